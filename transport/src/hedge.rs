//! Hedged requests over a list of candidates: the one scheduler behind metadata reads
//! (one answer from any member of a partition) and stripe reads (k shards from any k of
//! the k + m nodes).
//!
//! The rule: start as many attempts as answers are wanted, best candidates first. An
//! attempt that fails hands over to the next candidate at once. When no answer arrived
//! within the hedge delay (the largest delay of the candidates tried so far), one more
//! candidate races each attempt still out (up to the answers still missing), and the
//! next hedge waits twice as long. It ends when enough answers arrived, when an attempt
//! gives a final answer (an error no other candidate would change), or when every
//! candidate was tried. Attempts still running then go on in the background and are
//! dropped when they finish: a peer that hangs is still seen hanging by the failure
//! detector, and the caller does not wait for it.

use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;

/// How one attempt ended.
#[derive(Debug)]
pub enum Attempt<T, E> {
    /// An answer.
    Ok(T),
    /// A failure another candidate may not have (unreachable, busy, corrupt).
    Retry(E),
    /// A failure that ends the race (the same from every candidate, such as ENOENT).
    Final(E),
}

/// What a race produced.
#[derive(Debug)]
pub struct Race<C, T, E> {
    /// The answers, in arrival order (at most the number wanted).
    pub ok: Vec<(C, T)>,
    /// The attempts that failed and could be retried elsewhere, in arrival order.
    pub failed: Vec<(C, E)>,
    /// The final failure that ended the race, if one did.
    pub fatal: Option<(C, E)>,
    /// Attempts started by a hedge (not by a failure or at the start).
    pub hedged: u32,
}

