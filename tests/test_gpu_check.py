"""The GPU check (benchmarks/gpu_check.sh, benchmarks/gpu_check.py) and its levers table
(benchmarks/gpu_levers.py), on the CPU: the deadline, an outer kill, the table's reading of the
search's confirmation, and rows that fail without losing the others."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STEPS = ["env", "techniques", "search", "best", "levers", "measure", "roofline", "export", "tests"]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the table reads what the commands print --------------------------------------------------------------

PICK = {
    "study": "demo",
    "trial": 1,
    "config": {"batch_size": 256, "techniques": [{"name": "bf16", "params": {}}], "backend": "eager"},
    "metrics": {"latency_p99_ms": 0.7, "speedup_p99": 14.3, "accuracy": 0.94},
    "slo": {},
    "environment": {"key": "abc"},
}
CONFIRMATION = {
    "study": "demo",
    "run": 2,
    "runs": [2],
    "environment": {"key": "abc"},
    "guard": "0 rounds discarded for contention",
    "note": None,
    "items": [{"trial": 1, "description": "bf16 @ batch 256", "is_baseline": False, "busy_reason": None}],
    "reference": None,
}


def _search_output(best: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "study": "demo",
        "trials_run": 3,
        "measured": 3,
        "repeats": 0,
        "busy_trials": 0,
        "rejected_early": 0,
        "best": best,
        "no_best_reason": None,
        "confirmation": CONFIRMATION,
    }


def _write_step(out: Path, name: str, output: Any, status: str = "pass") -> None:
    record = {"name": name, "status": status, "exit_code": 0, "seconds": 3, "limit_s": 60, "output": output}
    (out / f"{name}.json").write_text(json.dumps({**record, "stderr_tail": []}))


def test_the_table_says_confirmed_from_the_top_level_confirmation_of_best_json(tmp_path: Path) -> None:
    """``pareto best --json`` carries the pick's confirmation as a top-level key; the search's own
    ``best`` may lack it (the pick of a search that ran before the confirmation)."""
    check = _load("gpu_check")
    (tmp_path / "plan.txt").write_text("search\nbest\n")
    _write_step(tmp_path, "search", _search_output({**PICK, "confirmation": None}))
    _write_step(tmp_path, "best", {**PICK, "confirmation": {"rounds": 20, "discarded_rounds": 0, "run": 2}})
    rows = {row[0]: row for row in check.table_rows(tmp_path)}
    assert rows["search"][3].endswith("(confirmed)"), rows["search"]
    assert rows["best"][3].endswith("(confirmed)"), rows["best"]
    assert "bf16 @ batch 256" in rows["best"][3]  # the pick described, not left blank
    printed = check.table(tmp_path)
    assert "| best | pass | 3 s |" in printed and (tmp_path / "table.md").read_text() == printed


def test_a_pick_without_a_confirmation_says_so(tmp_path: Path) -> None:
    check = _load("gpu_check")
    line = check.pick_detail({**PICK, "confirmation": None}, {**_search_output(None), "confirmation": None})
    assert line.endswith("(not confirmed (no confirmation ran))")


def test_the_export_detail_reads_the_manifest(tmp_path: Path) -> None:
    check = _load("gpu_check")
    (tmp_path / "plan.txt").write_text("export\n")
    manifest = {"artifact": {"format": "torch.export"}, "reload_check": {"passed": True, "max_abs_diff": 0.0}}
    _write_step(tmp_path, "export", manifest)
    [(_, result, _, detail)] = check.table_rows(tmp_path)
    assert (result, detail) == ("pass", "torch.export, reload check passed, max abs diff 0.0")


# --- gpu_levers: one row that fails does not lose the table ----------------------------------------------------


class _Failing(nn.Module):
    """The model, failing from its ``after``-th call on, or on any batch but ``batch``."""

    def __init__(self, model: nn.Module, *, after: int | None = None, batch: int | None = None) -> None:
        super().__init__()
        self.inner, self.after, self.batch, self.calls = model, after, batch, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.after is not None and self.calls >= self.after:
            raise RuntimeError("replay broke")
        if self.batch is not None and x.shape[0] != self.batch:
            raise RuntimeError(f"only batch {self.batch}")
        return self.inner(x)


@pytest.fixture(autouse=True)
def _own_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Timing locks of this test's own: other pareto processes timing on this host do not hold it up."""
    monkeypatch.setenv("PARETO_LOCK_DIR", str(tmp_path / "locks"))


