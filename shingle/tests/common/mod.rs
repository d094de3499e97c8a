//! What the integration tests share: a cluster of real `shingle serve` processes
//! (`Cluster`, through `shingle::local`), a lone node (`spawn`), `shingle dev` with its
//! mount (`DevMount`), another mount of a cluster (`SecondMount`), the command-line
//! tools (`tool`, `json`), test data (`pattern`), on-disk corruption
//! (`corrupt_first_record`) and the nodes' metrics endpoints (`free_run`, `http_get`).
#![allow(dead_code)]

use shingle::local::{LocalCluster, LocalSpec};
use shingle_meta::meta_client::MetaClient;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;
use std::time::Instant;

/// Starts `shingle serve` and waits for its "listening" line.
pub fn spawn(config: &Path) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shingle"))
        .args(["serve", "--config"])
        .arg(config)
        .env(
            "SHINGLE_LOG",
            std::env::var("SHINGLE_LOG").unwrap_or_else(|_| "warn,openraft=error,shingle_meta::manager=info".into()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn shingle serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read startup line");
    let addr = line
        .trim()
        .strip_prefix(shingle::banner::LISTENING)
        .unwrap_or_else(|| panic!("unexpected startup line: {line:?}"))
        .parse()
        .expect("address");
    (child, addr)
}

/// What a test's cluster is: node processes on 127.0.0.1 started through
/// `shingle::local` (the starter `shingle dev` and the benchmarks use), with the
/// binary under test, logs on the test's stderr and 32 placement groups.
pub struct Spec {
    pub nodes: usize,
    pub managers: usize,
    pub data: bool,
    pub partitions: u32,
    pub down_after_ms: u64,
    /// Lines of each node's `[data]` section besides the zones.
    pub data_toml: &'static str,
    /// Extra lines of each node's `[node]` section.
    pub node_toml: &'static str,
    /// Extra lines of each manager's `[manager]` section.
    pub manager_toml: &'static str,
    /// Zones per data node and their size.
    pub zones: (u32, &'static str),
}

impl Spec {
    /// `nodes` data and metadata nodes, one manager, 8 partitions, Down after 3 s,
    /// 10 zones of 8 MiB each (small enough to fill).
    pub fn small(nodes: usize) -> Spec {
        Spec {
            nodes,
            managers: 1,
            data: true,
            partitions: 8,
            down_after_ms: 3000,
            data_toml: "",
            zones: (10, "8MiB"),
            node_toml: "",
            manager_toml: "",
        }
    }
}

/// A running test cluster and the spec it was started from.
pub struct Cluster {
    pub local: LocalCluster,
    pub spec: LocalSpec,
}

impl Cluster {
    pub fn start(root: &Path, s: Spec) -> Cluster {
        Cluster::start_with_meta(root, s, "")
    }

    /// [`Cluster::start`] with extra lines in each node's `[meta]` section.
    pub fn start_with_meta(root: &Path, s: Spec, meta_toml: &str) -> Cluster {
        Cluster::start_full(root, s, meta_toml, None)
    }

    /// [`Cluster::start`] with node `id` serving its metrics on port `base + id`
    /// ([`free_run`] finds such ports).
    pub fn start_with_metrics(root: &Path, s: Spec, base: u16) -> Cluster {
        Cluster::start_full(root, s, "", Some(base))
    }

    fn start_full(root: &Path, s: Spec, meta_toml: &str, metrics_port: Option<u16>) -> Cluster {
        let spec = LocalSpec {
            metrics_port,
            meta_toml: meta_toml.into(),
            managers: s.managers,
            data: s.data,
            partitions: s.partitions,
            zones: s.zones,
            manager_toml: format!("down_after_ms = {}\n{}", s.down_after_ms, s.manager_toml),
            bin: Some(env!("CARGO_BIN_EXE_shingle").into()),
            pgs: Some(32),
            node_toml: s.node_toml.into(),
            data_toml: s.data_toml.into(),
            logs_to_stderr: true,
            log: std::env::var("SHINGLE_LOG")
                .unwrap_or_else(|_| "warn,openraft=error,shingle_meta::manager=info".into()),
            ..LocalSpec::new(root.to_path_buf(), s.nodes)
        };
        let local = LocalCluster::start(&spec).expect("start the cluster");
        Cluster { local, spec }
    }

    /// Where the cluster file, the secret and each node's folder (`node{id}`) are.
    pub fn root(&self) -> &Path {
        &self.spec.dir
    }

    pub async fn client(&self) -> MetaClient {
        self.local.meta_client().await.expect("a client of the cluster")
    }

    /// Waits until every node is Up and every partition has a serving primary.
    pub async fn wait_ready(&self, c: &MetaClient) {
        self.local
            .wait_ready(c, Duration::from_secs(60))
            .await
            .expect("cluster ready");
    }

    /// Node `i` (0-based) started again after a kill.
    pub fn restart(&mut self, i: usize) {
        self.local.nodes[i].restart(&self.spec).expect("restart the node");
    }
}

/// Flips a byte inside the first record of the first non-empty zone file under `zones`
/// (a data node's emulated device): that shard's checksum no longer matches.
pub fn corrupt_first_record(zones: &Path) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(zones)
        .expect("zones dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("zone-") && !n.to_string_lossy().contains('.'))
        })
        .collect();
    files.sort();
    for f in files {
        let mut bytes = std::fs::read(&f).expect("zone file");
        if bytes.len() > 200 {
            bytes[64 + 100] ^= 0x5a;
            std::fs::write(&f, bytes).expect("write zone file");
            return;
        }
    }
    panic!("no record to corrupt in {}", zones.display());
}

