//! One node's copy of one partition, and how batches change it.
//!
//! Pure: no I/O, no clock. The service persists what [`Replica::apply`] reports as
//! touched and replicates the batches; the rules for when a copy may serve live here so
//! they can be tested alone.

use super::wire::PartOp;
use crate::ids::{Epoch, Ino, PartitionId};
use crate::namespace::{FileKind, InodeRec, Mutation, Partition};
use serde::{Deserialize, Serialize};

/// Counters are made durable this many at a time (a restarted primary skips the rest).
pub const COUNTER_BLOCK: u64 = 1024;

/// A key of a partition's persisted records.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    /// A directory entry.
    Dentry(Ino, Vec<u8>),
    /// An inode.
    Inode(Ino),
    /// A pending intent.
    Intent(u64),
    /// An at-most-once marker.
    Marker(u64, u16),
    /// A removed file waiting for its data to be purged.
    Purge(Ino),
    /// One committed stripe of a file: (file, stripe index).
    Stripe(Ino, u64),
    /// A finished client operation, by its id.
    Done(u64),
}

const TAG_DENTRY: u8 = 1;
const TAG_INODE: u8 = 2;
const TAG_INTENT: u8 = 3;
const TAG_MARKER: u8 = 4;
const TAG_PURGE: u8 = 5;
const TAG_STRIPE: u8 = 6;
const TAG_DONE: u8 = 7;

impl Key {
    /// The on-disk key: partition, tag, fields (big-endian, so order is preserved).
    pub fn encode(&self, p: PartitionId) -> Vec<u8> {
        let mut k = p.0.to_be_bytes().to_vec();
        match self {
            Key::Dentry(parent, name) => {
                k.push(TAG_DENTRY);
                k.extend_from_slice(&parent.0.to_be_bytes());
                k.extend_from_slice(name);
            }
            Key::Inode(ino) => {
                k.push(TAG_INODE);
                k.extend_from_slice(&ino.0.to_be_bytes());
            }
            Key::Intent(id) => {
                k.push(TAG_INTENT);
                k.extend_from_slice(&id.to_be_bytes());
            }
            Key::Marker(id, step) => {
                k.push(TAG_MARKER);
                k.extend_from_slice(&id.to_be_bytes());
                k.extend_from_slice(&step.to_be_bytes());
            }
            Key::Purge(ino) => {
                k.push(TAG_PURGE);
                k.extend_from_slice(&ino.0.to_be_bytes());
            }
            Key::Stripe(ino, s) => {
                k.push(TAG_STRIPE);
                k.extend_from_slice(&ino.0.to_be_bytes());
                k.extend_from_slice(&s.to_be_bytes());
            }
            Key::Done(op) => {
                k.push(TAG_DONE);
                k.extend_from_slice(&op.to_be_bytes());
            }
        }
        k
    }

    /// Parses an on-disk key (`None` for anything malformed).
    pub fn decode(k: &[u8]) -> Option<(PartitionId, Key)> {
        let p = PartitionId(u32::from_be_bytes(k.get(..4)?.try_into().ok()?));
        let rest = k.get(5..)?;
        let u64_at = |b: &[u8]| -> Option<u64> { Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?)) };
        let key = match *k.get(4)? {
            TAG_DENTRY => Key::Dentry(Ino(u64_at(rest)?), rest.get(8..)?.to_vec()),
            TAG_INODE if rest.len() == 8 => Key::Inode(Ino(u64_at(rest)?)),
            TAG_INTENT if rest.len() == 8 => Key::Intent(u64_at(rest)?),
            TAG_PURGE if rest.len() == 8 => Key::Purge(Ino(u64_at(rest)?)),
            TAG_DONE if rest.len() == 8 => Key::Done(u64_at(rest)?),
            TAG_STRIPE if rest.len() == 16 => Key::Stripe(Ino(u64_at(rest)?), u64_at(rest.get(8..)?)?),
            TAG_MARKER if rest.len() == 10 => {
                Key::Marker(u64_at(rest)?, u16::from_be_bytes(rest.get(8..10)?.try_into().ok()?))
            }
            _ => return None,
        };
        Some((p, key))
    }
}

