"""What OpenVINO can run, asked of OpenVINO itself rather than of a list kept here.

Per node: the node alone becomes a model (core's :func:`nxrt.claims.standalone_model`,
with the ``Constant`` nodes that feed it, so OpenVINO sees a constant wherever
the graph has one), which OpenVINO's ONNX frontend converts (``Core.read_model``)
and a device other than the CPU is asked about (``Core.query_model``). The answer
is cached by the node's signature — op, domain, opset, attributes, input and
output types, ranks and which dims are static, the values of small constant
inputs — so the hundred Convs of a ResNet cost a handful of questions, and a
second session costs none.

Per claim: nodes that each convert may still fail together (a translator
that needs a constant its producer no longer folds, a device limit on the
fused result). Each candidate claim is converted and compiled as a whole
while the claims are formed (core's boundary check); when that fails, the
device names the operations it refuses, or else the shortest prefix (in graph
order) that fails is found by bisection, and that node leaves the claim with
OpenVINO's message as the reason. The compiled model of every claim that
passes is kept, so ``compile`` has nothing left to do.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import onnx_ir as ir

from nxrt.claims import captured_values, claim_boundary, is_weight, standalone_model
from nxrt.kernel import SubgraphClaim
from nxrt.registry import normalize_domain

if TYPE_CHECKING:
    import onnx

    from nxrt_ep_openvino.guard import CrashGuard

PRODUCER = "nxrt-ep-openvino"
#: Constant inputs up to this size are part of a node's signature by value (a Reshape's
#: shape, a Slice's starts); larger ones (weights) by dtype and shape only.
SMALL_CONSTANT_BYTES = 256
#: Weights at least this large reach OpenVINO as nxrt's own arrays, not through ONNX bytes.
INLINE_WEIGHT_BYTES = 1 << 16
#: Signatures remembered per OpenVINO version and device.
CACHE_SIZE = 8192

#: Element types numpy and OpenVINO exchange as they are (bfloat16, float8 and the
#: sub-byte types stay inside claims).
EXCHANGEABLE = frozenset(
    ir.DataType[name]
    for name in (
        "FLOAT", "FLOAT16", "DOUBLE", "BOOL",
        "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
    )
)  # fmt: skip
#: Attribute types a signature can hold; nodes with others (graphs) are always asked.
_PLAIN_ATTRIBUTES = frozenset(
    ir.AttributeType[name] for name in ("INT", "FLOAT", "STRING", "INTS", "FLOATS", "STRINGS")
)
#: Ops that read float64 values without computing with them: exact although OpenVINO's
#: CPU plugin keeps float64 values as float32.
_FLOAT64_EXACT = frozenset({"Shape", "Size"})


def _attribute(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _runtime_input(node: ir.Node, index: int) -> bool:
    value = node.inputs[index] if index < len(node.inputs) else None
    return value is not None and not is_weight(value) and constant_producer(value) is None


#: Nodes OpenVINO converts but computes wrongly: its own ONNX node conformance cases
#: differ by far more than rounding (garbage values, wrong shapes). Measured with
#: OpenVINO 2026.4; each is refused so the node goes to an EP that gets it right.
KNOWN_WRONG: dict[str, tuple[Callable[[ir.Node], bool], str]] = {
    "Tile": (
        lambda node: _runtime_input(node, 1),
        "with repeats known only at run time, OpenVINO returns uninitialised memory",
    ),
    "SpaceToDepth": (
        lambda node: _attribute(node, "mode", "DCR") == "CRD",
        "OpenVINO orders the blocks of mode CRD as DCR",
    ),
    "DFT": (lambda node: True, "OpenVINO's DFT differs from ONNX's (test_dft)"),
    "Attention": (
        lambda node: any(
            _attribute(node, name, -1) != -1 for name in ("left_window_size", "right_window_size")
        ),
        "OpenVINO ignores the sliding window (left_window_size, right_window_size)",
    ),
    "LSTM": (
        lambda node: (
            _attribute(node, "layout", 0) == 1
            or (len(node.inputs) > 7 and node.inputs[7] is not None and bool(node.inputs[7].name))
        ),
        "with layout=1 (batch first) OpenVINO returns the wrong shapes, and it ignores "
        "peephole weights (input P)",
    ),
    **{
        op: (
            lambda node: _attribute(node, "layout", 0) == 1,
            "with layout=1 (batch first), OpenVINO returns the wrong shapes",
        )
        for op in ("GRU", "RNN")
    },
}


def node_opset(node: ir.Node, opsets: Mapping[str, int]) -> int:
    """The opset a node follows: its own version if set, else the model's import."""
    if node.version is not None:
        return int(node.version)
    return int(opsets.get(normalize_domain(node.domain), 0))


