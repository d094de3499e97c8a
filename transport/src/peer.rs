//! The TCP client: a pool of authenticated, multiplexed connections per peer.
//!
//! Each connection has a writer task (coalescing queued frames into one flush) and a
//! reader task that routes replies to waiting callers by request id. Remote-read
//! replies are read straight from the socket into the caller's buffer. In-flight
//! requests and bytes are bounded per connection by semaphores, so a caller that
//! outruns the network waits instead of queueing without bound.

use crate::auth::{self, ClusterSecret};
use crate::backoff::Backoff;
use crate::config::TransportConfig;
use crate::error::TransportError;
use crate::frame::{FrameHeader, MsgKind};
use crate::region::{AccessError, RegionKey};
use crate::rpc::{CallOptions, ReadOutcome, RemoteRead, RemoteReadRequest, RpcChannel};
use crate::status::{Code, Status};
use crate::wire::{self, Outgoing};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span};

/// A cloneable handle to the client side of the transport: calls to any peer, over
/// pooled TCP connections or, with the `rdma` feature and a peer that has it, over RDMA
/// (SENDs for calls, one-sided READs for remote reads), falling back to TCP per peer.
#[derive(Clone)]
pub struct PeerClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    config: TransportConfig,
    secret: ClusterSecret,
    peers: Mutex<HashMap<SocketAddr, Arc<Peer>>>,
    shutdown: CancellationToken,
    /// Remote reads go over RDMA when attached (and the peer offers it).
    #[cfg(feature = "rdma")]
    rdma: std::sync::OnceLock<Arc<crate::rdma::RdmaReader>>,
}

struct Peer {
    addr: SocketAddr,
    slots: Mutex<Vec<Option<Arc<Conn>>>>,
    connecting: tokio::sync::Mutex<()>,
    backoff: Mutex<Backoff>,
}

enum Reply {
    Payload(Bytes),
    Sink(BytesMut),
}

/// A failed request, with the caller's read buffer when there was one.
struct Failed {
    error: TransportError,
    sink: Option<BytesMut>,
}

type Done = Result<Reply, Failed>;

struct Pending {
    tx: oneshot::Sender<Done>,
    sink: Option<BytesMut>,
}

impl Pending {
    fn fail(self, error: TransportError) {
        let _ = self.tx.send(Err(Failed { error, sink: self.sink }));
    }
}

struct Conn {
    peer: SocketAddr,
    out: mpsc::Sender<Outgoing>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    requests: Semaphore,
    max_requests: usize,
    bytes: Semaphore,
    max_bytes: u32,
    closed: CancellationToken,
    close_reason: Mutex<Option<String>>,
}

impl Conn {
    fn is_open(&self) -> bool {
        !self.closed.is_cancelled()
    }

    fn inflight(&self) -> usize {
        self.max_requests - self.requests.available_permits()
    }

    fn close(&self, reason: String) {
        let mut r = self.close_reason.lock();
        if r.is_none() {
            *r = Some(reason);
        }
        drop(r);
        self.closed.cancel();
        let drained: Vec<Pending> = {
            let mut p = self.pending.lock();
            p.drain().map(|(_, v)| v).collect()
        };
        for p in drained {
            p.fail(self.closed_error());
        }
    }

    fn closed_error(&self) -> TransportError {
        let reason = self.close_reason.lock().clone().unwrap_or_else(|| "closed".into());
        TransportError::ConnectionClosed {
            peer: self.peer,
            reason,
        }
    }
}

/// Removes a pending entry when its caller goes away (timeout or cancellation).
struct PendingGuard<'a> {
    conn: &'a Conn,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.conn.pending.lock().remove(&self.id);
    }
}

impl PeerClient {
    /// Whose client key this client connects with (`None`: the cluster secret).
    pub fn identity(&self) -> Option<&crate::auth::Identity> {
        self.inner.secret.identity()
    }

