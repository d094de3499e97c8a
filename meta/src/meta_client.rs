//! The namespace client: routes every operation by the map, retries through failures.
//!
//! Reads (lookup, getattr, readlink, xattrs) go to one member of the partition, rotating
//! over members to spread load and avoiding suspected ones (phi-accrual, see
//! [`shingle_transport::health`]); a member that fails, or is still catching up, is
//! skipped for the next, and one that does not answer within its hedge delay has the
//! next raced against it ([`shingle_transport::hedge`], as stripe reads) — no read
//! waits for the manager to declare a node down. Readdir asks every partition's members
//! in parallel, one request per node, and merges pages by name (a stable cursor).
//! Mutations go to the primary of their anchor partition, which coordinates them;
//! "stale map" answers trigger a map refresh. Everything is retried until `timeout`, then fails with the last errno
//! (EIO when no server answered). A mutation keeps one id over its retries (a create
//! its token), so a retry of one whose answer was lost is answered as done, not run
//! twice.
//!
//! Traces: reads run in an `ns.read` span, mutations in `ns.op`, listings in
//! `ns.readdir` (op, partition, ino; the node that answered, retries, hedged requests),
//! the parents of their RPCs' spans.

use crate::agent::MapWatch;
use crate::ids::{Ino, NodeId, PartitionId};
use crate::map::MapView;
use crate::namespace::{
    Attr, Creds, DirEntry, Errno, FileKind, InodeRec, Layout, Purge, SetAttr, StripeRec, StripeWrite, TimeNs,
};
use crate::pause::Pause;
use crate::service::wire::*;
use futures_util::future::join_all;
use parking_lot::RwLock;
use shingle_transport::hedge::{self, Attempt};
use shingle_transport::{Health, PeerClient};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing::field::Empty;
use tracing::{Instrument, Span, debug, info_span};

/// Stripe records read from a file, and its attributes when every record came from
/// one version of it.
pub type StripesRead = (Vec<(u64, StripeRec)>, Option<Attr>);

/// A namespace client. Clones share connections and the map.
#[derive(Clone)]
pub struct MetaClient {
    client: PeerClient,
    maps: MapWatch,
    view: Arc<RwLock<Arc<MapView>>>,
    rr: Arc<AtomicU64>,
    inflight: Arc<parking_lot::Mutex<std::collections::HashMap<NodeId, u32>>>,
    health: Arc<Health>,
    timeout: Duration,
    rpc_timeout: Duration,
    caps: Arc<parking_lot::Mutex<std::collections::HashMap<u64, Vec<u8>>>>,
    /// Directories this client's mutations changed, until when their attributes are
    /// read settled ([`ReadOp::GetAttrSettled`], `SETTLE_WINDOW`).
    settling: Arc<parking_lot::Mutex<std::collections::HashMap<Ino, Instant>>>,
}

/// Directories a [`MetaClient`] remembers as settling (beyond that, the oldest go:
/// their reads are then plain, as another client's would be).
const MAX_SETTLING: usize = 4096;

/// Shard capabilities a [`MetaClient`] keeps until they are taken.
const MAX_KEPT_CAPS: usize = 4096;

impl MetaClient {
    /// A client over `client`, routing by the maps `maps` delivers.
    pub fn new(client: PeerClient, maps: MapWatch) -> Self {
        let view = Arc::new(RwLock::new(Arc::new(MapView::new((*maps.current()).clone()))));
        MetaClient {
            client,
            maps,
            view,
            rr: Arc::new(AtomicU64::new(0)),
            inflight: Arc::default(),
            health: Arc::default(),
            timeout: Duration::from_secs(20),
            rpc_timeout: Duration::from_secs(2),
            caps: Arc::default(),
            settling: Arc::default(),
        }
    }

    /// Sets how long an operation is retried before it fails.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// The map view in use (refreshed when the watch has a newer map).
    pub fn view(&self) -> Arc<MapView> {
        let cur = self.maps.current();
        let v = self.view.read().clone();
        if cur.epoch > v.map.epoch {
            let nv = Arc::new(MapView::new((*cur).clone()));
            *self.view.write() = nv.clone();
            return nv;
        }
        v
    }

    /// The map watch.
    pub fn maps(&self) -> &MapWatch {
        &self.maps
    }

    /// The transport client.
    pub fn transport(&self) -> &PeerClient {
        &self.client
    }

    async fn refresh(&self, v: &MapView) {
        self.maps.refresh(v.map.epoch, Duration::from_millis(300)).await;
    }

    /// Waits up to `pause` for a map newer than `v`'s; true when one arrived.
    async fn newer_map_within(&self, v: &MapView, pause: Duration) -> bool {
        self.maps.refresh(v.map.epoch, pause).await.epoch > v.map.epoch
    }

