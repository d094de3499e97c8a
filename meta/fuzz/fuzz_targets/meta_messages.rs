//! Fuzzes the decoders of every namespace-service message a node accepts from peers and
//! clients, the persisted-record key parser, and the anchor/lock derivation of decoded
//! operations (which must never panic on any decoded value).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shingle_meta::service::replica::Key;
use shingle_meta::service::wire::*;

fuzz_target!(|data: &[u8]| {
    if let Ok(op) = decode::<Op>(data) {
        let _ = op.op.anchor(64);
        let _ = op.op.anchor(1);
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
    let _ = decode::<PulledPiece>(data);
    let _ = decode::<ReadReply>(data);
    let _ = decode::<OpReply>(data);
    if let Some((p, k)) = Key::decode(data) {
        assert_eq!(Key::decode(&k.encode(p)), Some((p, k)));
    }
});