/// Low bits of a reign that count the takeovers within one map epoch.
pub const REIGN_SEQ_BITS: u32 = 16;

/// The reign a new primary starts in map epoch `epoch`, having seen the reigns `seen`
/// (its own copy's and those of the members it asked).
///
/// A copy's `state_epoch` names its *reign*: one primary incarnation's numbering of
/// batches, as the map epoch it began in (high bits) and which takeover of that epoch it
/// is (low [`REIGN_SEQ_BITS`] bits). Only the partition's primary of an epoch takes over
/// in that epoch, but it can do so twice — restarted before the managers noticed, or
/// after its copy stopped serving — and its second numbering must not be taken for its
/// first: a member still on the first at lsn 40 would acknowledge the second's batches
/// 1..40 without applying them. Every reign this node began is persisted before its
/// first batch, so the reigns it has seen include all earlier ones of this epoch.
///
/// `None` when a seen reign is of a later epoch (this node's map is behind) or the
/// epoch has had 2^16 takeovers.
pub fn next_reign(epoch: Epoch, seen: impl IntoIterator<Item = Epoch>) -> Option<Epoch> {
    let mask = (1u64 << REIGN_SEQ_BITS) - 1;
    if epoch.0 >> (64 - REIGN_SEQ_BITS) != 0 {
        return None;
    }
    let mut seq = 0;
    for r in seen {
        match (r.0 >> REIGN_SEQ_BITS).cmp(&epoch.0) {
            std::cmp::Ordering::Greater => return None,
            std::cmp::Ordering::Equal => seq = seq.max((r.0 & mask) + 1),
            std::cmp::Ordering::Less => {}
        }
    }
    (seq <= mask).then_some(Epoch((epoch.0 << REIGN_SEQ_BITS) | seq))
}

/// Position and counters of a copy, persisted with every batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartMeta {
    /// Batches applied since the copy's state epoch began.
    pub lsn: u64,
    /// The reign whose primary produced this copy (see [`next_reign`]).
    pub state_epoch: Epoch,
    /// Counters below this may have been handed out.
    pub counter_hwm: u64,
}

/// A node's copy of a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// The state.
    pub part: Partition,
    /// Position and counters.
    pub meta: PartMeta,
    /// Caught up for the current epoch: may serve reads (and, as primary, writes).
    pub serving: bool,
    /// The highest counter mark a batch acknowledged by every member carried (kept in
    /// memory by a primary; 0 after a restart, an install or a new reign). Only numbers
    /// below it are handed out without a batch: a mark persisted on this node alone is
    /// unknown to a primary that takes over without hearing from it.
    pub counter_shared: u64,
    /// This copy stopped serving only because its node was promoted to primary at the
    /// start of this map epoch, after following its primary to the end of the previous
    /// one: it holds every acknowledged batch, and its takeover need not wait for the
    /// other placement nodes (in memory only).
    pub complete_at: Option<Epoch>,
}

impl Replica {
    /// A copy in its initial state: empty, except partition 0 which holds the root
    /// directory (every member creates the same one, so initial copies agree).
    pub fn initial(p: PartitionId, partitions: u32, now: i64) -> Replica {
        let part = if p.0 == 0 {
            let ns = crate::namespace::Namespace::format(partitions, now);
            ns.partition(p).cloned().unwrap_or_else(|| Partition::new(p))
        } else {
            Partition::new(p)
        };
        Replica {
            meta: PartMeta {
                lsn: 0,
                state_epoch: Epoch(0),
                counter_hwm: part.next_counter(),
            },
            part,
            serving: false,
            counter_shared: 0,
            complete_at: None,
        }
    }

