//! The chunk service of a data node, on the transport.
//!
//! - `WriteShard`: append a shard durably (acknowledged only after group commit).
//! - `Resolve`: find a shard version, verify it, and stage its payload in a registered
//!   region; the reply carries the region key, so the client reads the bytes (all of
//!   them, or just the byte range it asked for) with the remote-read verb (one-sided
//!   RDMA READ where there is RDMA) and verifies the crc32c of what it read end to end.
//!   Staged payloads are an LRU cache bounded in bytes; evicting one revokes its key,
//!   and a rewrite or delete of that version revokes it at once. Versions are immutable
//!   and stored side by side (see the store), so a new version never disturbs readers
//!   of an older one.
//! - `DeleteShard`, `DeleteFile` (every shard of a removed file: its purge), `Scrub`,
//!   `Stat`.
//! - `RepairShard`: rebuild this node's copy of a shard from k other shards of its
//!   stripe, fetched from their nodes, and store it.
//!
//! Store I/O is blocking and runs on tokio's blocking pool.
//!
//! Traces: each request runs in a `data.<request>` span (ino, stripe, shard, bytes;
//! `staged` for a resolve answered from the stage cache), a child of the transport's
//! `rpc.server` span and so of the caller's operation.

use crate::chunk::ChunkKey;
use crate::ec::EcPolicy;
use crate::store::{ChunkStore, StoreError, VKey};
use crate::zone::ZonedDevice;
use bytes::{Bytes, BytesMut};
use shingle_transport::{CallContext, RegionKey, RegionTable, RemoteRead, Router, RpcChannel, Status, TransportError};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tracing::field::Empty;
use tracing::{Instrument, Span, info_span};

/// A handler span named `$name` for shard `$id` (an `Option<ShardId>`).
macro_rules! shard_span {
    ($name:literal, $id:expr $(, $($field:tt)*)?) => {{
        let id = $id.unwrap_or_default();
        info_span!($name, ino = id.ino, stripe = id.stripe, shard = id.shard $(, $($field)*)?)
    }};
}

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
pub struct ResolveRequest {
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
    /// a small read instead of a resolve and a remote read.
    #[prost(bool, tag = "5")]
    pub inline: bool,
}

/// Largest byte range a resolve answers inline.
pub const INLINE_MAX: u64 = 128 << 10;

/// A staged shard: read `payload_len` bytes at offset 0 of the region.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResolveResponse {
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
}

impl ResolveResponse {
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
}

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
rpc!(Resolve, 0x0201, ResolveRequest, ResolveResponse);
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

fn status(e: StoreError) -> Status {
    let code = match &e {
        StoreError::NotFound(_) => errno::ENOENT,
        StoreError::NoSpace => errno::ENOSPC,
        StoreError::BadChecksum { .. } => errno::EILSEQ,
        StoreError::TooLarge(_) => errno::EFBIG,
        _ => errno::EIO,
    };
    Status::application(code, e.to_string())
}

fn missing_id() -> Status {
    Status::new(shingle_transport::Code::InvalidRequest, "shard id missing")
}

/// Staged payloads, bounded in bytes, each registered as a region.
struct StageCache {
    budget: u64,
    used: u64,
    entries: HashMap<VKey, (RegionKey, u32, Bytes)>,
    order: VecDeque<VKey>,
}

impl StageCache {
    fn get(&self, vk: &VKey) -> Option<(RegionKey, u32, Bytes)> {
        self.entries.get(vk).cloned()
    }

    /// Drops the staged copy of version `version` of `key` (every version for `None`).
    fn invalidate(&mut self, regions: &RegionTable, key: &ChunkKey, version: Option<u64>) {
        let gone: Vec<VKey> = self
            .entries
            .keys()
            .filter(|(k, v)| k == key && version.is_none_or(|w| w == *v))
            .copied()
            .collect();
        for vk in gone {
            if let Some((r, _, _)) = self.entries.remove(&vk) {
                regions.revoke(r);
                self.used = self.used.saturating_sub(r.len);
                self.order.retain(|k| *k != vk);
            }
        }
    }

    fn insert(&mut self, regions: &RegionTable, vk: VKey, payload: Bytes, crc: u32) -> RegionKey {
        self.invalidate(regions, &vk.0, Some(vk.1));
        while self.used + payload.len() as u64 > self.budget {
            let Some(old) = self.order.pop_front() else { break };
            if let Some((r, _, _)) = self.entries.remove(&old) {
                regions.revoke(r);
                self.used = self.used.saturating_sub(r.len);
            }
        }
        let r = regions.register(payload.clone());
        self.used += r.len;
        self.entries.insert(vk, (r, crc, payload));
        self.order.push_back(vk);
        r
    }
}

