"""Nightly jobs: regression rules, the study lock, history, and real processes started and killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

import pareto
from pareto.errors import ParetoError, UsageError
from pareto.nightly_job.job import run_nightly
from pareto.spec import NightlySettings, SearchSpec, load_nightly
from pareto.store.engine import open_engine, session_scope, upgrade
from pareto.store.models import Measurement, NightlyRun, Trial
from pareto.study.search import run_search

ROOT = Path(__file__).resolve().parents[1]
TASK = "tests.tiny_task:make_slowable_task"


def test_nightly_config_and_overrides(tmp_path: Path) -> None:
    spec, settings, db = load_nightly(
        ROOT / "configs" / "nightly.yaml", {"study": "other", "nightly.time_budget": "2min"}
    )
    assert spec.study_name == "other" and settings.time_budget == 120_000 and db is None
    assert spec.slo.p99 == 7.0 and settings.threshold == 2.0 and settings.p_value == 0.002
    bad = tmp_path / "bad.yaml"
    bad.write_text("nightly:\n  threshold: 0.9\n")
    with pytest.raises(UsageError, match="nightly.threshold"):
        load_nightly(bad)


def _spec(**measure: Any) -> SearchSpec:
    return SearchSpec.model_validate(
        {
            "task": TASK,
            "study": "night",
            # int8 on the tiny MLP is slower than float32 (the lever probe would leave it out): kept
            "search": {"n_trials": 3, "seed": 1, "confirm_top": 1, "keep": ["int8_dynamic"]},
            "measure": {
                "device": "cpu",
                "threads": 1,
                "warmup": 5,
                "samples": 200,
                "rounds": 10,
                "contention_limit": 50,
                **measure,
            },
            "space": {"techniques": {"int8_dynamic": {}}},
        }
    )


def test_nightly_unchanged_then_slower_model(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARETO_TEST_SLOWDOWN_MS", raising=False)
    run_search(_spec(), db_url=db_url)
    # no time for new trials; a false-alarm rate far below the default keeps a loaded test machine quiet
    settings = NightlySettings(time_budget="1s", summary_dir=str(tmp_path / "reports"), false_alarm=1e-6)
    first = run_nightly(_spec(), settings, db_url=db_url, notice=lambda _: None)
    # the first night has no drift-corrected history: the absolute rule, whose second pass may call a
    # loaded test machine noisy; never a regression
    assert first.status in {"ok", "noisy"} and first.exit_code in {0, 75}, first.summary["comparisons"]
    assert first.summary["pick_before"] is not None and first.summary["comparisons"]
    assert first.markdown_path.read_text().startswith(f"# Nightly of study `night`: {first.status}")
    assert json.loads(first.json_path.read_text())["status"] == first.status
    # the first night sizes the reference and measures beside it: the comparison is still absolute
    drift = first.summary["drift"]
    assert drift["reference"]["batch"] >= 1 and drift["reference_p99_ms"] > 0
    assert {c["basis"] for c in first.summary["comparisons"]} == {"absolute"}
    assert any(m["is_baseline"] for m in drift["measured"]) and drift["bands"]["p50"]["source"] == "default"

    quiet = run_nightly(_spec(), settings, db_url=db_url, notice=lambda _: None)
    # unchanged: ok, or noisy when a loaded test machine moved the tiny model's P99 alone; never a regression
    assert quiet.status in {"ok", "noisy"}, quiet.summary["comparisons"]
    assert quiet.summary["pick_before"]["trial"] == first.summary["pick_after"]["trial"]
    assert {c["basis"] for c in quiet.summary["comparisons"]} == {"drift-corrected"}
    assert quiet.summary["drift"]["reference"] == drift["reference"]  # the same yardstick every night
    assert "Drift-corrected" in quiet.markdown_path.read_text()

    monkeypatch.setenv("PARETO_TEST_SLOWDOWN_MS", "3")
    slow = run_nightly(_spec(), settings, db_url=db_url, notice=lambda _: None)
    assert slow.status == "regression" and slow.exit_code == 3
    (regression,) = slow.summary["regressions"]
    assert regression["trial"] == slow.summary["pick_before"]["trial"] and regression["slower"]
    # every configuration got slower, the baseline too, and not the reference: the model did
    assert regression["basis"] == "drift-corrected" and regression["kind"] == "model"
    assert slow.summary["reproduced"] is True

    rows = pareto.history(study="night", db=db_url)
    assert [r["status"] for r in rows] == [first.status, quiet.status, "regression"]
    assert rows[2]["regressions"][0]["ratio"] > 2.0 and rows[1]["drift"]["pick"]["corrected_p99_ms"] > 0
    assert "measured" not in rows[1]["drift"]

    # another environment (another thread count): reported, and nothing compared across it
    monkeypatch.delenv("PARETO_TEST_SLOWDOWN_MS")
    moved = run_nightly(_spec(threads=2), settings, db_url=db_url, notice=lambda _: None)
    assert moved.summary["environment_changes"] and moved.status == "ok"
    assert {c["basis"] for c in moved.summary["comparisons"]} == {"not compared"}
    assert moved.summary["drift"]["history_nights"] == 0


def test_the_pick_stays_until_a_new_configuration_or_a_regression() -> None:
    from pareto.front import Candidate
    from pareto.nightly_job.job import _Job

    def candidate(trial: int) -> Candidate:
        return Candidate("s", trial, {}, f"trial {trial}", {}, {})

    job, said = _Job.__new__(_Job), []
    job.notice, job.last_pick = said.append, 2
    before = [candidate(1), candidate(2)]
    # tonight's confirmations rank trial 1 first; the pick served since last night stays trial 2
    assert job._served(before, before[0]).trial == 2 and "stays trial 2" in said[0]
    job.last_pick = None  # the study's first nightly: the best
    assert job._served(before, before[0]).trial == 1
    after = [candidate(1), candidate(2), candidate(3)]
    assert job._next_pick(before[1], after[0], before, after, False).trial == 2  # noise does not move it
    assert job._next_pick(before[1], after[2], before, after, False).trial == 3  # a new configuration does
    assert job._next_pick(before[1], after[0], before, after, True).trial == 1  # a regression does
    assert job._next_pick(None, after[0], before, after, False).trial == 1
    assert job._next_pick(before[1], None, before, after, True).trial == 2  # nothing feasible: still watched


def test_nightly_searches_for_the_time_left(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARETO_TEST_SLOWDOWN_MS", raising=False)
    settings = NightlySettings(time_budget="2min", summary_dir=str(tmp_path))
    first = run_nightly(_spec(), settings, db_url=db_url, notice=lambda _: None)  # a new study: search only
    # the space holds two configurations (baseline, int8): both measured, then nothing new is left
    assert first.summary["pick_before"] is None and first.summary["trials_run"] == 2
    assert first.summary["pick_after"] is not None and first.exit_code == 0


def _nightly_process(cwd: Path, db_url: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    config = cwd / "nightly.yaml"
    config.write_text(
        f"study: night\ntask: {TASK}\n"
        "search: {n_trials: 40, seed: 1, confirm_top: 1}\n"
        "measure: {device: cpu, threads: 1, warmup: 5, samples: 200, rounds: 10, contention_limit: 50}\n"
        "space: {techniques: {int8_dynamic: {}, lowrank: {rank_ratio: {low: 0.1, high: 0.9}}}}\n"
        f"nightly: {{time_budget: 60s, summary_dir: {cwd / 'reports'}}}\n"
    )
    # every call 2 ms slower: the job runs for seconds, long enough to be caught mid-run
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PARETO_TEST_SLOWDOWN_MS": "2", **(env or {})}
    full_env.pop("PARETO_DB_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pareto", "nightly", "--config", str(config), "--db", db_url, *extra],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_running(db_url: str, timeout_s: float = 120) -> NightlyRun:
    engine = open_engine(db_url)
    upgrade(engine)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with session_scope(engine) as session:
            row = session.scalars(select(NightlyRun).where(NightlyRun.status == "running")).first()
            if row is not None:
                return row
        time.sleep(0.1)
    raise AssertionError("no nightly started")


def test_two_nightlies_at_once_then_kill_and_take_over(db_url: str, tmp_path: Path) -> None:
    first = _nightly_process(tmp_path, db_url)
    try:
        running = _wait_running(db_url)
        second = _nightly_process(tmp_path, db_url)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 75, err
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and "Another nightly of study 'night' is running" in lines[0], err
        assert f"pid {running.pid}" in lines[0] and "Traceback" not in err
        first.send_signal(signal.SIGKILL)  # kill -9 mid-run: no chance to clean up
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    third = _nightly_process(tmp_path, db_url, "--time-budget", "1s", "--json")
    out, err = third.communicate(timeout=300)
    assert third.returncode == 0, err
    assert "died without finishing; its lock is taken over" in err
    assert json.loads(out)["status"] == "ok"
    statuses = [r["status"] for r in pareto.history(study="night", db=db_url)]
    assert statuses == ["interrupted", "ok"]


def test_sigterm_ends_a_nightly_as_interrupted(db_url: str, tmp_path: Path) -> None:
    proc = _nightly_process(tmp_path, db_url)
    try:
        _wait_running(db_url)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert [r["status"] for r in pareto.history(study="night", db=db_url)] == ["interrupted"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PARETO_DB_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "pareto", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_history_and_studies_delete_on_the_command_line(db_url: str, tmp_path: Path) -> None:
    settings = NightlySettings(time_budget="1s", summary_dir=str(tmp_path))
    run_nightly(_spec(), settings, db_url=db_url, notice=lambda _: None)  # nothing stored yet, no time to search
    shown = _cli("history", "--study", "night", "--db", db_url, "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    (entry,) = json.loads(shown.stdout)
    assert entry["status"] == "ok" and entry["pick_before"] is None and entry["trials_run"] == 0
    listed = _cli("studies", "--db", db_url, "--json", cwd=tmp_path)
    assert json.loads(listed.stdout)[0]["last_nightly"]["status"] == "ok"

    unknown = _cli("studies", "delete", "nope", "--yes", "--db", db_url, cwd=tmp_path)
    assert unknown.returncode == 2 and "No study named 'nope'; known studies: night." in unknown.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "pareto", "studies", "delete", "night", "--db", db_url],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        input="n\n",
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and "Nothing deleted." in refused.stderr and "Traceback" not in refused.stderr
    assert pareto.studies(db=db_url)[0]["study"] == "night"  # asked, refused: nothing removed
    deleted = _cli("studies", "delete", "night", "--yes", "--db", db_url, cwd=tmp_path)
    assert deleted.returncode == 0 and "Deleted study 'night'" in deleted.stdout, deleted.stderr
    assert pareto.studies(db=db_url) == []
    gone = _cli("history", "--study", "night", "--db", db_url, cwd=tmp_path)
    assert gone.returncode == 2 and "Traceback" not in gone.stderr


def test_nightly_bad_input_is_one_sentence(tmp_path: Path) -> None:
    bad = _cli("nightly", "--config", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert bad.returncode == 2 and "Cannot read config" in bad.stderr and "Traceback" not in bad.stderr
    budget = _cli("nightly", "--time-budget", "soon", cwd=tmp_path)
    assert budget.returncode == 2 and "Traceback" not in budget.stderr
    unreachable = _cli("nightly", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/x", cwd=tmp_path)
    assert unreachable.returncode != 0 and "127.0.0.1" in unreachable.stderr and "Traceback" not in unreachable.stderr


def test_a_regression_the_second_pass_does_not_find_makes_a_noisy_night(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.delenv("PARETO_TEST_SLOWDOWN_MS", raising=False)
    run_search(_spec(), db_url=db_url)
    _first_pass_in_a_slow_spell(monkeypatch)
    settings = NightlySettings(time_budget="1s", remeasure_top=0, summary_dir=str(tmp_path))
    preferred_before = _preferred(db_url)
    reads_before = _reads(db_url)
    with session_scope(open_engine(db_url)) as session:
        before_night = session.scalars(select(Measurement.id).where(Measurement.kind == "confirm")).all()
    night = run_nightly(_spec(), settings, db_url=db_url, notice=lambda _: None)
    assert night.status == "noisy" and night.exit_code == 75
    assert _reads(db_url) == reads_before  # best, frontier and explain, byte for byte
    # a noisy night concludes nothing: its measurements are stored, best answers from those before it
    assert night.summary["withdrawn"] >= 1 and _preferred(db_url) == preferred_before
    with session_scope(open_engine(db_url)) as session:
        confirmations = session.scalar(select(func.count()).where(Measurement.kind == "confirm"))
    assert confirmations >= len(before_night) + 2  # both passes kept
    assert night.summary["first_pass"]["regression"] and night.summary["reproduced"] is False
    (pick,) = night.summary["comparisons"]  # the second pass's measurement, with the first pass named
    assert not night.summary["regressions"] and "a first pass found, a second did not" in pick["reason"]
    # the first pass's P99 was inflated 10x; the kept one is the second pass's own measurement
    assert pick["p99_after_ms"] != night.summary["first_pass"]["p99_after_ms"] and not pick["regression"]


def test_the_nights_search_confirms_held(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the search a night runs confirms its top configurations held: a noisy or interrupted night changes
    # no answer through them either, and a night with a verdict promotes them with its own
    from pareto.study import search as _search

    monkeypatch.delenv("PARETO_TEST_SLOWDOWN_MS", raising=False)
    # an SLO and enough samples to meet it: the search's confirmation has configurations to confirm
    spec = SearchSpec.model_validate({**_spec(samples=700, rounds=20).model_dump(mode="json"), "slo": {"p99": "1s"}})
    run_search(spec.model_copy(update={"search": spec.search.model_copy(update={"confirm_top": 0})}), db_url=db_url)
    before = _preferred(db_url)
    more = spec
    result = run_search(more, db_url=db_url, held=True)
    assert result.confirmation is not None and result.confirmation.items and result.confirmation.runs
    assert _preferred(db_url) == before  # stored, not answered from
    seen: dict[str, Any] = {}
    real = _search.run_search

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        seen["result"] = real(*args, **kwargs)
        return seen["result"]

    monkeypatch.setattr(_search, "run_search", spy)
    _first_pass_in_a_slow_spell(monkeypatch)  # a noisy night, whatever this machine's own noise
    settings = NightlySettings(time_budget="60s", remeasure_top=0, summary_dir=str(tmp_path))
    reads_before = _reads(db_url)
    night = run_nightly(more, settings, db_url=db_url, notice=lambda _: None)
    assert seen.get("held") is True and night.status == "noisy"
    confirmed = seen["result"].confirmation
    assert confirmed is not None and confirmed.runs and night.summary["withdrawn"] >= 1  # the search's confirmations
    assert _preferred(db_url) == before and _reads(db_url) == reads_before  # best, frontier, explain: byte for byte


def test_a_night_interrupted_after_its_search_confirmed_changes_no_answer(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a budget for new trials, so the night's search confirms (confirm_top 1, held); SIGTERM comes right
    # after the search: its confirmations and the night's re-measurements stay held, every read as before
    from pareto.nightly_job import job as _nightly
    from pareto.study import search as _search

    monkeypatch.delenv("PARETO_TEST_SLOWDOWN_MS", raising=False)
    spec = SearchSpec.model_validate({**_spec(samples=700, rounds=5).model_dump(mode="json"), "slo": {"p99": "1s"}})
    # the whole space measured, unconfirmed: the night's search has nothing new to measure, only to confirm
    run_search(spec.model_copy(update={"search": spec.search.model_copy(update={"confirm_top": 0})}), db_url=db_url)
    before, reads_before = _preferred(db_url), _reads(db_url)
    with session_scope(open_engine(db_url)) as session:
        confirms_before = session.scalar(select(func.count()).where(Measurement.kind == "confirm"))

    def deadline(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt  # what the SIGTERM handler raises

    monkeypatch.setattr(_nightly._Job, "_change_point", deadline)  # the step after the night's search
    settings = NightlySettings(time_budget="60s", remeasure_top=0, summary_dir=str(tmp_path))
    seen: dict[str, Any] = {}
    real = _search.run_search

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen["result"] = real(*args, **kwargs)
        return seen["result"]

    monkeypatch.setattr(_search, "run_search", spy)
    with pytest.raises(KeyboardInterrupt):
        run_nightly(spec, settings, db_url=db_url, notice=lambda _: None)
    with session_scope(open_engine(db_url)) as session:
        confirms = session.scalar(select(func.count()).where(Measurement.kind == "confirm"))
    confirmed = seen["result"].confirmation  # the night's search confirmed before the deadline
    assert confirmed is not None and confirmed.runs and confirms > confirms_before
    assert _preferred(db_url) == before and _reads(db_url) == reads_before  # byte for byte


def _first_pass_in_a_slow_spell(monkeypatch: pytest.MonkeyPatch) -> None:
    """The night's first re-measurement ran through a slow spell of the host (10x on every round); its second
    pass did not: a noisy night."""
    from pareto.nightly_job import job as _nightly

    real = _nightly.compare
    calls = {"n": 0}

    def spell(trial: int, description: str, before: dict[str, Any], after: dict[str, Any], **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            after = {
                **after,
                "latency_p99_ms": 10 * after["latency_p99_ms"],
                "latency_p99_lower_ms": 10 * after["latency_p99_lower_ms"],
                "round_medians_ms": [10 * m for m in after["round_medians_ms"]],
            }
        return real(trial, description, before, after, **kw)

    monkeypatch.setattr(_nightly, "compare", spell)


def _reads(db_url: str) -> list[str]:
    """What the read commands answer for the study, as JSON text (``best`` may answer "nothing meets")."""
    import json

    answers = []
    for read in (pareto.best, pareto.frontier, pareto.explain):
        try:
            answers.append(json.dumps(read(study="night", db=db_url), sort_keys=True, default=str))
        except ParetoError as exc:
            answers.append(f"{type(exc).__name__}: {exc}")
    return answers


def _preferred(db_url: str) -> dict[int, int]:
    """Each trial's preferred measurement (the one best and frontier answer from)."""
    with session_scope(open_engine(db_url)) as session:
        rows = session.execute(
            select(Trial.optuna_number, Measurement.id).join(Trial).where(Measurement.preferred.is_(True))
        ).all()
    return dict(rows)


