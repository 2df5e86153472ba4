"""The onnx package's light models and the input its backend runner gives them.

Real CNNs with every weight included, shipped inside the ``onnx`` wheel under
``backend/test/data/light``: the models the EP kit, the model tests and the
benchmarks run without downloading anything. Kept apart from
:mod:`nxrt.tools.testing` so that the kit's suite (:mod:`nxrt.tools.ep_suite`) and the
benchmarks can use them without importing the pytest plugin.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

#: The models the onnx package ships under ``backend/test/data/light``.
LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_model_path(name: str) -> str:
    """Path of a light model by name (``resnet50`` or ``light_resnet50``)."""
    import onnx

    stem = name if name.startswith("light_") else f"light_{name}"
    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return os.path.join(folder, stem + ".onnx")


def dummy_feeds(session: Any) -> dict[str, np.ndarray]:
    """The ONNX backend runner's input for light models: ``arange(n) / n``, dynamic dims as 1.

    Works with an nxrt or an onnxruntime session (both describe inputs alike).
    """
    import numpy as np

    from nxrt.pipeline.model import numpy_dtype_of

    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        n = math.prod(shape)
        feeds[arg.name] = (np.arange(n).reshape(shape) / max(n, 1)).astype(numpy_dtype_of(arg.type))
    return feeds


__all__ = ["LIGHT_MODELS", "dummy_feeds", "light_model_path"]