def constant_producer(value: ir.Value) -> ir.Node | None:
    """The ``Constant`` node that makes ``value``, if one does."""
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant":
        if not normalize_domain(producer.domain):
            return producer
    return None


def is_used(value: ir.Value) -> bool:
    return bool(value.name) and (bool(value.uses()) or value.is_graph_output())


def type_problem(value: ir.Value) -> str:
    """Why ``value`` cannot cross between nxrt and OpenVINO ('' when it can)."""
    if value.type is None or value.dtype is None:
        return f"the type of {value.name!r} is unknown (shape inference could not tell)"
    if not isinstance(value.type, ir.TensorType):
        return f"{value.name!r} is a {value.type}, and OpenVINO exchanges tensors only"
    if value.dtype not in EXCHANGEABLE:
        return f"{value.name!r} is {value.dtype.name}, which numpy and OpenVINO do not share"
    return ""


class _Uncacheable(Exception):
    """A node whose signature cannot be written down (graph attributes): always asked."""


def _tensor_key(tensor: Any) -> tuple[Any, ...]:
    """A small constant by value; a large one (a weight) by dtype and rank."""
    if tensor.nbytes <= SMALL_CONSTANT_BYTES:
        return (int(tensor.dtype), tuple(int(d) for d in tensor.shape), tensor.tobytes())
    return (int(tensor.dtype), len(tensor.shape), None)


def _attribute_key(attr: Any) -> Hashable:
    if attr.type == ir.AttributeType.TENSOR:
        return _tensor_key(attr.value)
    if attr.type not in _PLAIN_ATTRIBUTES:
        raise _Uncacheable
    value = attr.value
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _shape_key(value: ir.Value) -> tuple[bool, ...] | None:
    """Rank, and which dims are static: conversions depend on those, not on the sizes
    (the sizes that decide something, a Reshape's target, are constant inputs)."""
    if value.shape is None:
        return None
    return tuple(isinstance(d, int) for d in value.shape)


def _input_key(value: ir.Value | None) -> Hashable:
    if value is None or not value.name:
        return None
    kind = type(value.type).__name__ if value.type is not None else None
    dtype = int(value.dtype) if value.dtype is not None else None
    constant: Hashable = None
    if is_weight(value):
        constant = ("weight", _tensor_key(value.const_value))
    else:
        producer = constant_producer(value)
        if producer is not None:
            attrs = tuple(sorted((k, _attribute_key(a)) for k, a in producer.attributes.items()))
            constant = ("constant", attrs)
    return (kind, dtype, _shape_key(value), constant)


def node_signature(node: ir.Node, opset: int) -> Hashable:
    """What decides whether OpenVINO converts a node; ``_Uncacheable`` for subgraph ops."""
    attrs = tuple(sorted((name, _attribute_key(a)) for name, a in node.attributes.items()))
    outputs = tuple(
        (i, int(v.dtype) if v.dtype is not None else None, _shape_key(v))
        for i, v in enumerate(node.outputs)
        if is_used(v)
    )
    inputs = tuple(_input_key(v) for v in node.inputs)
    return (normalize_domain(node.domain), node.op_type, opset, attrs, inputs, outputs)


def short_reason(exc: BaseException) -> str:
    """OpenVINO's message without its C++ locations and documentation links."""
    text = str(exc)
    summary = [line.strip("- ").strip() for line in text.splitlines() if line.startswith("--")]
    if summary:
        return "; ".join(summary)[:400]
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip()
        and not line.startswith(("Exception from", "Check '"))
        and "docs.openvino.ai" not in line
    ]
    message = lines[-1] if lines else type(exc).__name__
    return re.sub(r"\s+", " ", message)[:400]


@dataclass
class Converted:
    """A claim converted by OpenVINO's frontend, and the nxrt arrays its constants share."""

    model: Any  # openvino.Model
    weights: dict[str, np.ndarray]
    feeds: list[str]  # the values its parameters stand for, in order
    #: The ONNX bytes the frontend read (the weights in ``weights`` left out of them).
    source: bytes = b""


