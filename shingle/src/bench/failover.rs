//! `shingle bench failover`: the fault scenarios of a training cluster, on real
//! processes, with a DataLoader-style scan and a writer running throughout.
//!
//! An 8-node local cluster (3 managers, every node meta + data, ec(4,2)) is loaded with
//! files; then, while readers scan them (lookup + open + whole-file read, verified),
//! a prober looks names up and a writer keeps creating files:
//! 1. `healthy`: the baseline;
//! 2. `one-data-down`: one node is killed with SIGKILL;
//! 3. `two-data-down`: a second one;
//! 4. `restart-two`: they restart; the cluster must become healthy (rebuild done);
//! 5. `leader-down`: the manager leader is killed; `restart-leader`: it restarts and
//!    the cluster must become healthy again;
//! 6. `three-down`: with the load stopped, three nodes are killed: a read of a stripe
//!    with three shards gone must fail with EIO, promptly; the rest still read;
//! 7. they restart; healthy again;
//! 8. `add-node`: a ninth node joins; the repair scans move its share of shards to it
//!    (and placement gives it its partitions); reported as shares of the whole;
//! 9. every file (preloaded and acknowledged written) is read back and compared byte
//!    for byte.
//!
//! Reported: per phase reads, failures, read latency (p50/max), scan throughput, lookup
//! stalls, write failures and the slowest write (create, write, close of a half-size
//! file); the longest read stall; degraded-read throughput as a ratio
//! to healthy; rebuild throughput; the outcome of the three-down phase and of the final
//! read-back. It fails (after writing the report) when a correctness invariant breaks:
//! a failed read, lookup or write while at most two nodes are down, an error other than
//! EIO or a slow error with three down, a lost or corrupt file at the end.

