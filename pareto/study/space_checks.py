"""Before the first trial: what each technique of a search's space does on this model and this machine.

Two checks, each stored per study and environment (``pareto_technique_checks``), so that a later run of
the study, or another worker, reads them instead of taking them again:

- **runs**: the technique alone (at the first point of its space, then the last), built on the task's
  model on the backend it would be served on, then one forward on the example input (no timing). A
  technique that breaks the model on its own (a model whose own code reads what the technique replaces
  or casts), or changes nothing on it, leaves the space with one line saying why: the search never
  spends a trial on it.
- **pays** (the CPU's levers: casts and int8, ``pareto.compress.availability.levers``): the technique on one layer
  of the task's widths (the ``nn.Linear`` or ``nn.Conv2d`` that carries most of the model's FLOPs, fed
  the input it sees in the model) timed in interleaved rounds beside the same layer in float32 on the
  same backend, in a process of its own. A lever under ``PAYS_BELOW`` float32's speed on every backend
  of the search leaves the space with one line (the CPU's facts in it, as ``pareto techniques`` says
  them), unless ``search.keep`` names it.

Also here: the space a search starts from on its device (``space_for_device``, ``available_techniques``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pareto.compress import BACKENDS, Backend, Config, apply, get_technique, registry
from pareto.compress.availability import cpu_facts, levers, technique_reason
from pareto.errors import MachineBusy, NoEffect, TechniqueError, TimingLockStuck, exception_line
from pareto.spec import DEFAULT_CUDA_SPACE, Range, SearchSpec, Space, start_point_problem
from pareto.store import storage
from pareto.store.records import CheckRecord
from pareto.study import layers
from pareto.task import Task, load_task

if TYPE_CHECKING:
    import torch
    from torch import nn

    from pareto.measure.probe import ContentionProbe
    from pareto.study.bench import Bench

Techniques = dict[str, dict[str, Any]]
#: The lever probe's timing: calls per model (fewer for a slow layer, ``PROBE_SECONDS`` at most each),
#: in this many rounds interleaved in a random order, after this many untimed calls.
PROBE_CALLS = 300
PROBE_MIN_CALLS = 40
PROBE_SECONDS = 0.3
PROBE_ROUNDS = 10
PROBE_WARMUP = 20
#: A lever leaves the space when its best speed over float32 is under this: slower by more than a short
#: probe's spread between runs on a shared machine (a lever near 1.0x pays nothing either way).
PAYS_BELOW = 0.9


@dataclass(frozen=True)
class Checked:
    """One technique's check: whether it stays in the space, and the sentence that says why not."""

    technique: str
    ok: bool
    reason: str | None = None
    details: dict[str, Any] | None = None


def first_params(space: dict[str, Any]) -> dict[str, Any]:
    """A technique's parameters at the first point of its space: each range's low end, each list's first."""
    return {p: (s.low if isinstance(s, Range) else s[0]) for p, s in space.items()}


def last_params(space: dict[str, Any]) -> dict[str, Any]:
    """A technique's parameters at the last point of its space: each range's high end, each list's last."""
    return {p: (s.high if isinstance(s, Range) else s[-1]) for p, s in space.items()}


def serving_backend(name: str, backends: Sequence[Backend]) -> Backend:
    """The first of the search's backends (in ``BACKENDS`` order) a technique runs on."""
    runs_on = registry()[name].backends
    return next(b for b in BACKENDS if b in backends and b in runs_on)


#: A pre-flight outcome: "runs", "no effect" or "fails"; why not; the (technique, layer) pairs it learned
#: to leave alone on the way (``pareto.study.layers``).
Outcome = tuple[str, str | None, list[list[str]]]
#: The layers one pre-flight check may learn to leave alone before it gives up.
LEARN_LAYERS = 4


def runs_alone(task: Task, config: Config, *, device: str, threads: int | None) -> Outcome:
    """Whether ``config`` runs on ``task``'s model here: built as a trial builds it, then one forward on the
    example input, untimed. ``("runs", None, learned)``, ``("no effect", why, learned)`` (a technique that
    changes nothing at these parameters) or ``("fails", why, learned)``. A failure traced to layers the
    technique replaced (``pareto.study.layers.culprits``) is tried again with them left alone, at most
    ``LEARN_LAYERS`` times; ``learned`` lists those layers as [technique, layer]."""
    learned: list[tuple[str, str]] = []
    first: str | None = None
    while True:
        status, why, found = _runs_once(task, config, device, threads)
        first = first or (why if status == "fails" else None)
        if status != "fails" or not found or set(found) & set(learned) or len(learned) >= LEARN_LAYERS:
            # a failure learning did not get past: the first failure says why (the others followed from it)
            return status, first if status == "fails" else why, [list(pair) for pair in learned]
        learned += found
        leave: dict[str, tuple[str, ...]] = {}
        for technique, layer in learned:
            leave[technique] = (*leave.get(technique, ()), layer)
        config = layers.with_learned(config, leave)


