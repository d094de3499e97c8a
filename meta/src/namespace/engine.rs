//! POSIX namespace operations over hashed partitions.
//!
//! Each operation reads what it needs from the partitions involved (the entry's
//! partition `hash(parent, name)`, the parent's inode partition, the target's inode
//! partition), checks POSIX rules and permissions, and turns into a list of
//! [`Mutation`]s on one or more partitions. A single-partition operation applies its
//! mutations directly. A multi-partition one first records an [`Intent`] holding every
//! step in the partition of its first entry (the coordinator), applies the steps in
//! order, and then drops the intent. After a crash, [`Namespace::recover`] redoes every
//! pending intent: every step of an intent is applied at most once (a marker per step,
//! so a redone absolute step cannot undo what later operations wrote, nor a relative
//! one count twice), so an operation is either fully applied or (if its intent was never
//! recorded) not at all — a rename is never half done.
//!
//! This is the pure core: partitions live in memory here, with no clock (callers pass
//! `now`) and no I/O. The service persists each partition's mutations and replicates
//! them; it must run the operations that touch a key one at a time (per-key locks in a
//! fixed order), which this single-threaded core takes for granted.

use super::acl;
use super::partition::{DentryVal, DoneOp, InodeRec, Intent, Mutation, Partition};
use super::perm::{self, R, W, X};
use super::types::*;
use crate::ids::{Ino, PartitionId};
use crate::placement::dentry_partition;
use std::collections::BTreeMap;

/// What refuses a create once its directory allows it: a directory with `LINK_MAX`
/// subdirectories, an empty or overlong symlink target, a device made by anyone but
/// root.
fn refuse_mknod(creds: &Creds, dir: &Attr, kind: FileKind, target: Option<&[u8]>) -> NsResult<()> {
    if kind == FileKind::Dir && dir.nlink >= LINK_MAX {
        return Err(Errno::EMLINK);
    }
    if let Some(t) = target {
        if t.is_empty() {
            return Err(Errno::ENOENT);
        }
        if t.len() >= PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
    }
    if matches!(kind, FileKind::CharDev | FileKind::BlockDev) && creds.uid != 0 {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// A new file's or directory's layout: its directory's policy (or the one `reserve`
/// names), with versions reserved for the creator's first writes.
fn new_layout(dir: Option<&Layout>, kind: FileKind, reserve: Option<(&Layout, u32)>) -> Option<Layout> {
    let mut layout = match kind {
        FileKind::File | FileKind::Dir => dir.map(Layout::without_stripes),
        _ => None,
    };
    if let Some((policy, count)) = reserve {
        let l = layout.get_or_insert_with(|| policy.without_stripes());
        l.next_version = 1 + u64::from(count);
    }
    layout
}

/// The steps of a create of `parent/name`: the inode and its name in the name's
/// partition `dp`, the directory's counts in its own.
fn create_steps(dp: PartitionId, rec: InodeRec, parent: Ino, name: &[u8], now: TimeNs) -> Vec<(PartitionId, Mutation)> {
    let (ino, kind) = (rec.attr.ino, rec.attr.kind);
    vec![
        (dp, Mutation::PutInode(Box::new(rec))),
        (
            dp,
            Mutation::PutDentry {
                parent,
                name: name.to_vec(),
                val: DentryVal { ino, kind },
            },
        ),
        (
            parent.partition(),
            Mutation::AdjustDir {
                dir: parent,
                entries: 1,
                subdirs: i64::from(kind == FileKind::Dir),
                time: now,
            },
        ),
    ]
}

/// `dir`'s parent is now `parent` (a directory's "..", any other inode's home: where
/// it was made or last moved to, which subtree grants go by), changed now.
fn reparent(dir: Ino, parent: Ino, now: TimeNs) -> (PartitionId, Mutation) {
    (dir.partition(), Mutation::SetParent { dir, parent, time: now })
}

/// A rename's two names and where their entries live.
struct Move<'a> {
    parent: Ino,
    name: &'a [u8],
    newparent: Ino,
    newname: &'a [u8],
    /// The entry being moved.
    src: DentryVal,
    /// The partitions of the source's and of the target's entry.
    sdp: PartitionId,
    ddp: PartitionId,
    now: TimeNs,
}

impl Move<'_> {
    /// The target name now names `val`.
    fn put_dst(&self, val: DentryVal) -> (PartitionId, Mutation) {
        (
            self.ddp,
            Mutation::PutDentry {
                parent: self.newparent,
                name: self.newname.to_vec(),
                val,
            },
        )
    }

    /// The source name is gone.
    fn del_src(&self) -> (PartitionId, Mutation) {
        (
            self.sdp,
            Mutation::DelDentry {
                parent: self.parent,
                name: self.name.to_vec(),
            },
        )
    }

    /// Directory `dir` gains `entries` entries and `subdirs` subdirectories (either
    /// negative), touched now.
    fn adjust(&self, dir: Ino, entries: i64, subdirs: i64) -> (PartitionId, Mutation) {
        (
            dir.partition(),
            Mutation::AdjustDir {
                dir,
                entries,
                subdirs,
                time: self.now,
            },
        )
    }
}

/// `rename` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with EEXIST if the target exists.
    pub noreplace: bool,
    /// Atomically swap source and target (both must exist).
    pub exchange: bool,
}

/// `setxattr` mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    Any,
    /// Fail with EEXIST if present.
    Create,
    /// Fail with ENODATA if absent.
    Replace,
}

/// Most stripe versions a create hands its creator (`mknod_once`'s `reserve`).
pub const MAX_CREATE_RESERVE: u32 = 1024;

/// Largest extended attribute value.
pub const XATTR_SIZE_MAX: usize = 65_536;
/// Most bytes of extended attributes (names and values) one inode holds.
pub const XATTR_TOTAL_MAX: usize = 256 << 10;

/// A namespace of `P` partitions, held in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    parts: Vec<Partition>,
    /// Crash injection for tests: stop after this many more applied steps.
    crash_after_steps: Option<usize>,
    /// Present in a sparse view (see [`Namespace::sparse`]).
    sparse: Option<Box<Sparse>>,
    /// The client operation being run by [`Namespace::once`]: (id, anchor, time).
    op: Option<(u64, PartitionId, TimeNs)>,
}

