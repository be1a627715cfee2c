//! A stdio server's process, owned: its own process group, reaped, and killed on
//! every path.
//!
//! The child is spawned as the leader of a new process group, so that one signal
//! reaches it and everything it started (shell wrappers, `npx`, `uv run` and their
//! grandchildren). A waiter task owns the [`tokio::process::Child`] and publishes its
//! exit. [`ProcessGroup::terminate`] is the graceful path: the caller has closed stdin;
//! wait, SIGTERM the group, wait, SIGKILL the group, wait for the reap. A final SIGKILL
//! to the group, sent by the waiter as soon as the leader is reaped, sweeps up
//! grandchildren that outlived it.
//! [`GroupHandle`] is the one place that signals the group; the [`ProcessGroup`]'s
//! `Drop` sends SIGKILL through it synchronously: it covers an actor killed mid-flight
//! or a transport dropped without `terminate`, and needs no runtime.
//! The harness killed outright runs no `Drop`: the leader then gets SIGKILL from the
//! kernel, as its parent-death signal (see the spawner); the rest of its group sees
//! the harness's ends of its pipes close.
//!
//! The environment is minimal unless asked otherwise: a server gets `PATH`, `HOME`,
//! `USER`, `LANG`, `LC_*`, `TERM`, `TMPDIR` and `SHELL` from the harness, plus what its
//! config sets, so that the harness's own secrets do not leak into every server.
//!
//! Caveats: a grandchild that calls `setsid` leaves the group and cannot be reached.
//! The group id is the leader's pid; once every member is gone the kernel may reuse it
//! (for a restarted server, even), so the handle disarms with that first sweep and no
//! later drop signals it. Unix only.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

use crate::transport::error::{SpawnFailure, TransportError};
use crate::transport::exit::ExitStatus;
use crate::transport::spec::StdioSpec;

/// Variables a server gets from the harness's environment by default.
const PASSED_ENV: &[&str] = &["PATH", "HOME", "USER", "LANG", "TERM", "TMPDIR", "SHELL"];

/// The harness's own secrets, kept from a server that inherits its whole environment
/// (`inherit_env`): the gateway's sealing keys (whoever holds them can seal any round)
/// and the tokens of its admin and metrics endpoints. A server's own `env` may still
/// name one.
const WITHHELD_ENV: &[&str] = &[
    "MCP_HARNESS_GATEWAY_KEYS",
    "MCP_HARNESS_ADMIN_TOKEN",
    "MCP_HARNESS_METRICS_TOKEN",
];

/// The right to signal one process group, shared by everyone who may kill it. Disarmed
/// once the group has been swept: its id may belong to someone else after that.
#[derive(Clone, Debug)]
pub(crate) struct GroupHandle {
    pgid: libc::pid_t,
    armed: Arc<AtomicBool>,
}

impl GroupHandle {
    /// Sends `signal` to the group unless it was already swept.
    fn signal(&self, signal: libc::c_int) {
        if self.pgid > 0 && self.armed.load(Ordering::SeqCst) {
            // SAFETY: killpg only sends a signal; a group that no longer exists yields
            // ESRCH, which is harmless and ignored.
            unsafe {
                libc::killpg(self.pgid, signal);
            }
        }
    }

    /// SIGKILLs the group now (fault injection, a forced stop); it stays armed.
    pub(crate) fn kill(&self) {
        self.signal(libc::SIGKILL);
    }

    /// SIGKILLs what is left of the group once its leader has been reaped, then never
    /// signals it again.
    pub(crate) fn sweep(&self) {
        if self.pgid > 0 && self.armed.swap(false, Ordering::SeqCst) {
            // SAFETY: as in `signal`.
            unsafe {
                libc::killpg(self.pgid, libc::SIGKILL);
            }
        }
    }
}

/// A running server process and its pipes (taken once by the transport).
pub(crate) struct Spawned {
    pub(crate) group: ProcessGroup,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: ChildStdout,
    pub(crate) stderr: ChildStderr,
}

/// The owned process group of one stdio server.
#[derive(Debug)]
pub(crate) struct ProcessGroup {
    pid: u32,
    handle: GroupHandle,
    exit: watch::Receiver<Option<ExitStatus>>,
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.handle.kill();
    }
}

/// What a failed spawn was, and words for it.
fn spawn_failure(e: &std::io::Error, spec: &StdioSpec) -> (SpawnFailure, String) {
    // A missing working directory fails as the command would (ENOENT from chdir), but
    // may come back (a volume mounted late), and the command is not to blame.
    if let Some(cwd) = spec.cwd.as_ref().filter(|d| !d.is_dir()) {
        let reason = format!(
            "the working directory {} is not a directory ({e})",
            cwd.display()
        );
        return (SpawnFailure::Other, reason);
    }
    (spawn_kind(e), e.to_string())
}

fn spawn_kind(e: &std::io::Error) -> SpawnFailure {
    match e.kind() {
        std::io::ErrorKind::NotFound => SpawnFailure::NotFound,
        std::io::ErrorKind::PermissionDenied => SpawnFailure::PermissionDenied,
        _ => SpawnFailure::Other,
    }
}

