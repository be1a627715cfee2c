//! The supervision tree under faults, on real server processes.

mod support;

use std::time::Duration;

use mcp_harness::{
    CallError, Caller, Harness, HarnessConfig, HarnessError, HarnessHandle, RestartConfig,
    RestartPolicy, ServerConfig, ServerError, ServerState, Service,
};
use serde_json::json;
use support::*;

fn demo(id: &str, args: &[&str]) -> ServerConfig {
    let mut all = vec!["demo-server".to_string(), id.to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let mut c = ServerConfig::stdio(id, harness_exe(), all);
    c.restart = RestartConfig {
        min_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(400),
        ..RestartConfig::default()
    };
    c
}

/// A demo server allowed `max_restarts` restarts in ten minutes (the test's whole life).
fn limited(id: &str, max_restarts: u32) -> ServerConfig {
    let mut c = demo(id, &[]);
    c.restart.max_restarts = max_restarts;
    c.restart.within = Duration::from_secs(600);
    c
}

/// `config` run through `sh -c script`, with this program as `$0` and `args` after it.
fn under_sh(mut config: ServerConfig, script: &str, args: &[String]) -> ServerConfig {
    let mut all = vec!["-c".to_string(), script.to_string(), harness_exe()];
    all.extend(args.iter().cloned());
    config.transport = mcp_harness::TransportSpec::Stdio(mcp_harness::transport::StdioSpec {
        command: "sh".into(),
        args: all,
        ..Default::default()
    });
    config
}

/// A harness of `server` alone, ready, whose stops have `grace`.
async fn ready_alone(server: ServerConfig, grace: Duration) -> HarnessHandle {
    let id = server.id.clone();
    let h = Harness::spawn(HarnessConfig {
        servers: vec![server],
        shutdown_grace: grace,
        ..HarnessConfig::default()
    })
    .await
    .expect("spawn");
    assert!(wait_state(&h, &id, ServerState::Ready).await);
    h
}

fn assert_last_error(status: &mcp_harness::ServerStatus, says: &str) {
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains(says)),
        "{:?} does not say {says:?}",
        status.last_error
    );
}

async fn harness(servers: Vec<ServerConfig>) -> HarnessHandle {
    Harness::spawn(HarnessConfig {
        servers,
        ..HarnessConfig::default()
    })
    .await
    .expect("spawn")
}

async fn wait_state(h: &HarnessHandle, id: &str, state: ServerState) -> bool {
    let limit = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < limit {
        if h.server_status(id).is_some_and(|s| s.state == state) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn pid(h: &HarnessHandle, id: &str) -> u32 {
    h.server_status(id)
        .and_then(|s| s.pid)
        .expect("a running server has a pid")
}

/// Kills `id`'s server actor and waits until a new one has the server ready again.
async fn kill_actor_until_rebuilt(h: &HarnessHandle, id: &str) {
    let old_actor = h.server_actor(id).expect("actor");
    old_actor.kill();
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_actor(id)
            .is_some_and(|a| a.get_id() != old_actor.get_id()))
        .await,
        "a new actor replaces the killed one"
    );
    assert!(wait_state(h, id, ServerState::Ready).await);
}

async fn echo(h: &HarnessHandle, id: &str, text_: &str) -> Result<String, HarnessError> {
    let r = h
        .request(id, "tools/call", call("echo", json!({"text": text_})))
        .await?;
    Ok(text(&r).to_string())
}

#[tokio::test]
async fn sigkill_under_load_fails_requests_in_flight_at_once_and_the_server_comes_back() {
    let record = temp_file("sigkill-load");
    let rec = record.to_string_lossy().to_string();
    let h = harness(vec![demo("alpha", &["--record", &rec])]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    let first_pid = pid(&h, "alpha");
    let hung: Vec<_> = (0..8)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                h.request_with_timeout(
                    "alpha",
                    "tools/call",
                    call("hang", json!({})),
                    Some(Duration::from_secs(300)),
                )
                .await
            })
        })
        .collect();
    // All 8 in flight (one still queued would be held through the restart instead).
    let hangs = || calls_recorded(&record, "hang");
    assert!(
        eventually(Duration::from_secs(10), || hangs() == 8).await,
        "the 8 hang requests reached the server"
    );
    let killed_at = std::time::Instant::now();
    sigkill(first_pid);
    for task in hung {
        let r = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("no hang")
            .expect("join");
        assert!(
            matches!(
                r,
                Err(HarnessError::Call(CallError::Server(
                    ServerError::TransportClosed { .. }
                )))
            ),
            "{r:?}"
        );
    }
    assert!(
        killed_at.elapsed() < Duration::from_secs(20),
        "long before the 300 s deadline"
    );
    assert!(
        wait_state(&h, "alpha", ServerState::Ready).await,
        "ready again after the backoff"
    );
    let status = h.server_status("alpha").expect("status");
    assert_eq!(status.restarts, 1);
    assert!(status.last_error.is_some());
    assert_ne!(pid(&h, "alpha"), first_pid);
    assert_eq!(echo(&h, "alpha", "back").await.expect("served"), "back");
    assert!(group_members(first_pid).is_empty());
    let second = pid(&h, "alpha");
    h.shutdown().await;
    assert!(
        group_members(second).is_empty(),
        "no process left after shutdown"
    );
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_rebuilt_server_actor_goes_on_with_the_restart_history() {
    let alpha = limited("alpha", 2);
    let h = harness(vec![alpha]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    let crash = || call("crash", json!({"code": 3}));
    let _ = h.request("alpha", "tools/call", crash()).await;
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_status("alpha")
            .is_some_and(|s| s.restarts == 1 && s.state == ServerState::Ready))
        .await,
        "the first restart allowed"
    );
    // The rebuild is the second.
    kill_actor_until_rebuilt(&h, "alpha").await;
    assert_eq!(h.server_status("alpha").map(|s| s.restarts), Some(2));
    // The new actor knows of the restarts before it: another crash within the window
    // is one too many (a fresh history restarted it).
    let _ = h.request("alpha", "tools/call", crash()).await;
    assert!(wait_state(&h, "alpha", ServerState::Failed).await);
    h.shutdown().await;
}

