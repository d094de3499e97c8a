//! One metadata partition's state and the mutations that change it.
//!
//! A partition holds the directory entries whose (parent, name) hash to it, the inodes
//! it allocated (inode numbers embed the partition), their extended attributes, and the
//! intents of the multi-partition operations it coordinates.
//!
//! Every change is a [`Mutation`]. Absolute mutations (put/delete an entry or inode)
//! are idempotent by nature; relative ones (adjust link or entry counts) carry the id
//! of their intent and step and are applied at most once, so an operation can be redone
//! from its intent after a crash without double-counting.

use super::types::{Attr, FileKind, Layout, StripeRec, TimeNs};
use crate::ids::{Ino, PartitionId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A link count changed by `delta`, kept within 0..=u32::MAX whatever the delta (as
/// link steps apply it).
pub(crate) fn add_links(nlink: u32, delta: i64) -> u32 {
    i64::from(nlink).saturating_add(delta).clamp(0, i64::from(u32::MAX)) as u32
}

/// A directory's link count after `delta` subdirectories, modulo 2^32: a directory's
/// counts are changed by relative steps of different operations whose order is not
/// fixed (counts follow the answer, and a step redone after a failure may land after
/// a later operation's), so they must commute; a clamp at zero would lose a decrement
/// that arrived before its increment for good.
pub(crate) fn add_subdirs(nlink: u32, delta: i64) -> u32 {
    nlink.wrapping_add(delta as u32)
}

/// A directory's entry count after `delta` entries, modulo 2^64 ([`add_subdirs`]).
pub(crate) fn add_entries(size: u64, delta: i64) -> u64 {
    size.wrapping_add_signed(delta)
}

/// An inode record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeRec {
    /// Attributes.
    pub attr: Attr,
    /// Symlink target.
    pub target: Option<Vec<u8>>,
    /// Parent directory: a directory's "..", any other inode's home (the directory it
    /// was made in or last renamed into; a hard link elsewhere does not change it).
    /// Subtree grants go by it. The root is its own parent; `None` for files made
    /// before homes were recorded (they lie in no subtree).
    pub parent: Option<Ino>,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Data layout (files) or layout policy (directories); `None` uses the default.
    /// In a partition the record holds the policy and version counter only: a file's
    /// stripes are records of their own ([`Partition::stripes`]), so a commit writes
    /// the stripes it changes, not the whole layout. Replies that hand a layout to a
    /// client fill `stripes` in from them.
    #[serde(default)]
    pub layout: Option<Layout>,
    /// The token of the create that made it (0: none): a create retried after its
    /// coordinator failed finds its own inode and succeeds instead of `EEXIST`.
    #[serde(default)]
    pub created_by: u64,
}

/// How long a removed file's data stays before it may be purged. An unlink by a
/// client that has the file open holds it in the same operation; a rename over an
/// open file places its hold ([`Mutation::HoldPurge`]) right after, within this.
pub const PURGE_DELAY_NS: TimeNs = 2_000_000_000;

/// A removed regular file whose data is still on the data nodes: purged (every shard
/// of the inode deleted) once `held_until` has passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Purge {
    /// When its last link went.
    pub since: TimeNs,
    /// Not before this (a client that has it open keeps moving it forward).
    pub held_until: TimeNs,
}

/// How long a finished client operation is remembered ([`Mutation::Done`]): far longer
/// than a client goes on retrying one (its operation timeout, 20 s by default), so a
/// retry always finds the first try's record. Records are dropped by the partition's
/// own sequence of operations (a record older than this, by the time of the newest),
/// so every copy drops the same ones.
pub const DONE_KEEP_NS: TimeNs = 600 * 1_000_000_000;

/// A finished client operation: its retry is answered as done instead of being run
/// again (an unlink retried after its coordinator died would find no name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoneOp {
    /// When it ran (its coordinator's clock).
    pub at: TimeNs,
}

/// A directory entry's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DentryVal {
    /// The inode it names.
    pub ino: Ino,
    /// Its kind (for READDIR without a second lookup).
    pub kind: FileKind,
}

