"""Simulations behind the nightly's noise band and change points: false alarms and detection rates.

The nightly calls a night slower when a drift-corrected statistic is above its level by more than the
noise band learned from the study's history (``pareto.nightly_job.stats``). How often does that band call an
unchanged night slower, and how often does it find a 1.25× or 1.5× slower model, for a study with 8,
15 or 30 nights of history? And how often does e-divisive means report a slower change point in 30
unchanged nights, or miss a creep of 3 % a night over 10 nights? Each answer here is from simulated
studies whose nightly values are drawn from the residuals a real run measured (``--db``: the history
database of ``benchmarks/nightly_sensitivity.py``, resampled), or from a normal with ``--sigma``.

    python benchmarks/nightly_noise.py --db sqlite:///.../history.db [--studies 2000]
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from pareto.nightly_job.history import DriftHistory, slower_change_point
from pareto.nightly_job.stats import FALSE_ALARM, STATISTICS, level, noise_band, residuals


def measured_residuals(db: str, study: str) -> dict[str, np.ndarray]:
    """Each statistic's residuals around the level, over every configuration of the study's nights."""
    from pareto.store import queries, trials
    from pareto.store.engine import open_engine, session_scope

    with session_scope(open_engine(db)) as session:
        row = queries.get_study(session, study)
        summaries = []
        for env_id in _environments(session, row.id):
            summaries += trials.nightly_summaries(session, row.id, env_id)
    history = DriftHistory(summaries)
    return {
        s: np.array(residuals([history.series(t, s, skip_regressions=True) for t in history.trials()]))
        for s in STATISTICS
    }


def _environments(session: Any, study_id: int) -> list[int]:
    from sqlalchemy import select

    from pareto.store.models import NightlyRun

    return sorted(set(session.scalars(select(NightlyRun.environment_id).where(NightlyRun.study_id == study_id))))


def _draw(rng: np.random.Generator, pool: np.ndarray | None, sigma: float, n: int) -> np.ndarray:
    """n nights' values of an unchanged configuration: resampled residuals, or normal noise."""
    if pool is not None and len(pool):
        return rng.choice(pool - np.median(pool), size=n, replace=True)
    return rng.normal(0.0, sigma, n)


def band_table(
    pools: dict[str, np.ndarray | None], sigma: dict[str, float], studies: int, seed: int, configs: int
) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = [
        "| statistic | history nights | band (median) | false alarms, one pass | 1.1× found | 1.25× found | 1.5× found |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for statistic in STATISTICS:
        for nights in (8, 15, 30):
            bands, alarms, found = [], 0, {1.1: 0, 1.25: 0, 1.5: 0}
            for _ in range(studies):
                # the pick and the other configurations re-measured each night, as the job pools them
                series = [list(_draw(rng, pools[statistic], sigma[statistic], nights)) for _ in range(configs)]
                history, tonight = series[0], _draw(rng, pools[statistic], sigma[statistic], 1)[0]
                band = noise_band(residuals(series), statistic, false_alarm=FALSE_ALARM)
                bands.append(band.threshold)
                residual = tonight - level(history)
                alarms += math.exp(residual) > band.threshold
                for factor in found:
                    found[factor] += math.exp(residual + math.log(factor)) > band.threshold
            rate = {f: f"{100 * n / studies:.1f} %" for f, n in found.items()}
            lines.append(
                f"| {statistic.upper()} | {nights} | ×{np.median(bands):.3f} | {100 * alarms / studies:.2f} % | "
                f"{rate[1.1]} | {rate[1.25]} | {rate[1.5]} |"
            )
    return lines


def change_point_table(
    pools: dict[str, np.ndarray | None], sigma: dict[str, float], studies: int, seed: int
) -> list[str]:
    """Nightly evaluations as the job makes them: after each night, on the series so far."""
    rng = np.random.default_rng(seed)
    lines = [
        "| statistic | series | studies | a slower change point reported | night found (median) |",
        "|---|---|---:|---:|---:|",
    ]
    for statistic in STATISTICS:
        quiet, creep, when = 0, 0, []
        for k in range(studies):
            values = _draw(rng, pools[statistic], sigma[statistic], 40)
            # nights 10, 11, ..., 30, each judged on the series so far, as the job does
            quiet += any(_slower(values[:n], statistic, seed=k) for n in range(10, 31))
            crept = values.copy()
            crept[30:] += math.log(1.03) * np.arange(1, 11)
            hit = next((n for n in range(1, 11) if _slower(crept[: 30 + n], statistic, seed=k)), None)
            creep += hit is not None
            when += [hit] if hit is not None else []
        lines.append(f"| {statistic.upper()} | 30 unchanged nights | {studies} | {100 * quiet / studies:.1f} % | — |")
        median = f"{np.median(when):.0f} of 10" if when else "—"
        lines.append(
            f"| {statistic.upper()} | 30 unchanged, then 3 %/night for 10 | {studies} | "
            f"{100 * creep / studies:.1f} % | {median} |"
        )
    return lines


def _slower(values: np.ndarray, statistic: str, *, seed: int) -> bool:
    """The job's rule: a significant change point whose later nights are slower by more than the band
    (learned from this series' residuals, as the job learns it from the study's)."""
    band = noise_band(residuals([list(values)]), statistic, false_alarm=FALSE_ALARM)
    return slower_change_point(list(values), min_ratio=band.threshold, seed=seed) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="a nightly_sensitivity.py history database: resample its residuals")
    parser.add_argument("--study", default="sensitivity")
    parser.add_argument("--sigma-p50", type=float, default=0.015)
    parser.add_argument("--sigma-p99", type=float, default=0.10)
    parser.add_argument("--studies", type=int, default=2000)
    parser.add_argument("--change-studies", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--configs", type=int, default=6, help="configurations re-measured a night (pick, frontier, baseline)"
    )
    args = parser.parse_args()
    sigma = {"p50": args.sigma_p50, "p99": args.sigma_p99}
    pools: dict[str, np.ndarray | None] = dict.fromkeys(STATISTICS)
    if args.db:
        pools.update(measured_residuals(args.db, args.study))
        for s in STATISTICS:
            pool = pools[s]
            assert pool is not None
            mad = 1.4826 * float(np.median(np.abs(pool - np.median(pool))))
            print(f"{s.upper()}: {len(pool)} measured residuals, robust spread {100 * mad:.2f} %, "
                  f"largest {100 * (math.exp(pool.max()) - 1):+.1f} %")  # fmt: skip
    else:
        print(f"Normal noise: spread {sigma}")
    print("\n" + "\n".join(band_table(pools, sigma, args.studies, args.seed, args.configs)))
    print("\n" + "\n".join(change_point_table(pools, sigma, args.change_studies, args.seed)))


if __name__ == "__main__":
    main()
