//! Tools that talk to a cluster without a mount: `status`, `ls`, `stat`, `put`, `get`,
//! `setlayout`.

use anyhow::{Context, Result, bail};
use shingle_client::Client;
use shingle_data::wire::{Stat, StatRequest};
use shingle_meta::ids::Ino;
use shingle_meta::map::NodeState;
use shingle_meta::namespace::{Attr, Creds, Errno, FileKind, Layout};
use shingle_meta::service::wire::NodeStats;
use shingle_transport::{CallOptions, RpcChannel};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

/// How to reach a cluster.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// The cluster file (or set SHINGLE_CLUSTER_FILE; for `shingle dev`: DATA/cluster.toml).
    #[arg(long, env = "SHINGLE_CLUSTER_FILE")]
    pub cluster_file: PathBuf,
    /// The secret file (or set SHINGLE_SECRET_FILE; for `shingle dev`: DATA/secret).
    #[arg(long, env = "SHINGLE_SECRET_FILE")]
    pub secret_file: PathBuf,
}

/// The tools.
#[derive(Debug, clap::Subcommand)]
pub enum Tool {
    /// Nodes, epoch, partitions, capacity (`--json` for machines).
    Status {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Wait (showing rebuild progress) until the cluster is healthy; fails after
        /// this many seconds.
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
    },
    /// List a directory.
    Ls {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Path in the filesystem (from its root).
        path: String,
    },
    /// Attributes and layout of a path.
    Stat {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Path in the filesystem.
        path: String,
    },
    /// Copy a local file (or `-` for stdin) into the filesystem.
    Put {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Local file.
        local: PathBuf,
        /// Path in the filesystem.
        path: String,
    },
    /// Copy a file out of the filesystem (to `-` for stdout).
    Get {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Path in the filesystem.
        path: String,
        /// Local file.
        local: PathBuf,
    },
    /// Set the erasure coding of a directory (inherited by new files): ec(K,M).
    Setlayout {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Directory.
        path: String,
        /// Policy, e.g. ec(8,3).
        policy: String,
    },
    /// Read every file under a path back (checksums verified, parity used where
    /// needed); fails when a file cannot be read whole. Progress on stderr.
    Fsck {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Where to start.
        #[arg(default_value = "/")]
        path: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Verify every shard on every data node against its checksum; fails on corrupt
    /// shards or unreachable nodes. Progress on stderr.
    Scrub {
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Seconds one node may take.
        #[arg(long, default_value_t = 3600)]
        node_timeout: u64,
    },
}

fn errno(e: Errno, what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what}: {}", std::io::Error::from_raw_os_error(e.code()))
}

async fn connect(c: &ClusterArgs) -> Result<(Client, crate::config::ClusterFile)> {
    let (meta, cf) = crate::dev::connect(&c.cluster_file, &c.secret_file, Duration::from_secs(10)).await?;
    let meta = meta.with_timeout(Duration::from_secs(10));
    Ok((Client::new(meta, crate::dev::client_config(&cf)), cf))
}

fn split(path: &str) -> Result<(String, String)> {
    let p = path.trim_end_matches('/');
    match p.rsplit_once('/') {
        Some((dir, name)) if !name.is_empty() => Ok((dir.to_string(), name.to_string())),
        None if !p.is_empty() => Ok((String::new(), p.to_string())),
        _ => bail!("'{path}' names no file"),
    }
}

fn kind_char(k: FileKind) -> char {
    match k {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDev => 'c',
        FileKind::BlockDev => 'b',
        FileKind::File => '-',
    }
}

/// Runs a tool: one trace (span `tool`, attribute `op`) when traces are exported.
pub async fn run(t: Tool) -> Result<()> {
    use tracing::Instrument;
    let op = match &t {
        Tool::Status { .. } => "status",
        Tool::Ls { .. } => "ls",
        Tool::Stat { .. } => "stat",
        Tool::Put { .. } => "put",
        Tool::Get { .. } => "get",
        Tool::Setlayout { .. } => "setlayout",
        Tool::Fsck { .. } => "fsck",
        Tool::Scrub { .. } => "scrub",
    };
    run_tool(t).instrument(tracing::info_span!("tool", op)).await
}

