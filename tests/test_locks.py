"""The nightly lock of a study, on SQLite (a file lock) and PostgreSQL (an advisory lock)."""

from __future__ import annotations

import pytest

from pareto.errors import LockHeld
from pareto.locks import study_lock
from pareto.store.engine import open_engine, upgrade


def test_second_lock_of_a_study_is_refused_at_once(db_url: str) -> None:
    engine = open_engine(db_url)
    upgrade(engine)
    with study_lock(engine, "s"):
        with pytest.raises(LockHeld, match="Another nightly of study 's' is running"), study_lock(engine, "s"):
            pass
        with study_lock(engine, "other"):  # per study
            pass
    with study_lock(engine, "s"):  # released
        pass
