//! Remote-read benchmark: a staged read over RDMA (one request whose answer grants the
//! bytes in the connection's read window, then one READ) against the same over TCP (the
//! request, then a remote read of the region by its key), on the same host pair.
//!
//! Runs a server (a region of `--region-mib`, RDMA export on `$SHINGLE_RDMA_DEV0`) and two
//! clients in one process: one over RDMA (`$SHINGLE_RDMA_DEV1`), one over TCP, to the
//! server's address `$SHINGLE_RDMA_ADDR0` (loopback when unset). For each read size it
//! measures throughput with `--depth` reads in flight for `--secs` seconds, and the
//! latency of single 4 KiB reads, and the latency of small RPCs (an echo of 64 bytes:
//! SEND fragments on the queue pair versus the TCP connection). Every read's bytes are
//! checked. Prints one
//! `key=value` line per figure (and the same as JSON with `--json FILE`).
//!
//!   fabric-tests/guest/run.sh --rdma -- fabric-tests/guest/rdma-bench.sh
//!
//! (which also runs `ib_read_bw` in the same guest and prints the ratio).

use bytes::{Bytes, BytesMut};
use shingle_transport::conformance::{Echo, EchoMsg, Rdma, echo_router, secret};
use shingle_transport::rdma::{Device, RdmaExport, RdmaReader};
use shingle_transport::{
    CallContext, CallOptions, Grant, PeerClient, RegionKey, RegionTable, RemoteRead, RpcChannel, Server, Status,
    TransportConfig,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    secs: f64,
    depth: usize,
    region_mib: usize,
    sizes: Vec<u32>,
    lat_reads: usize,
    json: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        secs: 5.0,
        depth: 16,
        region_mib: 64,
        sizes: vec![64 << 10, 1 << 20],
        lat_reads: 2000,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--secs" => a.secs = v().parse().expect("--secs"),
            "--depth" => a.depth = v().parse().expect("--depth"),
            "--region-mib" => a.region_mib = v().parse().expect("--region-mib"),
            "--sizes-kib" => {
                a.sizes = v()
                    .split(',')
                    .map(|s| s.parse::<u32>().expect("--sizes-kib") << 10)
                    .collect();
            }
            "--lat-reads" => a.lat_reads = v().parse().expect("--lat-reads"),
            "--json" => a.json = Some(v()),
            _ => panic!("unknown argument {k} (see the file's header)"),
        }
    }
    a
}

fn byte_at(i: usize) -> u8 {
    (i as u8).wrapping_mul(29) ^ (i >> 10) as u8
}

/// Stage `len` bytes at `offset` of the region (as a data node stages a shard's range).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StageMsg {
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(uint32, tag = "2")]
    pub len: u32,
}

/// The region's key, and over RDMA the range granted in the caller's window.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StagedMsg {
    #[prost(message, optional, tag = "1")]
    pub grant: Option<Grant>,
}

shingle_transport::rpc!(Stage, 0x0F02, StageMsg, StagedMsg);

/// A staged read: the request, then the bytes from the grant (RDMA) or by the region's
/// key (TCP, or a window without room).
async fn read(c: &PeerClient, addr: SocketAddr, key: RegionKey, off: u64, len: u32, buf: BytesMut) -> BytesMut {
    let req = StageMsg { offset: off, len };
    let r = c
        .call::<Stage>(addr, &req, CallOptions::default())
        .await
        .expect("stage");
    let buf = match r.grant {
        Some(g) => match c.read_grant(addr, &g, buf).await {
            Ok(b) => return b,
            Err(b) => b,
        },
        None => buf,
    };
    let (r, b) = c.read(addr, key, off, len, buf).await;
    r.expect("read");
    b
}

async fn throughput(c: &PeerClient, addr: SocketAddr, key: RegionKey, size: u32, depth: usize, secs: f64) -> f64 {
    let region = key.len as usize;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..depth {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut bytes = 0u64;
            let mut buf = BytesMut::new();
            let slots = (region / size as usize).max(1);
            let mut i = w;
            while Instant::now() < deadline {
                let off = (i % slots) * size as usize;
                let b = read(&c, addr, key, off as u64, size, buf).await;
                assert!(
                    b.len() == size as usize && b[0] == byte_at(off) && b[b.len() - 1] == byte_at(off + b.len() - 1)
                );
                bytes += size as u64;
                buf = b;
                i += depth;
            }
            bytes
        }));
    }
    let mut total = 0u64;
    for t in tasks {
        total += t.await.expect("reader");
    }
    total as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

async fn latency(c: &PeerClient, addr: SocketAddr, key: RegionKey, reads: usize) -> (f64, f64) {
    let mut lat = Vec::with_capacity(reads);
    let mut buf = BytesMut::new();
    for i in 0..reads {
        let off = (i * 4096 * 7) % (key.len as usize - 4096);
        let t = Instant::now();
        let b = read(c, addr, key, off as u64, 4096, buf).await;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(b[0], byte_at(off));
        buf = b;
    }
    lat.sort_by(f64::total_cmp);
    (lat[lat.len() / 2], lat[lat.len() * 99 / 100])
}