    /// The keys a batch touches (their values after it are what gets persisted).
    pub fn touched(&self, ops: &[PartOp]) -> Vec<Key> {
        let mut keys = Vec::new();
        for op in ops {
            match op {
                PartOp::Apply { intent, step, m } => {
                    if *intent != 0 {
                        keys.push(Key::Marker(*intent, *step));
                    }
                    let key = match m {
                        Mutation::PutDentry { parent, name, .. } | Mutation::DelDentry { parent, name } => {
                            Key::Dentry(*parent, name.clone())
                        }
                        Mutation::PutInode(rec) => {
                            if let Some(l) = &rec.layout {
                                keys.extend(l.stripes.keys().map(|s| Key::Stripe(rec.attr.ino, *s)));
                            }
                            Key::Inode(rec.attr.ino)
                        }
                        Mutation::DelInode(ino) => {
                            keys.extend(self.part.stripes_of(*ino, 0).map(|(s, _)| Key::Stripe(*ino, s)));
                            Key::Inode(*ino)
                        }
                        Mutation::PutStripes { ino, stripes } => {
                            keys.extend(stripes.iter().map(|(s, _)| Key::Stripe(*ino, *s)));
                            continue;
                        }
                        Mutation::CutStripes { ino, from } => {
                            keys.extend(self.part.stripes_of(*ino, *from).map(|(s, _)| Key::Stripe(*ino, s)));
                            continue;
                        }
                        Mutation::AdjustDir { dir, .. } | Mutation::SetParent { dir, .. } => Key::Inode(*dir),
                        Mutation::AdjustLinks { ino, .. } => {
                            // The last link of a file also queues its purge.
                            keys.push(Key::Purge(*ino));
                            Key::Inode(*ino)
                        }
                        Mutation::HoldPurge { ino, .. } | Mutation::Purged(ino) => Key::Purge(*ino),
                        Mutation::Done { op, at } => {
                            keys.extend(self.part.done_expiring(*at).map(Key::Done));
                            Key::Done(*op)
                        }
                    };
                    keys.push(key);
                }
                PartOp::Begin(i) => keys.push(Key::Intent(i.id)),
                PartOp::Finish(id) => keys.push(Key::Intent(*id)),
                PartOp::Forget(id) => {
                    keys.extend(self.part.markers_of(*id).into_iter().map(|(i, s)| Key::Marker(i, s)));
                }
                PartOp::Counter(_) => {}
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// Applies a batch in memory; returns the keys to persist.
    pub fn apply(&mut self, ops: &[PartOp]) -> Vec<Key> {
        let mut keys = Vec::new();
        for op in ops {
            // Each operation's keys are found just before it runs, on the state the
            // earlier operations of the batch left.
            keys.extend(self.touched(std::slice::from_ref(op)));
            // The last link of a file going also removes its stripes.
            if let PartOp::Apply {
                m: Mutation::AdjustLinks { ino, .. },
                ..
            } = op
                && self.part.inodes.get(ino).is_some_and(|r| r.attr.kind == FileKind::File)
            {
                let had: Vec<u64> = self.part.stripes_of(*ino, 0).map(|(s, _)| s).collect();
                self.apply_one(op);
                if !self.part.inodes.contains_key(ino) {
                    keys.extend(had.into_iter().map(|s| Key::Stripe(*ino, s)));
                }
                continue;
            }
            self.apply_one(op);
        }
        keys.sort();
        keys.dedup();
        keys
    }

    fn apply_one(&mut self, op: &PartOp) {
        {
            match op {
                PartOp::Apply { intent, step, m } => self.part.apply(*intent, *step, m),
                PartOp::Begin(i) => self.part.put_intent(i.clone()),
                PartOp::Finish(id) => self.part.finish_intent(*id),
                PartOp::Forget(id) => self.part.forget_intent(*id),
                PartOp::Counter(hwm) => {
                    self.meta.counter_hwm = self.meta.counter_hwm.max(*hwm);
                }
            }
        }
    }

    /// The current value of a key, encoded for disk (`None`: absent).
    pub fn value(&self, key: &Key) -> Option<Vec<u8>> {
        match key {
            Key::Dentry(parent, name) => self.part.dentry(*parent, name).map(|v| enc(&v)),
            Key::Inode(ino) => self.part.inodes.get(ino).map(enc),
            Key::Intent(id) => self.part.intents.get(id).map(enc),
            Key::Marker(id, step) => self.part.has_marker(*id, *step).then(Vec::new),
            Key::Purge(ino) => self.part.purges.get(ino).map(enc),
            Key::Stripe(ino, s) => self.part.stripes.get(&(*ino, *s)).map(enc),
            Key::Done(op) => self.part.done.get(op).map(enc),
        }
    }

    /// Every key with its value (an install writes the whole copy).
    pub fn all_values(&self) -> Vec<(Key, Vec<u8>)> {
        let mut out = Vec::new();
        for ((parent, name), v) in &self.part.dentries {
            out.push((Key::Dentry(*parent, name.clone()), enc(v)));
        }
        for (ino, r) in &self.part.inodes {
            out.push((Key::Inode(*ino), enc(r)));
        }
        for (id, i) in &self.part.intents {
            out.push((Key::Intent(*id), enc(i)));
        }
        for (ino, p) in &self.part.purges {
            out.push((Key::Purge(*ino), enc(p)));
        }
        for ((ino, s), r) in &self.part.stripes {
            out.push((Key::Stripe(*ino, *s), enc(r)));
        }
        for (op, d) in &self.part.done {
            out.push((Key::Done(*op), enc(d)));
        }
        // All markers, not only those of intents coordinated here: a step of another
        // partition's intent applied here must stay applied-once across a restart.
        for (i, s) in self.part.all_markers() {
            out.push((Key::Marker(i, s), Vec::new()));
        }
        out
    }

    /// Restores one persisted record (loading at start). Malformed values are errors.
    pub fn restore(&mut self, key: Key, value: &[u8]) -> Result<(), postcard::Error> {
        match key {
            Key::Dentry(parent, name) => {
                let v = postcard::from_bytes(value)?;
                self.part.dentries.insert((parent, name), v);
            }
            Key::Inode(ino) => {
                let r: InodeRec = postcard::from_bytes(value)?;
                self.part.inodes.insert(ino, r);
            }
            Key::Intent(id) => {
                let i = postcard::from_bytes(value)?;
                self.part.intents.insert(id, i);
            }
            Key::Marker(id, step) => self.part.insert_marker(id, step),
            Key::Purge(ino) => {
                let p = postcard::from_bytes(value)?;
                self.part.purges.insert(ino, p);
            }
            Key::Stripe(ino, s) => {
                let r = postcard::from_bytes(value)?;
                self.part.stripes.insert((ino, s), r);
            }
            Key::Done(op) => {
                let d = postcard::from_bytes(value)?;
                self.part.put_done(op, d);
            }
        }
        Ok(())
    }

    /// Hands out the next counter; returns it and, when the durable high-water mark must
    /// rise first, the new mark to persist (and replicate) before the counter is used.
    pub fn next_counter(&mut self) -> (u64, Option<u64>) {
        let c = self.part.next_counter().max(1);
        self.part.set_next_counter(c.saturating_add(1));
        if c.saturating_add(1) > self.meta.counter_hwm.min(self.counter_shared) {
            let hwm = c.saturating_add(COUNTER_BLOCK);
            (c, Some(hwm))
        } else {
            (c, None)
        }
    }

    /// After a restart or an install: resume counting above everything possibly handed out.
    pub fn resume_counters(&mut self) {
        let c = self.part.next_counter().max(self.meta.counter_hwm);
        self.part.set_next_counter(c);
    }
}

/// Encodes a record for disk. Serialising these plain structs into a `Vec` cannot fail.
fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::DentryVal;

    #[test]
    fn keys_round_trip_and_keep_order() {
        let p = PartitionId(7);
        let keys = [
            Key::Dentry(Ino(5), b"a".to_vec()),
            Key::Dentry(Ino(5), b"b".to_vec()),
            Key::Inode(Ino(9)),
            Key::Intent(3),
            Key::Marker(3, 2),
            Key::Done(11),
        ];
        let enc: Vec<_> = keys.iter().map(|k| k.encode(p)).collect();
        for (k, e) in keys.iter().zip(&enc) {
            assert_eq!(Key::decode(e), Some((p, k.clone())));
        }
        assert!(enc.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(Key::decode(&[0, 0, 0, 1, 9]), None);
        assert_eq!(Key::decode(&[0, 0, 0, 1, TAG_INODE, 1]), None);
    }

    #[test]
    fn apply_reports_touched_keys_and_restore_rebuilds_the_copy() {
        let mut r = Replica::initial(PartitionId(0), 4, 1);
        let ops = vec![
            PartOp::Apply {
                intent: 0,
                step: 0,
                m: Mutation::PutDentry {
                    parent: Ino::ROOT,
                    name: b"x".to_vec(),
                    val: DentryVal {
                        ino: Ino(77),
                        kind: FileKind::File,
                    },
                },
            },
            PartOp::Apply {
                intent: 5,
                step: 1,
                m: Mutation::AdjustDir {
                    dir: Ino::ROOT,
                    entries: 1,
                    subdirs: 0,
                    time: 2,
                },
            },
        ];
        let keys = r.apply(&ops);
        assert_eq!(
            keys,
            vec![
                Key::Dentry(Ino::ROOT, b"x".to_vec()),
                Key::Inode(Ino::ROOT),
                Key::Marker(5, 1)
            ]
        );
        // Applying the relative step again changes nothing (at most once).
        r.apply(&ops[1..]);
        assert_eq!(r.part.inodes[&Ino::ROOT].attr.size, 1);
        let mut back = Replica::initial(PartitionId(0), 4, 1);
        back.part.inodes.clear();
        for (k, v) in r.all_values() {
            back.restore(k, &v).expect("restore");
        }
        assert_eq!(back.part.dentries, r.part.dentries);
        assert_eq!(back.part.inodes, r.part.inodes);
        // The marker of another partition's intent (no intent record here) survives too.
        assert!(back.part.has_marker(5, 1));
        back.apply(&ops[1..]);
        assert_eq!(back.part.inodes[&Ino::ROOT].attr.size, 1);
    }

    #[test]
    fn done_records_persist_and_expire_the_same_on_every_copy() {
        use crate::namespace::DONE_KEEP_NS;
        let done = |op, at| PartOp::Apply {
            intent: 0,
            step: 0,
            m: Mutation::Done { op, at },
        };
        let mut r = Replica::initial(PartitionId(0), 4, 1);
        assert_eq!(r.apply(&[done(1, 10), done(2, 20)]), vec![Key::Done(1), Key::Done(2)]);
        // A retry's redo of the same record changes nothing but its time.
        r.apply(&[done(1, 10)]);
        assert_eq!(r.part.done.len(), 2);
        // A record at 10 + keep drops nothing (older than keep is dropped, not as old).
        assert_eq!(r.apply(&[done(3, 10 + DONE_KEEP_NS)]), vec![Key::Done(3)]);
        assert_eq!(r.part.done.len(), 3);
        // Later: the record of op 1 goes, and is among the keys persisted (deleted).
        let keys = r.apply(&[done(4, 15 + DONE_KEEP_NS)]);
        assert_eq!(keys, vec![Key::Done(1), Key::Done(4)]);
        assert_eq!(r.value(&Key::Done(1)), None);
        assert!(r.part.done.contains_key(&2) && !r.part.done.contains_key(&1));
        let mut back = Replica::initial(PartitionId(0), 4, 1);
        for (k, v) in r.all_values() {
            back.restore(k, &v).expect("restore");
        }
        assert_eq!(back.part.done, r.part.done);
        // The restored copy expires exactly what the original does.
        let later = [done(5, 25 + DONE_KEEP_NS)];
        assert_eq!(back.apply(&later), r.apply(&later));
        assert_eq!(back.part, r.part);
    }

    fn stripe(version: u64) -> crate::namespace::StripeRec {
        crate::namespace::StripeRec {
            version,
            len: 4096,
            nodes: vec![
                Some(crate::ids::NodeId(1)),
                Some(crate::ids::NodeId(2)),
                Some(crate::ids::NodeId(3)),
            ],
        }
    }

    fn file(ino: Ino) -> InodeRec {
        let mut rec = Replica::initial(PartitionId(0), 4, 1).part.inodes[&Ino::ROOT].clone();
        rec.attr.ino = ino;
        rec.attr.kind = FileKind::File;
        rec.attr.nlink = 1;
        rec.parent = None;
        rec.layout = Some(crate::namespace::Layout {
            k: 2,
            m: 1,
            unit: 4096,
            ..Default::default()
        });
        rec
    }

    fn put(m: Mutation) -> PartOp {
        PartOp::Apply { intent: 0, step: 0, m }
    }

    /// Stripe records are persisted one key each: a commit touches the stripes it
    /// writes, a truncate the ones it cuts, the last unlink all of the file's.
    #[test]
    fn stripe_records_are_keys_of_their_own() {
        let f = Ino(0x55);
        let mut r = Replica::initial(PartitionId(0), 4, 1);
        let stripes = (0..100).map(|s| (s, stripe(s + 1))).collect();
        let keys = r.apply(&[
            put(Mutation::PutInode(Box::new(file(f)))),
            put(Mutation::PutStripes { ino: f, stripes }),
        ]);
        assert_eq!(keys.len(), 101);
        // One stripe rewritten: its key and nothing else of the layout.
        let keys = r.apply(&[put(Mutation::PutStripes {
            ino: f,
            stripes: vec![(42, stripe(500))],
        })]);
        assert_eq!(keys, vec![Key::Stripe(f, 42)]);
        assert_eq!(r.value(&Key::Stripe(f, 42)), Some(enc(&stripe(500))));
        // A truncate cuts 90..100.
        let keys = r.apply(&[put(Mutation::CutStripes { ino: f, from: 90 })]);
        assert_eq!(keys, (90..100).map(|s| Key::Stripe(f, s)).collect::<Vec<_>>());
        assert!(keys.iter().all(|k| r.value(k).is_none()));
        // A second link going is not the last: the stripes stay and are not rewritten.
        let mut two = file(f);
        two.attr.nlink = 2;
        r.apply(&[put(Mutation::PutInode(Box::new(two)))]);
        let keys = r.apply(&[put(Mutation::AdjustLinks {
            ino: f,
            delta: -1,
            time: 3,
        })]);
        assert!(!keys.iter().any(|k| matches!(k, Key::Stripe(..))), "{keys:?}");
        // The last link: every stripe key goes with the inode.
        let keys = r.apply(&[put(Mutation::AdjustLinks {
            ino: f,
            delta: -1,
            time: 4,
        })]);
        assert_eq!(keys.iter().filter(|k| matches!(k, Key::Stripe(..))).count(), 90);
        assert!(r.part.stripes.is_empty());
        let k = Key::Stripe(f, 7);
        assert_eq!(Key::decode(&k.encode(PartitionId(0))), Some((PartitionId(0), k)));
    }

    /// A copy loaded from a store of format 1 (stripes inside inode records) splits
    /// them into stripe records, raising the version counter above clock versions.
    #[test]
    fn embedded_stripes_are_split_out_on_upgrade() {
        let f = Ino(0x56);
        let mut old = file(f);
        if let Some(l) = old.layout.as_mut() {
            l.stripes.insert(0, stripe(1_700_000_000));
            l.stripes.insert(3, stripe(5));
        }
        let mut r = Replica::initial(PartitionId(0), 4, 1);
        r.restore(Key::Inode(f), &enc(&old)).expect("restore");
        assert!(r.part.split_embedded_stripes());
        assert!(!r.part.split_embedded_stripes(), "once");
        let rec = &r.part.inodes[&f];
        let l = rec.layout.as_ref().expect("layout");
        assert!(l.stripes.is_empty());
        assert_eq!(l.next_version, 1_700_000_001);
        assert_eq!(r.part.stripes.len(), 2);
        let whole = r
            .part
            .inode_with_stripes(f, u64::MAX)
            .and_then(|r| r.layout)
            .expect("layout");
        assert_eq!(whole.stripes.keys().copied().collect::<Vec<_>>(), vec![0, 3]);
        // What an install then writes reloads to the same copy.
        let mut back = Replica::initial(PartitionId(0), 4, 1);
        for (k, v) in r.all_values() {
            back.restore(k, &v).expect("restore");
        }
        assert_eq!(back.part.stripes, r.part.stripes);
        assert_eq!(back.part.inodes[&f], r.part.inodes[&f]);
    }

    #[test]
    fn counters_are_durable_in_blocks() {
        let mut r = Replica::initial(PartitionId(3), 4, 1);
        r.meta.counter_hwm = 1;
        let (c, hwm) = r.next_counter();
        assert_eq!(c, 1);
        assert_eq!(hwm, Some(1 + COUNTER_BLOCK));
        r.meta.counter_hwm = hwm.unwrap_or(0);
        let (c2, _) = r.next_counter();
        assert_eq!(c2, 2, "the mark is not acknowledged yet: raise it again");
        r.acknowledged(&[PartOp::Counter(r.meta.counter_hwm)]);
        let (c2, hwm2) = r.next_counter();
        assert_eq!((c2, hwm2), (3, None));
        // A restart resumes above the mark, never reusing a counter.
        let mut again = Replica::initial(PartitionId(3), 4, 1);
        again.meta.counter_hwm = r.meta.counter_hwm;
        again.resume_counters();
        assert!(again.next_counter().0 >= r.meta.counter_hwm);
    }

    #[test]
    fn a_redone_intent_does_not_write_an_applied_step_again() {
        let mut r = Replica::initial(PartitionId(0), 4, 1);
        let rec = r.part.inodes[&Ino::ROOT].clone();
        let step = PartOp::Apply {
            intent: 9,
            step: 0,
            m: Mutation::PutInode(Box::new(rec.clone())),
        };
        let keys = r.apply(std::slice::from_ref(&step));
        assert!(keys.contains(&Key::Marker(9, 0)), "the marker is persisted: {keys:?}");
        // A later operation changes the record (a commit's size).
        let mut later = rec;
        later.attr.size = 300_000;
        r.apply(&[PartOp::Apply {
            intent: 0,
            step: 0,
            m: Mutation::PutInode(Box::new(later)),
        }]);
        // The intent is redone after its coordinator died: the step was applied.
        r.apply(&[step]);
        assert_eq!(r.part.inodes[&Ino::ROOT].attr.size, 300_000);
    }

    #[test]
    fn reigns_are_unique_within_an_epoch_and_ordered_across_epochs() {
        // The first takeover of epoch 7, after reigns of earlier epochs.
        let first = next_reign(Epoch(7), [Epoch(0), Epoch(5 << REIGN_SEQ_BITS | 3)]).expect("reign");
        assert_eq!(first, Epoch(7 << REIGN_SEQ_BITS));
        // The same node taking over again in epoch 7 (its copy says `first`).
        let second = next_reign(Epoch(7), [first, Epoch(6 << REIGN_SEQ_BITS)]).expect("reign");
        assert!(second > first);
        assert_eq!(second.0 >> REIGN_SEQ_BITS, 7);
        // Every reign of epoch 8 ranks above every reign of epoch 7.
        let next = next_reign(Epoch(8), [second]).expect("reign");
        assert!(next > second);
        // A member on a later epoch's reign: this map is behind, no takeover.
        assert_eq!(next_reign(Epoch(7), [next]), None);
        // Out of numbers within an epoch.
        let last = Epoch(7 << REIGN_SEQ_BITS | ((1 << REIGN_SEQ_BITS) - 1));
        assert_eq!(next_reign(Epoch(7), [last]), None);
        // Copies written before reigns were numbered (state epoch = map epoch) rank
        // below every numbered reign of epoch 1 and later.
        assert!(next_reign(Epoch(1), [Epoch(40)]).expect("reign") > Epoch(40));
    }
}
