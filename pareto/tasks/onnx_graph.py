"""A model ONNX Runtime runs, called like a PyTorch module (``OrtModule``), and a user's ONNX file read as one.

``OrtModule`` is what the ``onnxruntime`` backend serves (``pareto.compress.onnxrt`` exports a model
to ONNX and opens it here) and what a model folder's ``.onnx`` file becomes (``load_onnx``:
``pareto search --model FOLDER/model.onnx``). An ONNX file's folder gives the rest, as for a
``torch.export`` program (``pareto.tasks.program``): ``config.json`` the kind and the labels, the
tokenizer or image processor the inputs. The graph is fed by its inputs' names (``input_ids``,
``attention_mask``, ``token_type_ids`` as zeros, ``pixel_values``) and its output read by name
(``logits``, ``last_hidden_state``, else its first). Its shapes are its own: a batch exported fixed
is refused (a server batches requests), a length exported fixed pads every request to it. Only ONNX
Runtime's passes run on it (its int8 quantizers, its transformer fusions); the techniques that
change PyTorch layers find none and say so (``pareto techniques --model FILE``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pareto.errors import TaskError
from pareto.tasks.program import ProgramShape, load_program, match_inputs
from pareto.tasks.source import ONNX

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["OrtModule", "load_model_file", "load_onnx"]

#: ONNX Runtime's input types, as numpy dtype names, that a feed is cast to.
_NUMPY_TYPES = {"tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(float)": "float32"}


class OrtModule(nn.Module):
    """An ONNX Runtime CPU session that is called like the module it was exported from.

    Inputs are torch tensors (passed to ORT without a copy where their memory allows); outputs come
    back as torch tensors, one tensor for a one-output graph, else a tuple. The session uses
    ``torch.get_num_threads()`` intra-op threads and one inter-op thread, read at the first call and
    whenever it changes (a new session then, during warm-up: pareto sets threads before it times).
    Its threads do not spin while idle (``session.intra_op.allow_spinning=0``): spinning workers take
    the cores from whatever runs next, which in an interleaved measurement is another model.

    A graph read from a user's ONNX file (``load_onnx``) has no PyTorch module behind it:
    its callers pass the tensors ``given`` names (a graph input named ``token_type_ids`` that is not
    given is fed zeros shaped like ``input_ids``), the ``output`` it names is returned, and its FLOPs and
    activations are counted on the file's graph (``counted``, ``pareto.measure.graph_cost``).

    Attributes:
        source: The PyTorch module that was exported (not a submodule: its weights are not the
            session's); FLOPs and activations are counted on it (``Served.source``). None for a file's graph.
        onnx_bytes: The serialized graph, as ``pareto export`` writes it.
        given: The names of the tensors a caller passes, in order; None: the graph's inputs in order.
        output: The graph output returned; None: the only one, or all of them as a tuple.
        counted: The serialized graph FLOPs and activations are counted on when there is no ``source``
            (the file's, before any of ONNX Runtime's passes), else None.
    """

    def __init__(
        self,
        proto: onnx.ModelProto,
        source: nn.Module | None,
        *,
        given: tuple[str, ...] | None = None,
        output: str | None = None,
        counted: bytes | None = None,
    ) -> None:
        super().__init__()
        from onnx import numpy_helper

        self.onnx_bytes: bytes = proto.SerializeToString()
        self.source: nn.Module | None
        object.__setattr__(self, "source", source)
        self.given, self.output, self.counted = given, output, counted
        for index, initializer in enumerate(proto.graph.initializer):
            tensor = torch.from_numpy(numpy_helper.to_array(initializer).copy())
            name = f"initializer_{index}"
            if tensor.dim() >= 2:
                self.register_parameter(name, nn.Parameter(tensor, requires_grad=False))
            else:
                self.register_buffer(name, tensor, persistent=False)
        self._session: Any = None
        self._threads = 0
        self._names: list[str] = []
        self._types: dict[str, str] = {}

    def __getstate__(self) -> dict[str, object]:
        """A copy (``pareto.compress.apply`` copies the model first) opens a session of its own."""
        state = dict(self.__dict__)
        state["_session"], state["_threads"] = None, 0
        return state

    def session(self) -> Any:
        """The ORT session, built (again) when torch's thread count changed since the last one."""
        threads = torch.get_num_threads()
        if self._session is None or threads != self._threads:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3  # errors only
            # ORT's idle workers spin by default: on a small machine they slowed the next model's call
            # (or the contention probe) 7-12x at the median here (benchmarks/ort_spinning.py)
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
            self._session = ort.InferenceSession(self.onnx_bytes, options, providers=["CPUExecutionProvider"])
            self._names = [i.name for i in self._session.get_inputs()]
            self._types = {i.name: i.type for i in self._session.get_inputs()}
            self._threads = threads
        return self._session

    def rebuilt(self, proto: onnx.ModelProto) -> OrtModule:
        """A module for ``proto`` (this graph after one of ONNX Runtime's passes), called and counted as this one."""
        return OrtModule(proto, self.source, given=self.given, output=self.output, counted=self.counted)

    def graph_args(self, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        """The tensors the graph takes for ``model(*args)``, in its inputs' order (as ``pareto export``'s
        artifact is called)."""
        self.session()
        return tuple(self._tensors(args)[name] for name in self._names)

    def _tensors(self, args: tuple[Any, ...]) -> dict[str, torch.Tensor]:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if self.given is None:  # the graph's inputs, in its order (an export of a PyTorch module)
            if len(tensors) != len(self._names):
                raise TypeError(f"the ONNX graph takes {len(self._names)} tensor inputs, got {len(tensors)}")
            return dict(zip(self._names, tensors, strict=True))
        named = dict(zip(self.given, tensors, strict=False))
        if "token_type_ids" in self._names and "token_type_ids" not in named and "input_ids" in named:
            named["token_type_ids"] = torch.zeros_like(named["input_ids"])
        missing = [name for name in self._names if name not in named]
        if missing:
            raise TypeError(f"the ONNX graph takes {', '.join(self._names)}; {', '.join(missing)} not given")
        return {name: named[name] for name in self._names}

    def feed(self, args: tuple[Any, ...]) -> dict[str, np.ndarray]:
        """The session's input feed for ``model(*args)``: each tensor by its graph input's name, as numpy (in
        the dtype the graph declares: a graph exported with int32 ids takes the task's int64 ones)."""
        out = {}
        for name, t in self._tensors(args).items():
            array = t.detach().cpu().contiguous().numpy()
            wanted = _NUMPY_TYPES.get(self._types.get(name, ""))
            out[name] = array if wanted is None or array.dtype == wanted else array.astype(wanted)
        return out

    def forward(self, *args: Any) -> Any:
        session = self.session()
        if self.output is not None:
            return torch.from_numpy(session.run([self.output], self.feed(args))[0])
        outputs = [torch.from_numpy(o) for o in session.run(None, self.feed(args))]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def output_index(self) -> int | None:
        """The position of ``output`` among several graph outputs (None: one output, or all returned)."""
        names = [o.name for o in self.session().get_outputs()]
        return names.index(self.output) if self.output is not None and len(names) > 1 else None

    def input_shapes(self, args: tuple[Any, ...]) -> dict[str, tuple[int, ...]]:
        """Each graph input's shape for ``model(*args)`` (what ``pareto.measure.graph_cost`` counts at)."""
        self.session()
        return {name: tuple(t.shape) for name, t in self._tensors(args).items()}


def load_onnx(path: Path, given: tuple[str, ...], output: str) -> tuple[OrtModule, ProgramShape]:
    """The ONNX file at ``path`` as a module the task calls with ``given``, returning its ``output`` (else its
    first output), and the lengths it accepts.

    Raises:
        TaskError: ONNX Runtime is not installed; the file is not an ONNX model; it takes an input pareto
            cannot give or lacks one the task needs; its batch axis was exported fixed.
    """
    if any(importlib.util.find_spec(name) is None for name in ("onnx", "onnxruntime")):
        raise TaskError(f"{path.name} is an ONNX file, served by ONNX Runtime: pip install 'pareto-slo[onnx]'.")
    import onnx

    try:
        onnx.checker.check_model(str(path))  # by path: a graph whose weights lie in a file beside it
        proto = onnx.load(str(path))
    except Exception as exc:  # not an ONNX model, or one ONNX's checker refuses: the first line of why
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskError(f"{path.name} cannot be read as an ONNX model: {first[:200]}") from exc
    stored = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in stored]  # old exports list weights as inputs
    names = [i.name for i in inputs]
    given = match_inputs(path.name, names, given)
    dims = [
        d.dim_value if d.HasField("dim_value") else None
        for d in inputs[names.index(given[0])].type.tensor_type.shape.dim
    ]
    if dims and dims[0] is not None:
        raise TaskError(
            f"{path.name} was exported at a fixed batch of {dims[0]}; a server batches requests, so export it "
            "with a dynamic batch axis (dynamic_axes or dynamic_shapes on axis 0)."
        )
    length = dims[1] if given[0] == "input_ids" and len(dims) > 1 else None
    lengths = ProgramShape(fixed=length, shortest=length, longest=length) if length else ProgramShape()
    outputs = [o.name for o in proto.graph.output]
    chosen = output if output in outputs else outputs[0]
    module = OrtModule(proto, None, given=tuple(n for n in given if n in names), output=chosen)
    module.counted = module.onnx_bytes  # counted on the file's own graph, whatever ORT's passes do to it
    return module, lengths


def load_model_file(path: Path, given: tuple[str, ...], output: str) -> tuple[nn.Module, ProgramShape]:
    """A model file in a folder, by its suffix: an ONNX file (``load_onnx``) or a torch.export program
    (``pareto.tasks.program.load_program``)."""
    if path.suffix == ONNX:
        return load_onnx(path, given, output)
    return load_program(path, given, output)
