//! Client side of erasure-coded stripes: encode and write the k+m shards of a stripe
//! to the nodes of its placement group in parallel, and read a stripe back from its
//! data shards, decoding from parity when a shard is missing, unreachable or corrupt.
//!
//! Neither direction waits for the manager to notice a failure. Both consult the
//! client's [`Health`] (phi-accrual suspicion, hedge delays):
//! - a **read** skips shards on suspected or known-missing nodes and reads parity in
//!   their place; a shard not answered within the hedge delay gets a parity read raced
//!   against it, and the first k shards to arrive decode the stripe (the scheduling is
//!   [`shingle_transport::hedge`], shared with metadata reads). Slow requests run to
//!   their end in the background so a hung peer becomes suspected.
//! - a **write** sends shard i to node i of its group, or to a spare node when that one
//!   is suspected or fails. With no spare left (a 6-node cluster writing 4+2 with nodes
//!   down), the shard goes to a live node of the stripe that holds the fewest of its
//!   shards, unless the [`WriteRule`] asks for distinct nodes. The stripe is
//!   acknowledged once its stored shards survive the loss of any `tolerate` more nodes
//!   ([`survives`]: with distinct nodes that is k + `tolerate` shards); the repair
//!   scanner fills gaps and moves shared shards to their own nodes later. Where each
//!   shard went is returned, for the file's layout.
//!
//! Nodes are named by the caller's handle ([`ShardHome`]: the client's is a node id
//! with its address) from the placement down to each shard call and back; only the
//! transport and the health table key by address.
//!
//! Traces: a `stripe.read` / `stripe.write` span (ino, stripe, bytes; degraded, failed
//! shards, hedged reads, fabric; shards stored, spares used) with one `shard.read` /
//! `shard.write` span per shard request (shard, node, parity, hedge, fabric, bytes), the
//! parent of that request's RPC spans. Facts known only at the end are recorded late.

use crate::ec::{EcError, EcPolicy};
use crate::shard::{ShardReadError, read_shard, write_shard};
use crate::wire::ShardId;
use bytes::Bytes;
use shingle_transport::hedge::{self, Attempt};
use shingle_transport::{Health, RemoteRead, RpcChannel};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::field::Empty;
use tracing::{Instrument, Span, info_span};

/// A node that holds shards, as the caller names it: a cluster node id with its
/// address, or a bare address. Stripe reads and writes carry it down to each shard call
/// and back, so the caller learns where each shard went in its own terms; only the
/// transport and the health table see the address.
pub trait ShardHome: Copy + Eq + std::fmt::Display + Send + Sync + 'static {
    /// Where the node's chunk service listens.
    fn addr(&self) -> SocketAddr;
}

impl ShardHome for SocketAddr {
    fn addr(&self) -> SocketAddr {
        *self
    }
}

/// Which fabric remote reads of a peer use now (`"rdma"` or `"tcp"`), for traces.
pub trait Fabric {
    /// The fabric of `peer`.
    fn fabric(&self, peer: SocketAddr) -> &'static str;
}

impl Fabric for shingle_transport::PeerClient {
    fn fabric(&self, peer: SocketAddr) -> &'static str {
        shingle_transport::PeerClient::fabric(self, peer)
    }
}

/// The fabric of a stripe read from the fabrics of its shard reads.
fn combine(a: Option<&'static str>, b: &'static str) -> &'static str {
    match a {
        None => b,
        Some(a) if a == b => a,
        Some(_) => "mixed",
    }
}

/// Why a stripe operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StripeError {
    /// The placement group does not have one node per shard.
    #[error("stripe needs {need} nodes, placement group has {have}")]
    WrongGroupSize {
        /// k + m.
        need: usize,
        /// Nodes given.
        have: usize,
    },
    /// Erasure coding failed (for example fewer than k shards readable).
    #[error(transparent)]
    Ec(#[from] EcError),
    /// Fewer than k shards could be read.
    #[error("stripe {stripe} of inode {ino} unreadable: {source}; shard failures: {failed}")]
    Unreadable {
        /// Inode.
        ino: u64,
        /// Stripe.
        stripe: u64,
        /// What failed, per shard.
        failed: String,
        /// The decoder's verdict.
        source: EcError,
    },
    /// Some shards could not be written; the stripe is not durable as a whole.
    #[error("stripe {stripe} of inode {ino}: {failed} of {total} shard writes failed (first: {first})")]
    WriteFailed {
        /// Inode.
        ino: u64,
        /// Stripe.
        stripe: u64,
        /// Failed shard writes.
        failed: usize,
        /// All shard writes.
        total: usize,
        /// The first error.
        first: String,
    },
}