async fn rpc_latency(c: &PeerClient, addr: SocketAddr, calls: usize) -> (f64, f64) {
    let mut lat = Vec::with_capacity(calls);
    let data = Bytes::from(vec![7u8; 64]);
    for _ in 0..calls {
        let req = EchoMsg {
            data: data.clone(),
            delay_ms: 0,
            fail_with: 0,
        };
        let t = Instant::now();
        let r = c.call::<Echo>(addr, &req, CallOptions::default()).await.expect("echo");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(r.data, data);
    }
    lat.sort_by(f64::total_cmp);
    (lat[lat.len() / 2], lat[lat.len() * 99 / 100])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let regions = Arc::new(RegionTable::new());
    let data: Vec<u8> = (0..a.region_mib << 20).map(byte_at).collect();
    let key = regions.register(Bytes::from(data));
    let dev0 = Device::open(&Rdma::config("SHINGLE_RDMA_DEV0")).expect("server RDMA device");
    let export = RdmaExport::new(dev0, &TransportConfig::default());
    let whole = regions.whole(key).expect("region");
    let router =
        echo_router(Default::default(), Default::default()).rpc::<Stage, _, _>(move |ctx: CallContext, r: StageMsg| {
            let whole = whole.clone();
            async move {
                let end = r
                    .offset
                    .checked_add(u64::from(r.len))
                    .filter(|e| *e <= whole.len() as u64);
                let end = end.ok_or_else(|| Status::new(shingle_transport::Code::OutOfBounds, "range"))?;
                let range = &whole[r.offset as usize..end as usize];
                Ok(StagedMsg {
                    grant: ctx.window.as_ref().and_then(|w| w.place(range)),
                })
            }
        });
    let ip = std::env::var("SHINGLE_RDMA_ADDR0").unwrap_or_else(|_| "127.0.0.1".into());
    let bind: SocketAddr = format!("{ip}:0").parse().expect("SHINGLE_RDMA_ADDR0");
    let server = Server::bind(
        bind,
        TransportConfig::default(),
        secret(),
        export.routes(router),
        regions,
    )
    .await
    .expect("bind");
    let addr = server.local_addr();
    let rdma = PeerClient::new(TransportConfig::default(), secret());
    let reader = RdmaReader::new(Device::open(&Rdma::config("SHINGLE_RDMA_DEV1")).expect("client RDMA device"));
    rdma.attach_rdma(reader.clone());
    let tcp = PeerClient::new(TransportConfig::default(), secret());
    let mut out: Vec<(String, f64)> = Vec::new();
    // Warm up both paths (queue pair and window, TCP connections).
    read(&rdma, addr, key, 0, 4096, BytesMut::new()).await;
    read(&tcp, addr, key, 0, 4096, BytesMut::new()).await;
    for &size in &a.sizes {
        for (name, c) in [("rdma", &rdma), ("tcp", &tcp)] {
            let g = throughput(c, addr, key, size, a.depth, a.secs).await;
            out.push((format!("{name}_read_gbit_s_{}k", size >> 10), g));
        }
    }
    for (name, c) in [("rdma", &rdma), ("tcp", &tcp)] {
        let (p50, p99) = latency(c, addr, key, a.lat_reads).await;
        out.push((format!("{name}_4k_p50_us"), p50));
        out.push((format!("{name}_4k_p99_us"), p99));
    }
    let reads_before = reader.stats();
    let calls_before = reads_before.calls;
    for (name, c) in [("rdma", &rdma), ("tcp", &tcp)] {
        let (p50, p99) = rpc_latency(c, addr, a.lat_reads).await;
        out.push((format!("{name}_rpc_p50_us"), p50));
        out.push((format!("{name}_rpc_p99_us"), p99));
    }
    let s = reader.stats();
    assert_eq!(s.fallbacks, 0, "the RDMA client fell back to TCP");
    assert_eq!(
        s.calls - calls_before,
        a.lat_reads as u64,
        "the RDMA client's calls went over TCP"
    );
    assert!(
        s.reads > 0 && s.stale_grants == 0,
        "the RDMA client's reads did not use grants: {s:?}"
    );
    out.push(("rdma_reads".into(), s.reads as f64));
    out.push(("rdma_calls".into(), s.calls as f64));
    for (k, v) in &out {
        println!("{k}={v:.3}");
    }
    if let Some(path) = a.json {
        let body: Vec<String> = out.iter().map(|(k, v)| format!("  \"{k}\": {v:.3}")).collect();
        std::fs::write(&path, format!("{{\n{}\n}}\n", body.join(",\n"))).expect("write json");
    }
    server.shutdown().await;
}
