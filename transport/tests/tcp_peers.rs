//! TCP-specific behaviour with hostile or broken peers, over real sockets.

use bytes::Bytes;
use shingle_transport::conformance::{Echo, EchoMsg, Rig, Tcp, echo, secret};
use shingle_transport::{CallOptions, PeerClient, RpcChannel, TransportConfig, auth};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn expect_closed(mut s: TcpStream) {
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("server closes the connection");
    match r {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("server sent {n} bytes to a misbehaving peer"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_auth_closes_only_that_connection() {
    let mut rig = Rig::<Tcp>::start(TransportConfig::default()).await;
    let good = PeerClient::new(TransportConfig::default(), secret());
    let echo = |c: PeerClient, addr| async move {
        c.call::<Echo>(
            addr,
            &EchoMsg {
                data: Bytes::from_static(b"still here"),
                ..Default::default()
            },
            CallOptions::default(),
        )
        .await
    };
    echo(good.clone(), rig.addr).await.expect("before");

    // Authenticated, then random bytes instead of a frame.
    let mut s = TcpStream::connect(rig.addr).await.expect("connect");
    auth::connect(&mut s, &secret(), Duration::from_secs(5))
        .await
        .expect("auth");
    s.write_all(&[0x42; 200]).await.expect("write garbage");
    expect_closed(s).await;

    // Authenticated, then a header announcing a payload over the limit.
    let mut s = TcpStream::connect(rig.addr).await.expect("connect");
    auth::connect(&mut s, &secret(), Duration::from_secs(5))
        .await
        .expect("auth");
    let mut h = shingle_transport::frame::FrameHeader::request(<Echo as shingle_transport::Rpc>::KIND, 1)
        .encode(b"")
        .expect("encode");
    h[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    s.write_all(&h).await.expect("write header");
    expect_closed(s).await;

    // Authenticated, then a frame whose payload was damaged in transit.
    let mut s = TcpStream::connect(rig.addr).await.expect("connect");
    auth::connect(&mut s, &secret(), Duration::from_secs(5))
        .await
        .expect("auth");
    let f = shingle_transport::frame::Frame {
        header: shingle_transport::frame::FrameHeader::request(<Echo as shingle_transport::Rpc>::KIND, 1),
        payload: Bytes::from_static(b"payload"),
    };
    let mut bytes = f.encode().expect("encode");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    s.write_all(&bytes).await.expect("write frame");
    expect_closed(s).await;

    // No handshake at all: raw bytes are refused before any frame is read.
    let mut s = TcpStream::connect(rig.addr).await.expect("connect");
    let mut hello = [0u8; 40];
    s.read_exact(&mut hello).await.expect("hello");
    s.write_all(&[0u8; 104]).await.expect("write bogus proof");
    let mut verdict = [0u8; 36];
    s.read_exact(&mut verdict).await.expect("verdict");
    assert_eq!(verdict[0], 1, "bogus proof accepted");
    expect_closed(s).await;

    assert_eq!(
        rig.calls.load(Ordering::SeqCst),
        1,
        "a handler ran for a misbehaving peer"
    );
    echo(good, rig.addr).await.expect("other clients are still served");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peer_is_dropped_after_handshake_timeout() {
    let cfg = TransportConfig {
        handshake_timeout: Duration::from_millis(200),
        ..TransportConfig::default()
    };
    let mut rig = Rig::<Tcp>::start(cfg).await;
    let s = TcpStream::connect(rig.addr).await.expect("connect");
    let mut s = s;
    let mut hello = [0u8; 40];
    s.read_exact(&mut hello).await.expect("hello");
    expect_closed(s).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_peer_backs_off() {
    // A port nobody listens on: the first call fails to connect, the next ones fail fast.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    let c = PeerClient::new(
        TransportConfig {
            backoff_initial: Duration::from_secs(2),
            ..TransportConfig::default()
        },
        secret(),
    );
    let e = c.ping(addr).await.expect_err("nobody listens");
    assert!(matches!(e, shingle_transport::TransportError::Connect { .. }), "{e}");
    let e = c.ping(addr).await.expect_err("backing off");
    assert!(
        matches!(e, shingle_transport::TransportError::PeerUnavailable { .. }),
        "{e}"
    );
    assert!(e.is_peer_failure());
    // Known to be back (its node is Up in the map again): connected to at once.
    c.revive(addr);
    let e = c.ping(addr).await.expect_err("still nobody");
    assert!(matches!(e, shingle_transport::TransportError::Connect { .. }), "{e}");
}

/// A peer that comes back (its node Up again in the map) is called on a new
/// connection: one from before it left may be stalled in TCP's retransmission
/// back-off, and a call waiting on it fails at once instead of at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revived_peer_gets_new_connections() {
    let mut rig = Rig::<Tcp>::start(TransportConfig::default()).await;
    let c = PeerClient::new(TransportConfig::default(), secret());
    let addr = rig.addr;
    let slow = {
        let c = c.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = echo(&c, addr, Bytes::from_static(b"slow"), 5_000).await;
            (r, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.revive(addr);
    let (r, took) = slow.await.expect("task");
    let e = r.expect_err("its connection was dropped");
    assert!(
        matches!(e, shingle_transport::TransportError::ConnectionClosed { .. }),
        "{e}"
    );
    assert!(took < Duration::from_secs(2), "failed after {took:?}");
    // The next call connects anew, at once.
    let r = echo(&c, addr, Bytes::from_static(b"after"), 0)
        .await
        .expect("a new connection");
    assert_eq!(r.data, Bytes::from_static(b"after"));
    rig.stop().await;
}
