//! Fuzzes the server's check of a client's handshake proof: any bytes, including
//! identities that are not names, serials of 0 and proofs of every length. A proof
//! whose identity names a client is also completed with that client's real key, so
//! the accepting path (and the principal it names) is exercised, not only refusals.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shingle_transport::ClusterSecret;
use shingle_transport::auth::{Identity, MAC_LEN, NONCE_LEN, PROOF_LEN, Principal, check_proof};

fuzz_target!(|data: &[u8]| {
    let secret = ClusterSecret::new(b"fuzz-cluster-secret".to_vec()).expect("secret");
    let nonce = [7u8; NONCE_LEN];
    // Random bytes never pass: a MAC cannot be guessed.
    assert!(check_proof(&secret, &nonce, data).is_err());
    // The first bytes as a name and serial: if they make an identity, its own key
    // proves it and nothing else.
    if data.len() < 9 {
        return;
    }
    let serial = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    let name = String::from_utf8_lossy(&data[8..data.len().min(40)]).into_owned();
    let Ok(id) = Identity::new(&name, serial) else { return };
    let key = secret.client_key(&id).expect("the cluster secret makes keys");
    let proof = key.client_proof(&nonce, &[9u8; NONCE_LEN]);
    assert_eq!(proof.len(), PROOF_LEN);
    let (who, mac) = check_proof(&secret, &nonce, &proof).expect("its own key passes");
    assert_eq!(who, Principal::Client(id));
    assert_eq!(mac.len(), MAC_LEN);
    let mut bad = proof.clone();
    bad[NONCE_LEN] ^= 1;
    assert!(check_proof(&secret, &nonce, &bad).is_err(), "a changed identity fails");
});
