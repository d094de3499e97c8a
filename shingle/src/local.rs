//! A cluster of real `shingle serve` processes on 127.0.0.1, for `shingle dev`, the
//! benchmarks and the multi-process tests: formats a cluster, writes one config per
//! node, starts managers first (in parallel, so a 3-manager group can elect), then the
//! rest, and stops them all on drop.

use anyhow::{Context, Result, bail};
use shingle_meta::agent::{MapWatch, WatchConfig};
use shingle_meta::ids::NodeId;
use shingle_meta::map::NodeState;
use shingle_meta::meta_client::MetaClient;
use shingle_transport::{ClusterSecret, PeerClient, TransportConfig};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to start.
#[derive(Clone, Debug)]
pub struct LocalSpec {
    /// Folder for every node's data, configs, secret and cluster file.
    pub dir: PathBuf,
    /// Nodes (all hold metadata).
    pub nodes: usize,
    /// Of which managers (1 or 3).
    pub managers: usize,
    /// All nodes also hold data.
    pub data: bool,
    /// Metadata partitions.
    pub partitions: u32,
    /// Metadata replicas.
    pub replication: u8,
    /// Erasure coding K,M.
    pub ec: (u8, u8),
    /// Emulated zoned device per data node: zones and zone size.
    pub zones: (u32, &'static str),
    /// SHINGLE_LOG of the nodes.
    pub log: String,
    /// Cap each node at this share of one core (cgroup v1 cpu controller).
    pub cpu_cap: Option<f64>,
    /// Extra TOML lines for the `[manager]` sections (failure-detection settings).
    pub manager_toml: String,
    /// Extra TOML lines for the `[meta]` sections (repair settings).
    pub meta_toml: String,
    /// Run node i in network namespace `{prefix}h{i}` at 10.77.0.i:7100 (the hosts of
    /// `fabric-tests/netns/rig.sh`) instead of on 127.0.0.1.
    pub netns: Option<String>,
    /// Serve each node's `/metrics` on port `base + id` of its address.
    pub metrics_port: Option<u16>,
    /// The `shingle` binary to run (`None`: this executable; tests name the binary).
    pub bin: Option<PathBuf>,
    /// Placement groups of the new cluster (`None`: `shingle format`'s default).
    pub pgs: Option<u32>,
    /// Extra TOML lines for the `[node]` sections (frame limits).
    pub node_toml: String,
    /// Extra TOML lines for the `[data]` sections (scrub settings).
    pub data_toml: String,
    /// Nodes log to this process's stderr (tests: the test runner shows them with a
    /// failure) instead of to `node{id}.log` in `dir`.
    pub logs_to_stderr: bool,
}

impl LocalSpec {
    /// `nodes` nodes in `dir` as `shingle dev` makes them: one manager, every node a
    /// meta and a data node, 64 partitions, R = min(3, nodes), EC 4+2, 64 zones of
    /// 64 MiB, quiet logs, no CPU cap, no extra settings, on 127.0.0.1, no metrics.
    /// Callers change what they need with `..LocalSpec::new(dir, nodes)`.
    pub fn new(dir: PathBuf, nodes: usize) -> LocalSpec {
        LocalSpec {
            dir,
            nodes,
            managers: 1,
            data: true,
            partitions: 64,
            replication: nodes.min(3) as u8,
            ec: (4, 2),
            zones: (64, "64MiB"),
            log: "warn,openraft=error".into(),
            cpu_cap: None,
            manager_toml: String::new(),
            meta_toml: String::new(),
            netns: None,
            metrics_port: None,
            bin: None,
            pgs: None,
            node_toml: String::new(),
            data_toml: String::new(),
            logs_to_stderr: false,
        }
    }

    /// The binary the nodes run.
    fn exe(&self) -> Result<PathBuf> {
        match &self.bin {
            Some(b) => Ok(b.clone()),
            None => std::env::current_exe().context("locate the shingle binary"),
        }
    }

    /// How node `id` is started.
    fn launch(&self, id: u64) -> Result<Launch> {
        Ok(Launch {
            exe: self.exe()?,
            log: self.log.clone(),
            stderr: (!self.logs_to_stderr).then(|| self.dir.join(format!("node{id}.log"))),
            ns: self.namespace(id),
        })
    }

