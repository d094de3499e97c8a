//! The RDMA remote-read path beyond the conformance suite: reads really go over RDMA,
//! a queue-pair error is typed, that peer falls back to TCP (the read is redone there
//! and gets TCP's answer), and a queue pair is re-established after the fallback.
//! `#[ignore]`d: the guest rig (`fabric-tests/run.sh rdma`) runs them with
//! `--include-ignored`; without a device they fail.
#![cfg(feature = "rdma")]

use bytes::{Bytes, BytesMut};
use shingle_transport::conformance::{Rdma, TransportUnderTest, secret};
use shingle_transport::rdma::{Device, RdmaError, RdmaReader};
use shingle_transport::{AccessError, PeerClient, RegionTable, RemoteRead, Router, TransportConfig, TransportError};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: runs in the guest rig (fabric-tests/run.sh rdma)"]
async fn queue_pair_errors_are_typed_fall_back_to_tcp_and_reconnect() {
    need_rdma();
    let regions = Arc::new(RegionTable::new());
    let big = pattern(3 << 20, 1); // three bounce buffers: pieces in flight together
    let k1 = regions.register(Bytes::from(big.clone()));
    let (server, addr) = Rdma::serve(Router::new(), regions.clone(), TransportConfig::default(), secret())
        .await
        .expect("serve");
    let c = PeerClient::new(TransportConfig::default(), secret());
    let dev = Device::open(&Rdma::config("SHINGLE_RDMA_DEV1")).expect("client device");
    let reader = RdmaReader::with_fallback(dev, Duration::from_millis(300));
    assert!(c.attach_rdma(reader.clone()));

    let (r, buf) = c.read(addr, k1, 0, big.len() as u32, BytesMut::new()).await;
    r.expect("whole region over RDMA");
    assert!(buf[..] == big[..], "bytes read over RDMA differ");
    let (r, buf) = c.read(addr, k1, 12_345, 777, buf).await;
    r.expect("unaligned read");
    assert_eq!(&buf[..], &big[12_345..12_345 + 777]);
    assert_eq!(reader.stats().reads, 2, "both reads went over RDMA");
    assert_eq!(c.fabric(addr), "rdma");

    // The rkey of a revoked region is deregistered: the NIC refuses, a typed error.
    assert!(regions.revoke(k1));
    let (e, _) = reader
        .read_rdma(&c, addr, k1, 0, 4096, BytesMut::new())
        .await
        .expect_err("read of a revoked region");
    assert!(
        matches!(&e, RdmaError::Completion { status, .. } if status.contains("RemoteAccess")),
        "{e}"
    );

    // Through the RemoteRead API: a queue-pair error makes the peer fall back to TCP,
    // the read is redone there and gets TCP's answer (stale key).
    let k2 = regions.register(Bytes::from(pattern(64 << 10, 2)));
    let (r, _) = c.read(addr, k2, 0, 100, BytesMut::new()).await;
    r.expect("read k2");
    assert!(regions.revoke(k2));
    let (r, _) = c.read(addr, k2, 0, 100, BytesMut::new()).await;
    assert!(
        matches!(r, Err(TransportError::Access(AccessError::StaleGeneration { .. }))),
        "{r:?}"
    );
    assert_eq!(reader.stats().fallbacks, 1);
    assert_eq!(c.fabric(addr), "tcp");
    let reads = reader.stats().reads;
    let small = pattern(10_000, 3);
    let k3 = regions.register(Bytes::from(small.clone()));
    let (r, buf) = c.read(addr, k3, 0, 10_000, BytesMut::new()).await;
    r.expect("read over TCP during the fallback");
    assert_eq!(&buf[..], &small[..]);
    assert_eq!(reader.stats().reads, reads, "the fallback read went over TCP");

    // After the fallback period a new queue pair is set up.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (r, buf) = c.read(addr, k3, 100, 5_000, buf).await;
    r.expect("read after reconnecting");
    assert_eq!(&buf[..], &small[100..5_100]);
    assert_eq!(reader.stats().reads, reads + 1, "back on RDMA");
    assert_eq!(c.fabric(addr), "rdma");
    Rdma::stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: runs in the guest rig (fabric-tests/run.sh rdma)"]
async fn a_peer_without_rdma_is_read_over_tcp() {
    need_rdma();
    // A plain TCP server (no RDMA export): the handshake is refused, reads use TCP.
    let regions = Arc::new(RegionTable::new());
    let data = pattern(50_000, 4);
    let k = regions.register(Bytes::from(data.clone()));
    let s = shingle_transport::Server::bind(
        "127.0.0.1:0".parse().expect("addr"),
        TransportConfig::default(),
        secret(),
        Router::new(),
        regions,
    )
    .await
    .expect("bind");
    let addr = s.local_addr();
    let c = Rdma::client(TransportConfig::default(), secret());
    let (r, buf) = c.read(addr, k, 10, 40_000, BytesMut::new()).await;
    r.expect("read");
    assert_eq!(&buf[..], &data[10..40_010]);
    assert_eq!(c.fabric(addr), "tcp");
    s.shutdown().await;
}

/// RPCs go over RDMA SENDs once a queue pair is up (large messages in several
/// fragments, errors typed as over TCP); a region the server's NIC cannot register
/// (a shared read-only file mapping on kernels before 6.2) is read over TCP while the
/// peer stays on RDMA for everything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: runs in the guest rig (fabric-tests/run.sh rdma)"]
async fn rpcs_go_over_rdma_and_an_unpinnable_region_is_read_over_tcp() {
    use shingle_transport::conformance::{Echo, EchoMsg, echo_router};
    use shingle_transport::{CallOptions, Code, RpcChannel};
    use std::sync::atomic::{AtomicUsize, Ordering};
    need_rdma();
    let regions = Arc::new(RegionTable::new());
    let mem = pattern(200_000, 5);
    let kmem = regions.register(Bytes::from(mem.clone()));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("region.bin");
    let on_disk = pattern(1 << 20, 6);
    std::fs::write(&path, &on_disk).expect("write");
    let kfile = regions.register_file(&path).expect("map");
    let handled = Arc::new(AtomicUsize::new(0));
    let router = echo_router(handled.clone(), Arc::new(AtomicUsize::new(0)));
    let (server, addr) = Rdma::serve(router, regions.clone(), TransportConfig::default(), secret())
        .await
        .expect("serve");
    let c = PeerClient::new(TransportConfig::default(), secret());
    let dev = Device::open(&Rdma::config("SHINGLE_RDMA_DEV1")).expect("client device");
    let reader = RdmaReader::new(dev);
    assert!(c.attach_rdma(reader.clone()));

    // The first read sets up the queue pair; calls then ride on it.
    let (r, _) = c.read(addr, kmem, 0, 10, BytesMut::new()).await;
    r.expect("read over RDMA");
    let before = reader.stats();
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
    assert_eq!(reader.stats().calls, before.calls + 6, "every call went over RDMA");

    // The file mapping: read correctly whichever way it goes, and never at the cost
    // of the peer's RDMA.
    let (r, buf) = c.read(addr, kfile, 4096, 65_536, BytesMut::new()).await;
    r.expect("read of the file region");
    assert!(buf[..] == on_disk[4096..4096 + 65_536], "file region bytes differ");
    let s = reader.stats();
    assert_eq!(s.fallbacks, 0, "the peer did not fall back");
    assert_eq!(
        s.reads + s.tcp_regions,
        before.reads + before.tcp_regions + 1,
        "one read, over RDMA or (unpinnable region) over TCP: {s:?}"
    );
    let (r, buf) = c.read(addr, kmem, 1000, 50_000, buf).await;
    r.expect("memory region after the file region");
    assert!(buf[..] == mem[1000..51_000]);
    assert_eq!(reader.stats().reads, s.reads + 1, "still on RDMA");
    assert_eq!(c.fabric(addr), "rdma");
    Rdma::stop(server).await;
}
