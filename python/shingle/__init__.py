"""Native Python access to a Shingle cluster filesystem.

The Rust client is embedded in this process: no FUSE mount, no kernel copies. Paths
are absolute from the filesystem's root (``/datasets/shard-00001.bin``)::

    import shingle
    fs = shingle.Client("/etc/shingle/cluster.toml", "/etc/shingle/secret")
    with fs.open("/datasets/shard-00001.bin", "rb") as f:
        header = f.read(64)
        arr = numpy.empty(1 << 20, dtype=numpy.uint8)
        f.readinto(arr)                      # straight into the array
    fs.prefetch(["/datasets/shard-00002.bin"])   # read ahead of the sampler
    data = fs.read_buffer("/datasets/shard-00002.bin")  # zero-copy buffer

Without arguments the cluster file and secret come from ``SHINGLE_CLUSTER_FILE`` and
``SHINGLE_SECRET_FILE``. Errors are ``OSError``s with the errno the filesystem
answered (``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError`` ...).

A ``Client`` can be pickled and survives ``fork``: each process connects on its first
call (so a ``torch.utils.data.DataLoader``'s workers each get their own connection).
Files are not shared across processes: open them in the process that uses them.

Consistency is that of the mount (close-to-open): ``open`` sees everything another
client had closed (or flushed) before; what a file's ``flush``/``close`` returns from
is durable on the cluster.
"""

from __future__ import annotations

import io
import os
import stat as _stat
from typing import Iterable, Iterator, Optional, Sequence, Union

from . import _native

__all__ = ["Client", "File", "DirEntry", "connect"]

PathLike = Union[str, bytes, "os.PathLike[str]"]

_UMASK = os.umask(0)
os.umask(_UMASK)


def _fspath(path: PathLike) -> str:
    p = os.fspath(path)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    return p


def _stat_result(t: tuple) -> os.stat_result:
    mode, ino, nlink, uid, gid, size, at, mt, ct, rdev = t
    blocks = (size + 511) // 512
    return os.stat_result(
        (mode, ino, 0, nlink, uid, gid, size,
         at // 10**9, mt // 10**9, ct // 10**9,
         at / 1e9, mt / 1e9, ct / 1e9,
         at, mt, ct,
         4 << 20, blocks, rdev)
    )


class DirEntry:
    """One entry of ``Client.scandir``, shaped like ``os.DirEntry``: ``stat()`` with
    ``follow_symlinks=False`` (and for anything but a symbolic link) answers from the
    attributes the listing carried, with no round trip. ``kind`` is ``file``, ``dir``,
    ``symlink``, ``fifo``, ``socket``, ``chardev`` or ``blockdev``."""

    __slots__ = ("name", "path", "inode_number", "kind", "_lstat", "_client")

    def __init__(self, name: str, path: str, inode_number: int, kind: str,
                 lstat: Optional[os.stat_result] = None, client: Optional["Client"] = None):
        self.name = name
        self.path = path
        self.inode_number = inode_number
        self.kind = kind
        self._lstat = lstat
        self._client = client

    def __repr__(self) -> str:
        return f"<DirEntry {self.name!r} {self.kind}>"

    def __fspath__(self) -> str:
        return self.path

    def inode(self) -> int:
        return self.inode_number

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self.kind == "dir"

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return self.kind == "file"

    def is_symlink(self) -> bool:
        return self.kind == "symlink"

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        """The entry's attributes as the listing read them (a symbolic link's target's
        when following, read now); ``FileNotFoundError`` if it was removed before."""
        if self._lstat is not None and not (follow_symlinks and self.kind == "symlink"):
            return self._lstat
        if self._client is None:
            raise FileNotFoundError(2, "No such file or directory", self.path)
        return self._client.stat(self.path, follow_symlinks=follow_symlinks)


def _mode_flags(mode: str) -> dict:
    """``open()``'s mode string as the flags of an open."""
    kinds = set(mode) - {"b", "t"}
    first = [c for c in mode if c in "rwax"]
    if len(first) != 1 or not kinds <= {"r", "w", "a", "x", "+"} or ("b" in mode and "t" in mode):
        raise ValueError(f"invalid mode: {mode!r}")
    plus = "+" in mode
    c = first[0]
    return {
        "read": c == "r" or plus,
        "write": c != "r" or plus,
        "create": c in "wax",
        "exclusive": c == "x",
        "truncate": c == "w",
        "append": c == "a",
    }


