//! A meta node: the partitions it holds, their replication, and the RPC handlers.
//!
//! **Roles per partition** come from the map: the replica list of partition `p` is
//! `placement.partition(p)`; its *members* are the listed nodes that are Up, and the
//! first member is the *primary*. The primary numbers every batch (`lsn`), applies and
//! persists it, and sends it to every other member; the batch is acknowledged only when
//! all members have persisted it. A member whose copy does not follow (gap, or a copy of
//! another reign) answers `NeedInstall` and receives the whole partition.
//!
//! **Serving**: a copy serves reads (and, on the primary, writes) only when it is known
//! to be complete for the current epoch: it stayed a member across consecutive maps
//! while its node kept in touch with the managers, or it was installed by the primary
//! of this epoch. A primary that is not serving first pulls the best copy of the other
//! members, then starts a new reign (`state_epoch` = the epoch and the number of this
//! takeover within it, see [`super::replica::next_reign`]; `lsn` = 0), which makes every
//! other member reinstall: no member can follow a diverged history, even when the same
//! node takes over twice in one epoch (a restart the managers did not notice).
//!
//! **Fencing**: a member refuses batches and installs carrying an epoch older than its
//! map, so a partitioned old primary cannot get a write acknowledged.
//!
//! **Traces**: the handlers of reads, operations, batches and replication run in
//! `meta.read`, `meta.op`, `meta.execute`, `meta.batch`, `meta.replicate` (and `meta.fetch`,
//! `meta.alloc`, `meta.lock`, `meta.install`) spans with the operation, partition,
//! inode, batch size, replicas and retries: children of the transport's `rpc.server`
//! span, so a client operation's trace shows the coordinator and every replica.

use super::coordinator::{
    Coordination, Next, PlanRun, adjusts_any, answer_before, batch_ops, expected_counts, finish_ops, intent_ops,
    plan_run,
};
use super::copy::{Assembly, PieceError, Staging, Took};
use super::locks::LockTable;
use super::protocol::{Follow, Takeover};
use super::read_fence::ReadFence;
use super::replica::Replica;
use super::store::{MetaStore, Write};
use super::wire::*;
use crate::ids::{Epoch, Ino, NodeId, PartitionId};
use crate::map::{ClusterMap, MapCommand, MapView};
use crate::namespace::types::now_ns;
use crate::namespace::{DirEntry, Errno, Intent, Namespace, Need, Plan};
use crate::pause::Pause;
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use shingle_transport::cap::Right;
use shingle_transport::{CallContext, Code, PeerClient, Router, Status};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::field::Empty;
use tracing::{Instrument, Span, debug, info, info_span, warn};

/// Which file a reply's shard capability is for (see [`MetaNode::with_cap`]).
#[derive(Clone, Copy)]
enum CapFor {
    /// The file whose versions were reserved.
    File(Ino),
    /// The file created (named by the reply).
    Created,
}

/// Operations whose caller gets a shard capability with the reply.
fn cap_for(op: &NsOp) -> Option<CapFor> {
    match op {
        NsOp::ReserveVersions { ino, .. } => Some(CapFor::File(*ino)),
        NsOp::Mknod { reserve: Some(_), .. } => Some(CapFor::Created),
        _ => None,
    }
}

/// Settings of the namespace service on one node.
#[derive(Clone, Debug)]
pub struct MetaConfig {
    /// This node.
    pub node_id: NodeId,
    /// Directory of the partition store.
    pub dir: PathBuf,
    /// How long a replica may take to persist a batch before the write fails.
    pub replicate_timeout: Duration,
    /// Lease of coordinator locks (a dead coordinator's locks free after it).
    pub lock_lease: Duration,
    /// How long a coordinator keeps retrying a step of an operation it has begun.
    pub op_timeout: Duration,
    /// Bytes per piece when a partition copy moves (installs, takeover pulls): at most
    /// [`super::copy::PIECE_BYTES`], and well inside the transport's frame limit.
    pub copy_piece: usize,
    /// Bytes of copies this node holds at once while assembling installs (a piece past
    /// it is answered `Overloaded` and sent again later).
    pub copy_staging: u64,
    /// How long after its node is seen down a coordinator's locks are released when
    /// the partition of its operation cannot be seen settled (normally they go as soon
    /// as it is, well before).
    pub dead_coordinator_locks: Duration,
    /// Signs the shard capabilities handed to client keys (`None`: none are handed
    /// out, and client keys cannot write file data).
    pub caps: Option<shingle_transport::cap::CapKey>,
}

impl MetaConfig {
    /// Defaults: replicas get 2 s, locks 30 s, operations 10 s, copies move in 8 MiB
    /// pieces.
    pub fn new(node_id: NodeId, dir: PathBuf) -> Self {
        MetaConfig {
            node_id,
            dir,
            replicate_timeout: Duration::from_secs(2),
            lock_lease: Duration::from_secs(30),
            op_timeout: Duration::from_secs(10),
            copy_piece: super::copy::PIECE_BYTES,
            copy_staging: super::copy::STAGING_BYTES,
            dead_coordinator_locks: Duration::from_secs(10),
            caps: None,
        }
    }

    /// Pieces of half the transport's largest frame (the rest of a frame is the
    /// message around the piece), at most [`super::copy::PIECE_BYTES`].
    pub fn with_frame_limit(mut self, max_frame_bytes: usize) -> Self {
        self.copy_piece = (max_frame_bytes / 2).clamp(1, super::copy::PIECE_BYTES);
        self
    }
}

struct Slot {
    write: tokio::sync::Mutex<()>,
    state: RwLock<Replica>,
    /// Writes waiting for this copy's next batch ([`MetaNode::primary_write`]).
    queued: Mutex<Queue>,
}

/// Writes to one copy waiting for a batch, and whether a task leads them.
#[derive(Default)]
struct Queue {
    entries: Vec<Queued>,
    leading: bool,
}

/// One caller's write waiting in a copy's [`Queue`].
struct Queued {
    ops: Vec<PartOp>,
    from: NodeId,
    deadline: Option<Instant>,
    done: tokio::sync::oneshot::Sender<Result<(), Status>>,
    /// The caller's span: a batch's span is a child of its first write's.
    span: Span,
}

/// Most callers' writes one batch carries (each is a batch's worth on its own; this
/// keeps a batch far below a frame).
const MAX_WRITES_PER_BATCH: usize = 32;

impl Queue {
    /// The writes the next batch carries, oldest first; `None` (and no one leads any
    /// more) when none waits.
    fn next_batch(&mut self) -> Option<Vec<Queued>> {
        if self.entries.is_empty() {
            self.leading = false;
            return None;
        }
        let n = self.entries.len().min(MAX_WRITES_PER_BATCH);
        Some(self.entries.drain(..n).collect())
    }
}

impl Slot {
    fn new(r: Replica) -> Arc<Slot> {
        Arc::new(Slot {
            write: tokio::sync::Mutex::new(()),
            state: RwLock::new(r),
            queued: Mutex::new(Queue::default()),
        })
    }

    fn read(&self) -> parking_lot::RwLockReadGuard<'_, Replica> {
        self.state.read()
    }

    fn write_state(&self) -> parking_lot::RwLockWriteGuard<'_, Replica> {
        self.state.write()
    }
}

struct Inner {
    cfg: MetaConfig,
    client: PeerClient,
    store: MetaStore,
    view: RwLock<Arc<MapView>>,
    slots: RwLock<BTreeMap<PartitionId, Arc<Slot>>>,
    locks: LockTable,
    /// Intents this node drives now (the sweep leaves them alone). Lock order: this
    /// before a copy's state ([`MetaNode::settled_here`]); never taken while a copy's
    /// state is locked (two threads taking them in opposite orders hang the node).
    inflight: Mutex<BTreeSet<u64>>,
    /// Healthy contact with the managers (cleared when heartbeats fail for too long).
    in_touch: AtomicBool,
    /// Nodes that may still serve copies of partitions a map dropped them from: a
    /// primary hears from them before it acknowledges ([`super::read_fence`]).
    /// Lock order: the view's lock before this one (`adopt`), never after.
    read_fence: Mutex<ReadFence>,
    /// Questions to fenced nodes in flight, by node, with the epoch asked: partitions
    /// fenced on the same node (all of them, after a restart) share one question, and
    /// one node that does not answer holds up only the partitions that wait for it.
    fence_asks: Mutex<HashMap<NodeId, (Epoch, FenceAsk)>>,
    map_rx: watch::Receiver<Arc<ClusterMap>>,
    stopped: AtomicBool,
    /// Progress of the repair scan this node runs (reported by `Stats`).
    repair: Mutex<RepairStats>,
    /// Operations whose at-most-once markers can be forgotten, by partition.
    forgets: Mutex<BTreeMap<PartitionId, Vec<u64>>>,
    /// Answered intents whose every step is applied, by coordinating partition: the
    /// batch that drops each record rides on that partition's next batch here (or on
    /// the flush's, within [`FORGET_FLUSH`]).
    finishing: Mutex<BTreeMap<PartitionId, Vec<Finishing>>>,
    /// Intents of those (by id) from the moment every step is applied until the finish
    /// is durable or given up: a [`Quiet`] question counts them as applied. Lock
    /// order: never taken while a copy's state is locked.
    counted: Mutex<BTreeSet<u64>>,
    /// Wakes the flush of queued finishes and forgets at once.
    flush_now: tokio::sync::Notify,
    /// Client operations (by id) being coordinated here: a second attempt of one (its
    /// client retried while the first still ran) waits for the first's answer instead
    /// of running beside it — a straggler that ran after its client moved on could
    /// undo what the client did next.
    running: Mutex<HashMap<u64, Arc<Answer>>>,
    /// Copies being received in pieces, by partition.
    staging: Mutex<Staging>,
    /// Encoded copies a primary taking over is pulling in pieces, by partition.
    snapshots: Mutex<HashMap<PartitionId, Snapshot>>,
    /// The node's map agent, once it runs: refreshed at once when a caller has a newer
    /// map, told about peers that cannot be reached.
    watch: std::sync::OnceLock<crate::agent::MapWatch>,
    /// Wakes the sweep at once (a takeover may have found operations to redo).
    sweep_now: tokio::sync::Notify,
    /// Woken (all waiters) whenever a copy here begins to serve.
    served: tokio::sync::Notify,
    /// A copy here stopped serving outside a map change: catch up now.
    catch_up_now: tokio::sync::Notify,
    /// Parents and attributes of inodes other nodes hold, fetched to check subtree
    /// grants and client keys' lookups and listings.
    homes: super::subtree::Homes,
    /// Counts directories this node is primary of will get from steps that follow
    /// answers ([`Expect`]), until those steps apply here (or [`EXPECT_TTL`]).
    expected: Mutex<HashMap<Ino, Vec<(Expect, Instant)>>>,
}

/// Most [`Expect`]s one node keeps (a coordinator sends one per answered operation,
/// dropped a millisecond later; beyond this the oldest go, and a settled read misses
/// them until their steps apply).
const MAX_EXPECTED: usize = 65_536;

/// A question to a fenced node, shared by the partitions waiting for its answer.
type FenceAsk = futures_util::future::Shared<futures_util::future::BoxFuture<'static, Result<Epoch, String>>>;

/// The namespace service of one node. Clones share it.
#[derive(Clone)]
pub struct MetaNode {
    inner: Arc<Inner>,
}

fn stale(msg: impl Into<String>) -> Status {
    Status::new(Code::StaleEpoch, msg)
}

/// An encoded copy and its name.
type Snapshot = (CopyId, Arc<Vec<u8>>);

/// A copy's name and encoding, for moving it in pieces.
fn encode_copy(st: &Replica) -> Result<(CopyId, Vec<u8>), CallError> {
    let bytes = postcard::to_allocvec(&st.part).map_err(|_| CallError::Errno(Errno::EIO))?;
    Ok((st.copy_id(bytes.len() as u64), bytes))
}

fn store_failed(e: impl std::fmt::Display) -> Status {
    Status::new(Code::Internal, format!("metadata store: {e}"))
}

impl MetaNode {
    /// Opens the store in `cfg.dir` and loads every copy (none serves until the map
    /// says so). `maps` delivers the cluster maps the node learns (from its agent).
    pub async fn open(
        cfg: MetaConfig,
        client: PeerClient,
        maps: watch::Receiver<Arc<ClusterMap>>,
    ) -> Result<MetaNode, super::store::StoreError> {
        let dir = cfg.dir.clone();
        let (store, loaded) = tokio::task::spawn_blocking(move || MetaStore::open(&dir))
            .await
            .map_err(|e| super::store::StoreError(e.to_string()))??;
        let map = maps.borrow().clone();
        let mut slots = BTreeMap::new();
        for (p, (meta, recs)) in loaded {
            // The records on disk are the whole copy: start from an empty partition.
            let mut r = Replica {
                part: crate::namespace::Partition::new(p),
                meta,
                serving: false,
                counter_shared: 0,
                complete_at: None,
            };
            for (k, v) in recs {
                r.restore(k, &v)
                    .map_err(|e| super::store::StoreError(format!("partition {}: {e}", p.0)))?;
            }
            r.resume_counters();
            if r.part.split_embedded_stripes() {
                // A store of format 1 kept stripes inside inode records: rewrite the
                // copy once with stripe records before it serves.
                store
                    .commit(vec![super::store::Write::install(p, &r)])
                    .await
                    .map_err(|e| super::store::StoreError(format!("partition {}: upgrade: {e}", p.0)))?;
                info!(
                    node = cfg.node_id.0,
                    partition = p.0,
                    "stripe records split out of inode records"
                );
            }
            slots.insert(p, Slot::new(r));
        }
        info!(node = cfg.node_id.0, partitions = slots.len(), "metadata store loaded");
        let staging = cfg.copy_staging;
        let inner = Arc::new(Inner {
            cfg,
            client,
            store,
            view: RwLock::new(Arc::new(MapView::new((*map).clone()))),
            slots: RwLock::new(slots),
            locks: LockTable::default(),
            inflight: Mutex::new(BTreeSet::new()),
            in_touch: AtomicBool::new(true),
            read_fence: Mutex::new(ReadFence::default()),
            fence_asks: Mutex::new(HashMap::new()),
            map_rx: maps,
            watch: std::sync::OnceLock::new(),
            sweep_now: tokio::sync::Notify::new(),
            served: tokio::sync::Notify::new(),
            catch_up_now: tokio::sync::Notify::new(),
            stopped: AtomicBool::new(false),
            repair: Mutex::new(RepairStats::default()),
            forgets: Mutex::new(BTreeMap::new()),
            finishing: Mutex::new(BTreeMap::new()),
            counted: Mutex::new(BTreeSet::new()),
            flush_now: tokio::sync::Notify::new(),
            running: Mutex::new(HashMap::new()),
            staging: Mutex::new(Staging::new(staging)),
            snapshots: Mutex::new(HashMap::new()),
            homes: super::subtree::Homes::default(),
            expected: Mutex::new(HashMap::new()),
        });
        Ok(MetaNode { inner })
    }

    /// Starts the background work: following the map (catch-up, takeover) and redoing
    /// intents left by crashed coordinators.
    pub fn start(&self) {
        let node = self.clone();
        tokio::spawn(async move { node.follow_map().await });
        let node = self.clone();
        tokio::spawn(async move { node.sweep_intents().await });
        let node = self.clone();
        tokio::spawn(async move { node.flush_riders().await });
        let node = self.clone();
        tokio::spawn(async move { node.finish_moves().await });
    }