def _runs_once(
    task: Task, config: Config, device: str, threads: int | None
) -> tuple[str, str | None, tuple[tuple[str, str], ...]]:
    """One build and forward of ``runs_alone``, and the layers a failure was traced to."""
    import torch

    from pareto.devices import as_args

    served = None
    try:
        served = apply(task.model, config, task, device=device, threads=threads)
        if served.ready is not None:
            served.ready()
        with torch.inference_mode():
            served.module(*as_args(task.example_input(config.batch_size)))
    except NoEffect as exc:
        return "no effect", str(exc), ()
    except TechniqueError as exc:
        return "fails", str(exc), ()
    except Exception as exc:  # the user's model under the technique: the reason is the answer
        found = layers.culprits(exc, served) if served is not None else ()
        return "fails", f"{config.describe()} could not run: {exception_line(exc)}", found
    return "runs", None, ()


@dataclass(frozen=True)
class ProbeLayer:
    """The layer the lever probe times: a copy of the model's busiest ``nn.Linear`` or ``nn.Conv2d``, the
    input it sees in the model, and its shape in words ("384→1536 linear at 128 rows")."""

    module: nn.Module
    inputs: torch.Tensor
    shape: str

    def describe(self) -> str:
        return self.shape

    def task(self) -> Task:
        """The layer as a task the techniques can build on (its input is its calibration data too)."""
        import torch
        from torch import nn

        x = self.inputs

        def example_input(batch_size: int) -> torch.Tensor:
            return torch.cat([x] * -(-batch_size // x.shape[0]))[:batch_size].clone()

        return Task(
            name="lever-probe",
            model=nn.Sequential(self.module).eval(),
            example_input=example_input,
            evaluate=lambda model: 0.0,
            train_data=[(x.clone(), None)],
            batch_size=x.shape[0],
        )


def probe_layer(task: Task, batch_size: int) -> ProbeLayer | None:
    """The ``nn.Linear`` or ``nn.Conv2d`` shape whose calls carry the most FLOPs on
    ``example_input(batch_size)``, one such layer copied with the input it received; None without one."""
    import copy

    import torch
    from torch import nn

    from pareto.devices import as_args

    seen: dict[str, tuple[float, nn.Module, torch.Tensor]] = {}

    def hook(module: nn.Module, args: tuple[Any, ...], output: object) -> None:
        x = args[0] if args else None
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and isinstance(output, torch.Tensor)):
            return
        shape, flops = _layer_shape(module, x, output)
        total = seen[shape][0] if shape in seen else 0.0
        seen[shape] = (total + flops, module, x.detach().clone())

    layers = [m for m in task.model.modules() if type(m) in (nn.Linear, nn.Conv2d)]
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with torch.inference_mode():
            task.model(*as_args(task.example_input(batch_size)))
    except Exception:  # the runs check and the baseline's pre-flight say why; the probe is left out
        return None
    finally:
        for handle in handles:
            handle.remove()
    if not seen:
        return None
    shape, (_, module, inputs) = max(seen.items(), key=lambda entry: entry[1][0])
    return ProbeLayer(copy.deepcopy(module).float().eval().requires_grad_(False), inputs.float(), shape)


def _layer_shape(module: nn.Module, x: torch.Tensor, output: torch.Tensor) -> tuple[str, float]:
    """A linear's or convolution's shape in words, and the FLOPs of this call."""
    from torch import nn

    if isinstance(module, nn.Linear):
        rows = x.numel() // module.in_features
        return (
            f"{module.in_features}→{module.out_features} linear at {rows} rows",
            2.0 * x.numel() * module.out_features,
        )
    assert isinstance(module, nn.Conv2d)
    kh, kw = module.kernel_size
    per_output = module.in_channels // module.groups * kh * kw
    size = "×".join(str(d) for d in x.shape[2:])
    shape = f"{module.in_channels}→{module.out_channels} {kh}×{kw} convolution on {x.shape[0]}×{size}"
    return shape, 2.0 * output.numel() * per_output


def lever_speeds(
    layer: ProbeLayer,
    levers: dict[str, dict[str, Any]],
    backends: Sequence[Backend],
    *,
    threads: int | None,
    guard: Guard | None = None,
) -> dict[str, dict[str, Any]]:
    """Each lever's speed over float32 on the probe layer, per backend of the search it runs on, timed in
    one interleaved run (``pareto.measure.latency.measure_interleaved``, CPU), guarded as a trial's rounds
    are when ``guard`` is given: a round the contention probe finds busy is discarded and timed again, and
    a lever (or its float32) the machine stayed busy for is not judged on that backend.

    Returns:
        ``{lever: {"per_backend": {backend: {"lever_p50_ms", "float_p50_ms", "speedup"}}, "best": speedup or
        None, "failed": {backend: reason}, "busy": [backends not judged]}}``, with the method under
        ``"method"`` of each.
    """
    from pareto.measure.latency import RoundPlan, Timed, measure_interleaved

    task = layer.task()
    batch = task.batch_size
    built: dict[tuple[str, Backend], Timed] = {}
    failed: dict[str, dict[str, str]] = {name: {} for name in levers}
    wanted = {(name, b) for name in levers for b in backends if b in registry()[name].backends}
    for backend in sorted({b for _, b in wanted}, key=BACKENDS.index):
        built[("float32", backend)] = _timed(task, Config(batch_size=batch, backend=backend), threads)
    for name, backend in sorted(wanted):
        config = Config(techniques=(get_technique(name, levers[name]),), batch_size=batch, backend=backend)
        try:
            built[(name, backend)] = _timed(task, config, threads)
        except Exception as exc:  # a lever that cannot build on one layer: its runs check judges the model
            failed[name][backend] = exception_line(exc)
    calls = _calls(built[("float32", sorted({b for _, b in wanted}, key=BACKENDS.index)[0])], threads)
    plan = RoundPlan(samples=calls, rounds=PROBE_ROUNDS, warmup=PROBE_WARMUP)
    keys = list(built)
    probe = guard.probe(threads) if guard is not None else None
    results = measure_interleaved(
        [built[k] for k in keys], device="cpu", plan=plan, threads=threads, probe=probe, seed=0
    )
    busy = {k for k, r in zip(keys, results, strict=True) if r.busy}
    p50 = {k: r.summary.p50_ms for k, r in zip(keys, results, strict=True) if k not in busy}
    for lever, backend in list(p50):  # a lever whose float32 the machine stayed busy for is not judged
        if ("float32", backend) in busy:
            p50.pop((lever, backend))
            busy.add((lever, backend))
    method = f"{results[0].method}; {layer.describe()}, float32 on the same backend timed in the same rounds"
    return {
        name: {**_speeds(name, p50, failed[name], method), "busy": sorted(b for n, b in busy if n == name)}
        for name in levers
    }


@dataclass(frozen=True)
class Guard:
    """The contention guard's settings for the lever probe's own process: the environment's quiet probe
    time and the limit over it (``pareto.measure.probe.ContentionProbe``)."""

    quiet_ms: float | None
    limit: float

    def probe(self, threads: int | None) -> ContentionProbe:
        from pareto.measure.probe import ContentionProbe

        return ContentionProbe("cpu", threads=threads, stored_quiet_ms=self.quiet_ms, limit=self.limit)


def isolated_lever_speeds(
    layer: ProbeLayer,
    levers: dict[str, dict[str, Any]],
    backends: Sequence[Backend],
    *,
    threads: int | None,
    guard: Guard | None = None,
) -> dict[str, dict[str, Any]]:
    """``lever_speeds`` in a process of its own, so that a native crash while building or timing ends the
    probe, not the search (seen while this was written: Inductor code cached by a process held to AVX2,
    loaded by one that may use AMX, aborted it; ``pareto.measure.environment.separate_compiled_code``
    now keeps them apart). When that process dies, each lever is probed alone in a process of its own;
    one whose process dies too is kept (``best`` None, its trials judge it) with the reason."""
    found = _in_child(layer, levers, backends, threads, guard=guard)
    if isinstance(found, dict):
        return found
    out = {}
    for name, params in levers.items():
        alone = _in_child(layer, {name: params}, backends, threads, guard=guard)
        crashed = {"per_backend": {}, "best": None, "failed": {"probe": alone}, "method": ""}
        out[name] = alone[name] if isinstance(alone, dict) else crashed
    return out


#: The lever probe's own process: the longest it may take (builds included) before it is stopped.
PROBE_TIMEOUT_S = 900.0
#: the key of a child's result that says it could not time (``MachineBusy``)
_BUSY = "machine_busy"


def _in_child(
    layer: ProbeLayer,
    levers: dict[str, dict[str, Any]],
    backends: Sequence[Backend],
    threads: int | None,
    target: Callable[..., None] | None = None,
    *,
    guard: Guard | None = None,
) -> dict[str, dict[str, Any]] | str:
    """``lever_speeds`` in a spawned process (``target``: ``_probe_child``); its result, or why the process
    gave none."""
    import tempfile
    from pathlib import Path

    import torch

    with tempfile.TemporaryDirectory(prefix="pareto-probe-") as folder:
        source = Path(folder) / "layer.pt"
        torch.save({"module": layer.module, "inputs": layer.inputs, "shape": layer.shape}, source)
        settings = None if guard is None else [guard.quiet_ms, guard.limit]
        return in_process_of_its_own(target or _probe_child, str(source), levers, list(backends), threads, settings)


def in_process_of_its_own(target: Callable[..., None], *args: Any) -> dict[str, Any] | str:
    """``target(*args, out)`` in a spawned process that writes its result to the JSON file ``out``; the
    result, or why the process gave none (a native crash, ``PROBE_TIMEOUT_S`` passed)."""
    import multiprocessing
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="pareto-child-") as folder:
        out = Path(folder) / "out.json"
        child = multiprocessing.get_context("spawn").Process(target=target, args=(*args, str(out)))
        child.start()
        try:
            child.join(PROBE_TIMEOUT_S)
            timed_out = child.is_alive()
        finally:  # timed out, or this process interrupted (Ctrl-C, SIGTERM): the child goes with it
            if child.is_alive():
                child.kill()
                child.join()
        if timed_out:
            return f"its process ran over {PROBE_TIMEOUT_S:.0f} s and was stopped"
        if child.exitcode != 0 or not out.exists():
            return f"its process ended with exit code {child.exitcode}"
        result = dict(json.loads(out.read_text()))
    if _BUSY in result:  # the child could not time: raised here as it was there
        raise (TimingLockStuck if result.get("stuck") else MachineBusy)(result[_BUSY])
    return result


