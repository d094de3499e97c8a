//! The TCP server: authenticates every connection, reads frames with bounded
//! concurrency, dispatches requests to a [`Router`] and answers remote reads from its
//! [`RegionTable`].
//!
//! A peer that fails the handshake or sends a malformed frame has its connection
//! closed with one log line; everyone else is served on. Shutdown stops reading new
//! requests, lets the ones in flight finish (within the grace period) and flushes
//! their replies before closing.

use crate::auth::{self, ClusterSecret, Principal};
use crate::config::TransportConfig;
use crate::frame::{FrameHeader, MsgKind};
use crate::region::{AccessError, RegionTable};
use crate::rpc::{RemoteReadRequest, Rpc};
use crate::status::{Code, Status};
use crate::wire::{self, Outgoing};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a handler knows about the request it serves.
#[derive(Clone, Debug)]
pub struct CallContext {
    /// The authenticated peer.
    pub peer: SocketAddr,
    /// Who it authenticated as.
    pub principal: Arc<Principal>,
    /// The message kind.
    pub kind: MsgKind,
    /// When the caller stops waiting, if it said.
    pub deadline: Option<Instant>,
    /// The connection's read window, when the request came over RDMA: bytes placed
    /// there are read by the caller with one RDMA READ ([`crate::window`]).
    pub window: Option<Arc<dyn crate::window::Window>>,
}

/// A request handler for one message kind.
pub trait Handler: Send + Sync + 'static {
    /// Serves one request.
    fn handle(&self, ctx: CallContext, payload: Bytes) -> BoxFuture<Result<Bytes, Status>>;
}

