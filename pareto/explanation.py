"""Why each frontier configuration was or was not chosen; no torch, no database.

The pick is the most accurate configuration whose conservative bounds meet every limit (then the
lowest P99 bound, a confirmed measurement first, the lowest trial number: ``select_best``). Every
other frontier configuration either misses a limit (which, by how much, on the bound), is dominated
by the pick once the limits are applied, lost a tie, or is incomparable with it: more accurate
*and* slower, or less accurate *and* faster — which of two such configurations wins depends only on
the SLO, and the explanation says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pareto.front import Candidate
from pareto.limits import Constraints, evaluate
from pareto.metrics import served_capacity
from pareto.slo import P99_BOUND_METRIC
from pareto.units import format_bytes, format_ms

#: How many of the nearest configurations are described when nothing meets the limits.
NEAREST = 3


def explain_choice(
    front: Sequence[Candidate],
    pick: Candidate | None,
    constraints: Constraints,
    nearest: Sequence[Candidate] = (),
) -> dict[str, Any]:
    """One verdict and one sentence per frontier configuration, and what the nearest ones would
    need when nothing qualifies.

    Args:
        front: The frontier (fastest first), as ``pareto.front.frontier`` returns it.
        pick: The chosen configuration, None when nothing meets the constraints.
        constraints: The limits the pick was chosen under.
        nearest: When ``pick`` is None, the configurations closest to feasible, closest first.

    Returns:
        ``{"constraints", "pick", "items", "nearest"}``; each item has ``trial``, ``description``,
        ``accuracy``, ``p99_upper_ms``, ``verdict`` (chosen, misses, dominated, tie, incomparable)
        and ``reason``; each nearest entry has ``trial``, ``description`` and ``needs``.
    """
    items = [_item(c, pick, constraints) for c in front]
    return {
        "constraints": {**constraints.to_dict(), "described": constraints.describe()},
        "pick": pick.trial if pick is not None else None,
        "items": items,
        "nearest": [] if pick is not None else [_needs(c, constraints) for c in nearest[:NEAREST]],
    }


def _item(c: Candidate, pick: Candidate | None, constraints: Constraints) -> dict[str, Any]:
    judgement = evaluate(c.metrics, constraints)
    verdict, reason = _verdict(c, pick, constraints, list(judgement.violations))
    return {
        "trial": c.trial,
        "description": c.description,
        "accuracy": c.metrics["accuracy"],
        "p99_upper_ms": c.metrics.get(P99_BOUND_METRIC),
        "confirmed": c.confirmation is not None,
        "verdict": verdict,
        "violations": list(judgement.violations),
        "reason": reason,
    }


def _verdict(c: Candidate, pick: Candidate | None, constraints: Constraints, violations: list[str]) -> tuple[str, str]:
    if pick is not None and c.trial == pick.trial and c.environment.get("key") == pick.environment.get("key"):
        limits = f"meets {constraints.describe()}" if constraints.any else "nothing is constrained"
        return "chosen", f"Chosen: {limits}, and no configuration that does is more accurate."
    if violations:
        return "misses", f"Not chosen: {'; '.join(violations)}."
    if pick is None:  # feasible but no pick cannot happen; kept total for callers with a partial front
        return "misses", "Not chosen."
    acc, pick_acc = c.metrics["accuracy"], pick.metrics["accuracy"]
    p99, pick_p99 = _p99(c), _p99(pick)
    ours, theirs = _point(acc, p99), _point(pick_acc, pick_p99)
    if acc == pick_acc:
        if p99 > pick_p99:
            return "tie", (
                f"Not chosen: as accurate as trial {pick.trial} ({acc:.4g}) with a higher P99 bound "
                f"({format_ms(p99)} against {format_ms(pick_p99)})."
            )
        return "tie", (
            f"Not chosen: as accurate and as fast as trial {pick.trial}, which comes first "
            "(a confirmed measurement, then the lower trial number)."
        )
    if acc < pick_acc and p99 >= pick_p99:
        return "dominated", f"Not chosen: trial {pick.trial} is more accurate and no slower ({theirs} against {ours})."
    # acc < pick_acc and faster: the two trade accuracy for latency
    return "incomparable", (
        f"Not chosen: faster but less accurate than trial {pick.trial} ({ours} against {theirs}); both meet "
        "the limits, so which wins depends only on the SLO, and pareto takes the more accurate."
    )


def _needs(c: Candidate, constraints: Constraints) -> dict[str, Any]:
    """What ``c`` would need to qualify, and the limits under which it would."""
    m, needs, relaxed = c.metrics, [], {}
    upper = m.get(P99_BOUND_METRIC)
    capacity = served_capacity(m)[0] or 0.0  # load-run where load runs found one
    if constraints.qps is not None and capacity < constraints.qps:  # at a rate: the capacity, not one call's P99
        needs.append(
            f"{constraints.qps - capacity:,.0f} requests/s more capacity within {format_ms(constraints.p99_ms or 0)} "
            f"({capacity:,.0f}/s now, the rate is {constraints.qps:,.0f}/s)"
        )
        if capacity >= 1:
            relaxed["qps"] = capacity
    elif constraints.p99_ms is not None and constraints.qps is None:
        if upper is None or int(m.get("samples") or 0) < constraints.min_samples:
            needs.append(f"more timed calls to bound its P99 (has {m.get('samples')}, needs {constraints.min_samples})")
        elif upper > constraints.p99_ms:
            faster = 1 - constraints.p99_ms / upper
            needs.append(
                f"a P99 bound {faster:.0%} lower ({format_ms(upper)} now, the SLO is {format_ms(constraints.p99_ms)})"
            )
            relaxed["slo_p99_ms"] = upper
    if constraints.min_accuracy is not None and m["accuracy"] < constraints.min_accuracy:
        needs.append(f"{constraints.min_accuracy - m['accuracy']:.3g} more accuracy ({m['accuracy']:.4g} now)")
        relaxed["min_accuracy"] = m["accuracy"]
    memory = m.get("memory_bytes") if m.get("memory_bytes") is not None else m.get("params_bytes")
    if constraints.max_memory_bytes is not None and memory is not None and memory > constraints.max_memory_bytes:
        needs.append(f"{format_bytes(memory - constraints.max_memory_bytes)} less memory ({format_bytes(memory)} now)")
        relaxed["max_memory_bytes"] = memory
    if constraints.min_throughput_per_s is not None and m["throughput_per_s"] < constraints.min_throughput_per_s:
        needs.append(f"{constraints.min_throughput_per_s - m['throughput_per_s']:,.0f}/s more throughput")
        relaxed["min_throughput_per_s"] = m["throughput_per_s"]
    return {
        "trial": c.trial,
        "description": c.description,
        "accuracy": m["accuracy"],
        "p99_upper_ms": upper,
        "needs": needs,
        "would_qualify_with": relaxed,
    }


def _p99(c: Candidate) -> float:
    value = c.metrics.get(P99_BOUND_METRIC)
    return float("inf") if value is None else float(value)


def _point(accuracy: float, p99: float) -> str:
    return f"accuracy {accuracy:.4g} at a P99 bound of {format_ms(p99)}"
