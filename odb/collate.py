"""A default collate function for token-budgeted groups of model-ready samples.

Right-pads the sequence fields to the group's longest sample; other tensor fields are
concatenated along the first dimension (how Qwen-VL's ``pixel_values`` and
``image_grid_thw`` batch) and non-tensor fields become lists. Picklable, so it runs in
the collate process.

:func:`batch_cat` and :func:`batch_empty` are for collate functions (this one, or a
user's): where the batch will cross to another process (an ODB collate process, or a
DataLoader worker, as ``torch.utils.data.default_collate`` does), a big field is built
in shared memory at once (in an ODB collate process, in a reused block of the hand-off
pool), so it crosses without another copy (``odb._process.handoff``).

:func:`batch_parts` skips even that copy: the field stays a :class:`TensorParts` of the
samples' own tensors (from a DataLoader worker they are in shared memory already and
cross by descriptor) and is concatenated where it lands, by ``.to(device)``: on an
accelerator that is a device-side copy, off the loader's CPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from odb._process import torch_shm
from odb._process.batch_pool import batches_cross_processes, own_pool

# A field of at least this many bytes is built in shared memory where the batch crosses
# processes; smaller ones travel as bytes (the worker hand-off's threshold,
# odb._process.pickling._INLINE_MAX_BYTES).
SHARED_MIN_BYTES = 256 * 1024


def batch_empty(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)``, in shared memory when it will cross processes.

    Shared when ``batches_cross_processes()`` and it takes at least
    ``SHARED_MIN_BYTES``: in an ODB collate process a reused block of its hand-off
    pool (passed to the trainer without a copy, its pages already touched), in a
    DataLoader worker new shared memory (as ``default_collate`` does). Contiguous, on the
    CPU, contents undefined.
    """
    shape = tuple(int(n) for n in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < SHARED_MIN_BYTES or not batches_cross_processes():
        return torch.empty(shape, dtype=dtype)
    pool = own_pool()
    if pool is not None:
        return pool.empty(nbytes)[:nbytes].view(dtype).view(shape)
    storage = torch_shm.new_shared_storage(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def batch_cat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(tensors)`` along the first dimension, built with :func:`batch_empty`.

    Equal to ``torch.cat`` in values, dtype and shape; tensors of mixed dtypes, trailing
    shapes or devices are concatenated by ``torch.cat`` itself.
    """
    if not tensors:
        raise ValueError("batch_cat got no tensors")
    first = tensors[0]
    mixed = any(
        t.dtype != first.dtype or t.shape[1:] != first.shape[1:] or t.device.type != "cpu"
        for t in tensors
    )
    if mixed or first.dim() == 0:
        return torch.cat(list(tensors))
    shape = (sum(t.shape[0] for t in tensors), *first.shape[1:])
    return torch.cat(list(tensors), out=batch_empty(shape, first.dtype))


class TensorParts:
    """A batch field kept as its samples' tensors; one tensor once it is moved.

    Stands for ``torch.cat(parts)`` (first dimension) without building it: ``shape``,
    ``dtype`` and ``device`` are the concatenation's, :meth:`to` moves every part (the
    same arguments as ``torch.Tensor.to``) and concatenates them there, returning a
    ``torch.Tensor``, and :meth:`cat` concatenates where the parts are. Loops that move a
    batch with ``value.to(device)`` (the project's, ``odb.integrations``, the HF
    Trainer through ``odb.integrations.hf_trainer``) get the tensor. Pickles as its
    parts, so parts in shared memory cross processes by descriptor, without a copy.

    Invariants: at least one part; every part has at least one dimension and the same
    dtype, device and trailing shape.
    """

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[torch.Tensor]) -> None:
        parts = tuple(parts)
        if not parts:
            raise ValueError("TensorParts needs at least one tensor, got none")
        first = parts[0]
        for i, part in enumerate(parts):
            if not isinstance(part, torch.Tensor) or part.dim() == 0:
                what = "a 0-d tensor" if isinstance(part, torch.Tensor) else type(part).__name__
                raise ValueError(
                    f"TensorParts part {i} must be a tensor with at least one dimension, got {what}"
                )
            if (part.dtype, part.device, part.shape[1:]) != (
                first.dtype,
                first.device,
                first.shape[1:],
            ):
                raise ValueError(
                    f"TensorParts part {i} ({part.dtype}, {part.device}, trailing shape "
                    f"{tuple(part.shape[1:])}) differs from part 0 ({first.dtype}, "
                    f"{first.device}, {tuple(first.shape[1:])}); concatenate such "
                    "tensors with torch.cat"
                )
        self.parts: tuple[torch.Tensor, ...] = parts

    @property
    def shape(self) -> torch.Size:
        rows = sum(part.shape[0] for part in self.parts)
        return torch.Size((rows, *self.parts[0].shape[1:]))

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return sum(part.numel() for part in self.parts)

    @property
    def nbytes(self) -> int:
        """Bytes of the parts' data (what ``torch.cat(parts).nbytes`` would be)."""
        return sum(part.nbytes for part in self.parts)

    def cat(self) -> torch.Tensor:
        """``torch.cat(self.parts)`` (the one part itself when there is one)."""
        return self.parts[0] if len(self.parts) == 1 else torch.cat(self.parts)

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The concatenation, moved as ``torch.Tensor.to(*args, **kwargs)`` moves it.

        Each part moves first and the concatenation happens where they arrive.
        """
        return TensorParts([part.to(*args, **kwargs) for part in self.parts]).cat()

    def pin_memory(self) -> TensorParts:
        """The parts in pinned memory (what a DataLoader's ``pin_memory`` calls)."""
        return TensorParts([part.pin_memory() for part in self.parts])

    def __getattr__(self, name: str) -> Any:
        # Only for names a TensorParts lacks: say what to do instead of a bare miss
        # deep inside a model's forward.
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"TensorParts has no attribute {name!r}: it stands for torch.cat of its "
            "parts until it is moved; call .to(device) (or .cat()) to get the tensor, as "
            "a training loop does when it moves the batch"
        )

    def __reduce__(self) -> tuple[type[TensorParts], tuple[tuple[torch.Tensor, ...]]]:
        return TensorParts, (self.parts,)

    def __repr__(self) -> str:
        return (
            f"TensorParts({len(self.parts)} parts, shape={tuple(self.shape)}, "
            f"dtype={self.dtype}, device={self.device})"
        )


def batch_parts(tensors: Sequence[torch.Tensor]) -> TensorParts:
    """A field that stands for ``torch.cat(tensors)`` until it is moved (see
    :class:`TensorParts`); 0-d tensors count as one row each.

    Use it in a collate function for big per-sample fields (an image's
    ``pixel_values``): the collate side then never copies them, and ``.to(device)``
    concatenates them where the batch lands.
    """
    return TensorParts([t if t.dim() else t.reshape(1) for t in tensors])


@dataclass(frozen=True)
class PadCollate:
    """Pad ``input_ids``/``labels``/``attention_mask`` (1-D per sample) into a batch.

    Attributes:
        pad_token_id: Fill value of ``input_ids``.
        ignore_index: Fill value of ``labels``.
        sequence_keys: Fields padded to the longest sample (others are concatenated).

    Example:
        >>> a = {"input_ids": torch.tensor([1, 2]), "labels": torch.tensor([1, 2])}
        >>> b = {"input_ids": torch.tensor([3]), "labels": torch.tensor([3])}
        >>> batch = PadCollate()([a, b])
        >>> batch["input_ids"].tolist(), batch["attention_mask"].tolist()
        ([[1, 2], [3, 0]], [[1, 1], [1, 0]])
    """

    pad_token_id: int = 0
    ignore_index: int = -100
    sequence_keys: tuple[str, ...] = ("input_ids", "labels", "attention_mask", "position_ids")

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not samples:
            raise ValueError("PadCollate got an empty group")
        keys = list(samples[0])
        batch: dict[str, Any] = {}
        for key in keys:
            values = [s[key] for s in samples]
            if key in self.sequence_keys:
                batch[key] = self._pad(key, [torch.as_tensor(v) for v in values])
            elif all(isinstance(v, torch.Tensor) for v in values):
                batch[key] = batch_cat([v if v.dim() else v.reshape(1) for v in values])
            else:
                batch[key] = values
        if "attention_mask" not in batch and "input_ids" in batch:
            lengths = [len(s["input_ids"]) for s in samples]
            width = batch["input_ids"].shape[1]
            batch["attention_mask"] = torch.tensor(
                [[1] * n + [0] * (width - n) for n in lengths], dtype=torch.long
            )
        return batch

    def _pad(self, key: str, values: list[torch.Tensor]) -> torch.Tensor:
        fill = {"input_ids": self.pad_token_id, "labels": self.ignore_index}.get(key, 0)
        width = max(v.shape[-1] for v in values)
        out = torch.full((len(values), width), fill, dtype=values[0].dtype)
        for row, value in enumerate(values):
            out[row, : value.shape[-1]] = value
        return out
