//! The client library: namespace through [`MetaClient`], file data as erasure-coded
//! stripes on the data nodes of each stripe's placement group.
//!
//! Each file open on this client has one [`Content`] core (shared by all its handles,
//! so what one handle writes the others read at once) that says, per stripe, where the
//! truth is: dirty bytes here, a version stored but not committed, or the committed
//! version. This module is its I/O shell.
//!
//! **Reads** ask the core where each byte comes from. A small read inside one data
//! shard fetches just that byte range from the node that holds it (the code is
//! systematic: data shards hold the file's bytes); a sequential reader, a large read
//! or a degraded read fetches whole stripes (k data shards in parallel, parity only for
//! shards that fail) into a small per-file cache, and the next stripe is fetched in
//! the background (readahead). Versions are immutable, so a reader never sees a
//! half-replaced stripe: when the version it planned to read was replaced and deleted
//! by another client's commit, it reloads the layout and reads the new one.
//! **Writes** fill stripe buffers (read-modify-write fetches what a partial write
//! keeps); a full stripe is encoded and stored under a new version handed out by the
//! metadata service (all k+m shards in parallel, each durable on its node before the
//! store counts), beside the committed one. Flush, fsync and close commit the stored
//! versions and the size with compare-and-set on the versions they were based on
//! (close-to-open consistency, as with NFS); a lost race or a stripe that could not be
//! stored anywhere is reported by each handle's next fsync or close, and the committed
//! content stays as it was. Replaced and superseded versions are deleted on the nodes
//! after the commit that made them garbage. Memory per open file is bounded by
//! [`ClientConfig`].
//!
//! Traces: what a stripe read or write met on the way (parity used, hedged shard
//! reads, the fabric, shards left out) is recorded on the span of the operation that
//! needed it (`degraded`, `hedged`, `fabric` of `fs.read`, `fs.write`, ...); readahead
//! runs in an `fs.readahead` span, a child of the read that started it.

use crate::content::{Blocked, CommitPlan, Content, Garbage, Piece};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use shingle_data::shard::read_shard_range;
use shingle_data::stripe::{ShardHome, StripeAt, StripeError, WriteRule, read_stripe, write_stripe};
use shingle_data::wire::{DeleteShard, DeleteShardRequest, ShardId};
use shingle_meta::ids::{Ino, NodeId};
use shingle_meta::map::MapView;
use shingle_meta::meta_client::MetaClient;
use shingle_meta::namespace::{Attr, Creds, Errno, FileKind, Layout, SetAttr, StripeRec, TimeNs};
use shingle_meta::placement::stripe_pg;
use shingle_meta::service::wire::HEAD_STRIPES;
use shingle_transport::{CallOptions, Health, PeerClient, RpcChannel};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::OnceCell;
use tracing::{Instrument, Span, debug, warn};

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Erasure coding of new files when their directory names none: (k, m).
    pub ec: (u8, u8),
    /// Bytes per shard (a stripe holds k × unit bytes).
    pub unit: u32,
    /// Stripes a file may hold written but not yet stored (memory bound per open file).
    pub max_dirty_stripes: usize,
    /// Stripes kept per open file for reading (including readahead).
    pub cache_stripes: usize,
    /// Stripes written but not committed before a commit is forced.
    pub commit_every: usize,
    /// Stripes of one file being stored at once (writes go on meanwhile).
    pub inflight_stripes: usize,
    /// Stripes being stored at once by the whole client (memory bound per mount).
    pub inflight_stripes_total: usize,
    /// Stripe records loaded per request when a read or write reaches a part of a
    /// layout not loaded yet (at most [`HEAD_STRIPES`], what an open reads; tests make
    /// it small so small files load their layouts in pieces).
    pub layout_window: u64,
    /// Acknowledge a stripe only with k + 1 shards on k + 1 distinct nodes: with fewer
    /// live nodes in its group (and no spare) a write fails with EIO instead of storing
    /// two shards on one node (see [`WriteRule`]).
    pub distinct_homes: bool,
}

impl ClientConfig {
    /// The layout window in use: within 1..=[`HEAD_STRIPES`].
    fn window(&self) -> u64 {
        self.layout_window.clamp(1, HEAD_STRIPES)
    }
}

impl Default for ClientConfig {
    /// ec(4,2), 1 MiB units, 2 dirty and 4 cached stripes per file, commit every 16,
    /// 4 stripes of a file (32 of the client) stored at once.
    fn default() -> Self {
        ClientConfig {
            ec: (4, 2),
            unit: 1 << 20,
            max_dirty_stripes: 2,
            cache_stripes: 4,
            commit_every: 16,
            inflight_stripes: 4,
            inflight_stripes_total: 32,
            layout_window: HEAD_STRIPES,
            distinct_homes: false,
        }
    }
}

/// Filesystem capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Usable bytes.
    pub total: u64,
    /// Free usable bytes.
    pub free: u64,
    /// Inodes in use.
    pub files: u64,
    /// Inodes available.
    pub files_free: u64,
}

/// A Shingle client. Clones share everything.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    meta: MetaClient,
    tcp: PeerClient,
    health: Arc<Health>,
    cfg: ClientConfig,
    /// The shared state of each file open here.
    open: Mutex<HashMap<Ino, Weak<Shared>>>,
    /// (mtime, size) of each file when this client last opened or committed it: an open
    /// that finds them unchanged may keep the kernel's cached pages.
    seen: Mutex<HashMap<Ino, (i64, u64)>>,
    /// Stripe stores in flight, client-wide.
    store_slots: Arc<tokio::sync::Semaphore>,
    /// Removed files open here whose data this client keeps from being purged.
    held: Mutex<HashSet<Ino>>,
    /// The task that renews and releases those holds runs.
    holding: AtomicBool,
}

/// How long a stripe store that finds the cluster full keeps trying (space of removed
/// files is purged and collected within seconds).
const ENOSPC_PATIENCE: Duration = Duration::from_secs(8);

/// How long a hold keeps a removed open file's data, and how often it is renewed
/// (a client that dies lets it lapse: the data goes within `HOLD_SECS`).
const HOLD_SECS: u32 = 30;
const HOLD_RENEW: Duration = Duration::from_secs(5);

type Guard<'a> = tokio::sync::MutexGuard<'a, FileState>;

/// Most files whose version [`Client`] remembers for page-cache reuse.
const SEEN_MAX: usize = 200_000;
/// Stripe versions reserved at once, at first and at most.
const RESERVE_MIN: u32 = 16;
const RESERVE_MAX: u32 = 1024;
/// Times a read re-plans after the version it read was replaced.
const READ_RETRIES: usize = 3;

type StripeCell = Arc<OnceCell<Bytes>>;

/// One file open on this client: shared by all its handles.
struct Shared {
    ino: Ino,
    state: tokio::sync::Mutex<FileState>,
    /// The size as seen here (for getattr without the lock).
    size: AtomicU64,
    /// Whether something is written here and not committed (for getattr).
    local: std::sync::atomic::AtomicBool,
    /// Signalled when a stripe store finishes.
    stored: tokio::sync::Notify,
    /// The attributes at open or the last change through this client (fstat of a file
    /// unlinked while open answers from them).
    attr: Mutex<Attr>,
}

