"""What ``SessionOptions`` changes in a session's model, and the optimized model it writes.

Session creation calls these from its stages: in ``load``
(:func:`nxrt.pipeline.stages.load`), the caller's initializers and free-dimension
values replace the model's (``add_initializer``, ``add_external_initializers``,
``add_free_dimension_override_by_name``); once the plan is made, the
optimized graph is written where ``optimized_model_filepath`` says.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from onnx import numpy_helper

from nxrt._files import write_atomically
from nxrt.contrib_ops import DOMAIN as NXRT_DOMAIN
from nxrt.errors import InvalidArgument, RuntimeFailure

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.weight import WeightHandle

logger = logging.getLogger("nxrt")


def replace_initializers(
    model: ir.Model,
    weights: dict[str, WeightHandle],
    arrays: Mapping[str, np.ndarray],
    *,
    external: bool,
) -> None:
    """Give initializers the caller's arrays (held, not copied); ``external``: only
    initializers whose data is external may be replaced (``add_external_initializers``).

    A name the model has no initializer for is left out with a warning, as onnxruntime
    ignores it; a different dtype or shape is an error (the kernels were typed for it).
    """
    import onnx_ir as ir

    initializers = model.graph.initializers
    for name, array in arrays.items():
        value = initializers.get(name)
        if value is None:
            logger.warning("initializer %r given in SessionOptions is not in the model", name)
            continue
        if (
            external
            and name not in weights
            and not isinstance(value.const_value, ir.ExternalTensor)
        ):
            raise RuntimeFailure(
                f"add_external_initializers got {name!r}, whose data is inside the model, not "
                "in an external file; give it with add_initializer instead"
            )
        tensor = value.const_value
        if tensor is not None:
            want_dtype, want_shape = tensor.dtype.numpy(), tuple(tensor.shape.numpy())
            if array.dtype != want_dtype or tuple(array.shape) != want_shape:
                raise InvalidArgument(
                    f"initializer {name!r} given in SessionOptions has dtype {array.dtype} and "
                    f"shape {list(array.shape)}; the model's has {want_dtype} and "
                    f"{list(want_shape)}"
                )
        value.const_value = ir.Tensor(array, name=name)
        weights.pop(name, None)  # no longer mapped from the model's external file


def override_free_dimensions(
    model: ir.Model, sizes: Mapping[str, int], denotations: Mapping[str, int] | None = None
) -> None:
    """Fix each symbolic dimension named in ``sizes`` to its size, wherever the main graph
    uses that name (inputs, outputs and inner values: one name is one dimension), and each
    free dimension whose denotation (``DATA_BATCH``...) is in ``denotations``."""
    import onnx_ir as ir

    denotations = denotations or {}
    if not sizes and not denotations:
        return
    graph = model.graph
    values = [*graph.inputs, *graph.outputs, *(out for node in graph for out in node.outputs)]
    sizes = dict(sizes)
    for value in values:  # a denoted dimension's name is that dimension everywhere
        for i, dim in enumerate(value.shape or ()):
            mark = cast(ir.Shape, value.shape).get_denotation(i)
            if (
                isinstance(dim, ir.SymbolicDim)
                and dim.value
                and mark is not None
                and mark in denotations
            ):
                sizes.setdefault(dim.value, denotations[mark])
    for value in values:
        shape = value.shape
        if shape is None:
            continue
        marks = [shape.get_denotation(i) for i in range(len(shape))]
        dims = []
        for dim, mark in zip(shape, marks):
            if isinstance(dim, ir.SymbolicDim) and dim.value in sizes:
                dim = sizes[dim.value]
            elif not isinstance(dim, int) and mark is not None and mark in denotations:
                dim = denotations[mark]
            dims.append(dim)
        value.shape = ir.Shape(dims, denotations=marks)


#: onnxruntime's switch for session options carried in the model's metadata, the metadata
#: key holding them (JSON: ``{"session_options": {...}}``), and the options it reads, each
#: with the values it may take (``None``: any integer >= 0); other options are ignored.
LOAD_CONFIG_FROM_MODEL = "ORT_LOAD_CONFIG_FROM_MODEL"
ORT_CONFIG_KEY = "ort_config"
MODEL_OPTIONS: dict[str, tuple[int, ...] | None] = {
    "intra_op_num_threads": None,
    "inter_op_num_threads": None,
    "execution_mode": (0, 1),
    "graph_optimization_level": (0, 1, 2, 99),
    "enable_profiling": (0, 1),
}


def model_session_options(source: Any) -> dict[str, int]:
    """The session options in the model's ``ort_config`` metadata entry, checked as
    onnxruntime checks them (a bad one is a ``RuntimeError``, as there); they override the
    caller's when ``ORT_LOAD_CONFIG_FROM_MODEL=1`` (the session applies them)."""
    import json

    from nxrt.pipeline.model import read_proto

    entries = {p.key: p.value for p in read_proto(source).metadata_props}
    if ORT_CONFIG_KEY not in entries:
        return {}
    try:
        settings = json.loads(entries[ORT_CONFIG_KEY]).get("session_options", {})
    except (ValueError, AttributeError) as exc:
        raise RuntimeFailure(
            f"Json stored in the `{ORT_CONFIG_KEY}` key cannot be parsed. Error message: {exc}"
        ) from exc
    found = {}
    for key, value in settings.items():
        if key not in MODEL_OPTIONS:
            logger.info("ignoring unsupported session option in the model's ort_config: %s", key)
            continue
        allowed = MODEL_OPTIONS[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise RuntimeFailure(f"{key} option in the model file must be an integer")
        if value < 0 or (allowed is not None and value not in allowed):
            raise RuntimeFailure(
                f"Unsupported {key} value in ORT config: {value}"
                + (f" (allowed: {list(allowed)})" if allowed else " (must be >= 0)")
            )
        found[key] = value
    return found


def private_ops(model: ir.Model) -> list[str]:
    """The nodes of nxrt's own op domain (fusions only nxrt runs), as ``domain::op``."""
    return sorted(
        {f"{node.domain}::{node.op_type}" for node in model.graph if node.domain == NXRT_DOMAIN}
    )


#: Session config entries (onnxruntime's) that put the optimized model's initializers of
#: at least the minimum size in one data file next to it, instead of inline.
EXTERNAL_FILE = "session.optimized_model_external_initializers_file_name"
EXTERNAL_MIN_SIZE = "session.optimized_model_external_initializers_min_size_in_bytes"
#: onnxruntime's default minimum size, and the alignment of each tensor in the data file
#: (so the mmap-backed arrays nxrt makes of them are aligned for every dtype).
DEFAULT_MIN_SIZE = 1024
EXTERNAL_ALIGNMENT = 64


def save_optimized(
    model: ir.Model, path: str, source: Any, config: Mapping[str, str] | None = None
) -> None:
    """Write the optimized ``model`` to ``path`` atomically, never over the input model
    (``source``): weights inline, or, with :data:`EXTERNAL_FILE` set in ``config``, those
    of at least :data:`EXTERNAL_MIN_SIZE` bytes in that file in ``path``'s folder."""
    import onnx_ir as ir

    config = config or {}
    if isinstance(source, (str, os.PathLike)) and os.path.exists(path):
        if os.path.samefile(path, os.fspath(source)):
            raise InvalidArgument(
                f"optimized_model_filepath {path!r} is the input model; give another path, the "
                "input model is never overwritten"
            )
    data_name = config.get(EXTERNAL_FILE, "")
    min_size = int(config.get(EXTERNAL_MIN_SIZE, DEFAULT_MIN_SIZE))
    if data_name and (os.path.isabs(data_name) or ".." in data_name.replace("\\", "/").split("/")):
        raise InvalidArgument(
            f"{EXTERNAL_FILE} {data_name!r} must be a file name relative to the optimized "
            "model's folder (no absolute path, no '..'), as models name their data files"
        )
    proto = ir.to_proto(model)
    data = bytearray()
    for tensor in proto.graph.initializer:
        if tensor.data_location == tensor.EXTERNAL:  # weights mapped from a file: their bytes
            weight = model.graph.initializers[tensor.name].const_value
            assert weight is not None  # an initializer's
            array = weight.numpy()
            tensor.ClearField("external_data")
            tensor.data_location = tensor.DEFAULT
            tensor.raw_data = np.ascontiguousarray(array).tobytes()
        if not data_name or tensor.data_type == tensor.STRING:
            continue
        if not tensor.HasField("raw_data"):  # typed fields (float_data...) as raw bytes
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
        if len(tensor.raw_data) < min_size:
            continue
        data.extend(b"\0" * (-len(data) % EXTERNAL_ALIGNMENT))
        offset = len(data)
        data.extend(tensor.raw_data)
        tensor.ClearField("raw_data")
        tensor.data_location = tensor.EXTERNAL
        for key, value in (
            ("location", data_name),
            ("offset", offset),
            ("length", len(data) - offset),
        ):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
    if data_name:
        write_atomically(os.path.join(os.path.dirname(os.path.abspath(path)), data_name), data)
    write_atomically(path, proto.SerializeToString())
