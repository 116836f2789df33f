"""`pareto export`: the artifact loads in plain torch, without pareto, and computes what was measured."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cli
from pareto import Task
from pareto.compress import Config, Served, apply, registry
from pareto.errors import NoFeasibleConfiguration, NotFound, ParetoError, UsageError
from pareto.export.bundle import TECHNIQUE_NOTES, TORCH_EXPORT, TORCHSCRIPT, environment_differences, export
from pareto.measure.environment import fingerprint
from pareto.store import queries
from pareto.store.engine import open_engine, session_scope, upgrade
from pareto.store.models import Environment, Measurement, Study, Trial
from pareto.task import load_task
from tests.tiny_task import _data, make_task

ROOT = Path(__file__).resolve().parents[1]
TINY = "tests.tiny_task:make_task"
TRAINABLE = "tests.test_export:make_trainable_task"


def make_trainable_task() -> Task:
    """The tiny task with train_data, so that distillation and fine-tuning can run."""
    task = make_task()
    x, y = _data(256, seed=3)
    task.train_data = [(x[i : i + 64], y[i : i + 64]) for i in range(0, 256, 64)]
    return task


@dataclass(frozen=True)
class Row:
    """One stored trial: its configuration, accuracy and P99, and where it was measured."""

    number: int
    techniques: tuple[dict[str, Any], ...]
    batch_size: int = 8
    accuracy: float = 0.9
    p99_ms: float = 1.0
    state: str = "COMPLETE"
    elsewhere: bool = False


TINY_ROWS = [
    Row(0, ()),
    Row(1, ({"name": "int8_dynamic", "params": {}},), accuracy=0.91),
    Row(2, ({"name": "fp16", "params": {}},), batch_size=1),
    Row(3, ({"name": "prune_structured", "params": {"ratio": 0.5}},), accuracy=0.95),
    Row(4, ({"name": "prune_unstructured", "params": {"sparsity": 0.6}},)),
    Row(5, ({"name": "lowrank", "params": {"rank_ratio": 0.25}},)),
    Row(6, ({"name": "compile", "params": {"mode": "default"}},)),
    Row(7, ({"name": "prune_2_4", "params": {}},), elsewhere=True),
    Row(8, ({"name": "lowrank", "params": {"rank_ratio": 0.1}},), state="FAILED"),
    Row(9, ({"name": "int8_weight_only", "params": {}},)),
    Row(
        10,
        (
            {"name": "prune_structured", "params": {"ratio": 0.25}},
            {"name": "lowrank", "params": {"rank_ratio": 0.5}},
            {"name": "int8_dynamic", "params": {}},
        ),
        elsewhere=True,
    ),
]
TRAINABLE_ROWS = [
    Row(0, ()),
    Row(1, ({"name": "distill", "params": {"width_ratio": 0.25, "steps": 20, "lr": 0.01}},)),
]


def _metrics(row: Row) -> dict[str, Any]:
    p99 = row.p99_ms
    return {
        "accuracy": row.accuracy,
        "batch_size": row.batch_size,
        "latency_mean_ms": p99 / 2,
        "latency_p50_ms": p99 / 2,
        "latency_p90_ms": p99 * 0.8,
        "latency_p99_ms": p99,
        "latency_p99_lower_ms": p99 * 0.9,
        "latency_p99_upper_ms": p99 * 1.1,
        "latency_p999_ms": p99 * 1.2,
        "p99_p50_ratio": 2.0,
        "samples": 680,
        "warmup": 5,
        "confidence": 0.99,
        "method": "perf_counter_ns per call, 20 rounds x 34 calls (a row written by tests/test_export.py)",
        "throughput_per_s": row.batch_size / (p99 / 2000),
        "params_bytes": 1000,
        "theoretical_bytes": 1000,
        "compression_ratio": 1.0,
        "rounds": 20,
        "discarded_rounds": 0,
    }


def _store(url: str) -> None:
    """Two studies whose trials are rows written here: no search, no timing."""
    from pareto.compress import Config

    engine = open_engine(url)
    upgrade(engine)
    earlier = datetime.now(timezone.utc) - timedelta(days=1)
    with session_scope(engine) as session:
        here = queries.environment_id(session, fingerprint("cpu", torch.get_num_threads()))
        far = Environment(
            key="f" * 16,
            device="cuda:0",
            device_name="Elsewhere GPU",
            driver="CUDA 12.8",
            torch_version="2.4.0",
            cpu_model="Elsewhere CPU",
            threads=64,
            hostname="far",
            details={},
        )
        session.add(far)
        session.flush()
        for name, task, rows in (("tiny", TINY, TINY_ROWS), ("trainable", TRAINABLE, TRAINABLE_ROWS)):
            study = Study(name=name, task=task, spec={"slo": {"p99": 1000.0}})
            session.add(study)
            session.flush()
            measured = []
            for row in rows:
                config = Config.from_dict({"batch_size": row.batch_size, "techniques": list(row.techniques)})
                env_id = far.id if row.elsewhere else here
                trial = Trial(
                    study_id=study.id,
                    optuna_number=row.number,
                    state=row.state,
                    config=config.to_dict(),
                    config_key=config.key(),
                    description=config.describe(),
                    is_baseline=config.is_baseline,
                    batch_size=row.batch_size,
                    environment_id=env_id,
                    error="the test says so" if row.state == "FAILED" else None,
                )
                session.add(trial)
                session.flush()
                if row.state == "COMPLETE":
                    measured.append((row, trial.id, env_id))
            # the other environment's rows first, a day earlier: this machine's is the study's latest environment
            for row, trial_id, env_id in sorted(measured, key=lambda m: not m[0].elsewhere):
                when = {"created_at": earlier} if row.elsewhere else {}
                session.add(
                    Measurement(trial_id=trial_id, environment_id=env_id, kind="search", **_metrics(row), **when)
                )
                session.flush()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('export-db')}/pareto.db"
    _store(url)
    return url


def _dump(url: str) -> list[str]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return list(conn.iterdump())


# --- one export per technique family, checked in a process that imports torch and not pareto --------

FAMILIES = {
    # family: (study, trial, format)
    "quantization (int8_dynamic)": ("tiny", 1, TORCHSCRIPT),
    "cast (fp16, batch 1)": ("tiny", 2, TORCH_EXPORT),
    "structured pruning": ("tiny", 3, TORCH_EXPORT),
    "unstructured pruning": ("tiny", 4, TORCH_EXPORT),
    "low-rank": ("tiny", 5, TORCH_EXPORT),
    "compile": ("tiny", 6, TORCH_EXPORT),
    "distillation": ("trainable", 1, TORCH_EXPORT),
}
#: Exported through the command, with --best: the most accurate trial measured here is trial 3.
BY_COMMAND = "structured pruning"

#: Runs with -I (no PYTHONPATH, no current folder on sys.path): each manifest's own load line, then the batch.
_ISOLATED = r"""
import json, os, sys
import torch
results, jobs = {}, json.loads(sys.argv[1])
for family, (folder, inputs) in jobs.items():
    os.chdir(folder)
    manifest = json.load(open("manifest.json"))
    scope = {}
    exec(manifest["artifact"]["load"], scope)
    with torch.inference_mode():
        results[family] = scope["model"](*torch.load(inputs, weights_only=True))
