//! Messages cut into fragments that fit one RDMA SEND, and put back together.
//!
//! RPC over an RDMA queue pair (`transport::rdma`, feature `rdma`) sends each frame — the
//! same 56-byte header and payload as over TCP ([`crate::frame`]) — as a sequence of
//! SENDs into the peer's posted receive buffers. Each SEND carries a 16-byte fragment
//! header:
//!
//! ```text
//! 0      1      2       4                 12            16
//! | 0xF7 | flags | 0u16 | message id u64 | total u32 | data ...
//! flags: FIRST 0x1, LAST 0x2 (a one-fragment message has both), NOOP 0x4 (a probe; no
//! data), CLOSE 0x8 (the sender closes the queue pair; no data)
//! ```
//!
//! An RC queue pair delivers SENDs in order and one task posts all fragments of a
//! message in order, so a message's fragments arrive in order, possibly interleaved with
//! other messages' fragments. The [`Reassembler`] is pure and total: any bytes give a
//! piece or a [`FragmentError`] (the connection is then dropped), with bounded memory.

use bytes::{BufMut, Bytes, BytesMut};
use std::collections::HashMap;

/// Bytes of the fragment header.
pub const FRAGMENT_HEADER: usize = 16;

const MAGIC: u8 = 0xF7;
const FIRST: u8 = 0x1;
const LAST: u8 = 0x2;
const NOOP: u8 = 0x4;
const CLOSE: u8 = 0x8;

/// Why a fragment was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FragmentError {
    /// Shorter than the header.
    #[error("fragment of {0} bytes is shorter than its header")]
    Short(usize),
    /// Not a fragment.
    #[error("bad fragment magic {0:#04x}")]
    Magic(u8),
    /// Unknown flag bits, or a no-op with data.
    #[error("bad fragment flags {0:#04x}")]
    Flags(u8),
    /// The message is larger than allowed.
    #[error("message of {total} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Announced size.
        total: u32,
        /// Limit.
        max: usize,
    },
    /// A first fragment for a message already in progress.
    #[error("message {0} started twice")]
    Restarted(u64),
    /// A middle or last fragment of a message never started.
    #[error("fragment of unknown message {0}")]
    Unknown(u64),
    /// More data than announced, a last fragment short of it, or another total.
    #[error("message {id}: fragments do not add up to {total} bytes")]
    Length {
        /// Message.
        id: u64,
        /// Announced size.
        total: u32,
    },
    /// Too many messages in progress at once.
    #[error("more than {0} messages in progress")]
    TooMany(usize),
}

/// What one fragment completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// A probe: nothing to deliver.
    Noop,
    /// The peer is closing the queue pair: calls waiting on it fail now.
    Close,
    /// Part of a message; more fragments follow.
    Partial,
    /// A whole message.
    Complete(u64, Bytes),
}

/// Puts messages back together from their fragments.
#[derive(Debug)]
pub struct Reassembler {
    partial: HashMap<u64, (u32, BytesMut)>,
    max_message: usize,
    max_partial: usize,
}

impl Reassembler {
    /// Messages up to `max_message` bytes, at most `max_partial` in progress.
    pub fn new(max_message: usize, max_partial: usize) -> Self {
        Reassembler {
            partial: HashMap::new(),
            max_message,
            max_partial,
        }
    }

    /// Messages in progress.
    pub fn in_progress(&self) -> usize {
        self.partial.len()
    }