class File(io.RawIOBase):
    """An open file of a Shingle cluster (binary, unbuffered: every read and write
    goes to the client, which reads whole stripes ahead and writes whole stripes).

    Besides the ``io.RawIOBase`` methods: ``read_buffer`` (a zero-copy buffer),
    ``pread``/``preadinto``/``pwrite`` (positioned, the position does not move) and
    ``size``. ``flush`` and ``close`` commit what was written (durable when they
    return)."""

    def __init__(self, native: "_native.File", name: str, mode: str):
        super().__init__()
        self._f = native
        self.name = name
        self.mode = mode
        self._pid = os.getpid()
        self._flags = _mode_flags(mode)

    def readable(self) -> bool:
        return self._flags["read"]

    def writable(self) -> bool:
        return self._flags["write"]

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._f.readinto(buffer)

    def read(self, size: Optional[int] = -1) -> bytes:
        return self._f.read(-1 if size is None else size)

    def readall(self) -> bytes:
        return self._f.read(-1)

    def read_buffer(self, size: int = -1) -> "_native.Buffer":
        """Like ``read``, as a read-only buffer over the client's own bytes (no copy):
        ``numpy.frombuffer(f.read_buffer(), dtype=...)``."""
        return self._f.read_buffer(size)

    def readline(self, size: Optional[int] = -1) -> bytes:
        limit = -1 if size is None else size
        out = bytearray()
        pos = self._f.tell()
        while limit < 0 or len(out) < limit:
            want = 65536 if limit < 0 else min(65536, limit - len(out))
            chunk = self._f.pread(want, pos + len(out))
            if not chunk:
                break
            nl = chunk.find(b"\n")
            if nl >= 0:
                out += chunk[: nl + 1]
                break
            out += chunk
        self._f.seek(pos + len(out))
        return bytes(out)

    def pread(self, size: int, offset: int) -> bytes:
        return self._f.pread(size, offset)

    def preadinto(self, buffer, offset: int) -> int:
        return self._f.preadinto(buffer, offset)

    def write(self, data) -> int:
        return self._f.write(data)

    def pwrite(self, data, offset: int) -> int:
        return self._f.pwrite(data, offset)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def truncate(self, size: Optional[int] = None) -> int:
        return self._f.truncate(self._f.tell() if size is None else size)

    @property
    def size(self) -> int:
        """The file's size now, including what was written here and not committed."""
        return self._f.size

    def flush(self) -> None:
        if not self._f.closed and os.getpid() == self._pid:
            self._f.flush()

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a Shingle file has no file descriptor")

    def close(self) -> None:
        if self.closed:
            return
        try:
            if os.getpid() == self._pid:
                self._f.close()
        finally:
            super().close()

    def __repr__(self) -> str:
        return f"<shingle.File name={self.name!r} mode={self.mode!r}>"


