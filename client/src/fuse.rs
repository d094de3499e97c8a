//! The FUSE adapter: kernel requests become [`Client`] calls.
//!
//! Every request is handed to the tokio runtime with its reply, so a slow request (a
//! degraded read, a busy partition) never blocks the others. The kernel checks
//! permissions with the attributes it caches (`default_permissions`); the metadata
//! service checks them again for every change, with the caller's uid, gid and groups.
//! Entries and attributes are cached by the kernel for `ttl`, and a lookup that finds
//! nothing is a negative entry kept for `negative_ttl`; files are opened without
//! `keep_cache`, so an open sees what other clients closed (close-to-open).
//!
//! Traces: every request runs in an `fs.<op>` span (`fs.read`, `fs.lookup`, ...) with
//! the operation, inode, offsets and byte counts, and what happened on the way (errno;
//! for reads: degraded, hedged, fabric, retries) — the root of one trace per kernel
//! request, parent of the namespace, stripe and RPC spans below it.

use crate::absent::AbsentXattrs;
use crate::dirattrs::{Change, DirAttrs};
use crate::fs::{Client, OpenFile};
use crate::groups::{Groups, parse_status};
use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use shingle_meta::ids::Ino;
use shingle_meta::namespace::{Attr, Creds, DirEntry, Errno, FileKind, SetAttr, TimeNs};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::runtime::Handle;
use tracing::{Instrument, Span};

/// The attribute Linux probes before every write and chown of a file (to drop file
/// capabilities).
const CAPABILITY: &[u8] = b"security.capability";

/// The span of one kernel request (`$name` with `op`, `ino` and the fields given),
/// paired with the operation's name for the metrics.
macro_rules! op_span {
    ($name:literal, $op:expr, $ino:expr $(, $($field:tt)*)?) => {{
        let op: &'static str = $op;
        (
            op,
            tracing::info_span!(
                $name,
                op = op,
                ino = $ino,
                errno = tracing::field::Empty,
                otel.status_code = tracing::field::Empty
                $(, $($field)*)?
            ),
        )
    }};
}

tokio::task_local! {
    /// The operation a request's task runs (its errors are counted under it).
    static OP: &'static str;
}

/// The supplementary groups /proc lists for process `pid` (`None` when it is gone),
/// kept in `groups` for `ttl` under (pid, uid, gid).
fn read_and_keep(groups: &Mutex<Groups>, (pid, uid, gid): (u32, u32, u32), ttl: Duration) -> Option<Arc<[u32]>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let read: Arc<[u32]> = parse_status(&status)?.into();
    groups.lock().put(pid, uid, gid, read.clone(), Instant::now(), ttl);
    Some(read)
}

/// The caller of a request that only reads ([`ShingleFs::asker`]), with groups the
/// mount may have kept from before a `setgroups`. The kernel checked the request with
/// the caller's current groups first (`default_permissions`), so kept groups can only
/// make the service refuse what it should allow: such a refusal is asked again with
/// groups read afresh ([`Asker::again`]).
struct Asker {
    creds: Creds,
    pid: u32,
    /// The groups are kept ones, not read for this request.
    kept: bool,
    groups: Arc<Mutex<Groups>>,
    ttl: Duration,
}

impl Asker {
    /// Credentials to ask again with after the service answered `e`: when it is a
    /// refusal and the groups were kept ones that /proc no longer lists. `None`: the
    /// answer stands.
    fn again(&self, e: Errno) -> Option<Creds> {
        if !self.kept || !matches!(e, Errno::EACCES | Errno::EPERM) {
            return None;
        }
        let (uid, gid) = (self.creds.uid, self.creds.gid);
        let fresh = read_and_keep(&self.groups, (self.pid, uid, gid), self.ttl)?;
        (*fresh != *self.creds.groups).then(|| Creds {
            uid,
            gid,
            groups: fresh.to_vec(),
        })
    }
}

/// [`DirHandle::fill`] for `who`, asked again with groups read afresh after a refusal
/// its kept groups may explain ([`Asker::again`]; the pages already read stay).
async fn fill(h: &mut DirHandle, c: &Client, who: &Asker, want: usize) -> Result<(), Errno> {
    match h.fill(c, &who.creds, want).await {
        Err(e) => match who.again(e) {
            Some(cr) => h.fill(c, &cr, want).await,
            None => Err(e),
        },
        ok => ok,
    }
}