/// A change to one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    /// Create or replace a directory entry.
    PutDentry {
        /// Parent directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
        /// Value.
        val: DentryVal,
    },
    /// Remove a directory entry.
    DelDentry {
        /// Parent directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
    },
    /// Create or replace an inode.
    PutInode(Box<InodeRec>),
    /// Remove an inode.
    DelInode(Ino),
    /// A directory gained or lost entries (size) and subdirectories (nlink).
    AdjustDir {
        /// The directory.
        dir: Ino,
        /// Change of the entry count.
        entries: i64,
        /// Change of the subdirectory count.
        subdirs: i64,
        /// New mtime and ctime.
        time: TimeNs,
    },
    /// An inode gained or lost hard links; a non-directory at zero links is removed.
    AdjustLinks {
        /// The inode.
        ino: Ino,
        /// Change of nlink.
        delta: i64,
        /// New ctime.
        time: TimeNs,
    },
    /// A client that has removed file `ino` open keeps its data until `until`
    /// (no-op when the file is not waiting for a purge).
    HoldPurge {
        /// The removed file.
        ino: Ino,
        /// Keep its data until then (a time past releases it).
        until: TimeNs,
    },
    /// The data of removed file `ino` was deleted on the data nodes: forget it.
    Purged(Ino),
    /// Create or replace stripe records of file `ino` (a commit, or a relocation of
    /// shards). Absolute: applying it twice changes nothing.
    PutStripes {
        /// The file.
        ino: Ino,
        /// (stripe index, record).
        stripes: Vec<(u64, StripeRec)>,
    },
    /// Remove the stripe records of file `ino` from stripe `from` on (a truncate).
    CutStripes {
        /// The file.
        ino: Ino,
        /// First stripe removed.
        from: u64,
    },
    /// Client operation `op` is done (recorded in its anchor partition with its last
    /// step, so the record is durable exactly when the operation is). Also drops the
    /// records older than [`DONE_KEEP_NS`] before `at`. Absolute.
    Done {
        /// The operation's id (chosen by the client, the same on every retry).
        op: u64,
        /// When it ran.
        at: TimeNs,
    },
    /// An inode moved to another parent (renamed; see [`InodeRec::parent`]).
    SetParent {
        /// The inode (a directory when the name was chosen; any kind since).
        dir: Ino,
        /// Its new parent.
        parent: Ino,
        /// New ctime.
        time: TimeNs,
    },
}

impl Mutation {
    /// True for changes relative to the current value (applied at most once per id).
    pub fn is_relative(&self) -> bool {
        matches!(self, Mutation::AdjustDir { .. } | Mutation::AdjustLinks { .. })
    }
}

/// A multi-partition operation in progress: every step, so it can be redone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// Cluster-unique id (coordinating partition in the high bits).
    pub id: u64,
    /// The steps, in order.
    pub steps: Vec<(PartitionId, Mutation)>,
}

/// The state of one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// Which partition.
    pub id: PartitionId,
    next_counter: u64,
    next_intent: u64,
    /// Entries, by (parent, name).
    pub dentries: BTreeMap<(Ino, Vec<u8>), DentryVal>,
    /// Inodes allocated here.
    pub inodes: BTreeMap<Ino, InodeRec>,
    /// Intents coordinated here that are not finished.
    pub intents: BTreeMap<u64, Intent>,
    /// Removed files (allocated here) whose data is not deleted yet.
    pub purges: BTreeMap<Ino, Purge>,
    /// Committed stripes of the files allocated here, by (file, stripe index): one
    /// record per stripe, so a commit costs what it changes, not the file's size.
    pub stripes: BTreeMap<(Ino, u64), StripeRec>,
    /// Client operations anchored here that finished in the last [`DONE_KEEP_NS`].
    pub done: BTreeMap<u64, DoneOp>,
    /// The same, by time (what expires first).
    done_order: BTreeSet<(TimeNs, u64)>,
    applied: BTreeSet<(u64, u16)>,
}

