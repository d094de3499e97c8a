//! `shingle bench layout`: what a commit and an open cost as a file grows.
//!
//! Starts a local cluster of meta-node processes (no data nodes: only metadata is
//! measured), creates one file per size and gives it the layout a writer of that size
//! leaves: stripe records committed 16 at a time, as the client commits (every stripe's
//! shards named on six nodes; no data is written, so a 64 GiB file costs no disk). For
//! each size it then measures, with the layout in place:
//!
//! - **commit**: one more commit of 16 rewritten stripes (a writer's steady state);
//! - **open**: what a file system client reads at open (`MetaClient::head`);
//! - **whole layout**: every stripe record (`MetaClient::get_inode`, what a tool reads,
//!   and what every open read before layouts were loaded on demand);
//!
//! and how long building the whole layout took (the metadata cost of writing the file).

use super::median;
use super::transport::machine;
use crate::local::{LocalCluster, LocalSpec};
use anyhow::{Result, anyhow};
use shingle_meta::ids::Ino;
use shingle_meta::meta_client::MetaClient;
use shingle_meta::namespace::{Creds, FileKind, Layout, StripeRec, StripeWrite};
use std::time::{Duration, Instant};

/// Options of the layout benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct LayoutBenchArgs {
    /// File sizes in GiB.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u64, 8, 64])]
    pub gib: Vec<u64>,
    /// Meta nodes (every partition on min(3, N) of them).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Measurements per figure.
    #[arg(long, default_value_t = 50)]
    pub samples: usize,
    /// Work folder (default: a temporary folder).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

/// Stripes per commit, as the client commits (`ClientConfig::commit_every`).
const COMMIT_STRIPES: u64 = 16;

fn policy() -> Layout {
    Layout {
        k: 4,
        m: 2,
        unit: 1 << 20,
        ..Default::default()
    }
}

