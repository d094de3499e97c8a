//! Extended attributes known to be missing, for a while: the pure core behind the
//! mount's answers to the kernel's `security.capability` probes.
//!
//! Linux asks a FUSE filesystem for `security.capability` before every `write(2)` and
//! every `chown` of a file (to drop file capabilities), and almost no file has one: each
//! probe was a metadata round trip in the middle of the write. A name found missing on
//! an inode is remembered until the mount's attribute TTL passes — the same staleness
//! the kernel already accepts for a file's mode bits — and forgotten at once when this
//! mount sets or removes that attribute. Bounded: past [`AbsentXattrs::MAX`] entries the
//! expired ones go, and if that is not enough, all of them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// (inode, attribute name) → until when it is known to be missing.
#[derive(Debug, Default)]
pub struct AbsentXattrs {
    until: HashMap<(u64, Vec<u8>), Instant>,
    /// Changes made through this mount so far: a "missing" answer asked for before one
    /// of them may predate it, and is not remembered.
    changes: u64,
}

impl AbsentXattrs {
    /// Most entries kept (a few MiB at most).
    pub const MAX: usize = 65_536;

    /// Whether `name` on `ino` is known to be missing at `now`.
    pub fn known(&mut self, ino: u64, name: &[u8], now: Instant) -> bool {
        let key = (ino, name.to_vec());
        match self.until.get(&key) {
            Some(t) if now < *t => true,
            Some(_) => {
                self.until.remove(&key);
                false
            }
            None => false,
        }
    }

    /// What to pass to [`AbsentXattrs::note`] for a question asked now.
    pub fn asking(&self) -> u64 {
        self.changes
    }

    /// `name` on `ino` was found missing by a question asked at `now` (when
    /// [`AbsentXattrs::asking`] said `asked`): remember it for `ttl` — unless the TTL is
    /// zero or this mount changed an attribute since the question was asked.
    pub fn note(&mut self, ino: u64, name: &[u8], asked: u64, now: Instant, ttl: Duration) {
        if ttl.is_zero() || asked != self.changes {
            return;
        }
        if self.until.len() >= Self::MAX {
            self.until.retain(|_, t| now < *t);
            if self.until.len() >= Self::MAX {
                self.until.clear();
            }
        }
        self.until.insert((ino, name.to_vec()), now + ttl);
    }

    /// `name` on `ino` was just set or removed through this mount (or tried to be):
    /// forget that it was missing, and ignore answers to questions asked before.
    pub fn forget(&mut self, ino: u64, name: &[u8]) {
        self.until.remove(&(ino, name.to_vec()));
        self.changes += 1;
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.until.len()
    }

    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: &[u8] = b"security.capability";

    #[test]
    fn missing_is_remembered_for_the_ttl_only() {
        let (mut a, t0, ttl) = (AbsentXattrs::default(), Instant::now(), Duration::from_secs(1));
        assert!(!a.known(1, CAP, t0));
        a.note(1, CAP, a.asking(), t0, ttl);
        assert!(a.known(1, CAP, t0 + Duration::from_millis(999)));
        assert!(!a.known(2, CAP, t0), "another inode");
        assert!(!a.known(1, b"user.x", t0), "another name");
        assert!(!a.known(1, CAP, t0 + ttl), "expired");
        assert!(a.is_empty(), "an expired entry is dropped when seen");
    }

    #[test]
    fn a_set_here_is_seen_at_once_and_zero_ttl_remembers_nothing() {
        let (mut a, t0, ttl) = (AbsentXattrs::default(), Instant::now(), Duration::from_secs(60));
        a.note(1, CAP, a.asking(), t0, ttl);
        a.note(1, b"user.x", a.asking(), t0, ttl);
        a.forget(1, CAP);
        assert!(!a.known(1, CAP, t0));
        assert!(a.known(1, b"user.x", t0), "other names stay");
        a.note(3, CAP, a.asking(), t0, Duration::ZERO);
        assert!(!a.known(3, CAP, t0));
    }

    #[test]
    fn an_answer_asked_before_a_change_here_is_not_remembered() {
        let (mut a, t0, ttl) = (AbsentXattrs::default(), Instant::now(), Duration::from_secs(60));
        // A getxattr asks; a setxattr through this mount lands meanwhile; the getxattr's
        // "missing" (read before the set) comes back.
        let asked = a.asking();
        a.forget(1, b"user.x");
        a.note(1, b"user.x", asked, t0, ttl);
        assert!(!a.known(1, b"user.x", t0));
        // Asked after it: remembered.
        a.note(1, b"user.x", a.asking(), t0, ttl);
        assert!(a.known(1, b"user.x", t0));
    }

    #[test]
    fn the_table_stays_bounded() {
        let (mut a, t0) = (AbsentXattrs::default(), Instant::now());
        for i in 0..AbsentXattrs::MAX as u64 {
            a.note(
                i,
                CAP,
                0,
                t0,
                Duration::from_millis(if i % 2 == 0 { 1 } else { 60_000 }),
            );
        }
        assert_eq!(a.len(), AbsentXattrs::MAX);
        // Half of them expired: those go, the new one fits.
        let later = t0 + Duration::from_millis(2);
        a.note(u64::MAX, CAP, 0, later, Duration::from_secs(1));
        assert_eq!(a.len(), AbsentXattrs::MAX / 2 + 1);
        assert!(a.known(1, CAP, later) && a.known(u64::MAX, CAP, later));
        // None expired: all go rather than grow.
        let mut b = AbsentXattrs::default();
        for i in 0..AbsentXattrs::MAX as u64 {
            b.note(i, CAP, 0, t0, Duration::from_secs(60));
        }
        b.note(u64::MAX, CAP, 0, t0, Duration::from_secs(60));
        assert_eq!(b.len(), 1);
    }
}