async fn run_tool(t: Tool) -> Result<()> {
    let c = match &t {
        Tool::Status { cluster, .. }
        | Tool::Ls { cluster, .. }
        | Tool::Stat { cluster, .. }
        | Tool::Put { cluster, .. }
        | Tool::Get { cluster, .. }
        | Tool::Setlayout { cluster, .. }
        | Tool::Fsck { cluster, .. }
        | Tool::Scrub { cluster, .. } => cluster.clone(),
    };
    let (client, cf) = connect(&c).await?;
    let meta = client.meta().clone();
    let root = Creds::root();
    match t {
        Tool::Status { json, wait: None, .. } => status(&client, &cf, json).await.map(|_| ()),
        Tool::Fsck { path, json, .. } => crate::check::fsck(&client, &path, json).await,
        Tool::Scrub { json, node_timeout, .. } => {
            crate::check::scrub(&client, json, Duration::from_secs(node_timeout)).await
        }
        Tool::Status {
            json, wait: Some(secs), ..
        } => wait_healthy(&client, &cf, json, Duration::from_secs(secs)).await,
        Tool::Ls { path, .. } => ls(&client, &path).await,
        Tool::Stat { path, .. } => stat(&client, &path).await,
        Tool::Put { local, path, .. } => put(&client, &local, &path).await,
        Tool::Get { path, local, .. } => get(&client, &path, &local).await,
        Tool::Setlayout { path, policy, .. } => {
            let p = shingle_data::ec::EcPolicy::parse(&policy).map_err(|e| anyhow::anyhow!("{policy}: {e}"))?;
            let d = meta.resolve(path.as_bytes()).await.map_err(|e| errno(e, &path))?;
            let l = Layout {
                k: p.k,
                m: p.m,
                unit: p.unit,
                ..Default::default()
            };
            meta.set_layout(&root, d.ino, l).await.map_err(|e| errno(e, &path))?;
            println!("{path}: new files use {p}");
            Ok(())
        }
    }
}

/// `shingle ls`: one line per entry (kind and mode, size, name).
async fn ls(client: &Client, path: &str) -> Result<()> {
    let meta = client.meta();
    let d = meta.resolve(path.as_bytes()).await.map_err(|e| errno(e, path))?;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = meta
            .readdir_as(&Creds::root(), d.ino, after.as_deref(), 1000)
            .await
            .map_err(|e| errno(e, path))?;
        let Some(last) = page.last() else { break };
        after = Some(last.name.clone());
        for e in &page {
            let a = client.getattr(e.ino).await.ok();
            println!(
                "{}{:o} {:>12} {}",
                kind_char(e.kind),
                a.as_ref().map_or(0, |a| a.perm),
                a.as_ref().map_or(0, |a| a.size),
                String::from_utf8_lossy(&e.name)
            );
        }
    }
    Ok(())
}

/// `shingle stat`: attributes, layout, symlink target.
async fn stat(client: &Client, path: &str) -> Result<()> {
    let meta = client.meta();
    let a = meta.resolve(path.as_bytes()).await.map_err(|e| errno(e, path))?;
    let rec = meta.get_inode(a.ino).await.map_err(|e| errno(e, path))?;
    print_attr(path, &a);
    if let Some(l) = rec.layout {
        println!(
            "  layout: ec({},{}) unit {} KiB, {} stripes written",
            l.k,
            l.m,
            l.unit / 1024,
            l.stripes.len()
        );
    }
    if let Some(t) = rec.target {
        println!("  target: {}", String::from_utf8_lossy(&t));
    }
    Ok(())
}

