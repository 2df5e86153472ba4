"""nxrt's bridge to ONNX Runtime: claimed subgraphs run on ORT's providers and plugin EPs."""

__version__ = "0.1.0"
