//! The server's RDMA side: queue pairs for clients (RPCs over SEND/RECV), each in a
//! protection domain of its own with a read window ([`crate::window`]) the client READs
//! granted bytes from.

use super::endpoint::Endpoint;
use super::{Device, NewQp, QpInfo, RDMA_CONNECT, RDMA_RELEASE, random_u64, register_in};
use crate::TransportConfig;
use crate::auth::Principal;
use crate::frame::{Frame, MsgKind, decode_frame};
use crate::server::{CallContext, Router};
use crate::status::{Code, Status};
use crate::window::{Grant, Release, Window, WindowAlloc};
use bytes::Bytes;
use parking_lot::Mutex;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::CompletionChannel;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tracing::{Instrument, debug, info_span, warn};

/// Queue pairs a server keeps at most (the oldest are closed first).
const MAX_SERVER_QPS: usize = 4096;

/// Bytes of each client connection's read window (pinned while the connection lives).
pub const WINDOW_BYTES: usize = 8 << 20;

/// Windows a server pins at most (1 GiB): queue pairs beyond get none, and their reads
/// are answered without grants (the client reads those bytes over TCP).
pub const MAX_WINDOWS: usize = 128;

/// A server's RDMA side: accepts queue pairs, gives each a read window (pinned at its
/// first use).
pub struct RdmaExport {
    dev: Arc<Device>,
    /// The service handlers RPCs over RDMA are dispatched to.
    router: Mutex<Option<Router>>,
    max_frame: u32,
    /// RPCs handled at once per queue pair (the TCP server's per-connection bound).
    per_qp: usize,
    state: Mutex<ExportState>,
    /// RPCs being handled; a graceful shutdown waits for them.
    inflight: AtomicUsize,
    closing: AtomicBool,
    /// Read windows pinned now.
    windows: Arc<AtomicUsize>,
}

#[derive(Default)]
struct ExportState {
    /// Queue pairs by client session, oldest first in `order`.
    qps: HashMap<u64, Served>,
    order: VecDeque<u64>,
}

/// One client's queue pair.
struct Served {
    ep: Arc<Endpoint>,
    conn: Arc<Conn>,
}

/// What the requests of one client's queue pair are served with.
struct Conn {
    /// Its RPCs handled at once.
    permits: Arc<Semaphore>,
    /// Its read window, made at the first request that places bytes.
    window: Arc<LazyWindow>,
    principal: Arc<Principal>,
}

impl Drop for RdmaExport {
    fn drop(&mut self) {
        for q in self.lock().qps.values() {
            q.ep.close();
        }
    }
}

/// Memory of a window: a heap block written through its raw pointer only.
struct WindowMem {
    ptr: NonNull<u8>,
    len: usize,
}

