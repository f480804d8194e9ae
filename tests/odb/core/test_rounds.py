"""``RankRounds.partway``: a rank's round state between rounds, built from its counters
(the exhaustive check starts from such states: ``bench/model_check_world.py``; the
protocol itself: ``test_rounds_machine.py``)."""

from __future__ import annotations

from odb.core.config import ODBConfig
from odb.core.rounds import RankRounds

CONFIG = ODBConfig(token_budget=64, buffer_size=3, shuffle=False)


def test_a_state_built_partway_reports_its_counters_and_reads_on() -> None:
    state = RankRounds.partway(CONFIG, 9, read_count=4, read_tokens=100, read_limit=None, rounds=2)
    assert len(state.buffer) == 0
    status = state.status(free_slots=4)
    assert (status.read_count, status.read_tokens, status.unread) == (4, 100, 5)
    assert not status.read_done
    state = RankRounds.partway(CONFIG, 9, read_count=4, read_tokens=100, read_limit=None, rounds=2)
    assert state.wants_read()
    state.add(8, 0, "sample")
    assert (state.read_count, state.read_tokens) == (5, 108)


def test_a_state_built_partway_keeps_its_read_limit_and_its_round() -> None:
    held = RankRounds.partway(CONFIG, 9, read_count=4, read_tokens=100, read_limit=4, rounds=2)
    assert not held.wants_read()
    done = RankRounds.partway(CONFIG, 9, read_count=9, read_tokens=200, read_limit=None, rounds=5)
    assert done.read_done and not done.wants_read()
    ramped = ODBConfig(token_budget=8, buffer_budgets=64, initial_buffer_budgets=2)
    first = RankRounds(ramped, 9)
    later = RankRounds.partway(ramped, 9, read_count=0, read_tokens=0, read_limit=None, rounds=3)
    assert (first.buffer_tokens, later.buffer_tokens) == (2 * 8, 16 * 8)  # doubles a round
