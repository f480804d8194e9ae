"""A Hypothesis property split between the quick tier and the full suite.

``make test-quick`` deselects ``slow``. A property that draws hundreds of examples costs
seconds, mostly in Hypothesis's own generation. :func:`tiered` runs it as one test with
two parameters: ``[quick]``, :data:`QUICK_EXAMPLES` examples, and ``[slow]`` (marked
``slow``), the rest; the full suite runs as many examples as one run of the total would.
The quick run is seeded apart (:data:`QUICK_SEED`), so it draws other examples than the
slow run's first ones; both are deterministic (the suite's profile derandomizes, and a
seed is fixed).

Example::

    @tiered(300, cases())
    def test_form_groups_conserves_items(case): ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, seed, settings

QUICK_EXAMPLES = 50
QUICK_SEED = 20260101


def tiered(
    examples: int, *strategies: Any, **named: Any
) -> Callable[[Callable[..., None]], Callable[[str], None]]:
    """Decorator: the property drawn from ``strategies``/``named`` as a test of two tiers.

    Args:
        examples: Examples of both tiers together (the property's strength in the full
            suite); more than :data:`QUICK_EXAMPLES`.
    """
    if examples <= QUICK_EXAMPLES:
        raise ValueError(f"examples must be > {QUICK_EXAMPLES} to split, got {examples}")

    def split(prop: Callable[..., None]) -> Callable[[str], None]:
        def run(count: int) -> Callable[[], None]:
            return settings(max_examples=count, deadline=None)(given(*strategies, **named)(prop))

        runs = {
            "quick": seed(QUICK_SEED)(run(QUICK_EXAMPLES)),
            "slow": run(examples - QUICK_EXAMPLES),
        }

        @pytest.mark.parametrize("tier", ["quick", pytest.param("slow", marks=pytest.mark.slow)])
        def test(tier: str) -> None:
            runs[tier]()

        # Not functools.wraps: pytest would read the property's arguments as fixtures.
        test.__name__, test.__qualname__ = prop.__name__, prop.__qualname__
        test.__doc__, test.__module__ = prop.__doc__, prop.__module__
        return test

    return split
