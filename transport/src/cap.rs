//! Capabilities: signed, expiring tokens naming one object, which a server that
//! checked a caller's right hands it and other servers check without asking back. The
//! data service uses them as shard capabilities, the object being a file's inode
//! number (this crate knows no files: to it the object is a number).
//!
//! A data node cannot tell whose file a shard belongs to, nor whether the caller may
//! write it: the metadata service knows. So a metadata node that has just checked a
//! client's right to write a file (a create, or a version reservation, which a client
//! key passes only as the file's owner or with write permission) hands it a
//! capability: the file's inode and an expiry, signed with a key every server derives
//! from the cluster secret ([`CapKey`]). A data node asked by a client key to write or
//! delete a shard of that file checks the signature, the inode and the expiry, and
//! nothing else: no round trip, no state. Callers holding the cluster secret (servers,
//! their daemons, trusted mounts) need none.
//!
//! The check is pure ([`CapKey::check`]), so it is unit tested and fuzzed with the
//! other parsers of bytes from outside.

use crate::auth::ClusterSecret;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Bytes of an encoded capability: object, expiry (both little-endian u64), right
/// (one byte), MAC.
pub const CAP_LEN: usize = 8 + 8 + 1 + 32;

/// What a capability allows. A write capability allows reading too (a writer reads
/// the stripes it changes in part).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Right {
    /// Read the object's shards.
    Read = 1,
    /// Read, write and delete the object's shards.
    Write = 2,
}

impl Right {
    fn from_byte(b: u8) -> Option<Right> {
        match b {
            1 => Some(Right::Read),
            2 => Some(Right::Write),
            _ => None,
        }
    }

    /// Whether holding `self` gives `need`.
    pub fn allows(self, need: Right) -> bool {
        self == Right::Write || need == Right::Read
    }
}

/// How long a capability is good for, in seconds. Long enough that a writer renews
/// rarely (one version reservation), short enough that a client whose write
/// permission was taken away (chmod, chown) loses its shard access within the hour.
/// Revoking a client key cuts it off at once (nodes refuse the key itself).
pub const CAP_TTL_SECS: u64 = 3600;

/// Clock difference between servers a capability's expiry tolerates.
pub const CAP_SKEW_SECS: u64 = 60;

const KEY_LABEL: &[u8] = b"shingle shard capability key v1";
const CAP_LABEL: &[u8] = b"shingle shard capability v1";

/// The key capabilities are signed with; every server derives the same one from the
/// cluster secret. A client key cannot derive it.
#[derive(Clone)]
pub struct CapKey([u8; 32]);

impl std::fmt::Debug for CapKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapKey(..)")
    }
}

/// Why a capability was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CapError {
    /// No capability came with a request that needs one.
    #[error("a client key needs a shard capability for this file (ask the metadata service for versions)")]
    Missing,
    /// Not [`CAP_LEN`] bytes.
    #[error("malformed shard capability")]
    Malformed,
    /// A read capability where a write one is needed.
    #[error("shard capability allows reading only")]
    ReadOnly,
    /// Signed for another object.
    #[error("shard capability is for another file")]
    WrongFile,
    /// Past its expiry.
    #[error("shard capability expired")]
    Expired,
    /// Not signed by this cluster.
    #[error("shard capability not signed by this cluster")]
    BadSignature,
}

/// A decoded capability: `object` until `expires` (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardCap {
    /// The object (for shard capabilities, a file's inode number).
    pub object: u64,
    /// Unix seconds after which data nodes refuse it.
    pub expires: u64,
    /// What it allows.
    pub right: Right,
    mac: [u8; 32],
}

impl ShardCap {
    /// The capability as it travels.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CAP_LEN);
        b.extend_from_slice(&self.object.to_le_bytes());
        b.extend_from_slice(&self.expires.to_le_bytes());
        b.push(self.right as u8);
        b.extend_from_slice(&self.mac);
        b
    }

    /// Decodes [`ShardCap::to_bytes`] (the signature is not checked here).
    pub fn from_bytes(b: &[u8]) -> Result<ShardCap, CapError> {
        if b.len() != CAP_LEN {
            return Err(CapError::Malformed);
        }
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        let right = Right::from_byte(b[16]).ok_or(CapError::Malformed)?;
        let mut mac = [0u8; 32];
        mac.copy_from_slice(&b[17..]);
        Ok(ShardCap {
            object: word(0..8),
            expires: word(8..16),
            right,
            mac,
        })
    }
}

impl CapKey {
    /// The capability key of the cluster whose secret is `secret`; `None` for a client
    /// key (only servers sign capabilities).
    pub fn derive(secret: &ClusterSecret) -> Option<CapKey> {
        if secret.identity().is_some() {
            return None;
        }
        let mut m = hmac(secret.expose());
        m.update(KEY_LABEL);
        Some(CapKey(m.finalize().into_bytes().into()))
    }

