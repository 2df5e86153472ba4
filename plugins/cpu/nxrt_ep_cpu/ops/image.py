"""ImageDecoder through Pillow, the imaging library the ONNX reference decodes with."""

from __future__ import annotations

import io

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op


@op("ImageDecoder", since=20)
def image_decoder(encoded_stream: np.ndarray, /, *, pixel_format: str = "RGB") -> np.ndarray:
    """Decode one encoded image (1-D uint8) to ``[H, W, 3]`` RGB/BGR or ``[H, W, 1]`` gray."""
    from PIL import Image, UnidentifiedImageError

    if pixel_format not in ("RGB", "BGR", "Grayscale"):
        raise KernelFailed(
            f"ImageDecoder: pixel_format must be RGB, BGR or Grayscale, not {pixel_format!r}"
        )
    data = np.ascontiguousarray(encoded_stream, dtype=np.uint8).reshape(-1).tobytes()
    try:
        with Image.open(io.BytesIO(data)) as image:
            if pixel_format == "Grayscale":
                return np.asarray(image.convert("L"))[:, :, np.newaxis].copy()
            rgb = np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise KernelFailed(f"ImageDecoder: cannot decode the image ({exc})") from exc
    return rgb[:, :, ::-1].copy() if pixel_format == "BGR" else rgb.copy()
