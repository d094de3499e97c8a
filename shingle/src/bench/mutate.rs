//! `shingle bench mutate`: metadata mutations through a real FUSE mount of a local
//! cluster, against the same operations on a local directory in the same run.
//!
//! - **latency**: one thread, `ops` of each operation in turn — create (open with
//!   `O_CREAT` + close), chmod, chown, utime, rename within one directory, unlink,
//!   mkdir, rmdir, and stat for comparison, and stat of one missing name again and
//!   again (lookups that find nothing, as Python's import probes). p50 and p99 per
//!   operation.
//! - **tree**: a source tree of `tree` entries (files of 4 KiB in directories of 100)
//!   on the local disk, copied in with `cp -a`, listed with `ls -lR` once the kernel's
//!   entries from the copy have expired (the mount's TTL), then removed with `rm -rf`
//!   once the kernel's caches are dropped (a tree not listed a moment ago: right after
//!   a listing the kernel serves its cached copy of it, which brings no entries, and
//!   looks every name up). Seconds; on the mount also the seconds from the start of
//!   `rm -rf` until `df` shows the tree's space free again (the purges of its files).
//! - **storm**: `threads` threads each create, then delete, `files` empty files in a
//!   directory of their own (the mdtest shape). Creates/s and unlinks/s.
//! - **where the time goes**: around each latency phase on the mount, the metrics every
//!   process already keeps (the mount's FUSE requests and calls, every node's handled
//!   requests and metadata-store fsyncs) are read, and their change per operation is
//!   printed: how many of each, and their mean time.

use super::transport::machine;
use crate::local::{LocalSpec, start_mounted};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Options of the mutation benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct MutateBenchArgs {
    /// Operations of each kind in the latency run.
    #[arg(long, default_value_t = 300)]
    pub ops: usize,
    /// Entries of the tree copied with `cp -a` and removed with `rm -rf`.
    #[arg(long, default_value_t = 2_000)]
    pub tree: usize,
    /// Threads of the create/unlink storm.
    #[arg(long, default_value_t = 16)]
    pub threads: usize,
    /// Files each storm thread creates and deletes.
    #[arg(long, default_value_t = 250)]
    pub files: usize,
    /// Local directory for the baseline (default: a temporary folder in /var/tmp).
    #[arg(long)]
    pub local: Option<PathBuf>,
    /// The mount's negative-entry TTL in seconds (0: every lookup of a missing name
    /// asks the cluster).
    #[arg(long, default_value_t = 1.0)]
    pub negative_ttl: f64,
}

/// Operations of the latency run, in the order they run.
const OPS: [&str; 10] = [
    "create",
    "chmod",
    "chown",
    "utime",
    "rename",
    "unlink",
    "mkdir",
    "rmdir",
    "stat",
    "stat-missing",
];

#[derive(Debug, Default, Clone)]
struct Side {
    /// (p50, p99) µs per entry of [`OPS`].
    latency: Vec<(u64, u64)>,
    cp_s: f64,
    ls_s: f64,
    rm_s: f64,
    /// From the start of `rm -rf` until `statfs` shows the tree's space free again
    /// (the mount only: a local file system frees it at once).
    space_s: Option<f64>,
    creates_s: f64,
    unlinks_s: f64,
}

fn pct(v: &mut [u64], q: f64) -> u64 {
    v.sort_unstable();
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(0)
}

fn timed(samples: &mut Vec<u64>, f: impl FnOnce() -> std::io::Result<()>) -> Result<()> {
    let t = Instant::now();
    f()?;
    samples.push(t.elapsed().as_micros() as u64);
    Ok(())
}

/// Called after each measured phase with its name and how many operations (or
/// entries) it did.
type After<'a> = &'a mut dyn FnMut(&str, usize);