torch.save(results, sys.argv[2])
print(json.dumps(sorted(n for n in sys.modules if n == "pareto" or n.startswith("pareto."))))
"""


@dataclass
class Exported:
    manifests: dict[str, dict[str, Any]]
    folders: dict[str, Path]
    outputs: dict[str, Any]
    pareto_modules: list[str]
    command: tuple[int, str, str]  # exit code, stdout, stderr of the export run through the command


@pytest.fixture(scope="module")
def exported(db: str, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    root = tmp_path_factory.mktemp("exports")
    manifests, folders, jobs = {}, {}, {}
    command = (-1, "", "")
    before = _dump(db)
    for i, (family, (study, trial, _)) in enumerate(FAMILIES.items()):
        folder = root / f"family-{i}"
        if family == BY_COMMAND:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cli.main(
                    ["export", "--study", study, "--best", "--slo-p99", "1s", "-o", str(folder), "--db", db]
                )
            command = (code, out.getvalue(), err.getvalue())
            assert code == 0, command
        else:
            # the command loads the artifact back in a fresh process; the load lines below do that for these
            export(out_dir=folder, study=study, trial=trial, db=db, fresh_process=False)
        manifests[family], folders[family] = json.loads((folder / "manifest.json").read_text()), folder
        inputs = root / f"inputs-{i}.pt"
        torch.save(_inputs(load_task(TINY), manifests[family]["config"]["batch_size"]), inputs)
        jobs[family] = (str(folder), str(inputs))
    assert _dump(db) == before  # an export only reads the database
    out = root / "outputs.pt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", _ISOLATED, json.dumps(jobs), str(out)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    modules = json.loads(proc.stdout.splitlines()[-1])
    return Exported(manifests, folders, torch.load(out, weights_only=True), modules, command)


def _inputs(task: Task, batch_size: int) -> tuple[Any, ...]:
    x = task.example_input(batch_size)
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _reference(study: str, config: dict[str, Any]) -> tuple[nn.Module, torch.Tensor]:
    """The measured model, rebuilt through pareto's own pipeline, and its outputs on the measured batch."""
    task = load_task(TINY if study == "tiny" else TRAINABLE)
    model = apply(task.model, Config.from_dict(config), task, device="cpu").module
    with torch.inference_mode():
        return model, model(*_inputs(task, config["batch_size"]))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_artifact_computes_what_was_measured_without_pareto(exported: Exported, family: str) -> None:
    study, trial, fmt = FAMILIES[family]
    manifest = exported.manifests[family]
    assert manifest["trial"] == trial and manifest["study"] == study
    assert manifest["artifact"]["format"] == fmt
    assert exported.pareto_modules == []  # the load lines ran in a process that never imported pareto
    _, expected = _reference(study, manifest["config"])
    compiled = any(t["name"] == "compile" for t in manifest["config"]["techniques"])
    # the artifact is the eager graph; the load line compiles it as the measurement did
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if compiled else {"rtol": 0.0, "atol": 0.0}
    torch.testing.assert_close(exported.outputs[family], expected, **tolerance)
    check = manifest["reload_check"]
    assert check["passed"] and check["max_abs_diff"] <= check["atol"] + check["rtol"] * expected.abs().max().item()
    assert check["fresh_process"] is (family == BY_COMMAND)
    assert check["pareto_imported"] == ([] if family == BY_COMMAND else None)
    files = manifest["files"]
    assert set(files) == {manifest["artifact"]["file"]}
    for name, record in files.items():
        data = (exported.folders[family] / name).read_bytes()
        assert record["sha256"] == hashlib.sha256(data).hexdigest() and record["bytes"] == len(data)
    assert sorted(p.name for p in exported.folders[family].iterdir()) == sorted([*files, "manifest.json"])


