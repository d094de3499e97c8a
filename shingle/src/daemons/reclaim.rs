//! Space comes back: removed files' data is purged, and shards nothing names are swept.
//!
//! **The rule.** A shard version stops being live when the commit that replaced it, the
//! truncate below it, or the removal of its file's last link is durable. Writers delete
//! the versions their commits and truncates replace (the client's content core queues
//! them). The removal of a file's last link queues a *purge* in the metadata partition
//! of its inode (a replicated record, so it survives any node's crash); this module
//! carries purges out and catches what the others missed:
//!
//! - [`purge_loop`] (every meta node, for the partitions it is primary of): a removed
//!   file whose hold has passed gets `DeleteFile` on every data node that is up (every
//!   stripe, shard and version of the inode, also those on spares or left by failed
//!   writes); when all of them answered, `Purged` forgets the record. A pass takes up
//!   to 256 files: one `DeleteFile` per data node names them all (one durable index
//!   commit there), and their `Purged` records are written 16 at a time. A client that has
//!   the file open keeps moving the hold forward while it does (see `fs`); when that
//!   client dies, the hold runs out and the data goes.
//! - [`sweep_loop`] (every data node): every inode with shards here is asked `Alive`
//!   (exists, or waits for its purge). Shards of an inode found dead at two passes at
//!   least a grace period apart are deleted: a node that was down during the purge,
//!   shards of a removed file brought back by an index rebuild. The decision is the
//!   pure [`Sweep`]; an inode whose state cannot be learned is never deleted. (Stray
//!   versions of files that still exist — a crashed writer's uncommitted stores, an old
//!   copy a rebalance failed to delete — go when the file does.)
//!
//! Zone GC then reclaims the space; `df` reports live bytes (the data nodes' index).

use futures_util::future::join_all;
use shingle_data::wire::{DeleteFile, DeleteFileRequest, MAX_DELETE_FILES};
use shingle_meta::ids::Ino;
use shingle_meta::meta_client::MetaClient;
use shingle_meta::namespace::types::now_ns;
use shingle_meta::service::MetaNode;
use shingle_transport::{CallOptions, PeerClient, RpcChannel};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Inodes a sweep asks about per second, at most.
const SWEEP_RATE: f64 = 2_000.0;

/// Settings of the purge loop and the sweep.
#[derive(Clone, Debug)]
pub struct ReclaimConfig {
    /// Pause between purge passes.
    pub purge_interval: Duration,
    /// Pause between sweep passes.
    pub sweep_interval: Duration,
    /// An inode must be found dead this long apart before its shards are swept.
    pub grace: Duration,
}

impl Default for ReclaimConfig {
    /// Purges every second; a sweep every 10 min with a 10 min grace.
    fn default() -> Self {
        ReclaimConfig {
            purge_interval: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(600),
            grace: Duration::from_secs(600),
        }
    }
}

/// Removed files one purge pass takes, at most.
const PURGE_BATCH: usize = 256;

/// `Purged` records written at once by a pass (different partitions' batches share
/// the store's syncs; one partition's follow one another).
const PURGED_IN_FLIGHT: usize = 16;

/// Purges removed files whose data no client holds any more, in the partitions `node`
/// is primary of. Runs until aborted.
pub async fn purge_loop(node: MetaNode, meta: MetaClient, tcp: PeerClient, cfg: ReclaimConfig) {
    let mut more = false;
    loop {
        // After a full pass that worked, the next starts at once (a tree of 100,000
        // files removed is purged at the pace of the nodes, not 256 a second).
        if !more {
            tokio::time::sleep(cfg.purge_interval).await;
        }
        let inos = node.primary_purges(now_ns(), PURGE_BATCH);
        if inos.is_empty() {
            more = false;
            continue;
        }
        match purge(&meta, &tcp, &inos).await {
            Ok(n) => {
                debug!(files = inos.len(), shards = n, "removed files purged");
                more = inos.len() == PURGE_BATCH;
            }
            // An unreachable node stalls this pass; the next one retries.
            Err(e) => {
                debug!(files = inos.len(), error = %e, "purge not finished; the next pass retries");
                more = false;
            }
        }
    }
}

/// Deletes every shard of removed files `inos` on every data node that is up (one
/// call per node, all nodes at once), then forgets their purges. Returns the shard
/// versions deleted. Deleting again what is gone is harmless: a failed pass is
/// simply repeated.
pub async fn purge(meta: &MetaClient, tcp: &PeerClient, inos: &[Ino]) -> Result<u64, String> {
    let v = meta.view();
    let nodes: Vec<(u64, SocketAddr)> = v
        .map
        .nodes
        .values()
        .filter(|n| n.roles.data && v.map.is_up(n.id))
        .map(|n| (n.id.0, n.addr))
        .collect();
    let mut deleted = 0;
    for chunk in inos.chunks(MAX_DELETE_FILES) {
        let (first, more) = chunk.split_first().ok_or("no file to purge")?;
        let req = DeleteFileRequest {
            ino: first.0,
            more: more.iter().map(|i| i.0).collect(),
        };
        let calls: Vec<_> = nodes
            .iter()
            .map(|(id, addr)| delete_files(tcp, *id, *addr, req.clone()))
            .collect();
        for r in join_all(calls).await {
            deleted += r?;
        }
    }
    for chunk in inos.chunks(PURGED_IN_FLIGHT) {
        let records: Vec<_> = chunk.iter().map(|ino| record_purged(meta, *ino)).collect();
        join_all(records)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, String>>()?;
    }
    Ok(deleted)
}