fn latency(root: &Path, n: usize, after: After) -> Result<Vec<(u64, u64)>> {
    let dir = root.join("lat");
    fs::create_dir_all(&dir)?;
    let path = |i: usize| dir.join(format!("f{i:06}"));
    let moved = |i: usize| dir.join(format!("g{i:06}"));
    let sub = |i: usize| dir.join(format!("d{i:06}"));
    let mut all: Vec<Vec<u64>> = vec![Vec::with_capacity(n); OPS.len()];
    for i in 0..n {
        timed(&mut all[0], || fs::File::create(path(i)).map(drop))?;
    }
    after(OPS[0], n);
    for i in 0..n {
        timed(&mut all[1], || {
            fs::set_permissions(path(i), fs::Permissions::from_mode(0o600))
        })?;
    }
    after(OPS[1], n);
    for i in 0..n {
        timed(&mut all[2], || {
            std::os::unix::fs::chown(path(i), Some(1000), Some(1000))
        })?;
    }
    after(OPS[2], n);
    for i in 0..n {
        let f = fs::File::options().write(true).open(path(i))?;
        let when = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + i as u64);
        timed(&mut all[3], || {
            f.set_times(fs::FileTimes::new().set_modified(when).set_accessed(when))
        })?;
    }
    after(OPS[3], n);
    for i in 0..n {
        timed(&mut all[4], || fs::rename(path(i), moved(i)))?;
    }
    after(OPS[4], n);
    for i in 0..n {
        timed(&mut all[5], || fs::remove_file(moved(i)))?;
    }
    after(OPS[5], n);
    for i in 0..n {
        timed(&mut all[6], || fs::create_dir(sub(i)))?;
    }
    after(OPS[6], n);
    for i in 0..n {
        timed(&mut all[7], || fs::remove_dir(sub(i)))?;
    }
    after(OPS[7], n);
    for _ in 0..n {
        timed(&mut all[8], || fs::metadata(&dir).map(drop))?;
    }
    after(OPS[8], n);
    // The same missing name again and again, as Python's import path probes do.
    let absent = dir.join("absent");
    for _ in 0..n {
        timed(&mut all[9], || match fs::metadata(&absent) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Ok(_) => Err(std::io::Error::other("a name never created exists")),
            Err(e) => Err(e),
        })?;
    }
    after(OPS[9], n);
    fs::remove_dir(&dir)?;
    Ok(all.iter_mut().map(|v| (pct(v, 0.5), pct(v, 0.99))).collect())
}

/// A tree of `entries` entries: directories of 100 entries, files of 4 KiB.
fn make_tree(src: &Path, entries: usize) -> Result<()> {
    let _ = fs::remove_dir_all(src);
    fs::create_dir_all(src)?;
    let data = vec![7u8; 4096];
    let mut made = 0;
    let mut d = 0;
    while made < entries {
        let dir = src.join(format!("dir{d:04}"));
        fs::create_dir(&dir)?;
        made += 1;
        for f in 0..99 {
            if made >= entries {
                break;
            }
            fs::write(dir.join(format!("file{f:03}.bin")), &data)?;
            made += 1;
        }
        d += 1;
    }
    Ok(())
}

fn run_cmd(cmd: &mut Command) -> Result<f64> {
    let t = Instant::now();
    let st = cmd.status().with_context(|| format!("{cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed: {st}");
    }
    Ok(t.elapsed().as_secs_f64())
}