    /// Stops the background work.
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::Relaxed);
    }

    /// Tells the node whether its heartbeats reach the managers. A node out of touch may
    /// have been marked down without seeing it, so its copies stop serving until synced.
    pub fn set_in_touch(&self, ok: bool) {
        if !ok && self.inner.in_touch.swap(false, Ordering::Relaxed) {
            warn!("lost touch with the managers; metadata copies stop serving until they catch up");
            for s in self.inner.slots.read().values() {
                s.write_state().serving = false;
            }
            // Its partitions may get other primaries, who host their locks from an empty
            // table; what coordinators release meanwhile cannot reach this node, so the
            // keys it holds would outlive their owners here when it hosts them again.
            self.inner.locks.clear();
        } else if ok {
            self.inner.in_touch.store(true, Ordering::Relaxed);
        }
    }

    /// Files with stripes in the partitions this node is the serving primary of, in
    /// inode order after `after`: at most `limit`, and whether more may follow. The
    /// repair scan walks them.
    pub fn primary_files(&self, after: Ino, limit: usize) -> (Vec<(Ino, crate::namespace::Layout)>, bool) {
        let mut out: Vec<(Ino, crate::namespace::Layout)> = Vec::new();
        for (_, slot) in self.primary_slots(&self.view()) {
            let st = slot.read();
            if !st.serving {
                continue;
            }
            // The first `limit + 1` files of each partition: the merged first `limit` are
            // then the smallest overall, and `more` is exact.
            let mut taken = 0;
            for (ino, rec) in st
                .part
                .inodes
                .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            {
                if rec.layout.is_some() && st.part.stripes_of(*ino, 0).next().is_some() {
                    let Some(l) = st.part.inode_with_stripes(*ino, u64::MAX).and_then(|r| r.layout) else {
                        continue;
                    };
                    out.push((*ino, l));
                    taken += 1;
                    if taken > limit {
                        break;
                    }
                }
            }
        }
        out.sort_by_key(|(i, _)| *i);
        let more = out.len() > limit;
        out.truncate(limit);
        (out, more)
    }

    /// Removed files, in the partitions this node is the serving primary of, whose
    /// data may be purged at `now` (no hold left): at most `limit`, oldest first.
    pub fn primary_purges(&self, now: crate::namespace::TimeNs, limit: usize) -> Vec<Ino> {
        let mut out: Vec<(crate::namespace::TimeNs, Ino)> = Vec::new();
        for (_, slot) in self.primary_slots(&self.view()) {
            let st = slot.read();
            if !st.serving {
                continue;
            }
            out.extend(
                st.part
                    .purges
                    .iter()
                    .filter(|(_, p)| p.held_until <= now)
                    .map(|(i, p)| (p.since, *i)),
            );
        }
        out.sort_unstable();
        out.into_iter().take(limit).map(|(_, i)| i).collect()
    }

    /// Removed files waiting for a purge in the partitions this node is primary of.
    pub fn purges_pending(&self) -> usize {
        self.primary_slots(&self.view())
            .iter()
            .map(|(_, s)| s.read().part.purges.len())
            .sum()
    }

    /// The copies held here of partitions this node is primary of under `v` (serving or
    /// not: callers check under the copy's lock).
    fn primary_slots(&self, v: &MapView) -> Vec<(PartitionId, Arc<Slot>)> {
        let me = self.me();
        self.inner
            .slots
            .read()
            .iter()
            .filter(|(p, _)| v.primary(**p) == Some(me))
            .map(|(p, s)| (*p, s.clone()))
            .collect()
    }

    /// Publishes the repair scan's progress (reported by `Stats`).
    pub fn set_repair_stats(&self, r: RepairStats) {
        *self.inner.repair.lock() = r;
    }

    /// The repair scan's progress, as last reported.
    pub fn repair_stats(&self) -> RepairStats {
        self.inner.repair.lock().clone()
    }

    /// Gives the node its map agent (it proposes the node's map changes, such as a
    /// finished partition move); the first one given stays.
    pub fn attach_watch(&self, w: crate::agent::MapWatch) {
        let _ = self.inner.watch.set(w);
    }

    /// [`call`] to a peer node; a peer that cannot be reached is reported to the
    /// managers (they mark it Down at once if nothing listens at its address).
    async fn call_peer<R: MetaRpc>(&self, peer: SocketAddr, req: &R, t: Duration) -> Result<R::Reply, CallError> {
        let r = call(&self.inner.client, peer, req, t).await;
        if let Err(CallError::Transport(e)) = &r
            && e.is_peer_failure()
            && let Some(w) = self.inner.watch.get()
            && let Some(id) = self.view().map.nodes.values().find(|n| n.addr == peer).map(|n| n.id)
        {
            w.report_unreachable(id);
        }
        r
    }

    fn view(&self) -> Arc<MapView> {
        self.inner.view.read().clone()
    }

    fn me(&self) -> NodeId {
        self.inner.cfg.node_id
    }

    fn slot(&self, p: PartitionId) -> Option<Arc<Slot>> {
        self.inner.slots.read().get(&p).cloned()
    }

    fn slot_or_create(&self, p: PartitionId, partitions: u32) -> Arc<Slot> {
        let mut slots = self.inner.slots.write();
        slots
            .entry(p)
            .or_insert_with(|| Slot::new(Replica::initial(p, partitions, now_ns())))
            .clone()
    }

    /// The serving copy of `p` here, for reads.
    fn serving(&self, p: PartitionId) -> Result<Arc<Slot>, Status> {
        match self.slot(p) {
            Some(s) if s.read().serving => Ok(s),
            _ => Err(errno_status(Errno::EAGAIN)),
        }
    }

    /// [`MetaNode::primary_slot`] for a caller that came to this node as `p`'s primary:
    /// while the copy here is still taking over (or catching up), the call waits for it
    /// to serve, at most [`SERVE_WAIT`], and goes on at once when it does. Answered
    /// `EAGAIN` instead, a client tries again after its back-off, which doubles while
    /// nothing changes in the map: a takeover of ~320 ms cost a create 515 ms of waiting
    /// (5 + 10 + … + 160 + 200) when a data node died under the failover benchmark.
    /// A map that makes another node primary ends the wait (stale, as before).
    async fn primary_slot_soon(&self, p: PartitionId) -> Result<Arc<Slot>, Status> {
        // Serving, or not the primary: answered at once (every operation passes here).
        match self.primary_slot(p) {
            Err(s) if is_eagain(&s) => {}
            r => return r,
        }
        let start = tokio::time::Instant::now();
        let until = start + SERVE_WAIT;
        let mut maps = self.inner.map_rx.clone();
        loop {
            maps.borrow_and_update();
            // Made before the check: `notify_waiters` reaches it from now on.
            let served = self.inner.served.notified();
            match self.primary_slot(p) {
                Err(s) if is_eagain(&s) && tokio::time::Instant::now() < until => {}
                r => {
                    shingle_metrics::get().meta_op_serve_waits.inc();
                    Span::current().record("serve_wait_ms", start.elapsed().as_millis() as u64);
                    return r;
                }
            }
            tokio::select! {
                () = served => {}
                r = maps.changed() => if r.is_err() {
                    // The node is stopping: no map and no takeover will come.
                    return self.primary_slot(p);
                },
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// The serving copy of `p` when this node is its primary, for writes.
    fn primary_slot(&self, p: PartitionId) -> Result<Arc<Slot>, Status> {
        let v = self.view();
        if v.primary(p) != Some(self.me()) {
            return Err(stale(format!(
                "node {} is not the primary of partition {}",
                self.me().0,
                p.0
            )));
        }
        self.serving(p)
    }

    async fn check_epoch(&self, theirs: Epoch) -> Result<(), Status> {
        let mine = self.view().map.epoch;
        if theirs < mine {
            return Err(stale(format!(
                "caller's map epoch {} is older than {}",
                theirs.0, mine.0
            )));
        }
        if theirs > mine {
            // Ours is behind: have the agent fetch the newer map now, and wait briefly.
            if let Some(w) = self.inner.watch.get() {
                w.kick();
            }
            let mut rx = self.inner.map_rx.clone();
            let _ = tokio::time::timeout(Duration::from_millis(500), rx.wait_for(|m| m.epoch >= theirs)).await;
            self.adopt(rx.borrow().clone());
            if self.view().map.epoch < theirs {
                return Err(stale(format!(
                    "this node's map epoch {} is older than {}",
                    mine.0, theirs.0
                )));
            }
        }
        Ok(())
    }

    /// [`MetaNode::check_epoch`] for what makes a copy serve (a batch, an install): the
    /// sender's epoch must also not be older than the map this node adopted catching
    /// up to it. A node behind the sender that fetched a newer map than the sender's
    /// would otherwise follow a primary of an epoch that ended and serve in the new one
    /// — as a copy just promoted to primary, without the takeover that must come first
    /// (found by the simulator: seed 4 of `shingle sim --nodes 7 --partitions 16
    /// --ops 300 --clients 6 --ns-clients 3 --joins 2 --max-down 2`).
    async fn check_epoch_exact(&self, theirs: Epoch) -> Result<(), Status> {
        self.check_epoch(theirs).await?;
        let mine = self.view().map.epoch;
        if mine != theirs {
            return Err(stale(format!(
                "caller's map epoch {} is older than {}",
                theirs.0, mine.0
            )));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- map changes

    async fn follow_map(&self) {
        let mut rx = self.inner.map_rx.clone();
        let mut again = Pause::new(CATCH_UP_FIRST, CATCH_UP_LAST);
        loop {
            let map = rx.borrow_and_update().clone();
            self.adopt(map);
            let done = self.catch_up().await;
            if self.inner.stopped.load(Ordering::Relaxed) {
                return;
            }
            // Re-check now and then; a catch-up that failed is retried soon (20 ms
            // doubling to 300 ms): its partitions serve nothing meanwhile, and each try
            // reports a dead member to the managers again.
            if !done && let Some(w) = self.inner.watch.get() {
                // What it waits for (a dead member marked Down) comes with a newer map.
                w.kick();
            }
            let wait = if done { again.last() } else { again.get() };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = rx.changed() => {}
                () = self.inner.catch_up_now.notified() => {}
            }
            if done {
                again.reset();
            } else {
                again.grow();
            }
        }
    }

    /// Installs a newer map: copies that stay members across consecutive epochs keep
    /// serving; others stop until they catch up. When the map is several epochs ahead,
    /// the maps between (from the agent's history, which the managers fill) are adopted
    /// one after another, so a copy that stayed a member through all of them keeps
    /// serving (decision 0008); without them every copy stops.
    fn adopt(&self, map: Arc<ClusterMap>) {
        // The view stays locked while copies stop serving, so a copy that becomes serving
        // (`serve_in`) either sees the new view or is seen by this loop.
        let mut view = self.inner.view.write();
        let from = view.map.epoch;
        let steps = match self.inner.watch.get() {
            Some(w) if map.epoch.0 > from.0 + 1 && from.0 != 0 => w
                .chain(Epoch(from.0 + 1), map.epoch)
                .filter(|c| c.last().is_some_and(|m| **m == *map)),
            _ => None,
        };
        if let Some(steps) = &steps {
            debug!(from = from.0, to = map.epoch.0, "adopting the maps between, in order");
            shingle_metrics::get()
                .meta_map_epochs_stepped
                .inc_by(steps.len() as u64 - 1);
        }
        for m in steps.unwrap_or_else(|| vec![map]) {
            self.adopt_one(&mut view, m);
        }
    }

    fn adopt_one(&self, view: &mut Arc<MapView>, map: Arc<ClusterMap>) {
        let old = view.clone();
        if map.epoch <= old.map.epoch && old.map.epoch.0 != 0 {
            return;
        }
        let new = Arc::new(MapView::new((*map).clone()));
        let me = self.me();
        // Only consecutive epochs: a node that skipped one cannot know what it missed.
        let consecutive = map.epoch.0 == old.map.epoch.0 + 1 && self.inner.in_touch.load(Ordering::Relaxed);
        if !consecutive && old.map.epoch.0 != 0 {
            shingle_metrics::get().meta_map_epochs_skipped.inc();
        }
        for (p, s) in self.inner.slots.read().iter() {
            let was = old.members(*p).contains(&me);
            let is = new.members(*p).contains(&me);
            let promoted = new.primary(*p) == Some(me) && old.primary(*p) != Some(me);
            let mut st = s.write_state();
            if super::protocol::adopt_copy(&mut st, map.epoch, was, is, consecutive, promoted) {
                debug!(partition = p.0, epoch = map.epoch.0, promoted, "copy must catch up");
            }
        }
        self.inner.read_fence.lock().adopt(&old, &new, consecutive, me);
        // Locks on the inodes of partitions this node no longer leads go: their new
        // primary hosts them now (key 0, the rename lock, is partition 0's).
        // After skipped epochs it may have lost a partition and got it back: its keys
        // go too.
        let lost: BTreeSet<u32> = (0..map.partitions)
            .filter(|p| {
                old.primary(PartitionId(*p)) == Some(me) && (!consecutive || new.primary(PartitionId(*p)) != Some(me))
            })
            .collect();
        if !lost.is_empty() {
            let gone = self.inner.locks.forget_keys(|k| lost.contains(&Ino(k).partition().0));
            if gone > 0 {
                debug!(
                    locks = gone,
                    partitions = lost.len(),
                    "forgot the locks of partitions led elsewhere now"
                );
            }
        }
        *view = new;
        debug!(epoch = map.epoch.0, consecutive, "map adopted");
    }

    /// Finishes the moves of the partitions this node leads (see
    /// [`crate::map::PartitionMove`]): an empty batch that every replica makes durable
    /// shows they all hold the partition, and the managers hear the move is done. Runs
    /// on every new map and every [`CATCH_UP_LAST`] while a move is left; a refused
    /// [`MapCommand::MoveDone`] (a replica changed meanwhile) is tried again.
    async fn finish_moves(&self) {
        let mut rx = self.inner.map_rx.clone();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CATCH_UP_LAST) => {}
                r = rx.changed() => if r.is_err() {
                    return;
                },
            }
            if self.inner.stopped.load(Ordering::Relaxed) {
                return;
            }
            let v = self.view();
            let me = self.me();
            let mine: Vec<PartitionId> = v
                .map
                .moves
                .keys()
                .copied()
                .filter(|p| v.primary(*p) == Some(me))
                .collect();
            let Some(watch) = self.inner.watch.get() else {
                continue;
            };
            if mine.is_empty() {
                continue;
            }
            let checks = mine
                .iter()
                .map(|p| async move { (*p, self.primary_write(*p, Vec::new(), me, None).await) });
            let mut done = Vec::new();
            for (p, r) in futures_util::future::join_all(checks).await {
                match r {
                    Ok(()) => done.push(p),
                    Err(e) => {
                        debug!(partition = p.0, error = %e, "a moving partition's replicas are not all current yet")
                    }
                }
            }
            if done.is_empty() {
                continue;
            }
            let cmd = MapCommand::MoveDone {
                partitions: done,
                checked_in: v.map.epoch,
            };
            match watch.propose(&cmd).await {
                Ok(epoch) => debug!(?cmd, epoch = epoch.0, "told the managers moves are done"),
                Err(e) => debug!(error = %e, "could not tell the managers moves are done"),
            }
        }
    }

    /// Lets a copy serve once it caught up, unless the map changed since `epoch` (the
    /// one its catch-up was checked against) or this node lost touch with the managers:
    /// a takeover that finished after its epoch ended would serve a reign a newer
    /// primary may already have superseded (found by the simulator: seed 2321 of
    /// `meta/tests/sim.rs`).
    fn serve_in(&self, slot: &Slot, epoch: Epoch) -> bool {
        let view = self.inner.view.read();
        let ok = view.map.epoch == epoch && self.inner.in_touch.load(Ordering::Relaxed);
        if ok {
            slot.write_state().serving = true;
            self.inner.served.notify_waiters();
        }
        ok
    }

    /// Brings every copy this node should serve up to date; false when one is not.
    async fn catch_up(&self) -> bool {
        let v = self.view();
        if v.map.epoch.0 == 0 || !v.map.is_up(self.me()) {
            return true;
        }
        let mut done = true;
        let me = self.me();
        for p in v.placement.partitions_of(me) {
            let members = v.members(p);
            if !members.contains(&me) {
                continue;
            }
            let slot = self.slot_or_create(p, v.map.partitions);
            if slot.read().serving {
                continue;
            }
            let r = if members[0] == me {
                self.take_over(p, &v, &members, &slot).await
            } else {
                self.ask_install(p, &v, members[0]).await
            };
            if let Err(e) = r {
                done = false;
                debug!(partition = p.0, error = %e, "catch-up not done yet");
            }
        }
        done
    }

    /// This node became primary of `p` without a serving copy: take the best copy of
    /// the members that had one, then start a new reign.
    async fn take_over(&self, p: PartitionId, v: &MapView, members: &[NodeId], slot: &Arc<Slot>) -> Result<(), String> {
        let _w = slot.write.lock().await;
        let (mut tally, mut round) =
            Takeover::start(v.map.epoch, &slot.read(), self.me(), v.placement.partition(p), members);
        while !round.is_empty() {
            let asks = round
                .iter()
                .filter_map(|n| v.addr(*n).map(|a| (*n, a)))
                .map(|(n, addr)| async move {
                    let req = Pull {
                        epoch: v.map.epoch,
                        partition: p,
                    };
                    (n, self.call_peer(addr, &req, Duration::from_secs(2)).await)
                });
            for (n, got) in self
                .unless_map_moves(v.map.epoch, futures_util::future::join_all(asks))
                .await?
            {
                match got {
                    Ok(pos) => {
                        self.inner.read_fence.lock().absorb(p, &pos.fence);
                        if let Err(e) = tally.answer(n, &pos) {
                            warn!(partition = p.0, node = n.0, error = %e, "ignoring an impossible position");
                        }
                    }
                    Err(e) => debug!(partition = p.0, node = n.0, error = %e, "pull position failed"),
                }
            }
            round = tally.next_asks();
        }
        let plan = tally.decide()?;
        if let Some(n) = plan.pull {
            let addr = v.addr(n).ok_or("member without address")?;
            let (copy, part) = self
                .unless_map_moves(v.map.epoch, self.pull_copy(addr, v.map.epoch, p))
                .await??;
            slot.write_state().install(&copy, part)?;
            info!(partition = p.0, from = n.0, "took the newest copy from a member");
        }
        if self.view().map.epoch != v.map.epoch {
            return Err(format!(
                "the map changed during the takeover of epoch {}",
                v.map.epoch.0
            ));
        }
        let write = {
            let mut st = slot.write_state();
            st.begin_reign(plan.reign);
            Write::install(p, &st)
        };
        self.inner.store.commit(vec![write]).await.map_err(|e| e.to_string())?;
        // Every other member installs this copy before it serves: until they hold it,
        // what it has beyond them (a batch its members missed) is not durable, and a
        // retry must not find its operation done in it. An idle partition would also
        // keep copies apart that a later takeover must choose between.
        let levels = members[1..].iter().filter_map(|n| v.addr(*n)).map(|addr| async move {
            self.send_copy(addr, v.map.epoch, p, slot, self.inner.cfg.replicate_timeout * 5)
                .await
                .map_err(|e| format!("member {addr} did not take the new reign's copy: {e}"))
        });
        for r in self
            .unless_map_moves(v.map.epoch, futures_util::future::join_all(levels))
            .await?
        {
            r?;
        }
        if !self.serve_in(slot, v.map.epoch) {
            return Err(format!(
                "the map changed during the takeover of epoch {}",
                v.map.epoch.0
            ));
        }
        debug!(partition = p.0, epoch = v.map.epoch.0, "primary serving");
        // What earlier primaries left unfinished here is redone now (they are fenced).
        self.inner.sweep_now.notify_one();
        Ok(())
    }

    /// Runs `fut` unless this node learns a map newer than `epoch` first: a catch-up of
    /// `epoch` is moot then, and waiting on (a member cut off by the network answers
    /// nothing until a 10 s timeout) held up this node's catch-up of every partition —
    /// in the network-namespace rig a create waited 12 s for a member the map had
    /// marked Down 2 s after the cut.
    async fn unless_map_moves<T>(&self, epoch: Epoch, fut: impl std::future::Future<Output = T>) -> Result<T, String> {
        let mut rx = self.inner.map_rx.clone();
        let moved = async move {
            if rx.wait_for(|m| m.epoch > epoch).await.is_err() {
                // The node is stopping: no map will come.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            r = fut => Ok(r),
            () = moved => Err(format!("the map changed during the catch-up of epoch {}", epoch.0)),
        }
    }

    async fn ask_install(&self, p: PartitionId, v: &MapView, primary: NodeId) -> Result<(), String> {
        let addr = v.addr(primary).ok_or("primary without address")?;
        let req = SyncMe {
            epoch: v.map.epoch,
            partition: p,
            node: self.me(),
        };
        self.unless_map_moves(v.map.epoch, self.call_peer(addr, &req, Duration::from_secs(30)))
            .await?
            .map_err(|e| e.to_string())
    }

    // ---------------------------------------------------------------- writes

    /// Applies a write as primary: persisted here and on every member in the copy's
    /// next batch (maybe with other callers' writes), then returns. A write whose
    /// caller stopped waiting (went away, or `deadline` passed while it queued) is not
    /// applied: the caller retries it, and applying the stale copy too would apply it
    /// twice. Markers queued for forgetting here ride along.
    async fn primary_write(
        &self,
        p: PartitionId,
        ops: Vec<PartOp>,
        from: NodeId,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        let span = info_span!("meta.execute", partition = p.0, ops = ops.len());
        self.queue_write(p, ops, from, deadline).instrument(span).await
    }

    /// Queues a write for the copy's next batch and waits for it. One task at a time
    /// leads a copy's batches (each is persisted and replicated before the next: a
    /// replica takes them in order); writes that arrive while one is out go together in
    /// the next, so writers to one partition share its syncs and round trips instead of
    /// waiting for one batch each. The leader is a task of its own: a caller that goes
    /// away cannot cut a batch that carries other callers' writes.
    async fn queue_write(
        &self,
        p: PartitionId,
        ops: Vec<PartOp>,
        from: NodeId,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        let slot = self.primary_slot(p)?;
        let (done, answer) = tokio::sync::oneshot::channel();
        let lead = {
            let mut q = slot.queued.lock();
            q.entries.push(Queued {
                ops,
                from,
                deadline,
                done,
                span: Span::current(),
            });
            !std::mem::replace(&mut q.leading, true)
        };
        if lead {
            let node = self.clone();
            tokio::spawn(async move { node.lead_queued(p, slot).await });
        }
        answer.await.unwrap_or_else(|_| Err(errno_status(Errno::EAGAIN)))
    }

    /// Leads the batches of `slot`'s queued writes until none waits.
    async fn lead_queued(&self, p: PartitionId, slot: Arc<Slot>) {
        loop {
            let _w = slot.write.lock().await;
            let Some(writes) = slot.queued.lock().next_batch() else {
                return;
            };
            let span = info_span!(parent: &writes[0].span, "meta.batch", partition = p.0, writes = writes.len(), replicas = Empty);
            // One map for the fences and the batch: a map adopted after the fence may
            // drop holders it did not ask, so the batch goes out in the epoch fenced
            // (members on a newer map refuse it and the caller retries).
            let v = self.view();
            let (ops, dones) = admit(&v, writes);
            if dones.is_empty() {
                continue;
            }
            let m = shingle_metrics::get();
            m.meta_batches.inc();
            m.meta_batch_writes.inc_by(dones.len() as u64);
            let r = self.primary_write_inner(p, &v, ops).instrument(span).await;
            for done in dones {
                let _ = done.send(r.clone());
            }
        }
    }

    /// Persists and replicates `ops` as the copy's next batch in map `v` (the copy's
    /// write lock is held by the caller).
    async fn primary_write_inner(&self, p: PartitionId, v: &MapView, mut ops: Vec<PartOp>) -> Result<(), Status> {
        let slot = self.primary_slot(p)?; // Still primary after waiting?
        self.fence_dropped_holders(p, v).await?;
        let forgets = self.take_forgets(p);
        ops.extend(forgets.iter().map(|id| PartOp::Forget(*id)));
        let finishing = self.take_finishing(p);
        let (write, req, finishing) = match self.lead_batch(&slot, p, v, ops, finishing) {
            Ok(led) => led,
            Err(finishing) => {
                // A map change stopped the copy after the check above (adopt does not
                // wait for the write lock): the caller retries with the new primary.
                self.queue_forgets(p, forgets);
                self.abandon_finishing(finishing);
                return Err(errno_status(Errno::EAGAIN));
            }
        };
        if let Err(e) = self.persist_everywhere(&slot, p, v, write, &req).await {
            self.queue_forgets(p, forgets);
            self.abandon_finishing(finishing);
            return Err(e);
        }
        slot.write_state().acknowledged(&req.ops);
        self.finished(finishing);
        Ok(())
    }

    /// Leads `ops`, with the finishes of the intents led in this reign, as the copy's
    /// next batch: its write, its replication request and the finishes it carries.
    /// Finishes of an earlier reign may have been redone and finished by another primary
    /// meanwhile: they are abandoned once the copy's lock is released (`inflight` is
    /// taken before a copy's lock elsewhere, [`MetaNode::settled_here`], never after).
    /// A copy that stopped serving leads nothing and gives every finish back.
    fn lead_batch(
        &self,
        slot: &Slot,
        p: PartitionId,
        v: &MapView,
        mut ops: Vec<PartOp>,
        finishing: Vec<Finishing>,
    ) -> Result<(Write, Replicate, Vec<Finishing>), Vec<Finishing>> {
        let (led, stale) = {
            let mut st = slot.write_state();
            if !st.serving {
                drop(st);
                return Err(finishing);
            }
            let reign = st.meta.state_epoch;
            let (ours, stale): (Vec<Finishing>, Vec<Finishing>) = finishing.into_iter().partition(|f| f.reign == reign);
            ops.extend(ours.iter().flat_map(|f| finish_ops(f.id)));
            let (keys, lsn) = st.lead(&ops);
            // Counts announced to settled reads are in the copy now: drop them in the
            // same moment (a read holds the copy's lock too), or one would count twice.
            self.applied_expected(&ops);
            let req = Replicate {
                epoch: v.map.epoch,
                partition: p,
                state_epoch: st.meta.state_epoch,
                lsn,
                ops,
            };
            ((Write::batch(p, &st, &keys), req, ours), stale)
        };
        self.abandon_finishing(stale);
        Ok(led)
    }

    /// Persists a led batch here and replicates it to the other members in parallel.
    /// When this copy cannot persist it, or a member may have missed it, the copy stops
    /// serving until a catch-up repairs it.
    async fn persist_everywhere(
        &self,
        slot: &Slot,
        p: PartitionId,
        v: &MapView,
        write: Write,
        req: &Replicate,
    ) -> Result<(), Status> {
        let others: Vec<SocketAddr> = v
            .members(p)
            .into_iter()
            .filter(|n| *n != self.me())
            .filter_map(|n| v.addr(n))
            .collect();
        Span::current().record("replicas", others.len());
        let local = self.inner.store.commit(vec![write]);
        let remote = futures_util::future::join_all(others.into_iter().map(|addr| self.replicate_to(addr, req, slot)));
        let (local, remote) = tokio::join!(local, remote);
        if let Err(e) = local {
            // Memory is ahead of disk: stop serving until a catch-up repairs the copy.
            slot.write_state().serving = false;
            self.inner.catch_up_now.notify_one();
            warn!(partition = p.0, error = %e, "cannot persist a batch; partition stops serving here");
            return Err(store_failed(e));
        }
        if let Some(e) = remote.into_iter().find_map(Result::err) {
            // A member may have missed the batch this copy holds: until every member
            // has it, nothing here may be read as if it were durable (a retry would find
            // its operation "done" in a batch the next primary never saw). The copy
            // stops serving; the catch-up takes over again, which makes every member
            // install this copy in a new reign. The markers may not have been forgotten
            // on every member either: the caller says it again.
            let now = self.view().map.epoch;
            slot.write_state().batch_missed_a_member(v.map.epoch, now);
            self.inner.catch_up_now.notify_one();
            return Err(e);
        }
        Ok(())
    }

    /// Hears from every node that may still serve a copy of `p` it was dropped from
    /// (see [`super::read_fence`]) that it adopted this node's map, so no read there
    /// misses what this primary acknowledges next. Nothing to ask almost always; after
    /// a move, one call per dropped node (answers count for every partition).
    async fn fence_dropped_holders(&self, p: PartitionId, v: &MapView) -> Result<(), Status> {
        let need = self.inner.read_fence.lock().needed(p, v, self.me());
        if need.is_empty() {
            return Ok(());
        }
        let asks: Vec<FenceAsk> = need.iter().map(|(n, _)| self.fence_ask(*n, v)).collect();
        let answers = futures_util::future::join_all(asks).await;
        let mut fence = self.inner.read_fence.lock();
        let mut failed = None;
        for ((n, _), a) in need.iter().zip(answers) {
            match a {
                Ok(epoch) => fence.confirm(*n, epoch),
                Err(e) => failed = Some((*n, e)),
            }
        }
        drop(fence);
        if let Some((n, e)) = failed {
            debug!(partition = p.0, node = n.0, error = %e, "a dropped holder did not confirm the map");
            return Err(errno_status(Errno::EAGAIN));
        }
        Ok(())
    }

    /// The question to node `n` whether it adopted `v`'s epoch: one in flight per node,
    /// shared by every partition that waits for its answer.
    fn fence_ask(&self, n: NodeId, v: &MapView) -> FenceAsk {
        use futures_util::FutureExt;
        let epoch = v.map.epoch;
        let mut asks = self.inner.fence_asks.lock();
        if let Some((e, ask)) = asks.get(&n)
            && *e >= epoch
        {
            return ask.clone();
        }
        let node = self.clone();
        let addr = v.addr(n);
        let t = self.inner.cfg.replicate_timeout;
        let ask = async move {
            let answer = match addr {
                Some(addr) => node
                    .call_peer(addr, &Fence { epoch }, t)
                    .await
                    .map_err(|e| e.to_string()),
                None => Err(format!("node {} has no address", n.0)),
            };
            let mut asks = node.inner.fence_asks.lock();
            if asks.get(&n).is_some_and(|(e, _)| *e == epoch) {
                asks.remove(&n);
            }
            answer
        }
        .boxed()
        .shared();
        shingle_metrics::get().meta_fence_calls.inc();
        asks.insert(n, (epoch, ask.clone()));
        ask
    }

    /// A primary asks whether this node adopted `epoch` (see [`Fence`]): fetched now if
    /// this node is behind; the answer is the epoch adopted, whose copies that are not
    /// members stopped serving.
    async fn on_fence(&self, req: Fence) -> Result<Epoch, Status> {
        if self.view().map.epoch < req.epoch {
            self.check_epoch(req.epoch).await?;
        }
        Ok(self.view().map.epoch)
    }

    /// Queues forgetting the at-most-once markers of a finished operation in `p`: done
    /// with the partition's next batch written here, or by the background flush.
    fn queue_forgets(&self, p: PartitionId, ids: Vec<u64>) {
        if ids.is_empty() {
            return;
        }
        let mut q = self.inner.forgets.lock();
        let e = q.entry(p).or_default();
        e.extend(ids);
        e.sort_unstable();
        e.dedup();
    }

    fn take_forgets(&self, p: PartitionId) -> Vec<u64> {
        self.inner.forgets.lock().remove(&p).unwrap_or_default()
    }

    /// Queues the finish of an answered intent whose every step is applied, to ride on
    /// its partition's next batch here. It stays "in flight" until then, so this node's
    /// sweep leaves it alone.
    fn queue_finishing(&self, p: PartitionId, f: Finishing) {
        self.inner.finishing.lock().entry(p).or_default().push(f);
    }

    fn take_finishing(&self, p: PartitionId) -> Vec<Finishing> {
        self.inner.finishing.lock().remove(&p).unwrap_or_default()
    }

    /// Finishes that will not be made here (the batch failed, or this node no longer
    /// leads their partition in their reign): the sweep redoes each intent, whose
    /// markers keep its steps from applying twice, and finishes it.
    fn abandon_finishing(&self, fs: Vec<Finishing>) {
        if fs.is_empty() {
            return;
        }
        let mut inflight = self.inner.inflight.lock();
        for f in &fs {
            debug!(intent = f.id, "finishing an intent here failed; the sweep will");
            inflight.remove(&f.id);
        }
        drop(inflight);
        let mut counted = self.inner.counted.lock();
        for f in &fs {
            counted.remove(&f.id);
        }
        drop(counted);
        self.inner.sweep_now.notify_one();
    }

    /// Finishes made durable: the other partitions may now forget the intents'
    /// markers (not before: a redo would need them).
    fn finished(&self, fs: Vec<Finishing>) {
        for f in fs {
            for p in f.others {
                self.queue_forgets(p, vec![f.id]);
            }
            self.inner.inflight.lock().remove(&f.id);
            self.inner.counted.lock().remove(&f.id);
        }
    }

    /// Flushes queued finishes and forgets of partitions that had no batch to ride on,
    /// every [`FORGET_FLUSH`] or when woken.
    async fn flush_riders(&self) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FORGET_FLUSH) => {}
                _ = self.inner.flush_now.notified() => {}
            }
            if self.inner.stopped.load(Ordering::Relaxed) {
                return;
            }
            let parts: Vec<PartitionId> = self.inner.finishing.lock().keys().copied().collect();
            for p in parts {
                if self.lead_reign(p).is_none() {
                    let fs = self.take_finishing(p);
                    self.abandon_finishing(fs);
                    continue;
                }
                // An empty batch: the queued finishes (and forgets) ride on it.
                if let Err(e) = self.primary_write(p, Vec::new(), self.me(), None).await {
                    debug!(partition = p.0, error = %e, "finishing intents failed; the sweep will");
                }
            }
            let parts: Vec<PartitionId> = self.inner.forgets.lock().keys().copied().collect();
            for p in parts {
                let ids = self.take_forgets(p);
                if ids.is_empty() {
                    continue;
                }
                let ops: Vec<PartOp> = ids.iter().map(|id| PartOp::Forget(*id)).collect();
                if let Err(e) = self.execute_at(p, ops).await {
                    debug!(partition = p.0, error = %e, "forgetting markers failed; will retry");
                    self.queue_forgets(p, ids);
                }
            }
        }
    }

    async fn replicate_to(&self, addr: SocketAddr, req: &Replicate, slot: &Slot) -> Result<(), Status> {
        let t = self.inner.cfg.replicate_timeout;
        let fail = |e: CallError| match e {
            CallError::Stale(_) => stale(format!("replica {addr} has a newer map")),
            e => {
                debug!(replica = %addr, error = %e, "replication failed");
                errno_status(Errno::EAGAIN)
            }
        };
        match self.call_peer(addr, req, t).await.map_err(fail)? {
            ReplicaAck::Done => Ok(()),
            ReplicaAck::NeedInstall => self
                .send_copy(addr, req.epoch, req.partition, slot, t * 5)
                .await
                .map_err(fail),
        }
    }

    /// Sends this node's copy of `p` to the member at `addr` in pieces, going on from
    /// what the member reports it holds. The caller holds the slot's write lock (the
    /// copy does not change under it).
    async fn send_copy(
        &self,
        addr: SocketAddr,
        epoch: Epoch,
        p: PartitionId,
        slot: &Slot,
        piece_timeout: Duration,
    ) -> Result<(), CallError> {
        let (copy, bytes) = encode_copy(&slot.read())?;
        let mut offset = 0;
        for _ in 0..super::copy::max_rounds(copy.total, self.inner.cfg.copy_piece) {
            let req = InstallPiece {
                epoch,
                partition: p,
                copy,
                offset,
                data: super::copy::piece(&bytes, offset, self.inner.cfg.copy_piece).to_vec(),
            };
            let held = self.call_peer(addr, &req, piece_timeout).await?;
            if held >= copy.total {
                return Ok(());
            }
            offset = held;
        }
        Err(CallError::Errno(Errno::EIO))
    }

    /// Pulls the copy of `p` of the member at `addr`, in pieces.
    async fn pull_copy(
        &self,
        addr: SocketAddr,
        epoch: Epoch,
        p: PartitionId,
    ) -> Result<(CopyId, crate::namespace::Partition), String> {
        let mut asm = Assembly::default();
        let mut offset = 0;
        let mut rounds = 0u64;
        loop {
            let req = PullPiece {
                epoch,
                partition: p,
                offset,
            };
            let got = self
                .call_peer(addr, &req, Duration::from_secs(30))
                .await
                .map_err(|e| e.to_string())?;
            rounds += 1;
            if rounds > super::copy::max_rounds(got.copy.total, got.data.len().max(1)) {
                return Err(format!("pulling partition {} did not converge", p.0));
            }
            match asm.take(got.copy, got.offset, &got.data).map_err(|e| e.to_string())? {
                Took::Need(n) => offset = n,
                Took::Done(bytes) => {
                    let part: crate::namespace::Partition =
                        postcard::from_bytes(&bytes).map_err(|e| format!("pulled copy: {e}"))?;
                    if part.id != p {
                        return Err(format!("pulled a copy of partition {} for {}", part.id.0, p.0));
                    }
                    return Ok((got.copy, part));
                }
            }
        }
    }

    async fn on_replicate(&self, req: Replicate) -> Result<ReplicaAck, Status> {
        self.check_epoch_exact(req.epoch).await?;
        let v = self.view();
        if !v.members(req.partition).contains(&self.me()) {
            return Err(stale(format!("not a member of partition {}", req.partition.0)));
        }
        let slot = self.slot_or_create(req.partition, v.map.partitions);
        let _w = slot.write.lock().await;
        self.check_epoch_exact(req.epoch).await?;
        let epoch = req.epoch;
        // The primary led this batch in `epoch` after hearing from every node fenced then.
        self.inner.read_fence.lock().batch_applied(req.partition, epoch);
        let write = {
            let mut st = slot.write_state();
            match st.follow(req.state_epoch, req.lsn, &req.ops) {
                Follow::Already => return Ok(ReplicaAck::Done),
                Follow::NeedInstall => return Ok(ReplicaAck::NeedInstall),
                Follow::Applied(keys) => Write::batch(req.partition, &st, &keys),
            }
        };
        if let Err(e) = self.inner.store.commit(vec![write]).await {
            slot.write_state().serving = false;
            self.inner.catch_up_now.notify_one();
            return Err(store_failed(e));
        }
        // Following the primary's stream in order: complete for this reign.
        self.serve_in(&slot, epoch);
        Ok(ReplicaAck::Done)
    }

    /// A piece of the primary's copy; the whole copy, once assembled, replaces this
    /// node's and serves.
    async fn on_install_piece(&self, req: InstallPiece) -> Result<u64, Status> {
        self.check_epoch_exact(req.epoch).await?;
        let p = req.partition;
        let v = self.view();
        if !v.members(p).contains(&self.me()) {
            return Err(stale(format!("not a member of partition {}", p.0)));
        }
        req.copy
            .check(v.map.epoch)
            .map_err(|e| Status::new(Code::InvalidRequest, e))?;
        let took = {
            // Monotonic: a wall clock that jumps must not make live assemblies stale.
            static BOOT: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
            let now = u64::try_from(BOOT.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let mut staging = self.inner.staging.lock();
            staging
                .take(p.0, req.copy, req.offset, &req.data, now)
                .map_err(|e| match e {
                    PieceError::NoRoom { .. } => Status::new(Code::Overloaded, e.to_string()),
                    e => Status::new(Code::InvalidRequest, e.to_string()),
                })?
        };
        let bytes = match took {
            Took::Need(held) => return Ok(held),
            Took::Done(bytes) => bytes,
        };
        let part: crate::namespace::Partition = postcard::from_bytes(&bytes)
            .map_err(|e| Status::new(Code::InvalidRequest, format!("installed copy: {e}")))?;
        if part.id != p {
            return Err(Status::new(
                Code::InvalidRequest,
                format!("a copy of partition {} sent for {}", part.id.0, p.0),
            ));
        }
        let slot = self.slot_or_create(p, v.map.partitions);
        let _w = slot.write.lock().await;
        self.check_epoch_exact(req.epoch).await?;
        let epoch = req.epoch;
        let write = {
            let mut st = slot.write_state();
            st.install(&req.copy, part).map_err(stale)?;
            Write::install(p, &st)
        };
        self.inner.store.commit(vec![write]).await.map_err(store_failed)?;
        self.serve_in(&slot, epoch);
        debug!(
            partition = p.0,
            lsn = req.copy.lsn,
            bytes = req.copy.total,
            "installed a copy from the primary"
        );
        Ok(req.copy.total)
    }

    async fn on_sync_me(&self, req: SyncMe) -> Result<(), Status> {
        self.check_epoch(req.epoch).await?;
        let slot = self.primary_slot(req.partition)?;
        let _w = slot.write.lock().await;
        let v = self.view();
        if !v.members(req.partition).contains(&req.node) {
            return Err(stale("the caller is not a member of that partition"));
        }
        let addr = v.addr(req.node).ok_or_else(|| stale("the caller is not in the map"))?;
        self.send_copy(
            addr,
            v.map.epoch,
            req.partition,
            &slot,
            self.inner.cfg.replicate_timeout * 5,
        )
        .await
        .map_err(|e| errno_status(e.errno()))
    }

    /// A new primary asks for this copy's position. The caller's newer map
    /// is adopted first, so no batch of an older reign is accepted after the answer, and
    /// the answer waits for a batch being applied: an older primary cannot get a batch
    /// acknowledged that the new primary's takeover did not see (it would be lost when
    /// the new reign reinstalls every member).
    async fn on_pull(&self, req: Pull) -> Result<Pulled, Status> {
        self.check_epoch(req.epoch).await?;
        let slot = self.member_slot(req.partition)?;
        let _w = slot.write.lock().await;
        self.check_epoch(req.epoch).await?;
        let mut pos = slot.read().position();
        // The view first: `adopt` holds the view's lock while it takes the read
        // fence's, so taking them the other way round hangs both (it hung a node at
        // start-up about once in 40 test clusters: both runtime workers blocked).
        let epoch = self.view().map.epoch;
        pos.fence = self.inner.read_fence.lock().knowledge(req.partition, epoch);
        Ok(pos)
    }

    /// A new primary pulls this copy in pieces. The encoding is kept between pieces
    /// while the copy stays at the same position (and dropped after the last piece).
    async fn on_pull_piece(&self, req: PullPiece) -> Result<PulledPiece, Status> {
        self.check_epoch(req.epoch).await?;
        let slot = self.member_slot(req.partition)?;
        let _w = slot.write.lock().await;
        self.check_epoch(req.epoch).await?;
        let (copy, bytes) = {
            let st = slot.read();
            let mut snaps = self.inner.snapshots.lock();
            match snaps.get(&req.partition) {
                Some((c, b))
                    if (c.state_epoch, c.lsn, c.counter_hwm)
                        == (st.meta.state_epoch, st.meta.lsn, st.meta.counter_hwm) =>
                {
                    (*c, b.clone())
                }
                _ => {
                    let (c, b) = encode_copy(&st).map_err(|e| errno_status(e.errno()))?;
                    let b = Arc::new(b);
                    snaps.insert(req.partition, (c, b.clone()));
                    (c, b)
                }
            }
        };
        if req.offset > copy.total {
            return Err(Status::new(Code::InvalidRequest, "offset past the copy's end"));
        }
        let data = super::copy::piece(&bytes, req.offset, self.inner.cfg.copy_piece).to_vec();
        if req.offset + data.len() as u64 >= copy.total {
            self.inner.snapshots.lock().remove(&req.partition);
        }
        Ok(PulledPiece {
            copy,
            offset: req.offset,
            data,
        })
    }

    /// The copy of `p` on this node, made if absent, when this node is one of `p`'s
    /// members in its map (only members hold copies: anything else could make a node
    /// keep slots for partitions it does not host).
    fn member_slot(&self, p: PartitionId) -> Result<Arc<Slot>, Status> {
        let v = self.view();
        if !v.members(p).contains(&self.me()) {
            return Err(stale(format!("not a member of partition {}", p.0)));
        }
        Ok(self.slot_or_create(p, v.map.partitions))
    }

    async fn on_alloc(&self, req: Alloc) -> Result<u64, Status> {
        let slot = self.primary_slot(req.partition)?;
        let (c, raise) = slot.write_state().next_counter();
        if let Some(hwm) = raise {
            self.primary_write(req.partition, vec![PartOp::Counter(hwm)], self.me(), None)
                .await?;
        }
        Ok(c)
    }

    /// What a coordinator reads to plan an operation. Only for a caller on this node's
    /// map epoch: an answer for a coordinator with another map could come from a copy
    /// that is no longer (or not yet) the primary, and an error planned from it (ENOENT,
    /// EEXIST) would reach the client without any write to fence it.
    fn on_fetch(&self, req: &Fetch) -> Result<Fetched, Status> {
        let mine = self.view().map.epoch;
        if req.epoch != mine {
            return Err(stale(format!(
                "coordinator's map epoch {} is not this node's {}",
                req.epoch.0, mine.0
            )));
        }
        let n = req.inodes.len();
        if n + req.dentries.len() + req.stripes.len() > super::wire::MAX_FETCH {
            return Err(Status::new(
                Code::InvalidRequest,
                format!("a fetch names at most {} records", super::wire::MAX_FETCH),
            ));
        }
        if req
            .dentries
            .iter()
            .any(|(_, name)| name.len() > crate::namespace::types::NAME_MAX)
        {
            return Err(errno_status(Errno::ENAMETOOLONG));
        }
        let mut out = Fetched {
            inodes: Vec::with_capacity(n),
            dentries: Vec::with_capacity(req.dentries.len()),
            stripes: Vec::with_capacity(req.stripes.len()),
        };
        for (ino, stripe) in &req.stripes {
            let s = self.primary_slot(ino.partition())?;
            out.stripes.push(s.read().part.stripes.get(&(*ino, *stripe)).cloned());
        }
        for ino in &req.inodes {
            let s = self.primary_slot(ino.partition())?;
            out.inodes.push(s.read().part.inodes.get(ino).cloned());
        }
        let parts = self.view().map.partitions;
        for (parent, name) in &req.dentries {
            let p = crate::placement::dentry_partition(*parent, name, parts);
            let s = self.primary_slot(p)?;
            out.dentries.push(s.read().part.dentry(*parent, name));
        }
        Ok(out)
    }

    // ---------------------------------------------------------------- reads

    /// An inode with the first window of its layout (what an open reads).
    fn head(&self, ino: Ino) -> Result<crate::namespace::InodeRec, Status> {
        self.serving(ino.partition())?
            .read()
            .part
            .inode_with_stripes(ino, super::wire::HEAD_STRIPES)
            .ok_or_else(|| errno_status(Errno::ENOENT))
    }

    fn on_read(&self, req: &ReadOp) -> Result<ReadReply, Status> {
        match req {
            ReadOp::Lookup { parent, name } | ReadOp::LookupAs { parent, name, .. } => self.read_entry(*parent, name),
            ReadOp::GetAttr(ino) => self.with_inode(*ino, |r| ReadReply::Attr(r.attr.clone())),
            ReadOp::GetAttrSettled(ino) => {
                self.primary_slot(ino.partition())?;
                // Counted under the copy's lock (held by `with_inode`), against which
                // applied steps drop their announcements: never counted twice.
                self.with_inode(*ino, |r| ReadReply::Attr(self.counted(*ino, &r.attr)))
            }
            ReadOp::GetInode(ino) => Ok(ReadReply::Inode(Box::new(self.head(*ino)?))),
            ReadOp::GetInodeAs { creds, ino } => self.head_with_cap(creds, *ino),
            ReadOp::Stripes { ino, from, limit } => self.read_stripes(*ino, *from, *limit),
            ReadOp::GetXattr { creds, ino, name } => {
                self.sparse_read(*ino, |ns| ns.getxattr(creds, *ino, name).map(ReadReply::Value))
            }
            ReadOp::ListXattr { creds, ino } => {
                self.sparse_read(*ino, |ns| ns.listxattr(creds, *ino).map(ReadReply::Names))
            }
            ReadOp::Purges {
                partition,
                after,
                limit,
            } => {
                let s = self.serving(*partition)?;
                let st = s.read();
                let list = st
                    .part
                    .purges
                    .range((std::ops::Bound::Excluded(*after), std::ops::Bound::Unbounded))
                    .take((*limit).clamp(1, 4096) as usize)
                    .map(|(i, p)| (*i, *p))
                    .collect();
                Ok(ReadReply::Purges(list))
            }
            ReadOp::Alive(ino) => {
                let s = self.serving(ino.partition())?;
                let st = s.read();
                Ok(ReadReply::Alive(
                    st.part.inodes.contains_key(ino) || st.part.purges.contains_key(ino),
                ))
            }
            ReadOp::ReadDir {
                dir,
                after,
                limit,
                partitions,
                plus,
            }
            | ReadOp::ReadDirAs {
                dir,
                after,
                limit,
                partitions,
                plus,
                ..
            } => Ok(self.read_dir(*dir, after.as_deref(), *limit, partitions, *plus)),
        }
    }

    /// `f` of inode `ino`'s record in the copy served here (`ENOENT` if none).
    fn with_inode(
        &self,
        ino: Ino,
        f: impl FnOnce(&crate::namespace::InodeRec) -> ReadReply,
    ) -> Result<ReadReply, Status> {
        let s = self.serving(ino.partition())?;
        let st = s.read();
        st.part
            .inodes
            .get(&ino)
            .map(f)
            .ok_or_else(|| errno_status(Errno::ENOENT))
    }

    /// `f` of a namespace view holding just inode `ino` (for reads the namespace engine
    /// answers, such as extended attributes with their permission checks).
    fn sparse_read(
        &self,
        ino: Ino,
        f: impl FnOnce(&Namespace) -> Result<ReadReply, Errno>,
    ) -> Result<ReadReply, Status> {
        let s = self.serving(ino.partition())?;
        let mut ns = Namespace::sparse(self.view().map.partitions);
        ns.provide_inode(ino, s.read().part.inodes.get(&ino).cloned());
        f(&ns).map_err(errno_status)
    }

    /// Lookup: the entry, with the inode's attributes when its partition is the entry's.
    fn read_entry(&self, parent: Ino, name: &[u8]) -> Result<ReadReply, Status> {
        if name.len() > crate::namespace::types::NAME_MAX {
            return Err(errno_status(Errno::ENAMETOOLONG));
        }
        let p = crate::placement::dentry_partition(parent, name, self.view().map.partitions);
        let s = self.serving(p)?;
        let st = s.read();
        let e = st
            .part
            .dentry(parent, name)
            .ok_or_else(|| errno_status(Errno::ENOENT))?;
        let attr = st.part.inodes.get(&e.ino).map(|r| r.attr.clone());
        Ok(ReadReply::Entry(e, attr))
    }

    /// The head an open reads, with a read capability for the file's shards when
    /// `creds` may have its data (and this node has a capability key).
    fn head_with_cap(&self, creds: &crate::namespace::Creds, ino: Ino) -> Result<ReadReply, Status> {
        let r = self.head(ino)?;
        let cap = match &self.inner.cfg.caps {
            Some(key) if crate::namespace::perm::may_open_data(creds, &r.attr) => key
                .mint(ino.0, Right::Read, shingle_transport::cap::unix_now())
                .to_bytes(),
            _ => Vec::new(),
        };
        Ok(ReadReply::InodeCap(Box::new(r), cap))
    }

    /// Up to `limit` stripe records of `ino` from `from`, whether more follow, and the
    /// file's attributes as of the same moment.
    fn read_stripes(&self, ino: Ino, from: u64, limit: u32) -> Result<ReadReply, Status> {
        let s = self.serving(ino.partition())?;
        let st = s.read();
        let attr = st
            .part
            .inodes
            .get(&ino)
            .map(|r| r.attr.clone())
            .ok_or_else(|| errno_status(Errno::ENOENT))?;
        let limit = limit.clamp(1, super::wire::MAX_STRIPES_READ) as usize;
        let mut recs: Vec<(u64, crate::namespace::StripeRec)> = st
            .part
            .stripes_of(ino, from)
            .take(limit + 1)
            .map(|(s, r)| (s, r.clone()))
            .collect();
        let more = recs.len() > limit;
        recs.truncate(limit);
        Ok(ReadReply::Stripes(recs, more, Box::new(attr)))
    }

    /// Entries of `dir` after `after` from each of `partitions` served here, merged in
    /// name order (at most `limit`), and the partitions not served here.
    /// With `plus`, each entry carries its inode's attributes when the inode's record
    /// is in the entry's partition (read under the same lock as the entry).
    fn read_dir(
        &self,
        dir: Ino,
        after: Option<&[u8]>,
        limit: u32,
        partitions: &[PartitionId],
        plus: bool,
    ) -> ReadReply {
        let parts = self.view().map.partitions;
        let limit = limit.clamp(1, 4096) as usize;
        // Each partition once, and only partitions that exist: the reply holds at most
        // 2 × limit entries at any time.
        let mut wanted: Vec<PartitionId> = partitions.iter().copied().filter(|p| p.0 < parts).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut all: Vec<DirEntry> = Vec::new();
        let mut missing = Vec::new();
        for p in &wanted {
            match self.serving(*p) {
                Ok(s) => {
                    let st = s.read();
                    all.extend(st.part.entries_after(dir, after, limit).into_iter().map(|(name, v)| {
                        DirEntry {
                            attr: plus
                                .then(|| st.part.inodes.get(&v.ino).map(|r| r.attr.clone()))
                                .flatten(),
                            name,
                            ino: v.ino,
                            kind: v.kind,
                        }
                    }));
                }
                Err(_) => missing.push(*p),
            }
            if all.len() > limit {
                all.sort_by(|a, b| a.name.cmp(&b.name));
                all.truncate(limit);
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all.truncate(limit);
        ReadReply::Entries(all, missing)
    }

    fn on_stats(&self) -> NodeStats {
        let v = self.view();
        let me = self.me();
        let mut s = NodeStats {
            epoch: v.map.epoch,
            repair: self.inner.repair.lock().clone(),
            ..NodeStats::default()
        };
        for (p, slot) in self.inner.slots.read().iter() {
            let st = slot.read();
            s.partitions += 1;
            if st.serving {
                s.serving += 1;
                if v.primary(*p) == Some(me) {
                    s.primary += 1;
                    s.inodes += st.part.inodes.len() as u64;
                }
            }
        }
        s
    }

    // ---------------------------------------------------------------- coordinator

    async fn on_op(&self, req: Op, client: bool) -> Result<OpReply, Status> {
        if req.id == 0 {
            return self.on_op_once(req, client).await;
        }
        let id = req.id;
        let cell = self.inner.running.lock().entry(id).or_default().clone();
        // One attempt runs; one arriving meanwhile gets its answer. If the running one
        // is dropped (its caller went away), a waiting one runs instead.
        let r = cell.get_or_init(|| self.on_op_once(req, client)).await.clone();
        let mut running = self.inner.running.lock();
        if running.get(&id).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            running.remove(&id);
        }
        r
    }

    /// Runs one operation; `client`: its caller holds a client key (see
    /// [`Coordination::for_client`]).
    async fn on_op_once(&self, req: Op, client: bool) -> Result<OpReply, Status> {
        self.check_epoch(req.epoch).await?;
        let v = self.view();
        let anchor = req.op.anchor(v.map.partitions);
        self.primary_slot_soon(anchor).await?;
        let deadline = Instant::now() + self.inner.cfg.op_timeout;
        let mut pause = Duration::from_millis(2);
        let mut busy = 0u32;
        loop {
            let owner = super::locks::owner_id(self.me().0, random_u64());
            let mut held: Vec<(NodeId, Vec<u64>)> = Vec::new();
            let e = match self.coordinate(&req, client, owner, &mut held).await {
                Ok((reply, tails)) => {
                    // Answered now; what follows the answer runs under the locks,
                    // which go once it is applied (`answer_before`).
                    let node = self.clone();
                    tokio::spawn(async move { node.finish_op(tails, held, owner).await });
                    return Ok(reply);
                }
                Err(e) => e,
            };
            for (n, keys) in held {
                self.unlock(n, keys, owner).await;
            }
            match e {
                Retry::Busy if Instant::now() < deadline => {
                    busy += 1;
                    Span::current().record("retries", busy);
                    tokio::time::sleep(pause + Duration::from_micros(random_u64() % 2000)).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Retry::Busy => return Err(errno_status(Errno::EAGAIN)),
                Retry::Fail(s) if is_fenced(&s) => {
                    debug!(error = %s.message, "operation fenced; the client retries at the new primary");
                    return Err(errno_status(Errno::EAGAIN));
                }
                Retry::Fail(s) => return Err(s),
            }
        }
    }

    /// What an answered operation leaves: the batches of its intents that follow the
    /// answer, then its locks go, then the intents are finished. If a batch fails (this
    /// node lost the intent's partition), the locks stay until the intent is redone by
    /// the partition's primary: the directory's counts are not applied yet, and an
    /// operation that read them before could remove a directory that is not empty.
    async fn finish_op(&self, tails: Vec<Tail>, held: Vec<(NodeId, Vec<u64>)>, owner: u64) {
        let (applied, failed) = self.apply_later(tails).await;
        if !failed.is_empty() {
            // Only the failed ones: an applied intent stays pending until its finish,
            // which comes after the locks go.
            self.await_redone(&failed).await;
        }
        // Counted as applied before the locks go: an rmdir that takes its directory
        // next finds it quiet (`on_quiet`).
        self.finish_tails(applied);
        for (n, keys) in held {
            self.unlock(n, keys, owner).await;
        }
    }

    /// Waits (at most a lock lease) until the intents `(partition, id)` a coordinator
    /// could not complete are redone: none is pending any more in its partition's copy
    /// here when this node is its serving primary again, or its primary elsewhere has
    /// settled (drives every intent pending there itself, as for a dead coordinator's
    /// locks, decision 0009).
    async fn await_redone(&self, intents: &[(PartitionId, u64)]) {
        let deadline = Instant::now() + self.inner.cfg.lock_lease;
        while Instant::now() < deadline {
            let mut done = true;
            for (p, id) in intents {
                let here = self.primary_slot(*p).ok().map(|slot| {
                    let st = slot.read();
                    st.serving && !st.part.intents.contains_key(id)
                });
                let redone = match here {
                    Some(r) => r,
                    None => self.settled(&self.view(), *p).await,
                };
                done &= redone;
            }
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Applies what follows the answer of each tail; returns those applied, and the
    /// intents `(partition, id)` of those that failed (left to the sweep).
    async fn apply_later(&self, tails: Vec<Tail>) -> (Vec<Tail>, Vec<(PartitionId, u64)>) {
        let mut applied = Vec::with_capacity(tails.len());
        let mut failed = Vec::new();
        for mut t in tails {
            match self.execute_all(std::mem::take(&mut t.later), t.coord, t.reign).await {
                Ok(()) => applied.push(t),
                Err(e) => {
                    warn!(intent = t.id, error = %e, "applying a directory's counts after the answer failed; the sweep will");
                    self.inner.inflight.lock().remove(&t.id);
                    self.inner.sweep_now.notify_one();
                    failed.push((t.coord, t.id));
                }
            }
        }
        (applied, failed)
    }

    /// Finishes the intents of applied tails. Finishing only drops an intent's record
    /// (and then its markers); if that fails or this node dies first, the sweep redoes
    /// the intent, whose steps the markers keep from applying twice, and finishes it.
    /// Until then it stays "in flight" here so this node's own sweep leaves it alone.
    ///
    /// Nothing waits for a finish, so it costs no batch of its own: it rides on the
    /// coordinating partition's next batch here, or the flush's ([`Inner::finishing`]).
    fn finish_tails(&self, tails: Vec<Tail>) {
        self.inner.counted.lock().extend(tails.iter().map(|t| t.id));
        for t in tails {
            let f = Finishing {
                id: t.id,
                reign: t.reign,
                others: t.others,
            };
            self.queue_finishing(t.coord, f);
        }
    }

    async fn coordinate(
        &self,
        req: &Op,
        client: bool,
        owner: u64,
        held: &mut Vec<(NodeId, Vec<u64>)>,
    ) -> Result<(OpReply, Vec<Tail>), Retry> {
        let v = self.view();
        let mut c = Coordination::new(req.op.clone(), req.creds.clone(), req.id, now_ns(), v.map.partitions);
        if client {
            c = c.for_client();
        }
        let anchor = c.anchor();
        loop {
            match c.step() {
                Next::Lock(keys) => {
                    let read = self.lock(&v, keys.clone(), owner, anchor, held).await?;
                    let dirs = c.quiet_dirs(&keys);
                    if !dirs.is_empty() && !self.quiet(&v, dirs).await {
                        return Err(Retry::Busy);
                    }
                    c.locked(&keys);
                    for (ino, rec) in read {
                        c.provide_inode(ino, rec);
                    }
                }
                Next::Fetch(needs) => self.fetch(&v, &needs, &mut c).await?,
                Next::Commit(plans, reply) => {
                    let mut tails = Vec::new();
                    for plan in plans {
                        match self.execute_plan(plan).await {
                            Ok(t) => tails.extend(t),
                            Err(e) => {
                                // Plans done before this one are durable: they are
                                // completed, under the locks still held.
                                let (applied, _) = self.apply_later(tails).await;
                                self.finish_tails(applied);
                                return Err(Retry::Fail(e));
                            }
                        }
                    }
                    return Ok((reply, tails));
                }
                Next::Fail(e) => return Err(Retry::Fail(errno_status(e))),
            }
        }
    }

    /// Takes `keys` at their hosts; returns the locked inodes a remote host read once
    /// they were held (the coordinator would fetch them next: [`Lock::fetch`]).
    async fn lock(
        &self,
        v: &MapView,
        keys: Vec<u64>,
        owner: u64,
        anchor: PartitionId,
        held: &mut Vec<(NodeId, Vec<u64>)>,
    ) -> Result<Vec<(Ino, Option<crate::namespace::InodeRec>)>, Retry> {
        let mut by_host: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
        for k in keys {
            let host = v.primary(Ino(k).partition()).ok_or(Retry::Busy)?;
            by_host.entry(host).or_default().push(k);
        }
        let mut read = Vec::new();
        for (host, keys) in by_host {
            let ok = if host == self.me() {
                self.inner
                    .locks
                    .lock(
                        &keys,
                        owner,
                        anchor.0,
                        self.inner.cfg.lock_lease,
                        Duration::from_millis(200),
                    )
                    .await
            } else {
                let addr = v.addr(host).ok_or(Retry::Busy)?;
                let inodes: Vec<Ino> = keys.iter().filter_map(|k| super::locks::key_inode(*k)).collect();
                let fetch = (!inodes.is_empty()).then(|| Fetch {
                    epoch: v.map.epoch,
                    inodes,
                    ..Fetch::default()
                });
                let req = Lock {
                    keys: keys.clone(),
                    owner,
                    lease_ms: self.inner.cfg.lock_lease.as_millis() as u32,
                    wait_ms: 200,
                    release: false,
                    anchor,
                    fetch,
                };
                let reply = self
                    .call_peer(addr, &req, Duration::from_secs(2))
                    .await
                    .unwrap_or_default();
                if let (Some(got), Some(asked)) = (reply.fetched, req.fetch) {
                    read.extend(asked.inodes.into_iter().zip(got.inodes));
                }
                reply.granted
            };
            if !ok {
                return Err(Retry::Busy);
            }
            held.push((host, keys));
        }
        Ok(read)
    }

    async fn unlock(&self, host: NodeId, keys: Vec<u64>, owner: u64) {
        if host == self.me() {
            self.inner.locks.release(&keys, owner);
            return;
        }
        let Some(addr) = self.view().addr(host) else { return };
        let req = Lock {
            keys,
            owner,
            lease_ms: 0,
            wait_ms: 0,
            release: true,
            anchor: PartitionId(0),
            fetch: None,
        };
        if let Err(e) = self.call_peer(addr, &req, Duration::from_secs(2)).await {
            debug!(host = host.0, error = %e, "unlock failed; the lease will free the keys");
        }
    }

    async fn fetch(&self, v: &MapView, needs: &[Need], c: &mut Coordination) -> Result<(), Retry> {
        let mut by_node: BTreeMap<NodeId, Fetch> = BTreeMap::new();
        for n in needs {
            match n {
                Need::Inode(ino) => {
                    let host = v.primary(ino.partition()).ok_or(Retry::Busy)?;
                    by_node.entry(host).or_default().inodes.push(*ino);
                }
                Need::Dentry(parent, name) => {
                    let p = crate::placement::dentry_partition(*parent, name, v.map.partitions);
                    let host = v.primary(p).ok_or(Retry::Busy)?;
                    by_node.entry(host).or_default().dentries.push((*parent, name.clone()));
                }
                Need::Counter(p) => {
                    let counter = self.alloc(*p).await.map_err(|_| Retry::Busy)?;
                    c.provide_counter(*p, counter);
                }
                Need::Stripe(ino, stripe) => {
                    let host = v.primary(ino.partition()).ok_or(Retry::Busy)?;
                    by_node.entry(host).or_default().stripes.push((*ino, *stripe));
                }
                Need::Done(p, op) => {
                    // The anchor of the operation this node coordinates: its primary
                    // is this node (or the operation goes back to the client to retry
                    // at the new one), and its copy here has every finished operation.
                    let slot = self.primary_slot(*p).map_err(Retry::Fail)?;
                    let st = slot.read();
                    // Recorded by an intent not finished yet: not done until it is (its
                    // redo is under way); answering now would show a half-applied change.
                    if st.part.done_pending(*op) {
                        // Most likely its finish is queued here: make it now.
                        self.inner.flush_now.notify_one();
                        return Err(Retry::Busy);
                    }
                    let rec = st.part.done.get(op).copied();
                    drop(st);
                    c.provide_done(*p, *op, rec);
                }
            }
        }
        for (node, all) in by_node {
            for mut req in all.split(super::wire::MAX_FETCH) {
                req.epoch = v.map.epoch;
                let got = if node == self.me() {
                    self.on_fetch(&req).map_err(|_| Retry::Busy)?
                } else {
                    let addr = v.addr(node).ok_or(Retry::Busy)?;
                    self.call_peer(addr, &req, Duration::from_secs(2))
                        .await
                        .map_err(|_| Retry::Busy)?
                };
                for (ino, r) in req.inodes.iter().zip(got.inodes) {
                    c.provide_inode(*ino, r);
                }
                for ((parent, name), d) in req.dentries.into_iter().zip(got.dentries) {
                    c.provide_dentry(parent, name, d);
                }
                for ((ino, stripe), r) in req.stripes.into_iter().zip(got.stripes) {
                    c.provide_stripe(ino, stripe, r);
                }
            }
        }
        Ok(())
    }

    async fn alloc(&self, p: PartitionId) -> Result<u64, Status> {
        self.retrying(p, |node, addr, epoch| async move {
            if node == self.me() {
                self.on_alloc(Alloc { epoch, partition: p }).await
            } else {
                call(
                    &self.inner.client,
                    addr,
                    &Alloc { epoch, partition: p },
                    Duration::from_secs(5),
                )
                .await
                .map_err(to_status)
            }
        })
        .await
    }

    /// Executes a batch at the primary of `p`, retrying through map changes.
    async fn execute_at(&self, p: PartitionId, ops: Vec<PartOp>) -> Result<(), Status> {
        self.execute_in(p, ops, None).await
    }

    /// The reign of this node's copy of `p` if it is the serving primary copy.
    fn lead_reign(&self, p: PartitionId) -> Option<Epoch> {
        let slot = self.primary_slot(p).ok()?;
        let st = slot.read();
        st.serving.then_some(st.meta.state_epoch)
    }

    /// [`MetaNode::execute_at`] for a step of an intent this node leads from partition
    /// `coord` in reign `reign`: every try first checks that this node still leads
    /// `coord` in that reign. If it lost the partition and got it back, another primary
    /// may have redone and finished the intent meanwhile and its markers are forgotten:
    /// a step sent again now would apply twice. The fence at the target cannot tell
    /// (this node is the primary again), so the coordinator stops itself.
    async fn execute_led(
        &self,
        p: PartitionId,
        ops: Vec<PartOp>,
        coord: PartitionId,
        reign: Epoch,
    ) -> Result<(), Status> {
        self.execute_in(p, ops, Some((coord, reign))).await
    }

    async fn execute_in(
        &self,
        p: PartitionId,
        ops: Vec<PartOp>,
        led: Option<(PartitionId, Epoch)>,
    ) -> Result<(), Status> {
        self.retrying(p, |node, addr, epoch| {
            let ops = ops.clone();
            async move {
                if let Some((coord, reign)) = led
                    && self.lead_reign(coord) != Some(reign)
                {
                    return Err(fenced(format!(
                        "this node no longer leads partition {} in the reign its operation began in",
                        coord.0
                    )));
                }
                if node == self.me() {
                    self.primary_write(p, ops, node, None).await
                } else {
                    let req = Execute {
                        epoch,
                        from: self.me(),
                        partition: p,
                        ops,
                    };
                    self.call_peer(addr, &req, self.inner.cfg.replicate_timeout * 3)
                        .await
                        .map_err(to_status)
                }
            }
        })
        .await
    }

    async fn retrying<T, F, Fut>(&self, p: PartitionId, f: F) -> Result<T, Status>
    where
        F: Fn(NodeId, SocketAddr, Epoch) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let deadline = Instant::now() + self.inner.cfg.op_timeout;
        let mut pause = Pause::new(RETRY_FIRST, RETRY_LAST);
        let mut maps = self.inner.map_rx.clone();
        loop {
            maps.borrow_and_update();
            let served = self.inner.served.notified();
            let v = self.view();
            let target = v.primary(p).and_then(|n| v.addr(n).map(|a| (n, a)));
            let r = match target {
                Some((n, a)) => f(n, a, v.map.epoch).await,
                None => Err(errno_status(Errno::EAGAIN)),
            };
            match r {
                Err(s) if retryable(&s) && Instant::now() < deadline => {
                    // What a retry waits for is a newer map (a new primary) or a copy
                    // here that serves again (a takeover done): go at once on either.
                    // Sleeping a long back-off instead cost a commit 240 ms after its
                    // partition served again.
                    tokio::select! {
                        () = tokio::time::sleep(pause.get()) => pause.grow(),
                        r = maps.changed() => match r {
                            Ok(()) => pause.reset(),
                            // The node is stopping: no map will come; keep the pace.
                            Err(_) => tokio::time::sleep(pause.get()).await,
                        },
                        () = served => pause.reset(),
                    }
                }
                r => return r,
            }
        }
    }

    /// Keeps what a step that follows an answer will add to a directory this node is
    /// the serving primary of ([`Expect`]).
    fn on_expect(&self, e: Expect) -> Result<(), Status> {
        let slot = self.primary_slot(e.dir.partition())?;
        let st = slot.read();
        if !st.serving {
            return Err(errno_status(Errno::EAGAIN));
        }
        if st.part.has_marker(e.intent, e.step) {
            return Ok(()); // Applied already (a redo, or a retried announcement).
        }
        let now = Instant::now();
        let mut expected = self.inner.expected.lock();
        let total: usize = expected.values().map(Vec::len).sum();
        if total >= MAX_EXPECTED {
            expected.retain(|_, list| {
                list.retain(|(_, until)| *until > now);
                !list.is_empty()
            });
            if expected.values().map(Vec::len).sum::<usize>() >= MAX_EXPECTED {
                expected.clear();
            }
        }
        let list = expected.entry(e.dir).or_default();
        if !list.iter().any(|(x, _)| x.intent == e.intent && x.step == e.step) {
            list.push((e, now + EXPECT_TTL));
        }
        Ok(())
    }

    /// `attr` of directory `ino` with the counts announced for it and not applied yet.
    fn counted(&self, ino: Ino, attr: &crate::namespace::Attr) -> crate::namespace::Attr {
        let now = Instant::now();
        let mut expected = self.inner.expected.lock();
        match expected.get_mut(&ino) {
            Some(list) => {
                list.retain(|(_, until)| *until > now);
                super::coordinator::with_expected(attr.clone(), list.iter().map(|(e, _)| e))
            }
            None => attr.clone(),
        }
    }

    /// Drops the announced counts whose steps `ops` apply (called with the copy's
    /// state locked, so a settled read sees either the count or the step, never both).
    fn applied_expected(&self, ops: &[PartOp]) {
        let mut expected = self.inner.expected.lock();
        if expected.is_empty() {
            return;
        }
        for op in ops {
            if let PartOp::Apply {
                intent,
                step,
                m: crate::namespace::Mutation::AdjustDir { dir, .. },
            } = op
                && let Some(list) = expected.get_mut(dir)
            {
                list.retain(|(e, _)| !(e.intent == *intent && e.step == *step));
                if list.is_empty() {
                    expected.remove(dir);
                }
            }
        }
    }

    /// Announces `expects` to their directories' primaries ([`Expect`]); true when all
    /// took them.
    async fn announce(&self, expects: Vec<(PartitionId, Expect)>) -> bool {
        let v = self.view();
        let calls = expects.into_iter().map(|(p, mut e)| {
            e.epoch = v.map.epoch;
            let target = v.primary(p).and_then(|n| v.addr(n).map(|a| (n, a)));
            async move {
                match target {
                    Some((n, _)) if n == self.me() => self.on_expect(e).is_ok(),
                    Some((_, addr)) => self.call_peer(addr, &e, Duration::from_secs(2)).await.is_ok(),
                    None => false,
                }
            }
        });
        futures_util::future::join_all(calls).await.into_iter().all(|ok| ok)
    }

    /// Executes a plan up to its answer: one batch, or an intent's record and every
    /// step the client waits for. What follows the answer comes back as a [`Tail`].
    async fn execute_plan(&self, plan: Plan) -> Result<Option<Tail>, Status> {
        let coord = match plan_run(&plan) {
            PlanRun::Batch { p, relative } => {
                // A retry after a failed replication re-sends the batch to a primary
                // that may already have applied it: relative steps then carry an id
                // (the markers are forgotten afterwards).
                let id = if relative {
                    let counter = self.alloc(p).await?;
                    Ino::new(p, counter)
                        .map(|i| i.0)
                        .ok_or_else(|| errno_status(Errno::ENOSPC))?
                } else {
                    0
                };
                self.execute_at(p, batch_ops(plan.1, id)).await?;
                if id != 0 {
                    self.queue_forgets(p, vec![id]);
                }
                return Ok(None);
            }
            PlanRun::Intent { coord } => coord,
        };
        let steps = plan.1;
        let counter = self.alloc(coord).await?;
        let id = Ino::new(coord, counter)
            .map(|i| i.0)
            .ok_or_else(|| errno_status(Errno::ENOSPC))?;
        let reign = self.lead_reign(coord).ok_or_else(|| errno_status(Errno::EAGAIN))?;
        self.inner.inflight.lock().insert(id);
        let intent = Intent { id, steps };
        match self.apply_answered(coord, &intent, true, reign).await {
            // Durable (the intent's record is), and every name and inode it changes is
            // in place: answered now.
            Ok((later, others)) => Ok(Some(Tail {
                coord,
                id,
                reign,
                later,
                others,
            })),
            Err(e) => {
                self.inner.inflight.lock().remove(&id);
                Err(e)
            }
        }
    }

    /// Records (when `begin`) and applies every step of an intent, then finishes it.
    async fn drive_intent(&self, coord: PartitionId, intent: &Intent, begin: bool) -> Result<(), Status> {
        let reign = self.lead_reign(coord).ok_or_else(|| errno_status(Errno::EAGAIN))?;
        let (later, others) = self.apply_answered(coord, intent, begin, reign).await?;
        self.execute_all(later, coord, reign).await?;
        self.finish_intent(coord, intent.id, others, reign).await
    }

    /// Records (when `begin`) an intent and applies the steps its client waits for;
    /// returns the batches that may follow the answer ([`answer_before`]) and every
    /// other partition it touches.
    async fn apply_answered(
        &self,
        coord: PartitionId,
        intent: &Intent,
        begin: bool,
        reign: Epoch,
    ) -> Result<(Later, Vec<PartitionId>), Status> {
        let (first, by_part) = intent_ops(coord, intent, begin);
        let others: Vec<PartitionId> = by_part.keys().copied().collect();
        let (now, mut later) = answer_before(by_part);
        // A new operation (`begin`) tells the directories' primaries what follows its
        // answer, beside its first batch; a redo has no one to answer.
        let expects = if begin { expected_counts(&later) } else { Vec::new() };
        let (first, announced) = tokio::join!(self.execute_led(coord, first, coord, reign), self.announce(expects));
        first?;
        self.execute_all(now, coord, reign).await?;
        if !announced {
            // A settled read could not count them: apply them before the answer.
            self.execute_all(std::mem::take(&mut later), coord, reign).await?;
        }
        Ok((later, others))
    }

    /// Executes batches of an intent led from `coord` in `reign`, in parallel.
    async fn execute_all(&self, batches: Later, coord: PartitionId, reign: Epoch) -> Result<(), Status> {
        let results = futures_util::future::join_all(
            batches
                .into_iter()
                .map(|(p, ops)| self.execute_led(p, ops, coord, reign)),
        )
        .await;
        results.into_iter().collect()
    }

    /// Drops a finished intent's record and markers (in its partition now; in the
    /// `others` with their next batches).
    async fn finish_intent(
        &self,
        coord: PartitionId,
        id: u64,
        others: Vec<PartitionId>,
        reign: Epoch,
    ) -> Result<(), Status> {
        self.execute_led(coord, finish_ops(id), coord, reign).await?;
        for p in others {
            self.queue_forgets(p, vec![id]);
        }
        Ok(())
    }

    /// Whether no operation may still have counts to apply to `dirs`, by every node's
    /// answer for the partitions it leads in `v` (all of them covered), see
    /// [`quiet_dirs`].
    async fn quiet(&self, v: &MapView, dirs: Vec<Ino>) -> bool {
        let req = Quiet {
            epoch: v.map.epoch,
            dirs,
        };
        let asks = v
            .map
            .nodes
            .values()
            .filter(|n| n.roles.meta && v.map.is_up(n.id))
            .map(|n| {
                let req = &req;
                async move {
                    if n.id == self.me() {
                        (self.view().map.epoch == req.epoch).then(|| self.on_quiet(req))
                    } else {
                        self.call_peer(n.addr, req, Duration::from_millis(500)).await.ok()
                    }
                }
            });
        let mut covered = BTreeSet::new();
        for answer in futures_util::future::join_all(asks).await {
            match answer {
                Some(a) if a.quiet => covered.extend(a.partitions),
                _ => return false,
            }
        }
        covered.len() == v.map.partitions as usize
    }

    /// [`MetaNode::quiet`] for the partitions this node serves as primary.
    fn on_quiet(&self, req: &Quiet) -> QuietReply {
        let counted = self.inner.counted.lock().clone();
        let mut out = QuietReply {
            partitions: Vec::new(),
            quiet: true,
        };
        for (p, slot) in self.primary_slots(&self.view()) {
            let st = slot.read();
            if !st.serving {
                continue;
            }
            out.partitions.push(p);
            if st
                .part
                .intents
                .values()
                .any(|i| !counted.contains(&i.id) && adjusts_any(i, &req.dirs))
            {
                out.quiet = false;
            }
        }
        out
    }

    /// Whether partition `p` has nothing left unfinished by an earlier primary: this
    /// node is its primary, serves it, and drives every intent pending in it itself.
    fn settled_here(&self, p: PartitionId) -> bool {
        let Ok(slot) = self.primary_slot(p) else {
            return false;
        };
        let inflight = self.inner.inflight.lock();
        let st = slot.read();
        st.serving && st.part.intents.keys().all(|id| inflight.contains(id))
    }

    /// [`MetaNode::settled_here`], asked of `p`'s primary.
    async fn settled(&self, v: &MapView, p: PartitionId) -> bool {
        match v.primary(p) {
            Some(n) if n == self.me() => self.settled_here(p),
            Some(n) => match v.addr(n) {
                Some(addr) => {
                    let req = Settled {
                        epoch: v.map.epoch,
                        partition: p,
                    };
                    self.call_peer(addr, &req, Duration::from_millis(500))
                        .await
                        .unwrap_or(false)
                }
                None => false,
            },
            None => false,
        }
    }

    /// Redoes intents whose coordinator is gone, and frees the locks coordinators on
    /// nodes that went down left behind.
    ///
    /// An intent pending in a partition this node is primary of and not driven here
    /// was left by an earlier primary: it is redone at once (after a takeover, the
    /// takeover wakes this loop), since `fence` keeps an earlier primary that still
    /// runs from applying any more of its steps. The keys a coordinator held when its
    /// node went down are freed once the partition of its operation ([`Lock::anchor`])
    /// has settled — its new primary redid what the coordinator left — so nobody runs
    /// on a half-applied rename; or after `dead_coordinator_locks` if that cannot be
    /// learned.
    async fn sweep_intents(&self) {
        // Node → (when it was seen down, whether it has been seen up since).
        let mut down_since: HashMap<u64, (Instant, bool)> = HashMap::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
                _ = self.inner.sweep_now.notified() => {}
            }
            if self.inner.stopped.load(Ordering::Relaxed) {
                return;
            }
            let v = self.view();
            self.release_dead_coordinators(&v, &mut down_since).await;
            self.redo_left_intents(&v).await;
        }
    }

    /// Releases the locks of coordinators seen down (`down_since`: node → when it was
    /// seen down, whether seen up since): once their operations' anchors settled, or
    /// after `dead_coordinator_locks`.
    async fn release_dead_coordinators(&self, v: &MapView, down_since: &mut HashMap<u64, (Instant, bool)>) {
        let me = self.me();
        // A node that came back meanwhile lost its coordinations with its memory:
        // the locks it took before it was seen down go too (not those it took since).
        let now = Instant::now();
        for n in v.map.nodes.values() {
            let up = v.map.is_up(n.id);
            match down_since.get_mut(&n.id.0) {
                // Down again after coming back: the newest life ended now.
                Some((t, back)) if !up && *back => (*t, *back) = (now, false),
                Some((_, back)) => *back |= up,
                None if !up => {
                    down_since.insert(n.id.0, (now, false));
                }
                None => {}
            }
        }
        let dead: HashMap<u64, Instant> = down_since
            .iter()
            .filter(|(n, _)| **n != me.0)
            .map(|(n, (t, _))| (*n, *t))
            .collect();
        let is_dead = |n: u64, taken: Instant| dead.get(&n).is_some_and(|seen| taken <= *seen);
        let anchors = self.inner.locks.anchors_of(is_dead);
        if !anchors.is_empty() {
            let mut settled = BTreeSet::new();
            for a in anchors {
                if self.settled(v, PartitionId(a)).await {
                    settled.insert(a);
                }
            }
            let limit = self.inner.cfg.dead_coordinator_locks;
            let freed = self.inner.locks.release_coordinators(|n, taken, anchor| {
                dead.get(&n).is_some_and(|seen| {
                    taken <= *seen && (settled.contains(&anchor) || now.saturating_duration_since(*seen) >= limit)
                })
            });
            if freed > 0 {
                info!(locks = freed, nodes = ?dead.keys().collect::<Vec<_>>(), "released locks of coordinators that were down");
            }
        }
        // Done with a node once it is up again and its old locks are released.
        down_since.retain(|n, (seen, _)| {
            !v.map.is_up(NodeId(*n))
                || !self
                    .inner
                    .locks
                    .anchors_of(|m, taken| m == *n && taken <= *seen)
                    .is_empty()
        });
    }

    /// Redoes the intents of partitions led here that no coordination here drives (their
    /// coordinator died or gave up).
    async fn redo_left_intents(&self, v: &MapView) {
        let pending: Vec<(PartitionId, Intent)> = self
            .primary_slots(v)
            .into_iter()
            .flat_map(|(p, s)| {
                let st = s.read();
                if !st.serving {
                    return Vec::new();
                }
                st.part.intents.values().map(|i| (p, i.clone())).collect()
            })
            .collect();
        let inflight = self.inner.inflight.lock().clone();
        for (p, intent) in pending {
            if inflight.contains(&intent.id) {
                continue;
            }
            info!(
                partition = p.0,
                intent = intent.id,
                "redoing an operation its coordinator left unfinished"
            );
            if let Err(e) = self.drive_intent(p, &intent, false).await {
                warn!(intent = intent.id, error = %e, "redo failed; will retry");
            }
        }
    }

    /// The service's handlers, to merge into the node's transport router.
    pub fn router(&self) -> Router {
        let mut r = Router::new();
        r = self.route_reads(r);
        r = self.route_ops(r);
        r = self.route::<Fetch, _, _>(r, |n, _, req| {
            let span = info_span!("meta.fetch", inodes = req.inodes.len(), dentries = req.dentries.len());
            async move {
                n.check_epoch(req.epoch).await?;
                n.on_fetch(&req)
            }
            .instrument(span)
        });
        r = self.route::<Execute, _, _>(r, |n, ctx, req| async move {
            n.check_epoch(req.epoch).await?;
            n.primary_write(req.partition, req.ops, req.from, ctx.deadline).await
        });
        r = self.route::<Alloc, _, _>(r, |n, _, req| {
            let span = info_span!("meta.alloc", partition = req.partition.0);
            async move {
                n.check_epoch(req.epoch).await?;
                n.on_alloc(req).await
            }
            .instrument(span)
        });
        r = self.route::<Lock, _, _>(r, |n, _, req| {
            let span = info_span!("meta.lock", keys = req.keys.len(), release = req.release);
            async move { n.on_lock(req).await }.instrument(span)
        });
        r = self.route::<Replicate, _, _>(r, |n, _, req| {
            let span = info_span!(
                "meta.replicate",
                partition = req.partition.0,
                lsn = req.lsn,
                ops = req.ops.len()
            );
            async move { n.on_replicate(req).await }.instrument(span)
        });
        r = self.route::<InstallPiece, _, _>(r, |n, _, req| {
            let span = info_span!(
                "meta.install",
                partition = req.partition.0,
                lsn = req.copy.lsn,
                offset = req.offset,
                bytes = req.copy.total
            );
            async move { n.on_install_piece(req).await }.instrument(span)
        });
        r = self.route::<SyncMe, _, _>(r, |n, _, req| async move { n.on_sync_me(req).await });
        r = self.route::<Pull, _, _>(r, |n, _, req| async move { n.on_pull(req).await });
        r = self.route::<PullPiece, _, _>(r, |n, _, req| async move { n.on_pull_piece(req).await });
        r = self.route::<Stats, _, _>(r, |n, _, _| async move { Ok(n.on_stats()) });
        r = self.route::<Fence, _, _>(r, |n, _, req| async move { n.on_fence(req).await });
        r = self.route::<Settled, _, _>(r, |n, _, req| async move {
            n.check_epoch(req.epoch).await?;
            Ok(n.settled_here(req.partition))
        });
        r = self.route::<Quiet, _, _>(r, |n, _, req| async move {
            n.check_epoch_exact(req.epoch).await?;
            Ok(n.on_quiet(&req))
        });
        r = self.route::<Expect, _, _>(r, |n, _, req| async move {
            n.check_epoch(req.epoch).await?;
            n.on_expect(req)
        });
        r
    }

    /// Reads, served from any caught-up copy whatever the caller's epoch.
    fn route_reads(&self, r: Router) -> Router {
        self.route::<Read, _, _>(r, |n, ctx, mut req| {
            if let ReadOp::GetXattr { creds, .. }
            | ReadOp::ListXattr { creds, .. }
            | ReadOp::GetInodeAs { creds, .. }
            | ReadOp::LookupAs { creds, .. }
            | ReadOp::ReadDirAs { creds, .. } = &mut req.op
            {
                n.squash(&ctx, creds);
            }
            let confined = n.confined_to(&ctx);
            let client = matches!(*ctx.principal, shingle_transport::auth::Principal::Client(_));
            let parts = n.view().map.partitions;
            let partition = match &req.op {
                ReadOp::Lookup { parent, name } | ReadOp::LookupAs { parent, name, .. } => {
                    Some(crate::placement::dentry_partition(*parent, name, parts).0)
                }
                ReadOp::ReadDir { .. } | ReadOp::ReadDirAs { .. } => None,
                op => Some(op.ino().partition().0),
            };
            let span = info_span!("meta.read", op = req.op.name(), partition, ino = req.op.ino().0);
            async move {
                if let Some(root) = confined? {
                    let names = super::subtree::read_names(&req.op).ok_or_else(|| errno_status(Errno::EACCES))?;
                    n.confine(root, &[names]).await?;
                }
                if !n.check_read(client, &req.op).await?
                    && let ReadOp::ReadDirAs { plus, .. } = &mut req.op
                {
                    *plus = false;
                }
                n.on_read(&req.op)
            }
            .instrument(span)
        })
    }

    /// Client operations: admitted, confined to a client key's subtree, coordinated here.
    fn route_ops(&self, r: Router) -> Router {
        self.route::<Op, _, _>(r, |n, ctx, mut req| {
            let admitted = n.admit_client_op(&ctx, &mut req);
            let confined = n.confined_to(&ctx);
            let parts = n.view().map.partitions;
            let span = info_span!(
                "meta.op",
                op = req.op.name(),
                partition = req.op.anchor(parts).0,
                ino = req.op.ino().0,
                retries = 0u32,
                serve_wait_ms = Empty,
            );
            async move {
                let client = admitted?;
                if let Some(root) = confined? {
                    n.confine(root, &super::subtree::op_names(&req.op)).await?;
                }
                let cap_for = cap_for(&req.op);
                let reply = n.on_op(req, client).await?;
                Ok(match cap_for {
                    Some(of) if client => n.with_cap(of, reply),
                    _ => reply,
                })
            }
            .instrument(span)
        })
    }

    /// Takes (or releases) lock keys for a coordinator; when granted, reads what the
    /// request asks for under them.
    async fn on_lock(&self, req: Lock) -> Result<Locked, Status> {
        if req.keys.len() > super::wire::MAX_LOCK_KEYS {
            return Err(Status::new(
                Code::InvalidRequest,
                format!("a lock names at most {} keys", super::wire::MAX_LOCK_KEYS),
            ));
        }
        if req.release {
            self.inner.locks.release(&req.keys, req.owner);
            return Ok(Locked {
                granted: true,
                fetched: None,
            });
        }
        // A coordinator whose node is not Up may not take keys: its partitions went
        // to others, who may be redoing what it left.
        if !self.view().map.is_up(NodeId(super::locks::owner_node(req.owner))) {
            return Ok(Locked::default());
        }
        let lease = Duration::from_millis(u64::from(req.lease_ms.clamp(1, 120_000)));
        let wait = Duration::from_millis(u64::from(req.wait_ms.min(5000)));
        let granted = self
            .inner
            .locks
            .lock(&req.keys, req.owner, req.anchor.0, lease, wait)
            .await;
        // Read under the keys just taken, as the coordinator's fetch would.
        let fetched = if granted {
            req.fetch.as_ref().and_then(|f| self.on_fetch(f).ok())
        } else {
            None
        };
        Ok(Locked { granted, fetched })
    }

    /// What a client key's operation may be: what the nodes' own daemons record (a
    /// purge done, shards relocated) is refused; a hold on a removed file it has open
    /// is its own business (root's only because nodes check it so); everything else
    /// runs with its credentials squashed as its grant says.
    /// Returns whether the caller holds a client key.
    fn admit_client_op(&self, ctx: &CallContext, req: &mut Op) -> Result<bool, Status> {
        if !matches!(*ctx.principal, shingle_transport::auth::Principal::Client(_)) {
            return Ok(false);
        }
        match req.op {
            NsOp::Purged { .. } | NsOp::RelocateShards { .. } => Err(errno_status(Errno::EPERM)),
            NsOp::HoldPurge { .. } => Ok(true),
            _ => {
                self.squash(ctx, &mut req.creds);
                Ok(true)
            }
        }
    }

    /// `reply` with a shard capability for the file `of` names: a client key that
    /// created a file, or reserved versions of one (both checked by then), may write
    /// and delete its shards ([`shingle_transport::cap`]). Unchanged on a node
    /// without a capability key.
    fn with_cap(&self, of: CapFor, reply: OpReply) -> OpReply {
        let Some(key) = &self.inner.cfg.caps else {
            return reply;
        };
        let ino = match (of, &reply) {
            (CapFor::File(ino), OpReply::Versions(_)) => ino,
            (CapFor::Created, OpReply::Attr(a) | OpReply::Made(a, _)) => a.ino,
            _ => return reply,
        };
        let cap = key
            .mint(ino.0, Right::Write, shingle_transport::cap::unix_now())
            .to_bytes();
        OpReply::WithCap(Box::new(reply), cap)
    }

    /// A caller with a client key acts as its grant says: nobody for uid 0 when root
    /// is squashed, one fixed uid and gid when the grant names them (what it may send
    /// at all is the node's guard's business).
    fn squash(&self, ctx: &CallContext, creds: &mut crate::namespace::Creds) {
        if let shingle_transport::auth::Principal::Client(id) = &*ctx.principal {
            match self.view().map.client(&id.name, id.serial) {
                Some(g) => g.squash(creds),
                // Revoked since the guard let the request in: nobody, to be safe.
                None => *creds = crate::map::nobody(),
            }
        }
    }

    /// The directory a client key's requests are confined to: `None` for the cluster
    /// secret and for keys granted the whole tree.
    fn confined_to(&self, ctx: &CallContext) -> Result<Option<Ino>, Status> {
        let shingle_transport::auth::Principal::Client(id) = &*ctx.principal else {
            return Ok(None);
        };
        match self.view().map.client(&id.name, id.serial) {
            Some(g) => Ok(g.subtree.as_ref().map(|s| s.root)),
            // Revoked since the guard let the request in.
            None => Err(errno_status(Errno::EACCES)),
        }
    }

    /// Refuses (`EACCES`) a request naming an inode outside the directory `root`
    /// ([`super::subtree`]); one naming no inode at all gets `ENOENT`, as anyone would
    /// (a client's fstat of a file removed while open falls back to what it holds).
    async fn confine(&self, root: Ino, inos: &[Ino]) -> Result<(), Status> {
        for ino in inos {
            if self.facts(*ino).await?.is_none() {
                return Err(errno_status(Errno::ENOENT));
            }
            if !self.within(*ino, root).await? {
                return Err(errno_status(Errno::EACCES));
            }
        }
        Ok(())
    }

    /// Whether `ino` is `root` or lies below it: walks its parents through the records
    /// held here and facts fetched from their partitions' primaries.
    async fn within(&self, ino: Ino, root: Ino) -> Result<bool, Status> {
        use super::subtree::{Step, walk};
        for _ in 0..super::subtree::MAX_DEPTH {
            let now = Instant::now();
            let known = |i: Ino| self.known_facts(i, now).map(|f| f.and_then(|f| f.parent));
            match walk(ino, root, known).map_err(errno_status)? {
                Step::Inside => return Ok(true),
                Step::Outside => return Ok(false),
                Step::Need(i) => {
                    self.fetch_facts(i).await?;
                }
            }
        }
        Err(errno_status(Errno::ELOOP))
    }

    /// What a client's read needs checked that the kernel of a trusted mount checks:
    /// search permission on a lookup's directory, read permission on a listed one.
    /// A client key must send the kinds that carry its credentials. `Ok(false)`: a
    /// listing with attributes (`plus`) by credentials that may read the directory but
    /// not search it, which gets names only (as `ls -l` shows no attributes there).
    async fn check_read(&self, client: bool, op: &ReadOp) -> Result<bool, Status> {
        use crate::namespace::perm::{R, X};
        let (creds, dir, mask) = match op {
            ReadOp::Lookup { .. } | ReadOp::ReadDir { .. } if client => {
                return Err(Status::new(
                    Code::PermissionDenied,
                    "a client key looks up and lists with its credentials (LookupAs, ReadDirAs)",
                ));
            }
            ReadOp::LookupAs { creds, parent, .. } => (creds, *parent, X),
            ReadOp::ReadDirAs { creds, dir, .. } => (creds, *dir, R),
            _ => return Ok(true),
        };
        let facts = self.facts(dir).await?.ok_or_else(|| errno_status(Errno::ENOENT))?;
        if facts.attr.kind != crate::namespace::FileKind::Dir {
            return Err(errno_status(Errno::ENOTDIR));
        }
        crate::namespace::perm::check(creds, &facts.attr, mask).map_err(errno_status)?;
        Ok(match op {
            ReadOp::ReadDirAs { plus: true, .. } => crate::namespace::perm::check(creds, &facts.attr, X).is_ok(),
            _ => true,
        })
    }

    /// `ino`'s parent and attributes from a copy of its partition this node serves
    /// (`None`: none here; `Some(None)`: no such inode).
    fn held_facts(&self, ino: Ino) -> Option<Option<super::subtree::Facts>> {
        let slot = self.serving(ino.partition()).ok()?;
        let st = slot.read();
        Some(st.part.inodes.get(&ino).map(super::subtree::Facts::of))
    }

    /// `ino`'s parent and attributes: held here, fetched within [`super::subtree::HOME_TTL`],
    /// or fetched now.
    async fn facts(&self, ino: Ino) -> Result<Option<super::subtree::Facts>, Status> {
        match self.known_facts(ino, Instant::now()) {
            Some(f) => Ok(f),
            None => self.fetch_facts(ino).await,
        }
    }

    /// `ino`'s parent and attributes without asking another node: held here, or
    /// fetched within [`super::subtree::HOME_TTL`] before `now` (`None`: neither).
    fn known_facts(&self, ino: Ino, now: Instant) -> Option<Option<super::subtree::Facts>> {
        self.held_facts(ino).or_else(|| self.inner.homes.get(ino, now))
    }

    /// `ino`'s parent and attributes, from its partition's primary (and remembered).
    async fn fetch_facts(&self, ino: Ino) -> Result<Option<super::subtree::Facts>, Status> {
        let asked = Instant::now();
        let v = self.view();
        let addr = v
            .primary(ino.partition())
            .and_then(|n| v.addr(n))
            .ok_or_else(|| errno_status(Errno::EAGAIN))?;
        let req = Fetch {
            epoch: v.map.epoch,
            inodes: vec![ino],
            ..Fetch::default()
        };
        let got = self
            .call_peer(addr, &req, Duration::from_secs(2))
            .await
            .map_err(to_status)?;
        let facts = got
            .inodes
            .into_iter()
            .next()
            .flatten()
            .map(|r| super::subtree::Facts::of(&r));
        self.inner.homes.put(ino, facts.clone(), asked);
        Ok(facts)
    }

    fn route<R, F, Fut>(&self, router: Router, f: F) -> Router
    where
        R: MetaRpc,
        F: Fn(MetaNode, CallContext, R) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<R::Reply, Status>> + Send + 'static,
    {
        let node = self.clone();
        let f = Arc::new(f);
        shingle_transport::name_kind::<R>(R::KIND);
        router.raw(R::KIND, move |ctx: CallContext, payload: Bytes| {
            let node = node.clone();
            let f = f.clone();
            async move {
                let req: R = decode(&payload)?;
                let reply = f(node, ctx, req).await?;
                encode(&reply)
            }
        })
    }
}

/// Batches of an intent, by partition.
type Later = BTreeMap<PartitionId, Vec<PartOp>>;

/// What an answered operation's intent leaves to do: the batches that follow the
/// answer (directories' counts and times), then its finish.
struct Tail {
    coord: PartitionId,
    id: u64,
    reign: Epoch,
    later: Later,
    others: Vec<PartitionId>,
}

/// An answered intent whose record is still to drop ([`MetaNode::finish_tails`]).
struct Finishing {
    id: u64,
    /// The reign of its partition it was led in: finished only in that one.
    reign: Epoch,
    /// The other partitions it changed, which forget its markers once it is finished.
    others: Vec<PartitionId>,
}

/// The answer of a client operation, set once by the attempt that runs it.
type Answer = tokio::sync::OnceCell<Result<OpReply, Status>>;

enum Retry {
    /// Locks busy or a host unreachable: release everything and try again.
    Busy,
    /// Final.
    Fail(Status),
}

fn to_status(e: CallError) -> Status {
    match e {
        CallError::Errno(e) => errno_status(e),
        CallError::Stale(a) => stale(format!("stale map at {a}")),
        CallError::Transport(t) if t.is_peer_failure() => errno_status(Errno::EAGAIN),
        CallError::Transport(t) => t.status().cloned().unwrap_or_else(|| errno_status(Errno::EIO)),
    }
}

/// Refuses a batch from a coordinator that may no longer apply it
/// ([`super::coordinator::fence`]).
/// Whom a batch answers and the ops it carries (in the writes' order): the writes that
/// may still go in map `v`. A write whose caller stopped waiting is dropped (its
/// caller may be retrying it: applying this copy too would apply it twice); the others
/// are answered now: past their caller's deadline, or refused by `v`'s fence.
fn admit(v: &MapView, writes: Vec<Queued>) -> (Vec<PartOp>, Vec<tokio::sync::oneshot::Sender<Result<(), Status>>>) {
    let now = Instant::now();
    let mut ops = Vec::new();
    let mut dones = Vec::with_capacity(writes.len());
    for w in writes {
        if w.done.is_closed() {
            continue;
        }
        let refused = if w.deadline.is_some_and(|d| now >= d) {
            Some(Status::new(
                Code::DeadlineExceeded,
                "the batch waited past its caller's deadline",
            ))
        } else {
            fence(v, w.from, &w.ops).err()
        };
        match refused {
            Some(e) => {
                let _ = w.done.send(Err(e));
            }
            None => {
                ops.extend(w.ops);
                dones.push(w.done);
            }
        }
    }
    (ops, dones)
}

fn fence(v: &MapView, from: NodeId, ops: &[PartOp]) -> Result<(), Status> {
    super::coordinator::fence(v, from, ops).map_err(fenced)
}

/// The answer to a fenced coordinator ([`fence`]): final for it (it gives the operation
/// up and frees its locks), `EAGAIN` for its client, whose retry goes to the new primary.
fn fenced(msg: String) -> Status {
    Status::new(Code::Fenced, msg)
}

fn is_fenced(s: &Status) -> bool {
    s.code == Code::Fenced
}

fn is_eagain(s: &Status) -> bool {
    s.code == Code::Application && s.app_code == Errno::EAGAIN.code() as u32
}

fn retryable(s: &Status) -> bool {
    s.code == Code::StaleEpoch || is_eagain(s) || matches!(s.code, Code::ShuttingDown | Code::DeadlineExceeded)
}

/// How often the sweep looks for intents to redo and locks of dead coordinators.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// How soon a call to a partition's primary that found it not serving is tried again,
/// at first and at most (sooner when the map changes or a copy here serves again).
const RETRY_FIRST: Duration = Duration::from_millis(5);
const RETRY_LAST: Duration = Duration::from_millis(100);

/// How long a client's operation waits at its partition's primary for the copy there
/// to serve ([`MetaNode::primary_slot_soon`]): a takeover usually takes 0.1–0.5 s here;
/// well under the client's call timeout, so a primary that will not serve soon (cut
/// off from the managers) still answers `EAGAIN` and the client looks again.
const SERVE_WAIT: Duration = Duration::from_secs(2);

/// How soon a catch-up that failed is tried again, at first and at most.
const CATCH_UP_FIRST: Duration = Duration::from_millis(20);
const CATCH_UP_LAST: Duration = Duration::from_millis(300);

/// How often markers queued for forgetting are flushed when no batch carried them.
const FORGET_FLUSH: Duration = Duration::from_secs(1);

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::{NodeInfo, NodeState};
    use tokio::sync::oneshot;

    fn view(up: &[u64]) -> MapView {
        let mut m = ClusterMap::new("t", 8, 1, 3, 1);
        for id in up {
            let id = NodeId(*id);
            let addr = SocketAddr::from(([127, 0, 0, 1], 7000 + id.0 as u16));
            m.nodes.insert(id, NodeInfo::meta_only(id, addr, NodeState::Up));
        }
        MapView::new(m)
    }

    fn queued(op: u64, from: u64, deadline: Option<Instant>) -> (Queued, oneshot::Receiver<Result<(), Status>>) {
        let (done, answer) = oneshot::channel();
        let w = Queued {
            ops: vec![PartOp::Forget(op)],
            from: NodeId(from),
            deadline,
            done,
            span: Span::none(),
        };
        (w, answer)
    }

    #[test]
    fn a_queue_hands_out_bounded_batches_oldest_first_and_then_stops_leading() {
        let mut q = Queue {
            entries: Vec::new(),
            leading: true,
        };
        let mut answers = Vec::new();
        for i in 0..(MAX_WRITES_PER_BATCH as u64 + 3) {
            let (w, a) = queued(i, 1, None);
            q.entries.push(w);
            answers.push(a);
        }
        let first = q.next_batch().expect("a batch");
        assert_eq!(first.len(), MAX_WRITES_PER_BATCH);
        assert!(matches!(first[0].ops[0], PartOp::Forget(0)));
        let rest = q.next_batch().expect("the rest");
        assert_eq!(rest.len(), 3);
        assert!(matches!(rest[0].ops[0], PartOp::Forget(n) if n == MAX_WRITES_PER_BATCH as u64));
        assert!(q.leading, "still leading until it finds the queue empty");
        assert!(q.next_batch().is_none());
        assert!(!q.leading, "an empty queue ends the leader: the next write starts one");
    }

    #[test]
    fn a_batch_carries_the_writes_still_waiting_and_answers_the_refused_at_once() {
        let v = view(&[1, 2, 3]);
        let past = Instant::now() - Duration::from_secs(1);
        let (ok1, mut a1) = queued(1, 1, None);
        let (late, mut a2) = queued(2, 1, Some(past));
        let (gone, a3) = queued(3, 1, None);
        drop(a3);
        let (down, mut a4) = queued(4, 9, None); // node 9 is not Up in this map
        let (ok2, mut a5) = queued(5, 2, Some(Instant::now() + Duration::from_secs(60)));
        let (ops, dones) = admit(&v, vec![ok1, late, gone, down, ok2]);
        assert_eq!(
            ops,
            vec![PartOp::Forget(1), PartOp::Forget(5)],
            "in order, only those that go"
        );
        assert_eq!(dones.len(), 2);
        let refused = a2.try_recv().expect("answered").expect_err("late");
        assert_eq!(refused.code, Code::DeadlineExceeded);
        let refused = a4.try_recv().expect("answered").expect_err("fenced");
        assert_eq!(refused.code, Code::Fenced);
        assert!(
            a1.try_recv().is_err() && a5.try_recv().is_err(),
            "the batch answers them later"
        );
    }
}
