//! Corrupt shards are rebuilt where they are: every data node scrubs its own chunks now
//! and then, and each shard version that fails verification and that a committed layout
//! names is rebuilt on the node from the other shards of its stripe (`RepairShard` to
//! itself, replacing the corrupt copy at the same version). The corrupt record then no
//! longer pins its zone, so zone GC can reclaim it. A corrupt version no layout names is
//! left to the writer or the sweep (it may be a store about to be committed).
//!
//! The repair scan (`repair`) only sees shards that are missing; this finds the ones that
//! are present but wrong, which only the node that holds them can tell cheaply.

use shingle_data::chunk::ChunkKey;
use shingle_data::wire::{RepairShard, RepairShardRequest, ShardId, ShardSource};
use shingle_meta::ids::Ino;
use shingle_meta::meta_client::MetaClient;
use shingle_meta::namespace::{Layout, StripeRec};
use shingle_meta::placement::stripe_pg;
use shingle_transport::{CallOptions, PeerClient, RpcChannel};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// Every `interval`, asks `scrub` for the shard versions of this node that fail
/// verification (the node's store re-reads and checks every chunk) and rebuilds those a
/// layout names, on the node at `addr` (this one). Runs until aborted.
pub async fn heal_loop(
    scrub: impl Fn() -> Vec<(ChunkKey, u64)> + Send + Sync + 'static,
    addr: SocketAddr,
    meta: MetaClient,
    tcp: PeerClient,
    interval: Duration,
) {
    let scrub = Arc::new(scrub);
    loop {
        tokio::time::sleep(interval).await;
        let s = scrub.clone();
        let bad = match tokio::task::spawn_blocking(move || s()).await {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "scrub task failed");
                continue;
            }
        };
        for (key, version) in bad {
            match heal(&meta, &tcp, addr, key, version).await {
                Ok(true) => info!(%key, version, "corrupt shard rebuilt from its stripe"),
                Ok(false) => debug!(%key, version, "corrupt shard version not named by a layout; left"),
                Err(e) => warn!(%key, version, error = %e, "cannot rebuild a corrupt shard yet"),
            }
        }
    }
}

/// Rebuilds version `version` of shard `key` on the node at `addr` from the other shards
/// of its stripe, if the file's committed layout names that version. Returns whether it
/// did.
pub async fn heal(
    meta: &MetaClient,
    tcp: &PeerClient,
    addr: SocketAddr,
    key: ChunkKey,
    version: u64,
) -> Result<bool, String> {
    let ino = Ino(key.ino);
    let layout: Layout = match meta.get_inode(ino).await {
        Ok(rec) => match rec.layout {
            Some(l) => l,
            None => return Ok(false),
        },
        Err(shingle_meta::namespace::Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(format!("read the layout: {e}")),
    };
    let Some(rec) = layout.stripes.get(&key.stripe).filter(|r| r.version == version) else {
        return Ok(false);
    };
    let req = RepairShardRequest {
        id: Some(ShardId {
            ino: key.ino,
            stripe: key.stripe,
            shard: u32::from(key.shard),
        }),
        version,
        k: u32::from(layout.k),
        m: u32::from(layout.m),
        unit: layout.unit,
        stripe_len: rec.len,
        sources: sources(meta, ino, key, &layout, rec, addr),
        if_missing: false,
    };
    tcp.call::<RepairShard>(addr, &req, CallOptions::timeout(Duration::from_secs(30)))
        .await
        .map_err(|e| format!("rebuild: {e}"))?;
    Ok(true)
}

/// Where the other shards of `key`'s stripe are: the stripe's hints, else its placement
/// group's node at that index (never this node).
fn sources(
    meta: &MetaClient,
    ino: Ino,
    key: ChunkKey,
    layout: &Layout,
    rec: &StripeRec,
    me: SocketAddr,
) -> Vec<ShardSource> {
    let v = meta.view();
    let group = v.placement.pg(stripe_pg(ino, key.stripe, v.map.pgs));
    let n = usize::from(layout.k) + usize::from(layout.m);
    (0..n)
        .filter(|i| *i != usize::from(key.shard))
        .filter_map(|i| {
            let id = rec.nodes.get(i).copied().flatten().or_else(|| group.get(i).copied())?;
            let a = v.addr(id).filter(|a| *a != me)?;
            Some(ShardSource {
                addr: a.to_string(),
                shard: i as u32,
            })
        })
        .collect()
}