fn writes(from: u64, to: u64, version: &mut u64, sb: u64) -> Vec<StripeWrite> {
    (from..to)
        .map(|s| {
            let v = *version;
            *version += 1;
            StripeWrite {
                stripe: s,
                base: 0,
                rec: StripeRec {
                    version: v,
                    len: sb,
                    nodes: (1..=6).map(|n| Some(shingle_meta::ids::NodeId(n))).collect(),
                },
            }
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs the benchmark and prints a table (and JSON lines).
pub async fn run(a: LayoutBenchArgs) -> Result<()> {
    let (_tmp, dir) = match &a.dir {
        Some(d) => (None, d.join("layout")),
        None => {
            let t = tempfile::tempdir()?;
            let d = t.path().to_path_buf();
            (Some(t), d)
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    let spec = LocalSpec {
        data: false,
        zones: (8, "16MiB"),
        ..LocalSpec::new(dir, a.nodes)
    };
    let cluster = LocalCluster::start(&spec)?;
    let client = cluster.meta_client().await?;
    cluster.wait_ready(&client, Duration::from_secs(60)).await?;
    println!(
        "# layout at scale: commit and open cost against file size ({})",
        machine()
    );
    println!(
        "# {} meta nodes, R = {}, EC 4+2 x 1 MiB (4 MiB stripes), layouts built {} stripes per commit; p50 of {} samples",
        a.nodes,
        a.nodes.min(3),
        COMMIT_STRIPES,
        a.samples
    );
    println!("   GiB  stripes   build s  commit p50 ms  open p50 ms  whole layout p50 ms");
    for &gib in &a.gib {
        let mut f = BigFile::build(&client, gib, a.samples).await?;
        let (c, (o, w)) = (f.commits(&client, a.samples).await?, f.opens(&client, a.samples).await?);
        println!(
            "{gib:6} {:8} {:9.2} {c:14.2} {o:12.2} {w:20.2}",
            f.stripes,
            f.build.as_secs_f64()
        );
        println!(
            "{}",
            serde_json::json!({
                "bench": "layout", "gib": gib, "stripes": f.stripes,
                "build_s": f.build.as_secs_f64(), "commit_p50_ms": c, "open_p50_ms": o,
                "whole_layout_p50_ms": w,
            })
        );
    }
    drop(cluster);
    Ok(())
}

/// Bytes per stripe: EC 4+2 of 1 MiB units.
const STRIPE_BYTES: u64 = 4 << 20;

/// A file of `gib` GiB whose layout was committed, without data.
struct BigFile {
    name: String,
    ino: Ino,
    stripes: u64,
    /// The next version reserved for its writes.
    version: u64,
    /// How long committing its whole layout took.
    build: Duration,
}

impl BigFile {
    /// Creates the file and commits its layout, `COMMIT_STRIPES` stripes per commit, with
    /// versions reserved for `samples` rewrites after.
    async fn build(client: &MetaClient, gib: u64, samples: usize) -> Result<BigFile> {
        let root = Creds::root();
        let stripes = (gib << 30) / STRIPE_BYTES;
        let name = format!("file-{gib}g");
        let ino = client
            .mknod(&root, Ino::ROOT, name.as_bytes(), FileKind::File, 0o644, 0, None)
            .await
            .map_err(|e| anyhow!("create: {e}"))?
            .ino;
        let count = u32::try_from(stripes + COMMIT_STRIPES * samples as u64 + 1)?;
        let mut version = client
            .reserve_versions(&root, ino, policy(), count)
            .await
            .map_err(|e| anyhow!("reserve: {e}"))?;
        let start = Instant::now();
        let mut s = 0;
        while s < stripes {
            let to = (s + COMMIT_STRIPES).min(stripes);
            let w = writes(s, to, &mut version, STRIPE_BYTES);
            client
                .commit_write(&root, ino, policy(), to * STRIPE_BYTES, w)
                .await
                .map_err(|e| anyhow!("commit: {e}"))?;
            s = to;
        }
        Ok(BigFile {
            name,
            ino,
            stripes,
            version,
            build: start.elapsed(),
        })
    }

    /// The steady state: p50 ms of a commit rewriting 16 stripes in the middle.
    async fn commits(&mut self, client: &MetaClient, samples: usize) -> Result<f64> {
        let mut commit = Vec::new();
        let mid = self.stripes / 2;
        for _ in 0..samples {
            let cur = client.get_inode(self.ino).await.map_err(|e| anyhow!("layout: {e}"))?;
            let Some(layout) = cur.layout else {
                return Err(anyhow!("file {} has no layout", self.name));
            };
            let mut w = writes(mid, mid + COMMIT_STRIPES, &mut self.version, STRIPE_BYTES);
            for x in &mut w {
                x.base = layout.stripes.get(&x.stripe).map_or(0, |r| r.version);
            }
            let t = Instant::now();
            client
                .commit_write(&Creds::root(), self.ino, policy(), self.stripes * STRIPE_BYTES, w)
                .await
                .map_err(|e| anyhow!("commit: {e}"))?;
            commit.push(ms(t.elapsed()));
        }
        Ok(median(&mut commit))
    }

    /// p50 ms of an open (the head of the file) and of reading its whole layout, each
    /// checked against what was built.
    async fn opens(&self, client: &MetaClient, samples: usize) -> Result<(f64, f64)> {
        let mut open = Vec::new();
        let mut whole = Vec::new();
        for _ in 0..samples {
            let t = Instant::now();
            let head = client.head(self.ino).await.map_err(|e| anyhow!("open: {e}"))?;
            open.push(ms(t.elapsed()));
            if head.attr.size != self.stripes * STRIPE_BYTES {
                return Err(anyhow!("{}: size {} after the build", self.name, head.attr.size));
            }
            let t = Instant::now();
            let all = client.get_inode(self.ino).await.map_err(|e| anyhow!("layout: {e}"))?;
            whole.push(ms(t.elapsed()));
            let n = all.layout.map_or(0, |l| l.stripes.len() as u64);
            if n != self.stripes {
                return Err(anyhow!("{}: {n} stripe records, {} written", self.name, self.stripes));
            }
        }
        Ok((median(&mut open), median(&mut whole)))
    }
}
