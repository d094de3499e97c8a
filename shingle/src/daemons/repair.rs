//! The repair scan: rebuilds shards that are lost or were never stored, and records
//! where they went.
//!
//! Every meta node runs one over the files of the partitions it is primary of, so the
//! work is spread like the namespace and needs no coordinator: when a node fails or a
//! manager fails over, the partition's next primary simply scans again (repairs are
//! idempotent). A shard needs repair when its location hint is 0 (the write left it
//! out because its node was failing) or names a node that is Out (the manager gave up
//! on it). Shards on Down nodes are waited for: a node that comes back still has them.
//!
//! A complete stripe whose shards are not all on their placement group's current nodes
//! (written to a spare while a member was down, or the group changed when a node joined
//! or came back) has them moved there: rebuilt on the group node, relocated, and the old
//! copy deleted (only at that version). This is how a new node gets its ~1/N share of
//! the data, online and under the same throttle.
//!
//! For each such shard, [`plan_stripe`] (pure) picks a target — the stripe's current
//! placement-group node at that index, or the group's first spare, never a node that
//! already holds a shard of the stripe — and the sources (shards on Up nodes). The scan
//! asks the target to rebuild the shard from k sources (`RepairShard`), then records
//! the new location in the file's layout (`RelocateShards`, a no-op if the stripe was
//! rewritten meanwhile). Rebuild bandwidth is throttled; progress is published in the
//! node's `Stats` and shown by `shingle status`.

use bytes::Bytes;
use shingle_data::wire::{DeleteShard, DeleteShardRequest, RepairShard, RepairShardRequest, ShardId, ShardSource};
use shingle_meta::ids::{Ino, NodeId};
use shingle_meta::map::{ClusterMap, NodeState, Placement};
use shingle_meta::meta_client::MetaClient;
use shingle_meta::namespace::{Layout, StripeRec};
use shingle_meta::placement::stripe_pg;
use shingle_meta::service::MetaNode;
use shingle_meta::service::wire::RepairStats;
use shingle_transport::{CallOptions, PeerClient, RpcChannel};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

/// Settings of the repair scan.
#[derive(Clone, Debug)]
pub struct RepairConfig {
    /// Pause between passes (a map change starts one sooner).
    pub interval: Duration,
    /// Rebuild bandwidth limit of this node's scan, in bytes per second.
    pub bytes_per_sec: u64,
    /// Shards rebuilt at once.
    pub parallel: usize,
}

impl Default for RepairConfig {
    /// A pass every 10 s, 200 MiB/s, 4 shards at once.
    fn default() -> Self {
        RepairConfig {
            interval: Duration::from_secs(10),
            bytes_per_sec: 200 << 20,
            parallel: 4,
        }
    }
}

/// One shard to rebuild.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardRepair {
    /// Shard index.
    pub shard: usize,
    /// Node to rebuild it on.
    pub target: NodeId,
    /// Shards to rebuild from: (index, node), all on Up nodes.
    pub sources: Vec<(usize, NodeId)>,
    /// For a move: the node that holds the shard now (its copy is deleted after).
    pub from: Option<NodeId>,
}

/// What a stripe needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StripePlan {
    /// Every stored shard is on a node that is Up or Down (coming back).
    Healthy,
    /// Shards to rebuild (some may lack a target and wait for a node).
    Repair(Vec<ShardRepair>),
    /// Every shard is stored, but some share a node with another shard of the stripe
    /// (written while the group had too few live nodes): move them to their own nodes.
    /// This restores failure tolerance, so it goes before plain moves.
    Spread(Vec<ShardRepair>),
    /// Every shard is stored, but some are not on their placement group's current node
    /// (written to a spare, or the group changed when a node joined): move them there.
    Move(Vec<ShardRepair>),
    /// Fewer than k shards are on Up nodes: not readable, not repairable now.
    Unreadable,
}

