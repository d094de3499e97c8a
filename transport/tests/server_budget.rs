//! A server's memory for requests and replies is bounded in bytes, over all its
//! connections ([`TransportConfig::max_server_bytes`]) and per connection
//! (`max_inflight_bytes`): a request beyond the budget is not read until earlier ones
//! are answered, and a reply that cannot get budget in time is answered `Overloaded`.

use bytes::Bytes;
use shingle_transport::frame::MsgKind;
use shingle_transport::{
    CallContext, ClusterSecret, Code, PeerClient, RegionTable, Router, RpcChannel, Server, Status, TransportConfig,
    TransportError,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const HOLD: MsgKind = MsgKind(0x7001);
const BIG_REPLY: MsgKind = MsgKind(0x7002);

fn secret() -> ClusterSecret {
    ClusterSecret::new(b"0123456789abcdef-budget".to_vec()).expect("secret")
}

fn config() -> TransportConfig {
    TransportConfig {
        max_frame_bytes: 1 << 20,
        max_inflight_bytes: 1 << 20,
        max_server_bytes: 2 << 20,
        request_timeout: Duration::from_secs(20),
        ..TransportConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_server_budget_wait_and_big_replies_are_refused_in_time() {
    let (now, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (n, m, g) = (now.clone(), max.clone(), gate.clone());
    let router = Router::new()
        .raw(HOLD, move |_: CallContext, payload: Bytes| {
            let (n, m, g) = (n.clone(), m.clone(), g.clone());
            async move {
                let running = n.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(running, Ordering::SeqCst);
                g.acquire()
                    .await
                    .map_err(|_| Status::new(Code::Internal, "gate"))?
                    .forget();
                n.fetch_sub(1, Ordering::SeqCst);
                Ok(Bytes::from(payload.len().to_le_bytes().to_vec()))
            }
        })
        .raw(BIG_REPLY, |_: CallContext, _: Bytes| async move {
            Ok(Bytes::from(vec![7u8; 1 << 20]))
        });
    let server = Server::bind(
        "127.0.0.1:0".parse().expect("addr"),
        config(),
        secret(),
        router,
        Arc::new(RegionTable::new()),
    )
    .await
    .expect("bind");
    let addr = server.local_addr();

    // Four requests of 900 KiB, each on a connection of its own: the server's 2 MiB
    // budget lets two be read and handled at once; the others wait unread.
    let mut calls = Vec::new();
    for _ in 0..4 {
        let c = PeerClient::new(config(), secret());
        calls.push(tokio::spawn(async move {
            c.call_raw(addr, HOLD, Bytes::from(vec![1u8; 900 << 10]), Default::default())
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(now.load(Ordering::SeqCst), 2, "two requests fit the budget, two wait");

    // While two hold the budget, a request for a 1 MiB reply cannot get budget for it
    // and is answered Overloaded within the wait, not left hanging.
    let c = PeerClient::new(config(), secret());
    let started = std::time::Instant::now();
    match c.call_raw(addr, BIG_REPLY, Bytes::new(), Default::default()).await {
        Err(TransportError::Remote { status, .. }) => assert_eq!(status.code, Code::Overloaded, "{status}"),
        other => panic!("expected Overloaded, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());

    gate.add_permits(4);
    for call in calls {
        let reply = call.await.expect("task").expect("answered once budget was free");
        assert_eq!(&reply[..], &(900usize << 10).to_le_bytes()[..]);
    }
    assert_eq!(max.load(Ordering::SeqCst), 2, "never more than the budget allows");
    // With the budget free again the big reply goes through.
    let reply = c
        .call_raw(addr, BIG_REPLY, Bytes::new(), Default::default())
        .await
        .expect("big reply");
    assert_eq!(reply.len(), 1 << 20);
    server.shutdown().await;
}