    /// Runs `attempt` against the current map until it gives a final answer (`Ok`),
    /// refreshing the map and backing off between tries; when `timeout` has passed, the
    /// last retryable errno (`Err`) is the answer.
    ///
    /// Between tries it waits for a newer map for as long as the back-off (5 ms doubling
    /// to 200 ms) and retries the moment one arrives: a newer map is what most failures
    /// wait for (a dead node marked Down, a new primary), and a node that is taking over
    /// answers EAGAIN until it serves, which no newer map announces — waiting a fixed
    /// 300 ms for a map there, or sleeping a long back-off after one arrived, cost
    /// mutations hundreds of milliseconds after every failure.
    async fn retry<T, F, Fut>(&self, mut attempt: F) -> Result<T, Errno>
    where
        F: FnMut(Arc<MapView>) -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, Errno>, Errno>>,
    {
        let deadline = Instant::now() + self.timeout;
        let mut pause = Pause::new(Duration::from_millis(5), Duration::from_millis(200));
        let mut tries = 0u32;
        loop {
            let v = self.view();
            let last = match attempt(v.clone()).await {
                Ok(answer) => {
                    if tries > 0 {
                        Span::current().record("retries", tries);
                    }
                    return answer;
                }
                Err(e) => e,
            };
            tries += 1;
            if Instant::now() >= deadline {
                Span::current().record("retries", tries - 1);
                return Err(last);
            }
            if self.newer_map_within(&v, pause.get()).await {
                pause.reset();
            } else {
                pause.grow();
            }
        }
    }

    /// Reads from a member of `p`: the least-loaded healthy member first; a member that
    /// fails hands over to the next at once, one that has not answered within its hedge
    /// delay gets the next raced against it (the next hedge waits twice as long). The
    /// first answer wins; slower requests run to their end in the background, so a
    /// member that hangs becomes suspected.
    async fn read(&self, p: PartitionId, op: ReadOp) -> Result<ReadReply, Errno> {
        let span = info_span!(
            "ns.read",
            op = op.name(),
            partition = p.0,
            ino = op.ino().0,
            node = Empty,
            retries = 0u32,
            hedged = Empty,
            errno = Empty,
            otel.status_code = Empty,
        );
        self.read_inner(p, op)
            .instrument(span.clone())
            .await
            .inspect_err(|e| record_errno(&span, *e))
    }

    async fn read_inner(&self, p: PartitionId, op: ReadOp) -> Result<ReadReply, Errno> {
        self.retry(|v| {
            let op = op.clone();
            async move {
                let mut members: Vec<(NodeId, SocketAddr)> = self
                    .by_load(v.members(p))
                    .into_iter()
                    .filter_map(|n| v.addr(n).map(|a| (n, a)))
                    .collect();
                // Suspected members go last (stable: load order kept otherwise).
                let suspects = self.health.suspects(&members.iter().map(|m| m.1).collect::<Vec<_>>());
                let mut idx: Vec<usize> = (0..members.len()).collect();
                idx.sort_by_key(|i| suspects[*i]);
                members = idx.into_iter().map(|i| members[i]).collect();
                let req = Read {
                    epoch: v.map.epoch,
                    op: op.clone(),
                };
                let race = hedge::race(
                    members,
                    1,
                    |(_, addr)| self.health.hedge_delay(*addr),
                    |(n, addr), _| {
                        let (me, req) = (self.clone(), req.clone());
                        async move {
                            let ticket = me.health.start(addr);
                            let r = {
                                let _busy = Busy::new(&me.inflight, n);
                                call(&me.client, addr, &req, me.rpc_timeout).await
                            };
                            ticket.finish(!matches!(r, Err(CallError::Transport(ref e)) if e.status().is_none()));
                            match r {
                                Ok(r) => Attempt::Ok(r),
                                Err(CallError::Errno(e)) if e != Errno::EAGAIN => Attempt::Final(CallError::Errno(e)),
                                Err(e) => Attempt::Retry(e),
                            }
                        }
                        .in_current_span()
                    },
                )
                .await;
                if race.hedged > 0 {
                    Span::current().record("hedged", race.hedged);
                }
                for ((n, _), e) in &race.failed {
                    debug!(node = n.0, partition = p.0, error = %e, "read failed; trying another member");
                }
                if let Some(((n, _), r)) = race.ok.into_iter().next() {
                    Span::current().record("node", n.0);
                    return Ok(Ok(r));
                }
                if let Some(((n, _), e)) = race.fatal {
                    Span::current().record("node", n.0);
                    return Ok(Err(e.errno()));
                }
                Err(race.failed.last().map_or(Errno::EIO, |(_, e)| e.errno()))
            }
        })
        .await
    }

    /// Members ordered by requests this client has outstanding at each, fewest first
    /// (ties rotate): a slow or throttled replica gets less of the load.
    fn by_load(&self, mut members: Vec<NodeId>) -> Vec<NodeId> {
        if members.len() > 1 {
            let start = self.rr.fetch_add(1, Ordering::Relaxed) as usize % members.len();
            members.rotate_left(start);
            let load = self.inflight.lock();
            members.sort_by_key(|n| load.get(n).copied().unwrap_or(0));
        }
        members
    }

    /// Runs a mutation at its coordinator.
    pub async fn op(&self, creds: &Creds, op: NsOp) -> Result<OpReply, Errno> {
        let span = info_span!(
            "ns.op",
            op = op.name(),
            partition = Empty,
            ino = op.ino().0,
            node = Empty,
            retries = 0u32,
            errno = Empty,
            otel.status_code = Empty,
        );
        self.op_inner(creds, op)
            .instrument(span.clone())
            .await
            .inspect_err(|e| record_errno(&span, *e))
    }

