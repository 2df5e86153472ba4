"""Compiling a claim into one MLX function, and the kernels that run it.

:class:`Program` walks the claimed nodes once, when the session is created:
nodes computed from constants alone are evaluated right away (folded), and
constant weights get their one-off layout changes (the ``prepare`` of their
op). What is left becomes one Python function over the claim's non-constant
inputs that replays the translators; ``mx.compile`` traces it once per input
shape and fuses the element-wise work. :class:`MlxKernel` is what the
executor calls on every run.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.kernel import Kernel, attribute_values
from nxrt_ep_mlx._backend import mx
from nxrt_ep_mlx._claims import lookup
from nxrt_ep_mlx._convert import mx_dtype, to_mx, to_numpy
from nxrt_ep_mlx._graph import constant_array, node_opset
from nxrt_ep_mlx.ops._registry import Prepare

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.kernel import SubgraphClaim

#: The keyword through which a translator learns how many outputs its node has.
N_OUTPUTS = "_n_outputs"


@dataclass
class _Step:
    """One node to replay: its translator, the arguments known now, and those known at run."""

    fn: Callable[..., Any]
    attrs: dict[str, Any]
    static: list[Any]
    dynamic: list[tuple[int, str, Prepare | None]]
    outputs: list[str]
    name: str


@dataclass
class Program:
    """A claim translated to MLX: constants, the run-time steps and the boundary."""

    inputs: list[str]
    outputs: list[str]
    dynamic_inputs: list[int] = field(default_factory=list)
    input_specs: list[tuple[tuple[int | None, ...] | None, Any]] = field(default_factory=list)
    constants: dict[str, Any] = field(default_factory=dict)
    steps: list[_Step] = field(default_factory=list)
    folded: int = 0

    @classmethod
    def build(cls, claim: SubgraphClaim, opsets: Mapping[str, int], device: Any) -> Program:
        program = cls(list(claim.inputs), list(claim.outputs))
        values = {v.name: v for n in claim.nodes for v in n.inputs if v is not None}
        host: dict[str, np.ndarray] = {}
        for index, name in enumerate(claim.inputs):
            array = constant_array(values[name])
            if array is None:
                program.dynamic_inputs.append(index)
                program.input_specs.append(_spec(values[name]))
            else:
                host[name] = array
        with mx.stream(device):
            program._translate(claim.nodes, opsets, host)
        return program

    def _translate(self, nodes: Sequence[ir.Node], opsets: Mapping[str, int], host: dict) -> None:
        prepared: dict[tuple[str, Any, str], Any] = {}

        def const_mx(name: str) -> Any:
            if name not in self.constants:
                self.constants[name] = to_mx(host[name])
            return self.constants[name]

        def const_host(name: str) -> np.ndarray:
            if name not in host:
                host[name] = np.array(to_numpy(self.constants[name]))
            return host[name]

        for node in nodes:
            entry = lookup(node, node_opset(node, opsets))
            if entry is None:  # claims hold supported nodes only
                raise KernelFailed(
                    f"no mlx translator for {node.op_type}", node=cast(str, node.name)
                )
            attrs = attribute_values(node)
            if N_OUTPUTS in entry.attributes:
                attrs[N_OUTPUTS] = len(node.outputs)
            names = [v.name if v is not None else "" for v in node.inputs]
            known = all(not n or n in host or n in self.constants for n in names)
            static: list[Any] = [None] * len(names)
            dynamic = []
            for i, name in enumerate(names):
                if not name:
                    continue
                prepare = entry.prepare.get(i)
                if i in entry.const_inputs:
                    static[i] = const_host(name)
                elif name in host or name in self.constants:
                    if prepare is None:
                        static[i] = const_mx(name)
                    else:
                        key = (name, prepare, repr(sorted(attrs.items())))
                        if key not in prepared:
                            prepared[key] = prepare(const_mx(name), attrs)
                            mx.eval(prepared[key])
                        static[i] = prepared[key]
                else:
                    dynamic.append((i, name, prepare))
            outputs = [cast(str, v.name) for v in node.outputs]
            if known:
                results = _call(entry.fn, static, attrs)
                mx.eval(*results)
                for name, result in zip(outputs, results):
                    if name:
                        self.constants[name] = result
                self.folded += 1
            else:
                self.steps.append(
                    _Step(entry.fn, attrs, static, dynamic, outputs, cast(str, node.name))
                )

    @property
    def dynamic_outputs(self) -> list[str]:
        return [name for name in self.outputs if name not in self.constants]

    def function(self) -> Callable[..., tuple[Any, ...]]:
        """The claim as a function of its non-constant inputs, returning its other outputs."""
        names = [self.inputs[i] for i in self.dynamic_inputs]
        steps, constants, wanted = self.steps, self.constants, self.dynamic_outputs

        def run(*arrays: Any) -> tuple[Any, ...]:
            env = dict(zip(names, arrays))
            for step in steps:
                args = list(step.static)
                for i, name, prepare in step.dynamic:
                    value = env[name]
                    args[i] = prepare(value, step.attrs) if prepare is not None else value
                for name, result in zip(step.outputs, _call(step.fn, args, step.attrs)):
                    if name:
                        env[name] = result
            return tuple(env[name] if name in env else constants[name] for name in wanted)

        return run

    def full_function(self) -> Callable[..., tuple[Any, ...]]:
        """Like :meth:`function`, but returning every output (constants included)."""
        run, outputs, constants = self.function(), self.outputs, self.constants

        def full(*arrays: Any) -> tuple[Any, ...]:
            computed = dict(zip(self.dynamic_outputs, run(*arrays)))
            return tuple(computed[n] if n in computed else constants[n] for n in outputs)

        return full


def _spec(value: ir.Value) -> tuple[tuple[int | None, ...] | None, Any]:
    """A value's static shape (``None`` for symbolic dims) and element type."""
    shape = None
    if value.shape is not None:
        shape = tuple(d if isinstance(d, int) else None for d in value.shape)
    return shape, value.dtype