/// Outcome of a stripe read.
#[derive(Debug)]
pub struct StripeRead {
    /// The stripe's data bytes.
    pub data: Bytes,
    /// Shards that failed (index and reason); non-empty means the read was degraded.
    pub failed: Vec<(usize, String)>,
    /// Shards read from a parity race after the hedge delay.
    pub hedged: usize,
    /// Parity was part of the decode (a data shard failed, was missing or slow).
    pub degraded: bool,
    /// The fabric of the shard reads: `"rdma"`, `"tcp"`, or `"mixed"` (`None`: nothing
    /// was fetched).
    pub fabric: Option<&'static str>,
}

/// How long a write waits for a slow shard once the stripe is durable without it.
pub const WRITE_GIVE_UP: Duration = Duration::from_secs(1);

/// When a stripe write is acknowledged, and where its shards may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteRule {
    /// Node losses the acknowledged stripe must survive: after losing the `tolerate`
    /// nodes that hold the most of its shards, k shards are left.
    pub tolerate: usize,
    /// A shard with no node of its own (its node failed, no spare is left) may go to a
    /// node that already holds a shard of the stripe. Without it such a shard is left
    /// out, and the write fails when too few distinct nodes are left.
    pub share_nodes: bool,
}

impl WriteRule {
    /// The default rule for `policy`: survive one more node loss (none without parity),
    /// sharing nodes unless `distinct` asks for one node per shard.
    pub fn for_policy(policy: EcPolicy, distinct: bool) -> WriteRule {
        WriteRule {
            tolerate: usize::from(policy.m.min(1)),
            share_nodes: !distinct,
        }
    }
}

/// Whether a stripe of `k` data shards survives the loss of any `tolerate` nodes:
/// `held` names the node of each stored shard (`None`: not stored), `safe` counts shards
/// no node needs to keep (the empty data shards of a short stripe). The `tolerate`
/// nodes holding the most shards are taken away; at least `k` shards must remain.
pub fn survives<N: PartialEq>(held: &[Option<N>], safe: usize, k: usize, tolerate: usize) -> bool {
    let mut per_node: Vec<(&N, usize)> = Vec::new();
    for n in held.iter().flatten() {
        match per_node.iter_mut().find(|(m, _)| *m == n) {
            Some((_, c)) => *c += 1,
            None => per_node.push((n, 1)),
        }
    }
    let stored: usize = per_node.iter().map(|(_, c)| c).sum();
    let mut counts: Vec<usize> = per_node.into_iter().map(|(_, c)| c).collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let lost: usize = counts.iter().take(tolerate).sum();
    stored - lost + safe >= k
}

/// True when the peer answered (an error reply shows it is alive).
fn answered(r: &Result<Bytes, ShardReadError>) -> bool {
    match r {
        Ok(_) | Err(ShardReadError::Checksum(_)) => true,
        Err(ShardReadError::Transport(e)) => e.status().is_some(),
    }
}

/// The stripe version a write stores, and the shard capability that lets a caller
/// with a client key store it (empty for one holding the cluster secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeAt {
    /// The file.
    pub ino: u64,
    /// Stripe index.
    pub stripe: u64,
    /// The version stored.
    pub version: u64,
    /// `shingle_transport::cap` capability for the file, as it travels.
    pub cap: Bytes,
}

impl StripeAt {
    /// Version `version` of stripe `stripe` of file `ino`, with no capability.
    pub fn new(ino: u64, stripe: u64, version: u64) -> Self {
        StripeAt {
            ino,
            stripe,
            version,
            cap: Bytes::new(),
        }
    }

    /// The same, with capability `cap`.
    pub fn with_cap(mut self, cap: Bytes) -> Self {
        self.cap = cap;
        self
    }
}

