//! OpenTelemetry traces end to end: a real OTLP/HTTP receiver (protobuf over HTTP/1.1,
//! decoded with the opentelemetry-proto messages) gets the spans of `shingle dev` — six
//! `shingle serve` processes and the FUSE mount — and of a `shingle put`, all pointed at
//! it by `OTEL_EXPORTER_OTLP_ENDPOINT`. A read through the mount is one trace: the
//! client's `fs.read` span is an ancestor of `rpc.server` and `data.stage` spans in
//! the data node processes; a lookup's and a file close's traces reach the meta nodes
//! (coordinator and replicas). The batch delay is ten minutes, so every span here
//! arrives through the flush at exit (serve's SIGTERM path, the mount's unmount path).

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

use common::DevMount;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use parking_lot::Mutex;
use prost::Message;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_shingle");

/// An attribute value, simplified.
#[derive(Clone, Debug, PartialEq)]
enum Val {
    Str(String),
    Int(i64),
    Bool(bool),
    Other,
}

fn val(v: &Option<AnyValue>) -> Val {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => Val::Str(s.clone()),
        Some(any_value::Value::IntValue(i)) => Val::Int(*i),
        Some(any_value::Value::BoolValue(b)) => Val::Bool(*b),
        _ => Val::Other,
    }
}

fn attrs(kvs: &[KeyValue]) -> HashMap<String, Val> {
    kvs.iter().map(|kv| (kv.key.clone(), val(&kv.value))).collect()
}

/// One received span with its process's resource.
#[derive(Clone, Debug)]
struct Span {
    service: String,
    pid: i64,
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    attrs: HashMap<String, Val>,
}

impl Span {
    /// An integer attribute. tracing-opentelemetry exports `u64` fields (inodes, byte
    /// counts) as their decimal strings and `i64` fields as integers: both are accepted.
    fn int(&self, k: &str) -> Option<i64> {
        match self.attrs.get(k) {
            Some(Val::Int(i)) => Some(*i),
            Some(Val::Str(s)) => s.parse().ok(),
            _ => None,
        }
    }

    fn str(&self, k: &str) -> Option<&str> {
        match self.attrs.get(k) {
            Some(Val::Str(s)) => Some(s),
            _ => None,
        }
    }

    fn bool(&self, k: &str) -> Option<bool> {
        match self.attrs.get(k) {
            Some(Val::Bool(b)) => Some(*b),
            _ => None,
        }
    }
}

/// A minimal OTLP/HTTP receiver: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`, answered 200 with an empty `ExportTraceServiceResponse`.
struct Receiver {
    addr: std::net::SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind receiver");
        let addr = l.local_addr().expect("addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (s2, r2) = (spans.clone(), requests.clone());
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { continue };
                let (s, r) = (s2.clone(), r2.clone());
                std::thread::spawn(move || serve(conn, &s, &r));
            }
        });
        Receiver { addr, spans, requests }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().clone()
    }
}

/// Serves one keep-alive connection.
fn serve(conn: TcpStream, spans: &Mutex<Vec<Span>>, requests: &Mutex<Vec<String>>) {
    let mut w = conn.try_clone().expect("clone");
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let request_line = line.trim().to_string();
        let mut len = 0usize;
        let mut content_type = String::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().expect("content-length"),
                    "content-type" => content_type = v.trim().to_string(),
                    "transfer-encoding" => panic!("chunked OTLP body not expected: {v}"),
                    _ => {}
                }
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).expect("body");
        requests.lock().push(format!("{request_line} {content_type}"));
        let ok = request_line.starts_with("POST /v1/traces ") && content_type == "application/x-protobuf";
        if ok {
            let req = ExportTraceServiceRequest::decode(&body[..]).expect("an ExportTraceServiceRequest");
            let mut got = Vec::new();
            for rs in req.resource_spans {
                let res = attrs(&rs.resource.map(|r| r.attributes).unwrap_or_default());
                let service = match res.get("service.name") {
                    Some(Val::Str(s)) => s.clone(),
                    _ => String::new(),
                };
                let pid = match res.get("process.pid") {
                    Some(Val::Int(p)) => *p,
                    _ => 0,
                };
                for ss in rs.scope_spans {
                    for s in ss.spans {
                        got.push(Span {
                            service: service.clone(),
                            pid,
                            name: s.name,
                            trace: s.trace_id,
                            id: s.span_id,
                            parent: s.parent_span_id,
                            attrs: attrs(&s.attributes),
                        });
                    }
                }
            }
            spans.lock().extend(got);
        }
        let status = if ok { "200 OK" } else { "404 Not Found" };
        let reply = format!("HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n");
        if w.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// The environment that points a process at the receiver (and nowhere else).