/// One data node's `DeleteFile` of a purge pass; the shard versions it deleted.
async fn delete_files(tcp: &PeerClient, node: u64, addr: SocketAddr, req: DeleteFileRequest) -> Result<u64, String> {
    tcp.call::<DeleteFile>(addr, &req, CallOptions::timeout(Duration::from_secs(10)))
        .await
        .map(|r| r.deleted)
        .map_err(|e| format!("delete on {node}: {e}"))
}

/// Forgets the purge of `ino` (its data is gone).
async fn record_purged(meta: &MetaClient, ino: Ino) -> Result<(), String> {
    meta.purged(ino)
        .await
        .map_err(|e| format!("record the purge of {}: {e}", ino.0))
}

/// What the sweep knows between passes: when each inode was first found dead.
#[derive(Debug, Default)]
pub struct Sweep {
    dead_since: HashMap<u64, Instant>,
}

impl Sweep {
    /// An empty sweep.
    pub fn new() -> Sweep {
        Sweep::default()
    }

    /// Records what the metadata said of `ino` at `now` (`None`: it could not be
    /// asked) and returns whether its shards are to be deleted: dead now, and already
    /// dead at least `grace` ago.
    pub fn observe(&mut self, ino: u64, alive: Option<bool>, now: Instant, grace: Duration) -> bool {
        match alive {
            Some(false) => {
                let since = *self.dead_since.entry(ino).or_insert(now);
                now.duration_since(since) >= grace
            }
            Some(true) => {
                self.dead_since.remove(&ino);
                false
            }
            None => false,
        }
    }

    /// Forgets inodes that no longer have shards here (or were deleted).
    pub fn retain(&mut self, present: &[u64]) {
        let keep: std::collections::HashSet<u64> = present.iter().copied().collect();
        self.dead_since.retain(|i, _| keep.contains(i));
    }

    /// Inodes found dead and waiting for their grace.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.dead_since.len()
    }
}

/// Sweeps the shards of dead inodes off the data node at `addr`, whose stored inodes
/// `inos` lists. Runs until aborted.
pub async fn sweep_loop(
    inos: impl Fn() -> Vec<u64> + Send + 'static,
    addr: SocketAddr,
    meta: MetaClient,
    tcp: PeerClient,
    cfg: ReclaimConfig,
) {
    let mut sweep = Sweep::new();
    loop {
        tokio::time::sleep(cfg.sweep_interval).await;
        let present = inos();
        sweep.retain(&present);
        let mut swept = 0u64;
        let started = Instant::now();
        for (n, ino) in present.into_iter().enumerate() {
            // At most SWEEP_RATE questions a second: a node with millions of files asks
            // over minutes, not in a burst.
            let due = started + Duration::from_secs_f64(n as f64 / SWEEP_RATE);
            tokio::time::sleep_until(due.into()).await;
            let alive = match meta.alive(Ino(ino)).await {
                Ok(a) => Some(a),
                Err(e) => {
                    debug!(ino, error = %e, "cannot tell whether an inode lives; its shards stay");
                    None
                }
            };
            if !sweep.observe(ino, alive, Instant::now(), cfg.grace) {
                continue;
            }
            match tcp
                .call::<DeleteFile>(
                    addr,
                    &DeleteFileRequest { ino, more: Vec::new() },
                    CallOptions::timeout(Duration::from_secs(10)),
                )
                .await
            {
                Ok(r) => {
                    swept += r.deleted;
                    sweep.dead_since.remove(&ino);
                }
                Err(e) => warn!(ino, error = %e, "sweeping a dead inode's shards failed"),
            }
        }
        if swept > 0 {
            info!(shards = swept, "swept the shards of removed files");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_inode_dead_twice_a_grace_apart_is_swept() {
        let mut s = Sweep::new();
        let t0 = Instant::now();
        let g = Duration::from_secs(60);
        assert!(
            !s.observe(7, Some(false), t0, g),
            "first sighting only starts the grace"
        );
        assert!(!s.observe(7, Some(false), t0 + Duration::from_secs(59), g));
        assert!(s.observe(7, Some(false), t0 + g, g));
        // Alive in between (a lagging answer, or recreated): the grace starts over.
        assert!(!s.observe(8, Some(false), t0, g));
        assert!(!s.observe(8, Some(true), t0 + g, g));
        assert!(!s.observe(8, Some(false), t0 + g * 2, g));
        assert!(s.observe(8, Some(false), t0 + g * 3, g));
        // Unknown never deletes and does not reset.
        assert!(!s.observe(9, Some(false), t0, g));
        assert!(!s.observe(9, None, t0 + g, g));
        assert!(s.observe(9, Some(false), t0 + g, g));
        s.retain(&[9]);
        assert_eq!(s.pending(), 1);
    }
}
