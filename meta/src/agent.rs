//! Following the cluster map from outside the manager group.
//!
//! [`MapWatch`] keeps the newest map a node or client knows, in a watch channel. A
//! server node also registers itself and heartbeats every manager (the leader marks it
//! Down when heartbeats stop); the heartbeat replies carry the managers' epoch, so a
//! newer map is fetched within one heartbeat. Clients poll the epoch the same way
//! without registering, and anyone may ask for an immediate refresh after a peer
//! answered "stale map", or report a peer it cannot reach
//! ([`MapWatch::report_unreachable`]) so the managers check it at once.
//!
//! Maps are fetched from a manager that has the newest epoch, with the maps between
//! the one held and the newest, which the watch keeps ([`MapWatch::chain`]) so a meta
//! node can adopt every epoch in turn. Nodes a new map shows back Up are connected to
//! at once ([`shingle_transport::PeerClient::revive`]).

use crate::ids::{Epoch, NodeId};
use crate::manager::ManagerError;
use crate::manager::rpc::{Heartbeat, HeartbeatRequest, Report, ReportRequest};
use crate::manager::{fetch_map, fetch_map_since, propose};
use crate::map::{ClusterMap, MapCommand, MapHistory, NodeInfo};
use shingle_transport::{CallOptions, PeerClient, RpcChannel};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

/// The newest map known here, kept fresh in the background.
#[derive(Clone)]
pub struct MapWatch {
    rx: watch::Receiver<Arc<ClusterMap>>,
    kick: Arc<Notify>,
    client: PeerClient,
    managers: Arc<Vec<SocketAddr>>,
    /// When each node was last reported unreachable from here.
    reported: Arc<parking_lot::Mutex<std::collections::BTreeMap<NodeId, Instant>>>,
    /// The recent maps, epoch by epoch, as far as the managers could tell.
    history: Arc<parking_lot::Mutex<MapHistory>>,
}

/// How a [`MapWatch`] keeps in touch.
#[derive(Clone, Debug)]
pub struct WatchConfig {
    /// The managers.
    pub managers: Vec<SocketAddr>,
    /// This server node, to register and heartbeat (`None` for a client).
    pub node: Option<NodeInfo>,
    /// Heartbeat / poll interval.
    pub interval: Duration,
    /// Without a successful heartbeat for this long, the node counts as out of touch.
    pub touch_timeout: Duration,
}

