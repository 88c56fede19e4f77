"""Elastic training from Python: a training loop that keeps going when a
member dies and admits members that join, with nothing but a store (a
directory every member mounts, or Redis). docs/python.md, "Elastic
training"; the C++ protocol underneath is docs/elastic.md's
``dpkit::elastic_group`` (heartbeats, numbered generations, majority rule).

- :class:`ElasticGroup`: this process's membership (store URL and a member
  id unique in the job), and collectives of CPU tensors over the current
  generation's transport (shared memory when every member is on one node,
  TCP otherwise).
- :class:`ElasticTrainer`: the usual loop (a ``torch.nn.Module``, a
  ``torch.optim`` optimizer, an optional LR scheduler, an elastic
  :class:`dpkit.TokenBudgetBatchSampler`). Gradients are averaged over the
  current members, as DDP averages them. A step during which a member fails
  is discarded; the survivors re-form the group, every member is healed
  bitwise from a member that holds the training state, and the sampler is
  re-sharded for the new world size at the global offset the state holds,
  so every sample of an epoch is trained exactly once.

Needs the backend extension (``dpkit.distributed.available()``).
"""
from __future__ import annotations

import datetime
import hashlib
import io
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from . import _core

__all__ = ["ElasticGroup", "ElasticTrainer", "HealInfo", "NoStateError", "state_checksum"]


def _seconds(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(s))


