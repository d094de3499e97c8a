//! The conformance suite for transport implementations.
//!
//! Every case is generic over [`TransportUnderTest`] and uses only the public RPC and
//! remote-read contracts, so the same cases run over TCP today and over RDMA inside
//! the soft-RoCE guest. `conformance_tests!(MyTransport)` expands to one `#[tokio::test]`
//! per case. Cases talk to real servers over real sockets; nothing is mocked.

use crate::auth::ClusterSecret;
use crate::config::TransportConfig;
use crate::error::TransportError;
use crate::frame::MsgKind;
use crate::region::{AccessError, RegionTable};
use crate::rpc::{CallOptions, RemoteRead, Rpc, RpcChannel};
use crate::server::{CallContext, Router};
use crate::status::{Code, Status};
use bytes::{Bytes, BytesMut};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A transport implementation under test: how to start its server and make a client.
pub trait TransportUnderTest: Send + Sync + 'static {
    /// The client handle.
    type Client: RpcChannel + RemoteRead + Clone + Send + Sync + 'static;
    /// A running server.
    type Server: Send + 'static;

    /// Starts a server on a free local port.
    fn serve(
        router: Router,
        regions: Arc<RegionTable>,
        config: TransportConfig,
        secret: ClusterSecret,
    ) -> impl Future<Output = std::io::Result<(Self::Server, SocketAddr)>> + Send {
        Self::serve_at(SocketAddr::from(([127, 0, 0, 1], 0)), router, regions, config, secret)
    }

    /// Starts a server on a given address (to restart on the same port).
    fn serve_at(
        addr: SocketAddr,
        router: Router,
        regions: Arc<RegionTable>,
        config: TransportConfig,
        secret: ClusterSecret,
    ) -> impl Future<Output = std::io::Result<(Self::Server, SocketAddr)>> + Send;

    /// Gracefully stops a server.
    fn stop(server: Self::Server) -> impl Future<Output = ()> + Send;

    /// A client.
    fn client(config: TransportConfig, secret: ClusterSecret) -> Self::Client;

    /// Why this transport cannot run here (the cases then fail with it); `None` when
    /// it can.
    fn unavailable() -> Option<String> {
        None
    }
}

/// Echo request used by the suite.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoMsg {
    /// Bytes to echo.
    #[prost(bytes = "bytes", tag = "1")]
    pub data: Bytes,
    /// Milliseconds the handler sleeps first.
    #[prost(uint32, tag = "2")]
    pub delay_ms: u32,
    /// Application error to return instead (0 = none).
    #[prost(uint32, tag = "3")]
    pub fail_with: u32,
}

/// Echo RPC.
pub struct Echo;
impl Rpc for Echo {
    const KIND: MsgKind = MsgKind(0x0F00);
    type Request = EchoMsg;
    type Response = EchoMsg;
}

/// A test secret.
pub fn secret() -> ClusterSecret {
    ClusterSecret::new(b"conformance-suite-secret".to_vec()).unwrap_or_else(|_| unreachable!())
}

/// The router of the suite: echo with optional delay and error, counting calls and
/// tracking the highest concurrency seen.
pub fn echo_router(calls: Arc<AtomicUsize>, concurrent_max: Arc<AtomicUsize>) -> Router {
    let now = Arc::new(AtomicUsize::new(0));
    Router::new().rpc::<Echo, _, _>(move |_ctx: CallContext, req: EchoMsg| {
        let calls = calls.clone();
        let now = now.clone();
        let max = concurrent_max.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            max.fetch_max(n, Ordering::SeqCst);
            if req.delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(u64::from(req.delay_ms))).await;
            }
            now.fetch_sub(1, Ordering::SeqCst);
            if req.fail_with != 0 {
                return Err(Status::application(req.fail_with, "asked to fail"));
            }
            Ok(EchoMsg {
                data: req.data,
                delay_ms: 0,
                fail_with: 0,
            })
        }
    })
}

