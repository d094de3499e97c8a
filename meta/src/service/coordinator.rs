//! The coordinator of one namespace operation, as a pure engine.
//!
//! A mutation is coordinated by the primary of its anchor partition: it locks the
//! directories (or the inode) the operation changes, reads the records the operation
//! needs from their partitions' primaries into a sparse [`Namespace`], runs the
//! operation on it, and executes the changes it plans — one batch when they all fall in
//! one partition, through an intent otherwise. [`Coordination`] holds that sequence
//! without any I/O: it says what to do next ([`Coordination::step`]) and is told what came back; the
//! metadata service (`node.rs`) drives it over the network and the simulator
//! (`crate::sim`) over its simulated one. The batches a plan becomes and the fence a
//! primary puts in front of coordinators are pure functions here as well.

use crate::ids::{Ino, NodeId, PartitionId};
use crate::map::MapView;
use crate::namespace::{
    Attr, Creds, DentryVal, DoneOp, Errno, FileKind, InodeRec, Intent, Mutation, Namespace, Need, Plan, StripeRec,
};
use crate::service::locks;
use crate::service::wire::{self, PartOp};
use crate::service::wire::{NsOp, OpReply};
use std::collections::{BTreeMap, BTreeSet};

/// The cross-directory rename lock (like the kernel's `s_vfs_rename_mutex`).
pub const RENAME_LOCK: u64 = 0;

/// How many read rounds one operation may take before it fails with `EIO` (each round
/// fetches what the previous one found missing; real operations need a few).
pub const MAX_ROUNDS: u32 = 64;

/// What the driver of a [`Coordination`] does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Take these keys (at the primaries of their partitions), then call
    /// [`Coordination::locked`]. If any host refuses, release everything held and start
    /// the operation again (a new [`Coordination`]).
    Lock(Vec<u64>),
    /// Read these records and hand them in with the `provide_*` methods.
    Fetch(Vec<Need>),
    /// Execute these plans in order ([`PlanRun`]), then answer the client with this.
    Commit(Vec<Plan>, OpReply),
    /// The operation fails with this error; nothing was changed.
    Fail(Errno),
}

/// One namespace operation being coordinated.
#[derive(Clone, Debug)]
pub struct Coordination {
    op: NsOp,
    creds: Creds,
    id: u64,
    now: i64,
    partitions: u32,
    cache: Cache,
    held: BTreeSet<u64>,
    rounds: u32,
    client: bool,
}

impl Coordination {
    /// Coordination of `op` for `creds`, as client operation `id` (0: none), at time `now`.
    pub fn new(op: NsOp, creds: Creds, id: u64, now: i64, partitions: u32) -> Self {
        Coordination {
            op,
            creds,
            id,
            now,
            partitions,
            cache: Cache::default(),
            held: BTreeSet::new(),
            rounds: 0,
            client: false,
        }
    }

    /// The caller holds a client key, not the cluster secret: what a trusted mount's
    /// kernel checked at open is checked here instead ([`client_checks`]).
    pub fn for_client(mut self) -> Self {
        self.client = true;
        self
    }

    /// The operation.
    pub fn op(&self) -> &NsOp {
        &self.op
    }

    /// The partition the operation is anchored in (whose primary coordinates it).
    pub fn anchor(&self) -> PartitionId {
        self.op.anchor(self.partitions)
    }

    /// What to do next.
    pub fn step(&mut self) -> Next {
        let base: Vec<u64> = base_locks(&self.op, self.partitions)
            .into_iter()
            .filter(|k| !self.held.contains(k))
            .collect();
        if !base.is_empty() {
            return Next::Lock(base);
        }
        if self.rounds >= MAX_ROUNDS {
            return Next::Fail(Errno::EIO);
        }
        self.rounds += 1;
        let mut ns = Namespace::sparse(self.partitions);
        self.cache.fill(&mut ns);
        let result = if self.client {
            client_checks(&ns, &self.creds, &self.op)
        } else {
            Ok(())
        }
        .and_then(|()| run(&mut ns, &self.creds, &self.op, self.id, self.now));
        let needs = ns.needs();
        if !needs.is_empty() {
            return Next::Fetch(needs);
        }
        let extra: Vec<u64> = extra_locks(&self.op, &self.cache)
            .into_iter()
            .filter(|k| !self.held.contains(k))
            .collect();
        if !extra.is_empty() {
            return Next::Lock(extra);
        }
        match result {
            Ok(reply) => Next::Commit(ns.take_plans(), reply),
            Err(e) => Next::Fail(e),
        }
    }

    /// The directories to find quiet now that `keys` (just locked) are held
    /// ([`quiet_dirs`]).
    pub fn quiet_dirs(&self, keys: &[u64]) -> Vec<Ino> {
        quiet_dirs(&self.op, &self.cache, keys)
    }

    /// `keys` are held now. What was read of those inodes before they were locked is
    /// read again; after the rename lock, every inode (a directory's ancestry, read to
    /// refuse a move into its own subtree, may have changed before it was held).
    pub fn locked(&mut self, keys: &[u64]) {
        for k in keys {
            self.held.insert(*k);
            if let Some(ino) = locks::key_inode(*k) {
                self.cache.inodes.remove(&ino);
            }
        }
        if keys.contains(&RENAME_LOCK) {
            self.cache.inodes.clear();
        }
    }

