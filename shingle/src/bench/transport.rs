//! `shingle bench transport`: remote-read throughput against plain TCP, and small-RPC
//! latency, over loopback, measured in one run so the ratios are meaningful on a
//! noisy machine.

use anyhow::{Context, Result};
use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;
use serde::Serialize;
use shingle_transport::{
    CallOptions, ClusterSecret, MsgKind, PeerClient, RegionTable, RemoteRead, Router, RpcChannel, Server,
    TransportConfig,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Options of the transport benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct TransportBenchArgs {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Read sizes in KiB.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1024u32, 4096])]
    pub sizes_kib: Vec<u32>,
    /// Concurrent streams for the throughput test.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 4, 16])]
    pub streams: Vec<usize>,
    /// Concurrent callers for the latency test.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 16, 128])]
    pub callers: Vec<usize>,
    /// Measurement rounds per point; remote read and baseline alternate within a
    /// round and the median of the per-round ratios is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Connections the client keeps to the server (default: the transport's default
    /// pool size; the baseline always uses one connection per stream).
    #[arg(long)]
    pub conns: Option<usize>,
    /// Run only the remote-read side (no baseline, no latency): for profiling.
    #[arg(long, hide = true)]
    pub profile_remote_read: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
struct ThroughputRow {
    size_kib: u32,
    streams: usize,
    remote_read_mb_s: f64,
    plain_tcp_mb_s: f64,
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct LatencyRow {
    callers: usize,
    ops_per_s: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    machine: String,
    seconds_per_point: f64,
    throughput: Vec<ThroughputRow>,
    latency_64b: Vec<LatencyRow>,
}

const REGION_BYTES: usize = 64 << 20;

/// Runs the benchmark and prints a table.
pub async fn run(args: TransportBenchArgs) -> Result<()> {
    let secret = ClusterSecret::new(b"bench-secret-bench-secret".to_vec())?;
    let region: Bytes = (0..REGION_BYTES)
        .map(|i| (i * 7 + i / 4093) as u8)
        .collect::<Vec<u8>>()
        .into();
    let regions = Arc::new(RegionTable::new());
    let key = regions.register(region.clone());
    let cfg = TransportConfig::default();
    let server = Server::bind(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        cfg.clone(),
        secret.clone(),
        Router::new(),
        regions,
    )
    .await
    .context("start transport server")?;
    let addr = server.local_addr();
    let plain = spawn_plain_server(region.clone()).await?;
    let dur = Duration::from_secs_f64(args.seconds);

    println!(
        "remote-read throughput over loopback (median of {} rounds of {}s each, alternating with the baseline)",
        args.rounds, args.seconds
    );
    println!(
        "{:>9} {:>8} {:>16} {:>16} {:>7}",
        "size", "streams", "remote-read MB/s", "plain TCP MB/s", "ratio"
    );
    let to = Target { addr, key, plain };
    let throughput = throughput_table(&args, &cfg, &secret, to, dur).await?;

    let latency = latency_table(&args, &cfg, &secret, addr, dur).await?;
    server.shutdown().await;

    let report = Report {
        machine: machine(),
        seconds_per_point: args.seconds,
        throughput,
        latency_64b: latency,
    };
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("write {}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}

/// The transport server's address and the region it exports, and the plain TCP
/// server's address (the baseline).
#[derive(Clone, Copy)]
struct Target {
    addr: SocketAddr,
    key: shingle_transport::RegionKey,
    plain: SocketAddr,
}

/// Remote-read throughput against plain TCP for every size and stream count, printed
/// as it goes.
async fn throughput_table(
    args: &TransportBenchArgs,
    cfg: &TransportConfig,
    secret: &ClusterSecret,
    to: Target,
    dur: Duration,
) -> Result<Vec<ThroughputRow>> {
    let Target { addr, key, plain } = to;
    let mut throughput = Vec::new();
    for &size_kib in &args.sizes_kib {
        for &streams in &args.streams {
            let size = size_kib as usize * 1024;
            let conns = args.conns.unwrap_or(cfg.conns_per_peer).clamp(1, 64);
            let client = PeerClient::new(
                TransportConfig {
                    conns_per_peer: conns,
                    ..cfg.clone()
                },
                secret.clone(),
            );
            client.ping(addr).await.context("ping transport server")?;
            let (mut rrs, mut bases, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..args.rounds.max(1) {
                let rr = remote_read_rate(&client, addr, key, size, streams, dur).await?;
                if args.profile_remote_read {
                    rrs.push(rr);
                    continue;
                }
                let base = plain_rate(plain, size, streams, dur).await?;
                rrs.push(rr);
                bases.push(base);
                ratios.push(rr / base);
            }
            client.close();
            if args.profile_remote_read {
                println!("{size_kib:>6} KiB {streams:>8} {:>16.0}", super::median(&mut rrs) / 1e6);
                continue;
            }
            let row = ThroughputRow {
                size_kib,
                streams,
                remote_read_mb_s: super::median(&mut rrs) / 1e6,
                plain_tcp_mb_s: super::median(&mut bases) / 1e6,
                ratio: super::median(&mut ratios),
            };
            println!(
                "{:>6} KiB {:>8} {:>16.0} {:>16.0} {:>7.2}",
                row.size_kib, row.streams, row.remote_read_mb_s, row.plain_tcp_mb_s, row.ratio
            );
            throughput.push(row);
        }
    }

    Ok(throughput)
}

/// 64-byte RPC latency for every number of callers, printed as it goes.
async fn latency_table(
    args: &TransportBenchArgs,
    cfg: &TransportConfig,
    secret: &ClusterSecret,
    addr: SocketAddr,
    dur: Duration,
) -> Result<Vec<LatencyRow>> {
    println!("\n64-byte RPC latency ({}s per point)", args.seconds);
    println!(
        "{:>8} {:>10} {:>9} {:>9} {:>9}",
        "callers", "ops/s", "p50 µs", "p99 µs", "p999 µs"
    );
    let mut latency = Vec::new();
    let client = PeerClient::new(cfg.clone(), secret.clone());
    for &callers in &args.callers {
        let row = rpc_latency(&client, addr, callers, dur).await?;
        println!(
            "{:>8} {:>10.0} {:>9} {:>9} {:>9}",
            row.callers, row.ops_per_s, row.p50_us, row.p99_us, row.p999_us
        );
        latency.push(row);
    }
    client.close();
    Ok(latency)
}

async fn remote_read_rate(
    client: &PeerClient,
    addr: SocketAddr,
    key: shingle_transport::RegionKey,
    size: usize,
    streams: usize,
    dur: Duration,
) -> Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for s in 0..streams {
        let (client, stop, total) = (client.clone(), stop.clone(), total.clone());
        tasks.push(tokio::spawn(async move {
            let mut buf = BytesMut::with_capacity(size);
            let slots = (REGION_BYTES / size) as u64;
            let mut i = s as u64;
            while !stop.load(Ordering::Relaxed) {
                let off = (i % slots) * size as u64;
                let (r, b) = client.read(addr, key, off, size as u32, buf).await;
                r?;
                total.fetch_add(b.len() as u64, Ordering::Relaxed);
                buf = b;
                i += streams as u64;
            }
            anyhow::Ok(())
        }));
    }
    bytes_per_second(dur, &stop, &total, tasks).await
}

/// Lets `tasks` run for `dur`, then stops them and returns the bytes per second they
/// counted in `total` up to the stop.
async fn bytes_per_second(
    dur: Duration,
    stop: &AtomicBool,
    total: &AtomicU64,
    tasks: Vec<tokio::task::JoinHandle<Result<()>>>,
) -> Result<f64> {
    let t = Instant::now();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    let bytes_at_stop = total.load(Ordering::Relaxed);
    let elapsed = t.elapsed().as_secs_f64();
    for t in tasks {
        t.await??;
    }
    Ok(bytes_at_stop as f64 / elapsed)
}

/// The baseline: a bare TCP server that streams the same region in `size` blocks.
async fn spawn_plain_server(region: Bytes) -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let region = region.clone();
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let mut size = [0u8; 4];
                if s.read_exact(&mut size).await.is_err() {
                    return;
                }
                let size = u32::from_le_bytes(size) as usize;
                let slots = REGION_BYTES / size;
                let mut i = 0;
                loop {
                    let off = (i % slots) * size;
                    if s.write_all(&region[off..off + size]).await.is_err() {
                        return;
                    }
                    i += 1;
                }
            });
        }
    });
    Ok(addr)
}