class ElasticGroup:
    """This process's membership in an elastic group (C++
    ``dpkit::elastic_group``, docs/elastic.md "Membership").

    ``store_url``: ``file:///abs/dir`` or ``redis://host:port/job`` (every
    member names the same; ``tcp://`` has a fixed server rank and is refused).
    ``member_id``: unique in the job and never reused (a restarted process
    takes a new one); ranks follow the ids' order and rank 0 (the lowest live
    id) is the master. The constructor joins: it returns once this process is
    a member of a generation whose transport is connected (the first
    generation of a job waits for ``first_size`` processes).

    Times are in seconds: a member whose heartbeat (rewritten every
    ``heartbeat_interval``) is seen unchanged for ``dead_after`` is dead;
    forming a generation waits up to ``announce_wait`` for a live candidate;
    ``connect_timeout`` limits connecting one generation; ``timeout`` a whole
    join or rebuild; ``step_timeout`` is the deadline of each collective
    (a member that stops making progress costs its peers at most that).
    ``step_deadline`` (None: off): a member that has not entered a step's
    collectives (:meth:`enter_step`; :class:`ElasticTrainer` calls it after
    backward) ``step_deadline`` after a member waiting for it entered them
    is failed like a dead one and not waited for when the group re-forms:
    a member stuck in user code, or a stopped device, with its heartbeat
    alive (the issue torchft's per-step quorum solves) costs the others about
    that long instead of ``step_timeout``; it must exceed the spread of the
    members' compute times in one step. Such a member that wakes up finds
    its step failed and joins again (it is admitted, and healed with the
    others' newer state).
    ``majority=True``: a generation after the first forms only with a strict
    majority of the previous one's members (the minority of a partition
    stops with :class:`dpkit.TimeoutError`: never a split brain).
    ``hostname``: the address this member's connections listen on (default:
    as the "dpkit" torch backend picks it: ``DPKIT_GLOO_HOSTNAME``, else
    Gloo's rule, 127.0.0.1 where the host name does not resolve).

    Raises :class:`dpkit.InvalidArgument` for a bad URL, id or size,
    :class:`dpkit.TimeoutError` when no generation with this process forms in
    time, :class:`dpkit.Error` when the store cannot be used.
    """

    def __init__(self, store_url: str, member_id: int, *, first_size: int = 1, min_size: int = 1,
                 majority: bool = True, heartbeat_interval: float = 0.5, dead_after: float = 5.0,
                 announce_wait: float = 30.0, connect_timeout: float = 60.0, timeout: float = 1800.0,
                 step_timeout: float = 60.0, step_deadline: Optional[float] = None,
                 hostname: Optional[str] = None):
        from . import _dist
        from .distributed import _gloo_hostname
        if hostname is None:
            hostname = _gloo_hostname()
        self._core = _dist.ElasticCore(store_url, int(member_id), int(first_size), int(min_size), bool(majority),
                                       _seconds(heartbeat_interval), _seconds(dead_after), _seconds(announce_wait),
                                       _seconds(connect_timeout), _seconds(timeout), _seconds(step_timeout),
                                       _seconds(step_deadline or 0.0), hostname)

    @property
    def id(self) -> int:
        """This process's member id."""
        return self._core.id

    @property
    def rank(self) -> int:
        """This process's rank in the current generation (its id's position
        among the members' ids)."""
        return self._core.rank

    @property
    def size(self) -> int:
        """Members of the current generation (the world size)."""
        return self._core.size

    @property
    def generation(self) -> int:
        """The current generation's number (grows with every re-forming)."""
        return self._core.generation

    @property
    def first_generation(self) -> int:
        """The generation this process first became a member in: 0 for the
        processes the job started with (they hold its initial state)."""
        return self._core.first_generation

    @property
    def members(self) -> List[int]:
        """The members' ids, ascending (members[r] has rank r)."""
        return list(self._core.members)

    @property
    def shm_messages(self) -> bool:
        """True when this generation's messages go through shared memory
        (every member on this node)."""
        return self._core.shm_messages

    def rebuild(self) -> None:
        """Forms the next generation with the live members and the live
        processes waiting to join (every survivor calls it after a
        collective raised). Raises :class:`dpkit.TimeoutError` when none
        forms within ``timeout`` (too few members alive, or the minority
        of a partition)."""
        self._core.rebuild()

    def admit_joiners(self) -> bool:
        """Collective of all members at a step boundary: if any sees a live
        process waiting to join, all re-form with it and True is returned.
        Raises as a collective (a member failed: then :meth:`rebuild`)."""
        return self._core.admit_joiners()

    def enter_step(self, step: int) -> None:
        """Announces that this member enters the collectives of step
        ``step`` (numbered equally on every member) and starts the step
        deadline (a store write; nothing without ``step_deadline``)."""
        self._core.enter_step(int(step))

    def joiners(self) -> List[int]:
        """Ids of live processes waiting to join, as this process sees them."""
        return list(self._core.joiners())

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """In place over the current members: ``op`` is sum, avg, min, max
        or prod. ``tensor``: a contiguous CPU tensor (float32/64, float16,
        bfloat16, int8, uint8, int32, int64), the same shape and dtype on
        every member. Raises :class:`dpkit.PeerError` /
        :class:`dpkit.TimeoutError` when a member fails or is late past
        ``step_timeout`` (then :meth:`rebuild`),
        :class:`dpkit.MismatchError` when members disagree,
        :class:`dpkit.InvalidArgument` for a non-contiguous tensor."""
        self._core.all_reduce(tensor, op)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """``tensor`` of rank ``src`` to every member, in place (as
        :meth:`all_reduce` for tensors and errors)."""
        self._core.broadcast(tensor, int(src))

    def barrier(self) -> None:
        """Returns once every member has called it (errors as all_reduce)."""
        self._core.barrier()

    def close(self) -> None:
        """Leaves the group: stops the heartbeat and closes the transport
        (the others see this member as failed). Later calls raise
        :class:`dpkit.CommunicatorError`."""
        self._core.close()

    def __enter__(self) -> "ElasticGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def state_checksum(module: torch.nn.Module) -> str:
    """SHA-256 (hex, first 16 digits) of the bytes of ``module``'s
    parameters and buffers in ``state_dict`` order: equal on two members
    exactly when they hold bitwise the same values."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        t = t.detach().cpu().contiguous().reshape(-1)
        if t.numel():
            h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class HealInfo:
    """What a heal did (passed to ``on_heal``): the generation, this
    member's rank and the world size, the rank the state came from, the
    members' ids, the progress healed to (applied steps, epoch, global offset
    in the epoch's batch sequence) and :func:`state_checksum` of the module
    after it (equal on every member)."""
    generation: int
    rank: int
    world_size: int
    source: int
    members: List[int]
    step: int
    epoch: int
    offset: int
    checksum: str
    reason: str = ""  # the failure that made the group re-form ("" for a formation without one)


class ElasticTrainer:
    """Data-parallel training over an :class:`ElasticGroup` that survives
    member failures and admits joiners (C++ ``dpkit::elastic_ddp``, docs/
    elastic.md "Healing, exactly-once data and DDP", for Python modules).

    ``module``, ``optimizer`` (any ``torch.optim`` optimizer over its
    parameters) and ``scheduler`` (optional, any with state_dict) are used as
    they are. ``make_sampler(num_replicas, rank)`` returns this member's
    sampler; it is called again after every heal. Either an elastic
    :class:`dpkit.TokenBudgetBatchSampler` (``elastic=True``: one global
    batch sequence whatever the world size; a step is one of its batches),
    or a :class:`dpkit.DistributedSampler` (torch's order; a step is
    ``batch_size`` of its samples per member, so a step consumes
    ``batch_size x world size`` positions of the epoch's global sequence and
    the offset after a heal is valid on any world size). With the
    DistributedSampler, positions past the dataset's end (torch's padding
    duplicates, or a rank's missing last sample under ``exactly_once``) are
    not trained: a member's batch holds its real samples only, and a member
    left without one trains a duplicate with its loss times 0, so every
    member takes part in every step and each sample counts once. ``extra_state``: a dict of picklable objects healed with the
    rest (e.g. the loss curve); the RNG states of torch and ``random`` are
    healed too.

    :meth:`step` runs one step: ``compute(batch)`` (the sample indices of this
    member's batch) returns the loss; the trainer zeroes the gradients,
    runs backward (a padding duplicate's loss times 0: it takes part in the
    average and adds nothing), averages the gradients over the members
    (buckets of ``bucket_bytes``; a parameter without a gradient counts as
    zeros, as DDP with ``find_unused_parameters``), then steps the optimizer
    and the scheduler. A :class:`dpkit.Error` from a collective (a member
    died, or is late past ``step_timeout``) discards the step: the group is
    re-formed and healed and :meth:`step` returns None. Every
    ``admit_every`` applied steps, processes waiting to join are admitted
    (then healed). Healing: of the members that hold a training state (a
    member of the job's first generation, or one healed since; never a
    joiner), the one with the most applied steps, then the lowest rank,
    serializes it (torch.save: module and optimizer and scheduler
    state, progress, RNG states, ``extra_state``) and broadcasts it; every
    other member loads it, so all hold bitwise the same state
    (:func:`state_checksum`), then re-shards its sampler at the healed
    offset. ``on_heal(HealInfo)`` is called on every member after each heal.

    Raises :class:`NoStateError` (a :class:`dpkit.Error`) "no member holds
    the training state" when a generation is formed only of joiners (every
    holder died), and what
    :meth:`ElasticGroup.rebuild` raises when no generation forms.
    """

    def __init__(self, group: ElasticGroup, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 make_sampler: Callable[[int, int], Any], *, scheduler: Any = None,
                 bucket_bytes: int = 25 << 20, admit_every: int = 1,
                 on_heal: Optional[Callable[[HealInfo], None]] = None,
                 extra_state: Optional[Dict[str, Any]] = None, batch_size: Optional[int] = None):
        self.group, self.module, self.optimizer, self.scheduler = group, module, optimizer, scheduler
        self.make_sampler = make_sampler
        if batch_size is not None and int(batch_size) < 1:
            raise _core.InvalidArgument(f"ElasticTrainer: batch_size must be >= 1, got {batch_size}")
        self.batch_size = None if batch_size is None else int(batch_size)
        self.bucket_bytes = int(bucket_bytes)
        self.admit_every = int(admit_every)
        self.on_heal = on_heal
        self.extra_state: Dict[str, Any] = extra_state if extra_state is not None else {}
        self.step_count = 0  # applied steps
        self.epoch = 0
        self.offset = 0  # global offset in the epoch's batch sequence
        self.sampler: Any = None
        self.last_heal: Optional[HealInfo] = None
        self._k = 0  # steps of the sampler since its start
        self._reason = ""  # why the group is being re-formed (HealInfo.reason)
        self._has_state = group.first_generation == 0
        self._heal_until_done()

    # ---- the loop ----

    def next_batch(self) -> tuple:
        """(batch indices, is padding, global position) of this member's
        next step, starting the next epoch when this one's sequence is done
        (every member at the same step)."""
        while self._k >= len(self.sampler):
            self.epoch += 1
            self.offset = 0
            self._reshard()
        k = self._k
        return self.sampler.batch(k), self.sampler.is_padding(k), self.offset + self.group.rank

    def step(self, compute: Callable[[List[int]], torch.Tensor],
             batch: Optional[tuple] = None) -> Optional[torch.Tensor]:
        """One step (see the class): returns the loss (detached, this
        member's batch's; 0 for a padding duplicate), or None when the step
        was discarded because a member failed (the group was re-formed and
        healed). ``batch``: :meth:`next_batch`'s result if the caller
        already took it (else it is taken here)."""
        indices, pad, _ = batch if batch is not None else self.next_batch()
        from ._core import Error
        self.optimizer.zero_grad()
        loss = compute(indices)
        if pad:
            loss = loss * 0.0
        loss.backward()
        try:
            self.group.enter_step(self.step_count)
            self._average_gradients()
        except Error as e:
            self._reason = f"{type(e).__name__}: {e}"
            self._recover()
            return None
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self._k += 1
        self.step_count += 1
        self.offset = int(self.sampler.state_dict(steps_done=self._k)["offset"])
        if self.admit_every > 0 and self.step_count % self.admit_every == 0:
            try:
                if self.group.admit_joiners():
                    self._heal_until_done()
            except Error as e:
                self._reason = f"{type(e).__name__}: {e}"
                self._recover()
        return loss.detach()

    # ---- internals ----

    def _average_gradients(self) -> None:
        params = [p for p in self.module.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: List[torch.Tensor] = []
        size = 0
        for p in reversed(params):  # DDP's order: the last layers' gradients are ready first
            if bucket and (p.grad.dtype != bucket[0].dtype or size + p.grad.numel() * p.grad.element_size() >
                           self.bucket_bytes):
                self._reduce_bucket(bucket)
                bucket, size = [], 0
            bucket.append(p.grad)
            size += p.grad.numel() * p.grad.element_size()
        if bucket:
            self._reduce_bucket(bucket)

    def _reduce_bucket(self, grads: Sequence[torch.Tensor]) -> None:
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.group.all_reduce(flat, "avg")
        at = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[at:at + n].view_as(g))
            at += n

    def _recover(self) -> None:
        """The current generation failed: re-form (what rebuild raises ends
        training: no generation with this member) and heal, again while a
        member fails during the heal."""
        self.group.rebuild()
        self._heal_until_done()

    def _heal_until_done(self) -> None:
        from ._core import Error
        while True:
            try:
                self._heal()
                return
            except NoStateError:
                raise
            except Error as e:
                self._reason = f"{type(e).__name__} during a heal: {e}"
                self.group.rebuild()

    def _state_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save({"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                    "progress": {"step": self.step_count, "epoch": self.epoch, "offset": self.offset},
                    "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
                    "extra": self.extra_state}, buf)
        return buf.getvalue()

    def _load_state_bytes(self, data: bytes) -> None:
        try:  # the state holds Python objects (RNG state, extra_state): torch >= 2.6 loads weights only by default
            st = torch.load(io.BytesIO(data), weights_only=False)
        except TypeError:  # a torch without the argument
            st = torch.load(io.BytesIO(data))
        self.module.load_state_dict(st["module"])
        self.optimizer.load_state_dict(st["optimizer"])
        if self.scheduler is not None and st["scheduler"] is not None:
            self.scheduler.load_state_dict(st["scheduler"])
        p = st["progress"]
        self.step_count, self.epoch, self.offset = int(p["step"]), int(p["epoch"]), int(p["offset"])
        torch.set_rng_state(st["rng"]["torch"])
        random.setstate(st["rng"]["python"])
        self.extra_state.clear()
        self.extra_state.update(st["extra"])

    def _heal(self) -> None:
        g = self.group
        rank, world = g.rank, g.size
        # the holder with the most applied steps, then the lowest rank: a
        # member expelled past its step deadline that comes back holds an
        # older state than the others and must not be the source
        low = 1 << 20
        holder = torch.tensor([self.step_count * low + (low - 1 - rank) if self._has_state else -1],
                              dtype=torch.int64)
        g.all_reduce(holder, "max")
        best = int(holder.item())
        src = low - 1 - best % low if best >= 0 else world
        if src >= world:
            raise NoStateError(f"elastic trainer: id {g.id}: generation {g.generation} (members {g.members}): no member "
                           f"holds the training state (every member that had it is gone)")
        data = self._state_bytes() if rank == src else b""
        n = torch.tensor([len(data)], dtype=torch.int64)
        g.broadcast(n, src)
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if rank == src else \
            torch.empty(int(n.item()), dtype=torch.uint8)
        g.broadcast(buf, src)
        if rank != src:
            self._load_state_bytes(buf.numpy().tobytes())
        self._has_state = True
        self._k = 0
        self._reshard()
        self.last_heal = HealInfo(g.generation, rank, world, src, g.members, self.step_count, self.epoch,
                                  self.offset, state_checksum(self.module), self._reason)
        self._reason = ""
        if self.on_heal is not None:
            self.on_heal(self.last_heal)

    def _reshard(self) -> None:
        """This member's sampler for the current world size and rank at
        (epoch, offset); an offset past the epoch's plan (it ended on
        padding positions) is the epoch's end."""
        s = self.make_sampler(self.group.size, self.group.rank)
        from .samplers import DistributedSampler, TokenBudgetBatchSampler
        if isinstance(s, DistributedSampler):
            if self.batch_size is None:
                raise _core.InvalidArgument("ElasticTrainer: make_sampler returned a DistributedSampler: "
                                            "batch_size (samples per member per step) is required")
            if (s.num_replicas, s.rank) != (self.group.size, self.group.rank):
                raise _core.InvalidArgument(
                    f"ElasticTrainer: make_sampler({self.group.size}, {self.group.rank}) returned a sampler for "
                    f"rank {s.rank} of {s.num_replicas}")
            s = _SampleSteps(s, self.batch_size)
        elif not isinstance(s, TokenBudgetBatchSampler):
            raise _core.InvalidArgument(f"ElasticTrainer: make_sampler returned a {type(s).__name__}; a "
                                        "dpkit.TokenBudgetBatchSampler (elastic=True) or dpkit.DistributedSampler "
                                        "is needed")
        self.sampler = s
        s.load_state_dict({"epoch": self.epoch, "offset": 0})
        off = min(self.offset, s.total_batches)
        s.load_state_dict({"epoch": self.epoch, "offset": off})
        self._k = 0


