"""An fsspec filesystem for ``shingle://`` URLs.

Registered as an fsspec entry point, so pandas, pyarrow, Hugging Face ``datasets``
and anything else that takes fsspec URLs read and write a cluster directly::

    pandas.read_parquet("shingle:///datasets/train.parquet",
                        storage_options={"cluster_file": "...", "secret_file": "..."})

``shingle:///a/b`` and ``shingle://a/b`` both name ``/a/b``. Without storage options
the cluster file and secret come from ``SHINGLE_CLUSTER_FILE`` and
``SHINGLE_SECRET_FILE``.
"""

from __future__ import annotations

import stat as _stat
from typing import Any, Optional

from fsspec.spec import AbstractFileSystem

from . import Client


class ShingleFileSystem(AbstractFileSystem):
    """fsspec's interface over a ``shingle.Client``."""

    protocol = ("shingle",)
    root_marker = "/"

    def __init__(
        self,
        cluster_file: Optional[str] = None,
        secret_file: Optional[str] = None,
        auto_mkdir: bool = False,
        **kwargs: Any,
    ):
        """``auto_mkdir``: opening a file for writing makes its missing parent
        directories (as fsspec's local filesystem does with the same option)."""
        client_kw = {k: kwargs.pop(k) for k in ("uid", "gid", "groups", "timeout", "prefetch_bytes") if k in kwargs}
        super().__init__(**kwargs)
        self.auto_mkdir = auto_mkdir
        self.client = Client(cluster_file, secret_file, **client_kw)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("shingle://"):
            path = path[len("shingle://"):]
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    def _info_of(self, path: str, st) -> dict:
        kind = "directory" if _stat.S_ISDIR(st.st_mode) else "file"
        if _stat.S_ISLNK(st.st_mode):
            kind = "link"
        return {
            "name": path,
            "size": st.st_size,
            "type": kind,
            "mode": st.st_mode,
            "ino": st.st_ino,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "nlink": st.st_nlink,
            "mtime": st.st_mtime,
            "created": st.st_ctime,
        }

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._info_of(path, self.client.stat(path))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        st = self.client.stat(path)
        if not _stat.S_ISDIR(st.st_mode):
            return [self._info_of(path, st)] if detail else [path]
        base = path.rstrip("/")
        out = []
        for e in self.client.scandir(path):
            full = f"{base}/{e.name}"
            if detail:
                try:
                    out.append(self._info_of(full, e.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue
            else:
                out.append(full)
        return out

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if self.auto_mkdir and "r" not in mode:
            self.client.makedirs(self._parent(path), exist_ok=True)
        return self.client.open(path, mode)

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if start is None and end is None:
            return self.client.read_bytes(path)
        with self.client.open(path, "rb") as f:
            size = f.size
            start = 0 if start is None else (start if start >= 0 else max(0, size + start))
            end = size if end is None else (end if end >= 0 else max(0, size + end))
            return f.pread(max(0, end - start), start)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        with self.client.open(path, "xb" if mode == "create" else "wb") as f:
            f.write(value)

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if create_parents:
            self.client.makedirs(path, exist_ok=False)
        else:
            self.client.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        self.client.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path):
        # fsspec's recursive rm hands directories here too, deepest first.
        path = self._strip_protocol(path)
        if self.client.isdir(path):
            self.client.rmdir(path)
        else:
            self.client.remove(path)

    _rm = rm_file

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """A rename (atomic, any size, directories included)."""
        self.client.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            with self.client.open(path, "wb"):
                pass
        else:
            self.client.utime(path)

    def created(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.timezone.utc)

    def modified(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)
