"""Samplers: torch's DistributedSampler (bit-exact) and the token-budget
dynamic batch sampler, both resumable."""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _core

try:
    import torch as _torch
    from torch.utils.data import Sampler as _Base
except ImportError:  # pragma: no cover
    _torch = None
    _Base = object


def _default_compat() -> str:
    """torch.randperm's algorithm for n >= 214,748,364 changed in torch 2.7:
    reproduce the installed torch's (the newer one without torch)."""
    if _torch is None:
        return "since_2_7"
    major, minor = (int(x) for x in _torch.__version__.split(".")[:2])
    return "since_2_7" if (major, minor) >= (2, 7) else "before_2_7"


def _world(num_replicas: Optional[int], rank: Optional[int], who: str):
    """torch's defaults: the default process group's world size and rank."""
    if num_replicas is None or rank is None:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(f"{who}: num_replicas and rank not given and torch.distributed is not initialized")
        if num_replicas is None:
            num_replicas = dist.get_world_size()
        if rank is None:
            rank = dist.get_rank()
    return num_replicas, rank


class _Resumable:
    """set_epoch / state_dict / load_state_dict of both samplers: the state
    is the epoch and the global offset (C++ set_epoch(epoch, offset)) plus
    the settings it is only valid for (`_settings()`)."""

    def _settings(self) -> Dict[str, Any]:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch (torch: sampler.set_epoch): its beginning, or
        the offset load_state_dict loaded for that epoch."""
        start = self._resume[1] if self._resume and self._resume[0] == epoch else 0
        self.epoch = epoch
        self._s.set_epoch(epoch, start)
        self._yielded = 0

    def _state(self, done: Optional[int]) -> Dict[str, Any]:
        k = self._yielded if done is None else done
        return {"epoch": self.epoch, "offset": self._s.offset_after(k), **self._settings()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at ``state``'s epoch and offset. Raises
        dpkit.InvalidArgument naming the first setting that differs."""
        who = type(self).__name__
        for k, v in self._settings().items():
            if k in state and state[k] != v:
                raise _core.InvalidArgument(f"{who}.load_state_dict: {k} is {state[k]!r} in the state, {v!r} here")
        self._resume = (state["epoch"], state["offset"])
        self.epoch = state["epoch"]
        self._s.set_epoch(state["epoch"], state["offset"])
        self._yielded = 0


class DistributedSampler(_Resumable, _Base):
    """The indices rank ``rank`` of ``num_replicas`` reads in one epoch: equal
    to ``torch.utils.data.DistributedSampler(dataset, num_replicas, rank,
    shuffle, seed, drop_last)`` for every epoch (the default engine
    ``"torch"`` reproduces ``torch.randperm`` bit for bit, for the installed
    torch's version unless ``torch_compat`` says otherwise).

    Extras (C++ ``dpkit::distributed_sampler``, docs/data.md):

    - ``engine="feistel"``: a keyed Feistel permutation instead of randperm:
      O(1) memory and O(1) per index at any dataset size (a different order
      than torch's);
    - ``exactly_once=True`` (evaluation): every sample once over all ranks,
      no padding (torch pads with duplicates); ranks differ by at most one
      sample;
    - resumption: ``state_dict(samples_done)`` saves the epoch and the global
      offset (the positions all ranks consumed); ``load_state_dict`` resumes
      there on any world size: no sample of the epoch is lost or repeated.

    ``dataset`` is a sized dataset or its length (an int). Iterating yields
    ints. ``set_epoch(epoch)`` as torch's (after ``load_state_dict`` the
    saved epoch keeps its offset).

    Raises :class:`dpkit.InvalidArgument` for num_replicas < 1, rank not in
    [0, num_replicas), exactly_once with drop_last, an unknown engine, or a
    state saved with other settings.
    """

    def __init__(self, dataset: Union[int, Sequence[Any]], num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0, drop_last: bool = False, *,
                 exactly_once: bool = False, engine: str = "torch", torch_compat: Optional[str] = None,
                 rounds: int = 4):
        num_replicas, rank = _world(num_replicas, rank, "DistributedSampler")
        self.dataset_size = dataset if isinstance(dataset, int) else len(dataset)
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.exactly_once, self.engine = exactly_once, engine
        self.torch_compat = torch_compat or _default_compat()
        self._s = _core.DistributedSampler(self.dataset_size, num_replicas, rank, shuffle, seed, drop_last,
                                           exactly_once, engine, self.torch_compat, rounds)
        self.epoch = 0
        self._yielded = 0
        self._resume: Optional[tuple] = None

    def __iter__(self) -> Iterator[int]:
        self._yielded = 0
        self._resume = None
        n, k, block = len(self._s), 0, 8192
        while k < n:
            chunk = self._s.block(k, k + block)
            for i in chunk:
                self._yielded += 1
                yield i
            k += len(chunk)

    def __len__(self) -> int:
        """Samples this rank reads from the current start (torch: num_samples)."""
        return len(self._s)

    def __getitem__(self, k: int) -> int:
        """This rank's k-th index of the epoch (from the current start)."""
        return self._s[k]

    def _settings(self) -> Dict[str, Any]:
        return {"dataset_size": self.dataset_size, "shuffle": self.shuffle, "seed": self.seed,
                "drop_last": self.drop_last, "exactly_once": self.exactly_once, "engine": self.engine}

    def state_dict(self, samples_done: Optional[int] = None) -> Dict[str, Any]:
        """The epoch and the global offset after this rank read
        ``samples_done`` samples of it (default: the samples iteration has
        yielded, which with DataLoader workers runs ahead of training by the
        prefetched batches; pass steps x batch size to be exact). The same
        offset is valid on every rank and world size; load_state_dict
        resumes there."""
        return self._state(samples_done)