use crate::cli::cluster_health;
use crate::local::{LocalCluster, LocalSpec};
use anyhow::{Context, Result, bail};
use parking_lot::Mutex;
use shingle_client::{Client, ClientConfig};
use shingle_meta::ids::{Ino, PartitionId};
use shingle_meta::manager::rpc::{Heartbeat, HeartbeatRequest};
use shingle_meta::meta_client::MetaClient;
use shingle_meta::namespace::{Creds, Errno, FileKind};
use shingle_transport::{CallOptions, RpcChannel};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Arguments.
#[derive(clap::Args, Clone, Debug)]
pub struct FailoverBenchArgs {
    /// Files loaded before the faults.
    #[arg(long, default_value_t = 64)]
    pub files: usize,
    /// Size of each file, KiB.
    #[arg(long, default_value_t = 2048)]
    pub file_kib: usize,
    /// Stripe unit (bytes per shard), KiB.
    #[arg(long, default_value_t = 256)]
    pub unit_kib: u32,
    /// Seconds each fault phase runs.
    #[arg(long, default_value_t = 10)]
    pub phase_secs: u64,
    /// Concurrent readers.
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Longest wait for the cluster to become healthy after the nodes return, seconds.
    #[arg(long, default_value_t = 180)]
    pub heal_secs: u64,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run the nodes on the hosts of `fabric-tests/netns/rig.sh` (namespace prefix, e.g.
    /// `shn-`; run this command in the rig's client namespace). The first data node is
    /// then partitioned (its link cut) instead of killed, and a writer inside it must get
    /// nothing acknowledged while it is cut off.
    #[arg(long, value_name = "PREFIX")]
    pub netns: Option<String>,
    /// Fail when a read or a lookup took longer than this (ms) in any phase after the
    /// first kill, restarts and heal included (the target is 100).
    #[arg(long, value_name = "MS")]
    pub max_read_stall_ms: Option<f64>,
    /// Fail when a write (create, write, fsync, close) took longer than this (ms) in any
    /// phase after the first kill (the target for a primary's death is 500).
    #[arg(long, value_name = "MS")]
    pub max_write_stall_ms: Option<f64>,
}

/// Arguments of the writer that runs inside a partitioned host.
#[derive(clap::Args, Clone, Debug)]
pub struct IsoWriterArgs {
    /// Cluster file.
    #[arg(long)]
    pub cluster_file: PathBuf,
    /// Secret file.
    #[arg(long)]
    pub secret_file: PathBuf,
    /// Append "start_ms acked_ms name seed len ino" here for every acknowledged file.
    #[arg(long)]
    pub acks: PathBuf,
    /// File size in bytes.
    #[arg(long, default_value_t = 300_000)]
    pub len: usize,
    /// Stripe unit, KiB.
    #[arg(long, default_value_t = 256)]
    pub unit_kib: u32,
}

fn wall_ms() -> u64 {
    u64::try_from(shingle_meta::namespace::types::now_ns() / 1_000_000).unwrap_or(0)
}

/// The writer of the partition scenario: creates files in `/iso` until killed, and
/// records each acknowledged one.
pub async fn iso_writer(a: IsoWriterArgs) -> Result<()> {
    use std::io::Write;
    let (meta, _) = crate::dev::connect(&a.cluster_file, &a.secret_file, Duration::from_secs(30)).await?;
    let meta = meta.with_timeout(Duration::from_secs(5));
    let client = Client::new(
        meta.clone(),
        ClientConfig {
            ec: (4, 2),
            unit: a.unit_kib << 10,
            ..ClientConfig::default()
        },
    );
    let dir = meta
        .resolve(b"/iso")
        .await
        .map_err(|e| anyhow::anyhow!("/iso: {e}"))?
        .ino;
    let mut out = std::fs::OpenOptions::new().create(true).append(true).open(&a.acks)?;
    for i in 0u64.. {
        let start = wall_ms();
        let name = format!("i{i:05}");
        let seed = 2_000_000 + i;
        match write_file(&client, dir, &name, seed, a.len).await {
            Ok(()) => {
                let ino = ACKED_INO.lock().get(&name).copied().unwrap_or(0);
                writeln!(out, "{start} {} {name} {seed} {} {ino}", wall_ms(), a.len)?;
                out.flush()?;
            }
            Err(e) => {
                eprintln!(
                    "{} {name}: {e} (in {})",
                    wall_ms(),
                    STAGES[usize::from(WRITER_STAGE.load(Ordering::Relaxed)) % 5]
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Ok(())
}

/// Cuts (`up` false) or heals the rig link of host `id`.
fn set_link(prefix: &str, id: u64, up: bool) -> Result<()> {
    let st = std::process::Command::new("ip")
        .args(["-n", &format!("{prefix}sw"), "link", "set", &format!("p{id}")])
        .arg(if up { "up" } else { "down" })
        .status()
        .context("run ip")?;
    if !st.success() {
        bail!("ip link set p{id} failed (is fabric-tests/netns/rig.sh up?)");
    }
    Ok(())
}

/// Deterministic file contents, so every read can be checked.
pub(crate) fn content(seed: u64, len: usize) -> Vec<u8> {
    shingle_testkit::wide_bytes(seed, len)
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: f64,
    ms: f64,
    ok: bool,
    bytes: u64,
}

#[derive(Default)]
struct Log {
    reads: Mutex<Vec<Sample>>,
    lookups: Mutex<Vec<Sample>>,
    writes: Mutex<Vec<Sample>>,
    errors: Mutex<Vec<String>>,
    /// Files the writer got acknowledged: (name, seed, len).
    acked: Mutex<Vec<(String, u64, usize)>>,
    /// Host scheduling gaps: (when the probe woke, s since t0; ms it woke late).
    gaps: Mutex<Vec<(f64, f64)>>,
}

/// How late a 1 ms sleep may wake before it counts as a host scheduling gap (ms).
const GAP_MS: f64 = 2.0;

/// Watches how the host schedules this process: a thread sleeps 1 ms at a time and
/// logs each wake more than [`GAP_MS`] late, until `stop`. Such a gap delays every
/// operation the bench times, whatever the cluster does, so a stall that misses a
/// bound is printed with the longest gap of its phase: a phase with a 100 ms gap says
/// the machine, not Shingle, stood still. It excuses nothing: the bounds are checked
/// against the times measured.
fn watch_host(log: Arc<Log>, stop: Arc<AtomicBool>, t0: Instant) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            std::thread::sleep(Duration::from_millis(1));
            let late = t.elapsed().as_secs_f64() * 1e3 - 1.0;
            if late > GAP_MS {
                log.gaps.lock().push((t0.elapsed().as_secs_f64(), late));
            }
        }
    })
}

fn push(v: &Mutex<Vec<Sample>>, s: Sample) {
    v.lock().push(s);
}

/// Where the writer is (for reporting a hang).
static WRITER_STAGE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
/// The inode the writer created last (for diagnosing a failed open).
static WRITER_INO: AtomicU64 = AtomicU64::new(0);
const STAGES: [&str; 5] = ["idle", "mknod", "open", "write", "flush"];

/// The inode each written name got (for diagnosing a name lost later).
static ACKED_INO: std::sync::LazyLock<Mutex<std::collections::HashMap<String, u64>>> =
    std::sync::LazyLock::new(Default::default);

async fn write_file(client: &Client, dir: Ino, name: &str, seed: u64, len: usize) -> Result<(), Errno> {
    let root = Creds::root();
    // Where a slow write spent its time: create, open, write, flush (ms).
    let mut took = [0.0f64; 4];
    let mut t = Instant::now();
    let mut stage = |s: u8| {
        if s > 1 {
            took[usize::from(s) - 2] = t.elapsed().as_secs_f64() * 1e3;
        }
        t = Instant::now();
        WRITER_STAGE.store(s % 5, Ordering::Relaxed);
    };
    stage(1);
    let a = client
        .meta()
        .mknod(&root, dir, name.as_bytes(), FileKind::File, 0o644, 0, None)
        .await?;
    WRITER_INO.store(a.ino.0, Ordering::Relaxed);
    ACKED_INO.lock().insert(name.to_string(), a.ino.0);
    stage(2);
    let f = client.open(&root, a.ino).await?;
    let data = content(seed, len);
    let mut off = 0;
    stage(3);
    for chunk in data.chunks(1 << 20) {
        f.write(off as u64, chunk).await?;
        off += chunk.len();
    }
    stage(4);
    let r = f.flush().await;
    stage(5);
    if took.iter().sum::<f64>() > 250.0 {
        tracing::warn!(
            name,
            create_ms = took[0],
            open_ms = took[1],
            write_ms = took[2],
            flush_ms = took[3],
            "slow write"
        );
    }
    r
}

async fn read_file(client: &Client, dir: Ino, name: &str, seed: u64, len: usize) -> Result<(), String> {
    // Where a slow read spent its time: lookup, open, read (ms).
    let t = Instant::now();
    let a = client
        .lookup(&Creds::root(), dir, name.as_bytes())
        .await
        .map_err(|e| format!("lookup {name}: {e}"))?;
    let lookup_ms = t.elapsed().as_secs_f64() * 1e3;
    let f = client
        .open(&Creds::root(), a.ino)
        .await
        .map_err(|e| format!("open {name}: {e}"))?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3 - lookup_ms;
    let mut got = Vec::with_capacity(len);
    while got.len() < len {
        let b = f
            .read(got.len() as u64, (len - got.len()).min(4 << 20) as u32)
            .await
            .map_err(|e| format!("read {name}: {e}"))?;
        if b.is_empty() {
            break;
        }
        got.extend_from_slice(&b);
    }
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    if total_ms > 100.0 {
        tracing::warn!(
            name,
            lookup_ms,
            open_ms,
            read_ms = total_ms - lookup_ms - open_ms,
            "slow read"
        );
    }
    if got != content(seed, len) {
        return Err(format!("{name}: contents differ ({} of {len} bytes read)", got.len()));
    }
    Ok(())
}

/// What every node answers for `ino` right now (for diagnosing a read that missed it).
async fn who_has(meta: &MetaClient, ino: Ino) -> String {
    use shingle_meta::service::wire::ReadOp;
    ask_all(meta, ino.partition(), ReadOp::GetInode(ino)).await
}

/// What every node answers to `op` (about partition `p`) right now.
async fn ask_all(meta: &MetaClient, p: PartitionId, op: shingle_meta::service::wire::ReadOp) -> String {
    use shingle_meta::service::wire::{Read, ReadReply, call};
    let v = meta.view();
    let members = v.members(p);
    let mut out = vec![format!("partition {} epoch {} members {members:?}", p.0, v.map.epoch.0)];
    for n in v.map.nodes.values() {
        let req = Read {
            epoch: v.map.epoch,
            op: op.clone(),
        };
        let r = call(meta.transport(), n.addr, &req, Duration::from_secs(2)).await;
        out.push(format!(
            "{}: {}",
            n.id.0,
            r.map(|r| match r {
                ReadReply::Inode(rec) => format!(
                    "size {} nlink {} stripes {}",
                    rec.attr.size,
                    rec.attr.nlink,
                    rec.layout.map_or(0, |l| l.stripes.len())
                ),
                ReadReply::Entry(d, _) => format!("entry {d:?}"),
                _ => "has it".to_string(),
            })
            .unwrap_or_else(|e| e.to_string())
        ));
    }
    out.join(", ")
}

/// What every node holds of the entry `dir/name` and of inode `ino`.
async fn where_is(meta: &MetaClient, dir: Ino, name: &str, ino: Ino) -> String {
    use shingle_meta::service::wire::ReadOp;
    let p = shingle_meta::placement::dentry_partition(dir, name.as_bytes(), meta.view().map.partitions);
    let lookup = ReadOp::Lookup {
        parent: dir,
        name: name.as_bytes().to_vec(),
    };
    format!(
        "entry: {}; inode {ino}: {}",
        ask_all(meta, p, lookup).await,
        who_has(meta, ino).await
    )
}

/// Which shards of a bad file differ from what was written, and where they are.
async fn diagnose(client: &Client, dir: Ino, name: &str, seed: u64, len: usize) -> String {
    use shingle_data::shard::read_shard;
    use shingle_data::wire::ShardId;
    let meta = client.meta();
    let a = match meta.lookup(dir, name.as_bytes()).await {
        Ok(a) => a,
        Err(e) => {
            let ino = Ino(ACKED_INO.lock().get(name).copied().unwrap_or(0));
            return format!("lookup failed ({e}); {}", where_is(meta, dir, name, ino).await);
        }
    };
    let Ok(rec) = meta.get_inode(a.ino).await else {
        return "get_inode failed".into();
    };
    let Some(l) = rec.layout else { return "no layout".into() };
    let mut same = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    while let Ok(page) = meta.readdir(dir, after.as_deref(), 1000).await {
        let Some(last) = page.last() else { break };
        after = Some(last.name.clone());
        same.extend(
            page.iter()
                .filter(|e| e.ino == a.ino)
                .map(|e| String::from_utf8_lossy(&e.name).into_owned()),
        );
    }
    let policy = shingle_client::ec_policy(&l);
    let data = content(seed, len);
    let v = meta.view();
    let mut out = Vec::new();
    for (s, sr) in &l.stripes {
        let off = (*s * l.stripe_bytes()) as usize;
        let end = (off + sr.len as usize).min(data.len());
        let Ok(want) = policy.encode_stripe(&data[off..end]) else {
            out.push(format!("stripe {s}: cannot encode"));
            continue;
        };
        for (i, node) in sr.nodes.iter().enumerate() {
            let node = node.map_or(0, |n| n.0);
            let Some(addr) = v.map.addr(shingle_meta::ids::NodeId(node)) else {
                out.push(format!("s{s}/{i}@{node}: no addr"));
                continue;
            };
            if want[i].is_empty() {
                continue;
            }
            let id = ShardId {
                ino: a.ino.0,
                stripe: *s,
                shard: i as u32,
            };
            let got = read_shard(meta.transport(), addr, id, sr.version, &bytes::Bytes::new()).await;
            let verdict = match got {
                Ok(b) if b == want[i] => "ok".to_string(),
                Ok(b) => format!("DIFFERS (len {} vs {})", b.len(), want[i].len()),
                Err(e) => format!("err {e}"),
            };
            out.push(format!("s{s}/{i}@{node}: {verdict}"));
        }
        out.push(format!("s{s} v{} len {}", sr.version, sr.len));
    }
    format!("ino {} named {same:?}: {}", a.ino.0, out.join(", "))
}

/// Per-phase figures.
#[derive(Debug, Default, serde::Serialize)]
struct Phase {
    name: &'static str,
    secs: f64,
    reads: usize,
    failed_reads: usize,
    read_p50_ms: f64,
    read_max_ms: f64,
    read_mib_s: f64,
    lookups: usize,
    failed_lookups: usize,
    lookup_max_ms: f64,
    writes: usize,
    failed_writes: usize,
    write_max_ms: f64,
    /// The longest host scheduling gap the bench saw in the phase (see [`watch_host`]).
    host_gap_ms: f64,
}

impl Phase {
    /// How long the host left this process unscheduled in the phase, when it did.
    fn gap_note(&self) -> String {
        if self.host_gap_ms > 0.0 {
            format!(
                "; this process was not run for up to {:.1} ms in the phase",
                self.host_gap_ms
            )
        } else {
            String::new()
        }
    }
}

/// The phases whose longest read, lookup or write broke a bound (none when unset).
fn stall_problems(phases: &[Phase], read_ms: Option<f64>, write_ms: Option<f64>) -> Vec<String> {
    let mut out = Vec::new();
    for p in phases {
        let checks = [
            ("read", p.read_max_ms, read_ms),
            ("lookup", p.lookup_max_ms, read_ms),
            ("write", p.write_max_ms, write_ms),
        ];
        for (what, took, bound) in checks {
            if let Some(max) = bound
                && took > max
            {
                out.push(format!(
                    "{}: a {what} took {took:.1} ms (bound {max} ms){}",
                    p.name,
                    p.gap_note()
                ));
            }
        }
    }
    out
}

fn phase(name: &'static str, log: &Log, from: f64, to: f64) -> Phase {
    let pick = |v: &Mutex<Vec<Sample>>| -> Vec<Sample> {
        v.lock().iter().filter(|s| s.at >= from && s.at < to).copied().collect()
    };
    let (r, l, w) = (pick(&log.reads), pick(&log.lookups), pick(&log.writes));
    let mut ms: Vec<f64> = r.iter().map(|s| s.ms).collect();
    let max = |v: &[Sample]| v.iter().map(|s| s.ms).fold(0.0, f64::max);
    Phase {
        name,
        secs: to - from,
        reads: r.len(),
        failed_reads: r.iter().filter(|s| !s.ok).count(),
        read_p50_ms: super::median(&mut ms),
        read_max_ms: max(&r),
        read_mib_s: r.iter().filter(|s| s.ok).map(|s| s.bytes).sum::<u64>() as f64
            / (1u64 << 20) as f64
            / (to - from).max(1e-9),
        lookups: l.len(),
        failed_lookups: l.iter().filter(|s| !s.ok).count(),
        lookup_max_ms: max(&l),
        writes: w.len(),
        failed_writes: w.iter().filter(|s| !s.ok).count(),
        write_max_ms: max(&w),
        host_gap_ms: log
            .gaps
            .lock()
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|(_, ms)| *ms)
            .fold(0.0, f64::max),
    }
}