/// Decides what stripe `s` of `ino` needs under `map`.
pub fn plan_stripe(
    map: &ClusterMap,
    placement: &Placement,
    ino: Ino,
    s: u64,
    layout: &Layout,
    rec: &StripeRec,
) -> StripePlan {
    let (k, n) = (usize::from(layout.k), usize::from(layout.k) + usize::from(layout.m));
    let used = shingle_client::ec_policy(layout).data_shards_used(rec.len as usize);
    let g = stripe_pg(ino, s, map.pgs);
    let group = placement.pg(g);
    // Where each stored shard is: None when lost.
    let mut loc: Vec<Option<NodeId>> = vec![None; n];
    let mut lost = Vec::new();
    for (i, l) in loc.iter_mut().enumerate() {
        if (used..k).contains(&i) {
            continue; // an empty data shard of a short stripe: never stored
        }
        let node = match rec.nodes.get(i).copied() {
            Some(None) => None,
            Some(Some(h)) if map.nodes.contains_key(&h) => Some(h),
            _ => group.get(i).copied(),
        };
        match node {
            Some(id) if map.nodes.get(&id).is_some_and(|x| x.state != NodeState::Out) => *l = Some(id),
            _ => lost.push(i),
        }
    }
    if lost.is_empty() {
        return plan_moves(map, group, &loc);
    }
    let sources: Vec<(usize, NodeId)> = loc
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.filter(|id| map.is_up(*id)).map(|id| (i, id)))
        .collect();
    if sources.len() + (k - used) < k {
        return StripePlan::Unreadable;
    }
    let mut taken: Vec<NodeId> = loc.iter().flatten().copied().collect();
    let spares = map.pg_spares(g, group);
    let mut out = Vec::new();
    for i in lost {
        let target = group
            .get(i)
            .copied()
            .filter(|id| map.is_up(*id) && !taken.contains(id))
            .or_else(|| spares.iter().copied().find(|id| !taken.contains(id)));
        let Some(target) = target else { continue };
        taken.push(target);
        out.push(ShardRepair {
            shard: i,
            target,
            sources: sources.clone(),
            from: None,
        });
    }
    StripePlan::Repair(out)
}

/// Moves of a complete stripe's shards to their group's current nodes: only when the
/// shard's node and the group node are both Up and the group node holds no shard of
/// the stripe yet (so a move never lowers the stripe's failure tolerance).
fn plan_moves(map: &ClusterMap, group: &[NodeId], loc: &[Option<NodeId>]) -> StripePlan {
    let mut taken: Vec<NodeId> = loc.iter().flatten().copied().collect();
    let sources: Vec<(usize, NodeId)> = loc
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.filter(|id| map.is_up(*id)).map(|id| (i, id)))
        .collect();
    let mut out = Vec::new();
    for (i, l) in loc.iter().enumerate() {
        let (Some(now), Some(want)) = (*l, group.get(i).copied()) else {
            continue;
        };
        if now == want || !map.is_up(now) || !map.is_up(want) || taken.contains(&want) {
            continue;
        }
        taken.push(want);
        out.push(ShardRepair {
            shard: i,
            target: want,
            sources: sources.clone(),
            from: Some(now),
        });
    }
    if out.is_empty() {
        StripePlan::Healthy
    } else if shares_a_node(loc) {
        StripePlan::Spread(out)
    } else {
        StripePlan::Move(out)
    }
}

/// Whether two stored shards of a stripe are on one node.
pub fn shares_a_node(loc: &[Option<NodeId>]) -> bool {
    let held: Vec<NodeId> = loc.iter().flatten().copied().collect();
    held.iter().enumerate().any(|(i, a)| held[..i].contains(a))
}

/// Where each shard of stripe `rec` is (`None`: not stored, or an empty data shard of
/// a short stripe), by its location hints.
fn holders(layout: &Layout, rec: &StripeRec) -> Vec<Option<NodeId>> {
    let k = usize::from(layout.k);
    let used = shingle_client::ec_policy(layout).data_shards_used(rec.len as usize);
    rec.nodes
        .iter()
        .enumerate()
        .map(|(i, h)| h.filter(|_| !(used..k).contains(&i)))
        .collect()
}

