"""The command line as a user meets it: exit codes, one-sentence errors, JSON shapes, no torch for queries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cli
from pareto.spec import SearchSpec
from pareto.study.search import run_search

ROOT = Path(__file__).resolve().parents[1]
TINY = "tests.tiny_task:make_task"


def pareto(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("PARETO_DB_URL", None)
    return subprocess.run(
        [sys.executable, "-c", "import sys, cli; sys.exit(cli.main())", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_sentence(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose ./pareto.db holds a short search of the tiny task."""
    cwd = tmp_path_factory.mktemp("cli")
    proc = pareto(
        "search",
        "--task",
        TINY,
        "--study",
        "tiny",
        "--slo-p99",
        "1s",
        "--n-trials",
        "3",
        "--threads",
        "1",
        "--warmup",
        "5",
        "--device",
        "cpu",
        "--contention-limit",
        "50",  # the guard on, but never firing for a shared CI machine's neighbours: the search confirms
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Pareto frontier" in proc.stdout and "Best configuration" in proc.stdout
    return cwd


def test_best_json_shape(searched: Path) -> None:
    proc = pareto("best", "--slo-p99", "1s", "--json", cwd=searched)
    assert proc.returncode == 0, proc.stderr
    pick = json.loads(proc.stdout)
    assert set(pick) == {"study", "trial", "config", "metrics", "slo", "confirmation", "environment"}
    assert pick["metrics"]["latency_p99_upper_ms"] <= 1000
    assert set(pick["confirmation"]) == {"rounds", "discarded_rounds", "confirmed_at", "run"}
    assert {"rounds", "discarded_rounds"} <= set(pick["metrics"]) and pick["environment"]["key"]


def test_measure_a_stored_trial_again_and_confirm(searched: Path) -> None:
    quiet = ("--contention-limit", "50")  # the guard on, never firing for a CI machine's neighbours
    pick = json.loads(pareto("best", "--slo-p99", "1s", "--json", cwd=searched).stdout)
    trial = str(pick["trial"])  # a measured trial (some of the space can fail on the tiny model)
    proc = pareto("measure", "--study", "tiny", "--trial", trial, "--json", *quiet, cwd=searched)
    assert proc.returncode == 0, proc.stderr
    card = json.loads(proc.stdout)
    assert {"config", "metrics", "environment", "stored", "verdict_holds"} <= set(card)
    assert isinstance(card["verdict_holds"], bool)
    proc = pareto("measure", "--trial", trial, *quiet, cwd=searched)  # the only study; the card
    assert proc.returncode == 0, proc.stderr
    assert "Measured again" in proc.stdout and "p99 stored" in proc.stdout
    proc = pareto("confirm", "--top", "1", "--json", cwd=searched)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["items"]


def test_frontier_and_studies_json(searched: Path) -> None:
    front = json.loads(pareto("frontier", "--json", cwd=searched).stdout)
    assert isinstance(front, list) and front and "metrics" in front[0]
    studies = json.loads(pareto("studies", "--json", cwd=searched).stdout)
    assert studies[0]["study"] == "tiny" and studies[0]["complete"] >= 1


@pytest.mark.parametrize(
    ("query", "allowed"),
    [
        (["best", "--slo-p99", "1s", "--json"], set()),
        (["frontier"], {"numpy"}),  # the sort-based sweep over every trial's objectives
        (["studies"], set()),
        (["history", "--study", "tiny"], set()),
    ],
)
def test_queries_do_not_import_torch(searched: Path, query: list[str], allowed: set[str]) -> None:
    code = (
        "import sys, cli\n"
        f"rc = cli.main({query!r})\n"
        # pydantic builds the search spec's models: a tenth of a second a read does not need
        f"heavy = ({{'torch', 'optuna', 'numpy', 'scipy', 'pydantic'}} - {allowed!r}) & set(sys.modules)\n"
        "assert not heavy, f'a query imported {heavy}'\n"
        # the command's own module, none of the others'
        f"others = {{m for m in sys.modules if m.startswith('pareto._cli.')}} - {{'pareto._cli.cli', "
        f"'pareto._cli.options', 'pareto._cli.{query[0]}'}}\n"
        "assert not others, f'a query imported the modules of other commands: {others}'\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=searched,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr


def test_import_pareto_loads_its_api_on_first_use() -> None:
    code = (
        "import sys, pareto\n"
        "assert not {'pareto.api', 'sqlalchemy', 'pydantic'} & set(sys.modules), 'import pareto loaded its API'\n"
        "assert callable(pareto.best) and 'pareto.api' in sys.modules\n"
        "assert pareto.api.best is pareto.best and pareto.Limits.__module__ == 'pareto.limits'\n"
        "assert not hasattr(pareto, 'no_such_name')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_no_feasible_exits_1_with_the_closest(searched: Path) -> None:
    proc = pareto("best", "--slo-p99", "1ns", cwd=searched)
    assert proc.returncode == 1
    assert "closest is trial" in one_sentence(proc)


def test_every_read_takes_the_throughput_floor(searched: Path) -> None:
    """--min-throughput reaches best and explain as --slo-p99 does (one Limits value)."""
    proc = pareto("best", "--min-throughput", "1e15/s", cwd=searched)
    assert proc.returncode == 1
    assert "throughput ≥ 1,000,000,000,000,000/s" in one_sentence(proc)
    explained = pareto("explain", "--min-throughput", "1/s", "--json", cwd=searched)
    assert explained.returncode == 0, explained.stderr
    assert json.loads(explained.stdout)["constraints"]["min_throughput_per_s"] == 1.0


@pytest.mark.parametrize(
    ("args", "code", "phrase"),
    [
        (["best", "--study", "nosuch"], 2, "No study named 'nosuch'"),
        (["best", "--slo-p99", "7parsecs"], 2, "Unknown time unit"),
        (["best", "--slo-p99", "-3ms"], 2, "must be positive"),
        (["best", "--slo-p99", "7"], 2, "has no unit"),
        (["frontier", "--db", "sqlite:///nowhere/x.db"], 2, "No database"),
        (["best", "--environment", "nosuch"], 2, "matches none of study 'tiny'"),
        (["best", "--environment", "all"], 2, "within one environment"),
        (["best", "--max-memory", "0MiB"], 2, "must be positive"),
        (["frontier", "--min-throughput", "0/s"], 2, "must be positive"),
        (["measure", "--trial", "99"], 2, "has no trial 99"),
        (["measure", "--study", "tiny"], 2, "--study needs --trial"),
        (["confirm", "--top", "0"], 2, "--top"),
        (["search", "--confidence", "0.5"], 2, "--confidence"),
    ],
)
def test_bad_query_input(searched: Path, args: list[str], code: int, phrase: str) -> None:
    proc = pareto(*args, cwd=searched)
    assert proc.returncode == code
    assert phrase in one_sentence(proc)


@pytest.mark.parametrize(
    ("args", "yaml_text", "code", "phrase"),
    [
        (["--slo-p99", "7parsecs"], None, 2, "Unknown time unit"),
        (["--task", "nosuch"], None, 2, "Unknown task 'nosuch'"),
        (["--task", "tests.tiny_task:make_broken_task"], None, 2, "weights file missing"),
        ([], "space: {techniques: {magic: {}}}", 2, "unknown technique 'magic'"),
        ([], "slo: {p99: [", 2, "malformed YAML"),
        (["--db", "sqlite:////proc/nope/p.db"], None, 2, "Cannot create database"),
    ],
)
def test_bad_search_input_keeps_what_was_stored(
    searched: Path, args: list[str], yaml_text: str | None, code: int, phrase: str
) -> None:
    before = (searched / "pareto.db").stat().st_size
    if yaml_text is not None:
        (searched / "bad.yaml").write_text(yaml_text)
        args = [*args, "--config", "bad.yaml"]
    proc = pareto("search", *args, cwd=searched)
    assert proc.returncode == code, proc.stderr
    assert phrase in one_sentence(proc)
    assert (searched / "pareto.db").stat().st_size >= before
    assert pareto("best", "--slo-p99", "1s", cwd=searched).returncode == 0


@pytest.mark.parametrize(
    ("config", "phrase"),
    [
        ("binary.yaml", "is not a UTF-8 text file (byte 0x89 at offset 0)"),
        ("nul.yaml", "is not a YAML text file (character #x0000 at offset 11)"),
        ("folder", "is a directory"),
        ("missing.yaml", "Cannot read config missing.yaml: No such file or directory"),
        ("under-a-file.yaml/spec.yaml", "Not a directory"),
    ],
)
def test_a_config_that_is_no_yaml_text_is_one_sentence(tmp_path: Path, config: str, phrase: str) -> None:
    (tmp_path / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    (tmp_path / "nul.yaml").write_bytes(b"task: demo\n\x00\x01")
    (tmp_path / "under-a-file.yaml").write_text("task: demo\n")
    (tmp_path / "folder").mkdir()
    for command in (["search"], ["studies", "create"], ["nightly"]):
        proc = pareto(*command, "--config", config, "--db", f"sqlite:///{tmp_path}/p.db", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert phrase in one_sentence(proc)
    assert not (tmp_path / "p.db").exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_config_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "secret.yaml"
    path.write_text("task: demo\n")
    path.chmod(0)
    proc = pareto("search", "--config", str(path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Permission denied" in one_sentence(proc)


def test_db_upgrade(tmp_path: Path) -> None:
    proc = pareto("db", "upgrade", "--db", f"sqlite:///{tmp_path}/u.db", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    from pareto.store.engine import HEAD_REVISION

    assert f"is at revision {HEAD_REVISION}" in proc.stdout


@pytest.mark.parametrize("presses", [1, 2], ids=["once", "twice"])
def test_ctrl_c_stops_cleanly_and_keeps_what_was_measured(tmp_path: Path, presses: int) -> None:
    """Ctrl-C pressed in a trial's accuracy evaluation (the task's third call presses it: no timing here).
    Once: that trial is finished and stored, then the search stops. Twice: it is abandoned at once and
    stored as interrupted. Either way: exit 130, one line saying so, nothing left RUNNING."""
    import sqlite3

    proc = pareto(
        "search",
        "--task",
        "tests.tiny_task:make_interrupting_task",
        "--study",
        "c",
        "--n-trials",
        "500",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--slo-p99",
        "1s",
        "--warmup",
        "3",
        "--no-guard",  # a busy shared machine cannot end the search before the Ctrl-C
        cwd=tmp_path,
        env={"PARETO_TEST_SIGINT_AT": "3", "PARETO_TEST_SIGINTS": str(presses)},
    )
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "Interrupted" in proc.stderr, proc.stderr
    with sqlite3.connect(tmp_path / "pareto.db") as conn:
        trials = conn.execute("SELECT state, error FROM pareto_trials ORDER BY id").fetchall()
    states, shown = [state for state, _ in trials], (trials, proc.stderr)
    assert "RUNNING" not in states, shown  # the trial in progress is closed, not left dangling
    if presses == 1:
        assert "Ctrl-C: stopped after the trial in progress." in proc.stderr, shown
        assert states.count("COMPLETE") >= 2 and states[-1] == "COMPLETE", shown
    else:
        assert states.count("COMPLETE") >= 1 and trials[-1] == ("FAILED", "interrupted by the user"), shown
    assert len(states) < 10, shown  # stopped there, not after --n-trials
    assert pareto("best", "--json", cwd=tmp_path).returncode == 0


def test_the_command_tree_installs_inside_the_package() -> None:
    """No top-level ``cli`` module in site-packages: the entry point is pareto._cli.cli; cli.py imports it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["pareto"] == "pareto._cli.cli:main"
    assert "py-modules" not in project["tool"]["setuptools"]
    assert not (ROOT / "pareto" / "_cli" / "cli.py").is_symlink()
    assert "from pareto._cli.cli import" in (ROOT / "cli.py").read_text()


# `pareto measure`, `calibrate`, `roofline`, `hardware`, `techniques`, and the axes a search stores,
# called in this process

# the guard on, but not firing for a shared CI machine's neighbours (its behaviour: test_measure_latency.py)
FAST = ["--threads", "1", "--device", "cpu", "--samples", "100", "--warmup", "3", "--contention-limit", "50"]


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_measure_json_has_every_axis(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = in_process(
        capsys,
        "measure",
        "--task",
        TINY,
        "--technique",
        "prune_structured:ratio=0.5",
        "--technique",
        "int8_dynamic",
        "--slo-p99",
        "1s",
        "--hardware",
        "a100-40gb",
        "--json",
        *FAST,
    )
    assert code == 0, err
    card = json.loads(out)
    assert set(card) == {"config", "metrics", "environment"}
    m = card["metrics"]
    for key in (
        "latency_p50_ms",
        "latency_p99_ms",
        "latency_p99_lower_ms",
        "latency_p99_upper_ms",
        "p99_p50_ratio",
        "samples",
        "params_bytes",
        "activation_bytes",
        "kv_cache_bytes",
        "flops",
        "bytes_moved",
        "arithmetic_intensity",
        "roofline_bound_ms",
        "regime",
        "throughput_per_s",
        "compression_ratio",
        "speedup_p50",
        "speedup_p99",
    ):
        assert key in m, key
    assert m["flops"] > 0 and m["bytes_moved"] > 0 and m["regime"] in {"memory-bound", "compute-bound"}
    assert m["compression_ratio"] > 4  # half the hidden units and int8 weights
    assert m["kv_cache_bytes"] == 0  # the tiny task declares no attention shape
    # 100 samples can never claim a P99 is met: adaptive sampling timed on until the verdict was decided
    assert m["p99_verdict"] == "met" and m["samples"] >= 662


def test_measure_card_and_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = in_process(capsys, "measure", "--task", TINY, "--sweep", "--hardware", "none", *FAST)
    assert code == 0, err
    assert "memory" in out and "throughput curve" in out and "saturates at batch" in out


def test_measure_of_a_model_that_fails_its_own_input_is_a_failed_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = in_process(capsys, "measure", "--task", "tests.tiny_task:make_mismatched_task", *FAST)
    assert code == 4  # the uncompressed model cannot run here: nothing to measure beside it
    assert "the uncompressed model failed when running it on example_input(8) on cpu" in err
    assert "Traceback" not in err and len([line for line in err.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--hardware", "tpu-v9"], "Unknown hardware profile"),
        (["--technique", "prune_structured:ratio"], "Cannot read technique option"),
        (["--technique", "prune_structured:ratio=1.5"], "ratio"),
        (["--technique", "magic"], "Unknown technique 'magic'"),
        (["--batch-size", "0"], "--batch-size"),
        (["--technique", "prune_2_4"], "cannot run here"),
    ],
)
def test_measure_bad_input(capsys: pytest.CaptureFixture[str], args: list[str], phrase: str) -> None:
    code, _out, err = in_process(capsys, "measure", "--task", TINY, *args, *FAST)
    assert code == 2
    assert phrase in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1


def test_hardware_json_ridges(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = in_process(capsys, "hardware", "--json")
    assert code == 0
    ridges = {p["name"]: p["ridge_flop_per_byte"] for p in json.loads(out)}
    assert ridges["v100"]["fp16"] == pytest.approx(139, abs=2)
    assert ridges["a100-40gb"]["bf16"] == pytest.approx(201, abs=2)
    assert ridges["h100-sxm"]["bf16"] == pytest.approx(295, abs=2)


def test_calibrate_then_host_roofline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/p.db"
    code, out, err = in_process(
        capsys, "calibrate", "--device", "cpu", "--threads", "1", "--seconds", "1", "--db", db, "--json"
    )
    assert code == 0, err
    profile = json.loads(out)
    assert profile["peak_flops"]["fp32"] > 0 and profile["memory_bandwidth_bytes_per_s"] > 0
    code, out, err = in_process(capsys, "roofline", "--task", TINY, "--hardware", "host", "--device", "cpu", "--db", db)
    assert code == 0, err
    assert "Linear" in out and ("memory-bound" in out or "compute-bound" in out)


def test_host_profile_without_calibration(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = in_process(
        capsys,
        "roofline",
        "--task",
        TINY,
        "--hardware",
        "host",
        "--device",
        "cpu",
        "--db",
        f"sqlite:///{tmp_path}/none.db",
    )
    assert code == 2 and "pareto calibrate" in err


def test_techniques_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = in_process(capsys, "techniques", "--device", "cpu", "--json")
    assert code == 0
    listing = {t["name"]: t for t in json.loads(out)}
    for name in (
        "int8_dynamic",
        "prune_unstructured",
        "prune_structured",
        "prune_2_4",
        "lowrank",
        "distill",
        "finetune",
        "compile",
        "fp16",
        "bf16",
    ):
        assert name in listing
        assert set(listing[name]) >= {"name", "family", "available", "reason"}
    assert listing["prune_2_4"]["available"] is False and "CUDA" in listing["prune_2_4"]["reason"]
    assert listing["int8_dynamic"]["available"] is True and listing["int8_dynamic"]["reason"] is None


def test_search_stores_the_four_axes_and_optimizes_three_objectives(tmp_path: Path) -> None:
    import optuna

    import pareto

    db = f"sqlite:///{tmp_path}/p.db"
    data = {
        "task": TINY,
        "study": "axes",
        "objectives": ["accuracy", "p99", "memory"],
        "slo": {"p99": "1s", "min_throughput": "10/s"},
        "budget": {"max_memory": "64MiB"},
        "search": {"n_trials": 3, "seed": 0},
        "measure": {"device": "cpu", "threads": 1, "warmup": 3},
        "space": {"techniques": {"int8_dynamic": {}, "prune_structured": {"ratio": [0.5]}}},
    }
    spec = SearchSpec.model_validate(data)
    result = run_search(spec, db_url=db)
    assert result.measured >= 1
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    assert len(optuna.load_study(study_name="axes", storage=db).directions) == 3
    pick = pareto.best(study="axes", db=db)
    m = pick["metrics"]
    assert m["memory_bytes"] == m["params_bytes"] + m["activation_bytes"] + m["kv_cache_bytes"]
    assert m["flops"] > 0 and m["arithmetic_intensity"] > 0
    assert pick["slo"]["min_throughput_per_s"] == 10.0
    studies = {s["study"]: s for s in pareto.studies(db=db)}
    assert studies["axes"]["objectives"] == ["accuracy", "p99", "memory"]
    from pareto.machine import describe_cpu_features
    from pareto.measure.environment import host_cpu

    features = host_cpu()[0]  # the CPU's kernel features in words, where /proc/cpuinfo lists them
    assert studies["axes"]["cpu_kernels"] == ([describe_cpu_features(features)] if features else [])
    with pytest.raises(Exception, match="continue it with --objective accuracy,p99,memory"):
        run_search(spec.model_copy(update={"objectives": ["accuracy", "p99"]}), db_url=db)
    unsaid = SearchSpec.model_validate(
        {k: v for k, v in data.items() if k != "objectives"} | {"search": {"n_trials": 1}}
    )
    assert "objectives" not in unsaid.model_fields_set
    again = run_search(unsaid, db_url=db)  # the study's own objectives are kept: no error
    assert again.trials_run - again.repeats - again.busy == 1 or again.exhausted is not None


def test_explain_says_why_for_every_frontier_configuration(searched: Path) -> None:
    front = json.loads(pareto("frontier", "--slo-p99", "1s", "--json", cwd=searched).stdout)
    proc = pareto("explain", "--slo-p99", "1s", "--json", cwd=searched)
    assert proc.returncode == 0, proc.stderr
    why = json.loads(proc.stdout)
    assert [item["trial"] for item in why["items"]] == [row["trial"] for row in front]
    verdicts = {item["verdict"] for item in why["items"]}
    assert verdicts <= {"chosen", "misses", "dominated", "tie", "incomparable"}
    chosen = [item for item in why["items"] if item["verdict"] == "chosen"]
    best = json.loads(pareto("best", "--slo-p99", "1s", "--json", cwd=searched).stdout)
    assert [item["trial"] for item in chosen] == [best["trial"]] and why["pick"] == best["trial"]
    assert all(item["reason"].endswith(".") for item in why["items"])
    # nothing meets a microsecond: every frontier configuration misses, and the nearest say what they need
    proc = pareto("explain", "--slo-p99", "1us", cwd=searched)
    assert proc.returncode == 0, proc.stderr
    assert "Nothing on the frontier meets" in proc.stdout and "qualifies with --slo-p99" in proc.stdout
    proc = pareto("explain", "--study", "nope", cwd=searched)
    assert proc.returncode == 2 and "No study named 'nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_the_python_api_example_runs(searched: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python_api.py"), "--study", "tiny", "--slo-p99", "1s"],
        cwd=searched,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "pick: trial" in proc.stdout and "chosen" in proc.stdout


def test_the_study_opens_in_optuna_and_its_dashboard(searched: Path) -> None:
    """optuna-dashboard reads the study through Optuna's storage API: what load_study sees is what it shows."""
    import optuna

    url = f"sqlite:///{searched / 'pareto.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="tiny", storage=url)
    stored = json.loads(pareto("studies", "--json", cwd=searched).stdout)[0]
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) >= stored["complete"] >= 1
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]  # accuracy up, P99 bound down
    # the SLO is a constraint Optuna knows (feasible ≤ 0), so the dashboard can split feasible trials
    # one per limit the study set, here the P99 SLO, under Optuna's own keys ("constraints:<name>")
    constraints = [{k: v for k, v in t.system_attrs.items() if k.startswith("constraints")} for t in complete]
    assert all(list(c) == ["constraints:p99_ms"] for c in constraints)
    assert any(c["constraints:p99_ms"] <= 0 for c in constraints)
    study._storage.remove_session()  # type: ignore[attr-defined]
