//! Inode locks held by coordinators while they read and change a directory.
//!
//! A lock host is the primary of the inode's partition. A coordinator takes all keys at
//! one host at once or none (waiting a little for busy ones), hosts in ascending node
//! order; if a host refuses, the coordinator releases everything and tries again later,
//! so there is no deadlock. Every lock has a lease, so a coordinator that dies frees its
//! keys after the lease at the latest; normally they go sooner, once the partition of
//! its operation (the lock's anchor) has a new primary that redid what it left
//! (`MetaNode::sweep_intents`, decision 0009).
//!
//! A key is a `u64` on the wire. Most are inode numbers, taken exclusively. Two kinds
//! are marked in counter bits no inode uses (`Ino::LOCK_BITS`):
//! - [`shared`]: the same inode, shared. Operations that only add or remove a name in a
//!   directory (create, unlink, mkdir, rmdir of a child, a hard link) hold their
//!   directory shared, so several run in one directory at once; what changes the
//!   directory itself (its attributes, its removal, a rename) holds it exclusively and
//!   waits for all of them. An exclusive request that was refused keeps new shared
//!   holders out for a moment ([`WANT`]), so a stream of creates cannot starve it.
//! - [`name_key`]: one name in one directory, hosted with the entry's partition, so two
//!   operations on the same name (two creates of it) still exclude each other.
//!
//! [`Holds`] is the table as a pure value (no clock, no I/O): the service's
//! [`LockTable`] and the simulator both use it.

use crate::ids::{Ino, PartitionId};
use parking_lot::Mutex;
use std::collections::BTreeMap;
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

const SHARED_BIT: u64 = 1 << (Ino::COUNTER_BITS - 1);
const NAME_BIT: u64 = 1 << (Ino::COUNTER_BITS - 2);

/// The key that holds directory (or inode) `ino` shared.
pub fn shared(ino: Ino) -> u64 {
    ino.0 | SHARED_BIT
}

/// The key of name `name` in directory `parent`, hosted by the primary of the entry's
/// partition `p` (two names may share a key: they then only wait for each other).
pub fn name_key(p: PartitionId, parent: Ino, name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parent.0.to_le_bytes().iter().chain(name) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (u64::from(p.0) << Ino::COUNTER_BITS) | NAME_BIT | (h & (NAME_BIT - 1))
}

/// The key a request names without its mode, and whether it asks for it shared.
pub fn split(key: u64) -> (u64, bool) {
    (key & !SHARED_BIT, key & SHARED_BIT != 0)
}

/// The inode a key locks, if it locks one (a name key or the rename lock lock none).
pub fn key_inode(key: u64) -> Option<Ino> {
    let (base, _) = split(key);
    (base & NAME_BIT == 0 && Ino(base).counter() != 0).then_some(Ino(base))
}

/// How long a refused exclusive request keeps new shared holders out, in the caller's
/// time unit's terms: the service uses 50 ms (a request looks again well within it).
pub const WANT: Duration = Duration::from_millis(50);

/// One holder of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold<T> {
    /// The operation holding it.
    pub owner: u64,
    /// Lease end.
    pub until: T,
    /// When the owner took or last renewed it.
    pub taken: T,
    /// The partition of the owner's operation (where its intent would be).
    pub anchor: u32,
    /// Held shared (with other shared holders) rather than alone.
    pub shared: bool,
}

#[derive(Clone, Debug)]
struct Entry<T> {
    holds: Vec<Hold<T>>,
    /// An exclusive request refused for shared holders: (owner, until).
    wanted: Option<(u64, T)>,
}

/// The locks of one host, by key without its mode: a pure value, times of any ordered
/// type (the service's `Instant`, the simulator's milliseconds).
#[derive(Clone, Debug)]
pub struct Holds<T> {
    keys: BTreeMap<u64, Entry<T>>,
}

impl<T> Default for Holds<T> {
    fn default() -> Self {
        Holds { keys: BTreeMap::new() }
    }
}