/// The chunk service of one node.
pub struct ChunkService<D: ZonedDevice + 'static, C> {
    store: Arc<ChunkStore<D>>,
    regions: Arc<RegionTable>,
    stage: Mutex<StageCache>,
    peers: C,
}

impl<D, C> ChunkService<D, C>
where
    D: ZonedDevice + 'static,
    C: RpcChannel + RemoteRead + Clone + Send + Sync + 'static,
{
    /// A service over `store`, staging reads in `regions` (at most `stage_bytes`), using
    /// `peers` to fetch shards from other nodes for repair.
    pub fn new(store: Arc<ChunkStore<D>>, regions: Arc<RegionTable>, stage_bytes: u64, peers: C) -> Arc<Self> {
        Arc::new(ChunkService {
            store,
            regions,
            stage: Mutex::new(StageCache {
                budget: stage_bytes,
                used: 0,
                entries: HashMap::new(),
                order: VecDeque::new(),
            }),
            peers,
        })
    }

    /// The store.
    pub fn store(&self) -> &Arc<ChunkStore<D>> {
        &self.store
    }

    fn stage(&self) -> std::sync::MutexGuard<'_, StageCache> {
        self.stage.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&ChunkStore<D>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, Status> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| Status::new(shingle_transport::Code::Internal, format!("store task failed: {e}")))?
            .map_err(status)
    }

    async fn write(&self, req: WriteShardRequest) -> Result<WriteShardResponse, Status> {
        let span = shard_span!("data.write", req.id, bytes = req.data.len());
        self.write_inner(req).instrument(span).await
    }

    async fn write_inner(&self, req: WriteShardRequest) -> Result<WriteShardResponse, Status> {
        let key = req.id.ok_or_else(missing_id)?.key()?;
        self.stage().invalidate(&self.regions, &key, Some(req.version));
        let loc = self
            .blocking(move |s| match s.put(key, req.version, &req.data, req.crc) {
                // Full of garbage is not full: collect what any zone has, then retry once.
                Err(StoreError::NoSpace) => {
                    let r = s.gc(4, 0.05)?;
                    if r.zones_reset.is_empty() {
                        return Err(StoreError::NoSpace);
                    }
                    s.put(key, req.version, &req.data, req.crc)
                }
                r => r,
            })
            .await?;
        Ok(WriteShardResponse {
            zone: loc.zone.0,
            offset: loc.offset,
        })
    }

    async fn resolve(&self, req: ResolveRequest) -> Result<ResolveResponse, Status> {
        let span = shard_span!("data.resolve", req.id, bytes = Empty, staged = Empty);
        self.resolve_inner(req).instrument(span).await
    }

    async fn resolve_inner(&self, req: ResolveRequest) -> Result<ResolveResponse, Status> {
        let key = req.id.ok_or_else(missing_id)?.key()?;
        let version = if req.version != 0 {
            req.version
        } else {
            // The newest stored version.
            self.store
                .lookup(&key)
                .map(|e| e.version)
                .ok_or_else(|| Status::application(errno::ENOENT, format!("{key} not found")))?
        };
        let hit = self.stage().get(&(key, version));
        Span::current().record("staged", hit.is_some());
        let (r, crc, payload) = match hit {
            Some(h) => h,
            None => {
                let (h, payload) = self.blocking(move |s| s.get_version(&key, version)).await?;
                let r = self
                    .stage()
                    .insert(&self.regions, (key, version), payload.clone(), h.payload_crc);
                (r, h.payload_crc, payload)
            }
        };
        let mut data = Bytes::new();
        let range_crc = if req.range_len == 0 {
            crc
        } else {
            let end = req.range_offset.checked_add(req.range_len).filter(|e| *e <= r.len);
            let Some(end) = end else {
                return Err(Status::application(
                    errno::EINVAL,
                    format!(
                        "{key} v{version}: range {}+{} outside its {} bytes",
                        req.range_offset, req.range_len, r.len
                    ),
                ));
            };
            let range = payload.slice(req.range_offset as usize..end as usize);
            let c = crc32c::crc32c(&range);
            if req.inline && req.range_len <= INLINE_MAX {
                data = range;
            }
            c
        };
        Span::current().record("bytes", r.len);
        Ok(ResolveResponse {
            region: r.region,
            generation: r.generation,
            region_len: r.len,
            crc,
            version,
            range_crc,
            data,
        })
    }

    async fn delete(&self, req: DeleteShardRequest) -> Result<DeleteShardResponse, Status> {
        let span = shard_span!("data.delete", req.id);
        self.delete_inner(req).instrument(span).await
    }

    async fn delete_inner(&self, req: DeleteShardRequest) -> Result<DeleteShardResponse, Status> {
        let key = req.id.ok_or_else(missing_id)?.key()?;
        let version = (req.version != 0).then_some(req.version);
        self.stage().invalidate(&self.regions, &key, version);
        let existed = self.blocking(move |s| s.delete_if(&key, version)).await?;
        Ok(DeleteShardResponse { existed })
    }

    async fn delete_file(&self, req: DeleteFileRequest) -> Result<DeleteFileResponse, Status> {
        let span = tracing::info_span!("data.delete_file", ino = req.ino, deleted = Empty);
        async move {
            let ino = req.ino;
            let gone = self.blocking(move |s| s.delete_ino(ino)).await?;
            let mut stage = self.stage();
            for (key, version) in &gone {
                stage.invalidate(&self.regions, key, Some(*version));
            }
            drop(stage);
            Span::current().record("deleted", gone.len());
            Ok(DeleteFileResponse {
                deleted: gone.len() as u64,
            })
        }
        .instrument(span)
        .await
    }

    async fn repair(&self, req: RepairShardRequest) -> Result<RepairShardResponse, Status> {
        let span = shard_span!("data.repair", req.id, sources = req.sources.len(), bytes = Empty);
        self.repair_inner(req).instrument(span).await
    }

    async fn repair_inner(&self, req: RepairShardRequest) -> Result<RepairShardResponse, Status> {
        let bad = |m: String| Status::new(shingle_transport::Code::InvalidRequest, m);
        let key = req.id.ok_or_else(missing_id)?.key()?;
        let k = u8::try_from(req.k).map_err(|_| bad("k out of range".into()))?;
        let m = u8::try_from(req.m).map_err(|_| bad("m out of range".into()))?;
        let policy = EcPolicy::new(k, m, req.unit).map_err(|e| bad(e.to_string()))?;
        let stripe_len = usize::try_from(req.stripe_len).map_err(|_| bad("stripe too large".into()))?;
        let n = usize::from(k) + usize::from(m);
        let want = usize::from(key.shard);
        if want >= n {
            return Err(bad(format!("shard {want} is not in a {k}+{m} stripe")));
        }
        // Each source may cost a connection attempt: a stripe has at most n of them.
        if req.sources.len() > n {
            return Err(bad(format!("{} sources for a {k}+{m} stripe", req.sources.len())));
        }
        if req.if_missing && self.store.lookup_version(&key, req.version).is_some() {
            return Ok(RepairShardResponse { bytes: 0 });
        }
        let mut shards: Vec<Option<Bytes>> = vec![None; n];
        let mut have = 0;
        for src in &req.sources {
            if have >= usize::from(k) {
                break;
            }
            let idx = src.shard as usize;
            if idx >= n || idx == want || shards[idx].is_some() {
                continue;
            }
            let Ok(addr) = src.addr.parse::<SocketAddr>() else {
                continue;
            };
            let id = ShardId {
                ino: key.ino,
                stripe: key.stripe,
                shard: src.shard,
            };
            match read_shard(&self.peers, addr, id, req.version).await {
                Ok(b) => {
                    shards[idx] = Some(b);
                    have += 1;
                }
                Err(e) => tracing::debug!(source = %addr, shard = idx, error = %e, "repair source failed"),
            }
        }
        let rebuilt = policy
            .reconstruct_shard(stripe_len, &shards, want)
            .map_err(|e| Status::application(errno::EIO, format!("cannot rebuild {key}: {e}")))?;
        let crc = crc32c::crc32c(&rebuilt);
        let len = rebuilt.len() as u64;
        let version = req.version;
        self.stage().invalidate(&self.regions, &key, Some(version));
        // A repair rewrites the same version, which replaces the corrupt copy.
        self.blocking(move |s| s.put(key, version, &rebuilt, crc)).await?;
        Span::current().record("bytes", len);
        tracing::info!(%key, bytes = len, "shard repaired");
        Ok(RepairShardResponse { bytes: len })
    }

    /// The service's handlers, to merge into a node's router.
    pub fn router(self: &Arc<Self>) -> Router {
        let s = self.clone();
        let w = move |_: CallContext, r: WriteShardRequest| {
            let s = s.clone();
            async move { s.write(r).await }
        };
        let s = self.clone();
        let rs = move |_: CallContext, r: ResolveRequest| {
            let s = s.clone();
            async move { s.resolve(r).await }
        };
        let s = self.clone();
        let d = move |_: CallContext, r: DeleteShardRequest| {
            let s = s.clone();
            async move { s.delete(r).await }
        };
        let s = self.clone();
        let df = move |_: CallContext, r: DeleteFileRequest| {
            let s = s.clone();
            async move { s.delete_file(r).await }
        };
        let s = self.clone();
        let sc = move |_: CallContext, _: ScrubRequest| {
            let s = s.clone();
            async move {
                let r = s.blocking(|st| Ok(st.scrub())).await?;
                Ok(ScrubResponse {
                    checked: r.checked,
                    corrupt: r.corrupt.into_iter().map(ShardId::from).collect(),
                })
            }
        };
        let s = self.clone();
        let rp = move |_: CallContext, r: RepairShardRequest| {
            let s = s.clone();
            async move { s.repair(r).await }
        };
        let s = self.clone();
        let st = move |_: CallContext, _: StatRequest| {
            let s = s.clone();
            async move {
                let st = s.blocking(|st| Ok(st.stats())).await?;
                Ok(StatResponse {
                    zones_total: st.zones_total,
                    zones_free: st.zones_free,
                    chunks: st.chunks,
                    live_bytes: st.live_bytes,
                    written_bytes: st.written_bytes,
                    capacity_bytes: st.capacity_bytes,
                    write_amplification: st.write_amplification(),
                })
            }
        };
        Router::new()
            .rpc::<WriteShard, _, _>(w)
            .rpc::<Resolve, _, _>(rs)
            .rpc::<DeleteShard, _, _>(d)
            .rpc::<Scrub, _, _>(sc)
            .rpc::<RepairShard, _, _>(rp)
            .rpc::<Stat, _, _>(st)
            .rpc::<DeleteFile, _, _>(df)
    }
}

