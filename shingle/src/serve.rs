//! `shingle serve`: runs one node with the roles its config gives it.

use crate::config::{ClusterFile, NodeConfig};
use anyhow::{Context, Result};
use shingle_data::service::ChunkService;
use shingle_data::store::{ChunkStore, StoreOptions};
use shingle_data::zone::Geometry;
use shingle_data::zone::ZonedDevice;
use shingle_data::zone::blockdev::BlockZonedDevice;
use shingle_data::zone::file::FileZonedDevice;
use shingle_meta::agent::{MapWatch, WatchConfig};
use shingle_meta::ids::NodeId;
use shingle_meta::manager::{Manager, ManagerConfig, ManagerSlot};
use shingle_meta::map::{ClusterMap, NodeInfo, NodeState, Roles};
use shingle_meta::service::{MetaConfig, MetaNode};
use shingle_transport::cap::CapKey;
use shingle_transport::{ClusterSecret, PeerClient, RegionTable, Router, Server, TransportConfig};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Where the `/metrics` endpoint listens: `SHINGLE_METRICS_LISTEN`, else `[metrics]
/// listen`, else nowhere (`SHINGLE_METRICS_LISTEN=off` turns a configured one off).
fn metrics_listen(cfg: &NodeConfig) -> Result<Option<std::net::SocketAddr>> {
    let addr = metrics_addr(cfg)?;
    if let Some(a) = addr {
        let expose = cfg.metrics.as_ref().is_some_and(|m| m.expose) || env_flag("SHINGLE_METRICS_EXPOSE");
        shingle_metrics::http::check_exposure(a, expose).map_err(anyhow::Error::msg)?;
    }
    Ok(addr)
}

/// An environment switch: set to `1` or `true`.
fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

fn metrics_addr(cfg: &NodeConfig) -> Result<Option<std::net::SocketAddr>> {
    match std::env::var("SHINGLE_METRICS_LISTEN") {
        Ok(v) if v == "off" => Ok(None),
        Ok(v) if !v.is_empty() => v
            .parse()
            .map(Some)
            .with_context(|| format!("SHINGLE_METRICS_LISTEN={v:?} is not an address like 0.0.0.0:9464")),
        _ => Ok(cfg.metrics.as_ref().map(|m| m.listen)),
    }
}

/// Copies state kept elsewhere (zones, repair, Raft) into the metrics at each scrape.
fn scrape_hooks(
    store: Option<Arc<ChunkStore<Arc<dyn ZonedDevice>>>>,
    manager: Option<Manager>,
    meta: Option<MetaNode>,
    map: tokio::sync::watch::Receiver<Arc<ClusterMap>>,
) {
    use shingle_metrics::{State, counter_to, set};
    shingle_metrics::on_scrape(move |m| {
        set(&m.map_epoch, map.borrow().epoch.0);
        if let Some(s) = &store {
            let st = s.stats();
            set(
                &m.zones.get_or_create(&State { state: "total" }),
                u64::from(st.zones_total),
            );
            set(
                &m.zones.get_or_create(&State { state: "free" }),
                u64::from(st.zones_free),
            );
            set(
                &m.store_bytes.get_or_create(&State { state: "capacity" }),
                st.capacity_bytes,
            );
            set(
                &m.store_bytes.get_or_create(&State { state: "written" }),
                st.written_bytes,
            );
            set(&m.store_bytes.get_or_create(&State { state: "live" }), st.live_bytes);
            set(&m.chunks, st.chunks);
            counter_to(&m.store_user_written_bytes, st.user_bytes_written);
            counter_to(&m.gc_moved_bytes, st.gc_bytes_moved);
            counter_to(&m.chunk_index_checkpoints, st.checkpoints);
            set(&m.chunk_index_replayed, st.replayed);
            counter_to(&m.gc_zones_reset, st.gc_zones_reset);
        }
        if let Some(n) = &meta {
            let r = n.repair_stats();
            set(&m.repair_shards_todo, r.todo);
            set(&m.repair_shards_done, r.done);
            set(&m.repair_moves_todo, r.moves_todo);
            set(&m.repair_moves_done, r.moved);
            set(&m.repair_unreadable_stripes, r.unreadable);
            set(&m.repair_shared_stripes, r.shared);
            set(&m.repair_running, u64::from(r.running));
            set(&m.purges_pending, n.purges_pending() as u64);
            counter_to(&m.repair_passes, r.passes);
        }
        if let Some(mg) = &manager {
            let r = mg.metrics();
            set(&m.raft_term, r.term);
            set(&m.raft_leader, u64::from(r.role == shingle_meta::manager::Role::Leader));
            set(&m.raft_applied_index, r.last_applied_index.unwrap_or(0));
        }
    });
}

