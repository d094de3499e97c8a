//! The client library: namespace through [`MetaClient`], file data as erasure-coded
//! stripes on the data nodes of each stripe's placement group.
//!
//! **Reads** fetch whole stripes (k data shards in parallel, parity only for shards that
//! fail) into a small per-file cache; a reader that moves forward gets the next stripe
//! fetched in the background (readahead), so a sequential scan overlaps network and
//! decoding with the application. **Writes** fill stripe buffers; a full stripe is
//! encoded and written at once (all k+m shards in parallel, each durable on its node
//! before the write returns), and the new stripes and size are committed to the inode
//! on flush, fsync and close (close-to-open consistency, as with NFS). A partial stripe
//! that already exists is read, modified and rewritten under a new version. Memory per
//! open file is bounded by [`ClientConfig`].
//!
//! Traces: what a stripe read or write met on the way (parity used, hedged shard
//! reads, the fabric, shards left out) is recorded on the span of the operation that
//! needed it (`degraded`, `hedged`, `fabric` of `fs.read`, `fs.write`, ...); readahead
//! runs in an `fs.readahead` span, a child of the read that started it.

use bytes::{Bytes, BytesMut};
use shingle_data::ec::EcPolicy;
use shingle_data::stripe::{StripeError, read_stripe, write_stripe};
use shingle_meta::client::MetaClient;
use shingle_meta::ids::{Ino, NodeId};
use shingle_meta::namespace::{Attr, Creds, Errno, FileKind, Layout, SetAttr, StripeRec};
use shingle_meta::placement::stripe_pg;
use shingle_transport::{Health, TcpClient};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
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
}

impl Default for ClientConfig {
    /// ec(4,2), 1 MiB units, 2 dirty and 4 cached stripes per file, commit every 16.
    fn default() -> Self {
        ClientConfig {
            ec: (4, 2),
            unit: 1 << 20,
            max_dirty_stripes: 2,
            cache_stripes: 4,
            commit_every: 16,
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
    tcp: TcpClient,
    health: Arc<Health>,
    cfg: ClientConfig,
    open: Mutex<HashMap<Ino, Vec<Weak<OpenFile>>>>,
    /// (mtime, size) of each file when this client last opened or committed it: an open
    /// that finds them unchanged may keep the kernel's cached pages.
    seen: Mutex<HashMap<Ino, (i64, u64)>>,
}

/// Most files whose version [`Client`] remembers for page-cache reuse.
const SEEN_MAX: usize = 200_000;

type StripeCell = Arc<OnceCell<Result<Bytes, Errno>>>;

/// An open file.
pub struct OpenFile {
    /// The inode.
    pub ino: Ino,
    creds: Creds,
    client: Weak<Inner>,
    state: tokio::sync::Mutex<FileState>,
    /// Size including buffered writes (for getattr while open).
    size: Mutex<u64>,
}

struct FileState {
    layout: Layout,
    size: u64,
    dirty: BTreeMap<u64, (BytesMut, usize)>,
    pending: Vec<(u64, StripeRec)>,
    cache: VecDeque<(u64, u64, StripeCell)>,
    next_expected: u64,
    error: Option<Errno>,
}

fn stripe_err(e: StripeError) -> Errno {
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
                cfg,
                open: Mutex::new(HashMap::new()),
                seen: Mutex::new(HashMap::new()),
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
            stripes: BTreeMap::new(),
        }
    }

    /// Attributes, with the size of writes buffered by files open here.
    pub async fn getattr(&self, ino: Ino) -> Result<Attr, Errno> {
        let mut a = self.inner.meta.getattr(ino).await?;
        a.size = a.size.max(self.local_size(ino));
        Ok(a)
    }

    /// Looks up a name, with local sizes like [`Client::getattr`].
    pub async fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr, Errno> {
        let mut a = self.inner.meta.lookup(parent, name).await?;
        a.size = a.size.max(self.local_size(a.ino));
        Ok(a)
    }

