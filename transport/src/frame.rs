//! The frame: the only unit that crosses a Shingle connection after the handshake.
//!
//! Byte layout (all integers little-endian, 56-byte header, then the payload):
//!
//! ```text
//! offset size field
//!      0    4 magic          b"SHGF"
//!      4    1 version        FRAME_VERSION (1)
//!      5    1 flags          bit0 RESPONSE, bit1 ERROR, bit2 RAW_PAYLOAD; others zero
//!      6    2 kind           message type (MsgKind)
//!      8    8 request_id     chosen by the requester, echoed in the response
//!     16    4 payload_len    bytes of payload after the header (<= max_payload)
//!     20    4 timeout_ms     requester's remaining deadline, 0 = none
//!     24   16 trace_id       W3C trace-id (all zero = no trace context)
//!     40    8 span_id        W3C parent-id of the sender's span
//!     48    1 trace_flags    W3C trace-flags (bit0 sampled)
//!     49    3 reserved       must be zero
//!     52    4 crc32c         over header bytes 0..52, then the payload unless RAW_PAYLOAD
//! ```
//!
//! RAW_PAYLOAD marks bulk data whose integrity is checked end to end by its owner
//! (remote-read replies carry chunk bytes that hold their own crc32c, verified by the
//! reader after the transfer, exactly as with one-sided RDMA READ). Checksumming them
//! again in the transport costs a fifth of the CPU of a bulk transfer and protects
//! nothing the end-to-end check does not; the header is always covered.
//!
//! Decoding is pure: [`FrameHeader::decode`] checks everything that can be checked
//! from the header alone (magic, version, flags, reserved bytes, the length bound),
//! and [`FrameHeader::verify_payload`] checks the checksum once the payload is in.
//! [`decode_frame`] does both over one buffer; it is what the fuzzer drives.

use bytes::{BufMut, Bytes, BytesMut};

/// Size of the fixed frame header.
pub const HEADER_LEN: usize = 56;
/// The four bytes every frame starts with.
pub const FRAME_MAGIC: [u8; 4] = *b"SHGF";
/// The frame format version this build speaks.
pub const FRAME_VERSION: u8 = 1;
/// Hard upper bound on any configured payload limit (1 GiB): the wire field is u32 and
/// no single message of ours needs more.
pub const PAYLOAD_LEN_CEILING: u32 = 1 << 30;

const CRC_OFFSET: usize = 52;

/// Message type carried in a frame. Values below 0x0100 belong to the transport itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgKind(pub u16);

impl MsgKind {
    /// Liveness probe answered by the transport; payload echoed back.
    pub const PING: MsgKind = MsgKind(1);
    /// The remote-read verb over TCP: a `RemoteReadRequest`, answered with raw bytes.
    pub const REMOTE_READ: MsgKind = MsgKind(2);
    /// First kind available to services built on the transport.
    pub const FIRST_SERVICE: u16 = 0x0100;
}

impl std::fmt::Display for MsgKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

/// Frame flags. Only the bits defined here may be set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Flags(u8);

impl Flags {
    /// The frame answers the request with the same id.
    pub const RESPONSE: Flags = Flags(0b01);
    /// The payload is an encoded `Status` instead of the normal reply.
    pub const ERROR: Flags = Flags(0b10);
    /// The checksum covers the header only; the payload is verified end to end by
    /// its owner (see the module documentation).
    pub const RAW_PAYLOAD: Flags = Flags(0b100);
    const KNOWN: u8 = 0b111;

    /// No flags: a request.
    pub const fn request() -> Flags {
        Flags(0)
    }
    /// True when every bit of `other` is set here.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    /// The union of both flag sets.
    pub const fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
    /// Raw bits as they go on the wire.
    pub const fn bits(self) -> u8 {
        self.0
    }
}

/// W3C trace context carried by every frame (`traceparent` in binary form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TraceContext {
    /// 16-byte trace id; all zero means "no trace context".
    pub trace_id: [u8; 16],
    /// 8-byte id of the sender's span, the parent of the receiver's span.
    pub span_id: [u8; 8],
    /// W3C trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceContext {
    /// True when the context names a trace (non-zero trace and span ids).
    pub fn is_valid(&self) -> bool {
        self.trace_id != [0; 16] && self.span_id != [0; 8]
    }
}

/// A decoded, validated frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Request, response, error bits.
    pub flags: Flags,
    /// Message type.
    pub kind: MsgKind,
    /// Correlates a response with its request on one connection.
    pub request_id: u64,
    /// Payload length in bytes, already checked against the configured bound.
    pub payload_len: u32,
    /// The requester's remaining deadline in milliseconds; 0 means none.
    pub timeout_ms: u32,
    /// Trace context of the sender's span.
    pub trace: TraceContext,
    /// Checksum over header bytes 0..52 and the payload.
    pub crc32c: u32,
}