class Client:
    """A connection to a Shingle cluster.

    ``cluster_file`` and ``secret_file`` default to ``SHINGLE_CLUSTER_FILE`` and
    ``SHINGLE_SECRET_FILE``. The client acts as ``uid``/``gid``/``groups`` (by default
    this process's) and checks permissions as the kernel does on a mount.
    ``prefetch_bytes`` bounds the memory of files read ahead by ``prefetch``."""

    def __init__(
        self,
        cluster_file: Optional[PathLike] = None,
        secret_file: Optional[PathLike] = None,
        *,
        uid: Optional[int] = None,
        gid: Optional[int] = None,
        groups: Optional[Sequence[int]] = None,
        timeout: float = 30.0,
        prefetch_bytes: int = 256 << 20,
    ):
        cluster_file = cluster_file or os.environ.get("SHINGLE_CLUSTER_FILE")
        secret_file = secret_file or os.environ.get("SHINGLE_SECRET_FILE")
        if not cluster_file or not secret_file:
            raise ValueError(
                "name the cluster file and the secret file "
                "(or set SHINGLE_CLUSTER_FILE and SHINGLE_SECRET_FILE)"
            )
        self._args = dict(
            cluster_file=_fspath(cluster_file),
            secret_file=_fspath(secret_file),
            uid=os.geteuid() if uid is None else uid,
            gid=os.getegid() if gid is None else gid,
            groups=list(os.getgroups() if groups is None else groups),
            timeout=timeout,
            prefetch_bytes=prefetch_bytes,
        )
        self._native: Optional[_native.Session] = None
        self._pid = -1
        self._closed = False
        self._s  # connect now, so a wrong cluster file fails here

    @property
    def _s(self) -> "_native.Session":
        if self._closed:
            raise ValueError("the Shingle client is closed")
        if self._native is None or self._pid != os.getpid():
            a = self._args
            self._native = _native.Session(
                a["cluster_file"], a["secret_file"], a["uid"], a["gid"], a["groups"],
                a["timeout"], a["prefetch_bytes"],
            )
            self._pid = os.getpid()
        return self._native

    def __getstate__(self) -> dict:
        return {"_args": self._args}

    def __setstate__(self, state: dict) -> None:
        self._args = state["_args"]
        self._native = None
        self._pid = -1
        self._closed = False

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection (files still open keep theirs until they close)."""
        if self._native is not None and self._pid == os.getpid():
            self._native.close()
        self._native = None
        self._closed = True

    # -- names ---------------------------------------------------------------

    def stat(self, path: PathLike, *, follow_symlinks: bool = True) -> os.stat_result:
        return _stat_result(self._s.stat(_fspath(path), follow_symlinks))

    def lstat(self, path: PathLike) -> os.stat_result:
        return self.stat(path, follow_symlinks=False)

    def exists(self, path: PathLike) -> bool:
        try:
            self.stat(path)
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path: PathLike) -> bool:
        try:
            return _stat.S_ISDIR(self.stat(path).st_mode)
        except FileNotFoundError:
            return False

    def isfile(self, path: PathLike) -> bool:
        try:
            return _stat.S_ISREG(self.stat(path).st_mode)
        except FileNotFoundError:
            return False

    def scandir(self, path: PathLike = "/") -> Iterator[DirEntry]:
        """The entries of a directory, in name order (without ``.`` and ``..``)."""
        p = _fspath(path)
        base = p.rstrip("/")
        for name, kind, ino, attr in self._s.scandir(p):
            n = os.fsdecode(name)
            st = _stat_result(attr) if attr is not None else None
            yield DirEntry(n, f"{base}/{n}", ino, kind, st, self)

    def listdir(self, path: PathLike = "/") -> list[str]:
        return [e.name for e in self.scandir(path)]

    def walk(self, top: PathLike = "/", topdown: bool = True) -> Iterator[tuple[str, list[str], list[str]]]:
        """Like ``os.walk`` (symbolic links to directories are not followed)."""
        top = _fspath(top)
        try:
            entries = list(self.scandir(top))
        except OSError:
            return
        dirs = [e.name for e in entries if e.is_dir()]
        files = [e.name for e in entries if not e.is_dir()]
        if topdown:
            yield top, dirs, files
        for d in dirs:
            yield from self.walk(f"{top.rstrip('/')}/{d}", topdown)
        if not topdown:
            yield top, dirs, files

    def mkdir(self, path: PathLike, mode: int = 0o777) -> None:
        self._s.mkdir(_fspath(path), mode & ~_UMASK)

    def makedirs(self, path: PathLike, mode: int = 0o777, exist_ok: bool = False) -> None:
        p = _fspath(path).rstrip("/")
        if not p:
            if exist_ok:
                return
            raise FileExistsError(17, "File exists", "/")
        head = p.rsplit("/", 1)[0]
        if head and not self.exists(head):
            self.makedirs(head, mode, exist_ok=True)
        try:
            self.mkdir(p, mode)
        except FileExistsError:
            if not (exist_ok and self.isdir(p)):
                raise

    def remove(self, path: PathLike) -> None:
        self._s.unlink(_fspath(path))

    unlink = remove

    def rmdir(self, path: PathLike) -> None:
        self._s.rmdir(_fspath(path))

    def rename(self, src: PathLike, dst: PathLike) -> None:
        """Renames, replacing ``dst`` if it exists (as ``os.rename`` on Linux)."""
        self._s.rename(_fspath(src), _fspath(dst))

    replace = rename

    def symlink(self, target: PathLike, path: PathLike) -> None:
        self._s.symlink(_fspath(target), _fspath(path))

    def readlink(self, path: PathLike) -> str:
        return os.fsdecode(self._s.readlink(_fspath(path)))

    def chmod(self, path: PathLike, mode: int) -> None:
        self._s.setattr(_fspath(path), mode=mode)

    def chown(self, path: PathLike, uid: int, gid: int) -> None:
        self._s.setattr(
            _fspath(path), uid=None if uid == -1 else uid, gid=None if gid == -1 else gid
        )

    def utime(self, path: PathLike, times=None, *, ns=None) -> None:
        if ns is None:
            if times is None:
                import time

                now = time.time_ns()
                ns = (now, now)
            else:
                ns = (int(times[0] * 1e9), int(times[1] * 1e9))
        self._s.setattr(_fspath(path), atime_ns=ns[0], mtime_ns=ns[1])

    def truncate(self, path: PathLike, length: int) -> None:
        self._s.setattr(_fspath(path), size=length)

    def statvfs(self) -> dict:
        """Capacity: ``total``/``free`` bytes, ``files``/``files_free`` inodes."""
        total, free, files, files_free = self._s.statfs()
        return {"total": total, "free": free, "files": files, "files_free": files_free}

    # -- data ----------------------------------------------------------------

    def open(
        self,
        path: PathLike,
        mode: str = "rb",
        buffering: int = -1,
        encoding: Optional[str] = None,
        errors: Optional[str] = None,
        newline: Optional[str] = None,
        perm: int = 0o666,
    ):
        """Opens a file like the built-in ``open`` (modes ``r``, ``w``, ``a``, ``x``,
        with ``+`` and ``b``/``t``). Binary modes return a ``shingle.File``; text modes
        wrap it in ``io.TextIOWrapper``. ``perm`` (less the umask) is the mode of a
        file it creates."""
        flags = _mode_flags(mode)
        p = _fspath(path)
        native = self._s.open(p, perm=perm & ~_UMASK, **flags)
        raw = File(native, p, mode)
        if "b" in mode:
            return raw
        if flags["read"] and flags["write"]:
            buffered = io.BufferedRandom(raw)
        elif flags["write"]:
            buffered = io.BufferedWriter(raw, buffer_size=1 << 20)
        else:
            buffered = io.BufferedReader(raw, buffer_size=1 << 20)
        return io.TextIOWrapper(buffered, encoding=encoding or "utf-8", errors=errors, newline=newline)

    def read_buffer(self, path: PathLike) -> "_native.Buffer":
        """All of a file as a read-only buffer over the client's bytes (zero-copy when
        the file was prefetched or is one read)."""
        return self._s.read_file(_fspath(path))

    def read_bytes(self, path: PathLike) -> bytes:
        return bytes(self.read_buffer(path))

    def write_bytes(self, path: PathLike, data) -> int:
        """Creates or replaces the content of ``path``; durable when it returns."""
        with self.open(path, "wb") as f:
            return f.write(data)

    def prefetch(self, paths: Iterable[PathLike]) -> None:
        """Starts reading these files whole in the background (8 at a time, within
        ``prefetch_bytes``); a later ``open``/``read_buffer`` of one that has not
        changed is served from memory, once."""
        self._s.prefetch([_fspath(p) for p in paths])

    def prefetch_stats(self) -> dict:
        held, held_bytes, pending, hits, misses = self._s.prefetch_stats()
        return {"files": held, "bytes": held_bytes, "pending": pending, "hits": hits, "misses": misses}


def connect(cluster_file: Optional[PathLike] = None, secret_file: Optional[PathLike] = None, **kw) -> Client:
    """``Client(cluster_file, secret_file, **kw)``."""
    return Client(cluster_file, secret_file, **kw)
