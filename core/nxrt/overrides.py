"""What ``SessionOptions`` changes in a session's model, and the optimized model it writes.

Session creation (:func:`nxrt.pipeline.create`) calls these between its
stages: right after loading, the caller's initializers and free-dimension
values replace the model's (``add_initializer``, ``add_external_initializers``,
``add_free_dimension_override_by_name``); once the plan is made, the
optimized graph is written where ``optimized_model_filepath`` says.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.contrib_ops import DOMAIN as NXRT_DOMAIN
from nxrt.errors import InvalidArgument, RuntimeFailure
from nxrt.files import write_atomically

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
        if external and name not in weights:
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


def override_free_dimensions(model: ir.Model, sizes: Mapping[str, int]) -> None:
    """Fix each symbolic dimension named in ``sizes`` to its size, wherever the main graph
    uses that name (inputs, outputs and inner values: one name is one dimension)."""
    import onnx_ir as ir

    if not sizes:
        return
    graph = model.graph
    values = [*graph.inputs, *graph.outputs, *(out for node in graph for out in node.outputs)]
    for value in values:
        if value.shape is None:
            continue
        dims = [
            sizes[d.value] if isinstance(d, ir.SymbolicDim) and d.value in sizes else d
            for d in value.shape
        ]
        value.shape = ir.Shape(dims)


def private_ops(model: ir.Model) -> list[str]:
    """The nodes of nxrt's own op domain (fusions only nxrt runs), as ``domain::op``."""
    return sorted(
        {f"{node.domain}::{node.op_type}" for node in model.graph if node.domain == NXRT_DOMAIN}
    )


def save_optimized(model: ir.Model, path: str, source: Any) -> None:
    """Write the optimized ``model`` to ``path``: atomically, weights inline, and never over
    the input model (``source``)."""
    import onnx_ir as ir

    if isinstance(source, (str, os.PathLike)) and os.path.exists(path):
        if os.path.samefile(path, os.fspath(source)):
            raise InvalidArgument(
                f"optimized_model_filepath {path!r} is the input model; give another path, the "
                "input model is never overwritten"
            )
    proto = ir.to_proto(model)
    for tensor in proto.graph.initializer:  # weights mapped from a file go inline
        if tensor.data_location == tensor.EXTERNAL:
            array = model.graph.initializers[tensor.name].const_value.numpy()
            tensor.ClearField("external_data")
            tensor.data_location = tensor.DEFAULT
            tensor.raw_data = np.ascontiguousarray(array).tobytes()
    write_atomically(path, proto.SerializeToString())
