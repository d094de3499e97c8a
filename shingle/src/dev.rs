//! `shingle dev` and `shingle mount`: a FUSE mount of a cluster, and a whole local
//! cluster of real processes with a mount, for trying Shingle on one machine.

use crate::local::{LocalCluster, LocalSpec};
use anyhow::{Context, Result, bail};
use shingle_client::{Client, ClientConfig, MountConfig};
use shingle_meta::agent::{MapWatch, WatchConfig};
use shingle_meta::ids::Ino;
use shingle_meta::meta_client::MetaClient;
use shingle_transport::{ClusterSecret, PeerClient, TransportConfig};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Options of `shingle dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// Folder for the cluster's data (kept: running again resumes the same cluster).
    #[arg(long)]
    pub data: PathBuf,
    /// Where to mount the filesystem (created if missing; must be empty).
    #[arg(long)]
    pub mount: PathBuf,
    /// Nodes to start (each holds metadata and data; at least k+m).
    #[arg(long, default_value_t = 6)]
    pub nodes: usize,
    /// Managers among them (1 or 3).
    #[arg(long, default_value_t = 1)]
    pub managers: usize,
    /// Default erasure coding, K,M.
    #[arg(long, default_value = "4,2")]
    pub ec: String,
    /// Zones per node's emulated zoned device (64 MiB each).
    #[arg(long, default_value_t = 64)]
    pub zones: u32,
    /// Serve Prometheus metrics: the mount's on 127.0.0.1:PORT, node i's on PORT+i.
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// Stripe records the mount loads per request when a read or write reaches a part
    /// of a layout it has not loaded (default and most: 1,024, what an open reads). The
    /// checks run the exercisers with 2, so their files are opened knowing only part of
    /// their layout.
    #[arg(long, env = "SHINGLE_LAYOUT_WINDOW", default_value_t = shingle_meta::service::wire::HEAD_STRIPES)]
    pub layout_window: u64,
}

/// Options of `shingle mount`. Runs in the foreground until SIGINT/SIGTERM (or an
/// external `umount`). From /etc/fstab (needs the fuse3 package's `mount.fuse3`):
/// `/etc/shingle/cluster.toml /mnt/shingle fuse.shingle secret=/etc/shingle/secret,_netdev 0 0`
#[derive(Debug, Clone, clap::Args)]
pub struct MountArgs {
    /// The cluster file (from `shingle format`).
    #[arg(long)]
    pub cluster_file: PathBuf,
    /// The cluster secret file.
    #[arg(long)]
    pub secret_file: PathBuf,
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Seconds the kernel caches entries and attributes.
    #[arg(long, default_value_t = 1.0)]
    pub ttl: f64,
    /// Seconds the kernel remembers that a name does not exist (0: ask every time).
    /// Names created through this mount are seen at once; through another client, after
    /// at most this long.
    #[arg(long, default_value_t = 1.0)]
    pub negative_ttl: f64,
    /// Only the mounting user may use the mount (default: everyone, `allow_other`).
    #[arg(long)]
    pub private: bool,
    /// Serve Prometheus metrics of this mount at http://ADDR/metrics (`off`: none).
    #[arg(long, env = "SHINGLE_METRICS_LISTEN", value_parser = parse_metrics_listen)]
    pub metrics_listen: Option<MetricsListen>,
    /// Allow a metrics address other hosts can reach (no authentication: restrict who
    /// can reach the port). Without it only loopback addresses are accepted.
    #[arg(long, env = "SHINGLE_METRICS_EXPOSE")]
    pub metrics_expose: bool,
}

/// A metrics address, or none (`off`).
#[derive(Clone, Copy, Debug)]
pub struct MetricsListen(Option<std::net::SocketAddr>);

fn parse_metrics_listen(s: &str) -> Result<MetricsListen, String> {
    if s == "off" || s.is_empty() {
        return Ok(MetricsListen(None));
    }
    s.parse()
        .map(|a| MetricsListen(Some(a)))
        .map_err(|_| format!("'{s}' is not an address like 0.0.0.0:9465 (or off)"))
}

fn parse_ec(s: &str) -> Result<(u8, u8)> {
    s.split_once(',')
        .and_then(|(k, m)| Some((k.trim().parse().ok()?, m.trim().parse().ok()?)))
        .filter(|(k, m): &(u8, u8)| *k >= 1 && *m >= 1 && u32::from(*k) + u32::from(*m) <= 32)
        .with_context(|| format!("'{s}' is not K,M with K,M >= 1 and K+M <= 32 (e.g. 4,2)"))
}

/// Checks what a FUSE mount needs, with messages that say what to do.
fn preflight(mountpoint: &Path) -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: load the fuse module (modprobe fuse) or, in a container, pass --device /dev/fuse");
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        bail!("cannot open /dev/fuse ({e}): run as root, or add your user to the group that owns /dev/fuse");
    }
    let is_root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !is_root && which("fusermount3").is_none() && which("fusermount").is_none() {
        bail!("mounting as a normal user needs fusermount3 (apt install fuse3), or run as root");
    }
    std::fs::create_dir_all(mountpoint).with_context(|| format!("create mount point {}", mountpoint.display()))?;
    let busy = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == mountpoint.canonicalize().ok().as_deref().and_then(Path::to_str));
    if busy {
        bail!(
            "{} is already a mount point (a previous run still mounted?): fusermount3 -u {0}",
            mountpoint.display()
        );
    }
    if std::fs::read_dir(mountpoint)?.next().is_some() {
        bail!("mount point {} is not empty", mountpoint.display());
    }
    Ok(())
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.exists())
}

async fn serve_mount(
    meta: MetaClient,
    base: ClientConfig,
    layout_window: u64,
    mountpoint: &Path,
    mc: MountConfig,
    metrics: Option<(std::net::SocketAddr, bool)>,
) -> Result<()> {
    let _metrics = match metrics {
        Some((a, expose)) => {
            shingle_metrics::http::check_exposure(a, expose).map_err(anyhow::Error::msg)?;
            let watch = meta.maps().clone();
            shingle_metrics::on_scrape(move |m| shingle_metrics::set(&m.map_epoch, watch.current().epoch.0));
            let e = shingle_metrics::http::Endpoint::bind(a, expose)
                .await
                .with_context(|| format!("metrics endpoint on {a}"))?;
            println!("{}http://{}/metrics", crate::banner::METRICS, e.local_addr());
            Some(e)
        }
        None => None,
    };
    let cfg = ClientConfig {
        layout_window: layout_window.max(1),
        ..base
    };
    let client = Client::new(meta, cfg);
    let rt = tokio::runtime::Handle::current();
    let mp = mountpoint.to_path_buf();
    let session = tokio::task::spawn_blocking(move || shingle_client::mount(client, rt, &mp, &mc))
        .await?
        .with_context(|| format!("mount at {}", mountpoint.display()))?;
    println!("{}{}", crate::banner::MOUNTED, mountpoint.display());
    tokio::select! {
        r = crate::serve::wait_for_signal() => r?,
        _ = unmounted_elsewhere(mountpoint) => {
            // `umount` / `fusermount3 -u` from outside: the session has ended.
            println!("shingle: {} was unmounted", mountpoint.display());
            // Its unmount fails quietly (already gone) and the session ends; dropping
            // the session instead would try again and log a spurious warning.
            let _ = tokio::task::spawn_blocking(move || session.umount_and_join()).await;
            return Ok(());
        }
    }
    println!("shingle: unmounting {}", mountpoint.display());
    unmount(session, mountpoint).await
}

fn is_mounted(mountpoint: &Path) -> bool {
    let Some(mp) = mountpoint.canonicalize().ok() else {
        return false;
    };
    let Some(mp) = mp.to_str().map(str::to_owned) else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(mp.as_str()))
}

async fn unmounted_elsewhere(mountpoint: &Path) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !is_mounted(mountpoint) {
            return;
        }
    }
}

/// The `mount -t fuse.shingle` / `/etc/fstab` form, run by `mount.fuse3`:
/// `shingle CLUSTER_FILE MOUNTPOINT -o opt,opt,...`. Starts `shingle mount` detached
/// and returns once the mount is there. Options: `secret=PATH` (required), `ttl=SECS`,
/// `negative_ttl=SECS`, `private`, `log=PATH` (the mount's log; default none); the generic mount options
/// (rw, _netdev, nofail, allow_other, ...) are accepted and ignored.
pub fn fstab_helper(args: &[String]) -> Result<()> {
    let (cluster, mountpoint) = (&args[1], &args[2]);
    let mut opts = Vec::new();
    let mut it = args[3..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => opts.extend(
                it.next()
                    .map(|o| o.split(',').map(str::to_owned).collect::<Vec<_>>())
                    .unwrap_or_default(),
            ),
            o if o.starts_with("-o") => opts.extend(o[2..].split(',').map(str::to_owned)),
            _ => {}
        }
    }
    let (mut secret, mut ttl, mut negative_ttl, mut private, mut log) = (None, None, None, false, None);
    for o in &opts {
        match o.split_once('=') {
            Some(("secret", v)) => secret = Some(v.to_string()),
            Some(("ttl", v)) => ttl = Some(v.to_string()),
            Some(("negative_ttl", v)) => negative_ttl = Some(v.to_string()),
            Some(("log", v)) => log = Some(v.to_string()),
            None if o == "private" => private = true,
            _ => {}
        }
    }
    let secret = secret.context("the mount options need secret=PATH (the cluster secret file)")?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["mount", "--cluster-file", cluster, "--secret-file", &secret]);
    if let Some(t) = ttl {
        cmd.args(["--ttl", &t]);
    }
    if let Some(t) = negative_ttl {
        cmd.args(["--negative-ttl", &t]);
    }
    if private {
        cmd.arg("--private");
    }
    cmd.arg(mountpoint);
    let err = match &log {
        Some(l) => std::process::Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(l)
                .with_context(|| format!("open log {l}"))?,
        ),
        None => std::process::Stdio::null(),
    };
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .process_group(0)
        .spawn()
        .context("start shingle mount")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if is_mounted(Path::new(mountpoint)) {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            bail!(
                "shingle mount exited ({st}) before mounting {mountpoint}{}",
                log.map(|l| format!("; see {l}")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    bail!("{mountpoint} was not mounted within 60 s")
}

/// Unmounts; while files are still open there, retries for a few seconds and then
/// detaches the mount (it disappears from the namespace now and is released when the
/// last file closes), so no stale mount is left behind.
async fn unmount(session: shingle_client::BackgroundSession, mountpoint: &Path) -> Result<()> {
    // fuser's own unmount, which also ends and joins the session thread.
    let first = tokio::task::spawn_blocking(move || session.umount_and_join()).await?;
    if first.is_ok() || !is_mounted(mountpoint) {
        return Ok(());
    }
    // Busy: the session keeps serving the open files while we retry.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mp = mountpoint.to_path_buf();
        let done = tokio::task::spawn_blocking(move || {
            std::process::Command::new("umount")
                .arg(&mp)
                .stderr(std::process::Stdio::null())
                .status()
        })
        .await?;
        if done.is_ok_and(|s| s.success()) {
            return Ok(());
        }
    }
    eprintln!(
        "shingle: {} is still in use; detaching it (it is released when the last open file closes)",
        mountpoint.display()
    );
    let status = std::process::Command::new("umount").arg("-l").arg(mountpoint).status();
    if !status.is_ok_and(|s| s.success()) {
        bail!(
            "cannot unmount {}: unmount it with `umount -l {0}`",
            mountpoint.display()
        );
    }
    Ok(())
}

/// A namespace client of the cluster named by a cluster file, waiting up to `wait` for a
/// manager to answer.
pub async fn connect(
    cluster_file: &Path,
    secret_file: &Path,
    wait: Duration,
) -> Result<(MetaClient, crate::config::ClusterFile)> {
    let cf = crate::config::ClusterFile::load(cluster_file)?;
    let secret = ClusterSecret::from_file(secret_file)
        .with_context(|| format!("load cluster secret {}", secret_file.display()))?;
    let tcp = PeerClient::new(TransportConfig::default(), secret);
    crate::fabric::attach(&crate::fabric::RdmaSettings::default().with_env()?, &tcp)?;
    let wc = WatchConfig {
        managers: cf.manager_addrs(),
        node: None,
        interval: Duration::from_millis(500),
        touch_timeout: Duration::from_secs(5),
    };
    let maps = MapWatch::start(tcp.clone(), wc, wait, |_| {})
        .await
        .context("reach the managers")?;
    Ok((MetaClient::new(tcp, maps), cf))
}

/// The client settings a cluster file decides: erasure coding of new files, how
/// strictly a stripe's shards must be spread before a write is acknowledged.
pub fn client_config(cf: &crate::config::ClusterFile) -> ClientConfig {
    ClientConfig {
        ec: (cf.ec_k, cf.ec_m),
        distinct_homes: cf.distinct_homes,
        ..ClientConfig::default()
    }
}

/// The grant of the client key `meta` connected with (`None`: the cluster secret);
/// an error names a key that is revoked or was never granted, which nothing should
/// mount with.
pub fn client_grant(meta: &MetaClient) -> Result<Option<shingle_meta::map::ClientGrant>> {
    let Some(id) = meta.transport().identity() else {
        return Ok(None);
    };
    match meta.view().map.client(&id.name, id.serial) {
        Some(g) => Ok(Some(g.clone())),
        None => bail!("client key {id} is revoked or was never granted (see `shingle client list`)"),
    }
}

/// The directory a client with `grant` sees as its root: its subtree's, or the
/// filesystem's.
pub fn grant_root(grant: Option<&shingle_meta::map::ClientGrant>) -> Ino {
    grant.and_then(|g| g.subtree.as_ref()).map_or(Ino::ROOT, |s| s.root)
}

/// `shingle mount`.
pub async fn mount(a: MountArgs) -> Result<()> {
    preflight(&a.mountpoint)?;
    let (meta, cf) = connect(&a.cluster_file, &a.secret_file, Duration::from_secs(30)).await?;
    let grant = client_grant(&meta)?;
    let mc = MountConfig {
        ttl: Duration::from_secs_f64(a.ttl.max(0.0)),
        negative_ttl: Duration::from_secs_f64(a.negative_ttl.max(0.0)),
        allow_other: !a.private,
        read_only: grant.as_ref().is_some_and(|g| !g.write),
        root: grant_root(grant.as_ref()),
        ..MountConfig::default()
    };
    serve_mount(
        meta,
        client_config(&cf),
        shingle_meta::service::wire::HEAD_STRIPES,
        &a.mountpoint,
        mc,
        a.metrics_listen.and_then(|m| m.0).map(|addr| (addr, a.metrics_expose)),
    )
    .await
}

/// `shingle dev`.
pub async fn dev(a: DevArgs) -> Result<()> {
    let ec = parse_ec(&a.ec)?;
    if a.nodes < usize::from(ec.0 + ec.1) {
        bail!(
            "ec({},{}) needs at least {} nodes, --nodes is {}",
            ec.0,
            ec.1,
            ec.0 + ec.1,
            a.nodes
        );
    }
    if a.managers != 1 && a.managers != 3 {
        bail!("--managers must be 1 or 3");
    }
    preflight(&a.mount)?;
    let spec = LocalSpec {
        managers: a.managers,
        ec,
        zones: (a.zones, "64MiB"),
        log: std::env::var("SHINGLE_LOG").unwrap_or_else(|_| "warn,openraft=error".into()),
        metrics_port: a.metrics_port,
        ..LocalSpec::new(a.data.clone(), a.nodes)
    };
    println!("shingle: starting {} nodes in {}", a.nodes, a.data.display());
    let mut cluster = LocalCluster::start_or_resume(&spec)?;
    let meta = cluster.meta_client().await?;
    cluster.wait_ready(&meta, Duration::from_secs(90)).await?;
    let nodes: Vec<String> = cluster.nodes.iter().map(|n| format!("{}={}", n.id, n.addr)).collect();
    println!(
        "shingle: cluster ready: nodes {}; logs in {}; `shingle mount --cluster-file {} --secret-file {} DIR` mounts it elsewhere",
        nodes.join(" "),
        a.data.display(),
        cluster.cluster_file.display(),
        cluster.secret_file.display()
    );
    let metrics = a
        .metrics_port
        .map(|p| (std::net::SocketAddr::from(([127, 0, 0, 1], p)), false));
    let cf = crate::config::ClusterFile::load(&cluster.cluster_file)?;
    let base = ClientConfig {
        ec,
        ..client_config(&cf)
    };
    let r = serve_mount(meta, base, a.layout_window, &a.mount, MountConfig::default(), metrics).await;
    println!("shingle: stopping the cluster");
    cluster.stop();
    r
}
