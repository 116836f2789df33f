"""Does a request P99 bound cover a batched queue's true P99? (issue 45)

A stub queue whose calls take a fixed time per bucket (1, 1.2, 1.6 ms at 1, 2, 4; max batch 4, wait
0.5 ms), its true P99 from one simulated run of 10⁶ requests; then, per load and over ``--seeds`` seeds, how
often each bound is at or above it: the order statistic of one run (requests taken as independent),
pareto's independent replications (6 × 2 500, ``pool_replications``), and batch means of one run of
15 000 cut in 6. Run it from the repository root::

    .venv/bin/python benchmarks/queue_bound.py [--seeds 200] [--loads 0.5,0.7,0.9,0.95]
    .venv/bin/python benchmarks/queue_bound.py --settle 300 [--seeds 400] [--loads 0.5,0.7,0.8,0.83]

``--settle K``: pareto's bound as a search computes it (6 replications of at least 2 500 requests,
``settle_requests`` more near capacity, the two-sided t interval's upper end), its coverage per load,
the true P99 being the mean of six runs of 4 000 000 requests.
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime, timezone

import numpy as np
from scipy.stats import t as student_t

from pareto.measure.queue import Batcher, ServiceTimes, best_at_rate, poisson_arrivals, simulate

SERVICE = ServiceTimes.fixed({1: 1e-3, 2: 1.2e-3, 4: 1.6e-3})
BATCHER = Batcher(4, 0.5)
SATURATION = 4 / 1.6e-3


def long_p99(rate: float, requests: int, seed: int) -> float:
    """The queue's P99 (ms) over one long run at ``rate``, its first 1 % left out: a true P99 to cover."""
    run = simulate(poisson_arrivals(rate, requests, seed), SERVICE, BATCHER, seed=seed)
    return float(np.quantile(run.latency_s[requests // 100 :], 0.99)) * 1e3


def batch_means(latency_ms: np.ndarray, parts: int, confidence: float = 0.99) -> float:
    each = np.array([np.quantile(p, 0.99) for p in np.array_split(latency_ms, parts)])
    return float(
        np.quantile(latency_ms, 0.99) + student_t.ppf(confidence, parts - 1) * each.std(ddof=1) / math.sqrt(parts)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--loads", default="0.5,0.7,0.9,0.95")
    parser.add_argument(
        "--lengths",
        help="instead: per load and per replication length (e.g. 2500,5000,10000,20000), the coverage of 7 "
        "replications' t bound and of their largest P99 (at 7, all below the true P99 has chance 0.5^7 < 1 %%)",
    )
    parser.add_argument("--settle", type=float, help="instead: the coverage of pareto's settled bound at this K")
    args = parser.parse_args()
    if args.lengths:
        return by_length(args)
    if args.settle is not None:
        return settled(args)
    print(
        f"`benchmarks/queue_bound.py {' '.join(sys.argv[1:])}` — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n\n"
        "| load | true P99 | order statistic, one run of 15 000 | 6 replications × 2 500 | batch means, 15 000 in 6 |\n"
        "|---|---|---|---|---|"
    )
    for load in (float(x) for x in args.loads.split(",")):
        rate = load * SATURATION
        truth = long_p99(rate, 1_000_000, 12_345)
        covered = {"order": 0, "replications": 0, "batch means": 0}
        for seed in range(args.seeds):
            kwargs = {"seed": seed, "confidence": 0.99}
            one = best_at_rate(rate, SERVICE, [BATCHER], requests=15_000, **kwargs)
            covered["order"] += (one.summary.p99_upper_ms or 0.0) >= truth
            six = best_at_rate(rate, SERVICE, [BATCHER], requests=2_500, replications=6, **kwargs)
            covered["replications"] += (six.summary.p99_upper_ms or 0.0) >= truth
            run = simulate(poisson_arrivals(rate, 15_000, seed + 1), SERVICE, BATCHER, seed=seed + 1)
            covered["batch means"] += batch_means(run.latency_s[750:] * 1e3, 6) >= truth
        cells = " | ".join(f"{v / args.seeds:.1%}" for v in covered.values())
        print(f"| {load:g} | {truth:.2f} ms | {cells} |")
    return 0


def by_length(args: argparse.Namespace) -> int:
    """Coverage against the length of each replication (7 replications, each leaving out its first 5 %)."""
    lengths = [int(x) for x in args.lengths.split(",")]
    print(
        f"`benchmarks/queue_bound.py {' '.join(sys.argv[1:])}` — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n\n"
        "| load | true P99 | requests per replication | t bound over 7 | largest of 7 |\n|---|---|---|---|---|"
    )
    for load in (float(x) for x in args.loads.split(",")):
        rate = load * SATURATION
        truth = long_p99(rate, 2_000_000, 999)
        for length in lengths:
            t_bound = largest = 0
            for seed in range(args.seeds):
                each = np.array([
                    np.quantile(simulate(poisson_arrivals(rate, length, s), SERVICE, BATCHER, seed=s)
                                .latency_s[length // 20 :] * 1e3, 0.99)
                    for s in (seed * 10 + r + 1 for r in range(7))
                ])  # fmt: skip
                t_bound += each.mean() + student_t.ppf(0.99, 6) * each.std(ddof=1) / math.sqrt(7) >= truth
                largest += each.max() >= truth
            print(
                f"| {load:g} | {truth:.2f} ms | {length:,} | {t_bound / args.seeds:.0%} | {largest / args.seeds:.0%} |"
            )
    return 0


def settled(args: argparse.Namespace) -> int:
    """Coverage of the bound a search states (``best_at_rate`` with ``settle``) per load."""
    from pareto.measure.queue import settle_requests

    print(
        f"`benchmarks/queue_bound.py {' '.join(sys.argv[1:])}` — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n\n"
        "| load | true P99 (spread of 6 runs) | requests per replication | covered | not settled |\n"
        "|---|---|---|---|---|"
    )
    for load in (float(x) for x in args.loads.split(",")):
        rate = load * SATURATION
        each = [long_p99(rate, 4_000_000, s) for s in (1, 2, 3, 4, 5, 999)]
        truth, spread = float(np.mean(each)), (max(each) - min(each)) / 2 / float(np.mean(each))
        need = settle_requests(rate, SERVICE, BATCHER, args.settle)
        covered = unsettled = 0
        for seed in range(args.seeds):
            point = best_at_rate(
                rate, SERVICE, [BATCHER], requests=2_500, seed=seed, confidence=0.99, replications=6, settle=args.settle
            )
            unsettled += not point.summary.settled
            covered += (point.summary.p99_upper_ms or 0.0) >= truth
        size = f"{max(2_500, need):,}" if need is not None else "over 40,000"
        print(
            f"| {load:g} | {truth:.2f} ms (±{spread:.1%}) | {size} | {covered / args.seeds:.1%} | "
            f"{unsettled / args.seeds:.0%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