def _levers_args(out: Path, tasks: str = "tests.tiny_task:make_task") -> list[str]:
    return [
        *("--tasks", tasks, "--device", "cpu", "--samples", "12", "--rounds", "2", "--warmup", "1"),
        *("--no-guard", "--out", str(out)),
    ]


def test_levers_keep_the_rows_that_built_when_others_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose build fails, one that fails while timed and one whose evaluation fails keep their
    reasons; the baseline and bf16 are still timed and evaluated, and the JSON is written."""
    from pareto.compress.base import registry

    levers = _load("gpu_levers")
    techniques = registry()

    def broken(self: Any, model: nn.Module, task: Any) -> nn.Module:
        raise RuntimeError("no kernel for this")

    def replay_breaks(self: Any, model: nn.Module, task: Any) -> nn.Module:
        return _Failing(model, after=4)

    def evaluation_breaks(self: Any, model: nn.Module, task: Any) -> nn.Module:
        return _Failing(model, batch=8)

    monkeypatch.setattr(techniques["fp16"], "apply", broken)
    monkeypatch.setattr(techniques["prune_unstructured"], "apply", replay_breaks)
    monkeypatch.setattr(techniques["lowrank"], "apply", evaluation_breaks)
    rows = [(levers.BASELINE, []), ("bf16", ["bf16"]), ("fp16", ["fp16"]), ("cuda graphs", ["cuda_graphs"])]
    rows += [("pruned", ["prune_unstructured:sparsity=0.5"]), ("low-rank", ["lowrank:rank_ratio=0.5"])]
    monkeypatch.setattr(levers, "LEVERS", rows)
    out = tmp_path / "levers.json"
    assert levers.main(_levers_args(out)) == 1  # a row failed
    [task] = json.loads(out.read_text())
    got = {row["label"]: row for row in task["rows"]}
    assert [row["label"] for row in task["rows"]] == [label for label, _ in rows]
    assert got["fp16"]["failed"].endswith("RuntimeError: no kernel for this") and "p99_ms" not in got["fp16"]
    assert got["cuda graphs"]["skipped"].startswith("cuda_graphs:")
    assert got["pruned"]["failed"] == "timing: RuntimeError: replay broke"
    assert got["low-rank"]["failed"] == "accuracy: RuntimeError: only batch 8" and got["low-rank"]["p99_ms"] > 0
    for label in (levers.BASELINE, "bf16"):
        assert "failed" not in got[label] and got[label]["accuracy"] > 0.5
        assert got[label]["p99_ms"] > 0 and got[label]["baseline_p99_ms"] > 0
        assert got[label]["timed"].startswith("alone beside the baseline (the joint run failed: RuntimeError")


def test_levers_write_each_task_as_it_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task that cannot run keeps its reason; the task before it keeps its rows."""
    levers = _load("gpu_levers")
    monkeypatch.setattr(levers, "LEVERS", [(levers.BASELINE, []), ("bf16", ["bf16"])])
    out = tmp_path / "levers.json"
    assert levers.main(_levers_args(out, "tests.tiny_task:make_task,tests.tiny_task:no_such_factory")) == 1
    first, second = json.loads(out.read_text())
    assert [row["timed"] for row in first["rows"]] == ["together", "together"]
    assert second["rows"] == [] and "no_such_factory" in second["error"]


