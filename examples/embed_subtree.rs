//! Embedding mcp-harness under your own ractor supervisor.
//!
//! Spawns the harness as a child of an embedder actor, with two demo servers (one
//! modern, one legacy) from the `mcp-harness` binary next to this example. Then it kills
//! one server's actor and SIGKILLs the other server's process, and shows both recover
//! through `status()`. Stopping the embedder stops the harness and every server process.
//!
//! Run: `cargo build && cargo run --example embed_subtree`

use std::time::{Duration, Instant};

use mcp_harness::{Harness, HarnessConfig, HarnessHandle, ServerConfig, ServerState};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use serde_json::json;

/// The embedding application's own supervisor.
struct Embedder;

impl Actor for Embedder {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<()>,
        event: SupervisionEvent,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        println!("embedder saw: {event:?}");
        Ok(())
    }
}

fn print_status(h: &HarnessHandle, when: &str) {
    println!("-- status {when}");
    for s in h.status() {
        println!(
            "   {:<6} {:<10} era={:<7} pid={:<7} restarts={} rebuilds={} last_error={}",
            s.id,
            format!("{:?}", s.state),
            s.era.map(|e| format!("{e:?}")).unwrap_or_default(),
            s.pid.map(|p| p.to_string()).unwrap_or_default(),
            s.restarts,
            s.actor_rebuilds,
            s.last_error.unwrap_or_default()
        );
    }
}

async fn wait_ready(h: &HarnessHandle, ids: &[&str]) -> anyhow::Result<()> {
    let limit = Instant::now() + Duration::from_secs(30);
    while Instant::now() < limit {
        if ids.iter().all(|id| {
            h.server_status(id)
                .is_some_and(|s| s.state == ServerState::Ready)
        }) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("servers {ids:?} did not become ready")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut bin = std::env::current_exe()?;
    bin.pop(); // examples/
    bin.pop();
    let bin = bin.join("mcp-harness");
    anyhow::ensure!(
        bin.exists(),
        "build the binary first: cargo build ({} is missing)",
        bin.display()
    );
    let bin = bin.to_string_lossy().to_string();

    let (embedder, embedder_done) = Actor::spawn(None, Embedder, ()).await?;
    let config = HarnessConfig {
        servers: vec![
            ServerConfig::stdio("alpha", &bin, ["demo-server", "alpha"]),
            ServerConfig::stdio("beta", &bin, ["demo-server", "beta", "--era", "legacy"]),
        ],
        ..HarnessConfig::default()
    };
    let harness = Harness::spawn_linked(config, embedder.get_cell()).await?;
    wait_ready(&harness, &["alpha", "beta"]).await?;
    print_status(&harness, "after start");

    let old = harness
        .server_actor("alpha")
        .ok_or_else(|| anyhow::anyhow!("no alpha"))?;
    println!("\nkilling alpha's server actor {:?}", old.get_id());
    old.kill();
    tokio::time::sleep(Duration::from_millis(100)).await;
    wait_ready(&harness, &["alpha"]).await?;
    print_status(&harness, "after the actor kill");

    let beta_pid = harness
        .server_status("beta")
        .and_then(|s| s.pid)
        .ok_or_else(|| anyhow::anyhow!("no beta pid"))?;
    println!("\nSIGKILL to beta's process {beta_pid}");
    std::process::Command::new("kill")
        .args(["-KILL", &beta_pid.to_string()])
        .status()?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    wait_ready(&harness, &["beta"]).await?;
    print_status(&harness, "after the process kill");

    for id in ["alpha", "beta"] {
        let r = harness
            .request(
                id,
                "tools/call",
                Some(json!({"name": "echo", "arguments": {"text": "recovered"}})),
            )
            .await?;
        println!("{id}: echo -> {}", r["content"][0]["text"]);
    }

    let pids: Vec<u32> = harness.status().iter().filter_map(|s| s.pid).collect();
    println!("\nstopping the embedder");
    embedder.stop(None);
    embedder_done.await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for pid in pids {
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        println!(
            "server pid {pid}: {}",
            if alive { "STILL ALIVE" } else { "gone" }
        );
        anyhow::ensure!(!alive, "server process {pid} outlived the embedder");
    }
    Ok(())
}
