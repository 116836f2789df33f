from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pareto.errors import UsageError
from pareto.spec import DEFAULT_SPACE, SearchSpec, load_spec

ROOT = Path(__file__).resolve().parents[1]


def test_default_spec_is_the_demo_config() -> None:
    from_file = load_spec(ROOT / "configs" / "demo.yaml")
    assert from_file == SearchSpec(slo={"p99": "7ms"})
    assert from_file.space.model_dump() == SearchSpec().space.model_dump()
    assert set(DEFAULT_SPACE["techniques"]) == set(from_file.space.techniques)


def test_cli_flags_override_yaml(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"slo": {"p99": "9ms", "min_accuracy": 0.5}, "search": {"n_trials": 4}}))
    spec = load_spec(path, {"slo.p99": "500us", "search.seed": 3, "search.n_trials": None})
    assert spec.slo.p99 == pytest.approx(0.5)
    assert spec.slo.min_accuracy == 0.5
    assert spec.search.n_trials == 4
    assert spec.search.seed == 3


def test_study_name_defaults_to_task() -> None:
    assert SearchSpec().study_name == "demo"
    assert SearchSpec(task="pkg.mod:make_task").study_name == "make_task"
    assert SearchSpec(study="x").study_name == "x"


def _start(point: str) -> str:
    space = "{batch_size: [1, 8], techniques: {int8_dynamic: {}, prune_structured: {ratio: {low: 0.2, high: 0.8}}}}"
    return f"space: {space}\nsearch: {{start_with: [{point}]}}"


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        ("slo: {p99: 7}", "has no unit"),
        ("slo: {p99: 7parsecs}", "Unknown time unit"),
        ("space: {techniques: {magic_speedup: {}}}", "unknown technique 'magic_speedup'"),
        ("space: {techniques: {lowrank: {rank: [1]}}}", "has no parameter 'rank'"),
        ("space: {techniques: {lowrank: {}}}", "exactly one"),
        ("space: {techniques: {prune_structured: {}}}", "needs a space for 'ratio'"),
        ("objectives: [accuracy, speed]", "objectives"),
        ("slo: {min_throughput: 500}", "has no unit"),
        ("scenario: cloud", "scenario"),
        ("space: {techniques: {prune_unstructured: {sparsity: [0.5, 1.5]}}}", "sparsity"),
        ("space: {techniques: {prune_unstructured: {sparsity: {low: 0.9, high: 0.1}}}}", "must be below"),
        ("search: {n_trials: 0}", "n_trials"),
        ("bogus: 1", "unknown key"),
        ("slo: [1, 2]", "slo"),
        ("task: demo\n  nested: : :", "malformed YAML"),
        ("- a list", "must be a YAML mapping"),
        # start points: one configuration of the space each
        (_start("{backend: onnxruntime, techniques: {int8_dynamic: {}}}"), r"start_with\[0\]: int8_dynamic runs on"),
        (_start("{techniques: {prune_structured: {ratio: 0.5, amout: 1}}}"), "has no parameter 'amout'"),
        (_start("{techniques: {lowrank: {rank_ratio: 0.2}}}"), "'lowrank' is not in the space"),
        (_start("{techniques: {prune_structured: {}}}"), "give prune_structured's 'ratio'"),
        (_start("{techniques: {prune_structured: {ratio: 0.95}}}"), "outside the space"),
        (_start("{techniques: {int8_dynamic: {kernels: torchao}}}"), "is not searched"),
        (_start("{batch_size: 3, techniques: {}}"), "batch size 3 is not in"),
        (
            "space: {techniques: {lowrank: {rank_ratio: {low: 0.1, high: 0.5, step: 0.1}}}}\n"
            "search: {start_with: [{techniques: {lowrank: {rank_ratio: 0.25}}}]}",
            "in steps of 0.1",
        ),
    ],
)
def test_bad_specs_are_one_sentence(tmp_path: Path, content: str, phrase: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(UsageError, match=phrase) as info:
        load_spec(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="Cannot read config"):
        load_spec(tmp_path / "nope.yaml")


def test_scenarios_fill_in_what_is_unsaid() -> None:
    serving = SearchSpec(scenario="serving")
    assert serving.objectives == ["accuracy", "throughput", "memory"]
    assert serving.space.batch_size and len(serving.space.batch_size) > 1
    assert "int8_dynamic" in serving.space.techniques  # the default techniques stay
    mobile = SearchSpec(scenario="mobile", objectives=["accuracy", "p99"])
    assert mobile.objectives == ["accuracy", "p99"] and mobile.space.batch_size == [1]  # explicit wins
    realtime = SearchSpec(scenario="realtime", measure={"threads": 1})
    assert realtime.measure.confidence == 0.995 and realtime.measure.threads == 1


def test_throughput_floor_and_hardware_off() -> None:
    spec = load_spec(None, {"slo.min_throughput": "500/s", "measure.hardware": "none"})
    assert spec.slo.min_throughput == 500.0
    assert spec.measure.hardware is None


def test_measurement_settings_are_checked() -> None:
    from pareto.errors import UsageError
    from pareto.spec import validate_spec

    with pytest.raises(UsageError, match="confidence: Input should be greater than or equal to 0.9"):
        validate_spec({"measure": {"confidence": 0.5}})  # below the floor: "met" would mean little
    with pytest.raises(UsageError, match="rounds"):
        validate_spec({"measure": {"samples": 10, "rounds": 20}})
    with pytest.raises(UsageError, match="contention_limit"):
        validate_spec({"measure": {"contention_limit": 1.0}})
    assert SearchSpec().measure.confidence == 0.99 and SearchSpec().measure.rounds == 20


@pytest.mark.parametrize(
    "path", sorted(p for p in (ROOT / "configs").glob("*.yaml") if p.name != "nightly.yaml"), ids=lambda p: p.name
)
def test_every_shipped_search_config_is_a_valid_spec(path: Path) -> None:
    spec = load_spec(path)
    assert spec.space.techniques  # each names what it searches


def test_the_default_cuda_space_is_a_valid_space_without_conflicting_defaults() -> None:
    from pareto.spec import DEFAULT_CUDA_SPACE, Space

    space = Space.model_validate(DEFAULT_CUDA_SPACE)
    assert {"cuda_graphs", "bf16", "fp8", "int4_weight_only", "prune_2_4"} <= set(space.techniques)


def test_a_start_point_in_the_space_is_kept_as_written() -> None:
    spec = SearchSpec.model_validate(
        {
            "space": {"backend": ["eager", "compile"], "techniques": {"int8_dynamic": {}, "bf16": {}}},
            "search": {"start_with": [{"backend": "compile", "techniques": {"bf16": {}}}]},
        }
    )
    [point] = spec.search.start_with
    assert point.backend == "compile" and point.techniques == {"bf16": {}} and point.batch_size is None
    # two casts in one configuration: the configuration's own rule, said for the start point
    with pytest.raises(ValueError, match="cannot share a configuration"):
        SearchSpec.model_validate(
            {
                "space": {"techniques": {"bf16": {}, "fp16": {}}},
                "search": {"start_with": [{"techniques": {"bf16": {}, "fp16": {}}}]},
            }
        )


def test_a_null_choice_is_a_choice_a_start_point_may_name() -> None:
    spec = SearchSpec.model_validate(
        {
            "space": {
                "techniques": {"prune_structured": {"ratio": {"low": 0.2, "high": 0.8}, "width_ratio": [None, 0.25]}}
            },
            "search": {"start_with": [{"techniques": {"prune_structured": {"ratio": 0.5, "width_ratio": None}}}]},
        }
    )
    assert spec.search.start_with[0].techniques["prune_structured"]["width_ratio"] is None
    with pytest.raises(ValueError, match=r"width_ratio=0\.5 is outside the space"):
        SearchSpec.model_validate(
            {
                "space": {"techniques": {"prune_structured": {"ratio": [0.5], "width_ratio": [None, 0.25]}}},
                "search": {"start_with": [{"techniques": {"prune_structured": {"ratio": 0.5, "width_ratio": 0.5}}}]},
            }
        )
    with pytest.raises(ValueError, match="ratio"):  # a null where the technique needs a value is refused
        SearchSpec.model_validate({"space": {"techniques": {"prune_structured": {"ratio": [None, 0.5]}}}})


def test_a_specs_constraints_are_what_a_read_of_its_stored_study_judges_by() -> None:
    """The search judges trials by ``SearchSpec.constraints()``; a read of the stored study (no limit
    given) by ``Limits.constraints`` over the stored spec: the same values, of the same types."""
    from pareto.limits import Limits
    from pareto.spec import load_spec

    overrides = {"slo.p99": "7ms", "slo.min_accuracy": 0.9, "slo.min_throughput": "500/s", "budget.max_memory": "2GB"}
    for given in ({}, {"slo.p99": "7ms"}, overrides):
        spec = load_spec(None, given)
        stored = Limits().constraints(spec.model_dump(mode="json"))
        assert spec.constraints() == stored
        assert [type(v) for v in spec.constraints().to_dict().values()] == [type(v) for v in stored.to_dict().values()]
