"""nxrt's default execution provider: numpy kernels for the ONNX standard opset."""

__version__ = "0.1.0"