/// A server with the suite's router and its counters.
pub struct Rig<T: TransportUnderTest> {
    /// The running server.
    pub server: Option<T::Server>,
    /// Its address.
    pub addr: SocketAddr,
    /// Handler calls so far.
    pub calls: Arc<AtomicUsize>,
    /// Highest handler concurrency seen.
    pub concurrent_max: Arc<AtomicUsize>,
    /// The server's region table.
    pub regions: Arc<RegionTable>,
}

impl<T: TransportUnderTest> Rig<T> {
    /// Starts a server with `config`.
    pub async fn start(config: TransportConfig) -> Self {
        let calls = Arc::new(AtomicUsize::new(0));
        let concurrent_max = Arc::new(AtomicUsize::new(0));
        let regions = Arc::new(RegionTable::new());
        let router = echo_router(calls.clone(), concurrent_max.clone());
        let (server, addr) = T::serve(router, regions.clone(), config, secret())
            .await
            .expect("start server");
        Rig {
            server: Some(server),
            addr,
            calls,
            concurrent_max,
            regions,
        }
    }

    /// Stops the server gracefully.
    pub async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            T::stop(s).await;
        }
    }
}

fn quick() -> TransportConfig {
    TransportConfig {
        request_timeout: Duration::from_secs(10),
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        shutdown_grace: Duration::from_secs(2),
        ..TransportConfig::default()
    }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

/// Calls the suite's echo at `addr`, answered after `delay_ms`.
pub async fn echo<C: RpcChannel>(
    c: &C,
    addr: SocketAddr,
    data: Bytes,
    delay_ms: u32,
) -> Result<EchoMsg, TransportError> {
    c.call::<Echo>(
        addr,
        &EchoMsg {
            data,
            delay_ms,
            fail_with: 0,
        },
        CallOptions::default(),
    )
    .await
}

/// A typed call round-trips, repeatedly, on one pooled connection set.
pub async fn rpc_round_trip<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let c = T::client(quick(), secret());
    for i in 0..20u8 {
        let data = pattern(usize::from(i) * 100, i);
        let r = echo(&c, rig.addr, data.clone(), 0).await.expect("echo");
        assert_eq!(r.data, data);
    }
    assert_eq!(rig.calls.load(Ordering::SeqCst), 20);
    rig.stop().await;
}

