//! SIGINT, SIGTERM, SIGQUIT and SIGHUP, caught from the moment a command that starts
//! servers begins: a stdio server runs in a process group of its own, so the terminal's
//! Ctrl-C (or its closing, SIGHUP) never reaches it, and only the harness's own shutdown
//! (or its handles' drop) stops it. A signal left to its default action would end this
//! process at once and leave such servers behind, and the audit records buffered.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The exit code of a command ended by SIGHUP (128 + 1).
pub const HUNG_UP: u8 = 129;
/// The exit code of a command ended by SIGINT (128 + 2).
pub const INTERRUPTED: u8 = 130;
/// The exit code of a command ended by SIGQUIT (128 + 3).
pub const QUIT: u8 = 131;
/// The exit code of a command ended by SIGTERM (128 + 15).
pub const TERMINATED: u8 = 143;

/// The signals that stop a command, caught from when this is made until it is dropped
/// (and for the process's life after: tokio keeps its handler).
pub struct Stop {
    /// With the exit code each stands for.
    signals: Vec<(Signal, u8)>,
    /// The last signal taken, and when: a SIGHUP again within [`REPEAT`] is its echo,
    /// not a second signal.
    last: Option<(u8, std::time::Instant)>,
    /// `serve`'s SIGHUPs, caught from its start and handed to its config reload.
    hangup: Option<Signal>,
}

/// Whether a second signal ended the command at once: the exit then waits for no
/// telemetry export (the servers are killed as the runtime goes).
static AT_ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says that the command stops at once (a second signal), and marks it so.
pub fn stopping_at_once() {
    AT_ONCE.store(true, std::sync::atomic::Ordering::SeqCst);
    errln!("mcp-harness: stopping at once");
}

/// Whether [`stopping_at_once`] was said.
pub fn stopped_at_once() -> bool {
    AT_ONCE.load(std::sync::atomic::Ordering::SeqCst)
}

/// A SIGHUP repeated within this is one: a terminal closing often sends it twice
/// (the kernel's hangup, then the shell's to its jobs), and a second signal would end
/// the program at once, its servers killed rather than stopped.
const REPEAT: std::time::Duration = std::time::Duration::from_millis(250);

impl Stop {
    /// Catches SIGINT, SIGTERM, SIGQUIT and SIGHUP from now on. SIGHUP is left alone
    /// when it is ignored (`nohup`: the command is meant to outlive its terminal); a
    /// signal that cannot be caught is left as it was.
    pub fn install() -> Stop {
        // Read before any handler of tokio's replaces the disposition `nohup` set.
        let hangup_ignored = ignored(libc::SIGHUP);
        let mut stop = Self::catching();
        if !hangup_ignored && let Ok(s) = signal(SignalKind::hangup()) {
            stop.signals.push((s, HUNG_UP));
        }
        stop
    }

    /// [`Stop::install`] for `serve`, whose SIGHUP reloads its config: caught from now
    /// on (a SIGHUP while its servers start no longer ends it by its default action,
    /// its servers left running), and kept for the reload ([`Stop::take_hangup`]),
    /// which applies one that came meanwhile once it runs.
    pub fn install_serving() -> Stop {
        let mut stop = Self::catching();
        stop.hangup = signal(SignalKind::hangup()).ok();
        stop
    }

    /// SIGINT, SIGTERM and SIGQUIT, for the last moments of a command that has ended:
    /// a SIGHUP then is the echo of a terminal's closing that already ended it, not a
    /// person asking for an end at once.
    pub fn install_for_exit() -> Stop {
        Self::catching()
    }

    /// `serve`'s SIGHUPs since it started, for its config reload.
    pub fn take_hangup(&mut self) -> Option<Signal> {
        self.hangup.take()
    }

    /// SIGINT, SIGTERM and SIGQUIT; SIGINT and SIGQUIT only when they were not ignored
    /// when the program started (a shell starts its background jobs so: the terminal's
    /// Ctrl-C is for the job in front).
    fn catching() -> Stop {
        let signals = [
            (SignalKind::interrupt(), INTERRUPTED, Some(libc::SIGINT)),
            (SignalKind::terminate(), TERMINATED, None),
            (SignalKind::quit(), QUIT, Some(libc::SIGQUIT)),
        ]
        .into_iter()
        .filter(|(_, _, left)| !left.is_some_and(ignored))
        .filter_map(|(kind, code, _)| signal(kind).ok().map(|s| (s, code)))
        .collect();
        Stop {
            signals,
            last: None,
            hangup: None,
        }
    }

    /// Waits for any of the signals (one that came before this is waited for counts);
    /// the exit code it stands for.
    pub async fn recv(&mut self) -> u8 {
        if self.signals.is_empty() {
            return std::future::pending().await;
        }
        loop {
            let signals = &mut self.signals;
            let code = std::future::poll_fn(|cx| {
                for (s, code) in signals.iter_mut() {
                    if s.poll_recv(cx).is_ready() {
                        return std::task::Poll::Ready(*code);
                    }
                }
                std::task::Poll::Pending
            })
            .await;
            let now = std::time::Instant::now();
            // Only a hangup echoes: Ctrl-C pressed twice, however fast, is meant.
            let echo = code == HUNG_UP
                && self
                    .last
                    .is_some_and(|(last, at)| last == code && now.duration_since(at) < REPEAT);
            self.last = Some((code, now));
            if !echo {
                return code;
            }
        }
    }
}

/// Whether `signal`'s disposition is to be ignored (as `nohup` sets SIGHUP's).
fn ignored(signal: libc::c_int) -> bool {
    // SAFETY: a null new action only reads the current one into `old`, which is a
    // valid, zeroed `sigaction` owned here.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}
