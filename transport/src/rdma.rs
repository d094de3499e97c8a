//! One-sided RDMA READ over RoCE reliable-connection queue pairs (cargo feature `rdma`).
//!
//! **What goes over RDMA**: the remote-read verb. A client reads registered regions of a
//! server (staged shards, mmap'd chunk files) with one-sided RDMA READ into registered
//! buffers it owns; the server's CPU does not touch the bytes. RPCs, the queue-pair
//! handshake and key resolution stay on the authenticated TCP connection (decision 0010).
//!
//! **Setup** only through an authenticated TCP connection: the client creates an RC queue
//! pair, sends its number, PSN and GID in an `RDMA_CONNECT` request; the server creates
//! its side, moves it to ready-to-send and answers with its own. Region keys become
//! (address, rkey) through `RDMA_RESOLVE`, which registers the region's memory (remote
//! read only) the first time; revoking a region deregisters it, so a stale rkey gets a
//! remote access error from the NIC, as the TCP path answers `StaleGeneration`.
//!
//! **Completions** arrive on a completion channel whose file descriptor tokio watches
//! ([`tokio::io::unix::AsyncFd`]); each read waits on a oneshot. **Buffers** are owned:
//! a read lands in a registered bounce buffer of the connection's pool and is copied into
//! the caller's `BytesMut`, so the NIC never writes memory the caller has back.
//!
//! **Failures**: a completion error (remote access error, retry exceeded, flush) is a
//! typed [`RdmaError`]; the queue pair is dropped, the read is redone over TCP, and that
//! peer stays on TCP for [`FALLBACK_FOR`] with one log line saying why; the next read
//! after it re-establishes a queue pair. With no RDMA library or device a node runs on
//! TCP and says so once ([`Device::open`] returns [`Unavailable`]).
#![allow(unsafe_code)]

use crate::client::TcpClient;
use crate::error::TransportError;
use crate::frame::MsgKind;
use crate::region::{RegionKey, RegionTable};
use crate::rpc::{CallOptions, ReadOutcome, RpcChannel};
use crate::server::{CallContext, Router};
use crate::status::{Code, Status};
use bytes::{Bytes, BytesMut};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionChannel, CompletionQueue, GenericCompletionQueue, WorkCompletionStatus,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, SetScatterGatherEntry,
    WorkRequestFlags,
};
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::{Semaphore, oneshot};
use tracing::{debug, info, warn};

/// How long a peer whose queue pair failed is read over TCP before RDMA is tried again.
pub const FALLBACK_FOR: Duration = Duration::from_secs(30);

/// The same after a remote access error: usually a region revoked between resolving its
/// key and reading it (a staged shard evicted), not a sick fabric.
pub const ACCESS_FALLBACK_FOR: Duration = Duration::from_secs(1);

/// Resolved keys kept per reader (staged regions come and go; the oldest are dropped).
const MAX_RESOLVED: usize = 4096;

/// Bytes of one bounce buffer (and at most one work request).
pub const BOUNCE_BYTES: usize = 1 << 20;

/// Bounce buffers per connection (reads beyond wait: back-pressure).
const BOUNCE_BUFFERS: usize = 32;

/// Work requests in flight per queue pair.
const SEND_DEPTH: u32 = 64;

/// RDMA READs a queue pair may have outstanding as initiator / responder.
const READ_DEPTH: u8 = 16;

/// Queue pairs a server keeps at most (the oldest are closed first).
const MAX_SERVER_QPS: usize = 4096;

/// Message kind of the queue-pair handshake (transport-reserved).
pub const RDMA_CONNECT: MsgKind = MsgKind(3);
/// Message kind of region-key resolution (transport-reserved).
pub const RDMA_RESOLVE: MsgKind = MsgKind(4);

/// Which device and port to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaConfig {
    /// Device name (e.g. `mlx5_0`, `rxe0`); the first device when `None`.
    pub device: Option<String>,
    /// Port number (1-based).
    pub port: u8,
    /// GID index (RoCEv2 over IPv4 is usually 1 on soft-RoCE, 3 on ConnectX).
    pub gid_index: u32,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            device: None,
            port: 1,
            gid_index: 1,
        }
    }
}