    /// Takes one received fragment.
    pub fn push(&mut self, frag: &[u8]) -> Result<Piece, FragmentError> {
        let h: &[u8; FRAGMENT_HEADER] = frag
            .get(..FRAGMENT_HEADER)
            .and_then(|h| h.try_into().ok())
            .ok_or(FragmentError::Short(frag.len()))?;
        if h[0] != MAGIC {
            return Err(FragmentError::Magic(h[0]));
        }
        let flags = h[1];
        if flags & !(FIRST | LAST | NOOP | CLOSE) != 0 || h[2] != 0 || h[3] != 0 {
            return Err(FragmentError::Flags(flags));
        }
        let id = u64::from_le_bytes([h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11]]);
        let total = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
        let data = &frag[FRAGMENT_HEADER..];
        if flags & (NOOP | CLOSE) != 0 {
            if (flags != NOOP && flags != CLOSE) || !data.is_empty() || total != 0 {
                return Err(FragmentError::Flags(flags));
            }
            return Ok(if flags == NOOP { Piece::Noop } else { Piece::Close });
        }
        if total as usize > self.max_message {
            return Err(FragmentError::TooLarge {
                total,
                max: self.max_message,
            });
        }
        let length = FragmentError::Length { id, total };
        if flags & FIRST != 0 {
            if self.partial.contains_key(&id) {
                return Err(FragmentError::Restarted(id));
            }
            if data.len() > total as usize {
                return Err(length);
            }
            if flags & LAST != 0 {
                return if data.len() == total as usize {
                    Ok(Piece::Complete(id, Bytes::copy_from_slice(data)))
                } else {
                    Err(length)
                };
            }
            if self.partial.len() >= self.max_partial {
                return Err(FragmentError::TooMany(self.max_partial));
            }
            let mut buf = BytesMut::with_capacity(total as usize);
            buf.put_slice(data);
            self.partial.insert(id, (total, buf));
            return Ok(Piece::Partial);
        }
        let Some((want, buf)) = self.partial.get_mut(&id) else {
            return Err(FragmentError::Unknown(id));
        };
        if *want != total || buf.len() + data.len() > total as usize {
            self.partial.remove(&id);
            return Err(length);
        }
        buf.put_slice(data);
        if flags & LAST == 0 {
            return Ok(Piece::Partial);
        }
        let Some((_, buf)) = self.partial.remove(&id) else {
            return Err(FragmentError::Unknown(id));
        };
        if buf.len() != total as usize {
            return Err(length);
        }
        Ok(Piece::Complete(id, buf.freeze()))
    }
}

/// The fragment header for a piece of message `id` (`total` bytes).
pub fn header(id: u64, total: u32, first: bool, last: bool) -> [u8; FRAGMENT_HEADER] {
    let mut h = [0u8; FRAGMENT_HEADER];
    h[0] = MAGIC;
    h[1] = if first { FIRST } else { 0 } | if last { LAST } else { 0 };
    h[4..12].copy_from_slice(&id.to_le_bytes());
    h[12..16].copy_from_slice(&total.to_le_bytes());
    h
}

/// The header of a probe.
pub fn noop() -> [u8; FRAGMENT_HEADER] {
    let mut h = [0u8; FRAGMENT_HEADER];
    h[0] = MAGIC;
    h[1] = NOOP;
    h
}

/// The header of a close notice.
pub fn close() -> [u8; FRAGMENT_HEADER] {
    let mut h = [0u8; FRAGMENT_HEADER];
    h[0] = MAGIC;
    h[1] = CLOSE;
    h
}

