"""Loading a model: parse, check, infer shapes, and validate the graph's structure.

Everything a user can hand to ``InferenceSession`` (a path, bytes, a
``ModelProto``) goes through :func:`load_model`, which returns an ``onnx_ir``
model whose nodes are in topological order, or raises :class:`InvalidModel`
with what is wrong and where.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import onnx

from nxrt.errors import InvalidModel, ModelNotFound, ModelNotParsed
from nxrt.pipeline import contained
from nxrt.pipeline.values import MapType, complete_types, hide_map_types, restore_map_types
from nxrt.registry import normalize_domain

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.pipeline.contained import Emit

logger = logging.getLogger("nxrt")


def read_proto(model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Parse the model without loading external data (that is mapped lazily)."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as exc:  # noqa: BLE001 - protobuf raises its own DecodeError
            raise ModelNotParsed(
                f"the bytes given are not an ONNX model ({exc}); pass the bytes of a .onnx file"
            ) from exc
        if not proto.graph.node and not proto.graph.output:
            raise InvalidModel("the bytes given hold no ONNX graph; pass the bytes of a .onnx file")
        return proto
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ModelNotFound(f"model file {path!r} does not exist")
        try:
            return onnx.load(path, load_external_data=False)
        except Exception as exc:  # noqa: BLE001
            raise ModelNotParsed(f"{path!r} is not a readable ONNX model: {exc}") from exc
    raise InvalidModel(
        f"cannot load a model from {type(model).__name__}; pass a path, bytes or onnx.ModelProto"
    )


def check_opsets(proto: onnx.ModelProto) -> None:
    """Refuse a default-domain opset newer than the onnx package defines (as ONNX Runtime does)."""
    newest = onnx.defs.onnx_opset_version()
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > newest:
            raise InvalidModel(
                f"the model uses opset {opset.version} of the default domain, newer than the "
                f"newest this installation knows ({newest}); upgrade onnx and nxrt, or export "
                f"the model at opset {newest} or lower"
            )


def check_proto(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Run the ONNX checker, then shape inference (which may not know every op); returns
    ``proto`` with the inferred types and shapes in its ``value_info``. Outputs that
    inference leaves untyped get their schema's type (:func:`nxrt.pipeline.values.complete_types`).

    Both run on a copy without the weights' bytes (:func:`_types_only`): each
    passes the whole model through C++ as serialized bytes, and shape
    inference returns yet another full copy (measured on a 650 MB decoder: a
    3.2 GB peak in this function, 1.4 GB without the weights). Both run in a
    child process (:mod:`nxrt.pipeline.contained`), because some models crash them: a
    crash of the checker refuses the model with :class:`InvalidModel`, one of
    shape inference leaves the types to the schemas (:func:`_contained_types`).
    """
    from nxrt.pipeline.external_data import external_data_hidden_from_checker

    light = _types_only(proto)
    _initializers_listed_as_inputs(light)
    with _outputs_typed_for_checker(light), external_data_hidden_from_checker(light):
        for_checker = light.SerializeToString()
    _eye_like_as_cast(light.graph)
    inferred = _contained_types(for_checker, light)
    if inferred is not None:
        _take_inferred_types(proto.graph, inferred, _dim_names(proto.graph))
    return proto


#: What the child of :func:`_check_and_infer` reports, each a record's first bytes.
_CHECKED, _REFUSED, _TYPED, _UNTYPED = b"checked", b"refused:", b"typed:", b"untyped"


def _check_and_infer(
    for_checker: bytes | None, light: onnx.ModelProto, schemas_first: bool, emit: Emit
) -> None:
    """A contained child's work: the checker on ``for_checker`` (``None``: skipped), then
    shape inference on ``light``; emits the checker's verdict, then the inferred types
    (only :func:`_types_of`: no attribute, no initializer travels back)."""
    if for_checker is not None:
        try:
            onnx.checker.check_model(for_checker)
        except onnx.checker.ValidationError as exc:
            text = str(exc).strip()
            first = text.splitlines()[0] if text else repr(exc)
            emit(_REFUSED + first.encode(errors="replace"))
            return
        emit(_CHECKED)
    try:
        inferred = complete_types(light, _infer_shapes, schemas_first=schemas_first)
    except Exception:  # noqa: BLE001 - inference is an aid, never required
        emit(_UNTYPED)
        return
    emit(_TYPED + _types_of(inferred.graph).SerializeToString())


