//! `shingle bench fabric`: erasure-coded files read end to end by a client whose shard
//! reads go over one-sided RDMA READ and whose RPCs go as RDMA SENDs, against the same
//! reads over TCP, on a local
//! cluster of real processes. Every byte is checked; then one data node is killed and
//! the files are read again (reconstructed from parity, still over RDMA).
//!
//! Meant for the soft-RoCE guest rig (`fabric-tests/run.sh rdma`): the nodes take their
//! RDMA settings from the environment (`SHINGLE_RDMA=required`,
//! `SHINGLE_RDMA_DEVICE=$SHINGLE_RDMA_DEV0`), the client uses `--client-device`. Fails
//! (non-zero exit) when a byte differs, when the RDMA client read nothing or called
//! nothing over RDMA, or when it fell back to TCP (beyond the killed node).

use super::failover::content;
use crate::fabric::{RdmaMode, RdmaSettings};
use crate::local::{LocalCluster, LocalSpec};
use anyhow::{Context, Result, bail};
use shingle_client::{Client, ClientConfig};
use shingle_meta::ids::Ino;
use shingle_meta::namespace::{Attr, Creds, FileKind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Options of `shingle bench fabric`.
#[derive(Debug, Clone, clap::Args)]
pub struct FabricBenchArgs {
    /// Folder for the cluster (a temporary one when unset).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Files to write and read.
    #[arg(long, default_value_t = 6)]
    pub files: usize,
    /// Size of each file, KiB.
    #[arg(long, default_value_t = 4096)]
    pub file_kib: usize,
    /// RDMA device of the client (the nodes use SHINGLE_RDMA_DEVICE).
    #[arg(long)]
    pub client_device: Option<String>,
    /// Write the figures here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Reads every file through `client`, checks it; returns MiB/s.
async fn read_all(client: &Client, dir: Ino, files: usize, len: usize) -> Result<f64> {
    let root = Creds::root();
    let t = Instant::now();
    for i in 0..files {
        let name = format!("f{i}");
        let a = client
            .lookup(&root, dir, name.as_bytes())
            .await
            .map_err(|e| anyhow::anyhow!("lookup {name}: {e}"))?;
        let f = client
            .open(&root, a.ino)
            .await
            .map_err(|e| anyhow::anyhow!("open {name}: {e}"))?;
        let mut got = Vec::with_capacity(len);
        while got.len() < len {
            let b = f
                .read(got.len() as u64, (len - got.len()).min(4 << 20) as u32)
                .await
                .map_err(|e| anyhow::anyhow!("read {name}: {e}"))?;
            if b.is_empty() {
                break;
            }
            got.extend_from_slice(&b);
        }
        if got != content(i as u64, len) {
            bail!("{name}: contents differ ({} of {len} bytes read)", got.len());
        }
    }
    Ok((files * len) as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64())
}

/// Runs the benchmark.
pub async fn run(a: FabricBenchArgs) -> Result<()> {
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir().context("temporary folder")?;
            tmp.path().to_path_buf()
        }
    };
    let len = a.file_kib << 10;
    let spec = LocalSpec {
        partitions: 8,
        zones: (24, "16MiB"),
        log: std::env::var("SHINGLE_NODE_LOG").unwrap_or_else(|_| "warn,openraft=error".into()),
        ..LocalSpec::new(dir.join("cluster"), 6)
    };
    eprintln!("# starting 6 nodes in {}", spec.dir.display());
    let mut cluster = LocalCluster::start(&spec)?;
    let meta = cluster.meta_client().await?;
    cluster.wait_ready(&meta, Duration::from_secs(120)).await?;
    let cfg = ClientConfig {
        ec: (4, 2),
        ..ClientConfig::default()
    };
    // Writer and TCP reader: remote reads over TCP.
    let off = RdmaSettings {
        mode: RdmaMode::Off,
        ..RdmaSettings::default()
    };
    crate::fabric::attach(&off, meta.transport())?;
    let tcp_client = Client::new(meta.clone(), cfg.clone());
    let (d, write_mib_s) = write_files(&tcp_client, a.files, len).await?;
    eprintln!("wrote {} files of {} KiB ({write_mib_s:.1} MiB/s)", a.files, a.file_kib);

    // The RDMA reader: its own transport, RDMA required.
    let rdma_meta = cluster.meta_client().await?;
    let settings = RdmaSettings {
        mode: RdmaMode::Required,
        device: a.client_device.clone(),
        ..RdmaSettings::default()
    }
    .with_env_gid()?;
    crate::fabric::attach(&settings, rdma_meta.transport())?;
    let rdma_client = Client::new(rdma_meta.clone(), cfg);

    let tcp_mib_s = read_all(&tcp_client, d.ino, a.files, len).await?;
    let rdma_mib_s = read_all(&rdma_client, d.ino, a.files, len).await?;
    let stats = rdma_stats(&rdma_meta);
    eprintln!("read over TCP {tcp_mib_s:.1} MiB/s, over RDMA {rdma_mib_s:.1} MiB/s ({stats})");
    check_rdma(&rdma_meta, 0)?;

    // Degraded: a data node down, the files come back from parity, still over RDMA.
    cluster.nodes[5].kill();
    let t = Instant::now();
    let degraded_mib_s = read_all(&rdma_client, d.ino, a.files, len).await?;
    eprintln!(
        "one node down: read over RDMA {degraded_mib_s:.1} MiB/s in {:.1} s (reconstructed)",
        t.elapsed().as_secs_f64()
    );
    check_rdma(&rdma_meta, 1)?;
    let report = format!(
        "{{\n  \"files\": {},\n  \"file_kib\": {},\n  \"write_mib_s\": {write_mib_s:.2},\n  \"tcp_read_mib_s\": {tcp_mib_s:.2},\n  \"rdma_read_mib_s\": {rdma_mib_s:.2},\n  \"rdma_degraded_read_mib_s\": {degraded_mib_s:.2},\n  \"rdma\": \"{}\"\n}}\n",
        a.files,
        a.file_kib,
        rdma_stats(&rdma_meta)
    );
    println!("{report}");
    if let Some(p) = &a.json {
        std::fs::write(p, &report).with_context(|| format!("write {}", p.display()))?;
    }
    cluster.stop();
    Ok(())
}