struct FileState {
    /// The file's EC policy (no stripes).
    policy: Layout,
    content: Content,
    /// Whole stripes fetched for reading, by (stripe, version).
    cache: VecDeque<(u64, u64, StripeCell)>,
    /// Versions reserved so far (the next reservation doubles, up to a bound).
    reserve_next: u32,
    /// The file was removed while open: nothing is committed any more, the handles
    /// keep reading and writing what is stored.
    unlinked: bool,
    /// Stripe stores in flight.
    storing: usize,
    /// The version of the file (see [`version_of`]) whose layout `content` holds: a
    /// window loaded later must come from the same one, so a read never mixes stripes
    /// of two versions.
    layout_of: (i64, i64, u64),
    /// The shard capability a client key reads, writes and deletes this file's shards
    /// with (`shingle_transport::cap`): a read one from the open's head, a write one
    /// from the create or the last version reservation.
    cap: Option<ShardCapHeld>,
}

/// A shard capability and when it expires (Unix seconds).
#[derive(Clone)]
struct ShardCapHeld {
    bytes: Bytes,
    expires: u64,
    right: shingle_transport::cap::Right,
}

/// A capability with less left than this is renewed before it is used again: a write
/// one by the next version reservation, a read one by a new head.
const CAP_RENEW_SECS: u64 = 600;

/// What tells two versions of a file's layout apart: every commit and truncate changes
/// its mtime and ctime (and maybe its size).
fn version_of(a: &Attr) -> (i64, i64, u64) {
    (a.mtime, a.ctime, a.size)
}

/// An open file handle.
pub struct OpenFile {
    /// The inode.
    pub ino: Ino,
    creds: Creds,
    client: Weak<Inner>,
    shared: Arc<Shared>,
    /// The error sequence this handle has reported up to at fsync/close (errseq).
    seen: Mutex<u64>,
    /// The error sequence this handle's writes have reported up to.
    write_seen: Mutex<u64>,
    /// Where a sequential reader will read next.
    next_expected: AtomicU64,
}

/// A data node as stripe reads and writes carry it: its id, which the file's layout
/// records, and its address, which the shard calls use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Home {
    id: NodeId,
    addr: SocketAddr,
}

impl Home {
    /// Node `id` of the map, if the map knows its address.
    fn of(v: &MapView, id: NodeId) -> Option<Home> {
        v.addr(id).map(|addr| Home { id, addr })
    }
}

impl std::fmt::Display for Home {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.id, self.addr)
    }
}

impl ShardHome for Home {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn stripe_err(e: StripeError) -> Errno {
    stripe_err_ref(&e)
}

fn stripe_err_ref(e: &StripeError) -> Errno {
    match e {
        StripeError::WrongGroupSize { .. } => Errno::EIO,
        StripeError::Ec(_) | StripeError::Unreadable { .. } => Errno::EIO,
        StripeError::WriteFailed { first, .. } if first.contains("no space") || first.contains("ENOSPC") => {
            Errno::ENOSPC
        }
        StripeError::WriteFailed { .. } => Errno::EIO,
    }
}

impl Client {
    /// A client over a namespace client and the transport it uses.
    pub fn new(meta: MetaClient, cfg: ClientConfig) -> Client {
        let tcp = meta.transport().clone();
        Client {
            inner: Arc::new(Inner {
                meta,
                tcp,
                health: Arc::default(),
                open: Mutex::new(HashMap::new()),
                seen: Mutex::new(HashMap::new()),
                store_slots: Arc::new(tokio::sync::Semaphore::new(cfg.inflight_stripes_total.max(1))),
                held: Mutex::new(HashSet::new()),
                holding: AtomicBool::new(false),
                cfg,
            }),
        }
    }

    /// The namespace client.
    pub fn meta(&self) -> &MetaClient {
        &self.inner.meta
    }

    /// The settings.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// The default policy as a layout.
    pub fn default_policy(&self) -> Layout {
        Layout {
            k: self.inner.cfg.ec.0,
            m: self.inner.cfg.ec.1,
            unit: self.inner.cfg.unit,
            ..Default::default()
        }
    }

    /// Attributes, with the size of writes not yet committed by files open here.
    pub async fn getattr(&self, ino: Ino) -> Result<Attr, Errno> {
        let mut a = self.inner.meta.getattr(ino).await?;
        self.local_view(&mut a);
        Ok(a)
    }

    /// [`Client::getattr`] of each of `inos`, at most 32 in flight.
    pub async fn attrs(&self, inos: Vec<Ino>) -> Vec<Result<Attr, Errno>> {
        use futures_util::StreamExt;
        futures_util::stream::iter(inos)
            .map(|ino| {
                let c = self.clone();
                async move { c.getattr(ino).await }
            })
            .buffered(32)
            .collect()
            .await
    }

    /// One page of `dir` for `creds` with every entry's attributes (sizes local like
    /// [`Client::getattr`]): those the listing carried (an inode made with its name),
    /// the others read apart. An entry whose attributes could not be read apart (its
    /// inode gone meanwhile, or any other error) has none: a stat of its path then
    /// says why, and one entry never fails the listing.
    pub async fn readdir_plus(
        &self,
        creds: &Creds,
        dir: Ino,
        after: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<shingle_meta::namespace::DirEntry>, Errno> {
        let mut page = self.inner.meta.readdir_plus_as(creds, dir, after, limit).await?;
        let apart: Vec<usize> = (0..page.len()).filter(|&i| page[i].attr.is_none()).collect();
        let read = self.attrs(apart.iter().map(|&i| page[i].ino).collect()).await;
        for (i, a) in apart.into_iter().zip(read) {
            page[i].attr = a.ok();
        }
        for a in page.iter_mut().filter_map(|e| e.attr.as_mut()) {
            self.local_view(a);
        }
        Ok(page)
    }

    /// Looks up a name for `creds` (with a client key, the nodes check their search
    /// permission on `parent`), with local sizes like [`Client::getattr`].
    pub async fn lookup(&self, creds: &Creds, parent: Ino, name: &[u8]) -> Result<Attr, Errno> {
        let mut a = self.inner.meta.lookup_as(creds, parent, name).await?;
        self.local_view(&mut a);
        Ok(a)
    }

    /// A file open here with writes not yet committed has the size this client sees.
    pub(crate) fn local_view(&self, a: &mut Attr) {
        if let Some(sh) = self.shared(a.ino)
            && sh.local.load(Ordering::Acquire)
        {
            a.size = sh.size.load(Ordering::Acquire);
        }
    }

    fn shared(&self, ino: Ino) -> Option<Arc<Shared>> {
        let open = self.inner.open.lock();
        open.get(&ino).and_then(Weak::upgrade)
    }

    /// The attributes of a file open here that the metadata service no longer has (it
    /// was removed while open): nlink 0, this client's size. `None` when not open here.
    pub async fn unlinked_attr(&self, ino: Ino) -> Option<Attr> {
        let sh = self.shared(ino)?;
        let mut st = sh.state.lock().await;
        st.unlinked = true;
        let mut a = sh.attr.lock().clone();
        a.size = st.content.size();
        a.nlink = 0;
        drop(st);
        Some(a)
    }

    /// True while this client has the file open.
    pub fn is_open(&self, ino: Ino) -> bool {
        self.shared(ino).is_some()
    }

    fn any_open(&self) -> bool {
        let open = self.inner.open.lock();
        open.values().any(|w| w.strong_count() > 0)
    }

    /// The inode `name` in `parent` names, when this client has it open (its data must
    /// outlive the name if the name is about to go).
    async fn open_victim(&self, creds: &Creds, parent: Ino, name: &[u8]) -> Option<Ino> {
        if !self.any_open() {
            return None;
        }
        let a = self.inner.meta.lookup_as(creds, parent, name).await.ok()?;
        (a.kind == FileKind::File && self.is_open(a.ino)).then_some(a.ino)
    }

    /// Removes `name`. A file this client has open keeps its data until its last close
    /// here (POSIX: an open file outlives its name); then it is purged.
    pub async fn unlink(&self, creds: &Creds, parent: Ino, name: &[u8]) -> Result<(), Errno> {
        self.unlink_at(creds, parent, name).await.map(|_| ())
    }

    /// [`Client::unlink`], answering when it ran (what `parent`'s modification and
    /// change times became), if the nodes said.
    pub async fn unlink_at(&self, creds: &Creds, parent: Ino, name: &[u8]) -> Result<Option<TimeNs>, Errno> {
        let victim = self.open_victim(creds, parent, name).await;
        if let Some(ino) = victim {
            self.load_whole_layout(ino).await;
        }
        let keep = if victim.is_some() { HOLD_SECS } else { 0 };
        let at = self.inner.meta.unlink_at(creds, parent, name, keep).await?;
        if let Some(ino) = victim {
            self.keep_holding(ino);
        }
        Ok(at)
    }

    /// Renames; a file replaced by the rename is kept like an unlinked one while open here.
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
        let victim = if noreplace || exchange {
            None
        } else {
            self.open_victim(creds, newparent, newname).await
        };
        if let Some(ino) = victim {
            self.load_whole_layout(ino).await;
        }
        self.inner
            .meta
            .rename(creds, parent, name, newparent, newname, noreplace, exchange)
            .await?;
        if let Some(ino) = victim {
            self.hold(ino).await;
        }
        Ok(())
    }