/// Runs the repair scan of one meta node until the process ends.
pub async fn run(node: MetaNode, meta: MetaClient, tcp: PeerClient, cfg: RepairConfig) {
    let mut stats = RepairStats::default();
    let mut maps = meta.maps().subscribe();
    // A first pass soon after start, so `shingle status` knows the state early.
    tokio::time::sleep(Duration::from_secs(1)).await;
    pass(&node, &meta, &tcp, &cfg, &mut stats).await;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval) => {}
            r = maps.changed() => {
                if r.is_err() {
                    return;
                }
                // Let the map settle (nodes marked Out often come in groups).
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        pass(&node, &meta, &tcp, &cfg, &mut stats).await;
    }
}

/// Files are walked this many at a time.
const PAGE: usize = 256;

async fn pass(node: &MetaNode, meta: &MetaClient, tcp: &PeerClient, cfg: &RepairConfig, stats: &mut RepairStats) {
    let v = meta.view();
    let work = count(node, &v).await;
    stats.unreadable = work.unreadable;
    stats.shared = work.shared;
    stats.map_epoch = v.map.epoch.0;
    if work.todo == 0 && work.moves == 0 {
        *stats = RepairStats {
            todo: 0,
            done: 0,
            failed: 0,
            moves_todo: 0,
            moved: 0,
            running: false,
            passes: stats.passes + 1,
            ..stats.clone()
        };
        node.set_repair_stats(stats.clone());
        return;
    }
    info!(
        shards = work.todo,
        moves = work.moves,
        unreadable = work.unreadable,
        shared = work.shared,
        "repair pass starts"
    );
    *stats = RepairStats {
        running: true,
        todo: work.todo,
        done: 0,
        failed: 0,
        moves_todo: work.moves,
        moved: 0,
        bytes_per_sec: 0,
        ..stats.clone()
    };
    node.set_repair_stats(stats.clone());
    let mut p = Pass {
        node,
        meta,
        tcp,
        cfg,
        stats,
        started: Instant::now(),
        epoch: v.map.epoch,
        bytes: 0,
        gate: Arc::new(Semaphore::new(cfg.parallel.max(1))),
        jobs: tokio::task::JoinSet::new(),
    };
    // Two sweeps: first what restores failure tolerance (rebuilds, spreading shards
    // that share a node), then rebalancing moves; a sweep the count found nothing for
    // is skipped (what appeared since is found by the next pass).
    for (restore, found) in [(true, work.todo), (false, work.moves)] {
        if found > 0 && !p.sweep(restore).await {
            return;
        }
    }
    p.finish().await;
}

/// What a pass's count found.
struct Work {
    /// Shards to rebuild or spread.
    todo: u64,
    /// Shards to move (rebalance).
    moves: u64,
    /// Stripes with fewer than k readable shards.
    unreadable: u64,
    /// Stripes with two shards on one node.
    shared: u64,
}

/// Counts the pass's work first (in memory, cheap), so progress has a denominator.
async fn count(node: &MetaNode, v: &shingle_meta::map::MapView) -> Work {
    let mut w = Work {
        todo: 0,
        moves: 0,
        unreadable: 0,
        shared: 0,
    };
    let mut cursor = Ino(0);
    loop {
        let (files, more) = node.primary_files(cursor, PAGE);
        for (ino, layout) in &files {
            for (s, rec) in &layout.stripes {
                w.shared += u64::from(shares_a_node(&holders(layout, rec)));
                match plan_stripe(&v.map, &v.placement, *ino, *s, layout, rec) {
                    StripePlan::Healthy => {}
                    StripePlan::Repair(r) | StripePlan::Spread(r) => w.todo += r.len() as u64,
                    StripePlan::Move(r) => w.moves += r.len() as u64,
                    StripePlan::Unreadable => w.unreadable += 1,
                }
            }
        }
        match files.last() {
            Some((last, _)) if more => cursor = *last,
            _ => break,
        }
        tokio::task::yield_now().await;
    }
    w
}

