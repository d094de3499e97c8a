//! Failure detection: phi-accrual suspicion and hedge delays per peer.
//!
//! [`PhiAccrual`] is the detector of Hayashibara et al.: it keeps a window of
//! inter-arrival times (of heartbeats, or of request latencies) and turns the time
//! waited so far into a suspicion level φ = −log10(P(a sample is this late)), with a
//! normal distribution over the window (standard deviation floored, so a very regular
//! peer is not suspected after a few milliseconds of jitter). φ = 8 means "one chance in
//! 10⁸ that this peer is merely slow".
//!
//! [`PeerHealth`] is what a client keeps per peer: the latency window, the requests in
//! flight (a request unanswered for long makes φ grow, before any timeout fires), and
//! recent errors (a refused connection suspects the peer at once, for a cool-down that
//! doubles while errors repeat; after it, one request probes the peer again). From the
//! same window it derives the **hedge delay**: how long to wait for an answer before
//! asking another replica or reading parity.
//!
//! Pure state machines: every method takes `now`, nothing reads a clock or a socket.
//! [`Health`] is the thread-safe map of peers the client library shares.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Samples kept per window.
const WINDOW: usize = 64;

/// A phi-accrual failure detector over a window of intervals.
#[derive(Clone, Debug)]
pub struct PhiAccrual {
    samples: VecDeque<f64>,
    sum: f64,
    sum_sq: f64,
    min_std_ms: f64,
}

impl PhiAccrual {
    /// An empty detector whose standard deviation is never taken below `min_std`.
    pub fn new(min_std: Duration) -> Self {
        PhiAccrual {
            samples: VecDeque::with_capacity(WINDOW),
            sum: 0.0,
            sum_sq: 0.0,
            min_std_ms: min_std.as_secs_f64() * 1e3,
        }
    }

    /// Records one interval.
    pub fn record(&mut self, interval: Duration) {
        let x = interval.as_secs_f64() * 1e3;
        if self.samples.len() == WINDOW
            && let Some(old) = self.samples.pop_front()
        {
            self.sum -= old;
            self.sum_sq -= old * old;
        }
        self.samples.push_back(x);
        self.sum += x;
        self.sum_sq += x * x;
    }

    /// Samples in the window.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Mean and (floored) standard deviation of the window, in milliseconds.
    pub fn mean_std_ms(&self) -> Option<(f64, f64)> {
        let n = self.samples.len() as f64;
        if n == 0.0 {
            return None;
        }
        let mean = self.sum / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0);
        Some((mean, var.sqrt().max(self.min_std_ms)))
    }

    /// Suspicion after waiting `elapsed` since the last arrival (0 with no samples).
    pub fn phi(&self, elapsed: Duration) -> f64 {
        let Some((mean, std)) = self.mean_std_ms() else {
            return 0.0;
        };
        let t = elapsed.as_secs_f64() * 1e3;
        // P(X > t) for X ~ N(mean, std), with the logistic approximation of the normal
        // CDF that Akka and Cassandra use (accurate to ~1e-4, monotone, no erf needed).
        let y = (t - mean) / std;
        let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
        let p_later = if t > mean { e / (1.0 + e) } else { 1.0 - 1.0 / (1.0 + e) };
        -p_later.max(1e-300).log10()
    }
}

/// Settings of [`PeerHealth`].
#[derive(Clone, Copy, Debug)]
pub struct HealthConfig {
    /// φ at which a peer is suspected.
    pub phi_threshold: f64,
    /// Floor of the latency standard deviation.
    pub min_std: Duration,
    /// Hedge delay before any latency is known.
    pub default_hedge: Duration,
    /// Bounds of the hedge delay.
    pub min_hedge: Duration,
    /// Upper bound of the hedge delay.
    pub max_hedge: Duration,
    /// Cool-down after the first error; doubles per consecutive error.
    pub error_cooldown: Duration,
    /// Longest cool-down.
    pub max_cooldown: Duration,
}

impl Default for HealthConfig {
    /// φ 8, σ ≥ 2 ms, hedge 2–50 ms (20 ms before samples), cool-down 250 ms–5 s.
    fn default() -> Self {
        HealthConfig {
            phi_threshold: 8.0,
            min_std: Duration::from_millis(2),
            default_hedge: Duration::from_millis(20),
            min_hedge: Duration::from_millis(2),
            max_hedge: Duration::from_millis(50),
            error_cooldown: Duration::from_millis(250),
            max_cooldown: Duration::from_secs(5),
        }
    }
}