/// The Raft leader, as the managers report it.
async fn leader(meta: &MetaClient, managers: &[std::net::SocketAddr]) -> Option<u64> {
    for m in managers {
        let req = HeartbeatRequest { node_id: 0, epoch: 0 };
        if let Ok(r) = meta
            .transport()
            .call::<Heartbeat>(*m, &req, CallOptions::timeout(Duration::from_secs(1)))
            .await
            && r.leader != 0
        {
            return Some(r.leader);
        }
    }
    None
}

/// Three nodes holding shards of one stripe of a loaded file (so that stripe cannot be
/// read with them down), at most one a manager, that together hold no partition's every
/// replica (so the namespace stays up).
async fn three_victims(meta: &MetaClient, pre: Ino, files: usize, managers: u64) -> Option<Vec<u64>> {
    let v = meta.view();
    for i in 0..files {
        let Ok(a) = meta.lookup(pre, format!("f{i:04}").as_bytes()).await else {
            continue;
        };
        let Ok(rec) = meta.get_inode(a.ino).await else { continue };
        let Some((_, sr)) = rec.layout.as_ref().and_then(|l| l.stripes.iter().next()) else {
            continue;
        };
        let ids: Vec<u64> = sr.nodes.iter().flatten().map(|n| n.0).collect();
        for x in 0..ids.len() {
            for y in x + 1..ids.len() {
                for z in y + 1..ids.len() {
                    let set = [ids[x], ids[y], ids[z]];
                    if set.iter().filter(|i| **i <= managers).count() > 1 {
                        continue;
                    }
                    let safe = (0..v.map.partitions).all(|p| {
                        v.placement
                            .partition(PartitionId(p))
                            .iter()
                            .any(|n| !set.contains(&n.0))
                    });
                    if safe {
                        return Some(set.to_vec());
                    }
                }
            }
        }
    }
    None
}