/// `shingle put`: creates the file (or truncates it) and writes `local` (or stdin)
/// into it.
async fn put(client: &Client, local: &std::path::Path, path: &str) -> Result<()> {
    let (meta, root) = (client.meta(), Creds::root());
    let (dir, name) = split(path)?;
    let d = meta.resolve(dir.as_bytes()).await.map_err(|e| errno(e, &dir))?;
    let a = match meta
        .mknod(&root, d.ino, name.as_bytes(), FileKind::File, 0o644, 0, None)
        .await
    {
        Ok(a) => a,
        Err(Errno::EEXIST) => {
            let a = meta
                .lookup_as(&root, d.ino, name.as_bytes())
                .await
                .map_err(|e| errno(e, path))?;
            let set = shingle_meta::namespace::SetAttr {
                size: Some(0),
                ..Default::default()
            };
            client.setattr(&root, a.ino, set).await.map_err(|e| errno(e, path))?
        }
        Err(e) => return Err(errno(e, path)),
    };
    let f = client.open(&root, a.ino).await.map_err(|e| errno(e, path))?;
    let mut input: Box<dyn Read> = if local.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(local).with_context(|| format!("open {}", local.display()))?)
    };
    let mut buf = vec![0u8; 4 << 20];
    let mut off = 0u64;
    loop {
        let n = input.read(&mut buf)?;
        if n == 0 {
            break;
        }
        f.write(off, &buf[..n]).await.map_err(|e| errno(e, path))?;
        off += n as u64;
    }
    f.flush().await.map_err(|e| errno(e, path))?;
    eprintln!("wrote {off} bytes to {path}");
    Ok(())
}

/// `shingle get`: the file's bytes into `local` (or stdout).
async fn get(client: &Client, path: &str, local: &std::path::Path) -> Result<()> {
    let a = client
        .meta()
        .resolve(path.as_bytes())
        .await
        .map_err(|e| errno(e, path))?;
    let f = client.open(&Creds::root(), a.ino).await.map_err(|e| errno(e, path))?;
    let mut out: Box<dyn Write> = if local.as_os_str() == "-" {
        Box::new(std::io::stdout())
    } else {
        Box::new(std::fs::File::create(local).with_context(|| format!("create {}", local.display()))?)
    };
    let mut off = 0u64;
    loop {
        let b = f.read(off, 4 << 20).await.map_err(|e| errno(e, path))?;
        if b.is_empty() {
            break;
        }
        out.write_all(&b)?;
        off += b.len() as u64;
    }
    out.flush()?;
    Ok(())
}

fn print_attr(path: &str, a: &Attr) {
    println!("{path}");
    println!(
        "  inode {} (partition {})  {}{:o}  links {}  uid {} gid {}  size {}",
        a.ino.0,
        a.ino.partition().0,
        kind_char(a.kind),
        a.perm,
        a.nlink,
        a.uid,
        a.gid,
        a.size
    );
}

