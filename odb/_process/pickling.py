"""Pickling of samples and batch tensors on their way between processes.

A DataLoader worker pickles each item itself (:class:`WorkerPickle`). For a collate
*process*, tensor storages up to ``_INLINE_MAX_BYTES`` travel as bytes inside the
pickle instead of one shared-memory segment and one descriptor handshake each.
:func:`reduce_plain_tensor`, :func:`rebuild_tensor` and :func:`storage_bytes` are shared
with the hand-off of batches to the trainer (:mod:`odb._process.handoff`).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

# A storage up to this size travels from a worker inside the pickled item; a larger one
# through torch's shared memory. Below it bytes are faster than a segment and a
# descriptor handshake each; well above it shared memory is (docs/benchmarks.md,
# "Hand-off design figures").
_INLINE_MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class WorkerPickle:
    """The DataLoader's collate: pass one item through, pickled already in a worker.

    The collate side groups items itself and receives each item as it was. In a worker
    the item is pickled at once, so one that cannot be pickled raises there (the
    DataLoader re-raises it) instead of being dropped by the worker's queue thread,
    which left the loader waiting forever.

    With ``inline`` (collate process only) small storages travel as bytes in the pickle.
    A worker killed while it writes a message longer than a pipe write can leave half a
    message in the DataLoader's result pipe; the DataLoader in a collate process reads it
    in the main thread, where PyTorch's SIGCHLD handler interrupts the read and names the
    dead worker. A collate thread has no such handler and would wait forever, so in
    thread mode tensors keep travelling as shared-memory handles (short messages).
    """

    inline: bool

    def __call__(self, item: Any) -> Any:
        if get_worker_info() is None:
            return item
        pickler = _InlinePickler if self.inline else ForkingPickler
        return _Pickled(bytes(pickler.dumps(item, pickle.HIGHEST_PROTOCOL)))


class _Pickled:
    """An item pickled in a worker; unpickles to the item itself."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self) -> tuple[Callable[[bytes], Any], tuple[bytes]]:
        return pickle.loads, (self.blob,)


class _InlinePickler(ForkingPickler):
    """ForkingPickler that writes small storages of plain CPU tensors as bytes."""

    def __init__(self, file: Any, protocol: int | None = None) -> None:
        super().__init__(file, protocol)
        self._storages: dict[tuple[int, int], torch.UntypedStorage] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return reduce_plain_tensor(obj, self._storages) or NotImplemented
        if (
            type(obj) is torch.UntypedStorage
            and obj.device.type == "cpu"
            and obj.nbytes() <= _INLINE_MAX_BYTES
        ):
            return _storage_from_array, (storage_bytes(obj).numpy(),)
        return NotImplemented


def reduce_plain_tensor(
    tensor: torch.Tensor, storages: dict[tuple[int, int], torch.UntypedStorage]
) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]] | None:
    """``(rebuild_tensor, args)`` for a plain CPU tensor; None for any other tensor.

    Plain: exactly ``torch.Tensor``, strided, on the CPU, without autograd, conjugate or
    negative bits or quantisation. The args hold the tensor's storage object, one
    per distinct storage in ``storages`` (the pickler's memo), so views of one storage
    are rebuilt as views of one storage, with their offsets and strides.
    """
    if not (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.requires_grad
        and not tensor.is_quantized
        and not tensor.is_conj()
        and not tensor.is_neg()
    ):
        return None
    storage = tensor.untyped_storage()
    size = storage.nbytes()
    key = (storage.data_ptr(), size) if size else (id(storage), -1)
    storage = storages.setdefault(key, storage)
    layout = (tensor.storage_offset(), tuple(tensor.size()), tuple(tensor.stride()))
    return rebuild_tensor, (storage, tensor.dtype, *layout)


def rebuild_tensor(
    storage: torch.UntypedStorage,
    dtype: torch.dtype,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
) -> torch.Tensor:
    """The tensor :func:`reduce_plain_tensor` described, over ``storage``."""
    return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A ``uint8`` tensor over all bytes of ``storage`` (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _storage_from_array(array: np.ndarray) -> torch.UntypedStorage:
    return torch.from_numpy(array).untyped_storage()
