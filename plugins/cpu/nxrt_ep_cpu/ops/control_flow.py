"""Control flow with subgraphs: If, Loop, Scan, SequenceMap.

Graph attributes arrive as callables (:class:`nxrt.subgraph.Subgraph`) that
take the graph's inputs and return the list of its outputs; values the
subgraphs read from enclosing graphs are supplied by core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.kernel import attribute_values
from nxrt_ep_cpu.kernels import CpuKernel
from nxrt_ep_cpu.ops._registry import op

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.provider import ExecutionProvider


def _flag(value: Any, what: str) -> bool:
    """The truth of a one-element boolean tensor."""
    array = np.asarray(value)
    if array.size != 1:
        raise KernelFailed(f"{what} must hold exactly one value, got shape {list(array.shape)}")
    return bool(array.reshape(-1)[0])


@op("If", since=(1, 11, 13, 16, 19, 21, 23, 24, 25))
def if_(
    cond: np.ndarray, /, *, else_branch: Callable[..., list], then_branch: Callable[..., list]
) -> tuple[Any, ...]:
    """The outputs of ``then_branch`` when ``cond`` is true, else of ``else_branch``."""
    return tuple((then_branch if _flag(cond, "If's condition") else else_branch)())


def _stack(elements: list[Any], what: str) -> np.ndarray:
    """Per-iteration values of a scan output stacked along a new axis 0."""
    if any(not isinstance(e, np.ndarray) and not np.isscalar(e) for e in elements):
        raise KernelFailed(f"{what} must be tensors (sequences and optionals cannot be stacked)")
    arrays = [np.asarray(e) for e in elements]
    if any(a.shape != arrays[0].shape for a in arrays):
        shapes = sorted({str(list(a.shape)) for a in arrays})
        raise KernelFailed(f"{what} changes shape between iterations: {', '.join(shapes)}")
    return np.stack(arrays, axis=0)


def _loop_kernel(ep: ExecutionProvider, node: ir.Node) -> CpuKernel:
    """Loop's kernel, told the dtype and shape the body declares for each scan output: what
    an empty scan output (zero iterations) is made of."""
    attrs = attribute_values(node, ep.subgraph_compiler)
    body = node.attributes["body"].as_graph()
    carried = len(node.inputs) - 2
    empty = []
    for value in list(body.outputs)[1 + carried :]:
        dtype = value.dtype.numpy() if value.dtype is not None else np.dtype(np.float32)
        dims = value.shape.dims if value.shape is not None else None
        if dims is None or not all(isinstance(d, int) for d in dims):
            dims = ()  # unknown: an empty 1-D array
        empty.append(np.empty((0, *cast("tuple[int, ...]", dims)), dtype=dtype))  # all int
    return CpuKernel(loop, {**attrs, "_empty_scans": empty})


@op("Loop", since=(1, 11, 13, 16, 19, 21, 23, 24, 25), factory=_loop_kernel)
def loop(
    m: np.ndarray | None,
    cond: np.ndarray | None,
    /,
    *v_initial: Any,
    body: Callable[..., list],
    _empty_scans: Sequence[np.ndarray] = (),
) -> tuple[Any, ...]:
    """Run ``body(i, cond, *carried)`` while ``i < M`` and ``cond``; stack the scan outputs.

    Returns the final loop-carried values, then each scan output stacked along
    a new axis 0. The body's condition output ends the loop even when the
    ``cond`` input is absent (as ONNX Runtime and the reference do). With zero
    iterations the carried values are the initial ones and each scan output is
    empty, of the dtype and element shape the body declares (``_empty_scans``,
    which the kernel factory reads from the body), as in onnxruntime.
    """
    trips = None if m is None or np.asarray(m).size == 0 else int(np.asarray(m).reshape(-1)[0])
    keep_going = True if cond is None or np.asarray(cond).size == 0 else _flag(cond, "cond")
    carried = list(v_initial)
    count = len(carried)
    scans: list[list[Any]] | None = None
    i = 0
    while keep_going and (trips is None or i < trips):
        outputs = body(np.array(i, dtype=np.int64), np.array(keep_going), *carried)
        if len(outputs) < 1 + count:
            raise KernelFailed(
                f"Loop body returns {len(outputs)} values; it needs the condition and "
                f"{count} loop-carried values"
            )
        keep_going = _flag(outputs[0], "the Loop body's condition output")
        carried = list(outputs[1 : 1 + count])
        if scans is None:
            scans = [[] for _ in outputs[1 + count :]]
        for values, value in zip(scans, outputs[1 + count :], strict=True):
            values.append(value)
        i += 1
    if scans is None:  # the body never ran
        scan_count = len(body.output_names) - 1 - count if hasattr(body, "output_names") else 0
        empty = list(_empty_scans) or [np.empty((0,), dtype=np.float32)] * scan_count
        return (*carried, *(e.copy() for e in empty[:scan_count]))
    stacked = [_stack(values, f"Loop scan output {k}") for k, values in enumerate(scans)]
    return (*carried, *stacked)


def _axes(values: Sequence[int] | None, count: int, rank_of: Callable[[int], int], what: str):
    """One non-negative axis per input/output (default 0)."""
    values = list(values) if values else [0] * count
    if len(values) != count:
        raise KernelFailed(f"{what} needs {count} values, got {values}")
    out = []
    for k, axis in enumerate(values):
        rank = rank_of(k)
        if not -rank <= axis < rank:
            raise KernelFailed(f"{what}[{k}] = {axis} is out of range for rank {rank}")
        out.append(axis % rank)
    return out


@op("Scan", since=(9, 11, 16, 19, 21, 23, 24, 25))
def scan(
    *inputs: np.ndarray,
    body: Callable[..., list],
    num_scan_inputs: int,
    scan_input_axes: list[int] | None = None,
    scan_input_directions: list[int] | None = None,
    scan_output_axes: list[int] | None = None,
    scan_output_directions: list[int] | None = None,
) -> tuple[Any, ...]:
    """Run ``body(*state, *slices)`` over slices of the scan inputs; stack the scan outputs.

    Inputs are sliced along ``scan_input_axes`` (backwards where the direction
    is 1); each scan output gets the per-iteration values along
    ``scan_output_axes`` (in reverse order where its direction is 1).
    """
    n_state = len(inputs) - num_scan_inputs
    if n_state < 0 or num_scan_inputs < 1:
        raise KernelFailed(f"Scan has {len(inputs)} inputs but num_scan_inputs={num_scan_inputs}")
    states = list(inputs[:n_state])
    xs = [np.asarray(x) for x in inputs[n_state:]]
    in_axes = _axes(scan_input_axes, num_scan_inputs, lambda k: xs[k].ndim, "scan_input_axes")
    in_dirs = list(scan_input_directions or [0] * num_scan_inputs)
    lengths = {x.shape[a] for x, a in zip(xs, in_axes, strict=True)}
    if len(lengths) != 1:
        raise KernelFailed(f"scan inputs have different lengths along their scan axes: {lengths}")
    length = lengths.pop()
    n_out = len(body.output_names) - n_state if hasattr(body, "output_names") else None
    outs: list[list[np.ndarray]] | None = None
    for t in range(length):
        slices = [
            np.take(x, length - 1 - t if d else t, axis=a)
            for x, a, d in zip(xs, in_axes, in_dirs, strict=True)
        ]
        results = body(*states, *slices)
        states = list(results[:n_state])
        if outs is None:
            outs = [[] for _ in results[n_state:]]
        for values, value in zip(outs, results[n_state:], strict=True):
            values.append(value)
    if outs is None:
        if n_out:
            raise KernelFailed(
                "Scan over zero-length inputs cannot produce its scan outputs: their shape "
                "is only known from the body"
            )
        return tuple(states)
    out_dirs = list(scan_output_directions or [0] * len(outs))
    stacked = []
    for k, values in enumerate(outs):
        if k < len(out_dirs) and out_dirs[k]:
            values = values[::-1]
        stacked.append(_stack(values, f"Scan output {k}"))
    out_axes = _axes(scan_output_axes, len(stacked), lambda k: stacked[k].ndim, "scan_output_axes")
    stacked = [np.moveaxis(s, 0, a) if a else s for s, a in zip(stacked, out_axes, strict=True)]
    return (*states, *stacked)


@op("Scan", since=8)
def scan_8(
    sequence_lens: np.ndarray | None,
    /,
    *inputs: np.ndarray,
    body: Callable[..., list],
    directions: list[int] | None = None,
    num_scan_inputs: int,
) -> tuple[Any, ...]:
    """Scan with a batch axis: every input is ``[batch, ...]``, scan inputs ``[batch, seq, ...]``.

    Each batch entry is scanned on its own over its ``sequence_lens`` steps;
    scan outputs are zero past an entry's length.
    """
    n_state = len(inputs) - num_scan_inputs
    if n_state < 0 or num_scan_inputs < 1:
        raise KernelFailed(f"Scan has {len(inputs)} inputs but num_scan_inputs={num_scan_inputs}")
    xs = [np.asarray(x) for x in inputs[n_state:]]
    batch, steps = xs[0].shape[:2]
    lens = (
        np.full(batch, steps, dtype=np.int64)
        if sequence_lens is None
        else np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    )
    if lens.shape[0] != batch or np.any(lens < 0) or np.any(lens > steps):
        raise KernelFailed(
            f"sequence_lens {lens.tolist()} must give {batch} lengths in [0, {steps}]"
        )
    dirs = list(directions or [0] * num_scan_inputs)
    final_states, scan_outputs = [], []
    for b in range(batch):
        states = [np.asarray(s)[b] for s in inputs[:n_state]]
        n = int(lens[b])
        outs: list[list[Any]] = []
        for t in range(n):
            slices = [x[b, n - 1 - t if d else t] for x, d in zip(xs, dirs, strict=True)]
            results = body(*states, *slices)
            states = list(results[:n_state])
            if not outs:
                outs = [[] for _ in results[n_state:]]
            for values, value in zip(outs, results[n_state:], strict=True):
                values.append(value)
        final_states.append(states)
        scan_outputs.append([_stack(v, f"Scan output {k}") for k, v in enumerate(outs)])
    states_out = [np.stack([s[k] for s in final_states]) for k in range(n_state)]
    n_out = max((len(s) for s in scan_outputs), default=0)
    stacked = []
    for k in range(n_out):
        per_batch = [s[k] for s in scan_outputs if s]
        full = np.zeros((batch, steps) + per_batch[0].shape[1:], dtype=per_batch[0].dtype)
        for b, s in enumerate(scan_outputs):
            if s:
                full[b, : s[k].shape[0]] = s[k]
        stacked.append(full)
    return (*states_out, *stacked)


@op("SequenceMap", since=17)
def sequence_map(
    input_sequence: list[np.ndarray], /, *additional_inputs: Any, body: Callable[..., list]
) -> tuple[list[Any], ...]:
    """``body`` applied to each element (and the matching element of sequence inputs).

    Tensor inputs are passed whole to every call; each body output is
    collected into one output sequence.
    """
    count = len(input_sequence)
    for k, extra in enumerate(additional_inputs):
        if isinstance(extra, list) and len(extra) != count:
            raise KernelFailed(
                f"additional input {k} is a sequence of {len(extra)} elements; "
                f"input_sequence has {count}"
            )
    outputs: list[list[Any]] | None = None
    for i, element in enumerate(input_sequence):
        args = [extra[i] if isinstance(extra, list) else extra for extra in additional_inputs]
        results = body(element, *args)
        if outputs is None:
            outputs = [[] for _ in results]
        for values, value in zip(outputs, results, strict=True):
            values.append(value)
    if outputs is None:
        n_out = len(body.output_names) if hasattr(body, "output_names") else 1
        outputs = [[] for _ in range(n_out)]
    return tuple(outputs)
