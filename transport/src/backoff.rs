//! Reconnect backoff for one peer: a pure state machine over explicit instants.

use std::time::{Duration, Instant};

/// Exponential backoff after failed connects. No clock inside: callers pass `now`.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: String,
}

impl Backoff {
    /// A backoff that starts at `initial` and doubles up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            failures: 0,
            retry_at: None,
            last_error: String::new(),
        }
    }

    /// `Ok` when a connect may be tried at `now`; otherwise how long to wait and the
    /// last error seen.
    pub fn check(&self, now: Instant) -> Result<(), (Duration, &str)> {
        match self.retry_at {
            Some(at) if at > now => Err((at - now, &self.last_error)),
            _ => Ok(()),
        }
    }

    /// Records a failed connect at `now`; returns the delay before the next try.
    pub fn on_failure(&mut self, now: Instant, error: String) -> Duration {
        let shift = self.failures.min(20);
        let delay = self.initial.saturating_mul(1u32 << shift).min(self.max);
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(now + delay);
        self.last_error = error;
        delay
    }

    /// Records a successful connect: the next failure starts from `initial` again.
    pub fn on_success(&mut self) {
        self.failures = 0;
        self.retry_at = None;
        self.last_error.clear();
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let t0 = Instant::now();
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(300));
        assert!(b.check(t0).is_ok());
        assert_eq!(b.on_failure(t0, "refused".into()), Duration::from_millis(50));
        let (wait, err) = b.check(t0 + Duration::from_millis(10)).expect_err("backing off");
        assert_eq!(wait, Duration::from_millis(40));
        assert_eq!(err, "refused");
        assert!(b.check(t0 + Duration::from_millis(50)).is_ok());
        assert_eq!(b.on_failure(t0, String::new()), Duration::from_millis(100));
        assert_eq!(b.on_failure(t0, String::new()), Duration::from_millis(200));
        assert_eq!(b.on_failure(t0, String::new()), Duration::from_millis(300));
        for _ in 0..100 {
            assert_eq!(b.on_failure(t0, String::new()), Duration::from_millis(300));
        }
        b.on_success();
        assert_eq!(b.failures(), 0);
        assert!(b.check(t0).is_ok());
        assert_eq!(b.on_failure(t0, String::new()), Duration::from_millis(50));
    }
}
