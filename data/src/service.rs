//! The chunk service of a data node, on the transport.
//!
//! - `WriteShard`: append a shard durably (acknowledged only after group commit).
//! - `StageShard`: find a shard version, verify it, and stage its payload in a region
//!   registered for its file; the reply carries the region key (and over RDMA a grant of
//!   the asked range in the caller's read window), so the client reads the bytes (all
//!   of them, or just the byte range it asked for) with one RDMA READ of the grant, or
//!   the remote-read verb over TCP (a client key showing its capability again), and
//!   verifies the crc32c of what it read end to end.
//!   Staged payloads are an LRU cache bounded in bytes; evicting one revokes its key,
//!   and a rewrite or delete of that version revokes it at once. Versions are immutable
//!   and stored side by side (see the store), so a new version never disturbs readers
//!   of an older one.
//! - `DeleteShard`, `DeleteFile` (every shard of a removed file: its purge), `Scrub`,
//!   `Stat`.
//! - `RepairShard`: rebuild this node's copy of a shard from k other shards of its
//!   stripe, fetched from their nodes, and store it.
//!
//! A caller with a client key must show a shard capability for the file: a write one
//! to write or delete its shards, any to stage them (`shingle_transport::cap`).
//!
//! Store I/O is blocking and runs on tokio's blocking pool.
//!
//! Traces: each request runs in a `data.<request>` span (ino, stripe, shard, bytes;
//! `staged` for a stage answered from the stage cache), a child of the transport's
//! `rpc.server` span and so of the caller's operation.

use crate::chunk::ChunkKey;
use crate::ec::EcPolicy;
use crate::shard::read_shard;
use crate::store::{ChunkStore, StoreError, VKey};
use crate::wire::*;
use crate::zone::ZonedDevice;
use bytes::Bytes;
use parking_lot::Mutex;
use shingle_transport::auth::Principal;
use shingle_transport::cap::{CapError, CapKey, Right};
use shingle_transport::{CallContext, RegionKey, RegionTable, RemoteRead, Router, RpcChannel, Status, Window};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use tracing::field::Empty;
use tracing::{Instrument, Span, debug, info_span};

/// A handler span named `$name` for shard `$id` (an `Option<ShardId>`).
macro_rules! shard_span {
    ($name:literal, $id:expr $(, $($field:tt)*)?) => {{
        let id = $id.unwrap_or_default();
        info_span!($name, ino = id.ino, stripe = id.stripe, shard = id.shard $(, $($field)*)?)
    }};
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
        let r = regions.register_for(payload.clone(), vk.0.ino);
        self.used += r.len;
        self.entries.insert(vk, (r, crc, payload));
        self.order.push_back(vk);
        r
    }
}

/// A staged shard: the reply so far and the bytes it asks for (the asked range, or the
/// whole payload when no range was asked).
struct Staged {
    reply: StageShardResponse,
    range: Bytes,
}

/// The chunk service of one node.
pub struct ChunkService<D: ZonedDevice + 'static, C> {
    store: Arc<ChunkStore<D>>,
    regions: Arc<RegionTable>,
    stage: Mutex<StageCache>,
    peers: C,
    caps: Option<CapKey>,
}

