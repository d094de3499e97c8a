//! # shingle-data
//!
//! The data path of a Shingle data node, and the erasure code its clients use.
//!
//! - [`zone`]: zoned devices (append at the write pointer, reset to reclaim): the
//!   file emulation (default), real zoned block devices, and fault injection.
//! - [`chunk`]: the self-describing chunk record (key, version, crc32c), verified right
//!   before it is written and right after it is read.
//! - [`store`]: chunks appended to zones, a redb index (rebuildable by scanning zones;
//!   checkpointed, with the records after its checkpoint replayed from the zones at
//!   open), group commit (one zone sync per batch of puts), GC by garbage ratio, scrub.
//! - [`ec`]: Reed-Solomon stripes (k data + m parity shards, reed-solomon-simd).
//! - [`wire`]: the chunk service's messages and RPC kinds.
//! - [`service`]: the chunk service on the transport (the server): write, stage +
//!   remote read, delete, scrub, repair.
//! - [`shard`]: the calls a client makes to it (read a shard or a range, write one).
//!
//! This crate must never learn about paths, directories or FUSE; it stores and serves
//! shards named by [`chunk::ChunkKey`]. Nothing is acknowledged before it is durable.

pub mod chunk;
pub mod ec;
pub mod service;
pub mod shard;
pub mod store;
pub mod stripe;
pub mod wire;
pub mod zone;
