//! Fuzzes the decoders of control payloads that arrive from peers: error replies,
//! remote-read requests (run against a real region table, so the NIC-style bounds
//! checks are exercised with hostile values), and RDMA grant hand-backs (applied to a
//! read window's allocator holding grants: hostile tokens free nothing but their own).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shingle_transport::RegionTable;
use shingle_transport::rpc::RemoteReadRequest;
use shingle_transport::status::Status;
use shingle_transport::window::{Release, WindowAlloc};

fuzz_target!(|data: &[u8]| {
    let s = Status::decode(data);
    assert!(s.message.len() <= 64 * 1024 || !s.message.is_empty());
    if let Ok(r) = <Release as prost::Message>::decode(data) {
        let mut w = WindowAlloc::new(1 << 20);
        let live: Vec<u64> = (1..=4u64).filter(|t| w.place(4096, *t).is_some()).collect();
        assert_eq!(live.len(), 4);
        for t in &r.tokens {
            w.release(*t);
        }
        let kept = live.iter().filter(|t| !r.tokens.contains(t)).count() as u64;
        assert_eq!(w.used(), kept * 4096);
    }
    if let Ok(req) = <RemoteReadRequest as prost::Message>::decode(data) {
        let table = RegionTable::new();
        let key = table.register(Bytes::from_static(&[7u8; 4096]));
        let probe = shingle_transport::RegionKey { region: req.region % 2, ..req.key() };
        let probe = if probe.region == key.region { shingle_transport::RegionKey { generation: key.generation, ..probe } } else { probe };
        if let Ok(bytes) = table.access(probe, req.offset, u64::from(req.len)) {
            assert_eq!(bytes.len() as u64, u64::from(req.len));
            assert!(req.offset + u64::from(req.len) <= 4096);
        }
    }
});