/// One pass's jobs in flight and its progress.
struct Pass<'a> {
    node: &'a MetaNode,
    meta: &'a MetaClient,
    tcp: &'a PeerClient,
    cfg: &'a RepairConfig,
    stats: &'a mut RepairStats,
    started: Instant,
    /// The map epoch the pass counted under.
    epoch: shingle_meta::ids::Epoch,
    bytes: u64,
    gate: Arc<Semaphore>,
    jobs: tokio::task::JoinSet<JobResult>,
}

impl Pass<'_> {
    /// Walks this node's files and starts a job per shard to rebuild or spread
    /// (`restore`) or to move. Moves and spreads only on a settled map: while it
    /// changes, scans on different nodes could disagree about where a shard belongs.
    /// False when the pass must stop.
    async fn sweep(&mut self, restore: bool) -> bool {
        let mut cursor = Ino(0);
        loop {
            let (files, more) = self.node.primary_files(cursor, PAGE);
            let v = self.meta.view();
            let (meta, epoch) = (self.meta, self.epoch);
            let settled = || meta.view().map.epoch == epoch;
            for (ino, layout) in &files {
                for (s, rec) in &layout.stripes {
                    let (shards, plain_move) = match plan_stripe(&v.map, &v.placement, *ino, *s, layout, rec) {
                        StripePlan::Repair(r) if restore => (r, false),
                        StripePlan::Spread(r) if restore && settled() => (r, false),
                        StripePlan::Move(r) if !restore && settled() => (r, true),
                        _ => continue,
                    };
                    for r in shards {
                        let Ok(permit) = self.gate.clone().acquire_owned().await else {
                            return false;
                        };
                        let (meta, tcp, layout, rec, v) = (
                            self.meta.clone(),
                            self.tcp.clone(),
                            layout.clone(),
                            rec.clone(),
                            v.clone(),
                        );
                        let (ino, s) = (*ino, *s);
                        self.jobs.spawn(async move {
                            let r = repair_one(&meta, &tcp, &v.map, ino, s, &layout, &rec, &r).await;
                            drop(permit);
                            r.map(|bytes| (bytes, plain_move))
                        });
                        self.progress().await;
                    }
                }
            }
            match files.last() {
                Some((last, _)) if more => cursor = *last,
                _ => return true,
            }
        }
    }

    /// Accounts the jobs done so far, publishes the stats, and sleeps to stay under
    /// the configured bandwidth.
    async fn progress(&mut self) {
        while let Some(done) = self.jobs.try_join_next() {
            account(done, self.stats, &mut self.bytes);
        }
        self.stats.bytes_per_sec = self.rate();
        self.node.set_repair_stats(self.stats.clone());
        let ahead = Duration::from_secs_f64(self.bytes as f64 / self.cfg.bytes_per_sec.max(1) as f64)
            .saturating_sub(self.started.elapsed());
        if !ahead.is_zero() {
            tokio::time::sleep(ahead).await;
        }
    }

    fn rate(&self) -> u64 {
        (self.bytes as f64 / self.started.elapsed().as_secs_f64().max(1e-3)) as u64
    }

    /// Waits for the jobs still running and publishes the pass's end.
    async fn finish(mut self) {
        while let Some(done) = self.jobs.join_next().await {
            account(done, self.stats, &mut self.bytes);
        }
        self.stats.running = false;
        self.stats.passes += 1;
        self.stats.bytes_per_sec = self.rate();
        self.node.set_repair_stats(self.stats.clone());
        info!(
            repaired = self.stats.done,
            failed = self.stats.failed,
            mib = self.bytes >> 20,
            secs = self.started.elapsed().as_secs_f64(),
            "repair pass done"
        );
    }
}

