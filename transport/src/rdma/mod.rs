//! RDMA over RoCE reliable-connection queue pairs (cargo feature `rdma`).
//!
//! **What goes over RDMA**: RPCs and granted bytes. A request or reply is the same frame
//! as over TCP ([`crate::frame`]: kind, id, deadline, trace context, crc), cut into
//! fragments of one SEND each ([`crate::fragment`]) into receive buffers the peer keeps
//! posted. Bytes a handler places in the caller's read window ([`crate::window`]) are
//! answered as a [`crate::Grant`] and read by the client with one-sided RDMA READs into
//! registered buffers it owns; the client hands read grants back in an [`RDMA_RELEASE`]
//! message before its next request.
//!
//! **Setup** only through an authenticated TCP connection: the client creates an RC queue
//! pair, sends its number, PSN and GID in an `RDMA_CONNECT` request (always over TCP);
//! the server creates its side in a protection domain of the connection's own, moves it
//! to ready-to-send and answers with its own. The connection's window (registered once,
//! remote read only, in that protection domain, at its first use) is the only memory
//! its rkey reaches, on that queue pair only; it is deregistered with the queue pair.
//!
//! **Completions** arrive on a completion channel whose file descriptor tokio watches
//! ([`tokio::io::unix::AsyncFd`]); reads and calls wait on oneshots. **Buffers** are
//! owned: the NIC writes only into registered buffers of the queue pair's pools, and
//! bytes are copied into the caller's `BytesMut`.
//!
//! **Failures**: a completion error (remote access error, retry exceeded, flush) is a
//! typed [`RdmaError`]; the queue pair is dropped, a read is redone over TCP, a call in
//! flight fails like one on a dying TCP connection, and that peer stays on TCP for
//! [`FALLBACK_FOR`] with one log line saying why; the next request after it sets up a
//! new queue pair. A call waiting for its reply probes a silent peer every 250 ms, so a
//! dead server fails calls within about a second. With no RDMA library or device a node
//! runs on TCP and says so once ([`Device::open`] returns [`Unavailable`]).
#![allow(unsafe_code)]

mod endpoint;
mod export;
mod reader;

pub use endpoint::{BOUNCE_BYTES, MESSAGE_BUFFER};
pub use export::{MAX_WINDOWS, RdmaExport, WINDOW_BYTES};
pub use reader::{RdmaReader, RdmaStats};

use crate::frame::MsgKind;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, GenericCompletionQueue};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairAttribute, QueuePairState};
use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::Duration;

/// How long a peer whose queue pair failed is read over TCP before RDMA is tried again.
pub const FALLBACK_FOR: Duration = Duration::from_secs(30);

/// The same after a remote access error: a grant the server's window no longer holds
/// (the server closed the queue pair), not a sick fabric.
pub const ACCESS_FALLBACK_FOR: Duration = Duration::from_secs(1);

/// Send work requests in flight per queue pair.
const SEND_DEPTH: u32 = endpoint::SEND_DEPTH;

/// RDMA READs a queue pair may have outstanding as initiator / responder.
const READ_DEPTH: u8 = 16;

/// Message kind of the queue-pair handshake (transport-reserved).
pub const RDMA_CONNECT: MsgKind = MsgKind(3);
/// Message kind of a client handing grants back (transport-reserved; over RDMA only,
/// one way: no reply).
pub const RDMA_RELEASE: MsgKind = MsgKind(5);

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
    /// READ bounce buffers, shared by every queue pair of the device (pinned memory is
    /// bounded per process, not per peer).
    bounce: parking_lot::Mutex<Vec<endpoint::Buffer>>,
    bounce_permits: tokio::sync::Semaphore,
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
            bounce: parking_lot::Mutex::new(Vec::new()),
            bounce_permits: tokio::sync::Semaphore::new(endpoint::BOUNCE_BUFFERS),
        }))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A protection domain of its own (a server's queue pair for one client: its window's
    /// rkey is then valid on that queue pair only).
    fn new_pd(&self) -> Result<Arc<ProtectionDomain>, String> {
        self.ctx.alloc_pd().map_err(|e| format!("protection domain: {e}"))
    }

    /// A queue pair in INIT in `pd` with a completion queue (and, for the initiator, a
    /// channel).
    fn new_qp(
        &self,
        pd: &Arc<ProtectionDomain>,
        channel: Option<&Arc<CompletionChannel>>,
        access: AccessFlags,
    ) -> Result<NewQp, String> {
        let mut b = self.ctx.create_cq_builder();
        b.setup_cqe(SEND_DEPTH + endpoint::RECV_BUFFERS as u32 + 16);
        if let Some(ch) = channel {
            b.setup_comp_channel(ch, 0);
        }
        let cq = b.build().map_err(|e| format!("completion queue: {e}"))?;
        let g = GenericCompletionQueue::from(cq.clone());
        let mut qp = pd
            .create_qp_builder()
            .setup_max_send_wr(SEND_DEPTH)
            .setup_max_recv_wr(endpoint::RECV_BUFFERS as u32)
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

/// Registers `len` bytes at `ptr` in `pd`.
///
/// # Safety
/// The memory must stay valid (and, for local writes, exclusively ours) while the
/// returned region lives.
unsafe fn register_in(
    pd: &Arc<ProtectionDomain>,
    ptr: *const u8,
    len: usize,
    access: AccessFlags,
) -> Result<Arc<MemoryRegion>, String> {
    // SAFETY: forwarded to the caller.
    unsafe { pd.reg_mr(ptr as usize, len.max(1), access) }.map_err(|e| {
        let src = std::error::Error::source(&e)
            .map(|s| format!(": {s}"))
            .unwrap_or_default();
        format!(
            "{e}{src} ({len} bytes; registered memory is pinned: raise the memlock limit, e.g. \
             LimitMEMLOCK=infinity in the systemd unit or `ulimit -l unlimited`)"
        )
    })
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
