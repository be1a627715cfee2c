//! Restart policy in the OTP sense, as plain values that take `now`: which exits are
//! restarted, how long to wait (exponential backoff with jitter, from `backon`), when the
//! backoff resets (after a healthy period), and when to give up (more than
//! `max_restarts` restarts within `within`: the server is marked `failed`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use serde::{Deserialize, Serialize};

use crate::util::duration;
use crate::util::invalid::Invalid;

/// Which exits of a server's connection are restarted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestartPolicy {
    /// Always restarted (the default): a server is expected to stay up.
    #[default]
    Permanent,
    /// Restarted only when it ends abnormally (a crash, a non-zero exit, a broken link);
    /// a clean exit (status 0) leaves it `stopped`.
    Transient,
    /// Never restarted: when it ends, it is `stopped`.
    Temporary,
}

/// Timing of restarts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RestartConfig {
    /// Which exits are restarted.
    pub policy: RestartPolicy,
    /// First backoff delay.
    #[serde(with = "duration")]
    pub min_delay: Duration,
    /// Largest backoff delay before jitter (jitter adds up to the same again).
    #[serde(with = "duration")]
    pub max_delay: Duration,
    /// A connection up this long resets the backoff to `min_delay`.
    #[serde(with = "duration")]
    pub healthy_after: Duration,
    /// Restarts allowed within `within`; one more marks the server `failed`.
    pub max_restarts: u32,
    /// The window of the intensity limit.
    #[serde(with = "duration")]
    pub within: Duration,
}

impl Default for RestartConfig {
    fn default() -> Self {
        RestartConfig {
            policy: RestartPolicy::Permanent,
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(30),
            healthy_after: Duration::from_secs(60),
            // The first ten delays (0.1 s doubling, then 30 s) add up to 81 s, at most
            // twice that with jitter, all within the window: a server that fails at
            // once for longer than that is given up, one down for less (a redeploy, a
            // network blip) heals by itself. (Attempts that each take long to fail
            // may never fit ten in the window: they go on being restarted.)
            max_restarts: 10,
            within: Duration::from_secs(180),
        }
    }
}

impl RestartConfig {
    /// Checks the timings: a backoff whose floor is above its ceiling, a zero floor
    /// (it doubles to zero: no backoff at all, restarts back to back), or a zero window,
    /// is a mistake to report, not to clamp.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.min_delay.is_zero() {
            return Err(Invalid::new(
                "min_delay",
                "must be more than zero (the backoff doubles from it)",
            ));
        }
        if self.min_delay > self.max_delay {
            return Err(Invalid::new(
                "min_delay",
                format!(
                    "{:?} is more than max_delay {:?}",
                    self.min_delay, self.max_delay
                ),
            ));
        }
        if self.within.is_zero() {
            return Err(Invalid::new("within", "must be more than zero"));
        }
        if self.healthy_after.is_zero() {
            return Err(Invalid::new("healthy_after", "must be more than zero"));
        }
        Ok(())
    }
}

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// The server exited cleanly (status 0).
    Normal,
    /// Anything else.
    Abnormal,
}

/// What to do after a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start again after this delay.
    Restart(Duration),
    /// Past the intensity limit: mark the server `failed` with this reason.
    GiveUp(String),
    /// The policy does not restart this exit: mark the server `stopped`.
    Stop,
}

/// The restart history of one server.
#[derive(Debug)]
pub struct RestartTracker {
    config: RestartConfig,
    max_restarts: u32,
    recent: VecDeque<Instant>,
    backoff: ExponentialBackoff,
    /// When the last restart decided is due: an actor rebuilt while it waited out that
    /// backoff waits out the rest, charged nothing more (no process was lost).
    due: Option<Instant>,
}

impl RestartTracker {
    /// A tracker allowing `max_restarts` restarts within `config.within` (the caller
    /// passes the effective limit: `max_retries` in older files overrides it).
    pub fn new(config: RestartConfig, max_restarts: u32) -> RestartTracker {
        let backoff = Self::backoff(&config);
        RestartTracker {
            config,
            max_restarts,
            recent: VecDeque::new(),
            backoff,
            due: None,
        }
    }

    fn backoff(config: &RestartConfig) -> ExponentialBackoff {
        ExponentialBuilder::new()
            .with_min_delay(config.min_delay)
            .with_max_delay(config.max_delay)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// Decides what follows a connection that ended at `now`, having been up since
    /// `up_since` (`None` if it never got ready).
    pub fn on_exit(&mut self, now: Instant, up_since: Option<Instant>, exit: ExitKind) -> Decision {
        match (self.config.policy, exit) {
            (RestartPolicy::Temporary, _) | (RestartPolicy::Transient, ExitKind::Normal) => {
                return Decision::Stop;
            }
            _ => {}
        }
        self.forgive_if_healthy(now, up_since);
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > self.config.within)
        {
            self.recent.pop_front();
        }
        if self.recent.len() as u32 >= self.max_restarts {
            return Decision::GiveUp(format!(
                "more than {} restarts within {:?}",
                self.max_restarts, self.config.within
            ));
        }
        self.recent.push_back(now);
        let delay = self.backoff.next().unwrap_or(self.config.max_delay);
        self.due = Some(crate::util::duration::after(now, delay));
        Decision::Restart(delay)
    }

