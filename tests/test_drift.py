"""Drift-corrected nightly comparisons: the noise band, change points, the reference, the decision."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from pareto.measure.reference import (
    KIND,
    Reference,
    freeze,
    reference_input,
    reference_model,
    size_batch,
    size_reference,
    thaw,
)
from pareto.nightly_job.history import DriftHistory, NightDrift, whose
from pareto.nightly_job.regression import compare_corrected
from pareto.nightly_job.stats import DEFAULT_SIGMA, MIN_HISTORY, change_points, level, noise_band, residuals

SIGMA = {"p50": 0.015, "p99": 0.08}


def test_the_band_is_the_default_until_there_is_history_then_learned_and_pooled() -> None:
    few = noise_band([0.01] * (MIN_HISTORY - 1), "p50")
    assert few.source == "default" and few.sigma == DEFAULT_SIGMA["p50"] and few.residuals == 0
    rng = np.random.default_rng(0)
    quiet = noise_band(list(rng.normal(0, 0.005, 200)), "p50")
    loud = noise_band(list(rng.normal(0, 0.2, 200)), "p50")
    assert quiet.source == "history" and quiet.residuals == 200
    # a quiet history narrows the band, a loud one widens it; 200 nights outweigh the default
    assert quiet.threshold < few.threshold < loud.threshold
    assert loud.sigma == pytest.approx(0.2, rel=0.15)
    # a short quiet history is pooled with the default: narrower than the default, wider than 200 nights of it
    short = noise_band(list(rng.normal(0, 0.005, MIN_HISTORY)), "p50")
    assert quiet.threshold < short.threshold < few.threshold
    assert few.smallest_detectable > few.threshold > 1.0
    assert noise_band([0.0] * 50, "p99").sigma > 0  # identical nights are not a noiseless machine


def test_the_band_holds_its_false_alarm_rate_on_simulated_nights() -> None:
    rng = np.random.default_rng(1)
    history = list(rng.normal(0, 0.05, 300))
    band = noise_band(residuals([history]), "p99", false_alarm=0.01)
    fresh = [rng.normal(0, 0.05) - level(history[-7:]) for _ in range(4000)]
    alarms = np.mean([math.exp(r) > band.threshold for r in fresh])
    assert alarms < 0.03  # about 1 % asked; the level's own noise adds a little
    slower = np.mean([math.exp(r + math.log(band.smallest_detectable)) > band.threshold for r in fresh])
    assert slower > 0.85


def test_change_points_none_in_noise_a_step_and_a_creep_found() -> None:
    rng = np.random.default_rng(2)
    quiet = [change_points(list(rng.normal(0, 0.05, 30)), seed=k) for k in range(10)]
    assert sum(bool(found) for found in quiet) <= 1
    step = [*rng.normal(0, 0.05, 20), *rng.normal(0.2, 0.05, 6)]
    (found,) = change_points(step)
    assert 19 <= found.index <= 21 and 1.1 < found.ratio < 1.4 and found.p_value < 0.01
    creep = [*rng.normal(0, 0.015, 30), *(math.log(1.03) * n + rng.normal(0, 0.015) for n in range(1, 11))]
    found_creep = change_points(creep)
    assert found_creep and 29 <= found_creep[-1].index <= 36 and found_creep[-1].ratio > 1.1
    assert change_points([0.0, 0.1]) == []  # too short to split


def test_the_reference_is_the_same_network_in_every_process_and_sized_to_a_target() -> None:
    a, b = reference_model("cpu"), reference_model("cpu")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    small = size_reference(0.001, "cpu", threads=1)
    large = size_reference(2.0, "cpu", threads=1)
    assert small.batch == 1 and large.batch > small.batch
    assert reference_input(large, "cpu").shape[0] == large.batch
    assert Reference.from_dict({"kind": KIND, "batch": 8}) == Reference(8)
    frozen = Reference.from_dict({"kind": "frozen:abc123", "batch": 4, "source": "trial 3 as served"})
    assert frozen is not None and frozen.frozen and frozen.digest == "abc123" and "trial 3" in frozen.describe()
    assert Reference.from_dict({"kind": "another-reference", "batch": 8}) is None
    assert Reference.from_dict(None) is None


def test_a_frozen_reference_is_the_model_as_it_was_whatever_its_code_does_later() -> None:
    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear, self.scale = torch.nn.Linear(4, 4), 1.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x) * self.scale

    model, x = Scaled().eval(), torch.randn(3, 4)
    blob, kind = freeze(model, x)
    _, same = freeze(model, x)
    assert kind.startswith("frozen:") and len(Reference(3, kind).digest) == 64 and kind == same
    frozen = thaw(blob, kind)
    frozen.eval()  # an exported program refuses eval(); the reference takes it
    expected = model(x)
    model.scale = 100.0  # the model's code path changes after freezing; the frozen copy does not
    assert torch.allclose(frozen(x), expected) and not torch.allclose(model(x), expected)
    assert size_batch(model, lambda b: torch.randn(b, 4), 1e-6, "cpu", max_batch=8) == 1


def test_an_eager_int8_model_that_export_refuses_is_traced_with_its_int8_kernels() -> None:
    import warnings

    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the int8 path pareto's int8_dynamic serves
        model = quantize_dynamic(
            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), {torch.nn.Linear}
        )
    x = torch.randn(5, 16)
    blob, kind = freeze(model, x)
    reference = Reference(5, kind, source="trial 1 as served")
    assert kind.startswith("traced:") and reference.frozen and "TorchScript" in reference.describe()
    assert Reference.from_dict(reference.to_dict()) == reference
    frozen = thaw(blob, kind)
    frozen.eval()
    assert torch.equal(frozen(x), model(x))
    assert "quantized::linear_dynamic" in str(frozen.program.inlined_graph)  # the same int8 kernel


def _night(
    status: str, values: dict[int, tuple[float, float]], *, reference: int = 8, started: str = ""
) -> dict[str, Any]:
    """A stored summary: {trial: (p50, p99)} measured beside a reference timed at 1 ms."""
    measured = [
        {
            "trial": trial,
            "corrected_p50": p50,
            "corrected_p99": p99,
            "p50_ms": p50 * 1.0,
            "p99_ms": p99 * 1.2,
        }
        for trial, (p50, p99) in values.items()
    ]
    drift = {
        "reference": {"kind": KIND, "batch": reference},
        "reference_p50_ms": 1.0,
        "reference_p99_ms": 1.2,
        "measured": measured,
    }
    return {"status": status, "started_at": started, "drift": drift}


def _result(values: dict[int, tuple[float, float]], reference: tuple[float, float], baseline: int = 0) -> Any:
    items = [
        SimpleNamespace(
            trial=trial,
            is_baseline=trial == baseline,
            after={"latency_p50_ms": p50, "latency_p99_ms": p99},
        )
        for trial, (p50, p99) in values.items()
    ]
    ref = {"latency_p50_ms": reference[0], "latency_p99_ms": reference[1], "busy": False}
    return SimpleNamespace(items=items, reference=ref)


def _history(n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    nights = []
    for k in range(n):
        noise = {t: (rng.normal(0, SIGMA["p50"]), rng.normal(0, SIGMA["p99"])) for t in (0, 5)}
        base = {0: (8.0, 10.0), 5: (1.0, 1.3)}
        values = {t: (base[t][0] * math.exp(noise[t][0]), base[t][1] * math.exp(noise[t][1])) for t in base}
        nights.append(_night("ok", values, started=f"2026-11-{k + 1:02d}T03:00:00"))
    return nights


def _compare(drift: NightDrift, tonight: Any) -> Any:
    measured = drift.record(tonight, "first pass")
    base = drift.ratios(measured[0])
    before = {"latency_p99_ms": 1.3}
    after = {"latency_p99_ms": measured[5].p99_ms}
    return compare_corrected(
        5,
        "pick",
        before,
        after,
        ratios=drift.ratios(measured[5]) or {},
        raw_p50_ratio=drift.measured_ratio(measured[5]),
        bands=drift.bands,
        reference_ratio=drift.reference_ratio(),
        baseline_ratios=base,
        slo_ms=None,
    )


def test_a_slower_machine_is_not_a_regression_a_slower_model_and_a_slower_configuration_are() -> None:
    rng = np.random.default_rng(3)
    summaries = _history(20, rng)
    drift = NightDrift(summaries, false_alarm=0.01)
    assert drift.bands["p50"].source == "history" and drift.reference == Reference(8)
    # the whole machine 1.5x slower tonight: every configuration and the reference alike
    machine = _compare(drift, _result({0: (12.0, 15.0), 5: (1.5, 1.95)}, (1.5, 1.8)))
    assert machine.ratio > 1.4 and not machine.regression and machine.basis == "drift-corrected"
    assert drift.reference_ratio() == pytest.approx(1.5)
    # the model 1.25x slower: the pick and the baseline, not the reference
    drift = NightDrift(summaries, false_alarm=0.01)
    model = _compare(drift, _result({0: (10.0, 12.5), 5: (1.25, 1.625)}, (1.0, 1.2)))
    assert model.regression and model.kind == "model" and "the baseline too" in model.reason
    # a kernel regression of the pick alone
    drift = NightDrift(summaries, false_alarm=0.01)
    kernel = _compare(drift, _result({0: (8.0, 10.0), 5: (1.25, 1.625)}, (1.0, 1.2)))
    assert kernel.regression and kernel.kind == "configuration" and "this configuration" in kernel.reason
    assert kernel.corrected_p50_ratio == pytest.approx(1.25, rel=0.05)


def test_a_night_faster_than_the_level_calls_slower_only_what_is_slower_as_measured_too() -> None:
    # the level was set on loaded nights (the reference at 2 ms, the small pick at 1.3 ms: it slowed
    # less than the reference); tonight the machine is quiet: the reference at 1 ms, the pick at 1 ms
    loaded = [_night("ok", {0: (8.0, 10.0), 5: (0.65, 0.8)}, started=f"2026-11-0{k}") for k in range(1, 3)]
    for night in loaded:
        night["drift"].update(reference_p50_ms=2.0, reference_p99_ms=2.4)
        for m in night["drift"]["measured"]:
            m["p50_ms"], m["p99_ms"] = 2.0 * m["corrected_p50"], 2.4 * m["corrected_p99"]
    drift = NightDrift(loaded, false_alarm=1e-6)
    quiet = _compare(drift, _result({0: (8.0, 10.0), 5: (1.0, 1.25)}, (1.0, 1.2)))
    # ×1.54 with the drift taken out, ×0.77 as measured: the drift's doing, no verdict
    assert quiet.corrected_p50_ratio == pytest.approx(1.0 / 0.65, rel=0.01) and quiet.corrected_p50_ratio > 1.2
    assert not quiet.regression and quiet.inconclusive and "as measured" in quiet.inconclusive
    assert "the reference at ×0.50 its usual P50" in quiet.reason
    # a pick that got 3x slower is slower both ways, a quiet night or not
    drift = NightDrift(loaded, false_alarm=1e-6)
    slow = _compare(drift, _result({0: (8.0, 10.0), 5: (3.9, 4.8)}, (1.0, 1.2)))
    assert slow.regression and slow.kind == "configuration" and not slow.inconclusive


def test_history_keeps_to_one_reference_skips_regressions_in_levels_and_reports_change_points_once() -> None:
    rng = np.random.default_rng(4)
    summaries = _history(12, rng)
    summaries.append(_night("regression", {5: (2.0, 2.6)}))  # a regression night does not move the level
    summaries.insert(0, _night("ok", {5: (9.0, 9.0)}, reference=64))  # another reference: another yardstick
    history = DriftHistory(summaries)
    assert len(history) == 13 and history.level(5, "p50") == pytest.approx(0.0, abs=0.03)
    # a creep: 3 % a night over 10 nights, found by the end of it, reported as new once
    nights = _history(25, rng)
    for n in range(1, 11):
        drift = NightDrift(nights, false_alarm=0.01)
        drift.record(_result({5: (1.03**n, 1.3 * 1.03**n)}, (1.0, 1.2)), "first pass")
        found = drift.find_change_point(5, f"2026-12-{n:02d}T03:00:00")
        summary = _night("ok", {5: (1.03**n, 1.3 * 1.03**n)}, started=f"2026-12-{n:02d}T03:00:00")
        summary["drift"]["change_point"] = found
        nights.append(summary)
    assert found is not None and found["ratio"] > 1.1 and found["since"] >= "2026-11-25"
    news = [s["drift"]["change_point"]["new"] for s in nights[25:] if s["drift"]["change_point"]]
    assert news[0] is True and news.count(True) <= 2


def test_an_slo_or_a_p99_that_moved_while_the_p50_stayed_is_no_verdict_a_slower_p50_is_a_regression() -> None:
    bands = {s: noise_band([], s) for s in ("p50", "p99")}
    before = {"latency_p99_ms": 4.0, "latency_p99_lower_ms": 3.5, "latency_p99_upper_ms": 5.0, "samples": 2000}
    after = {"latency_p99_ms": 8.0, "latency_p99_lower_ms": 7.5, "latency_p99_upper_ms": 9.0, "samples": 2000}
    common: dict[str, Any] = {
        "bands": bands,
        "reference_ratio": 1.1,
        "baseline_ratios": {"p50": 1.0, "p99": 1.0},
        "slo_ms": 7.0,
    }
    machine = compare_corrected(
        1, "pick", before, after, ratios={"p50": 1.0, "p99": 1.0}, reference_p99_ratio=2.0, **common
    )
    assert not machine.regression and not machine.lost_slo and machine.inconclusive
    assert "usual speed 4.5 ms" in machine.reason and "no verdict" in machine.reason
    tail = compare_corrected(1, "pick", before, after, ratios={"p50": 1.02, "p99": 1.9}, **common)
    assert not tail.regression and tail.inconclusive and "tail" in tail.reason
    quiet = {**before, "latency_p99_ms": 5.5, "latency_p99_upper_ms": 6.0}
    tail_only = compare_corrected(1, "pick", before, quiet, ratios={"p50": 1.0, "p99": 1.9}, **common)
    assert not tail_only.regression and tail_only.inconclusive and "P99 ×1.90" in tail_only.reason
    model = compare_corrected(1, "pick", before, after, ratios={"p50": 1.3, "p99": 1.3}, **common)
    assert model.regression and model.lost_slo and not model.inconclusive and model.kind == "configuration"
    fine = compare_corrected(1, "pick", before, quiet, ratios={"p50": 1.01, "p99": 1.05}, **common)
    assert not fine.regression and not fine.inconclusive and "within the noise bands" in fine.reason


def test_a_creep_that_goes_on_after_the_pick_moved_is_followed_in_the_baselines_series() -> None:
    rng = np.random.default_rng(5)
    nights = _history(25, rng)  # the baseline (trial 0) and the pick (trial 5), steady

    def night(n: int, values: dict[int, tuple[float, float]], pick: int) -> dict[str, Any] | None:
        drift = NightDrift(nights, false_alarm=0.01)
        drift.record(_result(values, (1.0, 1.2)), "first pass")
        found = drift.find_change_point(pick, f"2026-12-{n:02d}T03:00:00", baseline=0)
        summary = _night("regression", values, started=f"2026-12-{n:02d}T03:00:00")
        summary["drift"]["change_point"] = found
        nights.append(summary)
        return found

    slower = [1.03**n for n in range(1, 11)]  # the model 3 % slower a night: every configuration
    for n in range(1, 8):
        found = night(n, {0: (8.0 * slower[n - 1], 10.0 * slower[n - 1]), 5: (slower[n - 1], 1.3 * slower[n - 1])}, 5)
    assert found is not None and found["series"] == "pick" and found["trial"] == 5
    # the pick moved to trial 9 (measured beside the reference once, the night before): too few nights of
    # its own, so the creep is followed in the baseline's series, from the same night as before: not new
    nights[-1]["drift"]["measured"].append({"trial": 9, "corrected_p50": 0.9 * slower[6], "corrected_p99": 1.2})
    found = night(8, {0: (8.0 * slower[7], 10.0 * slower[7]), 9: (0.9 * slower[7], 1.2 * slower[7])}, 9)
    assert found is not None and found["series"] == "baseline" and found["trial"] == 0 and not found["new"], found
    assert whose(found).startswith("the model's (the baseline, trial 0")
    # a pick with nights of its own is judged on them: the baseline alone slower does not count for it
    steady = _history(25, rng)
    drift = NightDrift(steady, false_alarm=0.01)
    drift.record(_result({0: (8.0 * 1.5, 10.0 * 1.5), 5: (1.0, 1.3)}, (1.0, 1.2)), "first pass")
    assert drift.find_change_point(5, "2026-12-01T03:00:00", baseline=0) is None