    /// The keys held (to release when the operation ends).
    pub fn held(&self) -> impl Iterator<Item = u64> + '_ {
        self.held.iter().copied()
    }

    /// An inode read (`None`: it does not exist).
    pub fn provide_inode(&mut self, ino: Ino, rec: Option<InodeRec>) {
        self.cache.inodes.insert(ino, rec);
    }

    /// An entry read.
    pub fn provide_dentry(&mut self, parent: Ino, name: Vec<u8>, val: Option<DentryVal>) {
        self.cache.dentries.insert((parent, name), val);
    }

    /// A fresh counter of a partition.
    pub fn provide_counter(&mut self, p: PartitionId, counter: u64) {
        self.cache.counters.insert(p, counter);
    }

    /// A stripe record read.
    pub fn provide_stripe(&mut self, ino: Ino, stripe: u64, rec: Option<StripeRec>) {
        self.cache.stripes.insert((ino, stripe), rec);
    }

    /// Whether client operation `op` is recorded as done in partition `p`.
    ///
    /// A done operation is answered from its records as they are now, so inodes read
    /// before this check are read again: a lock host reads the locked inodes when it
    /// grants them, which may be before the redo that finished the operation applied
    /// its last step there (an interrupted attempt's intent is redone without its locks).
    pub fn provide_done(&mut self, p: PartitionId, op: u64, rec: Option<DoneOp>) {
        if rec.is_some() {
            self.cache.inodes.clear();
        }
        self.cache.done.insert((p, op), rec);
    }
}

/// How a plan is executed: one batch at its coordinating partition, or an intent.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanRun {
    /// Every step is in partition `p`: one batch. When `relative` (a step adds to a
    /// value, such as a link count), the batch needs an id (a fresh inode number of `p`,
    /// [`batch_ops`]) so a retry that reaches a primary which already applied it does
    /// not apply it twice.
    Batch {
        /// The partition.
        p: PartitionId,
        /// Whether the steps need an id.
        relative: bool,
    },
    /// Steps in several partitions: an intent recorded in `coord` (its id a fresh inode
    /// number of `coord`), [`intent_ops`].
    Intent {
        /// The coordinating partition.
        coord: PartitionId,
    },
}

/// How `plan` is executed.
pub fn plan_run(plan: &Plan) -> PlanRun {
    let (coord, steps) = plan;
    if steps.iter().all(|(p, _)| p == coord) {
        PlanRun::Batch {
            p: *coord,
            relative: steps.iter().any(|(_, m)| m.is_relative()),
        }
    } else {
        PlanRun::Intent { coord: *coord }
    }
}

/// The batch of a one-partition plan. Relative steps carry `id` (0 when none was
/// needed) so they apply at most once; absolute steps carry none: writing the same
/// values again is harmless while the coordinator holds its locks, and nobody redoes a
/// batch without an intent.
pub fn batch_ops(steps: Vec<(PartitionId, Mutation)>, id: u64) -> Vec<PartOp> {
    steps
        .into_iter()
        .enumerate()
        .map(|(i, (_, m))| PartOp::Apply {
            intent: if m.is_relative() { id } else { 0 },
            step: i as u16,
            m,
        })
        .collect()
}

/// The batches of an intent: the first for its coordinating partition (the intent's
/// record, when `begin`, and that partition's steps), which must be durable before any
/// other; then one per other partition, in any order.
pub fn intent_ops(
    coord: PartitionId,
    intent: &Intent,
    begin: bool,
) -> (Vec<PartOp>, BTreeMap<PartitionId, Vec<PartOp>>) {
    let mut by_part: BTreeMap<PartitionId, Vec<PartOp>> = BTreeMap::new();
    for (i, (p, m)) in intent.steps.iter().enumerate() {
        by_part.entry(*p).or_default().push(PartOp::Apply {
            intent: intent.id,
            step: i as u16,
            m: m.clone(),
        });
    }
    let mut first = Vec::new();
    if begin {
        first.push(PartOp::Begin(intent.clone()));
    }
    first.extend(by_part.remove(&coord).unwrap_or_default());
    (first, by_part)
}

/// Splits the other partitions' batches of an intent ([`intent_ops`]) into those the
/// client waits for and those that may follow its answer: a partition whose steps only
/// adjust directories' counts and times (`AdjustDir`) comes after. The operation is
/// durable once its coordinating partition holds the intent (a new primary redoes the
/// rest), and every name and inode it changes is in place once the first group is
/// applied; the directories' attributes follow, under the locks the coordinator keeps
/// until they are applied (announced first to the directories' primaries,
/// [`expected_counts`], so the client that made the change reads them at once:
/// `ReadOp::GetAttrSettled`).
pub fn answer_before(
    by_part: BTreeMap<PartitionId, Vec<PartOp>>,
) -> (BTreeMap<PartitionId, Vec<PartOp>>, BTreeMap<PartitionId, Vec<PartOp>>) {
    by_part.into_iter().partition(|(_, ops)| {
        !ops.iter().all(|op| {
            matches!(
                op,
                PartOp::Apply {
                    m: Mutation::AdjustDir { .. },
                    ..
                }
            )
        })
    })
}

/// The directories an operation must find *quiet* once it holds `keys`: no operation
/// answered before its directory counts were applied may still have counts to apply
/// to them. An rmdir reads its victim's entry count, a rename the count of a
/// directory it replaces (nothing else reads a count: parents' counts change by
/// relative steps); both hold those directories exclusively, which normally waits
/// for every count to land — but a lock host that took its partition over (or
/// restarted) starts from an empty table, and the holders it never saw may still be
/// applying counts. [`Quiet`] asks every node (decision 0029). Empty for operations
/// that read no count, and for the lock rounds that do not take such a directory.
///
/// [`Quiet`]: crate::service::wire::Quiet
fn quiet_dirs(op: &NsOp, cache: &Cache, keys: &[u64]) -> Vec<Ino> {
    let read = match op {
        NsOp::Rmdir { parent, name } => cache.entry(*parent, name),
        NsOp::Rename { newparent, newname, .. } => cache.entry(*newparent, newname),
        _ => return Vec::new(),
    };
    read.filter(|d| d.kind == FileKind::Dir && keys.contains(&d.ino.0))
        .map(|d| d.ino)
        .into_iter()
        .collect()
}

