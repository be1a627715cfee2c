//! How a server process ended, as a type: the restart policy decides on it (a clean
//! exit is not a crash), so it must never be compared as text.

use std::fmt;

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl ExitStatus {
    /// True for `exit(0)`.
    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }
}

impl From<std::process::ExitStatus> for ExitStatus {
    fn from(status: std::process::ExitStatus) -> ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitStatus::Code(code),
            (None, Some(signal)) => ExitStatus::Signal(signal),
            // Neither a code nor a signal: only stopped/continued states, which `wait`
            // does not report for a reaped child.
            (None, None) => ExitStatus::Code(-1),
        }
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exit status {c}"),
            ExitStatus::Signal(s) => write!(f, "killed by signal {s}"),
        }
    }
}