def _contained_types(for_checker: bytes, light: onnx.ModelProto) -> onnx.GraphProto | None:
    """The checker's verdict on ``for_checker`` (``light`` as the checker takes it, see
    :func:`_outputs_typed_for_checker`) and the inferred types of ``light`` (``None``:
    none inferred), from children that may crash without harm to this process.

    A crash of the checker refuses the model (:class:`InvalidModel`): nxrt
    cannot vouch for it. A crash of shape inference does not: inference is
    an aid, so it is tried once more with every type the schemas give filled
    in first (what inference functions that crash on an untyped input need),
    and if that dies too, the types come from the schemas alone, with no
    onnx C++ run; kernels find the rest at run time, as ONNX Runtime does.
    """
    in_helper = _helper_knows(light)
    try:
        records = contained.run(_check_and_infer, for_checker, light, False, in_helper=in_helper)
    except contained.ChildDied as died:
        records = died.records
        if not records:
            raise InvalidModel(
                f"onnx's checker (onnx {onnx.__version__}) could not check this model: its "
                f"child process {died.reason} (this process is unharmed), and nxrt does not "
                "run a model it cannot check. Check that the exporter wrote the model whole "
                "and valid (onnx.checker.check_model in a separate process shows where it "
                "fails); report a crash to the exporter, or to onnx if the model is valid"
            ) from None
        logger.info(
            "onnx's shape inference %s on this model (its child process %s); nxrt tries it "
            "again with the types the op schemas give filled in first",
            "did not finish" if isinstance(died, contained.TimedOut) else "crashed",
            died.reason,
        )
    if records[0].startswith(_REFUSED):
        reason = records[0][len(_REFUSED) :].decode(errors="replace")
        raise InvalidModel(f"the model fails the ONNX checker: {reason}")
    if len(records) > 1:
        return _typed(records[1])
    try:
        retry = contained.run(_check_and_infer, None, light, True, in_helper=in_helper)
    except contained.ChildDied as died:
        logger.info(
            "onnx's shape inference failed again (its child process %s); nxrt types the "
            "model's values from the op schemas alone",
            died.reason,
        )
        return complete_types(light, _no_inference).graph
    return _typed(retry[0]) if retry else None


#: Domains whose schemas the helper process has (onnx's own, and nxrt's from
#: :mod:`nxrt.contrib_ops`): a model importing another (``com.microsoft``, a custom op
#: domain whose schema a plugin registered in this process) is checked in a fork of this
#: process, which has every schema registered here.
_HELPER_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "pkg.nxrt"})


def _helper_knows(light: onnx.ModelProto) -> bool:
    """Whether the helper process knows every domain ``light`` imports (those of the
    model's own functions travel with it)."""
    known = _HELPER_DOMAINS | {f.domain for f in light.functions}
    imports = [*light.opset_import, *(o for f in light.functions for o in f.opset_import)]
    return all(o.domain in known for o in imports)


def _typed(record: bytes) -> onnx.GraphProto | None:
    if not record.startswith(_TYPED):
        return None  # inference raised (it cannot type this model): no types, as before
    graph = onnx.GraphProto()
    graph.ParseFromString(record[len(_TYPED) :])
    return graph


def _no_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    """The ``infer`` of :func:`complete_types` that leaves the model as it is."""
    return model


