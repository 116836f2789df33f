"""A failure learned per layer (``pareto.study.layers``): traced to the layer a technique replaced, and
that layer left alone by the technique for the rest of the study."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from sqlalchemy import select

from pareto.compress import Config, apply, get_technique
from pareto.errors import TechniqueError, UsageError
from pareto.spec import SearchSpec
from pareto.store.engine import open_engine, session_scope
from pareto.store.models import TechniqueCheck, Trial
from pareto.study.layers import culprits, tracing_layers, with_learned
from pareto.study.search import run_search
from tests.tiny_task import make_reads_weight_task, make_task

QUICK = {"device": "cpu", "threads": 1, "samples": 40, "rounds": 4, "warmup": 2, "contention_limit": None}


def _config(name: str, params: dict[str, Any] | None = None, **leave: Any) -> Config:
    return Config(techniques=(get_technique(name, {**(params or {}), **leave}),), batch_size=4)


def _failure(config: Config) -> tuple[Any, TechniqueError]:
    task = make_reads_weight_task()
    served = apply(task.model, config, task)
    with pytest.raises(TechniqueError) as caught, tracing_layers(served):
        try:
            served.module(task.example_input(4))
        except Exception as exc:
            raise TechniqueError(f"{config.describe()} could not be measured: {exc}") from exc
    return served, caught.value


LOWRANK = {"rank_ratio": 0.3, "keep_head": True, "min_rank": 2}


def test_a_failure_inside_a_replaced_layer_names_it() -> None:
    """Low-rank made ``mid`` a factor pair; the forward reads ``mid.weight``: the deepest module frame is
    the pair's ``__getattr__``."""
    served, exc = _failure(_config("lowrank", LOWRANK))
    assert dict(served.changed) == {"inp": "lowrank", "mid": "lowrank"}
    assert exc.layers == (("lowrank", "mid"),)


def test_a_failure_in_the_models_own_line_names_the_replaced_layer_it_reads() -> None:
    """int8 made ``mid.weight`` a method: ``mid.weight.t()`` fails in the model's own forward, whose line
    names the layer."""
    served, exc = _failure(_config("int8_dynamic"))
    assert {"inp", "mid", "head"} <= set(dict(served.changed))
    assert exc.layers == (("int8_dynamic", "mid"),)


def test_no_layer_is_named_for_a_failure_that_is_not_a_replaced_layers() -> None:
    task = make_task()
    served = apply(task.model, _config("lowrank", LOWRANK), task)
    assert culprits(ValueError("the metric broke"), served) == ()


@pytest.mark.parametrize("name", ["lowrank", "int8_dynamic"])
def test_a_technique_leaves_a_learned_layer_alone(name: str) -> None:
    task = make_reads_weight_task()
    config = with_learned(_config(name, LOWRANK if name == "lowrank" else None), {name: ("mid",)})
    assert config.techniques[0].leave == ("mid",) and "leave=mid" in config.describe()
    assert Config.from_dict(config.to_dict()).key() == config.key()  # stored and read back: the same
    served = apply(task.model, config, task)
    assert type(served.module.mid) is torch.nn.Linear and served.module.mid.weight.dtype == torch.float32
    assert type(served.module.inp) is not torch.nn.Linear  # the others are still replaced
    served.module(task.example_input(4))


def test_only_a_technique_that_replaces_layers_takes_leave() -> None:
    with pytest.raises(UsageError, match="cannot leave"):
        get_technique("prune_unstructured", {"sparsity": 0.5, "leave": ["mid"]})
    assert (
        with_learned(_config("prune_unstructured", {"sparsity": 0.5}), {"lowrank": ("mid",)}).techniques[0].leave
        is None
    )


@pytest.mark.parametrize(
    ("ratios", "failed", "said"),
    [
        # the space's first point factors ``inp`` only: the pre-flight runs, one trial fails on ``mid``
        ([0.9, 0.25, 0.3, 0.35], 1, "Trial "),
        # every point factors ``mid``: the pre-flight learns it, and no trial fails
        ([0.25, 0.3, 0.35, 0.4], 0, "Pre-flight: "),
    ],
)
def test_a_search_fails_at_most_once_per_layer_and_measures_the_rest(
    db_url: str, ratios: list[float], failed: int, said: str
) -> None:
    """On a model that reads one layer's weight, low-rank fails at most one trial; the rest of its trials
    leave that layer alone and are measured; the learned layer is stored for the study."""
    spec = SearchSpec.model_validate(
        {
            "task": "tests.tiny_task:make_reads_weight_task",
            "study": "reads-weight",
            "slo": {"p99": "1s"},
            "search": {"n_trials": 4, "seed": 3, "confirm_top": 0, "sampler": "grid"},
            "measure": QUICK,
            "space": {
                "batch_size": [8],
                "techniques": {"lowrank": {"rank_ratio": ratios, "keep_head": [True], "min_rank": [2]}},
            },
        }
    )
    notices: list[str] = []
    from pareto.study import search as search_module

    class Collect(search_module.Quiet):
        def notice(self, message: str) -> None:
            notices.append(message)

    run_search(spec, db_url=db_url, reporter=Collect())
    with session_scope(open_engine(db_url)) as session:
        rows = session.execute(select(Trial.description, Trial.state)).all()
        stored = session.scalars(select(TechniqueCheck).where(TechniqueCheck.kind == "leave")).all()
    lowrank = [(d, str(s)) for d, s in rows if "lowrank" in d]
    assert sum("FAILED" in s for _, s in lowrank) == failed, (rows, notices)
    assert sum("leave=mid" in d and "COMPLETE" in s for d, s in lowrank) >= 2
    assert [(c.technique, c.details["layer"]) for c in stored] == [("lowrank", "mid")]
    learned = [n for n in notices if "lowrank leaves layer 'mid' alone for the rest of the study" in n]
    assert len(learned) == 1 and learned[0].startswith(said)