/// Cuts `message` into fragments whose data is at most `data_max` bytes: (header, data).
pub fn split(id: u64, message: &[u8], data_max: usize) -> impl Iterator<Item = ([u8; FRAGMENT_HEADER], &[u8])> {
    let total = message.len() as u32;
    let data_max = data_max.max(1);
    let n = message.len().div_ceil(data_max).max(1);
    (0..n).map(move |i| {
        let start = i * data_max;
        let end = (start + data_max).min(message.len());
        (header(id, total, i == 0, i + 1 == n), &message[start..end])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frag(h: [u8; FRAGMENT_HEADER], data: &[u8]) -> Vec<u8> {
        let mut v = h.to_vec();
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn one_fragment_and_empty_messages() {
        let mut r = Reassembler::new(1 << 20, 4);
        let msgs: Vec<_> = split(7, b"hello", 100).collect();
        assert_eq!(msgs.len(), 1);
        assert_eq!(
            r.push(&frag(msgs[0].0, msgs[0].1)),
            Ok(Piece::Complete(7, Bytes::from_static(b"hello")))
        );
        let empty: Vec<_> = split(8, b"", 100).collect();
        assert_eq!(
            r.push(&frag(empty[0].0, empty[0].1)),
            Ok(Piece::Complete(8, Bytes::new()))
        );
        assert_eq!(r.push(&noop()), Ok(Piece::Noop));
        assert_eq!(r.push(&close()), Ok(Piece::Close));
    }

    #[test]
    fn bad_fragments_are_refused() {
        let mut r = Reassembler::new(100, 1);
        assert_eq!(r.push(&[MAGIC; 3]), Err(FragmentError::Short(3)));
        let mut h = header(1, 10, true, false);
        h[0] = 0;
        assert_eq!(r.push(&h), Err(FragmentError::Magic(0)));
        let mut h = header(1, 10, true, false);
        h[1] |= 0x40;
        assert!(matches!(r.push(&h), Err(FragmentError::Flags(_))));
        assert!(matches!(r.push(&frag(noop(), b"x")), Err(FragmentError::Flags(_))));
        assert!(matches!(
            r.push(&header(1, 101, true, true)),
            Err(FragmentError::TooLarge { .. })
        ));
        assert_eq!(
            r.push(&frag(header(1, 10, false, true), b"x")),
            Err(FragmentError::Unknown(1))
        );
        assert_eq!(r.push(&frag(header(1, 10, true, false), b"abc")), Ok(Piece::Partial));
        assert_eq!(
            r.push(&frag(header(1, 10, true, false), b"abc")),
            Err(FragmentError::Restarted(1))
        );
        assert_eq!(
            r.push(&frag(header(2, 10, true, false), b"abc")),
            Err(FragmentError::TooMany(1))
        );
        // Past the announced total, or a last fragment short of it.
        assert!(matches!(
            r.push(&frag(header(1, 10, false, false), b"12345678")),
            Err(FragmentError::Length { .. })
        ));
        assert_eq!(r.in_progress(), 0);
        assert_eq!(r.push(&frag(header(3, 10, true, false), b"abc")), Ok(Piece::Partial));
        assert!(matches!(
            r.push(&frag(header(3, 10, false, true), b"de")),
            Err(FragmentError::Length { .. })
        ));
        assert!(matches!(
            r.push(&frag(header(4, 2, true, true), b"abc")),
            Err(FragmentError::Length { .. })
        ));
    }

    proptest! {
        /// Interleaved messages come back whole, whatever the fragment size.
        #[test]
        fn interleaved_messages_reassemble(
            msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..600), 1..6),
            data_max in 1usize..200,
            seed in any::<u64>(),
        ) {
            let mut queues: Vec<Vec<Vec<u8>>> = msgs
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let mut v: Vec<Vec<u8>> = split(i as u64, m, data_max).map(|(h, d)| frag(h, d)).collect();
                    v.reverse();
                    v
                })
                .collect();
            let mut r = Reassembler::new(1 << 20, 8);
            let mut got = vec![None; msgs.len()];
            let mut rng = shingle_testkit::Rng::seeded(seed);
            while queues.iter().any(|q| !q.is_empty()) {
                let live: Vec<usize> = (0..queues.len()).filter(|i| !queues[*i].is_empty()).collect();
                let i = *rng.pick(&live);
                let f = queues[i].pop().expect("fragment");
                match r.push(&f).expect("valid fragment") {
                    Piece::Complete(id, b) => got[id as usize] = Some(b.to_vec()),
                    Piece::Partial => {}
                    Piece::Noop | Piece::Close => prop_assert!(false, "no probes sent"),
                }
            }
            for (i, m) in msgs.iter().enumerate() {
                prop_assert_eq!(got[i].as_ref(), Some(m));
            }
            prop_assert_eq!(r.in_progress(), 0);
        }

        /// Any bytes: a piece or an error, never a panic, memory bounded by the limits.
        #[test]
        fn arbitrary_bytes_never_panic(frags in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..20)) {
            let mut r = Reassembler::new(256, 4);
            for f in &frags {
                let _ = r.push(f);
                prop_assert!(r.in_progress() <= 4);
            }
        }
    }
}