/// Encodes `data` (at most one stripe) and writes shard i to `targets[i]`, all in
/// parallel, moving a shard to the next of `spares` when its node is suspected or its
/// write fails, and when none is left to the live node of the stripe holding the
/// fewest of its shards (if `rule` allows). Returns where each shard is durable
/// (`None`: not stored; empty data shards of a short stripe are not stored either and
/// report their target), once the stored shards survive `rule.tolerate` node losses.
/// Shards whose node is in `down` (the map says so) are placed like those of suspected
/// nodes: elsewhere first, on their own node only when nothing else takes them.
#[allow(clippy::too_many_arguments)]
pub async fn write_stripe<C, N: ShardHome>(
    client: &C,
    health: &Arc<Health>,
    policy: EcPolicy,
    targets: &[N],
    spares: &[N],
    down: &[N],
    rule: WriteRule,
    at: StripeAt,
    data: Bytes,
) -> Result<Vec<Option<N>>, StripeError>
where
    C: RpcChannel + Clone + Send + Sync + 'static,
{
    let span = info_span!(
        "stripe.write",
        ino = at.ino,
        stripe = at.stripe,
        bytes = data.len(),
        k = policy.k,
        m = policy.m,
        stored = Empty,
        spares = Empty,
        shared = Empty,
        degraded = Empty,
        otel.status_code = Empty,
    );
    write_stripe_inner(client, health, policy, targets, spares, down, rule, at, data)
        .instrument(span)
        .await
}

#[allow(clippy::too_many_arguments)]
async fn write_stripe_inner<C, N: ShardHome>(
    client: &C,
    health: &Arc<Health>,
    policy: EcPolicy,
    targets: &[N],
    spares: &[N],
    down: &[N],
    rule: WriteRule,
    at: StripeAt,
    data: Bytes,
) -> Result<Vec<Option<N>>, StripeError>
where
    C: RpcChannel + Clone + Send + Sync + 'static,
{
    let n = policy.shard_count();
    if targets.len() != n {
        return Err(StripeError::WrongGroupSize {
            need: n,
            have: targets.len(),
        });
    }
    let shards = policy.encode_stripe_bytes(data)?;
    let suspected = |a: N| health.suspected(a.addr());
    let (tx, rx) = mpsc::unbounded_channel();
    let k = usize::from(policy.k);
    let mut flight = Flight {
        sender: ShardSender {
            client: client.clone(),
            health: health.clone(),
            tx,
            at,
            k,
        },
        placer: Placer::new(targets, spares, down, rule.share_nodes, &suspected),
        placed: vec![None; n],
        shards,
        pending: 0,
        safe: 0,
        errors: Vec::new(),
    };
    let addrs: Vec<SocketAddr> = targets.iter().map(ShardHome::addr).collect();
    flight.start(targets, down, &health.suspects(&addrs));
    flight.gather(rx, rule.tolerate).await;
    flight.outcome(rule.tolerate)
}

/// One stripe's shard writes in flight: where each shard is stored once it is, how
/// many writes are still out, and every failure.
struct Flight<'a, C, N> {
    sender: ShardSender<C, N>,
    placer: Placer<'a, N>,
    shards: Vec<Bytes>,
    placed: Vec<Option<N>>,
    pending: usize,
    /// Empty data shards of a short stripe: not stored, readers know they are empty.
    safe: usize,
    errors: Vec<String>,
}

