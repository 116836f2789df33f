"""Coverage of the P99 upper bound by simulation: how often is the true P99 at or under it?

Latencies are drawn in rounds the way pareto times them (20 rounds of 34 calls by default). Each
model of the machine is a mixture whose true P99 is computed from 4 million draws. The bound is
computed two ways: the order statistics of the pooled samples alone (what pareto did before
rounds), and ``pareto.measure.stats.percentile_bounds`` (the larger of that and the between-round
bound). A bound at 99 % should cover at least 99 % of the time; the median of bound / true P99 says
what the coverage costs.

    python benchmarks/coverage.py [--trials 1000] [--rounds 20] [--calls 34] [--confidence 0.99]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import numpy as np

from pareto.measure.stats import order_statistic_bounds, percentile_bounds

Draw = Callable[[np.random.Generator, int], np.ndarray]


def lognormal_rounds(drift: float, sigma: float = 0.25) -> Draw:
    """Calls lognormal(0, sigma); each round scaled by exp(N(0, drift))."""
    return lambda rng, k: rng.lognormal(0.0, sigma, k) * math.exp(rng.normal(0.0, drift))


def busy_rounds(share: float, slowdown: float = 2.0) -> Draw:
    """Quiet rounds, except a share of them that run ``slowdown`` times slower (a co-tenant)."""
    return lambda rng, k: rng.lognormal(0.0, 0.25, k) * (slowdown if rng.random() < share else 1.0)


def spiky_rounds(shape: float) -> Draw:
    """Preemption spikes: a round's spike rate is Gamma(shape) around 1 %, each spike + Exp(1) x base."""

    def draw(rng: np.random.Generator, k: int) -> np.ndarray:
        rate = rng.gamma(shape, 0.01 / shape)
        base = rng.lognormal(0.0, 0.1, k)
        return base + (rng.random(k) < rate) * rng.exponential(1.0, k)

    return draw


MODELS: dict[str, Draw] = {
    "independent calls (no drift)": lognormal_rounds(0.0),
    "round-to-round drift 10 %": lognormal_rounds(0.1),
    "round-to-round drift 30 %": lognormal_rounds(0.3),
    "spike rate varies by round (Gamma 1)": spiky_rounds(1.0),
    "spike rate varies by round (Gamma 0.3)": spiky_rounds(0.3),
    "10 % of rounds 2x slower (what the contention guard removes)": busy_rounds(0.1),
}


def true_p99(draw: Draw, k: int, rng: np.random.Generator) -> float:
    return float(np.quantile(np.concatenate([draw(rng, k) for _ in range(4_000_000 // k)]), 0.99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=34)
    parser.add_argument("--confidence", type=float, default=0.99)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    se = math.sqrt(args.confidence * (1 - args.confidence) / args.trials)
    print(
        f"{args.trials} simulated measurements per model, {args.rounds} rounds x {args.calls} calls, "
        f"bounds at {args.confidence:g} one-sided (binomial s.e. of a coverage near it: {se:.3f})\n"
    )
    print(
        "| machine model | coverage, pooled order statistics | coverage, rounds bound | "
        "median bound / true P99, pooled | median bound / true P99, rounds |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, draw in MODELS.items():
        truth = true_p99(draw, args.calls, rng)
        pooled_hits, rounds_hits, pooled_ratio, rounds_ratio = 0, 0, [], []
        for _ in range(args.trials):
            rounds = [draw(rng, args.calls) for _ in range(args.rounds)]
            pooled = order_statistic_bounds(np.concatenate(rounds), 0.99, args.confidence).upper
            both = percentile_bounds(rounds, 0.99, args.confidence).upper
            pooled_hits += pooled >= truth
            rounds_hits += both >= truth
            pooled_ratio.append(pooled / truth)
            rounds_ratio.append(both / truth)
        print(
            f"| {name} | {pooled_hits / args.trials:.3f} | {rounds_hits / args.trials:.3f} | "
            f"{np.median(pooled_ratio):.2f} | {np.median(rounds_ratio):.2f} |"
        )


if __name__ == "__main__":
    main()
