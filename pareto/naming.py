"""How a configuration is written for people: one function for the library, the tables and the cards.

Pure Python, so that the query side can name configurations without importing torch.
"""

from __future__ import annotations

from typing import Any, Literal

#: Where a configuration is served and measured: PyTorch as it is, under ``torch.compile``, or as an
#: ONNX export in ONNX Runtime's CPU execution provider.
Backend = Literal["eager", "compile", "onnxruntime"]
BACKENDS: tuple[Backend, ...] = ("eager", "compile", "onnxruntime")


def describe_technique(name: str, params: dict[str, Any]) -> str:
    """``prune_structured(ratio=0.375)``: floats to three significant digits, no parentheses when bare."""
    args = ",".join(f"{k}={_fmt(v)}" for k, v in params.items())
    return f"{name}({args})" if args else name


def describe_config(config: dict[str, Any], *, with_batch: bool = True) -> str:
    """A stored configuration (``Config.to_dict()``): ``int8_dynamic + lowrank(rank_ratio=0.2) @ batch 256``.

    A backend other than eager follows the techniques: ``ort_int8_dynamic on onnxruntime @ batch 1``;
    the uncompressed model on one reads ``uncompressed on onnxruntime``.
    """
    body = " + ".join(describe_technique(t["name"], t.get("params") or {}) for t in config.get("techniques", []))
    backend = config.get("backend", "eager")
    if backend != "eager":
        body = f"{body or 'uncompressed'} on {backend}"
    body = body or "baseline"
    return f"{body} @ batch {config['batch_size']}" if with_batch else body


def _fmt(value: Any) -> str:
    if isinstance(value, list | tuple):  # layers left alone: ``leave=mid+blocks.0.fc``
        return "+".join(map(str, value))
    return f"{value:.3g}" if isinstance(value, float) else str(value)


#: The samplers ``pareto search --sampler`` takes (``pareto.study.samplers`` builds them).
SamplerName = Literal["tpe", "gp", "nsga2", "random", "qmc", "grid"]
SAMPLER_HELP = (
    "Optuna sampler: tpe (default), gp (Gaussian process), nsga2, random, qmc (scrambled Sobol), grid (every "
    "combination of the space's steps; a range without a step in 5 points). tpe, gp and nsga2 take the SLOs "
    "as constraints; random, qmc and grid do not look at results, constraints included."
)