    fn mac(&self, object: u64, expires: u64, right: Right) -> Hmac<Sha256> {
        let mut m = hmac(&self.0);
        m.update(CAP_LABEL);
        m.update(&object.to_le_bytes());
        m.update(&expires.to_le_bytes());
        m.update(&[right as u8]);
        m
    }

    /// A capability giving `right` on `object`, good until `now + CAP_TTL_SECS`.
    pub fn mint(&self, object: u64, right: Right, now: u64) -> ShardCap {
        let expires = now.saturating_add(CAP_TTL_SECS);
        ShardCap {
            object,
            expires,
            right,
            mac: self.mac(object, expires, right).finalize().into_bytes().into(),
        }
    }

    /// Whether `cap` (as it travelled; empty: none) gives `need` on `object` at `now`
    /// (Unix seconds). The signature is compared in constant time.
    pub fn check(&self, cap: &[u8], object: u64, need: Right, now: u64) -> Result<(), CapError> {
        if cap.is_empty() {
            return Err(CapError::Missing);
        }
        let c = ShardCap::from_bytes(cap)?;
        self.mac(c.object, c.expires, c.right)
            .verify_slice(&c.mac)
            .map_err(|_| CapError::BadSignature)?;
        if c.object != object {
            return Err(CapError::WrongFile);
        }
        if !c.right.allows(need) {
            return Err(CapError::ReadOnly);
        }
        if now > c.expires.saturating_add(CAP_SKEW_SECS) {
            return Err(CapError::Expired);
        }
        Ok(())
    }
}

/// Unix seconds now, by [`crate::clock`] (0 if the clock is before 1970).
pub fn unix_now() -> u64 {
    crate::clock::now_secs()
}

fn hmac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length; new_from_slice cannot fail for it.
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Identity;

    fn key(s: &str) -> CapKey {
        CapKey::derive(&ClusterSecret::new(s.as_bytes().to_vec()).expect("secret")).expect("cluster key")
    }

    #[test]
    fn a_minted_capability_passes_for_its_object_and_right_until_it_expires() {
        let k = key("0123456789abcdef0123");
        let cap = k.mint(42, Right::Write, 1_000).to_bytes();
        assert_eq!(cap.len(), CAP_LEN);
        assert_eq!(k.check(&cap, 42, Right::Write, 1_000), Ok(()));
        assert_eq!(k.check(&cap, 42, Right::Read, 1_000), Ok(()), "a writer reads");
        let last = 1_000 + CAP_TTL_SECS + CAP_SKEW_SECS;
        assert_eq!(k.check(&cap, 42, Right::Write, last), Ok(()));
        assert_eq!(k.check(&cap, 42, Right::Write, last + 1), Err(CapError::Expired));
        assert_eq!(k.check(&cap, 43, Right::Write, 1_000), Err(CapError::WrongFile));
        let c = ShardCap::from_bytes(&cap).expect("decodes");
        assert_eq!((c.object, c.expires, c.right), (42, 1_000 + CAP_TTL_SECS, Right::Write));
        let read = k.mint(42, Right::Read, 1_000).to_bytes();
        assert_eq!(k.check(&read, 42, Right::Read, 1_000), Ok(()));
        assert_eq!(k.check(&read, 42, Right::Write, 1_000), Err(CapError::ReadOnly));
    }

    #[test]
    fn forged_altered_or_foreign_capabilities_are_refused() {
        let k = key("0123456789abcdef0123");
        let cap = k.mint(42, Right::Read, 1_000).to_bytes();
        assert_eq!(k.check(&[], 42, Right::Read, 1_000), Err(CapError::Missing));
        assert_eq!(
            k.check(&cap[..CAP_LEN - 1], 42, Right::Read, 1_000),
            Err(CapError::Malformed)
        );
        // Every byte matters: a changed object, expiry, right or MAC breaks the
        // signature (a read capability turned into a write one included), and a right
        // byte that names no right does not decode.
        for i in 0..CAP_LEN {
            let mut bad = cap.clone();
            bad[i] ^= 3;
            assert_eq!(
                k.check(&bad, 42, Right::Read, 1_000),
                Err(CapError::BadSignature),
                "byte {i}"
            );
        }
        let mut nonsense = cap.clone();
        nonsense[16] = 9;
        assert_eq!(k.check(&nonsense, 42, Right::Read, 1_000), Err(CapError::Malformed));
        // Another cluster's capability, and one a client key would sign, are not ours.
        let other = key("another cluster secret!").mint(42, Right::Read, 1_000).to_bytes();
        assert_eq!(k.check(&other, 42, Right::Read, 1_000), Err(CapError::BadSignature));
        let client = ClusterSecret::new(b"0123456789abcdef0123".to_vec())
            .expect("secret")
            .client_key(&Identity::new("host", 1).expect("id"))
            .expect("client key");
        assert!(
            CapKey::derive(&client).is_none(),
            "a client key cannot sign capabilities"
        );
    }
}
