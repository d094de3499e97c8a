"""A map-style dataset of files on a Shingle cluster.

``ShingleDataset`` works as a ``torch.utils.data.Dataset`` (``__len__`` and
``__getitem__``; torch is not needed to use it) and is safe with a multiprocessing
``DataLoader``: it holds a ``shingle.Client``, which connects again in each worker
after ``fork`` (or after unpickling, with ``spawn``). Item ``i`` is the content of
file ``i`` (a zero-copy buffer: ``numpy.frombuffer(item, ...)``), passed through
``transform`` when one is given.

Reading ahead: after item ``i`` the dataset prefetches the next ``prefetch`` files in
the order it expects. That order is the file order, or the sampler's order when you
give it with ``set_order(list(sampler))`` each epoch (a worker of a DataLoader sees
every ``num_workers``-th index of that order, so it reads ahead along its own share).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from . import Client


class ShingleDataset:
    """The files ``paths`` (or every file under ``root``, sorted) as a dataset."""

    def __init__(
        self,
        paths: Optional[Sequence[str]] = None,
        *,
        root: Optional[str] = None,
        client: Optional[Client] = None,
        transform: Optional[Callable[[Any], Any]] = None,
        prefetch: int = 8,
        stride: int = 1,
        **client_kw: Any,
    ):
        self.client = client or Client(**client_kw)
        if paths is None:
            if root is None:
                raise ValueError("give the files (paths=...) or a directory (root=...)")
            paths = sorted(
                f"{d.rstrip('/')}/{f}" for d, _, files in self.client.walk(root) for f in files
            )
        self.paths = list(paths)
        self.transform = transform
        self.prefetch = prefetch
        self.stride = max(1, stride)
        self._order: Optional[list[int]] = None
        self._where: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.paths)

    def set_order(self, indices: Sequence[int], stride: Optional[int] = None) -> None:
        """The order items will be asked in (for example ``list(sampler)``), and the
        step between one worker's items in it (a DataLoader's ``num_workers``)."""
        self._order = list(indices)
        self._where = {i: n for n, i in enumerate(self._order)}
        if stride is not None:
            self.stride = max(1, stride)

    def _next(self, index: int) -> list[str]:
        if self.prefetch <= 0:
            return []
        if self._order is None:
            nxt = range(index + self.stride, len(self.paths), self.stride)
        else:
            at = self._where.get(index)
            if at is None:
                return []
            nxt = self._order[at + self.stride :: self.stride]
        return [self.paths[i] for _, i in zip(range(self.prefetch), nxt)]

    def __getitem__(self, index: int):
        if index < 0:
            index += len(self.paths)
        if not 0 <= index < len(self.paths):
            raise IndexError(index)
        ahead = self._next(index)
        if ahead:
            self.client.prefetch(ahead)
        data = self.client.read_buffer(self.paths[index])
        return self.transform(data) if self.transform else data
