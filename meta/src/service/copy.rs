//! Partition copies moved in pieces.
//!
//! A replica that must catch up receives its primary's copy ([`InstallPiece`]), and a
//! primary taking over pulls the best member's copy ([`PullPiece`]). The copy is the
//! postcard encoding of the partition, cut into pieces of at most [`PIECE_BYTES`], so a
//! partition larger than a transport frame (64 MiB) still moves, and the move resumes:
//! the receiver answers how much of *that* copy (named by its [`CopyId`]) it holds, and
//! the sender goes on from there. A piece of another copy starts over.
//!
//! [`Assembly::take`] is the receiving side as a pure function, checked against the
//! whole copy over thousands of seeded lossy, duplicating and reordering deliveries.
//!
//! [`InstallPiece`]: super::wire::InstallPiece
//! [`PullPiece`]: super::wire::PullPiece

use crate::ids::Epoch;
use serde::{Deserialize, Serialize};

/// Largest piece (a node sends pieces of at most half its frame limit, and of this).
pub const PIECE_BYTES: usize = 8 << 20;

/// Largest copy a node agrees to assemble (a bound on what a peer can make it buffer).
pub const MAX_COPY_BYTES: u64 = 64 << 30;

/// Default bytes a node holds over every copy it is assembling at once.
pub const STAGING_BYTES: u64 = 4 << 30;

/// Which copy: its position, its counters, its encoded size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyId {
    /// The reign that produced it.
    pub state_epoch: Epoch,
    /// Batches applied in that reign.
    pub lsn: u64,
    /// Counter high-water mark.
    pub counter_hwm: u64,
    /// Bytes of the encoded copy.
    pub total: u64,
}

impl CopyId {
    /// Whether a copy with this position can come from a member of a cluster at map
    /// epoch `epoch`: a reign not of a later epoch, a log position and a counter mark
    /// with room to go on. Anything else could only come from a peer that lies, and
    /// would leave the partition unable to take a batch, a takeover or an inode number.
    pub fn check(&self, epoch: Epoch) -> Result<(), String> {
        if self.state_epoch.0 >> super::replica::REIGN_SEQ_BITS > epoch.0 {
            return Err(format!(
                "a copy of reign {:#x}, after map epoch {}",
                self.state_epoch.0, epoch.0
            ));
        }
        if self.lsn >= u64::MAX / 2 {
            return Err(format!("a copy at lsn {}", self.lsn));
        }
        if self.counter_hwm > 1 << crate::ids::Ino::COUNTER_BITS {
            return Err(format!("a copy with counter mark {}", self.counter_hwm));
        }
        Ok(())
    }
}

/// What a piece left the receiver with.
#[derive(Debug, PartialEq, Eq)]
pub enum Took {
    /// Holds this many bytes of the copy: the sender continues from here.
    Need(u64),
    /// The whole copy.
    Done(Vec<u8>),
}

/// A piece that cannot belong to any copy.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PieceError {
    /// The copy is larger than [`MAX_COPY_BYTES`].
    #[error("a copy of {0} bytes is larger than this node accepts")]
    TooLarge(u64),
    /// The piece runs past the copy's end, or is larger than [`PIECE_BYTES`].
    #[error("piece at {offset} of {len} bytes does not fit a copy of {total}")]
    OutOfRange {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// The copy's size.
        total: u64,
    },
    /// Taking the piece would make the node hold more copy bytes than its budget.
    #[error("no room: {held} bytes of copies held, budget {budget}")]
    NoRoom {
        /// Bytes held over all copies being assembled.
        held: u64,
        /// The node's budget.
        budget: u64,
    },
}

/// A copy being received.
#[derive(Debug, Default)]
pub struct Assembly {
    current: Option<(CopyId, Vec<u8>)>,
}

