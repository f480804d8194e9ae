"""Token-level loss accounting: loss-token counts and the accumulation-window normalizer.

The exact-gradient rule (``docs/protocol.md``): with ``W`` ranks averaging gradients,
rank ``r`` minimising ``sum(token losses of r) / (T_window / W)`` makes the averaged
gradient equal to the gradient of ``sum(all token losses) / T_window``, the global
per-token mean over the gradient-accumulation window (not the grouping buffer of
:mod:`odb.core.buffer`). ``T_window`` is known only once every step of the window is aligned,
so :class:`AccumulationNormalizer` holds steps back until their window is complete.
Pure apart from reading a label tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def count_loss_tokens(
    batch: Mapping[str, Any], label_key: str, ignore_index: int, shift: bool
) -> int:
    """Labels that carry loss in a collated batch.

    Args:
        batch: The collated batch (a mapping holding a label tensor).
        label_key: Key of the labels.
        ignore_index: Label value that carries no loss.
        shift: Count ``labels[..., 1:]``, as causal LMs shift labels by one.

    Raises:
        ValueError: The batch has no labels under ``label_key``.
    """
    if label_key not in batch:
        raise ValueError(
            f"collated batch has no {label_key!r}; ODB counts loss tokens from "
            f"the labels (keys present: {sorted(batch)}). Set label_key to the "
            "field that holds them"
        )
    labels = batch[label_key]
    if shift:
        labels = labels[..., 1:]
    return int((labels != ignore_index).sum())


@dataclass
class AccumulationNormalizer:
    """Releases steps once the global loss tokens of their window are known.

    Steps are pushed in order with their global loss tokens. A step of window
    ``k = step // window`` is released when all ``window`` steps of ``k`` were pushed,
    or when :meth:`flush` ends the epoch (a shorter last window). Every step of a window
    gets the same total. The same pushes give the same releases on every rank.
    """

    window: int
    world_size: int
    _held: list[tuple[Any, int]] = field(default_factory=list)

    def push(self, item: Any, global_loss_tokens: int) -> list[tuple[Any, int, float]]:
        """Add one step; return the ``(item, window_tokens, normalizer)`` now complete."""
        self._held.append((item, global_loss_tokens))
        if len(self._held) < self.window:
            return []
        return self.flush()

    def flush(self) -> list[tuple[Any, int, float]]:
        """Release every held step as one (possibly short) window."""
        total = sum(tokens for _, tokens in self._held)
        normalizer = max(total, 1) / self.world_size
        released = [(item, total, normalizer) for item, _ in self._held]
        self._held.clear()
        return released

    @property
    def held(self) -> int:
        return len(self._held)