    /// A client that authenticates with `secret`. Connections are made on first use.
    pub fn new(config: TransportConfig, secret: ClusterSecret) -> Self {
        PeerClient {
            inner: Arc::new(ClientInner {
                config,
                secret,
                peers: Mutex::new(HashMap::new()),
                shutdown: CancellationToken::new(),
                #[cfg(feature = "rdma")]
                rdma: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Sends remote reads over RDMA from now on (peers without RDMA, and peers whose
    /// queue pair failed, are read over TCP). Returns false when one was attached.
    #[cfg(feature = "rdma")]
    pub fn attach_rdma(&self, reader: Arc<crate::rdma::RdmaReader>) -> bool {
        self.inner.rdma.set(reader).is_ok()
    }

    /// The attached RDMA reader.
    #[cfg(feature = "rdma")]
    pub fn rdma(&self) -> Option<&Arc<crate::rdma::RdmaReader>> {
        self.inner.rdma.get()
    }

    /// The fabric remote reads of `peer` use now: `"rdma"` or `"tcp"`.
    pub fn fabric(&self, peer: SocketAddr) -> &'static str {
        #[cfg(feature = "rdma")]
        if let Some(r) = self.inner.rdma.get()
            && r.uses_rdma(peer)
        {
            return "rdma";
        }
        let _ = peer;
        "tcp"
    }

    /// The configuration in force.
    pub fn config(&self) -> &TransportConfig {
        &self.inner.config
    }

    /// Round-trip time of a PING to `peer`.
    pub async fn ping(&self, peer: SocketAddr) -> Result<Duration, TransportError> {
        let t = Instant::now();
        self.call_raw(peer, MsgKind::PING, Bytes::from_static(b"ping"), CallOptions::default())
            .await?;
        Ok(t.elapsed())
    }

    /// Closes every connection; calls in flight fail with `ConnectionClosed`, later
    /// calls with `Shutdown`.
    pub fn close(&self) {
        self.inner.shutdown.cancel();
        let peers: Vec<Arc<Peer>> = self.inner.peers.lock().values().cloned().collect();
        for p in peers {
            for c in p.slots.lock().iter().flatten() {
                c.close("client closed".into());
            }
        }
    }

    /// The peer is known to be back (the cluster map shows its node Up again after it
    /// was not): the next call connects at once instead of waiting out the backoff its
    /// failed connects built up while it was gone (up to `backoff_max`), and on a new
    /// connection. A connection from before may be stalled: a network cut leaves it
    /// open at both ends with its unacknowledged bytes in TCP's retransmission back-off
    /// (seconds by the time the cut heals), and every request queued on it waited for
    /// its deadline — in the network-namespace rig, a takeover's copy to the returning
    /// node for 10 s, and a create behind it 12 s. Calls in flight on those connections
    /// fail with `ConnectionClosed` and are retried by their callers.
    pub fn revive(&self, peer: SocketAddr) {
        let p = self.inner.peers.lock().get(&peer).cloned();
        if let Some(p) = p {
            p.backoff.lock().on_success();
            let old: Vec<Arc<Conn>> = p.slots.lock().iter_mut().filter_map(Option::take).collect();
            for c in old {
                c.close("the peer came back; connections from before it left are dropped".into());
            }
        }
    }

    /// Drops pooled connections to `peer` (for example after it was declared dead).
    pub fn forget(&self, peer: SocketAddr) {
        if let Some(p) = self.inner.peers.lock().remove(&peer) {
            for c in p.slots.lock().iter().flatten() {
                c.close("peer forgotten".into());
            }
        }
    }

    fn peer(&self, addr: SocketAddr) -> Arc<Peer> {
        let mut peers = self.inner.peers.lock();
        peers
            .entry(addr)
            .or_insert_with(|| {
                Arc::new(Peer {
                    addr,
                    slots: Mutex::new(vec![None; self.inner.config.conns_per_peer]),
                    connecting: tokio::sync::Mutex::new(()),
                    backoff: Mutex::new(Backoff::new(
                        self.inner.config.backoff_initial,
                        self.inner.config.backoff_max,
                    )),
                })
            })
            .clone()
    }

    async fn conn(&self, addr: SocketAddr) -> Result<Arc<Conn>, TransportError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(TransportError::Shutdown);
        }
        let peer = self.peer(addr);
        // Least-loaded live connection; a sequential caller thus stays on one warm
        // connection, and more are opened only when all live ones are busy.
        let (best, free_slot) = peer.pick();
        let idx = match (best, free_slot) {
            (Some((c, 0)), _) | (Some((c, _)), None) => return Ok(c),
            (Some((c, _)), Some(idx)) => {
                // Busy: open another connection if nobody else is, else share.
                if peer.check_backoff().is_err() {
                    return Ok(c);
                }
                let Ok(_guard) = peer.connecting.try_lock() else {
                    return Ok(c);
                };
                return match self.open_slot(&peer, idx).await {
                    Ok(n) => Ok(n),
                    Err(_) => Ok(c),
                };
            }
            (None, Some(idx)) => idx,
            (None, None) => 0,
        };
        peer.check_backoff()?;
        let _guard = peer.connecting.lock().await;
        if let (Some((c, _)), _) = peer.pick() {
            return Ok(c);
        }
        // Another caller may have failed while we waited for the lock.
        peer.check_backoff()?;
        self.open_slot(&peer, idx).await
    }

    /// Connects and stores the connection in slot `idx`; records success or failure
    /// in the peer's backoff. The caller holds `peer.connecting`.
    async fn open_slot(&self, peer: &Peer, idx: usize) -> Result<Arc<Conn>, TransportError> {
        match self.connect(peer.addr).await {
            Ok(c) => {
                peer.backoff.lock().on_success();
                peer.slots.lock()[idx] = Some(c.clone());
                Ok(c)
            }
            Err(e) => {
                let delay = peer.backoff.lock().on_failure(Instant::now(), e.to_string());
                debug!(peer = %peer.addr, retry_in = ?delay, error = %e, "connect failed");
                Err(e)
            }
        }
    }

    async fn connect(&self, peer: SocketAddr) -> Result<Arc<Conn>, TransportError> {
        let cfg = &self.inner.config;
        let mut stream = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(peer))
            .await
            .map_err(|_| TransportError::Connect {
                peer,
                source: std::io::ErrorKind::TimedOut.into(),
            })?
            .map_err(|source| TransportError::Connect { peer, source })?;
        let _ = stream.set_nodelay(true);
        auth::connect(&mut stream, &self.inner.secret, cfg.handshake_timeout)
            .await
            .map_err(|source| TransportError::Auth { peer, source })?;
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::channel(cfg.max_inflight_requests as usize);
        let max_bytes = u32::try_from(cfg.max_inflight_bytes).unwrap_or(u32::MAX);
        let conn = Arc::new(Conn {
            peer,
            out: tx,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            requests: Semaphore::new(cfg.max_inflight_requests as usize),
            max_requests: cfg.max_inflight_requests as usize,
            bytes: Semaphore::new(max_bytes as usize),
            max_bytes,
            closed: CancellationToken::new(),
            close_reason: Mutex::new(None),
        });
        let c = conn.clone();
        tokio::spawn(async move {
            let res = wire::writer_loop(wr, rx, c.closed.clone()).await;
            c.close(match res {
                Ok(()) => "writer finished".into(),
                Err(e) => format!("write failed: {e}"),
            });
        });
        let c = conn.clone();
        let max_frame = cfg.max_frame_bytes;
        #[cfg(feature = "rdma")]
        let rdma = self.inner.rdma.get().cloned();
        tokio::spawn(async move {
            let reason = tokio::select! {
                r = reader_loop(&c, rd, max_frame) => r,
                _ = c.closed.cancelled() => "closed".into(),
            };
            c.close(reason);
            // The peer's queue pair most likely went with the connection (restart).
            #[cfg(feature = "rdma")]
            if let Some(r) = rdma {
                r.peer_disconnected(peer);
            }
        });
        debug!(%peer, "connected");
        Ok(conn)
    }

    /// Sends a request and waits for its reply; `sink` receives a remote-read payload.
    async fn request(
        &self,
        peer: SocketAddr,
        kind: MsgKind,
        payload: Bytes,
        expect_bytes: u32,
        sink: Option<BytesMut>,
        opts: CallOptions,
    ) -> Done {
        let cfg = &self.inner.config;
        if payload.len() > cfg.max_frame_bytes as usize {
            let error = TransportError::TooLarge {
                len: payload.len(),
                max: cfg.max_frame_bytes,
            };
            return Err(Failed { error, sink });
        }
        let timeout = opts.timeout.unwrap_or(cfg.request_timeout);
        let span = info_span!("rpc.client", otel.kind = "client", rpc.kind = %kind, %peer, bytes_out = payload.len());
        let trace = crate::trace::inject(&span);
        let started = Instant::now();
        let work = async {
            let fail = |error, sink| Err(Failed { error, sink });
            let conn = match self.conn(peer).await {
                Ok(c) => c,
                Err(e) => return fail(e, sink),
            };
            let Ok(_req) = conn.requests.acquire().await else {
                return fail(conn.closed_error(), sink);
            };
            let cost = (payload.len() as u64 + u64::from(expect_bytes)).min(u64::from(conn.max_bytes)) as u32;
            let Ok(_bytes) = conn.bytes.acquire_many(cost).await else {
                return fail(conn.closed_error(), sink);
            };
            let id = conn.next_id.fetch_add(1, Ordering::Relaxed);
            let mut header = FrameHeader::request(kind, id);
            let left = timeout.saturating_sub(started.elapsed());
            header.timeout_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX).max(1);
            header.trace = trace;
            let out = match Outgoing::new(&header, payload) {
                Ok(o) => o,
                Err(source) => return fail(TransportError::Frame { peer, source }, sink),
            };
            let (tx, rx) = oneshot::channel();
            conn.pending.lock().insert(id, Pending { tx, sink });
            let _guard = PendingGuard { conn: &conn, id };
            if !conn.is_open() || conn.out.send(out).await.is_err() {
                // The reader's close() fails every pending entry, ours included.
                let taken = conn.pending.lock().remove(&id);
                return fail(conn.closed_error(), taken.and_then(|p| p.sink));
            }
            match rx.await {
                Ok(r) => r,
                Err(_) => fail(conn.closed_error(), None),
            }
        };
        match tokio::time::timeout(timeout, work.instrument(span)).await {
            // The server gave up on our deadline a moment before we did: same outcome.
            Ok(Err(Failed {
                error: TransportError::Remote { status, .. },
                sink,
            })) if status.code == Code::DeadlineExceeded => Err(Failed {
                error: TransportError::Timeout {
                    peer,
                    kind,
                    after: timeout,
                },
                sink,
            }),
            Ok(r) => r,
            Err(_) => Err(Failed {
                error: TransportError::Timeout {
                    peer,
                    kind,
                    after: timeout,
                },
                sink: None,
            }),
        }
    }
}

