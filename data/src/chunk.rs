//! The chunk: one shard of one stripe, stored as a self-describing record.
//!
//! On-disk record (little-endian), padded with zeros to the device block size:
//! ```text
//! offset size field
//!      0    4 magic          b"SHGC"
//!      4    1 format         CHUNK_FORMAT (1)
//!      5    1 kind           1 = data/parity shard
//!      6    2 reserved       0
//!      8    8 ino            inode the stripe belongs to
//!     16    8 stripe         stripe index in the file
//!     24    2 shard          shard index in the stripe (0..k data, k..k+m parity)
//!     26    6 reserved       0
//!     32    8 version        layout version of the shard (higher replaces lower)
//!     40    8 seq            store-wide write sequence number (newest record wins on scan)
//!     48    4 payload_len    bytes of payload after the header
//!     52    4 payload_crc    crc32c of the payload
//!     56    4 reserved       0
//!     60    4 header_crc     crc32c of bytes 0..60
//! ```
//! A reader checks key, version and both checksums, so a stale or corrupted location
//! is detected and never returned as data.

use bytes::{BufMut, Bytes, BytesMut};

/// Size of the record header.
pub const CHUNK_HEADER_LEN: usize = 64;
/// Record magic.
pub const CHUNK_MAGIC: [u8; 4] = *b"SHGC";
/// Record format version.
pub const CHUNK_FORMAT: u8 = 1;
const KIND_SHARD: u8 = 1;
/// Largest payload of one chunk (64 MiB).
pub const MAX_CHUNK_PAYLOAD: u32 = 64 << 20;

/// Names a chunk: shard `shard` of stripe `stripe` of inode `ino`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey {
    /// Inode number.
    pub ino: u64,
    /// Stripe index within the file.
    pub stripe: u64,
    /// Shard index within the stripe.
    pub shard: u16,
}

impl ChunkKey {
    /// Fixed 18-byte big-endian form (sorts like the tuple), used as index key.
    pub fn to_bytes(&self) -> [u8; 18] {
        let mut b = [0u8; 18];
        b[..8].copy_from_slice(&self.ino.to_be_bytes());
        b[8..16].copy_from_slice(&self.stripe.to_be_bytes());
        b[16..].copy_from_slice(&self.shard.to_be_bytes());
        b
    }

    /// Inverse of [`ChunkKey::to_bytes`].
    pub fn from_bytes(b: &[u8; 18]) -> Self {
        let mut ino = [0u8; 8];
        let mut stripe = [0u8; 8];
        ino.copy_from_slice(&b[..8]);
        stripe.copy_from_slice(&b[8..16]);
        ChunkKey {
            ino: u64::from_be_bytes(ino),
            stripe: u64::from_be_bytes(stripe),
            shard: u16::from_be_bytes([b[16], b[17]]),
        }
    }
}

impl std::fmt::Display for ChunkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "chunk {}:{}:{}", self.ino, self.stripe, self.shard)
    }
}

/// A decoded, header-verified chunk header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Which chunk.
    pub key: ChunkKey,
    /// Layout version.
    pub version: u64,
    /// Store write sequence number.
    pub seq: u64,
    /// Payload length.
    pub payload_len: u32,
    /// crc32c of the payload.
    pub payload_crc: u32,
}

/// What can be wrong with bytes that claim to be a chunk.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// Fewer bytes than a header.
    #[error("chunk record truncated: {0} bytes")]
    Truncated(usize),
    /// Not a chunk record.
    #[error("bad chunk magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// Unknown format or kind.
    #[error("unsupported chunk format {format} kind {kind}")]
    Unsupported {
        /// Format byte.
        format: u8,
        /// Kind byte.
        kind: u8,
    },
    /// Header checksum mismatch.
    #[error("chunk header checksum mismatch")]
    HeaderChecksum,
    /// Reserved bytes not zero.
    #[error("chunk header reserved bytes are not zero")]
    Reserved,
    /// Payload larger than any chunk may be.
    #[error("chunk payload of {0} bytes exceeds the limit")]
    TooLarge(u32),
    /// The record belongs to another chunk (stale location).
    #[error("location holds {found}, expected {expected}")]
    WrongKey {
        /// Expected key.
        expected: ChunkKey,
        /// Key found.
        found: ChunkKey,
    },
    /// The record has another version (stale location).
    #[error("location holds version {found} of {key}, expected {expected}")]
    WrongVersion {
        /// The chunk.
        key: ChunkKey,
        /// Expected version.
        expected: u64,
        /// Found version.
        found: u64,
    },
    /// Payload checksum mismatch: the data is corrupt.
    #[error("{key}: payload checksum mismatch (stored {expected:#010x}, computed {actual:#010x})")]
    PayloadChecksum {
        /// The chunk.
        key: ChunkKey,
        /// Checksum in the header.
        expected: u32,
        /// Checksum of the bytes read.
        actual: u32,
    },
}

