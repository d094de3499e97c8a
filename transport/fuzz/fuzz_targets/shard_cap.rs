//! Fuzzes a data node's check of a shard capability (`shingle_transport::cap`): any
//! bytes, for any file, at any time. Nothing but a capability this cluster signed
//! passes; one it signed passes for its own file until it expires, and any change to
//! its bytes makes it fail.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shingle_transport::ClusterSecret;
use shingle_transport::cap::{CAP_LEN, CAP_SKEW_SECS, CapKey, Right, ShardCap};

fuzz_target!(|data: &[u8]| {
    let key = CapKey::derive(&ClusterSecret::new(b"fuzz-cluster-secret".to_vec()).expect("secret")).expect("key");
    let word = |at: usize| {
        let mut w = [0u8; 8];
        for (i, b) in data.iter().skip(at).take(8).enumerate() {
            w[i] = *b;
        }
        u64::from_le_bytes(w)
    };
    let (object, now) = (word(0), word(8) >> 1);
    // Random bytes never pass: a MAC cannot be guessed.
    assert!(key.check(data, object, Right::Read, now).is_err());
    if let Ok(c) = ShardCap::from_bytes(data) {
        assert_eq!(c.to_bytes(), data, "decoding and encoding agree");
    }
    // A real one, for the object, right and time the bytes name.
    let right = if word(16) & 1 == 0 { Right::Read } else { Right::Write };
    let cap = key.mint(object, right, now);
    let bytes = cap.to_bytes();
    assert_eq!(bytes.len(), CAP_LEN);
    assert_eq!(key.check(&bytes, object, Right::Read, now), Ok(()));
    assert_eq!(key.check(&bytes, object, Right::Write, now).is_ok(), right == Right::Write);
    assert!(key.check(&bytes, object.wrapping_add(1), Right::Read, now).is_err(), "another object");
    let late = cap.expires.saturating_add(CAP_SKEW_SECS).saturating_add(1);
    if late > cap.expires.saturating_add(CAP_SKEW_SECS) {
        assert!(key.check(&bytes, object, Right::Read, late).is_err(), "expired");
    }
    if let Some(&b) = data.get(24) {
        let mut bad = bytes.clone();
        bad[usize::from(b) % CAP_LEN] ^= 1 | b;
        assert!(key.check(&bad, object, Right::Read, now).is_err(), "a changed byte");
    }
});