fn otel_env(cmd: &mut Command, rx: &Receiver) {
    for k in [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SERVICE_NAME",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    ] {
        cmd.env_remove(k);
    }
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint())
        // Nothing is exported on a timer: what arrives was flushed at exit.
        .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
        .env("OTEL_BSP_MAX_QUEUE_SIZE", "65536")
        .env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "65536");
}

/// The dev cluster of this test: 16 zones per node, spans sent to `rx`.
fn start_dev(data: &Path, mount: &Path, rx: &Receiver) -> DevMount {
    DevMount::start(data, mount, &["--zones", "16"], |cmd| otel_env(cmd, rx))
}

fn pattern(len: usize) -> Vec<u8> {
    shingle_testkit::bytes(1, len)
}

/// The spans of one trace by id, and helpers over them.
struct Traces {
    spans: Vec<Span>,
    by_id: HashMap<Vec<u8>, usize>,
}

impl Traces {
    fn new(spans: Vec<Span>) -> Traces {
        let by_id = spans.iter().enumerate().map(|(i, s)| (s.id.clone(), i)).collect();
        Traces { spans, by_id }
    }

    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Span> + 'a {
        self.spans.iter().filter(move |s| s.name == name)
    }

    /// True when `anc` is `s` or one of its ancestors (by parent span ids, across
    /// processes), all in one trace.
    fn descends(&self, s: &Span, anc: &Span) -> bool {
        let mut cur = s;
        for _ in 0..64 {
            assert_eq!(cur.trace, anc.trace, "parent chain left the trace");
            if cur.id == anc.id {
                return true;
            }
            let Some(&p) = self.by_id.get(&cur.parent) else {
                return false;
            };
            cur = &self.spans[p];
        }
        false
    }

    /// The names on the way from `s` up to `anc` (for messages).
    fn chain(&self, s: &Span) -> String {
        let mut out = vec![format!("{} [{}]", s.name, s.service)];
        let mut cur = s;
        while let Some(&p) = self.by_id.get(&cur.parent) {
            cur = &self.spans[p];
            out.push(format!("{} [{}]", cur.name, cur.service));
        }
        out.join(" <- ")
    }

    fn in_trace<'a>(&'a self, root: &'a Span) -> impl Iterator<Item = &'a Span> + 'a {
        self.spans
            .iter()
            .filter(move |s| s.trace == root.trace && self.descends(s, root))
    }
}