impl<T: Copy + Ord> Holds<T> {
    /// Takes every key of `keys` (as [`split`] reads them) for `owner` at `now`, with a
    /// lease to `until`, or none. True when all are held (keys the owner already holds
    /// count as taken, renewed, and exclusive if either asks so). A refused exclusive
    /// request keeps new shared holders out until `want_until`.
    pub fn take(&mut self, keys: &[u64], owner: u64, anchor: u32, now: T, until: T, want_until: T) -> bool {
        self.expire(now);
        let mut free = true;
        for k in keys {
            let (base, shared) = split(*k);
            let Some(e) = self.keys.get_mut(&base) else { continue };
            let others = e.holds.iter().filter(|h| h.owner != owner);
            let blocked = if shared {
                let wanted = e.wanted.is_some_and(|(o, t)| o != owner && t > now);
                wanted || others.clone().any(|h| !h.shared)
            } else {
                others.clone().next().is_some()
            };
            if blocked {
                free = false;
                if !shared && e.holds.iter().all(|h| h.shared || h.owner == owner) {
                    e.wanted = Some((owner, want_until));
                }
            }
        }
        if !free {
            return false;
        }
        for k in keys {
            let (base, shared) = split(*k);
            let e = self.keys.entry(base).or_insert_with(|| Entry {
                holds: Vec::new(),
                wanted: None,
            });
            if e.wanted.is_some_and(|(o, _)| o == owner) {
                e.wanted = None;
            }
            let mut hold = Hold {
                owner,
                until,
                taken: now,
                anchor,
                shared,
            };
            if let Some(i) = e.holds.iter().position(|h| h.owner == owner) {
                hold.shared = shared && e.holds[i].shared;
                e.holds[i] = hold;
            } else {
                e.holds.push(hold);
            }
        }
        true
    }

    /// Drops holds whose lease ran out by `now`, and wants that are over.
    pub fn expire(&mut self, now: T) {
        self.keys.retain(|_, e| {
            e.holds.retain(|h| h.until > now);
            if e.wanted.is_some_and(|(_, t)| t <= now) {
                e.wanted = None;
            }
            !e.holds.is_empty() || e.wanted.is_some()
        });
    }

    /// Releases the keys `owner` holds. True when something went.
    pub fn release(&mut self, keys: &[u64], owner: u64) -> bool {
        let mut any = false;
        for k in keys {
            let (base, _) = split(*k);
            if let Some(e) = self.keys.get_mut(&base) {
                let before = e.holds.len();
                e.holds.retain(|h| h.owner != owner);
                any |= e.holds.len() != before;
                if e.holds.is_empty() && e.wanted.is_none() {
                    self.keys.remove(&base);
                }
            }
        }
        any
    }

    /// Keeps the holds for which `keep(key without mode, hold)` holds; returns how many
    /// went.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &Hold<T>) -> bool) -> usize {
        let mut gone = 0;
        self.keys.retain(|k, e| {
            let before = e.holds.len();
            e.holds.retain(|h| keep(*k, h));
            gone += before - e.holds.len();
            !e.holds.is_empty() || e.wanted.is_some()
        });
        gone
    }

    /// Every hold, with its key without mode.
    pub fn holds(&self) -> impl Iterator<Item = (u64, &Hold<T>)> + '_ {
        self.keys.iter().flat_map(|(k, e)| e.holds.iter().map(move |h| (*k, h)))
    }

    /// Forgets every hold.
    pub fn clear(&mut self) {
        self.keys.clear();
    }
}