impl Assembly {
    /// Takes the piece of copy `id` at `offset`. A piece that continues the copy being
    /// assembled is appended; one of a copy already past it, or a gap, only reports
    /// what is held; the first piece of another copy replaces it.
    pub fn take(&mut self, id: CopyId, offset: u64, data: &[u8]) -> Result<Took, PieceError> {
        if id.total > MAX_COPY_BYTES {
            return Err(PieceError::TooLarge(id.total));
        }
        let len = data.len() as u64;
        if data.len() > PIECE_BYTES || offset.checked_add(len).is_none_or(|end| end > id.total) {
            return Err(PieceError::OutOfRange {
                offset,
                len,
                total: id.total,
            });
        }
        match &mut self.current {
            Some((cur, buf)) if *cur == id => {
                if offset != buf.len() as u64 {
                    return Ok(Took::Need(buf.len() as u64));
                }
                buf.extend_from_slice(data);
            }
            _ if offset == 0 => {
                let mut buf = Vec::with_capacity(data.len());
                buf.extend_from_slice(data);
                self.current = Some((id, buf));
            }
            // A later piece of another copy: nothing of it is held (what is being
            // assembled stays, in case that piece was a stray).
            _ => return Ok(Took::Need(0)),
        }
        match self.current.take() {
            Some((_, buf)) if buf.len() as u64 == id.total => Ok(Took::Done(buf)),
            Some((cur, buf)) => {
                let held = buf.len() as u64;
                self.current = Some((cur, buf));
                Ok(Took::Need(held))
            }
            None => Ok(Took::Need(0)),
        }
    }

    /// Bytes held of whatever copy is being assembled.
    pub fn len(&self) -> u64 {
        self.current.as_ref().map_or(0, |(_, b)| b.len() as u64)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held of copy `id`.
    pub fn held(&self, id: &CopyId) -> u64 {
        match &self.current {
            Some((cur, buf)) if cur == id => buf.len() as u64,
            _ => 0,
        }
    }
}

/// The copies a node is assembling, one per partition, within a byte budget: a piece
/// that would take the node past it is refused ([`PieceError::NoRoom`]; the sender tries
/// again later), and an assembly no piece has reached for [`STALE_NS`] is dropped first
/// (its sender gave up or died).
#[derive(Debug)]
pub struct Staging {
    budget: u64,
    parts: std::collections::BTreeMap<u32, (Assembly, u64)>,
}

/// An assembly untouched this long (nanoseconds) no longer counts against the budget.
pub const STALE_NS: u64 = 60_000_000_000;

impl Staging {
    /// Nothing held, at most `budget` bytes.
    pub fn new(budget: u64) -> Staging {
        Staging {
            budget,
            parts: Default::default(),
        }
    }

    /// Bytes held over every assembly.
    pub fn held(&self) -> u64 {
        self.parts.values().map(|(a, _)| a.len()).sum()
    }