def _initializers_listed_as_inputs(light: onnx.ModelProto) -> None:
    """Before IR version 4 the checker wants every initializer listed as a graph input; like
    ONNX Runtime, accept such models that do not list them (ONNX Runtime's own sample
    ``mul_1.onnx``). Only the checker's copy gains the inputs, so they stay constants."""
    if light.ir_version >= 4:
        return
    listed = {value.name for value in light.graph.input}
    for tensor in light.graph.initializer:
        if tensor.name not in listed:
            light.graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _eye_like_as_cast(graph: onnx.GraphProto) -> None:
    """Give shape inference each EyeLike as the Cast (or Identity) it infers like: same
    shape, the ``dtype`` attribute's type. onnx 1.23's EyeLike inference crashes the
    process (a segmentation fault) on an input typed by a function body's inference, such
    as GroupNormalization's output; the copy inference sees is never run, and the EyeLike
    kernel checks its input's rank itself."""
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs]:
                _eye_like_as_cast(subgraph)
        if node.op_type != "EyeLike" or node.domain not in ("", "ai.onnx"):
            continue
        dtype = [a for a in node.attribute if a.name == "dtype"]
        del node.attribute[:]
        if dtype:
            node.op_type = "Cast"
            node.attribute.append(onnx.helper.make_attribute("to", dtype[0].i))
        else:
            node.op_type = "Identity"


#: Initializers of at least this many bytes (serialized) go to the checker and to shape
#: inference as data-less stubs; smaller ones (the shape constants inference folds) stay.
_STUB_BYTES = 1024
#: The ``location`` of a stub: never a file, only read by the checker's field checks.
_STUB_LOCATION = "nxrt-weight-data-left-out"