class _SampleSteps:
    """ElasticTrainer's steps over a dpkit.DistributedSampler: step k of this
    rank is its samples k*batch_size .. (k+1)*batch_size - 1 from the current
    start, i.e. the global positions start + j*world + rank (torch's
    deal) for those j; positions at or past the dataset's end are padding.
    Offsets are global sample positions (the sampler's state_dict)."""

    def __init__(self, sampler: Any, batch_size: int):
        self.s, self.b = sampler, batch_size
        self.world, self.rank, self.n = sampler.num_replicas, sampler.rank, sampler.dataset_size
        self.start = 0

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.s.load_state_dict(state)
        self.start = int(state["offset"])

    @property
    def total_batches(self) -> int:
        return self.n  # offsets are sample positions: the epoch's end is N

    def _per_rank(self) -> int:
        # every rank the same number of steps: the most samples any rank reads
        rem = max(0, self.n - self.start)
        return rem // self.world if self.s.drop_last else -(-rem // self.world)

    def __len__(self) -> int:
        return -(-self._per_rank() // self.b)

    def _real(self, k: int) -> List[int]:
        rem = self.n - self.start
        hi = min((k + 1) * self.b, self._per_rank(), len(self.s))
        return [j for j in range(k * self.b, hi) if j * self.world + self.rank < rem]

    def batch(self, k: int) -> List[int]:
        real = self._real(k)
        if real:
            return [self.s[j] for j in real]
        return [self.s[0] if len(self.s) else 0]  # a duplicate, trained with its loss times 0

    def is_padding(self, k: int) -> bool:
        return not self._real(k)

    def state_dict(self, steps_done: int) -> Dict[str, Any]:
        return {"epoch": self.s.epoch,
                "offset": min(self.start + steps_done * self.b * self.world, self.n)}


class NoStateError(_core.Error):
    """Raised by :class:`ElasticTrainer` when a generation is formed only of
    processes that hold no training state (every member that had it is
    gone): it cannot be healed, and training from scratch would be a silent
    restart."""