@dataclass
class Compiled:
    """A claim compiled while claiming, with the boundary it was built for."""

    model: Any  # openvino.CompiledModel
    weights: dict[str, np.ndarray]  # what its constants may still point into: kept alive
    feeds: list[str]
    inputs: list[str]
    outputs: list[str]


def claim_key(nodes: Sequence[ir.Node]) -> frozenset[int]:
    return frozenset(id(n) for n in nodes)


#: Compiles a converted ``openvino.Model`` with the EP's settings (raises OpenVINO's error).
CompileFunction = Callable[[Any], Any]


class OpenVinoCapability:
    """Answers "can OpenVINO run this node on this device?", with OpenVINO's reason when not.

    :param core: The ``openvino.Core`` to ask.
    :param device: The OpenVINO device name, e.g. ``CPU``.
    :param version: OpenVINO's version (answers are cached per version and device).
    :param compile: Compiles a converted model with the EP's settings; a claim is
        compiled while it is formed, so a device that refuses the whole refuses it
        in time for its nodes to go to another EP.
    """

    #: (OpenVINO version, device) -> signature -> reason ('' when supported); shared by
    #: every EP instance, so a second session of the same model asks nothing.
    _answers: dict[tuple[str, str], OrderedDict[Hashable, str]] = {}
    _lock = threading.Lock()

    def __init__(
        self,
        core: Any,
        device: str,
        version: str,
        compile: CompileFunction,
        guard: CrashGuard | None = None,
    ) -> None:
        self.core = core
        self.device = device
        self.compile = compile
        #: Compiles each claim in a process of its own before it is compiled here.
        self.guard = guard
        with self._lock:
            self.answers = self._answers.setdefault((version, device), OrderedDict())
        #: Claims compiled while claiming, until the EP's ``compile`` takes them.
        self.compiled: dict[frozenset[int], Compiled] = {}
        self.questions = 0  # how many nodes OpenVINO was asked about (tests read it)

    # -- nodes ----------------------------------------------------------------------------------
    def refusal(self, node: ir.Node, graph: ir.Graph, opsets: Mapping[str, int]) -> str:
        """Why OpenVINO cannot run ``node`` ('' when it can)."""
        opset = node_opset(node, opsets)
        if not opset:
            return f"the model imports no opset for domain {node.domain or 'ai.onnx'!r}"
        reason = self._precision_refusal(node)
        if reason:
            return reason
        wrong = KNOWN_WRONG.get(node.op_type) if not normalize_domain(node.domain) else None
        if wrong is not None and wrong[0](node):
            return f"{node.op_type}: {wrong[1]}"
        for value in node.inputs:
            if value is not None and value.name and not is_weight(value):
                if constant_producer(value) is None and (value.type is None or not value.dtype):
                    return f"the type of input {value.name!r} is unknown, and OpenVINO needs it"
        try:
            key: Hashable | None = node_signature(node, opset)
        except _Uncacheable:
            key = None
        if key is not None:
            with self._lock:
                if key in self.answers:
                    self.answers.move_to_end(key)
                    return self.answers[key]
        reason = self._ask(node, graph, opsets)
        if key is not None:
            with self._lock:
                self.answers[key] = reason
                while len(self.answers) > CACHE_SIZE:
                    self.answers.popitem(last=False)
        return reason

    def _precision_refusal(self, node: ir.Node) -> str:
        """float64 on the CPU: OpenVINO computes it as float32, ONNX Runtime exactly."""
        if self.device.split(".")[0] != "CPU" or node.op_type in _FLOAT64_EXACT:
            return ""
        for value in (*node.inputs, *node.outputs):
            if value is not None and value.dtype == ir.DataType.DOUBLE:
                return (
                    f"{value.name!r} is float64, which OpenVINO's CPU plugin computes as "
                    "float32; left to an EP that computes it exactly"
                )
        return ""

    def _ask(self, node: ir.Node, graph: ir.Graph, opsets: Mapping[str, int]) -> str:
        self.questions += 1
        name = f"{node.domain or 'ai.onnx'}::{node.op_type}"
        try:
            converted = to_openvino(
                self.core, probe_claim(node, graph), graph, opsets, bind_weights=False
            ).model
        except Exception as exc:  # noqa: BLE001 - OpenVINO's reason is the answer
            return f"OpenVINO's ONNX frontend cannot convert {name}: {short_reason(exc)}"
        if self.device.split(".")[0] == "CPU":
            # The CPU plugin implements every operation of OpenVINO's opsets, and asking it
            # costs about as much as compiling (30 ms a node); each claim is compiled before
            # it is accepted, and the plugin is asked what it does not run only when it
            # refuses to compile one.
            return ""
        missing = self._unsupported(converted)
        if missing:
            kinds = ", ".join(sorted({op.get_type_name() for op in missing}))
            return f"OpenVINO's {self.device} plugin does not run {kinds} ({name})"
        return ""

    def _unsupported(self, converted: Any) -> list[Any]:
        """The operations of a converted model the device says it does not run.

        A device that answers nothing at all (an empty answer, or an error: the
        CPU plugin does so for some models with dynamic ranks) is not taken at its
        word: the claim is compiled before it is accepted, and that decides.
        """
        try:
            supported = self.core.query_model(converted, self.device)
        except Exception:  # noqa: BLE001
            return []
        if not supported:
            return []
        return [
            op
            for op in converted.get_ops()
            if op.get_friendly_name() not in supported
            and op.get_type_name() not in ("Parameter", "Result", "Constant")
        ]

    # -- claims ---------------------------------------------------------------------------------
    def claim_refusals(
        self, ep_id: str, nodes: Sequence[ir.Node], graph: ir.Graph, opsets: Mapping[str, int]
    ) -> dict[int, str]:
        """Nodes (by id) that must leave a candidate claim, and why (core's boundary check).

        First what cannot cross the claim's boundary (values of unknown or
        unshared types, outer values a subgraph reads); then the claim is
        converted and compiled as a whole, and kept for :meth:`take` when it compiles.
        """
        refusals = boundary_refusals(nodes)
        if refusals:
            return refusals
        key = claim_key(nodes)
        if key in self.compiled:
            return {}
        claim = self._claim(ep_id, nodes, graph)
        if not claim.outputs:
            return {id(n): "nothing reads what it computes (dead code)" for n in nodes}
        reason, converted = self._convert(claim, graph, opsets)
        if reason:
            index, reason = self._first_failing(
                nodes, lambda part: self._convert(self._claim(ep_id, part, graph), graph, opsets)[0]
            )
            return {id(nodes[index]): f"converts alone but not within its claim: {reason}"}
        assert converted is not None
        crash = self._crash(claim, graph, opsets, converted)
        if crash:
            return {id(n): crash for n in nodes}
        try:
            compiled = self.compile(converted.model)
        except Exception as exc:  # noqa: BLE001 - OpenVINO's reason is the answer
            return self._compile_refusals(ep_id, nodes, graph, opsets, converted.model, exc)
        self.compiled[key] = Compiled(
            compiled, converted.weights, converted.feeds, list(claim.inputs), list(claim.outputs)
        )
        return {}

    def _crash(
        self,
        claim: SubgraphClaim,
        graph: ir.Graph,
        opsets: Mapping[str, int],
        converted: Converted,
    ) -> str:
        """How OpenVINO crashes compiling ``claim`` in a process of its own ('' when it
        does not, or where there is no guard). The verdict is looked up by the bytes the
        frontend read with the large weights hashed in place; only a claim never seen
        is written whole (weights inline) for the helper."""
        if self.guard is None or not self.guard.enabled:
            return ""
        weights = converted.weights
        parts: list[bytes | memoryview] = [converted.source]
        parts += [np.ascontiguousarray(weights[name]).data for name in sorted(weights)]

        def whole() -> bytes | None:
            full, _ = standalone_model(claim, graph, producer_name=PRODUCER)
            _with_opsets(full, opsets)
            try:
                return full.SerializeToString()
            except ValueError:  # past protobuf's 2 GB: it cannot be written whole
                return None

        return self.guard.crash(parts, whole)

    def _compile_refusals(
        self,
        ep_id: str,
        nodes: Sequence[ir.Node],
        graph: ir.Graph,
        opsets: Mapping[str, int],
        converted: Any,
        error: BaseException,
    ) -> dict[int, str]:
        """The nodes to leave a claim the device would not compile.

        The device is asked which operations it does not run; those carry the
        output names of the ONNX nodes they came from. When it names none, the
        shortest prefix of the claim that fails to compile decides.
        """
        reason = f"OpenVINO's {self.device} plugin cannot compile its claim: {short_reason(error)}"
        producers = {v.name: n for n in nodes for v in n.outputs if v.name}
        culprits = {}
        for op in self._unsupported(converted):
            node = producers.get(op.get_friendly_name().split("/")[0])
            if node is not None:
                culprits[id(node)] = f"OpenVINO's {self.device} plugin does not run it: {reason}"
        if culprits:
            return culprits

        def compile_fails(part: Sequence[ir.Node]) -> str:
            failed, converted = self._convert(self._claim(ep_id, part, graph), graph, opsets)
            if failed or converted is None:
                return failed
            try:
                self.compile(converted.model)
            except Exception as exc:  # noqa: BLE001
                return short_reason(exc)
            return ""

        index, why = self._first_failing(nodes, compile_fails)
        return {id(nodes[index]): f"compiles alone but not within its claim: {why or reason}"}

    def take(self, claim: SubgraphClaim) -> Compiled | None:
        """The compiled model of a claim, if it was compiled while claiming (once)."""
        compiled = self.compiled.pop(claim_key(claim.nodes), None)
        if compiled is None:
            return None
        # The kernel maps values by name, so only the sets must agree with the host's boundary.
        if set(compiled.inputs) != set(claim.inputs) or set(compiled.outputs) != set(claim.outputs):
            return None
        return compiled

    def forget(self, keep: Sequence[Sequence[ir.Node]], added: set[frozenset[int]]) -> None:
        """Drop the compiled models ``added`` by one claiming whose groups were split again."""
        wanted = {claim_key(nodes) for nodes in keep}
        for key in added - wanted:
            self.compiled.pop(key, None)

    def convert(
        self, claim: SubgraphClaim, graph: ir.Graph, opsets: Mapping[str, int]
    ) -> Converted:
        """The claim converted now; ``RuntimeError`` with OpenVINO's reason when it fails."""
        reason, converted = self._convert(claim, graph, opsets)
        if reason or converted is None:
            raise RuntimeError(reason)
        return converted

    def _claim(self, ep_id: str, nodes: Sequence[ir.Node], graph: ir.Graph) -> SubgraphClaim:
        claim = SubgraphClaim(ep_id, list(nodes))
        claim.inputs, claim.outputs = claim_boundary(claim, graph)
        return claim

    def _convert(
        self, claim: SubgraphClaim, graph: ir.Graph, opsets: Mapping[str, int]
    ) -> tuple[str, Converted | None]:
        """OpenVINO's reason it cannot convert the claim ('' when it can), and the model."""
        try:
            return "", to_openvino(self.core, claim, graph, opsets)
        except Exception as exc:  # noqa: BLE001 - OpenVINO's reason is the answer
            return short_reason(exc), None

    @staticmethod
    def _first_failing(
        nodes: Sequence[ir.Node], fails: Callable[[Sequence[ir.Node]], str]
    ) -> tuple[int, str]:
        """The last node of the shortest prefix of ``nodes`` that ``fails``, and why.

        The whole is known to fail, so a bisection over prefix lengths finds
        it in a logarithmic number of attempts.
        """
        low, high = 1, len(nodes)
        reasons: dict[int, str] = {}
        while low < high:
            middle = (low + high) // 2
            reason = fails(nodes[:middle])
            if reason:
                high, reasons[middle] = middle, reason
            else:
                low = middle + 1
        return high - 1, reasons.get(high) or fails(nodes[:high])


