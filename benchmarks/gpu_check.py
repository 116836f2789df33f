"""The GPU check's bookkeeping (``benchmarks/gpu_check.sh`` calls it): the environment's facts, one
JSON file per step as it finishes, and the table of what finished.

    python benchmarks/gpu_check.py env --device cuda           # prints the environment's facts as JSON
    python benchmarks/gpu_check.py record OUT NAME STATUS EXIT SECONDS LIMIT [JSON_FILE]
    python benchmarks/gpu_check.py table OUT                   # prints the table, saves OUT/table.md

``record`` writes ``OUT/NAME.json``: the step's name, status (pass, FAIL, timeout, skipped, stopped),
exit code, seconds, time limit, the JSON it printed (``OUT/NAME.out``, or ``JSON_FILE`` where the
step writes its JSON to a file) and the last lines of its standard error. ``table`` reads the steps
planned (``OUT/plan.txt``, one name a line) and the records; a planned step without a record is
listed as not reached; it exits 1 unless every planned step passed. Only the standard library is
imported, except by ``env``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

#: lines of a step's standard error kept in its record
ERR_LINES = 20


def environment(device: str) -> dict[str, Any]:
    """torch and CUDA versions, the device's name and compute capability, TF32 settings, the driver."""
    import platform

    import torch

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "device": device,
        "cpu_threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }
    try:
        import torchao

        facts["torchao"] = torchao.__version__
    except ImportError:
        facts["torchao"] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        facts["device_name"] = torch.cuda.get_device_name(index)
        facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
        facts["memory_gib"] = round(torch.cuda.get_device_properties(index).total_memory / 2**30, 1)
        facts["driver"] = _driver()
    else:
        facts["device_name"] = platform.processor() or platform.machine()
        facts["capability"] = None
        facts["driver"] = None
    return facts


def _driver() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, or None where it cannot be read."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when it is missing, empty or not JSON."""
    try:
        return json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None


def record(out: Path, name: str, status: str, code: int, seconds: int, limit: int, json_file: str = "") -> None:
    """Write ``out/NAME.json`` for a step that finished, timed out or was skipped."""
    err = out / f"{name}.err"
    tail = err.read_text(errors="replace").splitlines()[-ERR_LINES:] if err.exists() else []
    data = {
        "name": name,
        "status": status,
        "exit_code": code,
        "seconds": seconds,
        "limit_s": limit,
        "output": read_json(Path(json_file) if json_file else out / f"{name}.out"),
        "stderr_tail": tail,
    }
    path = out / f"{name}.json"
    path.with_suffix(".json.tmp").write_text(json.dumps(data, indent=1, default=str))
    path.with_suffix(".json.tmp").replace(path)


def confirmation_word(pick: dict[str, Any] | None, search: dict[str, Any] | None) -> str:
    """The word "confirmed" when the pick's metrics come from a confirmation: ``confirmation`` is a top-level
    key of the pick (``pareto best --json``, or ``best`` in the search's JSON); else why not."""
    if pick and pick.get("confirmation"):
        return "confirmed"
    run = (search or {}).get("confirmation")
    if not run:
        return "not confirmed (no confirmation ran)"
    item = next((i for i in run.get("items", []) if pick and i.get("trial") == pick.get("trial")), None)
    if item and item.get("busy_reason"):
        return f"not confirmed ({item['busy_reason']})"
    return f"not confirmed ({run.get('note') or run.get('guard') or 'the pick was not among those confirmed'})"


def pick_detail(pick: dict[str, Any] | None, search: dict[str, Any] | None) -> str:
    """The pick in one line: its trial, what it is, its P99, speedup and accuracy, and whether it was confirmed."""
    if not pick:
        reason = (search or {}).get("no_best_reason") or "none"
        return f"no pick: {reason}"
    m = pick.get("metrics") or {}
    items = ((search or {}).get("confirmation") or {}).get("items", [])
    described = next((i["description"] for i in items if i.get("trial") == pick.get("trial")), None)
    what = described or describe_config(pick.get("config") or {})
    return (
        f"pick trial {pick.get('trial')} {what}: p99 {m.get('latency_p99_ms', 0):.3f} ms, "
        f"{m.get('speedup_p99', 0):.2f}x p99, accuracy {m.get('accuracy', 0):.4f} "
        f"({confirmation_word(pick, search)})"
    )


def describe_config(config: dict[str, Any]) -> str:
    """``name(key=value) + … @ batch N`` from a stored configuration."""
    parts = []
    for t in config.get("techniques", []):
        params = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["params"].items())
        parts.append(f"{t['name']}({params})" if params else t["name"])
    backend = config.get("backend", "eager")
    text = " + ".join(parts) or "baseline"
    return f"{text}{'' if backend == 'eager' else f' on {backend}'} @ batch {config.get('batch_size')}"