/// A record a sparse view lacks: the coordinator fetches it and runs the operation again.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// An inode (from the primary of `ino.partition()`).
    Inode(Ino),
    /// A directory entry (from the primary of its hashed partition).
    Dentry(Ino, Vec<u8>),
    /// A fresh inode counter of a partition (allocated by its primary).
    Counter(PartitionId),
    /// A stripe record of a file (from the primary of `ino.partition()`).
    Stripe(Ino, u64),
    /// Whether client operation (id) is recorded as done in a partition.
    Done(PartitionId, u64),
}

/// The changes one operation makes: `(coordinator, steps)`, executed like
/// [`Namespace`] does in memory (one batch when every step is in the coordinator's
/// partition, through an intent otherwise).
pub type Plan = (PartitionId, Vec<(PartitionId, Mutation)>);

/// Consecutive plans whose steps all fall in one and the same partition become one
/// plan: one atomic batch instead of several in a row (an operation made of two
/// changes of one inode, [`crate::service::wire::NsOp::CommitWriteSetAttr`], costs
/// one replicated commit). Applying them together is what applying them one after the
/// other would give, without the moment between.
pub fn merge_single_partition_plans(plans: Vec<Plan>) -> Vec<Plan> {
    let single = |(coord, steps): &Plan| steps.iter().all(|(p, _)| p == coord);
    let mut out: Vec<Plan> = Vec::with_capacity(plans.len());
    for plan in plans {
        match out.last_mut() {
            Some(last) if single(last) && single(&plan) && last.0 == plan.0 => last.1.extend(plan.1),
            _ => out.push(plan),
        }
    }
    out
}

/// What a sparse view holds and what it found missing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Sparse {
    inodes: std::collections::BTreeSet<Ino>,
    dentries: std::collections::BTreeSet<(Ino, Vec<u8>)>,
    counters: std::collections::BTreeSet<PartitionId>,
    stripes: std::collections::BTreeSet<(Ino, u64)>,
    done: std::collections::BTreeSet<(PartitionId, u64)>,
    needs: std::cell::RefCell<std::collections::BTreeSet<Need>>,
    plans: Vec<Plan>,
}

/// The "crashed" outcome of an injected crash.
pub const CRASHED: Errno = Errno::EIO;

impl Namespace {
    /// A new namespace with `partitions` partitions and a root directory owned by root
    /// with mode 0755.
    pub fn format(partitions: u32, now: TimeNs) -> Self {
        let mut parts: Vec<Partition> = (0..partitions.max(1)).map(|p| Partition::new(PartitionId(p))).collect();
        let root_ino = parts[0].alloc_ino().unwrap_or(Ino::ROOT);
        debug_assert_eq!(root_ino, Ino::ROOT);
        let root = InodeRec {
            attr: Attr {
                ino: Ino::ROOT,
                kind: FileKind::Dir,
                perm: 0o755,
                uid: 0,
                gid: 0,
                nlink: 2,
                size: 0,
                rdev: 0,
                atime: now,
                mtime: now,
                ctime: now,
                crtime: now,
            },
            target: None,
            parent: Some(Ino::ROOT),
            xattrs: BTreeMap::new(),
            layout: None,
            created_by: 0,
        };
        parts[0].apply(0, 0, &Mutation::PutInode(Box::new(root)));
        Namespace {
            parts,
            crash_after_steps: None,
            sparse: None,
            op: None,
        }
    }

    /// An empty *sparse view* of a namespace of `partitions` partitions, for a coordinator
    /// that holds only some records locally.
    ///
    /// The caller provides the records it has fetched ([`Namespace::provide_inode`],
    /// [`Namespace::provide_dentry`], [`Namespace::provide_counter`]) and runs an operation.
    /// Reading a record that was not provided records a [`Need`] and fails the operation;
    /// the caller fetches what [`Namespace::needs`] lists and runs it again on a new view.
    /// When nothing is missing, the operation's result is final and [`Namespace::take_plans`]
    /// returns the mutations to execute on the real partitions (in a sparse view they are
    /// only applied to the view itself, so a result such as the new attributes is right).
    pub fn sparse(partitions: u32) -> Self {
        Namespace {
            parts: (0..partitions.max(1)).map(|p| Partition::new(PartitionId(p))).collect(),
            crash_after_steps: None,
            sparse: Some(Box::default()),
            op: None,
        }
    }

    /// Sparse view: gives an inode's record (`None`: known absent).
    pub fn provide_inode(&mut self, ino: Ino, rec: Option<InodeRec>) {
        if let Some(s) = self.sparse.as_mut() {
            s.inodes.insert(ino);
        }
        if let (Some(rec), Some(p)) = (rec, self.parts.get_mut(ino.partition().0 as usize)) {
            p.inodes.insert(ino, rec);
        }
    }

    /// Sparse view: gives a directory entry (`None`: known absent).
    pub fn provide_dentry(&mut self, parent: Ino, name: &[u8], val: Option<DentryVal>) {
        if let Some(s) = self.sparse.as_mut() {
            s.dentries.insert((parent, name.to_vec()));
        }
        let dp = self.dpart(parent, name);
        if let (Some(val), Some(p)) = (val, self.parts.get_mut(dp.0 as usize)) {
            p.dentries.insert((parent, name.to_vec()), val);
        }
    }

    /// Sparse view: gives a fresh inode counter of partition `p` (allocated by its primary).
    pub fn provide_counter(&mut self, p: PartitionId, counter: u64) {
        if let Some(s) = self.sparse.as_mut() {
            s.counters.insert(p);
        }
        if let Some(part) = self.parts.get_mut(p.0 as usize) {
            part.set_next_counter(counter);
        }
    }

    /// Sparse view: gives a stripe record of a file (`None`: known absent).
    pub fn provide_stripe(&mut self, ino: Ino, stripe: u64, rec: Option<StripeRec>) {
        if let Some(s) = self.sparse.as_mut() {
            s.stripes.insert((ino, stripe));
        }
        if let (Some(rec), Some(p)) = (rec, self.parts.get_mut(ino.partition().0 as usize)) {
            p.stripes.insert((ino, stripe), rec);
        }
    }

    /// Sparse view: gives whether client operation `op` is recorded as done in
    /// partition `p` (its anchor).
    pub fn provide_done(&mut self, p: PartitionId, op: u64, rec: Option<DoneOp>) {
        if let Some(s) = self.sparse.as_mut() {
            s.done.insert((p, op));
        }
        if let (Some(rec), Some(part)) = (rec, self.parts.get_mut(p.0 as usize)) {
            part.put_done(op, rec);
        }
    }

