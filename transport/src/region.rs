//! Registered memory regions: what the remote-read verb reads from.
//!
//! A server registers a region (a memory buffer or an mmap'd file) and gets a
//! [`RegionKey`] {region, generation, length} to hand to clients. A region id is a slot
//! in a table; revoking a region bumps the slot's generation, so every key issued for
//! it turns stale at once, the way deregistering an RDMA memory region invalidates its
//! rkey. A read is checked exactly as a NIC would: unknown region, stale generation and
//! out-of-bounds ranges are typed errors, never a panic and never someone else's bytes.

use bytes::Bytes;
use parking_lot::RwLock;
use std::path::Path;

/// Names a registered region and bounds what can be read through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionKey {
    /// Slot in the server's region table.
    pub region: u32,
    /// Generation of the slot when the key was issued.
    pub generation: u32,
    /// Length of the region in bytes when the key was issued.
    pub len: u64,
}

/// Why a remote read was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No region was ever registered in that slot.
    #[error("unknown region {0}")]
    UnknownRegion(u32),
    /// The region was revoked (or the slot reused) after the key was issued.
    #[error("stale key for region {region} (generation {generation}): revoked or re-registered")]
    StaleGeneration {
        /// Region slot.
        region: u32,
        /// Generation in the key.
        generation: u32,
    },
    /// The range is not inside the region.
    #[error("read of {len} bytes at offset {offset} is outside region of {region_len} bytes")]
    OutOfBounds {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// Length of the region.
        region_len: u64,
    },
}

struct Slot {
    generation: u32,
    data: Option<Bytes>,
    /// The object (e.g. a file's inode) the region holds bytes of, when registered for
    /// one: a client key reads it only with a capability for that object.
    object: Option<u64>,
}

/// The table of registered regions of one server.
#[derive(Default)]
pub struct RegionTable {
    slots: RwLock<Table>,
    /// Called after a region is revoked (an RDMA export deregisters its memory).
    revoke_hooks: RwLock<Vec<RevokeHook>>,
}

/// A function told about every revoked key.
pub type RevokeHook = Box<dyn Fn(RegionKey) + Send + Sync>;

#[derive(Default)]
struct Table {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl RegionTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers memory and returns the key that reads it. Only the cluster's own nodes
    /// may read such a region remotely (see [`RegionTable::register_for`]).
    pub fn register(&self, data: Bytes) -> RegionKey {
        self.insert(data, None)
    }

    /// Registers memory holding bytes of `object` (a file's inode): a caller with a
    /// client key reads it remotely only by showing a capability for that object
    /// ([`crate::cap`]); the cluster's nodes read it with the key alone.
    pub fn register_for(&self, data: Bytes, object: u64) -> RegionKey {
        self.insert(data, Some(object))
    }

