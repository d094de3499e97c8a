//! The metadata store's write-ahead log, as a pure core: frames, where the next one
//! goes, and what a log read back after a crash still holds.
//!
//! A group commit used to be a redb transaction committed with fsync: redb rewrites the
//! B-tree pages on the path to each changed key and its allocator state, several random
//! writes per commit. Now the group is one frame appended to a log file (`meta.wal`)
//! and made durable with one `fdatasync` of blocks the file already has (no journal
//! commit of the file system), and the same writes go into redb without a sync
//! ([`redb::Durability::None`]). Every so often a **checkpoint** commits redb durably,
//! which persists every write before it, records the sequence number of the last frame
//! it covers (`applied`), and starts the log again at offset 0.
//!
//! Opening replays the frames after `applied`: the first must lie at offset 0 with
//! sequence `applied + 1`, and each next one follows the previous with the next
//! sequence. A frame is padded to [`BLOCK`], so appending never rewrites the blocks of
//! an acknowledged frame; a torn last frame (never acknowledged) fails its checksum and
//! ends the log; frames of an earlier round through the file carry smaller sequence
//! numbers and end it too. A bad frame followed by a good one of a later sequence is
//! corruption of an acknowledged frame, and opening refuses it ([`scan`]).

use serde::{Deserialize, Serialize};

/// Frames start at multiples of this (a device block).
pub const BLOCK: u64 = 4096;
const MAGIC: u32 = 0x4c57_4853; // "SHWL", little-endian
const HEADER: usize = 20;
/// Largest payload a frame header can describe; a larger group is a checkpoint.
const MAX_PAYLOAD: usize = u32::MAX as usize;

/// One write of a group, as it goes into redb (the store's own key encoding).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogOp {
    /// Drop every record of a partition (an install replaces its copy).
    Clear(u32),
    /// Put a record: key, value.
    Put(Vec<u8>, Vec<u8>),
    /// Delete a record.
    Del(Vec<u8>),
    /// A partition's position (its encoded `PartMeta`).
    Part(u32, Vec<u8>),
}

/// A frame of sequence `seq` holding `ops`, padded to a multiple of [`BLOCK`]; `None`
/// when the ops do not fit a frame (the group goes to redb as a checkpoint instead).
pub fn frame(seq: u64, ops: &[LogOp]) -> Option<Vec<u8>> {
    let payload = postcard::to_stdvec(ops).ok()?;
    if payload.len() > MAX_PAYLOAD {
        return None;
    }
    let len = payload.len() as u32;
    let mut f = Vec::with_capacity(padded(HEADER + payload.len()));
    f.extend_from_slice(&MAGIC.to_le_bytes());
    f.extend_from_slice(&seq.to_le_bytes());
    f.extend_from_slice(&len.to_le_bytes());
    f.extend_from_slice(&checksum(seq, len, &payload).to_le_bytes());
    f.extend_from_slice(&payload);
    f.resize(padded(f.len()), 0);
    Some(f)
}

fn padded(n: usize) -> usize {
    n.div_ceil(BLOCK as usize) * BLOCK as usize
}

fn checksum(seq: u64, len: u32, payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(&seq.to_le_bytes());
    let c = crc32c::crc32c_append(c, &len.to_le_bytes());
    crc32c::crc32c_append(c, payload)
}

/// The frame at `off` if one is whole there: its sequence, payload, and where the next
/// one starts.
fn frame_at(log: &[u8], off: usize) -> Option<(u64, &[u8], usize)> {
    let h = log.get(off..off.checked_add(HEADER)?)?;
    let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    if word(0) != MAGIC {
        return None;
    }
    let seq = u64::from_le_bytes(h[4..12].try_into().ok()?);
    let len = word(12);
    let start = off + HEADER;
    let payload = log.get(start..start.checked_add(len as usize)?)?;
    if checksum(seq, len, payload) != word(16) {
        return None;
    }
    Some((seq, payload, off + padded(HEADER + len as usize)))
}

/// What a log read back holds after checkpoint `applied`.
#[derive(Debug, PartialEq, Eq)]
pub struct Scanned {
    /// The groups of the frames after `applied`, in order.
    pub groups: Vec<Vec<LogOp>>,
    /// The sequence of the last of them (`applied` when none).
    pub last: u64,
}

