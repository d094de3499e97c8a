//! `shingle serve`: runs one node with the roles its config gives it.

use crate::config::NodeConfig;
use anyhow::{Context, Result};
use shingle_data::service::ChunkService;
use shingle_data::store::{ChunkStore, StoreOptions};
use shingle_data::zone::Geometry;
use shingle_data::zone::ZonedDevice;
use shingle_data::zone::blockdev::BlockZonedDevice;
use shingle_data::zone::file::FileZonedDevice;
use shingle_transport::{ClusterSecret, RegionTable, Router, Server, TcpClient, TransportConfig};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Runs a node until SIGINT or SIGTERM, then shuts down gracefully.
pub async fn run(config_path: &Path) -> Result<()> {
    let cfg = NodeConfig::load(config_path)?;
    let secret = ClusterSecret::from_file(&cfg.node.secret_file)
        .with_context(|| format!("load cluster secret {}", cfg.node.secret_file.display()))?;
    let transport = TransportConfig {
        max_frame_bytes: u32::try_from(cfg.node.max_frame_bytes.0).unwrap_or(u32::MAX),
        ..TransportConfig::default()
    };
    let regions = Arc::new(RegionTable::new());
    let peers = TcpClient::new(transport.clone(), secret.clone());
    let mut router = Router::new();
    let mut gc_task = None;
    if let Some(d) = &cfg.data {
        std::fs::create_dir_all(&d.dir).with_context(|| format!("create data dir {}", d.dir.display()))?;
        let device: Arc<dyn ZonedDevice> = match &d.device {
            Some(dev) => Arc::new(
                BlockZonedDevice::open(dev).with_context(|| format!("open zoned block device {}", dev.display()))?,
            ),
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
        let service = ChunkService::new(store.clone(), regions.clone(), d.stage_cache.0, peers.clone());
        router = router.merge(service.router());
        gc_task = Some(tokio::spawn(gc_loop(store, d.gc_when_free_below)));
    }
    let server = Server::bind(cfg.node.listen, transport, secret, router, regions)
        .await
        .with_context(|| format!("listen on {}", cfg.node.listen))?;
    // Scripts and tests read this line to learn the port when listening on :0.
    println!("shingle: node listening on {}", server.local_addr());
    info!(addr = %server.local_addr(), data = cfg.data.is_some(), "node started");
    wait_for_signal().await?;
    info!("shutting down");
    if let Some(t) = gc_task {
        t.abort();
    }
    server.shutdown().await;
    peers.close();
    Ok(())
}

async fn gc_loop(store: Arc<ChunkStore<Arc<dyn ZonedDevice>>>, free_below: u32) {
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let s = store.clone();
        let r = tokio::task::spawn_blocking(move || {
            if s.stats().zones_free < free_below {
                Some(s.gc(2, 0.2))
            } else {
                None
            }
        })
        .await;
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

async fn wait_for_signal() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("wait for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}
