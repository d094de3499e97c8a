//! The trace context travels in the frame: the server span of an RPC is a child of
//! the client span, in the same trace, across a real TCP connection.

use bytes::Bytes;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use shingle_transport::conformance::{Echo, EchoMsg, Rig, Tcp, secret};
use shingle_transport::{CallOptions, PeerClient, RemoteRead, RpcChannel, TransportConfig};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_span_is_child_of_client_span() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let tracer = provider.tracer("shingle-test");
    let subscriber = tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    tracing::subscriber::set_global_default(subscriber).expect("install subscriber");

    let mut rig = Rig::<Tcp>::start(TransportConfig::default()).await;
    let c = PeerClient::new(TransportConfig::default(), secret());
    let key = rig.regions.register(Bytes::from_static(b"traced region bytes"));
    async {
        c.call::<Echo>(
            rig.addr,
            &EchoMsg {
                data: Bytes::from_static(b"traced"),
                ..Default::default()
            },
            CallOptions::default(),
        )
        .await
        .expect("echo");
        let (r, _) = c.read(rig.addr, key, 0, 6, bytes::BytesMut::new()).await;
        r.expect("remote read");
    }
    .instrument(tracing::info_span!("test.operation"))
    .await;
    rig.stop().await;
    provider.force_flush().expect("flush");

    let spans = exporter.get_finished_spans().expect("spans");
    let by_name = |n: &str| spans.iter().filter(|s| s.name == n).cloned().collect::<Vec<_>>();
    let root = by_name("test.operation");
    assert_eq!(
        root.len(),
        1,
        "spans: {:?}",
        spans.iter().map(|s| s.name.clone()).collect::<Vec<_>>()
    );
    let root = &root[0];
    let clients = by_name("rpc.client");
    let servers = by_name("rpc.server");
    assert_eq!(clients.len(), 2, "one client span per RPC");
    assert_eq!(servers.len(), 2, "one server span per RPC");
    for client in &clients {
        assert_eq!(client.span_context.trace_id(), root.span_context.trace_id());
        assert_eq!(client.parent_span_id, root.span_context.span_id());
        let server = servers
            .iter()
            .find(|s| s.parent_span_id == client.span_context.span_id())
            .expect("a server span whose parent is this client span");
        assert_eq!(
            server.span_context.trace_id(),
            root.span_context.trace_id(),
            "server span in the same trace"
        );
    }
}