    /// A connection up since `up_since` that ends now (by an exit, or handed over to
    /// a new one) was healthy long enough: the backoff starts over.
    pub fn forgive_if_healthy(&mut self, now: Instant, up_since: Option<Instant>) {
        if up_since.is_some_and(|t| now.saturating_duration_since(t) >= self.config.healthy_after) {
            self.backoff = Self::backoff(&self.config);
        }
    }

    /// When the restart decided last is due: `None` before any, and once its
    /// connection is being made ([`RestartTracker::connecting`]).
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// A connection is being made: no backoff is being waited out any more.
    pub fn connecting(&mut self) {
        self.due = None;
    }

    /// Forgets the history (an explicit restart by the operator).
    pub fn reset(&mut self) {
        self.recent.clear();
        self.backoff = Self::backoff(&self.config);
        self.due = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(policy: RestartPolicy) -> RestartConfig {
        RestartConfig {
            policy,
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            healthy_after: Duration::from_secs(10),
            max_restarts: 5,
            within: Duration::from_secs(5),
        }
    }

    fn delay(d: Decision) -> Duration {
        match d {
            Decision::Restart(d) => d,
            other => panic!("expected a restart, got {other:?}"),
        }
    }

    #[test]
    fn a_zero_floor_or_window_is_refused_not_clamped() {
        assert!(RestartConfig::default().validate().is_ok());
        let zero_floor = RestartConfig {
            min_delay: Duration::ZERO,
            ..RestartConfig::default()
        };
        let e = zero_floor.validate().expect_err("no backoff at all");
        assert!(e.to_string().contains("min_delay"), "{e}");
        let zero_window = RestartConfig {
            within: Duration::ZERO,
            ..RestartConfig::default()
        };
        assert!(zero_window.validate().is_err());
    }

    // With the defaults, a server that fails as soon as it starts is restarted ten
    // times over at least 81 s (an outage shorter than that heals), then given up.
    #[test]
    fn the_defaults_give_up_after_about_a_minute_of_failing_not_seconds() {
        let mut t = RestartTracker::new(RestartConfig::default(), 10);
        let mut now = Instant::now();
        let start = now;
        for _ in 0..10 {
            now += delay(t.on_exit(now, None, ExitKind::Abnormal));
        }
        assert!(
            now - start >= Duration::from_millis(81_100),
            "{:?}",
            now - start
        );
        let d = t.on_exit(now, None, ExitKind::Abnormal);
        assert!(matches!(d, Decision::GiveUp(_)), "{:?} {d:?}", now - start);
    }

    #[test]
    fn backoff_grows_with_jitter_and_stays_bounded() {
        let mut t = RestartTracker::new(config(RestartPolicy::Permanent), 100);
        let now = Instant::now();
        let delays: Vec<Duration> = (0..8)
            .map(|i| delay(t.on_exit(now + Duration::from_secs(i * 10), None, ExitKind::Abnormal)))
            .collect();
        assert!(delays[0] >= Duration::from_millis(100) && delays[0] <= Duration::from_millis(200));
        assert!(delays[2] >= Duration::from_millis(400), "{delays:?}");
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(2)),
            "max delay plus jitter: {delays:?}"
        );
    }

    #[test]
    fn a_healthy_period_resets_the_backoff() {
        let mut t = RestartTracker::new(config(RestartPolicy::Permanent), 100);
        let start = Instant::now();
        for i in 0..5 {
            t.on_exit(start + Duration::from_secs(i * 6), None, ExitKind::Abnormal);
        }
        let later = start + Duration::from_secs(100);
        let d = delay(t.on_exit(
            later,
            Some(later - Duration::from_secs(11)),
            ExitKind::Abnormal,
        ));
        assert!(
            d <= Duration::from_millis(200),
            "back to the first delay: {d:?}"
        );
    }

    #[test]
    fn more_than_n_restarts_within_t_gives_up_and_old_ones_expire() {
        let mut t = RestartTracker::new(config(RestartPolicy::Permanent), 3);
        let now = Instant::now();
        for _ in 0..3 {
            delay(t.on_exit(now, None, ExitKind::Abnormal));
        }
        assert!(matches!(
            t.on_exit(now, None, ExitKind::Abnormal),
            Decision::GiveUp(_)
        ));
        // Outside the window the history no longer counts.
        delay(t.on_exit(now + Duration::from_secs(6), None, ExitKind::Abnormal));
    }

    #[test]
    fn temporary_never_restarts_and_transient_only_after_a_crash() {
        let now = Instant::now();
        let mut temp = RestartTracker::new(config(RestartPolicy::Temporary), 3);
        assert_eq!(temp.on_exit(now, None, ExitKind::Abnormal), Decision::Stop);
        let mut trans = RestartTracker::new(config(RestartPolicy::Transient), 3);
        assert_eq!(trans.on_exit(now, None, ExitKind::Normal), Decision::Stop);
        delay(trans.on_exit(now, None, ExitKind::Abnormal));
        let mut perm = RestartTracker::new(config(RestartPolicy::Permanent), 3);
        delay(perm.on_exit(now, None, ExitKind::Normal));
    }
}