/// Mount settings.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// How long the kernel may cache entries and attributes.
    pub ttl: Duration,
    /// How long the kernel may remember that a name does not exist (a negative entry;
    /// zero: ask every time). A name created or renamed into place through this mount
    /// is seen at once; one created through another client may stay hidden here for
    /// this long, as an existing name removed elsewhere stays visible for `ttl`.
    pub negative_ttl: Duration,
    /// Let every user use the mount (`allow_other`; needs root or user_allow_other).
    pub allow_other: bool,
    /// Threads reading requests from /dev/fuse.
    pub threads: usize,
    /// Kernel readahead window of the mount in KiB (sets the size of sequential reads).
    pub readahead_kb: u32,
    /// Mount read-only (`ro`): the kernel refuses every change with EROFS (a mount
    /// whose client key is read-only).
    pub read_only: bool,
    /// The directory shown as the mount's root (a client key confined to a subtree
    /// mounts its directory; [`Ino::ROOT`] otherwise).
    pub root: Ino,
}

impl Default for MountConfig {
    /// 1 s caches (negative entries too), open to all users, 2 threads, 4 MiB
    /// readahead, read-write.
    fn default() -> Self {
        MountConfig {
            ttl: Duration::from_secs(1),
            negative_ttl: Duration::from_secs(1),
            allow_other: true,
            threads: 2,
            readahead_kb: 4096,
            read_only: false,
            root: Ino::ROOT,
        }
    }
}

struct DirHandle {
    dir: Ino,
    parent: Option<Ino>,
    entries: Vec<DirEntry>,
    /// When each entry's attributes were read (parallel to `entries`).
    read_at: Vec<Instant>,
    done: bool,
}

/// Entries a READDIRPLUS reply gets attributes for at a time (a reply of one page
/// holds about 25).
const PLUS_AHEAD: usize = 32;

/// Entries the mount asks the metadata service for at a time.
const DIR_PAGE: u32 = 1024;

impl DirHandle {
    /// The directory's parent (its ".."), read when the listing starts.
    async fn start(&mut self, c: &Client, root: Ino) -> Result<Ino, Errno> {
        if self.parent.is_none() {
            let rec = c.meta().get_inode(self.dir).await?;
            if rec.attr.kind != FileKind::Dir {
                return Err(Errno::ENOTDIR);
            }
            // The mount's root is its own "..", as a filesystem's root is.
            self.parent = Some(if self.dir == root {
                root
            } else {
                rec.parent.unwrap_or(Ino::ROOT)
            });
        }
        Ok(self.parent.unwrap_or(Ino::ROOT))
    }

    /// Reads pages until `want` entries are here or the listing is complete. Pages
    /// carry the attributes of the inodes that live with their names.
    async fn fill(&mut self, c: &Client, cr: &Creds, want: usize) -> Result<(), Errno> {
        while self.entries.len() < want && !self.done {
            let after = self.entries.last().map(|e| e.name.clone());
            let page = c
                .meta()
                .readdir_plus_as(cr, self.dir, after.as_deref(), DIR_PAGE)
                .await?;
            // A short page is the last one.
            self.done = page.len() < DIR_PAGE as usize;
            let now = Instant::now();
            self.read_at.extend(page.iter().map(|_| now));
            self.entries.extend(page);
        }
        Ok(())
    }

    /// Makes the attributes of the entries in `range` at most `ttl` old: those the
    /// pages did not carry, or carried too long ago, are read again (at most 32 at
    /// once); an entry whose inode is gone has none.
    async fn fresh_attrs(&mut self, c: &Client, range: std::ops::Range<usize>, ttl: Duration) -> Result<(), Errno> {
        let now = Instant::now();
        let end = range.end.min(self.entries.len());
        let stale: Vec<usize> = (range.start.min(end)..end)
            .filter(|&i| self.entries[i].attr.is_none() || now.duration_since(self.read_at[i]) > ttl)
            .collect();
        let read = c.attrs(stale.iter().map(|&i| self.entries[i].ino).collect()).await;
        for (i, a) in stale.into_iter().zip(read) {
            self.entries[i].attr = match a {
                Ok(a) => Some(a),
                Err(Errno::ENOENT) => None,
                Err(e) => return Err(e),
            };
            self.read_at[i] = now;
        }
        Ok(())
    }
}

/// The filesystem served to the kernel.
pub struct ShingleFs {
    client: Client,
    rt: Handle,
    ttl: Duration,
    negative_ttl: Duration,
    files: Arc<Mutex<HashMap<u64, Arc<OpenFile>>>>,
    /// Handles opened for writing.
    writable: Arc<Mutex<std::collections::HashSet<u64>>>,
    dirs: Arc<Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirHandle>>>>>,
    next_fh: AtomicU64,
    /// Extended attributes found missing, kept for `ttl` (see [`crate::absent`]).
    root: Ino,
    absent: Arc<Mutex<AbsentXattrs>>,
    /// Directories' attributes with this mount's changes applied (see
    /// [`crate::dirattrs`]): the kernel's re-read after each change is answered here.
    dirs_kept: Arc<Mutex<DirAttrs>>,
    /// Callers' supplementary groups, kept for `ttl` (see [`crate::groups`]).
    groups: Arc<Mutex<Groups>>,
}