/// Why this host cannot use RDMA (it then runs on TCP).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// libibverbs is missing or the kernel has no RDMA support (ENOSYS).
    #[error("no RDMA support on this host (libibverbs or kernel): {0}")]
    NoSupport(String),
    /// The device list is empty.
    #[error("no RDMA device on this host")]
    NoDevice,
    /// The named device does not exist (ENODEV).
    #[error("RDMA device {wanted} not found (devices: {have})")]
    NotFound {
        /// The configured name.
        wanted: String,
        /// The devices present.
        have: String,
    },
    /// The device exists but cannot be used (port down, no such GID, ...).
    #[error("RDMA device {device} cannot be used: {why}")]
    Unusable {
        /// The device.
        device: String,
        /// Why.
        why: String,
    },
}

/// A failure of the RDMA path to one peer (the read is then redone over TCP).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmaError {
    /// A work request completed with an error status.
    #[error("work completion {status:?} (vendor error {vendor_err:#x})")]
    Completion {
        /// The status, e.g. `RemoteAccessError`, `RetryCounterExceededError`.
        status: String,
        /// The provider's code.
        vendor_err: u32,
    },
    /// Posting a work request failed.
    #[error("cannot post a work request: {0}")]
    Post(String),
    /// The queue-pair handshake failed.
    #[error("cannot set up a queue pair: {0}")]
    Setup(String),
    /// The peer does not offer RDMA (its server runs on TCP only).
    #[error("peer serves no RDMA")]
    NotOffered,
    /// No completion within the deadline.
    #[error("no completion within {0:?}")]
    Timeout(Duration),
}

// ---------------------------------------------------------------- wire

/// One side of a queue pair, exchanged over TCP.
#[derive(Clone, PartialEq, prost::Message)]
pub struct QpInfo {
    /// Queue pair number.
    #[prost(uint32, tag = "1")]
    pub qpn: u32,
    /// First packet sequence number.
    #[prost(uint32, tag = "2")]
    pub psn: u32,
    /// GID (16 bytes).
    #[prost(bytes = "vec", tag = "3")]
    pub gid: Vec<u8>,
    /// The client's session (a reconnect replaces the session's old queue pair).
    #[prost(uint64, tag = "4")]
    pub session: u64,
    /// Active path MTU in bytes.
    #[prost(uint32, tag = "5")]
    pub mtu: u32,
}

/// A region key to resolve.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResolveRequest {
    /// Region slot.
    #[prost(uint32, tag = "1")]
    pub region: u32,
    /// Generation.
    #[prost(uint32, tag = "2")]
    pub generation: u32,
    /// Length named by the key.
    #[prost(uint64, tag = "3")]
    pub key_len: u64,
}

/// Where a region is, for RDMA READ.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Resolved {
    /// Virtual address of byte 0.
    #[prost(uint64, tag = "1")]
    pub addr: u64,
    /// Remote key.
    #[prost(uint32, tag = "2")]
    pub rkey: u32,
    /// Readable bytes.
    #[prost(uint64, tag = "3")]
    pub len: u64,
}

// ---------------------------------------------------------------- device

/// An opened device with its protection domain.
pub struct Device {
    name: String,
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    port: u8,
    gid_index: u32,
    gid: Gid,
    mtu: Mtu,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .finish()
    }
}

