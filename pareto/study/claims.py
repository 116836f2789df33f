"""One measurement per configuration and environment: the claim, the twin, and the verdict written whole.

Workers of one study (``--workers``, or several hosts on PostgreSQL) may be proposed the same
configuration at once. A trial claims its configuration by inserting its row RUNNING; a partial unique
index (``uq_pareto_trials_running``: study, environment, configuration, where RUNNING) lets one insert
win. The loser stores nothing and waits: when the winner's verdict is stored (measured, rejected early,
or broken here) the loser is a DUPLICATE of it; when the winner ends without one (interrupted, its worker
dead, the machine busy) the loser claims through the same index again. The verdict and its measurement
are written in one transaction (``pareto.store.trials.complete_trial``), so a twin never sees the one
without the other.

The loser checks for a verdict after its insert, in the same transaction: on PostgreSQL an insert beside
an uncommitted claim waits for that transaction, and on SQLite the insert takes the write lock, so the
check that follows sees every verdict committed before the claim. Neither commit order nor id order
matters (ids follow PostgreSQL's sequence, not the order of commits).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from pareto.errors import MachineBusy
from pareto.store import storage
from pareto.store.records import NewTrial, Verdict

#: How long a trial waits for another worker measuring the same configuration before it gives up (BUSY).
TWIN_WAIT_S = 1800.0
TWIN_POLL_S = 1.0

#: An earlier trial of the same configuration here: its number, its metrics ({} when rejected early or
#: broken), the P99 lower bound that rejected it, or the reason it broke.
Twin = Verdict


@dataclass
class Claims:
    """The claims of one study's trials in one environment; ``slo_ms``: the run's P99 SLO, which decides
    whether an early rejection stands for this run."""

    engine: Engine
    study_id: int
    env_id: int
    slo_ms: float | None

    def claim(
        self, row: Callable[..., NewTrial], key: str, *, replacing: int | None = None, waiting: Callable[[], None]
    ) -> tuple[int, Twin | None]:
        """The trial's row id and None when it claimed ``key`` (measure it), or the id of its DUPLICATE row
        and the twin that answers it. ``row(**fields)`` makes the trial's row; ``replacing``: the trial's
        earlier row, deleted in the first attempt (its configuration turned out to be ``key``);
        ``waiting()`` runs between polls (failing the trials of dead workers). Each attempt is one
        transaction (``pareto.store.storage.claim``).

        Raises:
            MachineBusy: another worker has measured the same configuration for ``TWIN_WAIT_S`` (the
                trial's row is then stored BUSY).
        """
        deadline = time.monotonic() + TWIN_WAIT_S
        why = f"another worker has measured the same configuration here for over {TWIN_WAIT_S:.0f} s"
        while True:
            late = time.monotonic() > deadline
            row_id, twin = storage.claim(
                self.engine, row, key, replacing=replacing, slo_ms=self.slo_ms, busy=why if late else None
            )
            replacing = None
            if row_id is not None:
                return row_id, twin
            if late:
                raise MachineBusy(why)
            time.sleep(TWIN_POLL_S)
            waiting()