def search_detail(data: dict[str, Any], pick: dict[str, Any] | None) -> str:
    """The search in one line: what it measured and its pick (``pareto best``'s when it ran)."""
    tried = data["trials_run"] - data["repeats"] - data["busy_trials"]
    return (
        f"{data['measured']} of {tried} new configurations measured, {data['rejected_early']} rejected early; "
        + pick_detail(pick or data.get("best"), data)
    )


def lever_lines(name: str, data: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(row name, result, detail) per task of a ``gpu_levers.py`` JSON, or per technique for ``measure``."""
    lines = []
    for task in data:
        label = f"{name} {task['task']}@{task.get('batch_size')}"
        if "error" in task:
            lines.append((label, "FAIL", task["error"]))
            continue
        if name == "measure":
            lines += [(f"{name} {row['label']}", *row_result(row)) for row in task["rows"][1:]]
            continue
        lines.append((label, *task_summary(task["rows"])))
    return lines


def row_result(row: dict[str, Any]) -> tuple[str, str]:
    """One row of gpu_levers: (result, detail)."""
    if "skipped" in row:
        return "skipped", f"not available: {row['skipped']}"
    if "pending" in row:
        return "not timed", row["pending"]
    if "p99_ms" not in row:
        return "FAIL", row["failed"]
    if row["p99_ms"] != row["p99_ms"]:  # NaN: no round was kept
        return "busy", "the contention guard discarded every round: rerun on a quiet machine"
    speedup = f", {row['baseline_p99_ms'] / row['p99_ms']:.2f}x p99" if "baseline_p99_ms" in row else ""
    accuracy = f", accuracy {row['accuracy']:.4f}" if "accuracy" in row else ""
    detail = f"p99 {row['p99_ms']:.3f} ms{speedup}{accuracy}"
    return ("FAIL", f"{detail}; {row['failed']}") if "failed" in row else ("pass", detail)


def task_summary(rows: list[dict[str, Any]]) -> tuple[str, str]:
    """A levers task in one line: its fastest row by P99 and the rows that failed."""
    timed = [r for r in rows if "p99_ms" in r and "baseline_p99_ms" in r and r["p99_ms"] == r["p99_ms"]]  # not NaN
    failed = [r for r in rows if "failed" in r]
    parts = [f"{len(timed)} rows timed, {sum('skipped' in r for r in rows)} not available"]
    if timed:
        best = max(timed, key=lambda r: r["baseline_p99_ms"] / r["p99_ms"])
        parts.append(f"fastest: {best['label']} {best['baseline_p99_ms'] / best['p99_ms']:.2f}x p99")
    pending = [r["label"] for r in rows if "pending" in r]
    if pending:
        parts.append(f"built, not timed (the run stopped): {', '.join(pending)}")
    parts += [f"failed: {r['label']} ({r['failed']})" for r in failed]
    return ("FAIL" if failed or pending else "pass"), "; ".join(parts)


def result_text(rec: dict[str, Any]) -> str:
    """A record's status as the table shows it."""
    status = rec["status"]
    if status == "FAIL":
        return f"FAIL (exit {rec['exit_code']})"
    if status == "timeout":
        return f"timeout ({rec['limit_s']} s)"
    if status == "skipped":
        return "skipped (deadline)"
    if status == "stopped":
        return "stopped (signal)"
    return str(status)


def step_detail(out: Path, rec: dict[str, Any], search: Any, pick: Any) -> str:
    """What a step found, in one line; for a step that did not pass, the last line it wrote to standard error."""
    data = rec.get("output")
    if rec["status"] == "skipped":
        return "not started: too little time left before the deadline"
    if rec["status"] in {"timeout", "stopped"}:
        found = _found(out, rec, search, pick) if data else _last_line(out, rec)
        return f"killed after {rec['seconds']} s; " + (found or "it printed nothing before")
    return _found(out, rec, search, pick)


def _found(out: Path, rec: dict[str, Any], search: Any, pick: Any) -> str:
    """``step_detail`` of a step that printed its result (or, without one, its last line)."""
    name, data = rec["name"], rec.get("output")
    try:
        if name == "env" and data:
            return (
                f"torch {data['torch']} (CUDA {data.get('cuda_runtime')}), torchao {data.get('torchao')}, "
                f"{data.get('device_name')} (capability {data.get('capability')}), TF32 matmul "
                f"{'on' if data.get('tf32_matmul') else 'off'} ({data.get('float32_matmul_precision')}), "
                f"driver {data.get('driver')}"
            )
        if name == "techniques" and data:
            on = [t["name"] for t in data if t["available"]]
            off = [f"{t['name']} ({t['reason']})" for t in data if not t["available"]]
            return f"available: {', '.join(on)}; not available: {'; '.join(off) or 'none'}"
        if name == "calibrate" and isinstance(data, dict):
            peaks = ", ".join(f"{k} {v / 1e12:.3g}" for k, v in data.get("peak_flops", {}).items())
            bandwidth = data.get("memory_bandwidth_bytes_per_s") or 0
            return f"{data.get('description')}: peak TFLOP/s {peaks}; {bandwidth / 1e9:.0f} GB/s"
        if name == "search" and data:
            return search_detail(data, pick)
        if name == "best" and data:
            return pick_detail(data, search)
        if name in {"levers", "large", "measure"} and isinstance(data, list):
            lines = lever_lines(name, data)
            return f"{sum(r == 'pass' for _, r, _ in lines)} of {len(lines)} passed (rows below)"
        if name == "roofline" and data:
            regimes = ", ".join(f"{layer['type']} {layer['regime']}" for layer in data["layers"])
            return f"{data['task']}@{data['batch_size']} {data['dtype']} on {data['hardware']['name']}: {regimes}"
        if name == "export" and data:
            check = data.get("reload_check") or {}
            return (
                f"{(data.get('artifact') or {}).get('format')}, reload check "
                f"{'passed' if check.get('passed') else 'failed'}, max abs diff {check.get('max_abs_diff')}"
            )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        return f"its output could not be read ({type(exc).__name__}: {exc})"
    return _last_line(out, rec)


def _last_line(out: Path, rec: dict[str, Any]) -> str:
    """pytest's closing line for the tests; else the last line of standard error (or output)."""
    stdout = out / f"{rec['name']}.out"
    lines = stdout.read_text(errors="replace").strip().splitlines() if stdout.exists() else []
    if rec["name"] == "tests":
        closing = [line for line in lines if " passed" in line or " failed" in line or " error" in line]
        if closing:
            return closing[-1].strip("= ")[:200]
    tail = [line for line in rec.get("stderr_tail") or [] if line.strip()] or lines
    return tail[-1].strip()[:200] if tail else ""


def table_rows(out: Path) -> list[tuple[str, str, str, str]]:
    """(step, result, time, detail) for every planned step, in order, and a row per task or technique
    below the levers and measure steps."""
    plan = _plan(out)
    records = {name: read_json(out / f"{name}.json") for name in plan}
    search = (records.get("search") or {}).get("output")
    pick = (records.get("best") or {}).get("output")
    rows = []
    for name in plan:
        rec = records[name]
        if not isinstance(rec, dict):
            rows.append((name, "not reached", "", "the check stopped before this step"))
            continue
        took = f"{rec['seconds']} s" if rec["status"] != "skipped" else ""
        rows.append((name, result_text(rec), took, step_detail(out, rec, search, pick)))
        if name in {"levers", "large", "measure"} and isinstance(rec.get("output"), list):
            rows += [(label, result, "", detail) for label, result, detail in lever_lines(name, rec["output"])]
    return rows


def _plan(out: Path) -> list[str]:
    """The steps planned, in order (``out/plan.txt``)."""
    path = out / "plan.txt"
    return path.read_text().split() if path.exists() else []


def all_passed(out: Path) -> bool:
    """Every planned step ran and passed."""
    return all((read_json(out / f"{name}.json") or {}).get("status") == "pass" for name in _plan(out))


def table(out: Path) -> str:
    """The Markdown table of what finished, saved as ``out/table.md``."""
    lines = ["| step | result | time | detail |", "|---|---|---|---|"]
    for row in table_rows(out):
        lines.append("| " + " | ".join(cell.replace("|", "/").replace("\n", " ") for cell in row) + " |")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def main(argv: list[str]) -> int:
    """``env DEVICE``, ``record …`` or ``table OUT`` (see the module's docstring)."""
    if argv[:1] == ["env"]:
        device = argv[argv.index("--device") + 1] if "--device" in argv else "cuda"
        print(json.dumps(environment(device), indent=1))
    elif argv[:1] == ["record"] and len(argv) in (7, 8):
        out, name, status, code, seconds, limit = argv[1:7]
        record(Path(out), name, status, int(code), int(seconds), int(limit), argv[7] if len(argv) == 8 else "")
    elif argv[:1] == ["table"] and len(argv) == 2:
        print(table(Path(argv[1])), end="")
        return 0 if all_passed(Path(argv[1])) else 1
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