    /// Where node `id` listens: its rig host, or a free port on 127.0.0.1.
    fn addr_of(&self, id: u64, free: u16) -> SocketAddr {
        match &self.netns {
            Some(_) => SocketAddr::from(([10, 77, 0, id as u8], 7100)),
            None => SocketAddr::from(([127, 0, 0, 1], free)),
        }
    }

    /// The namespace node `id` runs in, if any.
    pub fn namespace(&self, id: u64) -> Option<String> {
        self.netns.as_ref().map(|p| format!("{p}h{id}"))
    }
}

/// Sends `sig` (as `kill` spells it: `-STOP`, `-CONT`, …) to process `pid`.
pub fn signal(pid: u32, sig: &str) -> Result<()> {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .with_context(|| format!("kill {sig} {pid}"))?
        .success();
    if !ok {
        bail!("kill {sig} {pid} failed");
    }
    Ok(())
}

/// One node process.
pub struct LocalNode {
    /// Node id.
    pub id: u64,
    /// Its address.
    pub addr: SocketAddr,
    /// Its config file.
    pub config: PathBuf,
    child: Option<Child>,
    cgroup: Option<PathBuf>,
}

/// A running local cluster.
pub struct LocalCluster {
    /// The nodes.
    pub nodes: Vec<LocalNode>,
    /// Manager addresses.
    pub managers: Vec<SocketAddr>,
    /// The cluster secret.
    pub secret: ClusterSecret,
    /// Its file.
    pub secret_file: PathBuf,
    /// The cluster file.
    pub cluster_file: PathBuf,
}

/// `n` distinct free ports on 127.0.0.1 for local nodes. They are taken below the
/// kernel's ephemeral range: the cluster's own outgoing connections take ephemeral
/// ports, and one of them could otherwise take a node's port between choosing it here
/// and the node binding it (the node then cannot start). Random in that range, so
/// clusters started side by side (parallel tests) rarely pick the same ones; each is
/// checked free by binding it, and all are held until every one is chosen.
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (start, end) = (low.saturating_sub(16384).max(1024), low);
    let mut held = Vec::new();
    let mut tries = 0;
    while held.len() < n && end > start && tries < 64 * n {
        tries += 1;
        let mut r = [0u8; 2];
        getrandom::fill(&mut r).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
        let port = start + u16::from_le_bytes(r) % (end - start);
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    // A machine whose ephemeral range starts too low: any free port will do.
    while held.len() < n {
        held.push(std::net::TcpListener::bind("127.0.0.1:0").context("find free ports on 127.0.0.1")?);
    }
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// What starting one node takes: the binary, its log filter, where its stderr goes
/// (`None`: this process's), and its network namespace.
struct Launch {
    exe: PathBuf,
    log: String,
    stderr: Option<PathBuf>,
    ns: Option<String>,
}

fn spawn(config: &Path, launch: Launch) -> Result<(Child, SocketAddr)> {
    let Launch { exe, log, stderr, ns } = launch;
    // Appended: a node restarted (by `shingle dev` again, or a benchmark) keeps the log
    // of its earlier runs.
    let err = match &stderr {
        Some(path) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("open {}", path.display()))?,
        ),
        None => Stdio::inherit(),
    };
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    // `shingle --log-format json dev` gives its nodes the same format (the environment
    // variable is inherited anyway).
    if let Some(f) = crate::logging::cli_format() {
        cmd.env(crate::logging::FORMAT_ENV, f.as_str());
    }
    let mut child = cmd
        .args(["serve", "--config"])
        .arg(config)
        .env("SHINGLE_LOG", &log)
        // Each node's metrics address is in its config (`--metrics-port`): one address
        // inherited by all of them would make all but the first fail to start.
        .env_remove("SHINGLE_METRICS_LISTEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .context("start shingle serve")?;
    let stdout = child.stdout.take().context("node stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .context("read node startup line")?;
    let Some(addr) = line.trim().strip_prefix(crate::banner::LISTENING) else {
        let _ = child.kill();
        let _ = child.wait();
        let Some(stderr) = stderr else {
            bail!("node with config {} did not start (its log is above)", config.display());
        };
        let log = std::fs::read_to_string(&stderr).unwrap_or_default();
        bail!(
            "node with config {} did not start; its log ({}):\n{}",
            config.display(),
            stderr.display(),
            log.lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    };
    Ok((child, addr.parse().context("node address")?))
}

impl LocalNode {
    /// Stops the process with SIGTERM (SIGKILL after 10 s).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(cg) = self.cgroup.take() {
            let _ = std::fs::remove_dir(cg);
        }
    }
}

impl LocalNode {
    /// "node ID (ADDR) is not up", and the last lines of its log when it has one.
    /// Where this node's log is when it logs to a file (`node{id}.log` in the data dir).
    fn log_path(&self) -> Option<PathBuf> {
        self.config
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join(format!("node{}.log", self.id)))
    }