def boundary_refusals(nodes: Sequence[ir.Node]) -> dict[int, str]:
    """Nodes of a group (by id) whose values cannot cross the claim's boundary, and why."""
    inside = {id(n) for n in nodes}
    refusals: dict[int, str] = {}
    for node in nodes:
        for value in node.inputs:
            if value is None or not value.name or is_weight(value):
                continue
            producer = value.producer()
            if producer is not None and id(producer) in inside:
                continue
            problem = type_problem(value)
            if problem:
                refusals[id(node)] = f"reads {problem}, from outside its claim"
        for value in captured_values(node) if node.attributes else ():
            producer = value.producer()
            if not is_weight(value) and (producer is None or id(producer) not in inside):
                refusals[id(node)] = f"a subgraph reads {value.name!r}, made outside its claim"
        for value in node.outputs:
            if not value.name:
                continue
            leaves = value.is_graph_output() or any(id(u) not in inside for u, _ in value.uses())
            problem = type_problem(value) if leaves else ""
            if problem:
                refusals[id(node)] = f"writes {problem}, out of its claim"
    return refusals


def _with_opsets(model: onnx.ModelProto, opsets: Mapping[str, int]) -> onnx.ModelProto:
    """Subgraph bodies carry no opset imports: the model's are added."""
    from onnx import helper

    have = {normalize_domain(o.domain) for o in model.opset_import}
    for domain, version in opsets.items():
        if normalize_domain(domain) not in have:
            model.opset_import.append(helper.make_opsetid(domain, int(version)))
    return model


