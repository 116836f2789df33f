"""A ``torch.export`` program (a ``.pt2`` file) as a model folder's model: ``--model FOLDER/model.pt2``.

The program is read with ``torch.export.load`` and called through its module (``ExportedProgram.module()``);
its Hugging Face folder (the file's own folder) gives the rest: ``config.json`` the kind and the labels,
the tokenizer or image processor the inputs. The program is called with the inputs it was exported
with, by name (``input_ids``, ``attention_mask``, ``token_type_ids`` as zeros, ``pixel_values``),
positionally or as keywords as it was traced, and its output is read as a tensor, the first of a tuple,
or the named field of a model output (``logits``, ``last_hidden_state``).

A program is a graph of ATen operations and its weights, not PyTorch layers: the techniques that
replace or reshape layers (dynamic int8, pruning, low-rank, distillation's student) find none to act
on, and say so; what works on a graph runs (PT2E int8 static, ONNX Runtime and its passes,
``torch.compile``, the batch size). Its shapes are its own: a batch exported fixed is refused (a
server batches requests), a sequence length exported fixed pads every request to it, and a dynamic
length's range bounds the rows' lengths.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pareto.errors import TaskError

__all__ = ["Program", "ProgramShape", "load_program", "match_inputs", "quiet_copies"]

#: The inputs pareto can give a program, by the names Hugging Face models take.
KNOWN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "pixel_values")
_DYNAMIC_HINT = "export it with dynamic_shapes (torch.export.Dim) on that axis"


@dataclass(frozen=True)
class ProgramShape:
    """The sequence lengths a text program accepts: ``fixed`` when it was exported at one length, else the
    range of its dynamic length (``longest`` None: no upper bound)."""

    fixed: int | None = None
    shortest: int = 1
    longest: int | None = None


class Program(nn.Module):
    """A loaded program called as the task calls its model: ``program(*given) -> tensor``.

    Args:
        module: ``ExportedProgram.module()``.
        given: The names of the tensors the task passes, in order (``input_ids, attention_mask`` or
            ``pixel_values``).
        positional: The program's inputs taken positionally, in order; ``keywords``: those taken by name.
        output: The field of a structured output to return (``logits``, ``last_hidden_state``).
    """

    def __init__(
        self,
        module: nn.Module,
        given: tuple[str, ...],
        positional: tuple[str, ...],
        keywords: tuple[str, ...],
        output: str,
    ) -> None:
        super().__init__()
        self.program = module
        self.given, self.positional, self.keywords, self.output = given, positional, keywords, output

    def train(self, mode: bool = True) -> Program:
        """Only this wrapper's flag: a program runs as it was traced (an exported module refuses ``train``)."""
        self.training = mode
        return self

    def forward(self, first: torch.Tensor, second: torch.Tensor | None = None) -> torch.Tensor:
        # two named parameters, not *args: exporters match dynamic shapes to the signature's parameters
        given = zip(self.given, (first, second)[: len(self.given)], strict=True)
        named: dict[str, torch.Tensor] = {name: t for name, t in given if t is not None}
        if "token_type_ids" not in named and "input_ids" in named:
            named["token_type_ids"] = torch.zeros_like(named["input_ids"])
        out = self.program(*(named[n] for n in self.positional), **{n: named[n] for n in self.keywords})
        if isinstance(out, torch.Tensor):
            return out
        if isinstance(out, dict):
            return out[self.output] if self.output in out else next(iter(out.values()))
        return out[0]


def quiet_copies() -> None:
    """Copying a program's module (pareto compresses copies) makes torch warn about its own tree specs, which
    is torch's to fix and would open every search's output: that one message is filtered from now on (not
    warnings at large). Called outside any ``catch_warnings`` block, which would undo it on exit."""
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )


def load_program(path: Path, given: tuple[str, ...], output: str) -> tuple[Program, ProgramShape]:
    """The program at ``path`` as a module the task calls with ``given``, and the lengths it accepts.

    Raises:
        TaskError: the file is not a program this torch reads; it takes an input pareto cannot give or
            lacks one the task needs; its batch axis was exported fixed.
    """
    try:
        # a program that returns a Hugging Face model output names its class in its output's tree: the
        # classes are known to torch's pytree once transformers' outputs are imported
        import transformers.modeling_outputs  # noqa: F401

        program = torch.export.load(str(path))
    except Exception as exc:  # a file of another kind, a program of a newer torch: the first line of why
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskError(f"{path.name} cannot be read as a torch.export program: {first[:200]}") from exc
    positional, kwargs = _example_inputs(program)
    names = [*(_user_inputs(program)[:positional]), *kwargs]
    given = match_inputs(path.name, names, given)
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    node = placeholders.get(given[0])
    shape = node.meta["val"].shape if node is not None and "val" in node.meta else None
    if shape is not None and isinstance(shape[0], int):
        raise TaskError(
            f"{path.name} was exported at a fixed batch of {shape[0]}; a server batches requests, so "
            f"{_DYNAMIC_HINT} (the batch, axis 0)."
        )
    lengths = _lengths(program, shape) if given[0] == "input_ids" and shape is not None else ProgramShape()
    module = Program(program.module(), given, tuple(names[:positional]), kwargs, output)
    return module, lengths


def match_inputs(file: str, names: list[str], given: tuple[str, ...]) -> tuple[str, ...]:
    """The names the task's tensors are passed by to a graph whose inputs are ``names``: ``given`` when the
    graph takes those (and perhaps ``token_type_ids``, fed as zeros); the graph's one input, whatever its
    name, when both sides have one (an image model exported as ``x`` or ``input``).

    Raises:
        TaskError: the graph takes an input pareto cannot give, or lacks the first one the task gives.
    """
    if len(names) == 1 and len(given) == 1:
        return (names[0],)
    unknown = [n for n in names if n not in KNOWN_INPUTS or (n != "token_type_ids" and n not in given)]
    if unknown or given[0] not in names:
        raise TaskError(
            f"{file} takes {', '.join(names) or 'no inputs'}; for this folder pareto gives it "
            f"{', '.join(given)} (and token_type_ids as zeros)."
        )
    return given


def _example_inputs(program: Any) -> tuple[int, tuple[str, ...]]:
    """How many inputs the program was traced with positionally, and the names of those given by keyword."""
    example = getattr(program, "example_inputs", None)
    if example is None:  # an older torch: every input positional, in signature order
        return len(_user_inputs(program)), ()
    args, kwargs = example
    return len(args), tuple(kwargs or {})


def _user_inputs(program: Any) -> list[str]:
    return [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]


def _lengths(program: Any, shape: Any) -> ProgramShape:
    """The sequence lengths (axis 1) the program accepts: fixed, or its dynamic dimension's range."""
    if len(shape) < 2:
        return ProgramShape()
    axis = shape[1]
    if isinstance(axis, int):
        return ProgramShape(fixed=axis, shortest=axis, longest=axis)
    bounds = program.range_constraints.get(axis.node.expr)
    if bounds is None:
        return ProgramShape()
    lower, upper = bounds.lower, bounds.upper
    longest = int(upper) if upper.is_finite and int(upper) < 1 << 31 else None
    return ProgramShape(shortest=max(1, int(lower)), longest=longest)
