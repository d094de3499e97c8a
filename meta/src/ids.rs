//! Identifiers of the cluster, as newtypes so that they cannot be mixed up.

use serde::{Deserialize, Serialize};

/// A node of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u64);

/// Version of the cluster map; increases on every change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Epoch(pub u64);

/// A metadata partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PartitionId(pub u32);

/// A data placement group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PgId(pub u32);

/// An inode number. The top 20 bits name the partition that allocated it, so GETATTR
/// routes without a lookup; the low 44 bits count within the partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Ino(pub u64);

impl Ino {
    /// The root directory (allocated by partition 0, counter 1).
    pub const ROOT: Ino = Ino(1);
    /// Bits of the per-partition counter.
    pub const COUNTER_BITS: u32 = 44;
    /// Largest partition count an inode number can name.
    pub const MAX_PARTITIONS: u32 = 1 << (64 - Self::COUNTER_BITS);
    /// The top counter bits no inode number (or intent id) uses: lock keys mark modes
    /// in them (`service::locks`). A partition hands out 2^42 - 1 numbers.
    pub const LOCK_BITS: u32 = 2;

    /// The inode number `counter` of `partition`.
    pub fn new(partition: PartitionId, counter: u64) -> Option<Ino> {
        if partition.0 >= Self::MAX_PARTITIONS || counter == 0 || counter >= 1 << (Self::COUNTER_BITS - Self::LOCK_BITS)
        {
            return None;
        }
        Some(Ino((u64::from(partition.0) << Self::COUNTER_BITS) | counter))
    }

    /// The partition that allocated this inode (and holds its attributes).
    pub fn partition(self) -> PartitionId {
        PartitionId((self.0 >> Self::COUNTER_BITS) as u32)
    }

    /// The counter part.
    pub fn counter(self) -> u64 {
        self.0 & ((1 << Self::COUNTER_BITS) - 1)
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {}", self.0)
    }
}

impl std::fmt::Display for Ino {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ino {}:{}", self.partition().0, self.counter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_embed_their_partition() {
        let i = Ino::new(PartitionId(1023), 77).expect("valid");
        assert_eq!(i.partition(), PartitionId(1023));
        assert_eq!(i.counter(), 77);
        assert_eq!(Ino::ROOT.partition(), PartitionId(0));
        assert_eq!(Ino::new(PartitionId(0), 1), Some(Ino::ROOT));
        assert!(Ino::new(PartitionId(Ino::MAX_PARTITIONS), 1).is_none());
        assert!(Ino::new(PartitionId(0), 0).is_none());
        assert!(Ino::new(PartitionId(0), 1 << 44).is_none());
        assert!(Ino::new(PartitionId(0), 1 << 42).is_none());
        assert!(Ino::new(PartitionId(0), (1 << 42) - 1).is_some());
    }
}
