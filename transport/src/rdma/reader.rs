//! The client's RDMA side: a queue pair per peer carrying RPCs (fragmented SENDs) and
//! one-sided READs of the bytes a peer granted in its read window; per-peer fallback to
//! TCP.

use super::endpoint::{BOUNCE_BYTES, Endpoint};
use super::{
    ACCESS_FALLBACK_FOR, Device, FALLBACK_FOR, NewQp, QpInfo, RDMA_CONNECT, RDMA_RELEASE, RdmaError, random_u64,
};
use crate::error::TransportError;
use crate::frame::{Frame, FrameHeader, MsgKind, decode_frame};
use crate::peer::PeerClient;
use crate::rpc::CallOptions;
use crate::status::{Code, Status};
use crate::window::{Grant, Release};
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

/// A client's RDMA side: queue pairs to peers, fallback state.
pub struct RdmaReader {
    dev: Arc<Device>,
    session: u64,
    peers: Mutex<HashMap<SocketAddr, PeerState>>,
    reads: AtomicU64,
    calls: AtomicU64,
    stale_grants: AtomicU64,
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
    /// The peer's queue pair number: grants name the queue pair they are valid on.
    remote_qpn: u32,
    /// Tokens of grants read, handed back before the next request.
    released: Mutex<Vec<u64>>,
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
    /// Grants not read over RDMA because they were answered on a queue pair since
    /// replaced (the caller read those bytes over TCP).
    pub stale_grants: u64,
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
            reads: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            stale_grants: AtomicU64::new(0),
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
            stale_grants: self.stale_grants.load(Ordering::Relaxed),
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
            if let Err(e) = self.hand_back(&p).await {
                self.fall_back(peer, &e);
                return Err(closed(peer, &e));
            }
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

    /// Reads the bytes of `grant` — answered by `peer` to a request this reader sent
    /// over RDMA — with one READ, and hands the grant back before the next request.
    /// `Err(buf)`: not read over RDMA (no queue pair to `peer` now, or another one than
    /// the grant's, or the READ failed and the peer falls back to TCP): the caller reads
    /// the bytes another way.
    pub async fn read_grant(
        &self,
        tcp: &PeerClient,
        peer: SocketAddr,
        grant: &Grant,
        buf: BytesMut,
    ) -> Result<BytesMut, BytesMut> {
        let Some(p) = self.ready(peer) else {
            return Err(buf);
        };
        if p.remote_qpn != grant.qpn {
            // Answered on a queue pair since replaced: its window is gone.
            self.stale_grants.fetch_add(1, Ordering::Relaxed);
            return Err(buf);
        }
        let r = self
            .read_on(
                &p.ep,
                grant.addr,
                grant.rkey,
                grant.len as usize,
                tcp.config().request_timeout,
                buf,
            )
            .await;
        p.released.lock().push(grant.token);
        match r {
            Ok(buf) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                Ok(buf)
            }
            Err((e, buf)) => {
                self.fall_back(peer, &e);
                Err(buf)
            }
        }
    }

    /// Hands back the grants read on `p` since its last request (one message, sent
    /// before the request: the peer frees them before it serves the request).
    async fn hand_back(&self, p: &Peer) -> Result<(), RdmaError> {
        let tokens = std::mem::take(&mut *p.released.lock());
        if tokens.is_empty() {
            return Ok(());
        }
        let id = p.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame {
            header: FrameHeader::request(RDMA_RELEASE, id),
            payload: Bytes::from(prost::Message::encode_to_vec(&Release { tokens })),
        }
        .encode()
        .map_err(|e| RdmaError::Post(format!("release: {e}")))?;
        p.ep.send_message(id, &frame).await
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

    /// READs `len` bytes at (`addr`, `rkey`) on `ep` into `buf` (cleared first): one
    /// READ per bounce buffer, all in flight at once.
    async fn read_on(
        &self,
        ep: &Arc<Endpoint>,
        addr: u64,
        rkey: u32,
        len: usize,
        timeout: Duration,
        mut buf: BytesMut,
    ) -> Result<BytesMut, (RdmaError, BytesMut)> {
        buf.clear();
        buf.reserve(len);
        let mut done = 0usize;
        let total = len;
        // The common case, one piece: straight into the caller's buffer. The READ runs in
        // a task of its own, so a caller dropping this future never frees memory the NIC
        // may still write.
        if total <= BOUNCE_BYTES {
            let ep = ep.clone();
            let task = tokio::spawn(async move { ep.read_into(addr, rkey, total, timeout, buf).await });
            return match task.await {
                Ok((Ok(()), buf)) => Ok(buf),
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
                let ep = ep.clone();
                tokio::spawn(async move {
                    let piece = BytesMut::with_capacity(n);
                    ep.read_into(addr + at as u64, rkey, n, timeout, piece).await
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
        match failed {
            Some(e) => Err((e, buf)),
            None => Ok(buf),
        }
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
            .new_qp(&self.dev.pd, Some(&channel), AccessFlags::LocalWrite)
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
            self.dev.pd.clone(),
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
            remote_qpn: theirs.qpn,
            released: Mutex::new(Vec::new()),
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