impl<C, N: ShardHome> Flight<'_, C, N>
where
    C: RpcChannel + Clone + Send + Sync + 'static,
{
    fn send(&mut self, i: usize, node: N, how: &'static str) {
        self.sender.send(i, node, self.shards[i].clone(), how);
        self.placer.add(node, 1);
        self.pending += 1;
    }

    /// Sends every shard: those with a healthy node of their own first, so the others
    /// can share them.
    fn start(&mut self, targets: &[N], down: &[N], suspects: &[bool]) {
        let k = self.sender.k;
        let mut orphans = Vec::new();
        for (i, &target) in targets.iter().enumerate() {
            if i < k && self.shards[i].is_empty() {
                self.placed[i] = Some(target);
                self.safe += 1;
            } else if suspects[i] || down.contains(&target) {
                orphans.push(i);
            } else {
                self.send(i, target, "own");
            }
        }
        for i in orphans {
            // A node the map says is down: a spare, else a live node of the stripe. One
            // that is only suspected (slow, or a request failed): a spare, else its own
            // node — suspicion may be wrong, and piling the shards of several suspected
            // nodes onto the few others could leave a stripe that would not survive one
            // more loss (seen on a loaded machine: six shards on two nodes, the write
            // failed).
            let (node, how) = match self.placer.fallback(down.contains(&targets[i])) {
                Some(f) => {
                    self.placer.bad.push(targets[i]);
                    f
                }
                None => (targets[i], "own"),
            };
            self.send(i, node, how);
        }
    }

    /// The stored shards' nodes, an empty data shard's as none.
    fn held(&self) -> Vec<Option<N>> {
        let k = self.sender.k;
        self.placed
            .iter()
            .enumerate()
            .map(|(i, p)| p.filter(|_| !(i < k && self.shards[i].is_empty())))
            .collect()
    }

    fn survives(&self, tolerate: usize) -> bool {
        survives(&self.held(), self.safe, self.sender.k, tolerate)
    }

    /// Takes the answers, sending a failed shard elsewhere, until every write answered
    /// or, once the stored shards survive `tolerate` losses, [`WRITE_GIVE_UP`] passed.
    async fn gather(&mut self, mut rx: mpsc::UnboundedReceiver<(usize, N, Result<(), String>)>, tolerate: usize) {
        let mut give_up: Option<tokio::time::Instant> = None;
        while self.pending > 0 {
            let next = match give_up {
                Some(t) => match tokio::time::timeout_at(t, rx.recv()).await {
                    Ok(x) => x,
                    Err(_) => break,
                },
                None => rx.recv().await,
            };
            let Some((i, node, r)) = next else { break };
            self.pending -= 1;
            match r {
                Ok(()) => self.placed[i] = Some(node),
                Err(e) => {
                    let at = &self.sender.at;
                    tracing::debug!(ino = at.ino, stripe = at.stripe, shard = i, %node, error = %e, "shard write failed");
                    self.errors.push(format!("shard {i} on {node}: {e}"));
                    self.placer.failed(node);
                    if let Some((other, how)) = self.placer.fallback(true) {
                        self.send(i, other, how);
                    }
                }
            }
            if give_up.is_none() && self.survives(tolerate) {
                give_up = Some(tokio::time::Instant::now() + WRITE_GIVE_UP);
            }
        }
    }

    /// Records the stripe's placement on the span: the placement, or why it is not safe.
    fn outcome(self, tolerate: usize) -> Result<Vec<Option<N>>, StripeError> {
        let (n, stored) = (self.placed.len(), self.placed.iter().flatten().count());
        let span = Span::current();
        span.record("stored", stored);
        span.record("spares", self.placer.spares_used);
        span.record("shared", self.placer.shared);
        span.record("degraded", stored < n || self.placer.shared > 0);
        if !self.survives(tolerate) {
            span.record("otel.status_code", "error");
            return Err(StripeError::WriteFailed {
                ino: self.sender.at.ino,
                stripe: self.sender.at.stripe,
                failed: n - stored,
                total: n,
                first: self
                    .errors
                    .first()
                    .cloned()
                    .unwrap_or_else(|| format!("the shards stored would not survive {tolerate} more node loss(es)")),
            });
        }
        Ok(self.placed)
    }
}

/// What one stripe write knows of where its shards may go, as answers come in: the
/// shards sent to each node and not failed there (every target, then each spare used,
/// in that order), the nodes that failed one, and the spares left. Pure: the health
/// it consults is a function.
struct Placer<'a, N> {
    spares: std::collections::VecDeque<N>,
    load: Vec<(N, usize)>,
    bad: Vec<N>,
    down: &'a [N],
    share_nodes: bool,
    suspected: &'a (dyn Fn(N) -> bool + Sync),
    spares_used: usize,
    shared: usize,
}

impl<'a, N: ShardHome> Placer<'a, N> {
    fn new(
        targets: &[N],
        spares: &[N],
        down: &'a [N],
        share_nodes: bool,
        suspected: &'a (dyn Fn(N) -> bool + Sync),
    ) -> Self {
        let spares = spares
            .iter()
            .copied()
            .filter(|a| !targets.contains(a) && !down.contains(a) && !suspected(*a))
            .collect();
        let mut load: Vec<(N, usize)> = Vec::new();
        for t in targets {
            if !load.iter().any(|(a, _)| a == t) {
                load.push((*t, 0));
            }
        }
        Placer {
            spares,
            load,
            bad: Vec::new(),
            down,
            share_nodes,
            suspected,
            spares_used: 0,
            shared: 0,
        }
    }

    /// A node for a shard that lost its own: the next spare, else (if the rule allows
    /// and `share`) the live node of this stripe with the fewest of its shards.
    fn fallback(&mut self, share: bool) -> Option<(N, &'static str)> {
        if let Some(a) = self.spares.pop_front() {
            self.spares_used += 1;
            return Some((a, "spare"));
        }
        if !self.share_nodes || !share {
            return None;
        }
        let (a, _) = self
            .load
            .iter()
            .filter(|(a, _)| !self.bad.contains(a) && !self.down.contains(a) && !(self.suspected)(*a))
            .min_by_key(|(_, c)| *c)?;
        self.shared += 1;
        Some((*a, "shared"))
    }

