//! Remote-read benchmark: one-sided RDMA READ against TCP on the same host pair.
//!
//! Runs a server (regions of `--region-mib`, RDMA export on `$SHINGLE_RDMA_DEV0`) and two
//! clients in one process: one reading over RDMA (`$SHINGLE_RDMA_DEV1`), one over TCP, to
//! the server's address `$SHINGLE_RDMA_ADDR0` (loopback when unset). For each read size
//! it measures throughput with `--depth` reads in flight for `--secs` seconds, and the
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
    CallOptions, PeerClient, RegionKey, RegionTable, RemoteRead, RpcChannel, Server, TransportConfig,
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
                let (r, b) = c.read(addr, key, off as u64, size, buf).await;
                r.expect("read");
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
        let (r, b) = c.read(addr, key, off as u64, 4096, buf).await;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        r.expect("read");
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
    let export = RdmaExport::new(dev0, regions.clone(), &TransportConfig::default());
    let ip = std::env::var("SHINGLE_RDMA_ADDR0").unwrap_or_else(|_| "127.0.0.1".into());
    let bind: SocketAddr = format!("{ip}:0").parse().expect("SHINGLE_RDMA_ADDR0");
    let server = Server::bind(
        bind,
        TransportConfig::default(),
        secret(),
        export.routes(echo_router(Default::default(), Default::default())),
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
    // Warm up both paths (queue pair, key resolution, TCP connections).
    rdma.read(addr, key, 0, 4096, BytesMut::new())
        .await
        .0
        .expect("rdma warm-up");
    tcp.read(addr, key, 0, 4096, BytesMut::new())
        .await
        .0
        .expect("tcp warm-up");
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
    let calls_before = reader.stats().calls;
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
