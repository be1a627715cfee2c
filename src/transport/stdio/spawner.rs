//! Threads that fork every stdio server, so that a server dies with the harness.
//!
//! Linux sends a child its parent-death signal (`PR_SET_PDEATHSIG`) when the *thread*
//! that forked it exits, not the process. tokio's threads come and go (its blocking
//! pool's after 10 s idle; a worker after `block_in_place`), so a server forked on one
//! of them would be killed at random. These threads live as long as the process: they
//! never return, and a panic in a job is caught. So the signal comes only when the
//! harness process is gone, SIGKILLed included, when no `Drop` runs.
//!
//! A fork waits for its child's `exec`, which a command on a dead network mount never
//! ends: each such spawn holds one thread, a caller waits for it at most
//! [`SPAWN_BOUND`], and the next spawn finds another thread (one is started when none
//! is idle, up to [`MOST_THREADS`]). A command (with its working directory) whose
//! spawn is stuck past that bound is not forked again until that spawn ends: each
//! restart of its server would hold one more thread, until none was left for any
//! other server ([`InFlight`]).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::process::{Child, Command};

/// A spawn to run, and whether a thread was reserved for it when it was queued (an
/// idle one, or one started for it); one that was not takes a thread from the idle
/// count when it is picked up.
struct Job {
    run: Box<dyn FnOnce() + Send>,
    reserved: bool,
}

/// Spawner threads at most: each one stuck in an `exec` that never returns holds one.
const MOST_THREADS: usize = 16;

/// How long a caller waits for its server's fork and exec.
const SPAWN_BOUND: Duration = Duration::from_secs(30);

struct Pool {
    queue: Sender<Job>,
    jobs: Arc<Mutex<Receiver<Job>>>,
    threads: AtomicUsize,
    /// Threads waiting for a job and not reserved for one queued.
    idle: Arc<AtomicUsize>,
}

/// Takes one from `count` if it is not zero.
fn take_one(count: &AtomicUsize) -> bool {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl Pool {
    /// Starts one more thread, up to [`MOST_THREADS`]: reserved for the job about to
    /// be queued, or idle; false when it cannot be.
    fn grow(&self, reserved: bool) -> bool {
        let room = self
            .threads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MOST_THREADS).then_some(n + 1)
            })
            .is_ok();
        if !room {
            return false;
        }
        if !reserved {
            self.idle.fetch_add(1, Ordering::SeqCst);
        }
        let (jobs, idle) = (self.jobs.clone(), self.idle.clone());
        let started = std::thread::Builder::new()
            .name("mcp-harness-spawner".into())
            .spawn(move || {
                loop {
                    // The queue's sender is in a static: `recv` fails only once it is
                    // gone, which it never is while the process runs.
                    let Ok(job) = jobs.lock().recv() else {
                        return;
                    };
                    // An unreserved job takes its thread from the idle count; if a
                    // reservation took that count first, this thread serves it next,
                    // and is not counted idle again.
                    let counted = job.reserved || take_one(&idle);
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(job.run));
                    if counted {
                        idle.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        match started {
            Ok(_) => true,
            Err(e) => {
                self.threads.fetch_sub(1, Ordering::SeqCst);
                if !reserved {
                    take_one(&self.idle);
                }
                tracing::warn!(error = %e, "no spawner thread could be started");
                false
            }
        }
    }

    /// Queues `run` with a thread reserved for it: an idle one, else one started for
    /// it; at [`MOST_THREADS`], it waits for the first thread to finish its spawn.
    fn submit(&self, run: Box<dyn FnOnce() + Send>) -> bool {
        let reserved = take_one(&self.idle) || self.grow(true);
        self.threads.load(Ordering::SeqCst) > 0 && self.queue.send(Job { run, reserved }).is_ok()
    }
}

/// What a spawn runs: its program and working directory (where a mount that hangs
/// would hold its exec).
type Runs = (OsString, Option<PathBuf>);

/// The spawns queued or running, each by what it runs and when it was queued.
#[derive(Default)]
struct InFlight {
    next: u64,
    spawns: HashMap<u64, (Runs, Instant)>,
}

impl InFlight {
    /// A place for a spawn of `runs` queued `now`; refused, with how long it has been
    /// stuck, while another spawn of it has been in flight for `bound` or more.
    fn enter(&mut self, runs: Runs, now: Instant, bound: Duration) -> Result<u64, Duration> {
        let oldest = (self.spawns.values())
            .filter(|(r, _)| *r == runs)
            .map(|(_, at)| *at)
            .min();
        if let Some(since) = oldest
            && now.saturating_duration_since(since) >= bound
        {
            return Err(now.saturating_duration_since(since));
        }
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        self.spawns.insert(id, (runs, now));
        Ok(id)
    }
}

/// The spawns in flight in this process.
fn in_flight() -> &'static Mutex<InFlight> {
    static IN_FLIGHT: OnceLock<Mutex<InFlight>> = OnceLock::new();
    IN_FLIGHT.get_or_init(Default::default)
}

/// A spawn's place in [`in_flight`], given up when dropped: its job done, skipped (its
/// caller gone), or never queued.
struct Place(u64);