def _call(fn: Callable[..., Any], args: Sequence[Any], attrs: dict[str, Any]) -> tuple[Any, ...]:
    result = fn(*args, **attrs)
    return result if isinstance(result, tuple) else (result,)


class MlxKernel(Kernel):
    """Runs one compiled claim: numpy (or device) arrays in, numpy views of the results out.

    Inputs are copied into MLX once per run (MLX cannot borrow numpy memory);
    outputs are zero-copy numpy views of MLX's buffers on the CPU device, and
    ``mx.array``s on a GPU (the executor copies those back).
    """

    def __init__(self, program: Program, device: Any, *, to_host: bool, compiled: bool = True):
        self.program = program
        self.device = device
        self.to_host = to_host
        self._raw = program.function()
        self._fn = mx.compile(self._raw) if compiled else self._raw
        self._lock = threading.Lock()
        self._constants = {
            name: _read_only(to_numpy(program.constants[name]))
            for name in program.outputs
            if name in program.constants
        }
        self.last_shapes: list[tuple[int, ...]] | None = None
        nodes = len(program.steps) + program.folded
        self.variant = "mx.compile" if compiled else "mlx eager"
        self.variant_reason = (
            f"{nodes} nodes, {program.folded} folded at compile time, device {_name(device)}"
        )

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        dynamic = self.program.dynamic_inputs
        with self._lock, mx.stream(self.device):
            arrays = [to_mx(inputs[i]) for i in dynamic]
            self.last_shapes = [tuple(a.shape) for a in arrays]
            try:
                results = self._fn(*arrays)
                mx.eval(*results)
            except Exception as exc:  # noqa: BLE001 - MLX raises plain Python errors
                if self._fn is self._raw:
                    raise KernelFailed(f"mlx: {exc}") from exc
                results = self._eager(arrays, exc)
            computed = dict(zip(self.program.dynamic_outputs, results))
            out = []
            for name in self.program.outputs:
                if name in self._constants:
                    const = self._constants[name]
                    out.append(const if self.to_host else self.program.constants[name])
                else:
                    value = computed[name]
                    out.append(to_numpy(value) if self.to_host else value)
        return tuple(out)

    def _eager(self, arrays: list[Any], error: Exception) -> tuple[Any, ...]:
        """Run without ``mx.compile`` (it needs a C++ compiler on CPU); stay eager if that works."""
        try:
            results = self._raw(*arrays)
            mx.eval(*results)
        except Exception as exc:  # noqa: BLE001
            raise KernelFailed(f"mlx: {exc}") from exc
        self._fn = self._raw
        self.variant, self.variant_reason = "mlx eager", f"mx.compile failed: {error}"
        return results

    def example_inputs(self) -> list[Any]:
        """Arrays of the claim's input shapes: static ones, else those of the last run."""
        arrays = []
        for k, (shape, dtype) in enumerate(self.program.input_specs):
            if shape is None or None in shape:
                if self.last_shapes is None:
                    raise ValueError(
                        "the claim has symbolic input shapes; run the session once before "
                        "saving its EPContext so the shapes are known"
                    )
                shape = self.last_shapes[k]
            dims = cast("tuple[int, ...]", shape)  # no symbolic dim left
            arrays.append(mx.zeros(dims, dtype=_mx_dtype(dtype)))
        return arrays

    def export(self) -> bytes:
        """The claim as ``mx.export_function`` writes it, for an EPContext blob."""
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "claim.mlxfn")
            with mx.stream(self.device):
                mx.export_function(path, self.program.full_function(), *self.example_inputs())
            with open(path, "rb") as f:
                return f.read()


class ImportedKernel(Kernel):
    """A claim loaded from an EPContext blob through ``mx.import_function``."""

    def __init__(self, blob: bytes, device: Any, *, to_host: bool) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "claim.mlxfn")
            with open(path, "wb") as f:
                f.write(blob)
            # a function, not (function, metadata): return_metadata is off
            self._fn = cast(Callable[..., Any], mx.import_function(path))
        self.device = device
        self.to_host = to_host
        self._lock = threading.Lock()
        self.variant = "mx.import_function"
        self.variant_reason = f"loaded from an EPContext, device {_name(device)}"

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        with self._lock, mx.stream(self.device):
            results = self._fn(*[to_mx(a) for a in inputs])
            mx.eval(*results)
            return tuple(to_numpy(r) if self.to_host else r for r in results)


def _name(device: Any) -> str:
    """``cpu`` or ``gpu`` from an MLX device or device type."""
    kind = getattr(device, "type", device)
    return str(getattr(kind, "name", kind))


def _read_only(array: np.ndarray) -> np.ndarray:
    """Constant outputs are shared across runs: the executor copies read-only arrays out."""
    view = array.view()
    view.flags.writeable = False
    return view


def _mx_dtype(dtype: Any) -> Any:
    return mx_dtype(int(dtype))