async fn wait_healthy(client: &Client, limit: Duration) -> Result<f64> {
    wait_until(client, limit, false).await
}

async fn wait_until(client: &Client, limit: Duration, settled: bool) -> Result<f64> {
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < limit {
        let h = cluster_health(client).await;
        let line = h.progress_line();
        if line != last {
            eprintln!("  {line}");
            last = line;
        }
        if h.healthy && (!settled || h.settled()) {
            return Ok(t.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("cluster not healthy after {limit:?}: {last}")
}

/// Kills three nodes that hold one stripe (leaving every partition a replica), reads
/// every preloaded file (each must read or fail with EIO, promptly), restarts them and
/// waits for health: the report, and what went wrong.
async fn three_down(
    cluster: &mut LocalCluster,
    spec: &LocalSpec,
    client: &Client,
    pre: Ino,
    files: usize,
    len: usize,
    heal_secs: u64,
) -> Result<(serde_json::Value, Option<String>)> {
    let victims = three_victims(client.meta(), pre, files, 3)
        .await
        .context("no three nodes that hold one stripe and leave every partition a replica")?;
    eprintln!("# phase three-down: nodes {victims:?} killed");
    for id in &victims {
        cluster.nodes[*id as usize - 1].kill();
    }
    let (mut ok, mut eio, mut other, mut max_ms) = (0, 0, Vec::new(), 0.0f64);
    for i in 0..files {
        let s = Instant::now();
        let r = read_file(client, pre, &format!("f{i:04}"), i as u64, len).await;
        max_ms = max_ms.max(s.elapsed().as_secs_f64() * 1e3);
        match r {
            Ok(()) => ok += 1,
            Err(e) if e.contains("Input/output error") || e.contains("EIO") => eio += 1,
            Err(e) => other.push(e),
        }
    }
    let three = serde_json::json!({"victims": victims, "files": files, "ok": ok, "eio": eio, "other_errors": other, "max_ms": max_ms});
    let mut err = None;
    if !other.is_empty() || max_ms > 10_000.0 || eio == 0 {
        err = Some(format!(
            "three down: {ok} read, {eio} EIO, other errors {other:?}, slowest {max_ms:.0} ms"
        ));
    }
    for id in &victims {
        cluster.nodes[*id as usize - 1].restart(spec)?;
    }
    if let Err(e) = wait_healthy(client, Duration::from_secs(heal_secs)).await {
        err.get_or_insert(format!("after three down: {e}"));
    }
    Ok((three, err))
}

/// Adds a node and waits for the moves to settle: the report (its share of partition
/// replicas and shards, shards moved, time), and what went wrong.
async fn add_node(
    cluster: &mut LocalCluster,
    spec: &LocalSpec,
    client: &Client,
    heal_secs: u64,
) -> Result<(serde_json::Value, Option<String>)> {
    let meta = client.meta();
    let before = cluster_health(client).await.repair.moved_total;
    let t = Instant::now();
    let id = cluster.add_node(spec)?;
    eprintln!("# phase add-node: node {id} joins");
    // Wait for its registration, then for the moves to finish.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !meta.view().map.is_up(shingle_meta::ids::NodeId(id)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let settled = wait_until(client, Duration::from_secs(heal_secs), true).await;
    let secs = t.elapsed().as_secs_f64();
    let after = cluster_health(client).await.repair.moved_total;
    let v = meta.view();
    let replicas = u64::from(v.map.partitions) * u64::from(v.map.replication);
    let held = v.placement.partitions_of(shingle_meta::ids::NodeId(id)).len() as u64;
    let (mut chunks_new, mut chunks_all) = (0u64, 0u64);
    for n in v.map.nodes.values().filter(|n| n.roles.data) {
        use shingle_data::wire::{Stat, StatRequest};
        if let Ok(st) = meta
            .transport()
            .call::<Stat>(n.addr, &StatRequest {}, CallOptions::timeout(Duration::from_secs(5)))
            .await
        {
            chunks_all += st.chunks;
            if n.id.0 == id {
                chunks_new += st.chunks;
            }
        }
    }
    let report = serde_json::json!({
        "node": id, "nodes": v.map.nodes.len(), "settled": settled.is_ok(), "secs": secs,
        "partition_share": held as f64 / replicas.max(1) as f64,
        "shard_share": chunks_new as f64 / chunks_all.max(1) as f64,
        "moved_shards": after.saturating_sub(before),
    });
    Ok((report, settled.err().map(|e| format!("after adding a node: {e}"))))
}

/// Names in `dirs` that share an inode (each name must have its own).
async fn shared_inodes(meta: &MetaClient, dirs: &[Ino]) -> Vec<String> {
    let mut inos: std::collections::BTreeMap<Ino, Vec<String>> = std::collections::BTreeMap::new();
    for &dir in dirs {
        let mut after: Option<Vec<u8>> = None;
        while let Ok(page) = meta.readdir(dir, after.as_deref(), 1000).await {
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            for e in page {
                inos.entry(e.ino)
                    .or_default()
                    .push(String::from_utf8_lossy(&e.name).into_owned());
            }
        }
    }
    inos.iter()
        .filter(|(_, n)| n.len() > 1)
        .map(|(ino, names)| format!("inode {ino} has several names: {names:?}"))
        .collect()
}

/// When the partition of the isolated host's writer began and ended, and when the
/// manager leader was killed and restarted (wall-clock ms), to place its writes.
struct CutTimes {
    cut_ms: u64,
    heal_ms: u64,
    lead: u64,
    lead_kill_ms: u64,
    lead_restart_ms: u64,
}

/// The writer inside the partitioned host: stops it, then checks that nothing was
/// acknowledged while it was cut off (a write begun just before the cut may finish)
/// and that everything it acknowledged reads back. The report, and what is wrong.
async fn check_iso_writer(
    mut child: std::process::Child,
    acks: &std::path::Path,
    log: &std::path::Path,
    client: &Client,
    iso_dir: Ino,
    t: &CutTimes,
) -> (serde_json::Value, Vec<String>) {
    let _ = child.kill();
    let _ = child.wait();
    let mut bad = Vec::new();
    let text = std::fs::read_to_string(acks).unwrap_or_default();
    let mut during = Vec::new();
    let mut acked_iso = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [_, acked, name, seed, len, ino, ..] = f[..] else {
            continue;
        };
        let (acked, seed, len): (u64, u64, usize) = (
            acked.parse().unwrap_or(0),
            seed.parse().unwrap_or(0),
            len.parse().unwrap_or(0),
        );
        acked_iso += 1;
        // Acknowledged while cut off: after the cut (a second for what was already
        // on the wire) and before the heal. A write begun during the cut that
        // finishes after the heal is fine.
        if acked > t.cut_ms + 1000 && acked < t.heal_ms {
            during.push(name.to_string());
        }
        if let Err(e) = read_file(client, iso_dir, name, seed, len).await {
            let ino = Ino(ino.parse().unwrap_or(0));
            let when = acked as i64;
            bad.push(format!(
                "partitioned host's acknowledged {name} (acked {} ms after the cut, {} ms after the heal, {} ms after node {} was killed, {} ms after it restarted): {e}; {}",
                when - t.cut_ms as i64,
                when - t.heal_ms as i64,
                when - t.lead_kill_ms as i64,
                t.lead,
                when - t.lead_restart_ms as i64,
                where_is(client.meta(), iso_dir, name, ino).await
            ));
            let log = std::fs::read_to_string(log).unwrap_or_default();
            for l in log
                .lines()
                .filter(|l| l.contains(name) || l.contains(&format!("ino={}", ino.0)))
            {
                bad.push(format!("  iso writer: {l}"));
            }
        }
    }
    if !during.is_empty() {
        bad.push(format!("acknowledged while partitioned (split brain): {during:?}"));
    }
    eprintln!(
        "# partitioned host's writer: {acked_iso} acknowledged, {} while cut off",
        during.len()
    );
    (
        serde_json::json!({"acked": acked_iso, "acked_while_cut": during.len()}),
        bad,
    )
}

/// Reads back the `files` preloaded files of `pre` and the writer's acknowledged ones
/// in `wdir`: what is lost or corrupt (with where its shards are, for a written one).
async fn read_back(
    client: &Client,
    pre: Ino,
    files: usize,
    len: usize,
    wdir: Ino,
    acked: &[(String, u64, usize)],
) -> Vec<String> {
    let mut bad = Vec::new();
    for i in 0..files {
        if let Err(e) = read_file(client, pre, &format!("f{i:04}"), i as u64, len).await {
            bad.push(e);
        }
    }
    for (name, seed, wlen) in acked {
        if let Err(e) = read_file(client, wdir, name, *seed, *wlen).await {
            let why = diagnose(client, wdir, name, *seed, *wlen).await;
            bad.push(format!("{e}; {why}"));
        }
    }
    bad
}

/// The per-phase table on stdout.
fn print_phases(phases: &[Phase]) {
    println!(
        "phase              secs  reads fail  p50 ms   max ms   MiB/s  lookups fail max ms  writes fail  max ms  host gap"
    );
    for p in phases {
        println!(
            "{:<17} {:5.1} {:6} {:4} {:7.1} {:8.1} {:7.1} {:8} {:4} {:6.1} {:7} {:4} {:7.1} {:9.1}",
            p.name,
            p.secs,
            p.reads,
            p.failed_reads,
            p.read_p50_ms,
            p.read_max_ms,
            p.read_mib_s,
            p.lookups,
            p.failed_lookups,
            p.lookup_max_ms,
            p.writes,
            p.failed_writes,
            p.write_max_ms,
            p.host_gap_ms
        );
    }
}

/// What the load tasks share: where they log, when to stop, the run's start, the
/// preloaded files.
struct Load {
    log: Arc<Log>,
    stop: Arc<AtomicBool>,
    t0: Instant,
    files: usize,
    len: usize,
}

impl Load {
    /// Stops the load and waits for its tasks (readers, then the prober, then the
    /// writer): the ones that did not end within a minute.
    async fn stop(&self, tasks: Vec<tokio::task::JoinHandle<()>>, readers: usize) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        let mut hung = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            if tokio::time::timeout(Duration::from_secs(60), t).await.is_err() {
                hung.push(if i == readers + 1 {
                    format!(
                        "writer stuck in {}",
                        STAGES[usize::from(WRITER_STAGE.load(Ordering::Relaxed)) % 5]
                    )
                } else {
                    format!("load task {i} stuck")
                });
            }
        }
        hung
    }

    /// Reader `r`: reads the preloaded files back in a stride of its own until stopped.
    fn reader(&self, c: Client, pre: Ino, r: usize) -> tokio::task::JoinHandle<()> {
        let (log, stop, files, len, t0) = (self.log.clone(), self.stop.clone(), self.files, self.len, self.t0);
        tokio::spawn(async move {
            let mut i = r * 7919;
            while !stop.load(Ordering::Relaxed) {
                i = (i + 13) % files;
                let s = Instant::now();
                let at = t0.elapsed().as_secs_f64();
                let r = read_file(&c, pre, &format!("f{i:04}"), i as u64, len).await;
                let ms = s.elapsed().as_secs_f64() * 1e3;
                if let Err(e) = &r {
                    log.errors.lock().push(format!("{at:.1}s read: {e}"));
                }
                push(
                    &log.reads,
                    Sample {
                        at,
                        ms,
                        ok: r.is_ok(),
                        bytes: len as u64,
                    },
                );
            }
        })
    }

    /// The lookup prober: one lookup of a preloaded name every 2 ms until stopped.
    fn prober(&self, m: MetaClient, pre: Ino) -> tokio::task::JoinHandle<()> {
        let (log, stop, files, t0) = (self.log.clone(), self.stop.clone(), self.files, self.t0);
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i = (i + 1) % files;
                let s = Instant::now();
                let at = t0.elapsed().as_secs_f64();
                let r = m.lookup(pre, format!("f{i:04}").as_bytes()).await;
                if let Err(e) = &r {
                    log.errors.lock().push(format!("{at:.1}s lookup: {e}"));
                }
                let ms = s.elapsed().as_secs_f64() * 1e3;
                push(
                    &log.lookups,
                    Sample {
                        at,
                        ms,
                        ok: r.is_ok(),
                        bytes: 0,
                    },
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    }

    /// The writer: new files of half a preloaded file's size in `wdir`, one after the
    /// other, each acknowledged one logged for the read-back.
    fn writer(&self, c: Client, wdir: Ino) -> tokio::task::JoinHandle<()> {
        let (log, stop, t0) = (self.log.clone(), self.stop.clone(), self.t0);
        let wlen = self.len / 2 + 4321;
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{i:05}");
                let seed = 1_000_000 + i;
                i += 1;
                let s = Instant::now();
                let at = t0.elapsed().as_secs_f64();
                let r = write_file(&c, wdir, &name, seed, wlen).await;
                let ms = s.elapsed().as_secs_f64() * 1e3;
                match &r {
                    Ok(()) => log.acked.lock().push((name, seed, wlen)),
                    Err(e) if WRITER_STAGE.load(Ordering::Relaxed) == 2 => {
                        let ino = Ino(WRITER_INO.load(Ordering::Relaxed));
                        let who = who_has(c.meta(), ino).await;
                        log.errors
                            .lock()
                            .push(format!("{at:.1}s write {name}: {e} in open of {ino}; {who}"));
                    }
                    Err(e) => log.errors.lock().push(format!(
                        "{at:.1}s write {name}: {e} (in {})",
                        STAGES[usize::from(WRITER_STAGE.load(Ordering::Relaxed)) % 5]
                    )),
                }
                push(
                    &log.writes,
                    Sample {
                        at,
                        ms,
                        ok: r.is_ok(),
                        bytes: wlen as u64,
                    },
                );
            }
        })
    }
}

