"""A study at a request rate (``--qps``), end to end on every database: the trials' traffic figures, the
capacity, the load runs after the search, and the read side judging a rate from the database."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

import pareto
from pareto.errors import UsageError
from pareto.front import select_best
from pareto.limits import Constraints, Limits, evaluate
from pareto.metrics import TRAFFIC_FIELDS, Metrics
from pareto.spec import SearchSpec
from pareto.store import storage
from pareto.store.engine import open_engine
from pareto.study.load_runs import bisect_rate
from pareto.study.search import Quiet, run_search
from pareto.study.traffic import batchers, waits_ms
from tests.test_cli import one_sentence
from tests.test_cli import pareto as run_cli

#: a rate the tiny task serves well within its capacity on any machine (a call takes tens of µs), and an SLO
#: far above a busy machine's scheduling stalls: with four busy processes on two cores a load run at 1000/s
#: had a request P99 bound of 39 ms and a load-run capacity of 1 660/s within 50 ms (2 vCPU Xeon,
#: 2026-12-08), so CI's busier machine missed 1000/s within 50 ms
QPS = 500.0
SLO_MS = 200.0


#: few requests, replications and runs: the tiny task serves thousands a second
TRAFFIC = {
    "qps": f"{QPS:g}/s",
    "requests": 1000,
    "sweep_samples": 40,
    "load_requests": 800,
    "replications": 3,
    "serve_runs": 2,
    "serve_requests": 300,
    "load_replications": 2,
    "load_top": 1,
    "load_min_s": 0.0,
}


def spec(**changes: object) -> SearchSpec:
    data = {
        "task": "tests.tiny_task:make_task",
        "study": "traffic",
        "slo": {"p99": f"{SLO_MS:g}ms"},
        "traffic": dict(TRAFFIC),
        "search": {"n_trials": 3, "seed": 1, "confirm_top": 0},
        "measure": {"device": "cpu", "threads": 1, "warmup": 5, "samples": 80, "rounds": 4, "contention_limit": None},
        "space": {"batch_size": [1, 4], "techniques": {"prune_structured": {"ratio": [0.25, 0.5]}}},
    }
    data.update(changes)
    return SearchSpec.model_validate(data)


def test_a_rate_needs_an_slo_and_makes_capacity_an_objective() -> None:
    with pytest.raises(ValidationError, match="needs a P99 SLO"):
        SearchSpec.model_validate({"traffic": {"qps": "800/s"}})
    s = SearchSpec.model_validate({"slo": {"p99": "7ms"}, "traffic": {"qps": "800/s"}})
    assert s.traffic.qps == 800.0 and s.objectives == ["accuracy", "capacity"]
    assert s.constraints().qps == 800.0
    named = SearchSpec.model_validate({"slo": {"p99": "7ms"}, "traffic": {"qps": "800/s"}, "objectives": ["accuracy"]})
    assert named.objectives == ["accuracy"]
    assert SearchSpec().traffic.qps is None and SearchSpec().objectives == ["accuracy", "p99"]
    with pytest.raises(ValidationError, match="capacity objective needs a request rate"):
        SearchSpec.model_validate({"objectives": ["accuracy", "capacity"]})


@pytest.mark.parametrize(
    ("limit", "low", "high", "expected"),
    [
        (100.0, 80.0, 125.0, 100.0),  # between the ends
        (30.0, 80.0, 125.0, 30.0),  # below: halved until one meets, the miss the upper end
        (600.0, 80.0, 125.0, 600.0),  # above: doubled until one misses
        (5000.0, 80.0, 125.0, 1000.0),  # every doubling meets: the highest tried, never an untried rate
        (1.0, 80.0, 125.0, None),  # even the lowest misses
    ],
)
def test_the_load_run_capacity_bisects_on_rates_it_tried(
    limit: float, low: float, high: float, expected: float | None
) -> None:
    tried: list[float] = []

    def meets(rate: float) -> bool:
        tried.append(rate)
        return rate <= limit

    found = bisect_rate(meets, low, high, rel_tol=0.01)
    assert len(tried) == len(set(tried))  # no rate run twice
    if expected is None:
        assert found is None
        return
    assert found in tried and found <= limit and found == pytest.approx(expected, rel=0.02)


def test_the_waits_tried_are_fractions_of_the_slo_unless_listed() -> None:
    s = SearchSpec.model_validate({"slo": {"p99": "8ms"}, "traffic": {"qps": "10/s"}})
    assert waits_ms(s.traffic, 8.0) == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert [b.max_wait_ms for b in batchers(1, s.traffic, 8.0)] == [0.0]  # one request never waits for another
    listed = SearchSpec.model_validate({"slo": {"p99": "8ms"}, "traffic": {"qps": "10/s", "max_wait": ["1ms", "0ms"]}})
    assert [(b.max_batch, b.max_wait_ms) for b in batchers(8, listed.traffic, 8.0)] == [(8, 0.0), (8, 1.0)]


def _metrics(**traffic: object) -> dict[str, object]:
    base = {
        "accuracy": 0.9,
        "batch_size": 4,
        "latency_p99_upper_ms": 40.0,
        "samples": 1000,
        "memory_bytes": 10,
        "throughput_per_s": 100.0,
    }
    return {**base, **traffic}


def test_at_a_rate_the_capacity_decides_not_one_calls_p99() -> None:
    at_rate = Constraints(p99_ms=7.0, qps=800.0)
    assert [limit.name for limit, _ in at_rate.set()] == ["qps"]  # the call's own P99 (40 ms) is not the limit
    ok = evaluate(_metrics(scenario="server", qps=800.0, capacity_qps=900.0), at_rate)
    assert ok.feasible and ok.p99_verdict == "met"
    service = [{"batch": 1, "p99_ms": 2.0}]
    over = evaluate(
        _metrics(scenario="server", qps=800.0, capacity_qps=450.0, request_p99_upper_ms=31.0, service_curve=service),
        at_rate,
    )
    assert not over.feasible and over.p99_verdict == "missed"
    assert "over its capacity of 450/s" in over.violations[0] and "31.00 ms" in over.violations[0]
    assert "alone (one request, nothing queued) its call's P99 is 2.00 ms, within the SLO" in over.violations[0]
    none = evaluate(_metrics(scenario="server", capacity_qps=None), at_rate)
    assert not none.feasible and "no capacity" in none.violations[0]
    assert "qps" not in Constraints(p99_ms=7.0).to_dict()  # single-stream answers keep their keys
    assert Constraints(p99_ms=7.0, qps=5.0).to_dict()["qps"] == 5.0


def test_a_rate_is_asked_of_a_study_searched_at_one_and_at_its_slo() -> None:
    single = {"slo": {"p99": 7.0}}
    with pytest.raises(UsageError, match="searched one call at a time"):
        Limits(qps="800/s").constraints(single)
    at_rate = {"slo": {"p99": 7.0}, "traffic": {"qps": 800.0}}
    assert Limits().constraints(at_rate).qps == 800.0  # the study's own rate by default
    assert Limits(qps=1000).constraints(at_rate).qps == 1000.0
    with pytest.raises(UsageError, match="found at its SLO of 7.00 ms, not at 5.00 ms"):
        Limits(slo_p99="5ms").constraints(at_rate)
    with pytest.raises(UsageError, match="must be above 0 requests per second"):
        Limits(qps="-3/s").given()
    for bad in ("1e400/s", "nan", "inf"):
        with pytest.raises(UsageError, match="not a finite number"):
            Limits(qps=bad).given()
    with pytest.raises(UsageError, match="must be above 0"):
        Limits(qps="0/s").given()
    assert Limits(qps="300").constraints(at_rate).qps == 300.0  # a bare number is requests per second


def test_single_stream_metrics_leave_the_traffic_fields_out() -> None:
    fields = {"accuracy": 1.0, "batch_size": 1, "latency_mean_ms": 1.0, "latency_p50_ms": 1.0}
    fields |= {"latency_p90_ms": 1.0, "latency_p99_ms": 1.0, "latency_p999_ms": 1.0, "p99_p50_ratio": 1.0}
    fields |= {"samples": 1, "warmup": 0, "confidence": 0.99, "method": "m", "throughput_per_s": 1.0}
    fields |= {"params_bytes": 1, "theoretical_bytes": 1, "compression_ratio": 1.0}
    single = Metrics(**fields).to_dict()  # type: ignore[arg-type]
    assert not set(TRAFFIC_FIELDS) & set(single)
    served = Metrics(**fields, scenario="server", qps=5.0).to_dict()  # type: ignore[arg-type]
    assert set(TRAFFIC_FIELDS) <= set(served)


class _Notices(Quiet):
    """The search's notices, kept: a failed assertion shows what the load runs said."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def notice(self, message: str) -> None:
        self.said.append(message)