/// Outcome of one job: bytes rebuilt, and whether it was a plain move (rebalance)
/// rather than a rebuild or a spread.
type JobResult = Result<(u64, bool), String>;

fn account(done: Result<JobResult, tokio::task::JoinError>, stats: &mut RepairStats, bytes: &mut u64) {
    match done {
        Ok(Ok((b, moved))) => {
            if moved {
                stats.moved += 1;
                stats.moved_total += 1;
            } else {
                stats.done += 1;
                stats.repaired_total += 1;
            }
            stats.bytes_total += b;
            *bytes += b;
        }
        Ok(Err(e)) => {
            stats.failed += 1;
            debug!(error = %e, "shard repair failed; the next pass retries");
        }
        Err(e) => {
            stats.failed += 1;
            warn!(error = %e, "repair task failed");
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn repair_one(
    meta: &MetaClient,
    tcp: &PeerClient,
    map: &ClusterMap,
    ino: Ino,
    s: u64,
    layout: &Layout,
    rec: &StripeRec,
    r: &ShardRepair,
) -> Result<u64, String> {
    let addr = |id: NodeId| map.addr(id).ok_or_else(|| format!("{id} has no address"));
    let req = RepairShardRequest {
        id: Some(ShardId {
            ino: ino.0,
            stripe: s,
            shard: r.shard as u32,
        }),
        version: rec.version,
        k: u32::from(layout.k),
        m: u32::from(layout.m),
        unit: layout.unit,
        stripe_len: rec.len,
        sources: r
            .sources
            .iter()
            .map(|(i, id)| {
                addr(*id).map(|a| ShardSource {
                    addr: a.to_string(),
                    shard: *i as u32,
                })
            })
            .collect::<Result<_, _>>()?,
        if_missing: true,
    };
    let target = addr(r.target)?;
    let reply = tcp
        .call::<RepairShard>(target, &req, CallOptions::timeout(Duration::from_secs(30)))
        .await
        .map_err(|e| format!("ino {} stripe {s} shard {} on {}: {e}", ino.0, r.shard, r.target))?;
    meta.relocate_shards(ino, s, rec.version, vec![(r.shard as u32, r.target.0)])
        .await
        .map_err(|e| format!("record location of ino {} stripe {s}: {e}", ino.0))?;
    if let Some(from) = r.from {
        // The old copy of a moved shard goes only when the layout now names the target
        // (another scan, on a node with a different map during a primary change, may
        // have moved it elsewhere), and only at the version moved (a newer write there
        // is kept). Failing leaves an unreferenced copy, not a loss.
        let now = meta.get_inode(ino).await.ok().and_then(|i| i.layout).and_then(|l| {
            l.stripes
                .get(&s)
                .map(|x| (x.version, x.nodes.get(r.shard).copied().flatten()))
        });
        if now != Some((rec.version, Some(r.target))) {
            debug!(
                ino = ino.0,
                stripe = s,
                shard = r.shard,
                "moved shard's location changed again; old copy kept"
            );
            return Ok(reply.bytes);
        }
        // A node's daemon holds the cluster secret: no capability needed.
        let del = DeleteShardRequest {
            id: req.id,
            version: rec.version,
            cap: Bytes::new(),
        };
        if let Err(e) = tcp
            .call::<DeleteShard>(addr(from)?, &del, CallOptions::timeout(Duration::from_secs(10)))
            .await
        {
            debug!(ino = ino.0, stripe = s, shard = r.shard, node = from.0, error = %e, "old copy of a moved shard not deleted");
        }
    }
    debug!(
        ino = ino.0,
        stripe = s,
        shard = r.shard,
        target = r.target.0,
        bytes = reply.bytes,
        moved = r.from.is_some(),
        "shard repaired"
    );
    Ok(reply.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shingle_meta::map::{MapCommand, NodeInfo, Roles};
    use std::collections::BTreeMap;
    use std::net::SocketAddr;

    /// Shard locations from node ids.
    fn at(ids: &[u64]) -> Vec<Option<NodeId>> {
        ids.iter().map(|id| Some(NodeId(*id))).collect()
    }

    fn cluster(n: u64) -> ClusterMap {
        let mut m = ClusterMap::new("t", 16, 32, 3, 6);
        for i in 1..=n {
            m.apply(&MapCommand::Register(NodeInfo {
                id: NodeId(i),
                addr: SocketAddr::from(([127, 0, 0, 1], 9000 + i as u16)),
                roles: Roles {
                    manager: false,
                    meta: true,
                    data: true,
                },
                domain: format!("h{i}"),
                state: NodeState::Up,
            }))
            .expect("register");
        }
        m
    }

    fn layout() -> Layout {
        Layout {
            k: 4,
            m: 2,
            unit: 4096,
            stripes: BTreeMap::new(),
            next_version: 0,
        }
    }

    fn set(m: &mut ClusterMap, id: u64, state: NodeState) {
        m.apply(&MapCommand::SetState { id: NodeId(id), state }).expect("state");
    }

    #[test]
    fn healthy_down_out_and_missing_shards() {
        let mut m = cluster(8);
        let p = m.placement();
        let (ino, s) = (Ino(77), 3);
        let group: Vec<u64> = p.pg(stripe_pg(ino, s, m.pgs)).iter().map(|n| n.0).collect();
        let full = StripeRec {
            version: 9,
            len: 4 * 4096,
            nodes: at(&group),
        };
        assert_eq!(plan_stripe(&m, &p, ino, s, &layout(), &full), StripePlan::Healthy);

        // Down: waited for, not rebuilt.
        set(&mut m, group[1], NodeState::Down);
        let p = m.placement();
        assert_eq!(plan_stripe(&m, &p, ino, s, &layout(), &full), StripePlan::Healthy);

        // Out: rebuilt on a node outside the stripe, from the shards on Up nodes.
        set(&mut m, group[1], NodeState::Out);
        let p = m.placement();
        let StripePlan::Repair(r) = plan_stripe(&m, &p, ino, s, &layout(), &full) else {
            panic!("expected a repair")
        };
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].shard, 1);
        assert!(!group.contains(&r[0].target.0), "target must not hold a shard already");
        assert_eq!(r[0].sources.len(), 5);
        assert!(r[0].sources.iter().all(|(i, _)| *i != 1));

        // A shard left out by a degraded write (hint 0) is rebuilt too.
        let mut m = cluster(8);
        let p = m.placement();
        let mut degraded = full.clone();
        degraded.nodes[4] = None;
        let StripePlan::Repair(r) = plan_stripe(&m, &p, ino, s, &layout(), &degraded) else {
            panic!("expected a repair")
        };
        assert_eq!((r[0].shard, r[0].target.0), (4, group[4]), "its own group node is free");

        // Three shards gone under 4+2: unreadable, nothing planned.
        set(&mut m, group[0], NodeState::Down);
        set(&mut m, group[2], NodeState::Down);
        let p = m.placement();
        degraded.nodes[5] = None;
        assert_eq!(
            plan_stripe(&m, &p, ino, s, &layout(), &degraded),
            StripePlan::Unreadable
        );
    }

    #[test]
    fn shards_off_their_group_node_move_back_when_it_is_up() {
        let mut m = cluster(8);
        let p = m.placement();
        let (ino, s) = (Ino(91), 2);
        let group: Vec<u64> = p.pg(stripe_pg(ino, s, m.pgs)).iter().map(|n| n.0).collect();
        let spare = (1..=8).find(|i| !group.contains(i)).expect("a spare");
        let mut rec = StripeRec {
            version: 4,
            len: 4 * 4096,
            nodes: at(&group),
        };
        rec.nodes[1] = Some(NodeId(spare));
        let StripePlan::Move(r) = plan_stripe(&m, &p, ino, s, &layout(), &rec) else {
            panic!("expected a move")
        };
        assert_eq!(
            (r[0].shard, r[0].target.0, r[0].from),
            (1, group[1], Some(NodeId(spare)))
        );
        // While the group node is down, the shard stays where it is.
        set(&mut m, group[1], NodeState::Down);
        let p = m.placement();
        assert_eq!(plan_stripe(&m, &p, ino, s, &layout(), &rec), StripePlan::Healthy);
    }

    #[test]
    fn shards_sharing_a_node_spread_when_their_nodes_return() {
        // Six nodes, 4+2: with two down a write put shards 4 and 5 on the nodes of
        // shards 0 and 1.
        let mut m = cluster(6);
        let p = m.placement();
        let (ino, s) = (Ino(12), 7);
        let group: Vec<u64> = p.pg(stripe_pg(ino, s, m.pgs)).iter().map(|n| n.0).collect();
        let mut rec = StripeRec {
            version: 3,
            len: 4 * 4096,
            nodes: at(&group),
        };
        rec.nodes[4] = Some(NodeId(group[0]));
        rec.nodes[5] = Some(NodeId(group[1]));
        assert!(shares_a_node(&holders(&layout(), &rec)));
        assert!(!shares_a_node(&holders(
            &layout(),
            &StripeRec {
                nodes: at(&group),
                ..rec.clone()
            }
        )));
        set(&mut m, group[4], NodeState::Down);
        set(&mut m, group[5], NodeState::Down);
        let p = m.placement();
        assert_eq!(
            plan_stripe(&m, &p, ino, s, &layout(), &rec),
            StripePlan::Healthy,
            "nowhere to go"
        );
        set(&mut m, group[4], NodeState::Up);
        set(&mut m, group[5], NodeState::Up);
        let p = m.placement();
        let StripePlan::Spread(r) = plan_stripe(&m, &p, ino, s, &layout(), &rec) else {
            panic!("expected a spread")
        };
        let moves: Vec<_> = r.iter().map(|x| (x.shard, x.target.0, x.from.map(|f| f.0))).collect();
        assert_eq!(
            moves,
            vec![(4, group[4], Some(group[0])), (5, group[5], Some(group[1]))]
        );
        // A short stripe's empty data shards do not count as sharing.
        let short = StripeRec {
            len: 100,
            nodes: at(&[group[0], group[0], group[0], group[0], group[4], group[5]]),
            ..rec
        };
        assert!(!shares_a_node(&holders(&layout(), &short)));
    }

    #[test]
    fn short_stripes_skip_their_empty_data_shards() {
        let mut m = cluster(7);
        let p = m.placement();
        let (ino, s) = (Ino(5), 0);
        let group: Vec<u64> = p.pg(stripe_pg(ino, s, m.pgs)).iter().map(|n| n.0).collect();
        let short = StripeRec {
            version: 1,
            len: 100,
            nodes: at(&group),
        };
        // Shard 2 is empty (never stored): its node leaving needs no repair (the group
        // changed, so stored shards may move to their new group nodes).
        set(&mut m, group[2], NodeState::Out);
        let p = m.placement();
        let plan = plan_stripe(&m, &p, ino, s, &layout(), &short);
        assert!(matches!(plan, StripePlan::Healthy | StripePlan::Move(_)), "{plan:?}");
        if let StripePlan::Move(mv) = plan {
            assert!(mv.iter().all(|r| r.shard != 2), "an empty shard never moves");
        }
        set(&mut m, group[0], NodeState::Out);
        let p = m.placement();
        let StripePlan::Repair(r) = plan_stripe(&m, &p, ino, s, &layout(), &short) else {
            panic!("expected a repair")
        };
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].sources.len(), 2, "the parity shards 4 and 5");
    }
}
