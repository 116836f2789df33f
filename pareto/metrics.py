"""The one record of what a trial measured: its fields are the measurement table's metric columns,
the ``metrics`` of every JSON answer, and what the report reads.

Adding a metric: add a field here (with its unit in the name or the docstring), a migration that adds
its column, and the code that measures it (``pareto.study.assess``). Pure Python: queries import it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, get_type_hints

#: Joins the method of each term (latency, memory, compute) in a measurement's ``method``.
METHOD_SEPARATOR = " | "

#: SQL column types for fields whose Python type alone does not say (bytes and FLOPs pass 2**31,
#: short strings get a length); read by ``pareto.store.models``.
BIG = {"sql": "big"}


def _str(length: int) -> dict[str, Any]:
    return {"sql": "string", "length": length}


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """Everything measured for one configuration, in the units its names say.

    Latency bounds are one-sided at ``confidence`` each and cover the variation between rounds
    (``pareto.measure.stats.percentile_bounds``); None means too few samples to bound that side.
    """

    accuracy: float  #: the task's metric, higher is better
    batch_size: int
    latency_mean_ms: float
    latency_p50_ms: float
    latency_p50_lower_ms: float | None = None
    latency_p50_upper_ms: float | None = None
    latency_p90_ms: float
    latency_p99_ms: float
    latency_p99_lower_ms: float | None = None
    latency_p99_upper_ms: float | None = None  #: the conservative P99 that SLO verdicts use
    latency_p999_ms: float
    p99_p50_ratio: float
    samples: int  #: timed calls kept (discarded rounds excluded)
    warmup: int
    confidence: float  #: one-sided confidence of each latency bound
    method: str = field(metadata={"sql": "text"})
    throughput_per_s: float  #: batch size / mean latency
    params_bytes: int = field(metadata=BIG)  #: parameters and buffers as stored
    theoretical_bytes: int = field(metadata=BIG)  #: the ideal size of the compressed weights
    compression_ratio: float  #: the baseline's theoretical bytes / this configuration's
    activation_bytes: int | None = field(default=None, metadata=BIG)
    kv_cache_bytes: int | None = field(default=None, metadata=BIG)
    memory_bytes: int | None = field(default=None, metadata=BIG)  #: params + activations + KV cache
    flops: int | None = field(default=None, metadata=BIG)  #: per forward pass of one batch
    bytes_moved: int | None = field(default=None, metadata=BIG)  #: a lower bound per forward pass
    arithmetic_intensity: float | None = None  #: FLOP per byte moved
    hardware_profile: str | None = field(default=None, metadata=_str(128))
    roofline_bound_ms: float | None = None
    regime: str | None = field(default=None, metadata=_str(16))
    achieved_fraction: float | None = None  #: roofline bound / measured p50; None when the bound is suspect
    throughput_curve: list[Any] | None = None
    saturation_batch: int | None = None
    max_batch_within_slo: int | None = None
    # revision 0003: rounds and the contention guard
    rounds: int | None = None  #: rounds kept
    discarded_rounds: int | None = None  #: rounds the contention guard discarded
    round_spread: float | None = None  #: standard deviation of the log round medians
    p99_bound: str | None = field(default=None, metadata=_str(32))  #: the method that set the P99 bound
    probe_ratio_max: float | None = None  #: the slowest probe over its quiet time
    load_average: float | None = None  #: the 1-minute load average when timing began
    roofline_suspect: bool | None = None  #: ran faster than the roofline bound: the ceiling is wrong
    # revision 0004
    latency_p999_upper_ms: float | None = None  #: None below 4,603 calls (the fewest that bound it at 99 %)
    # revision 0005
    round_medians_ms: list[Any] | None = None  #: the median of each round kept, in ms (regression tests)
    # revision 0011: the traffic scenario (None in a single-stream study, and left out of ``to_dict``)
    scenario: str | None = field(default=None, metadata=_str(16))  #: "server": requests arriving at ``qps``
    qps: float | None = None  #: the arrival rate (requests/s) the request latencies below are at
    max_batch: int | None = None  #: the batcher's largest batch (the trial's batch size)
    max_wait_ms: float | None = None  #: the batcher's longest wait for a batch to fill at ``qps``
    requests: int | None = None  #: simulated requests summarized
    request_p50_ms: float | None = None  #: per request: completion - arrival (queue, batch wait, service)
    request_p99_ms: float | None = None
    request_p99_upper_ms: float | None = None  #: one-sided bound at ``confidence`` over the requests
    capacity_qps: float | None = None  #: the highest rate whose request P99 bound is within the study's SLO
    capacity_max_batch: int | None = None  #: the batcher settings that reach ``capacity_qps``
    capacity_max_wait_ms: float | None = None
    service_curve: list[Any] | None = None  #: the measured call time per batch bucket the simulation draws from
    traffic_curve: list[Any] | None = None  #: the request P99 (and its batcher) at rates around the capacity
    # revision 0012: the capacity a user gets
    serving_runs: list[Any] | None = None  #: the short load runs the served batch costs were measured in
    serve_threads: int | None = None  #: the intra-op threads it is served with (the serving runs' choice)
    #: the highest rate whose real load run met the SLO (bisection over runs); 0.0: none did; None: not load-run
    load_capacity_qps: float | None = None
    load_capacity_max_batch: int | None = None  #: the batcher settings those load runs used
    load_capacity_max_wait_ms: float | None = None
    # revision 0013
    serve_instances: int | None = None  #: the model instances it is served with (the serving runs' choice)
    #: the layout its load-run capacity was found in (the load runs' choice among the layouts served)
    load_capacity_instances: int | None = None
    load_capacity_threads: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Field name → value; infinite floats become None (JSON has no infinity). A single-stream
        measurement leaves out the traffic fields (its answers are as they were before they existed)."""
        skip = TRAFFIC_FIELDS if self.scenario is None else ()
        return {
            f.name: None if isinstance(v, float) and math.isinf(v) else v
            for f in dataclasses.fields(self)
            if f.name not in skip
            for v in (getattr(self, f.name),)
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Metrics:
        """The record of a ``to_dict`` (a candidate's metrics; a single-stream one has no traffic fields)."""
        return cls(**{name: data[name] for name in FIELD_NAMES if name in data})

    @classmethod
    def from_row(cls, row: Any) -> Metrics:
        """The record of an object with one attribute per field (a measurement row)."""
        return cls(**{name: getattr(row, name) for name in FIELD_NAMES})


#: How a capacity was found, as shown beside it.
LOAD_RUN, SIMULATED = "load-run", "simulated, not load-run"


def served_capacity(metrics: dict[str, Any]) -> tuple[float | None, str]:
    """The capacity a read judges a configuration at a rate by, and its source: the load-run capacity
    where load runs found one (0.0 when none met the SLO), else the simulated one (``LOAD_RUN``,
    ``SIMULATED``). None: the simulation found no rate within the SLO."""
    if metrics.get("load_capacity_qps") is not None:
        return float(metrics["load_capacity_qps"]), LOAD_RUN
    capacity = metrics.get("capacity_qps")
    return (float(capacity) if capacity is not None else None), SIMULATED


#: Every metric field, in declaration order.
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Metrics))
#: The fields of the traffic scenario (revision 0011), from ``scenario`` on.
TRAFFIC_FIELDS: tuple[str, ...] = FIELD_NAMES[FIELD_NAMES.index("scenario") :]


def column_specs() -> list[tuple[str, type, bool, dict[str, Any]]]:
    """(name, Python type, nullable, metadata) of every field, for building table columns."""
    hints = get_type_hints(Metrics)
    specs = []
    for f in dataclasses.fields(Metrics):
        hint = hints[f.name]
        args = getattr(hint, "__args__", ())
        nullable = type(None) in args
        base = next((a for a in args if a is not type(None)), hint) if args else hint
        origin = getattr(base, "__origin__", base)
        specs.append((f.name, origin, nullable, dict(f.metadata)))
    return specs