/// `len` pseudo-random bytes determined by `seed`: file contents a test can write and
/// check again without keeping them.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    shingle_testkit::bytes(seed, len)
}

/// Runs a `shingle` tool command (`put`, `fsck`, `status`, ...) against the cluster made
/// in `root` by [`Cluster::start`].
pub fn tool(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shingle"))
        .args(args)
        .arg("--cluster-file")
        .arg(root.join("cluster.toml"))
        .arg("--secret-file")
        .arg(root.join("secret"))
        .env("SHINGLE_LOG", "error")
        .output()
        .expect("run shingle")
}

/// A tool's JSON output (`--json`), or a panic naming what it printed.
pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {:?} stderr {:?}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// A `shingle dev` process (a local cluster and its FUSE mount), started and stopped
/// the way a user does: it is ready when it prints [`shingle::banner::MOUNTED`], and
/// Ctrl-C (SIGINT) unmounts and stops it.
pub struct DevMount {
    child: Option<Child>,
    /// The cluster's data folder.
    pub data: PathBuf,
    /// Nodes this test restarted after killing them (dev no longer owns them).
    revived: Vec<Child>,
    /// The mount point.
    pub mount: PathBuf,
    /// What it printed on stdout up to and including the "mounted" line.
    pub banner: Vec<String>,
}

impl DevMount {
    /// Starts `shingle dev --data DATA --mount MOUNT ARGS..` with quiet logs on stderr;
    /// `configure` may add to the command (environment, stderr). Waits up to 180 s for
    /// the mount; stdout is drained afterwards so the process never blocks on it.
    pub fn start(data: &Path, mount: &Path, args: &[&str], configure: impl FnOnce(&mut Command)) -> DevMount {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shingle"));
        cmd.args(["dev", "--data"])
            .arg(data)
            .arg("--mount")
            .arg(mount)
            .args(args)
            .env("SHINGLE_LOG", "warn,openraft=error,shingle_meta::manager=info")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        configure(&mut cmd);
        let mut child = cmd.spawn().expect("spawn shingle dev");
        let out = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(out).lines();
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut banner = Vec::new();
        loop {
            let line = lines.next().expect("shingle dev exited before mounting").expect("read");
            let mounted = line.starts_with(shingle::banner::MOUNTED);
            banner.push(line);
            if mounted {
                break;
            }
            assert!(Instant::now() < deadline, "shingle dev did not mount within 180 s");
        }
        std::thread::spawn(move || for _ in lines {});
        DevMount {
            child: Some(child),
            data: data.to_path_buf(),
            revived: Vec::new(),
            mount: mount.to_path_buf(),
            banner,
        }
    }

    /// A path inside the mount.
    pub fn path(&self, p: &str) -> PathBuf {
        self.mount.join(p)
    }