/// Everything that can be wrong with bytes that claim to be a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// More bytes are needed; not an error on a stream, an error for a datagram.
    #[error("incomplete frame: need {needed} more bytes")]
    Incomplete {
        /// How many more bytes would complete the frame.
        needed: usize,
    },
    /// The first four bytes are not `SHGF`.
    #[error("bad frame magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// A version this build does not speak.
    #[error("unsupported frame version {0}")]
    UnsupportedVersion(u8),
    /// Flag bits that no version defines.
    #[error("unknown frame flags {0:#04x}")]
    UnknownFlags(u8),
    /// Reserved bytes are not zero.
    #[error("reserved header bytes are not zero")]
    ReservedNotZero,
    /// Payload longer than this endpoint accepts.
    #[error("payload of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Length announced by the header.
        len: u32,
        /// The configured bound.
        max: u32,
    },
    /// Checksum mismatch: header or payload damaged.
    #[error("frame checksum mismatch: header says {expected:#010x}, computed {actual:#010x}")]
    BadChecksum {
        /// Value from the header.
        expected: u32,
        /// Value computed over the received bytes.
        actual: u32,
    },
}

impl FrameHeader {
    /// A request header with no deadline and no trace context.
    pub fn request(kind: MsgKind, request_id: u64) -> Self {
        FrameHeader {
            flags: Flags::request(),
            kind,
            request_id,
            payload_len: 0,
            timeout_ms: 0,
            trace: TraceContext::default(),
            crc32c: 0,
        }
    }

    /// The header of a response to `self` (same kind and id).
    pub fn response(&self, error: bool) -> Self {
        let mut flags = Flags::RESPONSE;
        if error {
            flags = flags.with(Flags::ERROR);
        }
        FrameHeader {
            flags,
            kind: self.kind,
            request_id: self.request_id,
            payload_len: 0,
            timeout_ms: 0,
            trace: self.trace,
            crc32c: 0,
        }
    }

    /// Serialises the header for `payload`, filling in length and checksum.
    ///
    /// Fails only if the payload is longer than [`PAYLOAD_LEN_CEILING`].
    pub fn encode(&self, payload: &[u8]) -> Result<[u8; HEADER_LEN], FrameError> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|l| *l <= PAYLOAD_LEN_CEILING)
            .ok_or(FrameError::TooLarge {
                len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
                max: PAYLOAD_LEN_CEILING,
            })?;
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&FRAME_MAGIC);
        h[4] = FRAME_VERSION;
        h[5] = self.flags.bits();
        h[6..8].copy_from_slice(&self.kind.0.to_le_bytes());
        h[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        h[16..20].copy_from_slice(&len.to_le_bytes());
        h[20..24].copy_from_slice(&self.timeout_ms.to_le_bytes());
        h[24..40].copy_from_slice(&self.trace.trace_id);
        h[40..48].copy_from_slice(&self.trace.span_id);
        h[48] = self.trace.flags;
        let mut crc = crc32c::crc32c(&h[..CRC_OFFSET]);
        if !self.flags.contains(Flags::RAW_PAYLOAD) {
            crc = crc32c::crc32c_append(crc, payload);
        }
        h[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        Ok(h)
    }

    /// Parses and validates a header. `max_payload` is this endpoint's bound.
    pub fn decode(bytes: &[u8; HEADER_LEN], max_payload: u32) -> Result<Self, FrameError> {
        let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if magic != FRAME_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if bytes[4] != FRAME_VERSION {
            return Err(FrameError::UnsupportedVersion(bytes[4]));
        }
        let flags = bytes[5];
        if flags & !Flags::KNOWN != 0 {
            return Err(FrameError::UnknownFlags(flags));
        }
        if bytes[49..52] != [0, 0, 0] {
            return Err(FrameError::ReservedNotZero);
        }
        let le32 = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let payload_len = le32(16);
        let max = max_payload.min(PAYLOAD_LEN_CEILING);
        if payload_len > max {
            return Err(FrameError::TooLarge { len: payload_len, max });
        }
        let mut trace = TraceContext::default();
        trace.trace_id.copy_from_slice(&bytes[24..40]);
        trace.span_id.copy_from_slice(&bytes[40..48]);
        trace.flags = bytes[48];
        let mut id = [0u8; 8];
        id.copy_from_slice(&bytes[8..16]);
        Ok(FrameHeader {
            flags: Flags(flags),
            kind: MsgKind(u16::from_le_bytes([bytes[6], bytes[7]])),
            request_id: u64::from_le_bytes(id),
            payload_len,
            timeout_ms: le32(20),
            trace,
            crc32c: le32(CRC_OFFSET),
        })
    }

    /// Starts the checksum over the header; continue with [`crc32c::crc32c_append`]
    /// over the payload (possibly in pieces) and finish with [`FrameHeader::check_crc`].
    pub fn crc_seed(bytes: &[u8; HEADER_LEN]) -> u32 {
        crc32c::crc32c(&bytes[..CRC_OFFSET])
    }

    /// Compares a finished running checksum with the header's.
    pub fn check_crc(&self, actual: u32) -> Result<(), FrameError> {
        if actual == self.crc32c {
            Ok(())
        } else {
            Err(FrameError::BadChecksum {
                expected: self.crc32c,
                actual,
            })
        }
    }

    /// Verifies the checksum of a complete payload against the raw header bytes.
    pub fn verify_payload(&self, raw_header: &[u8; HEADER_LEN], payload: &[u8]) -> Result<(), FrameError> {
        let seed = Self::crc_seed(raw_header);
        if self.payload_checksummed() {
            self.check_crc(crc32c::crc32c_append(seed, payload))
        } else {
            self.check_crc(seed)
        }
    }

    /// False when the payload is not covered by the frame checksum (RAW_PAYLOAD).
    pub fn payload_checksummed(&self) -> bool {
        !self.flags.contains(Flags::RAW_PAYLOAD)
    }

    /// True for responses.
    pub fn is_response(&self) -> bool {
        self.flags.contains(Flags::RESPONSE)
    }

    /// True for error responses.
    pub fn is_error(&self) -> bool {
        self.flags.contains(Flags::ERROR)
    }
}