impl<F, Fut> Handler for F
where
    F: Fn(CallContext, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, Status>> + Send + 'static,
{
    fn handle(&self, ctx: CallContext, payload: Bytes) -> BoxFuture<Result<Bytes, Status>> {
        Box::pin(self(ctx, payload))
    }
}

/// Decides whether a client (a [`Principal::Client`]) may send a service kind; the
/// cluster's own principal may send any. See [`Router::guard`].
pub type Guard = Arc<dyn Fn(&Principal, MsgKind) -> Result<(), Status> + Send + Sync>;

/// Maps message kinds to handlers.
#[derive(Clone, Default)]
pub struct Router {
    handlers: HashMap<MsgKind, Arc<dyn Handler>>,
    /// Asked before every service request of a client; none: clients may send nothing.
    guard: Option<Guard>,
    /// Run by [`Server::shutdown`] with the grace period (e.g. draining RDMA queue pairs).
    shutdown_hooks: Vec<ShutdownHook>,
    /// Checks the capabilities client keys show to read regions registered for an
    /// object; none: client keys read no region.
    region_caps: Option<crate::cap::CapKey>,
}

/// Work a graceful shutdown waits for, given the grace period.
pub(crate) type ShutdownHook = Arc<dyn Fn(Duration) -> BoxFuture<()> + Send + Sync>;

impl Router {
    /// An empty router (the transport still answers PING and REMOTE_READ).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a handler of raw payloads.
    ///
    /// # Panics
    /// On a kind reserved for the transport or registered twice: a programming error
    /// caught at start-up.
    pub fn raw(mut self, kind: MsgKind, handler: impl Handler) -> Self {
        assert!(
            kind.0 >= MsgKind::FIRST_SERVICE,
            "message kind {kind} is reserved for the transport"
        );
        let prev = self.handlers.insert(kind, Arc::new(handler));
        assert!(prev.is_none(), "message kind {kind} registered twice");
        self
    }

    /// Registers a handler for a kind the transport itself defines (below
    /// [`MsgKind::FIRST_SERVICE`], e.g. the RDMA handshake).
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn transport_raw(mut self, kind: MsgKind, handler: impl Handler) -> Self {
        assert!(
            kind.0 < MsgKind::FIRST_SERVICE && kind != MsgKind::PING && kind != MsgKind::REMOTE_READ,
            "message kind {kind} is not a free transport kind"
        );
        let prev = self.handlers.insert(kind, Arc::new(handler));
        assert!(prev.is_none(), "message kind {kind} registered twice");
        self
    }

    /// Registers a typed handler for `R`.
    pub fn rpc<R, F, Fut>(self, handler: F) -> Self
    where
        R: Rpc,
        F: Fn(CallContext, R::Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R::Response, Status>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        shingle_metrics::name_kind(R::KIND.0, shingle_metrics::short_type_name::<R>());
        self.raw(R::KIND, move |ctx: CallContext, payload: Bytes| {
            let handler = handler.clone();
            async move {
                let req = <R::Request as prost::Message>::decode(payload).map_err(|e| {
                    Status::new(Code::InvalidRequest, format!("cannot decode request {}: {e}", R::KIND))
                })?;
                let resp = handler(ctx, req).await?;
                Ok(Bytes::from(prost::Message::encode_to_vec(&resp)))
            }
        })
    }

    /// Sets what clients may send: `guard` is asked before each of their requests
    /// of a service kind (the transport's own kinds, PING, REMOTE_READ and the RDMA
    /// handshake, are open to every authenticated peer). Without a guard, a client's
    /// service requests are all refused.
    pub fn guard(mut self, guard: Guard) -> Self {
        self.guard = Some(guard);
        self
    }

    /// Lets client keys read a region registered for an object
    /// ([`RegionTable::register_for`]) when they show a read capability for that object
    /// signed with `key` ([`crate::cap`]).
    pub fn region_caps(mut self, key: crate::cap::CapKey) -> Self {
        self.region_caps = Some(key);
        self
    }

    /// Merges another router's handlers into this one.
    ///
    /// # Panics
    /// When both have a guard (one server, one rule).
    pub fn merge(mut self, other: Router) -> Self {
        for (k, h) in other.handlers {
            let prev = self.handlers.insert(k, h);
            assert!(prev.is_none(), "message kind {k} registered twice");
        }
        if let Some(g) = other.guard {
            assert!(self.guard.is_none(), "two guards merged");
            self.guard = Some(g);
        }
        self.region_caps = self.region_caps.or(other.region_caps);
        self.shutdown_hooks.extend(other.shutdown_hooks);
        self
    }

    /// Adds work a graceful shutdown runs (after the TCP connections drained).
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn on_shutdown(mut self, hook: ShutdownHook) -> Self {
        self.shutdown_hooks.push(hook);
        self
    }
}

struct Shared {
    config: TransportConfig,
    secret: ClusterSecret,
    router: Router,
    regions: Arc<RegionTable>,
    connections: Arc<Semaphore>,
    /// The server's byte budget ([`TransportConfig::max_server_bytes`]).
    bytes: Arc<Semaphore>,
}

/// A running server. Dropping it without [`Server::shutdown`] aborts at once.
pub struct Server {
    local_addr: SocketAddr,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    grace: Duration,
    hooks: Vec<ShutdownHook>,
}

/// Connections accepted at most at once per server.
const MAX_CONNECTIONS: usize = 4096;

/// How long a finished request waits for budget for a reply larger than its request
/// before it answers `Overloaded` instead (small error replies need no budget, so
/// requests waiting on each other cannot hold the budget for ever).
const REPLY_BUDGET_WAIT: Duration = Duration::from_secs(1);

fn budget_permits(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX).min(Semaphore::MAX_PERMITS)
}

/// Bytes of a connection's and of the server's budget held by one request: taken before
/// its payload is read, grown to its reply's size, given back once the reply is written.
struct Budget {
    conn: Arc<Semaphore>,
    server: Arc<Semaphore>,
    held: u32,
    permits: Vec<tokio::sync::OwnedSemaphorePermit>,
}

impl Budget {
    fn new(conn: &Arc<Semaphore>, server: &Arc<Semaphore>) -> Budget {
        Budget {
            conn: conn.clone(),
            server: server.clone(),
            held: 0,
            permits: Vec::new(),
        }
    }