impl Peer {
    /// The live connection with the fewest requests in flight (and that number), and
    /// the first slot without a live connection.
    fn pick(&self) -> (Option<(Arc<Conn>, usize)>, Option<usize>) {
        let slots = self.slots.lock();
        let mut best: Option<(&Arc<Conn>, usize)> = None;
        let mut free = None;
        for (i, slot) in slots.iter().enumerate() {
            match slot.as_ref().filter(|c| c.is_open()) {
                Some(c) => {
                    let busy = c.inflight();
                    if best.is_none_or(|(_, b)| busy < b) {
                        best = Some((c, busy));
                    }
                }
                None if free.is_none() => free = Some(i),
                None => {}
            }
        }
        (best.map(|(c, b)| (c.clone(), b)), free)
    }

    fn check_backoff(&self) -> Result<(), TransportError> {
        let b = self.backoff.lock();
        b.check(Instant::now())
            .map_err(|(retry_in, last)| TransportError::PeerUnavailable {
                peer: self.addr,
                retry_in,
                last_error: last.to_string(),
            })
    }
}

/// Routes replies to their callers until the stream ends or turns bad; returns why.
async fn reader_loop(conn: &Conn, rd: tokio::net::tcp::OwnedReadHalf, max_frame: u32) -> String {
    let mut rd = BufReader::with_capacity(64 << 10, rd);
    loop {
        let raw = match wire::read_header(&mut rd).await {
            Ok(Some(raw)) => raw,
            Ok(None) => return "peer closed the connection".into(),
            Err(e) => return format!("read failed: {e}"),
        };
        let header = match FrameHeader::decode(&raw, max_frame) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(peer = %conn.peer, error = %e, "closing connection: malformed frame");
                return format!("malformed frame: {e}");
            }
        };
        if !header.is_response() {
            tracing::warn!(peer = %conn.peer, kind = %header.kind, "closing connection: server sent a request");
            return "protocol violation: request from server".into();
        }
        let len = header.payload_len as usize;
        let pending = conn.pending.lock().remove(&header.request_id);
        let Some(pending) = pending else {
            // The caller gave up (timeout or cancellation); drain the late reply.
            if let Err(e) = wire::discard(&mut rd, len).await {
                return format!("read failed: {e}");
            }
            continue;
        };
        let seed = FrameHeader::crc_seed(&raw);
        let mut original_sink = None;
        let (mut buf, is_sink) = match pending.sink {
            Some(mut b) if !header.is_error() => {
                b.clear();
                (b, true)
            }
            other => {
                original_sink = other;
                (BytesMut::new(), false)
            }
        };
        let crc = match wire::read_payload_into(&mut rd, &mut buf, len, seed, header.payload_checksummed()).await {
            Ok(c) => c,
            Err(e) => return format!("read failed: {e}"),
        };
        let mut sink_back = |buf: BytesMut| {
            if is_sink { Some(buf) } else { original_sink.take() }
        };
        if let Err(e) = header.check_crc(crc) {
            tracing::warn!(peer = %conn.peer, error = %e, "closing connection: corrupt frame");
            let error = TransportError::Frame {
                peer: conn.peer,
                source: e.clone(),
            };
            let _ = pending.tx.send(Err(Failed {
                error,
                sink: sink_back(buf),
            }));
            return format!("corrupt frame: {e}");
        }
        let reply = if header.is_error() {
            let error = TransportError::Remote {
                peer: conn.peer,
                status: Status::decode(&buf),
            };
            Err(Failed {
                error,
                sink: sink_back(BytesMut::new()),
            })
        } else if is_sink {
            Ok(Reply::Sink(buf))
        } else {
            Ok(Reply::Payload(buf.freeze()))
        };
        let _ = pending.tx.send(reply);
    }
}