def test_an_interrupted_night_changes_no_answer(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SIGTERM (a CronJob's deadline) after the night's re-measurements were stored: they stay stored, held,
    # and best answers from what it answered before the night; the next night with a verdict promotes its own
    from pareto.nightly_job import job as _nightly

    monkeypatch.delenv("PARETO_TEST_SLOWDOWN_MS", raising=False)
    run_search(_spec(), db_url=db_url)
    settings = NightlySettings(time_budget="1s", remeasure_top=1, summary_dir=str(tmp_path))
    before = _preferred(db_url)
    best_before = pareto.best(study="night", db=db_url)
    reads_before = _reads(db_url)

    def deadline(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt  # what the SIGTERM handler raises

    monkeypatch.setattr(_nightly._Job, "_reproduce", deadline)
    with pytest.raises(KeyboardInterrupt):
        run_nightly(_spec(), settings, db_url=db_url, notice=lambda _: None)
    with session_scope(open_engine(db_url)) as session:
        held = session.scalars(
            select(Measurement.id).where(Measurement.kind == "confirm", ~Measurement.preferred)
        ).all()
    assert held, "the night stored its re-measurements"
    assert _preferred(db_url) == before
    assert pareto.best(study="night", db=db_url) == best_before
    assert _reads(db_url) == reads_before  # best, frontier and explain, byte for byte
    assert [r["status"] for r in pareto.history(study="night", db=db_url)] == ["interrupted"]

    monkeypatch.undo()
    monkeypatch.delenv("PARETO_TEST_SLOWDOWN_MS", raising=False)
    night = run_nightly(_spec(), settings, db_url=db_url, notice=lambda _: None)
    if night.status in ("ok", "regression"):
        assert night.summary["promoted"] >= 1 and _preferred(db_url) != before
    else:
        assert _preferred(db_url) == before