    /// Grows the holding to `bytes` (waits while the budgets are spent).
    async fn grow_to(&mut self, bytes: u32) -> Result<(), tokio::sync::AcquireError> {
        if bytes <= self.held {
            return Ok(());
        }
        let more = bytes - self.held;
        let c = self.conn.clone().acquire_many_owned(more).await?;
        let s = self.server.clone().acquire_many_owned(more).await?;
        self.permits.extend([c, s]);
        self.held = bytes;
        Ok(())
    }
}

impl Server {
    /// Binds `addr` and starts serving.
    pub async fn bind(
        addr: SocketAddr,
        config: TransportConfig,
        secret: ClusterSecret,
        router: Router,
        regions: Arc<RegionTable>,
    ) -> std::io::Result<Server> {
        config.validate().map_err(std::io::Error::other)?;
        if secret.identity().is_some() {
            return Err(std::io::Error::other(auth::AuthError::ClientKey));
        }
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let grace = config.shutdown_grace;
        let config_bytes = config.max_server_bytes;
        let hooks = router.shutdown_hooks.clone();
        let shared = Arc::new(Shared {
            config,
            secret,
            router,
            regions,
            connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            bytes: Arc::new(Semaphore::new(budget_permits(config_bytes))),
        });
        tracker.spawn(accept_loop(listener, shared, shutdown.clone(), tracker.clone()));
        info!(addr = %local_addr, "transport listening");
        Ok(Server {
            local_addr,
            shutdown,
            tracker,
            grace,
            hooks,
        })
    }