def test_a_search_at_a_rate_stores_capacity_and_load_runs_and_reads_answer_at_a_rate(db_url: str) -> None:
    notices = _Notices()
    result = run_search(spec(), db_url=db_url, reporter=notices)
    assert result.best is not None, notices.said
    m = result.best.metrics
    assert m["scenario"] == "server" and m["qps"] == QPS
    assert m["capacity_qps"] > QPS and m["request_p99_upper_ms"] <= SLO_MS
    assert m["max_batch"] == result.best.config["batch_size"]
    assert m["max_wait_ms"] in waits_ms(spec().traffic, SLO_MS)
    assert m["service_curve"][0]["batch"] == 1
    assert any(point["qps"] == QPS for point in m["traffic_curve"])
    load = result.best.load_run
    assert load is not None and load["qps"] == QPS and load["requests"] > 0 and "generator" in load["method"]
    assert load["replications"] == 2 and 1 <= len(load["runs"]) <= 2 and load["threads"] == m["serve_threads"]
    # the serving path measured: two runs at each thread count tried, the costs drawn from them
    assert {r["threads"] for r in m["serving_runs"]} == {1} and len(m["serving_runs"]) == 2  # threads 1 here
    assert all(row["served_mean_ms"] > 0 for row in m["service_curve"])
    # the load run decides: the pick's capacity was found by load runs, and a rate is judged by it
    assert m["load_capacity_qps"] is not None and m["load_capacity_qps"] >= QPS
    assert result.best.slo["capacity_source"] == "load-run"
    assert result.best.slo["capacity_qps"] == m["load_capacity_qps"]

    engine = open_engine(db_url)
    try:
        everything = storage.study_candidates(engine, _study_id(engine), None)
    finally:
        engine.dispose()
    for rate in (QPS, 0.5 * m["capacity_qps"], 2.0 * max(c.metrics["capacity_qps"] or 0 for c in everything)):
        constraints = Constraints(p99_ms=SLO_MS, qps=rate)
        try:
            expected = select_best(everything, constraints, study="traffic").trial
        except Exception:
            expected = None
        try:
            found = pareto.best(study="traffic", qps=rate, db=db_url)["trial"]
        except Exception:
            found = None
        assert found == expected, rate  # the database's SQL and the Python rule agree
    answer = pareto.best(study="traffic", db=db_url)
    assert answer["slo"]["qps"] == QPS and answer["load_run"]["qps"] == QPS
    front = pareto.frontier(study="traffic", db=db_url)
    assert front and all("capacity_qps" in c["metrics"] for c in front)
    with pytest.raises(UsageError, match=f"found its capacities at P99 ≤ {SLO_MS:g} ms"):
        run_search(spec(slo={"p99": "40ms"}), db_url=db_url)
    with pytest.raises(UsageError, match=f"was searched at {QPS:,.4g} requests/s"):
        run_search(spec(traffic={}), db_url=db_url)
    with pytest.raises(UsageError, match="continue it at that rate"):
        run_search(spec(traffic={"qps": "300/s"}), db_url=db_url)
    _the_report_shows_the_rate(db_url, result.best.trial)
    with pytest.raises(UsageError, match="traffic.seed = 0, not 7"):
        run_search(spec(traffic={**TRAFFIC, "seed": 7}), db_url=db_url)
    unnamed = {k: v for k, v in TRAFFIC.items() if k != "requests"}  # left out: the study's own
    notices.said.clear()
    again = run_search(
        spec(traffic=unnamed, search={"n_trials": 1, "seed": 2, "confirm_top": 0}), db_url=db_url, reporter=notices
    )
    assert again.best is not None, notices.said
    # beyond every capacity stored now (the new trial's and the load runs' too), so nothing qualifies
    engine = open_engine(db_url)
    try:
        now = storage.study_candidates(engine, _study_id(engine), None)
    finally:
        engine.dispose()
    far = 2.0 * max(max(c.metrics["capacity_qps"] or 0, c.metrics.get("load_capacity_qps") or 0) for c in now)
    why = pareto.explain(study="traffic", qps=far, db=db_url)
    needs = [n for item in why["nearest"] for n in item["needs"]]
    assert needs and all("requests/s more capacity" in n for n in needs)


