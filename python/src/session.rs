//! One connection to a cluster: the runtime, path resolution, namespace calls and the
//! prefetch cache.
//!
//! Paths are resolved from the root one name at a time, as the kernel does for a
//! mount: search permission on every directory crossed, symbolic links followed (40
//! at most, then `ELOOP`), `..` within the tree. Directories crossed are remembered
//! for [`DIR_TTL`] (the mount's entry TTL); the last name is always asked fresh, so
//! opening a file sees what another client closed before (close-to-open).

use crate::buffer::Buffer;
use crate::file::File;
use crate::{os_error, same_process};
use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use shingle_client::{Client, OpenFile};
use shingle_meta::ids::Ino;
use shingle_meta::namespace::perm::{self, R, W, X};
use shingle_meta::namespace::{Attr, Creds, Errno, FileKind, SetAttr};
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a directory crossed on the way to a name is remembered.
pub const DIR_TTL: Duration = Duration::from_secs(1);
/// Symbolic links one resolution follows before `ELOOP` (Linux's limit).
const MAX_LINKS: usize = 40;
/// Bytes one read asks the client for.
pub const READ_CHUNK: u32 = 4 << 20;
/// Files prefetched at once.
const PREFETCH_PARALLEL: usize = 8;

/// What an open asked for (`os.open` flags, spelled out).
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenMode {
    pub read: bool,
    pub write: bool,
    pub create: bool,
    pub exclusive: bool,
    pub truncate: bool,
    pub append: bool,
}

/// Directories crossed on the way to names: (directory, name) to its attributes and
/// when they were asked.
type DirCache = HashMap<(Ino, Vec<u8>), (Attr, Instant)>;

/// Whole files read ahead of their open, by path; each is served once, and only if
/// the file is unchanged when it is opened (same inode, size, mtime and ctime).
#[derive(Default)]
struct Prefetched {
    files: HashMap<Vec<u8>, (Attr, Bytes)>,
    order: VecDeque<Vec<u8>>,
    bytes: usize,
    pending: HashSet<Vec<u8>>,
    hits: u64,
    misses: u64,
}

/// The process's runtime: one for every session, made on first use and never dropped
/// (a runtime cannot be dropped from one of its own tasks, where a session's last
/// reference may go). A child process after `fork` makes its own: the parent's threads
/// are not there.
fn runtime() -> std::io::Result<&'static tokio::runtime::Runtime> {
    static RT: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);
    let mut rt = RT.lock();
    let pid = std::process::id();
    if let Some((p, r)) = *rt
        && p == pid
    {
        return Ok(r);
    }
    let r: &'static _ = Box::leak(Box::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shingle-client")
            .enable_all()
            .build()?,
    ));
    *rt = Some((pid, r));
    Ok(r)
}

/// The shared state of a session (files keep it alive after the session closes).
pub struct Core {
    rt: &'static tokio::runtime::Runtime,
    pub client: Client,
    pub creds: Creds,
    /// The directory paths start from: the subtree of a confined client key, else the
    /// filesystem's root.
    pub root: Ino,
    pub pid: u32,
    dirs: Mutex<DirCache>,
    prefetched: Mutex<Prefetched>,
    prefetch_limit: usize,
    prefetch_gate: Arc<tokio::sync::Semaphore>,
}

/// Drops `core` in the process that made it; in another (after `fork`) it is leaked:
/// its runtime's threads are not there, and its locks may have been held at the fork.
pub fn release(core: Option<Arc<Core>>) {
    if let Some(c) = core
        && c.pid != std::process::id()
    {
        std::mem::forget(c);
    }
}

fn components(path: &[u8]) -> VecDeque<Vec<u8>> {
    path.split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
        .collect()
}

/// `path` split into its directory and last name (`EINVAL` for the root itself).
fn split(path: &[u8]) -> Result<(Vec<u8>, Vec<u8>), Errno> {
    let mut comps: Vec<Vec<u8>> = components(path).into();
    let name = comps.pop().ok_or(Errno::EINVAL)?;
    if name == b".." {
        return Err(Errno::EINVAL);
    }
    Ok((comps.join(&b'/'), name))
}

