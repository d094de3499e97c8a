//! The namespace service: the partitions a node holds, replicated, and the operations on them.
//!
//! - [`wire`]: the messages (postcard over the transport) and the call helper.
//! - [`replica`]: one copy of a partition and how batches change it (pure).
//! - [`protocol`]: the replication protocol's decisions (follow, install, takeover,
//!   which copies keep serving across a map change), pure and shared with the simulator.
//! - [`read_fence`]: which nodes may still serve reads of a partition they were
//!   dropped from, and must confirm the new map before its primary acknowledges (pure).
//! - [`store`]: durable copies in redb with group commit, behind [`wal`] (the
//!   write-ahead log's frames, cursor and replay, pure).
//! - [`copy`]: partition copies moved in resumable pieces (install, takeover pull).
//! - [`coordinator`]: the coordinator of one namespace operation (locks, reads, plans,
//!   intents, the fence of stale coordinators), pure and shared with the simulator.
//! - [`locks`]: inode locks of coordinators, with leases.
//! - [`node`]: the service: reads, the coordinator of mutations (sparse views over
//!   remote records, intents for multi-partition changes), primary/replica replication
//!   with epoch fencing, catch-up and takeover.

pub mod coordinator;
pub mod copy;
pub mod locks;
pub mod node;
pub mod protocol;
pub mod read_fence;
pub mod replica;
pub mod store;
pub mod subtree;
pub mod wal;
pub mod wire;

pub use node::{MetaConfig, MetaNode};