    /// Loads every stripe record of file `ino`, open here, whose name is about to go:
    /// its records go with its last link, and its handles must still read all of it.
    async fn load_whole_layout(&self, ino: Ino) {
        let Some(sh) = self.shared(ino) else { return };
        let mut st = sh.state.lock().await;
        if let Err(e) = self.load_range(ino, &mut st, 0, u64::MAX).await {
            warn!(ino = ino.0, error = %e, "cannot load the layout of an open file being removed; reads past its first window may fail");
        }
    }

    /// Keeps removed file `ino`'s data while this client has it open: a hold now, renewed
    /// every few seconds, released after the last close.
    async fn hold(&self, ino: Ino) {
        if let Err(e) = self.inner.meta.hold_purge(ino, HOLD_SECS).await {
            warn!(ino = ino.0, error = %e, "cannot keep a removed open file's data; reads of it may fail");
            return;
        }
        self.keep_holding(ino);
    }

    /// Renews the hold on `ino` while it is open here, then releases it.
    fn keep_holding(&self, ino: Ino) {
        self.inner.held.lock().insert(ino);
        if self.inner.holding.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(HOLD_RENEW).await;
                let Some(inner) = weak.upgrade() else { return };
                let c = Client { inner };
                let held: Vec<Ino> = c.inner.held.lock().iter().copied().collect();
                for ino in held {
                    let open = c.is_open(ino);
                    let secs = if open { HOLD_SECS } else { 0 };
                    match c.inner.meta.hold_purge(ino, secs).await {
                        Ok(()) if !open => {
                            c.inner.held.lock().remove(&ino);
                        }
                        Ok(()) => {}
                        Err(e) => debug!(ino = ino.0, error = %e, "renewing a hold failed; retried"),
                    }
                }
            }
        });
    }

    fn remember(&self, ino: Ino, mtime: i64, size: u64) -> bool {
        let mut seen = self.inner.seen.lock();
        if seen.len() >= SEEN_MAX {
            seen.clear();
        }
        seen.insert(ino, (mtime, size)) == Some((mtime, size))
    }

    /// Creates regular file `name` in `parent` and opens it. The create hands this
    /// client the file's first [`RESERVE_MIN`] stripe versions, so writing a small new
    /// file costs no `ReserveVersions` round trip of its own.
    pub async fn create(
        &self,
        creds: &Creds,
        parent: Ino,
        name: &[u8],
        perm: u32,
    ) -> Result<(Attr, Arc<OpenFile>), Errno> {
        let (a, made) = self
            .inner
            .meta
            .create_file(creds, parent, name, perm, self.default_policy(), RESERVE_MIN)
            .await?;
        // The create's write capability (client keys), taken before an open brings a
        // read one.
        let cap = self.inner.meta.take_cap(a.ino);
        let f = match made {
            // A new file: the reply is what reading it back would give (no stripes,
            // no data), so it is opened without a round trip.
            Some(layout) => {
                let rec = shingle_meta::namespace::InodeRec {
                    attr: a.clone(),
                    target: None,
                    parent: Some(parent),
                    xattrs: Default::default(),
                    layout: Some(layout),
                    created_by: 0,
                };
                self.open_rec(creds, rec).await.0
            }
            None => self.open(creds, a.ino).await?,
        };
        {
            let mut st = f.shared.state.lock().await;
            // Versions 1..=RESERVE_MIN are this create's (a retried create that the
            // first attempt made answers the same inode, still ours); a file open here
            // already has versions of its own.
            if st.content.never_had_versions() && !st.unlinked {
                st.content.add_versions(1, RESERVE_MIN);
                st.reserve_next = (RESERVE_MIN * 2).min(RESERVE_MAX);
            }
            st.keep_cap(cap);
        }
        Ok((a, f))
    }

    /// Opens a file (fresh attributes and layout: close-to-open consistency).
    pub async fn open(&self, creds: &Creds, ino: Ino) -> Result<Arc<OpenFile>, Errno> {
        Ok(self.open_cached(creds, ino).await?.0)
    }

    /// The shared state of `ino`, made from `rec` when the file is not open here, or
    /// refreshed from it (another client's committed changes become visible).
    async fn shared_for(&self, ino: Ino, rec: shingle_meta::namespace::InodeRec) -> Arc<Shared> {
        let layout = rec.layout.unwrap_or_else(|| self.default_policy());
        let existing = self.shared(ino);
        if let Some(sh) = existing {
            let mut st = sh.state.lock().await;
            if !st.unlinked {
                st.content
                    .set_head(self.inner.cfg.window(), layout.stripes.clone(), rec.attr.size);
                st.layout_of = version_of(&rec.attr);
                if !st.content.has_local() {
                    st.policy = layout.without_stripes();
                }
                sh.publish(&st);
                *sh.attr.lock() = rec.attr.clone();
            }
            drop(st);
            return sh;
        }
        let sb = layout.stripe_bytes().max(1);
        let sh = Arc::new(Shared {
            ino,
            size: AtomicU64::new(rec.attr.size),
            local: Default::default(),
            stored: tokio::sync::Notify::new(),
            attr: Mutex::new(rec.attr.clone()),
            state: tokio::sync::Mutex::new(FileState {
                policy: layout.without_stripes(),
                layout_of: version_of(&rec.attr),
                content: Content::with_head(sb, self.inner.cfg.window(), layout.stripes.clone(), rec.attr.size),
                cache: VecDeque::new(),
                reserve_next: RESERVE_MIN,
                unlinked: false,
                storing: 0,
                cap: None,
            }),
        });
        let mut open = self.inner.open.lock();
        // Another task may have opened it meanwhile: share theirs.
        if let Some(other) = open.get(&ino).and_then(Weak::upgrade) {
            return other;
        }
        if open.len() > 4096 {
            open.retain(|_, w| w.strong_count() > 0);
        }
        open.insert(ino, Arc::downgrade(&sh));
        sh
    }

    /// Like [`Client::open`]; also says whether the file is unchanged since this client
    /// last opened or wrote it (so cached pages of it are still valid).
    pub async fn open_cached(&self, creds: &Creds, ino: Ino) -> Result<(Arc<OpenFile>, bool), Errno> {
        // With a client key, the head brings a read capability for the file's shards.
        let rec = self.inner.meta.head_as(creds, ino).await?;
        if rec.attr.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        Ok(self.open_rec(creds, rec).await)
    }

    /// Opens the file whose record (attributes and first stripes) is `rec`.
    async fn open_rec(&self, creds: &Creds, rec: shingle_meta::namespace::InodeRec) -> (Arc<OpenFile>, bool) {
        let ino = rec.attr.ino;
        let unchanged = self.remember(ino, rec.attr.mtime, rec.attr.size);
        let shared = self.shared_for(ino, rec).await;
        let seen = {
            let mut st = shared.state.lock().await;
            st.keep_cap(self.inner.meta.take_cap(ino));
            st.content.err_seq()
        };
        let f = Arc::new(OpenFile {
            ino,
            creds: creds.clone(),
            client: Arc::downgrade(&self.inner),
            shared,
            seen: Mutex::new(seen),
            write_seen: Mutex::new(seen),
            next_expected: AtomicU64::new(0),
        });
        (f, unchanged)
    }

    /// Changes attributes. A size change goes through the file's content (open here or
    /// not): what is written is committed first, a cut inside a stripe rewrites that
    /// stripe short (so a later extension reads zeros there), then the metadata
    /// service changes the size.
    pub async fn setattr(&self, creds: &Creds, ino: Ino, set: SetAttr) -> Result<Attr, Errno> {
        let Some(size) = set.size else {
            let a = self.inner.meta.setattr(creds, ino, set).await?;
            if let Some(sh) = self.shared(ino) {
                *sh.attr.lock() = a.clone();
            }
            return Ok(a);
        };
        let rec = self.inner.meta.head(ino).await?;
        if rec.attr.kind != FileKind::File {
            return self.inner.meta.setattr(creds, ino, set).await;
        }
        let sh = self.shared_for(ino, rec).await;
        let st = sh.state.lock().await;
        let (mut st, r) = self.truncate_locked(creds, &sh, st, size, set).await;
        self.collect_garbage(ino, &mut st);
        sh.publish(&st);
        if let Ok(a) = &r {
            *sh.attr.lock() = a.clone();
        }
        r
    }

    async fn truncate_locked<'a>(
        &self,
        creds: &Creds,
        sh: &'a Arc<Shared>,
        st: Guard<'a>,
        size: u64,
        set: SetAttr,
    ) -> (Guard<'a>, Result<Attr, Errno>) {
        // What is written so far is committed first: the cut applies after it.
        let (mut st, r) = self.store_all(creds, sh, st).await;
        if let Err(e) = r {
            return (st, Err(e));
        }
        if let Err(e) = self.commit(creds, sh.ino, &mut st).await {
            return (st, Err(e));
        }
        // The stripes the cut removes (their versions become garbage) and the one it
        // lands in must be known.
        let cut_from = size / st.content.stripe_bytes();
        if let Err(e) = self.load_range(sh.ino, &mut st, cut_from, u64::MAX).await {
            return (st, Err(e));
        }
        if let Err(e) = self.apply(sh.ino, &mut st, |c| c.truncate(size)).await {
            return (st, Err(e));
        }
        st.cache.clear();
        let (mut st, r) = self.store_all(creds, sh, st).await;
        if let Err(e) = r {
            return (st, Err(e));
        }
        if let Err(e) = self.commit(creds, sh.ino, &mut st).await {
            return (st, Err(e));
        }
        match self.inner.meta.setattr(creds, sh.ino, set).await {
            Ok(a) => {
                st.content.truncated(a.size);
                (st, Ok(a))
            }
            Err(e) => (st, Err(e)),
        }
    }

    /// Capacity (usable after erasure coding, by the default policy) and inode counts.
    pub async fn statfs(&self) -> StatFs {
        use shingle_data::wire::{Stat, StatRequest};
        use shingle_transport::{CallOptions, RpcChannel};
        let v = self.inner.meta.view();
        let mut s = StatFs::default();
        for n in v.map.nodes.values().filter(|n| n.roles.data) {
            let r = self
                .inner
                .tcp
                .call::<Stat>(
                    n.addr,
                    &StatRequest {},
                    CallOptions::timeout(std::time::Duration::from_secs(2)),
                )
                .await;
            if let Ok(r) = r {
                s.total += r.capacity_bytes;
                // Live bytes, not written: garbage is space the zone GC gives back.
                s.free += r.capacity_bytes.saturating_sub(r.live_bytes);
            }
        }
        let (k, m) = (u64::from(self.inner.cfg.ec.0), u64::from(self.inner.cfg.ec.1));
        s.total = s.total * k / (k + m).max(1);
        s.free = s.free * k / (k + m).max(1);
        for (_, r) in self.inner.meta.stats().await {
            if let Ok(r) = r {
                s.files += r.inodes;
            }
        }
        s.files_free = (1u64 << 40).saturating_sub(s.files);
        s
    }

    /// Where the shards of stripe `s` are, from the hints of its record: `None` for a
    /// shard that was never stored (hint 0) or whose node is down or out of the cluster,
    /// so a read goes to parity at once instead of waiting for it. A hint naming a node
    /// no longer in the map falls back to the group's current node at that index.
    fn shard_sources(&self, ino: Ino, s: u64, n: usize, hint: &[Option<NodeId>]) -> Vec<Option<Home>> {
        let v = self.inner.meta.view();
        let group = v.placement.pg(stripe_pg(ino, s, v.map.pgs));
        (0..n)
            .map(|i| {
                let id = match hint.get(i).copied() {
                    // Stored nowhere (a degraded write): parity stands in.
                    Some(None) => return None,
                    Some(Some(h)) if v.map.nodes.contains_key(&h) => h,
                    _ => *group.get(i)?,
                };
                v.map.is_up(id).then(|| Home::of(&v, id)).flatten()
            })
            .collect()
    }

    async fn fetch_stripe(
        &self,
        ino: Ino,
        layout: &Layout,
        s: u64,
        rec: &StripeRec,
        cap: &Bytes,
    ) -> Result<Bytes, Errno> {
        let policy = crate::ec_policy(layout);
        let n = usize::from(layout.k) + usize::from(layout.m);
        let sources = self.shard_sources(ino, s, n, &rec.nodes);
        let r = read_stripe(
            &self.inner.tcp,
            &self.inner.health,
            policy,
            &sources,
            StripeAt::new(ino.0, s, rec.version).with_cap(cap.clone()),
            rec.len as usize,
        )
        .await
        .map_err(|e| {
            warn!(ino = ino.0, stripe = s, error = %e, "stripe read failed");
            stripe_err(e)
        })?;
        if !r.failed.is_empty() || r.hedged > 0 {
            debug!(ino = ino.0, stripe = s, failed = ?r.failed, hedged = r.hedged, "degraded or hedged stripe read");
        }
        // On the operation's span (fields it does not have are ignored).
        let span = Span::current();
        let m = shingle_metrics::get();
        if r.degraded {
            span.record("degraded", true);
            m.degraded_reads.inc();
        }
        if r.hedged > 0 {
            span.record("hedged", true);
            m.hedged_requests.inc_by(r.hedged as u64);
        }
        if let Some(f) = r.fabric {
            span.record("fabric", f);
        }
        Ok(r.data)
    }

    async fn store_stripe(&self, layout: &Layout, at: StripeAt, data: Bytes) -> Result<StripeRec, Errno> {
        let (ino, s, version) = (Ino(at.ino), at.stripe, at.version);
        let policy = crate::ec_policy(layout);
        let n = usize::from(layout.k) + usize::from(layout.m);
        let v = self.inner.meta.view();
        let g = stripe_pg(ino, s, v.map.pgs);
        let group = v.placement.pg(g);
        let rule = WriteRule::for_policy(policy, self.inner.cfg.distinct_homes);
        if group.is_empty() || (group.len() < n && !rule.share_nodes) {
            warn!(
                need = n,
                have = group.len(),
                "placement group smaller than the stripe: not enough data nodes"
            );
            return Err(Errno::EIO);
        }
        // Members that are down get a spare at once; the others are tried first. A
        // group narrower than the stripe (nodes given up on in a small cluster) holds
        // some shards twice; `write_stripe` acknowledges only what survives one more
        // node loss.
        let mut spares: VecDeque<NodeId> = v.map.pg_spares(g, group).into();
        let mut targets = Vec::with_capacity(n);
        let mut down = Vec::new();
        for id in group.iter().cycle().take(n) {
            let id = if v.map.is_up(*id) {
                *id
            } else {
                spares.pop_front().unwrap_or(*id)
            };
            let home = Home::of(&v, id).ok_or(Errno::EIO)?;
            if !v.map.is_up(id) {
                down.push(home);
            }
            targets.push(home);
        }
        let spares: Vec<Home> = spares.iter().filter_map(|id| Home::of(&v, *id)).collect();
        let len = data.len() as u64;
        // A full cluster may be getting space back (files removed a moment ago are
        // purged within seconds, then their zones collected): ENOSPC is retried for a
        // while before the writer gets it, as a local filesystem flushes pending frees
        // before it gives up.
        let give_up = std::time::Instant::now() + ENOSPC_PATIENCE;
        let mut pause = Duration::from_millis(100);
        let placed = loop {
            let r = write_stripe(
                &self.inner.tcp,
                &self.inner.health,
                policy,
                &targets,
                &spares,
                &down,
                rule,
                at.clone(),
                data.clone(),
            )
            .await;
            match r {
                Err(e) if stripe_err_ref(&e) == Errno::ENOSPC && std::time::Instant::now() + pause < give_up => {
                    debug!(ino = ino.0, stripe = s, error = %e, "cluster full; retrying the stripe");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    warn!(ino = ino.0, stripe = s, error = %e, "stripe write failed");
                    return Err(stripe_err(e));
                }
                Ok(placed) => break placed,
            }
        };
        let nodes: Vec<Option<NodeId>> = placed.iter().map(|h| h.map(|h| h.id)).collect();
        if nodes.contains(&None) {
            Span::current().record("degraded", true);
            debug!(
                ino = ino.0,
                stripe = s,
                ?nodes,
                "stripe stored degraded; repair will complete it"
            );
        }
        Ok(StripeRec { version, len, nodes })
    }

    /// Loads the committed stripe records of stripes `from..to` of file `ino` that the
    /// content does not know yet, a window per request. Every window must come from the
    /// version of the file the content's layout was read at; when the file changed
    /// since, its layout is read again from the start (as after a lost read race), so
    /// a read never mixes stripes of two versions. A file that keeps changing under
    /// the loads is taken as it is found on the last try.
    async fn load_range(&self, ino: Ino, st: &mut FileState, from: u64, to: u64) -> Result<(), Errno> {
        const TRIES: usize = 8;
        for attempt in 1..=TRIES {
            let unknown = st.content.unknown_windows(from, to);
            if unknown.is_empty() {
                return Ok(());
            }
            let w = st.content.window();
            let mut stale = false;
            for win in unknown {
                let lo = win.saturating_mul(w);
                let (recs, attr) = self.inner.meta.stripes(ino, lo, lo.saturating_add(w)).await?;
                if attempt < TRIES && attr.as_ref().map(version_of) != Some(st.layout_of) {
                    stale = true;
                    break;
                }
                st.content.load(win, recs);
            }
            if stale {
                let head = self.inner.meta.head(ino).await?;
                st.adopt(head, self.inner.cfg.window());
            }
        }
        Ok(())
    }

    /// Runs `op` on the content, fetching (and filling in) each stripe it says it needs
    /// first, until it applies or is refused.
    async fn apply(
        &self,
        ino: Ino,
        st: &mut FileState,
        mut op: impl FnMut(&mut Content) -> Result<(), Blocked>,
    ) -> Result<(), Errno> {
        loop {
            match op(&mut st.content) {
                Ok(()) => return Ok(()),
                Err(Blocked::Fetch(f)) => {
                    let bytes = self
                        .fetch_stripe(ino, &st.policy, f.stripe, &f.rec, &st.cap_bytes())
                        .await?;
                    st.content.fill(f.stripe, f.rec.version, &bytes);
                }
                Err(Blocked::Error(e)) => return Err(e),
            }
        }
    }

    /// With a client key, fetches a new read capability for the file when the one held
    /// is missing or about to expire (a handle kept open for hours). Best effort: a
    /// failure leaves the old one, and a data node's refusal says what went wrong.
    async fn renew_read_cap(&self, creds: &Creds, ino: Ino, st: &mut FileState) {
        if self.inner.tcp.identity().is_none() || !st.cap_due() {
            return;
        }
        match self.inner.meta.head_as(creds, ino).await {
            Ok(_) => st.keep_cap(self.inner.meta.take_cap(ino)),
            Err(e) => debug!(ino = ino.0, errno = ?e, "renewing the shard capability failed"),
        }
    }

    /// Reserves versions for `st` when it has none left, or when this client holds a
    /// client key and its shard capability for the file is missing or about to expire
    /// (the reservation brings a new one).
    async fn ensure_versions(&self, creds: &Creds, ino: Ino, st: &mut FileState) -> Result<(), Errno> {
        let cap_due = self.inner.tcp.identity().is_some() && !st.unlinked && (st.cap_due() || !st.write_cap());
        if !st.content.needs_versions() && !cap_due {
            return Ok(());
        }
        let n = st.reserve_next;
        let first = if st.unlinked {
            Err(Errno::ENOENT)
        } else {
            self.inner.meta.reserve_versions(creds, ino, st.policy.clone(), n).await
        };
        let first = match first {
            Ok(first) => first,
            Err(Errno::ENOENT) if !self.removed(ino).await => return Err(Errno::EIO),
            Err(Errno::ENOENT) => {
                // Removed while open: no layout will name these versions again, so any
                // unlikely-to-collide range serves the handles until the last close.
                st.unlinked = true;
                let mut b = [0u8; 8];
                let _ = getrandom::fill(&mut b);
                (u64::from_le_bytes(b) >> 2) | (1 << 62)
            }
            Err(e) => return Err(e),
        };
        st.content.add_versions(first, n);
        st.reserve_next = (n * 2).min(RESERVE_MAX);
        st.keep_cap(self.inner.meta.take_cap(ino));
        Ok(())
    }

    /// Starts storing dirty stripe `s` under a new version, in the background: the
    /// task records the outcome in the content (a failure drops the stripe's data and
    /// is reported by every handle) and wakes waiters. Fails only when no version can
    /// be had (the stripe then stays dirty: nothing is lost).
    async fn start_store(&self, creds: &Creds, sh: &Arc<Shared>, st: &mut FileState, s: u64) -> Result<(), Errno> {
        self.ensure_versions(creds, sh.ino, st).await?;
        let Some((data, version)) = st.content.start_store(s) else {
            return Ok(());
        };
        st.storing += 1;
        // Permits are given back before a task takes a file's lock: no cycle.
        let permit = self.inner.store_slots.clone().acquire_owned().await;
        let (c, sh, policy, ino) = (self.clone(), sh.clone(), st.policy.clone(), sh.ino);
        let at = StripeAt::new(ino.0, s, version).with_cap(st.cap_bytes());
        tokio::spawn(
            async move {
                let r = if data.is_empty() {
                    Ok(StripeRec {
                        version,
                        len: 0,
                        nodes: Vec::new(),
                    })
                } else {
                    c.store_stripe(&policy, at, data).await
                };
                drop(permit);
                let mut st = sh.state.lock().await;
                st.content.store_done(s, version, r);
                st.storing -= 1;
                c.collect_garbage(ino, &mut st);
                sh.publish(&st);
                drop(st);
                sh.stored.notify_waiters();
            }
            .in_current_span(),
        );
        Ok(())
    }

    /// Waits (without the lock) until at most `max` stores of the file are in flight.
    async fn wait_stores<'a>(sh: &'a Shared, mut st: Guard<'a>, max: usize) -> Guard<'a> {
        while st.storing > max {
            let notified = sh.stored.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            drop(st);
            notified.await;
            st = sh.state.lock().await;
        }
        st
    }

    /// Stores every dirty stripe and waits for every store in flight. Errors of the
    /// stores are in the content's error sequence; the result is a failure to start.
    async fn store_all<'a>(
        &self,
        creds: &Creds,
        sh: &'a Arc<Shared>,
        mut st: Guard<'a>,
    ) -> (Guard<'a>, Result<(), Errno>) {
        let mut first = Ok(());
        for s in st.content.dirty_stripes() {
            if let Err(e) = self.start_store(creds, sh, &mut st, s).await {
                first = first.and(Err(e));
            }
        }
        (Self::wait_stores(sh, st, 0).await, first)
    }

    /// Commits the stored stripes. A lost race (`ESTALE`) drops them, reloads the
    /// layout and is reported through the error sequence; other errors are returned.
    async fn commit(&self, creds: &Creds, ino: Ino, st: &mut FileState) -> Result<(), Errno> {
        self.commit_then(creds, ino, st, None).await.map(drop)
    }

    /// [`Client::commit`], and then `then` (the caller's credentials and changes) in the
    /// same operation: the attributes after both, or `None` when there was nothing to
    /// commit (and `then` was not applied). Refused as a whole, it leaves the writes to
    /// the next commit.
    async fn commit_then(
        &self,
        creds: &Creds,
        ino: Ino,
        st: &mut FileState,
        then: Option<(&Creds, &SetAttr)>,
    ) -> Result<Option<Attr>, Errno> {
        if st.unlinked {
            return Ok(None);
        }
        let Some(plan): Option<CommitPlan> = st.content.begin_commit() else {
            return Ok(None);
        };
        // With a setattr, the operation runs with its caller's credentials.
        let who = then.map_or(creds, |(caller, _)| caller);
        let mut r = Err(Errno::EIO);
        for _ in 0..2 {
            let (policy, writes, set) = (st.policy.clone(), plan.writes.clone(), then.map(|(_, s)| s.clone()));
            r = self
                .inner
                .meta
                .commit_write_then(who, ino, policy, plan.size, writes, set)
                .await;
            if r != Err(Errno::ENOENT) || self.removed(ino).await {
                break;
            }
            // The file is there: that answer came from a copy that was not current.
            // Once more; never take it for an unlink (the data would stay local).
            warn!(ino = ino.0, "commit answered ENOENT for a file that exists");
            r = Err(Errno::EIO);
        }
        if r == Err(Errno::ENOENT) {
            // Unlinked while open: the handles keep what is stored, locally.
            debug!(
                ino = ino.0,
                "commit: the file was removed while open; its data stays with the open handles"
            );
            st.unlinked = true;
            return Ok(None);
        }
        let reload = st
            .content
            .commit_done(&plan, r.as_ref().map(|a| a.size).map_err(|e| *e));
        if let Ok(a) = &r {
            // The kernel's pages hold what was just written: a later open may keep them.
            self.remember(ino, a.mtime, a.size);
            if let Some(sh) = self.shared(ino) {
                *sh.attr.lock() = a.clone();
            }
        }
        if reload {
            warn!(
                ino = ino.0,
                "another client committed the same stripes first; this client's writes to them are dropped"
            );
            if let Ok(rec) = self.inner.meta.head(ino).await {
                st.adopt(rec, self.inner.cfg.window());
            }
        }
        self.collect_garbage(ino, st);
        match r {
            Ok(a) => Ok(Some(a)),
            Err(Errno::ESTALE) if then.is_none() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether `ino` is really gone (its record removed), asked again: an ENOENT from
    /// an operation is taken for an unlink only when a read agrees.
    async fn removed(&self, ino: Ino) -> bool {
        matches!(self.inner.meta.getattr(ino).await, Err(Errno::ENOENT))
    }

    /// Deletes versions nobody references any more on their nodes, in the background
    /// (best effort: a node that misses a delete keeps an orphan for the sweep).
    fn collect_garbage(&self, ino: Ino, st: &mut FileState) {
        let garbage = st.content.take_garbage();
        if garbage.is_empty() {
            return;
        }
        let cap = st.cap_bytes();
        if self.inner.tcp.identity().is_some() && !st.write_cap() {
            // A client key without a write capability for the file (it truncated a
            // file it never wrote) may not delete its shards: the orphan sweep will.
            debug!(
                ino = ino.0,
                versions = garbage.len(),
                "no shard capability; old versions left to the orphan sweep"
            );
            return;
        }
        let n = usize::from(st.policy.k) + usize::from(st.policy.m);
        let c = self.clone();
        tokio::spawn(async move {
            for g in garbage {
                c.delete_version(ino, n, &g, &cap).await;
            }
        });
    }

    async fn delete_version(&self, ino: Ino, n: usize, g: &Garbage, cap: &Bytes) {
        let v = self.inner.meta.view();
        let group = v.placement.pg(stripe_pg(ino, g.stripe, v.map.pgs));
        for i in 0..n {
            let mut targets: Vec<NodeId> = Vec::new();
            if let Some(h) = g.nodes.get(i).copied().flatten() {
                targets.push(h);
            }
            if let Some(id) = group.get(i) {
                targets.push(*id);
            }
            if g.nodes.is_empty() {
                // Where a failed store may have put it: any spare of the group too.
                targets.extend(v.map.pg_spares(stripe_pg(ino, g.stripe, v.map.pgs), group));
            }
            targets.sort_unstable();
            targets.dedup();
            for id in targets {
                let Some(addr) = v.addr(id).filter(|_| v.map.is_up(id)) else {
                    continue;
                };
                let req = DeleteShardRequest {
                    id: Some(ShardId {
                        ino: ino.0,
                        stripe: g.stripe,
                        shard: i as u32,
                    }),
                    version: g.version,
                    cap: cap.clone(),
                };
                let r = self
                    .inner
                    .tcp
                    .call::<DeleteShard>(addr, &req, CallOptions::timeout(Duration::from_secs(5)))
                    .await;
                if let Err(e) = r {
                    debug!(ino = ino.0, stripe = g.stripe, version = g.version, node = %addr, error = %e, "deleting an old version failed; the orphan sweep will");
                }
            }
        }
    }

    /// Reads bytes `range` of stripe `s` (version `rec`) from the data shards that
    /// hold them, without decoding; `None` when a shard is not reachable (the caller
    /// then reads the whole stripe, from parity if need be).
    async fn read_range(
        &self,
        ino: Ino,
        policy: &Layout,
        s: u64,
        rec: &StripeRec,
        range: std::ops::Range<usize>,
        cap: &Bytes,
    ) -> Option<Bytes> {
        let n = usize::from(policy.k) + usize::from(policy.m);
        let sources = self.shard_sources(ino, s, n, &rec.nodes);
        let unit = policy.unit as usize;
        let mut out = BytesMut::with_capacity(range.len());
        let mut pos = range.start;
        while pos < range.end {
            let shard = pos / unit;
            let end = range.end.min((shard + 1) * unit);
            let node = (*sources.get(shard)?)?.addr;
            if self.inner.health.suspected(node) {
                return None;
            }
            let id = ShardId {
                ino: ino.0,
                stripe: s,
                shard: shard as u32,
            };
            let ticket = self.inner.health.start(node);
            let r = read_shard_range(
                &self.inner.tcp,
                node,
                id,
                rec.version,
                (pos - shard * unit) as u64,
                (end - pos) as u64,
                cap,
            )
            .await;
            match r {
                Ok(b) if b.len() == end - pos => {
                    ticket.finish(true);
                    out.extend_from_slice(&b);
                }
                Ok(_) => {
                    ticket.finish(true);
                    return None;
                }
                Err(e) => {
                    ticket.finish(e.errno().is_some());
                    debug!(ino = ino.0, stripe = s, shard, error = %e, "shard range read failed; reading the stripe");
                    return None;
                }
            }
            pos = end;
        }
        Some(out.freeze())
    }
}

impl OpenFile {
    fn client(&self) -> Result<Client, Errno> {
        self.client.upgrade().map(|inner| Client { inner }).ok_or(Errno::EIO)
    }

    /// Reads up to `len` bytes at `offset` (short only at end of file). The one
    /// retry rule of reads: a version replaced under the read (`ESTALE`) reloads the
    /// layout and plans again, a few times; a metadata answer of "try again" (`EAGAIN`,
    /// a partition changing hands) is tried once more. Each retry is counted in the
    /// caller's span (`retries`).
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, Errno> {
        let c = self.client()?;
        let mut attempt = 0;
        let mut again = false;
        loop {
            attempt += 1;
            let r = self.read_once(&c, offset, len).await;
            if matches!(r, Err(Errno::ESTALE | Errno::EAGAIN)) {
                tracing::Span::current().record("retries", attempt);
            }
            match r {
                Err(Errno::ESTALE) if attempt < READ_RETRIES => {
                    // The version planned was replaced: reload the layout, plan again.
                    self.refresh(&c).await;
                }
                Err(Errno::ESTALE) => return Err(Errno::EIO),
                Err(Errno::EAGAIN) if !again => again = true,
                r => return r,
            }
        }
    }

    /// Reloads the committed layout (another client replaced a stripe we read).
    async fn refresh(&self, c: &Client) {
        if let Ok(rec) = c.inner.meta.head(self.ino).await {
            let mut st = self.shared.state.lock().await;
            if !st.unlinked {
                st.adopt(rec, c.inner.cfg.window());
                self.shared.publish(&st);
            }
        }
    }

    async fn read_once(&self, c: &Client, offset: u64, len: u32) -> Result<Bytes, Errno> {
        let prev = self.next_expected.swap(offset + u64::from(len), Ordering::Relaxed);
        // Plan under the lock; fetch without it (versions are immutable).
        let (plan, policy, cells, cap) = {
            let mut st = self.shared.state.lock().await;
            let (from, to) = st.content.stripe_span(offset, u64::from(len));
            c.load_range(self.ino, &mut st, from, to).await?;
            c.renew_read_cap(&self.creds, self.ino, &mut st).await;
            let plan = st.content.read_plan(offset, u64::from(len));
            let sb = st.content.stripe_bytes();
            // A reader that goes on where it stopped, or whose large reads stay in (or
            // move to the next of) the stripes it read (the kernel's readahead arrives
            // out of order). Small reads elsewhere are random: byte ranges only.
            let near = prev != 0 && (offset / sb).abs_diff(prev.saturating_sub(1) / sb) <= 1;
            let sequential = offset == prev || (near && u64::from(len) >= 64 << 10);
            let mut cells = HashMap::new();
            let mut last_remote = None;
            for p in &plan {
                if let Piece::Remote { stripe, rec, range } = p {
                    // Whole stripes for a sequential reader, a large read or a stripe
                    // already cached; a byte range otherwise.
                    let cached = st.cached(*stripe, rec.version);
                    if cached.is_some() || sequential || range.len() as u64 >= u64::from(st.policy.unit) {
                        let cell = cached.unwrap_or_else(|| st.cell(*stripe, rec.version, c.inner.cfg.cache_stripes));
                        cells.insert(*stripe, cell);
                    }
                    last_remote = Some(*stripe);
                }
            }
            // Readahead: a sequential reader gets the next stripe started now.
            if sequential && let Some(last) = last_remote {
                self.read_ahead(c, &mut st, last + 1);
            }
            (plan, st.policy.clone(), cells, st.cap_bytes())
        };
        self.assemble(c, plan, &policy, &cells, &cap, len).await
    }

    /// Starts fetching stripe `next` into the cache (when it is known, stored, and not
    /// cached yet), without waiting for it.
    fn read_ahead(&self, c: &Client, st: &mut FileState, next: u64) {
        let sb = st.content.stripe_bytes();
        if c.inner.cfg.cache_stripes > 1
            && st.content.known(next)
            && let Some(Piece::Remote { stripe, rec, .. }) = st.content.read_plan(next * sb, 1).into_iter().next()
            && st.cached(stripe, rec.version).is_none()
        {
            let cell = st.cell(stripe, rec.version, c.inner.cfg.cache_stripes);
            let (c2, policy, ino, cap) = (c.clone(), st.policy.clone(), self.ino, st.cap_bytes());
            let span = tracing::info_span!(
                "fs.readahead",
                ino = ino.0,
                stripe,
                degraded = false,
                hedged = false,
                fabric = tracing::field::Empty,
            );
            tokio::spawn(
                async move {
                    let _ = cell
                        .get_or_try_init(|| c2.fetch_stripe(ino, &policy, stripe, &rec, &cap))
                        .await;
                }
                .instrument(span),
            );
        }
    }

    /// The bytes of a read from its plan: zeros, bytes in memory, and stored stripes —
    /// from their cache cells (fetched whole once), else as a byte range.
    async fn assemble(
        &self,
        c: &Client,
        plan: Vec<Piece>,
        policy: &Layout,
        cells: &HashMap<u64, StripeCell>,
        cap: &Bytes,
        len: u32,
    ) -> Result<Bytes, Errno> {
        let mut out = BytesMut::with_capacity(len as usize);
        for p in plan {
            match p {
                Piece::Zeros(n) => out.resize(out.len() + n, 0),
                Piece::Local(b) => out.extend_from_slice(&b),
                Piece::Remote { stripe, rec, range } => {
                    let data = match cells.get(&stripe) {
                        Some(cell) => cell
                            .get_or_try_init(|| c.fetch_stripe(self.ino, policy, stripe, &rec, cap))
                            .await
                            .cloned()
                            .map_err(|_| Errno::ESTALE)?,
                        None => match c.read_range(self.ino, policy, stripe, &rec, range.clone(), cap).await {
                            Some(b) => {
                                out.extend_from_slice(&b);
                                continue;
                            }
                            None => c
                                .fetch_stripe(self.ino, policy, stripe, &rec, cap)
                                .await
                                .map_err(|_| Errno::ESTALE)?,
                        },
                    };
                    if data.len() < range.end {
                        return Err(Errno::EIO);
                    }
                    out.extend_from_slice(&data[range]);
                }
            }
        }
        Ok(out.freeze())
    }

    /// Writes `data` at `offset`: all of it, or an error. Full stripes are stored
    /// before this returns.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let c = self.client()?;
        let sh = &self.shared;
        let mut st = sh.state.lock().await;
        let (from, to) = st.content.stripe_span(offset, data.len() as u64);
        c.load_range(self.ino, &mut st, from, to).await?;
        c.apply(self.ino, &mut st, |content| content.write(offset, data))
            .await?;
        // The read cache holds immutable versions: nothing in it goes stale here.
        self.shared.publish(&st);
        let mut result = Ok(data.len() as u32);
        // Full stripes, and the oldest beyond the dirty bound, are stored in the
        // background; a bounded number per file is in flight.
        let mut to_store = st.content.full_stripes();
        let dirty = st.content.dirty_stripes();
        let over = dirty
            .len()
            .saturating_sub(to_store.len())
            .saturating_sub(c.inner.cfg.max_dirty_stripes);
        let extra: Vec<u64> = dirty.into_iter().filter(|s| !to_store.contains(s)).take(over).collect();
        to_store.extend(extra);
        for s in to_store {
            st = Client::wait_stores(sh, st, c.inner.cfg.inflight_stripes.max(1) - 1).await;
            if let Err(e) = c.start_store(&self.creds, sh, &mut st, s).await {
                result = Err(e);
            }
        }
        // A store that failed is reported by the next write too (once), and by fsync.
        {
            let mut ws = self.write_seen.lock();
            if let Some((e, now)) = st.content.error_since(*ws)
                && result.is_ok()
            {
                *ws = now;
                result = Err(e);
            }
        }
        if result.is_ok() && st.content.stored_count() >= c.inner.cfg.commit_every {
            result = c
                .commit(&self.creds, self.ino, &mut st)
                .await
                .map(|_| data.len() as u32);
        }
        c.collect_garbage(self.ino, &mut st);
        self.shared.publish(&st);
        result
    }

    /// Stores buffered stripes and commits them with the size (flush, fsync, close);
    /// reports an error recorded since this handle last reported one (a stripe that
    /// could not be stored, a commit that lost a race), once.
    pub async fn flush(&self) -> Result<(), Errno> {
        let c = self.client()?;
        let st = self.shared.state.lock().await;
        let (mut st, stored) = c.store_all(&self.creds, &self.shared, st).await;
        let committed = c.commit(&self.creds, self.ino, &mut st).await;
        c.collect_garbage(self.ino, &mut st);
        self.shared.publish(&st);
        let mut seen = self.seen.lock();
        if let Some((e, now)) = st.content.error_since(*seen) {
            *seen = now;
            return Err(e);
        }
        stored.and(committed)
    }

    /// Stores and commits the writes this file holds and then applies `set` (no size
    /// change) with the caller's credentials `creds`, as one operation: a setattr
    /// orders after the writes made before it for the cost of one replicated commit.
    /// `Ok(None)`: nothing was left to commit, `set` is not applied. An error leaves the
    /// writes to the next flush, which reports what went wrong with them.
    pub async fn commit_setattr(&self, creds: &Creds, set: &SetAttr) -> Result<Option<Attr>, Errno> {
        let c = self.client()?;
        let st = self.shared.state.lock().await;
        let (mut st, stored) = c.store_all(&self.creds, &self.shared, st).await;
        stored?;
        // The commit records the new attributes in the shared state.
        let r = c.commit_then(&self.creds, self.ino, &mut st, Some((creds, set))).await;
        c.collect_garbage(self.ino, &mut st);
        self.shared.publish(&st);
        r
    }

    /// Whether the file holds writes (through any handle of this client) that are not
    /// committed yet.
    pub fn has_uncommitted(&self) -> bool {
        self.shared.local.load(Ordering::Acquire)
    }

    /// Size as seen through this handle.
    pub fn size(&self) -> u64 {
        self.shared.size.load(Ordering::Acquire)
    }
}

