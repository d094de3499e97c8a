//! Callers' supplementary groups, kept for a while: the pure core behind the
//! credentials of the mount's read-only requests.
//!
//! A FUSE request names the caller's uid, gid and pid, not its supplementary groups,
//! which the metadata service checks requests with (a group-readable directory, a
//! `chgrp`, the set-group-id bit). They are read from `/proc/<pid>/status`, and that
//! read was a sixth of the mount's CPU in a DataLoader storm of opens and listings
//! (the kernel renders the whole status file each time).
//!
//! A change (create, unlink, setattr, ...) still reads them afresh, and keeps what it
//! read here. A request that only reads (lookup, open, a listing, xattr reads) uses
//! the groups kept for its (pid, uid, gid) when they are younger than the mount's
//! attribute TTL. That cannot grant what the caller's current groups deny — the kernel
//! checks every request with them first (`default_permissions`) — only refuse what
//! they allow, after a `setgroups` that kept the uid and gid (test suites switch users
//! that way in one process); such a refusal is asked again with groups read afresh.
//! A zero TTL keeps nothing. Bounded: past [`Groups::MAX`] entries the expired ones go,
//! and if that is not enough, all of them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A caller: pid, uid, gid.
type Caller = (u32, u32, u32);

/// Each caller's groups as read, and until when they are kept.
#[derive(Debug, Default)]
pub struct Groups {
    kept: HashMap<Caller, (Instant, Arc<[u32]>)>,
}

impl Groups {
    /// Most entries kept (one per live caller; a few hundred KiB at most).
    pub const MAX: usize = 16_384;

    /// The groups kept for the caller at `now`, if any.
    pub fn get(&mut self, pid: u32, uid: u32, gid: u32, now: Instant) -> Option<Arc<[u32]>> {
        let key = (pid, uid, gid);
        match self.kept.get(&key) {
            Some((until, g)) if now < *until => Some(g.clone()),
            Some(_) => {
                self.kept.remove(&key);
                None
            }
            None => None,
        }
    }

    /// The caller's groups were read at `now`: keep them for `ttl` (not at all when it
    /// is zero).
    pub fn put(&mut self, pid: u32, uid: u32, gid: u32, groups: Arc<[u32]>, now: Instant, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        if self.kept.len() >= Self::MAX {
            self.kept.retain(|_, (until, _)| now < *until);
            if self.kept.len() >= Self::MAX {
                self.kept.clear();
            }
        }
        self.kept.insert((pid, uid, gid), (now + ttl, groups));
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

/// The supplementary groups of a `/proc/<pid>/status` text (its `Groups:` line);
/// `None` when there is no such line.
pub fn parse_status(status: &str) -> Option<Vec<u32>> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|l| l.split_whitespace().filter_map(|g| g.parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::{Groups, parse_status};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const TTL: Duration = Duration::from_secs(1);

    #[test]
    fn groups_are_kept_per_caller_until_the_ttl() {
        let mut g = Groups::default();
        let t0 = Instant::now();
        let wheel: Arc<[u32]> = Arc::from(vec![10, 27]);
        assert!(g.get(7, 1000, 1000, t0).is_none());
        g.put(7, 1000, 1000, wheel.clone(), t0, TTL);
        assert_eq!(g.get(7, 1000, 1000, t0 + Duration::from_millis(999)), Some(wheel));
        assert!(g.get(7, 0, 1000, t0).is_none(), "another uid is another caller");
        assert!(g.get(7, 1000, 0, t0).is_none(), "another gid is another caller");
        assert!(g.get(8, 1000, 1000, t0).is_none(), "another process");
        assert!(g.get(7, 1000, 1000, t0 + TTL).is_none(), "expired");
        assert!(g.is_empty(), "an expired entry is dropped when seen");
        g.put(7, 1000, 1000, Arc::from(vec![]), t0, Duration::ZERO);
        assert!(g.is_empty(), "a zero TTL keeps nothing");
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut g = Groups::default();
        let t0 = Instant::now();
        for pid in 0..Groups::MAX as u32 {
            g.put(pid, 0, 0, Arc::from(vec![]), t0, TTL);
        }
        assert_eq!(g.len(), Groups::MAX);
        // Full of live entries: all go.
        g.put(u32::MAX, 0, 0, Arc::from(vec![]), t0, TTL);
        assert_eq!(g.len(), 1);
        for pid in 0..Groups::MAX as u32 - 1 {
            g.put(pid, 0, 0, Arc::from(vec![]), t0, TTL);
        }
        // Full, all expired but the newest few: only the expired go.
        let later = t0 + TTL;
        g.put(1, 1, 1, Arc::from(vec![]), later, TTL);
        g.put(2, 2, 2, Arc::from(vec![]), later, TTL);
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn the_groups_line_of_a_status_file() {
        let status = "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 27 1000 \nVmPeak:\t1 kB\n";
        assert_eq!(parse_status(status), Some(vec![4, 24, 27, 1000]));
        assert_eq!(parse_status("Name:\tx\nGroups:\t\n"), Some(vec![]));
        assert_eq!(parse_status("Name:\tx\n"), None);
    }
}
