//! A stdio server's process, owned: its own process group, reaped, and killed on
//! every path.
//!
//! The child is spawned as the leader of a new process group, so that one signal
//! reaches it and everything it started (shell wrappers, `npx`, `uv run` and their
//! grandchildren). A waiter task owns the [`tokio::process::Child`] and publishes its
//! exit. [`ProcessGroup::terminate`] is the graceful path: the caller has closed stdin;
//! wait, SIGTERM the group, wait, SIGKILL the group, wait for the reap. A final SIGKILL
//! to the group after the leader exits sweeps up grandchildren that outlived it.
//! [`GroupGuard`]'s `Drop` sends SIGKILL to the group synchronously: it covers an
//! actor killed mid-flight or a transport dropped without `terminate`, and needs no
//! runtime.
//!
//! Caveats: a grandchild that calls `setsid` leaves the group and cannot be reached.
//! The group id is the leader's pid; once every member is gone the kernel may reuse it,
//! so the guard disarms after a completed sweep. Unix only.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

use crate::transport::error::TransportError;

/// Sends SIGKILL to a process group when dropped, unless disarmed.
#[derive(Debug)]
pub(crate) struct GroupGuard {
    pgid: libc::pid_t,
    /// Cleared once the group has been swept: its id may be reused after that.
    armed: Arc<AtomicBool>,
}

impl GroupGuard {
    /// Signals the group unless it was already swept (its id may be reused since).
    fn signal(&self, signal: libc::c_int) {
        if self.armed.load(Ordering::SeqCst) {
            send_group_signal(self.pgid, signal);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

fn send_group_signal(pgid: libc::pid_t, signal: libc::c_int) {
    if pgid > 0 {
        // SAFETY: killpg only sends a signal; a pgid that no longer exists yields
        // ESRCH, which is harmless and ignored.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

/// SIGKILLs the process group `pgid` now.
pub(crate) fn kill_group(pgid: u32) {
    send_group_signal(pgid as libc::pid_t, libc::SIGKILL);
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
    guard: GroupGuard,
    exit: watch::Receiver<Option<String>>,
}

impl ProcessGroup {
    /// Spawns `command` as the leader of a new process group with piped stdio.
    pub(crate) fn spawn(
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&PathBuf>,
    ) -> Result<Spawned, TransportError> {
        let mut cmd = Command::new(command);
        cmd.args(args)
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            // The guard kills the whole group; tokio's kill would reach only the leader.
            .kill_on_drop(false);
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        let spawn_err = |reason: String| TransportError::Spawn {
            command: command.to_string(),
            reason,
        };
        let mut child = cmd.spawn().map_err(|e| spawn_err(e.to_string()))?;
        let pid = child
            .id()
            .ok_or_else(|| spawn_err("exited before its pid was read".into()))?;
        let guard = GroupGuard {
            pgid: pid as libc::pid_t,
            armed: Arc::new(AtomicBool::new(true)),
        };
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(spawn_err("stdio pipes were not created".into()));
        };
        let (exit_tx, exit) = watch::channel(None);
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(e) => format!("wait failed: {e}"),
            };
            let _ = exit_tx.send(Some(status));
        });
        Ok(Spawned {
            group: ProcessGroup { pid, guard, exit },
            stdin,
            stdout,
            stderr,
        })
    }

    /// The leader's pid (also the group id).
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// How the leader exited, once it has.
    pub(crate) fn exit_status(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    /// The guard's arming flag, for the reader to disarm after its own sweep.
    pub(crate) fn armed(&self) -> Arc<AtomicBool> {
        self.guard.armed.clone()
    }

    /// A receiver that sees the leader's exit.
    pub(crate) fn exit_watch(&self) -> watch::Receiver<Option<String>> {
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
    pub(crate) async fn terminate(&mut self, grace: Duration) -> Option<String> {
        if !self.exited_within(grace).await {
            tracing::debug!(pid = self.pid, "server ignored stdin EOF; sending SIGTERM");
            self.guard.signal(libc::SIGTERM);
            if !self.exited_within(grace).await {
                tracing::warn!(pid = self.pid, "server ignored SIGTERM; sending SIGKILL");
                self.guard.signal(libc::SIGKILL);
                // SIGKILL cannot be ignored; the bound only guards against a stuck reap.
                self.exited_within(Duration::from_secs(5)).await;
            }
        }
        // Grandchildren may outlive the leader; they still hold the group id.
        if self.guard.armed.swap(false, Ordering::SeqCst) {
            send_group_signal(self.guard.pgid, libc::SIGKILL);
        }
        self.exit_status()
    }
}
