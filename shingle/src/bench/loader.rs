//! `shingle bench loader`: the DataLoader workload through a real FUSE mount of a local
//! cluster, against the same workload on a local directory in the same run.
//!
//! - **scan**: N files of `file_mib` MiB in D directories; W worker *processes* each read
//!   a shuffled share in full with 1 MiB reads. Aggregate MB/s, per-file open+read
//!   p50/p99. Page caches are dropped before each scan when running as root.
//! - **storm**: W worker processes for T seconds doing stat, listdir and open+close on
//!   random paths. ops/s and p50/p99/p999 per operation.
//! - **write**: the dataset itself is written first, by one thread, one `write(2)` per
//!   file; MB/s.
//!
//! Workers are this binary (`shingle bench loader-worker`), so the kernel sees separate
//! processes as it would with a PyTorch DataLoader.

use super::transport::machine;
use crate::local::{LocalSpec, start_mounted};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Options of the loader benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct LoaderBenchArgs {
    /// Files in the dataset.
    #[arg(long, default_value_t = 512)]
    pub files: usize,
    /// Directories they are spread over.
    #[arg(long, default_value_t = 16)]
    pub dirs: usize,
    /// Size of each file in MiB.
    #[arg(long, default_value_t = 2)]
    pub file_mib: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// Seconds of the metadata storm.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Local directory for the baseline (default: a temporary folder in /var/tmp).
    #[arg(long)]
    pub local: Option<PathBuf>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Arguments of one worker process.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// "scan" or "storm".
    pub mode: String,
    /// Dataset root.
    pub root: PathBuf,
    /// Files.
    pub files: usize,
    /// Directories.
    pub dirs: usize,
    /// This worker's index.
    pub index: usize,
    /// Workers in all.
    pub workers: usize,
    /// Storm seconds.
    #[arg(default_value_t = 0.0)]
    pub seconds: f64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct WorkerOut {
    bytes: u64,
    secs: f64,
    file_us: Vec<u64>,
    stat_us: Vec<u64>,
    list_us: Vec<u64>,
    open_us: Vec<u64>,
}

fn path_of(root: &Path, dirs: usize, i: usize) -> PathBuf {
    root.join(format!("d{:03}", i % dirs.max(1)))
        .join(format!("shard-{i:06}.bin"))
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut r = shingle_testkit::Rng::seeded(seed);
    move || r.next()
}

/// One worker process: prints its measurements as one JSON line.
pub fn worker(a: WorkerArgs) -> Result<()> {
    let mut out = WorkerOut::default();
    let mut next = rng(a.index as u64 + 7);
    match a.mode.as_str() {
        "scan" => {
            let mut mine: Vec<usize> = (0..a.files).filter(|i| i % a.workers == a.index).collect();
            for i in (1..mine.len()).rev() {
                mine.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            let mut buf = vec![0u8; 1 << 20];
            let t0 = Instant::now();
            for i in mine {
                let t = Instant::now();
                let mut f = std::fs::File::open(path_of(&a.root, a.dirs, i))?;
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    out.bytes += n as u64;
                }
                out.file_us.push(t.elapsed().as_micros() as u64);
            }
            out.secs = t0.elapsed().as_secs_f64();
        }
        "storm" => {
            let t0 = Instant::now();
            let until = t0 + Duration::from_secs_f64(a.seconds);
            while Instant::now() < until {
                let r = next();
                let i = (r >> 8) as usize % a.files.max(1);
                let t = Instant::now();
                match r % 3 {
                    0 => {
                        std::fs::metadata(path_of(&a.root, a.dirs, i))?;
                        out.stat_us.push(t.elapsed().as_micros() as u64);
                    }
                    1 => {
                        let d = a.root.join(format!("d{:03}", i % a.dirs.max(1)));
                        let n = std::fs::read_dir(d)?.count();
                        std::hint::black_box(n);
                        out.list_us.push(t.elapsed().as_micros() as u64);
                    }
                    _ => {
                        drop(std::fs::File::open(path_of(&a.root, a.dirs, i))?);
                        out.open_us.push(t.elapsed().as_micros() as u64);
                    }
                }
            }
            out.secs = t0.elapsed().as_secs_f64();
        }
        m => bail!("unknown worker mode {m}"),
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

fn run_workers(mode: &str, root: &Path, a: &LoaderBenchArgs) -> Result<(Vec<WorkerOut>, f64)> {
    let exe = std::env::current_exe()?;
    let t0 = Instant::now();
    let children: Vec<_> = (0..a.workers)
        .map(|i| {
            Command::new(&exe)
                .args(["bench", "loader-worker", mode])
                .arg(root)
                .args([a.files, a.dirs, i, a.workers].map(|n| n.to_string()))
                .arg(a.seconds.to_string())
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut outs = Vec::new();
    for c in children {
        let o = c.wait_with_output()?;
        if !o.status.success() {
            bail!("a {mode} worker failed");
        }
        outs.push(serde_json::from_slice(&o.stdout).context("worker output")?);
    }
    Ok((outs, t0.elapsed().as_secs_f64()))
}

fn pct(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

#[derive(Debug, Serialize)]
struct Side {
    /// Writing the dataset (one thread), filled in by the caller.
    write_mb_s: f64,
    scan_mb_s: f64,
    file_p50_us: u64,
    file_p99_us: u64,
    storm_ops_s: f64,
    stat_us: [u64; 3],
    list_us: [u64; 3],
    open_us: [u64; 3],
}

fn measure(root: &Path, a: &LoaderBenchArgs) -> Result<Side> {
    super::drop_kernel_caches();
    let (outs, wall) = run_workers("scan", root, a)?;
    let bytes: u64 = outs.iter().map(|o| o.bytes).sum();
    let mut files: Vec<u64> = outs.iter().flat_map(|o| o.file_us.iter().copied()).collect();
    let (outs2, _) = run_workers("storm", root, a)?;
    let cat =
        |f: fn(&WorkerOut) -> &Vec<u64>| -> Vec<u64> { outs2.iter().flat_map(|o| f(o).iter().copied()).collect() };
    let (mut st, mut li, mut op) = (cat(|o| &o.stat_us), cat(|o| &o.list_us), cat(|o| &o.open_us));
    let ops = (st.len() + li.len() + op.len()) as f64 / a.seconds.max(0.001);
    let three = |v: &mut Vec<u64>| [pct(v, 0.5), pct(v, 0.99), pct(v, 0.999)];
    Ok(Side {
        write_mb_s: 0.0,
        scan_mb_s: bytes as f64 / wall / 1e6,
        file_p50_us: pct(&mut files, 0.5),
        file_p99_us: pct(&mut files, 0.99),
        storm_ops_s: ops,
        stat_us: three(&mut st),
        list_us: three(&mut li),
        open_us: three(&mut op),
    })
}

fn make_dataset(root: &Path, a: &LoaderBenchArgs) -> Result<()> {
    let mut next = rng(42);
    let block: Vec<u8> = (0..a.file_mib << 20).map(|_| next() as u8).collect();
    for d in 0..a.dirs.max(1) {
        std::fs::create_dir_all(root.join(format!("d{d:03}")))?;
    }
    for i in 0..a.files {
        let mut b = block.clone();
        b[..8].copy_from_slice(&(i as u64).to_le_bytes());
        std::fs::write(path_of(root, a.dirs, i), &b).with_context(|| format!("write file {i}"))?;
    }
    Ok(())
}

/// Runs the benchmark.
pub async fn run(a: LoaderBenchArgs) -> Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("shingle-loader-")
        .tempdir_in("/var/tmp")?;
    let local = a.local.clone().unwrap_or_else(|| tmp.path().join("local"));
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt)?;
    let spec = LocalSpec::new(tmp.path().join("cluster"), 6);
    let (mut cluster, session) = start_mounted(&spec, &mnt, &shingle_client::MountConfig::default()).await?;
    let a2 = a.clone();
    let (l2, m3) = (local.clone(), mnt.clone());
    let result = tokio::task::spawn_blocking(move || -> Result<(Side, Side)> {
        let bytes = (a2.files * (a2.file_mib << 20)) as f64;
        let t = Instant::now();
        make_dataset(&l2, &a2)?;
        let local_write = bytes / t.elapsed().as_secs_f64() / 1e6;
        let t = Instant::now();
        make_dataset(&m3, &a2)?;
        let shingle_write = bytes / t.elapsed().as_secs_f64() / 1e6;
        let local = Side {
            write_mb_s: local_write,
            ..measure(&l2, &a2)?
        };
        let shingle = Side {
            write_mb_s: shingle_write,
            ..measure(&m3, &a2)?
        };
        Ok((local, shingle))
    })
    .await?;
    let _ = tokio::task::spawn_blocking(move || session.umount_and_join()).await?;
    cluster.stop();
    let (local, shingle) = result?;
    print_table(&a, &local, &shingle);
    let json = serde_json::json!({
        "bench": "loader", "machine": machine(), "files": a.files, "file_mib": a.file_mib,
        "dirs": a.dirs, "workers": a.workers, "storm_seconds": a.seconds,
        "local": local, "shingle": shingle,
        "scan_ratio": shingle.scan_mb_s / local.scan_mb_s.max(1e-9),
    });
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&json)?)?;
        println!(
            "# wrote {} (plot: python3 scripts/plot-loader.py {0} loader.png)",
            p.display()
        );
    }
    Ok(())
}

/// The comparison table on stdout.
fn print_table(a: &LoaderBenchArgs, local: &Side, shingle: &Side) {
    println!("# DataLoader workload ({}), 6-node dev cluster, ec(4,2)", machine());
    println!(
        "# {} files x {} MiB in {} dirs, {} worker processes, storm {} s",
        a.files, a.file_mib, a.dirs, a.workers, a.seconds
    );
    println!("                 local        shingle      ratio");
    println!(
        "scan MB/s      {:10.0}   {:10.0}   {:8.2}",
        local.scan_mb_s,
        shingle.scan_mb_s,
        shingle.scan_mb_s / local.scan_mb_s.max(1e-9)
    );
    println!(
        "write MB/s     {:10.0}   {:10.0}   {:8.2}",
        local.write_mb_s,
        shingle.write_mb_s,
        shingle.write_mb_s / local.write_mb_s.max(1e-9)
    );
    println!(
        "file p50/p99 us {:>6}/{:<6}  {:>6}/{:<6}",
        local.file_p50_us, local.file_p99_us, shingle.file_p50_us, shingle.file_p99_us
    );
    println!(
        "storm ops/s    {:10.0}   {:10.0}   {:8.2}",
        local.storm_ops_s,
        shingle.storm_ops_s,
        shingle.storm_ops_s / local.storm_ops_s.max(1e-9)
    );
    for (name, l, s) in [
        ("stat", local.stat_us, shingle.stat_us),
        ("listdir", local.list_us, shingle.list_us),
        ("open+close", local.open_us, shingle.open_us),
    ] {
        println!("{name:<11} p50/p99/p999 us  local {:?}  shingle {:?}", l, s);
    }
}
