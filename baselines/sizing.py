"""The two ways a method sizes its steps: a fixed batch size, or a token budget per group.

Each refuses the settings that have no meaning for it, at construction.
"""

from __future__ import annotations

from typing import Any

from baselines.loader import PlannedLoader

__all__ = ["FixedBatchLoader", "TokenBudgetedLoader"]


class FixedBatchLoader(PlannedLoader):
    """A method whose batches have a fixed size (``config.fixed_batch_size()``)."""

    def _setup(self) -> None:
        self.batch_size = self.config.fixed_batch_size()

    def _plan_params(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "shuffle": self.config.shuffle}


class TokenBudgetedLoader(PlannedLoader):
    """A method whose groups are sized by ``token_budget``: ``batch_size`` and
    ``cutoff_len`` are refused."""

    def _setup(self) -> None:
        for name in ("batch_size", "cutoff_len"):
            if getattr(self.config, name) is not None:
                raise ValueError(
                    f"{name}={getattr(self.config, name)} has no meaning for the "
                    f"{self.method!r} method, whose groups are sized by token_budget; "
                    f"leave {name}=None"
                )

    def _plan_params(self) -> dict[str, Any]:
        return {"shuffle": self.config.shuffle}
