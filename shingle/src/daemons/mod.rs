//! The background work of `shingle serve`: what keeps data whole and gives space back.
//!
//! - [`repair`]: the repair scan meta nodes run over their files: rebuilds shards lost
//!   with a node (or left out by a degraded write) and records their new locations;
//!   moves shards to their placement after the map changed (rebalance).
//! - [`reclaim`]: space comes back: removed files' data purged by the meta nodes, and
//!   shards of dead inodes swept by the data nodes.
//! - [`heal`]: data nodes scrub their chunks and rebuild corrupt shards a layout names
//!   from the rest of their stripe (the corrupt record then no longer pins its zone).
//!
//! They are clients of the other nodes (through the metadata client and the data
//! service's calls) driven by a node's own state (`MetaNode`, the chunk store), so they
//! live with the server, not in the client library.

pub mod heal;
pub mod reclaim;
pub mod repair;
