"""nxrt's MLX execution provider."""

__version__ = "0.1.0"