    async fn op_inner(&self, creds: &Creds, op: NsOp) -> Result<OpReply, Errno> {
        // One id for every try: a retry of an operation whose first try was finished
        // after its answer was lost is answered as done (see `NsOp::once`).
        let id = if op.once() { random_id() } else { 0 };
        self.op_as(creds, op, id).await
    }

    /// Runs a mutation as operation `id` (0: none): a second call with the same id,
    /// after the first finished, is answered as done without running it again. For
    /// tests and tools that retry on their own; [`MetaClient::op`] chooses the id.
    pub async fn op_as(&self, creds: &Creds, op: NsOp, id: u64) -> Result<OpReply, Errno> {
        let dirs = op.dirs_adjusted();
        let r = self.op_at_coordinator(creds, &op, id).await;
        // Also after a failure: the operation may have been done all the same.
        self.settle_later(&dirs);
        r
    }

    /// Remembers `dirs` as changed by this client now: their counts and times may
    /// reach their copies a moment after the answer, and this client must see them.
    fn settle_later(&self, dirs: &[Ino]) {
        if dirs.is_empty() {
            return;
        }
        let until = Instant::now() + crate::service::wire::SETTLE_WINDOW;
        let mut s = self.settling.lock();
        if s.len() + dirs.len() > MAX_SETTLING {
            let now = Instant::now();
            s.retain(|_, t| *t > now);
            while s.len() + dirs.len() > MAX_SETTLING {
                let Some(oldest) = s.iter().min_by_key(|(_, t)| **t).map(|(i, _)| *i) else {
                    break;
                };
                s.remove(&oldest);
            }
        }
        for d in dirs {
            s.insert(*d, until);
        }
    }

    /// Whether this client changed directory `ino` within `SETTLE_WINDOW`.
    fn settling(&self, ino: Ino) -> bool {
        let mut s = self.settling.lock();
        match s.get(&ino) {
            Some(t) if *t > Instant::now() => true,
            Some(_) => {
                s.remove(&ino);
                false
            }
            None => false,
        }
    }

    /// Attributes of `ino` from its primary, with what answered operations will still
    /// add to them ([`ReadOp::GetAttrSettled`]).
    async fn getattr_settled(&self, ino: Ino) -> Result<Attr, Errno> {
        let p = ino.partition();
        let r = self
            .retry(|v| async move {
                let Some(addr) = v.primary(p).and_then(|n| v.addr(n)) else {
                    return Err(Errno::EAGAIN);
                };
                let req = Read {
                    epoch: v.map.epoch,
                    op: ReadOp::GetAttrSettled(ino),
                };
                match call(&self.client, addr, &req, self.rpc_timeout).await {
                    Ok(r) => Ok(Ok(r)),
                    Err(CallError::Errno(e)) if e != Errno::EAGAIN => Ok(Err(e)),
                    Err(e) => Err(e.errno()),
                }
            })
            .await?;
        match r {
            ReadReply::Attr(a) => Ok(a),
            _ => Err(Errno::EIO),
        }
    }

    async fn op_at_coordinator(&self, creds: &Creds, op: &NsOp, id: u64) -> Result<OpReply, Errno> {
        self.retry(|v| {
            let req = Op {
                epoch: v.map.epoch,
                creds: creds.clone(),
                op: op.clone(),
                id,
            };
            async move {
                let anchor = req.op.anchor(v.map.partitions);
                let primary = v.primary(anchor);
                let span = Span::current();
                span.record("partition", anchor.0);
                if let Some(n) = primary {
                    span.record("node", n.0);
                }
                let Some(addr) = primary.and_then(|n| v.addr(n)) else {
                    return Err(Errno::EIO);
                };
                let sent = call(&self.client, addr, &req, self.timeout.min(Duration::from_secs(15)));
                // A primary cut off by the network answers nothing until the call times
                // out; once a newer map names another primary, the operation goes there
                // instead (the old one is fenced, and the retry is exactly-once).
                let answer = tokio::select! {
                    r = sent => r,
                    () = self.primary_moves(anchor, primary) => {
                        debug!(partition = anchor.0, "the primary changed; retrying at the new one");
                        return Err(Errno::EAGAIN);
                    }
                };
                match answer {
                    Ok(r) => Ok(Ok(r)),
                    Err(CallError::Errno(e)) if e != Errno::EAGAIN => Ok(Err(e)),
                    Err(e) => {
                        if let (CallError::Transport(t), Some(n)) = (&e, primary)
                            && t.is_peer_failure()
                        {
                            // The primary may be dead: the managers check and, if so,
                            // hand its partitions on now, not after missed heartbeats.
                            self.maps.report_unreachable(n);
                        }
                        debug!(partition = anchor.0, error = %e, "operation not done; retrying");
                        Err(e.errno())
                    }
                }
            }
        })
        .await
        .map(|r| self.keep_cap(r))
    }