/// Runs the benchmark.
pub async fn run(a: FailoverBenchArgs) -> Result<()> {
    let tmp = scratch_dir()?;
    let mut rig = Rig::start(&a, tmp.path()).await?;
    let load = Load {
        log: Arc::new(Log::default()),
        stop: Arc::new(AtomicBool::new(false)),
        t0: Instant::now(),
        files: a.files,
        len: rig.len,
    };
    let mut tasks: Vec<_> = (0..a.readers)
        .map(|r| load.reader(rig.client.clone(), rig.pre, r))
        .collect();
    tasks.push(load.prober(rig.meta.clone(), rig.pre));
    tasks.push(load.writer(rig.client.clone(), rig.wdir));
    let host = watch_host(load.log.clone(), load.stop.clone(), load.t0);
    let mut faults = rig.faults(&a, load.t0, tmp.path()).await?;
    let hung = load.stop(tasks, a.readers).await;
    let _ = host.join();
    let health_after = cluster_health(&rig.client).await;
    let figures = Figures::of(&load.log, &faults.marks, faults.killed_at);
    let checks = rig.checks(&a, &load.log, &mut faults, tmp.path()).await?;
    rig.cluster.stop();

    let machine = crate::bench::transport::machine();
    let errors = load.log.errors.lock().clone();
    figures.print(&machine, a.readers, &faults, &health_after);
    checks.print(a.files);
    for e in &errors {
        println!("  error: {e}");
    }
    let report = serde_json::json!({
        "bench": "failover", "machine": machine, "files": a.files, "file_kib": a.file_kib,
        "unit_kib": a.unit_kib, "phase_secs": a.phase_secs, "readers": a.readers,
        "phases": figures.phases, "longest_read_stall_ms": figures.stall_ms,
        "median_read_before_ms": figures.median_before_ms, "median_read_after_ms": figures.median_after_ms,
        "worst_lookup_stall_ms": figures.lookup_stall_ms, "degraded_read_ratio": figures.degraded_ratio,
        "degraded2_read_ratio": figures.degraded2_ratio,
        "rebuild": {"bytes": health_after.repair.bytes_total, "bytes_during_faults": faults.repaired_before,
            "mib_s": health_after.repair.bytes_per_sec as f64 / (1u64 << 20) as f64},
        "healed": faults.healed.is_ok(), "heal_secs": faults.heal_secs, "three_down": checks.three,
        "add_node": checks.add, "partitioned_writer": checks.iso, "netns": a.netns,
        "read_back": {"files": checks.files, "verified": checks.verified(), "acked_writes": checks.acked, "bad": checks.bad},
        "errors": errors, "hung": hung,
    });
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
        println!("# wrote {}", p.display());
    }
    verdict(&a, &figures.phases, &errors, faults.healed, hung, checks)
}