    /// Runs client operation `op` (`f` does it) at most once, however often it is
    /// retried: when its anchor partition records it as done, answers `Ok(None)`
    /// without running `f`; otherwise runs `f`, and every batch or intent `f` makes
    /// also records `op` as done in `anchor`, with its other steps, so the record is
    /// durable exactly when the operation is (best one of the partitions `f` changes:
    /// a one-partition batch elsewhere would become an intent).
    ///
    /// This is what makes a retry after a lost answer (its coordinator died; the next
    /// primary finished the operation from its intent) succeed instead of seeing its
    /// own effect as an error (`ENOENT` for an unlink, `EEXIST` for a link). `op == 0`
    /// runs `f` unprotected. The anchor must be the partition the caller checks first
    /// on every try: the partition of the entry the operation creates or removes.
    pub fn once<T>(
        &mut self,
        op: u64,
        anchor: PartitionId,
        at: TimeNs,
        f: impl FnOnce(&mut Self) -> NsResult<T>,
    ) -> NsResult<Option<T>> {
        if op == 0 {
            return f(self).map(Some);
        }
        if let Some(s) = &self.sparse
            && !s.done.contains(&(anchor, op))
        {
            self.need(Need::Done(anchor, op));
            return Err(Errno::EAGAIN);
        }
        if self.part(anchor)?.done.contains_key(&op) {
            return Ok(None);
        }
        self.op = Some((op, anchor, at));
        let r = f(self);
        self.op = None;
        r.map(Some)
    }

    /// When client operation `op`, recorded as done in partition `anchor`, ran.
    pub fn done_at(&self, anchor: PartitionId, op: u64) -> Option<TimeNs> {
        self.part(anchor).ok()?.done.get(&op).map(|d| d.at)
    }

    /// Sparse view: the records the last operation lacked.
    pub fn needs(&self) -> Vec<Need> {
        self.sparse
            .as_ref()
            .map(|s| s.needs.borrow().iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Sparse view: the mutations of the operations run so far.
    pub fn take_plans(&mut self) -> Vec<Plan> {
        let plans = self
            .sparse
            .as_mut()
            .map(|s| std::mem::take(&mut s.plans))
            .unwrap_or_default();
        merge_single_partition_plans(plans)
    }

    fn need(&self, n: Need) {
        if let Some(s) = &self.sparse {
            s.needs.borrow_mut().insert(n);
        }
    }

    /// Number of partitions.
    pub fn partition_count(&self) -> u32 {
        self.parts.len() as u32
    }

    /// One partition's state.
    pub fn partition(&self, p: PartitionId) -> Option<&Partition> {
        self.parts.get(p.0 as usize)
    }

    /// Tests: the next multi-step operation "crashes" after `steps` applied steps.
    pub fn crash_after(&mut self, steps: usize) {
        self.crash_after_steps = Some(steps);
    }

    /// Tests: cancels an injected crash that did not fire.
    pub fn clear_crash(&mut self) {
        self.crash_after_steps = None;
    }

    fn dpart(&self, parent: Ino, name: &[u8]) -> PartitionId {
        dentry_partition(parent, name, self.partition_count())
    }

    fn part(&self, p: PartitionId) -> NsResult<&Partition> {
        self.parts.get(p.0 as usize).ok_or(Errno::ESTALE)
    }

    fn rec(&self, ino: Ino) -> NsResult<&InodeRec> {
        if let Some(s) = &self.sparse
            && !s.inodes.contains(&ino)
        {
            self.need(Need::Inode(ino));
            return Err(Errno::EAGAIN);
        }
        self.part(ino.partition())?.inodes.get(&ino).ok_or(Errno::ENOENT)
    }

    /// The committed record of stripe `stripe` of file `ino` (`None`: not written).
    fn stripe(&self, ino: Ino, stripe: u64) -> NsResult<Option<&StripeRec>> {
        if let Some(s) = &self.sparse
            && !s.stripes.contains(&(ino, stripe))
        {
            self.need(Need::Stripe(ino, stripe));
            return Err(Errno::EAGAIN);
        }
        Ok(self.part(ino.partition())?.stripes.get(&(ino, stripe)))
    }

    fn alloc_ino(&mut self, p: PartitionId) -> NsResult<Ino> {
        if let Some(s) = &self.sparse
            && !s.counters.contains(&p)
        {
            self.need(Need::Counter(p));
            return Err(Errno::EAGAIN);
        }
        self.parts
            .get_mut(p.0 as usize)
            .ok_or(Errno::ESTALE)?
            .alloc_ino()
            .ok_or(Errno::ENOSPC)
    }

    /// Attributes of an inode.
    pub fn getattr(&self, ino: Ino) -> NsResult<Attr> {
        Ok(self.rec(ino)?.attr.clone())
    }

    fn dir_for(&self, creds: &Creds, dir: Ino, mask: u32) -> NsResult<&InodeRec> {
        let d = self.rec(dir)?;
        if d.attr.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        perm::check(creds, &d.attr, mask)?;
        Ok(d)
    }

    fn entry(&self, parent: Ino, name: &[u8]) -> Option<DentryVal> {
        if let Some(s) = &self.sparse
            && !s.dentries.contains(&(parent, name.to_vec()))
        {
            self.need(Need::Dentry(parent, name.to_vec()));
            return None;
        }
        self.parts
            .get(self.dpart(parent, name).0 as usize)
            .and_then(|p| p.dentry(parent, name))
    }

    /// Looks `name` up in `parent`: one partition for the entry, attributes from the
    /// inode's partition (the same one unless the inode is a hard link made elsewhere).
    pub fn lookup(&self, creds: &Creds, parent: Ino, name: &[u8]) -> NsResult<Attr> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let p = self.dir_for(creds, parent, X)?;
        if name == b"." {
            return Ok(p.attr.clone());
        }
        if name == b".." {
            return self.getattr(p.parent.unwrap_or(Ino::ROOT));
        }
        let e = self.entry(parent, name).ok_or(Errno::ENOENT)?;
        self.getattr(e.ino)
    }

    /// Reads a symlink.
    pub fn readlink(&self, ino: Ino) -> NsResult<Vec<u8>> {
        let r = self.rec(ino)?;
        r.target.clone().ok_or(Errno::EINVAL)
    }

    /// Applies `steps`: directly when they touch one partition, through an intent
    /// recorded in `coord` otherwise.
    fn execute(&mut self, coord: PartitionId, mut steps: Vec<(PartitionId, Mutation)>) -> NsResult<()> {
        if let Some((op, anchor, at)) = self.op {
            steps.push((anchor, Mutation::Done { op, at }));
        }
        if self.sparse.is_some() {
            if !self.needs().is_empty() {
                return Err(Errno::EAGAIN);
            }
            for (p, m) in &steps {
                self.parts[p.0 as usize].apply(0, 0, m);
            }
            if let Some(s) = self.sparse.as_mut() {
                s.plans.push((coord, steps));
            }
            return Ok(());
        }
        let single = steps.iter().all(|(p, _)| *p == coord);
        if single {
            // One partition applies its steps in one transaction: all or nothing.
            if let Some(left) = self.crash_after_steps.as_mut() {
                if *left == 0 {
                    self.crash_after_steps = None;
                    return Err(CRASHED);
                }
                *left -= 1;
            }
            for (i, (p, m)) in steps.iter().enumerate() {
                self.parts[p.0 as usize].apply(0, i as u16, m);
            }
            return Ok(());
        }
        let id = self.parts[coord.0 as usize].begin_intent(steps.clone());
        for (i, (p, m)) in steps.iter().enumerate() {
            if let Some(left) = self.crash_after_steps.as_mut() {
                if *left == 0 {
                    self.crash_after_steps = None;
                    return Err(CRASHED);
                }
                *left -= 1;
            }
            self.parts[p.0 as usize].apply(id, i as u16, m);
        }
        self.finish(coord, id, &steps);
        Ok(())
    }

    fn finish(&mut self, coord: PartitionId, id: u64, steps: &[(PartitionId, Mutation)]) {
        self.parts[coord.0 as usize].finish_intent(id);
        for (p, _) in steps {
            self.parts[p.0 as usize].forget_intent(id);
        }
    }

    /// Redoes every pending intent (after a crash). Returns how many were redone.
    pub fn recover(&mut self) -> usize {
        self.crash_after_steps = None;
        let pending: Vec<(PartitionId, Intent)> = self
            .parts
            .iter()
            .flat_map(|p| p.intents.values().map(move |i| (p.id, i.clone())))
            .collect();
        for (coord, Intent { id, steps }) in &pending {
            for (i, (p, m)) in steps.iter().enumerate() {
                self.parts[p.0 as usize].apply(*id, i as u16, m);
            }
            self.finish(*coord, *id, steps);
        }
        pending.len()
    }

    /// Creates a node of any kind (regular file, directory, symlink, fifo, socket,
    /// device) named `name` in `parent`.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &mut self,
        creds: &Creds,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        rdev: u64,
        target: Option<&[u8]>,
        now: TimeNs,
    ) -> NsResult<Attr> {
        self.mknod_once(creds, parent, name, kind, perm, rdev, target, now, 0, None)
    }

