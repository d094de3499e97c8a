//! # shingle
//!
//! The one Shingle binary: servers, the FUSE mount, the local dev cluster, and the
//! command-line tools. This file only parses arguments and calls the library part of
//! this crate (`src/lib.rs`), which wires the library crates together; the logic
//! lives in `shingle-transport`, `shingle-meta`, `shingle-data` and `shingle-client`.

use anyhow::Result;
use clap::{Parser, Subcommand};
use shingle::{bench, cli, config, dev, logging, serve, telemetry};

/// Shingle: an RDMA-accelerated, erasure-coded cluster filesystem for GPU training clusters.
#[derive(Debug, Parser)]
#[command(name = "shingle", version, about)]
struct Cli {
    /// Log format on stderr: text, or one JSON object per line (overrides the node
    /// config's `[log] format`; the level is set by SHINGLE_LOG or `[log] level`).
    #[arg(long, global = true, value_enum, env = logging::FORMAT_ENV, value_name = "FORMAT")]
    log_format: Option<logging::LogFormat>,
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
    /// Start a local cluster of real processes (6 nodes) and mount it: the way to try Shingle.
    Dev(dev::DevArgs),
    /// Mount a cluster with FUSE (runs until SIGINT/SIGTERM, then unmounts).
    Mount(dev::MountArgs),
    /// Cluster tools without a mount: status, ls, stat, put, get, setlayout.
    #[command(flatten)]
    Tool(cli::Tool),
    /// Client keys: grant (read-write or read-only, root squashed), revoke, list.
    #[command(subcommand)]
    Client(shingle::keys::ClientCommand),
    /// Create a new cluster: write the cluster file every node of it shares.
    Format(FormatArgs),
    /// Create a new random cluster secret file (mode 0600).
    Keygen {
        /// Where to write it; refuses to overwrite.
        out: std::path::PathBuf,
    },
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Simulate metadata replication: many nodes, virtual time, faults, one seed
    /// (replays a failure a test printed; runs long batches; measures at scale).
    Sim(shingle::sim::SimArgs),
}

#[derive(Debug, clap::Args)]
struct FormatArgs {
    /// Where to write the cluster file; refuses to overwrite.
    #[arg(long)]
    cluster_file: std::path::PathBuf,
    /// The managers, as ID=ADDR,... (1 or 3 of them, e.g. 1=10.0.0.1:7000).
    #[arg(long, value_delimiter = ',', required = true)]
    managers: Vec<String>,
    /// Metadata partitions (fixed for the life of the cluster).
    #[arg(long, default_value_t = 64)]
    partitions: u32,
    /// Data placement groups (fixed for the life of the cluster).
    #[arg(long, default_value_t = 128)]
    pgs: u32,
    /// Metadata replicas.
    #[arg(long, default_value_t = 3)]
    replication: u8,
    /// Default erasure coding of new files, K,M (data, parity).
    #[arg(long, default_value = "4,2")]
    ec: String,
    /// Acknowledge a stripe only when k + 1 of its shards are on distinct nodes; by
    /// default a stripe whose group has too few live nodes stores two shards on one
    /// node instead (still surviving one more node loss) and repair spreads them later.
    #[arg(long)]
    distinct_homes: bool,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Remote-read throughput vs plain TCP, and small-RPC latency, over loopback.
    Transport(bench::transport::TransportBenchArgs),
    /// Zoned-store append throughput vs a plain file on the same disk; GC write amplification.
    Store(bench::store::StoreBenchArgs),
    /// Erasure-coding encode/decode throughput vs reed-solomon-simd alone.
    Ec(bench::ec::EcBenchArgs),
    /// Lookup + getattr storm against local meta-node processes; CPU-capped scale-out.
    Meta(bench::meta::MetaBenchArgs),
    /// Metadata mutations (create, chmod, rename, unlink, mkdir, ...; cp -a and rm -rf of
    /// a tree; a create/unlink storm) through a FUSE mount of a local cluster vs a local
    /// directory.
    Mutate(bench::mutate::MutateBenchArgs),
    /// Commit and open cost against file size (metadata only, 1 to 64 GiB layouts).
    Layout(bench::layout::LayoutBenchArgs),
    /// DataLoader scan and metadata storm through a FUSE mount of a local cluster, vs a
    /// local directory.
    Loader(bench::loader::LoaderBenchArgs),
    /// One worker process of the loader benchmark.
    #[command(hide = true)]
    LoaderWorker(bench::loader::WorkerArgs),
    /// Node kills under a scan and a writer: read stalls, degraded throughput, rebuild,
    /// three-down EIO, full read-back.
    Failover(bench::failover::FailoverBenchArgs),
    /// EC files read end to end over RDMA vs TCP on a local cluster (soft-RoCE guest rig).
    Fabric(bench::fabric::FabricBenchArgs),
    /// The writer the failover bench runs inside a partitioned rig host.
    #[command(hide = true)]
    IsoWriter(bench::failover::IsoWriterArgs),
}

