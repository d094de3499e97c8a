//! Fuzzes the decoders of chunk-service requests that arrive from peers, and the
//! conversion of shard ids to store keys (which must reject out-of-range shards).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use shingle_data::wire::{RepairShardRequest, StageShardRequest, WriteShardRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(w) = WriteShardRequest::decode(data) {
        if let Some(id) = w.id {
            if let Ok(k) = id.key() {
                assert_eq!(u32::from(k.shard), id.shard);
            }
        }
    }
    if let Ok(r) = StageShardRequest::decode(data) {
        let _ = r.id.map(|id| id.key());
    }
    if let Ok(r) = RepairShardRequest::decode(data) {
        let _ = shingle_data::ec::EcPolicy::new(r.k.min(255) as u8, r.m.min(255) as u8, r.unit);
    }
});