    fn describe(&self) -> String {
        let log = self.log_path();
        let tail = log
            .as_ref()
            .and_then(|l| std::fs::read_to_string(l).ok())
            .map(|t| {
                // A panic in one of its tasks leaves a node running but silent: the
                // panic is the line that explains it, wherever it is in the log.
                let lines: Vec<&str> = t.lines().collect();
                let tail = &lines[lines.len().saturating_sub(8)..];
                let panics = lines
                    .iter()
                    .filter(|l| l.contains("panicked at") && !tail.contains(l))
                    .take(3);
                panics.chain(tail).copied().collect::<Vec<_>>().join("\n    ")
            })
            .filter(|t| !t.is_empty());
        match (log, tail) {
            (Some(l), Some(t)) => format!(
                "node {} ({}) is not up; the end of {}:\n    {t}",
                self.id,
                self.addr,
                l.display()
            ),
            _ => format!("node {} ({}) is not up", self.id, self.addr),
        }
    }

    /// Kills the process with SIGKILL (a crash: nothing is flushed or said goodbye).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the process without ending it (SIGSTOP): its sockets stay open and its
    /// connections accept requests, but it answers nothing until it gets SIGCONT
    /// ([`signal`] at [`LocalNode::pid`]) — a node that hangs, not one that died.
    pub fn freeze(&self) -> Result<()> {
        let pid = self.pid().context("node process not running")?;
        signal(pid, "-STOP").with_context(|| format!("freeze node {}", self.id))
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts it again with the same config (after [`LocalNode::kill`] or `stop`).
    pub fn restart(&mut self, spec: &LocalSpec) -> Result<()> {
        self.kill();
        let (child, _) = spawn(&self.config, spec.launch(self.id)?)?;
        self.child = Some(child);
        Ok(())
    }

    /// Whether its process was started and has not been stopped or killed (a process
    /// that exited by itself still counts until [`LocalNode::exited`] says so).
    pub fn alive(&self) -> bool {
        self.child.is_some()
    }

    /// Whether its process has exited by itself (a crash).
    pub fn exited(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
    }
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        self.stop();
    }
}

fn cap_cpu(pid: u32, id: u64, share: f64) -> Result<PathBuf> {
    let root = Path::new("/sys/fs/cgroup/cpu");
    if !root.join("cpu.cfs_quota_us").exists() {
        bail!("no cgroup v1 cpu controller at {} (needed for --cap)", root.display());
    }
    let cg = root.join(format!("shingle-{}-{id}", std::process::id()));
    std::fs::create_dir_all(&cg).with_context(|| format!("create cgroup {}", cg.display()))?;
    std::fs::write(cg.join("cpu.cfs_period_us"), "100000")?;
    std::fs::write(cg.join("cpu.cfs_quota_us"), format!("{}", (share * 100_000.0) as u64))?;
    std::fs::write(cg.join("cgroup.procs"), pid.to_string()).context("move the node into its cgroup")?;
    Ok(cg)
}