/// The run's scratch folder under /var/tmp; `SHINGLE_KEEP_CLUSTER=1` keeps it (node logs,
/// stores) to look into after a run, failed or not.
fn scratch_dir() -> Result<tempfile::TempDir> {
    let mut tmp = tempfile::Builder::new()
        .prefix("shingle-failover-")
        .tempdir_in("/var/tmp")?;
    if std::env::var_os("SHINGLE_KEEP_CLUSTER").is_some() {
        tmp.disable_cleanup(true);
        eprintln!("# keeping {}", tmp.path().display());
    }
    Ok(tmp)
}

/// The cluster under test, its clients, and the three directories of the run: `pre`
/// (the preloaded files), `w` (the writer's) and `iso` (the partitioned writer's).
struct Rig {
    spec: LocalSpec,
    cluster: LocalCluster,
    meta: MetaClient,
    client: Client,
    pre: Ino,
    wdir: Ino,
    iso_dir: Ino,
    /// Bytes per preloaded file.
    len: usize,
}

/// The first data node to fail (partitioned in the rig, killed otherwise) and the second.
const VICTIMS: (u64, u64) = (5, 6);

impl Rig {
    /// Starts 8 nodes (3 managers), makes the run's directories and loads the files.
    async fn start(a: &FailoverBenchArgs, dir: &std::path::Path) -> Result<Rig> {
        let spec = LocalSpec {
            managers: 3,
            partitions: 32,
            zones: (32, "32MiB"),
            log: std::env::var("SHINGLE_NODE_LOG").unwrap_or_else(|_| "warn,openraft=error".into()),
            manager_toml: "down_after_ms = 3000\nheartbeat_pause_ms = 500\nout_after_ms = 6000\n".into(),
            meta_toml: "repair_interval_ms = 2000\nrebuild_rate = \"1GiB\"\n".into(),
            netns: a.netns.clone(),
            ..LocalSpec::new(dir.join("cluster"), 8)
        };
        eprintln!("# starting 8 nodes (3 managers) in {}", spec.dir.display());
        let cluster = LocalCluster::start(&spec)?;
        let meta = cluster.meta_client().await?;
        cluster.wait_ready(&meta, Duration::from_secs(90)).await?;
        let cfg = ClientConfig {
            ec: (4, 2),
            unit: a.unit_kib << 10,
            ..ClientConfig::default()
        };
        let client = Client::new(meta.clone(), cfg);
        let mkdir = async |name: &str| {
            meta.mknod(
                &Creds::root(),
                Ino::ROOT,
                name.as_bytes(),
                FileKind::Dir,
                0o755,
                0,
                None,
            )
            .await
            .map(|a| a.ino)
            .map_err(|e| anyhow::anyhow!("mkdir {name}: {e}"))
        };
        let (pre, wdir, iso_dir) = (mkdir("pre").await?, mkdir("w").await?, mkdir("iso").await?);
        let len = a.file_kib << 10;
        eprintln!("# loading {} files of {} KiB", a.files, a.file_kib);
        for i in 0..a.files {
            write_file(&client, pre, &format!("f{i:04}"), i as u64, len)
                .await
                .map_err(|e| anyhow::anyhow!("load file {i}: {e}"))?;
        }
        Ok(Rig {
            spec,
            cluster,
            meta,
            client,
            pre,
            wdir,
            iso_dir,
            len,
        })
    }