fn mtu_bytes(m: Mtu) -> u32 {
    match m {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}

fn mtu_of(bytes: u32) -> Mtu {
    match bytes {
        0..=256 => Mtu::Mtu256,
        257..=512 => Mtu::Mtu512,
        513..=1024 => Mtu::Mtu1024,
        1025..=2048 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

impl Device {
    /// Opens the configured device. Errors say why RDMA cannot be used here.
    pub fn open(cfg: &RdmaConfig) -> Result<Arc<Device>, Unavailable> {
        let list = DeviceList::new().map_err(|e| {
            let src = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
            Unavailable::NoSupport(format!("{e}: {src}"))
        })?;
        let names: Vec<String> = list.iter().map(|d| d.name()).collect();
        if names.is_empty() {
            return Err(Unavailable::NoDevice);
        }
        let dev = match &cfg.device {
            Some(want) => list
                .iter()
                .find(|d| d.name() == *want)
                .ok_or_else(|| Unavailable::NotFound {
                    wanted: want.clone(),
                    have: names.join(", "),
                })?,
            None => list.iter().next().ok_or(Unavailable::NoDevice)?,
        };
        let name = dev.name();
        let unusable = |why: String| Unavailable::Unusable {
            device: name.clone(),
            why,
        };
        let ctx = dev.open().map_err(|e| unusable(format!("open: {e}")))?;
        let port = ctx
            .query_port(cfg.port)
            .map_err(|e| unusable(format!("port {}: {e}", cfg.port)))?;
        let mtu = port.active_mtu();
        let gid = ctx
            .query_gid(cfg.port, cfg.gid_index)
            .map_err(|e| unusable(format!("GID index {}: {e}", cfg.gid_index)))?;
        if Ipv6Addr::from(gid).is_unspecified() {
            return Err(unusable(format!(
                "GID index {} is empty (no address on the netdev?)",
                cfg.gid_index
            )));
        }
        let pd = ctx
            .alloc_pd()
            .map_err(|e| unusable(format!("protection domain: {e}")))?;
        Ok(Arc::new(Device {
            name,
            ctx,
            pd,
            port: cfg.port,
            gid_index: cfg.gid_index,
            gid,
            mtu,
        }))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Registers `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The memory must stay valid (and, for local writes, exclusively ours) while the
    /// returned region lives.
    unsafe fn register(&self, ptr: *const u8, len: usize, access: AccessFlags) -> Result<Arc<MemoryRegion>, String> {
        // SAFETY: forwarded to the caller.
        unsafe { self.pd.reg_mr(ptr as usize, len.max(1), access) }.map_err(|e| e.to_string())
    }

    /// A queue pair in INIT with a completion queue (and, for the initiator, a channel).
    fn new_qp(&self, channel: Option<&Arc<CompletionChannel>>, access: AccessFlags) -> Result<NewQp, String> {
        let mut b = self.ctx.create_cq_builder();
        b.setup_cqe(SEND_DEPTH * 2);
        if let Some(ch) = channel {
            b.setup_comp_channel(ch, 0);
        }
        let cq = b.build().map_err(|e| format!("completion queue: {e}"))?;
        let g = GenericCompletionQueue::from(cq.clone());
        let mut qp = self
            .pd
            .create_qp_builder()
            .setup_max_send_wr(SEND_DEPTH)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_max_inline_data(0)
            .setup_send_cq(g.clone())
            .setup_recv_cq(g)
            .build()
            .map_err(|e| format!("queue pair: {e}"))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(self.port)
            .setup_access_flags(access);
        qp.modify(&attr).map_err(|e| format!("to INIT: {e}"))?;
        let psn = random_u32() & 0xFF_FFFF;
        Ok(NewQp { qp, cq, psn })
    }

    fn info(&self, qp: &BasicQueuePair, psn: u32, session: u64) -> QpInfo {
        QpInfo {
            qpn: qp.qp_number(),
            psn,
            gid: Ipv6Addr::from(self.gid).octets().to_vec(),
            session,
            mtu: mtu_bytes(self.mtu),
        }
    }

    /// Moves a queue pair to ready-to-send towards `remote`.
    fn connect_qp(&self, qp: &mut BasicQueuePair, my_psn: u32, remote: &QpInfo) -> Result<(), String> {
        let gid: [u8; 16] = remote
            .gid
            .as_slice()
            .try_into()
            .map_err(|_| "remote GID is not 16 bytes")?;
        let gid = Gid::from(Ipv6Addr::from(gid));
        let mtu = mtu_of(remote.mtu.min(mtu_bytes(self.mtu)));
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(READ_DEPTH)
            .setup_min_rnr_timer(12);
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(0)
            .setup_port(self.port)
            .setup_service_level(0)
            .setup_grh_src_gid_index(self.gid_index as u8)
            .setup_grh_dest_gid(&gid)
            .setup_grh_hop_limit(64);
        attr.setup_address_vector(&ah);
        qp.modify(&attr).map_err(|e| format!("to RTR: {e}"))?;
        let mut attr = QueuePairAttribute::new();
        // Local ACK timeout 4.096 µs × 2^14 ≈ 67 ms, 7 retries: a dead peer fails a read
        // within about half a second.
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(my_psn)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(READ_DEPTH);
        qp.modify(&attr).map_err(|e| format!("to RTS: {e}"))
    }
}

struct NewQp {
    qp: BasicQueuePair,
    cq: Arc<BasicCompletionQueue>,
    psn: u32,
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b)
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

// ---------------------------------------------------------------- server side

/// A server's RDMA side: accepts queue pairs and resolves region keys.
pub struct RdmaExport {
    dev: Arc<Device>,
    regions: Arc<RegionTable>,
    state: Mutex<ExportState>,
}

#[derive(Default)]
struct ExportState {
    /// Registered regions by (slot, generation), with the bytes they pin.
    mrs: HashMap<(u32, u32), (Arc<MemoryRegion>, Bytes)>,
    /// Queue pairs by client session, oldest first in `order`.
    qps: HashMap<u64, ServerQp>,
    order: VecDeque<u64>,
}

struct ServerQp {
    _qp: BasicQueuePair,
    _cq: Arc<BasicCompletionQueue>,
}

impl RdmaExport {
    /// Serves `regions` over `dev`. Revoking a region deregisters its memory.
    pub fn new(dev: Arc<Device>, regions: Arc<RegionTable>) -> Arc<RdmaExport> {
        let export = Arc::new(RdmaExport {
            dev,
            regions: regions.clone(),
            state: Mutex::new(ExportState::default()),
        });
        let weak: Weak<RdmaExport> = Arc::downgrade(&export);
        regions.on_revoke(Box::new(move |key| {
            if let Some(e) = weak.upgrade() {
                e.lock().mrs.remove(&(key.region, key.generation));
            }
        }));
        export
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ExportState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device served.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Adds the handshake and resolve handlers to a router.
    pub fn routes(self: &Arc<Self>, router: Router) -> Router {
        let e = self.clone();
        let router = router.transport_raw(RDMA_CONNECT, move |ctx: CallContext, payload: Bytes| {
            let e = e.clone();
            async move {
                let req: QpInfo = decode(&payload)?;
                let reply = e.accept(ctx.peer, &req)?;
                Ok(Bytes::from(prost::Message::encode_to_vec(&reply)))
            }
        });
        let e = self.clone();
        router.transport_raw(RDMA_RESOLVE, move |_: CallContext, payload: Bytes| {
            let e = e.clone();
            async move {
                let req: ResolveRequest = decode(&payload)?;
                let reply = e.resolve(&req)?;
                Ok(Bytes::from(prost::Message::encode_to_vec(&reply)))
            }
        })
    }

    fn accept(&self, peer: SocketAddr, remote: &QpInfo) -> Result<QpInfo, Status> {
        let fail = |why: String| Status::new(Code::Internal, format!("RDMA queue pair for {peer}: {why}"));
        let NewQp { mut qp, cq, psn } = self.dev.new_qp(None, AccessFlags::RemoteRead).map_err(fail)?;
        self.dev.connect_qp(&mut qp, psn, remote).map_err(fail)?;
        let info = self.dev.info(&qp, psn, remote.session);
        let mut st = self.lock();
        if st.qps.insert(remote.session, ServerQp { _qp: qp, _cq: cq }).is_none() {
            st.order.push_back(remote.session);
        }
        while st.qps.len() > MAX_SERVER_QPS {
            let Some(old) = st.order.pop_front() else { break };
            st.qps.remove(&old);
        }
        debug!(%peer, qpn = info.qpn, remote_qpn = remote.qpn, "RDMA queue pair ready");
        Ok(info)
    }

    fn resolve(&self, req: &ResolveRequest) -> Result<Resolved, Status> {
        let key = RegionKey {
            region: req.region,
            generation: req.generation,
            len: req.key_len,
        };
        let id = (key.region, key.generation);
        if let Some((mr, bytes)) = self.lock().mrs.get(&id) {
            return Ok(resolved(mr, bytes, key));
        }
        // The same checks as a TCP read: unknown or stale keys are refused.
        let bytes = self.regions.whole(key).map_err(|e| Status::from(&e))?;
        // SAFETY: `bytes` is kept with the registration (in `mrs`), so the memory stays
        // mapped for as long as the NIC may read it; remote read only.
        let mr = unsafe { self.dev.register(bytes.as_ptr(), bytes.len(), AccessFlags::RemoteRead) }
            .map_err(|e| Status::new(Code::Internal, format!("cannot register region {}: {e}", key.region)))?;
        let out = resolved(&mr, &bytes, key);
        self.lock().mrs.insert(id, (mr, bytes));
        // A revoke between the check and the insert must not leave it registered.
        if self.regions.access(key, 0, 0).is_err() {
            self.lock().mrs.remove(&id);
            return Err(Status::new(Code::StaleGeneration, "region revoked"));
        }
        Ok(out)
    }
}

fn resolved(mr: &MemoryRegion, bytes: &Bytes, key: RegionKey) -> Resolved {
    Resolved {
        addr: bytes.as_ptr() as u64,
        rkey: mr.rkey(),
        len: (bytes.len() as u64).min(key.len),
    }
}

fn decode<M: prost::Message + Default>(b: &[u8]) -> Result<M, Status> {
    M::decode(b).map_err(|e| Status::new(Code::InvalidRequest, format!("undecodable RDMA request: {e}")))
}

// ---------------------------------------------------------------- client side

/// A client's RDMA side: queue pairs to peers, resolved keys, fallback state.
pub struct RdmaReader {
    dev: Arc<Device>,
    session: u64,
    peers: Mutex<HashMap<SocketAddr, PeerState>>,
    resolved: Mutex<HashMap<(SocketAddr, u32, u32), Resolved>>,
    reads: AtomicU64,
    fallbacks: AtomicU64,
    fallback_for: Duration,
}

enum PeerState {
    Ready(Arc<Conn>),
    Fallback { until: Instant },
}

/// Counters of the RDMA path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdmaStats {
    /// Reads completed over RDMA.
    pub reads: u64,
    /// Times a peer fell back to TCP.
    pub fallbacks: u64,
}

impl RdmaReader {
    /// A reader on `dev`.
    pub fn new(dev: Arc<Device>) -> Arc<RdmaReader> {
        Self::with_fallback(dev, FALLBACK_FOR)
    }

    /// A reader on `dev` that keeps a failed peer on TCP for `fallback_for`.
    pub fn with_fallback(dev: Arc<Device>, fallback_for: Duration) -> Arc<RdmaReader> {
        Arc::new(RdmaReader {
            fallback_for,
            dev,
            session: random_u64(),
            peers: Mutex::new(HashMap::new()),
            resolved: Mutex::new(HashMap::new()),
            reads: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
        })
    }

    /// The device used.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Counters.
    pub fn stats(&self) -> RdmaStats {
        RdmaStats {
            reads: self.reads.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
        }
    }

    /// True when reads of `peer` go over RDMA now (no fallback in force).
    pub fn uses_rdma(&self, peer: SocketAddr) -> bool {
        !matches!(self.peers_lock().get(&peer), Some(PeerState::Fallback { until }) if Instant::now() < *until)
    }

    fn peers_lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, PeerState>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads over RDMA. `Err(buf)`: the peer is on TCP for now (fallback in force, or
    /// this read failed on RDMA and was not done): the caller reads over TCP.
    pub(crate) async fn read(
        &self,
        tcp: &TcpClient,
        peer: SocketAddr,
        key: RegionKey,
        offset: u64,
        len: u32,
        buf: BytesMut,
    ) -> Result<ReadOutcome, BytesMut> {
        if !self.uses_rdma(peer) {
            return Err(buf);
        }
        match self.try_read(tcp, peer, key, offset, len, buf).await {
            Ok(out) => Ok(out),
            Err((e, buf)) => {
                self.fall_back(peer, &e);
                Err(buf)
            }
        }
    }

    /// Reads over RDMA and reports RDMA failures as they are (no fallback): the typed
    /// errors of the RDMA path, for tests and diagnostics.
    pub async fn read_rdma(
        &self,
        tcp: &TcpClient,
        peer: SocketAddr,
        key: RegionKey,
        offset: u64,
        len: u32,
        buf: BytesMut,
    ) -> Result<ReadOutcome, (RdmaError, BytesMut)> {
        let r = self.try_read(tcp, peer, key, offset, len, buf).await;
        if let Err((e, _)) = &r {
            self.drop_conn(peer, e);
        }
        r
    }

    fn fall_back(&self, peer: SocketAddr, why: &RdmaError) {
        let access = matches!(why, RdmaError::Completion { status, .. } if status.contains("RemoteAccess"));
        let period = if access {
            self.fallback_for.min(ACCESS_FALLBACK_FOR)
        } else {
            self.fallback_for
        };
        let mut peers = self.peers_lock();
        let was_ready = !matches!(peers.get(&peer), Some(PeerState::Fallback { .. }));
        peers.insert(
            peer,
            PeerState::Fallback {
                until: Instant::now() + period,
            },
        );
        drop(peers);
        self.forget_keys(peer);
        if !was_ready {
            return;
        }
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        match why {
            RdmaError::NotOffered => info!(%peer, "peer serves no RDMA; reading it over TCP"),
            _ => {
                warn!(%peer, error = %why, "RDMA to this peer failed; reading it over TCP for {period:?}, then reconnecting")
            }
        }
    }

    fn drop_conn(&self, peer: SocketAddr, why: &RdmaError) {
        if self.peers_lock().remove(&peer).is_some() {
            debug!(%peer, error = %why, "RDMA queue pair dropped");
        }
        self.forget_keys(peer);
    }

    fn forget_keys(&self, peer: SocketAddr) {
        self.resolved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(p, _, _), _| *p != peer);
    }

    async fn try_read(
        &self,
        tcp: &TcpClient,
        peer: SocketAddr,
        key: RegionKey,
        offset: u64,
        len: u32,
        mut buf: BytesMut,
    ) -> Result<ReadOutcome, (RdmaError, BytesMut)> {
        let conn = match self.conn(tcp, peer).await {
            Ok(c) => c,
            Err(e) => return Err((e, buf)),
        };
        let target = match self.resolve(tcp, peer, key).await {
            Ok(Ok(r)) => r,
            // The server refused the key: the same answer TCP gives.
            Ok(Err(e)) => return Ok((Err(e), buf)),
            Err(e) => return Err((e, buf)),
        };
        let end = offset + u64::from(len);
        if end > target.len {
            let e = crate::region::AccessError::OutOfBounds {
                offset,
                len: u64::from(len),
                region_len: target.len,
            };
            return Ok((Err(e.into()), buf));
        }
        buf.clear();
        buf.reserve(len as usize);
        let timeout = tcp.config().request_timeout;
        let mut done = 0usize;
        let total = len as usize;
        // Pieces of up to a bounce buffer, all in flight at once.
        let mut pieces = Vec::new();
        while done < total {
            let n = (total - done).min(BOUNCE_BYTES);
            pieces.push((done, n));
            done += n;
        }
        let reads: Vec<_> = pieces
            .iter()
            .map(|&(at, n)| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    conn.read(target.addr + offset + at as u64, target.rkey, n, timeout)
                        .await
                })
            })
            .collect();
        let mut failed = None;
        for r in reads {
            match r.await {
                Ok(Ok(bytes)) if failed.is_none() => buf.extend_from_slice(&bytes),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(e) => failed = failed.or(Some(RdmaError::Post(format!("read task: {e}")))),
            }
        }
        if let Some(e) = failed {
            return Err((e, buf));
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok((Ok(()), buf))
    }

    async fn resolve(
        &self,
        tcp: &TcpClient,
        peer: SocketAddr,
        key: RegionKey,
    ) -> Result<Result<Resolved, TransportError>, RdmaError> {
        let id = (peer, key.region, key.generation);
        if let Some(r) = self.resolved.lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
            return Ok(Ok(*r));
        }
        let req = ResolveRequest {
            region: key.region,
            generation: key.generation,
            key_len: key.len,
        };
        let payload = Bytes::from(prost::Message::encode_to_vec(&req));
        match tcp.call_raw(peer, RDMA_RESOLVE, payload, CallOptions::default()).await {
            Ok(b) => {
                let r: Resolved =
                    prost::Message::decode(b).map_err(|e| RdmaError::Setup(format!("resolve reply: {e}")))?;
                let mut cache = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
                if cache.len() >= MAX_RESOLVED {
                    // Mostly keys of regions long revoked; re-resolving costs one RPC.
                    cache.clear();
                }
                cache.insert(id, r);
                Ok(Ok(r))
            }
            Err(TransportError::Remote { status, .. }) if crate::client::is_access(&status) => {
                Ok(Err(crate::client::access_error(&status, key, 0, 0).into()))
            }
            Err(TransportError::Remote { status, .. }) if status.code == Code::UnknownKind => {
                Err(RdmaError::NotOffered)
            }
            Err(e) => Err(RdmaError::Setup(format!("resolve: {e}"))),
        }
    }

    async fn conn(&self, tcp: &TcpClient, peer: SocketAddr) -> Result<Arc<Conn>, RdmaError> {
        if let Some(PeerState::Ready(c)) = self.peers_lock().get(&peer)
            && !c.broken.load(Ordering::Relaxed)
        {
            return Ok(c.clone());
        }
        let channel = CompletionChannel::new(&self.dev.ctx).map_err(|e| RdmaError::Setup(e.to_string()))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| RdmaError::Setup(format!("completion channel: {e}")))?;
        let NewQp { mut qp, cq, psn } = self
            .dev
            .new_qp(Some(&channel), AccessFlags::LocalWrite)
            .map_err(RdmaError::Setup)?;
        let mine = self.dev.info(&qp, psn, self.session);
        let payload = Bytes::from(prost::Message::encode_to_vec(&mine));
        let reply = match tcp.call_raw(peer, RDMA_CONNECT, payload, CallOptions::default()).await {
            Ok(b) => b,
            Err(TransportError::Remote { status, .. }) if status.code == Code::UnknownKind => {
                return Err(RdmaError::NotOffered);
            }
            Err(e) => return Err(RdmaError::Setup(format!("handshake: {e}"))),
        };
        let theirs: QpInfo =
            prost::Message::decode(reply).map_err(|e| RdmaError::Setup(format!("handshake reply: {e}")))?;
        self.dev.connect_qp(&mut qp, psn, &theirs).map_err(RdmaError::Setup)?;
        let conn = Conn::start(self.dev.clone(), qp, cq, channel).map_err(RdmaError::Setup)?;
        info!(%peer, device = %self.dev.name, qpn = theirs.qpn, "reading this peer over RDMA");
        self.peers_lock().insert(peer, PeerState::Ready(conn.clone()));
        Ok(conn)
    }
}

/// One queue pair to a peer, its completions and its bounce buffers.
struct Conn {
    dev: Arc<Device>,
    qp: Mutex<BasicQueuePair>,
    cq: Arc<BasicCompletionQueue>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<(), RdmaError>>>>,
    next_id: AtomicU64,
    buffers: Mutex<Vec<Bounce>>,
    permits: Semaphore,
    broken: AtomicBool,
    task: Mutex<Option<tokio::task::AbortHandle>>,
}

/// A registered buffer the NIC writes into. Field order matters: the registration is
/// dropped (deregistered) before the memory is freed.
struct Bounce {
    mr: Arc<MemoryRegion>,
    mem: Box<[u8]>,
}

struct ChannelFd(Arc<CompletionChannel>);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

impl Conn {
    fn start(
        dev: Arc<Device>,
        qp: BasicQueuePair,
        cq: Arc<BasicCompletionQueue>,
        channel: Arc<CompletionChannel>,
    ) -> Result<Arc<Conn>, String> {
        let conn = Arc::new(Conn {
            dev,
            qp: Mutex::new(qp),
            cq,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            buffers: Mutex::new(Vec::new()),
            permits: Semaphore::new(BOUNCE_BUFFERS),
            broken: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        // SAFETY: the descriptor belongs to the channel `ChannelFd` holds: open, and the
        // same, for as long as the AsyncFd lives.
        let fd = unsafe { AsyncFd::register(ChannelFd(channel)) }.map_err(|e| format!("completion channel: {e}"))?;
        let weak = Arc::downgrade(&conn);
        let task = tokio::spawn(completions(weak, fd));
        *conn.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
        Ok(conn)
    }

    fn bounce(&self) -> Result<Bounce, RdmaError> {
        if let Some(b) = self.buffers.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(b);
        }
        let mem = vec![0u8; BOUNCE_BYTES].into_boxed_slice();
        // SAFETY: the heap block does not move when the box does; `Bounce` holds the
        // only handle to the registration and drops it before the memory, and the NIC
        // writes only while a read is posted (a timed-out read leaks its buffer).
        let mr = unsafe { self.dev.register(mem.as_ptr(), mem.len(), AccessFlags::LocalWrite) }
            .map_err(|e| RdmaError::Setup(format!("bounce buffer: {e}")))?;
        Ok(Bounce { mr, mem })
    }

    /// One RDMA READ of `n` ≤ [`BOUNCE_BYTES`] bytes at `addr`.
    async fn read(&self, addr: u64, rkey: u32, n: usize, timeout: Duration) -> Result<Vec<u8>, RdmaError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| RdmaError::Setup("connection closed".into()))?;
        if self.broken.load(Ordering::Relaxed) {
            return Err(RdmaError::Post("queue pair in error".into()));
        }
        let mut bounce = self.bounce()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(id, tx);
        let posted = {
            let mut qp = self.qp.lock().unwrap_or_else(|p| p.into_inner());
            let mut guard = qp.start_post_send();
            let wr = guard
                .construct_wr(id, WorkRequestFlags::Signaled)
                .setup_read(rkey, addr);
            // SAFETY: the bounce buffer stays alive and untouched until the completion
            // (or, on timeout, it is leaked below rather than reused).
            unsafe { wr.setup_sge(bounce.mr.lkey(), bounce.mem.as_mut_ptr() as u64, n as u32) };
            guard.post().map_err(|e| RdmaError::Post(e.to_string()))
        };
        if let Err(e) = posted {
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            self.buffers.lock().unwrap_or_else(|p| p.into_inner()).push(bounce);
            self.broken.store(true, Ordering::Relaxed);
            return Err(e);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(()))) => {
                let out = bounce.mem[..n].to_vec();
                self.buffers.lock().unwrap_or_else(|p| p.into_inner()).push(bounce);
                Ok(out)
            }
            Ok(Ok(Err(e))) => {
                self.broken.store(true, Ordering::Relaxed);
                Err(e)
            }
            Ok(Err(_)) => {
                self.broken.store(true, Ordering::Relaxed);
                Err(RdmaError::Setup("completion handler stopped".into()))
            }
            Err(_) => {
                // The NIC may still write into the buffer: never reuse it. The queue
                // pair is abandoned (dropping it flushes the request).
                self.broken.store(true, Ordering::Relaxed);
                std::mem::forget(bounce);
                Err(RdmaError::Timeout(timeout))
            }
        }
    }

    /// Delivers every completion waiting in the queue.
    fn drain(&self) {
        loop {
            let Ok(poller) = self.cq.start_poll() else { return };
            let mut any = false;
            for wc in poller {
                any = true;
                let status = WorkCompletionStatus::from(wc.status());
                let r = if status == WorkCompletionStatus::Success {
                    Ok(())
                } else {
                    self.broken.store(true, Ordering::Relaxed);
                    Err(RdmaError::Completion {
                        status: format!("{status:?}"),
                        vendor_err: wc.vendor_err(),
                    })
                };
                if let Some(tx) = self
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&wc.wr_id())
                {
                    let _ = tx.send(r);
                }
            }
            if !any {
                return;
            }
        }
    }
}

/// Waits for completion events and delivers completions, while the connection lives.
async fn completions(conn: Weak<Conn>, fd: AsyncFd<ChannelFd>) {
    loop {
        let Some(c) = conn.upgrade() else { return };
        c.drain();
        // SAFETY: the CQ outlives this call (held by `c`).
        let armed = unsafe { rdma_mummy_sys::ibv_req_notify_cq(c.cq.cq().as_ptr(), 0) };
        if armed != 0 {
            warn!(
                error = armed,
                "cannot arm the RDMA completion queue; the queue pair is abandoned"
            );
            c.broken.store(true, Ordering::Relaxed);
            return;
        }
        // Completions that arrived before arming raise no event: drain once more.
        c.drain();
        drop(c);
        let Ok(mut guard) = fd.readable().await else { return };
        let Some(c) = conn.upgrade() else { return };
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: the channel is valid (owned by `fd`); non-blocking, so this returns
            // -1 with EAGAIN when no event is waiting.
            let got =
                unsafe { rdma_mummy_sys::ibv_get_cq_event(fd.get_ref().0.comp_channel().as_ptr(), &mut cq, &mut ctx) };
            if got != 0 {
                break;
            }
            // SAFETY: `cq` was returned by ibv_get_cq_event for our CQ.
            unsafe { rdma_mummy_sys::ibv_ack_cq_events(cq, 1) };
        }
        guard.clear_ready();
        drop(c);
    }
}