def claim_model(
    claim: SubgraphClaim, graph: ir.Graph, opsets: Mapping[str, int]
) -> onnx.ModelProto:
    """The claim as a standalone ONNX model with every weight inline (an EPContext keeps it)."""
    model, _ = standalone_model(claim, graph, producer_name=PRODUCER)
    return _with_opsets(model, opsets)


def to_openvino(
    core: Any,
    claim: SubgraphClaim,
    graph: ir.Graph,
    opsets: Mapping[str, int],
    *,
    bind_weights: bool = True,
) -> Converted:
    """The claim as an ``openvino.Model``, and the weight arrays it shares with nxrt.

    Weights of at least :data:`INLINE_WEIGHT_BYTES` do not go through the
    ONNX bytes at all: they reach the frontend as graph inputs, and the
    converted model's parameters are then replaced by constants made from
    nxrt's arrays (over them when they are writeable, which the caller then
    keeps alive; else copied once). A probe leaves them as parameters,
    which is all a conversion check needs. Raises OpenVINO's error when the
    frontend cannot convert the model.
    """
    model, external = standalone_model(
        claim, graph, external_threshold=INLINE_WEIGHT_BYTES, producer_name=PRODUCER
    )
    _with_opsets(model, opsets)
    feeds = [value.name for value in model.graph.input]
    _weights_as_inputs(model, external)
    source = model.SerializeToString()
    converted = core.read_model(source)
    if bind_weights and external:
        _bind_weights(converted, external)
    return Converted(converted, external, feeds, source)