/// Many concurrent calls with different delays are answered out of order and each
/// reply reaches its own caller.
pub async fn multiplexed_out_of_order<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let c = T::client(
        TransportConfig {
            conns_per_peer: 1,
            ..quick()
        },
        secret(),
    );
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let c = c.clone();
        let addr = rig.addr;
        tasks.push(tokio::spawn(async move {
            let data = Bytes::from(format!("request-{i}"));
            let r = echo(&c, addr, data.clone(), (200 - i) % 17).await.expect("echo");
            assert_eq!(r.data, data);
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert!(
        rig.concurrent_max.load(Ordering::SeqCst) > 1,
        "requests were not pipelined"
    );
    rig.stop().await;
}

/// Error replies are typed: unknown kinds and application errors.
pub async fn errors_are_typed<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let c = T::client(quick(), secret());
    let e = c
        .call_raw(rig.addr, MsgKind(0x7777), Bytes::new(), CallOptions::default())
        .await
        .expect_err("unknown kind");
    assert_eq!(e.status().map(|s| s.code), Some(Code::UnknownKind), "{e}");
    let e = c
        .call::<Echo>(
            rig.addr,
            &EchoMsg {
                data: Bytes::new(),
                delay_ms: 0,
                fail_with: 13,
            },
            CallOptions::default(),
        )
        .await
        .expect_err("application error");
    let s = e.status().expect("status");
    assert_eq!((s.code, s.app_code), (Code::Application, 13));
    let e = c
        .call_raw(
            rig.addr,
            Echo::KIND,
            Bytes::from_static(&[0xff, 0xff, 0xff]),
            CallOptions::default(),
        )
        .await
        .expect_err("bad payload");
    assert_eq!(e.status().map(|s| s.code), Some(Code::InvalidRequest), "{e}");
    // The connection is still good after errors.
    assert_eq!(
        echo(&c, rig.addr, Bytes::from_static(b"ok"), 0)
            .await
            .expect("echo")
            .data,
        Bytes::from_static(b"ok")
    );
    rig.stop().await;
}

/// A call past its deadline fails promptly with `Timeout`; the connection serves on.
pub async fn deadlines<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let c = T::client(quick(), secret());
    let t = Instant::now();
    let e = c
        .call::<Echo>(
            rig.addr,
            &EchoMsg {
                data: Bytes::new(),
                delay_ms: 3000,
                fail_with: 0,
            },
            CallOptions::timeout(Duration::from_millis(100)),
        )
        .await
        .expect_err("timeout");
    assert!(matches!(e, TransportError::Timeout { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2), "timeout took {:?}", t.elapsed());
    assert_eq!(
        echo(&c, rig.addr, Bytes::from_static(b"after"), 0)
            .await
            .expect("echo")
            .data,
        Bytes::from_static(b"after")
    );
    rig.stop().await;
}

/// Frames up to the limit pass; larger requests are refused before sending.
pub async fn frame_limits<T: TransportUnderTest>() {
    let cfg = TransportConfig {
        max_frame_bytes: 8 << 20,
        max_inflight_bytes: 64 << 20,
        ..quick()
    };
    let mut rig = Rig::<T>::start(cfg.clone()).await;
    let c = T::client(cfg, secret());
    let big = pattern((8 << 20) - 64, 3);
    assert_eq!(echo(&c, rig.addr, big.clone(), 0).await.expect("big echo").data, big);
    let e = c
        .call_raw(rig.addr, Echo::KIND, pattern((8 << 20) + 1, 1), CallOptions::default())
        .await
        .expect_err("too large");
    assert!(matches!(e, TransportError::TooLarge { .. }), "{e}");
    rig.stop().await;
}

/// Remote reads return exactly the registered bytes, from memory and mmap'd files,
/// into the caller's buffer.
pub async fn remote_read_returns_region_bytes<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let c = T::client(quick(), secret());
    let mem = pattern(3 << 20, 7);
    let kmem = rig.regions.register(mem.clone());
    let dir = tempfile_dir();
    let path = dir.join("region.bin");
    let file_bytes = pattern(1 << 20, 99);
    std::fs::write(&path, &file_bytes).expect("write region file");
    let kfile = rig.regions.register_file(&path).expect("map file");
    let mut buf = BytesMut::with_capacity(1 << 20);
    for (key, src) in [(kmem, &mem), (kfile, &file_bytes)] {
        for (off, len) in [
            (0u64, 1u32),
            (0, 4096),
            (12345, 65536),
            (src.len() as u64 - 10, 10),
            (0, src.len().min(1 << 20) as u32),
        ] {
            let (r, b) = c.read(rig.addr, key, off, len, buf).await;
            r.expect("remote read");
            assert_eq!(&b[..], &src[off as usize..off as usize + len as usize]);
            buf = b;
        }
    }
    let (r, b) = c.read(rig.addr, kmem, 5, 0, buf).await;
    r.expect("empty read");
    assert!(b.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
    rig.stop().await;
}

/// The checks a NIC makes: unknown key, revoked or reused generation, out of bounds.
/// Each is a typed error, the buffer comes back, and the connection serves on.
pub async fn remote_read_checks<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let c = T::client(quick(), secret());
    let data = pattern(4096, 1);
    let key = rig.regions.register(data.clone());
    let buf = BytesMut::with_capacity(64);

    let unknown = crate::region::RegionKey { region: 4242, ..key };
    let (r, buf) = c.read(rig.addr, unknown, 0, 16, buf).await;
    assert!(
        matches!(
            r,
            Err(TransportError::Access(
                AccessError::UnknownRegion(4242) | AccessError::StaleGeneration { .. }
            ))
        ),
        "{r:?}"
    );

    let (r, buf) = c.read(rig.addr, key, 4000, 200, buf).await;
    assert!(
        matches!(r, Err(TransportError::Access(AccessError::OutOfBounds { .. }))),
        "{r:?}"
    );
    let (r, buf) = c.read(rig.addr, key, u64::MAX - 1, 16, buf).await;
    assert!(
        matches!(r, Err(TransportError::Access(AccessError::OutOfBounds { .. }))),
        "{r:?}"
    );
    // A forged key claiming a longer region is still bounded by the real one.
    let forged = crate::region::RegionKey { len: 1 << 20, ..key };
    let (r, buf) = c.read(rig.addr, forged, 4000, 200, buf).await;
    assert!(
        matches!(r, Err(TransportError::Access(AccessError::OutOfBounds { .. }))),
        "{r:?}"
    );

    assert!(rig.regions.revoke(key));
    let (r, buf) = c.read(rig.addr, key, 0, 16, buf).await;
    assert!(
        matches!(r, Err(TransportError::Access(AccessError::StaleGeneration { .. }))),
        "{r:?}"
    );
    let key2 = rig.regions.register(pattern(4096, 2));
    assert_eq!(key2.region, key.region);
    let (r, buf) = c.read(rig.addr, key, 0, 16, buf).await;
    assert!(
        matches!(r, Err(TransportError::Access(AccessError::StaleGeneration { .. }))),
        "reused slot served an old key: {r:?}"
    );

    let (r, buf) = c.read(rig.addr, key2, 0, 16, buf).await;
    r.expect("fresh key reads");
    assert_eq!(&buf[..], &pattern(4096, 2)[..16]);
    rig.stop().await;
}