impl ProcessGroup {
    /// Spawns the server as the leader of a new process group with piped stdio.
    pub(crate) async fn spawn(
        spec: &StdioSpec,
        spawned_hook: Option<crate::transport::SpawnHook>,
    ) -> Result<Spawned, TransportError> {
        let mut cmd = Command::new(&spec.command);
        cmd.args(&spec.args);
        if !spec.inherit_env {
            cmd.env_clear();
            for (key, value) in std::env::vars_os() {
                let name = key.to_string_lossy();
                if PASSED_ENV.contains(&name.as_ref()) || name.starts_with("LC_") {
                    cmd.env(&key, value);
                }
            }
        } else {
            for name in WITHHELD_ENV {
                cmd.env_remove(name);
            }
        }
        cmd.envs(&spec.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            // The group handle kills the whole group; tokio's kill reaches only the leader.
            .kill_on_drop(false);
        if let Some(cwd) = &spec.cwd {
            cmd.current_dir(cwd);
        }
        let spawn_err = {
            let command = spec.command.clone();
            move |kind: SpawnFailure, reason: String| TransportError::Spawn {
                command: command.clone(),
                kind,
                reason,
            }
        };
        // Owned where it is spawned: a caller that stopped waiting (cancelled, or past
        // the spawn's bound) drops the group, which kills it, and `spawned` has already
        // been told of it (a removal waits for its end).
        let owned = {
            let (spec, spawn_err) = (spec.clone(), spawn_err.clone());
            move |child: std::io::Result<Child>| {
                let child = child.map_err(|e| {
                    let (kind, reason) = spawn_failure(&e, &spec);
                    spawn_err(kind, reason)
                })?;
                let spawned = Self::own(child, &spawn_err)?;
                if let Some(hook) = &spawned_hook {
                    (hook.0)(crate::transport::ProcessExit(spawned.group.exit_watch()));
                }
                Ok(spawned)
            }
        };
        match super::spawner::spawn(cmd, owned).await {
            Ok(spawned) => spawned,
            // No spawn's own error (that one was read on the spawner thread): a bound
            // passed, or no thread took it. Not looked into on this async thread: a
            // stat of the working directory on a mount that hangs would hang it too.
            Err(e) => Err(spawn_err(SpawnFailure::Other, e.to_string())),
        }
    }

    /// Takes `child` (spawned as the leader of its group) and its pipes, and starts
    /// the task that reaps it.
    fn own(
        mut child: Child,
        spawn_err: &impl Fn(SpawnFailure, String) -> TransportError,
    ) -> Result<Spawned, TransportError> {
        let pid = child.id().ok_or_else(|| {
            spawn_err(SpawnFailure::Other, "exited before its pid was read".into())
        })?;
        let handle = GroupHandle {
            pgid: pid as libc::pid_t,
            armed: Arc::new(AtomicBool::new(true)),
        };
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            handle.kill();
            return Err(spawn_err(
                SpawnFailure::Other,
                "stdio pipes were not created".into(),
            ));
        };
        let (exit_tx, exit) = watch::channel(None);
        let reaped = GroupHandle {
            pgid: handle.pgid,
            armed: handle.armed.clone(),
        };
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => ExitStatus::from(status),
                Err(e) => {
                    tracing::warn!(pid, error = %e, "waiting for a server process failed");
                    ExitStatus::Code(-1)
                }
            };
            // Swept (and disarmed) as soon as the leader is reaped: once the group is
            // empty its number may go to a new process, perhaps the server restarted,
            // and a later signal to it (a dropped connection's) would kill that.
            reaped.sweep();
            let _ = exit_tx.send(Some(status));
        });
        Ok(Spawned {
            group: ProcessGroup { pid, handle, exit },
            stdin,
            stdout,
            stderr,
        })
    }

    /// The leader's pid (also the group id).
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The group's signalling handle.
    pub(crate) fn handle(&self) -> GroupHandle {
        self.handle.clone()
    }

    /// A receiver that sees the leader's exit.
    pub(crate) fn exit_watch(&self) -> watch::Receiver<Option<ExitStatus>> {
        self.exit.clone()
    }

    /// Waits up to `grace` for the leader to exit.
    async fn exited_within(&self, grace: Duration) -> bool {
        let mut exit = self.exit.clone();
        tokio::time::timeout(grace, exit.wait_for(Option::is_some))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Stops the group after the caller closed stdin: wait `grace`, SIGTERM, wait
    /// `grace`, SIGKILL, wait for the reap; then sweep the group with SIGKILL.
    pub(crate) async fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        if !self.exited_within(grace).await {
            tracing::debug!(pid = self.pid, "server ignored stdin EOF; sending SIGTERM");
            self.handle.signal(libc::SIGTERM);
            if !self.exited_within(grace).await {
                tracing::warn!(pid = self.pid, "server ignored SIGTERM; sending SIGKILL");
                self.handle.kill();
                // SIGKILL cannot be ignored; the bound only guards against a stuck reap.
                self.exited_within(Duration::from_secs(5)).await;
            }
        }
        // Grandchildren may outlive the leader; they still hold the group id.
        self.handle.sweep();
        *self.exit.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    // The parent-death signal follows the thread that forked: a server asked for on a
    // thread that then exits (a blocking-pool thread, idle) must live on. Before the
    // spawner thread, setting the signal on tokio's threads would have killed it here.
    #[test]
    fn a_server_outlives_the_thread_that_asked_for_it() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let handle = runtime.handle().clone();
        let spec = StdioSpec {
            command: "sleep".into(),
            args: vec!["30".into()],
            env: Default::default(),
            cwd: None,
            inherit_env: false,
        };
        let spawned = std::thread::spawn(move || {
            handle.block_on(async {
                ProcessGroup::spawn(&spec, None)
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .join()
        .expect("thread")
        .expect("spawn");
        let pid = spawned.group.pid();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(state(pid).filter(|s| *s != 'Z'), Some('S'), "pid {pid}");
        drop(spawned);
        runtime.block_on(async {
            let start = std::time::Instant::now();
            while state(pid).is_some_and(|s| s != 'Z') && start.elapsed() < Duration::from_secs(10)
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        assert!(
            state(pid).is_none_or(|s| s == 'Z'),
            "dropped, and still running"
        );
    }
}
