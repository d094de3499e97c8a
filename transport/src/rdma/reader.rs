//! The client's RDMA side: a queue pair per peer carrying RPCs (fragmented SENDs) and
//! one-sided READs of the peer's registered regions; per-peer fallback to TCP.

use super::endpoint::{BOUNCE_BYTES, Endpoint};
use super::{
    ACCESS_FALLBACK_FOR, Device, FALLBACK_FOR, MAX_RESOLVED, NewQp, QpInfo, RDMA_CONNECT, RDMA_RESOLVE, RdmaError,
    ResolveRequest, Resolved, random_u64,
};
use crate::error::TransportError;
use crate::frame::{Frame, FrameHeader, MsgKind, decode_frame};
use crate::peer::PeerClient;
use crate::region::RegionKey;
use crate::rpc::{CallOptions, ReadOutcome};
use crate::status::{Code, Status};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::CompletionChannel;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, oneshot};
use tracing::{Instrument, debug, info, info_span, warn};

/// How often a call waiting for its reply checks the queue pair, and probes a peer
/// silent for that long (a dead peer fails the probe within about half a second).
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// A client's RDMA side: queue pairs to peers, resolved keys, fallback state.
pub struct RdmaReader {
    dev: Arc<Device>,
    session: u64,
    peers: Mutex<HashMap<SocketAddr, PeerState>>,
    /// Resolved keys by (peer, region, generation); `None`: the peer cannot register
    /// that region with its NIC, so it is read over TCP.
    resolved: Mutex<HashMap<(SocketAddr, u32, u32), Option<Resolved>>>,
    reads: AtomicU64,
    calls: AtomicU64,
    tcp_regions: AtomicU64,
    fallbacks: AtomicU64,
    fallback_for: Duration,
    connecting: tokio::sync::Mutex<()>,
}

enum PeerState {
    Ready(Arc<Peer>),
    Fallback { until: Instant },
}

/// A queue pair to one peer and the calls waiting for replies on it.
struct Peer {
    ep: Arc<Endpoint>,
    calls: Arc<Mutex<HashMap<u64, oneshot::Sender<Bytes>>>>,
    next_id: AtomicU64,
    permits: Semaphore,
}

/// Why no queue pair could be had: an RDMA problem (use TCP), or the peer cannot be
/// reached over TCP either (the request's answer).
enum Failure {
    Rdma(RdmaError),
    Tcp(TransportError),
}

impl From<RdmaError> for Failure {
    fn from(e: RdmaError) -> Self {
        Failure::Rdma(e)
    }
}

/// Removes a call's entry when its future ends, however it ends.
struct CallGuard<'a> {
    calls: &'a Mutex<HashMap<u64, oneshot::Sender<Bytes>>>,
    id: u64,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.calls.lock().remove(&self.id);
    }
}

