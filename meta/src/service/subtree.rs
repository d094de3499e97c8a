//! Subtree grants on the metadata service (decision 0022): which inodes a request of
//! a confined client key names, whether each lies below the key's directory, and a
//! short-lived cache of the parents and attributes of inodes other nodes hold (also
//! what a client key's lookups and listings are checked against).
//!
//! An inode lies in a subtree when walking its parents ([`InodeRec::parent`]) reaches
//! the subtree's directory before the root. A directory's parent is its `..`; any other
//! inode's is its home, the directory it was made in or last renamed into (CephFS's
//! primary dentry): a hard link made elsewhere does not move it. The walk is
//! [`walk`], pure; the node feeds it the records it holds and the parents it fetched
//! ([`Homes`]), and fetches what the walk asks for next.
//!
//! A parent fetched from another node is trusted for [`HOME_TTL`]: a directory renamed
//! out of a subtree may stay reachable by that subtree's clients on a node that looked
//! it up within the last second. Records a node holds itself are always current.
//!
//! [`InodeRec::parent`]: crate::namespace::InodeRec::parent

use super::wire::{NsOp, ReadOp};
use crate::ids::Ino;
use crate::namespace::{Attr, Errno};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a parent fetched from another node is trusted.
pub const HOME_TTL: Duration = Duration::from_secs(1);

/// Deepest walk: a longer chain of parents is refused (`ELOOP`), as a cycle would be.
pub const MAX_DEPTH: usize = 4096;

/// Most parents a node remembers (it forgets them all when full).
const MAX_HOMES: usize = 65_536;

/// The inodes a request of a confined client names, each of which must lie in its
/// subtree; `None`: a read only node daemons make (removed files waiting for a purge,
/// whether an inode is alive), refused to a confined client.
pub fn read_names(op: &ReadOp) -> Option<Ino> {
    match op {
        ReadOp::Purges { .. } | ReadOp::Alive(_) => None,
        op => Some(op.ino()),
    }
}

/// The inodes an operation names: the directories whose entries it changes, the
/// inodes whose records it changes. A confined client may name only inodes in its
/// subtree; what lies below them (a name removed, a directory replaced by a rename)
/// is in the subtree by being there. A hold on a removed file's data names none: the
/// file has no record left to place it (its client removed it while it had it open,
/// and keeps its data until the last close), and a hold changes and shows nothing.
pub fn op_names(op: &NsOp) -> Vec<Ino> {
    match op {
        NsOp::Link { ino, newparent, .. } => vec![*ino, *newparent],
        NsOp::Rename { parent, newparent, .. } => vec![*parent, *newparent],
        NsOp::HoldPurge { .. } => Vec::new(),
        op => vec![op.ino()],
    }
}

/// Where a walk from an inode towards the root ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// It reached the subtree's directory.
    Inside,
    /// It reached the root, or an inode with no (known) parent, first.
    Outside,
    /// The parent of this inode is needed to go on.
    Need(Ino),
}

/// Walks from `start` towards the root: `parent(i)` is `Some(Some(p))` when `i`'s
/// parent is known to be `p`, `Some(None)` when `i` is known to have none (absent, or
/// a file made before homes were recorded), `None` when it is not known here.
pub fn walk(start: Ino, root: Ino, parent: impl Fn(Ino) -> Option<Option<Ino>>) -> Result<Step, Errno> {
    let mut cur = start;
    for _ in 0..MAX_DEPTH {
        if cur == root {
            return Ok(Step::Inside);
        }
        if cur == Ino::ROOT {
            return Ok(Step::Outside);
        }
        match parent(cur) {
            None => return Ok(Step::Need(cur)),
            Some(None) => return Ok(Step::Outside),
            Some(Some(p)) => cur = p,
        }
    }
    Err(Errno::ELOOP)
}

/// What a node checking a client's request needs of an inode: its parent (for a
/// subtree) and attributes (for the caller's permission on a directory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// [`InodeRec::parent`](crate::namespace::InodeRec::parent).
    pub parent: Option<Ino>,
    /// Attributes.
    pub attr: Attr,
}

impl Facts {
    /// The facts of a record.
    pub fn of(rec: &crate::namespace::InodeRec) -> Facts {
        Facts {
            parent: rec.parent,
            attr: rec.attr.clone(),
        }
    }
}

/// Facts of inodes fetched from other nodes (`None`: no such inode), each trusted
/// for [`HOME_TTL`].
#[derive(Default)]
pub struct Homes {
    known: Mutex<HashMap<Ino, (Option<Facts>, Instant)>>,
}

