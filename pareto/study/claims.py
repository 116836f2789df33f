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
from typing import Any, NamedTuple

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from pareto.errors import MachineBusy
from pareto.metrics import Metrics
from pareto.store import trials
from pareto.store.engine import session_scope
from pareto.store.models import Trial, utcnow

#: How long a trial waits for another worker measuring the same configuration before it gives up (BUSY).
TWIN_WAIT_S = 1800.0
TWIN_POLL_S = 1.0


class Twin(NamedTuple):
    """An earlier trial of the same configuration here: its number, its metrics ({} when rejected early or
    broken), the P99 lower bound that rejected it, or the reason it broke."""

    number: int
    metrics: dict[str, Any]
    p99_lower_ms: float | None
    failed: str | None = None


@dataclass
class Claims:
    """The claims of one study's trials in one environment; ``slo_ms``: the run's P99 SLO, which decides
    whether an early rejection stands for this run."""

    engine: Engine
    study_id: int
    env_id: int
    slo_ms: float | None

    def claim(
        self, row: Callable[..., Trial], key: str, *, replacing: int | None = None, waiting: Callable[[], None]
    ) -> tuple[int, Twin | None]:
        """The trial's row id and None when it claimed ``key`` (measure it), or the id of its DUPLICATE row
        and the twin that answers it. ``row(**fields)`` makes the trial's row; ``replacing``: the trial's
        earlier row, deleted in the first attempt (its configuration turned out to be ``key``);
        ``waiting()`` runs between polls (failing the trials of dead workers).

        Raises:
            MachineBusy: another worker has measured the same configuration for ``TWIN_WAIT_S`` (the
                trial's row is then stored BUSY).
        """
        deadline = time.monotonic() + TWIN_WAIT_S
        why = f"another worker has measured the same configuration here for over {TWIN_WAIT_S:.0f} s"
        while True:
            late = time.monotonic() > deadline
            with session_scope(self.engine) as session:
                if replacing is not None:
                    trials.drop_trial(session, replacing)
                    replacing = None
                row_id = trials.claim_trial(session, row())
                twin = self.verdict(session, key, exclude_id=row_id)
                if twin is not None:
                    return self._duplicate(session, row, row_id, twin), twin
                if row_id is not None:
                    return row_id, None
                if late:
                    trials.add_trial(session, row(state="BUSY", error=why, finished_at=utcnow()))
            if late:
                raise MachineBusy(why)
            time.sleep(TWIN_POLL_S)
            waiting()

    def verdict(self, session: Session, key: str, *, exclude_id: int | None) -> Twin | None:
        """The verdict stored on ``key`` here: measured, broken here, or rejected early against an SLO at
        least as tight as this run's (a looser SLO measures it again)."""
        exclude = exclude_id if exclude_id is not None else -1
        earlier = trials.measured_twin(session, self.study_id, self.env_id, key, exclude)
        if earlier is not None:
            return Twin(earlier.trial.optuna_number, Metrics.from_row(earlier).to_dict(), None)
        failed = trials.failed_twin(session, self.study_id, self.env_id, key, exclude)
        if failed is not None:
            return Twin(failed[0], {}, None, failed=failed[1])
        if self.slo_ms is None:
            return None
        for number, early in trials.rejected_early(session, self.study_id, self.env_id, key, exclude):
            lower = (early or {}).get("latency_p99_lower_ms")
            if lower is not None and lower > self.slo_ms:
                return Twin(number, {}, lower)
        return None

    @staticmethod
    def _duplicate(session: Session, row: Callable[..., Trial], row_id: int | None, twin: Twin) -> int:
        reason = f"same configuration as trial {twin.number}; not measured again"
        if row_id is None:
            return trials.add_trial(session, row(state="DUPLICATE", error=reason, finished_at=utcnow()))
        trials.finish_trial(session, row_id, "DUPLICATE", reason)
        return row_id