/// Counters of the RDMA path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdmaStats {
    /// Reads completed over RDMA.
    pub reads: u64,
    /// RPCs answered over RDMA.
    pub calls: u64,
    /// Times a peer fell back to TCP.
    pub fallbacks: u64,
    /// Reads sent over TCP because the peer cannot register that region (the peer
    /// stays on RDMA for other regions).
    pub tcp_regions: u64,
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
            calls: AtomicU64::new(0),
            tcp_regions: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
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
            calls: self.calls.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            tcp_regions: self.tcp_regions.load(Ordering::Relaxed),
        }
    }

    /// The TCP connection to `peer` closed (a restart, a crash): its queue pair is
    /// probably dead too; the next call sets up a new one.
    pub(crate) fn peer_disconnected(&self, peer: SocketAddr) {
        let gone = {
            let mut peers = self.peers_lock();
            if matches!(peers.get(&peer), Some(PeerState::Ready(_))) {
                peers.remove(&peer)
            } else {
                None
            }
        };
        if gone.is_some() {
            // Calls in flight finish (or fail) on it; new ones set up a new queue pair.
            debug!(%peer, "TCP connection closed; the next request sets up a new RDMA queue pair");
        }
        self.forget_keys(peer);
    }

    /// An RPC over RDMA. `None`: not sent; the peer is on TCP for now (fallback, no
    /// RDMA offered, or the queue pair could not be set up): the caller uses TCP.
    /// Once sent, a failure is the call's error (like a TCP connection dying with a
    /// request in flight, it is not resent) and the peer falls back to TCP.
    pub(crate) async fn call(
        &self,
        tcp: &PeerClient,
        peer: SocketAddr,
        kind: MsgKind,
        payload: &Bytes,
        timeout: Duration,
    ) -> Option<Result<Bytes, TransportError>> {
        let max = tcp.config().max_frame_bytes;
        if !self.uses_rdma(peer) || payload.len() > max as usize {
            return None;
        }
        let p = match self.conn(tcp, peer).await {
            Ok(p) => p,
            Err(Failure::Tcp(e)) => return Some(Err(e)),
            Err(Failure::Rdma(e)) => {
                self.fall_back(peer, &e);
                return None;
            }
        };
        let started = Instant::now();
        let span = info_span!("rpc.client", otel.kind = "client", rpc.kind = %kind, %peer, fabric = "rdma", bytes_out = payload.len());
        let trace = crate::trace::inject(&span);
        let work = async {
            let Ok(_permit) = p.permits.acquire().await else {
                return Err(closed(peer, &p.ep.why()));
            };
            let id = p.next_id.fetch_add(1, Ordering::Relaxed);
            let mut header = FrameHeader::request(kind, id);
            let left = timeout.saturating_sub(started.elapsed());
            header.timeout_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX).max(1);
            header.trace = trace;
            let frame = Frame {
                header,
                payload: payload.clone(),
            }
            .encode()
            .map_err(|source| TransportError::Frame { peer, source })?;
            let (tx, mut rx) = oneshot::channel();
            p.calls.lock().insert(id, tx);
            let _guard = CallGuard { calls: &p.calls, id };
            if let Err(e) = p.ep.send_message(id, &frame).await {
                self.fall_back(peer, &e);
                return Err(closed(peer, &e));
            }
            loop {
                tokio::select! {
                    r = &mut rx => {
                        let Ok(msg) = r else { return Err(closed(peer, &p.ep.why())) };
                        return self.reply(peer, &p, kind, &msg);
                    }
                    _ = tokio::time::sleep(PROBE_EVERY.min(timeout.saturating_sub(started.elapsed()))) => {
                        if p.ep.is_broken() {
                            let why = p.ep.why();
                            self.fall_back(peer, &why);
                            return Err(closed(peer, &why));
                        }
                        if started.elapsed() >= timeout {
                            return Err(TransportError::Timeout { peer, kind, after: timeout });
                        }
                        if p.ep.idle_for() >= PROBE_EVERY {
                            let ep = p.ep.clone();
                            tokio::spawn(async move { ep.probe().await });
                        }
                    }
                }
            }
        };
        Some(work.instrument(span).await)
    }

    fn reply(&self, peer: SocketAddr, p: &Peer, kind: MsgKind, msg: &[u8]) -> Result<Bytes, TransportError> {
        let frame = match decode_frame(msg, u32::MAX >> 2) {
            Ok((f, used)) if used == msg.len() && f.header.is_response() && f.header.kind == kind => f,
            Ok(_) => {
                p.ep.close();
                return Err(TransportError::ConnectionClosed {
                    peer,
                    reason: "RDMA reply is not the response frame of the call".into(),
                });
            }
            Err(source) => {
                p.ep.close();
                return Err(TransportError::Frame { peer, source });
            }
        };
        self.calls.fetch_add(1, Ordering::Relaxed);
        if frame.header.is_error() {
            return Err(TransportError::Remote {
                peer,
                status: Status::decode(&frame.payload),
            });
        }
        Ok(frame.payload)
    }

    /// True when reads of `peer` go over RDMA now (no fallback in force).
    pub fn uses_rdma(&self, peer: SocketAddr) -> bool {
        !matches!(self.peers_lock().get(&peer), Some(PeerState::Fallback { until }) if Instant::now() < *until)
    }

    fn peers_lock(&self) -> parking_lot::MutexGuard<'_, HashMap<SocketAddr, PeerState>> {
        self.peers.lock()
    }

    /// Reads over RDMA. `Err(buf)`: the peer is on TCP for now (fallback in force, or
    /// this read failed on RDMA and was not done): the caller reads over TCP.
    pub(crate) async fn read(
        &self,
        tcp: &PeerClient,
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
            // This region only: the peer stays on RDMA for the others.
            Err((RdmaError::NotRegistrable(_), buf)) => {
                self.tcp_regions.fetch_add(1, Ordering::Relaxed);
                Err(buf)
            }
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
        tcp: &PeerClient,
        peer: SocketAddr,
        key: RegionKey,
        offset: u64,
        len: u32,
        buf: BytesMut,
    ) -> Result<ReadOutcome, (RdmaError, BytesMut)> {
        let r = self.try_read(tcp, peer, key, offset, len, buf).await;
        if let Err((e, _)) = &r
            && !matches!(e, RdmaError::NotRegistrable(_))
        {
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
            RdmaError::NotOffered => info!(%peer, "peer serves no RDMA; using TCP"),
            _ => {
                warn!(%peer, error = %why, "RDMA to this peer failed; using TCP for {period:?}, then reconnecting")
            }
        }
    }

    fn drop_conn(&self, peer: SocketAddr, why: &RdmaError) {
        let gone = self.peers_lock().remove(&peer);
        if let Some(PeerState::Ready(p)) = gone {
            debug!(%peer, error = %why, "RDMA queue pair dropped");
            p.ep.close();
        }
        self.forget_keys(peer);
    }

    fn forget_keys(&self, peer: SocketAddr) {
        self.resolved.lock().retain(|(p, _, _), _| *p != peer);
    }

    async fn try_read(
        &self,
        tcp: &PeerClient,
        peer: SocketAddr,
        key: RegionKey,
        offset: u64,
        len: u32,
        mut buf: BytesMut,
    ) -> Result<ReadOutcome, (RdmaError, BytesMut)> {
        let conn = match self.conn(tcp, peer).await {
            Ok(c) => c,
            Err(Failure::Rdma(e)) => return Err((e, buf)),
            Err(Failure::Tcp(e)) => return Ok((Err(e), buf)),
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
        // The common case, one piece: straight into the caller's buffer. The READ runs in
        // a task of its own, so a caller dropping this future never frees memory the NIC
        // may still write.
        if total <= BOUNCE_BYTES {
            let ep = conn.ep.clone();
            let at = target.addr + offset;
            let task = tokio::spawn(async move { ep.read_into(at, target.rkey, total, timeout, buf).await });
            return match task.await {
                Ok((Ok(()), buf)) => {
                    self.reads.fetch_add(1, Ordering::Relaxed);
                    Ok((Ok(()), buf))
                }
                Ok((Err(e), buf)) => Err((e, buf)),
                Err(e) => Err((RdmaError::Post(format!("read task: {e}")), BytesMut::new())),
            };
        }
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
                let conn = conn.ep.clone();
                tokio::spawn(async move {
                    let piece = BytesMut::with_capacity(n);
                    conn.read_into(target.addr + offset + at as u64, target.rkey, n, timeout, piece)
                        .await
                })
            })
            .collect();
        let mut failed = None;
        for r in reads {
            match r.await {
                Ok((Ok(()), bytes)) if failed.is_none() => buf.extend_from_slice(&bytes),
                Ok((Ok(()), _)) => {}
                Ok((Err(e), _)) => failed = failed.or(Some(e)),
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
        tcp: &PeerClient,
        peer: SocketAddr,
        key: RegionKey,
    ) -> Result<Result<Resolved, TransportError>, RdmaError> {
        let id = (peer, key.region, key.generation);
        match self.resolved.lock().get(&id) {
            Some(Some(r)) => return Ok(Ok(*r)),
            Some(None) => return Err(RdmaError::NotRegistrable("as answered before".into())),
            None => {}
        }
        let req = ResolveRequest {
            region: key.region,
            generation: key.generation,
            key_len: key.len,
        };
        let payload = Bytes::from(prost::Message::encode_to_vec(&req));
        match tcp.call_tcp(peer, RDMA_RESOLVE, payload, CallOptions::default()).await {
            Ok(b) => {
                let r: Resolved =
                    prost::Message::decode(b).map_err(|e| RdmaError::Setup(format!("resolve reply: {e}")))?;
                self.remember(id, Some(r));
                Ok(Ok(r))
            }
            Err(TransportError::Remote { status, .. }) if status.code == Code::NotRegistrable => {
                self.remember(id, None);
                Err(RdmaError::NotRegistrable(status.message))
            }
            Err(TransportError::Remote { status, .. }) if crate::peer::is_access(&status) => {
                Ok(Err(crate::peer::access_error(&status, key, 0, 0).into()))
            }
            Err(TransportError::Remote { status, .. }) if status.code == Code::UnknownKind => {
                Err(RdmaError::NotOffered)
            }
            // Not an RDMA problem: the read's answer, as over TCP.
            Err(e) => Ok(Err(e)),
        }
    }

    fn remember(&self, id: (SocketAddr, u32, u32), target: Option<Resolved>) {
        let mut cache = self.resolved.lock();
        if cache.len() >= MAX_RESOLVED {
            // Mostly keys of regions long revoked; re-resolving costs one RPC.
            cache.clear();
        }
        cache.insert(id, target);
    }

    async fn conn(&self, tcp: &PeerClient, peer: SocketAddr) -> Result<Arc<Peer>, Failure> {
        if let Some(p) = self.ready(peer) {
            return Ok(p);
        }
        // One handshake at a time: two would replace each other's queue pair.
        let _one = self.connecting.lock().await;
        if let Some(p) = self.ready(peer) {
            return Ok(p);
        }
        let channel = CompletionChannel::new(&self.dev.ctx).map_err(|e| RdmaError::Setup(e.to_string()))?;
        let NewQp { mut qp, cq, psn } = self
            .dev
            .new_qp(Some(&channel), AccessFlags::LocalWrite)
            .map_err(RdmaError::Setup)?;
        let mine = self.dev.info(&qp, psn, self.session);
        let payload = Bytes::from(prost::Message::encode_to_vec(&mine));
        let reply = match tcp.call_tcp(peer, RDMA_CONNECT, payload, CallOptions::default()).await {
            Ok(b) => b,
            Err(TransportError::Remote { status, .. }) if status.code == Code::UnknownKind => {
                return Err(RdmaError::NotOffered.into());
            }
            Err(e @ TransportError::Remote { .. }) => return Err(RdmaError::Setup(format!("handshake: {e}")).into()),
            Err(e) => return Err(Failure::Tcp(e)),
        };
        let theirs: QpInfo =
            prost::Message::decode(reply).map_err(|e| RdmaError::Setup(format!("handshake reply: {e}")))?;
        self.dev.connect_qp(&mut qp, psn, &theirs).map_err(RdmaError::Setup)?;
        let calls: Arc<Mutex<HashMap<u64, oneshot::Sender<Bytes>>>> = Arc::default();
        let deliver = calls.clone();
        let max_message = tcp.config().max_frame_bytes as usize + crate::frame::HEADER_LEN;
        let ep = Endpoint::start(
            self.dev.clone(),
            qp,
            cq,
            channel,
            max_message,
            Box::new(move |_, id, msg| {
                if let Some(tx) = deliver.lock().remove(&id) {
                    let _ = tx.send(msg);
                }
            }),
        )?;
        let p = Arc::new(Peer {
            ep,
            calls,
            next_id: AtomicU64::new(1),
            permits: Semaphore::new(tcp.config().max_inflight_requests as usize),
        });
        info!(%peer, device = %self.dev.name, qpn = theirs.qpn, "talking to this peer over RDMA");
        self.peers_lock().insert(peer, PeerState::Ready(p.clone()));
        Ok(p)
    }

    fn ready(&self, peer: SocketAddr) -> Option<Arc<Peer>> {
        match self.peers_lock().get(&peer) {
            Some(PeerState::Ready(p)) if !p.ep.is_broken() => Some(p.clone()),
            _ => None,
        }
    }
}

fn closed(peer: SocketAddr, why: &RdmaError) -> TransportError {
    TransportError::ConnectionClosed {
        peer,
        reason: format!("RDMA: {why}"),
    }
}