/// What a client knows about one peer.
#[derive(Clone, Debug)]
pub struct PeerHealth {
    cfg: HealthConfig,
    latency: PhiAccrual,
    inflight: HashMap<u64, Instant>,
    next_ticket: u64,
    errors: u32,
    suspect_until: Option<Instant>,
}

impl PeerHealth {
    /// A peer with no history.
    pub fn new(cfg: HealthConfig) -> Self {
        PeerHealth {
            cfg,
            latency: PhiAccrual::new(cfg.min_std),
            inflight: HashMap::new(),
            next_ticket: 0,
            errors: 0,
            suspect_until: None,
        }
    }

    /// A request starts; pass the ticket to [`PeerHealth::finish`].
    pub fn start(&mut self, now: Instant) -> u64 {
        self.next_ticket += 1;
        self.inflight.insert(self.next_ticket, now);
        self.next_ticket
    }

    /// A request ended: `ok` when the peer answered (any answer, errors included, shows
    /// it is alive), false when it could not be reached or timed out.
    pub fn finish(&mut self, ticket: u64, ok: bool, now: Instant) {
        let Some(started) = self.inflight.remove(&ticket) else {
            return;
        };
        if ok {
            self.latency.record(now.saturating_duration_since(started));
            self.errors = 0;
            self.suspect_until = None;
        } else {
            self.errors = self.errors.saturating_add(1);
            let factor = 1u32 << self.errors.saturating_sub(1).min(16);
            let cool = self
                .cfg
                .error_cooldown
                .saturating_mul(factor)
                .min(self.cfg.max_cooldown);
            self.suspect_until = Some(now + cool);
        }
    }

    /// A request was cancelled before an answer: forgotten, it says nothing about the
    /// peer. (Hedging callers let the slow request run to its end instead, so that a
    /// peer that hangs is suspected.)
    pub fn abandon(&mut self, ticket: u64) {
        self.inflight.remove(&ticket);
    }

    /// Suspicion now: from the oldest request still unanswered.
    pub fn phi(&self, now: Instant) -> f64 {
        self.inflight
            .values()
            .map(|t| self.latency.phi(now.saturating_duration_since(*t)))
            .fold(0.0, f64::max)
    }

    /// True when requests should avoid this peer: a recent error (within its
    /// cool-down) or an unanswered request past the φ threshold.
    pub fn suspected(&self, now: Instant) -> bool {
        self.suspect_until.is_some_and(|t| now < t) || self.phi(now) >= self.cfg.phi_threshold
    }

    /// How long to wait for this peer before hedging: mean + 4σ of its latencies,
    /// within the configured bounds.
    pub fn hedge_delay(&self) -> Duration {
        let Some((mean, std)) = self.latency.mean_std_ms() else {
            return self.cfg.default_hedge;
        };
        if self.latency.len() < 8 {
            return self.cfg.default_hedge;
        }
        Duration::from_secs_f64((mean + 4.0 * std) / 1e3).clamp(self.cfg.min_hedge, self.cfg.max_hedge)
    }

    /// Consecutive errors.
    pub fn errors(&self) -> u32 {
        self.errors
    }
}

/// Per-peer health, shared by all requests of a client.
#[derive(Debug)]
pub struct Health {
    cfg: HealthConfig,
    peers: Mutex<HashMap<SocketAddr, PeerHealth>>,
}

impl Default for Health {
    fn default() -> Self {
        Health::new(HealthConfig::default())
    }
}

/// A request in flight to a peer. Dropped without a verdict (its future was
/// cancelled, say because a hedge won), it is abandoned: forgotten without counting.
#[derive(Debug)]
pub struct Ticket {
    health: Arc<Health>,
    peer: SocketAddr,
    id: u64,
    done: bool,
}

impl Health {
    /// Empty, with `cfg` for every peer.
    pub fn new(cfg: HealthConfig) -> Self {
        Health {
            cfg,
            peers: Mutex::new(HashMap::new()),
        }
    }

    fn with<T>(&self, peer: SocketAddr, f: impl FnOnce(&mut PeerHealth) -> T) -> T {
        let mut g = self.peers.lock();
        f(g.entry(peer).or_insert_with(|| PeerHealth::new(self.cfg)))
    }

    /// A request to `peer` starts.
    pub fn start(self: &Arc<Self>, peer: SocketAddr) -> Ticket {
        let id = self.with(peer, |p| p.start(Instant::now()));
        Ticket {
            health: self.clone(),
            peer,
            id,
            done: false,
        }
    }