fn main() -> Result<()> {
    // `mount -t fuse.shingle` (and /etc/fstab) runs `shingle SOURCE MOUNTPOINT -o OPTS`.
    let args: Vec<String> = std::env::args().collect();
    if args.len() >= 3 && std::path::Path::new(&args[1]).is_file() && std::path::Path::new(&args[2]).is_dir() {
        return dev::fstab_helper(&args);
    }
    let cli = Cli::parse();
    // A node's config is read before logging starts: its `[log]` table sets the format and level.
    let node = match &cli.command {
        Command::Serve { config } => Some(config::NodeConfig::load(config)?),
        _ => None,
    };
    let log = node.as_ref().map(|n| {
        let l = n.log.as_ref();
        (
            l.map(|l| l.format).unwrap_or_default(),
            l.and_then(|l| l.level.as_deref()),
        )
    });
    // Traces: OTEL_* variables for every command, `[trace]` for a node.
    let identity = identity(&cli.command, node.as_ref());
    let setup = telemetry::resolve(
        node.as_ref().and_then(|n| n.trace.as_ref()),
        |k| std::env::var(k).ok(),
        &identity.service,
    )?;
    let traces = setup.map(|s| telemetry::Tracing::start(&s, &identity)).transpose()?;
    logging::init(cli.log_format, log, traces.as_ref());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = rt.block_on(async move {
        match cli.command {
            Command::Serve { .. } => serve::run(anyhow::Context::context(node, "no node config")?).await,
            Command::Keygen { out } => keygen(&out),
            Command::Sim(a) => shingle::sim::run(a),
            Command::Format(a) => format(a),
            Command::Dev(a) => dev::dev(a).await,
            Command::Mount(a) => dev::mount(a).await,
            Command::Bench(BenchCommand::Transport(a)) => bench::transport::run(a).await,
            Command::Bench(BenchCommand::Store(a)) => bench::store::run(a).await,
            Command::Bench(BenchCommand::Ec(a)) => bench::ec::run(a).await,
            Command::Bench(BenchCommand::Meta(a)) => bench::meta::run(a).await,
            Command::Bench(BenchCommand::Layout(a)) => bench::layout::run(a).await,
            Command::Bench(BenchCommand::Mutate(a)) => bench::mutate::run(a).await,
            Command::Bench(BenchCommand::Loader(a)) => bench::loader::run(a).await,
            Command::Bench(BenchCommand::Failover(a)) => bench::failover::run(a).await,
            Command::Bench(BenchCommand::Fabric(a)) => bench::fabric::run(a).await,
            Command::Bench(BenchCommand::IsoWriter(a)) => bench::failover::iso_writer(a).await,
            Command::Bench(BenchCommand::LoaderWorker(a)) => bench::loader::worker(a),
            Command::Tool(t) => cli::run(t).await,
            Command::Client(c) => shingle::keys::run(c).await,
        }
    });
    // Tasks still running end (and close their spans) with the runtime; then the spans
    // still queued are exported before the process exits.
    drop(rt);
    if let Some(t) = &traces {
        t.shutdown();
    }
    if let Err(e) = &result
        && let Some(miss) = e.downcast_ref::<bench::failover::StallBoundsMissed>()
    {
        // Every child process is gone (the runtime and the bench's cluster were dropped).
        eprintln!("Error: {miss}");
        std::process::exit(bench::failover::STALL_EXIT);
    }
    result
}