class TokenBudgetBatchSampler(_Resumable, _Base):
    """Batches of sample indices under a token budget, the same number on
    every rank: FunASR's ``CustomDistributedBufferDynamicBatchSampler`` (the
    seed's sampler) made deterministic (C++
    ``dpkit::token_budget_batch_sampler``, docs/data.md).

    Per epoch: shuffle the indices with ``torch.randperm(N,
    manual_seed(seed + epoch))`` (``shuffle_with="feistel"``: O(1) memory at
    1e8+ samples); sort each buffer of ``sort_size * num_replicas`` samples by
    length (stable); pack greedily while ``max_len * count <= max_tokens``
    (``batch_type="token"``; ``"example"`` counts samples) and ``count <=
    max_batch_size``; samples over ``max_sample_tokens`` are skipped
    (``oversize="truncate"`` keeps them at the limit, ``"error"`` raises);
    batches are dealt round-robin to ranks and padded with duplicates
    (``balance="drop"`` drops the tail instead) so every rank runs
    ``len(self)`` steps. Differences from the seed: batches hold up to
    max_batch_size samples (the seed stops at max_batch_size - 1), the
    padding is deterministic, the seed is ``seed + epoch``, and the order of
    steps is shuffled (``shuffle_batches=False`` keeps the seed's order).

    ``lengths`` is a :class:`JsonlDataset` opened with a ``length_field``
    (the lengths stay in its index: nothing copied), or a sequence of ints.
    Iterating yields lists of ints. ``elastic=True`` makes the batch sequence
    independent of the world size (resume on another one).
    ``state_dict(steps_done)`` / ``load_state_dict`` resume mid-epoch.

    Raises :class:`dpkit.InvalidArgument` for bad options, a rank out of
    range, or a dataset without a length column.
    """

    def __init__(self, lengths: Any, max_tokens: int, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, *, batch_type: str = "token", max_batch_size: int = 200,
                 max_sample_tokens: int = 2048, oversize: str = "skip", sort_size: int = 1024,
                 shuffle: bool = True, shuffle_with: str = "torch", shuffle_batches: bool = True, seed: int = 0,
                 balance: str = "pad", batch_size_multiple: int = 1, torch_compat: Optional[str] = None,
                 elastic: bool = False, threads: int = 0):
        num_replicas, rank = _world(num_replicas, rank, "TokenBudgetBatchSampler")
        self.num_replicas, self.rank = num_replicas, rank
        self.options = dict(max_tokens=max_tokens, batch_type=batch_type, max_batch_size=max_batch_size,
                            max_sample_tokens=max_sample_tokens, oversize=oversize, sort_size=sort_size,
                            shuffle=shuffle, shuffle_with=shuffle_with, shuffle_batches=shuffle_batches, seed=seed,
                            balance=balance, batch_size_multiple=batch_size_multiple,
                            torch_compat=torch_compat or _default_compat(), elastic=elastic)
        from .data import JsonlDataset
        if isinstance(lengths, JsonlDataset):
            self.dataset_size = len(lengths)
            self._s = _core.TokenBudgetBatchSampler(lengths._index, num_replicas, rank, threads=threads,
                                                    **self.options)
        else:
            lengths = [int(x) for x in lengths]
            self.dataset_size = len(lengths)
            self._s = _core.TokenBudgetBatchSampler(lengths, num_replicas, rank, threads=threads, **self.options)
        self.epoch = 0
        self._yielded = 0
        self._resume: Optional[tuple] = None

    def __iter__(self) -> Iterator[List[int]]:
        self._yielded = 0
        self._resume = None
        for step in range(len(self._s)):
            b = self._s.batch(step)
            self._yielded += 1
            yield b

    def __len__(self) -> int:
        """Steps (batches per rank) from the current start."""
        return len(self._s)

    def batch(self, step: int) -> List[int]:
        """This rank's batch at ``step`` (O(sort buffer))."""
        return self._s.batch(step)

    def plan_batch(self, b: int) -> List[int]:
        """Plan batch ``b`` (0 <= b < total_batches, before the deal to ranks)."""
        return self._s.plan_batch(b)

    def is_padding(self, step: int) -> bool:
        """True if this rank's batch at ``step`` is a padding duplicate."""
        return self._s.is_padding(step)

    @property
    def total_batches(self) -> int:
        """Batches of the epoch's plan, over all ranks, before padding."""
        return self._s.total_batches

    @property
    def skipped(self) -> int:
        """Samples left out this epoch (over max_sample_tokens)."""
        return self._s.skipped

    @property
    def kept_samples(self) -> int:
        """Samples in the epoch's plan."""
        return self._s.kept_samples

    def _settings(self) -> Dict[str, Any]:
        return {"dataset_size": self.dataset_size, **self.options}

    def state_dict(self, steps_done: Optional[int] = None) -> Dict[str, Any]:
        """The epoch and global offset after ``steps_done`` steps (default:
        the batches iteration yielded; see DistributedSampler.state_dict).
        Resuming on another world size needs ``elastic=True``."""
        return self._state(steps_done)