// An actor killed while its server waits out a restart's backoff lost no process: the
// new actor waits out the rest of that backoff, and the restart is counted once (it
// was charged again, doubling the backoff and using up the limit twice as fast).
#[tokio::test]
async fn an_actor_killed_during_a_backoff_charges_no_second_restart() {
    let mut alpha = limited("alpha", 5);
    alpha.restart.min_delay = Duration::from_secs(2);
    alpha.restart.max_delay = Duration::from_secs(2);
    let h = harness(vec![alpha]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    let _ = h
        .request("alpha", "tools/call", call("crash", json!({"code": 3})))
        .await;
    assert!(wait_state(&h, "alpha", ServerState::Restarting).await);
    let old_actor = h.server_actor("alpha").expect("actor");
    old_actor.kill();
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_actor("alpha")
            .is_some_and(|a| a.get_id() != old_actor.get_id()))
        .await,
        "a new actor replaces the killed one"
    );
    let status = h.server_status("alpha").expect("status");
    assert_eq!(
        (status.state, status.restarts, status.actor_rebuilds),
        (ServerState::Restarting, 1, 1)
    );
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    let status = h.server_status("alpha").expect("status");
    assert_eq!((status.restarts, status.actor_rebuilds), (1, 1));
    assert_eq!(echo(&h, "alpha", "back").await.expect("echo"), "back");
    h.shutdown().await;
}

// The servers' supervisor killed while a server waits out a restart's backoff: the
// rebuilt server actor waits out the rest of it too. Before, it started the server at
// once, so a supervisor that kept dying restarted a crash-looping server each time.
#[tokio::test]
async fn a_supervisor_rebuilt_during_a_backoff_waits_it_out() {
    let mut alpha = limited("alpha", 5);
    alpha.restart.min_delay = Duration::from_secs(10);
    alpha.restart.max_delay = Duration::from_secs(10);
    let h = harness(vec![alpha]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    // The backoff (10 s at least) counts from the crash.
    let crashed = std::time::Instant::now();
    let _ = h
        .request("alpha", "tools/call", call("crash", json!({"code": 3})))
        .await;
    assert!(wait_state(&h, "alpha", ServerState::Restarting).await);
    let old_actor = h.server_actor("alpha").expect("actor");
    h.service_actor(Service::Servers)
        .await
        .expect("running")
        .kill();
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_actor("alpha")
            .is_some_and(|a| a.get_id() != old_actor.get_id()))
        .await,
        "a new actor replaces the one that went with its supervisor"
    );
    // Still waiting out the backoff a moment after the rebuild.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if crashed.elapsed() < Duration::from_secs(8) {
        let status = h.server_status("alpha").expect("status");
        assert_eq!(status.state, ServerState::Restarting, "{status:?}");
    }
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    assert_eq!(h.server_status("alpha").expect("status").restarts, 1);
    h.shutdown().await;
}

// An actor killed while its server's next connection is being made (still
// `restarting`, the backoff over) took that connection's process with it: that is a
// restart, charged (else an actor that kept dying there would respawn its server for
// ever, with no backoff).
#[tokio::test]
async fn an_actor_killed_while_a_restart_connects_is_charged() {
    let marker = temp_file("slow-reconnect");
    let script = r#"if [ -e "$1" ]; then sleep 30; exit 0; fi
touch "$1"
exec "$0" demo-server slow"#;
    let slow = under_sh(limited("slow", 5), script, &[marker.display().to_string()]);
    let h = ready_alone(slow, HarnessConfig::default().shutdown_grace).await;
    let _ = h
        .request("slow", "tools/call", call("crash", json!({"code": 3})))
        .await;
    // The restart's connection is being made: its process waits, never answering.
    let needle = marker.to_string_lossy().to_string();
    assert!(
        eventually(Duration::from_secs(20), || processes_with(&needle).len()
            == 1)
        .await,
        "the next connection is being made"
    );
    let status = h.server_status("slow").expect("status");
    assert_eq!(
        (status.state, status.restarts),
        (ServerState::Restarting, 1)
    );
    let old_actor = h.server_actor("slow").expect("actor");
    old_actor.kill();
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_status("slow")
            .is_some_and(|s| s.actor_rebuilds == 1 && s.restarts == 2))
        .await,
        "rebuilt, and charged: {:?}",
        h.server_status("slow")
            .map(|s| (s.actor_rebuilds, s.restarts))
    );
    h.shutdown().await;
    let _ = std::fs::remove_file(marker);
}

#[tokio::test]
async fn a_server_actor_that_keeps_dying_is_held_to_the_restart_limit() {
    let alpha = limited("alpha", 2);
    let h = harness(vec![alpha]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    for _ in 0..2 {
        kill_actor_until_rebuilt(&h, "alpha").await;
    }
    let status = h.server_status("alpha").expect("status");
    assert_eq!((status.restarts, status.actor_rebuilds), (2, 2));
    // A third death within the window is one too many: the server is failed, not
    // started again (it was, at once, however often its actor died).
    let (old_actor, old_pid) = (h.server_actor("alpha").expect("actor"), pid(&h, "alpha"));
    old_actor.kill();
    assert!(wait_state(&h, "alpha", ServerState::Failed).await);
    let status = h.server_status("alpha").expect("status");
    assert_eq!(status.actor_rebuilds, 3);
    assert_last_error(&status, "more than 2 restarts");
    assert!(
        eventually(Duration::from_secs(5), || group_members(old_pid).is_empty()).await,
        "the last process died with its actor"
    );
    assert!(matches!(
        echo(&h, "alpha", "x").await,
        Err(HarnessError::Call(CallError::Server(
            ServerError::Failed { .. }
        )))
    ));
    // Its actor dying now changes nothing: there was no connection to lose.
    let failed_actor = h.server_actor("alpha").expect("actor");
    failed_actor.kill();
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_status("alpha")
            .is_some_and(|s| s.actor_rebuilds == 4))
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await; // past a first backoff (deliberate)
    let status = h.server_status("alpha").expect("status");
    assert_eq!((status.state, status.restarts), (ServerState::Failed, 2));
    assert_last_error(&status, "more than 2 restarts");
    // An operator's restart forgets the history and starts it.
    h.restart_server("alpha").await.expect("restart");
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    h.shutdown().await;
}