/// Concurrent remote reads of random ranges all return the right bytes; cancelled
/// reads leave the connection usable.
pub async fn remote_read_concurrent_and_cancelled<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let c = T::client(quick(), secret());
    let data = pattern(8 << 20, 5);
    let key = rig.regions.register(data.clone());
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let c = c.clone();
        let data = data.clone();
        let addr = rig.addr;
        tasks.push(tokio::spawn(async move {
            let off = (i * 7919 * 997) % (7 << 20);
            let len = (((i * 104_729) % (1 << 20)) + 1) as u32;
            let (r, b) = c.read(addr, key, off, len, BytesMut::new()).await;
            r.expect("read");
            assert_eq!(&b[..], &data[off as usize..off as usize + len as usize]);
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    // Cancel reads at various points; the buffers are simply dropped with the futures.
    for i in 0..20u64 {
        let fut = c.read(rig.addr, key, i * 1000, 4 << 20, BytesMut::new());
        let _ = tokio::time::timeout(Duration::from_micros(50 * i), fut).await;
    }
    let (r, b) = c.read(rig.addr, key, 100, 1000, BytesMut::new()).await;
    r.expect("read after cancellations");
    assert_eq!(&b[..], &data[100..1100]);
    rig.stop().await;
}

/// A client with the wrong secret is refused, never reaches a handler, and the
/// server keeps serving authenticated clients.
pub async fn wrong_secret_refused<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let bad = T::client(
        quick(),
        ClusterSecret::new(b"not-the-cluster-secret".to_vec()).expect("secret"),
    );
    let e = echo(&bad, rig.addr, Bytes::from_static(b"x"), 0)
        .await
        .expect_err("refused");
    assert!(matches!(e, TransportError::Auth { .. }), "{e}");
    let key = rig.regions.register(pattern(100, 0));
    let (r, _) = bad.read(rig.addr, key, 0, 10, BytesMut::new()).await;
    assert!(r.is_err(), "unauthenticated read succeeded");
    assert_eq!(
        rig.calls.load(Ordering::SeqCst),
        0,
        "a handler ran for an unauthenticated peer"
    );
    let good = T::client(quick(), secret());
    echo(&good, rig.addr, Bytes::from_static(b"x"), 0)
        .await
        .expect("good client");
    rig.stop().await;
}

/// A client key is who it says (the handler sees its identity), may send only what
/// the server's guard allows (nothing without a guard), and reads a region remotely
/// only when it was registered for an object and the key shows a read capability for
/// that object.
pub async fn client_keys_pass_the_guard<T: TransportUnderTest>() {
    use crate::auth::{Identity, Principal};
    let reader = Identity::new("reader", 1).expect("id");
    let key = secret().client_key(&reader).expect("key");
    // No guard: a client may send no service kind, the cluster secret any.
    let mut rig = Rig::<T>::start(quick()).await;
    let client = T::client(quick(), key.clone());
    let e = echo(&client, rig.addr, Bytes::from_static(b"x"), 0)
        .await
        .expect_err("refused");
    assert_eq!(e.status().map(|s| s.code), Some(Code::PermissionDenied), "{e}");
    // A region registered for no object is read by the cluster's nodes only.
    let region = rig.regions.register(pattern(100, 0));
    let (r, _) = client.read(rig.addr, region, 0, 10, BytesMut::new()).await;
    let e = r.expect_err("a client key reads no plain region");
    assert_eq!(e.status().map(|s| s.code), Some(Code::PermissionDenied), "{e}");
    assert_eq!(
        rig.calls.load(Ordering::SeqCst),
        0,
        "a handler ran for a refused client"
    );
    rig.stop().await;
    // A guard that lets `reader` echo, and a handler that sees who called.
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let router = Router::new()
        .rpc::<Echo, _, _>(move |ctx: CallContext, req: EchoMsg| {
            s2.lock().push((*ctx.principal).clone());
            async move { Ok(req) }
        })
        .guard(Arc::new(|p: &Principal, _kind: MsgKind| match p {
            Principal::Client(id) if id.name == "reader" => Ok(()),
            _ => Err(Status::new(Code::PermissionDenied, "not reader")),
        }));
    // Regions registered for an object: a client key reads one with a read capability
    // for that object, signed with the server's key; the cluster with the key alone.
    let caps = crate::cap::CapKey::derive(&secret()).expect("cap key");
    let regions = Arc::new(RegionTable::new());
    let shard = regions.register_for(pattern(100, 1), 7);
    let (server, addr) = T::serve(router.region_caps(caps.clone()), regions, quick(), secret())
        .await
        .expect("start server");
    let client = T::client(quick(), key);
    echo(&client, addr, Bytes::from_static(b"x"), 0)
        .await
        .expect("reader may echo");
    let now = crate::cap::unix_now();
    let cap = |object| Bytes::from(caps.mint(object, crate::cap::Right::Read, now).to_bytes());
    for (shown, what) in [(Bytes::new(), "no capability"), (cap(8), "another object's capability")] {
        let (r, _) = client.read_capped(addr, shard, shown, 0, 10, BytesMut::new()).await;
        let e = r.expect_err(what);
        assert_eq!(e.status().map(|s| s.code), Some(Code::PermissionDenied), "{what}: {e}");
    }
    let (r, buf) = client.read_capped(addr, shard, cap(7), 5, 10, BytesMut::new()).await;
    r.expect("with the object's capability");
    assert_eq!(&buf[..], &pattern(100, 1)[5..15]);
    let (r, _) = T::client(quick(), secret())
        .read(addr, shard, 0, 10, BytesMut::new())
        .await;
    r.expect("the cluster reads with the key alone");
    let other = T::client(
        quick(),
        secret()
            .client_key(&Identity::new("other", 1).expect("id"))
            .expect("key"),
    );
    let e = echo(&other, addr, Bytes::from_static(b"x"), 0)
        .await
        .expect_err("other may not");
    assert_eq!(e.status().map(|s| s.code), Some(Code::PermissionDenied), "{e}");
    echo(&T::client(quick(), secret()), addr, Bytes::from_static(b"x"), 0)
        .await
        .expect("the cluster may");
    assert_eq!(*seen.lock(), vec![Principal::Client(reader), Principal::Cluster]);
    T::stop(server).await;
}

/// Per-connection in-flight requests are bounded: callers beyond the bound wait, and
/// everybody is served.
pub async fn backpressure_bounds_inflight<T: TransportUnderTest>() {
    let cfg = TransportConfig {
        max_inflight_requests: 4,
        conns_per_peer: 1,
        ..quick()
    };
    let mut rig = Rig::<T>::start(cfg.clone()).await;
    let c = T::client(cfg, secret());
    let mut tasks = Vec::new();
    for i in 0..64u32 {
        let c = c.clone();
        let addr = rig.addr;
        tasks.push(tokio::spawn(async move {
            echo(&c, addr, Bytes::from(i.to_le_bytes().to_vec()), 5).await
        }));
    }
    for t in tasks {
        t.await.expect("task").expect("echo");
    }
    let max = rig.concurrent_max.load(Ordering::SeqCst);
    assert!(
        (1..=4).contains(&max),
        "server ran {max} handlers at once on one connection with a bound of 4"
    );
    rig.stop().await;
}

/// After the server restarts on the same address the client reconnects by itself.
pub async fn reconnects_after_restart<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let c = T::client(quick(), secret());
    echo(&c, rig.addr, Bytes::from_static(b"1"), 0).await.expect("before");
    let addr = rig.addr;
    rig.stop().await;
    let e = echo(&c, addr, Bytes::from_static(b"2"), 0)
        .await
        .expect_err("server down");
    assert!(e.is_peer_failure(), "{e}");
    let calls = Arc::new(AtomicUsize::new(0));
    let (server, _) = T::serve_at(
        addr,
        echo_router(calls.clone(), Arc::new(AtomicUsize::new(0))),
        Arc::new(RegionTable::new()),
        quick(),
        secret(),
    )
    .await
    .expect("restart");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match echo(&c, addr, Bytes::from_static(b"3"), 0).await {
            Ok(r) => {
                assert_eq!(r.data, Bytes::from_static(b"3"));
                break;
            }
            Err(e) if Instant::now() < deadline && e.is_peer_failure() => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("no reconnect: {e}"),
        }
    }
    T::stop(server).await;
}