impl Drop for WindowMem {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` come from `Box::into_raw` of a boxed slice (`new`).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)) });
    }
}

// SAFETY: the block is owned; writes go to ranges the window's allocator hands out to
// one writer at a time (see `ServerWindow::place`).
unsafe impl Send for WindowMem {}
// SAFETY: as above.
unsafe impl Sync for WindowMem {}

/// A client connection's read window: [`WINDOW_BYTES`] registered once, remote read
/// only, in the connection's protection domain. Field order matters: the registration
/// is dropped (deregistered) before the memory is freed.
struct ServerWindow {
    mr: Arc<MemoryRegion>,
    mem: WindowMem,
    alloc: Mutex<WindowAlloc>,
    /// The server's queue pair of the connection.
    qpn: u32,
    /// The export's count of pinned windows (this one leaves it when dropped).
    count: Arc<AtomicUsize>,
}

impl Drop for ServerWindow {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for ServerWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerWindow")
            .field("qpn", &self.qpn)
            .field("bytes", &self.mem.len)
            .finish()
    }
}

impl ServerWindow {
    fn new(pd: &Arc<ProtectionDomain>, len: usize, qpn: u32, count: Arc<AtomicUsize>) -> Result<ServerWindow, String> {
        let cap = u32::try_from(len).map_err(|_| format!("window of {len} bytes"))?;
        let block = Box::into_raw(vec![0u8; len].into_boxed_slice());
        let mem = WindowMem {
            ptr: NonNull::new(block.cast::<u8>()).ok_or("window allocation")?,
            len,
        };
        // SAFETY: `mem` lives as long as the registration (declared after it in the
        // struct, so dropped after it); remote read only.
        let mr = unsafe { register_in(pd, mem.ptr.as_ptr(), len, AccessFlags::RemoteRead) }?;
        Ok(ServerWindow {
            mr,
            mem,
            alloc: Mutex::new(WindowAlloc::new(cap)),
            qpn,
            count,
        })
    }

    fn place(&self, bytes: &[u8]) -> Option<Grant> {
        let len = u32::try_from(bytes.len()).ok()?;
        // Tokens no client can guess: only the client this grant is answered to can
        // hand the range back, and only after the copy below (it learns the token from
        // the answer).
        let token = random_u64();
        let at = self.alloc.lock().place(len, token)?;
        // SAFETY: [at, at + len) is inside the block (the allocator's bound) and ours
        // alone until the token is released (see above).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.ptr.as_ptr().add(at as usize), bytes.len());
        }
        Some(Grant {
            addr: self.mem.ptr.as_ptr() as u64 + u64::from(at),
            rkey: self.mr.rkey(),
            len,
            token,
            qpn: self.qpn,
        })
    }

    fn release(&self, tokens: &[u64]) {
        let mut a = self.alloc.lock();
        for t in tokens {
            a.release(*t);
        }
    }
}

/// A connection's window, pinned only once the connection places bytes (queue pairs
/// that carry only RPCs, e.g. between metadata nodes, pin none).
struct LazyWindow {
    pd: Arc<ProtectionDomain>,
    qpn: u32,
    peer: SocketAddr,
    /// The export's count of pinned windows.
    count: Arc<AtomicUsize>,
    state: Mutex<Made>,
}

enum Made {
    /// Not yet (or refused for the [`MAX_WINDOWS`] bound: tried again at the next place).
    Not,
    Yes(Arc<ServerWindow>),
    /// The NIC refused the registration: this connection's reads go over TCP.
    Failed,
}

impl std::fmt::Debug for LazyWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyWindow").field("qpn", &self.qpn).finish()
    }
}

impl LazyWindow {
    /// The window, made now if it is not yet and the [`MAX_WINDOWS`] bound allows.
    fn get(&self) -> Option<Arc<ServerWindow>> {
        let mut st = self.state.lock();
        match &*st {
            Made::Yes(w) => return Some(w.clone()),
            Made::Failed => return None,
            Made::Not => {}
        }
        let taken = self.count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < MAX_WINDOWS).then_some(n + 1)
        });
        if taken.is_err() {
            debug!(peer = %self.peer, "{MAX_WINDOWS} read windows pinned already; this read goes over TCP");
            return None;
        }
        match ServerWindow::new(&self.pd, WINDOW_BYTES, self.qpn, self.count.clone()) {
            Ok(w) => {
                let w = Arc::new(w);
                *st = Made::Yes(w.clone());
                Some(w)
            }
            Err(e) => {
                self.count.fetch_sub(1, Ordering::Relaxed);
                warn!(peer = %self.peer, error = %e, "cannot register a read window; this client's reads go over TCP");
                *st = Made::Failed;
                None
            }
        }
    }

    fn release(&self, tokens: &[u64]) {
        if let Made::Yes(w) = &*self.state.lock() {
            w.release(tokens);
        }
    }
}

impl Window for LazyWindow {
    fn place(&self, bytes: &[u8]) -> Option<Grant> {
        self.get()?.place(bytes)
    }
}

impl RdmaExport {
    /// Serves RPCs and read windows over `dev`, with the frame and in-flight limits of
    /// `config` (the server's).
    pub fn new(dev: Arc<Device>, config: &TransportConfig) -> Arc<RdmaExport> {
        Arc::new(RdmaExport {
            dev,
            router: Mutex::new(None),
            max_frame: config.max_frame_bytes,
            per_qp: config.max_inflight_requests as usize,
            state: Mutex::new(ExportState::default()),
            inflight: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            windows: Arc::default(),
        })
    }

    /// Read windows pinned now (one per client queue pair that placed bytes, up to
    /// [`MAX_WINDOWS`]).
    pub fn windows(&self) -> usize {
        self.windows.load(Ordering::Relaxed)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, ExportState> {
        self.state.lock()
    }

    /// The device served.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Queue pairs open now.
    pub fn queue_pairs(&self) -> usize {
        self.lock().qps.len()
    }

    /// Closes the queue pairs (and so the windows) of clients `drop` picks, e.g. those
    /// whose key was revoked: their grants die with them. Returns how many closed.
    pub fn close_clients(&self, drop: impl Fn(&Principal) -> bool) -> usize {
        let mut st = self.lock();
        let gone: Vec<u64> = st
            .qps
            .iter()
            .filter(|(_, q)| drop(&q.conn.principal))
            .map(|(s, _)| *s)
            .collect();
        for s in &gone {
            if let Some(q) = st.qps.remove(s) {
                q.ep.close();
            }
        }
        let ExportState { qps, order } = &mut *st;
        order.retain(|s| qps.contains_key(s));
        gone.len()
    }

    /// Adds the handshake handler to `router`; RPCs arriving over RDMA are
    /// dispatched to `router`'s handlers. A graceful server shutdown waits for RPCs in
    /// flight over RDMA, then closes every queue pair.
    pub fn routes(self: &Arc<Self>, router: Router) -> Router {
        *self.router.lock() = Some(router.clone());
        let e = self.clone();
        let router = router.transport_raw(RDMA_CONNECT, move |ctx: CallContext, payload: Bytes| {
            let e = e.clone();
            async move {
                let req: QpInfo = decode(&payload)?;
                let reply = e.accept(ctx.peer, ctx.principal.clone(), &req)?;
                Ok(Bytes::from(prost::Message::encode_to_vec(&reply)))
            }
        });
        let e = self.clone();
        router.on_shutdown(Arc::new(move |grace| {
            let e = e.clone();
            Box::pin(async move { e.shutdown(grace).await })
        }))
    }

    /// Refuses new RPCs, waits up to `grace` for those in flight, closes every queue pair.
    pub async fn shutdown(&self, grace: Duration) {
        self.closing.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + grace;
        while self.inflight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let qps: Vec<Arc<Endpoint>> = {
            let mut st = self.lock();
            st.order.clear();
            st.qps.drain().map(|(_, q)| q.ep).collect()
        };
        // Replies already posted, then a close notice, go out before the queue pairs close.
        let goodbyes: Vec<_> = qps
            .iter()
            .map(|q| {
                let q = q.clone();
                tokio::spawn(async move { q.say_goodbye().await })
            })
            .collect();
        for g in goodbyes {
            let _ = g.await;
        }
        for q in qps {
            q.close();
        }
    }

    fn accept(
        self: &Arc<Self>,
        peer: SocketAddr,
        principal: Arc<Principal>,
        remote: &QpInfo,
    ) -> Result<QpInfo, Status> {
        if self.closing.load(Ordering::Relaxed) {
            return Err(Status::new(Code::ShuttingDown, "the server is shutting down"));
        }
        let fail = |why: String| Status::new(Code::Internal, format!("RDMA queue pair for {peer}: {why}"));
        let channel = CompletionChannel::new(&self.dev.ctx).map_err(|e| fail(e.to_string()))?;
        // A protection domain of the connection's own: its window's rkey is valid on this
        // queue pair only.
        let pd = self.dev.new_pd().map_err(fail)?;
        let NewQp { mut qp, cq, psn } = self
            .dev
            .new_qp(&pd, Some(&channel), AccessFlags::RemoteRead | AccessFlags::LocalWrite)
            .map_err(fail)?;
        self.dev.connect_qp(&mut qp, psn, remote).map_err(fail)?;
        let info = self.dev.info(&qp, psn, remote.session);
        let conn = Arc::new(Conn {
            permits: Arc::new(Semaphore::new(self.per_qp)),
            window: Arc::new(LazyWindow {
                pd: pd.clone(),
                qpn: info.qpn,
                peer,
                count: self.windows.clone(),
                state: Mutex::new(Made::Not),
            }),
            principal,
        });
        let weak = Arc::downgrade(self);
        let max_message = self.max_frame as usize + crate::frame::HEADER_LEN;
        let on = conn.clone();
        let ep = Endpoint::start(
            self.dev.clone(),
            pd,
            qp,
            cq,
            channel,
            max_message,
            Box::new(move |ep, id, msg| {
                if let Some(e) = weak.upgrade() {
                    e.on_message(peer, &on, ep, id, msg);
                }
            }),
        )
        .map_err(|e| fail(e.to_string()))?;
        self.keep(remote.session, Served { ep, conn });
        debug!(%peer, qpn = info.qpn, remote_qpn = remote.qpn, "RDMA queue pair ready");
        Ok(info)
    }
    /// Keeps a new queue pair (replacing the session's old one) and closes the oldest
    /// beyond [`MAX_SERVER_QPS`] and those of clients that went away.
    fn keep(&self, session: u64, served: Served) {
        let mut st = self.lock();
        // Queue pairs of clients that went away (their replies failed) are dropped.
        st.qps.retain(|_, q| !q.ep.is_broken());
        let ExportState { qps, order } = &mut *st;
        order.retain(|s| qps.contains_key(s));
        if let Some(old) = st.qps.insert(session, served) {
            old.ep.close();
        } else {
            st.order.push_back(session);
        }
        while st.qps.len() > MAX_SERVER_QPS {
            let Some(old) = st.order.pop_front() else { break };
            if let Some(q) = st.qps.remove(&old) {
                q.ep.close();
            }
        }
    }

    /// A whole message from a client: a request frame, handled in a task of its own.
    fn on_message(self: Arc<Self>, peer: SocketAddr, conn: &Arc<Conn>, ep: &Arc<Endpoint>, id: u64, msg: Bytes) {
        let frame = match decode_frame(&msg, self.max_frame) {
            Ok((f, used)) if used == msg.len() && !f.header.is_response() => f,
            Ok(_) => {
                warn!(%peer, "RDMA message is not one request frame; closing the queue pair");
                ep.close();
                return;
            }
            Err(e) => {
                warn!(%peer, error = %e, "malformed frame over RDMA; closing the queue pair");
                ep.close();
                return;
            }
        };
        if frame.header.kind == RDMA_RELEASE {
            // Grants read: handed back at once, in order with the requests that follow.
            match <Release as prost::Message>::decode(frame.payload) {
                Ok(r) => {
                    conn.window.release(&r.tokens);
                }
                Err(e) => {
                    warn!(%peer, error = %e, "undecodable release over RDMA; closing the queue pair");
                    ep.close();
                }
            }
            return;
        }
        let ep = ep.clone();
        let permits = conn.permits.clone();
        let window = Some(conn.window.clone() as Arc<dyn Window>);
        self.inflight.fetch_add(1, Ordering::Relaxed);
        let router = self.router.lock().clone();
        let closing = self.closing.load(Ordering::Relaxed);
        let header = frame.header;
        let principal = conn.principal.clone();
        let span = info_span!("rpc.server", otel.kind = "server", rpc.kind = %header.kind, %peer, fabric = "rdma", bytes_in = frame.payload.len());
        crate::trace::adopt(&span, &header.trace);
        tokio::spawn(
            async move {
                // The per-queue-pair bound, like the TCP server's per connection.
                let _permit = permits.acquire_owned().await.ok();
                let deadline = (header.timeout_ms > 0).then(|| Duration::from_millis(u64::from(header.timeout_ms)));
                let result = match (header.kind, router) {
                    _ if closing => Err(Status::new(Code::ShuttingDown, "the server is shutting down")),
                    (MsgKind::PING, _) => Ok(frame.payload),
                    (kind, Some(r)) => {
                        crate::server::dispatch(&r, peer, &principal, window, kind, deadline, frame.payload).await
                    }
                    (kind, None) => Err(Status::new(Code::UnknownKind, format!("no handler for {kind}"))),
                };
                let reply = match result {
                    Ok(b) if b.len() <= self.max_frame as usize => Frame {
                        header: header.response(false),
                        payload: b,
                    },
                    Ok(b) => error_frame(
                        &header,
                        Status::new(
                            Code::Internal,
                            format!("reply of {} bytes exceeds the frame limit", b.len()),
                        ),
                    ),
                    Err(s) => error_frame(&header, s),
                };
                match reply.encode() {
                    Ok(bytes) => {
                        if let Err(e) = ep.send_message(id, &bytes).await {
                            debug!(%peer, error = %e, "cannot send an RDMA reply");
                        }
                    }
                    Err(e) => warn!(error = %e, "cannot encode reply"),
                }
                self.inflight.fetch_sub(1, Ordering::Relaxed);
            }
            .instrument(span),
        );
    }
}

fn error_frame(request: &crate::frame::FrameHeader, s: Status) -> Frame {
    debug!(status = %s, "request failed");
    Frame {
        header: request.response(true),
        payload: Bytes::from(s.encode_to_vec()),
    }
}

fn decode<M: prost::Message + Default>(b: &[u8]) -> Result<M, Status> {
    M::decode(b).map_err(|e| Status::new(Code::InvalidRequest, format!("undecodable RDMA request: {e}")))
}