impl RpcChannel for PeerClient {
    async fn call_raw(
        &self,
        peer: SocketAddr,
        kind: MsgKind,
        payload: Bytes,
        opts: CallOptions,
    ) -> Result<Bytes, TransportError> {
        let m = shingle_metrics::get();
        let _inflight = shingle_metrics::InFlight::new(&m.rpc_client_inflight);
        let started = Instant::now();
        let (r, fabric) = self.call_any(peer, kind, payload, opts).await;
        let name = shingle_metrics::kind_name(kind.0);
        m.rpc_client_seconds
            .get_or_create(&shingle_metrics::KindFabric { kind: name, fabric })
            .observe(started.elapsed().as_secs_f64());
        if r.is_err() {
            m.rpc_client_errors
                .get_or_create(&shingle_metrics::Kind { kind: name })
                .inc();
        }
        r
    }
}

impl PeerClient {
    /// A call over RDMA or TCP, and which it went over.
    async fn call_any(
        &self,
        peer: SocketAddr,
        kind: MsgKind,
        payload: Bytes,
        opts: CallOptions,
    ) -> (Result<Bytes, TransportError>, &'static str) {
        // Service calls (and pings) go over the peer's RDMA queue pair when there is one;
        // the RDMA handshake and key resolution always go over TCP.
        #[cfg(feature = "rdma")]
        if let Some(r) = self.inner.rdma.get()
            && (kind.0 >= MsgKind::FIRST_SERVICE || kind == MsgKind::PING)
        {
            let timeout = opts.timeout.unwrap_or(self.inner.config.request_timeout);
            if let Some(res) = r.call(self, peer, kind, &payload, timeout).await {
                return (res, "rdma");
            }
        }
        (self.call_tcp(peer, kind, payload, opts).await, "tcp")
    }

