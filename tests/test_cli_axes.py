"""`pareto measure`, `calibrate`, `roofline`, `hardware`, `techniques`, and the axes a search stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cli
from pareto._search import run_search
from pareto.spec import SearchSpec

TINY = "tests.tiny_task:make_task"
FAST = ["--threads", "1", "--device", "cpu", "--samples", "100", "--warmup", "3"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_measure_json_has_every_axis(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
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
    code, out, err = run(capsys, "measure", "--task", TINY, "--sweep", "--hardware", "none", *FAST)
    assert code == 0, err
    assert "memory" in out and "throughput curve" in out and "saturates at batch" in out


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--hardware", "tpu-v9"], "Unknown hardware profile"),
        (["--technique", "prune_structured:ratio"], "Cannot read technique option"),
        (["--technique", "prune_structured:ratio=1.5"], "ratio"),
        (["--technique", "magic"], "Unknown technique 'magic'"),
        (["--batch-size", "0"], "--batch-size"),
        (["--task", "tests.tiny_task:make_mismatched_task"], "does not accept example_input"),
        (["--technique", "prune_2_4"], "cannot run here"),
    ],
)
def test_measure_bad_input(capsys: pytest.CaptureFixture[str], args: list[str], phrase: str) -> None:
    code, _out, err = run(capsys, "measure", "--task", TINY, *args, *FAST)
    assert code == 2
    assert phrase in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1


def test_hardware_json_ridges(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "hardware", "--json")
    assert code == 0
    ridges = {p["name"]: p["ridge_flop_per_byte"] for p in json.loads(out)}
    assert ridges["v100"]["fp16"] == pytest.approx(139, abs=2)
    assert ridges["a100-40gb"]["bf16"] == pytest.approx(201, abs=2)
    assert ridges["h100-sxm"]["bf16"] == pytest.approx(295, abs=2)


def test_calibrate_then_host_roofline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/p.db"
    code, out, err = run(
        capsys, "calibrate", "--device", "cpu", "--threads", "1", "--seconds", "1", "--db", db, "--json"
    )
    assert code == 0, err
    profile = json.loads(out)
    assert profile["peak_flops"]["fp32"] > 0 and profile["memory_bandwidth_bytes_per_s"] > 0
    code, out, err = run(capsys, "roofline", "--task", TINY, "--hardware", "host", "--device", "cpu", "--db", db)
    assert code == 0, err
    assert "Linear" in out and ("memory-bound" in out or "compute-bound" in out)


def test_host_profile_without_calibration(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(
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
    code, out, _ = run(capsys, "techniques", "--device", "cpu", "--json")
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
    with pytest.raises(Exception, match="continue it with --objective accuracy,p99,memory"):
        run_search(spec.model_copy(update={"objectives": ["accuracy", "p99"]}), db_url=db)
    unsaid = SearchSpec.model_validate(
        {k: v for k, v in data.items() if k != "objectives"} | {"search": {"n_trials": 1}}
    )
    assert "objectives" not in unsaid.model_fields_set
    assert run_search(unsaid, db_url=db).trials_run == 1  # the study's own objectives are kept