    fn local_size(&self, ino: Ino) -> u64 {
        let open = self.inner.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&ino)
            .map(|v| {
                v.iter()
                    .filter_map(Weak::upgrade)
                    .map(|f| *f.size.lock().unwrap_or_else(|p| p.into_inner()))
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    }

    fn open_files(&self, ino: Ino) -> Vec<Arc<OpenFile>> {
        let mut open = self.inner.open.lock().unwrap_or_else(|p| p.into_inner());
        let Some(v) = open.get_mut(&ino) else { return Vec::new() };
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(Weak::upgrade).collect()
    }

    /// True while this client has the file open.
    pub fn is_open(&self, ino: Ino) -> bool {
        !self.open_files(ino).is_empty()
    }

    fn remember(&self, ino: Ino, mtime: i64, size: u64) -> bool {
        let mut seen = self.inner.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= SEEN_MAX {
            seen.clear();
        }
        seen.insert(ino, (mtime, size)) == Some((mtime, size))
    }

    /// Opens a file (fresh attributes and layout: close-to-open consistency).
    pub async fn open(&self, creds: &Creds, ino: Ino) -> Result<Arc<OpenFile>, Errno> {
        Ok(self.open_cached(creds, ino).await?.0)
    }

    /// Like [`Client::open`]; also says whether the file is unchanged since this client
    /// last opened or wrote it (so cached pages of it are still valid).
    pub async fn open_cached(&self, creds: &Creds, ino: Ino) -> Result<(Arc<OpenFile>, bool), Errno> {
        let rec = self.inner.meta.get_inode(ino).await?;
        if rec.attr.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        let unchanged = self.remember(ino, rec.attr.mtime, rec.attr.size);
        let layout = rec.layout.unwrap_or_else(|| self.default_policy());
        let f = Arc::new(OpenFile {
            ino,
            creds: creds.clone(),
            client: Arc::downgrade(&self.inner),
            size: Mutex::new(rec.attr.size),
            state: tokio::sync::Mutex::new(FileState {
                layout,
                size: rec.attr.size,
                dirty: BTreeMap::new(),
                pending: Vec::new(),
                cache: VecDeque::new(),
                next_expected: 0,
                error: None,
            }),
        });
        self.inner
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(ino)
            .or_default()
            .push(Arc::downgrade(&f));
        Ok((f, unchanged))
    }

    /// Changes attributes; a size change flushes open files first and rewrites the
    /// stripe the new end falls in, so a later extension reads zeros there.
    pub async fn setattr(&self, creds: &Creds, ino: Ino, set: SetAttr) -> Result<Attr, Errno> {
        if let Some(size) = set.size {
            for f in self.open_files(ino) {
                f.flush().await?;
            }
            let rec = self.inner.meta.get_inode(ino).await?;
            if rec.attr.kind == FileKind::File
                && let Some(layout) = &rec.layout
                && size < rec.attr.size
            {
                let sb = layout.stripe_bytes();
                let (s, within) = (size / sb, size % sb);
                if within != 0
                    && let Some(old) = layout.stripes.get(&s)
                    && old.len > within
                {
                    let data = self.fetch_stripe(ino, layout, s, old).await?;
                    let keep = data.slice(..(within as usize).min(data.len()));
                    let rec2 = self.store_stripe(ino, layout, s, old.version, keep).await?;
                    self.inner
                        .meta
                        .commit_write(creds, ino, layout.policy(), 0, vec![(s, rec2)])
                        .await?;
                }
            }
            for f in self.open_files(ino) {
                f.truncated(size).await;
            }
        }
        let a = self.inner.meta.setattr(creds, ino, set).await?;
        if a.kind == FileKind::File {
            // Reload layouts of open files after the change.
            for f in self.open_files(ino) {
                f.reload().await;
            }
        }
        Ok(a)
    }

    /// Capacity (usable after erasure coding, by the default policy) and inode counts.
    pub async fn statfs(&self) -> StatFs {
        use shingle_data::service::{Stat, StatRequest};
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
                s.free += r.capacity_bytes.saturating_sub(r.written_bytes);
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
    fn shard_sources(&self, ino: Ino, s: u64, n: usize, hint: &[u64]) -> Vec<Option<SocketAddr>> {
        let v = self.inner.meta.view();
        let group = v.placement.pg(stripe_pg(ino, s, v.map.pgs));
        (0..n)
            .map(|i| {
                let id = match hint.get(i).copied() {
                    Some(0) => return None,
                    Some(h) if v.map.nodes.contains_key(&NodeId(h)) => NodeId(h),
                    _ => *group.get(i)?,
                };
                v.map.is_up(id).then(|| v.addr(id)).flatten()
            })
            .collect()
    }

    async fn fetch_stripe(&self, ino: Ino, layout: &Layout, s: u64, rec: &StripeRec) -> Result<Bytes, Errno> {
        let policy = EcPolicy {
            k: layout.k,
            m: layout.m,
            unit: layout.unit,
        };
        let n = usize::from(layout.k) + usize::from(layout.m);
        let sources = self.shard_sources(ino, s, n, &rec.nodes);
        let r = read_stripe(
            &self.inner.tcp,
            &self.inner.health,
            policy,
            &sources,
            ino.0,
            s,
            rec.version,
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

    async fn store_stripe(
        &self,
        ino: Ino,
        layout: &Layout,
        s: u64,
        old_version: u64,
        data: Bytes,
    ) -> Result<StripeRec, Errno> {
        let policy = EcPolicy {
            k: layout.k,
            m: layout.m,
            unit: layout.unit,
        };
        let n = usize::from(layout.k) + usize::from(layout.m);
        let v = self.inner.meta.view();
        let g = stripe_pg(ino, s, v.map.pgs);
        let group = v.placement.pg(g);
        if group.len() < n {
            warn!(
                need = n,
                have = group.len(),
                "placement group smaller than the stripe: not enough data nodes"
            );
            return Err(Errno::EIO);
        }
        // Members that are down get a spare at once; the others are tried first.
        let mut spares: VecDeque<NodeId> = v.map.pg_spares(g, group).into();
        let mut targets = Vec::with_capacity(n);
        for id in &group[..n] {
            let id = if v.map.is_up(*id) {
                *id
            } else {
                spares.pop_front().unwrap_or(*id)
            };
            targets.push(v.addr(id).ok_or(Errno::EIO)?);
        }
        let spare_addrs: Vec<SocketAddr> = spares.iter().filter_map(|id| v.addr(*id)).collect();
        // Versions follow the clock, and always exceed the version they replace.
        let version = (shingle_meta::service::wire::now_ns().max(0) as u64).max(old_version + 1);
        let len = data.len() as u64;
        // Durable with one shard to spare: k + 1 shards (all of them when m = 0).
        let min_shards = usize::from(layout.k) + usize::from(layout.m.min(1));
        let placed = write_stripe(
            &self.inner.tcp,
            &self.inner.health,
            policy,
            &targets,
            &spare_addrs,
            min_shards,
            ino.0,
            s,
            version,
            data,
        )
        .await
        .map_err(|e| {
            warn!(ino = ino.0, stripe = s, error = %e, "stripe write failed");
            stripe_err(e)
        })?;
        let by_addr: HashMap<SocketAddr, NodeId> = v.map.nodes.values().map(|n| (n.addr, n.id)).collect();
        let nodes: Vec<u64> = placed
            .iter()
            .map(|a| a.and_then(|a| by_addr.get(&a)).map_or(0, |id| id.0))
            .collect();
        if nodes.contains(&0) {
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
}

impl OpenFile {
    fn client(&self) -> Result<Client, Errno> {
        self.client.upgrade().map(|inner| Client { inner }).ok_or(Errno::EIO)
    }

    /// Reads up to `len` bytes at `offset` (short only at end of file).
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, Errno> {
        let c = self.client()?;
        // Plan under the lock: which stripes, from where; fetch without it.
        let (parts, size, layout) = {
            let mut st = self.state.lock().await;
            if let Some(e) = st.error {
                return Err(e);
            }
            let size = st.size;
            if offset >= size || len == 0 {
                return Ok(Bytes::new());
            }
            let end = (offset + u64::from(len)).min(size);
            let sb = st.layout.stripe_bytes();
            let (first, last) = (offset / sb, (end - 1) / sb);
            let sequential = offset == st.next_expected || first == st.next_expected / sb.max(1);
            st.next_expected = end;
            let mut parts = Vec::new();
            for s in first..=last {
                parts.push((s, st.source(s, &c)));
            }
            // Readahead: a sequential reader gets the next stripe started now.
            if sequential && c.inner.cfg.cache_stripes > 1 {
                let next = last + 1;
                if next * sb < size
                    && let Source::Cell(cell, rec) = st.source(next, &c)
                {
                    let (c2, layout, ino) = (c.clone(), st.layout.clone(), self.ino);
                    let span = tracing::info_span!(
                        "fs.readahead",
                        ino = ino.0,
                        stripe = next,
                        degraded = false,
                        hedged = false,
                        fabric = tracing::field::Empty,
                    );
                    tokio::spawn(
                        async move {
                            let _ = cell
                                .get_or_init(|| async { c2.fetch_stripe(ino, &layout, next, &rec).await })
                                .await;
                        }
                        .instrument(span),
                    );
                }
            }
            (parts, size, st.layout.clone())
        };
        let end = (offset + u64::from(len)).min(size);
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        let sb = layout.stripe_bytes();
        for (s, src) in parts {
            let start = s * sb;
            let (lo, hi) = (offset.max(start) - start, end.min(start + sb) - start);
            let data = match src {
                Source::Bytes(b) => b,
                Source::Hole => Bytes::new(),
                Source::Cell(cell, rec) => {
                    let r = cell
                        .get_or_init(|| async { c.fetch_stripe(self.ino, &layout, s, &rec).await })
                        .await;
                    match r {
                        Ok(b) => b.clone(),
                        Err(Errno::ESTALE) => {
                            // Our layout is older than the stripe: reload and fetch afresh.
                            self.reload().await;
                            return Err(Errno::EAGAIN);
                        }
                        Err(e) => return Err(*e),
                    }
                }
            };
            let (lo, hi) = (lo as usize, hi as usize);
            if data.len() >= hi {
                out.extend_from_slice(&data[lo..hi]);
            } else {
                if data.len() > lo {
                    out.extend_from_slice(&data[lo..]);
                }
                let have = data.len().max(lo);
                out.resize(out.len() + (hi - have), 0);
            }
        }
        Ok(out.freeze())
    }

    /// Writes `data` at `offset`; full stripes are stored before this returns.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let c = self.client()?;
        let mut st = self.state.lock().await;
        if let Some(e) = st.error {
            return Err(e);
        }
        let sb = st.layout.stripe_bytes();
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let s = pos / sb;
            let start = s * sb;
            let lo = (pos - start) as usize;
            let hi = ((end - start).min(sb)) as usize;
            if !st.dirty.contains_key(&s) {
                let mut buf = BytesMut::zeroed(sb as usize);
                let mut valid = 0usize;
                // Keep what the stripe holds unless this write covers all of it.
                if let Some(rec) = st.layout.stripes.get(&s).cloned()
                    && !(lo == 0 && hi as u64 >= rec.len)
                {
                    let old = c.fetch_stripe(self.ino, &st.layout, s, &rec).await?;
                    let n = old.len().min(buf.len());
                    buf[..n].copy_from_slice(&old[..n]);
                    valid = n;
                }
                // Bytes below the old end of file in this stripe stay valid (zeros in holes).
                let old_end = st.size.saturating_sub(start).min(sb) as usize;
                valid = valid.max(old_end);
                st.dirty.insert(s, (buf, valid));
            }
            let src = &data[(pos - offset) as usize..(pos - offset) as usize + (hi - lo)];
            let full = {
                let (buf, valid) = st.dirty.get_mut(&s).ok_or(Errno::EIO)?;
                buf[lo..hi].copy_from_slice(src);
                *valid = (*valid).max(hi);
                *valid as u64 == sb
            };
            st.drop_cached(s);
            pos = start + hi as u64;
            st.size = st.size.max(pos);
            *self.size.lock().unwrap_or_else(|p| p.into_inner()) = st.size;
            if full {
                st.store(&c, self.ino, s).await?;
            }
        }
        while st.dirty.len() > c.inner.cfg.max_dirty_stripes {
            let oldest = st.dirty.keys().next().copied().ok_or(Errno::EIO)?;
            st.store(&c, self.ino, oldest).await?;
        }
        if st.pending.len() >= c.inner.cfg.commit_every {
            st.commit(&c, self.ino, &self.creds).await?;
        }
        Ok(data.len() as u32)
    }

    /// Stores buffered stripes and commits them with the size (flush, fsync, close).
    pub async fn flush(&self) -> Result<(), Errno> {
        let c = self.client()?;
        let mut st = self.state.lock().await;
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        let stripes: Vec<u64> = st.dirty.keys().copied().collect();
        for s in stripes {
            st.store(&c, self.ino, s).await?;
        }
        st.commit(&c, self.ino, &self.creds).await
    }

    /// The file was truncated to `size` (through this client).
    async fn truncated(&self, size: u64) {
        let mut st = self.state.lock().await;
        st.size = size;
        *self.size.lock().unwrap_or_else(|p| p.into_inner()) = size;
        let sb = st.layout.stripe_bytes();
        st.dirty.retain(|s, _| s * sb < size);
        st.cache.clear();
    }

    /// Reloads the layout (after a truncate, or a stale read).
    async fn reload(&self) {
        let Ok(c) = self.client() else { return };
        if let Ok(rec) = c.inner.meta.get_inode(self.ino).await {
            let mut st = self.state.lock().await;
            if let Some(l) = rec.layout {
                st.layout = l;
            }
            if st.dirty.is_empty() && st.pending.is_empty() {
                st.size = rec.attr.size;
                *self.size.lock().unwrap_or_else(|p| p.into_inner()) = rec.attr.size;
            }
            st.cache.clear();
        }
    }

    /// Size as seen through this handle.
    pub fn size(&self) -> u64 {
        *self.size.lock().unwrap_or_else(|p| p.into_inner())
    }
}

enum Source {
    Bytes(Bytes),
    Hole,
    Cell(StripeCell, StripeRec),
}

impl FileState {
    fn source(&mut self, s: u64, c: &Client) -> Source {
        if let Some((buf, valid)) = self.dirty.get(&s) {
            return Source::Bytes(Bytes::copy_from_slice(&buf[..*valid]));
        }
        let Some(rec) = self.layout.stripes.get(&s).cloned() else {
            return Source::Hole;
        };
        if let Some((_, _, cell)) = self.cache.iter().find(|(cs, v, _)| *cs == s && *v == rec.version) {
            return Source::Cell(cell.clone(), rec);
        }
        let cell: StripeCell = Arc::new(OnceCell::new());
        self.cache.push_back((s, rec.version, cell.clone()));
        while self.cache.len() > c.inner.cfg.cache_stripes.max(1) {
            self.cache.pop_front();
        }
        Source::Cell(cell, rec)
    }

    fn drop_cached(&mut self, s: u64) {
        self.cache.retain(|(cs, _, _)| *cs != s);
    }

    async fn store(&mut self, c: &Client, ino: Ino, s: u64) -> Result<(), Errno> {
        let Some((buf, valid)) = self.dirty.remove(&s) else {
            return Ok(());
        };
        let old = self.layout.stripes.get(&s).map_or(0, |r| r.version);
        let old = self
            .pending
            .iter()
            .filter(|(ps, _)| *ps == s)
            .map(|(_, r)| r.version)
            .max()
            .unwrap_or(old);
        let data = buf.freeze().slice(..valid);
        match c.store_stripe(ino, &self.layout, s, old, data).await {
            Ok(rec) => {
                self.pending.retain(|(ps, _)| *ps != s);
                self.pending.push((s, rec));
                Ok(())
            }
            Err(e) => {
                // The data is lost from this handle: report it now and at flush/close.
                self.error = Some(e);
                Err(e)
            }
        }
    }

    async fn commit(&mut self, c: &Client, ino: Ino, creds: &Creds) -> Result<(), Errno> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let stripes = std::mem::take(&mut self.pending);
        let policy = self.layout.policy();
        match c
            .inner
            .meta
            .commit_write(creds, ino, policy, self.size, stripes.clone())
            .await
        {
            Ok(a) => {
                for (s, r) in stripes {
                    self.layout.stripes.insert(s, r);
                }
                self.size = self.size.max(a.size);
                // The kernel's pages hold what was just written: a later open may keep them.
                c.remember(ino, a.mtime, a.size);
                Ok(())
            }
            Err(e) => {
                self.pending = stripes;
                Err(e)
            }
        }
    }
}