/// Why a shard read failed on the client side.
#[derive(Debug, thiserror::Error)]
pub enum ShardReadError {
    /// Transport failure or error reply.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The bytes read do not match the shard's checksum.
    #[error("shard {0:?} failed its checksum after transfer")]
    Checksum(ShardId),
}

impl ShardReadError {
    /// The errno the node answered with, if it answered.
    pub fn errno(&self) -> Option<u32> {
        match self {
            ShardReadError::Transport(e) => e
                .status()
                .filter(|s| s.code == shingle_transport::Code::Application)
                .map(|s| s.app_code),
            ShardReadError::Checksum(_) => None,
        }
    }
}

/// Reads one shard from `node`: resolve, then remote-read the staged region, then
/// verify the crc32c end to end. A staged copy evicted between the two steps is
/// resolved again (bounded).
pub async fn read_shard<C: RpcChannel + RemoteRead>(
    client: &C,
    node: SocketAddr,
    id: ShardId,
    version: u64,
) -> Result<Bytes, ShardReadError> {
    read_shard_range(client, node, id, version, 0, 0).await
}

/// Reads `len` bytes at `offset` of one shard version from `node` (`len` 0: the whole
/// shard), verified end to end against the crc32c the node computed of that range.
pub async fn read_shard_range<C: RpcChannel + RemoteRead>(
    client: &C,
    node: SocketAddr,
    id: ShardId,
    version: u64,
    offset: u64,
    len: u64,
) -> Result<Bytes, ShardReadError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let inline = len > 0 && len <= INLINE_MAX;
        let req = ResolveRequest {
            id: Some(id),
            version,
            range_offset: offset,
            range_len: len,
            inline,
        };
        let r = client.call::<Resolve>(node, &req, Default::default()).await?;
        if inline && r.data.len() as u64 == len {
            if crc32c::crc32c(&r.data) != r.range_crc {
                return Err(ShardReadError::Checksum(id));
            }
            return Ok(r.data);
        }
        let (off, want) = if len == 0 { (0, r.region_len) } else { (offset, len) };
        // The buffer is sized from the answer: no shard is larger than a chunk payload.
        let want = u32::try_from(want)
            .ok()
            .filter(|w| *w <= crate::chunk::MAX_CHUNK_PAYLOAD)
            .ok_or(ShardReadError::Checksum(id))?;
        let (res, buf) = client
            .read(node, r.key(), off, want, BytesMut::with_capacity(want as usize))
            .await;
        match res {
            Ok(()) => {
                if crc32c::crc32c(&buf) != r.range_crc {
                    return Err(ShardReadError::Checksum(id));
                }
                return Ok(buf.freeze());
            }
            Err(TransportError::Access(_)) if attempt < 3 => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes one shard to `node`; returns once it is durable there.
pub async fn write_shard<C: RpcChannel>(
    client: &C,
    node: SocketAddr,
    id: ShardId,
    version: u64,
    data: Bytes,
) -> Result<WriteShardResponse, TransportError> {
    let crc = crc32c::crc32c(&data);
    client
        .call::<WriteShard>(
            node,
            &WriteShardRequest {
                id: Some(id),
                version,
                crc,
                data,
            },
            Default::default(),
        )
        .await
}