/// Writes the config of node `id` (listening on 127.0.0.1:`port`) under `spec.dir`.
fn write_node_config(
    spec: &LocalSpec,
    secret_file: &Path,
    cluster_file: &Path,
    id: u64,
    listen: SocketAddr,
    manager: bool,
) -> Result<PathBuf> {
    use crate::config::{
        DataSection, ManagerSection, MetaSection, MetricsSection, NodeConfig, NodeSection, parse_size,
    };
    let ndir = spec.dir.join(format!("node{id}"));
    std::fs::create_dir_all(&ndir)?;
    let mut cfg = NodeConfig::new(NodeSection {
        id: Some(id),
        cluster_file: Some(cluster_file.to_path_buf()),
        ..NodeSection::new(listen, secret_file)
    });
    cfg.meta = Some(MetaSection::new(&ndir.join("meta")));
    if manager {
        cfg.manager = Some(ManagerSection::new(&ndir.join("manager")));
    }
    if spec.data {
        let zone_size = parse_size(spec.zones.1).map_err(anyhow::Error::msg)?;
        cfg.data = Some(DataSection::emulated(&ndir.join("data"), spec.zones.0, zone_size));
    }
    if let Some(base) = spec.metrics_port {
        let port = base
            .checked_add(u16::try_from(id).unwrap_or(u16::MAX))
            .context("metrics port out of range")?;
        cfg.metrics = Some(MetricsSection {
            listen: SocketAddr::new(listen.ip(), port),
            expose: false,
        });
    }
    // The spec's extra lines go into their tables; a table the node does not have
    // (extra [manager] lines of a node that is not one) is left out.
    let mut extra = vec![("node", spec.node_toml.as_str()), ("meta", spec.meta_toml.as_str())];
    if manager {
        extra.push(("manager", spec.manager_toml.as_str()));
    }
    if spec.data {
        extra.push(("data", spec.data_toml.as_str()));
    }
    let config = ndir.join("node.toml");
    std::fs::write(&config, cfg.to_toml_with(&extra)?)?;
    Ok(config)
}

impl LocalCluster {
    /// Adds a node (meta, and data when the spec says so; never a manager) and starts
    /// it: it registers, and placement gives it its share of partitions and groups.
    pub fn add_node(&mut self, spec: &LocalSpec) -> Result<u64> {
        let id = self.nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
        let listen = spec.addr_of(id, free_ports(1)?[0]);
        let config = write_node_config(spec, &self.secret_file, &self.cluster_file, id, listen, false)?;
        let (child, addr) = spawn(&config, spec.launch(id)?)?;
        self.nodes.push(LocalNode {
            id,
            addr,
            config,
            child: Some(child),
            cgroup: None,
        });
        Ok(id)
    }

    /// Starts the cluster kept in `spec.dir` again when one is there (same node configs,
    /// same ports, same data), or formats and starts a new one.
    pub fn start_or_resume(spec: &LocalSpec) -> Result<LocalCluster> {
        let cluster_file = spec.dir.join("cluster.toml");
        if !cluster_file.exists() {
            return Self::start(spec);
        }
        let secret_file = spec.dir.join("secret");
        let secret = ClusterSecret::from_file(&secret_file)?;
        let cf = crate::config::ClusterFile::load(&cluster_file)?;
        let mut nodes = Vec::new();
        for id in 1.. {
            let config = spec.dir.join(format!("node{id}")).join("node.toml");
            if !config.exists() {
                break;
            }
            let nc = crate::config::NodeConfig::load(&config)?;
            nodes.push(LocalNode {
                id,
                addr: nc.node.listen,
                config,
                child: None,
                cgroup: None,
            });
        }
        if nodes.is_empty() {
            bail!("{} has a cluster file but no node configs", spec.dir.display());
        }
        let mut cluster = LocalCluster {
            nodes,
            managers: cf.manager_addrs(),
            secret,
            secret_file,
            cluster_file,
        };
        cluster.spawn_all(spec, cf.managers.len())?;
        Ok(cluster)
    }

    fn spawn_all(&mut self, spec: &LocalSpec, managers: usize) -> Result<()> {
        let mut starts = Vec::new();
        for n in &self.nodes[..managers] {
            let (cfg, launch) = (n.config.clone(), spec.launch(n.id)?);
            starts.push(std::thread::spawn(move || spawn(&cfg, launch)));
        }
        for (i, h) in starts.into_iter().enumerate() {
            let (child, _) = h.join().map_err(|_| anyhow::anyhow!("start thread panicked"))??;
            self.nodes[i].child = Some(child);
        }
        for n in self.nodes.iter_mut().skip(managers) {
            let (child, _) = spawn(&n.config, spec.launch(n.id)?)?;
            n.child = Some(child);
        }
        if let Some(share) = spec.cpu_cap {
            for n in &mut self.nodes {
                let pid = n.child.as_ref().map(Child::id).unwrap_or(0);
                n.cgroup = Some(cap_cpu(pid, n.id, share)?);
            }
        }
        Ok(())
    }

