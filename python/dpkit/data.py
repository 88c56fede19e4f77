"""JsonlDataset: dpkit's memory-mapped JSONL index as a map-style dataset."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, List, Optional, Sequence, Union

from . import _core

try:  # a torch Dataset when torch is there; any DataLoader takes it either way
    from torch.utils.data import Dataset as _Base
except ImportError:  # pragma: no cover - torch is optional for the data path
    _Base = object

PathLike = Union[str, os.PathLike]


def _decoder(decode: Union[str, Callable[[bytes], Any]]) -> Callable[[bytes], Any]:
    if callable(decode):
        return decode
    if decode == "json":
        return json.loads
    if decode == "bytes":
        return lambda b: b
    if decode == "str":
        return lambda b: b.decode("utf-8")
    raise _core.InvalidArgument(f"JsonlDataset: decode {decode!r}: expected 'json', 'bytes', 'str' or a callable")


class _Progress:
    """tqdm bar over the bytes indexed (one bar per shard)."""

    def __init__(self, paths: Sequence[str]):
        self.paths = paths
        self.bar = None
        self.shard = -1

    def __call__(self, shard: int, done: int, total: int) -> bool:
        if shard != self.shard:
            self.close()
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                            desc=f"dpkit index {os.path.basename(self.paths[shard])}", file=sys.stderr)
            self.shard = shard
        self.bar.update(done - self.bar.n)
        return True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class JsonlDataset(_Base):
    """A JSONL file (or several shards, in order) as a map-style dataset.

    ``dataset[i]`` is line ``i`` (0-based, global over the shards) decoded with
    ``decode``: ``"json"`` (default, ``json.loads``: a dict for an object
    line), ``"bytes"`` (the raw line without ``\\n`` and a trailing ``\\r``),
    ``"str"`` (UTF-8) or a callable taking the bytes. ``len(dataset)`` is the
    number of lines (blank lines included: line numbers are file line numbers).

    The index (``<path>.idx`` unless ``index_path`` is given; format in
    docs/jsonl-index-format.md) is built when missing or stale if ``build``
    (with a tqdm progress bar on stderr when ``progress`` is true, the default
    when stderr is a terminal), else a missing or stale index raises
    :class:`dpkit.StaleIndexError` / :class:`dpkit.Error`. A damaged index
    raises :class:`dpkit.FormatError` and is never rebuilt silently.
    ``length_field`` (e.g. ``"num_tokens"``) stores that integer field of every
    line in the index, for :meth:`lengths` and :class:`TokenBudgetBatchSampler`.

    Memory: lines are read with ``pread`` (C++ ``jsonl_index::read_line``), not
    through the mapping, so the resident set of a process does not grow with
    the lines it has read, and nothing is copied per worker: with ``fork`` the
    workers share the parent's mappings, with ``spawn`` (or ``forkserver``) the
    dataset pickles as its paths and each worker reopens the index in O(1)
    (no checksum pass). Thread-safe.

    Raises: :class:`dpkit.Error` when a file cannot be opened (errno text),
    :class:`dpkit.FormatError` for a damaged index or a line whose
    ``length_field`` is not an integer (building), ``IndexError`` for an index
    out of range, ``KeyboardInterrupt`` if a build is interrupted (no index is
    written).
    """

    def __init__(self, path: Union[PathLike, Sequence[PathLike]], *, index_path: Optional[PathLike] = None,
                 length_field: Optional[str] = None, decode: Union[str, Callable[[bytes], Any]] = "json",
                 build: bool = True, progress: Optional[bool] = None, threads: int = 0,
                 verify_checksum: bool = True):
        if isinstance(path, (str, bytes, os.PathLike)):
            paths = [os.fspath(path)]
        else:
            paths = [os.fspath(p) for p in path]
        self.paths: List[str] = paths
        self.index_path = os.fspath(index_path) if index_path is not None else None
        self.length_field = length_field
        self.decode = decode
        self._decode = _decoder(decode)
        if progress is None:
            progress = sys.stderr.isatty()
        bar = _Progress(paths) if progress and build else None
        try:
            self._index = _core.JsonlIndex(paths, self.index_path, length_field, build, threads, verify_checksum, bar)
        finally:
            if bar is not None:
                bar.close()

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> Any:
        return self._decode(self._index.line(i))

    def __getitems__(self, indices: Sequence[int]) -> List[Any]:
        """Several lines in one call (torch >= 2.0's batched fetch)."""
        return [self._decode(b) for b in self._index.lines(list(indices))]

    def raw(self, i: int) -> bytes:
        """Line ``i`` as bytes, whatever ``decode`` is."""
        return self._index.line(i)

    @property
    def has_lengths(self) -> bool:
        """True if the index has the ``length_field`` column."""
        return self._index.has_lengths

    def length(self, i: int) -> int:
        """``length_field`` of line ``i`` (from the index, no parsing)."""
        return self._index.length(i)

    def lengths(self) -> List[int]:
        """``length_field`` of every line, as a list (copies N integers)."""
        return self._index.lengths()

    @property
    def index_paths(self) -> List[str]:
        """The index file of each shard."""
        return self._index.index_paths

    # pickling (spawn / forkserver workers): the paths, reopened in O(1)
    def __getstate__(self):
        return {"paths": self.paths, "index_path": self.index_path, "length_field": self.length_field,
                "decode": self.decode}

    def __setstate__(self, state):
        self.paths = state["paths"]
        self.index_path = state["index_path"]
        self.length_field = state["length_field"]
        self.decode = state["decode"]
        self._decode = _decoder(self.decode)
        self._index = _core.JsonlIndex(self.paths, self.index_path, self.length_field, False, 0, False, None)

    def __repr__(self) -> str:
        return f"JsonlDataset({self.paths!r}, lines={len(self)}, length_field={self.length_field!r})"
