"""What a question to the database is asked against: the study, the environment, and the limits.

Every read (``best``, ``frontier``, ``explain``, ``trials``, the report, the export) takes one
``Limits`` value; the CLI builds it from its options, the Python API from keyword arguments, and
``Limits.constraints`` turns it into the parsed ``Constraints`` the queries filter on, with what the
caller did not say taken from the study's own stored SLO and budget. A new limit is a field here, a
field of ``Constraints`` and the query that filters on it, and a CLI option.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pareto.errors import UsageError
from pareto.front import Constraints
from pareto.units import parse_duration_ms, parse_rate_per_s, parse_size_bytes


@dataclass(frozen=True)
class Limits:
    """The study, the environment and the limits a read answers against; None leaves each to its default.

    Args:
        study: Study name; may be omitted when the database holds one study.
        environment: ``latest`` (default: where the study was last measured), an environment key, or
            ``all`` where a read takes every environment.
        slo_p99: P99 bound, ``"7ms"`` or milliseconds; default: the study's own SLO.
        min_accuracy: Accuracy floor (the task's metric); default: the study's.
        max_memory: Memory budget (params + activations + KV cache), ``"2GB"`` or bytes; default: the study's.
        min_throughput: Throughput floor, ``"500/s"`` or samples per second; default: the study's.
    """

    study: str | None = None
    environment: str | None = None
    slo_p99: str | float | None = None
    min_accuracy: float | None = None
    max_memory: str | int | None = None
    min_throughput: str | float | None = None

    @classmethod
    def of(cls, limits: Limits | None = None, **keywords: Any) -> Limits:
        """``limits`` with any of its fields given as keywords instead (None keywords are ignored).

        Raises:
            UsageError: a keyword that is not a limit.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(keywords) - names)
        if unknown:
            raise UsageError(f"Unknown limit {unknown[0]!r}: the limits are {', '.join(sorted(names))}.")
        given = {k: v for k, v in keywords.items() if v is not None}
        return dataclasses.replace(limits or cls(), **given)

    def given(self) -> Constraints:
        """The limits the caller said, parsed and checked (nothing from the study).

        Raises:
            UsageError: a malformed or non-positive duration, size or rate.
        """
        memory = parse_size_bytes(self.max_memory) if isinstance(self.max_memory, str) else self.max_memory
        if memory is not None and not memory > 0:
            raise UsageError(f"A memory budget must be positive, got {self.max_memory!r}; write it like '512MiB'.")
        rate = self.min_throughput
        throughput = parse_rate_per_s(rate) if isinstance(rate, str) else None if rate is None else float(rate)
        if throughput is not None and not throughput > 0:
            raise UsageError(f"A throughput floor must be positive, got {rate!r}; write it like '500/s'.")
        return Constraints(
            p99_ms=slo_ms(self.slo_p99),
            min_accuracy=self.min_accuracy,
            max_memory_bytes=memory,
            min_throughput_per_s=throughput,
        )

    def constraints(self, study_spec: dict[str, Any] | None) -> Constraints:
        """The limits to judge by: what the caller said, else the study's stored SLO and budget."""
        given = self.given()
        spec = study_spec or {}
        slo, budget = spec.get("slo") or {}, spec.get("budget") or {}

        def either(said: Any, stored: Any) -> Any:
            return said if said is not None else stored

        return Constraints(
            p99_ms=either(given.p99_ms, slo.get("p99")),
            min_accuracy=either(given.min_accuracy, slo.get("min_accuracy")),
            max_memory_bytes=either(given.max_memory_bytes, budget.get("max_memory")),
            min_throughput_per_s=either(given.min_throughput_per_s, slo.get("min_throughput")),
        )


def slo_ms(value: str | float | None) -> float | None:
    """A P99 SLO in milliseconds, from ``"7ms"`` or a number of milliseconds (None stays None).

    Raises:
        UsageError: malformed, or not positive.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration_ms(value)
    if not value > 0:
        raise UsageError(f"P99 SLO {value!r} ms must be positive.")
    return float(value)