    /// `node` was sent `d` more shards (or holds `-d` fewer).
    fn add(&mut self, node: N, d: isize) {
        match self.load.iter_mut().find(|(a, _)| *a == node) {
            Some((_, c)) => *c = c.saturating_add_signed(d),
            None => self.load.push((node, d.max(0) as usize)),
        }
    }

    /// A shard write to `node` failed: it holds one fewer, and gets no more.
    fn failed(&mut self, node: N) {
        self.add(node, -1);
        if !self.bad.contains(&node) {
            self.bad.push(node);
        }
    }
}

/// Sends the shards of one stripe version, each in a task of its own, and reports
/// each outcome (shard index, node, result) on `tx`.
struct ShardSender<C, N> {
    client: C,
    health: Arc<Health>,
    tx: mpsc::UnboundedSender<(usize, N, Result<(), String>)>,
    at: StripeAt,
    k: usize,
}

impl<C, N: ShardHome> ShardSender<C, N>
where
    C: RpcChannel + Clone + Send + Sync + 'static,
{
    fn send(&self, i: usize, node: N, shard: Bytes, how: &'static str) {
        let (c, h, tx, cap) = (
            self.client.clone(),
            self.health.clone(),
            self.tx.clone(),
            self.at.cap.clone(),
        );
        let id = ShardId {
            ino: self.at.ino,
            stripe: self.at.stripe,
            shard: i as u32,
        };
        let version = self.at.version;
        let span = info_span!("shard.write", shard = i, %node, bytes = shard.len(), parity = i >= self.k, placed = how, otel.status_code = Empty);
        tokio::spawn(
            async move {
                let ticket = h.start(node.addr());
                let r = write_shard(&c, node.addr(), id, version, shard, cap).await;
                ticket.finish(r.as_ref().map_or_else(|e| e.status().is_some(), |_| true));
                if r.is_err() {
                    Span::current().record("otel.status_code", "error");
                }
                let _ = tx.send((i, node, r.map(|_| ()).map_err(|e| e.to_string())));
            }
            .instrument(span),
        );
    }
}

/// Reads a stripe of `stripe_len` data bytes. `nodes[i]` holds shard i (`None`: known
/// missing). Data shards are read in parallel, parity in place of shards on suspected
/// or missing nodes, in place of failures, and raced against shards still unanswered
/// after the hedge delay.
#[allow(clippy::too_many_arguments)]
pub async fn read_stripe<C, N: ShardHome>(
    client: &C,
    health: &Arc<Health>,
    policy: EcPolicy,
    nodes: &[Option<N>],
    at: StripeAt,
    stripe_len: usize,
) -> Result<StripeRead, StripeError>
where
    C: RpcChannel + RemoteRead + Fabric + Clone + Send + Sync + 'static,
{
    let span = info_span!(
        "stripe.read",
        ino = at.ino,
        stripe = at.stripe,
        bytes = stripe_len,
        k = policy.k,
        m = policy.m,
        degraded = Empty,
        failed = Empty,
        hedged = Empty,
        fabric = Empty,
        otel.status_code = Empty,
    );
    read_stripe_inner(client, health, policy, nodes, at, stripe_len)
        .instrument(span)
        .await
}

async fn read_stripe_inner<C, N: ShardHome>(
    client: &C,
    health: &Arc<Health>,
    policy: EcPolicy,
    nodes: &[Option<N>],
    at: StripeAt,
    stripe_len: usize,
) -> Result<StripeRead, StripeError>
where
    C: RpcChannel + RemoteRead + Fabric + Clone + Send + Sync + 'static,
{
    let StripeAt {
        ino,
        stripe,
        version,
        cap,
    } = at;
    let (k, n) = (usize::from(policy.k), policy.shard_count());
    if nodes.len() != n {
        return Err(StripeError::WrongGroupSize {
            need: n,
            have: nodes.len(),
        });
    }
    let mut shards: Vec<Option<Bytes>> = vec![None; n];
    let mut failed = Vec::new();
    // A short stripe leaves its last data shards empty: nothing to fetch for them.
    let used = policy.data_shards_used(stripe_len);
    for s in shards.iter_mut().take(k).skip(used) {
        *s = Some(Bytes::new());
    }
    let (order, missing) = read_order(nodes, &suspects(health, nodes), used, k);
    failed.extend(missing);
    // The data shards the stripe uses are wanted (k of them, counting the empty ones).
    let race = hedge::race(
        order,
        used,
        |(_, node)| health.hedge_delay(node.addr()),
        |(i, node), hedging| {
            let id = ShardId {
                ino,
                stripe,
                shard: i as u32,
            };
            read_one(
                client.clone(),
                health.clone(),
                node,
                id,
                version,
                cap.clone(),
                i >= k,
                hedging,
            )
        },
    )
    .await;
    let mut fabric: Option<&'static str> = None;
    for ((i, _), (b, f)) in race.ok {
        shards[i] = Some(b);
        fabric = Some(combine(fabric, f));
    }
    failed.extend(race.failed.into_iter().map(|((i, _), e)| (i, e)));
    finish_read(
        &policy,
        (ino, stripe),
        stripe_len,
        &shards,
        failed,
        race.hedged as usize,
        fabric,
    )
}