/// Polls until the cluster is healthy, drawing the rebuild progress.
async fn wait_healthy(client: &Client, cf: &crate::config::ClusterFile, json: bool, limit: Duration) -> Result<()> {
    use std::io::{IsTerminal, Write};
    let started = std::time::Instant::now();
    let tty = std::io::stderr().is_terminal();
    loop {
        let r = cluster_health(client).await;
        let line = r.progress_line();
        if tty {
            eprint!("\r{line:<100}");
        } else {
            eprintln!("{line}");
        }
        let _ = std::io::stderr().flush();
        if r.healthy {
            if tty {
                eprintln!();
            }
            return status(client, cf, json).await.map(|_| ());
        }
        if started.elapsed() >= limit {
            if tty {
                eprintln!();
            }
            status(client, cf, json).await?;
            bail!("cluster not healthy after {}s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Cluster-wide health, from the map and every meta node's stats.
pub(crate) struct Health {
    /// No node Down, every partition served, every repair scan done on the current map
    /// with nothing left to rebuild, every stripe readable.
    pub(crate) healthy: bool,
    down: usize,
    serving: u32,
    partitions: u32,
    /// Repair progress summed over the meta nodes.
    pub(crate) repair: shingle_meta::service::wire::RepairStats,
    /// Meta nodes whose repair scan has not finished a pass on the current map.
    scanning: usize,
    /// Metadata partitions still held by their replicas from before a placement change.
    pub(crate) moving: usize,
}

impl Health {
    /// Healthy, and no rebalance moves (shards or partitions) left.
    pub(crate) fn settled(&self) -> bool {
        self.healthy && self.repair.moves_todo <= self.repair.moved && !self.repair.running && self.moving == 0
    }

    /// One line: state, a progress bar of the rebuild, and what keeps it degraded.
    pub(crate) fn progress_line(&self) -> String {
        let r = &self.repair;
        let width = 30;
        let frac = if r.todo == 0 {
            1.0
        } else {
            r.done as f64 / r.todo as f64
        };
        let filled = ((frac * width as f64) as usize).min(width);
        format!(
            "{}  rebuild [{}{}] {:>3.0}%  {}/{} shards ({} failed), {:.1} MiB/s; {} stripes unreadable; {} stripes with shards sharing a node; {} nodes down; {}/{} partitions serving{}",
            if self.healthy { "healthy " } else { "degraded" },
            "#".repeat(filled),
            ".".repeat(width - filled),
            frac * 100.0,
            r.done,
            r.todo,
            r.failed,
            r.bytes_per_sec as f64 / (1u64 << 20) as f64,
            r.unreadable,
            r.shared,
            self.down,
            self.serving,
            self.partitions,
            if self.scanning > 0 {
                format!("; {} scans on an older map", self.scanning)
            } else {
                String::new()
            }
        ) + &if r.moves_todo > r.moved {
            format!("; rebalancing {}/{} shards", r.moved, r.moves_todo)
        } else {
            String::new()
        } + &if self.moving > 0 {
            format!("; {} partitions moving", self.moving)
        } else {
            String::new()
        }
    }
}

/// The cluster's health now.
pub(crate) async fn cluster_health(client: &Client) -> Health {
    let meta = client.meta();
    let v = meta.view();
    let stats = meta.stats().await;
    let ok: Vec<_> = stats.iter().filter_map(|(_, s)| s.as_ref().ok()).collect();
    let mut repair = shingle_meta::service::wire::RepairStats::default();
    let mut scanning = 0;
    for s in &ok {
        let r = &s.repair;
        repair.todo += r.todo;
        repair.done += r.done;
        repair.failed += r.failed;
        repair.unreadable += r.unreadable;
        repair.shared += r.shared;
        repair.bytes_per_sec += r.bytes_per_sec;
        repair.repaired_total += r.repaired_total;
        repair.moves_todo += r.moves_todo;
        repair.moved += r.moved;
        repair.moved_total += r.moved_total;
        repair.bytes_total += r.bytes_total;
        repair.running |= r.running;
        if s.primary > 0 && (r.running || r.map_epoch < v.map.epoch.0) {
            scanning += 1;
        }
    }
    let serving: u32 = ok.iter().map(|s| s.primary).sum();
    // Out nodes are given up on: their data is rebuilt elsewhere, they do not count.
    let down = v.map.nodes.values().filter(|n| n.state == NodeState::Down).count();
    let healthy = down == 0
        && serving >= v.map.partitions
        && scanning == 0
        && repair.todo == repair.done
        && repair.unreadable == 0
        && repair.shared == 0;
    Health {
        healthy,
        down,
        serving,
        partitions: v.map.partitions,
        repair,
        scanning,
        moving: v.map.moves.len(),
    }
}

async fn status(client: &Client, cf: &crate::config::ClusterFile, json: bool) -> Result<()> {
    let meta = client.meta();
    let v = meta.view();
    let stats = meta.stats().await;
    let (nodes, cap, used) = node_status(meta, &v, &stats).await;
    let primaries: u32 = stats
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok())
        .map(|s| s.primary)
        .sum();
    let down = v.map.nodes.values().filter(|n| n.state != NodeState::Up).count();
    let inodes: u64 = stats
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok())
        .map(|s| s.inodes)
        .sum();
    let h = cluster_health(client).await;
    let health = if h.healthy { "healthy" } else { "degraded" };
    let root_ok = meta.getattr(Ino::ROOT).await.is_ok();
    let out = serde_json::json!({
        "cluster_id": v.map.cluster_id, "epoch": v.map.epoch.0, "health": health,
        "partitions": v.map.partitions, "partitions_serving": primaries, "pgs": v.map.pgs,
        "replication": v.map.replication, "ec": format!("ec({},{})", cf.ec_k, cf.ec_m),
        "nodes_down": down, "inodes": inodes, "namespace_reachable": root_ok,
        "raw_capacity_bytes": cap, "raw_used_bytes": used, "nodes": nodes,
        "repair": serde_json::to_value(&h.repair)?,
        "partitions_moving": h.moving,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "cluster {}  epoch {}  {}  ({} of {} partitions serving, {} moving, {} nodes not up)",
        v.map.cluster_id, v.map.epoch.0, health, primaries, v.map.partitions, h.moving, down
    );
    println!(
        "capacity {:.1} GiB raw, {:.1} GiB used; {} inodes; default ec({},{})",
        cap as f64 / (1u64 << 30) as f64,
        used as f64 / (1u64 << 30) as f64,
        inodes,
        cf.ec_k,
        cf.ec_m
    );
    println!("{}", h.progress_line());
    print_nodes(&nodes);
    Ok(())
}

/// Each node's row of the status (its map entry, its metadata service's figures, its
/// data service's, asked with a short timeout), and the data nodes' raw capacity and
/// bytes written.
async fn node_status(
    meta: &shingle_meta::meta_client::MetaClient,
    v: &shingle_meta::map::MapView,
    stats: &[(shingle_meta::ids::NodeId, Result<NodeStats, Errno>)],
) -> (Vec<serde_json::Value>, u64, u64) {
    let mut nodes = Vec::new();
    let (mut cap, mut used) = (0u64, 0u64);
    for n in v.map.nodes.values() {
        let ms = stats
            .iter()
            .find(|(id, _)| *id == n.id)
            .and_then(|(_, s)| s.as_ref().ok().cloned());
        let ds = if n.roles.data {
            meta.transport()
                .call::<Stat>(n.addr, &StatRequest {}, CallOptions::timeout(Duration::from_secs(2)))
                .await
                .ok()
        } else {
            None
        };
        if let Some(d) = &ds {
            cap += d.capacity_bytes;
            used += d.written_bytes;
        }
        nodes.push(serde_json::json!({
            "id": n.id.0, "addr": n.addr.to_string(), "domain": n.domain,
            "state": format!("{:?}", n.state),
            "roles": { "manager": n.roles.manager, "meta": n.roles.meta, "data": n.roles.data },
            "meta": ms.map(|s| serde_json::json!({"partitions": s.partitions, "serving": s.serving, "primary": s.primary, "inodes": s.inodes})),
            "data": ds.map(|d| serde_json::json!({"zones_total": d.zones_total, "zones_free": d.zones_free, "chunks": d.chunks, "live_bytes": d.live_bytes, "capacity_bytes": d.capacity_bytes})),
        }));
    }
    (nodes, cap, used)
}

/// The status's node table.
fn print_nodes(nodes: &[serde_json::Value]) {
    println!("  id  address               state    roles      meta (p/s/pri) zones free");
    for n in nodes {
        let roles = ["manager", "meta", "data"]
            .iter()
            .filter(|r| n["roles"][**r].as_bool().unwrap_or(false))
            .map(|r| &r[..1])
            .collect::<String>();
        let m = &n["meta"];
        let d = &n["data"];
        println!(
            "{:>4}  {:<21} {:<8} {:<10} {:<14} {}",
            n["id"].as_u64().unwrap_or(0),
            n["addr"].as_str().unwrap_or(""),
            n["state"].as_str().unwrap_or(""),
            roles,
            if m.is_null() {
                "-".to_string()
            } else {
                format!("{}/{}/{}", m["partitions"], m["serving"], m["primary"])
            },
            if d.is_null() {
                "-".to_string()
            } else {
                format!("{}/{}", d["zones_free"], d["zones_total"])
            }
        );
    }
}
