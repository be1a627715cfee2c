//! One thread that forks every stdio server, so that a server dies with the harness.
//!
//! Linux sends a child its parent-death signal (`PR_SET_PDEATHSIG`) when the *thread*
//! that forked it exits, not the process. tokio's threads come and go (its blocking
//! pool's after 10 s idle; a worker after `block_in_place`), so a server forked on one
//! of them would be killed at random. This thread lives as long as the process: it
//! never returns, and a panic in a job is caught. So the signal comes only when the
//! harness process is gone, SIGKILLed included, when no `Drop` runs.

use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel, sync_channel};

use tokio::process::{Child, Command};

type Job = Box<dyn FnOnce() + Send>;

/// The spawner's queue, or `None` when its thread could not be started.
fn queue() -> Option<&'static Sender<Job>> {
    static QUEUE: OnceLock<Option<Sender<Job>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = channel::<Job>();
            let started = std::thread::Builder::new()
                .name("mcp-harness-spawner".into())
                .spawn(move || {
                    // The sender is a static: `recv` fails only if it is gone, which
                    // it never is while the process runs.
                    while let Ok(job) = rx.recv() {
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                    }
                });
            match started {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "no spawner thread: servers will not die with the harness if it is killed");
                    None
                }
            }
        })
        .as_ref()
}

/// Spawns `cmd`, from the spawner thread when there is one, with the parent-death
/// signal set to SIGKILL. Blocks the calling thread for the fork and exec, as a spawn
/// in place would.
pub(super) fn spawn(mut cmd: Command) -> io::Result<Child> {
    let (Some(queue), Ok(runtime)) = (queue(), tokio::runtime::Handle::try_current()) else {
        return cmd.spawn();
    };
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The harness may have died between the fork and the prctl: the signal
            // would never come.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let (reply, answer) = sync_channel(1);
    let job: Job = Box::new(move || {
        // tokio registers the child and its pipes with the caller's runtime.
        let _entered = runtime.enter();
        let _ = reply.send(cmd.spawn());
    });
    queue
        .send(job)
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the spawner thread dropped the spawn"))?
}