/// Whether `intent` adjusts any of `dirs` (an `AdjustDir` step): while it is pending
/// and its steps are not known to be applied, those directories' counts may be behind.
pub fn adjusts_any(intent: &Intent, dirs: &[Ino]) -> bool {
    intent
        .steps
        .iter()
        .any(|(_, m)| matches!(m, Mutation::AdjustDir { dir, .. } if dirs.contains(dir)))
}

/// What the batches that follow an answer will add to directories, one [`Expect`] per
/// `AdjustDir` step (epoch 0: the sender sets it), by the partition whose primary keeps
/// it (the directory's).
///
/// [`Expect`]: crate::service::wire::Expect
pub fn expected_counts(later: &BTreeMap<PartitionId, Vec<PartOp>>) -> Vec<(PartitionId, wire::Expect)> {
    let mut out = Vec::new();
    for (p, ops) in later {
        for op in ops {
            if let PartOp::Apply {
                intent,
                step,
                m:
                    Mutation::AdjustDir {
                        dir,
                        entries,
                        subdirs,
                        time,
                    },
            } = op
            {
                out.push((
                    *p,
                    wire::Expect {
                        epoch: crate::ids::Epoch(0),
                        intent: *intent,
                        step: *step,
                        dir: *dir,
                        entries: *entries,
                        subdirs: *subdirs,
                        time: *time,
                    },
                ));
            }
        }
    }
    out
}

/// A directory's attributes with the counts and times of `expected` steps not applied
/// yet: what it will be once they are (as `AdjustDir` applies them; the times are the
/// latest of all).
pub fn with_expected<'a>(mut attr: Attr, expected: impl IntoIterator<Item = &'a wire::Expect>) -> Attr {
    for e in expected {
        attr.size = crate::namespace::partition::add_entries(attr.size, e.entries);
        attr.nlink = crate::namespace::partition::add_subdirs(attr.nlink, e.subdirs);
        attr.mtime = attr.mtime.max(e.time);
        attr.ctime = attr.ctime.max(e.time);
    }
    attr
}

/// The batch that finishes intent `id` in its coordinating partition: drops its record
/// and its markers there (the other partitions forget theirs with later batches).
pub fn finish_ops(id: u64) -> Vec<PartOp> {
    vec![PartOp::Finish(id), PartOp::Forget(id)]
}

/// Why a primary refuses a batch from coordinator node `from`, if it does: the node is
/// not Up, or a step of an intent (or the intent's record) comes from another node than
/// the primary of the intent's partition. That primary redoes intents left unfinished
/// at once; a coordinator that lost its partition must not go on applying steps
/// meanwhile, or a step could apply again after the redo finished and forgot its
/// at-most-once markers.
pub fn fence(v: &MapView, from: NodeId, ops: &[PartOp]) -> Result<(), String> {
    if !v.map.is_up(from) {
        return Err(format!("coordinator node {} is not Up", from.0));
    }
    for op in ops {
        let id = match op {
            PartOp::Apply { intent, .. } if *intent != 0 => *intent,
            PartOp::Begin(i) => i.id,
            _ => continue,
        };
        let coord = Ino(id).partition();
        if v.primary(coord) != Some(from) {
            return Err(format!(
                "node {} no longer coordinates the operations of partition {}",
                from.0, coord.0
            ));
        }
    }
    Ok(())
}

/// Records a coordinator has fetched for one operation.
#[derive(Clone, Debug, Default)]
struct Cache {
    inodes: BTreeMap<Ino, Option<InodeRec>>,
    dentries: BTreeMap<(Ino, Vec<u8>), Option<DentryVal>>,
    counters: BTreeMap<PartitionId, u64>,
    stripes: BTreeMap<(Ino, u64), Option<StripeRec>>,
    done: BTreeMap<(PartitionId, u64), Option<DoneOp>>,
}

impl Cache {
    fn fill(&self, ns: &mut Namespace) {
        for (ino, r) in &self.inodes {
            ns.provide_inode(*ino, r.clone());
        }
        for ((parent, name), d) in &self.dentries {
            ns.provide_dentry(*parent, name, *d);
        }
        for (p, c) in &self.counters {
            ns.provide_counter(*p, *c);
        }
        for ((ino, stripe), r) in &self.stripes {
            ns.provide_stripe(*ino, *stripe, r.clone());
        }
        for ((p, op), r) in &self.done {
            ns.provide_done(*p, *op, *r);
        }
    }

    fn entry(&self, parent: Ino, name: &[u8]) -> Option<DentryVal> {
        self.dentries.get(&(parent, name.to_vec())).copied().flatten()
    }
}

/// Locks taken before reading: the directories whose entries change, or the inode.
///
/// An operation that only adds or removes one name of a directory (a create, an
/// unlink, an rmdir of a child, a hard link) holds the directory shared and the name
/// alone ([`locks::name_key`]): such operations run side by side in one directory, each
/// still alone on its name. They change the directory's record only by relative steps
/// (`AdjustDir`: entry and link counts, times), which commute; what reads or rewrites
/// the directory's record as a whole — its removal (whose emptiness check reads the
/// entry count), a rename, a change of its attributes — holds it exclusively and so
/// waits until every such step has been applied.
fn base_locks(op: &NsOp, partitions: u32) -> Vec<u64> {
    let name = |parent: Ino, name: &[u8]| {
        let p = crate::placement::dentry_partition(parent, name, partitions);
        [locks::shared(parent), locks::name_key(p, parent, name)]
    };
    let mut k = match op {
        NsOp::Mknod { parent, name: n, .. }
        | NsOp::Unlink { parent, name: n, .. }
        | NsOp::Rmdir { parent, name: n } => name(*parent, n).to_vec(),
        NsOp::Link {
            ino,
            newparent,
            newname,
            ..
        } => {
            let mut k = name(*newparent, newname).to_vec();
            k.push(ino.0);
            k
        }
        NsOp::Rename { parent, newparent, .. } => vec![parent.0, newparent.0],
        NsOp::SetAttr { ino, .. }
        | NsOp::SetXattr { ino, .. }
        | NsOp::RemoveXattr { ino, .. }
        | NsOp::SetLayout { ino, .. }
        | NsOp::CommitWrite { ino, .. }
        | NsOp::CommitWriteSetAttr { ino, .. }
        | NsOp::ReserveVersions { ino, .. }
        | NsOp::HoldPurge { ino, .. }
        | NsOp::Purged { ino }
        | NsOp::RelocateShards { ino, .. } => vec![ino.0],
    };
    k.sort_unstable();
    k.dedup();
    k
}

