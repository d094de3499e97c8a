//! Fuzzes the decoders of control payloads that arrive from peers: error replies and
//! remote-read requests (run against a real region table, so the NIC-style bounds
//! checks are exercised with hostile values).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shingle_transport::RegionTable;
use shingle_transport::rpc::RemoteReadRequest;
use shingle_transport::status::Status;

fuzz_target!(|data: &[u8]| {
    let s = Status::decode(data);
    assert!(s.message.len() <= 64 * 1024 || !s.message.is_empty());
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