/// Graceful shutdown lets requests in flight finish and their replies arrive.
pub async fn graceful_shutdown_finishes_inflight<T: TransportUnderTest>() {
    let mut rig = Rig::<T>::start(quick()).await;
    let c = T::client(quick(), secret());
    let addr = rig.addr;
    let c2 = c.clone();
    let slow = tokio::spawn(async move { echo(&c2, addr, Bytes::from_static(b"slow"), 300).await });
    while rig.calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rig.stop().await;
    let r = slow
        .await
        .expect("task")
        .expect("in-flight request finished during shutdown");
    assert_eq!(r.data, Bytes::from_static(b"slow"));
    assert!(
        echo(&c, addr, Bytes::from_static(b"late"), 0).await.is_err(),
        "server accepted work after shutdown"
    );
}

/// A server that dies with a request in flight fails the call promptly instead of
/// leaving it to the deadline.
pub async fn dead_server_fails_calls_promptly<T: TransportUnderTest>() {
    let cfg = TransportConfig {
        shutdown_grace: Duration::from_millis(100),
        ..quick()
    };
    let mut rig = Rig::<T>::start(cfg.clone()).await;
    let c = T::client(quick(), secret());
    let addr = rig.addr;
    let c2 = c.clone();
    let hung = tokio::spawn(async move {
        let t = Instant::now();
        (echo(&c2, addr, Bytes::new(), 60_000).await, t.elapsed())
    });
    while rig.calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rig.stop().await;
    let (r, took) = hung.await.expect("task");
    let e = r.expect_err("call to a dead server");
    assert!(e.is_peer_failure(), "{e}");
    assert!(took < Duration::from_secs(5), "call took {took:?} to fail");
}