/// Locks known only after reading entries: directories being removed or moved (their
/// emptiness and ".." must not change underneath), and the rename lock when a
/// directory moves to another directory (two such moves at once could each pass the
/// check that the target is not inside the directory moved, and make a cycle between
/// them). Files moving between directories do not take it: they cannot make a cycle,
/// and a cluster-wide lock would put every such rename in one queue.
fn extra_locks(op: &NsOp, cache: &Cache) -> Vec<u64> {
    let dir = |e: Option<DentryVal>| e.filter(|d| d.kind == FileKind::Dir).map(|d| d.ino.0);
    match op {
        NsOp::Rmdir { parent, name } => dir(cache.entry(*parent, name)).into_iter().collect(),
        NsOp::Rename {
            parent,
            name,
            newparent,
            newname,
            exchange,
            ..
        } => {
            let moved = dir(cache.entry(*parent, name));
            let replaced = dir(cache.entry(*newparent, newname));
            // An exchange moves the target into the source's directory as well.
            let crosses = parent != newparent && (moved.is_some() || (*exchange && replaced.is_some()));
            crosses
                .then_some(RENAME_LOCK)
                .into_iter()
                .chain(moved)
                .chain(replaced)
                .collect()
        }
        _ => Vec::new(),
    }
}

/// What a caller with a client key must pass besides the checks every operation
/// makes: to reserve versions of a file or commit data to it (and so get a shard
/// capability for it), the file's owner or write permission. A trusted mount's kernel
/// checked write access when the file was opened; a client key's word is not taken
/// for it.
fn client_checks(ns: &Namespace, creds: &Creds, op: &NsOp) -> Result<(), Errno> {
    match op {
        NsOp::ReserveVersions { ino, .. } | NsOp::CommitWrite { ino, .. } | NsOp::CommitWriteSetAttr { ino, .. } => {
            ns.may_write_data(creds, *ino)
        }
        _ => Ok(()),
    }
}

/// Runs `op` on a (sparse) namespace, as client operation `id` when it is one run at
/// most once ([`NsOp::once`]): a retry of one already done is answered as done.
fn run(ns: &mut Namespace, creds: &Creds, op: &NsOp, id: u64, now: i64) -> Result<OpReply, Errno> {
    if id == 0 || !op.once() {
        return run_op(ns, creds, op, now);
    }
    let anchor = op.anchor(ns.partition_count());
    match ns.once(id, anchor, now, |ns| run_op(ns, creds, op, now))? {
        Some(reply) => Ok(reply),
        None => Ok(match op {
            // What a link answers: the inode's attributes (as they are now).
            NsOp::Link { ino, .. } => OpReply::Attr(ns.getattr(*ino)?),
            // A create: the inode it made, if its name still leads there. Without the
            // record a late copy of a create whose name was removed since would make
            // the name again.
            NsOp::Mknod {
                parent, name, token, ..
            } => OpReply::Attr(ns.created(*parent, name, *token)?),
            // An unlink or rmdir: the time it ran, as the first answer gave it.
            NsOp::Unlink { .. } | NsOp::Rmdir { .. } => ns.done_at(anchor, id).map_or(OpReply::Done, OpReply::DoneAt),
            _ => OpReply::Done,
        }),
    }
}

/// Runs `op` on a (sparse) namespace.
fn run_op(ns: &mut Namespace, creds: &Creds, op: &NsOp, now: i64) -> Result<OpReply, Errno> {
    Ok(match op {
        NsOp::Mknod { .. } => return run_mknod(ns, creds, op, now),
        NsOp::Link {
            ino,
            newparent,
            newname,
        } => OpReply::Attr(ns.link(creds, *ino, *newparent, newname, now)?),
        NsOp::Unlink {
            parent,
            name,
            keep_secs,
        } => {
            let keep = (*keep_secs > 0).then(|| now.saturating_add(i64::from(*keep_secs) * 1_000_000_000));
            ns.unlink_keep(creds, *parent, name, now, keep.unwrap_or(0))?;
            OpReply::DoneAt(now)
        }
        NsOp::Rmdir { parent, name } => {
            ns.rmdir(creds, *parent, name, now)?;
            OpReply::DoneAt(now)
        }
        NsOp::Rename {
            parent,
            name,
            newparent,
            newname,
            noreplace,
            exchange,
        } => {
            let flags = NsOp::rename_flags(*noreplace, *exchange);
            ns.rename(creds, *parent, name, *newparent, newname, flags, now)?;
            OpReply::Done
        }
        NsOp::SetAttr { ino, set } => OpReply::Attr(ns.setattr(creds, *ino, set, now)?),
        NsOp::SetXattr { ino, name, value, mode } => {
            ns.setxattr(creds, *ino, name, value, NsOp::xattr_mode(*mode), now)?;
            OpReply::Done
        }
        NsOp::RemoveXattr { ino, name } => {
            ns.removexattr(creds, *ino, name, now)?;
            OpReply::Done
        }
        NsOp::SetLayout { .. }
        | NsOp::CommitWrite { .. }
        | NsOp::CommitWriteSetAttr { .. }
        | NsOp::ReserveVersions { .. } => return run_data_op(ns, creds, op, now),
        NsOp::HoldPurge { .. } | NsOp::Purged { .. } | NsOp::RelocateShards { .. } => {
            return run_service_op(ns, creds, op, now);
        }
    })
}