    /// Keeps the shard capability a reply carries (for [`MetaClient::take_cap`]) and
    /// returns the reply without it.
    fn keep_cap(&self, reply: OpReply) -> OpReply {
        let OpReply::WithCap(inner, cap) = reply else {
            return reply;
        };
        self.store_cap(cap);
        *inner
    }

    /// Keeps `cap` for the file it names until [`MetaClient::take_cap`].
    fn store_cap(&self, cap: Vec<u8>) {
        if let Ok(c) = shingle_transport::cap::ShardCap::from_bytes(&cap) {
            let mut caps = self.caps.lock();
            // Taken at once by the file layer; a caller that never takes them (a tool)
            // must not grow this without bound. Lost ones are asked for again.
            if caps.len() >= MAX_KEPT_CAPS {
                caps.clear();
            }
            caps.insert(c.object, cap);
        }
    }

    /// The shard capability the last create or version reservation of file `ino`
    /// brought (with a client key; none with the cluster secret), taken.
    pub fn take_cap(&self, ino: Ino) -> Option<Vec<u8>> {
        self.caps.lock().remove(&ino.0)
    }

    /// Resolves once a newer map than this client's names another primary than `was`
    /// for partition `p`; never otherwise.
    async fn primary_moves(&self, p: PartitionId, was: Option<NodeId>) {
        let mut rx = self.maps.subscribe();
        rx.borrow_and_update();
        if self.view().primary(p) != was {
            return;
        }
        loop {
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
            if self.view().primary(p) != was {
                return;
            }
        }
    }

    /// Looks up `name` in `parent` (one RPC unless the inode lives in another partition).
    /// Nodes refuse it to a client key, which uses [`MetaClient::lookup_as`].
    pub async fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr, Errno> {
        let op = ReadOp::Lookup {
            parent,
            name: name.to_vec(),
        };
        self.entry(op).await
    }

    /// [`MetaClient::lookup`] for `creds`: with a client key, the nodes check that
    /// `creds` (squashed as its grant says) may search `parent`; with the cluster
    /// secret it is `lookup` (the mount's kernel checked).
    pub async fn lookup_as(&self, creds: &Creds, parent: Ino, name: &[u8]) -> Result<Attr, Errno> {
        if self.client.identity().is_none() {
            return self.lookup(parent, name).await;
        }
        let op = ReadOp::LookupAs {
            creds: creds.clone(),
            parent,
            name: name.to_vec(),
        };
        self.entry(op).await
    }

    async fn entry(&self, op: ReadOp) -> Result<Attr, Errno> {
        let (ReadOp::Lookup { parent, name } | ReadOp::LookupAs { parent, name, .. }) = &op else {
            return Err(Errno::EINVAL);
        };
        let p = crate::placement::dentry_partition(*parent, name, self.view().map.partitions);
        match self.read(p, op).await? {
            ReadReply::Entry(e, _) if self.settling(e.ino) => self.getattr_settled(e.ino).await,
            ReadReply::Entry(_, Some(a)) => Ok(a),
            ReadReply::Entry(e, None) => self.getattr(e.ino).await,
            _ => Err(Errno::EIO),
        }
    }

    /// Attributes of an inode (of a directory this client changed a moment ago, as
    /// they are once those changes are applied: `ReadOp::GetAttrSettled`).
    pub async fn getattr(&self, ino: Ino) -> Result<Attr, Errno> {
        if self.settling(ino) {
            return self.getattr_settled(ino).await;
        }
        match self.read(ino.partition(), ReadOp::GetAttr(ino)).await? {
            ReadReply::Attr(a) => Ok(a),
            _ => Err(Errno::EIO),
        }
    }

    /// The inode with the records of its first [`HEAD_STRIPES`] stripes (what an open
    /// needs: one request, whatever the file's size).
    pub async fn head(&self, ino: Ino) -> Result<InodeRec, Errno> {
        match self.read(ino.partition(), ReadOp::GetInode(ino)).await? {
            ReadReply::Inode(r) => Ok(*r),
            _ => Err(Errno::EIO),
        }
    }

    /// [`MetaClient::head`] for `creds` opening the file: with a client key, the reply
    /// also brings a read capability for the file's shards when `creds` may have its
    /// data ([`MetaClient::take_cap`]); with the cluster secret it is `head`.
    pub async fn head_as(&self, creds: &Creds, ino: Ino) -> Result<InodeRec, Errno> {
        if self.client.identity().is_none() {
            return self.head(ino).await;
        }
        let op = ReadOp::GetInodeAs {
            creds: creds.clone(),
            ino,
        };
        match self.read(ino.partition(), op).await? {
            ReadReply::InodeCap(r, cap) => {
                self.store_cap(cap);
                Ok(*r)
            }
            _ => Err(Errno::EIO),
        }
    }