#[tokio::test]
async fn a_rebuilt_servers_supervisor_charges_no_server_and_leaves_a_failed_one_failed() {
    let alpha = limited("alpha", 1);
    let future = demo("future", &["--versions", "2099-01-01"]);
    let h = harness(vec![alpha, future]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    assert!(wait_state(&h, "future", ServerState::Failed).await);
    for round in 1..=3 {
        let old_pid = pid(&h, "alpha");
        let servers = h.service_actor(Service::Servers).await.expect("running");
        servers.kill();
        assert!(
            eventually(Duration::from_secs(20), || h
                .server_status("alpha")
                .is_some_and(
                    |s| s.state == ServerState::Ready && s.pid.is_some_and(|p| p != old_pid)
                ))
            .await,
            "alpha started again after the supervisor's death {round}"
        );
        assert!(
            eventually(Duration::from_secs(5), || group_members(old_pid).is_empty()).await,
            "the old process died with its actor"
        );
    }
    // Three deaths of the supervisor, none of them alpha's: its one restart is left.
    let alpha = h.server_status("alpha").expect("status");
    assert_eq!((alpha.restarts, alpha.actor_rebuilds), (0, 3));
    // The failed server was not tried again.
    let future = h.server_status("future").expect("status");
    assert_eq!(future.state, ServerState::Failed);
    assert_eq!(future.restarts, 0);
    assert_last_error(&future, "no common protocol version");
    assert_eq!(echo(&h, "alpha", "still").await.expect("served"), "still");
    h.shutdown().await;
}

// A shutdown while the servers' supervisor waits out the pause before its rebuild does
// not rebuild it (which would start every server only to stop it): its servers are
// marked stopped, and the shutdown returns once their processes, killed with it, are
// gone.
#[tokio::test]
async fn a_shutdown_while_the_servers_supervisor_is_dead_starts_no_server() {
    let census = temp_file("dead-supervisor-census");
    let c = census.to_string_lossy().into_owned();
    let h = harness(vec![demo("alpha", &["--census", &c])]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    // Each death soon after the rebuild before waits longer: the eighth, a second. Only
    // the rebuilt supervisor is waited for, so the deaths stay soon after each other.
    for death in 1..=8 {
        let old = h.service_actor(Service::Servers).await.expect("running");
        old.kill();
        if death == 8 {
            break;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while h
            .service_actor(Service::Servers)
            .await
            .is_none_or(|a| a.get_id() == old.get_id())
        {
            assert!(std::time::Instant::now() < deadline, "not rebuilt");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert!(
        h.service_actor(Service::Servers).await.is_none(),
        "waiting out its pause"
    );
    let rebuilds = h.server_status("alpha").map(|s| s.actor_rebuilds);
    h.shutdown().await;
    let alpha = h.server_status("alpha").expect("status");
    assert_eq!(
        Some(alpha.actor_rebuilds),
        rebuilds,
        "not rebuilt to be stopped"
    );
    assert_eq!((alpha.state, alpha.pid), (ServerState::Stopped, None));
    let spawned: Vec<String> = std::fs::read_to_string(&census)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect();
    assert!(!spawned.is_empty());
    let left: Vec<&String> = spawned
        .iter()
        .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_file(census);
}

// A raw request to a server being added waits for its actor, as for a start: it is not
// refused as unavailable while the actor is spawned (on another worker, meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_request_to_a_server_being_added_waits_for_its_actor() {
    let h = harness(vec![]).await;
    for round in 0..10 {
        let id = format!("late{round}");
        let early = {
            let (h, id) = (h.clone(), id.clone());
            tokio::spawn(async move {
                loop {
                    match echo(&h, &id, "early").await {
                        Err(HarnessError::UnknownServer(_)) => tokio::task::yield_now().await,
                        answer => return answer,
                    }
                }
            })
        };
        h.add_server(demo(&id, &[])).await.expect("added");
        assert_eq!(early.await.expect("joined").expect("served"), "early");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_killed_server_actor_is_rebuilt_and_serves_again() {
    let h = harness(vec![demo("alpha", &[])]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    let old_pid = pid(&h, "alpha");
    kill_actor_until_rebuilt(&h, "alpha").await;
    assert_eq!(
        echo(&h, "alpha", "rebuilt").await.expect("served"),
        "rebuilt"
    );
    assert_eq!(h.server_status("alpha").expect("status").actor_rebuilds, 1);
    assert!(
        eventually(Duration::from_secs(5), || group_members(old_pid).is_empty()).await,
        "the old process died with its actor"
    );
    // Stopped rather than killed (not asked to shut down): rebuilt the same way, its
    // process stopped, not left `Stopped` until someone restarts it.
    let old_pid = pid(&h, "alpha");
    let old_actor = h.server_actor("alpha").expect("actor");
    old_actor.stop(None);
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_actor("alpha")
            .is_some_and(|a| a.get_id() != old_actor.get_id()))
        .await,
        "a new actor replaces the stopped one"
    );
    assert!(
        wait_state(&h, "alpha", ServerState::Ready).await,
        "{:?}",
        h.server_status("alpha")
    );
    assert_eq!(echo(&h, "alpha", "again").await.expect("served"), "again");
    assert_eq!(h.server_status("alpha").expect("status").actor_rebuilds, 2);
    assert!(
        eventually(Duration::from_secs(5), || group_members(old_pid).is_empty()).await,
        "the old process was stopped with its actor"
    );
    // Raw requests sent while the actor dies wait for the rebuilt one, as for a
    // restart: each is answered, or lost with the connection it was sent on, never
    // refused as unavailable.
    let senders: Vec<_> = (0..8)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for _ in 0..40 {
                    outcomes.push(echo(&h, "alpha", "waited").await);
                }
                outcomes
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.server_actor("alpha").expect("actor").kill();
    for sender in senders {
        for outcome in sender.await.expect("sender") {
            match outcome {
                Ok(text) => assert_eq!(text, "waited"),
                Err(e) => assert!(!e.to_string().contains("unavailable"), "{e}"),
            }
        }
    }
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    let new_pid = pid(&h, "alpha");
    h.shutdown().await;
    assert!(group_members(new_pid).is_empty());
}

#[tokio::test]
async fn a_server_that_crashes_on_start_backs_off_then_fails_and_the_others_keep_working() {
    let mut crashy = demo("crashy", &["--crash-on-start"]);
    crashy.restart.max_restarts = 3;
    let h = harness(vec![crashy, demo("alpha", &[])]).await;
    assert!(
        wait_state(&h, "crashy", ServerState::Failed).await,
        "{:?}",
        h.server_status("crashy")
    );
    let status = h.server_status("crashy").expect("status");
    assert_eq!(status.restarts, 3, "restarted up to the limit");
    assert_last_error(&status, "restarts within");
    let err = echo(&h, "crashy", "x").await.expect_err("failed");
    assert!(
        matches!(&err, HarnessError::Call(CallError::Server(ServerError::Failed { server, .. })) if server == "crashy"),
        "{err}"
    );
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    assert_eq!(
        echo(&h, "alpha", "fine").await.expect("alpha unaffected"),
        "fine"
    );
    // An explicit restart tries again (and, this server being what it is, fails again).
    h.restart_server("crashy").await.expect("restart");
    assert!(wait_state(&h, "crashy", ServerState::Failed).await);
    h.shutdown().await;
}

#[tokio::test]
async fn restart_policies_behave_as_in_otp() {
    let mut temporary = demo("temp", &[]);
    temporary.restart.policy = RestartPolicy::Temporary;
    let mut transient = demo("trans", &[]);
    transient.restart.policy = RestartPolicy::Transient;
    let mut permanent = demo("perm", &[]);
    permanent.restart.policy = RestartPolicy::Permanent;
    let h = harness(vec![temporary, transient, permanent]).await;
    for id in ["temp", "trans", "perm"] {
        assert!(wait_state(&h, id, ServerState::Ready).await, "{id}");
    }
    let crash = |code: i32| call("crash", json!({"code": code}));

    // temporary: never restarted.
    let _ = h.request("temp", "tools/call", crash(3)).await;
    assert!(wait_state(&h, "temp", ServerState::Stopped).await);
    assert!(matches!(
        echo(&h, "temp", "x").await,
        Err(HarnessError::Call(CallError::Server(
            ServerError::Stopped { .. }
        )))
    ));

    // transient: a crash is restarted, a clean exit is not.
    let _ = h.request("trans", "tools/call", crash(3)).await;
    assert!(wait_state(&h, "trans", ServerState::Ready).await);
    assert_eq!(h.server_status("trans").expect("status").restarts, 1);
    let _ = h.request("trans", "tools/call", crash(0)).await;
    assert!(wait_state(&h, "trans", ServerState::Stopped).await);

    // permanent: even a clean exit is restarted.
    let _ = h.request("perm", "tools/call", crash(0)).await;
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_status("perm")
            .is_some_and(|s| s.restarts == 1 && s.state == ServerState::Ready))
        .await
    );
    h.shutdown().await;
}

// A call waiting for its restarting server is not sent once its agent's grant is
// revoked: `revoke()` is in force for it too (it went out after the restart before).
#[tokio::test]
async fn a_grant_revoked_while_its_call_waits_for_a_restart_withdraws_the_call() {
    let record = temp_file("withdrawn");
    let rec = record.to_string_lossy().to_string();
    let mut alpha = demo("alpha", &["--record", &rec]);
    // Long enough for the call to be queued and the grant revoked on a busy machine.
    alpha.restart = RestartConfig {
        min_delay: Duration::from_secs(5),
        max_delay: Duration::from_secs(5),
        ..RestartConfig::default()
    };
    let h = harness(vec![alpha]).await;
    h.grant("b", "alpha", &["echo"]).await.expect("grant");
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    sigkill(pid(&h, "alpha"));
    assert!(wait_state(&h, "alpha", ServerState::Restarting).await);
    let waiting = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(
                &Caller::agent("b"),
                "alpha__echo",
                json!({"text": "not sent"}),
            )
            .await
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("alpha")
            .is_some_and(|s| s.queued == 1))
        .await,
        "the call waits for the restart"
    );
    h.revoke("b", Some("alpha")).await.expect("revoke");
    let outcome = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("answered after the restart")
        .expect("join");
    assert!(
        matches!(outcome, Err(CallError::Denied { .. })),
        "{outcome:?}"
    );
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    let calls = recorded(&record)
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .count();
    assert_eq!(calls, 0, "the withdrawn call never reached the server");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn requests_during_a_restart_wait_in_a_bounded_queue_and_are_released_in_order() {
    let record = temp_file("queue");
    let rec = record.to_string_lossy().to_string();
    let mut alpha = demo("alpha", &["--record", &rec]);
    alpha.queue_capacity = 3;
    alpha.restart = RestartConfig {
        min_delay: Duration::from_millis(1500),
        max_delay: Duration::from_millis(1500),
        ..RestartConfig::default()
    };
    let h = harness(vec![alpha]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    sigkill(pid(&h, "alpha"));
    assert!(wait_state(&h, "alpha", ServerState::Restarting).await);
    let queued = |n: usize| {
        let h = h.clone();
        eventually(Duration::from_secs(10), move || {
            h.server_status("alpha").map(|s| s.queued) == Some(n)
        })
    };
    let mut waiting = Vec::new();
    for n in 0..3 {
        let h = h.clone();
        waiting.push(tokio::spawn(async move {
            echo(&h, "alpha", &format!("queued-{n}")).await
        }));
        // In the queue before the next is sent: the arrival order is known.
        assert!(queued(n + 1).await, "queued-{n} is in the queue");
    }
    // The queue is full (3), so the next one overflows.
    let overflow = echo(&h, "alpha", "one too many")
        .await
        .expect_err("queue full");
    assert!(
        matches!(
            overflow,
            HarnessError::Call(CallError::Server(ServerError::Overloaded {
                capacity: 3,
                ..
            }))
        ),
        "{overflow}"
    );
    for (n, task) in waiting.into_iter().enumerate() {
        let r = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("released")
            .expect("join");
        assert_eq!(r.expect("served after the restart"), format!("queued-{n}"));
    }
    let order: Vec<String> = recorded(&record)
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .filter_map(|r| r["params"]["arguments"]["text"].as_str().map(String::from))
        .collect();
    assert_eq!(
        order,
        vec!["queued-0", "queued-1", "queued-2"],
        "released in arrival order"
    );
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_queued_request_fails_with_restarting_at_its_deadline() {
    let mut alpha = demo("alpha", &[]);
    alpha.restart = RestartConfig {
        min_delay: Duration::from_secs(20),
        max_delay: Duration::from_secs(20),
        ..RestartConfig::default()
    };
    let h = harness(vec![alpha]).await;
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    sigkill(pid(&h, "alpha"));
    assert!(wait_state(&h, "alpha", ServerState::Restarting).await);
    let started = std::time::Instant::now();
    let err = h
        .request_with_timeout(
            "alpha",
            "tools/call",
            call("echo", json!({"text": "late"})),
            Some(Duration::from_millis(300)),
        )
        .await
        .expect_err("deadline");
    assert!(
        matches!(
            err,
            HarnessError::Call(CallError::Server(ServerError::Restarting { .. }))
        ),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    h.shutdown().await;
}

#[tokio::test]
async fn a_modern_server_with_no_common_version_is_failed_without_retrying() {
    let h = harness(vec![demo("future", &["--versions", "2099-01-01"])]).await;
    assert!(wait_state(&h, "future", ServerState::Failed).await);
    let s = h.server_status("future").expect("status");
    assert_eq!(s.restarts, 0);
    assert!(
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("no common protocol version")),
        "{:?}",
        s.last_error
    );
    h.shutdown().await;
}

#[tokio::test]
async fn servers_are_added_removed_and_disabled_at_run_time() {
    let h = harness(vec![]).await;
    h.add_server(demo("alpha", &[])).await.expect("add");
    assert!(matches!(
        h.add_server(demo("alpha", &[])).await,
        Err(HarnessError::DuplicateServer(_))
    ));
    assert!(matches!(
        h.add_server(demo("bad__id", &[])).await,
        Err(HarnessError::Config(_))
    ));
    let mut off = demo("off", &[]);
    off.enabled = false;
    h.add_server(off).await.expect("add disabled");
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    assert_eq!(
        h.server_status("off").expect("listed").state,
        ServerState::Stopped
    );
    let alpha_pid = pid(&h, "alpha");
    h.remove_server("alpha").await.expect("remove");
    assert!(
        group_members(alpha_pid).is_empty(),
        "removal stops the process"
    );
    assert!(matches!(
        echo(&h, "alpha", "x").await,
        Err(HarnessError::UnknownServer(_))
    ));
    h.restart_server("off")
        .await
        .expect("start the disabled one");
    assert!(wait_state(&h, "off", ServerState::Ready).await);
    let status = h.status();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].era, Some(mcp_harness::transport::Era::Modern));
    assert!(
        status[0]
            .profile
            .as_ref()
            .and_then(|p| p.instructions())
            .is_some()
    );
    assert!(status[0].uptime().is_some());
    h.shutdown().await;
}

#[tokio::test]
async fn dropping_the_last_handle_kills_every_server_process() {
    let h = harness(vec![
        demo("alpha", &["--ignore-sigterm", "--spawn-child"]),
        demo("beta", &["--era", "legacy"]),
    ])
    .await;
    assert!(
        wait_state(&h, "alpha", ServerState::Ready).await
            && wait_state(&h, "beta", ServerState::Ready).await
    );
    let pids = [pid(&h, "alpha"), pid(&h, "beta")];
    assert!(
        eventually(Duration::from_secs(10), || group_members(pids[0]).len()
            >= 2)
        .await
    );
    drop(h);
    for p in pids {
        assert!(
            eventually(Duration::from_secs(10), || group_members(p).is_empty()).await,
            "group {p} survived"
        );
    }
}

#[tokio::test]
async fn a_harness_under_an_embedders_supervisor_stops_with_it() {
    let (embedder, join) = embedder().await;
    let config = HarnessConfig {
        servers: vec![demo("alpha", &[])],
        ..HarnessConfig::default()
    };
    let h = Harness::spawn_linked(config, embedder.get_cell())
        .await
        .expect("linked");
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    let p = pid(&h, "alpha");
    embedder.stop(None);
    join.await.expect("embedder stopped");
    assert!(
        eventually(Duration::from_secs(10), || group_members(p).is_empty()).await,
        "the server died with the embedder"
    );
    drop(h);
}

// `shutdown()` after an embedder's supervisor stopped the harness returns, as it says,
// when no server process is left: each is killed as its actor's state drops, in its
// own time. Before, it returned at once, and an embedder that then exited could leave
// a server's children behind (the parent-death signal reaches the server alone).
#[tokio::test]
async fn shutdown_after_an_embedders_supervisor_stopped_the_harness_leaves_no_process() {
    for _ in 0..3 {
        let (embedder, join) = embedder().await;
        let config = HarnessConfig {
            servers: vec![demo("alpha", &["--spawn-child"])],
            ..HarnessConfig::default()
        };
        let h = Harness::spawn_linked(config, embedder.get_cell())
            .await
            .expect("linked");
        assert!(wait_state(&h, "alpha", ServerState::Ready).await);
        let p = pid(&h, "alpha");
        assert!(
            eventually(Duration::from_secs(10), || group_members(p).len() >= 2).await,
            "the server's child started"
        );
        embedder.stop(None);
        join.await.expect("embedder stopped");
        h.shutdown().await;
        let left = group_members(p);
        assert!(left.is_empty(), "left after shutdown: {left:?}");
    }
}

// The root stopped from outside takes the audit actor with it: records of the calls
// made since (each refused) are written without it, in batches, rather than piling up,
// and `shutdown()` writes what is left before it returns.
#[tokio::test]
async fn audit_records_are_written_after_an_embedders_supervisor_stopped_the_harness() {
    // Batches of 8: written as they fill. One batch never full: left to `shutdown()`.
    for (batch, calls) in [(8, 100), (65_536, 10)] {
        let (h, audit) = orphaned_with_audit(batch).await;
        let caller = Caller::agent("a");
        for _ in 0..calls {
            let e = h
                .call_tool(&caller, "alpha__echo", json!({"text": "x"}))
                .await
                .expect_err("no worker is left");
            assert!(
                matches!(e, CallError::WorkerDied | CallError::ShutDown),
                "{e:?}"
            );
        }
        if batch == 8 {
            assert!(
                eventually(Duration::from_secs(10), || h.audit_health().backlog < 16).await,
                "records piled up: {:?}",
                h.audit_health()
            );
        }
        let health = h.shutdown().await;
        assert_eq!((health.backlog, health.unwritten), (0, 0), "{health:?}");
        let written = std::fs::read_to_string(&audit).expect("audit file");
        let finished = written
            .lines()
            .filter(|l| l.contains("\"finished\""))
            .count();
        assert!(finished >= calls, "{finished} calls recorded as finished");
        let _ = std::fs::remove_file(&audit);
        let _ = std::fs::remove_file(audit.with_extension("jsonl.key"));
    }
}

/// An embedder's own actor, doing nothing, for a harness to live under; and its end.
async fn embedder() -> (ractor::ActorRef<()>, tokio::task::JoinHandle<()>) {
    use ractor::{Actor, ActorProcessingErr, ActorRef};
    struct Embedder;
    impl Actor for Embedder {
        type Msg = ();
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }
    Actor::spawn(None, Embedder, ()).await.expect("embedder")
}

/// A harness with an audit trail writing `batch` records at a time, whose embedder's
/// supervisor has stopped (and its root with it); and the trail's path.
async fn orphaned_with_audit(batch: usize) -> (HarnessHandle, std::path::PathBuf) {
    let audit = temp_file(&format!("audit-orphan-{batch}"));
    let (embedder, join) = embedder().await;
    let config = HarnessConfig {
        servers: vec![demo("alpha", &[])],
        permissions: grant_everything(&["a"]),
        audit: mcp_harness::audit::AuditConfig {
            path: Some(audit.clone()),
            batch,
            flush_every: Duration::from_secs(3600),
            ..Default::default()
        },
        ..HarnessConfig::default()
    };
    let h = Harness::spawn_linked(config, embedder.get_cell())
        .await
        .expect("linked");
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    embedder.stop(None);
    join.await.expect("embedder stopped");
    (h, audit)
}

#[test]
fn the_embedding_example_recovers_both_servers_and_leaves_nothing_behind() {
    let mut exe = std::env::current_exe().expect("test path");
    exe.pop();
    exe.pop();
    let exe = exe.join("examples").join("embed_subtree");
    assert!(exe.exists(), "{} is built by `cargo test`", exe.display());
    let out = std::process::Command::new(&exe)
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("echo -> \"recovered\"").count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("rebuilds=1"), "{stdout}");
    assert!(!stdout.contains("STILL ALIVE"), "{stdout}");
}

/// A harness whose one server, `slow`, is ready, and takes seconds to stop: its process
/// ignores SIGTERM and stays after stdin ends, so a stop waits out the grace (3 s) and
/// kills it.
async fn with_a_slow_stop() -> HarnessHandle {
    let script = "trap '' TERM; \"$0\" demo-server slow; sleep 30";
    ready_alone(
        under_sh(demo("slow", &[]), script, &[]),
        Duration::from_secs(3),
    )
    .await
}

/// An echo asked of `slow` with a minute to answer.
async fn echo_slow(h: &HarnessHandle) -> Result<serde_json::Value, HarnessError> {
    h.request_with_timeout(
        "slow",
        "tools/call",
        call("echo", json!({"text": "x"})),
        Some(Duration::from_secs(60)),
    )
    .await
}

// A server being removed is gone from routing at once: requests are answered while its
// process, which takes its time to go, is still being stopped.
#[tokio::test]
async fn requests_to_a_server_being_removed_are_answered_at_once() {
    let h = with_a_slow_stop().await;
    let removing = {
        let h = h.clone();
        tokio::spawn(async move { h.remove_server("slow").await })
    };
    assert!(
        eventually(Duration::from_secs(30), || h
            .server_status("slow")
            .is_none())
        .await
    );
    let answer = echo_slow(&h).await;
    assert!(
        !removing.is_finished(),
        "answered while the stop still waits for the process: {answer:?}"
    );
    assert!(
        matches!(answer, Err(HarnessError::UnknownServer(_))),
        "{answer:?}"
    );
    removing.await.expect("join").expect("removed");
    h.shutdown().await;
}

// The connection a restart replaced is stopped gracefully before a removal right after
// returns: it was told to stop and forgotten, and the removal's end killed it mid-way
// (SIGKILL, where its stop would have sent SIGTERM after the grace).
#[tokio::test]
async fn a_connection_replaced_by_a_restart_is_stopped_gracefully_by_a_removal() {
    // The first start: a server that stays after stdin ends and leaves at SIGTERM,
    // saying so; any later start is slow, so that the removal finds the new connection
    // still connecting (ended at once) and the replaced one still stopping.
    let marker = temp_file("replaced-marker");
    let termed = std::path::PathBuf::from(format!("{}.termed", marker.display()));
    let script = r#"if [ -e "$1" ]; then exec sleep 30; fi
touch "$1"
trap 'touch "$1.termed"; exit 0' TERM
"$0" demo-server slow
while :; do sleep 0.1; done"#;
    let stubborn = under_sh(demo("slow", &[]), script, &[marker.display().to_string()]);
    let h = ready_alone(stubborn, Duration::from_secs(1)).await;
    let old = pid(&h, "slow");
    h.restart_server("slow").await.expect("restart");
    h.remove_server("slow").await.expect("remove");
    assert!(
        termed.exists(),
        "the replaced connection was killed, not stopped"
    );
    assert!(group_members(old).is_empty(), "and is gone");
    h.shutdown().await;
    let _ = std::fs::remove_file(marker);
    let _ = std::fs::remove_file(termed);
}

// A server restarted with a new config (a reload that changes it) keeps its id and its
// place: a call made while its old process, slow to go, is being stopped waits for the
// new one, which starts only once the old one has gone. The lists are the new one's,
// though it says nothing of a change (no subscription reads them again).
#[tokio::test]
async fn a_server_replaced_keeps_its_place_and_calls_wait_for_the_new_one() {
    let script = "trap '' TERM; \"$0\" demo-server slow --no-list-changed; sleep 30";
    let slow = under_sh(demo("slow", &[]), script, &[]);
    let h = Harness::spawn(HarnessConfig {
        servers: vec![slow, demo("after", &[])],
        permissions: grant_everything(&["a"]),
        shutdown_grace: Duration::from_secs(2),
        ..HarnessConfig::default()
    })
    .await
    .expect("spawn");
    assert!(wait_state(&h, "slow", ServerState::Ready).await);
    assert!(wait_state(&h, "after", ServerState::Ready).await);
    let tools = |h: HarnessHandle| async move {
        let listed = h.list_tools(&Caller::agent("a")).await.expect("listed");
        let names: Vec<String> = listed.iter().map(|t| t.qualified.to_string()).collect();
        names
    };
    assert!(!tools(h.clone()).await.contains(&"slow__gen_0".to_string()));
    // A crash first: the restart it counts is still counted after the replacement.
    sigkill(pid(&h, "slow"));
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_status("slow")
            .is_some_and(|s| s.restarts == 1 && s.state == ServerState::Ready))
        .await
    );
    let old = pid(&h, "slow");

    let mut events = h.subscribe();
    let mut new = demo("slow", &["--extra-tools", "1", "--no-list-changed"]);
    new.timeout = Duration::from_secs(60);
    let replacing = {
        let h = h.clone();
        tokio::spawn(async move { h.replace_server(new).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("slow")
            .is_some_and(|s| s.pid != Some(old)))
        .await,
        "the new server is in the directory"
    );
    let order: Vec<String> = h.status().into_iter().map(|s| s.id).collect();
    assert_eq!(order, ["slow", "after"], "in its place");
    let answer = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(&Caller::agent("a"), "slow__echo", json!({"text": "waited"}))
                .await
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("slow")
            .is_some_and(|s| s.queued == 1))
        .await,
        "the call waits for the new process: {:?}",
        h.server_status("slow")
    );
    assert!(!replacing.is_finished(), "the old process is still going");
    assert!(!group_members(old).is_empty());
    // One replacement at a time: what waits for this one is not stopped by another.
    let again = h.replace_server(demo("slow", &[])).await;
    assert!(
        matches!(
            again,
            Err(HarnessError::Call(CallError::Server(
                ServerError::Restarting { .. }
            )))
        ),
        "{again:?}"
    );
    replacing.await.expect("join").expect("replaced");
    assert!(group_members(old).is_empty(), "the old process is gone");
    let answer = answer.await.expect("join").expect("answered");
    assert!(answer.to_string().contains("waited"), "{answer}");
    let new_pid = pid(&h, "slow");
    assert_ne!(new_pid, old);
    assert_eq!(h.server_status("slow").map(|s| s.restarts), Some(1));
    // Told, as a server's own list change is: a gateway passes it on to its clients.
    let told = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Ok(mcp_harness::registry::HarnessEvent::ListsChanged { server, tools, .. })
                    if server == "slow" && tools =>
                {
                    break true;
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => break false,
            }
        }
    })
    .await;
    assert_eq!(told, Ok(true), "the lists are announced as changed");
    assert!(
        tools(h.clone()).await.contains(&"slow__gen_0".to_string()),
        "the new server's tools"
    );
    h.shutdown().await;
}