/// A data node's chunk store.
type Store = Arc<ChunkStore<Arc<dyn ZonedDevice>>>;

/// The tasks a node runs beside its handlers, stopped at shutdown.
#[derive(Default)]
struct Background {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Background {
    fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

/// Runs a node (its config loaded and validated) until SIGINT or SIGTERM, then shuts
/// down gracefully.
pub async fn run(cfg: NodeConfig) -> Result<()> {
    let (secret, transport) = secret_and_transport(&cfg)?;
    let regions = Arc::new(RegionTable::new());
    let peers = PeerClient::new(transport.clone(), secret.clone());
    // Signs (meta) and checks (data) the shard capabilities of client keys.
    let caps = CapKey::derive(&secret).context("a node needs the cluster secret, not a client key")?;
    let rdma = cfg.rdma.clone().unwrap_or_default().with_env()?;
    rdma.validate()?;
    // Nodes read each other's shards too (repair, rebuild).
    crate::fabric::attach(&rdma, &peers)?;
    let mut router = Router::new();
    let mut background = Background::default();
    let mut store = None;
    if let Some(d) = &cfg.data {
        let (s, service) = open_data(d, &regions, &peers, caps.clone()).await?;
        router = router.merge(service);
        background
            .tasks
            .push(tokio::spawn(gc_loop(s.clone(), d.gc_when_free_below)));
        store = Some(s);
    }
    let cluster = cfg.node.cluster_file.as_deref().map(ClusterFile::load).transpose()?;
    let initial_map = cluster.as_ref().map(ClusterFile::initial_map);
    // The meta service is opened before the server binds, so that its handlers are there
    // from the first request; it learns maps through this channel.
    let (map_tx, map_rx) = tokio::sync::watch::channel(Arc::new(
        initial_map
            .clone()
            .unwrap_or_else(|| ClusterMap::new("standalone", 1, 1, 1, 1)),
    ));
    let node_id = NodeId(cfg.node.id.unwrap_or(0));
    let meta = open_meta(&cfg, node_id, &caps, &peers, &map_rx).await?;
    if let Some(node) = &meta {
        router = router.merge(node.router());
    }
    let slot = ManagerSlot::new();
    if cfg.manager.is_some() {
        router = router.merge(slot.router());
    }
    if cfg.data.is_some() {
        router = crate::fabric::export(&rdma, router, &map_rx, &transport)?;
    }
    // Client keys may send what their grant in the current map allows.
    let router = router.guard(crate::access::guard(map_rx.clone()));
    let server = Server::bind(cfg.node.listen, transport, secret, router, regions)
        .await
        .with_context(|| format!("listen on {}", cfg.node.listen))?;
    let addr = cfg.node.advertise.unwrap_or_else(|| server.local_addr());
    let manager = match (&cfg.manager, &cluster, &initial_map) {
        (Some(m), Some(c), Some(map)) => Some(start_manager(m, c, map, node_id, addr, &slot, &peers).await?),
        _ => None,
    };
    if let Some(c) = &cluster {
        let joined = join_cluster(&cfg, c, node_id, addr, meta.as_ref(), store.as_ref(), &peers, map_tx).await?;
        background.tasks.extend(joined.tasks);
    }
    let _metrics = match metrics_listen(&cfg)? {
        Some(a) => {
            scrape_hooks(store.clone(), manager.clone(), meta.clone(), map_rx.clone());
            Some(serve_metrics(a).await?)
        }
        None => None,
    };
    // Handlers first: whoever reads the line below may send SIGTERM at once.
    let shutdown = Shutdown::install()?;
    // Scripts and tests read this line to learn the port when listening on :0.
    println!("{}{}", crate::banner::LISTENING, server.local_addr());
    info!(addr = %server.local_addr(), id = node_id.0, data = cfg.data.is_some(), meta = meta.is_some(),
        manager = manager.is_some(), "node started");
    shutdown.wait().await;
    info!("shutting down");
    background.stop();
    if let Some(m) = &meta {
        m.stop();
    }
    server.shutdown().await;
    if let Some(s) = store {
        checkpoint(s).await?;
    }
    if let Some(m) = manager {
        m.shutdown().await;
    }
    peers.close();
    Ok(())
}

/// The cluster secret and the transport's settings (the node's frame limit).
fn secret_and_transport(cfg: &NodeConfig) -> Result<(ClusterSecret, TransportConfig)> {
    let secret = ClusterSecret::from_file(&cfg.node.secret_file)
        .with_context(|| format!("load cluster secret {}", cfg.node.secret_file.display()))?;
    let transport = TransportConfig {
        max_frame_bytes: u32::try_from(cfg.node.max_frame_bytes.0).unwrap_or(u32::MAX),
        ..TransportConfig::default()
    };
    Ok((secret, transport))
}

/// Opens the metadata service of a node that has one (before the server binds, so its
/// handlers are there from the first request); it learns maps through `map_rx`.
async fn open_meta(
    cfg: &NodeConfig,
    node_id: NodeId,
    caps: &CapKey,
    peers: &PeerClient,
    map_rx: &tokio::sync::watch::Receiver<Arc<ClusterMap>>,
) -> Result<Option<MetaNode>> {
    let Some(m) = &cfg.meta else { return Ok(None) };
    let mut mc = MetaConfig::new(node_id, m.dir.clone())
        .with_frame_limit(usize::try_from(cfg.node.max_frame_bytes.0).unwrap_or(usize::MAX));
    mc.dead_coordinator_locks = Duration::from_millis(m.dead_coordinator_locks_ms);
    mc.caps = Some(caps.clone());
    let node = MetaNode::open(mc, peers.clone(), map_rx.clone())
        .await
        .with_context(|| format!("open metadata store in {}", m.dir.display()))?;
    Ok(Some(node))
}

/// The Prometheus endpoint on `addr` (`metrics_listen` checked the exposure).
async fn serve_metrics(addr: std::net::SocketAddr) -> Result<shingle_metrics::http::Endpoint> {
    let e = shingle_metrics::http::Endpoint::bind(addr, true)
        .await
        .with_context(|| format!("metrics endpoint on {addr}"))?;
    info!(addr = %e.local_addr(), "metrics at http://{}/metrics", e.local_addr());
    Ok(e)
}

/// Makes the chunk index durable at shutdown, so the next start replays nothing; a
/// failure is logged (the next start replays the zones instead).
async fn checkpoint(store: Store) -> Result<()> {
    if let Err(e) = tokio::task::spawn_blocking(move || store.checkpoint()).await? {
        warn!(error = %e, "chunk index checkpoint at shutdown failed; the next start replays the zones");
    }
    Ok(())
}

/// Opens a data node's zoned device (a block device, or one emulated in files) and its
/// chunk store; returns the store and the chunk service's handlers.
async fn open_data(
    d: &crate::config::DataSection,
    regions: &Arc<RegionTable>,
    peers: &PeerClient,
    caps: CapKey,
) -> Result<(Store, Router)> {
    std::fs::create_dir_all(&d.dir).with_context(|| format!("create data dir {}", d.dir.display()))?;
    let device: Arc<dyn ZonedDevice> = match &d.device {
        Some(dev) => {
            Arc::new(BlockZonedDevice::open(dev).with_context(|| format!("open zoned block device {}", dev.display()))?)
        }
        None => {
            let geometry = Geometry {
                zone_count: d.zones,
                zone_capacity: d.zone_size.0,
                block_size: u32::try_from(d.block_size.0).unwrap_or(4096),
                max_open_zones: 0,
            };
            let dir = d.dir.join("zones");
            Arc::new(
                FileZonedDevice::open_or_create(&dir, geometry)
                    .with_context(|| format!("open emulated zoned device {}", dir.display()))?,
            )
        }
    };
    let options = StoreOptions {
        reserved_zones: d.reserved_zones,
    };
    let store = tokio::task::spawn_blocking({
        let index = d.dir.join("index.redb");
        move || ChunkStore::open(device, &index, options)
    })
    .await?
    .context("open chunk store")?;
    let store = Arc::new(store);
    let service = ChunkService::new(
        store.clone(),
        regions.clone(),
        d.stage_cache.0,
        peers.clone(),
        Some(caps),
    );
    Ok((store, service.router()))
}

/// Starts this node's manager; the lowest-numbered manager forms the group on first
/// start (a no-op later).
async fn start_manager(
    m: &crate::config::ManagerSection,
    c: &ClusterFile,
    map: &ClusterMap,
    node_id: NodeId,
    addr: std::net::SocketAddr,
    slot: &ManagerSlot,
    peers: &PeerClient,
) -> Result<Manager> {
    let mut mc = ManagerConfig::new(node_id.0, addr, m.dir.clone());
    mc.down_after_ms = m.down_after_ms;
    mc.down_phi = m.down_phi;
    mc.heartbeat_pause_ms = m.heartbeat_pause_ms;
    mc.out_after_ms = m.out_after_ms;
    mc.down_on_refused = m.down_on_refused;
    let manager = Manager::start_in(slot, mc, peers.clone(), map.clone())
        .await
        .context("start the manager")?;
    if c.managers.iter().map(|m| m.id).min() == Some(node_id.0) {
        let members = c.managers.iter().map(|m| (m.id, m.addr)).collect();
        manager.initialize(members).await.context("form the manager group")?;
    }
    Ok(manager)
}

/// Registers with the managers and follows their maps (forwarded to the metadata
/// service through `map_tx`), then starts the daemons of this node's roles: the
/// metadata service, repair and purges on meta nodes; scrub healing and the orphan
/// sweep on data nodes.
#[allow(clippy::too_many_arguments)]
async fn join_cluster(
    cfg: &NodeConfig,
    c: &ClusterFile,
    node_id: NodeId,
    addr: std::net::SocketAddr,
    meta: Option<&MetaNode>,
    store: Option<&Store>,
    peers: &PeerClient,
    map_tx: tokio::sync::watch::Sender<Arc<ClusterMap>>,
) -> Result<Background> {
    let mut bg = Background::default();
    let info = NodeInfo {
        id: node_id,
        addr,
        roles: Roles {
            manager: cfg.manager.is_some(),
            meta: cfg.meta.is_some(),
            data: cfg.data.is_some(),
        },
        domain: cfg.node.domain.clone().unwrap_or_else(|| format!("node-{}", node_id.0)),
        state: NodeState::Up,
    };
    let wc = WatchConfig {
        managers: c.manager_addrs(),
        node: Some(info),
        interval: std::time::Duration::from_millis(500),
        touch_timeout: std::time::Duration::from_millis(1500),
    };
    let touch = meta.cloned();
    let watch = MapWatch::start(peers.clone(), wc, Duration::from_secs(120), move |ok| {
        if let Some(m) = &touch {
            m.set_in_touch(ok);
        }
    })
    .await
    .context("register with the managers")?;
    let mut rx = watch.subscribe();
    let _ = map_tx.send(rx.borrow_and_update().clone());
    bg.tasks.push(tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let m = rx.borrow_and_update().clone();
            if map_tx.send(m).is_err() {
                return;
            }
        }
    }));
    if let (Some(m), Some(ms)) = (meta, &cfg.meta) {
        m.attach_watch(watch.clone());
        m.start();
        bg.tasks.extend(meta_daemons(m, ms, &watch, peers));
    }
    if let (Some(store), Some(d)) = (store, &cfg.data) {
        bg.tasks.extend(data_daemons(store, d, addr, &watch, peers));
    }
    Ok(bg)
}