/// Runs attempts on `candidates` (best first) until `want` of them answered, one gave
/// a final answer, or all were tried. `delay` is a candidate's hedge delay; `start`
/// begins an attempt on a candidate (`true` when a hedge started it) and returns a
/// future that runs on its own task.
pub async fn race<C, T, E, F, Fut>(
    candidates: impl IntoIterator<Item = C>,
    want: usize,
    delay: impl Fn(&C) -> Duration,
    mut start: F,
) -> Race<C, T, E>
where
    C: Clone + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
    F: FnMut(C, bool) -> Fut,
    Fut: Future<Output = Attempt<T, E>> + Send + 'static,
{
    let mut next = candidates.into_iter();
    let mut out = Race {
        ok: Vec::new(),
        failed: Vec::new(),
        fatal: None,
        hedged: 0,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut pending = 0usize;
    let mut hedge = Duration::ZERO;
    let mut launch = |hedging: bool, pending: &mut usize, hedge: &mut Duration| -> bool {
        let Some(c) = next.next() else { return false };
        *hedge = (*hedge).max(delay(&c));
        let fut = start(c.clone(), hedging);
        let tx = tx.clone();
        tokio::spawn(async move {
            let r = fut.await;
            let _ = tx.send((c, r));
        });
        *pending += 1;
        true
    };
    for _ in 0..want {
        if !launch(false, &mut pending, &mut hedge) {
            break;
        }
    }
    let mut hedge_at = tokio::time::Instant::now() + hedge;
    while out.ok.len() < want && pending > 0 {
        match tokio::time::timeout_at(hedge_at, rx.recv()).await {
            Ok(Some((c, r))) => {
                pending -= 1;
                match r {
                    Attempt::Ok(t) => out.ok.push((c, t)),
                    Attempt::Final(e) => {
                        out.fatal = Some((c, e));
                        break;
                    }
                    Attempt::Retry(e) => {
                        out.failed.push((c, e));
                        launch(false, &mut pending, &mut hedge);
                    }
                }
            }
            // Every sender is held by this function: not reached while attempts are out.
            Ok(None) => break,
            Err(_) => {
                for _ in 0..pending.min(want - out.ok.len()) {
                    if launch(true, &mut pending, &mut hedge) {
                        out.hedged += 1;
                    }
                }
                hedge *= 2;
                hedge_at = tokio::time::Instant::now() + hedge;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::sync::Arc;
    use tokio::time::{Instant, sleep};

    /// A candidate that answers after `ms` milliseconds with `how`.
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Peer {
        id: u32,
        ms: u64,
        how: How,
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum How {
        Answer,
        Fail,
        Refuse,
    }

    fn peer(id: u32, ms: u64, how: How) -> Peer {
        Peer { id, ms, how }
    }

    /// Runs a race with a hedge delay of 10 ms; returns it, the ids started (with
    /// whether a hedge started them) and when it ended (ms of virtual time).
    async fn run(peers: Vec<Peer>, want: usize) -> (Race<Peer, u32, u32>, Vec<(u32, bool)>, u64) {
        let started = Arc::new(Mutex::new(Vec::new()));
        let t0 = Instant::now();
        let log = started.clone();
        let r = race(
            peers,
            want,
            |_| Duration::from_millis(10),
            move |p: Peer, hedging| {
                log.lock().push((p.id, hedging));
                async move {
                    sleep(Duration::from_millis(p.ms)).await;
                    match p.how {
                        How::Answer => Attempt::Ok(p.id),
                        How::Fail => Attempt::Retry(p.id),
                        How::Refuse => Attempt::Final(p.id),
                    }
                }
            },
        )
        .await;
        let ms = t0.elapsed().as_millis() as u64;
        let s = started.lock().clone();
        (r, s, ms)
    }

    fn ids(v: &[(Peer, u32)]) -> Vec<u32> {
        v.iter().map(|(_, t)| *t).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_first_candidate_is_the_only_one_asked() {
        let (r, started, ms) = run(vec![peer(1, 2, How::Answer), peer(2, 2, How::Answer)], 1).await;
        assert_eq!(ids(&r.ok), vec![1]);
        assert_eq!(started, vec![(1, false)]);
        assert_eq!((r.hedged, ms), (0, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_candidate_is_raced_after_the_hedge_delay() {
        let (r, started, ms) = run(vec![peer(1, 1000, How::Answer), peer(2, 3, How::Answer)], 1).await;
        assert_eq!(ids(&r.ok), vec![2]);
        assert_eq!(started, vec![(1, false), (2, true)]);
        assert_eq!((r.hedged, ms), (1, 13), "hedge at 10 ms, answer 3 ms later");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_hands_over_at_once_and_is_reported() {
        let (r, started, ms) = run(vec![peer(1, 1, How::Fail), peer(2, 2, How::Answer)], 1).await;
        assert_eq!(ids(&r.ok), vec![2]);
        assert_eq!(r.failed.iter().map(|(p, _)| p.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(started, vec![(1, false), (2, false)]);
        assert_eq!((r.hedged, ms), (0, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_final_answer_ends_the_race() {
        let (r, started, _) = run(vec![peer(1, 1, How::Refuse), peer(2, 1, How::Answer)], 1).await;
        assert!(r.ok.is_empty());
        assert_eq!(r.fatal.map(|(p, e)| (p.id, e)), Some((1, 1)));
        assert_eq!(started, vec![(1, false)]);
    }

    #[tokio::test(start_paused = true)]
    async fn k_answers_from_the_first_k_when_all_are_quick() {
        let peers = (1..=6).map(|i| peer(i, 5, How::Answer)).collect();
        let (r, started, ms) = run(peers, 4).await;
        assert_eq!(ids(&r.ok), vec![1, 2, 3, 4]);
        assert_eq!(started.len(), 4, "parity is not asked: {started:?}");
        assert_eq!(ms, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn hedges_race_only_the_missing_answers_and_back_off() {
        // Two of four hang: the first hedge (10 ms) races two more (five and six). Six
        // answers at once, five at 35 ms; the second hedge (at 30 ms) finds no
        // candidate left.
        let peers = vec![
            peer(1, 1, How::Answer),
            peer(2, 1, How::Answer),
            peer(3, 10_000, How::Answer),
            peer(4, 10_000, How::Answer),
            peer(5, 25, How::Answer),
            peer(6, 1, How::Answer),
        ];
        let (r, started, ms) = run(peers, 4).await;
        assert_eq!(ids(&r.ok), vec![1, 2, 6, 5]);
        assert_eq!(started[4..], [(5, true), (6, true)]);
        assert_eq!(r.hedged, 2);
        assert_eq!(ms, 35, "hedged at 10 ms; the slower hedge answered 25 ms later");
    }

    #[tokio::test(start_paused = true)]
    async fn not_enough_candidates_ends_with_what_there_is() {
        let peers = vec![peer(1, 1, How::Answer), peer(2, 1, How::Fail), peer(3, 1, How::Fail)];
        let (r, started, _) = run(peers, 2).await;
        assert_eq!(ids(&r.ok), vec![1]);
        assert_eq!(r.failed.len(), 2);
        assert_eq!(started.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_hedge_delay_doubles_after_each_round() {
        // Everything hangs except the third candidate: hedges at 10 ms and then 30 ms
        // (10 + 20) start the second and the third.
        let peers = vec![
            peer(1, 10_000, How::Answer),
            peer(2, 10_000, How::Answer),
            peer(3, 1, How::Answer),
        ];
        let (r, started, ms) = run(peers, 1).await;
        assert_eq!(ids(&r.ok), vec![3]);
        assert_eq!(started, vec![(1, false), (2, true), (3, true)]);
        assert_eq!(ms, 31);
    }
}
