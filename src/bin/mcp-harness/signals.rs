//! SIGINT and SIGTERM, caught from the moment a command that starts servers begins: a
//! stdio server runs in a process group of its own, so the terminal's Ctrl-C never
//! reaches it, and only the harness's own shutdown (or its handles' drop) stops it. A
//! signal left to its default action would end this process at once and leave such
//! servers behind.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The exit code of a command ended by SIGINT (128 + 2).
pub const INTERRUPTED: u8 = 130;
/// The exit code of a command ended by SIGTERM (128 + 15).
pub const TERMINATED: u8 = 143;

/// Both signals, caught from when this is made until it is dropped (and for the
/// process's life after: tokio keeps its handler).
pub struct Stop {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
}

impl Stop {
    /// Catches both signals from now on; one that cannot be caught is left as it was.
    pub fn install() -> Stop {
        Stop {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Waits for either signal (one that came before this is waited for counts); the
    /// exit code it stands for.
    pub async fn recv(&mut self) -> u8 {
        let interrupt = async {
            match self.interrupt.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        let terminate = async {
            match self.terminate.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = interrupt => INTERRUPTED,
            _ = terminate => TERMINATED,
        }
    }
}