/// The daemons of a meta node: repair scans and purges of removed files.
fn meta_daemons(
    m: &MetaNode,
    ms: &crate::config::MetaSection,
    watch: &MapWatch,
    peers: &PeerClient,
) -> Vec<tokio::task::JoinHandle<()>> {
    let rc = crate::daemons::repair::RepairConfig {
        interval: Duration::from_millis(ms.repair_interval_ms),
        bytes_per_sec: ms.rebuild_rate.0,
        ..Default::default()
    };
    let mc = shingle_meta::meta_client::MetaClient::new(peers.clone(), watch.clone());
    let purge = crate::daemons::reclaim::ReclaimConfig {
        purge_interval: Duration::from_millis(ms.purge_interval_ms),
        ..Default::default()
    };
    vec![
        tokio::spawn(crate::daemons::reclaim::purge_loop(
            m.clone(),
            mc.clone(),
            peers.clone(),
            purge,
        )),
        tokio::spawn(crate::daemons::repair::run(m.clone(), mc, peers.clone(), rc)),
    ]
}

/// The daemons of a data node: healing what scrubs find corrupt, and the sweep of
/// shards no committed layout references.
fn data_daemons(
    store: &Store,
    d: &crate::config::DataSection,
    addr: std::net::SocketAddr,
    watch: &MapWatch,
    peers: &PeerClient,
) -> Vec<tokio::task::JoinHandle<()>> {
    let every = Duration::from_millis(d.sweep_interval_ms);
    let sweep = crate::daemons::reclaim::ReclaimConfig {
        sweep_interval: every,
        grace: every,
        ..Default::default()
    };
    let mc = shingle_meta::meta_client::MetaClient::new(peers.clone(), watch.clone());
    let scrubbed = store.clone();
    let swept = store.clone();
    vec![
        tokio::spawn(crate::daemons::heal::heal_loop(
            move || corrupt_versions(&scrubbed),
            addr,
            mc.clone(),
            peers.clone(),
            Duration::from_millis(d.scrub_interval_ms),
        )),
        tokio::spawn(crate::daemons::reclaim::sweep_loop(
            move || swept.inos(),
            addr,
            mc,
            peers.clone(),
            sweep,
        )),
    ]
}

