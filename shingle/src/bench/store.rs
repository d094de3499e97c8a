//! `shingle bench store`: zoned-store append throughput against a plain sequential file
//! write on the same disk in the same run, and GC write amplification at 50% garbage.

use anyhow::{Context, Result};
use serde::Serialize;
use shingle_data::chunk::ChunkKey;
use shingle_data::store::{ChunkStore, StoreOptions};
use shingle_data::zone::Geometry;
use shingle_data::zone::file::FileZonedDevice;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Options of the store benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreBenchArgs {
    /// Directory on the disk to measure (a temporary folder is made inside).
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// MiB written per measurement.
    #[arg(long, default_value_t = 512)]
    pub total_mib: u64,
    /// Chunk (and baseline block) size in KiB.
    #[arg(long, default_value_t = 1024)]
    pub chunk_kib: usize,
    /// Concurrent writers into the store; the baseline syncs every this many blocks.
    #[arg(long, default_value_t = 8)]
    pub writers: usize,
    /// Rounds; store and baseline alternate and medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Report {
    machine: String,
    total_mib: u64,
    chunk_kib: usize,
    writers: usize,
    store_mb_s: f64,
    plain_file_mb_s: f64,
    ratio: f64,
    gc: GcFigures,
}

#[derive(Debug, Serialize)]
struct GcFigures {
    garbage_fraction: f64,
    user_bytes: u64,
    gc_bytes_moved: u64,
    bytes_reclaimed: u64,
    moved_per_reclaimed: f64,
    write_amplification: f64,
}

const ZONE: u64 = 64 << 20;

fn payload(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(0x9E37_79B9).wrapping_add(seed) as u8)
        .collect()
}

/// Runs the benchmark and prints a table.
pub async fn run(args: StoreBenchArgs) -> Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(args)).await?
}

fn run_blocking(args: StoreBenchArgs) -> Result<()> {
    let root = tempdir_in(&args.dir)?;
    let chunk = args.chunk_kib * 1024;
    let total = args.total_mib << 20;
    let (mut stores, mut plains, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    println!(
        "zoned-store append vs plain sequential file, {} MiB of {} KiB chunks, {} writers (baseline: fdatasync every {} blocks)",
        args.total_mib, args.chunk_kib, args.writers, args.writers
    );
    for round in 0..args.rounds.max(1) {
        let s = store_rate(&root.join(format!("store-{round}")), total, chunk, args.writers)?;
        let p = plain_rate(&root.join(format!("plain-{round}")), total, chunk, args.writers)?;
        println!(
            "  round {round}: store {:.0} MB/s, plain file {:.0} MB/s, ratio {:.2}",
            s / 1e6,
            p / 1e6,
            s / p
        );
        stores.push(s);
        plains.push(p);
        ratios.push(s / p);
    }
    let gc = gc_figures(&root.join("gc"), chunk)?;
    let report = Report {
        machine: super::transport::machine(),
        total_mib: args.total_mib,
        chunk_kib: args.chunk_kib,
        writers: args.writers,
        store_mb_s: super::median(&mut stores) / 1e6,
        plain_file_mb_s: super::median(&mut plains) / 1e6,
        ratio: super::median(&mut ratios),
        gc,
    };
    println!(
        "median: store {:.0} MB/s, plain file {:.0} MB/s, ratio {:.2}",
        report.store_mb_s, report.plain_file_mb_s, report.ratio
    );
    println!(
        "GC at {:.0}% garbage: moved {} MiB to reclaim {} MiB ({:.2} moved per reclaimed); write amplification {:.2}",
        report.gc.garbage_fraction * 100.0,
        report.gc.gc_bytes_moved >> 20,
        report.gc.bytes_reclaimed >> 20,
        report.gc.moved_per_reclaimed,
        report.gc.write_amplification
    );
    let _ = std::fs::remove_dir_all(&root);
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn open_store(dir: &Path, total: u64) -> Result<ChunkStore<FileZonedDevice>> {
    let zones = (total / ZONE + 4) as u32;
    let g = Geometry {
        zone_count: zones,
        zone_capacity: ZONE,
        block_size: 4096,
        max_open_zones: 0,
    };
    let dev = FileZonedDevice::create(&dir.join("zones"), g)?;
    Ok(ChunkStore::open(dev, &dir.join("index.redb"), StoreOptions::default())?)
}

fn store_rate(dir: &Path, total: u64, chunk: usize, writers: usize) -> Result<f64> {
    let store = Arc::new(open_store(dir, total)?);
    let per_writer = total as usize / chunk / writers;
    let data = Arc::new(payload(chunk, 1));
    let crc = crc32c::crc32c(&data);
    let t = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let (store, data) = (store.clone(), data.clone());
            std::thread::spawn(move || -> Result<()> {
                for i in 0..per_writer {
                    let key = ChunkKey {
                        ino: w as u64,
                        stripe: i as u64,
                        shard: 0,
                    };
                    store.put(key, 1, &data, crc)?;
                }
                Ok(())
            })
        })
        .collect();
    for th in threads {
        th.join().map_err(|_| anyhow::anyhow!("writer thread panicked"))??;
    }
    let secs = t.elapsed().as_secs_f64();
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    Ok((per_writer * writers * chunk) as f64 / secs)
}

fn plain_rate(dir: &Path, total: u64, chunk: usize, sync_every: usize) -> Result<f64> {
    std::fs::create_dir_all(dir)?;
    let data = payload(chunk, 2);
    let blocks = total as usize / chunk;
    let path = dir.join("plain");
    let t = Instant::now();
    let mut f = std::fs::File::create(&path)?;
    for i in 0..blocks {
        f.write_all(&data)?;
        if (i + 1) % sync_every == 0 {
            f.sync_data()?;
        }
    }
    f.sync_data()?;
    let secs = t.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_dir_all(dir);
    Ok((blocks * chunk) as f64 / secs)
}

/// Fills 8 zones, overwrites every other chunk (50% garbage in every zone), collects.
fn gc_figures(dir: &Path, chunk: usize) -> Result<GcFigures> {
    let store = open_store(dir, 24 * ZONE)?;
    let per_zone = (ZONE as usize / (chunk + 4096)).max(1);
    let n = per_zone * 8;
    let data = payload(chunk, 3);
    let crc = crc32c::crc32c(&data);
    let key = |i: usize| ChunkKey {
        ino: 1,
        stripe: i as u64,
        shard: 0,
    };
    for i in 0..n {
        store.put(key(i), 1, &data, crc)?;
    }
    for i in (0..n).step_by(2) {
        store.put(key(i), 2, &data, crc)?;
    }
    let before = store.stats();
    let mut moved = 0;
    loop {
        let r = store.gc(4, 0.3)?;
        moved += r.bytes_moved;
        if r.zones_reset.is_empty() {
            break;
        }
    }
    let after = store.stats();
    let reclaimed = before.written_bytes.saturating_sub(after.written_bytes) + moved;
    let figures = GcFigures {
        garbage_fraction: 0.5,
        user_bytes: after.user_bytes_written,
        gc_bytes_moved: after.gc_bytes_moved,
        bytes_reclaimed: reclaimed,
        moved_per_reclaimed: moved as f64 / reclaimed.max(1) as f64,
        write_amplification: after.write_amplification(),
    };
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    Ok(figures)
}

fn tempdir_in(base: &Path) -> Result<PathBuf> {
    let p = base.join(format!("shingle-bench-store-{}", std::process::id()));
    std::fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
    Ok(p)
}