def _weights_as_inputs(model: onnx.ModelProto, external: Mapping[str, np.ndarray]) -> None:
    from onnx import helper

    kept = [t for t in model.graph.initializer if t.name not in external]
    moved = [t for t in model.graph.initializer if t.name in external]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved
    )


def _bind_weights(converted: Any, external: Mapping[str, np.ndarray]) -> None:
    import openvino as ov

    for parameter in list(converted.get_parameters()):
        name = next((n for n in parameter.output(0).get_names() if n in external), None)
        if name is None:
            continue
        array = external[name]
        # OpenVINO shares only writeable arrays; nxrt's weights are read-only views, which
        # are copied once here (the plugin repacks its weights while compiling anyway).
        constant = ov.op.Constant(array, shared_memory=bool(array.flags.writeable))
        constant.set_friendly_name(name)
        parameter.output(0).replace(constant.output(0))
        converted.remove_parameter(parameter)
    converted.validate_nodes_and_infer_types()


def probe_claim(node: ir.Node, graph: ir.Graph) -> SubgraphClaim:
    """One node as a claim of its own: its Constant producers come along, its other
    inputs (and outer values its subgraphs read) are the claim's inputs."""
    constants: list[ir.Node] = []
    for value in node.inputs:
        producer = constant_producer(value) if value is not None else None
        if producer is not None and all(producer is not c for c in constants):
            constants.append(producer)
    claim = SubgraphClaim(PRODUCER, [*constants, node])
    made = {v.name for c in constants for v in c.outputs}
    names: list[str] = []
    for value in [*node.inputs, *captured_values(node)] if node.attributes else node.inputs:
        if value is not None and value.name and value.name not in made and value.name not in names:
            names.append(value.name)
    outputs = [cast(str, v.name) for v in node.outputs if is_used(v)]
    claim.inputs = names
    claim.outputs = outputs or [v.name for v in node.outputs if v.name][:1]
    return claim