impl ChunkHeader {
    /// Serialises the header.
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut h = [0u8; CHUNK_HEADER_LEN];
        h[0..4].copy_from_slice(&CHUNK_MAGIC);
        h[4] = CHUNK_FORMAT;
        h[5] = KIND_SHARD;
        h[8..16].copy_from_slice(&self.key.ino.to_le_bytes());
        h[16..24].copy_from_slice(&self.key.stripe.to_le_bytes());
        h[24..26].copy_from_slice(&self.key.shard.to_le_bytes());
        h[32..40].copy_from_slice(&self.version.to_le_bytes());
        h[40..48].copy_from_slice(&self.seq.to_le_bytes());
        h[48..52].copy_from_slice(&self.payload_len.to_le_bytes());
        h[52..56].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32c::crc32c(&h[..60]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Parses and verifies a header (not the payload).
    pub fn decode(b: &[u8]) -> Result<Self, ChunkError> {
        let b: &[u8; CHUNK_HEADER_LEN] = b
            .get(..CHUNK_HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(ChunkError::Truncated(b.len()))?;
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != CHUNK_MAGIC {
            return Err(ChunkError::BadMagic(magic));
        }
        let le32 = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let le64 = |at: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(x)
        };
        if crc32c::crc32c(&b[..60]) != le32(60) {
            return Err(ChunkError::HeaderChecksum);
        }
        if b[4] != CHUNK_FORMAT || b[5] != KIND_SHARD {
            return Err(ChunkError::Unsupported {
                format: b[4],
                kind: b[5],
            });
        }
        if b[6..8] != [0, 0] || b[26..32] != [0; 6] || b[56..60] != [0; 4] {
            return Err(ChunkError::Reserved);
        }
        let payload_len = le32(48);
        if payload_len > MAX_CHUNK_PAYLOAD {
            return Err(ChunkError::TooLarge(payload_len));
        }
        Ok(ChunkHeader {
            key: ChunkKey {
                ino: le64(8),
                stripe: le64(16),
                shard: u16::from_le_bytes([b[24], b[25]]),
            },
            version: le64(32),
            seq: le64(40),
            payload_len,
            payload_crc: le32(52),
        })
    }

    /// Length of the whole record padded to `block_size`.
    pub fn record_len(&self, block_size: u32) -> u64 {
        record_len(self.payload_len as usize, block_size)
    }

    /// Checks that the payload matches the header's checksum.
    pub fn verify_payload(&self, payload: &[u8]) -> Result<(), ChunkError> {
        let actual = crc32c::crc32c(payload);
        if payload.len() != self.payload_len as usize || actual != self.payload_crc {
            return Err(ChunkError::PayloadChecksum {
                key: self.key,
                expected: self.payload_crc,
                actual,
            });
        }
        Ok(())
    }
}

/// Length of a record with `payload_len` payload bytes padded to `block_size`.
pub fn record_len(payload_len: usize, block_size: u32) -> u64 {
    let bs = u64::from(block_size.max(1));
    (CHUNK_HEADER_LEN as u64 + payload_len as u64).div_ceil(bs) * bs
}

/// Builds a whole record (header, payload, zero padding) ready to append.
pub fn encode_record(header: &ChunkHeader, payload: &[u8], block_size: u32) -> BytesMut {
    let len = record_len(payload.len(), block_size) as usize;
    let mut out = BytesMut::with_capacity(len);
    out.put_slice(&header.encode());
    out.put_slice(payload);
    out.resize(len, 0);
    out
}

/// Parses a whole record read back from a device: header, then payload checks, key and
/// version against what the caller expects.
pub fn decode_record(
    bytes: Bytes,
    expect_key: Option<ChunkKey>,
    expect_version: Option<u64>,
) -> Result<(ChunkHeader, Bytes), ChunkError> {
    let h = ChunkHeader::decode(&bytes)?;
    if let Some(k) = expect_key {
        if h.key != k {
            return Err(ChunkError::WrongKey {
                expected: k,
                found: h.key,
            });
        }
    }
    if let Some(v) = expect_version {
        if h.version != v {
            return Err(ChunkError::WrongVersion {
                key: h.key,
                expected: v,
                found: h.version,
            });
        }
    }
    let end = CHUNK_HEADER_LEN + h.payload_len as usize;
    if bytes.len() < end {
        return Err(ChunkError::Truncated(bytes.len()));
    }
    let payload = bytes.slice(CHUNK_HEADER_LEN..end);
    h.verify_payload(&payload)?;
    Ok((h, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(payload: &[u8]) -> ChunkHeader {
        ChunkHeader {
            key: ChunkKey {
                ino: 0x0102_0304_0506_0708,
                stripe: 9,
                shard: 5,
            },
            version: 3,
            seq: 77,
            payload_len: payload.len() as u32,
            payload_crc: crc32c::crc32c(payload),
        }
    }

    #[test]
    fn record_round_trip_and_padding() {
        let payload = b"shard bytes";
        let h = hdr(payload);
        let rec = encode_record(&h, payload, 4096);
        assert_eq!(rec.len(), 4096);
        assert_eq!(&rec[..4], b"SHGC");
        assert!(rec[64 + payload.len()..].iter().all(|b| *b == 0));
        let (g, p) = decode_record(rec.freeze(), Some(h.key), Some(3)).expect("decode");
        assert_eq!(g, h);
        assert_eq!(&p[..], payload);
        assert_eq!(record_len(4096 - 64, 4096), 4096);
        assert_eq!(record_len(4096 - 63, 4096), 8192);
        assert_eq!(record_len(0, 512), 512);
    }

    #[test]
    fn key_bytes_round_trip_and_sort_order() {
        let a = ChunkKey {
            ino: 1,
            stripe: 2,
            shard: 3,
        };
        let b = ChunkKey {
            ino: 1,
            stripe: 256,
            shard: 0,
        };
        assert_eq!(ChunkKey::from_bytes(&a.to_bytes()), a);
        assert!(a.to_bytes() < b.to_bytes());
    }

    #[test]
    fn stale_and_corrupt_locations_are_detected() {
        let payload = vec![7u8; 1000];
        let h = hdr(&payload);
        let rec = encode_record(&h, &payload, 512).freeze();
        let other = ChunkKey { shard: 4, ..h.key };
        assert!(matches!(
            decode_record(rec.clone(), Some(other), None),
            Err(ChunkError::WrongKey { .. })
        ));
        assert!(matches!(
            decode_record(rec.clone(), None, Some(2)),
            Err(ChunkError::WrongVersion { .. })
        ));
        let mut bad = BytesMut::from(&rec[..]);
        bad[100] ^= 0x10;
        assert!(matches!(
            decode_record(bad.freeze(), None, None),
            Err(ChunkError::PayloadChecksum { .. })
        ));
        let mut bad = BytesMut::from(&rec[..]);
        bad[10] ^= 1;
        assert_eq!(decode_record(bad.freeze(), None, None), Err(ChunkError::HeaderChecksum));
        assert_eq!(
            decode_record(Bytes::from_static(b"SHGC"), None, None),
            Err(ChunkError::Truncated(4))
        );
        assert!(matches!(
            decode_record(Bytes::from(vec![0u8; 4096]), None, None),
            Err(ChunkError::BadMagic(_))
        ));
        assert_eq!(
            decode_record(rec.slice(..500), None, None),
            Err(ChunkError::Truncated(500))
        );
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn any_bytes_decode_or_error(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
                let _ = decode_record(Bytes::from(bytes), None, None);
            }

            #[test]
            fn every_single_bit_flip_in_a_record_is_caught(pos in 0usize..(64 + 40), bit in 0u8..8) {
                let payload = [0xabu8; 40];
                let h = ChunkHeader {
                    key: ChunkKey { ino: 1, stripe: 2, shard: 3 }, version: 4, seq: 5,
                    payload_len: 40, payload_crc: crc32c::crc32c(&payload),
                };
                let mut rec = encode_record(&h, &payload, 512);
                rec[pos] ^= 1 << bit;
                prop_assert!(decode_record(rec.freeze(), None, None).is_err());
            }
        }
    }
}