// A server removed while it replaces another is removed once both have stopped: one
// added under its id right after does not start beside the old process.
#[tokio::test]
async fn a_removal_during_a_replacement_waits_for_the_old_process() {
    let h = with_a_slow_stop().await;
    let old = pid(&h, "slow");
    let replacing = {
        let h = h.clone();
        tokio::spawn(async move { h.replace_server(demo("slow", &[])).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("slow")
            .is_some_and(|s| s.pid != Some(old)))
        .await
    );
    h.remove_server("slow").await.expect("removed");
    assert!(group_members(old).is_empty(), "the old process is gone too");
    replacing
        .await
        .expect("join")
        .expect("replaced, then removed");
    assert!(h.server_status("slow").is_none());
    h.shutdown().await;
}

// A server removed while it starts (its handshake never answered) is removed once its
// process is gone: its connection was given up, its process group SIGKILLed and reaped
// after. Before, the removal answered at the kill, the process still there.
#[tokio::test]
async fn a_server_removed_while_it_starts_is_removed_once_its_process_is_gone() {
    let h = Harness::spawn(HarnessConfig::default())
        .await
        .expect("spawn");
    for round in 0..5 {
        let id = format!("mute{round}");
        // A status has no pid before the handshake: the process is found by its
        // arguments, unique to this round.
        let seconds = format!("29.{}{round}", std::process::id());
        let script = format!("trap '' TERM; exec sleep {seconds}");
        h.add_server(under_sh(demo(&id, &[]), &script, &[]))
            .await
            .expect("added");
        assert!(
            eventually(Duration::from_secs(10), || !processes_with(&seconds)
                .is_empty())
            .await,
            "started"
        );
        let pids = processes_with(&seconds);
        // Its handshake under way (the spawn has handed the process over).
        tokio::time::sleep(Duration::from_millis(200)).await;
        h.remove_server(&id).await.expect("removed");
        for pid in pids {
            assert!(
                group_members(pid).is_empty(),
                "round {round}: its process is left"
            );
        }
    }
    h.shutdown().await;
}

// A restart asked of a server whose process is slow to stop (it ignores stdin's end
// and SIGTERM) starts the new process once the old one is gone, not beside it (a
// port, a lock file). Before, the new one started at once.
#[tokio::test]
async fn a_restart_starts_the_new_process_once_the_old_one_is_gone() {
    let h = with_a_slow_stop().await;
    let old = pid(&h, "slow");
    h.restart_server("slow").await.expect("restart");
    assert!(
        eventually(Duration::from_secs(60), || h
            .server_status("slow")
            .is_some_and(
                |s| s.state == ServerState::Ready && s.pid.is_some_and(|p| p != old)
            ))
        .await,
        "the new process runs"
    );
    assert!(
        group_members(old).is_empty(),
        "the old process is gone before the new one started"
    );
    h.shutdown().await;
}

// A server given up on while calls wait for it answers them, and its status says its
// queue is empty again.
#[tokio::test]
async fn a_server_given_up_on_shows_its_queue_emptied() {
    // It never answers its handshake, and exits five seconds later (time for the calls
    // to queue on a loaded machine); no restart allowed.
    let dies = under_sh(limited("dies", 0), "sleep 5; exit 3", &[]);
    let h = harness(vec![dies]).await;
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                h.request_with_timeout(
                    "dies",
                    "tools/call",
                    call("echo", json!({"text": "x"})),
                    Some(Duration::from_secs(30)),
                )
                .await
            })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("dies")
            .is_some_and(|s| s.queued == 3))
        .await,
        "the calls wait in its queue: {:?}",
        h.server_status("dies")
    );
    assert!(wait_state(&h, "dies", ServerState::Failed).await);
    for call in waiting {
        let answer = call.await.expect("join");
        assert!(
            matches!(
                answer,
                Err(HarnessError::Call(CallError::Server(
                    ServerError::Failed { .. }
                )))
            ),
            "{answer:?}"
        );
    }
    assert_eq!(h.server_status("dies").map(|s| s.queued), Some(0));
    h.shutdown().await;
}