async fn plain_rate(addr: SocketAddr, size: usize, streams: usize, dur: Duration) -> Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let (stop, total) = (stop.clone(), total.clone());
        let mut s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        s.write_all(&(size as u32).to_le_bytes()).await?;
        tasks.push(tokio::spawn(async move {
            let mut buf = vec![0u8; size];
            while !stop.load(Ordering::Relaxed) {
                s.read_exact(&mut buf).await?;
                total.fetch_add(size as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    bytes_per_second(dur, &stop, &total, tasks).await
}

async fn rpc_latency(client: &PeerClient, addr: SocketAddr, callers: usize, dur: Duration) -> Result<LatencyRow> {
    let payload = Bytes::from(vec![0x5a; 64]);
    // Warm the pool so connects are not measured.
    for _ in 0..client.config().conns_per_peer {
        client
            .call_raw(addr, MsgKind::PING, payload.clone(), CallOptions::default())
            .await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (client, stop, payload) = (client.clone(), stop.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = client
                    .call_raw(addr, MsgKind::PING, payload.clone(), CallOptions::default())
                    .await?;
                h.record((t.elapsed().as_micros() as u64).max(1))?;
                anyhow::ensure!(r == payload, "echo mismatch");
            }
            anyhow::Ok(h)
        }));
    }
    let t = Instant::now();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in tasks {
        all.add(t.await??)?;
    }
    let elapsed = t.elapsed().as_secs_f64();
    Ok(LatencyRow {
        callers,
        ops_per_s: all.len() as f64 / elapsed,
        p50_us: all.value_at_quantile(0.50),
        p99_us: all.value_at_quantile(0.99),
        p999_us: all.value_at_quantile(0.999),
    })
}

/// A one-line description of the machine, for the report.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} cpus, {model}, Linux {}", kernel.trim())
}
