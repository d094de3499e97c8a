//! `shingle bench meta`: the lookup + getattr storm against real meta-node processes.
//!
//! For each cluster size, starts a local cluster (every node a meta node, one manager),
//! creates `files` files spread over `dirs` directories, then runs `callers` concurrent
//! callers, each repeatedly looking up a random file (one RPC to the entry's partition)
//! and getting its attributes (one RPC to the inode's partition), for `seconds`.
//! Reports ops/s and p50/p99/p999 per operation.
//!
//! `--cap` repeats the storm with every node capped at a fixed CPU share (cgroup v1 cpu
//! controller) at 1, 2 and 4 nodes, to show scale-out on a machine with few cores.

use super::transport::machine;
use crate::local::{LocalCluster, LocalSpec};
use anyhow::Result;
use hdrhistogram::Histogram;
use shingle_meta::ids::Ino;
use shingle_meta::meta_client::MetaClient;
use shingle_meta::namespace::{Creds, FileKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Options of the metadata benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct MetaBenchArgs {
    /// Cluster sizes (meta nodes).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 3, 6])]
    pub nodes: Vec<usize>,
    /// Concurrent callers.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 16, 128])]
    pub callers: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Files to create.
    #[arg(long, default_value_t = 2000)]
    pub files: usize,
    /// Directories they are spread over.
    #[arg(long, default_value_t = 20)]
    pub dirs: usize,
    /// Metadata partitions.
    #[arg(long, default_value_t = 64)]
    pub partitions: u32,
    /// Also measure scale-out with each node capped at this share of a core (e.g. 0.25),
    /// at the `cap_nodes` sizes.
    #[arg(long)]
    pub cap: Option<f64>,
    /// Cluster sizes of the capped scale-out run.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2, 4])]
    pub cap_nodes: Vec<usize>,
    /// Callers of the capped scale-out run.
    #[arg(long, default_value_t = 128)]
    pub cap_callers: usize,
    /// Work folder (default: a temporary folder).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

struct Point {
    ops: f64,
    lookup: Histogram<u64>,
    getattr: Histogram<u64>,
}

/// Runs the benchmark and prints a table (and JSON lines).
pub async fn run(a: MetaBenchArgs) -> Result<()> {
    println!("# metadata storm: lookup + getattr of random files ({})", machine());
    println!(
        "# {} files in {} dirs, {} partitions, {} s per point",
        a.files, a.dirs, a.partitions, a.seconds
    );
    println!("nodes callers      ops/s   lookup p50/p99/p999 us   getattr p50/p99/p999 us");
    for &n in &a.nodes {
        let (cluster, client, files, _tmp) = setup(&a, n, None).await?;
        for &c in &a.callers {
            let p = storm(&client, &files, c, a.seconds).await;
            report(n, c, &p, None);
        }
        drop(cluster);
    }
    if let Some(share) = a.cap {
        println!(
            "# scale-out: each node capped at {share} core, {} callers",
            a.cap_callers
        );
        println!("nodes callers      ops/s   lookup p50/p99/p999 us   getattr p50/p99/p999 us   speedup");
        let mut base = None;
        for &n in &a.cap_nodes {
            let (cluster, client, files, _tmp) = setup(&a, n, Some(share)).await?;
            let p = storm(&client, &files, a.cap_callers, a.seconds).await;
            let b = *base.get_or_insert(p.ops);
            report(n, a.cap_callers, &p, Some(p.ops / b));
            drop(cluster);
        }
    }
    Ok(())
}

fn report(n: usize, c: usize, p: &Point, speedup: Option<f64>) {
    let q = |h: &Histogram<u64>, x: f64| h.value_at_quantile(x);
    let mut line = format!(
        "{n:5} {c:7} {:10.0}   {:6}/{:6}/{:6}      {:6}/{:6}/{:6}",
        p.ops,
        q(&p.lookup, 0.5),
        q(&p.lookup, 0.99),
        q(&p.lookup, 0.999),
        q(&p.getattr, 0.5),
        q(&p.getattr, 0.99),
        q(&p.getattr, 0.999)
    );
    if let Some(s) = speedup {
        line += &format!("   {s:.2}x");
    }
    println!("{line}");
    println!(
        "{}",
        serde_json::json!({
            "bench": "meta", "nodes": n, "callers": c, "ops_per_s": p.ops.round(),
            "lookup_us": [q(&p.lookup, 0.5), q(&p.lookup, 0.99), q(&p.lookup, 0.999)],
            "getattr_us": [q(&p.getattr, 0.5), q(&p.getattr, 0.99), q(&p.getattr, 0.999)],
            "cpu_cap": speedup.map(|_| true), "speedup": speedup,
        })
    );
}

type Setup = (
    LocalCluster,
    MetaClient,
    Arc<Vec<(Ino, Vec<u8>)>>,
    Option<tempfile::TempDir>,
);

async fn setup(a: &MetaBenchArgs, nodes: usize, cap: Option<f64>) -> Result<Setup> {
    let (tmp, dir) = match &a.dir {
        Some(d) => (None, d.join(format!("meta-{nodes}-{}", cap.is_some()))),
        None => {
            let t = tempfile::tempdir()?;
            let d = t.path().to_path_buf();
            (Some(t), d)
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    let spec = LocalSpec {
        data: false,
        partitions: a.partitions,
        zones: (8, "16MiB"),
        cpu_cap: cap,
        ..LocalSpec::new(dir, nodes)
    };
    let cluster = LocalCluster::start(&spec)?;
    let client = cluster.meta_client().await?;
    cluster.wait_ready(&client, Duration::from_secs(60)).await?;
    let root = Creds::root();
    let mut dirs = Vec::new();
    for d in 0..a.dirs.max(1) {
        let attr = client
            .mknod(
                &root,
                Ino::ROOT,
                format!("d{d}").as_bytes(),
                FileKind::Dir,
                0o755,
                0,
                None,
            )
            .await
            .map_err(|e| anyhow::anyhow!("mkdir: {e}"))?;
        dirs.push(attr.ino);
    }
    let names: Vec<(Ino, Vec<u8>)> = (0..a.files)
        .map(|i| (dirs[i % dirs.len()], format!("shard-{i:06}.bin").into_bytes()))
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in names.chunks(names.len().div_ceil(32).max(1)) {
        let (c, chunk, root) = (client.clone(), chunk.to_vec(), root.clone());
        tasks.spawn(async move {
            for (d, n) in chunk {
                c.mknod(&root, d, &n, FileKind::File, 0o644, 0, None).await?;
            }
            Ok::<_, shingle_meta::namespace::Errno>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r?.map_err(|e| anyhow::anyhow!("create: {e}"))?;
    }
    Ok((cluster, client, Arc::new(names), tmp))
}

async fn storm(client: &MetaClient, files: &Arc<Vec<(Ino, Vec<u8>)>>, callers: usize, seconds: f64) -> Point {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..callers {
        let (c, files, stop) = (client.clone(), files.clone(), stop.clone());
        tasks.spawn(async move {
            let mut lookup = Histogram::<u64>::new(3).expect("histogram");
            let mut getattr = Histogram::<u64>::new(3).expect("histogram");
            let mut rng = shingle_testkit::Rng::seeded(w as u64 + 1);
            while !stop.load(Ordering::Relaxed) {
                let (d, n) = rng.pick(&files);
                let t = Instant::now();
                let Ok(a) = c.lookup(*d, n).await else { continue };
                let t2 = Instant::now();
                let _ = lookup.record((t2 - t).as_micros() as u64);
                if c.getattr(a.ino).await.is_ok() {
                    let _ = getattr.record(t2.elapsed().as_micros() as u64);
                }
            }
            (lookup, getattr)
        });
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut lookup = Histogram::<u64>::new(3).expect("histogram");
    let mut getattr = Histogram::<u64>::new(3).expect("histogram");
    while let Some(Ok((l, g))) = tasks.join_next().await {
        let _ = lookup.add(&l);
        let _ = getattr.add(&g);
    }
    let secs = started.elapsed().as_secs_f64();
    Point {
        ops: (lookup.len() + getattr.len()) as f64 / secs,
        lookup,
        getattr,
    }
}
