"""nxrt-ep-example: a small execution provider to copy when writing your own."""

__version__ = "0.1.0"
