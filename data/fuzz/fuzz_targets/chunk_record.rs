//! Fuzzes the chunk record decoder with bytes as they could come back from a damaged
//! disk: a record decodes only if every check passes, and then re-encodes exactly.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shingle_data::chunk::{ChunkHeader, decode_record, encode_record};

fuzz_target!(|data: &[u8]| {
    if let Ok((h, payload)) = decode_record(Bytes::copy_from_slice(data), None, None) {
        assert_eq!(payload.len(), h.payload_len as usize);
        assert_eq!(crc32c_of(&payload), h.payload_crc);
        let again = encode_record(&h, &payload, 1);
        assert_eq!(&again[..], &data[..again.len()]);
    }
    let _ = ChunkHeader::decode(data);
});

fn crc32c_of(b: &[u8]) -> u32 {
    // Recompute through the header API: a header with this payload must verify.
    let h = ChunkHeader {
        key: shingle_data::chunk::ChunkKey { ino: 0, stripe: 0, shard: 0 },
        version: 0,
        seq: 0,
        payload_len: b.len() as u32,
        payload_crc: 0,
    };
    match h.verify_payload(b) {
        Err(shingle_data::chunk::ChunkError::PayloadChecksum { actual, .. }) => actual,
        _ => 0,
    }
}