fn bytes_of(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

impl Core {
    /// Runs `f` on the runtime with the GIL released.
    pub fn block<T: Send>(&self, py: Python<'_>, f: impl AsyncFnOnce() -> T + Send) -> T {
        py.detach(|| self.rt.block_on(f()))
    }

    /// Spawns background work on the runtime.
    fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        self.rt.spawn(fut);
    }

    async fn lookup(&self, dir: &Attr, name: &[u8], last: bool) -> Result<Attr, Errno> {
        perm::check(&self.creds, dir, X)?;
        let key = (dir.ino, name.to_vec());
        if !last
            && let Some((a, at)) = self.dirs.lock().get(&key)
            && at.elapsed() < DIR_TTL
        {
            return Ok(a.clone());
        }
        let a = self.client.lookup(&self.creds, dir.ino, name).await?;
        if a.kind == FileKind::Dir {
            let mut dirs = self.dirs.lock();
            if dirs.len() > 65_536 {
                dirs.clear();
            }
            dirs.insert(key, (a.clone(), Instant::now()));
        }
        Ok(a)
    }

    /// The root's attributes, remembered like any directory crossed.
    async fn root(&self) -> Result<Attr, Errno> {
        let key = (self.root, Vec::new());
        if let Some((a, at)) = self.dirs.lock().get(&key)
            && at.elapsed() < DIR_TTL
        {
            return Ok(a.clone());
        }
        let a = self.client.getattr(self.root).await?;
        self.dirs.lock().insert(key, (a.clone(), Instant::now()));
        Ok(a)
    }

    /// Forgets the directories crossed (after a change to a directory's name or mode).
    fn forget_dirs(&self) {
        self.dirs.lock().clear();
    }

    /// The attributes `path` names, following a symbolic link in its last name when
    /// `follow` (links in the directories crossed are always followed).
    pub async fn resolve(&self, path: &[u8], follow: bool) -> Result<Attr, Errno> {
        let mut todo = components(path);
        let root = if todo.is_empty() {
            self.client.getattr(self.root).await?
        } else {
            self.root().await?
        };
        let mut stack = vec![root];
        let mut links = 0;
        while let Some(name) = todo.pop_front() {
            let dir = stack.last().cloned().ok_or(Errno::ENOENT)?;
            if dir.kind != FileKind::Dir {
                return Err(Errno::ENOTDIR);
            }
            if name == b".." {
                perm::check(&self.creds, &dir, X)?;
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            let last = todo.is_empty();
            let a = self.lookup(&dir, &name, last).await?;
            if a.kind == FileKind::Symlink && (!last || follow) {
                links += 1;
                if links > MAX_LINKS {
                    return Err(Errno::ELOOP);
                }
                let target = self.client.meta().readlink(a.ino).await?;
                if target.first() == Some(&b'/') {
                    stack.truncate(1);
                }
                for c in components(&target).into_iter().rev() {
                    todo.push_front(c);
                }
                continue;
            }
            stack.push(a);
        }
        stack.pop().ok_or(Errno::ENOENT)
    }

    /// The directory holding `path`'s last name, and that name.
    async fn parent_of(&self, path: &[u8]) -> Result<(Attr, Vec<u8>), Errno> {
        let (dir, name) = split(path)?;
        let d = self.resolve(&dir, true).await?;
        if d.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        Ok((d, name))
    }

    /// Opens `path`: what `open(2)` does with the flags of `m`.
    pub async fn open(&self, path: &[u8], m: OpenMode, perm_bits: u32) -> Result<Opened, Errno> {
        let a = if m.create {
            let (d, name) = self.parent_of(path).await?;
            match self.lookup(&d, &name, true).await {
                Ok(_) if m.exclusive => return Err(Errno::EEXIST),
                Ok(a) if a.kind == FileKind::Symlink => self.resolve(path, true).await?,
                Ok(a) => a,
                Err(Errno::ENOENT) => {
                    // A new file comes with its first stripe versions (no round trip
                    // to reserve them before its first store).
                    match self.client.create(&self.creds, d.ino, &name, perm_bits & 0o7777).await {
                        Ok((a, f)) => return Ok(Opened::File(a, f)),
                        Err(Errno::EEXIST) if !m.exclusive => self.resolve(path, true).await?,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        } else {
            self.resolve(path, true).await?
        };
        match a.kind {
            FileKind::Dir => return Err(Errno::EISDIR),
            FileKind::File => {}
            _ => return Err(Errno::EOPNOTSUPP),
        }
        let mask = if m.read { R } else { 0 } | if m.write { W } else { 0 };
        perm::check(&self.creds, &a, mask)?;
        if !m.write
            && let Some(data) = self.take_prefetched(path, &a)
        {
            return Ok(Opened::Cached(a, data));
        }
        if m.truncate && a.size != 0 {
            let set = SetAttr {
                size: Some(0),
                ..Default::default()
            };
            self.client.setattr(&self.creds, a.ino, set).await?;
        }
        let f = self.client.open(&self.creds, a.ino).await?;
        Ok(Opened::File(a, f))
    }

    /// Reads all of `path` (from the prefetch cache when it holds the file unchanged).
    pub async fn read_file(&self, path: &[u8]) -> Result<Bytes, Errno> {
        match self
            .open(
                path,
                OpenMode {
                    read: true,
                    ..Default::default()
                },
                0,
            )
            .await?
        {
            Opened::Cached(_, data) => Ok(data),
            Opened::File(_, f) => read_all(&f, 0).await,
        }
    }

    fn take_prefetched(&self, path: &[u8], now: &Attr) -> Option<Bytes> {
        let mut p = self.prefetched.lock();
        let Some((then, data)) = p.files.remove(path) else {
            if !p.files.is_empty() || !p.pending.is_empty() {
                p.misses += 1;
            }
            return None;
        };
        p.bytes -= data.len();
        p.order.retain(|q| q.as_slice() != path);
        let same = then.ino == now.ino && then.size == now.size && then.mtime == now.mtime && then.ctime == now.ctime;
        if same {
            p.hits += 1;
            Some(data)
        } else {
            p.misses += 1;
            None
        }
    }

    /// Starts reading `paths` whole in the background (skipping those cached or on
    /// their way, and files larger than an eighth of the cache).
    pub fn prefetch(self: &Arc<Self>, paths: Vec<Vec<u8>>) {
        for path in paths {
            {
                let mut p = self.prefetched.lock();
                if p.files.contains_key(&path) || !p.pending.insert(path.clone()) {
                    continue;
                }
            }
            let core = Arc::clone(self);
            let gate = Arc::clone(&self.prefetch_gate);
            self.spawn(async move {
                let got = match gate.acquire().await {
                    Ok(_permit) => core.fetch_whole(&path).await,
                    Err(_) => None,
                };
                let mut p = core.prefetched.lock();
                p.pending.remove(&path);
                if let Some((a, data)) = got {
                    p.bytes += data.len();
                    p.order.push_back(path.clone());
                    p.files.insert(path, (a, data));
                    while p.bytes > core.prefetch_limit {
                        let Some(old) = p.order.pop_front() else { break };
                        if let Some((_, d)) = p.files.remove(&old) {
                            p.bytes -= d.len();
                        }
                    }
                }
            });
        }
    }

    async fn fetch_whole(&self, path: &[u8]) -> Option<(Attr, Bytes)> {
        let a = self.resolve(path, true).await.ok()?;
        if a.kind != FileKind::File || a.size > (self.prefetch_limit / 8) as u64 {
            return None;
        }
        perm::check(&self.creds, &a, R).ok()?;
        let f = self.client.open(&self.creds, a.ino).await.ok()?;
        let data = read_all(&f, 0).await.ok()?;
        // What was read is what the attributes describe only if nothing changed meanwhile.
        let b = self.client.getattr(a.ino).await.ok()?;
        (b.mtime == a.mtime && b.ctime == a.ctime && b.size == data.len() as u64).then_some((a, data))
    }
}

/// What [`Core::open`] found: the file opened, or its whole content prefetched.
pub enum Opened {
    File(Attr, Arc<OpenFile>),
    Cached(Attr, Bytes),
}

/// Everything from `offset` to the end of the file: [`read_range`] without a limit.
pub async fn read_all(f: &OpenFile, offset: u64) -> Result<Bytes, Errno> {
    read_range(f, offset, None).await
}

/// Up to `limit` bytes from `offset` (to the end of the file when `None`): the
/// client's own bytes when one read returns them all, one buffer otherwise.
pub async fn read_range(f: &OpenFile, offset: u64, limit: Option<u64>) -> Result<Bytes, Errno> {
    let end = limit.map(|n| offset.saturating_add(n));
    let mut parts: Vec<Bytes> = Vec::new();
    let mut at = offset;
    loop {
        let want = match end {
            Some(e) => e.saturating_sub(at),
            // To the end: ask for what the size says is left, at least a byte (the
            // size may have grown since).
            None => f.size().saturating_sub(at).max(1),
        };
        if want == 0 {
            break;
        }
        let b = f.read(at, want.min(u64::from(READ_CHUNK)) as u32).await?;
        if b.is_empty() {
            break;
        }
        at += b.len() as u64;
        parts.push(b);
    }
    Ok(match parts.len() {
        0 => Bytes::new(),
        1 => parts.pop().unwrap_or_default(),
        _ => Bytes::from(parts.concat()),
    })
}

/// `os.stat_result` fields: (mode, ino, nlink, uid, gid, size, atime_ns, mtime_ns,
/// ctime_ns, rdev).
pub type StatTuple = (u32, u64, u32, u32, u32, u64, i64, i64, i64, u64);

pub fn stat_tuple(a: &Attr) -> StatTuple {
    (
        a.kind.mode_bits() | a.perm,
        a.ino.0,
        a.nlink,
        a.uid,
        a.gid,
        a.size,
        a.atime,
        a.mtime,
        a.ctime,
        a.rdev,
    )
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDev => "chardev",
        FileKind::BlockDev => "blockdev",
    }
}

/// A connection to a cluster (`shingle._native.Session`; Python code uses
/// `shingle.Client`).
#[pyclass(module = "shingle._native")]
pub struct Session {
    core: Option<Arc<Core>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        release(self.core.take());
    }
}

impl Session {
    fn core(&self) -> PyResult<&Arc<Core>> {
        let c = self
            .core
            .as_ref()
            .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("the Shingle client is closed"))?;
        same_process(c.pid)?;
        Ok(c)
    }

    /// Runs a namespace call on `path` with the GIL released; errors name `path`.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        path: &[u8],
        f: impl AsyncFnOnce(&Core) -> Result<T, Errno> + Send,
    ) -> PyResult<T> {
        let c = self.core()?;
        c.block(py, async || f(c).await).map_err(|e| os_error(e, path))
    }
}