/// Scrubs the store: the (shard, version) pairs that fail verification.
fn corrupt_versions(store: &ChunkStore<Arc<dyn ZonedDevice>>) -> Vec<(shingle_data::chunk::ChunkKey, u64)> {
    let mut bad = Vec::new();
    for key in store.scrub().corrupt {
        for v in store.versions(&key) {
            if matches!(
                store.get_version(&key, v),
                Err(shingle_data::store::StoreError::Corrupt { .. })
            ) {
                bad.push((key, v));
            }
        }
    }
    bad
}

/// Collects zones while free zones are below `free_below`: every 2 s when there is
/// room, again at once while a pass made progress and room is still short (a stream of
/// rewrites turns zones into garbage faster than one zone a pass reclaims). Every 2 s
/// it also checkpoints the chunk index when puts left it behind the zones (what a
/// crash would replay stays small on a quiet node).
async fn gc_loop(store: Arc<ChunkStore<Arc<dyn ZonedDevice>>>, free_below: u32) {
    let mut pressed = false;
    loop {
        let pause = if pressed { 50 } else { 2000 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let s = store.clone();
        let r = tokio::task::spawn_blocking(move || {
            if !pressed && let Err(e) = s.checkpoint() {
                warn!(error = %e, "chunk index checkpoint failed");
            }
            if s.stats().zones_free < free_below {
                Some(s.gc(4, 0.2))
            } else {
                None
            }
        })
        .await;
        pressed = matches!(&r, Ok(Some(Ok(rep))) if !rep.zones_reset.is_empty());
        match r {
            Ok(Some(Ok(rep))) if !rep.zones_reset.is_empty() => {
                info!(
                    zones = rep.zones_reset.len(),
                    bytes_moved = rep.bytes_moved,
                    "GC reclaimed zones"
                );
            }
            Ok(Some(Err(e))) => warn!(error = %e, "GC pass failed"),
            _ => {}
        }
    }
}

/// SIGINT and SIGTERM, caught from the moment this is made (a signal that arrives before
/// [`Shutdown::wait`] is polled still counts, instead of killing the process).
pub struct Shutdown {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Shutdown {
    /// Installs the handlers.
    pub fn install() -> Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Shutdown {
            int: signal(SignalKind::interrupt()).context("install SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("install SIGTERM handler")?,
        })
    }

    /// Waits for either signal.
    pub async fn wait(mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

pub async fn wait_for_signal() -> Result<()> {
    Shutdown::install()?.wait().await;
    Ok(())
}