/// A change of this mount in flight ([`ShingleFs::changing`]): told what it did to
/// which directory before the kernel is answered. One dropped untold (its task gone)
/// forgets every kept directory.
struct Changing(Option<Arc<Mutex<DirAttrs>>>);

impl Changing {
    fn take(mut self) -> Arc<Mutex<DirAttrs>> {
        self.0.take().expect("a change ends once")
    }

    /// The change did `done` to `dir` at the service's time; `None`: its outcome or
    /// time is not known for sure, and `dir` is forgotten.
    fn ended(self, dir: Ino, done: Option<(Change, TimeNs)>) {
        let kept = self.take();
        let mut k = kept.lock();
        match done {
            Some((change, at)) => k.end(&[(dir.0, change, at)], &[]),
            None => k.end(&[], &[dir.0]),
        }
    }

    /// An entry was made in `dir` (a directory's when `is_dir`), or not (`Err`). The
    /// new inode's change time is the operation's.
    fn made(self, dir: Ino, r: &Result<Attr, Errno>, is_dir: bool) {
        let done = r.as_ref().ok().map(|a| (Change::Added { dir: is_dir }, a.ctime));
        self.ended(dir, done);
    }

    /// The change may have touched any kept directory.
    fn forgetting_all(self) {
        self.take().lock().end_forgetting_all();
    }

    /// The change sets attributes of `ino` (answered to the kernel by its reply): they
    /// are forgotten now and again when the returned guard drops.
    fn forgetting(self, ino: u64) -> Forgetting {
        let kept = self.take();
        kept.lock().forget(ino);
        Forgetting(kept, ino)
    }
}

impl Drop for Changing {
    fn drop(&mut self) {
        if let Some(kept) = self.0.take() {
            kept.lock().end_forgetting_all();
        }
    }
}

/// Ends a change that set the attributes of an inode, when dropped.
struct Forgetting(Arc<Mutex<DirAttrs>>, u64);

impl Drop for Forgetting {
    fn drop(&mut self) {
        self.0.lock().end(&[], &[self.1]);
    }
}

/// The kernel's errno for `e`, recorded on the request's span.
fn errno(e: Errno) -> fuser::Errno {
    shingle_meta::meta_client::record_errno(&Span::current(), e);
    let _ = OP.try_with(|&op| {
        shingle_metrics::get()
            .fs_op_errors
            .get_or_create(&shingle_metrics::Op { op })
            .inc();
    });
    fuser::Errno::from_i32(e.code())
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// Kernel attributes of an inode.
pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.crtime),
        kind: kind(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: 1 << 20,
        flags: 0,
    }
}

/// A directory's "." or ".." in a READDIRPLUS reply: its number and kind; the kernel
/// keeps no entry for these names, so the rest is unused.
fn dir_only(ino: Ino) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino.0),
        kind: FileType::Directory,
        ..negative_entry()
    }
}

/// The attributes of a negative entry: node id 0, the rest unused.
fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 1 << 20,
        flags: 0,
    }
}

fn when(t: Option<TimeOrNow>) -> Option<i64> {
    t.map(|t| match t {
        // The metadata service's now: allowed with write permission alone.
        TimeOrNow::Now => SetAttr::NOW,
        TimeOrNow::SpecificTime(s) => match s.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i64,
            Err(e) => -(e.duration().as_nanos() as i64),
        },
    })
}

impl ShingleFs {
    /// The caller's credentials, with its supplementary groups read from /proc now
    /// (none when the process is already gone): for a change, which the service checks
    /// with them. What is read is kept for [`ShingleFs::asker`].
    fn creds(&self, req: &Request) -> Creds {
        let (pid, uid, gid) = (req.pid(), req.uid(), req.gid());
        let groups = read_and_keep(&self.groups, (pid, uid, gid), self.ttl);
        Creds {
            uid,
            gid,
            groups: groups.map(|g| g.to_vec()).unwrap_or_default(),
        }
    }

    /// The caller of a request that only reads, with the groups kept for it when they
    /// are younger than `ttl` (see [`crate::groups`]), read from /proc otherwise.
    fn asker(&self, req: &Request) -> Asker {
        let (pid, uid, gid) = (req.pid(), req.uid(), req.gid());
        let kept = self.groups.lock().get(pid, uid, gid, Instant::now());
        let (groups, kept) = match kept {
            Some(g) => (g.to_vec(), true),
            None => (self.creds(req).groups, false),
        };
        Asker {
            creds: Creds { uid, gid, groups },
            pid,
            kept,
            groups: self.groups.clone(),
            ttl: self.ttl,
        }
    }