impl Shared {
    /// Makes the size and whether anything is uncommitted visible to getattr.
    fn publish(&self, st: &FileState) {
        self.size.store(st.content.size(), Ordering::Release);
        self.local.store(st.content.has_local(), Ordering::Release);
    }
}

impl FileState {
    /// Keeps a capability just handed out (`None`: the reply brought none, as with the
    /// cluster secret; an earlier one stays).
    /// A write capability is not given up for a read one while it has time left.
    fn keep_cap(&mut self, cap: Option<Vec<u8>>) {
        let Some(bytes) = cap else { return };
        let Ok(c) = shingle_transport::cap::ShardCap::from_bytes(&bytes) else {
            return;
        };
        let keep_old = self.cap.as_ref().is_some_and(|old| {
            !c.right.allows(old.right) && old.expires >= shingle_transport::cap::unix_now() + CAP_RENEW_SECS
        });
        if !keep_old {
            self.cap = Some(ShardCapHeld {
                bytes: Bytes::from(bytes),
                expires: c.expires,
                right: c.right,
            });
        }
    }

    /// Whether the capability held is a write one (whatever time it has left).
    fn write_cap(&self) -> bool {
        self.cap
            .as_ref()
            .is_some_and(|c| c.right == shingle_transport::cap::Right::Write)
    }