def _probe_child(
    source: str,
    levers: dict[str, dict[str, Any]],
    backends: list[Backend],
    threads: int | None,
    guard: list[float | None] | None,
    target: str,
) -> None:
    """The lever probe's process: the layer from ``source``, the speeds to ``target`` (JSON)."""
    from pathlib import Path

    import torch

    saved = torch.load(source, weights_only=False)
    layer = ProbeLayer(saved["module"], saved["inputs"], saved["shape"])
    try:
        settings = None if guard is None else Guard(guard[0], float(guard[1] or 0.0))
        speeds = lever_speeds(layer, levers, backends, threads=threads, guard=settings)
    except MachineBusy as exc:  # the timing lock never let go: the parent raises it, no traceback here
        Path(target).write_text(json.dumps({_BUSY: str(exc), "stuck": isinstance(exc, TimingLockStuck)}))
        return
    Path(target).write_text(json.dumps(speeds))


def _speeds(name: str, p50: dict[tuple[str, Backend], float], failed: dict[str, str], method: str) -> dict[str, Any]:
    per_backend = {
        backend: {
            "lever_p50_ms": p50[(lever, backend)],
            "float_p50_ms": p50[("float32", backend)],
            "speedup": p50[("float32", backend)] / p50[(lever, backend)],
        }
        for lever, backend in p50
        if lever == name
    }
    best = max((v["speedup"] for v in per_backend.values()), default=None)
    return {"per_backend": per_backend, "best": best, "failed": failed, "method": method}