/// A whole frame: header and payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The validated header.
    pub header: FrameHeader,
    /// The payload, checksum verified.
    pub payload: Bytes,
}

impl Frame {
    /// Serialises the frame into one buffer (header then payload).
    pub fn encode(&self) -> Result<BytesMut, FrameError> {
        let h = self.header.encode(&self.payload)?;
        let mut out = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        out.put_slice(&h);
        out.put_slice(&self.payload);
        Ok(out)
    }
}

/// Decodes one frame from the front of `buf`, returning it and the bytes consumed.
///
/// Pure and total: any input gives a frame or a [`FrameError`], never a panic.
pub fn decode_frame(buf: &[u8], max_payload: u32) -> Result<(Frame, usize), FrameError> {
    let Some(raw) = buf.get(..HEADER_LEN) else {
        return Err(FrameError::Incomplete {
            needed: HEADER_LEN - buf.len(),
        });
    };
    let raw: &[u8; HEADER_LEN] = raw
        .try_into()
        .map_err(|_| FrameError::Incomplete { needed: HEADER_LEN })?;
    let header = FrameHeader::decode(raw, max_payload)?;
    let total = HEADER_LEN + header.payload_len as usize;
    let Some(payload) = buf.get(HEADER_LEN..total) else {
        return Err(FrameError::Incomplete {
            needed: total - buf.len(),
        });
    };
    header.verify_payload(raw, payload)?;
    Ok((
        Frame {
            header,
            payload: Bytes::copy_from_slice(payload),
        },
        total,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Frame {
        let mut header = FrameHeader::request(MsgKind(0x0123), 0x0102_0304_0506_0708);
        header.timeout_ms = 250;
        header.trace = TraceContext {
            trace_id: [7; 16],
            span_id: [9; 8],
            flags: 1,
        };
        Frame {
            header,
            payload: Bytes::from_static(b"hello"),
        }
    }

    #[test]
    fn known_bytes() {
        let bytes = sample().encode().expect("encode");
        assert_eq!(&bytes[0..4], b"SHGF");
        assert_eq!(bytes[4], 1);
        assert_eq!(bytes[5], 0);
        assert_eq!(&bytes[6..8], &[0x23, 0x01]);
        assert_eq!(&bytes[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&bytes[16..20], &[5, 0, 0, 0]);
        assert_eq!(&bytes[20..24], &[250, 0, 0, 0]);
        assert_eq!(&bytes[24..40], &[7; 16]);
        assert_eq!(&bytes[40..48], &[9; 8]);
        assert_eq!(bytes[48], 1);
        assert_eq!(&bytes[49..52], &[0, 0, 0]);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[..52]), b"hello");
        assert_eq!(&bytes[52..56], &crc.to_le_bytes());
        assert_eq!(&bytes[56..], b"hello");
    }

    #[test]
    fn round_trip() {
        let f = sample();
        let bytes = f.encode().expect("encode");
        let (g, used) = decode_frame(&bytes, 1024).expect("decode");
        assert_eq!(used, bytes.len());
        assert_eq!(
            g.header.crc32c,
            u32::from_le_bytes(bytes[52..56].try_into().expect("4 bytes"))
        );
        assert_eq!(g.payload, f.payload);
        assert_eq!(g.header.kind, f.header.kind);
        assert_eq!(g.header.trace, f.header.trace);
    }

    #[test]
    fn short_input_is_incomplete() {
        let bytes = sample().encode().expect("encode");
        assert_eq!(
            decode_frame(&bytes[..10], 1024),
            Err(FrameError::Incomplete { needed: 46 })
        );
        assert_eq!(
            decode_frame(&bytes[..58], 1024),
            Err(FrameError::Incomplete { needed: 3 })
        );
        assert_eq!(decode_frame(&[], 1024), Err(FrameError::Incomplete { needed: 56 }));
    }

    #[test]
    fn rejects_bad_magic_version_flags_reserved() {
        let good = sample().encode().expect("encode");
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(decode_frame(&b, 1024), Err(FrameError::BadMagic(_))));
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(decode_frame(&b, 1024), Err(FrameError::UnsupportedVersion(2)));
        let mut b = good.clone();
        b[5] = 0x80;
        assert_eq!(decode_frame(&b, 1024), Err(FrameError::UnknownFlags(0x80)));
        let mut b = good.clone();
        b[5] = 0x08;
        assert_eq!(decode_frame(&b, 1024), Err(FrameError::UnknownFlags(0x08)));
        let mut b = good.clone();
        b[50] = 1;
        assert_eq!(decode_frame(&b, 1024), Err(FrameError::ReservedNotZero));
    }

    #[test]
    fn rejects_oversized_before_reading_payload() {
        let mut b = sample().encode().expect("encode");
        b[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_frame(&b, 1024),
            Err(FrameError::TooLarge {
                len: u32::MAX,
                max: 1024
            })
        );
        let b = sample().encode().expect("encode");
        assert_eq!(decode_frame(&b, 4), Err(FrameError::TooLarge { len: 5, max: 4 }));
    }

    #[test]
    fn detects_any_single_bit_flip_in_checksummed_frames() {
        let good = sample().encode().expect("encode");
        for byte in 0..good.len() {
            for bit in 0..8 {
                let mut b = good.clone();
                b[byte] ^= 1 << bit;
                assert!(
                    decode_frame(&b, 1024).is_err(),
                    "flip at byte {byte} bit {bit} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn raw_payload_checksums_header_only() {
        let mut f = sample();
        f.header.flags = Flags::RESPONSE.with(Flags::RAW_PAYLOAD);
        let mut b = f.encode().expect("encode");
        let crc = crc32c::crc32c(&b[..52]);
        assert_eq!(&b[52..56], &crc.to_le_bytes());
        let n = b.len();
        b[n - 1] ^= 1;
        let (g, _) = decode_frame(&b, 1024).expect("payload not covered");
        assert!(!g.header.payload_checksummed());
        b[20] ^= 1;
        assert!(
            matches!(decode_frame(&b, 1024), Err(FrameError::BadChecksum { .. })),
            "header still covered"
        );
    }

    #[test]
    fn response_header_keeps_id_kind_and_trace() {
        let f = sample();
        let r = f.header.response(true);
        assert!(r.is_response() && r.is_error());
        assert_eq!(r.request_id, f.header.request_id);
        assert_eq!(r.kind, f.header.kind);
        assert_eq!(r.trace, f.header.trace);
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn encode_decode_round_trip(
                flags in 0u8..8, kind: u16, id: u64, timeout: u32,
                trace_id: [u8; 16], span_id: [u8; 8], tflags: u8,
                payload in proptest::collection::vec(any::<u8>(), 0..4096),
                trailing in proptest::collection::vec(any::<u8>(), 0..64),
            ) {
                let header = FrameHeader {
                    flags: Flags(flags), kind: MsgKind(kind), request_id: id,
                    payload_len: 0, timeout_ms: timeout,
                    trace: TraceContext { trace_id, span_id, flags: tflags }, crc32c: 0,
                };
                let f = Frame { header, payload: Bytes::from(payload.clone()) };
                let mut bytes = f.encode().expect("encode").to_vec();
                let len = bytes.len();
                bytes.extend_from_slice(&trailing);
                let (g, used) = decode_frame(&bytes, 1 << 20).expect("decode");
                prop_assert_eq!(used, len);
                prop_assert_eq!(g.header.flags, f.header.flags);
                prop_assert_eq!(g.header.kind, f.header.kind);
                prop_assert_eq!(g.header.request_id, id);
                prop_assert_eq!(g.header.timeout_ms, timeout);
                prop_assert_eq!(g.header.trace, f.header.trace);
                prop_assert_eq!(g.header.payload_len as usize, payload.len());
                prop_assert_eq!(&g.payload[..], &payload[..]);
            }

            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), max in 0u32..1024) {
                let _ = decode_frame(&bytes, max);
            }
        }
    }
}
