//! Following the cluster map from outside the manager group.
//!
//! [`MapWatch`] keeps the newest map a node or client knows, in a watch channel. A
//! server node also registers itself and heartbeats every manager (the leader marks it
//! Down when heartbeats stop); the heartbeat replies carry the managers' epoch, so a
//! newer map is fetched within one heartbeat. Clients poll the epoch the same way
//! without registering, and anyone may ask for an immediate refresh after a peer
//! answered "stale map".

use crate::ids::Epoch;
use crate::manager::ManagerError;
use crate::manager::rpc::{Heartbeat, HeartbeatRequest};
use crate::manager::{fetch_map, propose};
use crate::map::{ClusterMap, MapCommand, NodeInfo};
use shingle_transport::{CallOptions, PeerClient, RpcChannel};
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
                    propose(&client, &cfg.managers, &MapCommand::Register(n.clone())).await?;
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
        let (tx, rx) = watch::channel(Arc::new(map));
        let kick = Arc::new(Notify::new());
        tokio::spawn(follow(client, cfg, tx, kick.clone(), Box::new(on_touch)));
        Ok(MapWatch { rx, kick })
    }

    /// The newest map.
    pub fn current(&self) -> Arc<ClusterMap> {
        self.rx.borrow().clone()
    }

    /// A receiver of every newer map.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterMap>> {
        self.rx.clone()
    }

    /// Asks for a refresh now and waits (up to `wait`) for a map newer than `than`.
    pub async fn refresh(&self, than: Epoch, wait: Duration) -> Arc<ClusterMap> {
        self.kick.notify_one();
        let mut rx = self.rx.clone();
        let _ = tokio::time::timeout(wait, rx.wait_for(|m| m.epoch > than)).await;
        self.current()
    }
}

type TouchFn = Box<dyn Fn(bool) + Send + Sync>;

async fn follow(
    client: PeerClient,
    cfg: WatchConfig,
    tx: watch::Sender<Arc<ClusterMap>>,
    kick: Arc<Notify>,
    on_touch: TouchFn,
) {
    let mut last_ok = Instant::now();
    let mut told_ok = true;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval) => {}
            _ = kick.notified() => {}
            _ = tx.closed() => return,
        }
        let known = tx.borrow().epoch;
        let mut newest = known;
        let mut any = false;
        let node_id = cfg.node.as_ref().map_or(0, |n| n.id.0);
        // Every manager hears the heartbeat (any of them may lead next), in parallel so a
        // dead one delays nobody.
        let calls = cfg.managers.iter().map(|&m| {
            let client = &client;
            let req = HeartbeatRequest {
                node_id,
                epoch: known.0,
            };
            async move {
                let r = client
                    .call::<Heartbeat>(
                        m,
                        &req,
                        CallOptions::timeout(cfg.interval.max(Duration::from_millis(500))),
                    )
                    .await;
                (m, r)
            }
        });
        for (m, r) in crate::join::join_all(calls).await {
            match r {
                Ok(r) => {
                    any = true;
                    newest = newest.max(Epoch(r.epoch));
                }
                Err(e) => debug!(manager = %m, error = %e, "heartbeat failed"),
            }
        }
        if any {
            last_ok = Instant::now();
            if !told_ok {
                info!("in touch with the managers again");
            }
            told_ok = true;
            on_touch(true);
        } else if told_ok && last_ok.elapsed() >= cfg.touch_timeout {
            warn!(
                silent_ms = last_ok.elapsed().as_millis() as u64,
                "no manager answers heartbeats"
            );
            told_ok = false;
            on_touch(false);
        }
        if newest > known {
            match fetch_map(&client, &cfg.managers).await {
                Ok(map) if map.epoch > known => {
                    debug!(epoch = map.epoch.0, "newer cluster map");
                    let _ = tx.send(Arc::new(map));
                }
                Ok(_) => {}
                Err(e) => debug!(error = %e, "cannot fetch the newer map"),
            }
        }
    }
}
