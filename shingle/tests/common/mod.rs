//! A local cluster of real `shingle serve` processes for integration tests.
#![allow(dead_code)]

use shingle_meta::agent::{MapWatch, WatchConfig};
use shingle_meta::client::MetaClient;
use shingle_transport::{ClusterSecret, PeerClient, TransportConfig};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;
use std::time::Instant;

/// One node process.
pub struct Proc {
    pub id: u64,
    pub child: Option<Child>,
    pub config: PathBuf,
    pub addr: SocketAddr,
}

impl Proc {
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        let (child, addr) = spawn(&self.config);
        assert_eq!(addr, self.addr);
        self.child = Some(child);
    }

    pub fn alive(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `shingle serve` and waits for its "listening" line.
pub fn spawn(config: &Path) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shingle"))
        .args(["serve", "--config"])
        .arg(config)
        .env(
            "SHINGLE_LOG",
            std::env::var("SHINGLE_LOG").unwrap_or_else(|_| "warn,openraft=error".into()),
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

/// Free loopback ports (bound and released; fine for tests).
pub fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    ls.iter().map(|l| l.local_addr().expect("addr").port()).collect()
}

/// A cluster: `managers` nodes with the manager role (ids 1..), every node meta,
/// `data` of them also data nodes.
pub struct Cluster {
    pub root: PathBuf,
    pub secret: ClusterSecret,
    pub nodes: Vec<Proc>,
    pub managers: Vec<SocketAddr>,
}

pub struct Spec {
    pub nodes: usize,
    pub managers: usize,
    pub data: bool,
    pub partitions: u32,
    pub down_after_ms: u64,
    /// Lines of each node's `[data]` section (zones); empty: 16 zones of 16 MiB.
    pub data_toml: &'static str,
    /// Extra lines of each node's `[node]` section.
    pub node_toml: &'static str,
}

impl Cluster {
    pub fn start(root: &Path, spec: Spec) -> Cluster {
        let bin = env!("CARGO_BIN_EXE_shingle");
        let secret_path = root.join("secret");
        let out = Command::new(bin)
            .arg("keygen")
            .arg(&secret_path)
            .output()
            .expect("keygen");
        assert!(out.status.success(), "keygen: {out:?}");
        let secret = ClusterSecret::from_file(&secret_path).expect("secret");
        let ports = free_ports(spec.nodes);
        let managers: Vec<SocketAddr> = ports[..spec.managers]
            .iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
            .collect();
        let cluster_file = root.join("cluster.toml");
        let mspec: Vec<String> = managers
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        let out = Command::new(bin)
            .args(["format", "--cluster-file"])
            .arg(&cluster_file)
            .args([
                "--managers",
                &mspec.join(","),
                "--partitions",
                &spec.partitions.to_string(),
                "--pgs",
                "32",
            ])
            .output()
            .expect("format");
        assert!(out.status.success(), "format: {out:?}");
        let mut nodes = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let id = i as u64 + 1;
            let dir = root.join(format!("n{id}"));
            std::fs::create_dir_all(&dir).expect("dir");
            let mut cfg = format!(
                "[node]\nid = {id}\nlisten = \"127.0.0.1:{}\"\nsecret_file = \"{}\"\ncluster_file = \"{}\"\n{}\n[meta]\ndir = \"{}\"\n",
                port,
                secret_path.display(),
                cluster_file.display(),
                spec.node_toml,
                dir.join("meta").display()
            );
            if i < spec.managers {
                cfg += &format!(
                    "\n[manager]\ndir = \"{}\"\ndown_after_ms = {}\n",
                    dir.join("manager").display(),
                    spec.down_after_ms
                );
            }
            if spec.data {
                let zones = if spec.data_toml.is_empty() {
                    "zones = 16\nzone_size = \"16MiB\"\n"
                } else {
                    spec.data_toml
                };
                cfg += &format!("\n[data]\ndir = \"{}\"\n{zones}", dir.join("data").display());
            }
            let config = dir.join("node.toml");
            std::fs::write(&config, cfg).expect("config");
            nodes.push(Proc {
                id,
                child: None,
                config,
                addr: SocketAddr::from(([127, 0, 0, 1], *port)),
            });
        }
        // Managers first (in parallel: a 3-manager group needs a majority to elect).
        let mut handles = Vec::new();
        for n in nodes.iter().take(spec.managers) {
            let c = n.config.clone();
            handles.push(std::thread::spawn(move || spawn(&c)));
        }
        for (n, h) in nodes.iter_mut().zip(handles) {
            let (child, addr) = h.join().expect("spawn thread");
            assert_eq!(addr, n.addr);
            n.child = Some(child);
        }
        for n in nodes.iter_mut().skip(spec.managers) {
            let (child, addr) = spawn(&n.config);
            assert_eq!(addr, n.addr);
            n.child = Some(child);
        }
        Cluster {
            root: root.to_path_buf(),
            secret,
            nodes,
            managers,
        }
    }

    pub async fn client(&self) -> MetaClient {
        let tcp = PeerClient::new(TransportConfig::default(), self.secret.clone());
        let wc = WatchConfig {
            managers: self.managers.clone(),
            node: None,
            interval: Duration::from_millis(300),
            touch_timeout: Duration::from_secs(5),
        };
        let maps = MapWatch::start(tcp.clone(), wc, Duration::from_secs(30), |_| {})
            .await
            .expect("map watch");
        MetaClient::new(tcp, maps)
    }

    /// Waits until every partition has a serving primary and `n` nodes are Up.
    pub async fn wait_ready(&self, c: &MetaClient, up: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let v = c.view();
            let ups = v
                .map
                .nodes
                .values()
                .filter(|n| n.state == shingle_meta::map::NodeState::Up)
                .count();
            if ups >= up {
                let stats = c.stats().await;
                let serving: u32 = stats
                    .iter()
                    .filter_map(|(_, s)| s.as_ref().ok())
                    .map(|s| s.primary)
                    .sum();
                if serving >= v.map.partitions {
                    return;
                }
            }
            assert!(std::time::Instant::now() < deadline, "cluster not ready: {} up", ups);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
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
            .env("SHINGLE_LOG", "warn,openraft=error")
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
            mount: mount.to_path_buf(),
            banner,
        }
    }

    /// A path inside the mount.
    pub fn path(&self, p: &str) -> PathBuf {
        self.mount.join(p)
    }

    /// Ctrl-C, as a user stops it: asserts that it exits with success within `limit`
    /// and leaves no mount behind.
    pub fn stop(&mut self, limit: Duration) {
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
