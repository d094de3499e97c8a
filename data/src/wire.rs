//! The chunk service's messages (protobuf, prost) and RPC kinds: what a data node and
//! its callers agree on. The server is [`crate::service`]; the calls a client makes
//! are [`crate::shard`].

use crate::chunk::ChunkKey;
use bytes::Bytes;
use shingle_transport::{RegionKey, Status};

/// A shard's name on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct ShardId {
    /// Inode.
    #[prost(uint64, tag = "1")]
    pub ino: u64,
    /// Stripe index.
    #[prost(uint64, tag = "2")]
    pub stripe: u64,
    /// Shard index.
    #[prost(uint32, tag = "3")]
    pub shard: u32,
}

impl ShardId {
    /// The store key, refusing shard indexes that do not fit.
    pub fn key(&self) -> Result<ChunkKey, Status> {
        let shard = u16::try_from(self.shard)
            .map_err(|_| Status::new(shingle_transport::Code::InvalidRequest, "shard index out of range"))?;
        Ok(ChunkKey {
            ino: self.ino,
            stripe: self.stripe,
            shard,
        })
    }
}

impl From<ChunkKey> for ShardId {
    fn from(k: ChunkKey) -> Self {
        ShardId {
            ino: k.ino,
            stripe: k.stripe,
            shard: u32::from(k.shard),
        }
    }
}

/// Write one shard.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteShardRequest {
    /// Which shard.
    #[prost(message, optional, tag = "1")]
    pub id: Option<ShardId>,
    /// Layout version.
    #[prost(uint64, tag = "2")]
    pub version: u64,
    /// crc32c of `data`, computed by the writer.
    #[prost(uint32, tag = "3")]
    pub crc: u32,
    /// The shard bytes.
    #[prost(bytes = "bytes", tag = "4")]
    pub data: Bytes,
    /// A capability for the shard's file (`shingle_transport::cap`): required of a
    /// caller with a client key, ignored for one holding the cluster secret.
    #[prost(bytes = "bytes", tag = "5")]
    pub cap: Bytes,
}

/// Where the shard was stored (a location hint for the layout).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteShardResponse {
    /// Zone.
    #[prost(uint32, tag = "1")]
    pub zone: u32,
    /// Offset in the zone.
    #[prost(uint64, tag = "2")]
    pub offset: u64,
}

/// Find and stage a shard for remote read.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StageShardRequest {
    /// Which shard.
    #[prost(message, optional, tag = "1")]
    pub id: Option<ShardId>,
    /// Required version; 0 takes the newest stored one.
    #[prost(uint64, tag = "2")]
    pub version: u64,
    /// Start of the byte range the caller will read (with `range_len`).
    #[prost(uint64, tag = "3")]
    pub range_offset: u64,
    /// Length of the byte range the caller will read; 0: the whole payload.
    #[prost(uint64, tag = "4")]
    pub range_len: u64,
    /// Send the range in the reply (at most [`INLINE_MAX`] bytes): one round trip for
    /// a small read instead of a stage and a remote read.
    #[prost(bool, tag = "5")]
    pub inline: bool,
    /// A capability for the shard's file, as for [`WriteShardRequest::cap`] (a read
    /// capability will do).
    #[prost(bytes = "bytes", tag = "6")]
    pub cap: Bytes,
}

/// Largest byte range a stage answers inline.
pub const INLINE_MAX: u64 = 128 << 10;

/// A staged shard: read `payload_len` bytes at offset 0 of the region.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StageShardResponse {
    /// Region slot.
    #[prost(uint32, tag = "1")]
    pub region: u32,
    /// Region generation.
    #[prost(uint32, tag = "2")]
    pub generation: u32,
    /// Region length (= payload length).
    #[prost(uint64, tag = "3")]
    pub region_len: u64,
    /// crc32c of the payload, to verify after the read.
    #[prost(uint32, tag = "4")]
    pub crc: u32,
    /// Stored version.
    #[prost(uint64, tag = "5")]
    pub version: u64,
    /// crc32c of the requested byte range (of the payload when no range was asked for).
    #[prost(uint32, tag = "6")]
    pub range_crc: u32,
    /// The requested range, when asked for inline.
    #[prost(bytes = "bytes", tag = "7")]
    pub data: Bytes,
    /// Over RDMA, when not answered inline: the requested range (the whole payload when
    /// no range was asked), placed in the caller's read window; read it with one RDMA
    /// READ on the connection that asked (`shingle_transport::window`). Absent when the
    /// window had no room: read the region instead.
    #[prost(message, optional, tag = "8")]
    pub grant: Option<shingle_transport::Grant>,
}

impl StageShardResponse {
    /// The region key to read.
    pub fn key(&self) -> RegionKey {
        RegionKey {
            region: self.region,
            generation: self.generation,
            len: self.region_len,
        }
    }
}