def _timed(task: Task, config: Config, threads: int | None) -> Any:
    from pareto.devices import timed_inputs
    from pareto.measure.latency import Timed

    served = apply(task.model, config, task, device="cpu", threads=threads)
    return Timed(served.module, timed_inputs(task, config.batch_size), label=config.describe(), ready=served.ready)


def _calls(reference: Any, threads: int | None) -> int:
    """Calls per model: ``PROBE_CALLS``, fewer where the float32 layer is slow (``PROBE_SECONDS`` a model)."""
    from pareto.measure.latency import RoundPlan, measure_interleaved

    plan = RoundPlan(samples=5, rounds=1, warmup=3)
    [first] = measure_interleaved([reference], device="cpu", plan=plan, threads=threads)
    per_call_s = max(first.summary.p50_ms, 1e-6) / 1000
    return max(PROBE_MIN_CALLS, min(PROBE_CALLS, int(PROBE_SECONDS / per_call_s)))


def check_key(kind: str, payload: dict[str, Any]) -> str:
    """The stored key of a check: what it was taken on (configuration, backends, layer)."""
    blob = json.dumps({"kind": kind, **payload}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def lever_sentence(name: str, speeds: dict[str, Any], facts: str | None, layer: str) -> str:
    """Why a lever leaves the space, in one sentence's clause."""
    per_backend = ", ".join(f"{v['speedup']:.2f}× on {backend}" for backend, v in sorted(speeds["per_backend"].items()))
    said = f"; {name} on this CPU: {facts}" if facts else ""
    return f"it ran the model's {layer} at {per_backend} the speed of float32 (medians in interleaved rounds{said})"


def steer_space(
    bench: Bench,
    study_id: int,
    techniques: Techniques,
    *,
    backends: Sequence[Backend],
    batch_size: int,
    keep: Sequence[str],
    notice: Callable[[str], None],
    task_ref: str,
) -> Techniques:
    """The space this study searches here: the techniques that pay (CPU levers, but those ``keep`` names:
    searched without a probe) and run on this model (every technique), each check read from the database
    or taken now and stored. ``task_ref`` names the task (``load_task``) for the checks that build in a
    process of their own."""
    kept = dict(techniques)
    if bench.device == "cpu":
        judged = {name: space for name, space in kept.items() if name not in keep}
        for name, checked in _pays(bench, study_id, judged, backends, batch_size).items():
            if not checked.ok:
                notice(f"Leaving out {name}: {checked.reason}; name it in search.keep to search it anyway.")
                kept.pop(name)
            elif checked.reason:
                notice(f"Keeping {name}: {checked.reason}.")
    for name, checked in _runs(bench, study_id, kept, backends, batch_size, task_ref).items():
        if not checked.ok:
            notice(f"Leaving out {name}: {checked.reason}.")
            kept.pop(name)
        elif learned := (checked.details or {}).get("leave"):
            notice(f"Pre-flight: {layers.said(tuple((str(t), str(x)) for t, x in learned))}")
    return kept


def _runs(
    bench: Bench, study_id: int, techniques: Techniques, backends: Sequence[Backend], batch_size: int, task_ref: str
) -> dict[str, Checked]:
    """The runs check of each technique: at the first point of its space and, when that does not run, at the
    last (a failure of some parameters only is the trials' to find, each one once). None is taken when
    the uncompressed model itself does not run: the baseline's pre-flight says why.

    In a search that compiles (the compile backend), the checks build in a process of their own: a
    technique whose build or compiled code crashes natively (as Inductor's cached code did, see
    ``isolated_lever_speeds``) then fails its check with that reason instead of ending the search, and
    the search's trials start from the process state they had before the checks existed."""
    if runs_alone(bench.task, Config(batch_size=batch_size), device=bench.device, threads=bench.threads)[0] != "runs":
        return {}
    model = model_signature(bench.task.model)
    plans = {name: _run_configs(name, space, backends, batch_size) for name, space in techniques.items()}
    keys = {name: check_key("runs", {"configurations": [c.to_dict() for c in configs], "model": model})
            for name, configs in plans.items()}  # fmt: skip
    stored = storage.technique_checks(bench.engine, study_id, bench.env_id, "runs")
    out = {name: _checked(stored[key]) for name, key in keys.items() if key in stored}
    todo = {name: configs for name, configs in plans.items() if name not in out}
    if not todo:
        return out
    if "compile" in backends or any(c.backend == "compile" for configs in todo.values() for c in configs):
        outcomes = _outcomes_apart(task_ref, bench.device, bench.threads, todo)
    else:
        outcomes = {name: _outcomes(bench.task, configs, bench.device, bench.threads) for name, configs in todo.items()}
    for name, configs in todo.items():
        out[name] = _save(bench, study_id, "runs", keys[name], _verdict(configs, outcomes[name]))
        learned = tuple((str(t), str(layer)) for t, layer in (out[name].details or {}).get("leave", []))
        layers.remember(bench.engine, study_id, bench.env_id, learned, "its pre-flight failed there")
    return out


def _run_configs(name: str, space: dict[str, Any], backends: Sequence[Backend], batch_size: int) -> list[Config]:
    """The technique alone at the first point of its space, then at the last (when it differs)."""
    backend = serving_backend(name, backends)
    points = [first_params(space), last_params(space)]
    return [
        Config(techniques=(get_technique(name, params),), batch_size=batch_size, backend=backend)
        for params in (points if points[0] != points[1] else points[:1])
    ]


def _outcomes_apart(
    task_ref: str, device: str, threads: int | None, todo: dict[str, list[Config]]
) -> dict[str, list[Outcome]]:
    """``_outcomes`` of every technique in one process of its own; when it dies, each technique in one of its
    own, and one whose process dies too fails with that reason."""
    plans = {name: [c.to_dict() for c in configs] for name, configs in todo.items()}
    found = in_process_of_its_own(_runs_child, task_ref, device, threads, plans)
    if isinstance(found, dict):
        return {name: [(str(o[0]), o[1], list(o[2])) for o in outcomes] for name, outcomes in found.items()}
    out = {}
    for name, configs in todo.items():
        alone = in_process_of_its_own(_runs_child, task_ref, device, threads, {name: plans[name]})
        if isinstance(alone, dict):
            out[name] = [(str(o[0]), o[1], list(o[2])) for o in alone[name]]
        else:
            out[name] = [("fails", f"{configs[0].describe()} could not be built: {alone}", [])]
    return out


def _verdict(configs: list[Config], outcomes: list[Outcome]) -> Checked:
    """The first of ``configs`` that runs keeps the technique; none: why, the first failure's reason first.
    The layers learned on the way are in its details (``"leave"``)."""
    name = configs[0].techniques[0].name
    learned = sorted({tuple(pair) for _, _, pairs in outcomes for pair in pairs})
    tried = {"configurations": [c.describe() for c in configs], **({"leave": learned} if learned else {})}
    if any(status == "runs" for status, _, _ in outcomes):
        return Checked(name, True, None, tried)
    failed = [why or "" for status, why, _ in outcomes if status == "fails"]
    if failed:
        return Checked(name, False, f"on its own it failed on this model ({failed[0].rstrip('.')})", tried)
    nothing = (outcomes[0][1] or "").rstrip(".")
    return Checked(name, False, f"it changes nothing on this model at either end of its space ({nothing})", tried)


def _outcomes(task: Task, configs: list[Config], device: str, threads: int | None) -> list[Outcome]:
    """``runs_alone`` of each of ``configs`` until one runs."""
    outcomes = []
    for config in configs:
        outcomes.append(runs_alone(task, config, device=device, threads=threads))
        if outcomes[-1][0] == "runs":
            break
    return outcomes


def _runs_child(
    task_ref: str, device: str, threads: int | None, plans: dict[str, list[dict[str, Any]]], out: str
) -> None:
    """The runs checks' own process: the task loaded again, each technique's ``_outcomes`` to ``out`` (JSON)."""
    from pathlib import Path

    from pareto.devices import on_device

    task = on_device(load_task(task_ref), device)
    found = {
        name: _outcomes(task, [Config.from_dict(c) for c in configs], device, threads)
        for name, configs in plans.items()
    }
    Path(out).write_text(json.dumps(found))


def model_signature(model: nn.Module) -> str:
    """What a check of a model depends on: its parameters' and buffers' names, shapes and dtypes, hashed
    (a model the user changed is checked again)."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return check_key("model", {"tensors": [[n, list(t.shape), str(t.dtype)] for n, t in tensors]})


def _pays(
    bench: Bench, study_id: int, techniques: Techniques, backends: Sequence[Backend], batch_size: int
) -> dict[str, Checked]:
    cpu_levers = levers()
    levers_here = {
        name: first_params(space)
        for name, space in techniques.items()
        if name in cpu_levers and set(backends) & set(registry()[name].backends)
    }
    if not levers_here:
        return {}
    layer = probe_layer(bench.task, batch_size)
    if layer is None:
        return {}
    model = model_signature(bench.task.model)
    keys = {
        name: check_key(
            "pays", {"lever": name, "params": p, "backends": list(backends), "layer": layer.shape, "model": model}
        )
        for name, p in levers_here.items()
    }
    stored = storage.technique_checks(bench.engine, study_id, bench.env_id, "pays")
    known = {name: _checked(stored[key]) for name, key in keys.items() if key in stored}
    todo = {name: p for name, p in levers_here.items() if name not in known}
    if todo:
        limit = bench.measure.contention_limit
        guard = Guard(bench.quiet_ms, limit) if limit is not None else None
        speeds = isolated_lever_speeds(layer, todo, backends, threads=bench.threads, guard=guard)
        for name, measured in speeds.items():
            best = measured["best"]
            if best is None and measured.get("busy"):  # never dropped on a noisy reading, nor stored
                known[name] = Checked(name, True, NOT_JUDGED, measured)
                continue
            ok = best is None or best >= PAYS_BELOW  # nothing timed: the runs check judges it on the model
            reason = None if ok else lever_sentence(name, measured, cpu_facts(name), layer.describe())
            known[name] = _save(bench, study_id, "pays", keys[name], Checked(name, ok, reason, measured))
    return known


#: Why a lever the machine stayed busy for is searched all the same.
NOT_JUDGED = (
    "the machine stayed busy while the lever probe timed it (its rounds discarded for contention), so the "
    "probe could not judge it; it is searched, and a later search probes it again"
)


def _checked(record: CheckRecord) -> Checked:
    return Checked(record.technique, record.ok, record.reason, record.details)


def _save(bench: Bench, study_id: int, kind: str, key: str, checked: Checked) -> Checked:
    """Store a check; the stored one (another process's, when it stored the same check first): two
    transactions, the second reading what the first, or another process's, stored."""
    record = CheckRecord(checked.technique, checked.ok, checked.reason, checked.details or {})
    storage.save_technique_check(bench.engine, study_id, bench.env_id, kind, key, record)
    return _checked(storage.technique_checks(bench.engine, study_id, bench.env_id, kind)[key])


def space_for_device(spec: SearchSpec, device: str, notice: Callable[[str], None]) -> SearchSpec:
    """On a GPU, a spec that does not name its techniques searches the GPU's levers
    (``pareto.spec.DEFAULT_CUDA_SPACE``): the CPU's default space has little that pays there."""
    unsaid = "space" not in spec.model_fields_set or "techniques" not in spec.space.model_fields_set
    if not (device.startswith("cuda") and unsaid):
        return spec

    techniques = copy.deepcopy(DEFAULT_CUDA_SPACE["techniques"])
    notice(f"On {device} the default space searches the GPU's levers: {', '.join(techniques)}.")
    space = Space.model_validate(
        {**spec.space.model_dump(mode="json", exclude={"techniques"}), "techniques": techniques}
    )
    # start points were checked against the CPU's default space: those outside the GPU's are left out,
    # so the spec workers validate again (``--workers``) holds only points of the space searched
    kept = []
    for k, point in enumerate(spec.search.start_with):
        problem = start_point_problem(point, space)
        if problem is None:
            kept.append(point)
        else:
            notice(f"Leaving out start point {k} on {device}: {problem}.")
    search = spec.search.model_copy(update={"start_with": kept})
    return spec.model_copy(update={"space": space, "search": search})


def available_techniques(
    spec: SearchSpec, device: str, task: Task, backends: tuple[Backend, ...] = ("eager",)
) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
    """The techniques of the spec's space that can run on one of ``backends`` on ``device`` for ``task``,
    and ``(name, why not)`` for each left out (one that runs on another backend's graph, in the default
    space, is left out without a word)."""
    usable, skipped = {}, []
    default_space = spec.space.techniques == Space().techniques
    for name, space in spec.space.techniques.items():
        probe = {p: (s.low if isinstance(s, Range) else s[0]) for p, s in space.items()}
        technique = get_technique(name, probe)
        if not set(backends) & set(technique.backends):
            # one that works on another backend's graph (ORT's quantizer) is in the default space for
            # that backend: left out without a word there; a PyTorch technique, or one the user's own
            # space names, left out is worth one
            if not technique.on_graph or not default_space:
                where = " or ".join(technique.backends)
                served = ", ".join(backends)
                skipped.append((name, f"it runs on the {where} backend; this search serves on {served}."))
            continue
        reason = technique_reason(technique, device, task)
        if reason is None:
            usable[name] = space
        else:
            skipped.append((name, reason))
    return usable, skipped