def test_levers_stopped_while_timing_keep_what_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed while timing: the JSON already holds which rows built (pending) and which failed, and the
    check's table reads it."""
    from pareto.compress.base import registry

    levers = _load("gpu_levers")

    def broken(self: Any, model: nn.Module, task: Any) -> nn.Module:
        raise RuntimeError("no kernel for this")

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(registry()["fp16"], "apply", broken)
    monkeypatch.setattr(levers, "LEVERS", [(levers.BASELINE, []), ("fp16", ["fp16"])])
    monkeypatch.setattr(levers, "time_rows", killed)
    out = tmp_path / "levers.json"
    with pytest.raises(KeyboardInterrupt):
        levers.main(_levers_args(out))
    [task] = json.loads(out.read_text())
    assert task["complete"] is False
    baseline, fp16 = task["rows"]
    assert "pending" in baseline and "TechniqueError" in fp16["failed"]
    [(_, result, detail)] = _load("gpu_check").lever_lines("levers", [task])
    assert result == "FAIL" and f"built, not timed (the run stopped): {levers.BASELINE}" in detail


# --- the script: a deadline, and a kill from outside, still print the table --------------------------------------


def _fake_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for python that starts a child and waits for it: what a step's process tree looks like."""
    pids = tmp_path / "pids"
    fake = tmp_path / "fake-python"
    fake.write_text(f'#!/bin/sh\nsleep 300 &\necho $! >> "{pids}"\nwait\n')
    fake.chmod(0o755)
    return fake, pids


def _start(tmp_path: Path, deadline: int) -> tuple[subprocess.Popen[str], Path]:
    fake, pids = _fake_python(tmp_path)
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "PY": str(fake),
        "CHECK_PY": sys.executable,
        "DEVICE": "cpu",
        "DEADLINE": str(deadline),
        "MIN_STEP": "2",
    }
    process = subprocess.Popen(
        ["bash", str(SCRIPT)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return process, pids


def _finish(process: subprocess.Popen[str], timeout: float) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return output


def _alive(pids: Path) -> list[int]:
    """The processes in ``pids`` still running after a few seconds' grace (a zombie is not running)."""
    for _ in range(50):
        alive = [pid for pid in map(int, pids.read_text().split()) if _running(pid)]
        if not alive:
            break
        time.sleep(0.1)
    return alive


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _table(output: str) -> dict[str, str]:
    rows = [line.split(" | ") for line in output.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0].lstrip("| "): cells[1] for cells in rows[1:]}


def test_the_deadline_stops_the_step_and_its_children_and_prints_the_table(tmp_path: Path) -> None:
    start = time.monotonic()
    process, pids = _start(tmp_path, deadline=14)  # 10 s kept for the table: the first step gets 4 s
    output = _finish(process, timeout=40)
    took = time.monotonic() - start
    assert process.returncode == 1, output  # not every step passed
    assert took < 14 + 3, output
    table = _table(output)
    assert table["env"] == "timeout (4 s)"
    assert [table[name] for name in STEPS[1:]] == ["skipped (deadline)"] * 8
    assert json.loads((tmp_path / "out" / "env.json").read_text())["status"] == "timeout"
    assert json.loads((tmp_path / "out" / "tests.json").read_text())["status"] == "skipped"
    assert (tmp_path / "out" / "table.md").read_text() in output
    assert _alive(pids) == []  # the step's child went with it


def test_a_kill_from_outside_stops_the_step_and_prints_the_table(tmp_path: Path) -> None:
    process, pids = _start(tmp_path, deadline=300)
    for _ in range(100):  # until the first step's child is running
        if pids.exists() and pids.read_text().strip():
            break
        time.sleep(0.1)
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output = _finish(process, timeout=30)
    assert process.returncode == 143, output
    assert time.monotonic() - start < 10, output
    table = _table(output)
    assert table["env"] == "stopped (signal)"
    assert [table[name] for name in STEPS[1:]] == ["not reached"] * 8
    assert _alive(pids) == []