#[pymethods]
impl Session {
    /// Connects with a cluster file and its secret, acting as `uid`/`gid`/`groups`.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (cluster_file, secret_file, uid, gid, groups, timeout=30.0, prefetch_bytes=256 << 20))]
    fn new(
        py: Python<'_>,
        cluster_file: PathBuf,
        secret_file: PathBuf,
        uid: u32,
        gid: u32,
        groups: Vec<u32>,
        timeout: f64,
        prefetch_bytes: usize,
    ) -> PyResult<Self> {
        let rt =
            runtime().map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("start the client runtime: {e}")))?;
        let wait = Duration::from_secs_f64(timeout.max(0.1));
        let connected = py.detach(|| {
            rt.block_on(async {
                let (meta, cf) = shingle::dev::connect(&cluster_file, &secret_file, wait).await?;
                anyhow::Ok((meta.with_timeout(wait), cf))
            })
        });
        let (meta, cf) = match connected {
            Ok(c) => c,
            Err(e) => return Err(pyo3::exceptions::PyConnectionError::new_err(format!("{e:#}"))),
        };
        let grant = shingle::dev::client_grant(&meta)
            .map_err(|e| pyo3::exceptions::PyPermissionError::new_err(format!("{e:#}")))?;
        let root = shingle::dev::grant_root(grant.as_ref());
        let client = Client::new(meta, shingle::dev::client_config(&cf));
        Ok(Session {
            core: Some(Arc::new(Core {
                rt,
                client,
                creds: Creds { uid, gid, groups },
                root,
                pid: std::process::id(),
                dirs: Mutex::new(HashMap::new()),
                prefetched: Mutex::new(Prefetched::default()),
                prefetch_limit: prefetch_bytes,
                prefetch_gate: Arc::new(tokio::sync::Semaphore::new(PREFETCH_PARALLEL)),
            })),
        })
    }

    /// Attributes of `path` (following a last symbolic link when `follow`).
    #[pyo3(signature = (path, follow=true))]
    fn stat(&self, py: Python<'_>, path: PathBuf, follow: bool) -> PyResult<StatTuple> {
        let p = bytes_of(&path);
        self.call(py, &p, async |c| c.resolve(&p, follow).await.map(|a| stat_tuple(&a)))
    }

    /// The entries of a directory: (name, kind, inode, attributes), in name order; the
    /// attributes (symbolic links not followed) come with the listing, `None` for an
    /// entry removed meanwhile.
    #[allow(clippy::type_complexity)]
    fn scandir(
        &self,
        py: Python<'_>,
        path: PathBuf,
    ) -> PyResult<Vec<(Py<PyBytes>, &'static str, u64, Option<StatTuple>)>> {
        let p = bytes_of(&path);
        let entries = self.call(py, &p, async |c| {
            let d = c.resolve(&p, true).await?;
            if d.kind != FileKind::Dir {
                return Err(Errno::ENOTDIR);
            }
            perm::check(&c.creds, &d, R)?;
            // Attributes only where a stat of the entries would be allowed (search
            // permission), as the kernel shows none in a directory one may only read.
            let searchable = perm::check(&c.creds, &d, X).is_ok();
            let mut out = Vec::new();
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page = if searchable {
                    c.client.readdir_plus(&c.creds, d.ino, after.as_deref(), 1000).await?
                } else {
                    c.client
                        .meta()
                        .readdir_as(&c.creds, d.ino, after.as_deref(), 1000)
                        .await?
                };
                let Some(last) = page.last() else { break };
                after = Some(last.name.clone());
                out.extend(page);
            }
            Ok(out)
        })?;
        Ok(entries
            .into_iter()
            .map(|e| {
                (
                    PyBytes::new(py, &e.name).unbind(),
                    kind_name(e.kind),
                    e.ino.0,
                    e.attr.as_ref().map(stat_tuple),
                )
            })
            .collect())
    }

    /// Makes a directory.
    #[pyo3(signature = (path, mode=0o777))]
    fn mkdir(&self, py: Python<'_>, path: PathBuf, mode: u32) -> PyResult<()> {
        let p = bytes_of(&path);
        self.call(py, &p, async |c| {
            let (d, name) = c.parent_of(&p).await?;
            c.client
                .meta()
                .mknod(&c.creds, d.ino, &name, FileKind::Dir, mode & 0o7777, 0, None)
                .await
                .map(|_| ())
        })
    }

    /// Makes a symbolic link at `path` pointing to `target`.
    fn symlink(&self, py: Python<'_>, target: PathBuf, path: PathBuf) -> PyResult<()> {
        let (p, t) = (bytes_of(&path), bytes_of(&target));
        self.call(py, &p, async |c| {
            let (d, name) = c.parent_of(&p).await?;
            c.client
                .meta()
                .mknod(&c.creds, d.ino, &name, FileKind::Symlink, 0o777, 0, Some(&t))
                .await
                .map(|_| ())
        })
    }

    /// The target of a symbolic link.
    fn readlink<'py>(&self, py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyBytes>> {
        let p = bytes_of(&path);
        let t = self.call(py, &p, async |c| {
            let a = c.resolve(&p, false).await?;
            c.client.meta().readlink(a.ino).await
        })?;
        Ok(PyBytes::new(py, &t))
    }

    /// Removes a file (its data stays while this client has it open).
    fn unlink(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let p = bytes_of(&path);
        self.call(py, &p, async |c| {
            let (d, name) = c.parent_of(&p).await?;
            c.client.unlink(&c.creds, d.ino, &name).await
        })
    }

    /// Removes an empty directory.
    fn rmdir(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let p = bytes_of(&path);
        self.call(py, &p, async |c| {
            let (d, name) = c.parent_of(&p).await?;
            c.forget_dirs();
            c.client.meta().rmdir(&c.creds, d.ino, &name).await
        })
    }

    /// Renames `src` to `dst`, replacing `dst` unless `noreplace`.
    #[pyo3(signature = (src, dst, noreplace=false))]
    fn rename(&self, py: Python<'_>, src: PathBuf, dst: PathBuf, noreplace: bool) -> PyResult<()> {
        let (s, t) = (bytes_of(&src), bytes_of(&dst));
        self.call(py, &s, async |c| {
            let (sd, sn) = c.parent_of(&s).await?;
            let (td, tn) = c.parent_of(&t).await?;
            c.forget_dirs();
            c.client
                .rename(&c.creds, sd.ino, &sn, td.ino, &tn, noreplace, false)
                .await
        })
    }

    /// Changes attributes: any of mode, uid, gid, size, atime and mtime (ns).
    #[pyo3(signature = (path, mode=None, uid=None, gid=None, size=None, atime_ns=None, mtime_ns=None, follow=true))]
    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        py: Python<'_>,
        path: PathBuf,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime_ns: Option<i64>,
        mtime_ns: Option<i64>,
        follow: bool,
    ) -> PyResult<StatTuple> {
        let p = bytes_of(&path);
        self.call(py, &p, async |c| {
            let a = c.resolve(&p, follow).await?;
            if size.is_some() {
                if a.kind == FileKind::Dir {
                    return Err(Errno::EISDIR);
                }
                perm::check(&c.creds, &a, W)?;
            }
            if mode.is_some() && a.kind == FileKind::Dir {
                c.forget_dirs();
            }
            let set = SetAttr {
                perm: mode.map(|m| m & 0o7777),
                uid,
                gid,
                size,
                atime: atime_ns,
                mtime: mtime_ns,
            };
            c.client.setattr(&c.creds, a.ino, set).await.map(|a| stat_tuple(&a))
        })
    }

    /// Opens a file: `os.open`'s flags spelled out; `perm` for a file it creates.
    #[pyo3(signature = (path, read=true, write=false, create=false, exclusive=false, truncate=false, append=false, perm=0o644))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        py: Python<'_>,
        path: PathBuf,
        read: bool,
        write: bool,
        create: bool,
        exclusive: bool,
        truncate: bool,
        append: bool,
        perm: u32,
    ) -> PyResult<File> {
        let p = bytes_of(&path);
        let m = OpenMode {
            read,
            write,
            create,
            exclusive,
            truncate,
            append,
        };
        let opened = self.call(py, &p, async |c| c.open(&p, m, perm).await)?;
        Ok(File::new(Arc::clone(self.core()?), p, opened, m))
    }

    /// All of a file, as a read-only buffer over the client's bytes (no copy when the
    /// file is one read; `bytes(buf)` copies it).
    fn read_file(&self, py: Python<'_>, path: PathBuf) -> PyResult<Buffer> {
        let p = bytes_of(&path);
        let data = self.call(py, &p, async |c| c.read_file(&p).await)?;
        Ok(Buffer::new(data))
    }

    /// Starts reading these files whole in the background; a later `open` or
    /// `read_file` of one that is unchanged is served from memory.
    fn prefetch(&self, paths: Vec<PathBuf>) -> PyResult<()> {
        let c = self.core()?;
        c.prefetch(paths.iter().map(|p| bytes_of(p)).collect());
        Ok(())
    }

    /// The prefetch cache: (files held, bytes held, files on their way, hits, misses).
    fn prefetch_stats(&self) -> PyResult<(usize, usize, usize, u64, u64)> {
        let c = self.core()?;
        let p = c.prefetched.lock();
        Ok((p.files.len(), p.bytes, p.pending.len(), p.hits, p.misses))
    }

    /// Capacity: (total bytes, free bytes, inodes in use, inodes free).
    fn statfs(&self, py: Python<'_>) -> PyResult<(u64, u64, u64, u64)> {
        let c = self.core()?;
        let s = c.block(py, async || c.client.statfs().await);
        Ok((s.total, s.free, s.files, s.files_free))
    }

    /// Closes the connection (open files keep theirs until they close).
    fn close(&mut self) {
        release(self.core.take());
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.core.is_none()
    }
}