    /// A call over TCP whatever else is attached (the RDMA handshake uses it).
    pub(crate) async fn call_tcp(
        &self,
        peer: SocketAddr,
        kind: MsgKind,
        payload: Bytes,
        opts: CallOptions,
    ) -> Result<Bytes, TransportError> {
        match self.request(peer, kind, payload, 0, None, opts).await {
            Ok(Reply::Payload(b)) => Ok(b),
            Ok(Reply::Sink(b)) => Ok(b.freeze()),
            Err(f) => Err(f.error),
        }
    }
}

impl RemoteRead for PeerClient {
    async fn read_capped(
        &self,
        peer: SocketAddr,
        key: RegionKey,
        cap: Bytes,
        offset: u64,
        len: u32,
        buf: BytesMut,
    ) -> ReadOutcome {
        // The checks the NIC would make on our side: the key bounds the range.
        let in_bounds = offset.checked_add(u64::from(len)).is_some_and(|end| end <= key.len);
        if !in_bounds {
            let e = AccessError::OutOfBounds {
                offset,
                len: u64::from(len),
                region_len: key.len,
            };
            return (Err(e.into()), buf);
        }
        let out = self.read_tcp(peer, key, cap, offset, len, buf).await;
        if out.0.is_ok() {
            read_bytes("tcp", len);
        }
        out
    }

