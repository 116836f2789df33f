"""The search spec: pydantic models loaded from YAML (configs/*.yaml), with CLI flags on top."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pareto.errors import UsageError
from pareto.front import DEFAULT_OBJECTIVE_NAMES, TRAFFIC_OBJECTIVE_NAMES
from pareto.limits import Constraints
from pareto.naming import Backend, SamplerName
from pareto.slo import DEFAULT_CONFIDENCE, DEFAULT_CONTENTION_LIMIT, DEFAULT_ROUNDS, MIN_CONFIDENCE, MIN_SAMPLES_P99
from pareto.tasks.source import GRAPH_FILES, ONNX, PROGRAM, ModelSource, is_source_ref
from pareto.units import parse_duration_ms, parse_rate_per_s, parse_request_rate, parse_size_bytes


def _stored_or(parse: Any) -> Any:
    """A unit parser that also takes a bare number when validating a stored spec: a spec dumped to
    JSON (``SearchSpec.model_dump(mode="json")``) holds its durations in ms, sizes in bytes and
    rates per second, and validates again with ``context={"stored": True}``."""

    def validate(value: Any, info: ValidationInfo) -> Any:
        stored = bool(info.context and info.context.get("stored"))
        if stored and isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        return parse(value)

    return validate


DurationMs = Annotated[float, BeforeValidator(_stored_or(parse_duration_ms))]
SizeBytes = Annotated[int, BeforeValidator(_stored_or(parse_size_bytes))]
RatePerS = Annotated[float, BeforeValidator(_stored_or(parse_rate_per_s))]
RequestRate = Annotated[float, BeforeValidator(_stored_or(parse_request_rate))]


def _wait_ms(value: Any) -> float:
    """A batcher's wait: a duration, or zero ("0", "0ms")."""
    if isinstance(value, str) and value.strip().rstrip("µumsn").strip() in {"0", "0.0"}:
        return 0.0
    return parse_duration_ms(value)