    /// The bound address (useful after binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, finishes requests in flight (up to the grace period), flushes
    /// their replies and closes every connection.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.tracker.close();
        let hooks = futures_join(self.hooks.iter().map(|h| h(self.grace)));
        let (tcp, ()) = tokio::join!(
            tokio::time::timeout(self.grace + Duration::from_secs(1), self.tracker.wait()),
            hooks
        );
        if tcp.is_err() {
            warn!(addr = %self.local_addr, "shutdown grace period ran out with requests in flight");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, shutdown: CancellationToken, tracker: TaskTracker) {
    loop {
        let permit = tokio::select! {
            p = shared.connections.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = shutdown.cancelled() => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.cancelled() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                let shutdown = shutdown.clone();
                tracker.spawn(async move {
                    serve_connection(stream, peer, shared, shutdown).await;
                    drop(permit);
                });
            }
            Err(e) => {
                // Out of file descriptors and similar: do not spin.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_connection(mut stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, shutdown: CancellationToken) {
    let Some(principal) = authenticate(&mut stream, peer, &shared).await else {
        return;
    };
    let (rd, wr) = stream.into_split();
    let max_inflight = shared.config.max_inflight_requests as usize;
    let (tx, rx) = mpsc::channel(max_inflight);
    let conn_dead = CancellationToken::new();
    let writer = tokio::spawn(wire::writer_loop(wr, rx, conn_dead.clone()));
    let permits = Arc::new(Semaphore::new(max_inflight));
    let mut reader = Reader {
        rd: BufReader::with_capacity(64 << 10, rd),
        peer,
        conn_bytes: Arc::new(Semaphore::new(budget_permits(shared.config.max_inflight_bytes))),
        shutdown: shutdown.clone(),
        conn_dead: conn_dead.clone(),
    };
    let handlers = TaskTracker::new();
    loop {
        // Back-pressure: with every permit taken we stop reading, and TCP pushes back.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.cancelled() => break,
            _ = conn_dead.cancelled() => break,
        };
        let Some((header, payload, budget)) = reader.next(&shared).await else {
            break;
        };
        if matches!(header.kind, MsgKind::PING | MsgKind::REMOTE_READ) {
            // Served by the transport without blocking: answer inline, saving a task
            // hop. The reply queue holds as many frames as there are permits, so the
            // send cannot wait.
            serve_request(&shared, peer, &principal, header, payload, budget, tx.clone()).await;
            drop(permit);
            continue;
        }
        let shared = shared.clone();
        let tx = tx.clone();
        let principal = principal.clone();
        handlers.spawn(async move {
            serve_request(&shared, peer, &principal, header, payload, budget, tx).await;
            drop(permit);
        });
    }
    handlers.close();
    if tokio::time::timeout(shared.config.shutdown_grace, handlers.wait())
        .await
        .is_err()
    {
        warn!(%peer, "requests still running after the grace period; closing connection");
        conn_dead.cancel();
    }
    drop(tx);
    match writer.await {
        Ok(Ok(())) | Err(_) => {}
        Ok(Err(e)) => debug!(%peer, error = %e, "connection write failed"),
    }
    debug!(%peer, "connection closed");
}

/// The connection's handshake: who the peer proved to be, or `None` (logged).
async fn authenticate(stream: &mut TcpStream, peer: SocketAddr, shared: &Shared) -> Option<Arc<Principal>> {
    match auth::accept(stream, &shared.secret, shared.config.handshake_timeout).await {
        Ok(p) => {
            debug!(%peer, principal = ?p, "peer authenticated");
            Some(Arc::new(p))
        }
        Err(e) => {
            match &e {
                // Closed before proving anything: a liveness probe (a manager checking that
                // a node still listens) or a port scan, not a failed authentication.
                auth::AuthError::Io(io)
                    if matches!(
                        io.kind(),
                        std::io::ErrorKind::UnexpectedEof
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::BrokenPipe
                    ) =>
                {
                    debug!(%peer, "connection closed before the handshake finished");
                }
                _ => warn!(%peer, error = %e, "refused connection: authentication failed"),
            }
            None
        }
    }
}

/// The read side of a served connection.
struct Reader {
    rd: BufReader<tokio::net::tcp::OwnedReadHalf>,
    peer: SocketAddr,
    /// The connection's budget of request bytes in flight.
    conn_bytes: Arc<Semaphore>,
    shutdown: CancellationToken,
    conn_dead: CancellationToken,
}

impl Reader {
    /// The next request: its header, its payload and the memory budget it holds. `None`
    /// when the connection is done: closed, failed (logged), sent something that is
    /// not a well-formed request, or shut down.
    async fn next(&mut self, shared: &Shared) -> Option<(FrameHeader, Bytes, Budget)> {
        let peer = self.peer;
        let raw = tokio::select! {
            r = wire::read_header(&mut self.rd) => r,
            _ = self.shutdown.cancelled() => return None,
            _ = self.conn_dead.cancelled() => return None,
        };
        let raw = match raw {
            Ok(Some(raw)) => raw,
            Ok(None) => return None,
            Err(e) => {
                debug!(%peer, error = %e, "connection read failed");
                return None;
            }
        };
        let header = match FrameHeader::decode(&raw, shared.config.max_frame_bytes) {
            Ok(h) if !h.is_response() => h,
            Ok(h) => {
                warn!(%peer, kind = %h.kind, "closing connection: response frame sent to a server");
                return None;
            }
            Err(e) => {
                warn!(%peer, error = %e, "closing connection: malformed frame");
                return None;
            }
        };
        // Memory bound in bytes: the payload is read only once the connection's and
        // the server's budgets have room for it (until then TCP pushes back).
        let mut budget = Budget::new(&self.conn_bytes, &shared.bytes);
        tokio::select! {
            r = budget.grow_to(header.payload_len) => r.ok()?,
            _ = self.shutdown.cancelled() => return None,
            _ = self.conn_dead.cancelled() => return None,
        }
        let mut payload = BytesMut::new();
        let read = wire::read_payload_into(
            &mut self.rd,
            &mut payload,
            header.payload_len as usize,
            FrameHeader::crc_seed(&raw),
            header.payload_checksummed(),
        )
        .await;
        let crc = match read {
            Ok(c) => c,
            Err(e) => {
                debug!(%peer, error = %e, "connection read failed");
                return None;
            }
        };
        if let Err(e) = header.check_crc(crc) {
            warn!(%peer, error = %e, "closing connection: corrupt frame");
            return None;
        }
        Some((header, payload.freeze(), budget))
    }
}

async fn serve_request(
    shared: &Shared,
    peer: SocketAddr,
    principal: &Arc<Principal>,
    header: FrameHeader,
    payload: Bytes,
    mut budget: Budget,
    tx: mpsc::Sender<Outgoing>,
) {
    let span = info_span!("rpc.server", otel.kind = "server", rpc.kind = %header.kind, %peer, bytes_in = payload.len());
    crate::trace::adopt(&span, &header.trace);
    async {
        let deadline = (header.timeout_ms > 0).then(|| Duration::from_millis(u64::from(header.timeout_ms)));
        let result = match header.kind {
            MsgKind::PING => Ok(payload),
            MsgKind::REMOTE_READ => serve_remote_read(shared, principal, &payload),
            kind => dispatch(&shared.router, peer, principal, None, kind, deadline, payload).await,
        };
        // A reply larger than its request needs more of the budget; one that cannot get
        // it in time is answered Overloaded (the caller retries or goes elsewhere).
        let result = match result {
            Ok(b) if b.len() <= shared.config.max_frame_bytes as usize => {
                let len = b.len() as u32;
                match tokio::time::timeout(REPLY_BUDGET_WAIT, budget.grow_to(len)).await {
                    Ok(Ok(())) => Ok(b),
                    _ => Err(Status::new(
                        Code::Overloaded,
                        format!("no memory budget for a reply of {len} bytes now"),
                    )),
                }
            }
            other => other,
        };
        let (rh, body) = match result {
            Ok(b) if b.len() <= shared.config.max_frame_bytes as usize => {
                let mut rh = header.response(false);
                if header.kind == MsgKind::REMOTE_READ {
                    // Region bytes are verified end to end by their owner (chunk crc32c).
                    rh.flags = rh.flags.with(crate::frame::Flags::RAW_PAYLOAD);
                }
                (rh, b)
            }
            Ok(b) => {
                let s = Status::new(
                    Code::Internal,
                    format!("reply of {} bytes exceeds the frame limit", b.len()),
                );
                (header.response(true), Bytes::from(s.encode_to_vec()))
            }
            Err(s) => {
                debug!(status = %s, "request failed");
                (header.response(true), Bytes::from(s.encode_to_vec()))
            }
        };
        match Outgoing::new(&rh, body) {
            Ok(mut out) => {
                out.hold = std::mem::take(&mut budget.permits);
                let _ = tx.send(out).await;
            }
            Err(e) => warn!(error = %e, "cannot encode reply"),
        }
    }
    .instrument(span)
    .await
}

/// Runs the router's handler of `kind` (within `deadline`; a panic becomes `Internal`).
/// Shared by the TCP connections and the RDMA queue pairs.
pub(crate) async fn dispatch(
    router: &Router,
    peer: SocketAddr,
    principal: &Arc<Principal>,
    window: Option<Arc<dyn crate::window::Window>>,
    kind: MsgKind,
    deadline: Option<Duration>,
    payload: Bytes,
) -> Result<Bytes, Status> {
    let m = shingle_metrics::get();
    let Some(h) = router.handlers.get(&kind) else {
        // One series for all of them: a peer cannot grow the label set.
        m.rpc_server_requests
            .get_or_create(&shingle_metrics::KindCode {
                kind: "unknown",
                code: Code::UnknownKind.name(),
            })
            .inc();
        return Err(Status::new(
            Code::UnknownKind,
            format!("no handler for message kind {kind}"),
        ));
    };
    if matches!(**principal, Principal::Client(_)) && kind.0 >= MsgKind::FIRST_SERVICE {
        let allowed = match &router.guard {
            Some(g) => g(principal, kind),
            None => Err(Status::new(Code::PermissionDenied, "this server takes no client keys")),
        };
        if let Err(s) = allowed {
            m.rpc_server_requests
                .get_or_create(&shingle_metrics::KindCode {
                    kind: shingle_metrics::kind_name(kind.0),
                    code: s.code.name(),
                })
                .inc();
            return Err(s);
        }
    }
    let name = shingle_metrics::kind_name(kind.0);
    let _inflight = shingle_metrics::InFlight::new(&m.rpc_server_inflight);
    let started = Instant::now();
    let r = handle(h, peer, principal, window, kind, deadline, payload).await;
    m.rpc_server_seconds
        .get_or_create(&shingle_metrics::Kind { kind: name })
        .observe(started.elapsed().as_secs_f64());
    let code = match &r {
        Ok(_) => "ok",
        Err(s) => s.code.name(),
    };
    m.rpc_server_requests
        .get_or_create(&shingle_metrics::KindCode { kind: name, code })
        .inc();
    r
}

async fn handle(
    h: &Arc<dyn Handler>,
    peer: SocketAddr,
    principal: &Arc<Principal>,
    window: Option<Arc<dyn crate::window::Window>>,
    kind: MsgKind,
    deadline: Option<Duration>,
    payload: Bytes,
) -> Result<Bytes, Status> {
    let ctx = CallContext {
        peer,
        principal: principal.clone(),
        kind,
        deadline: deadline.map(|d| Instant::now() + d),
        window,
    };
    let fut = CatchUnwind(h.handle(ctx, payload));
    match deadline {
        Some(d) => tokio::time::timeout(d, fut).await.unwrap_or_else(|_| {
            Err(Status::new(
                Code::DeadlineExceeded,
                format!("deadline of {d:?} passed on the server"),
            ))
        }),
        None => fut.await,
    }
}

/// A remote read: the NIC-style checks, then for a client key a capability for the
/// region's object (a region registered for none is read only by the cluster's nodes).
fn serve_remote_read(shared: &Shared, principal: &Principal, payload: &[u8]) -> Result<Bytes, Status> {
    let req = <RemoteReadRequest as prost::Message>::decode(payload)
        .map_err(|e| Status::new(Code::InvalidRequest, format!("cannot decode remote read: {e}")))?;
    if req.len > shared.config.max_frame_bytes {
        return Err(Status::new(
            Code::InvalidRequest,
            format!("remote read of {} bytes exceeds the frame limit", req.len),
        ));
    }
    let (bytes, object) = shared
        .regions
        .access_with_object(req.key(), req.offset, u64::from(req.len))
        .map_err(|e| Status::from(&e))?;
    if matches!(principal, Principal::Client(_)) {
        let refused = |why: String| Status::new(Code::PermissionDenied, format!("remote read: {why}"));
        let Some(object) = object else {
            return Err(refused("this region is read only by the cluster's nodes".into()));
        };
        let Some(caps) = &shared.router.region_caps else {
            return Err(refused("this server takes no capabilities".into()));
        };
        caps.check(&req.cap, object, crate::cap::Right::Read, crate::cap::unix_now())
            .map_err(|e| refused(e.to_string()))?;
    }
    shingle_metrics::get()
        .remote_read_served_bytes
        .inc_by(bytes.len() as u64);
    Ok(bytes)
}

impl From<&AccessError> for Status {
    fn from(e: &AccessError) -> Status {
        let code = match e {
            AccessError::UnknownRegion(_) => Code::UnknownRegion,
            AccessError::StaleGeneration { .. } => Code::StaleGeneration,
            AccessError::OutOfBounds { .. } => Code::OutOfBounds,
        };
        Status::new(code, e.to_string())
    }
}

/// Turns a panicking handler into an `Internal` error reply instead of a silent hang.
struct CatchUnwind(BoxFuture<Result<Bytes, Status>>);

impl Future for CatchUnwind {
    type Output = Result<Bytes, Status>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(p) => p,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!(panic = %what, "request handler panicked");
                Poll::Ready(Err(Status::new(Code::Internal, format!("handler panicked: {what}"))))
            }
        }
    }
}

/// Awaits every future (the hooks run side by side).
async fn futures_join(futs: impl Iterator<Item = BoxFuture<()>>) {
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    for h in handles {
        let _ = h.await;
    }
}