    /// The attributes of the inode a create with `token` made, if `parent`/`name` still
    /// names it (`ENOENT` otherwise): what a retried create answers once the create is
    /// recorded as done.
    pub fn created(&self, parent: Ino, name: &[u8], token: u64) -> NsResult<Attr> {
        let e = self.entry(parent, name).ok_or(Errno::ENOENT)?;
        let r = self.rec(e.ino)?;
        if token == 0 || r.created_by != token {
            return Err(Errno::ENOENT);
        }
        Ok(r.attr.clone())
    }

    /// [`Namespace::mknod`] that is exactly-once under retries: the new inode records
    /// `token` (non-zero, unique per create), and a retry whose first attempt did create
    /// the entry (its coordinator failed before answering, and the create was redone)
    /// returns that inode's attributes instead of `EEXIST`.
    ///
    /// `reserve` (a regular file only): `(policy, count)` hands the creator stripe
    /// versions `1..=count` with the create — the file takes its directory's policy, or
    /// `policy` when the directory has none — so its first stores need no
    /// [`Namespace::reserve_versions`]. Later reservations start above them.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod_once(
        &mut self,
        creds: &Creds,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        rdev: u64,
        target: Option<&[u8]>,
        now: TimeNs,
        token: u64,
        reserve: Option<(&Layout, u32)>,
    ) -> NsResult<Attr> {
        check_name(name)?;
        if let Some((policy, count)) = reserve
            && (kind != FileKind::File || !(1..=MAX_CREATE_RESERVE).contains(&count) || !policy.policy_is_valid())
        {
            return Err(Errno::EINVAL);
        }
        let p = self.dir_for(creds, parent, W | X)?;
        if let Some(e) = self.entry(parent, name) {
            return self.made_before(e.ino, token, kind);
        }
        refuse_mknod(creds, &p.attr, kind, target)?;
        let (gid, perm) = perm::new_owner(
            creds,
            &p.attr,
            kind,
            if kind == FileKind::Symlink { 0o777 } else { perm },
        );
        let layout = new_layout(p.layout.as_ref(), kind, reserve);
        let dp = self.dpart(parent, name);
        let ino = self.alloc_ino(dp)?;
        let attr = Attr {
            ino,
            kind,
            perm,
            uid: creds.uid,
            gid,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            size: target.map_or(0, |t| t.len() as u64),
            rdev: if matches!(kind, FileKind::CharDev | FileKind::BlockDev) {
                rdev
            } else {
                0
            },
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        };
        let rec = InodeRec {
            attr: attr.clone(),
            target: target.map(<[u8]>::to_vec),
            parent: Some(parent),
            xattrs: BTreeMap::new(),
            layout,
            created_by: token,
        };
        self.execute(dp, create_steps(dp, rec, parent, name, now))?;
        Ok(attr)
    }

    /// A create found its name taken: the record, when this very create made it before
    /// (a retry, by its `token`), else `EEXIST`.
    fn made_before(&self, ino: Ino, token: u64, kind: FileKind) -> NsResult<Attr> {
        if token != 0 {
            let r = self.rec(ino)?;
            if r.created_by == token && r.attr.kind == kind {
                return Ok(r.attr.clone());
            }
        }
        Err(Errno::EEXIST)
    }

    /// Creates a hard link `newparent/newname` to `ino`.
    pub fn link(&mut self, creds: &Creds, ino: Ino, newparent: Ino, newname: &[u8], now: TimeNs) -> NsResult<Attr> {
        check_name(newname)?;
        let target = self.rec(ino)?.attr.clone();
        if target.kind == FileKind::Dir {
            return Err(Errno::EPERM);
        }
        self.dir_for(creds, newparent, W | X)?;
        if self.entry(newparent, newname).is_some() {
            return Err(Errno::EEXIST);
        }
        if target.nlink >= LINK_MAX {
            return Err(Errno::EMLINK);
        }
        let dp = self.dpart(newparent, newname);
        self.execute(
            dp,
            vec![
                (
                    dp,
                    Mutation::PutDentry {
                        parent: newparent,
                        name: newname.to_vec(),
                        val: DentryVal { ino, kind: target.kind },
                    },
                ),
                (
                    ino.partition(),
                    Mutation::AdjustLinks {
                        ino,
                        delta: 1,
                        time: now,
                    },
                ),
                (
                    newparent.partition(),
                    Mutation::AdjustDir {
                        dir: newparent,
                        entries: 1,
                        subdirs: 0,
                        time: now,
                    },
                ),
            ],
        )?;
        self.getattr(ino)
    }

    /// Removes a non-directory entry.
    pub fn unlink(&mut self, creds: &Creds, parent: Ino, name: &[u8], now: TimeNs) -> NsResult<()> {
        self.unlink_keep(creds, parent, name, now, 0)
    }

    /// [`Namespace::unlink`]; when this removes a regular file's last link and
    /// `keep_until` is set, its data is held until then in the same operation (the
    /// caller has it open), so no purge can run in between.
    pub fn unlink_keep(
        &mut self,
        creds: &Creds,
        parent: Ino,
        name: &[u8],
        now: TimeNs,
        keep_until: TimeNs,
    ) -> NsResult<()> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let p = self.dir_for(creds, parent, X)?.attr.clone();
        let e = self.entry(parent, name).ok_or(Errno::ENOENT)?;
        let victim = self.getattr(e.ino)?;
        if victim.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        perm::check_delete(creds, &p, &victim)?;
        let dp = self.dpart(parent, name);
        let mut steps = vec![
            (
                dp,
                Mutation::DelDentry {
                    parent,
                    name: name.to_vec(),
                },
            ),
            (
                e.ino.partition(),
                Mutation::AdjustLinks {
                    ino: e.ino,
                    delta: -1,
                    time: now,
                },
            ),
        ];
        if keep_until > 0 && victim.kind == FileKind::File {
            steps.push((
                e.ino.partition(),
                Mutation::HoldPurge {
                    ino: e.ino,
                    until: keep_until,
                },
            ));
        }
        steps.push((
            parent.partition(),
            Mutation::AdjustDir {
                dir: parent,
                entries: -1,
                subdirs: 0,
                time: now,
            },
        ));
        self.execute(dp, steps)
    }

    /// Removes an empty directory.
    pub fn rmdir(&mut self, creds: &Creds, parent: Ino, name: &[u8], now: TimeNs) -> NsResult<()> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let p = self.dir_for(creds, parent, X)?.attr.clone();
        if name == b"." {
            return Err(Errno::EINVAL);
        }
        if name == b".." {
            return Err(Errno::ENOTEMPTY);
        }
        let e = self.entry(parent, name).ok_or(Errno::ENOENT)?;
        let victim = self.getattr(e.ino)?;
        if victim.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        perm::check_delete(creds, &p, &victim)?;
        if victim.size != 0 {
            return Err(Errno::ENOTEMPTY);
        }
        let dp = self.dpart(parent, name);
        self.execute(
            dp,
            vec![
                (
                    dp,
                    Mutation::DelDentry {
                        parent,
                        name: name.to_vec(),
                    },
                ),
                (e.ino.partition(), Mutation::DelInode(e.ino)),
                (
                    parent.partition(),
                    Mutation::AdjustDir {
                        dir: parent,
                        entries: -1,
                        subdirs: -1,
                        time: now,
                    },
                ),
            ],
        )
    }

    /// Is `dir` equal to or below `ancestor`? Walks parent pointers to the root.
    fn is_within(&self, dir: Ino, ancestor: Ino) -> NsResult<bool> {
        let mut cur = dir;
        for _ in 0..4096 {
            if cur == ancestor {
                return Ok(true);
            }
            if cur == Ino::ROOT {
                return Ok(false);
            }
            cur = self.rec(cur)?.parent.unwrap_or(Ino::ROOT);
        }
        Err(Errno::ELOOP)
    }

    /// Renames `parent/name` to `newparent/newname` (with RENAME_NOREPLACE or
    /// RENAME_EXCHANGE semantics when asked), atomically across partitions.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &mut self,
        creds: &Creds,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
        now: TimeNs,
    ) -> NsResult<()> {
        if flags.noreplace && flags.exchange {
            return Err(Errno::EINVAL);
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        check_name(newname)?;
        let sp = self.dir_for(creds, parent, W | X)?.attr.clone();
        let dpa = self.dir_for(creds, newparent, W | X)?.attr.clone();
        if name == b"." || name == b".." {
            return Err(Errno::EBUSY);
        }
        let src = self.entry(parent, name).ok_or(Errno::ENOENT)?;
        let src_attr = self.getattr(src.ino)?;
        perm::check_delete(creds, &sp, &src_attr)?;
        let dst = self.entry(newparent, newname);
        if flags.exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        if parent == newparent && name == newname {
            return Ok(());
        }
        let src_is_dir = src.kind == FileKind::Dir;
        if src_is_dir && newparent != parent {
            if self.is_within(newparent, src.ino)? {
                return Err(Errno::EINVAL);
            }
            // Moving a directory rewrites its "..": needs write access to it.
            perm::check(creds, &src_attr, W)?;
        }
        let mv = Move {
            parent,
            name,
            newparent,
            newname,
            src,
            sdp: self.dpart(parent, name),
            ddp: self.dpart(newparent, newname),
            now,
        };
        let steps = match dst {
            Some(_) if flags.noreplace => return Err(Errno::EEXIST),
            Some(d) if flags.exchange => self.exchange_steps(creds, &dpa, &mv, d)?,
            // Two links to the same inode: POSIX says do nothing.
            Some(d) if d.ino == src.ino => return Ok(()),
            Some(d) => self.replace_steps(creds, &dpa, &mv, d)?,
            None => {
                if src_is_dir && newparent != parent && dpa.nlink >= LINK_MAX {
                    return Err(Errno::EMLINK);
                }
                let sub = i64::from(src_is_dir);
                vec![
                    mv.put_dst(src),
                    mv.del_src(),
                    reparent(src.ino, newparent, now),
                    mv.adjust(parent, -1, -sub),
                    mv.adjust(newparent, 1, sub),
                ]
            }
        };
        self.execute(mv.ddp, steps)
    }

    /// The steps of a rename that swaps two existing names (RENAME_EXCHANGE).
    fn exchange_steps(
        &self,
        creds: &Creds,
        dpa: &Attr,
        mv: &Move<'_>,
        d: DentryVal,
    ) -> NsResult<Vec<(PartitionId, Mutation)>> {
        let (parent, newparent, src, now) = (mv.parent, mv.newparent, mv.src, mv.now);
        let dst_attr = self.getattr(d.ino)?;
        perm::check_delete(creds, dpa, &dst_attr)?;
        let (src_is_dir, dst_is_dir) = (src.kind == FileKind::Dir, d.kind == FileKind::Dir);
        if dst_is_dir && newparent != parent {
            if self.is_within(parent, d.ino)? {
                return Err(Errno::EINVAL);
            }
            perm::check(creds, &dst_attr, W)?;
        }
        let mut steps = vec![
            mv.put_dst(src),
            (
                mv.sdp,
                Mutation::PutDentry {
                    parent,
                    name: mv.name.to_vec(),
                    val: d,
                },
            ),
        ];
        steps.push(reparent(src.ino, newparent, now));
        steps.push(reparent(d.ino, parent, now));
        let moved = i64::from(src_is_dir) - i64::from(dst_is_dir);
        steps.push(mv.adjust(parent, 0, -moved));
        steps.push(mv.adjust(newparent, 0, moved));
        Ok(steps)
    }

    /// The steps of a rename onto an existing name of another inode, which loses that
    /// link (an empty directory, or a file's link).
    fn replace_steps(
        &self,
        creds: &Creds,
        dpa: &Attr,
        mv: &Move<'_>,
        d: DentryVal,
    ) -> NsResult<Vec<(PartitionId, Mutation)>> {
        let (parent, newparent, src, now) = (mv.parent, mv.newparent, mv.src, mv.now);
        let src_is_dir = src.kind == FileKind::Dir;
        let dst_attr = self.getattr(d.ino)?;
        perm::check_delete(creds, dpa, &dst_attr)?;
        match (src_is_dir, d.kind == FileKind::Dir) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (true, true) if dst_attr.size != 0 => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        if d.kind == FileKind::Dir && self.is_within(parent, d.ino)? {
            return Err(Errno::EINVAL);
        }
        let lose = if d.kind == FileKind::Dir {
            Mutation::DelInode(d.ino)
        } else {
            Mutation::AdjustLinks {
                ino: d.ino,
                delta: -1,
                time: now,
            }
        };
        let (sub, dst_sub) = (i64::from(src_is_dir), i64::from(d.kind == FileKind::Dir));
        Ok(vec![
            mv.put_dst(src),
            mv.del_src(),
            (d.ino.partition(), lose),
            reparent(src.ino, newparent, now),
            mv.adjust(parent, -1, -sub),
            mv.adjust(newparent, 0, sub - dst_sub),
        ])
    }

    /// Changes attributes (chmod, chown, truncate, utimes).
    pub fn setattr(&mut self, creds: &Creds, ino: Ino, set: &SetAttr, now: TimeNs) -> NsResult<Attr> {
        let rec = self.rec(ino)?.clone();
        let mut a = perm::apply_setattr(creds, &rec.attr, set, now)?;
        a.ctime = now;
        let p = ino.partition();
        let cut = match (set.size, rec.layout.as_ref()) {
            (Some(size), Some(l)) if rec.attr.kind == FileKind::File => Some(size.div_ceil(l.stripe_bytes().max(1))),
            _ => None,
        };
        let new = InodeRec { attr: a.clone(), ..rec };
        let mut steps = vec![(p, Mutation::PutInode(Box::new(new)))];
        // Stripes wholly at or beyond the new size go with it.
        if let Some(from) = cut {
            steps.push((p, Mutation::CutStripes { ino, from }));
        }
        self.execute(p, steps)?;
        Ok(a)
    }

    /// One page of a directory listing: entries with names after `after`, in name
    /// order, merged from every partition (a stable cursor under concurrent changes).
    pub fn readdir(&self, creds: &Creds, dir: Ino, after: Option<&[u8]>, limit: usize) -> NsResult<Vec<DirEntry>> {
        self.dir_for(creds, dir, R)?;
        let mut all: Vec<DirEntry> = self
            .parts
            .iter()
            .flat_map(|p| p.entries_after(dir, after, limit))
            .map(|(name, v)| DirEntry {
                name,
                ino: v.ino,
                kind: v.kind,
                attr: None,
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all.truncate(limit);
        Ok(all)
    }

    fn xattr_access(&self, creds: &Creds, rec: &InodeRec, name: &[u8], write: bool) -> NsResult<()> {
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(if name.is_empty() { Errno::EINVAL } else { Errno::ERANGE });
        }
        if name.starts_with(b"user.") {
            if !matches!(rec.attr.kind, FileKind::File | FileKind::Dir) {
                return Err(if write { Errno::EPERM } else { Errno::ENODATA });
            }
            return perm::check(creds, &rec.attr, if write { W } else { R });
        }
        if acl::is_acl(name) {
            // Anyone may read an ACL; only the owner (or root) sets one. Linux keeps
            // none on symbolic links.
            if rec.attr.kind == FileKind::Symlink {
                return Err(Errno::EOPNOTSUPP);
            }
            if write && creds.uid != 0 && creds.uid != rec.attr.uid {
                return Err(Errno::EPERM);
            }
            return Ok(());
        }
        if name.starts_with(b"trusted.") || name.starts_with(b"security.") {
            if name.starts_with(b"trusted.") && creds.uid != 0 {
                return Err(if write { Errno::EPERM } else { Errno::ENODATA });
            }
            if write && creds.uid != 0 && creds.uid != rec.attr.uid {
                return Err(Errno::EPERM);
            }
            return Ok(());
        }
        Err(Errno::EOPNOTSUPP)
    }

    /// Reads an extended attribute.
    pub fn getxattr(&self, creds: &Creds, ino: Ino, name: &[u8]) -> NsResult<Vec<u8>> {
        let rec = self.rec(ino)?;
        self.xattr_access(creds, rec, name, false)?;
        rec.xattrs.get(name).cloned().ok_or(Errno::ENODATA)
    }

    /// Sets an extended attribute.
    pub fn setxattr(
        &mut self,
        creds: &Creds,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
        now: TimeNs,
    ) -> NsResult<()> {
        let rec = self.rec(ino)?.clone();
        self.xattr_access(creds, &rec, name, true)?;
        if acl::is_acl(name) {
            return self.set_acl(creds, rec, name, value, now);
        }
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::E2BIG);
        }
        let exists = rec.xattrs.contains_key(name);
        match mode {
            XattrMode::Create if exists => return Err(Errno::EEXIST),
            XattrMode::Replace if !exists => return Err(Errno::ENODATA),
            _ => {}
        }
        let mut new = rec;
        new.xattrs.insert(name.to_vec(), value.to_vec());
        // The inode record carries its attributes in every batch and copy: their total
        // is bounded as a disk's inode space is (ENOSPC, as ext4 and XFS answer).
        if new.xattrs.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>() > XATTR_TOTAL_MAX {
            return Err(Errno::ENOSPC);
        }
        new.attr.ctime = now;
        let p = ino.partition();
        self.execute(p, vec![(p, Mutation::PutInode(Box::new(new)))])
    }

    /// Sets an ACL (module [`acl`]): one the permission bits express is the mode,
    /// nothing is stored, and setting the mode the file has is no change at all (no
    /// batch, no ctime: ext4 does the same); others are not supported. Removing one is
    /// done: none is ever stored.
    fn set_acl(&mut self, creds: &Creds, rec: InodeRec, name: &[u8], value: &[u8], now: TimeNs) -> NsResult<()> {
        let entries = acl::parse(value)?;
        if entries.is_empty() {
            return Ok(());
        }
        if name == acl::DEFAULT {
            // Linux: a default ACL is for directories.
            return Err(if rec.attr.kind == FileKind::Dir {
                Errno::EOPNOTSUPP
            } else {
                Errno::EACCES
            });
        }
        let bits = acl::equivalent_mode(&entries).ok_or(Errno::EOPNOTSUPP)?;
        let mut perm = (rec.attr.perm & !0o777) | bits;
        // As chmod (Linux's `posix_acl_update_mode`): set-group-id stays only for a
        // member of the file's group, or root.
        if creds.uid != 0 && !creds.in_group(rec.attr.gid) {
            perm &= !S_ISGID;
        }
        if perm == rec.attr.perm {
            return Ok(());
        }
        let mut new = rec;
        new.attr.perm = perm;
        new.attr.ctime = now;
        let p = new.attr.ino.partition();
        self.execute(p, vec![(p, Mutation::PutInode(Box::new(new)))])
    }

    /// Lists extended attribute names the caller may see.
    pub fn listxattr(&self, creds: &Creds, ino: Ino) -> NsResult<Vec<Vec<u8>>> {
        let rec = self.rec(ino)?;
        Ok(rec
            .xattrs
            .keys()
            .filter(|n| !n.starts_with(b"trusted.") || creds.uid == 0)
            .cloned()
            .collect())
    }

    /// Removes an extended attribute.
    pub fn removexattr(&mut self, creds: &Creds, ino: Ino, name: &[u8], now: TimeNs) -> NsResult<()> {
        let rec = self.rec(ino)?.clone();
        self.xattr_access(creds, &rec, name, true)?;
        if acl::is_acl(name) {
            // Nothing stored: removed (Linux answers success here too).
            return Ok(());
        }
        if !rec.xattrs.contains_key(name) {
            return Err(Errno::ENODATA);
        }
        let mut new = rec;
        new.xattrs.remove(name);
        new.attr.ctime = now;
        let p = ino.partition();
        self.execute(p, vec![(p, Mutation::PutInode(Box::new(new)))])
    }

    /// The layout policy and version counter of a file (or the policy of a directory),
    /// without its stripes: what its record holds.
    pub fn policy(&self, ino: Ino) -> NsResult<Option<Layout>> {
        Ok(self.rec(ino)?.layout.clone())
    }

    /// The data layout of a file with its committed stripes (or the policy of a
    /// directory). Not for sparse views (they hold only the stripes they fetched).
    pub fn layout(&self, ino: Ino) -> NsResult<Option<Layout>> {
        self.rec(ino)?;
        Ok(self
            .part(ino.partition())?
            .inode_with_stripes(ino, u64::MAX)
            .and_then(|r| r.layout))
    }

    /// Sets the erasure-coding policy of a directory (inherited by what is created in
    /// it) or of an empty file. Owner or root only.
    pub fn set_layout(&mut self, creds: &Creds, ino: Ino, policy: &Layout, now: TimeNs) -> NsResult<()> {
        let rec = self.rec(ino)?.clone();
        if creds.uid != 0 && creds.uid != rec.attr.uid {
            return Err(Errno::EPERM);
        }
        match rec.attr.kind {
            FileKind::Dir => {}
            FileKind::File if rec.attr.size == 0 => {}
            FileKind::File => return Err(Errno::EBUSY),
            _ => return Err(Errno::EINVAL),
        }
        if !policy.policy_is_valid() {
            return Err(Errno::EINVAL);
        }
        let mut new = rec;
        new.layout = Some(policy.without_stripes());
        new.attr.ctime = now;
        let p = ino.partition();
        self.execute(p, vec![(p, Mutation::PutInode(Box::new(new)))])
    }

    /// Whether `creds` may store data in file `ino`: as its owner (who may always give
    /// themselves write permission) or with write permission. EACCES otherwise.
    pub fn may_write_data(&self, creds: &Creds, ino: Ino) -> NsResult<()> {
        let rec = self.rec(ino)?;
        if creds.uid == rec.attr.uid {
            return Ok(());
        }
        perm::check(creds, &rec.attr, perm::W)
    }

    /// Hands out `count` stripe versions of file `ino` for a writer to store new stripe
    /// versions under: returns the first; the range is the writer's alone. The file
    /// takes `policy` if it has no data yet.
    pub fn reserve_versions(&mut self, ino: Ino, policy: &Layout, count: u32) -> NsResult<u64> {
        let rec = self.rec(ino)?.clone();
        if rec.attr.kind != FileKind::File {
            return Err(Errno::EISDIR);
        }
        if count == 0 || !policy.policy_is_valid() {
            return Err(Errno::EINVAL);
        }
        let mut new = rec;
        let layout = Self::file_layout(&mut new, policy)?;
        // (Files written before versions were handed out had clock versions: their
        // `next_version` was raised above them when their stripes were split out.)
        let first = layout.next_version.max(1);
        layout.next_version = first.checked_add(u64::from(count)).ok_or(Errno::EOVERFLOW)?;
        let p = ino.partition();
        self.execute(p, vec![(p, Mutation::PutInode(Box::new(new)))])?;
        Ok(first)
    }

    /// Keeps the data of removed file `ino` until `until` (a client still has it open);
    /// a time already past lets it be purged now. No-op for a file not waiting for a
    /// purge.
    pub fn hold_purge(&mut self, ino: Ino, until: TimeNs) -> NsResult<()> {
        let p = ino.partition();
        self.execute(p, vec![(p, Mutation::HoldPurge { ino, until })])
    }

    /// The data of removed file `ino` is gone from the data nodes: forget the purge.
    pub fn purged(&mut self, ino: Ino) -> NsResult<()> {
        let p = ino.partition();
        self.execute(p, vec![(p, Mutation::Purged(ino))])
    }

    /// The layout of file record `new`, taking `policy` while it has no data. A file
    /// of size 0 has no stripes (stripes lie below the size: commits write inside it,
    /// truncates cut what lies past it).
    fn file_layout<'a>(new: &'a mut InodeRec, policy: &Layout) -> NsResult<&'a mut Layout> {
        let empty = new.attr.size == 0;
        let layout = new.layout.get_or_insert_with(|| policy.without_stripes());
        if empty && (layout.k, layout.m, layout.unit) != (policy.k, policy.m, policy.unit) {
            let next = layout.next_version;
            *layout = policy.without_stripes();
            layout.next_version = next;
        }
        if (layout.k, layout.m, layout.unit) != (policy.k, policy.m, policy.unit) {
            return Err(Errno::EINVAL);
        }
        Ok(layout)
    }

    /// Commits written data: the new stripe versions and the file size, which only
    /// grows here (truncation is `setattr`). Compare-and-set: every stripe must still
    /// have the version its write was based on, else nothing changes and the commit
    /// fails with `ESTALE` (another writer committed that stripe first). A stripe that
    /// already has the new version was committed by this same commit before (a retry).
    /// New versions must have been handed out by [`Namespace::reserve_versions`].
    /// The writer has permission from its open; the file must still be a regular file.
    pub fn commit_write(
        &mut self,
        ino: Ino,
        policy: &Layout,
        size: u64,
        stripes: &[StripeWrite],
        now: TimeNs,
    ) -> NsResult<Attr> {
        let rec = self.rec(ino)?.clone();
        if rec.attr.kind != FileKind::File {
            return Err(Errno::EISDIR);
        }
        if !policy.policy_is_valid() {
            return Err(Errno::EINVAL);
        }
        if size > MAX_FILE_BYTES {
            return Err(Errno::EINVAL);
        }
        let mut new = rec;
        let new_size = new.attr.size.max(size);
        let layout = Self::file_layout(&mut new, policy)?.clone();
        let shards = usize::from(layout.k) + usize::from(layout.m);
        // The current records of the stripes written (all asked for at once).
        let mut current = Vec::with_capacity(stripes.len());
        let mut missing = false;
        for w in stripes {
            match self.stripe(ino, w.stripe) {
                Ok(r) => current.push(r.map_or(0, |r| r.version)),
                Err(Errno::EAGAIN) => missing = true,
                Err(e) => return Err(e),
            }
        }
        if missing {
            return Err(Errno::EAGAIN);
        }
        for (w, cur) in stripes.iter().zip(current) {
            // Every field of a written stripe is checked: a version this file handed
            // out, data that fits the stripe, a shard list no longer than the policy,
            // and a stripe that starts inside the committed size.
            let start = w.stripe.checked_mul(layout.stripe_bytes());
            if w.rec.version == 0
                || w.rec.version >= layout.next_version
                || w.rec.len > layout.stripe_bytes()
                || w.rec.nodes.len() > shards
                || start.is_none_or(|s| s >= new_size)
            {
                return Err(Errno::EINVAL);
            }
            if cur != w.base && cur != w.rec.version {
                return Err(Errno::ESTALE);
            }
        }
        new.attr.size = new_size;
        new.attr.mtime = now;
        new.attr.ctime = now;
        // Writing clears set-user-id (and set-group-id when group-executable), as Linux does.
        if new.attr.perm & (S_ISUID | S_ISGID) != 0 {
            new.attr.perm &= !S_ISUID;
            if new.attr.perm & 0o010 != 0 {
                new.attr.perm &= !S_ISGID;
            }
        }
        let attr = new.attr.clone();
        let p = ino.partition();
        let mut steps = vec![(p, Mutation::PutInode(Box::new(new)))];
        if !stripes.is_empty() {
            let recs = stripes.iter().map(|w| (w.stripe, w.rec.clone())).collect();
            steps.push((p, Mutation::PutStripes { ino, stripes: recs }));
        }
        self.execute(p, steps)?;
        Ok(attr)
    }

    /// Records where shards of stripe `stripe` now live (after a repair moved them):
    /// `moves` are (shard index, node). Applies only while the stripe still has
    /// `version` (a newer write wins; the repair then was moot). Location hints only:
    /// no timestamp changes. Returns whether anything changed.
    pub fn relocate_shards(&mut self, ino: Ino, stripe: u64, version: u64, moves: &[(u32, u64)]) -> NsResult<bool> {
        let Some(layout) = self.rec(ino)?.layout.clone() else {
            return Ok(false);
        };
        let shards = u32::from(layout.k) + u32::from(layout.m);
        if moves.iter().any(|(i, _)| *i >= shards) {
            return Err(Errno::EINVAL);
        }
        let Some(mut rec) = self.stripe(ino, stripe)?.cloned() else {
            return Ok(false);
        };
        if rec.version != version {
            return Ok(false);
        }
        let mut changed = false;
        for (i, node) in moves {
            let (i, node) = (*i as usize, (*node != 0).then_some(crate::ids::NodeId(*node)));
            if i >= rec.nodes.len() {
                rec.nodes.resize(i + 1, None);
            }
            if rec.nodes[i] != node {
                rec.nodes[i] = node;
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        let p = ino.partition();
        self.execute(
            p,
            vec![(
                p,
                Mutation::PutStripes {
                    ino,
                    stripes: vec![(stripe, rec)],
                },
            )],
        )?;
        Ok(true)
    }

    /// Number of inodes in the namespace (for statfs).
    pub fn inode_count(&self) -> u64 {
        self.parts.iter().map(|p| p.inodes.len() as u64).sum()
    }
}