    /// True when `peer` is suspected now.
    pub fn suspected(&self, peer: SocketAddr) -> bool {
        self.peers
            .lock()
            .get(&peer)
            .is_some_and(|p| p.suspected(Instant::now()))
    }

    /// The hedge delay for `peer`.
    pub fn hedge_delay(&self, peer: SocketAddr) -> Duration {
        self.peers
            .lock()
            .get(&peer)
            .map_or(self.cfg.default_hedge, PeerHealth::hedge_delay)
    }

    /// Suspected peers among `peers`.
    pub fn suspects(&self, peers: &[SocketAddr]) -> Vec<bool> {
        let now = Instant::now();
        let g = self.peers.lock();
        peers
            .iter()
            .map(|a| g.get(a).is_some_and(|p| p.suspected(now)))
            .collect()
    }
}

impl Ticket {
    /// The request ended (see [`PeerHealth::finish`]).
    pub fn finish(mut self, ok: bool) {
        self.done = true;
        let id = self.id;
        self.health.with(self.peer, |p| p.finish(id, ok, Instant::now()));
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            let id = self.id;
            self.health.with(self.peer, |p| p.abandon(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn phi_grows_with_silence_and_is_low_within_the_usual_interval() {
        let mut d = PhiAccrual::new(ms(50));
        for i in 0..50 {
            d.record(ms(500 + (i % 5) * 10));
        }
        assert!(d.phi(ms(400)) < 0.5, "{}", d.phi(ms(400)));
        assert!(d.phi(ms(520)) < 1.0);
        assert!(d.phi(ms(800)) > 3.0);
        assert!(d.phi(ms(1000)) > 8.0);
        let mut last = 0.0;
        for t in (0..3000).step_by(50) {
            let p = d.phi(ms(t));
            assert!(p >= last, "phi is monotone");
            last = p;
        }
        assert!(last.is_finite());
    }

    #[test]
    fn an_unanswered_request_becomes_suspect_and_an_answer_clears_it() {
        let cfg = HealthConfig::default();
        let mut p = PeerHealth::new(cfg);
        let t0 = Instant::now();
        for i in 0..20 {
            let at = t0 + ms(i * 10);
            let t = p.start(at);
            p.finish(t, true, at + ms(1));
        }
        let hang = p.start(t0 + ms(300));
        assert!(!p.suspected(t0 + ms(302)));
        assert!(p.suspected(t0 + ms(330)), "30 ms against a 1 ms norm");
        p.finish(hang, true, t0 + ms(331));
        assert!(!p.suspected(t0 + ms(332)));
        assert!(p.hedge_delay() >= cfg.min_hedge && p.hedge_delay() <= cfg.max_hedge);
    }

    #[test]
    fn errors_suspect_at_once_with_a_doubling_cooldown_then_a_probe_clears() {
        let cfg = HealthConfig::default();
        let mut p = PeerHealth::new(cfg);
        let t0 = Instant::now();
        let t = p.start(t0);
        p.finish(t, false, t0);
        assert!(p.suspected(t0 + ms(1)));
        assert!(!p.suspected(t0 + cfg.error_cooldown + ms(1)));
        let t = p.start(t0 + ms(300));
        p.finish(t, false, t0 + ms(300));
        assert!(
            p.suspected(t0 + ms(300) + cfg.error_cooldown + ms(1)),
            "second error: doubled"
        );
        assert!(!p.suspected(t0 + ms(300) + cfg.error_cooldown * 2 + ms(1)));
        for i in 0..30 {
            let t = p.start(t0);
            p.finish(t, false, t0 + ms(i));
        }
        assert!(
            !p.suspected(t0 + ms(30) + cfg.max_cooldown + ms(1)),
            "cool-down is bounded"
        );
        let t = p.start(t0 + ms(10_000));
        p.finish(t, true, t0 + ms(10_001));
        assert_eq!(p.errors(), 0);
        assert!(!p.suspected(t0 + ms(10_002)));
    }

    #[test]
    fn hedge_delay_follows_latency_within_bounds() {
        let cfg = HealthConfig::default();
        let mut p = PeerHealth::new(cfg);
        assert_eq!(p.hedge_delay(), cfg.default_hedge);
        let t0 = Instant::now();
        for _ in 0..30 {
            let t = p.start(t0);
            p.finish(t, true, t0 + ms(5));
        }
        let h = p.hedge_delay();
        assert!(h >= ms(5) && h <= ms(20), "{h:?}");
        for _ in 0..64 {
            let t = p.start(t0);
            p.finish(t, true, t0 + ms(400));
        }
        assert_eq!(p.hedge_delay(), cfg.max_hedge);
    }
}