    /// The committed stripe records of file `ino` in `from..to`, in order (as many
    /// requests as it takes), and the file's attributes as the first request found
    /// them. `None` instead of attributes when the pages came from different versions
    /// of the file (a commit or truncate between two requests).
    pub async fn stripes(&self, ino: Ino, from: u64, to: u64) -> Result<StripesRead, Errno> {
        let mut out = Vec::new();
        let mut attr: Option<Attr> = None;
        let mut same = true;
        let mut at = from;
        while at < to {
            let limit = (to - at).min(u64::from(MAX_STRIPES_READ)) as u32;
            let (recs, more, a) = match self
                .read(ino.partition(), ReadOp::Stripes { ino, from: at, limit })
                .await?
            {
                ReadReply::Stripes(recs, more, a) => (recs, more, *a),
                _ => return Err(Errno::EIO),
            };
            match &attr {
                Some(first) => same &= first == &a,
                None => attr = Some(a),
            }
            let Some(last) = recs.last().map(|(s, _)| *s) else {
                break;
            };
            if last < at {
                return Err(Errno::EIO);
            }
            out.extend(recs.into_iter().filter(|(s, _)| (at..to).contains(s)));
            if !more {
                break;
            }
            at = last.saturating_add(1);
        }
        Ok((out, attr.filter(|_| same)))
    }

    /// The whole inode: attributes, symlink target and every stripe of its layout (for
    /// tools; a file system client reads [`MetaClient::head`] and loads the rest on demand).
    pub async fn get_inode(&self, ino: Ino) -> Result<InodeRec, Errno> {
        let mut rec = self.head(ino).await?;
        if let Some(l) = rec.layout.as_mut()
            && rec.attr.size.div_ceil(l.stripe_bytes().max(1)) > HEAD_STRIPES
        {
            l.stripes.extend(self.stripes(ino, HEAD_STRIPES, u64::MAX).await?.0);
        }
        Ok(rec)
    }

    /// A symlink's target.
    pub async fn readlink(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        self.get_inode(ino).await?.target.ok_or(Errno::EINVAL)
    }

    /// One extended attribute.
    pub async fn getxattr(&self, creds: &Creds, ino: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
        let op = ReadOp::GetXattr {
            creds: creds.clone(),
            ino,
            name: name.to_vec(),
        };
        match self.read(ino.partition(), op).await? {
            ReadReply::Value(v) => Ok(v),
            _ => Err(Errno::EIO),
        }
    }

    /// Extended attribute names.
    pub async fn listxattr(&self, creds: &Creds, ino: Ino) -> Result<Vec<Vec<u8>>, Errno> {
        let op = ReadOp::ListXattr {
            creds: creds.clone(),
            ino,
        };
        match self.read(ino.partition(), op).await? {
            ReadReply::Names(v) => Ok(v),
            _ => Err(Errno::EIO),
        }
    }

    /// One page of `dir`: up to `limit` entries with names after `after`, in name order,
    /// from every partition (in parallel, one request per node).
    /// Nodes refuse it to a client key, which uses [`MetaClient::readdir_as`].
    pub async fn readdir(&self, dir: Ino, after: Option<&[u8]>, limit: u32) -> Result<Vec<DirEntry>, Errno> {
        self.readdir_for(None, dir, after, limit, false).await
    }