def _types_only(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose large main-graph initializers are external-data stubs
    (name, type and shape kept, no bytes), built field by field so no weight is copied."""
    light = onnx.ModelProto()
    _copy_fields(proto, light, skip="graph")
    _copy_fields(proto.graph, light.graph, skip="initializer")
    for tensor in proto.graph.initializer:
        # ByteSize counts the data in whichever field holds it (raw_data, float_data, ...)
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.ByteSize() < _STUB_BYTES:
            light.graph.initializer.add().CopyFrom(tensor)
            continue
        stub = light.graph.initializer.add()
        stub.name, stub.data_type = tensor.name, tensor.data_type
        stub.dims.extend(tensor.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        entry = stub.external_data.add()
        entry.key, entry.value = "location", _STUB_LOCATION
    return light


def _copy_fields(source, target, *, skip: str) -> None:
    """Every set field of one protobuf message into another, except ``skip``."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        repeated = getattr(field, "is_repeated", None)  # protobuf 7 dropped `label`
        if repeated is None:
            repeated = field.label == field.LABEL_REPEATED
        if repeated:
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _types_of(graph: onnx.GraphProto) -> onnx.GraphProto:
    """Only what :func:`_take_inferred_types` reads of an inferred graph: its ``value_info``,
    its outputs, and for each node holding subgraphs a node named by its index with only
    those attributes, reduced the same way (no weight, no other attribute travels back)."""
    types = onnx.GraphProto()
    types.value_info.extend(graph.value_info)
    types.output.extend(graph.output)
    for index, node in enumerate(graph.node):
        for attribute in node.attribute:
            if attribute.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                continue
            if not types.node or types.node[-1].name != str(index):
                types.node.add().name = str(index)
            kept = types.node[-1].attribute.add()
            kept.name, kept.type = attribute.name, attribute.type
            if attribute.type == onnx.AttributeProto.GRAPH:
                kept.g.CopyFrom(_types_of(attribute.g))
            for subgraph in attribute.graphs:
                kept.graphs.add().CopyFrom(_types_of(subgraph))
    return types


def _dim_names(graph: onnx.GraphProto) -> set[str]:
    """The dimension names a graph's inputs and outputs give."""
    return {
        d.dim_param
        for value in (*graph.input, *graph.output)
        for d in value.type.tensor_type.shape.dim
        if d.dim_param
    }


def _take_inferred_types(graph: onnx.GraphProto, types: onnx.GraphProto, names: set[str]) -> None:
    """Shape inference's ``value_info`` and output types (as :func:`_types_of` keeps them),
    into ``graph`` and its subgraphs (inference adds those and changes nothing else);
    ``names`` are the model's own dimension names."""
    del graph.value_info[:]
    graph.value_info.extend(types.value_info)
    for output, typed in zip(graph.output, types.output):
        _take_output_type(output.type, typed.type, names)
    for typed_node in types.node:
        node = graph.node[int(typed_node.name)]
        attributes = {a.name: a for a in node.attribute}
        for typed in typed_node.attribute:
            attribute = attributes[typed.name]
            if attribute.type == onnx.AttributeProto.GRAPH:
                _take_inferred_types(attribute.g, typed.g, names)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph, typed_subgraph in zip(attribute.graphs, typed.graphs):
                    _take_inferred_types(subgraph, typed_subgraph, names)


def _take_output_type(declared: onnx.TypeProto, inferred: onnx.TypeProto, names: set[str]) -> None:
    """``inferred`` into ``declared``, but a dim the model leaves unnamed stays unnamed:
    inference names each such dim of a graph output ``unk__<n>`` (unless it carries a
    name of the model's, ``names``), and ONNX Runtime reports the model's own (``None``)."""
    before = [
        d.HasField("dim_value") or d.HasField("dim_param") for d in declared.tensor_type.shape.dim
    ]
    if not declared.tensor_type.HasField("shape"):
        before = []
    declared.CopyFrom(inferred)
    dims = declared.tensor_type.shape.dim
    if before and len(dims) != len(before):
        return
    for index, dim in enumerate(dims):
        named = before[index] if before else False
        made_up = dim.dim_param.startswith("unk__") and dim.dim_param not in names
        if not named and made_up:
            dim.ClearField("dim_param")


@contextlib.contextmanager
def _outputs_typed_for_checker(proto: onnx.ModelProto) -> Iterator[None]:
    """Let graph outputs without a type or shape, and tensor inputs without a shape, pass
    the checker, as ONNX Runtime does.

    The checker insists on both; ONNX Runtime infers them (and takes inputs of
    any shape). Placeholders are put in for the check only, and the caller's
    values are restored afterwards.
    """
    originals = []
    shapeless_inputs = [v for v in proto.graph.input if v.type.HasField("tensor_type")]
    for output in [*shapeless_inputs, *proto.graph.output]:
        tensor_type = output.type.tensor_type
        if output.type.HasField("tensor_type") and tensor_type.HasField("shape"):
            continue
        if output.type.WhichOneof("value") not in (None, "tensor_type"):
            continue
        originals.append((output, onnx.ValueInfoProto()))
        originals[-1][1].CopyFrom(output)
        if not tensor_type.elem_type:
            tensor_type.elem_type = onnx.TensorProto.FLOAT
        tensor_type.shape.SetInParent()
    try:
        yield
    finally:
        for output, original in originals:
            output.CopyFrom(original)


def load_model(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
) -> tuple[ir.Model, str | None]:
    """The checked, shape-inferred model as ``onnx_ir`` and the folder it came from."""
    import onnx_ir as ir

    base_dir = None
    if isinstance(model, (str, os.PathLike)):
        base_dir = os.path.dirname(os.path.abspath(os.fspath(model)))
    proto = read_proto(model)
    check_opsets(proto)
    if proto is model:  # the caller's own message: types are added to a copy
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    densify_sparse_tensors(proto.graph)
    proto = check_proto(proto)
    hidden = hide_map_types(proto.graph)  # onnx_ir cannot read map types; nxrt keeps them
    serde_log = logging.getLogger("onnx_ir.serde")
    level = serde_log.level
    serde_log.setLevel(logging.ERROR)  # EPContext blobs are binary in string attributes, as in ORT
    try:
        ir_model = ir.from_proto(proto)
    except Exception as exc:  # noqa: BLE001
        raise InvalidModel(f"the model's graph cannot be read: {exc}") from exc
    finally:
        serde_log.setLevel(level)
    restore_map_types(ir_model.graph, hidden)
    if ir_model.functions:
        inline_functions(ir_model)
    validate_graph(ir_model.graph)
    return ir_model, base_dir


def densify_sparse_tensors(graph: onnx.GraphProto) -> None:
    """Sparse initializers (and Constant ``sparse_value`` attributes) as dense tensors, in
    this graph and its subgraphs, as ONNX Runtime turns them into dense ones at load.

    Every nxrt kernel computes on dense tensors. The COO indices need not be in order
    (the ONNX checker asks for sorted indices; ONNX Runtime loads unsorted ones, and so
    does nxrt: each value is put at its index, whatever the order). Indices outside the
    dense shape, or of the wrong shape, refuse the model.
    """
    sparse = list(graph.sparse_initializer)
    if sparse:
        del graph.sparse_initializer[:]
        graph.initializer.extend(_dense(t) for t in sparse)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                densify_sparse_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    densify_sparse_tensors(sub)
            elif attr.type == onnx.AttributeProto.SPARSE_TENSOR and node.op_type == "Constant":
                dense = _dense(attr.sparse_tensor)
                attr.Clear()
                attr.CopyFrom(onnx.helper.make_attribute("value", dense))


def _dense(sparse: onnx.SparseTensorProto) -> onnx.TensorProto:
    """One COO sparse tensor as its dense tensor (named like its values)."""
    from onnx import numpy_helper

    name = sparse.values.name
    shape = tuple(int(d) for d in sparse.dims)
    try:
        values = numpy_helper.to_array(sparse.values).reshape(-1)
        indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    except Exception as exc:  # noqa: BLE001 - onnx's reader: a malformed tensor
        raise InvalidModel(f"sparse initializer {name!r} cannot be read: {exc}") from exc
    size = int(np.prod(shape, dtype=np.int64))
    if indices.ndim == 2 and indices.shape == (values.size, len(shape)):
        if indices.size and ((indices < 0) | (indices >= np.array(shape))).any():
            raise InvalidModel(f"sparse initializer {name!r} has an index outside {list(shape)}")
        linear = np.ravel_multi_index(indices.T, shape) if indices.size else indices[:, 0]
    elif indices.ndim == 1 and indices.size == values.size:
        if indices.size and (indices.min() < 0 or indices.max() >= size):
            raise InvalidModel(f"sparse initializer {name!r} has an index outside {list(shape)}")
        linear = indices
    else:
        raise InvalidModel(
            f"sparse initializer {name!r}: {values.size} values need indices of shape "
            f"[{values.size}] or [{values.size}, {len(shape)}], not {list(indices.shape)}"
        )
    dense = np.zeros(size, dtype=values.dtype)
    dense[linear] = values
    return numpy_helper.from_array(dense.reshape(shape), name)


def inline_functions(model: ir.Model) -> None:
    """Expand every call of a model-local function (``ModelProto.functions``) into the
    function's nodes, as the ONNX spec defines a call and as ONNX Runtime runs it.

    A function may import an op domain at another version than the model (skl2onnx's
    KNNImputer functions use opsets 14 and 16 in an opset-18 model). Once inlined, its
    nodes run at the model's version, which is right only where an op means the same at
    both versions: each such node's schema must be the same one at both (the same
    ``since_version``), and the model is refused where it is not. The inliner is
    onnx_ir's, in Python (onnx's is C++, which nxrt runs on untrusted models only in a
    child process).
    """
    import onnx_ir as ir
    from onnx_ir.passes.common import InlinePass

    versions = dict(model.opset_imports)
    for function in model.functions.values():
        for domain, version in list(function.opset_imports.items()):
            wanted = versions.get(domain)
            if wanted is None or wanted == version:
                continue
            for node in ir.traversal.RecursiveGraphIterator(function.graph):
                if normalize_domain(node.domain) != normalize_domain(domain):
                    continue
                if _schema_since(node, version) != _schema_since(node, wanted):
                    raise InvalidModel(
                        f"model-local function {function.domain}::{function.name} uses "
                        f"{node.op_type} at opset {version} of domain {domain or 'ai.onnx'!r}, "
                        f"where the model imports opset {wanted}, and {node.op_type} differs "
                        "between the two: nxrt expands functions into the graph and cannot run "
                        "both versions; export the function at the model's opset"
                    )
            function.opset_imports[domain] = wanted
    try:
        InlinePass()(model)
    except Exception as exc:  # noqa: BLE001 - onnx_ir's pass errors (a cycle, a bad call)
        raise InvalidModel(f"the model's local functions cannot be expanded: {exc}") from exc


def _schema_since(node: ir.Node, version: int) -> int | None:
    """The ``since_version`` of the schema ``node``'s op has at ``version`` (``None``:
    onnx does not know it, and the node cannot be told apart across versions)."""
    try:
        return onnx.defs.get_schema(node.op_type, version, node.domain).since_version
    except onnx.defs.SchemaError:
        return None


def validate_graph(graph: ir.Graph) -> None:
    """Refuse duplicate producers, dangling inputs and cycles; sort when needed."""
    produced: dict[str | None, str] = {}
    for value in [*graph.inputs, *graph.initializers.values()]:
        produced[value.name] = "graph input"
    for node in graph:
        for value in node.outputs:
            if not value.name:
                continue
            if value.name in produced and produced[value.name] != "graph input":
                raise InvalidModel(
                    f"value {value.name!r} is produced twice (by {produced[value.name]!r} "
                    f"and {node.name!r}); every output name must be unique"
                )
            produced[value.name] = node.name or node.op_type
    for node in graph:
        for value in node.inputs:
            if value is not None and value.name and value.name not in produced:
                if value.producer() is None and not value.is_graph_input():
                    raise InvalidModel(
                        f"node {node.name!r} ({node.op_type}) reads {value.name!r}, which no "
                        "node, input or initializer produces"
                    )
    order = topological_order(graph)
    if [id(n) for n in order] != [id(n) for n in graph]:
        graph.sort()


def topological_order(graph: ir.Graph) -> list[ir.Node]:
    """Kahn's order of the graph's nodes; a cycle is an :class:`InvalidModel`."""
    nodes = list(graph)
    index = {id(n): i for i, n in enumerate(nodes)}
    pending = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        preds = {index[id(p)] for p in node.predecessors() if id(p) in index}
        pending[i] = len(preds)
        for p in preds:
            users[p].append(i)
    ready = [i for i, count in enumerate(pending) if count == 0]
    order: list[int] = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for user in users[i]:
            pending[user] -= 1
            if pending[user] == 0:
                ready.append(user)
    if len(order) != len(nodes):
        stuck = [nodes[i].name or nodes[i].op_type for i in range(len(nodes)) if pending[i]]
        raise InvalidModel(f"the graph has a cycle through nodes {stuck[:5]}")
    return [nodes[i] for i in order]


def opset_of(model: ir.Model, domain: str) -> int:
    """The model's opset for a node's domain (0 when the model does not import it)."""
    imports = {normalize_domain(d): v for d, v in model.opset_imports.items()}
    return int(imports.get(normalize_domain(domain), 0))


#: ONNX elem type -> ONNX Runtime's type string, e.g. ``tensor(float)``.
_TYPE_NAMES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float",
    onnx.TensorProto.DOUBLE: "double",
}