/// The locks hosted by one node.
#[derive(Default)]
pub struct LockTable {
    held: Mutex<Holds<Instant>>,
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
            let now = Instant::now();
            if self.held.lock().take(keys, owner, anchor, now, now + lease, now + WANT) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            // A lease may run out without a release, so look again now and then.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(20)), freed).await;
        }
    }

    /// Releases the keys `owner` holds.
    pub fn release(&self, keys: &[u64], owner: u64) {
        self.held.lock().release(keys, owner);
        self.freed.notify_waiters();
    }

    /// The anchors of the locks for which `dead(coordinator node, taken at)` holds:
    /// the partitions whose new primaries must have redone what those coordinators
    /// left before their keys may go.
    pub fn anchors_of(&self, dead: impl Fn(u64, Instant) -> bool) -> Vec<u32> {
        let held = self.held.lock();
        let mut a: Vec<u32> = held
            .holds()
            .filter(|(_, h)| dead(owner_node(h.owner), h.taken))
            .map(|(_, h)| h.anchor)
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
        let n = self
            .held
            .lock()
            .retain(|_, h| !dead(owner_node(h.owner), h.taken, h.anchor));
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
        let n = self.held.lock().retain(|k, _| !moved(k));
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
    async fn shared_holders_run_together_and_exclusive_waits_for_all() {
        let t = std::sync::Arc::new(LockTable::default());
        let lease = Duration::from_secs(10);
        let d = Ino::new(PartitionId(3), 7).expect("ino");
        let (a, b, c) = (owner_id(1, 1), owner_id(2, 1), owner_id(3, 1));
        let na = name_key(PartitionId(5), d, b"a");
        assert_eq!(Ino(na).partition(), PartitionId(5));
        assert_eq!(key_inode(na), None);
        assert_eq!(key_inode(shared(d)), Some(d));
        assert!(t.lock(&[shared(d), na], a, 0, lease, Duration::ZERO).await);
        // Another name in the same directory: runs beside it.
        assert!(
            t.lock(
                &[shared(d), name_key(PartitionId(6), d, b"b")],
                b,
                0,
                lease,
                Duration::ZERO
            )
            .await
        );
        // The same name: waits.
        assert!(!t.lock(&[shared(d), na], c, 0, lease, Duration::ZERO).await);
        // The directory itself: waits for both, and keeps new shared holders out.
        assert!(!t.lock(&[d.0], c, 0, lease, Duration::ZERO).await);
        let d2 = owner_id(4, 1);
        assert!(!t.lock(&[shared(d)], d2, 0, lease, Duration::ZERO).await);
        t.release(&[shared(d), na], a);
        assert!(!t.lock(&[d.0], c, 0, lease, Duration::ZERO).await);
        t.release(&[shared(d)], b);
        assert!(t.lock(&[d.0], c, 0, lease, Duration::ZERO).await);
        assert!(!t.lock(&[shared(d)], d2, 0, lease, Duration::ZERO).await);
        t.release(&[d.0], c);
        assert!(t.lock(&[shared(d)], d2, 0, lease, Duration::ZERO).await);
    }

    /// Random takes, releases and expiries of a few keys in both modes over 2,000
    /// seeds: every key is held by one owner alone or only shared, a take is all or
    /// nothing, and a refusal always has a reason (another owner's conflicting hold, or
    /// a refused exclusive request that is waiting).
    #[test]
    fn holds_keep_modes_apart() {
        let d = |i: u64| Ino::new(PartitionId(1), i + 1).expect("ino");
        for seed in 0..2000u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut h: Holds<u64> = Holds::default();
            for now in 0..300u64 {
                let owner = next() % 5 + 1;
                match next() % 4 {
                    0 => {
                        h.release(&[d(next() % 3).0], owner);
                    }
                    _ => {
                        let keys: Vec<u64> = (0..1 + next() % 2)
                            .map(|_| {
                                let ino = d(next() % 3);
                                if next() % 3 == 0 { ino.0 } else { shared(ino) }
                            })
                            .collect();
                        let before = h.clone();
                        let until = now + 1 + next() % 20;
                        let took = h.take(&keys, owner, 0, now, until, now + 5);
                        let mine = |x: &Holds<u64>, k: u64| {
                            x.holds()
                                .any(|(b, o)| b == split(k).0 && o.owner == owner && o.until > now)
                        };
                        if took {
                            assert!(keys.iter().all(|k| mine(&h, *k)), "seed {seed}: take left a key out");
                        } else {
                            assert!(
                                keys.iter().filter(|k| !mine(&before, **k)).all(|k| !mine(&h, *k)),
                                "seed {seed}: a refused take held a key"
                            );
                            let reason = keys.iter().any(|k| {
                                let (base, sh) = split(*k);
                                let conflict = before
                                    .holds()
                                    .filter(|(b, o)| *b == base && o.owner != owner && o.until > now)
                                    .any(|(_, o)| !sh || !o.shared);
                                let wanted = before
                                    .keys
                                    .get(&base)
                                    .is_some_and(|e| e.wanted.is_some_and(|(o, t)| o != owner && t > now));
                                conflict || (sh && wanted)
                            });
                            assert!(reason, "seed {seed}: refused without a reason");
                        }
                    }
                }
                h.expire(now);
                for (base, e) in &h.keys {
                    let live: Vec<&Hold<u64>> = e.holds.iter().filter(|o| o.until > now).collect();
                    assert!(
                        live.len() <= 1 || live.iter().all(|o| o.shared),
                        "seed {seed}: key {base} held exclusively beside others"
                    );
                }
            }
        }
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
