"""``core.spells``: one line when a failing spell starts, one when it ends, per key, with its length and
the failures it counted."""

from __future__ import annotations

import threading

from flask_gateway.core.spells import Spell, Spells


def test_a_spell_starts_once_counts_its_failures_and_ends_once() -> None:
    now = [10.0]
    spells: Spells[str] = Spells(lambda: now[0])
    assert spells.succeeded("db") is None  # nothing was failing: nothing to say
    assert spells.failed("db") is True  # the first failure starts the spell
    now[0] = 12.0
    assert spells.failed("db", count=3) is False  # later ones only count
    assert spells.failing("db") and spells.failures("db") == 4
    assert not spells.failing("redis") and spells.failures("redis") == 0  # keys are apart
    now[0] = 15.5
    assert spells.succeeded("db") == Spell(seconds=5.5, failures=4)
    assert spells.succeeded("db") is None  # ended once
    assert not spells.failing("db") and spells.failures("db") == 0
    assert spells.failed("db") is True  # a new spell


def test_a_failure_that_counts_nothing_still_starts_the_spell() -> None:
    spells: Spells[None] = Spells(lambda: 0.0)
    assert spells.failed(None, count=0) is True
    assert spells.failing(None) and spells.failures(None) == 0


def test_threads_racing_start_one_spell_and_end_it_once() -> None:
    spells: Spells[None] = Spells()
    starts: list[bool] = []
    barrier = threading.Barrier(8)

    def fail() -> None:
        barrier.wait()
        starts.append(spells.failed(None))

    threads = [threading.Thread(target=fail) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert starts.count(True) == 1 and spells.failures(None) == 8
    ended = spells.succeeded(None)
    assert ended is not None and ended.failures == 8