// A request that the next restart (after its backoff) cannot serve before its deadline
// is answered at once, `restarting`, free to go to another server: one that comes
// while the server waits, and one that waited in its queue when it went down.
#[tokio::test]
async fn a_request_the_next_restart_comes_too_late_for_is_answered_at_once() {
    let late = |c: &mut ServerConfig| {
        c.restart.min_delay = Duration::from_secs(60);
        c.restart.max_delay = Duration::from_secs(60);
    };
    let mut alpha = demo("alpha", &[]);
    late(&mut alpha);
    // Never answers its handshake; exits five seconds later.
    let mut dies = under_sh(demo("dies", &[]), "sleep 5; exit 3", &[]);
    late(&mut dies);
    let h = harness(vec![alpha, dies]).await;
    let echo = |id: &'static str| {
        let h = h.clone();
        async move {
            let started = std::time::Instant::now();
            let answer = h
                .request_with_timeout(
                    id,
                    "tools/call",
                    call("echo", json!({"text": "x"})),
                    Some(Duration::from_secs(20)),
                )
                .await;
            (answer, started.elapsed())
        }
    };
    let queued = tokio::spawn(echo("dies"));
    assert!(
        eventually(Duration::from_secs(4), || h
            .server_status("dies")
            .is_some_and(|s| s.queued == 1 && s.state == ServerState::Starting))
        .await,
        "queued while it starts: {:?}",
        h.server_status("dies")
    );
    assert!(wait_state(&h, "alpha", ServerState::Ready).await);
    let _ = h
        .request("alpha", "tools/call", call("crash", json!({"code": 3})))
        .await;
    assert!(wait_state(&h, "alpha", ServerState::Restarting).await);
    for (which, (answer, took)) in [
        ("while it waits", echo("alpha").await),
        ("queued before", queued.await.expect("join")),
    ] {
        assert!(
            matches!(
                answer,
                Err(HarnessError::Call(CallError::Server(
                    ServerError::Restarting { .. }
                )))
            ),
            "{which}: {answer:?}"
        );
        // Not its 20 s deadline (the queued one waited for the server to go down).
        assert!(took < Duration::from_secs(15), "{which}: {took:?}");
    }
    h.shutdown().await;
}

