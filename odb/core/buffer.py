"""A rank's grouping buffer: samples read but not yet emitted, with their ages.

Pure bookkeeping between reads and the alignment plan: it says when to stop reading
(the buffer is sized by work, a number of tokens the caller sets each round, and capped
by ``capacity`` samples and by ``buffer_bytes`` bytes of sample data), groups its
contents (:func:`odb.core.grouping.form_groups`), splits the groups into those
ready now and those worth waiting for, hands out the chosen groups' payloads and ages
everything left. Samples not chosen stay and are regrouped next round
(recirculation), so nothing is ever dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from odb.core.budget import TokenBudget
from odb.core.grouping import Group, SizedSample, emission_order, form_groups

_SCALARS = (int, float, bool, str, type(None))


def sample_nbytes(value: Any) -> int:
    """Bytes of the tensors and arrays in a sample (dicts, lists, tuples searched).

    What bounds the buffer's memory (``ODBConfig.buffer_bytes``): each object with an
    integer ``nbytes`` (a ``torch.Tensor``, a ``numpy.ndarray``) counts its data, and
    ``bytes`` their length. No data is touched or copied. A list or tuple that starts
    with a scalar is taken as a list of scalars (token ids) and not walked: a few bytes
    per token are noise next to the images this bound is for, and walking each would
    cost more than the sample's grouping.

    Example:
        >>> import numpy as np
        >>> sample_nbytes({"input_ids": [1, 2, 3], "pixels": [np.zeros((2, 4), np.float32)]})
        32
    """
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int) and not isinstance(value, _SCALARS):
        return nbytes
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, Mapping):
        return sum(sample_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], _SCALARS):
        return sum(sample_nbytes(v) for v in value)
    return 0


@dataclass
class _Entry:
    length: int
    patches: int
    age: int
    payload: Any
    nbytes: int = 0


class SampleBuffer:
    """Buffered samples of one rank, keyed by a unique sequence number.

    The caps are checked before a read, so the buffer may pass them by one sample: it
    holds at most ``capacity`` samples, and its bytes plus those of the batches the
    trainer still holds stay under ``buffer_bytes`` plus one sample's bytes (or the
    buffer holds one sample). An empty buffer always has room, so reading always
    progresses.

    Args:
        budget: Group budget.
        capacity: Most samples held at once.
        age_limit: Rounds after which a sample's group is ready regardless of fill.
        buffer_bytes: Bytes of sample data after which the buffer stops reading.
        held_bytes: Bytes of the emitted batches the trainer has not released yet;
            None: nothing is held outside the buffer (a simulation).

    Attributes:
        peak_nbytes: The most bytes the buffer and the held batches took at once.

    Example:
        >>> buf = SampleBuffer(TokenBudget(8), capacity=4, age_limit=2, buffer_bytes=100)
        >>> buf.add(3, 0, "a", nbytes=60)
        >>> buf.wants_more(buffer_tokens=16), buf.has_room()
        (True, True)
        >>> buf.add(3, 0, "b", nbytes=60)
        >>> buf.wants_more(buffer_tokens=16), buf.nbytes, buf.peak_nbytes
        (False, 120, 120)
    """

    def __init__(
        self,
        budget: TokenBudget,
        capacity: int,
        age_limit: int,
        buffer_bytes: int,
        held_bytes: Callable[[], int] | None = None,
    ) -> None:
        self.budget = budget
        self.capacity = capacity
        self.age_limit = age_limit
        self.buffer_bytes = buffer_bytes
        self.held_bytes = held_bytes if held_bytes is not None else _none_held
        self.peak_nbytes = 0
        self._entries: dict[int, _Entry] = {}
        self._tokens = 0
        self._nbytes = 0
        self._next_key = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    @property
    def nbytes(self) -> int:
        """Bytes of the buffered samples' data, as measured when they were read."""
        return self._nbytes

    @property
    def max_age(self) -> int:
        return max((e.age for e in self._entries.values()), default=0)

    def has_room(self) -> bool:
        """True while the buffer is under both caps (samples and bytes).

        The byte cap counts the batches emitted that the trainer has not released yet
        (``held_bytes``): what the buffer gave away is still in memory until then. An
        empty buffer always has room, so reading always progresses.
        """
        if len(self._entries) >= self.capacity:
            return False
        return not self._entries or self._nbytes + self.held_bytes() < self.buffer_bytes

    def wants_more(self, buffer_tokens: int) -> bool:
        """True while the buffer holds fewer than ``buffer_tokens`` and has room."""
        return self._tokens < buffer_tokens and self.has_room()

    def add(self, length: int, patches: int, payload: Any, age: int = 0, nbytes: int = 0) -> None:
        """Buffer one sample (``length >= 1``) whose data takes ``nbytes`` bytes."""
        self._entries[self._next_key] = _Entry(length, patches, age, payload, nbytes)
        self._next_key += 1
        self._tokens += length
        self._nbytes += nbytes
        self.peak_nbytes = max(self.peak_nbytes, self._nbytes + self.held_bytes())

    def plan(self, can_read_more: bool) -> tuple[list[Group], list[Group]]:
        """Group the buffer; return ``(ready, waiting)``, ready in emission order.

        A group is ready when it is complete (the next sample did not fit), holds a
        sample at the age limit, or when no more samples can arrive before the next
        round (then waiting would gain nothing). Every nonempty buffer that cannot
        read more therefore has at least one ready group.
        """
        items = [SizedSample(key, e.length, e.patches, e.age) for key, e in self._entries.items()]
        ordered = emission_order(form_groups(items, self.budget), self.budget, self.age_limit)
        ready: list[Group] = []
        waiting: list[Group] = []
        for group in ordered:
            overdue = any(item.age >= self.age_limit for item in group.items)
            (ready if group.complete or overdue or not can_read_more else waiting).append(group)
        return ready, waiting

    def take(self, groups: Sequence[Group]) -> list[list[Any]]:
        """Remove the given groups' samples, age the rest, return payloads per group."""
        payloads = []
        for group in groups:
            entries = [self._entries.pop(item.key) for item in group.items]
            self._tokens -= sum(e.length for e in entries)
            self._nbytes -= sum(e.nbytes for e in entries)
            payloads.append([e.payload for e in entries])
        for entry in self._entries.values():
            entry.age += 1
        return payloads

    def drain(self) -> list[tuple[int, int, int, Any]]:
        """Remove everything; ``(length, patches, age, payload)`` per sample (carry)."""
        out = [(e.length, e.patches, e.age, e.payload) for e in self._entries.values()]
        self._entries.clear()
        self._tokens = 0
        self._nbytes = 0
        return out


def _none_held() -> int:
    return 0