impl Drop for Place {
    fn drop(&mut self) {
        in_flight().lock().spawns.remove(&self.0);
    }
}

/// The pool, or `None` when not even its first thread could be started.
fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (queue, jobs) = channel::<Job>();
        let pool = Pool {
            queue,
            jobs: Arc::new(Mutex::new(jobs)),
            threads: AtomicUsize::new(0),
            idle: Arc::new(AtomicUsize::new(0)),
        };
        if pool.grow(false) {
            Some(pool)
        } else {
            tracing::warn!("servers will not die with the harness if it is killed");
            None
        }
    })
    .as_ref()
}

/// Spawns `cmd` from a spawner thread when there is one, with the parent-death signal
/// set to SIGKILL, and hands the outcome to `owned` there: what it makes (the process's
/// owner, which kills it when dropped) is what a caller that stopped waiting drops,
/// after [`SPAWN_BOUND`] or cancelled, so no process is left unowned.
pub(super) async fn spawn<T: Send + 'static>(
    mut cmd: Command,
    owned: impl FnOnce(io::Result<Child>) -> T + Send + 'static,
) -> io::Result<T> {
    let (Some(pool), Ok(runtime)) = (pool(), tokio::runtime::Handle::try_current()) else {
        return Ok(owned(cmd.spawn()));
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
    let runs = (
        cmd.as_std().get_program().to_owned(),
        cmd.as_std().get_current_dir().map(PathBuf::from),
    );
    let place = match in_flight().lock().enter(runs, Instant::now(), SPAWN_BOUND) {
        Ok(id) => Place(id),
        Err(stuck) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "an earlier start of this command has been stuck for {} s (its command or working directory on a mount that hangs?); it is not started again until that one ends",
                    stuck.as_secs()
                ),
            ));
        }
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = Box::new(move || {
        let _place = place;
        // A caller gone (past its bound, cancelled, its runtime shut down) before its
        // turn: nothing is forked for nobody.
        if reply.is_closed() {
            return;
        }
        // tokio registers the child and its pipes with the caller's runtime.
        let _entered = runtime.enter();
        // Sent back, or dropped here if the caller is gone.
        let _ = reply.send(owned(cmd.spawn()));
    });
    if !pool.submit(job) {
        return Err(io::Error::other("no spawner thread takes the spawn"));
    }
    match tokio::time::timeout(SPAWN_BOUND, answer).await {
        Ok(Ok(made)) => Ok(made),
        Ok(Err(_)) => Err(io::Error::other("the spawner thread dropped the spawn")),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the process did not start within {} s (its command or working directory on a mount that hangs?)",
                SPAWN_BOUND.as_secs()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A spawn stuck in its exec (a command on a mount that hangs) holds its own
    // thread: the next spawn finds another. Before, one thread forked every server, and
    // one stuck exec held every start behind it.
    #[test]
    fn a_stuck_spawn_holds_one_thread_not_the_next_spawn() {
        let pool = pool().expect("a spawner thread");
        // Two stuck, queued at once with the next (as servers start together): each
        // is given a thread of its own when it is queued, not when a thread is free.
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let stuck = Arc::new(Mutex::new(stuck));
        for _ in 0..2 {
            let stuck = stuck.clone();
            assert!(pool.submit(Box::new(move || {
                let _ = stuck.lock().recv_timeout(Duration::from_secs(30));
            })));
        }
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        assert!(pool.submit(Box::new(move || {
            let _ = done_tx.send(());
        })));
        let ran = done.recv_timeout(Duration::from_secs(10));
        for _ in 0..2 {
            let _ = release.send(());
        }
        assert!(ran.is_ok(), "the next spawn waited behind the stuck ones");
        assert!(pool.threads.load(Ordering::SeqCst) <= MOST_THREADS);
    }

    // A command whose spawn is stuck past the bound is not queued again (each restart
    // of its server would hold one more thread, until no server could start); others,
    // and spawns of it within the bound (servers starting together), are.
    #[test]
    fn a_command_stuck_past_the_bound_is_not_spawned_again() {
        let mut in_flight = InFlight::default();
        let bound = Duration::from_secs(30);
        let runs = |p: &str| (OsString::from(p), None);
        let t0 = Instant::now();
        let stuck = in_flight
            .enter(runs("/nfs/server"), t0, bound)
            .expect("the first");
        let within = t0 + Duration::from_secs(5);
        assert!(in_flight.enter(runs("/nfs/server"), within, bound).is_ok());
        let past = t0 + Duration::from_secs(31);
        assert_eq!(
            in_flight.enter(runs("/nfs/server"), past, bound),
            Err(Duration::from_secs(31))
        );
        let elsewhere = (OsString::from("/nfs/server"), Some(PathBuf::from("/tmp")));
        assert!(
            in_flight.enter(elsewhere, past, bound).is_ok(),
            "another directory"
        );
        assert!(in_flight.enter(runs("cat"), past, bound).is_ok());
        // Once the stuck one ends, and the one within the bound is recent enough.
        in_flight.spawns.remove(&stuck);
        assert!(in_flight.enter(runs("/nfs/server"), past, bound).is_ok());
    }
}