// While the harness shuts down, a server already stopped but whose process is still
// going answers requests `stopped` at once, from its published state: they do not wait
// in its actor's mailbox for the stop to end.
#[tokio::test]
async fn requests_to_a_server_being_stopped_are_answered_at_once() {
    let h = with_a_slow_stop().await;
    let stopping = {
        let h = h.clone();
        tokio::spawn(async move { h.shutdown().await })
    };
    assert!(wait_state(&h, "slow", ServerState::Stopped).await);
    let answer = echo_slow(&h).await;
    assert!(
        !stopping.is_finished(),
        "answered while the stop still waits for the process: {answer:?}"
    );
    assert!(
        matches!(
            answer,
            Err(HarnessError::Call(CallError::Server(
                ServerError::Stopped { .. }
            )))
        ),
        "{answer:?}"
    );
    stopping.await.expect("join");
}

// A replacement under way when the servers' supervisor dies does not leave the server
// it replaces among those stopping for good: before, a death at the spawn of the new
// server's actor left the old one unstopped there, and every later replacement of the
// id was refused as "under way", a removal never finished.
#[tokio::test]
async fn a_replacement_cut_short_by_the_supervisors_death_leaves_the_id_usable() {
    let h = harness(vec![demo("s", &[])]).await;
    assert!(wait_state(&h, "s", ServerState::Ready).await);
    for round in 0..8 {
        let supervisor = h.service_actor(Service::Servers).await.expect("running");
        let replacing = {
            let h = h.clone();
            tokio::spawn(async move { h.replace_server(demo("s", &[])).await })
        };
        // At once, or a moment later: the replacement's steps are short.
        if round % 2 == 1 {
            tokio::task::yield_now().await;
        }
        supervisor.kill();
        let _ = tokio::time::timeout(Duration::from_secs(60), replacing)
            .await
            .expect("the replacement answers");
        // Another replacement goes through once the old process has stopped.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match h.replace_server(demo("s", &[])).await {
                Ok(()) => break,
                Err(e) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "round {round}: still refused: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    let removed = tokio::time::timeout(Duration::from_secs(30), h.remove_server("s")).await;
    assert!(matches!(removed, Ok(Ok(()))), "{removed:?}");
    h.add_server(demo("s", &[])).await.expect("added");
    assert!(wait_state(&h, "s", ServerState::Ready).await);
    h.shutdown().await;
}