def type_string(elem_type: int) -> str:
    name = _TYPE_NAMES.get(elem_type)
    if name is None:
        name = onnx.TensorProto.DataType.Name(elem_type).lower()
    return f"tensor({name})"


def type_string_of(value_type: Any) -> str:
    """ONNX Runtime's type string of an ``onnx_ir`` type: ``seq(tensor(float))``,
    ``seq(map(int64,tensor(float)))`` and so on."""
    if isinstance(value_type, MapType):
        key = type_string(int(value_type.key_type)).removeprefix("tensor(").removesuffix(")")
        return f"map({key},{type_string_of(value_type.value_type)})"
    kind = type(value_type).__name__
    if kind == "SequenceType":
        return f"seq({type_string_of(value_type.elem_type)})"
    if kind == "OptionalType":
        return f"optional({type_string_of(value_type.elem_type)})"
    dtype = getattr(value_type, "dtype", None)
    return type_string(int(dtype) if dtype is not None else onnx.TensorProto.UNDEFINED)


def numpy_dtype_of(type_str: str) -> np.dtype:
    """The numpy dtype of an ONNX Runtime type string such as ``tensor(float)``."""
    name = type_str.removeprefix("tensor(").removesuffix(")")
    return np.dtype({"float": np.float32, "double": np.float64, "string": object}.get(name, name))


def numpy_dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def value_names(values: Iterable[ir.Value | None]) -> list[str]:
    return [cast(str, v.name) if v is not None else "" for v in values]
