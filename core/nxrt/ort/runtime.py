"""Process-wide information and settings, in ONNX Runtime's shape.

The module-level functions onnxruntime offers besides its classes: the provider
names (:func:`get_available_providers`, :func:`get_all_providers`), version and
build information, the device, and the default logger. Provider naming is
decided here, once (docs/onnxruntime-compat.md explains it):

- an EP's *public name* is its ONNX Runtime name when its plugin declares one
  (an alias ending in ``ExecutionProvider``, e.g. ``CPUExecutionProvider`` for
  ``cpu``), its nxrt id otherwise;
- the lists nxrt returns use public names; everything that takes a name takes
  either (the registry resolves aliases).

nxrt's messages go through Python's :mod:`logging` (logger ``"nxrt"``); the
default logger's severity and callback map onto that logger.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from nxrt.errors import RuntimeFailure

if TYPE_CHECKING:
    from nxrt.ep_registry import EpDescriptor, EpRegistry
    from nxrt.host import NxrtPluginManager

#: The ONNX Runtime Python API version whose names and semantics nxrt follows; what
#: :func:`get_version_string` reports to code that checks onnxruntime's version.
ORT_API_VERSION = "1.32.0"

#: Every provider name ONNX Runtime knows, in its default priority order (CPU last).
#: Requested but not installed, one of these is left out with a warning, as onnxruntime
#: does for providers its build lacks; any other unknown name is an error.
ORT_PROVIDER_NAMES = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "MIGraphXExecutionProvider",
    "OpenVINOExecutionProvider",
    "DnnlExecutionProvider",
    "VitisAIExecutionProvider",
    "QNNExecutionProvider",
    "NnapiExecutionProvider",
    "VSINPUExecutionProvider",
    "JsExecutionProvider",
    "CoreMLExecutionProvider",
    "DmlExecutionProvider",
    "RknpuExecutionProvider",
    "WebNNExecutionProvider",
    "WebGpuExecutionProvider",
    "XnnpackExecutionProvider",
    "CANNExecutionProvider",
    "AzureExecutionProvider",
    "CPUExecutionProvider",
)

#: onnxruntime's severities (0 verbose ... 4 fatal) as :mod:`logging` levels.
SEVERITY_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)

logger = logging.getLogger("nxrt")


# -- provider names ------------------------------------------------------------------------
def public_name(descriptor: EpDescriptor) -> str:
    """The name nxrt reports an EP by: its ONNX Runtime name if declared, else its id."""
    for alias in descriptor.aliases:
        if alias.endswith("ExecutionProvider"):
            return alias
    return descriptor.id


def _registry(plugin_manager: NxrtPluginManager | None) -> EpRegistry:
    from nxrt import default_plugin_manager
    from nxrt.host import Host

    return Host(plugin_manager or default_plugin_manager()).build_registry()


def get_available_providers(plugin_manager: NxrtPluginManager | None = None) -> list[str]:
    """Public names of the installed EPs, in the default priority order (cpu last)."""
    registry = _registry(plugin_manager)
    return [public_name(registry.providers[i]) for i in registry.default_order()]


def get_all_providers(plugin_manager: NxrtPluginManager | None = None) -> list[str]:
    """Every provider name a session accepts without error: ONNX Runtime's names (those
    not installed are left out of a session with a warning) and the installed EPs'."""
    names = list(ORT_PROVIDER_NAMES[:-1])
    names += [n for n in get_available_providers(plugin_manager) if n not in ORT_PROVIDER_NAMES]
    return [*names, ORT_PROVIDER_NAMES[-1]]


def get_device(plugin_manager: NxrtPluginManager | None = None) -> str:
    """``"GPU"`` when an installed EP computes on a GPU, else ``"CPU"`` (onnxruntime's words)."""
    registry = _registry(plugin_manager)
    gpu = any(d.device_type == "gpu" for d in registry.providers.values())
    return "GPU" if gpu else "CPU"


# -- versions ------------------------------------------------------------------------------
def get_version_string() -> str:
    """The ONNX Runtime API version nxrt follows (:data:`ORT_API_VERSION`), which code
    written for onnxruntime compares against; nxrt's own is ``nxrt.__version__``."""
    return ORT_API_VERSION


def get_build_info() -> str:
    """nxrt's version, the ONNX Runtime API version it follows, and its Python."""
    from nxrt import __version__

    python = ".".join(str(part) for part in sys.version_info[:3])
    return (
        f"nxrt Build Info: nxrt-version={__version__}, onnxruntime-api={ORT_API_VERSION}, "
        f"python={python}, execution providers are plugins (`nxrt providers` lists them)"
    )