fn storm(root: &Path, threads: usize, files: usize) -> Result<(f64, f64)> {
    let dirs: Vec<PathBuf> = (0..threads).map(|t| root.join(format!("storm{t:02}"))).collect();
    for d in &dirs {
        fs::create_dir_all(d)?;
    }
    let phase = |create: bool| -> Result<f64> {
        let t = Instant::now();
        std::thread::scope(|s| {
            let handles: Vec<_> = dirs
                .iter()
                .map(|d| {
                    s.spawn(move || -> std::io::Result<()> {
                        for i in 0..files {
                            let p = d.join(format!("e{i:06}"));
                            if create {
                                fs::File::create(&p)?;
                            } else {
                                fs::remove_file(&p)?;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join().map_err(|_| anyhow::anyhow!("a storm thread panicked"))??;
            }
            Ok::<_, anyhow::Error>(())
        })?;
        Ok((threads * files) as f64 / t.elapsed().as_secs_f64())
    };
    let creates = phase(true)?;
    let unlinks = phase(false)?;
    for d in &dirs {
        if let Err(e) = fs::remove_dir(d) {
            // Every name was removed: say what the directory still shows.
            let left: Vec<String> = fs::read_dir(d)
                .map(|r| {
                    r.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            bail!(
                "rmdir {} after removing every name in it: {e}; it lists {left:?}",
                d.display()
            );
        }
    }
    Ok((creates, unlinks))
}

/// Bytes in use on the file system of `p`, as `df` shows them.
fn used_bytes(p: &Path) -> Result<u64> {
    let out = Command::new("stat").args(["-f", "-c", "%b %f %S"]).arg(p).output()?;
    if !out.status.success() {
        bail!("stat -f {}: {}", p.display(), String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let n: Vec<u64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    let [blocks, free, size] = n[..] else {
        bail!("stat -f {}: unexpected output {text:?}", p.display());
    };
    Ok(blocks.saturating_sub(free) * size)
}

/// Seconds until the space in use on `root` is back to `base` (within 1 MiB), at
/// most a minute.
fn space_back(root: &Path, base: u64) -> Result<f64> {
    let t = Instant::now();
    while used_bytes(root)? > base + (1 << 20) {
        if t.elapsed() > Duration::from_secs(60) {
            bail!("the removed tree's space was not back within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(t.elapsed().as_secs_f64())
}

fn measure(root: &Path, src: &Path, a: &MutateBenchArgs, space: bool, after: After) -> Result<Side> {
    let latency = latency(root, a.ops, after)?;
    let base = if space { Some(used_bytes(root)?) } else { None };
    let dst = root.join("tree");
    let cp_s = run_cmd(Command::new("cp").arg("-a").arg(src).arg(&dst))?;
    after("cp -a", a.tree);
    // What a user listing the tree later sees: nothing of the copy left in the kernel.
    std::thread::sleep(Duration::from_millis(1_200));
    let ls_s = run_cmd(
        Command::new("ls")
            .arg("-lR")
            .arg(&dst)
            .stdout(std::process::Stdio::null()),
    )?;
    after("ls -lR", a.tree);
    super::drop_kernel_caches();
    let rm_s = run_cmd(Command::new("rm").arg("-rf").arg(&dst))?;
    after("rm -rf", a.tree);
    let space_s = match base {
        Some(b) => Some(rm_s + space_back(root, b)?),
        None => None,
    };
    let (creates_s, unlinks_s) = storm(root, a.threads, a.files)?;
    Ok(Side {
        latency,
        cp_s,
        ls_s,
        rm_s,
        space_s,
        creates_s,
        unlinks_s,
    })
}

/// Runs the benchmark and prints a table (and one JSON line).
pub async fn run(a: MutateBenchArgs) -> Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("shingle-mutate-")
        .tempdir_in("/var/tmp")?;
    let local = a.local.clone().unwrap_or_else(|| tmp.path().join("local"));
    fs::create_dir_all(&local)?;
    let src = tmp.path().join("src");
    make_tree(&src, a.tree)?;
    let mnt = tmp.path().join("mnt");
    fs::create_dir_all(&mnt)?;
    // Node i serves its metrics on base + i (base out of the way of other runs).
    let metrics_base = 20_000 + (std::process::id() % 2_000) as u16 * 10;
    let spec = LocalSpec {
        metrics_port: Some(metrics_base),
        ..LocalSpec::new(tmp.path().join("cluster"), 6)
    };
    let (mut cluster, session) = start_mounted(
        &spec,
        &mnt,
        &shingle_client::MountConfig {
            negative_ttl: Duration::from_secs_f64(a.negative_ttl.max(0.0)),
            ..shingle_client::MountConfig::default()
        },
    )
    .await?;
    let a2 = a.clone();
    let (l2, m3, s2) = (local.clone(), mnt.clone(), src.clone());
    let nodes: Vec<u16> = (1..=spec.nodes as u16 + 1).map(|i| metrics_base + i).collect();
    let result = tokio::task::spawn_blocking(move || -> Result<(Side, Side, Vec<String>)> {
        let local = measure(&l2, &s2, &a2, false, &mut |_, _| {})?;
        let mut last = snapshot(&nodes);
        let mut lines = Vec::new();
        let shingle = measure(&m3, &s2, &a2, true, &mut |op, n| {
            let now = snapshot(&nodes);
            lines.push(breakdown(op, &last, &now, n as f64));
            last = now;
        })?;
        Ok((local, shingle, lines))
    })
    .await?;
    let _ = tokio::task::spawn_blocking(move || session.umount_and_join()).await?;
    cluster.stop();
    if let Err(e) = &result {
        // The nodes' logs and stores, for whoever looks into the failure.
        eprintln!(
            "bench mutate failed ({e}); its cluster is kept in {}",
            tmp.keep().display()
        );
    }
    let (local, shingle, lines) = result?;
    report(&a, &local, &shingle, &lines);
    Ok(())
}

/// The table, the per-operation breakdown and the JSON line on stdout.
fn report(a: &MutateBenchArgs, local: &Side, shingle: &Side, lines: &[String]) {
    println!(
        "# metadata mutations ({}), 6-node dev cluster, R = 3, through FUSE",
        machine()
    );
    println!(
        "# latency: {} of each, one thread; tree: {} entries (4 KiB files); storm: {} threads x {} files",
        a.ops, a.tree, a.threads, a.files
    );
    println!("# negative-entry TTL of the mount: {} s", a.negative_ttl);
    println!("op            local p50/p99 us    shingle p50/p99 us    p50 ratio");
    for (i, op) in OPS.iter().enumerate() {
        let (l, s) = (local.latency[i], shingle.latency[i]);
        println!(
            "{op:12} {:>8}/{:<8}     {:>8}/{:<8}   {:8.1}",
            l.0,
            l.1,
            s.0,
            s.1,
            s.0 as f64 / (l.0.max(1)) as f64
        );
    }
    println!("cp -a s       {:17.2}     {:17.2}", local.cp_s, shingle.cp_s);
    println!("ls -lR s      {:17.2}     {:17.2}", local.ls_s, shingle.ls_s);
    println!("rm -rf s      {:17.2}     {:17.2}", local.rm_s, shingle.rm_s);
    println!(
        "space back s  {:>17}     {:17.2}",
        "-",
        shingle.space_s.unwrap_or(f64::NAN)
    );
    println!("creates/s     {:17.0}     {:17.0}", local.creates_s, shingle.creates_s);
    println!("unlinks/s     {:17.0}     {:17.0}", local.unlinks_s, shingle.unlinks_s);
    println!("# where the time goes, per operation (cp -a, ls -lR, rm -rf: per entry) on the mount: count x mean ms");
    for l in lines {
        println!("{l}");
    }
    println!(
        "{}",
        serde_json::json!({
            "bench": "mutate", "ops": a.ops, "tree": a.tree, "threads": a.threads, "files": a.files,
            "local": local.json(), "shingle": shingle.json(),
        })
    );
}

impl Side {
    fn json(&self) -> serde_json::Value {
        let lat: serde_json::Map<String, serde_json::Value> = OPS
            .iter()
            .zip(&self.latency)
            .map(|(op, (p50, p99))| (op.to_string(), serde_json::json!([p50, p99])))
            .collect();
        serde_json::json!({
            "latency_us": lat, "cp_s": self.cp_s, "ls_s": self.ls_s, "rm_s": self.rm_s, "space_s": self.space_s,
            "creates_s": self.creates_s, "unlinks_s": self.unlinks_s,
        })
    }
}

/// Sums and counts of every histogram series (and counter values, as sums), by
/// "family{labels}", over this process and the nodes' `/metrics` on `ports`.
type Snapshot = BTreeMap<String, (f64, f64)>;

fn parse_into(text: &str, out: &mut Snapshot) {
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else { continue };
        let (name, labels) = match key.find('{') {
            Some(i) => (&key[..i], &key[i..]),
            None => (key, ""),
        };
        if let Some(base) = name.strip_suffix("_sum") {
            out.entry(format!("{base}{labels}")).or_default().0 += v;
        } else if let Some(base) = name.strip_suffix("_count") {
            out.entry(format!("{base}{labels}")).or_default().1 += v;
        } else if let Some(base) = name.strip_suffix("_total") {
            out.entry(format!("{base}{labels}")).or_default().1 += v;
        }
    }
}

fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return String::new();
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

fn snapshot(ports: &[u16]) -> Snapshot {
    let mut out = Snapshot::new();
    parse_into(&shingle_metrics::render(), &mut out);
    for p in ports {
        // Node series are told apart from the mount's by a prefix.
        let mut node = Snapshot::new();
        parse_into(&scrape(*p), &mut node);
        for (k, (sum, count)) in node {
            let e = out.entry(format!("node:{k}")).or_default();
            e.0 += sum;
            e.1 += count;
        }
    }
    out
}

/// One line: what changed between `before` and `after`, per operation of `n`.
fn breakdown(op: &str, before: &Snapshot, after: &Snapshot, n: f64) -> String {
    let wanted = [
        ("shingle_fs_op_seconds", "fuse"),
        ("shingle_rpc_client_seconds", "mount calls"),
        ("node:shingle_rpc_server_seconds", "nodes handled"),
        ("node:shingle_meta_store_commit_seconds", "fsyncs"),
    ];
    let mut parts = Vec::new();
    for (family, title) in wanted {
        let mut items = Vec::new();
        for (k, (sum, count)) in after.range(family.to_string()..) {
            let Some(rest) = k.strip_prefix(family) else { break };
            if !(rest.is_empty() || rest.starts_with('{')) {
                continue;
            }
            let (s0, c0) = before.get(k).copied().unwrap_or_default();
            let (ds, dc) = (sum - s0, count - c0);
            if dc / n < 0.05 {
                continue;
            }
            let label = rest
                .trim_matches(|c| c == '{' || c == '}')
                .split(',')
                .filter(|l| !l.starts_with("fabric="))
                .map(|l| l.split_once('=').map_or(l, |(_, v)| v).trim_matches('"'))
                .collect::<Vec<_>>()
                .join("/");
            let label = if label.is_empty() { "all".to_string() } else { label };
            items.push(format!("{label} {:.1}x{:.2}", dc / n, ds / dc.max(1.0) * 1e3));
        }
        if !items.is_empty() {
            parts.push(format!("{title}: {}", items.join(", ")));
        }
    }
    format!("{op:7} {}", parts.join("; "))
}
