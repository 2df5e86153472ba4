"""Value types nxrt keeps in its own layer: maps, and types shape inference leaves out.

onnx_ir cannot represent ``map(K, V)`` types (its reader raises "Map types
are not supported yet"), yet every classifier skl2onnx converts with default
options ends in ZipMap, whose output is ``seq(map(int64, tensor(float)))``,
and DictVectorizer models take a map as input. nxrt keeps such types in its
own layer: :func:`hide_map_types` takes them out of the protobuf before
onnx_ir reads it, and :func:`restore_map_types` puts a :class:`MapType` on
the values afterwards. At run time a map is a ``dict`` and a sequence of maps
a ``list`` of dicts, as ONNX Runtime takes and returns them.

Shape inference also leaves values untyped: most ``ai.onnx.ml`` schemas
(Scaler, Normalizer, Imputer, the tree ensembles, LinearRegressor ...) have no
inference function, and everything downstream of them stays untyped too. An
EP that compiles claims must know the type of every value entering a claim,
so :func:`complete_types` gives such outputs the type their op's schema
implies (a fixed type, the type of an input sharing the type variable, or,
for a classifier's labels, the kind of class labels it has) and runs
inference again, until nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import onnx

from nxrt.errors import InvalidArgument, InvalidModel

if TYPE_CHECKING:
    import onnx_ir as ir


@dataclass(frozen=True)
class MapType:
    """``map(key_type, value_type)``, shaped like onnx_ir's types (and its ``MapTypeProtocol``).

    ``dtype`` and ``elem_type`` name the value side, as onnx_ir's sequence and
    optional types do for their elements.
    """

    key_type: ir.DataType
    value_type: Any  # an onnx_ir type: TensorType, SequenceType, MapType ...
    denotation: str | None = field(default=None, compare=False)

    @property
    def elem_type(self) -> Any:
        return self.value_type

    @property
    def dtype(self) -> ir.DataType:
        return self.value_type.dtype

    def __repr__(self) -> str:
        return f"Map({self.key_type!r}, {self.value_type!r})"


def has_map(type_proto: onnx.TypeProto) -> bool:
    """Whether a type is, or holds, a map (which onnx_ir cannot read)."""
    kind = type_proto.WhichOneof("value")
    if kind == "map_type":
        return True
    if kind in ("sequence_type", "optional_type"):
        return has_map(getattr(type_proto, kind).elem_type)
    return False


def ir_type(type_proto: onnx.TypeProto) -> Any:
    """The onnx_ir type of a TypeProto, maps (as :class:`MapType`) included."""
    import onnx_ir as ir

    kind = type_proto.WhichOneof("value")
    if kind == "map_type":
        key = ir.DataType(type_proto.map_type.key_type)
        return MapType(key, ir_type(type_proto.map_type.value_type))
    if kind == "sequence_type":
        return ir.SequenceType(ir_type(type_proto.sequence_type.elem_type))
    if kind == "optional_type":
        return ir.OptionalType(ir_type(type_proto.optional_type.elem_type))
    if kind == "tensor_type":
        return ir.TensorType(ir.DataType(type_proto.tensor_type.elem_type))
    raise InvalidModel(f"nxrt cannot read the type {onnx.helper.printable_type(type_proto)}")


#: Map types taken out of one graph (and, in ``nested``, its subgraphs, in node order).
@dataclass
class HiddenTypes:
    types: dict[str, onnx.TypeProto] = field(default_factory=dict)
    nested: list[HiddenTypes] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.types) or any(self.nested)


def hide_map_types(graph: onnx.GraphProto) -> HiddenTypes:
    """Clear every map-holding type of ``graph`` (inputs, outputs, value_info, and in
    subgraphs) and return them, so that onnx_ir can read the graph."""
    hidden = HiddenTypes()
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.WhichOneof("value") and has_map(info.type):
            hidden.types[info.name] = onnx.TypeProto()
            hidden.types[info.name].CopyFrom(info.type)
            info.type.Clear()
    for subgraph in _subgraphs(graph):
        hidden.nested.append(hide_map_types(subgraph))
    return hidden


def restore_map_types(graph: ir.Graph, hidden: HiddenTypes) -> None:
    """Give the values of ``graph`` the map types :func:`hide_map_types` took out."""
    if not hidden:
        return
    if hidden.types:
        for value in _values(graph):
            proto = hidden.types.get(value.name) if value.name is not None else None
            if proto is not None:
                value.type = ir_type(proto)
    for subgraph, nested in zip(_ir_subgraphs(graph), hidden.nested):
        restore_map_types(subgraph, nested)


def _subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield attribute.g
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                yield from attribute.graphs


def _ir_subgraphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """The subgraphs of ``graph`` in the order :func:`_subgraphs` walks the protobuf."""
    import onnx_ir as ir

    for node in graph:
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                yield attribute.value
            elif attribute.type == ir.AttributeType.GRAPHS:
                yield from attribute.value


def _values(graph: ir.Graph) -> Iterator[ir.Value]:
    yield from graph.inputs
    for node in graph:
        yield from node.outputs


# -- types as ONNX Runtime names them ------------------------------------------------------------
def is_map_type(value_type: Any) -> bool:
    """Whether ``value_type`` is a map or a sequence of maps."""
    import onnx_ir as ir

    if isinstance(value_type, ir.SequenceType):
        return isinstance(value_type.elem_type, MapType)
    return isinstance(value_type, MapType)


# -- feeds -----------------------------------------------------------------------------------------
def map_feed(name: str, value: Any, value_type: Any) -> dict | list[dict]:
    """A map (``dict``) or sequence-of-maps (list of dicts) feed, checked against its type,
    with keys and values as plain Python ``int`` / ``float`` / ``str``."""
    import onnx_ir as ir

    if isinstance(value_type, ir.SequenceType):
        if not isinstance(value, (list, tuple)):
            raise InvalidArgument(
                f"input {name!r} is a sequence of maps: pass a list of dicts, not "
                f"{type(value).__name__}"
            )
        return [
            _one_map(f"{name}[{i}]", item, cast(MapType, value_type.elem_type))
            for i, item in enumerate(value)
        ]
    return _one_map(name, value, value_type)


def _one_map(name: str, value: Any, map_type: MapType) -> dict:
    if not isinstance(value, dict):
        raise InvalidArgument(f"input {name!r} is a map: pass a dict, not {type(value).__name__}")
    to_key = _converter(map_type.key_type)
    to_value = _converter(map_type.value_type.dtype)
    try:
        return {to_key(k): to_value(v) for k, v in value.items()}
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"input {name!r} must be a map({_name(map_type.key_type)}, "
            f"{_name(map_type.value_type.dtype)}): {exc}"
        ) from exc


def _converter(dtype: ir.DataType):
    """The Python type of one map key or value of ``dtype``, refusing the wrong kind."""
    import numbers

    import onnx_ir as ir

    if dtype == ir.DataType.STRING:

        def text(v: Any) -> str:
            if isinstance(v, bytes):
                return v.decode()
            if not isinstance(v, str):
                raise TypeError(f"{v!r} is not a string")
            return v

        return text
    if dtype.is_floating_point():

        def real(v: Any) -> float:
            # ONNX Runtime takes what float() takes (numpy bools, 0-d arrays), but no text
            v = _scalar(v)
            if not isinstance(v, (numbers.Real, np.bool_)):
                raise TypeError(f"{v!r} is not a number")
            return float(v)

        return real

    def integer(v: Any) -> int:
        v = _scalar(v)
        if not isinstance(v, numbers.Integral) or isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{v!r} is not an integer")
        return int(v)

    return integer


def _scalar(v: Any) -> Any:
    """A 0-d array as its one element (ONNX Runtime reads map values with float())."""
    if isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "biuf":
        return v[()]
    return v


def constant_array(tensor: Any) -> Any:
    """An onnx_ir tensor's data as kernels take it: a string tensor as an object array
    of ``str``, the form ONNX Runtime gives string tensors (onnx_ir gives ``bytes``, so
    string initializers would come out of a graph as bytes and miss string keys)."""
    array = tensor.numpy()
    if isinstance(array, np.ndarray) and array.dtype.kind in "SO" and _is_string(tensor):
        return as_strings(array)
    return array


def as_strings(array: np.ndarray) -> np.ndarray:
    """``array`` (bytes, ``str`` or both) as an object array of ``str``."""
    items = [
        v.decode("utf-8", errors="replace") if isinstance(v, (bytes, np.bytes_)) else str(v)
        for v in array.reshape(-1).tolist()
    ]
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(array.shape)


def _is_string(tensor: Any) -> bool:
    import onnx_ir as ir

    return getattr(tensor, "dtype", None) == ir.DataType.STRING


def _name(dtype: ir.DataType) -> str:
    return onnx.TensorProto.DataType.Name(int(dtype)).lower()


# -- types shape inference leaves out ------------------------------------------------------------
#: Classifiers whose first output (labels) is tensor(string) with ``classlabels_strings``,
#: else tensor(int64).
_LABELED = {"LinearClassifier", "SVMClassifier", "TreeEnsembleClassifier"}


def complete_types(
    model: onnx.ModelProto,
    infer: Callable[[onnx.ModelProto], onnx.ModelProto],
    rounds: int = 8,
    *,
    schemas_first: bool = False,
) -> onnx.ModelProto:
    """``infer(model)``, then types for the main graph's untyped node outputs from their
    schemas, then ``infer`` again, while that types anything new.

    ``schemas_first`` types from the schemas before the first ``infer`` too: some
    inference functions crash on an untyped input (onnx 1.23's LabelEncoder after a
    TreeEnsembleRegressor, which has no inference function), so a retry after such a
    crash gives them typed inputs. ``infer`` may be the identity: the schemas alone.
    """
    if schemas_first:
        _type_from_schemas(model)
    inferred = infer(model)
    for _ in range(rounds):
        if not _type_from_schemas(inferred):
            break
        inferred = infer(inferred)
    return inferred


def _type_from_schemas(model: onnx.ModelProto) -> int:
    """Add a ``value_info`` (type only) for each node output the schema types; the count."""
    graph = model.graph
    known: dict[str, onnx.TypeProto] = {}
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.WhichOneof("value"):
            known[info.name] = info.type
    for tensor in graph.initializer:
        known.setdefault(tensor.name, onnx.helper.make_tensor_type_proto(tensor.data_type, None))
    opsets = {o.domain or "": o.version for o in model.opset_import}
    added = 0
    for node in graph.node:
        missing = [i for i, name in enumerate(node.output) if name and name not in known]
        if not missing:
            continue
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
        except onnx.defs.SchemaError:
            continue
        for index in missing:
            found = _output_type(schema, node, index, known)
            if found is None:
                continue
            info = graph.value_info.add()
            info.name = node.output[index]
            info.type.CopyFrom(found)
            known[info.name] = info.type
            added += 1
    return added


def _output_type(
    schema: onnx.defs.OpSchema, node: onnx.NodeProto, index: int, known: dict[str, onnx.TypeProto]
) -> onnx.TypeProto | None:
    formals = list(schema.outputs)
    if index < len(formals):
        formal = formals[index]
    elif formals and formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        formal = formals[-1]
    else:
        return None
    type_str = formal.type_str
    if "(" in type_str:
        return parse_type(type_str)
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    if len(allowed.get(type_str, [])) == 1:
        return parse_type(allowed[type_str][0])
    for position, formal_in in enumerate(schema.inputs):
        if formal_in.type_str != type_str:
            continue
        # onnx's stub of FormalParameterOption leaves out the enum's name
        names = (
            node.input[position:]
            if formal_in.option.name == "Variadic"  # type: ignore[attr-defined]
            else node.input[position : position + 1]
        )
        for name in names:
            if name in known:
                found = onnx.TypeProto()
                found.CopyFrom(known[name])
                if found.HasField("tensor_type"):
                    found.tensor_type.ClearField("shape")
                return found
    if node.op_type in _LABELED and index == 0:
        strings = any(a.name == "classlabels_strings" and a.strings for a in node.attribute)
        return parse_type("tensor(string)" if strings else "tensor(int64)")
    return None


def parse_type(text: str) -> onnx.TypeProto:
    """A TypeProto from a schema's type string, e.g. ``seq(map(int64, tensor(float)))``."""
    text = text.strip()
    proto = onnx.TypeProto()
    head, _, rest = text.partition("(")
    inner = rest[:-1] if rest.endswith(")") else rest
    if head == "tensor":
        proto.tensor_type.elem_type = _elem_type(inner)
    elif head == "seq":
        proto.sequence_type.elem_type.CopyFrom(parse_type(inner))
    elif head == "optional":
        proto.optional_type.elem_type.CopyFrom(parse_type(inner))
    elif head == "map":
        depth, cut = 0, -1
        for i, char in enumerate(inner):
            depth += char == "("
            depth -= char == ")"
            if char == "," and depth == 0:
                cut = i
                break
        key, value = inner[:cut].strip(), inner[cut + 1 :].strip()
        proto.map_type.key_type = _elem_type(key)
        proto.map_type.value_type.CopyFrom(
            parse_type(value if "(" in value else f"tensor({value})")
        )
    else:
        raise InvalidModel(f"nxrt cannot read the type {text!r}")
    return proto


def _elem_type(name: str) -> int:
    return int(onnx.TensorProto.DataType.Value(name.strip().upper()))


__all__ = [
    "HiddenTypes",
    "MapType",
    "complete_types",
    "has_map",
    "hide_map_types",
    "ir_type",
    "is_map_type",
    "map_feed",
    "parse_type",
    "restore_map_types",
]
