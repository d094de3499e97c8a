//! The RDMA paths beyond the conformance suite: RPCs go over RDMA SENDs; bytes a server
//! grants in a connection's read window are read with one READ, handed back, and
//! readable on that connection only (another connection's rkey is refused by the NIC);
//! grants die with their connection; a queue-pair error is typed, that peer falls back
//! to TCP, and a queue pair is set up again after the fallback.
//! `#[ignore]`d: the guest rig (`fabric-tests/run.sh rdma`) runs them with
//! `--include-ignored`; without a device they fail.
#![cfg(feature = "rdma")]

use bytes::{Bytes, BytesMut};
use shingle_transport::conformance::{Rdma, TransportUnderTest, secret};
use shingle_transport::rdma::{Device, RdmaExport, RdmaReader, WINDOW_BYTES};
use shingle_transport::{
    CallContext, CallOptions, Grant, PeerClient, RegionTable, RemoteRead, Router, RpcChannel, Server, Status,
    TransportConfig,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Fails the test when RDMA cannot run here (it runs only in the guest rig).
fn need_rdma() {
    if let Some(why) = Rdma::unavailable() {
        panic!("RDMA cannot run here: {why}");
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// Asks the server to place `len` bytes of `pattern(len, seed)` in the caller's window.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PlaceMsg {
    #[prost(uint32, tag = "1")]
    pub len: u32,
    #[prost(uint32, tag = "2")]
    pub seed: u32,
}

/// The grant, when the request came over RDMA and the window had room.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Placed {
    #[prost(message, optional, tag = "1")]
    pub grant: Option<Grant>,
}

shingle_transport::rpc!(Place, 0x0F01, PlaceMsg, Placed);

fn place_router() -> Router {
    Router::new().rpc::<Place, _, _>(|ctx: CallContext, req: PlaceMsg| async move {
        let bytes = pattern(req.len as usize, req.seed as u8);
        Ok::<_, Status>(Placed {
            grant: ctx.window.as_ref().and_then(|w| w.place(&bytes)),
        })
    })
}

/// A server with an RDMA export (kept, to close its clients) on the guest's first device.
async fn serve() -> (Server, SocketAddr, Arc<RdmaExport>) {
    let dev = Device::open(&Rdma::config("SHINGLE_RDMA_DEV0")).expect("server device");
    let config = TransportConfig::default();
    let export = RdmaExport::new(dev, &config);
    let router = export.routes(place_router());
    let regions = Arc::new(RegionTable::new());
    let s = Server::bind("127.0.0.1:0".parse().expect("addr"), config, secret(), router, regions)
        .await
        .expect("bind");
    let a = s.local_addr();
    (s, a, export)
}

/// A client on the guest's second device, falling back to TCP for `fallback` after an
/// RDMA failure.
fn client(fallback: Duration) -> (PeerClient, Arc<RdmaReader>) {
    let c = PeerClient::new(TransportConfig::default(), secret());
    let dev = Device::open(&Rdma::config("SHINGLE_RDMA_DEV1")).expect("client device");
    let reader = RdmaReader::with_fallback(dev, fallback);
    assert!(c.attach_rdma(reader.clone()));
    (c, reader)
}

async fn place(c: &PeerClient, addr: SocketAddr, len: usize, seed: u8) -> Option<Grant> {
    let req = PlaceMsg {
        len: len as u32,
        seed: u32::from(seed),
    };
    c.call::<Place>(addr, &req, CallOptions::default())
        .await
        .expect("place")
        .grant
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: runs in the guest rig (fabric-tests/run.sh rdma)"]
async fn granted_bytes_take_one_read_come_back_and_stay_on_their_connection() {
    need_rdma();
    let (server, addr, export) = serve().await;
    let (a, ra) = client(Duration::from_millis(300));

    // Several bounce buffers' worth: pieces in flight together, one request before.
    let big = pattern(3 << 20, 1);
    let g = place(&a, addr, big.len(), 1).await.expect("a grant over RDMA");
    assert_eq!(g.len as usize, big.len());
    let buf = a.read_grant(addr, &g, BytesMut::new()).await.expect("read the grant");
    assert!(buf[..] == big[..], "granted bytes read over RDMA differ");
    assert_eq!((ra.stats().reads, ra.stats().calls), (1, 1), "one call, one read");
    assert_eq!(export.windows(), 1);

    // Read grants go back with the next request: many more bytes than the window
    // holds pass through it, each with a grant.
    let n = 3 * WINDOW_BYTES / (1 << 20);
    for i in 0..n {
        let want = pattern(1 << 20, i as u8);
        let g = place(&a, addr, want.len(), i as u8)
            .await
            .expect("room after hand-backs");
        let got = a.read_grant(addr, &g, BytesMut::new()).await.expect("read");
        assert!(got[..] == want[..], "grant {i} differs");
    }

    // Grants not read hold their room: a full window answers without one.
    let mut held = Vec::new();
    while let Some(g) = place(&a, addr, 1 << 20, 7).await {
        held.push(g);
        assert!(held.len() <= WINDOW_BYTES >> 20, "more granted than the window holds");
    }
    assert_eq!(held.len(), WINDOW_BYTES >> 20);

    // Another client's grant names another queue pair, in another protection domain.
    let (b, rb) = client(Duration::from_millis(300));
    let gb = place(&b, addr, 64 << 10, 9).await.expect("b's grant");
    let got = b.read_grant(addr, &gb, BytesMut::new()).await.expect("b reads its own");
    assert!(got[..] == pattern(64 << 10, 9)[..]);
    assert_eq!(rb.stats().reads, 1);
    assert_eq!(export.windows(), 2);
    // Presented to a's queue pair as it is, it is not even tried.
    let stale = ra.stats().stale_grants;
    assert!(a.read_grant(addr, &gb, BytesMut::new()).await.is_err());
    assert_eq!(ra.stats().stale_grants, stale + 1);
    // Forged to name a's queue pair, the NIC refuses b's rkey there; a falls back to TCP.
    let forged = Grant { qpn: held[0].qpn, ..gb };
    let reads = ra.stats().reads;
    assert!(
        a.read_grant(addr, &forged, BytesMut::new()).await.is_err(),
        "another connection's rkey"
    );
    assert_eq!(ra.stats().reads, reads);
    assert_eq!(ra.stats().fallbacks, 1);
    assert_eq!(a.fabric(addr), "tcp");
    // During the fallback calls go over TCP: no window, no grant.
    assert_eq!(place(&a, addr, 4096, 1).await, None);

    // After the fallback period a new queue pair (and window) is set up; grants of the
    // old one are not tried on it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let g = place(&a, addr, 100_000, 3)
        .await
        .expect("a grant on the new queue pair");
    assert_ne!(g.qpn, held[0].qpn);
    let got = a.read_grant(addr, &g, BytesMut::new()).await.expect("read");
    assert!(got[..] == pattern(100_000, 3)[..]);
    assert!(a.read_grant(addr, &held[1], BytesMut::new()).await.is_err());
    assert_eq!(a.fabric(addr), "rdma");

    // Grants die with their connection: closed by the server (a revoked key), b's next
    // read of a grant fails and b falls back.
    let gb = place(&b, addr, 1 << 20, 4).await.expect("b's grant");
    assert!(export.close_clients(|_| true) >= 2);
    assert!(
        b.read_grant(addr, &gb, BytesMut::new()).await.is_err(),
        "closed connection"
    );
    assert_eq!(b.fabric(addr), "tcp");
    server.shutdown().await;
    assert_eq!(export.windows(), 0, "windows unpinned with their queue pairs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: runs in the guest rig (fabric-tests/run.sh rdma)"]
async fn a_peer_without_rdma_is_read_over_tcp() {
    need_rdma();
    // A plain TCP server (no RDMA export): the handshake is refused, reads use TCP.
    let regions = Arc::new(RegionTable::new());
    let data = pattern(50_000, 4);
    let k = regions.register(Bytes::from(data.clone()));
    let s = Server::bind(
        "127.0.0.1:0".parse().expect("addr"),
        TransportConfig::default(),
        secret(),
        place_router(),
        regions,
    )
    .await
    .expect("bind");
    let addr = s.local_addr();
    let c = Rdma::client(TransportConfig::default(), secret());
    assert_eq!(place(&c, addr, 1000, 1).await, None, "no window over TCP");
    let (r, buf) = c.read(addr, k, 10, 40_000, BytesMut::new()).await;
    r.expect("read");
    assert_eq!(&buf[..], &data[10..40_010]);
    assert_eq!(c.fabric(addr), "tcp");
    s.shutdown().await;
}

/// RPCs go over RDMA SENDs once a queue pair is up (large messages in several
/// fragments, errors typed as over TCP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: runs in the guest rig (fabric-tests/run.sh rdma)"]
async fn rpcs_go_over_rdma() {
    use shingle_transport::conformance::{Echo, EchoMsg, echo_router};
    use shingle_transport::{Code, TransportError};
    use std::sync::atomic::{AtomicUsize, Ordering};
    need_rdma();
    let regions = Arc::new(RegionTable::new());
    let handled = Arc::new(AtomicUsize::new(0));
    let router = echo_router(handled.clone(), Arc::new(AtomicUsize::new(0)));
    let (server, addr) = Rdma::serve(router, regions, TransportConfig::default(), secret())
        .await
        .expect("serve");
    let (c, reader) = client(shingle_transport::rdma::FALLBACK_FOR);
    for len in [0usize, 1, 4000, 100_000, 3 << 20] {
        let data = Bytes::from(pattern(len, len as u8));
        let req = EchoMsg {
            data: data.clone(),
            delay_ms: 0,
            fail_with: 0,
        };
        let reply = c.call::<Echo>(addr, &req, CallOptions::default()).await.expect("echo");
        assert!(reply.data == data, "echo of {len} bytes differs");
    }
    let req = EchoMsg {
        data: Bytes::new(),
        delay_ms: 0,
        fail_with: 42,
    };
    match c.call::<Echo>(addr, &req, CallOptions::default()).await {
        Err(TransportError::Remote { status, .. }) => {
            assert_eq!((status.code, status.app_code), (Code::Application, 42));
        }
        other => panic!("expected the handler's error, got {other:?}"),
    }
    assert_eq!(handled.load(Ordering::SeqCst), 6);
    assert_eq!(reader.stats().calls, 6, "every call went over RDMA");
    assert_eq!(c.fabric(addr), "rdma");
    Rdma::stop(server).await;
}