/// Reads the frames after checkpoint `applied` from a whole log file. Errors when a
/// frame that checks is not a group (a log of another format), or when the log breaks
/// off before a checked frame of a later sequence (an acknowledged frame was damaged).
pub fn scan(log: &[u8], applied: u64) -> Result<Scanned, String> {
    let mut groups = Vec::new();
    let mut off = 0usize;
    let mut last = applied;
    while let Some((seq, payload, next)) = frame_at(log, off) {
        if Some(seq) != last.checked_add(1) {
            break;
        }
        let ops: Vec<LogOp> =
            postcard::from_bytes(payload).map_err(|e| format!("log frame {seq} at offset {off}: {e}"))?;
        groups.push(ops);
        last = seq;
        off = next;
    }
    // What follows the end: a torn frame, zeros, or frames of an earlier round (smaller
    // sequences). A checked frame of a later sequence means one in between was lost.
    let mut b = off.div_ceil(BLOCK as usize) * BLOCK as usize;
    while b < log.len() {
        if let Some((seq, _, _)) = frame_at(log, b)
            && seq > last
        {
            return Err(format!(
                "log damaged at offset {off}: frame {seq} at offset {b} follows, frame {} is missing",
                last + 1
            ));
        }
        b += BLOCK as usize;
    }
    Ok(Scanned { groups, last })
}

/// Where the next group goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Append it as frame `seq` at offset `at` (then sync the log and write redb
    /// without a sync).
    Append {
        /// Offset in the log.
        at: u64,
        /// Its sequence number.
        seq: u64,
    },
    /// Commit it to redb durably, recording `applied`; the log starts again at 0.
    Checkpoint {
        /// The last frame the checkpoint covers.
        applied: u64,
    },
}

/// The writer's position in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    pos: u64,
    seq: u64,
    cap: u64,
}

impl Cursor {
    /// A log of `cap` bytes just checkpointed at `applied` (after opening: the replay's
    /// checkpoint).
    pub fn new(applied: u64, cap: u64) -> Cursor {
        Cursor {
            pos: 0,
            seq: applied,
            cap: cap.max(BLOCK),
        }
    }

    /// Where a group whose frame is `len` bytes (`None`: it has none) goes. Past half
    /// the log, the next group is a checkpoint, so replay after a crash stays short.
    pub fn place(&mut self, len: Option<u64>) -> Place {
        match len {
            Some(len) if self.pos < self.cap / 2 && self.pos + len <= self.cap => {
                self.seq += 1;
                let at = self.pos;
                self.pos += len;
                Place::Append { at, seq: self.seq }
            }
            _ => self.checkpointed(),
        }
    }

    /// A checkpoint when the log is not empty (the writer is idle).
    pub fn idle(&mut self) -> Option<Place> {
        (self.pos > 0).then(|| self.checkpointed())
    }

    fn checkpointed(&mut self) -> Place {
        self.pos = 0;
        Place::Checkpoint { applied: self.seq }
    }

