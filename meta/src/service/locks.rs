//! Inode locks held by coordinators while they read and change a directory.
//!
//! A lock host is the primary of the inode's partition. A coordinator takes all keys at
//! one host at once or none (waiting a little for busy ones), hosts in ascending node
//! order; if a host refuses, the coordinator releases everything and tries again later,
//! so there is no deadlock. Every lock has a lease, so a coordinator that dies frees its
//! keys after the lease at the latest; normally they go sooner, once the partition of
//! its operation (the lock's anchor) has a new primary that redid what it left
//! (`MetaNode::sweep_intents`, decision 0009).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// An owner id for an operation coordinated by node `node`: the node id in the high
/// 24 bits, `nonce` in the rest.
pub fn owner_id(node: u64, nonce: u64) -> u64 {
    (node << 40) | (nonce & ((1 << 40) - 1))
}

/// The coordinating node of an owner id made by [`owner_id`].
pub fn owner_node(owner: u64) -> u64 {
    owner >> 40
}

/// One held key.
#[derive(Clone, Copy, Debug)]
struct Held {
    owner: u64,
    /// Lease end.
    until: Instant,
    /// When the owner took or last renewed it.
    taken: Instant,
    /// The partition of the owner's operation (where its intent would be).
    anchor: u32,
}

/// The locks hosted by one node.
#[derive(Default)]
pub struct LockTable {
    held: Mutex<HashMap<u64, Held>>,
    freed: Notify,
}