/// Runs a create (file, directory, node or symlink).
fn run_mknod(ns: &mut Namespace, creds: &Creds, op: &NsOp, now: i64) -> Result<OpReply, Errno> {
    let NsOp::Mknod {
        parent,
        name,
        kind,
        perm,
        rdev,
        target,
        token,
        reserve,
    } = op
    else {
        return Err(Errno::EINVAL);
    };
    let a = ns.mknod_once(
        creds,
        *parent,
        name,
        *kind,
        *perm,
        *rdev,
        target.as_deref(),
        now,
        *token,
        reserve.as_ref().map(|r| (&r.policy, r.count)),
    )?;
    // A file made with versions reserved, still empty (no stripes: its record holds all
    // an open reads), is opened from the reply. One a retry found made before (its
    // token) may have data by now: the creator reads it.
    let policy = if reserve.is_some() && a.size == 0 {
        ns.policy(a.ino)?
    } else {
        None
    };
    Ok(match policy {
        Some(layout) => OpReply::Made(a, layout),
        None => OpReply::Attr(a),
    })
}

/// Runs an operation on a file's layout: its policy, a commit of written stripes,
/// versions reserved for writes.
fn run_data_op(ns: &mut Namespace, creds: &Creds, op: &NsOp, now: i64) -> Result<OpReply, Errno> {
    Ok(match op {
        NsOp::SetLayout { ino, policy } => {
            ns.set_layout(creds, *ino, policy, now)?;
            OpReply::Done
        }
        NsOp::CommitWrite {
            ino,
            policy,
            size,
            stripes,
        } => OpReply::Attr(ns.commit_write(*ino, policy, *size, stripes, now)?),
        NsOp::CommitWriteSetAttr {
            ino,
            policy,
            size,
            stripes,
            set,
        } => {
            if set.size.is_some() {
                return Err(Errno::EINVAL);
            }
            // Refused as a whole when the setattr would be: nothing is committed.
            ns.commit_write(*ino, policy, *size, stripes, now)?;
            OpReply::Attr(ns.setattr(creds, *ino, set, now)?)
        }
        NsOp::ReserveVersions { ino, policy, count } => OpReply::Versions(ns.reserve_versions(*ino, policy, *count)?),
        _ => return Err(Errno::EINVAL),
    })
}