    async fn read_grant(
        &self,
        peer: SocketAddr,
        grant: &crate::window::Grant,
        buf: BytesMut,
    ) -> Result<BytesMut, BytesMut> {
        #[cfg(feature = "rdma")]
        if let Some(r) = self.inner.rdma.get() {
            let out = r.read_grant(self, peer, grant, buf).await;
            if out.is_ok() {
                read_bytes("rdma", grant.len);
            }
            return out;
        }
        let _ = (peer, grant);
        Err(buf)
    }
}

fn read_bytes(fabric: &'static str, len: u32) {
    shingle_metrics::get()
        .remote_read_bytes
        .get_or_create(&shingle_metrics::Fabric { fabric })
        .inc_by(u64::from(len));
}

impl PeerClient {
    async fn read_tcp(
        &self,
        peer: SocketAddr,
        key: RegionKey,
        cap: Bytes,
        offset: u64,
        len: u32,
        buf: BytesMut,
    ) -> ReadOutcome {
        let max = self.inner.config.max_frame_bytes;
        if len > max {
            return (Err(TransportError::TooLarge { len: len as usize, max }), buf);
        }
        let req = RemoteReadRequest {
            region: key.region,
            generation: key.generation,
            key_len: key.len,
            offset,
            len,
            cap,
        };
        let payload = Bytes::from(prost::Message::encode_to_vec(&req));
        match self
            .request(
                peer,
                MsgKind::REMOTE_READ,
                payload,
                len,
                Some(buf),
                CallOptions::default(),
            )
            .await
        {
            Ok(Reply::Sink(b)) if b.len() == len as usize => (Ok(()), b),
            Ok(Reply::Sink(b)) => {
                let e = TransportError::Decode {
                    peer,
                    message: format!("remote read returned {} bytes, asked {len}", b.len()),
                };
                (Err(e), b)
            }
            Ok(Reply::Payload(b)) => {
                let e = TransportError::Decode {
                    peer,
                    message: format!("remote read reply of {} bytes lost its buffer", b.len()),
                };
                (Err(e), BytesMut::new())
            }
            Err(Failed { error, sink }) => {
                let error = match error {
                    TransportError::Remote { status, .. } if is_access(&status) => {
                        access_error(&status, key, offset, len).into()
                    }
                    e => e,
                };
                (Err(error), sink.unwrap_or_default())
            }
        }
    }
}

pub(crate) fn is_access(s: &Status) -> bool {
    matches!(s.code, Code::UnknownRegion | Code::StaleGeneration | Code::OutOfBounds)
}

pub(crate) fn access_error(s: &Status, key: RegionKey, offset: u64, len: u32) -> AccessError {
    match s.code {
        Code::UnknownRegion => AccessError::UnknownRegion(key.region),
        Code::StaleGeneration => AccessError::StaleGeneration {
            region: key.region,
            generation: key.generation,
        },
        _ => AccessError::OutOfBounds {
            offset,
            len: u64::from(len),
            region_len: key.len,
        },
    }
}