/// Makes `/fabric` and writes `files` files of `len` bytes in it: the directory and the
/// write rate in MiB/s.
async fn write_files(client: &Client, files: usize, len: usize) -> Result<(Attr, f64)> {
    let root = Creds::root();
    let d = client
        .meta()
        .mknod(&root, Ino::ROOT, b"fabric", FileKind::Dir, 0o755, 0, None)
        .await
        .map_err(|e| anyhow::anyhow!("mkdir: {e}"))?;
    let t = Instant::now();
    for i in 0..files {
        let name = format!("f{i}");
        let at = client
            .meta()
            .mknod(&root, d.ino, name.as_bytes(), FileKind::File, 0o644, 0, None)
            .await
            .map_err(|e| anyhow::anyhow!("create {name}: {e}"))?;
        let f = client
            .open(&root, at.ino)
            .await
            .map_err(|e| anyhow::anyhow!("open {name}: {e}"))?;
        let data = content(i as u64, len);
        for (n, chunk) in data.chunks(1 << 20).enumerate() {
            f.write((n << 20) as u64, chunk)
                .await
                .map_err(|e| anyhow::anyhow!("write {name}: {e}"))?;
        }
        f.flush().await.map_err(|e| anyhow::anyhow!("flush {name}: {e}"))?;
    }
    Ok((d, (files * len) as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()))
}

impl RdmaSettings {
    /// Only the GID index from the environment (the device is the client's own).
    fn with_env_gid(mut self) -> Result<Self> {
        if let Ok(g) = std::env::var("SHINGLE_RDMA_GID_INDEX") {
            self.gid_index = g.parse().context("SHINGLE_RDMA_GID_INDEX")?;
        }
        Ok(self)
    }
}

#[cfg(feature = "rdma")]
fn rdma_stats(meta: &shingle_meta::meta_client::MetaClient) -> String {
    match meta.transport().rdma() {
        Some(r) => {
            let s = r.stats();
            format!(
                "{} reads over RDMA, {} calls over RDMA, {} fallbacks",
                s.reads, s.calls, s.fallbacks
            )
        }
        None => "no RDMA".into(),
    }
}

#[cfg(not(feature = "rdma"))]
fn rdma_stats(_: &shingle_meta::meta_client::MetaClient) -> String {
    "built without RDMA".into()
}

#[cfg(feature = "rdma")]
fn check_rdma(meta: &shingle_meta::meta_client::MetaClient, dead_peers: u64) -> Result<()> {
    let Some(r) = meta.transport().rdma() else {
        bail!("the RDMA client has no RDMA reader")
    };
    let s = r.stats();
    if s.reads == 0 {
        bail!("no shard was read over RDMA");
    }
    if s.calls == 0 {
        bail!("no RPC went over RDMA");
    }
    // A killed node's queue pair fails (calls to it in flight): that peer, and only
    // that one, may have fallen back.
    if s.fallbacks > dead_peers {
        bail!("the RDMA client fell back to TCP {} times", s.fallbacks);
    }
    Ok(())
}

#[cfg(not(feature = "rdma"))]
fn check_rdma(_: &shingle_meta::meta_client::MetaClient, _: u64) -> Result<()> {
    bail!("this binary was built without RDMA (cargo build --features rdma)")
}