/// Decodes a stripe from the shards read (parity among them when data shards failed)
/// and records on the span how degraded the read was.
fn finish_read(
    policy: &EcPolicy,
    (ino, stripe): (u64, u64),
    stripe_len: usize,
    shards: &[Option<Bytes>],
    failed: Vec<(usize, String)>,
    hedged: usize,
    fabric: Option<&'static str>,
) -> Result<StripeRead, StripeError> {
    let k = usize::from(policy.k);
    let span = Span::current();
    // Degraded: parity is part of the decode (a data shard failed, was missing, was on
    // a suspected node, or lost a hedge race).
    let degraded = shards[k..].iter().any(Option::is_some);
    span.record("degraded", degraded);
    span.record("failed", failed.len());
    span.record("hedged", hedged);
    if let Some(f) = fabric {
        span.record("fabric", f);
    }
    let data = policy
        .decode_stripe(stripe_len, shards)
        .map_err(|source| StripeError::Unreadable {
            ino,
            stripe,
            failed: failed
                .iter()
                .map(|(i, e)| format!("{i}: {e}"))
                .collect::<Vec<_>>()
                .join("; "),
            source,
        })
        .inspect_err(|_| {
            span.record("otel.status_code", "error");
        })?;
    Ok(StripeRead {
        data,
        failed,
        hedged,
        degraded,
        fabric,
    })
}

/// Whether each shard's node is suspected (a shard no node holds is not).
fn suspects<N: ShardHome>(health: &Health, nodes: &[Option<N>]) -> Vec<bool> {
    let addrs: Vec<SocketAddr> = nodes.iter().flatten().map(ShardHome::addr).collect();
    let mut known = health.suspects(&addrs).into_iter();
    nodes
        .iter()
        .map(|n| n.is_some() && known.next().unwrap_or(false))
        .collect()
}

/// A shard index and the node asked for it.
type ShardAt<N> = (usize, N);
/// A shard index and why it could not be had.
type ShardFailure = (usize, String);

/// The shards a stripe read asks for, best first — healthy data shards, healthy
/// parity, then those on suspected nodes — and the shards no node holds. Only the
/// first `used` data shards are read (a short stripe leaves the rest empty).
fn read_order<N: Copy>(
    nodes: &[Option<N>],
    suspects: &[bool],
    used: usize,
    k: usize,
) -> (Vec<ShardAt<N>>, Vec<ShardFailure>) {
    let mut order = Vec::new();
    let mut missing = Vec::new();
    for pass in 0..2 {
        for i in (0..used).chain(k..nodes.len()) {
            match nodes[i] {
                None if pass == 0 => missing.push((i, "no node holds this shard".to_string())),
                Some(node) if suspects[i] == (pass == 1) => order.push((i, node)),
                _ => {}
            }
        }
    }
    (order, missing)
}