def _the_report_shows_the_rate(db_url: str, pick: int) -> None:
    """The report of a study at a rate: the front against capacity, the P99 against the rate, and the pick's
    capacity and load run on its card (the page in a browser: ``test_report_html``)."""
    import tempfile

    pytest.importorskip("matplotlib")
    from pareto.report.html import write_report

    with tempfile.TemporaryDirectory() as out:
        written = write_report(Path(out) / "r", study="traffic", db=db_url)
        names = {Path(f).name for f in written["figures"]}
        assert {"pareto.png", "rate.png"} <= names, written["skipped"]
        page = Path(written["index"]).read_text()
    assert "accuracy against capacity" in page and "Request P99 against the arrival rate" in page
    assert f"The pick: trial {pick}" in page and "load-run" in page and "load run" in page


def _study_id(engine: object) -> int:
    from sqlalchemy import select

    from pareto.store.engine import session_scope
    from pareto.store.models import Study

    with session_scope(engine) as session:  # type: ignore[arg-type]
        return int(session.scalar(select(Study.id).where(Study.name == "traffic")))  # type: ignore[arg-type]


def test_the_cli_answers_a_rate_and_refuses_one_a_study_cannot_answer(db_url: str, tmp_path: Path) -> None:
    # no serving or capacity load runs here (the test above has them): the reads are what is tested
    run_search(spec(traffic={**TRAFFIC, "serve_runs": 0, "load_top": 0}), db_url=db_url)
    ok = run_cli("best", "--db", db_url, "--json", "--qps", f"{QPS:g}/s", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["slo"]["qps"] == QPS
    table = run_cli("best", "--db", db_url, cwd=tmp_path)
    assert table.returncode == 0 and "capacity" in table.stdout and "load run" in table.stdout
    far = run_cli("best", "--db", db_url, "--qps", "100000000/s", cwd=tmp_path)
    assert far.returncode == 1 and "over its capacity" in one_sentence(far)
    other = run_cli("best", "--db", db_url, "--slo-p99", "5ms", "--qps", "10/s", cwd=tmp_path)
    assert other.returncode == 2 and "found at its SLO" in one_sentence(other)
    bad = run_cli("best", "--db", db_url, "--qps", "fast", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    for text, says in (("1e400/s", "not a finite number"), ("0", "must be above 0"), ("nan", "not a finite number")):
        refused = run_cli("best", "--db", db_url, "--qps", text, cwd=tmp_path)
        assert refused.returncode == 2 and says in one_sentence(refused), text
    bare = run_cli("best", "--db", db_url, "--json", "--qps", f"{QPS:g}", cwd=tmp_path)
    assert bare.returncode == 0 and json.loads(bare.stdout)["slo"]["capacity_source"] in (
        "load-run",
        "simulated, not load-run",
    )


def test_the_export_manifest_names_the_serving_settings_and_the_capacity_it_was_judged_by() -> None:
    from pareto.export.manifest import _at_rate

    assert _at_rate({"scenario": None}) == {}  # a single-stream study's manifest is as it was
    m = {"scenario": "server", "qps": 800.0, "capacity_qps": 1000.0, "capacity_max_batch": 4}
    m |= {"capacity_max_wait_ms": 1.0, "serve_threads": 1}
    simulated = _at_rate(m)["traffic"]
    assert simulated["capacity_source"] == "simulated, not load-run" and simulated["max_wait_ms"] == 1.0
    m |= {"load_capacity_qps": 900.0, "load_capacity_max_batch": 4, "load_capacity_max_wait_ms": 2.0}
    loaded = _at_rate(m)["traffic"]
    assert loaded["capacity_qps"] == 900.0 and loaded["capacity_source"] == "load-run"
    assert loaded["max_wait_ms"] == 2.0 and loaded["intra_op_threads"] == 1


def test_a_study_stored_before_the_serving_path_keeps_its_simulation_when_continued() -> None:
    from types import SimpleNamespace

    from pareto.study.studies import adopt_stored_traffic

    old = {"traffic": {"qps": 200.0, "seed": 0, "max_wait": None, "requests": 5000, "sweep_samples": 200}}
    writer = SimpleNamespace(study_named=lambda name: SimpleNamespace(spec=old))
    kept = adopt_stored_traffic(writer, spec(traffic={"qps": "200/s"}))  # type: ignore[arg-type]
    assert kept.traffic.requests == 5000 and kept.traffic.replications == 1
    assert kept.traffic.serve_runs == 0 and kept.traffic.load_min_s == 0.0  # calls timed alone, as then
    with pytest.raises(UsageError, match="traffic.serve_runs = 0, not 3"):
        adopt_stored_traffic(writer, spec(traffic={"qps": "200/s", "serve_runs": 3}))  # type: ignore[arg-type]


class _FakeTarget:
    """A served configuration whose load runs meet the SLO below a capacity that depends on its layout."""

    def __init__(self, capacity: dict[tuple[int, int], float], serving_runs: list[dict[str, int]]) -> None:
        from pareto.measure.queue import Batcher

        self.capacity, self.batcher, self.threads = capacity, Batcher(4, 1.0), 1
        self.candidate = SimpleNamespace(metrics={"serving_runs": serving_runs})
        self.ran: list[tuple[tuple[int, int], float]] = []

    @property
    def layout(self) -> tuple[int, int]:
        return self.batcher.instances, self.threads

    def use_layout(self, layout: tuple[int, int]) -> None:
        self.batcher, self.threads = dataclasses.replace(self.batcher, instances=layout[0]), layout[1]

    def run_checked(self, rate: float, requests: int, **_: object) -> dict[str, object]:
        self.ran.append((self.layout, rate))
        meets = rate <= self.capacity[self.layout]
        return {"qps": rate, "valid": meets, "p99_upper_ms": 5.0 if meets else 50.0}


def test_the_load_runs_choose_the_serving_layout() -> None:
    """The layout the simulation chose (1 × 1) reaches 1 000/s; 2 instances reach 1 400/s and take over
    after a bisection above 1.1× 1 000/s; 1 × 2 misses its first rate and costs one run."""
    from pareto.study.load_runs import CHALLENGE_STEP, _challenge_layouts

    layouts = {(1, 1): 1_000.0, (1, 2): 900.0, (2, 1): 1_400.0}
    target = _FakeTarget(layouts, [{"instances": i, "threads": t} for i, t in layouts] + [{"threads": 1}])
    runs: list[dict[str, object]] = []
    from pareto.study.load_runs import RunPlan

    kwargs = RunPlan(requests=100, seed=0, replications=1, run_id=None)
    found = _challenge_layouts(target, 7.0, 1_000.0, 1_200.0, runs, kwargs)  # type: ignore[arg-type]
    assert target.layout == (2, 1) and found is not None and 1_400 / 1.06 <= found <= 1_400
    assert [r for lay, r in target.ran if lay == (1, 2)] == [pytest.approx(CHALLENGE_STEP * 1_000)]
    assert len(runs) == len(target.ran) and len({(lay, r) for lay, r in target.ran}) == len(target.ran)
    # a layout that does no better leaves the simulation's in place
    target = _FakeTarget({(1, 1): 1_000.0, (2, 1): 1_050.0}, [{"instances": 2, "threads": 1}, {"threads": 1}])
    assert _challenge_layouts(target, 7.0, 1_000.0, 1_200.0, [], kwargs) == 1_000.0  # type: ignore[arg-type]
    assert target.layout == (1, 1)


def test_serving_layouts_fit_the_cores_unless_the_spec_asks() -> None:
    from pareto.spec import Traffic
    from pareto.study.traffic import serve_layouts

    assert serve_layouts(Traffic(qps=100), 2) == [(1, 1), (1, 2), (2, 1)]
    assert serve_layouts(Traffic(qps=100), 1) == [(1, 1)]
    assert serve_layouts(Traffic(qps=100), 4) == [(1, 1), (1, 4), (4, 1)]
    assert serve_layouts(Traffic(qps=100, serve_instances=[1, 2], serve_threads=[2]), 2) == [(1, 2)]
    assert serve_layouts(Traffic(qps=100, serve_instances=[3], serve_threads=[2]), 2) == [(3, 2)]  # none fits
    with pytest.raises(ValidationError):
        Traffic(qps=100, serve_instances=[0])