WaitMs = Annotated[float, BeforeValidator(_stored_or(_wait_ms))]
ObjectiveName = Literal["accuracy", "p99", "p50", "memory", "throughput", "bytes_moved", "flops", "capacity"]
Scenario = Literal["mobile", "serving", "realtime", "edge"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SLO(_Strict):
    """What a configuration must meet: a P99 latency bound, an accuracy floor, a throughput floor."""

    p99: DurationMs | None = Field(default=None, description="P99 latency bound in ms ('7ms').")
    min_accuracy: float | None = None
    min_throughput: RatePerS | None = Field(default=None, description="Items per second ('500/s').")


class Budget(_Strict):
    """Resource limits: inference memory (parameters as stored + peak activations + KV cache)."""

    max_memory: SizeBytes | None = Field(default=None, description="Bytes ('512MiB', '2GB').")


class Range(_Strict):
    """A numeric interval to search: ``{low: 0.1, high: 0.9}`` (``step``/``log`` optional)."""

    low: float
    high: float
    step: float | None = None
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        return self


ParamSpace = Range | list[float | int | str | bool | None]  # null: a parameter's "off" (prune_structured's width_ratio)


class Space(_Strict):
    """Which batch sizes and techniques (with their parameter spaces) the search may combine."""

    batch_size: list[Annotated[int, Field(ge=1)]] | None = None
    #: where configurations are served and measured; several: the sampler chooses (unsaid: eager)
    backend: list[Backend] | None = None
    # unsaid: the default techniques; an explicit empty mapping searches the batch size alone
    techniques: dict[str, dict[str, ParamSpace]] = Field(
        default_factory=lambda: copy.deepcopy(DEFAULT_SPACE["techniques"]), validate_default=True
    )

    @model_validator(mode="after")
    def _known_techniques(self) -> Space:
        from pareto.compress.base import get_technique, registry

        techniques = registry()
        if self.backend is not None and (not self.backend or len(set(self.backend)) != len(self.backend)):
            raise ValueError(f"backend lists {self.backend or 'nothing'}: name each backend once")
        for name, params in self.techniques.items():
            cls = techniques.get(name)
            if cls is None:
                raise ValueError(f"unknown technique {name!r}; known: {', '.join(sorted(techniques))}")
            for pname in params:
                if pname not in cls.model_fields:
                    fields = ", ".join(f for f in cls.model_fields if f != "leave" or cls.leaves_layers) or "none"
                    raise ValueError(f"technique {name!r} has no parameter {pname!r} (it has: {fields})")
            for pname, field in cls.model_fields.items():
                if field.is_required() and pname not in params:
                    raise ValueError(f"technique {name!r} needs a space for {pname!r}")
            # the first choices together, then every end of every range and every listed choice,
            # must each make a valid technique
            try:
                get_technique(name, {p: _first(v) for p, v in params.items()})
            except UsageError as exc:
                raise ValueError(str(exc).rstrip(".")) from None
            for pname, pspace in params.items():
                values = [pspace.low, pspace.high] if isinstance(pspace, Range) else pspace
                if not values:
                    raise ValueError(f"technique {name!r}: {pname!r} lists no choices")
                for value in values:
                    others = {k: _first(v) for k, v in params.items() if k != pname}
                    try:
                        get_technique(name, {**others, pname: value})
                    except UsageError as exc:
                        raise ValueError(str(exc).rstrip(".")) from None
        return self


def start_point_problem(point: StartPoint, space: Space) -> str | None:
    """Why ``point`` is not one configuration of ``space`` (a technique or value outside it, a
    parameter left unsaid, a backend it cannot run on), or None."""
    from pareto.compress import Config, get_technique
    from pareto.compress.base import registry

    # a backend the space (or the command line: --backend) leaves out is not an error: the point is
    # skipped at the search's start, as one whose technique cannot run there
    if point.batch_size is not None and space.batch_size and point.batch_size not in space.batch_size:
        return f"batch size {point.batch_size} is not in the space's batch sizes {space.batch_size}"
    techniques = []
    for name, params in point.techniques.items():
        if name not in space.techniques:
            return f"technique {name!r} is not in the space"
        for pname, pspace in space.techniques[name].items():
            if pname not in params:
                return f"give {name}'s {pname!r} (every parameter of a start point is given)"
            if not _within(params[pname], pspace):
                return f"{name}'s {pname}={params[pname]!r} is outside the space ({_shown(pspace)})"
        extra = set(params) - set(space.techniques[name])
        unknown = sorted(extra - set(registry()[name].model_fields))
        if unknown:
            return f"technique {name!r} has no parameter {unknown[0]!r}"
        if extra:
            return f"{name}'s {', '.join(sorted(extra))} is not searched: the space fixes it"
        try:
            techniques.append(get_technique(name, params))
        except UsageError as exc:
            return str(exc).rstrip(".")
    try:
        Config(techniques=tuple(techniques), batch_size=point.batch_size or 1, backend=point.backend)
    except ValidationError as exc:
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return None


def _within(value: Any, pspace: ParamSpace) -> bool:
    if not isinstance(pspace, Range):
        return value in pspace
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not pspace.low <= value <= pspace.high:
        return False
    steps = (value - pspace.low) / pspace.step if pspace.step else 0.0
    return abs(steps - round(steps)) < 1e-9  # on the range's steps, where it has them


def _shown(pspace: ParamSpace) -> str:
    if not isinstance(pspace, Range):
        return f"one of {pspace}"
    return f"{pspace.low} to {pspace.high}" + (f" in steps of {pspace.step}" if pspace.step else "")


def _first(space: ParamSpace) -> Any:
    return space.low if isinstance(space, Range) else space[0]


class StartPoint(_Strict):
    """A configuration measured before the sampler proposes any (Optuna's ``enqueue_trial``): each
    lever alone, say, so that the search's pick is compared with every one of them. Every parameter
    of its techniques is given, within the space; ``batch_size`` unsaid: the space's first."""

    backend: Backend = "eager"
    batch_size: int | None = Field(default=None, ge=1)
    techniques: dict[str, dict[str, Any]] = Field(default_factory=dict)


class Search(_Strict):
    n_trials: int = Field(default=30, ge=1)
    timeout: DurationMs | None = None
    seed: int | None = 0
    #: the Optuna sampler (see ``pareto.study.samplers``); stored with the study's spec
    sampler: SamplerName = "tpe"
    #: the grid sampler: points of a range without a step (both ends included)
    grid_points: int = Field(default=5, ge=2, le=100)
    #: stop timing a configuration after its first round when its P99 lower bound is already over
    #: the SLO: stored as pruned with its latency, its accuracy never evaluated (never the baseline)
    early_reject: bool = True
    #: after the trials, re-measure this many of the best feasible and near-feasible frontier
    #: configurations in interleaved rounds with the baseline (0: no confirmation)
    confirm_top: int = Field(default=3, ge=0)
    #: "near-feasible": a P99 upper bound within this multiple of the SLO
    confirm_margin: float = Field(default=1.5, ge=1.0)
    #: configurations measured first, in this order, before the sampler proposes (one each per
    #: environment: one tried here already is not queued again)
    start_with: list[StartPoint] = Field(default_factory=list)
    #: CPU levers searched even where the lever probe times them slower than float32 on this machine
    #: (``pareto.study.space_checks``): left out otherwise, with a notice
    keep: list[str] = Field(default_factory=list)

    @field_validator("keep")
    @classmethod
    def _known_levers(cls, value: list[str]) -> list[str]:
        from pareto.compress.availability import levers  # deferred: the techniques load torch

        known = levers()
        unknown = [name for name in value if name not in known]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not one of the CPU levers the probe judges ({', '.join(known)})")
        return value


class Measure(_Strict):
    device: str = "auto"
    threads: int | None = Field(default=None, ge=1)
    #: the fewest timed calls; a "met" P99 needs MIN_SAMPLES_P99 (MLPerf LoadGen's rule)
    samples: int = Field(default=MIN_SAMPLES_P99, ge=1)
    #: the calls are split into this many rounds, with the contention probe between them
    rounds: int = Field(default=DEFAULT_ROUNDS, ge=1)
    warmup: int = Field(default=50, ge=0)
    #: one-sided confidence of every latency bound ("met" holds with at least this probability)
    confidence: float = Field(default=DEFAULT_CONFIDENCE, ge=MIN_CONFIDENCE, lt=1)
    #: a round whose probe is slower than this multiple of the quiet time is discarded; None: no guard
    contention_limit: float | None = Field(default=DEFAULT_CONTENTION_LIMIT, gt=1)
    #: rounds a model may lose to the guard before it is given up as "machine busy"; None: as many as
    #: its rounds. A nightly job can wait out an intermittent load: the reference it times in the same
    #: rounds takes the load's drift out of what it keeps
    max_discards: int | None = Field(default=None, ge=0)
    #: keep timing past ``samples`` until the P99 verdict is decided or this budget per trial ends
    adaptive_budget: DurationMs | None = Field(default=None, description="e.g. '20s'; None: fixed samples.")
    #: roofline: a profile name from configs/hardware, "host" (the latest `pareto calibrate`), or None
    hardware: str | None = "auto"
    #: also time a batch sweep per trial for the throughput curve (costly: one timing per batch size)
    throughput_sweep: bool = False

    @field_validator("hardware")
    @classmethod
    def _no_hardware(cls, value: str | None) -> str | None:
        return None if value is not None and value.lower() in {"none", "off"} else value

    @model_validator(mode="after")
    def _rounds_fit(self) -> Measure:
        if self.rounds > self.samples:
            raise ValueError(f"rounds ({self.rounds}) cannot exceed samples ({self.samples})")
        return self


class Traffic(_Strict):
    """Requests arriving at a rate (the "server" scenario): with ``qps`` set, a configuration's P99 is its
    requests' at that Poisson arrival rate behind a dynamic batcher, not one call's with nothing queued.

    The space's batch sizes are the batcher's largest batch; the longest wait for a batch to fill is
    chosen per configuration from ``max_wait`` by the queue simulation (it changes nothing measured).
    """

    qps: RequestRate | None = Field(
        default=None, description="Poisson arrival rate ('800/s' or 800); None: single stream."
    )
    #: the batcher's waits tried per configuration; None: 0, 1/16, 1/8, 1/4 and 1/2 of the SLO
    max_wait: list[WaitMs] | None = None
    #: simulated requests per rate in each replication
    requests: int = Field(default=2500, ge=MIN_SAMPLES_P99)
    #: independent replications per rate (their own arrivals and draws): the P99 bound comes from their spread
    replications: int = Field(default=6, ge=1, le=64)
    #: each replication at load ρ holds at least settle / (1 − √ρ)² requests, so that its queue settles; a
    #: rate that would need over 40 000 is "not settled" and counts as a miss (0: no such rule)
    settle: float = Field(default=300.0, ge=0.0, le=10_000.0)
    #: timed calls per batch bucket below the largest (the largest is the trial's own latency measurement)
    sweep_samples: int = Field(default=200, ge=20)
    #: short load runs per trial that measure what a served batch costs (0: the calls timed alone)
    serve_runs: int = Field(default=3, ge=0, le=10)
    #: the intra-op thread counts a configuration is served with, the one of highest simulated capacity kept;
    #: None: 1 and the measurement's thread count
    serve_threads: list[Annotated[int, Field(ge=1, le=1024)]] | None = None
    #: the model instances (batcher threads taking batches from one queue concurrently) a configuration is
    #: served with, each with each thread count whose product fits the cores measured on (at least one
    #: pair); the layout of highest simulated capacity kept; None: 1 and the measurement's thread count
    serve_instances: list[Annotated[int, Field(ge=1, le=64)]] | None = None
    #: the most requests of each such serving run (its schedule lasts at most 4 s, 200 requests at least)
    serve_requests: int = Field(default=1000, ge=100)
    #: requests of each confirming load run (pick and baseline, after the search), per replication
    load_requests: int = Field(default=2000, ge=MIN_SAMPLES_P99)
    #: the shortest schedule of one load run in seconds (more requests at a high rate); LoadGen's minimum
    #: duration, scaled to a small machine
    load_min_s: float = Field(default=1.0, ge=0.0, le=600.0)
    #: load runs per rate, each on its own seeded schedule: the P99 bound comes from their spread (a
    #: Student-t bound over R runs: with 2 its factor is 63.7, with 5 it is 4.6; fewer than 4 rarely
    #: bound a P99 within an SLO)
    load_replications: int = Field(default=5, ge=1, le=20)
    #: after the trials, the configurations that lead on simulated capacity within the accuracy limit whose
    #: capacity load runs find (bisection); reads judge these by it
    load_top: int = Field(default=2, ge=0, le=10)
    #: after the trials, load-run the pick and its baseline (a worker leaves it to the parent)
    load_runs: bool = True
    #: the arrivals' seed: every configuration of the study is simulated and load-run on the same schedule
    seed: int = 0

    @field_validator("max_wait")
    @classmethod
    def _waits(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (not value or min(value) < 0):
            raise ValueError("max_wait lists the batcher's waits to try: at least one, none negative")
        return value


#: Deployment scenarios: the objectives and measurement that each one's users care about.
SCENARIOS: dict[str, dict[str, Any]] = {
    # memory and P99 at batch 1; throughput given up
    "mobile": {"objectives": ["accuracy", "p99", "memory"], "space": {"batch_size": [1]}},
    # throughput and memory under a P99 bound, batch size searched
    "serving": {
        "objectives": ["accuracy", "throughput", "memory"],
        "space": {"batch_size": [1, 8, 32, 128, 256]},
    },
    # P99 alone, strictly: batch 1, bounds at 99.5 %, sampling until the verdict is decided
    "realtime": {
        "objectives": ["accuracy", "p99"],
        "space": {"batch_size": [1]},
        "measure": {"confidence": 0.995, "adaptive_budget": "20s"},
    },
    # bytes moved per inference as the energy proxy, and memory
    "edge": {"objectives": ["accuracy", "bytes_moved", "memory"], "space": {"batch_size": [1]}},
}


class Inputs(_Strict):
    """How a model folder's data file is read and served (``model:`` and ``data:``; see ``ModelSource``)."""

    text_field: str = "text"
    #: an image classifier's data file: the field with each image's path
    image_field: str = "image"
    #: the labels a sequence classifier is scored on (a sentence-transformers folder needs none)
    label_field: str | None = "label"
    metric: Literal["accuracy", "f1"] = "accuracy"
    #: a request at its own length (each batch padded to its longest row), up to a length bucket, or the max
    padding: Literal["request", "bucket", "max"] = "request"
    max_length: Annotated[int, Field(ge=2)] | None = None
    trust_remote_code: bool = False


class SearchSpec(_Strict):
    """Everything a search needs; ``configs/demo.yaml`` is the default spelled out."""

    task: str = "demo"
    #: a Hugging Face model folder and a data file (JSONL or CSV) in place of ``task``: set together
    model: str | None = None
    data: str | None = None
    inputs: Inputs = Inputs()
    study: str | None = None
    scenario: Scenario | None = None
    objectives: list[ObjectiveName] = Field(
        default_factory=lambda: cast("list[ObjectiveName]", list(DEFAULT_OBJECTIVE_NAMES))
    )
    slo: SLO = SLO()
    budget: Budget = Budget()
    traffic: Traffic = Traffic()
    search: Search = Search()
    measure: Measure = Measure()
    space: Space = Field(default_factory=lambda: Space.model_validate(DEFAULT_SPACE))

    def constraints(self) -> Constraints:
        """The study's SLO and budget as the limits every judgement takes (what a read of the study judges
        by when the caller says nothing)."""
        return Constraints(
            p99_ms=self.slo.p99,
            qps=self.traffic.qps,
            min_accuracy=self.slo.min_accuracy,
            max_memory_bytes=self.budget.max_memory,
            min_throughput_per_s=self.slo.min_throughput,
        )

    @model_validator(mode="before")
    @classmethod
    def _scenario_defaults(cls, data: Any) -> Any:
        """A scenario fills in what the spec leaves unsaid; anything written explicitly wins."""
        if not isinstance(data, dict) or data.get("scenario") not in SCENARIOS:
            return data
        merged = dict(data)
        for key, preset in SCENARIOS[data["scenario"]].items():
            if isinstance(preset, dict):
                given = merged.get(key) or {}
                if isinstance(given, BaseModel):
                    given = given.model_dump(exclude_unset=True)
                if isinstance(given, dict):
                    merged[key] = {**preset, **{k: v for k, v in given.items() if v is not None}}
            elif merged.get(key) is None:
                merged[key] = preset
        return merged

    @model_validator(mode="before")
    @classmethod
    def _model_folder(cls, data: Any) -> Any:
        """``model`` and ``data`` become the task (``ModelSource.ref``: the files' paths and digests)."""
        if not isinstance(data, dict) or (data.get("model") is None and data.get("data") is None):
            return data
        if data.get("model") is None or data.get("data") is None:
            raise ValueError("a model folder needs its data file and a data file its model: give model and data")
        if is_source_ref(str(data.get("task"))):  # a stored spec: its files as they were measured, not re-read
            return data
        if data.get("task") not in (None, "demo"):
            raise ValueError("give either task or model and data, not both")
        given = data.get("inputs") or {}
        given = given.model_dump(exclude_unset=True) if isinstance(given, BaseModel) else dict(given)
        suffix = Path(str(data["model"])).suffix
        if suffix == PROGRAM:  # served where a graph is: one shape unless the user says otherwise
            given.setdefault("padding", "max")
        settings = Inputs.model_validate(given)
        source = ModelSource.open(data["model"], data["data"], **settings.model_dump())
        folder = {**data, "model": source.model, "data": source.data, "task": source.ref()}
        if suffix in GRAPH_FILES:
            return {**folder, "inputs": given, "space": _graph_space(data.get("space"), suffix)}
        return folder

    @model_validator(mode="after")
    def _inputs_need_a_model(self) -> SearchSpec:
        if self.inputs != Inputs() and not is_source_ref(self.task):
            raise ValueError("the data settings (inputs: --text-field, --padding…) need a model folder: give --model")
        return self

    @model_validator(mode="after")
    def _static_shapes(self) -> SearchSpec:
        static = sorted(set(self.space.backend or []) & {"compile", "onnxruntime"})
        onnx_file = is_source_ref(self.task) and Path(ModelSource.from_ref(self.task).model).suffix == ONNX
        if onnx_file and "compile" in static:
            raise ValueError(
                "an ONNX file is served by ONNX Runtime, which the compile backend cannot serve: search it on "
                "--backend onnxruntime"
            )
        if onnx_file:  # its own graph serves the shapes it was exported with
            return self
        if is_source_ref(self.task) and static and self.inputs.padding != "max":
            raise ValueError(
                f"the {static[0]} backend serves one input shape, and --padding {self.inputs.padding} gives "
                "requests of many lengths: pass --padding max to serve it"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _traffic_defaults(cls, data: Any) -> Any:
        """At a request rate, a spec that names no objectives optimizes accuracy and capacity."""
        if not isinstance(data, dict) or data.get("objectives") is not None:
            return data
        traffic = data.get("traffic")
        qps = traffic.qps if isinstance(traffic, Traffic) else (traffic or {}).get("qps")
        return {**data, "objectives": list(TRAFFIC_OBJECTIVE_NAMES)} if qps is not None else data

    @model_validator(mode="after")
    def _objectives_make_sense(self) -> SearchSpec:
        if len(set(self.objectives)) != len(self.objectives):
            raise ValueError(f"objectives list one twice: {self.objectives}")
        if not self.objectives:
            raise ValueError("objectives: give at least one")
        if "capacity" in self.objectives and self.traffic.qps is None:
            raise ValueError("the capacity objective needs a request rate (traffic.qps, --qps)")
        return self

    @model_validator(mode="after")
    def _traffic_has_slo(self) -> SearchSpec:
        if self.traffic.qps is not None and self.slo.p99 is None:
            raise ValueError("a request rate (qps) needs a P99 SLO (slo.p99, --slo-p99) to judge its requests by")
        return self

    @model_validator(mode="after")
    def _start_points_in_space(self) -> SearchSpec:
        for k, point in enumerate(self.search.start_with):
            problem = start_point_problem(point, self.space)
            if problem is not None:
                raise ValueError(f"search.start_with[{k}]: {problem}")
        return self

    @property
    def study_name(self) -> str:
        if self.study:
            return self.study
        if is_source_ref(self.task):
            return ModelSource.from_ref(self.task).name
        return self.task.rsplit(":", 1)[-1].replace(".", "-")


#: The demo search space; configs/demo.yaml writes the same out (a test keeps them equal).
DEFAULT_SPACE: dict[str, Any] = {
    "batch_size": None,
    "techniques": {
        # a CPU lever: searched where the lever probe times it faster than float32 here (AMX, AVX-512 BF16)
        "bf16": {},
        "int8_dynamic": {},
        "prune_unstructured": {"sparsity": {"low": 0.5, "high": 0.95}},
        "prune_structured": {"ratio": {"low": 0.2, "high": 0.9}},
        "lowrank": {"rank_ratio": {"low": 0.05, "high": 0.5}},
        # searched only when configurations are served on onnxruntime (pareto search --backend onnxruntime)
        "ort_int8_dynamic": {"per_channel": [False, True]},
    },
}


#: The search space of a torch.export program when the spec names no techniques or backends: what runs on a
#: graph (its layers are ATen operations, not modules to replace), on the three backends.
PROGRAM_SPACE: dict[str, object] = {
    "backend": ["eager", "compile", "onnxruntime"],
    "techniques": {"bf16": {}, "int8_static": {}, "ort_int8_dynamic": {"per_channel": [False, True]}},
}


#: The search space of an ONNX file when the spec names no techniques or backends: ONNX Runtime's own passes
#: (the baseline, on eager, is the file as given, run by ONNX Runtime too).
ONNX_SPACE: dict[str, object] = {
    "backend": ["onnxruntime"],
    "techniques": {"ort_int8_dynamic": {"per_channel": [False, True]}, "ort_int8_static": {}, "ort_fuse": {}},
}


def _graph_space(space: object, suffix: str) -> dict[str, object]:
    """A program's or an ONNX file's space: what the spec says, ``PROGRAM_SPACE`` or ``ONNX_SPACE`` for what it
    leaves unsaid."""
    said = space.model_dump(exclude_unset=True) if isinstance(space, BaseModel) else {}
    if isinstance(space, dict):
        said = dict(space)
    defaults = copy.deepcopy(ONNX_SPACE if suffix == ONNX else PROGRAM_SPACE)
    from pareto.compress.onnxrt import onnxruntime_reason  # deferred: the techniques load torch

    if suffix == PROGRAM and onnxruntime_reason() is not None:  # searched without it, as the skip lines say
        defaults["backend"] = ["eager", "compile"]
    return {**said, **{k: v for k, v in defaults.items() if said.get(k) is None}}


def default_cuda_space() -> dict[str, Any]:
    """The search space on a CUDA device when the spec names no techniques: what pays on a GPU, from each
    technique's ``cuda_default`` (its parameters' choices) in ``cuda_default_order``. A small model there
    is launch-bound, so CUDA graphs (eager, or Inductor's in reduce-overhead mode) come first; precision
    (bf16, fp16, fp8), int4 and int8 weights, 2:4 sparsity (cuSPARSELt on Hopper) and structured pruning
    at tensor-core widths pay once the model computes. Techniques that cannot share a configuration (two
    weight quantizations, two casts) are never drawn together; fp8 and int4 with compile are probed
    together on the GPU first (a small MLP through both, cached), and never drawn together where the
    probe fails (Dynamo cannot trace torchao's weights on some releases). int4 is not offered where
    torchao's tile-packed layout would pad the model's Linear weights more than 2x. A new dict each call."""
    from pareto.compress.base import registry

    offered = sorted(
        (cls for cls in registry().values() if cls.cuda_default is not None),
        key=lambda cls: (cls.cuda_default_order, cls.name),
    )
    return {"batch_size": None, "techniques": {cls.name: copy.deepcopy(cls.cuda_default) for cls in offered}}


def __getattr__(name: str) -> Any:
    """``DEFAULT_CUDA_SPACE``: ``default_cuda_space()``, built from the registry when asked (importing the
    spec does not import torch)."""
    if name == "DEFAULT_CUDA_SPACE":
        return default_cuda_space()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_spec(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> SearchSpec:
    """Read a YAML spec (or the built-in default) and apply CLI overrides on top.

    ``overrides`` uses dotted keys: ``{"slo.p99": "7ms", "search.n_trials": 20}``; None values are ignored.

    Raises:
        UsageError: unreadable or malformed YAML, unknown keys, or invalid values.
    """
    where = str(path) if path is not None else "search spec"
    data = read_config(path)
    apply_overrides(data, overrides)
    return validate_spec(data, where)


def read_config(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """A YAML config file as a mapping ({} for None).

    Raises:
        UsageError: unreadable or malformed YAML, or not a mapping.
    """
    data: dict[str, Any] = {}
    if path is not None:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")  # YAML's own encoding, whatever the locale's
        except OSError as exc:
            raise UsageError(f"Cannot read config {where}: {exc.strerror or exc}.") from exc
        except UnicodeDecodeError as exc:  # a binary file, or text in another encoding
            raise UsageError(
                f"Config {where} is not a UTF-8 text file (byte 0x{exc.object[exc.start]:02x} at offset "
                f"{exc.start}): pass a YAML search spec."
            ) from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.reader.ReaderError as exc:  # text with characters YAML does not allow (NUL, controls)
            raise UsageError(
                f"Config {where} is not a YAML text file (character #x{exc.character:04x} at offset "
                f"{exc.position}): pass a YAML search spec."
            ) from exc
        except RecursionError as exc:  # "[[[[…" thousands deep: no spec nests like that
            raise UsageError(f"Config {where} nests deeper than a YAML search spec can: pass a search spec.") from exc
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise UsageError(f"Config {where} is malformed YAML{at}: {problem}.") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise UsageError(f"Config {where} must be a YAML mapping, not {type(loaded).__name__}.")
        data = loaded
    return data


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any] | None) -> None:
    """Set dotted keys (``{"slo.p99": "7ms"}``) in ``data``, in place; None values are ignored."""
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        node[leaf] = value


def load_stored_spec(path: str | os.PathLike[str]) -> SearchSpec:
    """A spec written as JSON by ``SearchSpec.model_dump(mode="json")`` (a worker's, from ``--workers``).

    Raises:
        UsageError: unreadable or invalid.
    """
    import json

    try:
        data = json.loads(Path(path).read_text())
        return SearchSpec.model_validate(data, context={"stored": True})
    except (OSError, ValueError) as exc:
        raise UsageError(f"Cannot read the spec {path}: {exc}.") from exc


#: The nightly's rules' defaults (``pareto.nightly_job``): one pass's chance of calling an unchanged night
#: slower (one-sided; the second pass lowers it further).
DEFAULT_FALSE_ALARM = 0.01
#: A P99 must grow by more than this factor to count as slower (``pareto.nightly_job.regression``'s absolute
#: rule). asv's default is 1.1, for a dedicated benchmark machine; between two nightlies on a shared
#: 2-core cloud VM the same configuration's P99 moved by up to 1.6x with nothing changed (BENCHMARKS.md),
#: and rounds within one run share that run's state, so the U test alone cannot tell such drift from a
#: change. Lower it on a quiet machine.
DEFAULT_REGRESSION_THRESHOLD = 2.0
#: asv's significance level for its Mann-Whitney U test.
DEFAULT_REGRESSION_P_VALUE = 0.002


class NightlySettings(_Strict):
    """The ``nightly:`` block of a nightly config (``configs/nightly.yaml``)."""

    time_budget: DurationMs = Field(default=600_000.0, gt=0, description="The whole job, e.g. '10min'.")
    #: re-measure the pick and up to this many other frontier configurations (0: the pick alone)
    remeasure_top: int = Field(default=4, ge=0)
    #: one pass's chance of calling an unchanged night slower, on the drift-corrected P99 (the noise
    #: band is this far out in the spread the study's history shows; see pareto.nightly_job.stats)
    false_alarm: float = Field(default=DEFAULT_FALSE_ALARM, gt=0, lt=0.5)
    #: for a configuration with no drift-corrected history yet: its absolute P99 must grow beyond this
    #: factor, and significantly, to count as slower
    threshold: float = Field(default=DEFAULT_REGRESSION_THRESHOLD, gt=1)
    #: the one-sided Mann-Whitney U test's level (with ``threshold``)
    p_value: float = Field(default=DEFAULT_REGRESSION_P_VALUE, gt=0, lt=1)
    #: the Markdown and JSON summaries go here (a relative path is from the working directory)
    summary_dir: str = "nightly-reports"


def load_nightly(
    path: str | os.PathLike[str] | None, overrides: dict[str, Any] | None = None
) -> tuple[SearchSpec, NightlySettings, str | None]:
    """A nightly config: the search spec, the ``nightly:`` block and the ``db:`` URL (None: unsaid).

    Raises:
        UsageError: as ``load_spec``, for either part.
    """
    where = str(path) if path is not None else "nightly config"
    data = read_config(path)
    apply_overrides(data, overrides)
    db = data.pop("db", None)
    if db is not None and not isinstance(db, str):
        raise UsageError(f"{where}: db: must be a database URL string.")
    block = data.pop("nightly", None) or {}
    if not isinstance(block, dict):
        raise UsageError(f"{where}: nightly: must be a mapping.")
    try:
        settings = NightlySettings.model_validate(block)
    except ValidationError as exc:
        raise UsageError(f"{where}: nightly.{describe_validation_error(exc)}.") from exc
    return validate_spec(data, where), settings, db


def validate_spec(data: dict[str, Any], where: str = "search spec") -> SearchSpec:
    try:
        return SearchSpec.model_validate(data)
    except UsageError as exc:
        if where == "search spec":
            raise
        raise UsageError(f"{where}: {exc}") from exc
    except ValidationError as exc:
        raise UsageError(f"{where}: {describe_validation_error(exc)}.") from exc


def describe_validation_error(exc: ValidationError) -> str:
    """The first error of a pydantic ValidationError as one readable clause."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "list[", "Range")))
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    ctx_error = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_error, UsageError):
        msg = str(ctx_error).rstrip(".")
    return f"{loc}: {msg}" if loc else msg