/// One shard read of a stripe read's race, in a span of its own: the bytes and the
/// fabric they came over, or the error (the race then asks another shard).
/// The span is made when the read is asked for, under the stripe read's span (the race
/// may poll it elsewhere).
#[allow(clippy::too_many_arguments)]
fn read_one<C, N: ShardHome>(
    c: C,
    h: Arc<Health>,
    node: N,
    id: ShardId,
    version: u64,
    cap: Bytes,
    parity: bool,
    hedging: bool,
) -> impl std::future::Future<Output = Attempt<(Bytes, &'static str), String>> + Send + 'static
where
    C: RpcChannel + RemoteRead + Fabric + Clone + Send + Sync + 'static,
{
    let span = info_span!(
        "shard.read",
        shard = id.shard,
        %node,
        parity,
        hedge = hedging,
        bytes = Empty,
        fabric = Empty,
        otel.status_code = Empty,
    );
    async move {
        let ticket = h.start(node.addr());
        let r = read_shard(&c, node.addr(), id, version, &cap).await;
        ticket.finish(answered(&r));
        // After the read: a failed RDMA read was redone over TCP, and says so.
        let fabric = c.fabric(node.addr());
        let span = Span::current();
        span.record("fabric", fabric);
        match r {
            Ok(b) => {
                span.record("bytes", b.len());
                Attempt::Ok((b, fabric))
            }
            Err(e) => {
                span.record("otel.status_code", "error");
                Attempt::Retry(e.to_string())
            }
        }
    }
    .instrument(span)
}

#[cfg(test)]
mod tests {
    use super::{Placer, StripeAt, read_order, survives};
    use proptest::prelude::*;

    #[test]
    fn reads_ask_healthy_data_then_parity_then_suspects() {
        let a = |p: u16| Some(std::net::SocketAddr::from(([127, 0, 0, 1], p)));
        // 4+2, a short stripe using 3 data shards; shard 1 on a suspect, parity 5 lost.
        let nodes = [a(10), a(11), a(12), a(13), a(14), None];
        let suspects = [false, true, false, false, false, false];
        let (order, missing) = read_order(&nodes, &suspects, 3, 4);
        let shards: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
        assert_eq!(shards, [0, 2, 4, 1], "data 3 is empty, so never read");
        assert_eq!(missing.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [5]);
    }

    #[test]
    fn a_lost_shard_goes_to_a_spare_then_to_the_least_loaded_live_node() {
        let a = |p: u16| std::net::SocketAddr::from(([127, 0, 0, 1], p));
        let targets = [a(1), a(2), a(3), a(4)];
        let (down, spares) = ([a(4)], [a(2), a(5), a(6), a(7)]);
        // 7 is suspected: never a spare, never shared to.
        let suspected = |n: std::net::SocketAddr| n == a(7);
        let mut p = Placer::new(&targets, &spares, &down, true, &suspected);
        for (t, d) in [(a(1), 2), (a(2), 1), (a(3), 1)] {
            p.add(t, d);
        }
        assert_eq!(p.fallback(false), Some((a(5), "spare")), "a target is no spare");
        assert_eq!(p.fallback(false), Some((a(6), "spare")));
        assert_eq!(p.fallback(false), None, "only a down node's shard may share");
        p.failed(a(2));
        assert_eq!(
            p.fallback(true),
            Some((a(3), "shared")),
            "least loaded, not failed, not down"
        );
        p.add(a(3), 2);
        assert_eq!(p.fallback(true), Some((a(1), "shared")));
        assert_eq!((p.spares_used, p.shared), (2, 2));
        let mut strict = Placer::new(&targets, &[], &down, false, &suspected);
        assert_eq!(strict.fallback(true), None, "the rule forbids sharing");
    }

    /// A data node that stores every shard it is sent (an empty reply is a default
    /// `WriteShardResponse`).
    #[derive(Clone)]
    struct AcceptAll;

    impl shingle_transport::RpcChannel for AcceptAll {
        async fn call_raw(
            &self,
            _peer: std::net::SocketAddr,
            _kind: shingle_transport::MsgKind,
            _payload: bytes::Bytes,
            _opts: shingle_transport::CallOptions,
        ) -> Result<bytes::Bytes, shingle_transport::TransportError> {
            Ok(bytes::Bytes::new())
        }
    }

    fn node(i: u16) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + i))
    }

    #[tokio::test]
    async fn shards_of_suspected_nodes_stay_home_and_those_of_down_nodes_share() {
        use super::{WriteRule, write_stripe};
        let policy = crate::ec::EcPolicy::new(4, 2, 4096).expect("policy");
        let targets: Vec<_> = (0..6).map(node).collect();
        let rule = WriteRule {
            tolerate: 1,
            share_nodes: true,
        };
        let data = bytes::Bytes::from(vec![7u8; 4 * 4096]);
        let store =
            |health: std::sync::Arc<shingle_transport::health::Health>, down: Vec<std::net::SocketAddr>, stripe| {
                let (targets, data) = (targets.clone(), data.clone());
                async move {
                    write_stripe(
                        &AcceptAll,
                        &health,
                        policy,
                        &targets,
                        &[],
                        &down,
                        rule,
                        StripeAt::new(1, stripe, 1),
                        data,
                    )
                    .await
                    .expect("stored")
                }
            };
        // Four of six nodes suspected (a loaded machine answering slowly), none down, no
        // spare: moving their shards to the other two would put three on each, which
        // one more loss would leave with three of four needed. They stay home.
        let health = std::sync::Arc::new(shingle_transport::health::Health::default());
        for i in 0..4 {
            health.start(node(i)).finish(false);
        }
        assert!(health.suspected(node(0)));
        let placed = store(health, Vec::new(), 0).await;
        assert_eq!(placed, targets.iter().copied().map(Some).collect::<Vec<_>>());
        // A node the map says is down: its shard goes to the least loaded live node.
        let placed = store(std::sync::Arc::default(), vec![node(5)], 1).await;
        assert_ne!(placed[5], Some(node(5)));
        assert!(placed[5].is_some_and(|a| targets[..5].contains(&a)));
        let held: Vec<_> = placed.iter().map(|p| p.map(|a| a.port())).collect();
        assert!(survives(&held, 0, 4, 1));
    }

    /// A caller's node handle: an id the transport never sees, beside the address.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Named(u64, std::net::SocketAddr);

    impl std::fmt::Display for Named {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "node {} at {}", self.0, self.1)
        }
    }

    impl super::ShardHome for Named {
        fn addr(&self) -> std::net::SocketAddr {
            self.1
        }
    }

    #[tokio::test]
    async fn a_write_answers_in_the_callers_node_handles() {
        use super::{WriteRule, write_stripe};
        let policy = crate::ec::EcPolicy::new(4, 2, 4096).expect("policy");
        let home = |i: u16| Named(100 + u64::from(i), node(i));
        let targets: Vec<Named> = (0..6).map(home).collect();
        let rule = WriteRule {
            tolerate: 1,
            share_nodes: false,
        };
        // Node 2 is down: its shard goes to the spare, and the answer names the spare.
        let placed = write_stripe(
            &AcceptAll,
            &std::sync::Arc::default(),
            policy,
            &targets,
            &[home(9)],
            &[home(2)],
            rule,
            StripeAt::new(1, 0, 1),
            bytes::Bytes::from(vec![1u8; 4 * 4096]),
        )
        .await
        .expect("stored");
        let ids: Vec<Option<u64>> = placed.iter().map(|h| h.map(|h| h.0)).collect();
        assert_eq!(ids, [Some(100), Some(101), Some(109), Some(103), Some(104), Some(105)]);
    }

    #[test]
    fn a_shard_no_node_holds_takes_no_other_shards_suspicion() {
        let health = std::sync::Arc::new(shingle_transport::health::Health::default());
        health.start(node(2)).finish(false);
        let nodes = [None, Some(node(1)), Some(node(2)), None, Some(node(4))];
        assert_eq!(super::suspects(&health, &nodes), [false, false, true, false, false]);
    }

    #[test]
    fn distinct_nodes_need_k_plus_tolerate_shards() {
        let held = |n: usize| (0..6).map(|i| (i < n).then_some(i)).collect::<Vec<_>>();
        assert!(survives(&held(6), 0, 4, 2));
        assert!(!survives(&held(5), 0, 4, 2));
        assert!(survives(&held(5), 0, 4, 1));
        assert!(!survives(&held(4), 0, 4, 1));
        assert!(survives(&held(4), 0, 4, 0));
        // Empty data shards of a short stripe count without a node.
        assert!(survives(&held(3), 2, 4, 1));
    }

    #[test]
    fn shared_nodes_count_as_one_loss() {
        // 4+2 on four live nodes: two hold two shards each; losing either leaves four.
        let four = [Some('a'), Some('b'), Some('c'), Some('d'), Some('a'), Some('b')];
        assert!(survives(&four, 0, 4, 1));
        assert!(!survives(&four, 0, 4, 2));
        // On three nodes, two each: one loss leaves four.
        let three = [Some('a'), Some('b'), Some('c'), Some('a'), Some('b'), Some('c')];
        assert!(survives(&three, 0, 4, 1));
        // Three on one node: its loss leaves three.
        let piled = [Some('a'), Some('b'), Some('c'), Some('a'), Some('a'), None];
        assert!(!survives(&piled, 0, 4, 1));
    }

    proptest! {
        /// Against the definition: every set of `tolerate` nodes lost leaves k shards.
        #[test]
        fn matches_removing_every_set_of_nodes(
            held in proptest::collection::vec(proptest::option::of(0u8..5), 1..9),
            safe in 0usize..3,
            k in 1usize..6,
            tolerate in 0usize..3,
        ) {
            let nodes: Vec<u8> = (0..5).collect();
            let mut all = true;
            for mask in 0u32..(1 << nodes.len()) {
                if mask.count_ones() as usize != tolerate {
                    continue;
                }
                let left = held
                    .iter()
                    .flatten()
                    .filter(|n| mask & (1 << **n) == 0)
                    .count();
                all &= left + safe >= k;
            }
            prop_assert_eq!(survives(&held, safe, k, tolerate), all);
        }
    }
}