    /// Whether the capability held is missing or has less than [`CAP_RENEW_SECS`] left.
    fn cap_due(&self) -> bool {
        self.cap
            .as_ref()
            .is_none_or(|c| c.expires < shingle_transport::cap::unix_now() + CAP_RENEW_SECS)
    }

    /// The capability as it travels (empty when none is held).
    fn cap_bytes(&self) -> Bytes {
        self.cap.as_ref().map(|c| c.bytes.clone()).unwrap_or_default()
    }

    /// Takes the committed layout and size the metadata service has now (after
    /// another client's commit); local writes stay.
    fn adopt(&mut self, rec: shingle_meta::namespace::InodeRec, window: u64) {
        let layout = rec.layout.unwrap_or_else(|| self.policy.clone());
        self.layout_of = version_of(&rec.attr);
        self.content.set_head(window, layout.stripes, rec.attr.size);
        self.cache.clear();
    }

    fn cached(&self, s: u64, version: u64) -> Option<StripeCell> {
        self.cache
            .iter()
            .find(|(cs, v, _)| *cs == s && *v == version)
            .map(|(_, _, c)| c.clone())
    }

    fn cell(&mut self, s: u64, version: u64, max: usize) -> StripeCell {
        if let Some(c) = self.cached(s, version) {
            return c;
        }
        let cell: StripeCell = Arc::new(OnceCell::new());
        self.cache.push_back((s, version, cell.clone()));
        while self.cache.len() > max.max(1) {
            self.cache.pop_front();
        }
        cell
    }
}