    /// Takes a piece of copy `id` of partition `p` at time `now_ns` (see
    /// [`Assembly::take`]); a finished copy leaves the staging.
    pub fn take(&mut self, p: u32, id: CopyId, offset: u64, data: &[u8], now_ns: u64) -> Result<Took, PieceError> {
        self.parts
            .retain(|q, (_, touched)| *q == p || now_ns.saturating_sub(*touched) < STALE_NS);
        let (asm, _) = self.parts.entry(p).or_default();
        // What this partition would hold after the piece, if it is taken.
        let after = if asm.current.as_ref().is_some_and(|(cur, _)| *cur == id) {
            asm.len() + data.len() as u64
        } else {
            data.len() as u64
        };
        let others = self.held() - self.parts.get(&p).map_or(0, |(a, _)| a.len());
        if others + after > self.budget {
            return Err(PieceError::NoRoom {
                held: others + self.parts.get(&p).map_or(0, |(a, _)| a.len()),
                budget: self.budget,
            });
        }
        let entry = self.parts.entry(p).or_default();
        entry.1 = now_ns;
        let took = entry.0.take(id, offset, data);
        if matches!(took, Ok(Took::Done(_))) {
            self.parts.remove(&p);
        }
        took
    }
}

/// The piece of `bytes` (an encoded copy) at `offset`: at most `size` bytes (and at
/// most [`PIECE_BYTES`]).
pub fn piece(bytes: &[u8], offset: u64, size: usize) -> &[u8] {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
    let end = start.saturating_add(size.min(PIECE_BYTES)).min(bytes.len());
    &bytes[start..end]
}

/// How many round trips a move of `total` bytes in pieces of `size` may take before
/// the mover gives up: every piece twice, and a few restarts.
pub fn max_rounds(total: u64, size: usize) -> u64 {
    2 * total.div_ceil(size.clamp(1, PIECE_BYTES) as u64) + 8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies of several partitions share one budget: a piece past it is refused (and
    /// nothing of it held), a finished copy frees its share, and an assembly no piece
    /// reached for a minute stops counting.
    #[test]
    fn staging_stays_within_its_budget() {
        let mut s = Staging::new(100);
        let (a, b) = (id(1, 1, 70), id(1, 2, 50));
        assert_eq!(s.take(1, a, 0, &[1; 40], 0), Ok(Took::Need(40)));
        assert_eq!(s.take(2, b, 0, &[2; 40], 1), Ok(Took::Need(40)));
        assert_eq!(s.held(), 80);
        assert!(matches!(
            s.take(1, a, 40, &[1; 30], 2),
            Err(PieceError::NoRoom { held: 80, budget: 100 })
        ));
        assert_eq!(s.held(), 80, "a refused piece is not held");
        assert!(matches!(
            s.take(3, id(1, 3, 30), 0, &[3; 30], 3),
            Err(PieceError::NoRoom { .. })
        ));
        // Partition 2 finishes: its share is free, and partition 1 goes on.
        assert_eq!(s.take(2, b, 40, &[2; 10], 4), Ok(Took::Done(vec![2; 50])));
        assert_eq!(s.held(), 40);
        assert_eq!(s.take(1, a, 40, &[1; 30], 5), Ok(Took::Done(vec![1; 70])));
        assert_eq!(s.held(), 0);
        // An abandoned assembly is dropped once it is stale.
        assert_eq!(s.take(4, id(1, 4, 100), 0, &[4; 90], 10), Ok(Took::Need(90)));
        assert!(matches!(
            s.take(5, id(1, 5, 20), 0, &[5; 20], 11),
            Err(PieceError::NoRoom { .. })
        ));
        assert_eq!(
            s.take(5, id(1, 5, 20), 0, &[5; 20], 11 + STALE_NS),
            Ok(Took::Done(vec![5; 20]))
        );
        assert_eq!(s.held(), 0, "the stale assembly of partition 4 went");
        // A new copy of the same partition replaces the old one within the budget.
        assert_eq!(s.take(6, id(1, 6, 100), 0, &[6; 90], 20), Ok(Took::Need(90)));
        assert_eq!(s.take(6, id(1, 7, 100), 0, &[7; 50], 21), Ok(Took::Need(50)));
        assert_eq!(s.held(), 50);
    }

    #[test]
    fn impossible_positions_are_refused() {
        let ok = CopyId {
            state_epoch: Epoch(5 << super::super::replica::REIGN_SEQ_BITS | 3),
            lsn: 40,
            counter_hwm: 2048,
            total: 10,
        };
        assert_eq!(ok.check(Epoch(5)), Ok(()));
        assert!(ok.check(Epoch(4)).is_err(), "a reign of a later epoch");
        assert!(CopyId { lsn: u64::MAX, ..ok }.check(Epoch(5)).is_err());
        assert!(
            CopyId {
                counter_hwm: u64::MAX,
                ..ok
            }
            .check(Epoch(5))
            .is_err()
        );
    }

    fn id(state: u64, lsn: u64, total: u64) -> CopyId {
        CopyId {
            state_epoch: Epoch(state),
            lsn,
            counter_hwm: 9,
            total,
        }
    }

    #[test]
    fn pieces_in_order_make_the_copy() {
        let bytes: Vec<u8> = (0..(2 * PIECE_BYTES + 5)).map(|i| (i % 251) as u8).collect();
        let c = id(1, 2, bytes.len() as u64);
        let mut a = Assembly::default();
        let mut off = 0;
        loop {
            match a.take(c, off, piece(&bytes, off, PIECE_BYTES)).expect("piece") {
                Took::Need(n) => off = n,
                Took::Done(b) => {
                    assert_eq!(b, bytes);
                    break;
                }
            }
        }
    }

    #[test]
    fn bad_pieces_are_refused() {
        let mut a = Assembly::default();
        assert_eq!(
            a.take(id(1, 1, MAX_COPY_BYTES + 1), 0, b"x"),
            Err(PieceError::TooLarge(MAX_COPY_BYTES + 1))
        );
        assert!(a.take(id(1, 1, 4), 3, b"xy").is_err());
        assert!(a.take(id(1, 1, 4), u64::MAX, b"xy").is_err());
        // A gap is not an error: the sender is told where to go on.
        assert_eq!(a.take(id(1, 1, 4), 2, b"xy"), Ok(Took::Need(0)));
        assert_eq!(a.take(id(1, 1, 4), 0, b"ab"), Ok(Took::Need(2)));
        assert_eq!(a.take(id(1, 1, 4), 0, b"ab"), Ok(Took::Need(2)));
        assert_eq!(a.held(&id(1, 1, 4)), 2);
        // Another copy's first piece replaces it.
        assert_eq!(a.take(id(1, 2, 3), 0, b"abc"), Ok(Took::Done(b"abc".to_vec())));
        assert_eq!(a.held(&id(1, 1, 4)), 0);
    }

    /// The protocol over a channel that drops, repeats and reorders: the sender sends
    /// the piece at the offset the receiver last reported (or a stale earlier one, or a
    /// piece of an older copy), and must end with exactly the newest copy.
    #[test]
    fn a_lossy_channel_still_delivers_the_copy_exactly() {
        const PIECE: usize = 7; // scaled down: the logic does not depend on the size
        for seed in 1..=3000u64 {
            let mut rng = shingle_testkit::Rng::seeded(seed);
            let mut rnd = move |n: u64| rng.below(n);
            let len = rnd(60) as usize;
            let old: Vec<u8> = (0..rnd(40)).map(|i| i as u8 ^ 0x5a).collect();
            let new: Vec<u8> = (0..len).map(|i| (i as u64 ^ seed) as u8).collect();
            let (old_id, new_id) = (id(1, 3, old.len() as u64), id(1, 4, new.len() as u64));
            let mut a = Assembly::default();
            let mut reported = 0u64;
            let mut sent: Vec<u64> = Vec::new();
            let mut done = None;
            for _ in 0..10_000 {
                // Which piece arrives.
                let (c, bytes, off) = match rnd(10) {
                    0 if !old.is_empty() => (old_id, &old, rnd(old.len() as u64)),
                    1 if !sent.is_empty() => (new_id, &new, sent[rnd(sent.len() as u64) as usize]),
                    _ => (new_id, &new, reported),
                };
                sent.push(off);
                let start = (off as usize).min(bytes.len());
                let data = &bytes[start..(start + PIECE).min(bytes.len())];
                let took = a.take(c, start as u64, data).expect("pieces in range");
                if rnd(5) == 0 {
                    continue; // the reply is lost: the sender repeats
                }
                match took {
                    Took::Need(n) if c == new_id => reported = n,
                    Took::Need(_) => {}
                    Took::Done(b) if c == new_id => {
                        done = Some(b);
                        break;
                    }
                    Took::Done(b) => assert_eq!(b, old, "seed {seed}: an old copy is whole or nothing"),
                }
            }
            assert_eq!(done.as_deref(), Some(&new[..]), "seed {seed}");
        }
    }
}