    /// A filesystem over `client`, running requests on `rt`.
    pub fn new(client: Client, rt: Handle, cfg: &MountConfig) -> Self {
        ShingleFs {
            client,
            rt,
            ttl: cfg.ttl,
            negative_ttl: cfg.negative_ttl,
            files: Arc::default(),
            writable: Arc::default(),
            dirs: Arc::default(),
            next_fh: AtomicU64::new(1),
            absent: Arc::default(),
            groups: Arc::default(),
            root: cfg.root,
            dirs_kept: Arc::default(),
        }
    }

    /// Starts a change of this mount (before its request is sent): directory
    /// attributes read while it is in flight are not kept. The returned handle ends it.
    fn changing(&self) -> Changing {
        self.dirs_kept.lock().begin();
        Changing(Some(self.dirs_kept.clone()))
    }

    /// The inode the kernel's node id names: its root (node id 1) is the mount's root
    /// directory, every other node id is the inode of that number. The mount's root
    /// never comes back under its own number (its name lies outside the mount).
    fn ino(&self, n: INodeNo) -> Ino {
        if n.0 == fuser::INodeNo::ROOT.0 {
            self.root
        } else {
            Ino(n.0)
        }
    }

    /// Runs a request's work on the runtime, inside its span, timed under its operation.
    fn run(&self, (op, span): (&'static str, Span), work: impl std::future::Future<Output = ()> + Send + 'static) {
        let started = std::time::Instant::now();
        let timed = OP.scope(op, async move {
            work.await;
            shingle_metrics::get()
                .fs_op_seconds
                .get_or_create(&shingle_metrics::Op { op })
                .observe(started.elapsed().as_secs_f64());
        });
        self.rt.spawn(timed.instrument(span));
    }

    fn fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    fn file(&self, fh: FileHandle) -> Option<Arc<OpenFile>> {
        self.files.lock().get(&fh.0).cloned()
    }

    /// A handle of `ino` (`fh` when it is one) through which writes wait to be
    /// committed, if any.
    fn uncommitted(&self, ino: Ino, fh: Option<FileHandle>) -> Option<Arc<OpenFile>> {
        let files = self.files.lock();
        if let Some(f) = fh.and_then(|fh| files.get(&fh.0)).filter(|f| f.ino == ino) {
            return f.has_uncommitted().then(|| f.clone());
        }
        if !self.client.is_open(ino) {
            return None;
        }
        files.values().find(|f| f.ino == ino && f.has_uncommitted()).cloned()
    }

    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        k: FileKind,
        perm: u32,
        rdev: u64,
        target: Option<Vec<u8>>,
        reply: ReplyEntry,
    ) {
        let parent = self.ino(parent);
        let (c, cr, name, ttl) = (self.client.clone(), self.creds(req), name.as_bytes().to_vec(), self.ttl);
        let changing = self.changing();
        self.run(
            op_span!(
                "fs.mknod",
                match k {
                    FileKind::Dir => "mkdir",
                    FileKind::Symlink => "symlink",
                    _ => "mknod",
                },
                parent.0
            ),
            async move {
                let r = c
                    .meta()
                    .mknod(&cr, parent, &name, k, perm, rdev, target.as_deref())
                    .await;
                changing.made(parent, &r, k == FileKind::Dir);
                match r {
                    Ok(a) => reply.entry(&ttl, &file_attr(&a), Generation(0)),
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }
}

impl Filesystem for ShingleFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(4 << 20);
        let _ = config.set_max_background(64);
        // READDIRPLUS when the kernel sees a listing followed by lookups (and for a
        // listing's first page): `ls -l`, `find`, `rm -rf` make no lookup per name.
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let parent = self.ino(parent);
        let (c, who, name, ttl, negative) = (
            self.client.clone(),
            self.asker(req),
            name.as_bytes().to_vec(),
            self.ttl,
            self.negative_ttl,
        );
        self.run(op_span!("fs.lookup", "lookup", parent.0), async move {
            let mut r = c.lookup(&who.creds, parent, &name).await;
            if let Some(cr) = r.as_ref().err().and_then(|e| who.again(*e)) {
                r = c.lookup(&cr, parent, &name).await;
            }
            match r {
                Ok(a) => reply.entry(&ttl, &file_attr(&a), Generation(0)),
                // Node id 0 is "no such name" that the kernel keeps for the entry TTL
                // (Python's import path probes, a build's header search ask again and
                // again); its attributes mean nothing.
                Err(Errno::ENOENT) if !negative.is_zero() => {
                    // Still an ENOENT for the caller: counted and traced as one.
                    let _ = errno(Errno::ENOENT);
                    reply.entry_with_ttls(&Duration::ZERO, &negative, &negative_entry(), Generation(0))
                }
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ino = self.ino(ino);
        let (c, ttl, kept) = (self.client.clone(), self.ttl, self.dirs_kept.clone());
        self.run(op_span!("fs.getattr", "getattr", ino.0), async move {
            // A directory this mount read and changed since: its attributes are known.
            let known = kept.lock().get(ino.0, std::time::Instant::now(), ttl);
            if let Some((a, left)) = known {
                reply.attr(&left, &file_attr(&a));
                return;
            }
            let asked = kept.lock().asking();
            match c.getattr(ino).await {
                Ok(a) => {
                    kept.lock().read(&a, asked, std::time::Instant::now(), ttl);
                    reply.attr(&ttl, &file_attr(&a))
                }
                Err(Errno::ENOENT) => match c.unlinked_attr(ino).await {
                    // fstat of a file removed while open here: what the handles know,
                    // nlink 0 (the kernel does not say which handle asks).
                    Some(a) => reply.attr(&Duration::ZERO, &file_attr(&a)),
                    None => reply.error(errno(Errno::ENOENT)),
                },
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let ino = self.ino(ino);
        let (c, mut cr, ttl) = (self.client.clone(), self.creds(req), self.ttl);
        // ftruncate on a descriptor open for writing: permission was checked at open
        // (a file created with mode 0 can still be truncated through it).
        let writable = fh.is_some_and(|fh| self.writable.lock().contains(&fh.0));
        if size.is_some() && writable && mode.is_none() && uid.is_none() && gid.is_none() {
            cr = Creds::root();
        }
        let set = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: when(atime),
            mtime: when(mtime),
        };
        // Writes made here before the change are committed before it, in the same
        // operation: committed at close instead, they would set the mtime after
        // `futimens` (cp -a sets times and owner before it closes) and clear set-id
        // bits after `fchmod`, as if they had been made later. (A size change commits
        // them itself.)
        let earlier = if size.is_none() {
            self.uncommitted(ino, fh)
        } else {
            None
        };
        let changing = self.changing();
        self.run(op_span!("fs.setattr", "setattr", ino.0, size), async move {
            // A directory's attributes set here reach the kernel with the reply.
            let _changed = changing.forgetting(ino.0);
            if let Some(f) = earlier {
                match f.commit_setattr(&cr, &set).await {
                    Ok(Some(a)) => {
                        reply.attr(&ttl, &file_attr(&a));
                        return;
                    }
                    Ok(None) => {}
                    // Refused as a whole: the writes first (their error, if they
                    // have one), then the change alone (its error, if it has one).
                    Err(_) => {
                        if let Err(e) = f.flush().await {
                            reply.error(errno(e));
                            return;
                        }
                    }
                }
            }
            match c.setattr(&cr, ino, set).await {
                Ok(a) => reply.attr(&ttl, &file_attr(&a)),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let ino = self.ino(ino);
        let c = self.client.clone();
        self.run(op_span!("fs.readlink", "readlink", ino.0), async move {
            match c.meta().readlink(ino).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let Some(k) = FileKind::from_mode(mode) else {
            reply.error(fuser::Errno::EINVAL);
            return;
        };
        if k == FileKind::Dir || k == FileKind::Symlink {
            reply.error(fuser::Errno::EINVAL);
            return;
        }
        self.make(
            req,
            parent,
            name,
            k,
            mode & !umask & 0o7777,
            u64::from(rdev),
            None,
            reply,
        );
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.make(req, parent, name, FileKind::Dir, mode & !umask & 0o7777, 0, None, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let parent = self.ino(parent);
        let (c, cr, name) = (self.client.clone(), self.creds(req), name.as_bytes().to_vec());
        let changing = self.changing();
        self.run(op_span!("fs.unlink", "unlink", parent.0), async move {
            let r = c.unlink_at(&cr, parent, &name).await;
            let at = r.as_ref().ok().copied().flatten();
            changing.ended(parent, at.map(|t| (Change::Removed { dir: false }, t)));
            match r {
                Ok(_) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let parent = self.ino(parent);
        let (c, cr, name) = (self.client.clone(), self.creds(req), name.as_bytes().to_vec());
        let changing = self.changing();
        self.run(op_span!("fs.rmdir", "rmdir", parent.0), async move {
            // The removed directory may be kept too, under a number not known here.
            let r = c.meta().rmdir(&cr, parent, &name).await;
            changing.forgetting_all();
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let t = target.as_os_str().as_bytes().to_vec();
        self.make(req, parent, link_name, FileKind::Symlink, 0o777, 0, Some(t), reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let parent = self.ino(parent);
        let newparent = self.ino(newparent);
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            reply.error(fuser::Errno::EINVAL);
            return;
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let (c, cr) = (self.client.clone(), self.creds(req));
        let (name, newname) = (name.as_bytes().to_vec(), newname.as_bytes().to_vec());
        let changing = self.changing();
        self.run(
            op_span!("fs.rename", "rename", parent.0, newparent = newparent.0),
            async move {
                let r = c
                    .rename(&cr, parent, &name, newparent, &newname, noreplace, exchange)
                    .await;
                // A moved directory may be kept (its parent and change time changed).
                changing.forgetting_all();
                match r {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let ino = self.ino(ino);
        let newparent = self.ino(newparent);
        let (c, cr, name, ttl) = (
            self.client.clone(),
            self.creds(req),
            newname.as_bytes().to_vec(),
            self.ttl,
        );
        let changing = self.changing();
        self.run(
            op_span!("fs.link", "link", ino.0, newparent = newparent.0),
            async move {
                let r = c.meta().link(&cr, ino, newparent, &name).await;
                changing.made(newparent, &r, false);
                match r {
                    Ok(a) => reply.entry(&ttl, &file_attr(&a), Generation(0)),
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let ino = self.ino(ino);
        let (c, who, files, fh) = (self.client.clone(), self.asker(req), self.files.clone(), self.fh());
        let read_only = flags.0 & libc::O_ACCMODE == libc::O_RDONLY;
        if !read_only {
            self.writable.lock().insert(fh);
        }
        self.run(
            op_span!("fs.open", "open", ino.0, keep_cache = tracing::field::Empty),
            async move {
                let mut r = c.open_cached(&who.creds, ino).await;
                if let Some(cr) = r.as_ref().err().and_then(|e| who.again(*e)) {
                    r = c.open_cached(&cr, ino).await;
                }
                match r {
                    Ok((f, unchanged)) => {
                        files.lock().insert(fh, f);
                        // Unchanged since this client last saw it: keep the cached pages.
                        Span::current().record("keep_cache", unchanged);
                        let mut flags = if unchanged {
                            FopenFlags::FOPEN_KEEP_CACHE
                        } else {
                            FopenFlags::empty()
                        };
                        // A read-only handle has nothing to flush at close: the kernel
                        // then sends no FLUSH, one request less that close waits for
                        // (NFS skips it too; errors of other handles' writes are theirs
                        // to report, as on a local filesystem).
                        if read_only {
                            flags |= FopenFlags::FOPEN_NOFLUSH;
                        }
                        reply.opened(FileHandle(fh), flags);
                    }
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(f) = self.file(fh) else {
            reply.error(fuser::Errno::EBADF);
            return;
        };
        tracing::trace!(ino = f.ino.0, offset, size, "read");
        self.run(
            op_span!(
                "fs.read",
                "read",
                f.ino.0,
                offset,
                len = size,
                bytes = tracing::field::Empty,
                retries = 0u32,
                degraded = false,
                hedged = false,
                fabric = tracing::field::Empty
            ),
            async move {
                match f.read(offset, size).await {
                    Ok(b) => {
                        Span::current().record("bytes", b.len());
                        shingle_metrics::get().fs_read_bytes.inc_by(b.len() as u64);
                        reply.data(&b)
                    }
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(f) = self.file(fh) else {
            reply.error(fuser::Errno::EBADF);
            return;
        };
        let data = data.to_vec();
        self.run(
            op_span!(
                "fs.write",
                "write",
                f.ino.0,
                offset,
                bytes = data.len(),
                degraded = false
            ),
            async move {
                match f.write(offset, &data).await {
                    Ok(n) => {
                        shingle_metrics::get().fs_write_bytes.inc_by(u64::from(n));
                        reply.written(n)
                    }
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        let Some(f) = self.file(fh) else {
            reply.error(fuser::Errno::EBADF);
            return;
        };
        self.run(op_span!("fs.flush", "flush", f.ino.0, degraded = false), async move {
            match f.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let f = self.files.lock().remove(&fh.0);
        self.writable.lock().remove(&fh.0);
        self.run(
            op_span!("fs.release", "release", _ino.0, degraded = false),
            async move {
                let r = match f {
                    Some(f) => f.flush().await,
                    None => Ok(()),
                };
                match r {
                    // An unlinked file has nothing left to commit to.
                    Ok(()) | Err(Errno::ENOENT) => reply.ok(),
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.flush(_req, _ino, fh, LockOwner(0), reply);
    }

    /// No file of ours is a terminal or takes device requests: `ENOTTY`, what a local
    /// filesystem answers (Python's `open()` asks `TCGETS` of every file it opens).
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(fuser::Errno::from_i32(libc::ENOTTY));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let ino = self.ino(ino);
        // No round trip here: the kernel only opens directories, and ".." is resolved
        // when a listing starts. The kernel may keep the listing in its cache; it drops it
        // when the directory's mtime changes (seen within the attribute TTL).
        let fh = self.fh();
        let h = DirHandle {
            dir: ino,
            parent: None,
            entries: Vec::new(),
            read_at: Vec::new(),
            done: false,
        };
        self.dirs.lock().insert(fh, Arc::new(tokio::sync::Mutex::new(h)));
        reply.opened(
            FileHandle(fh),
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
        );
    }

    fn readdir(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(h) = self.dirs.lock().get(&fh.0).cloned() else {
            reply.error(fuser::Errno::EBADF);
            return;
        };
        let (c, who, root) = (self.client.clone(), self.asker(req), self.root);
        self.run(op_span!("fs.readdir", "readdir", _ino.0, offset), async move {
            let mut h = h.lock().await;
            let parent = match h.start(&c, root).await {
                Ok(p) => p,
                Err(e) => return reply.error(errno(e)),
            };
            // Offsets: 1 is ".", 2 is "..", 2 + i + 1 is entry i.
            let mut off = offset;
            if off == 0 {
                if reply.add(INodeNo(h.dir.0), 1, FileType::Directory, ".") {
                    return reply.ok();
                }
                off = 1;
            }
            if off == 1 {
                if reply.add(INodeNo(parent.0), 2, FileType::Directory, "..") {
                    return reply.ok();
                }
                off = 2;
            }
            let mut i = (off - 2) as usize;
            loop {
                if let Err(e) = fill(&mut h, &c, &who, i + 1).await {
                    return reply.error(errno(e));
                }
                let Some(e) = h.entries.get(i) else { break };
                if reply.add(
                    INodeNo(e.ino.0),
                    (i + 3) as u64,
                    kind(e.kind),
                    OsStr::from_bytes(&e.name),
                ) {
                    break;
                }
                i += 1;
            }
            reply.ok();
        });
    }

    /// A listing with each entry's attributes and a kernel entry for it (READDIRPLUS,
    /// which the kernel asks for when a listing is followed by lookups: `ls -l`,
    /// `find`, `rm -rf`, a DataLoader's scan): no lookup per name afterwards.
    /// Attributes come with the listing's own pages where the inode lives with its
    /// name, are read apart otherwise, and are never older than the attribute TTL when
    /// handed over; a file open here with writes not yet committed has this client's
    /// size, as in `getattr`.
    fn readdirplus(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let Some(h) = self.dirs.lock().get(&fh.0).cloned() else {
            reply.error(fuser::Errno::EBADF);
            return;
        };
        let (c, who, root, ttl) = (self.client.clone(), self.asker(req), self.root, self.ttl);
        self.run(op_span!("fs.readdirplus", "readdirplus", _ino.0, offset), async move {
            let mut h = h.lock().await;
            let parent = match h.start(&c, root).await {
                Ok(p) => p,
                Err(e) => return reply.error(errno(e)),
            };
            // "." and "..": the kernel makes no entry for them (it checks the names),
            // so they carry their inode number and kind only.
            let mut off = offset;
            if off == 0 {
                if reply.add(
                    INodeNo(h.dir.0),
                    1,
                    ".",
                    &Duration::ZERO,
                    &dir_only(h.dir),
                    Generation(0),
                ) {
                    return reply.ok();
                }
                off = 1;
            }
            if off == 1 {
                if reply.add(
                    INodeNo(parent.0),
                    2,
                    "..",
                    &Duration::ZERO,
                    &dir_only(parent),
                    Generation(0),
                ) {
                    return reply.ok();
                }
                off = 2;
            }
            let mut i = (off - 2) as usize;
            loop {
                // Attributes for the entries one reply may hold (a reply is a page of
                // about 25 entries).
                if let Err(e) = fill(&mut h, &c, &who, i + PLUS_AHEAD).await {
                    return reply.error(errno(e));
                }
                if let Err(e) = h.fresh_attrs(&c, i..i + PLUS_AHEAD, ttl).await {
                    return reply.error(errno(e));
                }
                let end = (i + PLUS_AHEAD).min(h.entries.len());
                if i >= end {
                    break;
                }
                while i < end {
                    let e = &h.entries[i];
                    i += 1;
                    // Removed since it was listed: left out, as a listing taken a
                    // moment later would.
                    let Some(a) = &e.attr else { continue };
                    let mut a = a.clone();
                    c.local_view(&mut a);
                    if reply.add(
                        INodeNo(e.ino.0),
                        (i + 2) as u64,
                        OsStr::from_bytes(&e.name),
                        &ttl,
                        &file_attr(&a),
                        Generation(0),
                    ) {
                        return reply.ok();
                    }
                }
            }
            reply.ok();
        });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Every namespace change is durable on all replicas before it is acknowledged.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let c = self.client.clone();
        self.run(op_span!("fs.statfs", "statfs", _ino.0), async move {
            let s = c.statfs().await;
            let bs = 4096u64;
            reply.statfs(
                s.total / bs,
                s.free / bs,
                s.free / bs,
                s.files + s.files_free,
                s.files_free,
                bs as u32,
                255,
                bs as u32,
            );
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let ino = self.ino(ino);
        let mode = match flags {
            0 => 0,
            libc::XATTR_CREATE => 1,
            libc::XATTR_REPLACE => 2,
            _ => {
                reply.error(fuser::Errno::EINVAL);
                return;
            }
        };
        let (c, cr, name, value) = (
            self.client.clone(),
            self.creds(req),
            name.as_bytes().to_vec(),
            value.to_vec(),
        );
        let absent = self.absent.clone();
        let changing = self.changing();
        self.run(op_span!("fs.setxattr", "setxattr", ino.0), async move {
            // Its ctime changes (and an ACL sets the mode).
            let _changed = changing.forgetting(ino.0);
            let r = c.meta().setxattr(&cr, ino, &name, &value, mode).await;
            // Whatever the answer, the attribute may exist now.
            absent.lock().forget(ino.0, &name);
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let ino = self.ino(ino);
        let (c, who, name) = (self.client.clone(), self.asker(req), name.as_bytes().to_vec());
        let (absent, ttl) = (self.absent.clone(), self.ttl);
        self.run(op_span!("fs.getxattr", "getxattr", ino.0), async move {
            // The kernel checked the caller's permission before asking (VFS xattr
            // rules): a remembered "missing" can be answered without the service.
            let (known, asked) = {
                let mut a = absent.lock();
                (a.known(ino.0, &name, std::time::Instant::now()), a.asking())
            };
            if known {
                reply.error(errno(Errno::ENODATA));
                return;
            }
            let at = std::time::Instant::now();
            let mut r = c.meta().getxattr(&who.creds, ino, &name).await;
            if let Some(cr) = r.as_ref().err().and_then(|e| who.again(*e)) {
                r = c.meta().getxattr(&cr, ino, &name).await;
            }
            match r {
                Ok(v) if size == 0 => reply.size(v.len() as u32),
                Ok(v) if v.len() > size as usize => reply.error(fuser::Errno::ERANGE),
                Ok(v) => reply.data(&v),
                Err(Errno::ENODATA) => {
                    absent.lock().note(ino.0, &name, asked, at, ttl);
                    reply.error(errno(Errno::ENODATA));
                }
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let ino = self.ino(ino);
        let (c, who) = (self.client.clone(), self.asker(req));
        self.run(op_span!("fs.listxattr", "listxattr", ino.0), async move {
            let mut r = c.meta().listxattr(&who.creds, ino).await;
            if let Some(cr) = r.as_ref().err().and_then(|e| who.again(*e)) {
                r = c.meta().listxattr(&cr, ino).await;
            }
            match r {
                Ok(names) => {
                    let mut buf = Vec::new();
                    for n in names {
                        buf.extend_from_slice(&n);
                        buf.push(0);
                    }
                    if size == 0 {
                        reply.size(buf.len() as u32);
                    } else if buf.len() > size as usize {
                        reply.error(fuser::Errno::ERANGE);
                    } else {
                        reply.data(&buf);
                    }
                }
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let ino = self.ino(ino);
        let (c, cr, name) = (self.client.clone(), self.creds(req), name.as_bytes().to_vec());
        let absent = self.absent.clone();
        let changing = self.changing();
        self.run(op_span!("fs.removexattr", "removexattr", ino.0), async move {
            let _changed = changing.forgetting(ino.0);
            let r = c.meta().removexattr(&cr, ino, &name).await;
            absent.lock().forget(ino.0, &name);
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let parent = self.ino(parent);
        let (c, cr, name, ttl) = (self.client.clone(), self.creds(req), name.as_bytes().to_vec(), self.ttl);
        let (files, fh) = (self.files.clone(), self.fh());
        self.writable.lock().insert(fh);
        let k = FileKind::from_mode(mode).unwrap_or(FileKind::File);
        let absent = self.absent.clone();
        let changing = self.changing();
        self.run(
            op_span!("fs.create", "create", parent.0, degraded = false),
            async move {
                let perm = mode & !umask & 0o7777;
                let (asked, at) = (absent.lock().asking(), std::time::Instant::now());
                let made = if k == FileKind::File {
                    c.create(&cr, parent, &name, perm).await
                } else {
                    // Anything else the kernel creates and opens (a fifo): no stripes.
                    match c.meta().mknod(&cr, parent, &name, k, perm, 0, None).await {
                        Ok(a) => c.open(&cr, a.ino).await.map(|f| (a, f)),
                        Err(e) => Err(e),
                    }
                };
                changing.made(parent, &made.as_ref().map(|(a, _)| a.clone()).map_err(|e| *e), false);
                match made {
                    Ok((a, f)) => {
                        // A file made a moment ago has no file capabilities: the
                        // kernel's probe before its first write is answered here.
                        absent.lock().note(a.ino.0, CAPABILITY, asked, at, ttl);
                        files.lock().insert(fh, f);
                        reply.created(&ttl, &file_attr(&a), Generation(0), FileHandle(fh), FopenFlags::empty());
                    }
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }
}