    /// The fault schedule under load: healthy, one node down, two down, both back (until
    /// healthy), the manager leader down, back (until healthy).
    async fn faults(&mut self, a: &FailoverBenchArgs, t0: Instant, dir: &std::path::Path) -> Result<Faults> {
        let phase_len = Duration::from_secs(a.phase_secs);
        let run_phase = async |what: &str| {
            eprintln!("# {what}");
            tokio::time::sleep(phase_len).await;
            t0.elapsed().as_secs_f64()
        };
        let (va, vb) = VICTIMS;
        let mut marks = vec![0.0, run_phase("phase healthy").await];
        // In the rig, node 5 is cut off instead of killed, with a writer inside it.
        let iso_child = match &a.netns {
            Some(prefix) => Some(self.start_iso_writer(prefix, dir).await?),
            None => None,
        };
        let cut_ms = wall_ms();
        self.set_first_victim(a, false)?;
        let killed_at = t0.elapsed().as_secs_f64();
        marks.push(
            run_phase(if a.netns.is_some() {
                "phase one-data-down: node 5 partitioned"
            } else {
                "phase one-data-down: node 5 killed"
            })
            .await,
        );
        self.cluster.nodes[vb as usize - 1].kill();
        marks.push(run_phase("phase two-data-down: node 6 killed").await);
        let repaired_before = cluster_health(&self.client).await.repair.bytes_total;
        eprintln!("# restarting nodes {va}, {vb}");
        let heal_ms = wall_ms();
        self.set_first_victim(a, true)?;
        self.cluster.nodes[vb as usize - 1].restart(&self.spec)?;
        let heal_started = Instant::now();
        let mut healed = wait_healthy(&self.client, Duration::from_secs(a.heal_secs)).await;
        let heal_secs = heal_started.elapsed().as_secs_f64();
        marks.push(t0.elapsed().as_secs_f64());
        let lead = leader(&self.meta, &self.cluster.managers)
            .await
            .context("no manager leader")?;
        let lead_kill_ms = wall_ms();
        self.cluster.nodes[lead as usize - 1].kill();
        marks.push(run_phase(&format!("phase leader-down: manager {lead} killed")).await);
        eprintln!("# restarting node {lead}");
        let lead_restart_ms = wall_ms();
        self.cluster.nodes[lead as usize - 1].restart(&self.spec)?;
        if let Err(e) = wait_healthy(&self.client, Duration::from_secs(a.heal_secs)).await {
            healed = healed.and(Err(e));
        }
        marks.push(t0.elapsed().as_secs_f64());
        Ok(Faults {
            marks,
            killed_at,
            healed,
            heal_secs,
            repaired_before,
            times: CutTimes {
                cut_ms,
                heal_ms,
                lead,
                lead_kill_ms,
                lead_restart_ms,
            },
            iso_child,
        })
    }

    /// Takes the first victim away (`up` false) or brings it back: its link in the rig,
    /// the process otherwise.
    fn set_first_victim(&mut self, a: &FailoverBenchArgs, up: bool) -> Result<()> {
        let node = &mut self.cluster.nodes[VICTIMS.0 as usize - 1];
        match (&a.netns, up) {
            (Some(prefix), _) => set_link(prefix, VICTIMS.0, up),
            (None, false) => {
                node.kill();
                Ok(())
            }
            (None, true) => node.restart(&self.spec),
        }
    }

    /// Starts `bench iso-writer` inside the first victim's host and gives it a moment.
    async fn start_iso_writer(&self, prefix: &str, dir: &std::path::Path) -> Result<std::process::Child> {
        let exe = std::env::current_exe()?;
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &format!("{prefix}h{}", VICTIMS.0)])
            .arg(exe)
            .args(["bench", "iso-writer", "--cluster-file"])
            .arg(&self.cluster.cluster_file)
            .arg("--secret-file")
            .arg(&self.cluster.secret_file)
            .arg("--acks")
            .arg(dir.join("iso-acks.txt"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("iso-writer.log"))?)
            .spawn()
            .context("start the writer inside the partitioned host")?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(child)
    }

    /// With the load stopped: three nodes down, a node added, everything read back, the
    /// partitioned writer's acknowledgements checked, every name its own inode.
    async fn checks(
        &mut self,
        a: &FailoverBenchArgs,
        log: &Log,
        faults: &mut Faults,
        dir: &std::path::Path,
    ) -> Result<Checks> {
        // Three down: a clear EIO, promptly; nothing lost once they return.
        let (three, mut err) = if faults.healed.is_ok() {
            let (pre, len) = (self.pre, self.len);
            three_down(
                &mut self.cluster,
                &self.spec,
                &self.client,
                pre,
                a.files,
                len,
                a.heal_secs,
            )
            .await?
        } else {
            (serde_json::json!(null), None)
        };
        // A node joins: it should get about 1/N of the partition replicas and shards,
        // moved online and throttled by the repair scans.
        let mut add = serde_json::json!(null);
        if err.is_none() {
            let (report, e) = add_node(&mut self.cluster, &self.spec, &self.client, a.heal_secs).await?;
            add = report;
            err = e;
        }
        let acked = log.acked.lock().clone();
        let mut bad = read_back(&self.client, self.pre, a.files, self.len, self.wdir, &acked).await;
        // The writer inside the partitioned host: nothing acknowledged while it was cut
        // off (a write begun just before the cut may finish), and everything it had
        // acknowledged is there.
        let mut iso = serde_json::json!(null);
        if let Some(c) = faults.iso_child.take() {
            let (acks, log) = (dir.join("iso-acks.txt"), dir.join("iso-writer.log"));
            let (report, found) = check_iso_writer(c, &acks, &log, &self.client, self.iso_dir, &faults.times).await;
            iso = report;
            bad.extend(found);
        }
        bad.extend(shared_inodes(&self.meta, &[self.pre, self.wdir]).await);
        Ok(Checks {
            three,
            three_err: err,
            add,
            iso,
            files: a.files + acked.len(),
            acked: acked.len(),
            bad,
        })
    }
}

/// What the fault schedule did and saw.
struct Faults {
    /// Seconds since the load started at which each phase ended (the first is 0).
    marks: Vec<f64>,
    /// When the first node went.
    killed_at: f64,
    /// Whether the cluster became healthy after both returns, and in how long after the
    /// first.
    healed: Result<f64>,
    heal_secs: f64,
    /// Bytes rebuilt before the nodes returned.
    repaired_before: u64,
    times: CutTimes,
    /// The writer inside the partitioned host, in the rig.
    iso_child: Option<std::process::Child>,
}

/// The figures of the loaded phases.
struct Figures {
    phases: Vec<Phase>,
    stall_ms: f64,
    lookup_stall_ms: f64,
    median_before_ms: f64,
    median_after_ms: f64,
    /// Scan throughput with one and with two nodes down, as a ratio to healthy (the
    /// second phase also sees the first node's shards rebuilt once it is Out).
    degraded_ratio: f64,
    degraded2_ratio: f64,
}

