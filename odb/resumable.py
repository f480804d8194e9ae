"""What a resumable loader is, for ODB's loader and every loader built on :mod:`odb.kit`.

A loader's epoch resumes exactly once, at any world size, from pieces its ranks save:

- ``state_dict()`` returns *this rank's* piece at once, with no collective: any rank may
  save at any step, and a save made on rank 0 alone cannot hang;
- ``load_state_dict(pieces)`` takes *every* rank's pieces (a list, in any order; a single
  dict when it was saved at world size 1), because what a rank still owes after a resume
  depends on what every rank consumed, and at a new world size the owed samples are dealt
  anew.

That asymmetry is on purpose, and it is why such a loader is not torchdata's
``Stateful`` (whose ``load_state_dict`` takes what the same rank's ``state_dict``
returned). :class:`GatheredState` makes it one: its ``state_dict`` gathers every rank's
piece (a collective, as a ``torch.distributed.checkpoint`` save is), so each rank's saved
state holds them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch.distributed as dist

Piece = dict[str, Any]


@runtime_checkable
class ResumableLoader(Protocol):
    """A loader whose epoch resumes exactly once from its ranks' pieces (module doc)."""

    def state_dict(self) -> Piece: ...

    def load_state_dict(self, state_dict: Sequence[Piece] | Piece) -> None: ...


class GatheredState:
    """A torchdata ``Stateful`` over a :class:`ResumableLoader`.

    ``state_dict()`` is a collective over ``group`` (every rank calls it together) and
    returns ``{"pieces": [every rank's piece]}``, the same on every rank;
    ``load_state_dict`` hands those pieces to the loader (at any world size).

    Example:
        >>> app_state = {"loader": GatheredState(loader)}  # doctest: +SKIP
        >>> torch.distributed.checkpoint.save(app_state, checkpoint_id=path)  # doctest: +SKIP
    """

    def __init__(self, loader: ResumableLoader, group: Any = None) -> None:
        if not isinstance(loader, ResumableLoader):
            raise TypeError(
                f"GatheredState needs a loader with state_dict() and load_state_dict(), "
                f"got {type(loader).__name__}"
            )
        self.loader = loader
        self.group = group

    def state_dict(self) -> dict[str, list[Piece]]:
        piece = self.loader.state_dict()
        if not (dist.is_available() and dist.is_initialized()):
            return {"pieces": [piece]}
        pieces: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(pieces, piece, group=self.group)
        return {"pieces": pieces}

    def load_state_dict(self, state_dict: dict[str, list[Piece]]) -> None:
        if not isinstance(state_dict, dict) or "pieces" not in state_dict:
            raise ValueError(
                "GatheredState.load_state_dict takes what GatheredState.state_dict returned "
                f"(a dict with 'pieces'), got {type(state_dict).__name__}"
            )
        self.loader.load_state_dict(list(state_dict["pieces"]))