    /// [`MetaClient::readdir`] for `creds`: with a client key, each node checks that
    /// `creds` (squashed as its grant says) may read `dir`; with the cluster secret it is
    /// `readdir`.
    pub async fn readdir_as(
        &self,
        creds: &Creds,
        dir: Ino,
        after: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<DirEntry>, Errno> {
        self.readdir_with(creds, dir, after, limit, false).await
    }

    /// [`MetaClient::readdir_as`] with attributes (READDIRPLUS): [`DirEntry::attr`] is
    /// `Some` where the listing's own replies carried it, read with the entry — the
    /// inode lives with its name, and is not a directory this client changed a moment
    /// ago (whose counts [`MetaClient::getattr`] waits for). The caller reads the
    /// others (a file renamed or linked elsewhere) with `getattr`.
    pub async fn readdir_plus_as(
        &self,
        creds: &Creds,
        dir: Ino,
        after: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<DirEntry>, Errno> {
        let mut page = self.readdir_with(creds, dir, after, limit, true).await?;
        for e in &mut page {
            if e.attr.is_some() && self.settling(e.ino) {
                e.attr = None;
            }
        }
        Ok(page)
    }

    /// A listing with `creds` sent only by a client key (the cluster secret lists as
    /// anyone).
    async fn readdir_with(
        &self,
        creds: &Creds,
        dir: Ino,
        after: Option<&[u8]>,
        limit: u32,
        plus: bool,
    ) -> Result<Vec<DirEntry>, Errno> {
        let creds = self.client.identity().is_some().then_some(creds);
        self.readdir_for(creds, dir, after, limit, plus).await
    }

    async fn readdir_for(
        &self,
        creds: Option<&Creds>,
        dir: Ino,
        after: Option<&[u8]>,
        limit: u32,
        plus: bool,
    ) -> Result<Vec<DirEntry>, Errno> {
        let span = info_span!(
            "ns.readdir",
            op = "readdir",
            ino = dir.0,
            nodes = Empty,
            entries = Empty,
            retries = 0u32,
            errno = Empty,
            otel.status_code = Empty,
        );
        self.readdir_inner(creds, dir, after, limit, plus)
            .instrument(span.clone())
            .await
            .inspect_err(|e| record_errno(&span, *e))
    }

    async fn readdir_inner(
        &self,
        creds: Option<&Creds>,
        dir: Ino,
        after: Option<&[u8]>,
        limit: u32,
        plus: bool,
    ) -> Result<Vec<DirEntry>, Errno> {
        let deadline = Instant::now() + self.timeout;
        let v = self.view();
        let mut todo: Vec<PartitionId> = (0..v.map.partitions).map(PartitionId).collect();
        let mut out: Vec<DirEntry> = Vec::new();
        let mut attempt = 0usize;
        while !todo.is_empty() {
            let v = self.view();
            let by_node = cover(&v, &todo, attempt);
            if attempt == 0 {
                Span::current().record("nodes", by_node.len());
            } else {
                Span::current().record("retries", attempt);
            }
            let calls = by_node.into_iter().map(|(n, parts)| {
                let v = v.clone();
                let after = after.map(<[u8]>::to_vec);
                async move {
                    let addr = v.addr(n)?;
                    let partitions = parts.clone();
                    let op = match creds {
                        Some(c) => ReadOp::ReadDirAs {
                            creds: c.clone(),
                            dir,
                            after,
                            limit,
                            partitions,
                            plus,
                        },
                        None => ReadOp::ReadDir {
                            dir,
                            after,
                            limit,
                            partitions,
                            plus,
                        },
                    };
                    let req = Read { epoch: v.map.epoch, op };
                    match call(&self.client, addr, &req, self.rpc_timeout).await {
                        Ok(ReadReply::Entries(e, missing)) => Some(Ok((e, missing, parts))),
                        Ok(_) => None,
                        // The directory's answer (not there, not a directory, not this
                        // client's to list): the same from every node.
                        Err(CallError::Errno(e)) if e != Errno::EAGAIN => Some(Err(e)),
                        Err(e) => {
                            debug!(node = n.0, error = %e, "readdir failed at a node");
                            None
                        }
                    }
                }
            });
            let results = join_all(calls).await;
            let mut done = std::collections::BTreeSet::new();
            for r in results.into_iter().flatten() {
                let (entries, missing, parts) = r?;
                out.extend(entries);
                for p in parts {
                    if !missing.contains(&p) {
                        done.insert(p);
                    }
                }
            }
            todo.retain(|p| !done.contains(p));
            if todo.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Errno::EIO);
            }
            attempt += 1;
            if attempt % 3 == 0 {
                self.refresh(&v).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out.truncate(limit as usize);
        Span::current().record("entries", out.len());
        Ok(out)
    }

    fn attr(r: OpReply) -> Result<Attr, Errno> {
        match r {
            OpReply::Attr(a) | OpReply::Made(a, _) => Ok(a),
            OpReply::Done | OpReply::DoneAt(_) | OpReply::Versions(_) | OpReply::WithCap(..) => Err(Errno::EIO),
        }
    }

    /// Creates a node of any kind (file, directory, symlink, fifo, socket, device).
    #[allow(clippy::too_many_arguments)]
    pub async fn mknod(
        &self,
        creds: &Creds,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        rdev: u64,
        target: Option<&[u8]>,
    ) -> Result<Attr, Errno> {
        let op = NsOp::Mknod {
            parent,
            name: name.to_vec(),
            kind,
            perm,
            rdev,
            target: target.map(<[u8]>::to_vec),
            token: random_id(),
            reserve: None,
        };
        Self::attr(self.op(creds, op).await?)
    }

    /// Creates a regular file and takes stripe versions `1..=count` of it with the
    /// create (`policy`: the file's when its directory sets none): the creator stores
    /// its first stripes without asking for versions. With the attributes comes the
    /// file's layout policy (no stripes) when the file is new; `None` when a retry
    /// found it made by an earlier attempt (it may have data: read it).
    pub async fn create_file(
        &self,
        creds: &Creds,
        parent: Ino,
        name: &[u8],
        perm: u32,
        policy: Layout,
        count: u32,
    ) -> Result<(Attr, Option<Layout>), Errno> {
        let op = NsOp::Mknod {
            parent,
            name: name.to_vec(),
            kind: FileKind::File,
            perm,
            rdev: 0,
            target: None,
            token: random_id(),
            reserve: Some(crate::service::wire::CreateReserve { policy, count }),
        };
        match self.op(creds, op).await? {
            OpReply::Made(a, layout) if a.kind == FileKind::File && layout.stripes.is_empty() => Ok((a, Some(layout))),
            r => Self::attr(r).map(|a| (a, None)),
        }
    }

    /// Creates a hard link.
    pub async fn link(&self, creds: &Creds, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr, Errno> {
        let op = NsOp::Link {
            ino,
            newparent,
            newname: newname.to_vec(),
        };
        Self::attr(self.op(creds, op).await?)
    }

    /// Removes a non-directory.
    pub async fn unlink(&self, creds: &Creds, parent: Ino, name: &[u8]) -> Result<(), Errno> {
        self.unlink_keep(creds, parent, name, 0).await
    }

    /// Removes a non-directory entry; a file whose last link this is keeps its data for
    /// `keep_secs` (the caller has it open and renews the hold with
    /// [`MetaClient::hold_purge`]).
    pub async fn unlink_keep(&self, creds: &Creds, parent: Ino, name: &[u8], keep_secs: u32) -> Result<(), Errno> {
        self.unlink_at(creds, parent, name, keep_secs).await.map(|_| ())
    }

    /// [`MetaClient::unlink_keep`], answering when it ran (what `parent`'s modification
    /// and change times became), if the nodes said.
    pub async fn unlink_at(
        &self,
        creds: &Creds,
        parent: Ino,
        name: &[u8],
        keep_secs: u32,
    ) -> Result<Option<TimeNs>, Errno> {
        let op = NsOp::Unlink {
            parent,
            name: name.to_vec(),
            keep_secs,
        };
        self.op(creds, op).await.map(Self::done_at)
    }

    /// Removes an empty directory.
    pub async fn rmdir(&self, creds: &Creds, parent: Ino, name: &[u8]) -> Result<(), Errno> {
        self.rmdir_at(creds, parent, name).await.map(|_| ())
    }

    /// [`MetaClient::rmdir`], answering when it ran, if the nodes said.
    pub async fn rmdir_at(&self, creds: &Creds, parent: Ino, name: &[u8]) -> Result<Option<TimeNs>, Errno> {
        let op = NsOp::Rmdir {
            parent,
            name: name.to_vec(),
        };
        self.op(creds, op).await.map(Self::done_at)
    }

    fn done_at(r: OpReply) -> Option<TimeNs> {
        match r {
            OpReply::DoneAt(t) => Some(t),
            _ => None,
        }
    }

    /// Renames (renameat2 flags: NOREPLACE, EXCHANGE).
    #[allow(clippy::too_many_arguments)]
    pub async fn rename(
        &self,
        creds: &Creds,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> Result<(), Errno> {
        let op = NsOp::Rename {
            parent,
            name: name.to_vec(),
            newparent,
            newname: newname.to_vec(),
            noreplace,
            exchange,
        };
        self.op(creds, op).await.map(|_| ())
    }

    /// Changes attributes.
    pub async fn setattr(&self, creds: &Creds, ino: Ino, set: SetAttr) -> Result<Attr, Errno> {
        Self::attr(self.op(creds, NsOp::SetAttr { ino, set }).await?)
    }

    /// Sets an extended attribute (mode 0 any, 1 create, 2 replace).
    pub async fn setxattr(&self, creds: &Creds, ino: Ino, name: &[u8], value: &[u8], mode: u8) -> Result<(), Errno> {
        let op = NsOp::SetXattr {
            ino,
            name: name.to_vec(),
            value: value.to_vec(),
            mode,
        };
        self.op(creds, op).await.map(|_| ())
    }

    /// Removes an extended attribute.
    pub async fn removexattr(&self, creds: &Creds, ino: Ino, name: &[u8]) -> Result<(), Errno> {
        let op = NsOp::RemoveXattr {
            ino,
            name: name.to_vec(),
        };
        self.op(creds, op).await.map(|_| ())
    }

    /// Records where repaired shards of a stripe now live (root only; a no-op when the
    /// stripe was rewritten since `version`).
    pub async fn relocate_shards(
        &self,
        ino: Ino,
        stripe: u64,
        version: u64,
        moves: Vec<(u32, u64)>,
    ) -> Result<(), Errno> {
        let op = NsOp::RelocateShards {
            ino,
            stripe,
            version,
            moves,
        };
        self.op(&Creds::root(), op).await.map(|_| ())
    }

    /// Sets the EC policy of a directory or empty file.
    pub async fn set_layout(&self, creds: &Creds, ino: Ino, policy: Layout) -> Result<(), Errno> {
        self.op(creds, NsOp::SetLayout { ino, policy }).await.map(|_| ())
    }

    /// Commits written stripes and the new size; `ESTALE` when a stripe no longer has
    /// the version its write was based on (another writer committed it first).
    pub async fn commit_write(
        &self,
        creds: &Creds,
        ino: Ino,
        policy: Layout,
        size: u64,
        stripes: Vec<StripeWrite>,
    ) -> Result<Attr, Errno> {
        self.commit_write_then(creds, ino, policy, size, stripes, None).await
    }

    /// [`MetaClient::commit_write`], then `then` (a setattr with no size change, made
    /// with `creds`) in the same operation and replicated commit.
    pub async fn commit_write_then(
        &self,
        creds: &Creds,
        ino: Ino,
        policy: Layout,
        size: u64,
        stripes: Vec<StripeWrite>,
        then: Option<SetAttr>,
    ) -> Result<Attr, Errno> {
        let op = match then {
            None => NsOp::CommitWrite {
                ino,
                policy,
                size,
                stripes,
            },
            Some(set) => NsOp::CommitWriteSetAttr {
                ino,
                policy,
                size,
                stripes,
                set,
            },
        };
        Self::attr(self.op(creds, op).await?)
    }

    /// Reserves `count` stripe versions of file `ino` for this writer; returns the first.
    pub async fn reserve_versions(&self, creds: &Creds, ino: Ino, policy: Layout, count: u32) -> Result<u64, Errno> {
        match self.op(creds, NsOp::ReserveVersions { ino, policy, count }).await? {
            OpReply::Versions(first) => Ok(first),
            _ => Err(Errno::EIO),
        }
    }

    /// Keeps removed file `ino`'s data `secs` more seconds (0: release it now): this
    /// client still has it open. Root only; a file not waiting for a purge is left as is.
    pub async fn hold_purge(&self, ino: Ino, secs: u32) -> Result<(), Errno> {
        self.op(&Creds::root(), NsOp::HoldPurge { ino, secs }).await.map(|_| ())
    }

    /// Records that removed file `ino`'s data is gone from the data nodes (root only).
    pub async fn purged(&self, ino: Ino) -> Result<(), Errno> {
        self.op(&Creds::root(), NsOp::Purged { ino }).await.map(|_| ())
    }

    /// Removed files of partition `p` waiting for a purge, in inode order after `after`.
    pub async fn purges(&self, p: PartitionId, after: Ino, limit: u32) -> Result<Vec<(Ino, Purge)>, Errno> {
        match self
            .read(
                p,
                ReadOp::Purges {
                    partition: p,
                    after,
                    limit,
                },
            )
            .await?
        {
            ReadReply::Purges(v) => Ok(v),
            _ => Err(Errno::EIO),
        }
    }

    /// Whether inode `ino` exists or waits for a purge (`false`: its data is garbage).
    pub async fn alive(&self, ino: Ino) -> Result<bool, Errno> {
        match self.read(ino.partition(), ReadOp::Alive(ino)).await? {
            ReadReply::Alive(a) => Ok(a),
            _ => Err(Errno::EIO),
        }
    }

    /// Resolves a slash-separated path from the root (no symlink following), as root
    /// (squashed as a client key's grant says).
    pub async fn resolve(&self, path: &[u8]) -> Result<Attr, Errno> {
        let mut cur = self.getattr(Ino::ROOT).await?;
        for comp in path.split(|b| *b == b'/').filter(|c| !c.is_empty() && *c != b".") {
            if cur.kind != FileKind::Dir {
                return Err(Errno::ENOTDIR);
            }
            cur = self.lookup_as(&Creds::root(), cur.ino, comp).await?;
        }
        Ok(cur)
    }

    /// Inode counts and health summed over the meta nodes in the map.
    pub async fn stats(&self) -> Vec<(NodeId, Result<NodeStats, Errno>)> {
        let v = self.view();
        let calls = v.map.nodes.values().filter(|n| n.roles.meta).map(|n| {
            let (id, addr) = (n.id, n.addr);
            async move {
                (
                    id,
                    call(&self.client, addr, &Stats, self.rpc_timeout)
                        .await
                        .map_err(|e| e.errno()),
                )
            }
        });
        join_all(calls).await
    }
}

/// Records a failed operation's errno on its span (an I/O error also marks the span as
/// failed; ENOENT and the like are answers, not failures).
pub fn record_errno(span: &Span, e: Errno) {
    span.record("errno", e.code());
    if e == Errno::EIO {
        span.record("otel.status_code", "error");
    }
}

/// Assigns each partition to one of its members so that few nodes cover all of them
/// (greedy set cover: the node holding most unassigned partitions first), so a readdir
/// asks 2–3 nodes instead of every node. Later attempts rotate to other members.
fn cover(v: &MapView, todo: &[PartitionId], attempt: usize) -> BTreeMap<NodeId, Vec<PartitionId>> {
    let mut left: Vec<(PartitionId, Vec<NodeId>)> = todo
        .iter()
        .map(|p| {
            let mut m = v.members(*p);
            if !m.is_empty() {
                let r = attempt % m.len();
                m.rotate_left(r);
            }
            (*p, m)
        })
        .filter(|(_, m)| !m.is_empty())
        .collect();
    let mut out: BTreeMap<NodeId, Vec<PartitionId>> = BTreeMap::new();
    while !left.is_empty() {
        let mut count: BTreeMap<NodeId, usize> = BTreeMap::new();
        for (_, m) in &left {
            // After a failure, only each partition's rotated first choice counts.
            let choices = if attempt == 0 { &m[..] } else { &m[..1] };
            for n in choices {
                *count.entry(*n).or_default() += 1;
            }
        }
        let Some((&best, _)) = count.iter().max_by_key(|(n, c)| (**c, std::cmp::Reverse(**n))) else {
            break;
        };
        let (take, keep): (Vec<_>, Vec<_>) = left
            .into_iter()
            .partition(|(_, m)| if attempt == 0 { m.contains(&best) } else { m[0] == best });
        out.entry(best).or_default().extend(take.into_iter().map(|(p, _)| p));
        left = keep;
    }
    out
}

/// Counts one outstanding request at a node while alive.
struct Busy<'a> {
    map: &'a parking_lot::Mutex<std::collections::HashMap<NodeId, u32>>,
    node: NodeId,
}

impl<'a> Busy<'a> {
    fn new(map: &'a parking_lot::Mutex<std::collections::HashMap<NodeId, u32>>, node: NodeId) -> Self {
        *map.lock().entry(node).or_default() += 1;
        Busy { map, node }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.map.lock().get_mut(&self.node) {
            *c = c.saturating_sub(1);
        }
    }
}

/// A random non-zero id naming one operation across its retries (a create's token).
fn random_id() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b).max(1)
}