impl Figures {
    fn of(log: &Log, marks: &[f64], killed_at: f64) -> Figures {
        let names = [
            "healthy",
            "one-data-down",
            "two-data-down",
            "restart-two",
            "leader-down",
            "restart-leader",
        ];
        let phases: Vec<Phase> = names
            .iter()
            .enumerate()
            .map(|(i, n)| phase(n, log, marks[i], marks[i + 1]))
            .collect();
        let faults = [&phases[1], &phases[2], &phases[4]];
        let median_of = |from: f64, to: f64| {
            let mut ms: Vec<f64> = log
                .reads
                .lock()
                .iter()
                .filter(|s| s.at >= from && s.at < to)
                .map(|s| s.ms)
                .collect();
            super::median(&mut ms)
        };
        Figures {
            stall_ms: faults.iter().map(|p| p.read_max_ms).fold(0.0, f64::max),
            lookup_stall_ms: faults.iter().map(|p| p.lookup_max_ms).fold(0.0, f64::max),
            median_before_ms: median_of(f64::MIN, killed_at),
            median_after_ms: median_of(killed_at, marks[3]),
            degraded_ratio: phases[1].read_mib_s / phases[0].read_mib_s.max(1e-9),
            degraded2_ratio: phases[2].read_mib_s / phases[0].read_mib_s.max(1e-9),
            phases,
        }
    }

    fn print(&self, machine: &str, readers: usize, faults: &Faults, after: &crate::cli::Health) {
        println!(
            "# failover ({machine}): 8 nodes, 3 managers, ec(4,2), {readers} readers + 1 writer + 1 lookup prober"
        );
        print_phases(&self.phases);
        println!(
            "longest read stall {:.1} ms (target <= 100); median read {:.1} ms before, {:.1} ms after the first kill",
            self.stall_ms, self.median_before_ms, self.median_after_ms
        );
        println!(
            "worst lookup stall {:.1} ms; scan throughput {:.2}x healthy with one node down, {:.2}x with two",
            self.lookup_stall_ms, self.degraded_ratio, self.degraded2_ratio
        );
        println!(
            "rebuilt {:.1} MiB at {:.1} MiB/s (repair scan's own rate); healthy {:.1} s after restart",
            after.repair.bytes_total as f64 / (1u64 << 20) as f64,
            after.repair.bytes_per_sec as f64 / (1u64 << 20) as f64,
            faults.heal_secs
        );
    }
}

/// What the checks after the load found.
struct Checks {
    three: serde_json::Value,
    three_err: Option<String>,
    add: serde_json::Value,
    iso: serde_json::Value,
    /// Files read back (preloaded and acknowledged written) and how many were written.
    files: usize,
    acked: usize,
    /// Lost or corrupt files, acknowledgements broken, names sharing an inode.
    bad: Vec<String>,
}

impl Checks {
    fn verified(&self) -> usize {
        self.files.saturating_sub(self.bad.len())
    }

    fn print(&self, preloaded: usize) {
        println!("three down: {}", self.three);
        println!("add node: {} (ideal share 1/N)", self.add);
        println!(
            "read-back: {} of {} files verified ({} acknowledged writes), {} bad",
            self.verified(),
            preloaded + self.acked,
            self.acked,
            self.bad.len()
        );
        for b in &self.bad {
            println!("  bad: {b}");
        }
    }
}

/// Fails the run when an invariant broke, or (with a distinct exit) when only the stall
/// bounds were missed.
fn verdict(
    a: &FailoverBenchArgs,
    phases: &[Phase],
    errors: &[String],
    healed: Result<f64>,
    hung: Vec<String>,
    checks: Checks,
) -> Result<()> {
    let failed: usize = phases
        .iter()
        .map(|p| p.failed_reads + p.failed_lookups + p.failed_writes)
        .sum();
    let mut problems = Vec::new();
    if failed > 0 {
        problems.push(format!(
            "{failed} operations failed with at most two nodes down: {:?}",
            errors.iter().take(5).collect::<Vec<_>>()
        ));
    }
    if let Err(e) = healed {
        problems.push(e.to_string());
    }
    problems.extend(hung);
    problems.extend(checks.three_err);
    if !checks.bad.is_empty() {
        problems.push(format!(
            "{} files lost or corrupt: {:?}",
            checks.bad.len(),
            checks.bad.iter().take(5).collect::<Vec<_>>()
        ));
    }
    if !problems.is_empty() {
        bail!("failover invariants broken:\n  {}", problems.join("\n  "));
    }
    let stalls = stall_problems(&phases[1..], a.max_read_stall_ms, a.max_write_stall_ms);
    if !stalls.is_empty() {
        return Err(StallBoundsMissed(stalls).into());
    }
    Ok(())
}

/// The run kept every invariant (no failed operation, nothing lost) but an operation
/// took longer than `--max-read-stall-ms` / `--max-write-stall-ms`. The command exits
/// with [`STALL_EXIT`] for it, so a script can tell a slow run on a busy machine from
/// a broken one.
#[derive(Debug)]
pub struct StallBoundsMissed(pub Vec<String>);

/// The exit code of a run that missed only its stall bounds.
pub const STALL_EXIT: i32 = 3;

impl std::fmt::Display for StallBoundsMissed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stall bounds missed (every invariant held):\n  {}",
            self.0.join("\n  ")
        )
    }
}

impl std::error::Error for StallBoundsMissed {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stall_bounds_name_each_phase_and_operation_that_broke_them() {
        let phases = [
            Phase {
                name: "one-data-down",
                read_max_ms: 99.0,
                lookup_max_ms: 120.0,
                write_max_ms: 400.0,
                ..Phase::default()
            },
            Phase {
                name: "leader-down",
                read_max_ms: 101.0,
                lookup_max_ms: 3.0,
                write_max_ms: 501.0,
                host_gap_ms: 42.0,
                ..Phase::default()
            },
        ];
        assert!(stall_problems(&phases, None, None).is_empty());
        let got = stall_problems(&phases, Some(100.0), Some(500.0));
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].starts_with("one-data-down: a lookup took 120.0 ms"), "{got:?}");
        assert!(got[1].starts_with("leader-down: a read took 101.0 ms"), "{got:?}");
        assert!(got[2].starts_with("leader-down: a write took 501.0 ms"), "{got:?}");
        // The phase's host scheduling gap is named beside the miss, where there was one.
        assert!(got[2].ends_with("not run for up to 42.0 ms in the phase"), "{got:?}");
        assert!(got[0].ends_with("(bound 100 ms)"), "{got:?}");
        assert_eq!(stall_problems(&phases, Some(200.0), Some(600.0)), Vec::<String>::new());
    }
}