/// Who this process is in traces: `shingle-<roles>` for a node (`shingle-meta-data`),
/// `shingle-client` for a mount, `shingle-bench`, `shingle-tool`.
fn identity(command: &Command, node: Option<&config::NodeConfig>) -> telemetry::Identity {
    match (command, node) {
        (Command::Serve { .. }, Some(n)) => {
            let roles: Vec<&str> = [
                ("manager", n.manager.is_some()),
                ("meta", n.meta.is_some()),
                ("data", n.data.is_some()),
            ]
            .into_iter()
            .filter_map(|(r, on)| on.then_some(r))
            .collect();
            telemetry::Identity {
                service: format!(
                    "shingle-{}",
                    if roles.is_empty() {
                        "node".into()
                    } else {
                        roles.join("-")
                    }
                ),
                node_id: n.node.id,
                roles: Some(roles.join(",")),
            }
        }
        (Command::Dev(_) | Command::Mount(_), _) => telemetry::Identity {
            service: "shingle-client".into(),
            ..Default::default()
        },
        (Command::Bench(_), _) => telemetry::Identity {
            service: "shingle-bench".into(),
            ..Default::default()
        },
        _ => telemetry::Identity {
            service: "shingle-tool".into(),
            ..Default::default()
        },
    }
}

fn format(a: FormatArgs) -> Result<()> {
    use anyhow::{Context, bail};
    let mut managers = Vec::new();
    for m in &a.managers {
        let (id, addr) = m
            .split_once('=')
            .with_context(|| format!("manager '{m}' must be ID=ADDR, e.g. 1=127.0.0.1:7000"))?;
        managers.push(config::ManagerEntry {
            id: id
                .parse()
                .with_context(|| format!("manager id '{id}' is not a number"))?,
            addr: addr
                .parse()
                .with_context(|| format!("manager address '{addr}' is not IP:PORT"))?,
        });
    }
    let (k, m) =
        a.ec.split_once(',')
            .and_then(|(k, m)| Some((k.trim().parse::<u8>().ok()?, m.trim().parse::<u8>().ok()?)))
            .with_context(|| format!("--ec '{}' must be K,M, e.g. 4,2", a.ec))?;
    let mut id = [0u8; 8];
    getrandom::fill(&mut id).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let cluster = config::ClusterFile {
        cluster_id: id.iter().map(|b| format!("{b:02x}")).collect(),
        partitions: a.partitions,
        pgs: a.pgs,
        replication: a.replication,
        pg_width: k.saturating_add(m),
        ec_k: k,
        ec_m: m,
        distinct_homes: a.distinct_homes,
        managers,
    };
    cluster.validate()?;
    if a.cluster_file.exists() {
        bail!("{} exists; a cluster is formatted once", a.cluster_file.display());
    }
    let text = toml::to_string(&cluster)?;
    std::fs::write(&a.cluster_file, text).with_context(|| format!("write {}", a.cluster_file.display()))?;
    println!(
        "formatted cluster {} in {}",
        cluster.cluster_id,
        a.cluster_file.display()
    );
    Ok(())
}

fn keygen(out: &std::path::Path) -> Result<()> {
    use anyhow::Context;
    let secret = shingle_transport::ClusterSecret::generate()?;
    shingle::keys::write_key_file(out, &secret).with_context(|| format!("create secret file {}", out.display()))?;
    println!("wrote a new cluster secret to {}", out.display());
    Ok(())
}