#[test]
fn read_through_the_mount_is_one_trace_across_processes() {
    let rx = Receiver::start();
    let tmp = tempfile::tempdir().expect("tmp");
    let (data, mnt) = (tmp.path().join("data"), tmp.path().join("mnt"));
    let mut dev = start_dev(&data, &mnt, &rx);

    // A file stored by the tool (so the mount has never seen it: its read reaches FUSE,
    // not the page cache), one stripe of ec(4,2) with 1 MiB units.
    let content = pattern((3 << 20) + 12_345);
    let local = tmp.path().join("local.bin");
    std::fs::write(&local, &content).expect("write local");
    let mut put = Command::new(BIN);
    put.args(["put", "--cluster-file"])
        .arg(data.join("cluster.toml"))
        .arg("--secret-file")
        .arg(data.join("secret"))
        .arg(&local)
        .arg("/traced.bin");
    otel_env(&mut put, &rx);
    let out = put.output().expect("shingle put");
    assert!(out.status.success(), "put: {}", String::from_utf8_lossy(&out.stderr));
    // The tool exited: its spans came with the flush at exit.
    let tool = rx.spans();
    assert!(
        tool.iter()
            .any(|s| s.name == "tool" && s.service == "shingle-tool" && s.str("op") == Some("put")),
        "no tool span flushed at the tool's exit: {:?}",
        tool.iter().map(|s| &s.name).collect::<Vec<_>>()
    );

    // Through the mount: a read, and a write that is committed on close.
    assert_eq!(std::fs::read(mnt.join("traced.bin")).expect("read via mount"), content);
    std::fs::write(mnt.join("written.bin"), b"written through the mount").expect("write via mount");
    assert!(
        !rx.spans().iter().any(|s| s.name.starts_with("fs.")),
        "the mount exported before its exit (batch delay is 10 minutes)"
    );
    dev.stop(Duration::from_secs(90));

    let t = Traces::new(rx.spans());
    let services: std::collections::BTreeSet<&str> = t.spans.iter().map(|s| s.service.as_str()).collect();
    let pids: std::collections::BTreeSet<i64> = t.spans.iter().map(|s| s.pid).collect();
    assert!(
        services.contains("shingle-client")
            && services.contains("shingle-manager-meta-data")
            && services.contains("shingle-meta-data"),
        "services: {services:?}"
    );
    assert!(pids.len() >= 7, "spans from {} processes: {pids:?}", pids.len());

    // The read: fs.read → stripe.read → shard.read → rpc.client ⇒ rpc.server →
    // data.stage in the data nodes' processes, one trace.
    let client_pid = t.named("fs.read").next().expect("an fs.read span").pid;
    let read = t
        .named("fs.read")
        .find(|r| t.in_trace(r).any(|s| s.name == "stripe.read"))
        .unwrap_or_else(|| {
            panic!(
                "no fs.read with a stripe read under it; fs.read spans: {:?}",
                t.named("fs.read").map(|s| &s.attrs).collect::<Vec<_>>()
            )
        });
    assert_eq!(read.service, "shingle-client");
    assert_eq!(read.str("op"), Some("read"));
    assert!(read.int("ino").is_some_and(|i| i > 1), "{:?}", read.attrs);
    assert!(read.int("bytes").is_some_and(|b| b > 0), "{:?}", read.attrs);
    assert_eq!(read.str("fabric"), Some("tcp"), "{:?}", read.attrs);
    let stripe = t.in_trace(read).find(|s| s.name == "stripe.read").expect("stripe.read");
    assert_eq!(stripe.int("bytes"), Some(content.len() as i64), "{:?}", stripe.attrs);
    assert_eq!(stripe.str("fabric"), Some("tcp"));
    // On a loaded machine a shard may be slow enough to be hedged with parity (then
    // the read is decoded: degraded). Both are recorded either way.
    let hedged = stripe.int("hedged").expect("hedged is recorded");
    assert!(read.bool("degraded").is_some() && stripe.bool("degraded").is_some());
    if hedged == 0 {
        assert_eq!(read.bool("degraded"), Some(false), "{:?}", read.attrs);
        assert_eq!(stripe.bool("degraded"), Some(false), "{:?}", stripe.attrs);
    }
    let shards: Vec<&Span> = t.in_trace(read).filter(|s| s.name == "shard.read").collect();
    assert!(shards.len() >= 4, "{} shard reads", shards.len());
    for s in &shards {
        assert!(
            s.int("bytes").is_some_and(|b| b > 0) && s.str("fabric") == Some("tcp"),
            "{:?}",
            s.attrs
        );
    }
    let resolves: Vec<&Span> = t.in_trace(read).filter(|s| s.name == "data.stage").collect();
    assert!(resolves.len() >= 4, "{} resolves in the read's trace", resolves.len());
    let data_pids: std::collections::BTreeSet<i64> = resolves.iter().map(|s| s.pid).collect();
    assert!(data_pids.len() >= 4, "resolves served by {data_pids:?}");
    for r in &resolves {
        assert_ne!(r.pid, client_pid, "a resolve in the client's process");
        assert!(
            r.service.starts_with("shingle-") && r.service.ends_with("data"),
            "{}",
            r.service
        );
        let chain = t.chain(r);
        assert!(
            chain.starts_with("data.stage") && chain.contains("rpc.server") && chain.contains("rpc.client"),
            "{chain}"
        );
        assert!(r.int("bytes").is_some_and(|b| b > 0), "{:?}", r.attrs);
        assert_eq!(r.int("ino"), read.int("ino"));
        let server = &t.spans[t.by_id[&r.parent]];
        assert_eq!(server.name, "rpc.server");
        assert_eq!(server.pid, r.pid);
        let client = &t.spans[t.by_id[&server.parent]];
        assert_eq!((client.name.as_str(), client.pid), ("rpc.client", client_pid));
    }
    // The shard bytes themselves: remote reads over TCP, served in the same processes.
    let remote_reads = t
        .in_trace(read)
        .filter(|s| s.name == "rpc.server" && s.pid != client_pid && !resolves.iter().any(|r| r.parent == s.id))
        .count();
    assert!(remote_reads >= 4, "{remote_reads} remote-read server spans");

    // Namespace hops: the lookup of the file is answered by a meta node, in its trace.
    let lookup_reaches_meta = t.named("fs.lookup").any(|l| {
        t.in_trace(l)
            .any(|s| s.name == "meta.read" && s.pid != client_pid && s.str("op") == Some("lookup"))
    });
    assert!(lookup_reaches_meta, "no fs.lookup trace reaching a meta node");
    // The write's commit (on flush/close): client → coordinator (meta.op, meta.execute)
    // → the partition's replicas (meta.replicate), three processes in one trace.
    let commit = t
        .named("meta.op")
        .find(|s| s.str("op") == Some("commit_write"))
        .expect("a commit_write at a meta node");
    let root = {
        let mut cur = commit;
        while let Some(&p) = t.by_id.get(&cur.parent) {
            cur = &t.spans[p];
        }
        cur
    };
    assert!(
        root.name == "fs.flush" || root.name == "fs.release",
        "commit's root: {}",
        t.chain(commit)
    );
    let replicas: Vec<&Span> = t
        .in_trace(root)
        .filter(|s| s.name == "meta.replicate" && s.pid != commit.pid && s.pid != client_pid)
        .collect();
    assert!(!replicas.is_empty(), "no replica in the commit's trace");
    assert!(
        t.in_trace(root)
            .any(|s| s.name == "ns.op" && s.int("partition").is_some())
    );
    // Data written through the mount: stripe.write → data.write on the data nodes.
    let write = t
        .named("stripe.write")
        .find(|s| s.pid == client_pid && s.int("bytes") == Some(25))
        .expect("the written file's stripe");
    assert!(
        t.spans
            .iter()
            .filter(|s| s.name == "data.write" && s.trace == write.trace && t.descends(s, write))
            .count()
            >= 3,
        "shard writes of the stripe (one data shard and two parity)"
    );

    // Background RPCs (heartbeats, map polls) start no traces by default.
    assert!(
        !t.spans
            .iter()
            .any(|s| s.name.starts_with("rpc.") && s.parent.is_empty()),
        "a root RPC span was exported"
    );
    let requests = rx.requests.lock().clone();
    assert!(
        requests.iter().all(|r| r.starts_with("POST /v1/traces ")),
        "{requests:?}"
    );
}