/// Runs an operation only the cluster's own services send (as root): holding and
/// finishing a purge, moving shards.
fn run_service_op(ns: &mut Namespace, creds: &Creds, op: &NsOp, now: i64) -> Result<OpReply, Errno> {
    if creds.uid != 0 {
        return Err(Errno::EPERM);
    }
    match op {
        NsOp::HoldPurge { ino, secs } => ns.hold_purge(*ino, now.saturating_add(i64::from(*secs) * 1_000_000_000))?,
        NsOp::Purged { ino } => ns.purged(*ino)?,
        NsOp::RelocateShards {
            ino,
            stripe,
            version,
            moves,
        } => {
            ns.relocate_shards(*ino, *stripe, *version, moves)?;
        }
        _ => return Err(Errno::EINVAL),
    }
    Ok(OpReply::Done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::SetAttr;

    fn root() -> Creds {
        Creds {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    /// Drives a coordination against a whole in-memory namespace, as a driver would
    /// against the partitions' primaries; returns the steps it took.
    fn drive(c: &mut Coordination, whole: &mut Namespace) -> (Vec<String>, Result<OpReply, Errno>) {
        let mut trace = Vec::new();
        loop {
            match c.step() {
                Next::Lock(keys) => {
                    trace.push(format!("lock {keys:?}"));
                    let dirs = c.quiet_dirs(&keys);
                    if !dirs.is_empty() {
                        trace.push(format!("quiet {dirs:?}"));
                    }
                    c.locked(&keys);
                }
                Next::Fetch(needs) => {
                    trace.push(format!("fetch {}", needs.len()));
                    for n in needs {
                        match n {
                            Need::Inode(ino) => {
                                let rec = whole
                                    .partition(ino.partition())
                                    .and_then(|p| p.inodes.get(&ino).cloned());
                                c.provide_inode(ino, rec);
                            }
                            Need::Dentry(parent, name) => {
                                let p = crate::placement::dentry_partition(parent, &name, whole.partition_count());
                                let val = whole.partition(p).and_then(|p| p.dentry(parent, &name));
                                c.provide_dentry(parent, name, val);
                            }
                            Need::Counter(p) => c.provide_counter(p, 100 + u64::from(p.0)),
                            Need::Stripe(ino, s) => c.provide_stripe(ino, s, None),
                            Need::Done(p, op) => {
                                let rec = whole.partition(p).and_then(|p| p.done.get(&op).copied());
                                c.provide_done(p, op, rec);
                            }
                        }
                    }
                }
                Next::Commit(plans, reply) => {
                    trace.push(format!("commit {}", plans.len()));
                    return (trace, Ok(reply));
                }
                Next::Fail(e) => return (trace, Err(e)),
            }
        }
    }

    fn mknod(parent: Ino, name: &str, kind: FileKind) -> NsOp {
        NsOp::Mknod {
            parent,
            name: name.as_bytes().to_vec(),
            kind,
            perm: 0o755,
            rdev: 0,
            target: None,
            token: 0,
            reserve: None,
        }
    }

    #[test]
    fn a_create_locks_its_directory_before_reading_and_plans_one_change() {
        let mut whole = Namespace::format(8, 1);
        let op = mknod(Ino::ROOT, "a", FileKind::File);
        let mut c = Coordination::new(op, root(), 0, 1, 8);
        let (trace, r) = drive(&mut c, &mut whole);
        let name = locks::name_key(crate::placement::dentry_partition(Ino::ROOT, b"a", 8), Ino::ROOT, b"a");
        let mut keys = vec![locks::shared(Ino::ROOT), name];
        keys.sort_unstable();
        assert_eq!(trace[0], format!("lock {keys:?}"));
        assert!(matches!(r, Ok(OpReply::Attr(_))), "{r:?}");
        assert_eq!(trace.last().map(String::as_str), Some("commit 1"));
        assert_eq!(c.held().collect::<Vec<_>>(), keys);
    }

    #[test]
    #[allow(clippy::too_many_lines)] // a scenario, step by step
    fn a_create_with_versions_answers_the_layout_its_file_takes() {
        let (mut whole, _, policy) = root_file();
        let create = |parent, name: &str| NsOp::Mknod {
            parent,
            name: name.as_bytes().to_vec(),
            kind: FileKind::File,
            perm: 0o644,
            rdev: 0,
            target: None,
            token: 0,
            reserve: Some(super::super::wire::CreateReserve {
                policy: policy.clone(),
                count: 8,
            }),
        };
        // No policy on the directory: the file takes the creator's, versions 1..=8 its.
        let mut c = Coordination::new(create(Ino::ROOT, "a"), root(), 0, 1, 8);
        let Ok(OpReply::Made(a, layout)) = drive(&mut c, &mut whole).1 else {
            panic!("a create with versions answers its layout")
        };
        assert_eq!(a.kind, FileKind::File);
        assert_eq!(
            (layout.k, layout.m, layout.unit, layout.next_version),
            (4, 2, 1 << 20, 9)
        );
        assert!(layout.stripes.is_empty());
        // A directory's policy wins, and is what the creator is told.
        let d = whole
            .mknod(&root(), Ino::ROOT, b"d", FileKind::Dir, 0o755, 0, None, 1)
            .expect("mkdir");
        whole
            .set_layout(&root(), d.ino, &policy_of(2, 1, 1 << 16), 2)
            .expect("directory policy");
        let mut c = Coordination::new(create(d.ino, "b"), root(), 0, 3, 8);
        let Ok(OpReply::Made(_, layout)) = drive(&mut c, &mut whole).1 else {
            panic!("a create with versions answers its layout")
        };
        assert_eq!(
            (layout.k, layout.m, layout.unit, layout.next_version),
            (2, 1, 1 << 16, 9)
        );
        // Without versions, attributes only (the creator reads what it needs).
        let mut c = Coordination::new(mknod(d.ino, "c", FileKind::File), root(), 0, 4, 8);
        assert!(matches!(drive(&mut c, &mut whole).1, Ok(OpReply::Attr(_))));
        // A retry whose token finds the file made, and written meanwhile: attributes
        // only, so the creator reads its stripes.
        let retried = || match create(Ino::ROOT, "t") {
            NsOp::Mknod {
                parent,
                name,
                kind,
                perm,
                rdev,
                target,
                reserve,
                ..
            } => NsOp::Mknod {
                parent,
                name,
                kind,
                perm,
                rdev,
                target,
                token: 77,
                reserve,
            },
            _ => unreachable!("a create"),
        };
        let t = whole
            .mknod_once(
                &root(),
                Ino::ROOT,
                b"t",
                FileKind::File,
                0o644,
                0,
                None,
                5,
                77,
                Some((&policy, 8)),
            )
            .expect("the first attempt");
        let mut c = Coordination::new(retried(), root(), 0, 6, 8);
        assert!(
            matches!(drive(&mut c, &mut whole).1, Ok(OpReply::Made(..))),
            "still empty"
        );
        let grow = crate::namespace::SetAttr {
            size: Some(4096),
            ..Default::default()
        };
        whole.setattr(&root(), t.ino, &grow, 7).expect("written meanwhile");
        let mut c = Coordination::new(retried(), root(), 0, 8, 8);
        let Ok(OpReply::Attr(a)) = drive(&mut c, &mut whole).1 else {
            panic!("a retry that finds data answers attributes only")
        };
        assert_eq!((a.ino, a.size), (t.ino, 4096));
    }

    #[test]
    fn an_rmdir_locks_the_directory_it_removes_once_it_knows_it() {
        let mut whole = Namespace::format(8, 1);
        let d = whole
            .mknod(&root(), Ino::ROOT, b"d", FileKind::Dir, 0o755, 0, None, 1)
            .expect("mkdir in an empty root");
        let op = NsOp::Rmdir {
            parent: Ino::ROOT,
            name: b"d".to_vec(),
        };
        let mut c = Coordination::new(op.clone(), root(), 7, 2, 8);
        let (trace, r) = drive(&mut c, &mut whole);
        assert!(r.is_ok(), "{r:?}");
        assert!(trace.contains(&format!("lock {:?}", vec![d.ino.0])), "{trace:?}");
        let held: Vec<u64> = c.held().collect();
        assert!(held.contains(&d.ino.0) && held.contains(&locks::shared(Ino::ROOT)));
        // It asks for quiet on the directory it removes only, once it holds it: its
        // parent is held shared.
        let quiet: Vec<&String> = trace.iter().filter(|t| t.starts_with("quiet")).collect();
        assert_eq!(quiet, vec![&format!("quiet {:?}", vec![d.ino])], "{trace:?}");
        let intent = Intent {
            id: 3,
            steps: vec![(
                PartitionId(1),
                Mutation::AdjustDir {
                    dir: d.ino,
                    entries: 1,
                    subdirs: 0,
                    time: 1,
                },
            )],
        };
        assert!(adjusts_any(&intent, &[d.ino]));
        assert!(!adjusts_any(&intent, &[Ino::ROOT]));
    }

    /// A rename reads one count only, that of a directory it replaces (which must be
    /// empty): only then does it ask for quiet; an unlink never does.
    #[test]
    fn only_a_rename_that_replaces_a_directory_asks_for_quiet() {
        let mut whole = Namespace::format(8, 1);
        let mk = |whole: &mut Namespace, parent: Ino, name: &[u8], kind: FileKind| {
            whole
                .mknod(&root(), parent, name, kind, 0o755, 0, None, 1)
                .expect("mknod")
        };
        let a = mk(&mut whole, Ino::ROOT, b"a", FileKind::Dir);
        let b = mk(&mut whole, Ino::ROOT, b"b", FileKind::Dir);
        mk(&mut whole, a.ino, b"f", FileKind::File);
        mk(&mut whole, a.ino, b"g", FileKind::File);
        mk(&mut whole, a.ino, b"x", FileKind::Dir);
        let y = mk(&mut whole, b.ino, b"y", FileKind::Dir);
        let rename = |parent: Ino, name: &[u8], newparent: Ino, newname: &[u8]| NsOp::Rename {
            parent,
            name: name.to_vec(),
            newparent,
            newname: newname.to_vec(),
            noreplace: false,
            exchange: false,
        };
        let quiet_of = |whole: &mut Namespace, op: NsOp| {
            let mut c = Coordination::new(op, root(), 0, 3, 8);
            let (trace, r) = drive(&mut c, whole);
            assert!(r.is_ok(), "{r:?} {trace:?}");
            trace.into_iter().filter(|t| t.starts_with("quiet")).collect::<Vec<_>>()
        };
        // (Each runs against the same namespace: `drive` commits nothing.) A file to a
        // new name, over another file, to another directory: no count is read.
        assert!(quiet_of(&mut whole, rename(a.ino, b"f", a.ino, b"f2")).is_empty());
        assert!(quiet_of(&mut whole, rename(a.ino, b"f", a.ino, b"g")).is_empty());
        assert!(quiet_of(&mut whole, rename(a.ino, b"f", b.ino, b"f")).is_empty());
        // A directory moved to a new name elsewhere: its parents' counts change by
        // relative steps, nothing is read.
        assert!(quiet_of(&mut whole, rename(a.ino, b"x", b.ino, b"x")).is_empty());
        // Over an (empty) directory: that directory's count is read.
        assert_eq!(
            quiet_of(&mut whole, rename(a.ino, b"x", b.ino, b"y")),
            vec![format!("quiet {:?}", vec![y.ino])]
        );
        let unlink = NsOp::Unlink {
            parent: a.ino,
            name: b"g".to_vec(),
            keep_secs: 0,
        };
        assert!(quiet_of(&mut whole, unlink).is_empty());
    }

    #[test]
    fn only_directory_counts_follow_the_answer() {
        let adjust = |dir: Ino| PartOp::Apply {
            intent: 9,
            step: 2,
            m: Mutation::AdjustDir {
                dir,
                entries: 1,
                subdirs: 0,
                time: 5,
            },
        };
        let (p1, p2) = (PartitionId(1), PartitionId(2));
        let mut by_part = BTreeMap::new();
        by_part.insert(p1, vec![adjust(Ino::ROOT)]);
        by_part.insert(
            p2,
            vec![
                adjust(Ino::ROOT),
                PartOp::Apply {
                    intent: 9,
                    step: 1,
                    m: Mutation::DelDentry {
                        parent: Ino::ROOT,
                        name: b"x".to_vec(),
                    },
                },
            ],
        );
        let (now, later) = answer_before(by_part);
        assert_eq!(now.keys().collect::<Vec<_>>(), vec![&p2]);
        assert_eq!(later.keys().collect::<Vec<_>>(), vec![&p1]);
        let expected = expected_counts(&later);
        assert_eq!(expected.len(), 1);
        let (p, e) = &expected[0];
        assert_eq!((*p, e.intent, e.step, e.dir, e.entries), (p1, 9, 2, Ino::ROOT, 1));
        let whole = Namespace::format(8, 1);
        let before = whole.getattr(Ino::ROOT).expect("root");
        let after = with_expected(before.clone(), [e, e]);
        assert_eq!(after.size, before.size + 2);
        assert_eq!(after.nlink, before.nlink);
        assert_eq!(after.mtime, 5.max(before.mtime));
    }

    #[test]
    fn a_failing_operation_plans_nothing() {
        let mut whole = Namespace::format(8, 1);
        let op = NsOp::Unlink {
            parent: Ino::ROOT,
            name: b"missing".to_vec(),
            keep_secs: 0,
        };
        let mut c = Coordination::new(op, root(), 9, 2, 8);
        assert_eq!(drive(&mut c, &mut whole).1, Err(Errno::ENOENT));
    }

    /// A namespace with one file of root's, `/f`, and a 4+2 policy to write it with.
    fn root_file() -> (Namespace, Attr, crate::namespace::Layout) {
        let mut whole = Namespace::format(8, 1);
        let f = whole
            .mknod(&root(), Ino::ROOT, b"f", FileKind::File, 0o644, 0, None, 1)
            .expect("root's file");
        (whole, f, policy_of(4, 2, 1 << 20))
    }

    /// An erasure-coding policy (no stripes).
    fn policy_of(k: u8, m: u8, unit: u32) -> crate::namespace::Layout {
        crate::namespace::Layout {
            k,
            m,
            unit,
            ..Default::default()
        }
    }

    #[test]
    fn a_client_key_reserves_versions_only_of_files_it_owns_or_may_write() {
        let (mut whole, f, policy) = root_file();
        let user = |uid| Creds {
            uid,
            gid: uid,
            groups: Vec::new(),
        };
        let reserve = || NsOp::ReserveVersions {
            ino: f.ino,
            policy: policy.clone(),
            count: 4,
        };
        // A trusted mount's kernel checked the open: its word is taken.
        let mut c = Coordination::new(reserve(), user(1000), 0, 2, 8);
        assert!(matches!(drive(&mut c, &mut whole).1, Ok(OpReply::Versions(_))));
        // A client key's is not: not the owner, no write permission.
        let mut c = Coordination::new(reserve(), user(1000), 0, 3, 8).for_client();
        assert_eq!(drive(&mut c, &mut whole).1, Err(Errno::EACCES));
        let commit = NsOp::CommitWrite {
            ino: f.ino,
            policy: policy.clone(),
            size: 1,
            stripes: Vec::new(),
        };
        let mut c = Coordination::new(commit, user(1000), 0, 3, 8).for_client();
        assert_eq!(drive(&mut c, &mut whole).1, Err(Errno::EACCES));
        // The owner, even of a file it made read-only, and root, pass.
        let mut c = Coordination::new(reserve(), root(), 0, 4, 8).for_client();
        assert!(matches!(drive(&mut c, &mut whole).1, Ok(OpReply::Versions(_))));
        let d = whole
            .mknod(&root(), Ino::ROOT, b"d", FileKind::Dir, 0o777, 0, None, 5)
            .expect("a shared directory");
        let mine = whole
            .mknod(&user(1000), d.ino, b"g", FileKind::File, 0o444, 0, None, 6)
            .expect("a read-only file of its own");
        let op = NsOp::ReserveVersions {
            ino: mine.ino,
            policy,
            count: 4,
        };
        let mut c = Coordination::new(op, user(1000), 0, 7, 8).for_client();
        assert!(matches!(drive(&mut c, &mut whole).1, Ok(OpReply::Versions(_))));
    }

    /// A commit of written data and a setattr of the same file are one batch, applied
    /// in that order (the setattr's times win over the commit's); a setattr the caller
    /// may not make refuses the whole, and nothing is committed.
    #[test]
    fn a_commit_and_a_setattr_are_one_batch_or_nothing() {
        let (mut whole, f, policy) = root_file();
        let when: crate::namespace::TimeNs = 1_600_000_000_000_000_000;
        let op = |set: SetAttr| NsOp::CommitWriteSetAttr {
            ino: f.ino,
            policy: policy.clone(),
            size: 10,
            stripes: Vec::new(),
            set,
        };
        let times = SetAttr {
            mtime: Some(when),
            ..Default::default()
        };
        let mut c = Coordination::new(op(times), root(), 0, 2, 8);
        let (trace, r) = drive(&mut c, &mut whole);
        let Ok(OpReply::Attr(a)) = r else { panic!("{r:?}") };
        assert_eq!((a.size, a.mtime), (10, when), "committed, then the times set");
        assert_eq!(trace.last().map(String::as_str), Some("commit 1"), "{trace:?}");
        let user = Creds {
            uid: 1000,
            gid: 1000,
            groups: Vec::new(),
        };
        let chmod = SetAttr {
            perm: Some(0o600),
            ..Default::default()
        };
        let mut c = Coordination::new(op(chmod), user, 0, 3, 8);
        assert_eq!(drive(&mut c, &mut whole).1, Err(Errno::EPERM), "not the owner");
        let truncate = SetAttr {
            size: Some(0),
            ..Default::default()
        };
        let mut c = Coordination::new(op(truncate), root(), 0, 4, 8);
        assert_eq!(
            drive(&mut c, &mut whole).1,
            Err(Errno::EINVAL),
            "a size change has its own path"
        );
    }

    #[test]
    fn plans_become_one_batch_or_an_intent() {
        let p = PartitionId(3);
        let m = Mutation::DelDentry {
            parent: Ino::ROOT,
            name: b"x".to_vec(),
        };
        let one: Plan = (p, vec![(p, m.clone())]);
        assert_eq!(plan_run(&one), PlanRun::Batch { p, relative: false });
        let two: Plan = (p, vec![(p, m.clone()), (PartitionId(5), m.clone())]);
        assert_eq!(plan_run(&two), PlanRun::Intent { coord: p });
        let intent = Intent {
            id: 42,
            steps: two.1.clone(),
        };
        let (first, others) = intent_ops(p, &intent, true);
        assert!(matches!(first[0], PartOp::Begin(_)));
        assert_eq!(first.len(), 2);
        assert_eq!(others.keys().copied().collect::<Vec<_>>(), vec![PartitionId(5)]);
        let (again, _) = intent_ops(p, &intent, false);
        assert_eq!(again.len(), 1, "a redo does not record the intent again");
        // Consecutive plans of one partition are one batch; a plan of another
        // partition, or an intent, keeps its place.
        use crate::namespace::engine::merge_single_partition_plans as merge;
        let q = PartitionId(4);
        let other: Plan = (q, vec![(q, m.clone())]);
        let merged = merge(vec![
            one.clone(),
            one.clone(),
            other.clone(),
            two.clone(),
            one.clone(),
            one.clone(),
        ]);
        let shape: Vec<(PartitionId, usize)> = merged.iter().map(|(c, s)| (*c, s.len())).collect();
        assert_eq!(shape, vec![(p, 2), (q, 1), (p, 2), (p, 2)]);
        assert_eq!(plan_run(&merged[0]), PlanRun::Batch { p, relative: false });
        assert_eq!(plan_run(&merged[2]), PlanRun::Intent { coord: p });
    }
}