    /// Formats and starts a cluster.
    pub fn start(spec: &LocalSpec) -> Result<LocalCluster> {
        let dir = &spec.dir;
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let secret_file = dir.join("secret");
        if !secret_file.exists() {
            crate::keys::write_key_file(&secret_file, &ClusterSecret::generate()?)
                .with_context(|| format!("create {}", secret_file.display()))?;
        }
        let secret = ClusterSecret::from_file(&secret_file)?;
        let ports = if spec.netns.is_some() {
            vec![0; spec.nodes]
        } else {
            free_ports(spec.nodes)?
        };
        let addrs: Vec<SocketAddr> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| spec.addr_of(i as u64 + 1, *p))
            .collect();
        let managers: Vec<SocketAddr> = addrs[..spec.managers].to_vec();
        let cluster_file = dir.join("cluster.toml");
        let _ = std::fs::remove_file(&cluster_file);
        let mspec: Vec<String> = managers
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        let mut format = Command::new(spec.exe()?);
        format
            .args(["format", "--cluster-file"])
            .arg(&cluster_file)
            .args(["--managers", &mspec.join(",")])
            .args(["--partitions", &spec.partitions.to_string()])
            .args(["--replication", &spec.replication.to_string()])
            .args(["--ec", &format!("{},{}", spec.ec.0, spec.ec.1)]);
        if let Some(pgs) = spec.pgs {
            format.args(["--pgs", &pgs.to_string()]);
        }
        let out = format.output().context("run shingle format")?;
        if !out.status.success() {
            bail!("shingle format failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mut nodes = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let id = i as u64 + 1;
            let config = write_node_config(spec, &secret_file, &cluster_file, id, *addr, i < spec.managers)?;
            nodes.push(LocalNode {
                id,
                addr: *addr,
                config,
                child: None,
                cgroup: None,
            });
        }
        let mut cluster = LocalCluster {
            nodes,
            managers,
            secret,
            secret_file,
            cluster_file,
        };
        cluster.spawn_all(spec, spec.managers)?;
        Ok(cluster)
    }

    /// A namespace client of this cluster.
    pub async fn meta_client(&self) -> Result<MetaClient> {
        let tcp = PeerClient::new(TransportConfig::default(), self.secret.clone());
        let wc = WatchConfig {
            managers: self.managers.clone(),
            node: None,
            interval: Duration::from_millis(500),
            touch_timeout: Duration::from_secs(5),
        };
        let maps = MapWatch::start(tcp.clone(), wc, Duration::from_secs(60), |_| {})
            .await
            .context("reach the managers")?;
        Ok(MetaClient::new(tcp, maps))
    }