fn tempfile_dir() -> std::path::PathBuf {
    let mut raw = [0u8; 8];
    let _ = getrandom::fill(&mut raw);
    let p = std::env::temp_dir().join(format!("shingle-conformance-{}", u64::from_le_bytes(raw)));
    std::fs::create_dir_all(&p).expect("create temp dir");
    p
}

/// Expands to one `#[tokio::test]` per conformance case for transport `$t`, each with
/// the attributes given before it (e.g. `#[ignore = "needs a device"]`). A transport
/// that cannot run here fails every case with the reason.
#[macro_export]
macro_rules! conformance_tests {
    ($(#[$attr:meta])* $t:ty) => {
        $crate::conformance_tests!(@cases [$(#[$attr])*] $t;
            rpc_round_trip, multiplexed_out_of_order, errors_are_typed, deadlines, frame_limits,
            remote_read_returns_region_bytes, remote_read_checks, remote_read_concurrent_and_cancelled,
            wrong_secret_refused, client_keys_pass_the_guard, backpressure_bounds_inflight,
            reconnects_after_restart,
            graceful_shutdown_finishes_inflight, dead_server_fails_calls_promptly);
    };
    (@cases $attrs:tt $t:ty; $($case:ident),* $(,)?) => {
        $( $crate::conformance_tests!(@case $attrs $t; $case); )*
    };
    (@case [$(#[$attr:meta])*] $t:ty; $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$attr])*
        async fn $case() {
            if let Some(why) = <$t as $crate::conformance::TransportUnderTest>::unavailable() {
                panic!("the transport cannot run here: {why}");
            }
            $crate::conformance::$case::<$t>().await;
        }
    };
}

/// The TCP implementation.
pub struct Tcp;

impl TransportUnderTest for Tcp {
    type Client = crate::peer::PeerClient;
    type Server = crate::server::Server;

    async fn serve_at(
        addr: SocketAddr,
        router: Router,
        regions: Arc<RegionTable>,
        config: TransportConfig,
        secret: ClusterSecret,
    ) -> std::io::Result<(Self::Server, SocketAddr)> {
        let s = crate::server::Server::bind(addr, config, secret, router, regions).await?;
        let a = s.local_addr();
        Ok((s, a))
    }

    async fn stop(server: Self::Server) {
        server.shutdown().await;
    }

    fn client(config: TransportConfig, secret: ClusterSecret) -> Self::Client {
        crate::peer::PeerClient::new(config, secret)
    }
}

/// The RDMA implementation: RPCs as SENDs on the queue pair (set up over TCP), one-sided
/// RDMA READ for remote reads. The
/// server uses `$SHINGLE_RDMA_DEV0` and the client `$SHINGLE_RDMA_DEV1` (the guest rig's
/// two soft-RoCE devices; the first device when unset), GID index
/// `$SHINGLE_RDMA_GID_INDEX` (default 1).
#[cfg(feature = "rdma")]
pub struct Rdma;

#[cfg(feature = "rdma")]
impl Rdma {
    /// The device configuration `$var` names.
    pub fn config(var: &str) -> crate::rdma::RdmaConfig {
        crate::rdma::RdmaConfig {
            device: std::env::var(var).ok().filter(|s| !s.is_empty()),
            port: 1,
            gid_index: std::env::var("SHINGLE_RDMA_GID_INDEX")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1),
        }
    }
}

#[cfg(feature = "rdma")]
impl TransportUnderTest for Rdma {
    type Client = crate::peer::PeerClient;
    type Server = crate::server::Server;

    async fn serve_at(
        addr: SocketAddr,
        router: Router,
        regions: Arc<RegionTable>,
        config: TransportConfig,
        secret: ClusterSecret,
    ) -> std::io::Result<(Self::Server, SocketAddr)> {
        let dev = crate::rdma::Device::open(&Self::config("SHINGLE_RDMA_DEV0")).map_err(std::io::Error::other)?;
        let export = crate::rdma::RdmaExport::new(dev, &config);
        let router = export.routes(router);
        let s = crate::server::Server::bind(addr, config, secret, router, regions).await?;
        let a = s.local_addr();
        Ok((s, a))
    }

    async fn stop(server: Self::Server) {
        server.shutdown().await;
    }

    fn client(config: TransportConfig, secret: ClusterSecret) -> Self::Client {
        let c = crate::peer::PeerClient::new(config, secret);
        match crate::rdma::Device::open(&Self::config("SHINGLE_RDMA_DEV1")) {
            Ok(dev) => {
                c.attach_rdma(crate::rdma::RdmaReader::new(dev));
            }
            Err(e) => panic!("no RDMA device for the client: {e}"),
        }
        c
    }

    fn unavailable() -> Option<String> {
        crate::rdma::Device::open(&Self::config("SHINGLE_RDMA_DEV0"))
            .err()
            .map(|e| e.to_string())
    }
}
