//! Fuzzes the decoders of every namespace-service message a node accepts from peers and
//! clients, the ACL attribute parser, the persisted-record key parser, the store's log
//! reader, the anchor/lock derivation of decoded operations (which must never panic on
//! any decoded value), and what an agent does with a manager's map reply (maps parsed,
//! recorded in a history, chained).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shingle_meta::ids::Epoch;
use shingle_meta::manager::rpc::{GetMapRequest, GetMapResponse};
use shingle_meta::map::{ClusterMap, MapHistory};
use shingle_meta::service::replica::Key;
use shingle_meta::service::wire::*;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    // The store's log as read back from disk: frames taken or the log refused, never a
    // panic, whatever the bytes.
    let _ = shingle_meta::service::wal::scan(data, 0);
    let _ = shingle_meta::service::wal::scan(data, 7);
    // An ACL attribute's value, as any client may send it.
    if let Ok(entries) = shingle_meta::namespace::acl::parse(data) {
        let _ = shingle_meta::namespace::acl::equivalent_mode(&entries);
    }
    if let Ok(op) = decode::<Op>(data) {
        let _ = op.op.anchor(64);
        let _ = op.op.anchor(1);
        let _ = op.op.once();
    }
    let _ = decode::<Read>(data);
    let _ = decode::<Fetch>(data);
    let _ = decode::<Execute>(data);
    let _ = decode::<Alloc>(data);
    let _ = decode::<Lock>(data);
    let _ = decode::<Replicate>(data);
    if let Ok(piece) = decode::<InstallPiece>(data) {
        // Any decoded piece is taken or refused, never a panic.
        let _ = shingle_meta::service::copy::Assembly::default().take(piece.copy, piece.offset, &piece.data);
    }
    let _ = decode::<SyncMe>(data);
    let _ = decode::<Pull>(data);
    let _ = decode::<PullPiece>(data);
    let _ = decode::<Settled>(data);
    let _ = decode::<Quiet>(data);
    let _ = decode::<QuietReply>(data);
    let _ = decode::<Expect>(data);
    let _ = decode::<PulledPiece>(data);
    let _ = decode::<Fence>(data);
    if let Ok(pos) = decode::<Pulled>(data) {
        // What a member says it knows of a partition's fence is taken, never a panic.
        let mut f = shingle_meta::service::read_fence::ReadFence::default();
        f.absorb(shingle_meta::ids::PartitionId(0), &pos.fence);
    }
    let _ = decode::<ReadReply>(data);
    let _ = decode::<OpReply>(data);
    let _ = <GetMapRequest as prost::Message>::decode(data);
    if let Ok(r) = <GetMapResponse as prost::Message>::decode(data) {
        let mut h = MapHistory::default();
        for json in r.history_json.iter().chain([&r.map_json]) {
            if let Ok(m) = serde_json::from_str::<ClusterMap>(json) {
                let _ = m.returned_since(&m);
                h.record(Arc::new(m));
            }
        }
        if let Some(c) = h.chain(Epoch(r.epoch.saturating_sub(3)), Epoch(r.epoch)) {
            assert!(c.windows(2).all(|w| w[0].epoch.0 + 1 == w[1].epoch.0));
        }
    }
    if let Some((p, k)) = Key::decode(data) {
        assert_eq!(Key::decode(&k.encode(p)), Some((p, k)));
    }
});
