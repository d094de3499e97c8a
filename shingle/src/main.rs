//! # shingle
//!
//! The one Shingle binary: servers, the FUSE mount, the local dev cluster, and the
//! command-line tools. This crate only parses arguments and wires the library crates
//! together; the logic lives in `shingle-transport`, `shingle-meta`, `shingle-data`
//! and `shingle-client`.

mod bench;
mod config;
mod serve;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Shingle: an RDMA-accelerated, erasure-coded cluster filesystem for GPU training clusters.
#[derive(Debug, Parser)]
#[command(name = "shingle", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node (manager, meta and/or data roles, from its config file).
    Serve {
        /// The node's TOML config.
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Create a new random cluster secret file (mode 0600).
    Keygen {
        /// Where to write it; refuses to overwrite.
        out: std::path::PathBuf,
    },
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Remote-read throughput vs plain TCP, and small-RPC latency, over loopback.
    Transport(bench::transport::TransportBenchArgs),
    /// Zoned-store append throughput vs a plain file on the same disk; GC write amplification.
    Store(bench::store::StoreBenchArgs),
    /// Erasure-coding encode/decode throughput vs reed-solomon-simd alone.
    Ec(bench::ec::EcBenchArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHINGLE_LOG").unwrap_or_else(|_| "warn,openraft=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        match cli.command {
            Command::Serve { config } => serve::run(&config).await,
            Command::Keygen { out } => keygen(&out),
            Command::Bench(BenchCommand::Transport(a)) => bench::transport::run(a).await,
            Command::Bench(BenchCommand::Store(a)) => bench::store::run(a).await,
            Command::Bench(BenchCommand::Ec(a)) => bench::ec::run(a).await,
        }
    })
}

fn keygen(out: &std::path::Path) -> Result<()> {
    use anyhow::Context;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let secret = shingle_transport::ClusterSecret::generate()?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("create secret file {}", out.display()))?;
    f.write_all(secret.expose())
        .and_then(|_| f.write_all(b"\n"))
        .and_then(|_| f.sync_all())?;
    println!("wrote a new cluster secret to {}", out.display());
    Ok(())
}
