"""nxrt's OpenVINO execution provider."""

__version__ = "0.1.0"
