"""dpkit from Python: the data path and a torch.distributed backend.

- :class:`JsonlDataset`: a JSONL file (or shards) of any size as a map-style
  dataset over dpkit's memory-mapped line index; memory stays flat however
  many DataLoader workers read it.
- :class:`DistributedSampler`: torch.utils.data.DistributedSampler's indices,
  bit for bit, plus an O(1)-memory Feistel mode and exactly-once evaluation;
  :class:`TokenBudgetBatchSampler`: the token-budget dynamic batching of
  FunASR's CustomDistributedBufferDynamicBatchSampler, done deterministically.
  Both resume with ``state_dict()`` / ``load_state_dict()``.
- ``torch.distributed.init_process_group("dpkit", ...)``: dpkit's collectives
  (shared memory within a node) as a torch.distributed backend, registered
  when this package is imported (see :mod:`dpkit.distributed`).

Errors raised by dpkit are the classes below (the C++ message included):
``dpkit.Error`` (a RuntimeError) and its kinds ``FormatError``,
``StaleIndexError``, ``TimeoutError`` (not the builtin one: a RuntimeError),
``MismatchError``, ``CommunicatorError``, ``PeerError``, ``BuildCancelled``;
bad arguments raise ``dpkit.InvalidArgument`` (a ValueError).
Guide: docs/python.md.
"""
from ._core import (BuildCancelled, CommunicatorError, Error, FormatError, InvalidArgument, MismatchError,
                    PeerError, StaleIndexError, TimeoutError)
from .data import JsonlDataset
from .samplers import DistributedSampler, TokenBudgetBatchSampler
from . import distributed

__all__ = [
    "JsonlDataset", "DistributedSampler", "TokenBudgetBatchSampler", "distributed",
    "Error", "FormatError", "StaleIndexError", "TimeoutError", "MismatchError", "CommunicatorError",
    "PeerError", "BuildCancelled", "InvalidArgument",
]
__version__ = "0.1.0"

distributed._register_backend()