def _weights(folder: Path, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    path = folder / manifest["artifact"]["file"]
    if manifest["artifact"]["format"] == TORCH_EXPORT:
        return dict(torch.export.load(path).state_dict)
    return dict(torch.jit.load(str(path)).state_dict())


def test_structured_pruning_ships_smaller_layers(exported: Exported) -> None:
    base = load_task(TINY).model
    family = "structured pruning"
    shapes = [
        w.shape for k, w in _weights(exported.folders[family], exported.manifests[family]).items() if "weight" in k
    ]
    assert [s[0] for s in shapes] == [32, 32, 4] and sum(s.numel() for s in shapes) < sum(
        p.numel() for n, p in base.named_parameters() if "weight" in n
    )


def test_unstructured_pruning_ships_dense_zeros(exported: Exported) -> None:
    family = "unstructured pruning"
    weights = [w for k, w in _weights(exported.folders[family], exported.manifests[family]).items() if "weight" in k]
    zeros = sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    assert zeros == pytest.approx(0.6, abs=0.01) and not any(w.is_sparse for w in weights)


def test_lowrank_ships_factor_pairs_and_casts_ship_half_weights(exported: Exported) -> None:
    lowrank = _weights(exported.folders["low-rank"], exported.manifests["low-rank"])
    assert len([k for k in lowrank if k.endswith("weight")]) > 3  # a factorized layer is two
    family = "cast (fp16, batch 1)"
    weights = _weights(exported.folders[family], exported.manifests[family])
    assert {w.dtype for w in weights.values()} == {torch.float16}
    manifest = exported.manifests[family]
    assert manifest["outputs"][0]["dtype"] == "float32"  # the graph casts back
    # exported at batch 1, with a batch dimension that is not fixed to 1
    assert manifest["inputs"][0]["shape"] == [1, 16] and manifest["artifact"]["dynamic_batch"] is True


def test_int8_ships_torchscript_with_packed_int8_weights(exported: Exported) -> None:
    family = "quantization (int8_dynamic)"
    manifest = exported.manifests[family]
    assert "torch.export cannot trace" in manifest["artifact"]["why"]
    module = torch.jit.load(str(exported.folders[family] / manifest["artifact"]["file"]))
    assert "quantized::linear_dynamic" in module.inlined_graph.__str__()


def test_compile_ships_the_eager_graph_and_the_mode(exported: Exported) -> None:
    manifest = exported.manifests["compile"]
    assert manifest["serve"]["torch_compile"]["mode"] == "default"
    assert manifest["artifact"]["load"].startswith("import torch; model = torch.compile(torch.export.load(")


def test_distillation_ships_the_student(exported: Exported) -> None:
    weights = _weights(exported.folders["distillation"], exported.manifests["distillation"])
    assert [w.shape[0] for k, w in weights.items() if k.endswith("weight")] == [16, 16, 4]


def test_the_manifest_says_how_it_was_measured_and_how_to_serve(exported: Exported) -> None:
    manifest = exported.manifests["structured pruning"]
    assert manifest["metrics"]["method"].startswith("perf_counter_ns per call")
    assert {"samples", "confidence", "rounds", "latency_p99_upper_ms"} <= set(manifest["metrics"])
    assert manifest["description"] == "prune_structured(ratio=0.5) @ batch 8"
    assert manifest["inputs"] == [{"shape": [8, 16], "dtype": "float32", "device": "cpu", "batch_dim": 0}]
    assert manifest["serve"]["batch_size"] == 8 and manifest["serve"]["torch_compile"] is None
    assert manifest["artifact"]["dynamic_batch"] is True and manifest["reload_check"]["other_batch"]["matches"]
    assert manifest["environment_differs"] is False and manifest["environment_differences"] == []
    assert manifest["measured_environment"]["key"] == manifest["export_environment"]["key"]
    assert manifest["pareto_version"] and manifest["techniques"][0]["in_the_artifact"]


def test_every_technique_says_what_it_becomes_in_the_artifact() -> None:
    assert set(TECHNIQUE_NOTES) == set(registry())


# --- the command ----------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["export", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_best_exports_the_pick_and_prints_where(exported: Exported) -> None:
    code, out, err = exported.command
    folder = exported.folders[BY_COMMAND]
    assert code == 0 and err == ""  # measured here, with this thread count: no warning
    assert f"artifact   {folder / 'model.pt2'}" in out and f"manifest   {folder / 'manifest.json'}" in out
    assert "format     torch.export" in out and "max abs difference 0 " in out
    manifest = exported.manifests[BY_COMMAND]
    assert manifest["trial"] == 3 and manifest["chosen_by"]["by"] == "best"  # the most accurate one measured here
    assert manifest["chosen_by"]["slo"]["feasible"] is True


def test_another_environment_is_warned_about_and_force_replaces_an_earlier_export(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "far"
    folder.mkdir()
    (folder / "model.pt2").write_text("an earlier export's artifact")
    (folder / "manifest.json").write_text(json.dumps({"files": {"model.pt2": {}}}))
    (folder / "mine.txt").write_text("not an export's")
    code, _, err = run(capsys, "--study", "tiny", "--trial", "10", "-o", str(folder), "--db", db)
    assert code == 2 and "not empty" in one_line(err) and "--force" in one_line(err)
    code, out, err = run(capsys, "--study", "tiny", "--trial", "10", "-o", str(folder), "--db", db, "--json", "--force")
    assert code == 0, err
    warning = one_line(err)
    assert warning.startswith("Warning: trial 10 was measured in another environment")
    assert "torch_version 2.4.0 then" in warning and "threads 64 then" in warning
    manifest = json.loads(out)
    assert manifest == json.loads((folder / "manifest.json").read_text())
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "mine.txt", "model.torchscript.pt"]
    assert manifest["environment_differs"] is True
    assert {d["field"] for d in manifest["environment_differences"]} >= {"device", "torch_version", "threads"}
    assert manifest["artifact"]["format"] == TORCHSCRIPT  # structured + low-rank + int8: torch.ao's int8 decides
    _, expected = _reference("tiny", manifest["config"])
    loaded = torch.jit.load(str(folder / "model.torchscript.pt"))
    inputs = _inputs(load_task(TINY), 8)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(*inputs), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("args", "code", "phrase"),
    [
        (["--study", "nosuch", "--trial", "0"], 2, "No study named 'nosuch'"),
        (["--study", "tiny", "--trial", "99"], 2, "has no trial 99"),
        (["--study", "tiny", "--trial", "8"], 2, "is FAILED (the test says so)"),
        (["--study", "tiny"], 2, "exactly one of --trial N and --best"),
        (["--study", "tiny", "--trial", "1", "--best"], 2, "exactly one of --trial N and --best"),
        (["--study", "tiny", "--trial", "1", "--slo-p99", "1ms"], 2, "with --trial drop them"),
        (["--study", "tiny", "--trial", "1", "--environment", "all"], 2, "name its environment"),
        (["--study", "tiny", "--trial", "1", "--environment", "nosuch"], 2, "matches none of study 'tiny'"),
        (["--study", "tiny", "--trial", "3", "--environment", "fff"], 2, "has no measurement in environment"),
        (["--study", "tiny", "--best", "--slo-p99", "1ns"], 1, "the closest is trial"),
        (["--study", "tiny", "--trial", "7"], 2, "on cpu: prune_2_4: 2:4 sparse kernels need"),
    ],
)
def test_bad_input_is_one_sentence_and_writes_nothing(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, phrase: str
) -> None:
    before = _dump(db)
    folder = tmp_path / "out"
    got, _, err = run(capsys, *args, "-o", str(folder), "--db", db)
    assert got == code
    assert phrase in one_line(err)
    assert not folder.exists()
    assert _dump(db) == before