impl MapWatch {
    /// Registers (servers), fetches the first map, and starts following. Retries until
    /// a manager answers or `wait` passes. `on_touch` hears whether heartbeats get through.
    pub async fn start(
        client: PeerClient,
        cfg: WatchConfig,
        wait: Duration,
        on_touch: impl Fn(bool) + Send + Sync + 'static,
    ) -> Result<MapWatch, ManagerError> {
        let deadline = Instant::now() + wait;
        let map = loop {
            let r = async {
                if let Some(n) = &cfg.node {
                    let registered = propose(&client, &cfg.managers, &MapCommand::Register(n.clone())).await?;
                    // A map with this registration (a manager that restarted with this
                    // node has an older one until it catches up).
                    return fetch_map_since(&client, &cfg.managers, None, registered)
                        .await
                        .map(|(m, _)| m);
                }
                fetch_map(&client, &cfg.managers).await
            }
            .await;
            match r {
                Ok(m) if cfg.node.is_none() || m.epoch.0 > 0 => break m,
                Ok(_) => {}
                Err(e @ ManagerError::Refused(_)) => return Err(e),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(e) => debug!(error = %e, "managers not reachable yet"),
            }
            if Instant::now() >= deadline {
                return Err(ManagerError::NoManagers);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        if let Some(n) = &cfg.node {
            info!(node = n.id.0, epoch = map.epoch.0, "registered with the managers");
        }
        let map = Arc::new(map);
        let history = Arc::new(parking_lot::Mutex::new(MapHistory::default()));
        history.lock().record(map.clone());
        let (tx, rx) = watch::channel(map);
        let kick = Arc::new(Notify::new());
        let managers = Arc::new(cfg.managers.clone());
        tokio::spawn(follow(
            client.clone(),
            cfg,
            tx,
            kick.clone(),
            Box::new(on_touch),
            history.clone(),
        ));
        Ok(MapWatch {
            rx,
            kick,
            client,
            managers,
            reported: Arc::default(),
            history,
        })
    }

    /// The maps of every epoch in `from..=to` this agent has seen, in order, or `None`
    /// when any is missing (see [`MapHistory`]): a map newer than the last one
    /// adopted is published only after the maps between were recorded here.
    pub fn chain(&self, from: Epoch, to: Epoch) -> Option<Vec<Arc<ClusterMap>>> {
        self.history.lock().chain(from, to)
    }

    /// The newest map.
    pub fn current(&self) -> Arc<ClusterMap> {
        self.rx.borrow().clone()
    }

    /// A receiver of every newer map.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterMap>> {
        self.rx.clone()
    }

    /// Commits `cmd` through the managers (any of them forwards to the leader), then
    /// asks for the newer map.
    pub async fn propose(&self, cmd: &MapCommand) -> Result<Epoch, ManagerError> {
        let r = propose(&self.client, &self.managers, cmd).await;
        self.kick.notify_one();
        r
    }

    /// Asks for a refresh now, without waiting for it.
    pub fn kick(&self) {
        self.kick.notify_one();
    }

    /// Tells the managers that `node` could not be reached (a connect failed or a
    /// connection broke). A hint, sent in the background at most every 250 ms per node:
    /// the leader connects to the node itself and marks it Down at once only if its
    /// address refuses connections, so a dead node's partitions and shards move on
    /// without waiting for its heartbeats to be missed.
    pub fn report_unreachable(&self, node: NodeId) {
        let now = Instant::now();
        {
            let mut r = self.reported.lock();
            if r.get(&node)
                .is_some_and(|t| now.saturating_duration_since(*t) < Duration::from_millis(250))
            {
                return;
            }
            r.insert(node, now);
            if r.len() > 4096 {
                r.retain(|_, t| now.saturating_duration_since(*t) < Duration::from_secs(1));
            }
        }
        let (client, managers) = (self.client.clone(), self.managers.clone());
        debug!(node = node.0, "reporting an unreachable node to the managers");
        tokio::spawn(async move {
            let req = ReportRequest {
                unreachable: vec![node.0],
            };
            let calls = managers.iter().map(|&m| {
                let (client, req) = (&client, &req);
                async move {
                    let _ = client
                        .call::<Report>(m, req, CallOptions::timeout(Duration::from_millis(500)))
                        .await;
                }
            });
            futures_util::future::join_all(calls).await;
        });
    }

    /// Asks for a refresh now and waits (up to `wait`) for a map newer than `than`.
    /// The managers are asked again every 50 ms meanwhile: the change awaited (a node
    /// just reported dead being marked Down) may be committed a moment after the first
    /// ask.
    pub async fn refresh(&self, than: Epoch, wait: Duration) -> Arc<ClusterMap> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut rx = self.rx.clone();
        loop {
            self.kick.notify_one();
            let step = (tokio::time::Instant::now() + Duration::from_millis(50)).min(deadline);
            if tokio::time::timeout_at(step, rx.wait_for(|m| m.epoch > than))
                .await
                .is_ok()
                || tokio::time::Instant::now() >= deadline
            {
                return self.current();
            }
        }
    }
}

type TouchFn = Box<dyn Fn(bool) + Send + Sync>;

/// How long one manager may fail a node's heartbeats (while others answer) before the
/// node says so.
const MANAGER_SILENT: Duration = Duration::from_secs(5);

/// The shortest time between two rounds of heartbeats of one agent.
const KICK_GAP: Duration = Duration::from_millis(10);

/// The longest a map fetch of the follow loop may take (every manager asked in turn);
/// the loop's next heartbeat waits for it.
const FETCH_LIMIT: Duration = Duration::from_secs(2);

async fn follow(
    client: PeerClient,
    cfg: WatchConfig,
    tx: watch::Sender<Arc<ClusterMap>>,
    kick: Arc<Notify>,
    on_touch: TouchFn,
    history: Arc<parking_lot::Mutex<MapHistory>>,
) {
    let mut touch = Touch {
        last_ok: Instant::now(),
        told_ok: true,
        failing: BTreeMap::new(),
    };
    let mut last_round = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval) => {}
            _ = kick.notified() => {}
            _ = tx.closed() => return,
        }
        // Kicks (callers waiting for a newer map) come as often as their retries; the
        // managers are asked at most every KICK_GAP for them.
        if let Some(left) = KICK_GAP.checked_sub(last_round.elapsed()) {
            tokio::time::sleep(left).await;
        }
        last_round = Instant::now();
        let known = tx.borrow().epoch;
        let mut by_epoch = touch.heartbeat(&client, &cfg, known).await;
        touch.tell(&cfg, !by_epoch.is_empty(), &on_touch);
        let newest = by_epoch.iter().map(|e| e.0).fold(known, Epoch::max);
        if newest > known {
            // The map is fetched from a manager that has it, newest first (a manager that
            // just restarted trails the others for a while).
            by_epoch.sort_by_key(|e| std::cmp::Reverse(e.0));
            let order: Vec<SocketAddr> = by_epoch.iter().map(|(_, m)| *m).collect();
            adopt_newer(&client, &tx, &history, &order, known, newest).await;
        }
    }
}