    /// Kills node `id` of the dev cluster with SIGKILL (a crash), found by its config.
    pub fn kill_node(&self, id: u64) {
        let config = self.data.join(format!("node{id}")).join("node.toml");
        let want = config.to_str().expect("utf-8 path");
        let mut killed = 0;
        for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            if args.contains(&b"serve".as_slice()) && args.contains(&want.as_bytes()) {
                let pid = e.file_name().to_string_lossy().to_string();
                assert!(
                    Command::new("kill")
                        .args(["-KILL", &pid])
                        .status()
                        .is_ok_and(|s| s.success()),
                    "kill node {id} ({pid})"
                );
                killed += 1;
            }
        }
        assert_eq!(killed, 1, "node {id} of {} not found", self.data.display());
    }

    /// Starts node `id` again from its config, as an operator restarts a crashed node;
    /// returns once it serves. It is stopped with the mount.
    pub fn restart_node(&mut self, id: u64) {
        let (child, _) = spawn(&self.data.join(format!("node{id}")).join("node.toml"));
        self.revived.push(child);
    }

    fn stop_revived(&mut self) {
        for c in &mut self.revived {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        }
        for mut c in self.revived.drain(..) {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && !matches!(c.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Ctrl-C, as a user stops it: asserts that it exits with success within `limit`
    /// and leaves no mount behind.
    pub fn stop(&mut self, limit: Duration) {
        self.stop_revived();
        let Some(mut c) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill").args(["-INT", &c.id().to_string()]).status();
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                assert!(st.success(), "shingle dev exited with {st}");
                break;
            }
            assert!(Instant::now() < deadline, "shingle dev did not stop within {limit:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        assert!(
            !mounts.contains(self.mount.to_str().unwrap_or("?")),
            "mount left behind after Ctrl-C"
        );
    }
}

impl Drop for DevMount {
    /// A test that failed half-way: Ctrl-C, a moment to unmount, then kill and unmount.
    fn drop(&mut self) {
        self.stop_revived();
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-INT", &c.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && !matches!(c.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
            let _ = Command::new("fusermount3").arg("-u").arg(&self.mount).status();
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
    }
}

/// A second mount of the same cluster, as another GPU host would have (`shingle mount`).
pub struct SecondMount {
    child: Child,
    pub mount: PathBuf,
}

impl SecondMount {
    /// `shingle mount` of the cluster in `data` (a `shingle dev` or `Cluster` root)
    /// with its cluster secret.
    pub fn start(data: &Path, mount: &Path) -> SecondMount {
        SecondMount::with_args(data, mount, &[])
    }

    /// [`SecondMount::start`] with more arguments.
    pub fn with_args(data: &Path, mount: &Path, args: &[&str]) -> SecondMount {
        SecondMount::with_key(data, &data.join("secret"), mount, args)
    }

    /// [`SecondMount::with_args`] with `key` (a client key file) as its secret file.
    pub fn with_key(data: &Path, key: &Path, mount: &Path, args: &[&str]) -> SecondMount {
        std::fs::create_dir_all(mount).expect("mount dir");
        let child = Command::new(env!("CARGO_BIN_EXE_shingle"))
            .arg("mount")
            .args(args)
            .arg("--cluster-file")
            .arg(data.join("cluster.toml"))
            .arg("--secret-file")
            .arg(key)
            .arg(mount)
            .env("SHINGLE_LOG", "warn,openraft=error")
            .env("SHINGLE_METRICS_LISTEN", "off")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn shingle mount");
        let deadline = Instant::now() + Duration::from_secs(60);
        let needle = format!(" {} ", mount.display());
        while !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .contains(&needle)
        {
            assert!(Instant::now() < deadline, "second mount did not appear");
            std::thread::sleep(Duration::from_millis(100));
        }
        SecondMount {
            child,
            mount: mount.to_path_buf(),
        }
    }
}

impl Drop for SecondMount {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// A port P with P..=P+n all free now.
pub fn free_run(n: u16) -> u16 {
    for _ in 0..200 {
        let base = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("probe port")
            .port();
        if base > u16::MAX - n - 1 {
            continue;
        }
        let all: Vec<_> = (0..=n)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if all.iter().all(Result::is_ok) {
            return base;
        }
    }
    panic!("no run of {n} free ports");
}

/// GET over HTTP/1.1 (Connection: close): (status, body).
pub fn http_get(addr: SocketAddr, path_and_query: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    Ok((status, if chunked { dechunk(body) } else { body.to_string() }))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}
