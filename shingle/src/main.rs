//! # shingle
//!
//! The one Shingle binary: servers, the FUSE mount, the local dev cluster, and the
//! command-line tools. This crate only parses arguments and wires the library crates
//! together; the logic lives in `shingle-transport`, `shingle-meta`, `shingle-data`
//! and `shingle-client`.

mod bench;

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
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Remote-read throughput vs plain TCP, and small-RPC latency, over loopback.
    Transport(bench::transport::TransportBenchArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SHINGLE_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        match cli.command {
            Command::Bench(BenchCommand::Transport(a)) => bench::transport::run(a).await,
        }
    })
}