impl Homes {
    /// `ino`'s facts, if fetched less than [`HOME_TTL`] before `now`.
    pub fn get(&self, ino: Ino, now: Instant) -> Option<Option<Facts>> {
        let known = self.known.lock();
        let (facts, at) = known.get(&ino)?;
        (now.saturating_duration_since(*at) < HOME_TTL).then(|| facts.clone())
    }

    /// Remembers `ino`'s facts as fetched at `at`.
    pub fn put(&self, ino: Ino, facts: Option<Facts>, at: Instant) {
        let mut known = self.known.lock();
        if known.len() >= MAX_HOMES {
            known.clear();
        }
        known.insert(ino, (facts, at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A random tree: inode 1 is the root; each later inode's parent is an earlier
    /// directory (inodes 1..=dirs are directories).
    fn tree(seed: u64, n: u64, dirs: u64) -> BTreeMap<Ino, Ino> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (2..=n).map(|i| (Ino(i), Ino(1 + next() % (i - 1).min(dirs)))).collect()
    }

    /// The reference: the chain of parents from `i`, straight from the tree.
    fn model_inside(t: &BTreeMap<Ino, Ino>, mut i: Ino, root: Ino) -> bool {
        loop {
            if i == root {
                return true;
            }
            match t.get(&i) {
                Some(p) => i = *p,
                None => return false,
            }
        }
    }

    #[test]
    fn walks_agree_with_the_tree_whatever_is_known_where() {
        for seed in 1..=2000u64 {
            let t = tree(seed, 40, 12);
            // Some parents are held here, the rest must be fetched (and then are).
            let held = |i: Ino| (i.0 ^ seed) % 3 != 0;
            for start in 1..=40 {
                for root in 1..=12 {
                    let (start, root) = (Ino(start), Ino(root));
                    let mut fetched: BTreeMap<Ino, Option<Ino>> = BTreeMap::new();
                    let got = loop {
                        let step = walk(start, root, |i| {
                            if held(i) {
                                return Some(t.get(&i).copied());
                            }
                            fetched.get(&i).copied()
                        })
                        .expect("a tree has no cycle");
                        match step {
                            Step::Need(i) => {
                                assert!(!held(i) && !fetched.contains_key(&i), "asks only for what it lacks");
                                fetched.insert(i, t.get(&i).copied());
                            }
                            s => break s == Step::Inside,
                        }
                    };
                    assert_eq!(
                        got,
                        model_inside(&t, start, root),
                        "seed {seed} {start:?} under {root:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_missing_parent_is_outside_and_a_cycle_is_refused() {
        assert_eq!(walk(Ino(5), Ino(3), |_| Some(None)), Ok(Step::Outside));
        assert_eq!(walk(Ino(3), Ino(3), |_| None), Ok(Step::Inside));
        let cycle = |i: Ino| Some(Some(if i == Ino(5) { Ino(6) } else { Ino(5) }));
        assert_eq!(walk(Ino(5), Ino(3), cycle), Err(Errno::ELOOP));
    }

    #[test]
    fn fetched_facts_expire() {
        let h = Homes::default();
        let t0 = Instant::now();
        let rec = crate::service::replica::Replica::initial(crate::ids::PartitionId(0), 4, 1)
            .part
            .inodes[&Ino::ROOT]
            .clone();
        let f = Facts::of(&rec);
        h.put(Ino(9), Some(f.clone()), t0);
        assert_eq!(h.get(Ino(9), t0 + HOME_TTL / 2), Some(Some(f)));
        assert_eq!(h.get(Ino(9), t0 + HOME_TTL), None);
        assert_eq!(h.get(Ino(8), t0), None);
    }

    #[test]
    fn confined_clients_name_every_directory_they_change() {
        let rename = NsOp::Rename {
            parent: Ino(3),
            name: b"a".to_vec(),
            newparent: Ino(4),
            newname: b"b".to_vec(),
            noreplace: false,
            exchange: false,
        };
        assert_eq!(op_names(&rename), vec![Ino(3), Ino(4)]);
        let link = NsOp::Link {
            ino: Ino(9),
            newparent: Ino(4),
            newname: b"c".to_vec(),
        };
        assert_eq!(op_names(&link), vec![Ino(9), Ino(4)]);
        let hold = NsOp::HoldPurge { ino: Ino(9), secs: 30 };
        assert!(op_names(&hold).is_empty(), "a removed file has no home to check");
        assert_eq!(read_names(&ReadOp::Alive(Ino(9))), None);
        assert_eq!(read_names(&ReadOp::GetAttr(Ino(9))), Some(Ino(9)));
    }
}
