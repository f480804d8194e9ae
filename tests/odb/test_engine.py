"""Pure parts of the epoch engine."""

from __future__ import annotations

from odb.engine import deal_carry


def test_deal_carry_balances_and_conserves() -> None:
    per_rank = [[1, 2, 3, 4, 5, 6, 7], [], [8]]
    shares = [deal_carry(per_rank, rank) for rank in range(3)]
    assert sorted(i for share in shares for i in share) == list(range(1, 9))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_deal_carry_single_rank_keeps_its_carry_in_order() -> None:
    assert deal_carry([[5, 3, 9]], 0) == [5, 3, 9]