/// What [`follow`] remembers between rounds about its managers.
struct Touch {
    /// When a manager last answered a heartbeat.
    last_ok: Instant,
    /// Whether being in touch is what was last logged and told.
    told_ok: bool,
    /// Per manager: since when its heartbeats fail (while others may answer), and
    /// whether that was logged. Only the leader's ear keeps a node Up: a node that
    /// reaches two managers but never the leader is marked Down and stays Down.
    failing: BTreeMap<SocketAddr, (Instant, bool)>,
}

impl Touch {
    /// Sends every manager the heartbeat (any of them may lead next), in parallel so a
    /// dead one delays nobody: the managers that answered, with the epoch each has.
    async fn heartbeat(&mut self, client: &PeerClient, cfg: &WatchConfig, known: Epoch) -> Vec<(Epoch, SocketAddr)> {
        let node_id = cfg.node.as_ref().map_or(0, |n| n.id.0);
        let calls = cfg.managers.iter().map(|&m| {
            let req = HeartbeatRequest {
                node_id,
                epoch: known.0,
            };
            async move {
                let timeout = CallOptions::timeout(cfg.interval.max(Duration::from_millis(500)));
                (m, client.call::<Heartbeat>(m, &req, timeout).await)
            }
        });
        let mut by_epoch = Vec::with_capacity(cfg.managers.len());
        for (m, r) in futures_util::future::join_all(calls).await {
            match r {
                Ok(r) => {
                    by_epoch.push((Epoch(r.epoch), m));
                    if self.failing.remove(&m).is_some_and(|(_, told)| told) {
                        info!(manager = %m, "manager answers heartbeats again");
                    }
                }
                Err(e) => {
                    debug!(manager = %m, error = %e, "heartbeat failed");
                    let (since, told) = self.failing.entry(m).or_insert((Instant::now(), false));
                    if node_id != 0 && !*told && since.elapsed() >= cfg.touch_timeout.max(MANAGER_SILENT) {
                        *told = true;
                        warn!(
                            manager = %m,
                            silent_ms = since.elapsed().as_millis() as u64,
                            error = %e,
                            "a manager does not answer this node's heartbeats"
                        );
                    }
                }
            }
        }
        by_epoch
    }

    /// Tells `on_touch` (and the log) when the node comes back in touch with the
    /// managers, or has heard none for the touch timeout.
    fn tell(&mut self, cfg: &WatchConfig, any: bool, on_touch: &TouchFn) {
        if any {
            self.last_ok = Instant::now();
            if !self.told_ok {
                info!("in touch with the managers again");
            }
            self.told_ok = true;
            on_touch(true);
        } else if self.told_ok && self.last_ok.elapsed() >= cfg.touch_timeout {
            warn!(
                silent_ms = self.last_ok.elapsed().as_millis() as u64,
                "no manager answers heartbeats"
            );
            self.told_ok = false;
            on_touch(false);
        }
    }
}

/// Fetches the maps after `known` up to (at least) `newest` from the first of `order`
/// that has them, records each in the history and publishes the newest.
async fn adopt_newer(
    client: &PeerClient,
    tx: &watch::Sender<Arc<ClusterMap>>,
    history: &parking_lot::Mutex<MapHistory>,
    order: &[SocketAddr],
    known: Epoch,
    newest: Epoch,
) {
    // Bounded well below the transport's default deadline: the next heartbeat waits
    // for this fetch, and a node whose heartbeats stop is marked Down.
    let fetched = tokio::time::timeout(FETCH_LIMIT, fetch_map_since(client, order, Some(known), newest))
        .await
        .unwrap_or(Err(ManagerError::NoManagers));
    match fetched {
        Ok((map, between)) if map.epoch > known => {
            debug!(epoch = map.epoch.0, between = between.len(), "newer cluster map");
            let map = Arc::new(map);
            let mut prev = tx.borrow().clone();
            {
                let mut h = history.lock();
                for m in between.into_iter().map(Arc::new).chain([map.clone()]) {
                    // Nodes back Up are connected to at once, not after the reconnect
                    // backoff built up while they were away.
                    for addr in m.returned_since(&prev) {
                        client.revive(addr);
                    }
                    h.record(m.clone());
                    prev = m;
                }
            }
            let _ = tx.send(map);
        }
        Ok(_) => {}
        Err(e) => debug!(error = %e, "cannot fetch the newer map"),
    }
}