    /// Waits until all nodes are Up and every partition has a serving primary. The
    /// placements of a forming cluster may still be moving: what starts on it runs
    /// through those moves (reads stay current: primaries fence the holders a move
    /// drops, docs/decisions/0008).
    pub async fn wait_ready(&self, c: &MetaClient, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = c.view();
            let up = v.map.nodes.values().filter(|n| n.state == NodeState::Up).count();
            if up >= self.nodes.len() {
                let stats = c.stats().await;
                let primaries: u32 = stats
                    .iter()
                    .filter_map(|(_, s)| s.as_ref().ok())
                    .map(|s| s.primary)
                    .sum();
                if primaries >= v.map.partitions && c.getattr(shingle_meta::ids::Ino::ROOT).await.is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                let missing: Vec<String> = self
                    .nodes
                    .iter()
                    .filter(|n| v.map.nodes.get(&NodeId(n.id)).is_none_or(|m| m.state != NodeState::Up))
                    .map(LocalNode::describe)
                    .collect();
                // The map as this client sees it: a node Down in it, or a map that
                // stopped moving (the client's own map watch stuck), tell different stories.
                let states: Vec<String> = v
                    .map
                    .nodes
                    .values()
                    .map(|n| format!("{}:{:?}", n.id.0, n.state))
                    .collect();
                bail!(
                    "cluster not ready after {timeout:?}: {up} of {} nodes up (map epoch {}: {}){}{}",
                    self.nodes.len(),
                    v.map.epoch.0,
                    states.join(" "),
                    missing.iter().map(|m| format!("\n{m}")).collect::<String>(),
                    self.liveness_story()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What the nodes' logs say of liveness (who marked whom Down, which manager a
    /// node could not reach): the story behind a node that is not up.
    fn liveness_story(&self) -> String {
        let mut lines = Vec::new();
        for n in &self.nodes {
            let Some(text) = n.log_path().and_then(|l| std::fs::read_to_string(l).ok()) else {
                continue;
            };
            lines.extend(
                text.lines()
                    .filter(|l| l.contains("liveness changed") || l.contains("does not answer"))
                    .map(|l| format!("\n    node {}: {l}", n.id)),
            );
        }
        if lines.is_empty() {
            return String::new();
        }
        let tail = &lines[lines.len().saturating_sub(16)..];
        format!("\nliveness in the nodes' logs:{}", tail.concat())
    }

    /// Kills every node (SIGKILL) and starts them all again with the same configs,
    /// managers first: a whole-cluster crash and restart.
    pub fn restart_all(&mut self, spec: &LocalSpec) -> Result<()> {
        for n in &mut self.nodes {
            n.kill();
        }
        let managers = self.managers.len();
        self.spawn_all(spec, managers)
    }

    /// Stops every node (SIGTERM).
    pub fn stop(&mut self) {
        for n in &mut self.nodes {
            n.stop();
        }
    }
}

/// Starts the cluster `spec` describes, waits until it serves, and mounts it at `mnt`
/// in this process with the default client settings and `mount` (what the benchmarks
/// measure through). Dropping the session unmounts.
pub async fn start_mounted(
    spec: &LocalSpec,
    mnt: &Path,
    mount: &shingle_client::MountConfig,
) -> Result<(LocalCluster, shingle_client::BackgroundSession)> {
    let cluster = LocalCluster::start(spec)?;
    let meta = cluster.meta_client().await?;
    cluster.wait_ready(&meta, Duration::from_secs(90)).await?;
    let client = shingle_client::Client::new(meta, shingle_client::ClientConfig::default());
    let rt = tokio::runtime::Handle::current();
    let (m, mc) = (mnt.to_path_buf(), mount.clone());
    let session = tokio::task::spawn_blocking(move || shingle_client::mount(client, rt, &m, &mc)).await??;
    Ok((cluster, session))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_clear_of_the_ephemeral_range() {
        let ports = free_ports(16).expect("ports");
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 16, "{ports:?}");
        let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .expect("port range")
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .expect("low end");
        if low > 1024 + 16 {
            assert!(ports.iter().all(|&p| p < low), "{ports:?} below {low}");
        }
    }

    #[test]
    fn a_node_not_up_is_described_with_its_panic_and_the_end_of_its_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("node4")).expect("node dir");
        let mut log: Vec<String> = (0..20).map(|i| format!("line {i}")).collect();
        log[3] = "thread 'tokio-runtime-worker' panicked at meta/src/x.rs:1:1:".into();
        std::fs::write(dir.path().join("node4.log"), log.join("\n")).expect("log");
        let node = LocalNode {
            id: 4,
            addr: SocketAddr::from(([127, 0, 0, 1], 7104)),
            config: dir.path().join("node4").join("node.toml"),
            child: None,
            cgroup: None,
        };
        let d = node.describe();
        assert!(d.starts_with("node 4 (127.0.0.1:7104) is not up"), "{d}");
        assert!(d.contains("panicked at meta/src/x.rs"), "{d}");
        assert!(
            d.contains("line 19") && d.contains("line 12") && !d.contains("line 11"),
            "{d}"
        );
        std::fs::remove_file(dir.path().join("node4.log")).expect("rm");
        assert_eq!(node.describe(), "node 4 (127.0.0.1:7104) is not up");
    }
}