/// Delete one shard.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteShardRequest {
    /// Which shard.
    #[prost(message, optional, tag = "1")]
    pub id: Option<ShardId>,
    /// Delete only this stored version (0: whatever is stored).
    #[prost(uint64, tag = "2")]
    pub version: u64,
    /// A capability for the shard's file, as for [`WriteShardRequest::cap`].
    #[prost(bytes = "bytes", tag = "3")]
    pub cap: Bytes,
}

/// Whether it existed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteShardResponse {
    /// True when the shard was stored.
    #[prost(bool, tag = "1")]
    pub existed: bool,
}

/// Delete every shard of a file (every stripe, shard and version): its purge.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteFileRequest {
    /// The removed file's inode.
    #[prost(uint64, tag = "1")]
    pub ino: u64,
    /// More removed files purged in the same call (at most [`MAX_DELETE_FILES`] in
    /// all): one durable index commit for all of them.
    #[prost(uint64, repeated, tag = "2")]
    pub more: Vec<u64>,
}

/// Most files one [`DeleteFileRequest`] names.
pub const MAX_DELETE_FILES: usize = 1024;

/// What was deleted.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteFileResponse {
    /// Shard versions deleted.
    #[prost(uint64, tag = "1")]
    pub deleted: u64,
}

/// Verify every stored shard.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScrubRequest {}

/// What scrub found.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScrubResponse {
    /// Shards verified.
    #[prost(uint64, tag = "1")]
    pub checked: u64,
    /// Shards that failed verification.
    #[prost(message, repeated, tag = "2")]
    pub corrupt: Vec<ShardId>,
}

/// Another node's shard of the same stripe, for repair.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ShardSource {
    /// Node address (ip:port).
    #[prost(string, tag = "1")]
    pub addr: String,
    /// Shard index it holds.
    #[prost(uint32, tag = "2")]
    pub shard: u32,
}

/// Rebuild this node's shard from the others.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RepairShardRequest {
    /// The shard to rebuild here.
    #[prost(message, optional, tag = "1")]
    pub id: Option<ShardId>,
    /// Its layout version.
    #[prost(uint64, tag = "2")]
    pub version: u64,
    /// Data shards per stripe.
    #[prost(uint32, tag = "3")]
    pub k: u32,
    /// Parity shards per stripe.
    #[prost(uint32, tag = "4")]
    pub m: u32,
    /// Stripe unit in bytes.
    #[prost(uint32, tag = "5")]
    pub unit: u32,
    /// Data bytes in the stripe.
    #[prost(uint64, tag = "6")]
    pub stripe_len: u64,
    /// Where the other shards are.
    #[prost(message, repeated, tag = "7")]
    pub sources: Vec<ShardSource>,
    /// Do nothing when this node already stores the shard at `version` (the rebuild
    /// scan asks again after a crash); false rewrites it (a scrub found it corrupt).
    #[prost(bool, tag = "8")]
    pub if_missing: bool,
}

/// Bytes rebuilt.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RepairShardResponse {
    /// Payload bytes of the rebuilt shard.
    #[prost(uint64, tag = "1")]
    pub bytes: u64,
}

/// Capacity and counters.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatRequest {}

/// Capacity and counters of a data node.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatResponse {
    /// Zones on the device.
    #[prost(uint32, tag = "1")]
    pub zones_total: u32,
    /// Empty zones.
    #[prost(uint32, tag = "2")]
    pub zones_free: u32,
    /// Shards stored.
    #[prost(uint64, tag = "3")]
    pub chunks: u64,
    /// Live record bytes.
    #[prost(uint64, tag = "4")]
    pub live_bytes: u64,
    /// Written bytes (live + garbage).
    #[prost(uint64, tag = "5")]
    pub written_bytes: u64,
    /// Device capacity.
    #[prost(uint64, tag = "6")]
    pub capacity_bytes: u64,
    /// GC write amplification since start.
    #[prost(double, tag = "7")]
    pub write_amplification: f64,
}

use shingle_transport::rpc;
rpc!(WriteShard, 0x0200, WriteShardRequest, WriteShardResponse);
rpc!(StageShard, 0x0201, StageShardRequest, StageShardResponse);
rpc!(DeleteShard, 0x0202, DeleteShardRequest, DeleteShardResponse);
rpc!(Scrub, 0x0203, ScrubRequest, ScrubResponse);
rpc!(RepairShard, 0x0204, RepairShardRequest, RepairShardResponse);
rpc!(Stat, 0x0205, StatRequest, StatResponse);
rpc!(DeleteFile, 0x0206, DeleteFileRequest, DeleteFileResponse);

/// errno-style application codes carried in error replies.
pub mod errno {
    /// No such shard.
    pub const ENOENT: u32 = 2;
    /// I/O error or corrupt shard.
    pub const EIO: u32 = 5;
    /// Shard too large.
    pub const EFBIG: u32 = 27;
    /// Device full.
    pub const ENOSPC: u32 = 28;
    /// Payload does not match its checksum.
    pub const EILSEQ: u32 = 84;
    /// The requested byte range lies outside the shard.
    pub const EINVAL: u32 = 22;
}