# -- logging -------------------------------------------------------------------------------
def check_severity(severity: int) -> int:
    """``severity`` as an index into :data:`SEVERITY_LEVELS`, or the error onnxruntime raises."""
    if not isinstance(severity, int) or not 0 <= severity <= 4:
        raise RuntimeFailure(
            f"invalid logging severity {severity!r}: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal"
        )
    return severity


def severity_of(level: int) -> int:
    """onnxruntime's severity of a :mod:`logging` level."""
    for severity in range(4, -1, -1):
        if level >= SEVERITY_LEVELS[severity]:
            return severity
    return 0


def set_default_logger_severity(severity: int) -> None:
    """Show nxrt's messages from ``severity`` up (0 verbose ... 4 fatal)."""
    logger.setLevel(SEVERITY_LEVELS[check_severity(severity)])


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted for onnxruntime's API; nxrt's verbose messages (severity 0) have no
    verbosity levels: all of them show once the severity is 0."""
    if not isinstance(verbosity, int):
        raise TypeError(f"verbosity must be an int, got {type(verbosity).__name__}")


#: ``callback(severity, category, logid, code_location, message)``, onnxruntime's signature.
LoggerCallback = Callable[[int, str, str, str, str], None]


class _CallbackHandler(logging.Handler):
    """Hands each record of the ``nxrt`` logger to a user callback, in onnxruntime's form."""

    def __init__(self, callback: LoggerCallback) -> None:
        super().__init__()
        self.callback = callback
        self._busy = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._busy, "active", False):  # a message logged by the callback itself
            return
        self._busy.active = True
        try:
            self.callback(
                severity_of(record.levelno),
                "nxrt",
                str(getattr(record, "logid", "")),
                f"{record.filename}:{record.lineno} {record.funcName}",
                record.getMessage(),
            )
        except Exception:  # noqa: BLE001 - a failing callback must not fail the session
            self.handleError(record)
        finally:
            self._busy.active = False


_callback_handler: _CallbackHandler | None = None
_callback_lock = threading.Lock()


def set_default_logger_callback(callback: LoggerCallback | None, severity: int = 2) -> None:
    """Send nxrt's messages to ``callback(severity, category, logid, code_location,
    message)`` from ``severity`` up; ``None`` removes the callback (severity unchanged)."""
    global _callback_handler
    check_severity(severity)
    if callback is not None and not callable(callback):
        raise RuntimeFailure(f"callback must be callable, got {type(callback).__name__}")
    with _callback_lock:
        if _callback_handler is not None:
            logger.removeHandler(_callback_handler)
            _callback_handler = None
        if callback is None:
            return
        _callback_handler = _CallbackHandler(callback)
        logger.addHandler(_callback_handler)
        logger.setLevel(SEVERITY_LEVELS[severity])


class SessionLog:
    """A session's (or a run's) messages: tagged with its ``logid``, and shown from its own
    severity when one is set (``log_severity_level`` >= 0), else from the default logger's."""

    def __init__(self, logid: str = "", severity: int = -1) -> None:
        self.logid = logid
        self.severity = severity
        self.level = SEVERITY_LEVELS[severity] if 0 <= severity <= 4 else None

    def enabled(self, severity: int) -> bool:
        level = SEVERITY_LEVELS[severity]
        return level >= self.level if self.level is not None else logger.isEnabledFor(level)

    def log(self, severity: int, message: str, *args: object) -> None:
        if not self.enabled(severity):
            return
        caller = sys._getframe(1)  # where the message comes from, for code_location
        record = logger.makeRecord(
            logger.name,
            SEVERITY_LEVELS[severity],
            caller.f_code.co_filename,
            caller.f_lineno,
            message,
            args,
            None,
            func=caller.f_code.co_name,
            extra={"logid": self.logid},
        )
        logger.handle(record)  # the session's own severity decides, not the logger's level


# -- what onnxruntime's build has and nxrt has not ----------------------------------------------
def has_collective_ops() -> bool:
    """nxrt has no collective (multi-device communication) ops, as onnxruntime's usual builds."""
    return False


def disable_telemetry_events() -> None:
    """nxrt sends no telemetry (as onnxruntime on Linux and macOS): nothing to disable."""


def enable_telemetry_events() -> None:
    """nxrt sends no telemetry (as onnxruntime on Linux and macOS): nothing to enable."""


__all__ = [
    "ORT_API_VERSION",
    "ORT_PROVIDER_NAMES",
    "SessionLog",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_all_providers",
    "get_available_providers",
    "get_build_info",
    "get_device",
    "get_version_string",
    "has_collective_ops",
    "public_name",
    "set_default_logger_callback",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
]