    /// The sequence number the next frame takes.
    pub fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    /// The log's size limit.
    pub fn cap(&self) -> u64 {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn put(k: u8, v: u8) -> LogOp {
        LogOp::Put(vec![k], vec![v])
    }

    #[test]
    fn frames_read_back_in_order_and_stop_at_a_torn_one() {
        let mut log = Vec::new();
        for seq in 1..=3 {
            log.extend(frame(seq, &[put(seq as u8, 1)]).expect("frame"));
        }
        let all = scan(&log, 0).expect("scan");
        assert_eq!(all.last, 3);
        assert_eq!(all.groups.len(), 3);
        // A checkpoint covering them all (the log not started again yet): nothing after.
        assert_eq!(scan(&log, 3).expect("scan").groups, Vec::<Vec<LogOp>>::new());
        // A torn last frame ends the log.
        let mut torn = log.clone();
        torn[2 * BLOCK as usize + HEADER] ^= 1;
        assert_eq!(scan(&torn, 0).expect("scan").last, 2);
        // A damaged middle frame before a good later one is refused.
        let mut bad = log.clone();
        bad[BLOCK as usize + HEADER] ^= 1;
        let e = scan(&bad, 0).expect_err("damaged");
        assert!(e.contains("frame 3 at offset 8192"), "{e}");
    }

    /// The log's bytes on disk do not change by accident: a log written by hand (the
    /// fuzzer's seed) reads back.
    #[test]
    fn a_log_of_this_format_reads_back() {
        let log = include_bytes!("../../fuzz/seeds/meta_messages/wal-two-frames");
        let got = scan(log, 0).expect("scan");
        let ops = vec![
            LogOp::Put(vec![0, 0], vec![0x41]),
            LogOp::Del(vec![0x42]),
            LogOp::Clear(7),
        ];
        assert_eq!(
            got,
            Scanned {
                groups: vec![ops.clone(), ops.clone()],
                last: 2
            }
        );
        assert_eq!(frame(1, &ops).expect("frame"), log[..BLOCK as usize]);
    }

    /// A simulated disk: the log's bytes, redb's durable and in-memory states.
    struct Disk {
        log: Vec<u8>,
        durable: BTreeMap<Vec<u8>, Vec<u8>>,
        applied: u64,
        memory: BTreeMap<Vec<u8>, Vec<u8>>,
    }

    fn apply(db: &mut BTreeMap<Vec<u8>, Vec<u8>>, ops: &[LogOp]) {
        for op in ops {
            match op {
                LogOp::Put(k, v) => {
                    db.insert(k.clone(), v.clone());
                }
                LogOp::Del(k) => {
                    db.remove(k);
                }
                LogOp::Clear(_) => db.clear(),
                LogOp::Part(..) => {}
            }
        }
    }

    /// Groups of writes through the cursor, crashes at random points (the write in
    /// flight lost, torn or whole), recovery: what opening gives back is every
    /// acknowledged group, in order, and maybe the one in flight — never less, never a
    /// mix. Thousands of seeds.
    #[test]
    #[allow(clippy::too_many_lines)] // a scenario, step by step
    fn recovery_keeps_every_acknowledged_group() {
        for seed in 0..2000u64 {
            let mut rng = shingle_testkit::Rng::seeded(seed);
            let cap = BLOCK * (2 + rng.below(14));
            let mut disk = Disk {
                log: Vec::new(),
                durable: BTreeMap::new(),
                applied: 0,
                memory: BTreeMap::new(),
            };
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut cur = Cursor::new(0, cap);
            for _round in 0..(1 + rng.below(4)) {
                let groups = rng.below(30);
                let mut crashed_in_flight: Option<Vec<LogOp>> = None;
                for g in 0..groups {
                    let most = if rng.below(20) == 0 { 900 } else { 8 };
                    let n = 1 + rng.below(most);
                    let ops: Vec<LogOp> = (0..n)
                        .map(|_| {
                            let pick = rng.below(200);
                            let k = rng.below(16) as u8;
                            let v = rng.below(256) as u8;
                            match pick {
                                0 => LogOp::Clear(0),
                                1..=10 => LogOp::Del(vec![k]),
                                _ => put(k, v),
                            }
                        })
                        .collect();
                    let crash = g + 1 == groups && rng.below(2) == 0;
                    let idle = rng.below(10) == 0;
                    if idle && let Some(Place::Checkpoint { applied }) = cur.idle() {
                        disk.durable = disk.memory.clone();
                        disk.applied = applied;
                    }
                    let f = frame(cur.next_seq(), &ops);
                    match cur.place(f.as_ref().map(|f| f.len() as u64)) {
                        Place::Append { at, seq } => {
                            let f = f.expect("a frame was placed");
                            assert_eq!(f[4..12], seq.to_le_bytes());
                            let at = at as usize;
                            if disk.log.len() < at + f.len() {
                                disk.log.resize(at + f.len(), 0);
                            }
                            let written = if crash {
                                // The write in flight: nothing, part of it, or all.
                                rng.below(f.len() as u64 + 1) as usize
                            } else {
                                f.len()
                            };
                            disk.log[at..at + written].copy_from_slice(&f[..written]);
                            if crash {
                                crashed_in_flight = Some(ops);
                                break;
                            }
                            apply(&mut disk.memory, &ops);
                        }
                        Place::Checkpoint { applied } => {
                            if crash {
                                // Redb's durable commit is atomic: lost or made.
                                if rng.below(2) == 0 {
                                    apply(&mut disk.memory, &ops);
                                    disk.durable = disk.memory.clone();
                                    disk.applied = applied;
                                    apply(&mut model, &ops);
                                }
                                break;
                            }
                            apply(&mut disk.memory, &ops);
                            disk.durable = disk.memory.clone();
                            disk.applied = applied;
                        }
                    }
                    apply(&mut model, &ops);
                }
                // Crash (or not) and open: the durable redb plus the replayed frames.
                let got = scan(&disk.log, disk.applied).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                let mut db = disk.durable.clone();
                for g in &got.groups {
                    apply(&mut db, g);
                }
                let mut with_flight = model.clone();
                if let Some(ops) = &crashed_in_flight {
                    apply(&mut with_flight, ops);
                }
                assert!(
                    db == model || db == with_flight,
                    "seed {seed}: recovered state is not the acknowledged one"
                );
                if db == with_flight {
                    model = with_flight;
                }
                // Opening checkpoints the replay and starts the log at 0.
                disk.durable = db.clone();
                disk.memory = db;
                disk.applied = got.last;
                cur = Cursor::new(got.last, cap);
            }
        }
    }
}