    fn insert(&self, data: Bytes, object: Option<u64>) -> RegionKey {
        let mut t = self.slots.write();
        let len = data.len() as u64;
        let region = match t.free.pop() {
            Some(idx) => idx,
            None => {
                let idx = u32::try_from(t.slots.len()).unwrap_or(u32::MAX);
                t.slots.push(Slot {
                    generation: 0,
                    data: None,
                    object: None,
                });
                idx
            }
        };
        let slot = &mut t.slots[region as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.data = Some(data);
        slot.object = object;
        RegionKey {
            region,
            generation: slot.generation,
            len,
        }
    }

    /// Maps a file read-only and registers it.
    pub fn register_file(&self, path: &Path) -> std::io::Result<RegionKey> {
        let file = std::fs::File::open(path)?;
        let bytes = map_file(&file)?;
        Ok(self.register(bytes))
    }

    /// Revokes a region: every key issued for it turns stale. Returns false when the
    /// key was already stale or unknown.
    pub fn revoke(&self, key: RegionKey) -> bool {
        let mut t = self.slots.write();
        let Some(slot) = t.slots.get_mut(key.region as usize) else {
            return false;
        };
        if slot.generation != key.generation || slot.data.is_none() {
            return false;
        }
        slot.generation = slot.generation.wrapping_add(1);
        slot.data = None;
        slot.object = None;
        t.free.push(key.region);
        drop(t);
        for hook in self.revoke_hooks.read().iter() {
            hook(key);
        }
        true
    }

    /// Calls `hook` with every key revoked from now on.
    pub fn on_revoke(&self, hook: RevokeHook) {
        self.revoke_hooks.write().push(hook);
    }

    /// The whole region a valid key names (at most `key.len` bytes).
    pub fn whole(&self, key: RegionKey) -> Result<Bytes, AccessError> {
        let len = {
            let t = self.slots.read();
            match t.slots.get(key.region as usize) {
                Some(Slot {
                    data: Some(d),
                    generation,
                    ..
                }) if *generation == key.generation => d.len() as u64,
                Some(_) => {
                    return Err(AccessError::StaleGeneration {
                        region: key.region,
                        generation: key.generation,
                    });
                }
                None => return Err(AccessError::UnknownRegion(key.region)),
            }
        };
        self.access(key, 0, len.min(key.len))
    }

    /// Number of regions registered now.
    pub fn len(&self) -> usize {
        let t = self.slots.read();
        t.slots.len() - t.free.len()
    }

    /// True when no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks a read as the NIC would and returns the bytes it may see.
    pub fn access(&self, key: RegionKey, offset: u64, len: u64) -> Result<Bytes, AccessError> {
        self.access_with_object(key, offset, len).map(|(b, _)| b)
    }

    /// As [`RegionTable::access`], with the object the region was registered for.
    pub fn access_with_object(
        &self,
        key: RegionKey,
        offset: u64,
        len: u64,
    ) -> Result<(Bytes, Option<u64>), AccessError> {
        let t = self.slots.read();
        let slot = t
            .slots
            .get(key.region as usize)
            .ok_or(AccessError::UnknownRegion(key.region))?;
        let data = match &slot.data {
            Some(d) if slot.generation == key.generation => d,
            _ => {
                return Err(AccessError::StaleGeneration {
                    region: key.region,
                    generation: key.generation,
                });
            }
        };
        let region_len = (data.len() as u64).min(key.len);
        match offset.checked_add(len) {
            Some(end) if end <= region_len => Ok((data.slice(offset as usize..end as usize), slot.object)),
            _ => Err(AccessError::OutOfBounds {
                offset,
                len,
                region_len,
            }),
        }
    }
}

/// Maps a whole file read-only into a `Bytes` that keeps the mapping alive.
pub fn map_file(file: &std::fs::File) -> std::io::Result<Bytes> {
    if file.metadata()?.len() == 0 {
        return Ok(Bytes::new());
    }
    // The mapping is read-only. The caller owns the file's content and must not
    // truncate it while the region is registered (the zoned store only appends).
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(file)? };
    Ok(Bytes::from_owner(map))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_checks_like_a_nic() {
        let t = RegionTable::new();
        let k = t.register(Bytes::from_static(b"0123456789"));
        assert_eq!(&t.access(k, 2, 3).expect("in bounds")[..], b"234");
        assert_eq!(&t.access(k, 0, 10).expect("whole")[..], b"0123456789");
        assert_eq!(t.access(k, 10, 0).expect("empty at end").len(), 0);
        assert!(matches!(t.access(k, 8, 3), Err(AccessError::OutOfBounds { .. })));
        assert!(matches!(t.access(k, u64::MAX, 2), Err(AccessError::OutOfBounds { .. })));
        let unknown = RegionKey { region: 99, ..k };
        assert_eq!(t.access(unknown, 0, 1), Err(AccessError::UnknownRegion(99)));
        let forged = RegionKey {
            generation: k.generation + 5,
            ..k
        };
        assert!(matches!(
            t.access(forged, 0, 1),
            Err(AccessError::StaleGeneration { .. })
        ));
        let longer = RegionKey { len: 1000, ..k };
        assert!(matches!(t.access(longer, 0, 11), Err(AccessError::OutOfBounds { .. })));
    }

    #[test]
    fn revoke_makes_keys_stale_and_reuse_never_resurrects_them() {
        let t = RegionTable::new();
        let k1 = t.register(Bytes::from_static(b"first"));
        assert!(t.revoke(k1));
        assert!(!t.revoke(k1));
        assert!(matches!(t.access(k1, 0, 1), Err(AccessError::StaleGeneration { .. })));
        let k2 = t.register(Bytes::from_static(b"second"));
        assert_eq!(k2.region, k1.region, "slot is reused");
        assert!(matches!(t.access(k1, 0, 1), Err(AccessError::StaleGeneration { .. })));
        assert_eq!(&t.access(k2, 0, 6).expect("new key")[..], b"second");
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_region_remembers_its_object_until_its_slot_is_reused() {
        let t = RegionTable::new();
        let k = t.register_for(Bytes::from_static(b"shard"), 42);
        assert_eq!(t.access_with_object(k, 0, 5).expect("read").1, Some(42));
        assert!(t.revoke(k));
        let k2 = t.register(Bytes::from_static(b"plain"));
        assert_eq!(k2.region, k.region);
        assert_eq!(t.access_with_object(k2, 0, 5).expect("read").1, None);
    }

    #[test]
    fn files_map_and_empty_files_work() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, b"mapped bytes").expect("write");
        let t = RegionTable::new();
        let k = t.register_file(&p).expect("map");
        assert_eq!(&t.access(k, 7, 5).expect("read")[..], b"bytes");
        let e = dir.path().join("e");
        std::fs::write(&e, b"").expect("write");
        let k = t.register_file(&e).expect("map empty");
        assert_eq!(k.len, 0);
    }
}