impl LockTable {
    /// Tries to take every key for `owner` (an operation anchored in partition
    /// `anchor`), waiting up to `wait` for busy ones. True when all are held (keys
    /// `owner` already holds count as taken; their lease is renewed).
    pub async fn lock(&self, keys: &[u64], owner: u64, anchor: u32, lease: Duration, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_lock(keys, owner, anchor, lease) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            // A lease may run out without a release, so look again now and then.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(50)), freed).await;
        }
    }

    fn try_lock(&self, keys: &[u64], owner: u64, anchor: u32, lease: Duration) -> bool {
        let now = Instant::now();
        let mut held = self.held.lock();
        // Expired leases go, so the table holds only live locks.
        held.retain(|_, h| h.until > now);
        let free = keys
            .iter()
            .all(|k| held.get(k).is_none_or(|h| h.owner == owner || h.until <= now));
        if free {
            for k in keys {
                held.insert(
                    *k,
                    Held {
                        owner,
                        until: now + lease,
                        taken: now,
                        anchor,
                    },
                );
            }
        }
        free
    }

    /// Releases the keys `owner` holds.
    pub fn release(&self, keys: &[u64], owner: u64) {
        let mut held = self.held.lock();
        for k in keys {
            if held.get(k).is_some_and(|h| h.owner == owner) {
                held.remove(k);
            }
        }
        drop(held);
        self.freed.notify_waiters();
    }

    /// The anchors of the locks for which `dead(coordinator node, taken at)` holds:
    /// the partitions whose new primaries must have redone what those coordinators
    /// left before their keys may go.
    pub fn anchors_of(&self, dead: impl Fn(u64, Instant) -> bool) -> Vec<u32> {
        let held = self.held.lock();
        let mut a: Vec<u32> = held
            .values()
            .filter(|h| dead(owner_node(h.owner), h.taken))
            .map(|h| h.anchor)
            .collect();
        a.sort_unstable();
        a.dedup();
        a
    }

    /// Releases every lock for which `dead(coordinator node, taken at, anchor)` holds
    /// (see [`owner_node`]): a coordinator marked Down will not finish, so its keys need
    /// not wait out their lease. `taken at` tells the locks of a node's earlier life
    /// (taken before it was seen down) from those it takes after it came back.
    pub fn release_coordinators(&self, dead: impl Fn(u64, Instant, u32) -> bool) -> usize {
        let mut held = self.held.lock();
        let before = held.len();
        held.retain(|_, h| !dead(owner_node(h.owner), h.taken, h.anchor));
        let n = before - held.len();
        drop(held);
        if n > 0 {
            self.freed.notify_waiters();
        }
        n
    }

    /// Forgets the locks on keys for which `moved(key)` holds (this node stopped hosting
    /// them: their partition has another primary). Returns how many went. A node that
    /// hosts them again later starts without them: their owners' releases could not
    /// reach it while it was away, and would otherwise hold the keys for a lease.
    pub fn forget_keys(&self, moved: impl Fn(u64) -> bool) -> usize {
        let mut held = self.held.lock();
        let before = held.len();
        held.retain(|k, _| !moved(*k));
        let n = before - held.len();
        drop(held);
        if n > 0 {
            self.freed.notify_waiters();
        }
        n
    }

    /// Forgets every lock (this node stopped being the host).
    pub fn clear(&self) {
        self.held.lock().clear();
        self.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn locks_of_a_dead_coordinator_are_released() {
        let t = LockTable::default();
        let (a, b) = (owner_id(3, 77), owner_id(4, 77));
        assert_eq!(owner_node(a), 3);
        let lease = Duration::from_secs(30);
        assert!(t.lock(&[10, 11], a, 5, lease, Duration::ZERO).await);
        assert!(t.lock(&[12], a, 6, lease, Duration::ZERO).await);
        assert!(!t.lock(&[10], b, 5, lease, Duration::ZERO).await);
        assert_eq!(t.anchors_of(|n, _| n == 3), vec![5, 6]);
        // Only those whose anchor has settled go.
        assert_eq!(t.release_coordinators(|n, _, anchor| n == 3 && anchor == 5), 2);
        assert!(t.lock(&[10], b, 5, lease, Duration::ZERO).await);
        assert!(!t.lock(&[12], b, 5, lease, Duration::ZERO).await);
        assert_eq!(t.anchors_of(|n, _| n == 3), vec![6]);
    }

    #[tokio::test]
    async fn a_restarted_coordinators_old_locks_go_and_its_new_ones_stay() {
        let t = LockTable::default();
        let lease = Duration::from_secs(30);
        let (old, new) = (owner_id(6, 1), owner_id(6, 2));
        assert!(t.lock(&[1], old, 0, lease, Duration::ZERO).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let seen_down = Instant::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
        // Back up: it coordinates again.
        assert!(t.lock(&[2], new, 0, lease, Duration::ZERO).await);
        assert_eq!(t.release_coordinators(|n, taken, _| n == 6 && taken <= seen_down), 1);
        assert!(t.lock(&[1], owner_id(7, 1), 0, lease, Duration::ZERO).await);
        assert!(!t.lock(&[2], owner_id(7, 1), 0, lease, Duration::ZERO).await);
    }

    #[tokio::test]
    async fn keys_of_a_partition_no_longer_hosted_are_forgotten() {
        let t = LockTable::default();
        let lease = Duration::from_secs(30);
        assert!(t.lock(&[10, 11, 20], owner_id(1, 1), 0, lease, Duration::ZERO).await);
        assert_eq!(t.forget_keys(|k| k < 15), 2);
        assert!(t.lock(&[10, 11], owner_id(2, 1), 0, lease, Duration::ZERO).await);
        assert!(!t.lock(&[20], owner_id(2, 1), 0, lease, Duration::ZERO).await);
    }

    #[tokio::test]
    async fn locks_exclude_wait_and_expire() {
        let t = std::sync::Arc::new(LockTable::default());
        let lease = Duration::from_secs(10);
        assert!(t.lock(&[1, 2], 100, 0, lease, Duration::ZERO).await);
        assert!(!t.lock(&[2, 3], 200, 0, lease, Duration::from_millis(10)).await);
        // Nothing of a refused request is held.
        assert!(t.lock(&[3], 300, 0, lease, Duration::ZERO).await);
        let t2 = t.clone();
        let waiter = tokio::spawn(async move { t2.lock(&[1], 200, 0, lease, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        t.release(&[1, 2], 100);
        assert!(waiter.await.expect("join"));
        // A lease runs out by itself.
        assert!(t.lock(&[9], 1, 0, Duration::from_millis(30), Duration::ZERO).await);
        assert!(t.lock(&[9], 2, 0, lease, Duration::from_secs(2)).await);
    }
}