def test_torchao_techniques_are_refused_without_torchao(db: str, tmp_path: Path) -> None:
    from pareto.compress import get_technique

    reason = get_technique("int8_weight_only").available("cpu")
    if reason is None:
        pytest.skip("torchao is installed here")
    with pytest.raises(UsageError, match="cannot be exported here, on cpu: int8_weight_only: needs torchao"):
        export(out_dir=tmp_path / "ao", study="tiny", trial=9, db=db)
    assert not (tmp_path / "ao").exists()


def test_an_unwritable_folder_is_one_sentence(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    regular = tmp_path / "file.txt"
    regular.write_text("x")
    code, _, err = run(capsys, "--study", "tiny", "--trial", "0", "-o", str(regular / "out"), "--db", db)
    assert code == 2 and "Cannot create output folder" in one_line(err)
    code, _, err = run(capsys, "--study", "tiny", "--trial", "0", "-o", str(regular), "--db", db)
    assert code == 2 and one_line(err)


def test_library_errors_are_typed(db: str, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        export(out_dir=tmp_path / "a", study="tiny", trial=99, db=db)
    with pytest.raises(NoFeasibleConfiguration):
        export(out_dir=tmp_path / "a", study="tiny", best=True, slo_p99="1ns", db=db)


def test_environment_differences_compare_what_changes_latency() -> None:
    here = {
        "device": "cpu",
        "device_name": "X",
        "driver": None,
        "cpu_model": "X",
        "torch_version": "2.13",
        "threads": 2,
    }
    assert environment_differences(dict(here, hostname="a"), dict(here, hostname="b")) == []
    diff = environment_differences(dict(here, threads=1), here)
    assert diff == [{"field": "threads", "measured": 1, "here": 2}]


def test_an_artifact_whose_outputs_differ_is_not_kept(db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pareto.export.bundle as module

    serialize = module.serialize

    def uncompressed(selection: Any, served: Served, task: Task, *rest: Any) -> Any:
        wrong = dataclasses.replace(served, module=task.model)  # the wrong model: the check must catch it
        return serialize(selection, wrong, task, *rest)

    monkeypatch.setattr(module, "serialize", uncompressed)
    with pytest.raises(ParetoError, match="differ from the compressed model's"):
        export(out_dir=tmp_path / "x", study="tiny", trial=3, db=db, fresh_process=False)
    assert not (tmp_path / "x").exists()