impl<D, C> ChunkService<D, C>
where
    D: ZonedDevice + 'static,
    C: RpcChannel + RemoteRead + Clone + Send + Sync + 'static,
{
    /// A service over `store`, staging reads in `regions` (at most `stage_bytes`), using
    /// `peers` to fetch shards from other nodes for repair. `caps` checks the shard
    /// capabilities callers with a client key must show to stage, write or delete a
    /// shard ([`shingle_transport::cap`]); without it such callers may do none of these.
    pub fn new(
        store: Arc<ChunkStore<D>>,
        regions: Arc<RegionTable>,
        stage_bytes: u64,
        peers: C,
        caps: Option<CapKey>,
    ) -> Arc<Self> {
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
            caps,
        })
    }

    /// A caller with a client key must show a capability giving `need` on the shard's
    /// file; callers holding the cluster secret need none.
    fn check_cap(&self, ctx: &CallContext, id: Option<&ShardId>, cap: &[u8], need: Right) -> Result<(), Status> {
        if !matches!(*ctx.principal, Principal::Client(_)) {
            return Ok(());
        }
        let ino = id.ok_or_else(missing_id)?.ino;
        let r = match &self.caps {
            Some(k) => k.check(cap, ino, need, shingle_transport::cap::unix_now()),
            None => Err(CapError::Missing),
        };
        r.map_err(|e| {
            debug!(ino, error = %e, "shard capability refused");
            Status::new(shingle_transport::Code::PermissionDenied, e.to_string())
        })
    }

    /// The store.
    pub fn store(&self) -> &Arc<ChunkStore<D>> {
        &self.store
    }

    fn stage(&self) -> parking_lot::MutexGuard<'_, StageCache> {
        self.stage.lock()
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

    /// Stages a shard version; over RDMA the asked range (or whole payload) is also
    /// placed in the caller's read `window` and granted, so the caller reads it with one
    /// READ and no further request.
    async fn stage_shard(
        &self,
        req: StageShardRequest,
        window: Option<&dyn Window>,
    ) -> Result<StageShardResponse, Status> {
        let span = shard_span!("data.stage", req.id, bytes = Empty, staged = Empty, granted = Empty);
        let Staged { mut reply, range } = self.stage_inner(&req).instrument(span.clone()).await?;
        if let Some(w) = window
            && reply.data.is_empty()
        {
            // No room: no grant, and the caller reads the range by the region key.
            reply.grant = w.place(&range);
            span.record("granted", reply.grant.is_some());
        }
        Ok(reply)
    }

    async fn stage_inner(&self, req: &StageShardRequest) -> Result<Staged, Status> {
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
        let (range_crc, range) = if req.range_len == 0 {
            (crc, payload)
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
                data = range.clone();
            }
            (c, range)
        };
        Span::current().record("bytes", r.len);
        Ok(Staged {
            reply: StageShardResponse {
                region: r.region,
                generation: r.generation,
                region_len: r.len,
                crc,
                version,
                range_crc,
                data,
                grant: None,
            },
            range,
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
        let span = tracing::info_span!(
            "data.delete_file",
            ino = req.ino,
            files = 1 + req.more.len(),
            deleted = Empty
        );
        async move {
            if 1 + req.more.len() > crate::wire::MAX_DELETE_FILES {
                return Err(Status::new(
                    shingle_transport::Code::InvalidRequest,
                    format!("a delete names at most {} files", crate::wire::MAX_DELETE_FILES),
                ));
            }
            let mut inos = req.more;
            inos.push(req.ino);
            let gone = self.blocking(move |s| s.delete_inos(&inos)).await?;
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
            // A node's own call: it holds the cluster secret, no capability needed.
            match read_shard(&self.peers, addr, id, req.version, &Bytes::new()).await {
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

    /// The service's handlers, to merge into a node's router, with the capability key
    /// remote reads of staged shards by client keys are checked with.
    pub fn router(self: &Arc<Self>) -> Router {
        let s = self.clone();
        let w = move |ctx: CallContext, r: WriteShardRequest| {
            let s = s.clone();
            async move {
                s.check_cap(&ctx, r.id.as_ref(), &r.cap, Right::Write)?;
                s.write(r).await
            }
        };
        let s = self.clone();
        let rs = move |ctx: CallContext, r: StageShardRequest| {
            let s = s.clone();
            async move {
                s.check_cap(&ctx, r.id.as_ref(), &r.cap, Right::Read)?;
                s.stage_shard(r, ctx.window.as_deref()).await
            }
        };
        let s = self.clone();
        let d = move |ctx: CallContext, r: DeleteShardRequest| {
            let s = s.clone();
            async move {
                s.check_cap(&ctx, r.id.as_ref(), &r.cap, Right::Write)?;
                s.delete(r).await
            }
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
        let router = Router::new()
            .rpc::<WriteShard, _, _>(w)
            .rpc::<StageShard, _, _>(rs)
            .rpc::<DeleteShard, _, _>(d)
            .rpc::<Scrub, _, _>(sc)
            .rpc::<RepairShard, _, _>(rp)
            .rpc::<Stat, _, _>(st)
            .rpc::<DeleteFile, _, _>(df);
        // Staged shards are registered for their file: a client key reads one over TCP
        // only with a capability for that file, as it stages it.
        match &self.caps {
            Some(k) => router.region_caps(k.clone()),
            None => router,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreOptions;
    use crate::zone::Geometry;
    use crate::zone::file::FileZonedDevice;
    use shingle_transport::window::WindowAlloc;
    use shingle_transport::{ClusterSecret, Grant, PeerClient, TransportConfig};

    /// A window in plain memory: what the RDMA export does, without the NIC.
    #[derive(Debug)]
    struct MemWindow {
        alloc: Mutex<WindowAlloc>,
        mem: Mutex<Vec<u8>>,
        next: std::sync::atomic::AtomicU64,
    }

    impl Window for MemWindow {
        fn place(&self, bytes: &[u8]) -> Option<Grant> {
            let token = 1 + self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let len = u32::try_from(bytes.len()).ok()?;
            let at = self.alloc.lock().place(len, token)?;
            self.mem.lock()[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
            Some(Grant {
                addr: u64::from(at),
                rkey: 1,
                len,
                token,
                qpn: 1,
            })
        }
    }

    fn read(w: &MemWindow, g: &Grant) -> Vec<u8> {
        w.mem.lock()[g.addr as usize..(g.addr + u64::from(g.len)) as usize].to_vec()
    }

    /// A data node's service over a file-emulated zoned device holding one shard.
    fn service(dir: &std::path::Path, key: ChunkKey, payload: &[u8]) -> Arc<ChunkService<FileZonedDevice, PeerClient>> {
        let geometry = Geometry {
            zone_count: 8,
            zone_capacity: 1 << 20,
            block_size: 4096,
            max_open_zones: 0,
        };
        let dev = FileZonedDevice::open_or_create(&dir.join("dev"), geometry).expect("device");
        let store = ChunkStore::open(dev, &dir.join("index.redb"), StoreOptions::default()).expect("store");
        store.put(key, 1, payload, crc32c::crc32c(payload)).expect("put");
        let peers = PeerClient::new(TransportConfig::default(), ClusterSecret::generate().expect("secret"));
        ChunkService::new(Arc::new(store), Arc::new(RegionTable::new()), 1 << 20, peers, None)
    }

    #[tokio::test]
    async fn a_stage_over_rdma_grants_the_range_asked_or_the_whole_payload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = ChunkKey {
            ino: 9,
            stripe: 0,
            shard: 1,
        };
        let payload: Vec<u8> = (0..600u32).map(|i| (i * 7) as u8).collect();
        let svc = service(dir.path(), key, &payload);
        let w = MemWindow {
            alloc: Mutex::new(WindowAlloc::new(1000)),
            mem: Mutex::new(vec![0; 1000]),
            next: Default::default(),
        };
        let ask = |offset, len, inline| StageShardRequest {
            id: Some(ShardId {
                ino: key.ino,
                stripe: key.stripe,
                shard: u32::from(key.shard),
            }),
            version: 1,
            range_offset: offset,
            range_len: len,
            inline,
            cap: Bytes::new(),
        };
        let r = svc
            .stage_shard(ask(100, 250, false), Some(&w))
            .await
            .expect("stage a range");
        let g = r.grant.expect("a range over RDMA is granted");
        assert_eq!(read(&w, &g), payload[100..350]);
        assert_eq!(crc32c::crc32c(&read(&w, &g)), r.range_crc);
        let r = svc.stage_shard(ask(0, 0, false), Some(&w)).await.expect("stage it all");
        assert_eq!(read(&w, &r.grant.expect("the whole payload")), payload);
        let r = svc.stage_shard(ask(0, 10, true), Some(&w)).await.expect("inline");
        assert_eq!((r.data.len(), r.grant), (10, None), "answered inline: nothing to grant");
        let r = svc
            .stage_shard(ask(0, 0, false), Some(&w))
            .await
            .expect("a full window");
        assert_eq!(r.grant, None, "no room: no grant, the region key still answers");
        let r = svc.stage_shard(ask(0, 0, false), None).await.expect("over TCP");
        assert_eq!(r.grant, None);
    }
}