impl Partition {
    /// An empty partition.
    pub fn new(id: PartitionId) -> Self {
        Partition {
            id,
            next_counter: 1,
            next_intent: 1,
            dentries: BTreeMap::new(),
            inodes: BTreeMap::new(),
            intents: BTreeMap::new(),
            purges: BTreeMap::new(),
            stripes: BTreeMap::new(),
            done: BTreeMap::new(),
            done_order: BTreeSet::new(),
            applied: BTreeSet::new(),
        }
    }

    /// Records client operation `op` as done (also when loading from disk).
    pub fn put_done(&mut self, op: u64, rec: DoneOp) {
        if let Some(old) = self.done.insert(op, rec) {
            self.done_order.remove(&(old.at, op));
        }
        self.done_order.insert((rec.at, op));
    }

    /// The operations whose records a [`Mutation::Done`] at `at` drops, oldest first.
    pub fn done_expiring(&self, at: TimeNs) -> impl Iterator<Item = u64> + '_ {
        let cutoff = at.saturating_sub(DONE_KEEP_NS);
        self.done_order.range(..(cutoff, 0)).map(|(_, op)| *op)
    }

    fn expire_done(&mut self, at: TimeNs) {
        let gone: Vec<u64> = self.done_expiring(at).collect();
        for op in gone {
            if let Some(rec) = self.done.remove(&op) {
                self.done_order.remove(&(rec.at, op));
            }
        }
    }

    /// The committed stripes of file `ino` from stripe `from` on, in order.
    pub fn stripes_of(&self, ino: Ino, from: u64) -> impl Iterator<Item = (u64, &StripeRec)> + '_ {
        self.stripes
            .range((ino, from)..=(ino, u64::MAX))
            .map(|((_, s), r)| (*s, r))
    }

    /// The inode record of `ino` with its layout's stripes below index `below` filled
    /// in (`u64::MAX`: all of them; an open is given the first window).
    pub fn inode_with_stripes(&self, ino: Ino, below: u64) -> Option<InodeRec> {
        let mut rec = self.inodes.get(&ino)?.clone();
        if let Some(l) = rec.layout.as_mut() {
            let recs = self.stripes_of(ino, 0).take_while(|(s, _)| *s < below);
            l.stripes.extend(recs.map(|(s, r)| (s, r.clone())));
        }
        Some(rec)
    }

    /// Removes the stripes of `ino` from `from` on; returns their indexes.
    fn cut_stripes(&mut self, ino: Ino, from: u64) -> Vec<u64> {
        let cut: Vec<u64> = self.stripes_of(ino, from).map(|(s, _)| s).collect();
        for s in &cut {
            self.stripes.remove(&(ino, *s));
        }
        cut
    }

    /// Moves stripes held inside inode records (as stores of format 1 kept them) into
    /// stripe records. Returns whether anything moved (the copy must then be rewritten).
    pub fn split_embedded_stripes(&mut self) -> bool {
        let mut moved = false;
        for (ino, rec) in self.inodes.iter_mut() {
            if let Some(l) = rec.layout.as_mut()
                && !l.stripes.is_empty()
            {
                // Versions of files written before versions were handed out came from
                // clocks: the next one handed out must be above them all.
                let newest = l.stripes.values().map(|r| r.version).max().unwrap_or(0);
                l.next_version = l.next_version.max(newest.saturating_add(1));
                for (s, r) in std::mem::take(&mut l.stripes) {
                    self.stripes.insert((*ino, s), r);
                }
                moved = true;
            }
        }
        moved
    }

    /// Allocates an inode number in this partition.
    pub fn alloc_ino(&mut self) -> Option<Ino> {
        let ino = Ino::new(self.id, self.next_counter)?;
        self.next_counter += 1;
        Some(ino)
    }

    /// The next inode counter this partition hands out.
    pub fn next_counter(&self) -> u64 {
        self.next_counter
    }

    /// Sets the next inode counter (a sparse view uses the primary's allocation; a
    /// restarted primary resumes above its persisted high-water mark).
    pub fn set_next_counter(&mut self, c: u64) {
        self.next_counter = c;
    }

    /// Records an intent with a given id (a replica applying its primary's batch).
    pub fn put_intent(&mut self, intent: Intent) {
        self.intents.insert(intent.id, intent);
    }

    /// True when step `step` of intent `intent` has been applied here.
    pub fn has_marker(&self, intent: u64, step: u16) -> bool {
        self.applied.contains(&(intent, step))
    }

    /// The at-most-once markers of an intent.
    pub fn markers_of(&self, intent: u64) -> Vec<(u64, u16)> {
        self.applied.range((intent, 0)..=(intent, u16::MAX)).copied().collect()
    }

    /// Every at-most-once marker held here: of intents coordinated here and of steps
    /// other partitions' intents (or single-partition operations) applied here.
    pub fn all_markers(&self) -> impl Iterator<Item = (u64, u16)> + '_ {
        self.applied.iter().copied()
    }

    /// Restores a marker (loading from disk).
    pub fn insert_marker(&mut self, intent: u64, step: u16) {
        self.applied.insert((intent, step));
    }

    /// Records a new intent; returns its id.
    pub fn begin_intent(&mut self, steps: Vec<(PartitionId, Mutation)>) -> u64 {
        let id = (u64::from(self.id.0) << Ino::COUNTER_BITS) | self.next_intent;
        self.next_intent += 1;
        self.intents.insert(id, Intent { id, steps });
        id
    }

    /// Removes a finished intent.
    pub fn finish_intent(&mut self, id: u64) {
        self.intents.remove(&id);
    }

    /// Forgets the at-most-once markers of a finished intent.
    pub fn forget_intent(&mut self, id: u64) {
        let keys: Vec<_> = self.applied.range((id, 0)..=(id, u16::MAX)).copied().collect();
        for k in keys {
            self.applied.remove(&k);
        }
    }

    /// Whether client operation `op` is recorded as done by an intent still pending
    /// here: its record is durable but some of its steps in other partitions may not be
    /// applied yet, so the operation is not done for a retry to see.
    pub fn done_pending(&self, op: u64) -> bool {
        self.intents.values().any(|i| {
            i.steps
                .iter()
                .any(|(p, m)| *p == self.id && matches!(m, Mutation::Done { op: o, .. } if *o == op))
        })
    }

    /// Looks up an entry.
    pub fn dentry(&self, parent: Ino, name: &[u8]) -> Option<DentryVal> {
        self.dentries.get(&(parent, name.to_vec())).copied()
    }

    /// Entries of `dir` held here with names after `after`, in name order, at most `limit`.
    pub fn entries_after(&self, dir: Ino, after: Option<&[u8]>, limit: usize) -> Vec<(Vec<u8>, DentryVal)> {
        use std::ops::Bound;
        let start = match after {
            Some(a) => Bound::Excluded((dir, a.to_vec())),
            None => Bound::Included((dir, Vec::new())),
        };
        self.dentries
            .range((start, Bound::Unbounded))
            .take_while(|((p, _), _)| *p == dir)
            .take(limit)
            .map(|((_, n), v)| (n.clone(), *v))
            .collect()
    }

    /// Applies step `step` of intent `intent`, at most once. Absolute steps too: an
    /// intent redone after its coordinator died re-sends every step, and re-applying
    /// one applied before would undo what later operations did to the same key (a
    /// create's inode record written again over the size a commit gave it since).
    /// Intent 0 means no at-most-once protection: for steps that are never redone (the
    /// in-memory engine, or absolute steps of a single-batch operation).
    pub fn apply(&mut self, intent: u64, step: u16, m: &Mutation) {
        if intent != 0 && !self.applied.insert((intent, step)) {
            return;
        }
        match m {
            Mutation::PutDentry { parent, name, val } => {
                self.dentries.insert((*parent, name.clone()), *val);
            }
            Mutation::DelDentry { parent, name } => {
                self.dentries.remove(&(*parent, name.clone()));
            }
            Mutation::PutInode(rec) => self.put_inode(rec),
            Mutation::DelInode(ino) => {
                self.inodes.remove(ino);
                self.cut_stripes(*ino, 0);
            }
            Mutation::PutStripes { ino, stripes } => {
                for (s, r) in stripes {
                    self.stripes.insert((*ino, *s), r.clone());
                }
            }
            Mutation::CutStripes { ino, from } => {
                self.cut_stripes(*ino, *from);
            }
            Mutation::AdjustDir {
                dir,
                entries,
                subdirs,
                time,
            } => {
                if let Some(r) = self.inodes.get_mut(dir) {
                    r.attr.size = add_entries(r.attr.size, *entries);
                    r.attr.nlink = add_subdirs(r.attr.nlink, *subdirs);
                    r.attr.mtime = *time;
                    r.attr.ctime = *time;
                }
            }
            Mutation::AdjustLinks { ino, delta, time } => self.adjust_links(*ino, *delta, *time),
            Mutation::HoldPurge { ino, until } => {
                if let Some(p) = self.purges.get_mut(ino) {
                    p.held_until = *until;
                }
            }
            Mutation::Purged(ino) => {
                self.purges.remove(ino);
            }
            Mutation::Done { op, at } => {
                self.expire_done(*at);
                self.put_done(*op, DoneOp { at: *at });
            }
            Mutation::SetParent { dir, parent, time } => {
                if let Some(r) = self.inodes.get_mut(dir) {
                    r.parent = Some(*parent);
                    r.attr.ctime = *time;
                }
            }
        }
    }

    /// Stores an inode record; its stripes (records of their own) go to the stripe
    /// table, so an inode record never carries them.
    fn put_inode(&mut self, rec: &InodeRec) {
        let mut rec = rec.clone();
        if let Some(l) = rec.layout.as_mut()
            && !l.stripes.is_empty()
        {
            for (s, r) in std::mem::take(&mut l.stripes) {
                self.stripes.insert((rec.attr.ino, s), r);
            }
        }
        self.inodes.insert(rec.attr.ino, rec);
    }

    /// Adds `delta` to an inode's link count at `time`. A file or node left with no
    /// link is removed with its stripes; a file's shards go once no client holds it
    /// open (see `HoldPurge`).
    fn adjust_links(&mut self, ino: Ino, delta: i64, time: TimeNs) {
        let remove = match self.inodes.get_mut(&ino) {
            Some(r) => {
                r.attr.nlink = add_links(r.attr.nlink, delta);
                r.attr.ctime = time;
                (r.attr.nlink == 0 && r.attr.kind != FileKind::Dir).then_some(r.attr.kind)
            }
            None => None,
        };
        if let Some(kind) = remove {
            self.inodes.remove(&ino);
            self.cut_stripes(ino, 0);
            if kind == FileKind::File {
                self.purges.insert(
                    ino,
                    Purge {
                        since: time,
                        held_until: time.saturating_add(PURGE_DELAY_NS),
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Directory counts change by relative steps of different operations, applied in
    /// whatever order their batches land (counts follow the answer; a redone step may
    /// land after a later operation's): an unlink's decrement that arrives before its
    /// create's increment must not be lost to a clamp at zero (found by the simulator
    /// once it answered before the counts: seed 673 of its namespace world).
    #[test]
    fn directory_counts_applied_out_of_order_converge() {
        // The root directory of a fresh namespace: entry count 0, link count 2.
        let dir = Ino::ROOT;
        let mut a = crate::namespace::Namespace::format(1, 1)
            .partition(PartitionId(0))
            .expect("partition 0")
            .clone();
        let adjust = |entries, subdirs| Mutation::AdjustDir {
            dir,
            entries,
            subdirs,
            time: 2,
        };
        let mut b = a.clone();
        // An rmdir of a subdirectory, then the mkdir it removed; and the reverse.
        a.apply(7, 2, &adjust(-1, -1));
        a.apply(7, 3, &adjust(-1, -1));
        a.apply(5, 2, &adjust(1, 1));
        a.apply(6, 2, &adjust(1, 1));
        b.apply(5, 2, &adjust(1, 1));
        b.apply(6, 2, &adjust(1, 1));
        b.apply(7, 2, &adjust(-1, -1));
        b.apply(7, 3, &adjust(-1, -1));
        for p in [&a, &b] {
            let attr = &p.inodes[&dir].attr;
            assert_eq!((attr.size, attr.nlink), (0, 2));
        }
        // A step applies once, whatever its order.
        a.apply(5, 2, &adjust(1, 1));
        assert_eq!(a.inodes[&dir].attr.size, 0);
    }
}
