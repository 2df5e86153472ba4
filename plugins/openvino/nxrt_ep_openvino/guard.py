"""OpenVINO compiles a claim in a process of its own first: a crash there is a refusal.

OpenVINO's CPU plugin crashes outright (a segmentation fault, not an exception)
compiling some models, among them statically quantized (QDQ) DenseNets as
``onnxruntime.quantization`` writes them. The EP compiles its claims in the
caller's process, and the default selection builds an openvino candidate for
every model, so such a model would end the caller's process. Before a claim is
compiled here for the first time, nxrt's helper process (a fresh interpreter,
:mod:`nxrt.pipeline.contained`; never a fork of this process, whose OpenVINO
thread pools a fork would leave half there) reads and compiles it with the
same device and settings. A crash there makes the claim a refusal, so its
nodes go to another EP; an error or a success lets the compile here go on.

The verdict is kept per model bytes, OpenVINO version, device, settings and
CPU, in memory and in ``nxrt.cache_folder("openvino")``, so each model pays the
contained compile once per machine. ``NXRT_OPENVINO_CONTAIN=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import nxrt
from nxrt.pipeline import contained
from nxrt.pipeline.selection import hardware

#: ``0`` compiles in this process without the contained compile first.
CONTAIN_ENV = "NXRT_OPENVINO_CONTAIN"
#: What a verdict file holds for a model that compiled (or failed with an error).
_SAFE = b""

_log = logging.getLogger(__name__)


def plain_config(config: Mapping[Any, Any]) -> dict[str, str]:
    """The EP's ``compile_model`` settings as strings, as a fresh process can pass them
    (OpenVINO's property objects name themselves when called; its types and enums print
    their names)."""
    plain = {}
    for key, value in config.items():
        name = key() if callable(key) else str(key)
        if hasattr(value, "to_string"):
            text = value.to_string()
        elif hasattr(value, "name"):
            text = str(value.name)
        else:
            text = str(value)
        plain[str(name)] = text
    return plain


def compile_in_child(path: str, device: str, config: dict[str, str], emit: Any) -> None:
    """The contained task: read and compile the model at ``path``."""
    import openvino as ov

    core = ov.Core()
    try:
        core.compile_model(core.read_model(path), device, config)
    except Exception as exc:  # noqa: BLE001 - an error is the EP's to report, in process
        emit(f"error: {type(exc).__name__}".encode())
        return
    emit(b"compiled")


class CrashGuard:
    """Whether OpenVINO survives compiling a model, asked once per model in the helper."""

    _verdicts: dict[str, str] = {}
    _lock = threading.Lock()

    def __init__(self, version: str, device: str, config: Mapping[Any, Any]) -> None:
        self.version, self.device = version, device
        self.config = plain_config(config)
        self.enabled = os.environ.get(CONTAIN_ENV, "1") not in ("0", "")

    def crash(self, parts: Sequence[Any], whole: Callable[[], bytes | None]) -> str:
        """Why compiling a model must not happen in this process: how OpenVINO crashed on
        it in the helper ('' when it did not). ``parts`` (bytes-like: the model's bytes
        and its large weights) identify it; ``whole()`` writes it as one ONNX model,
        called only when no verdict is known (``None``: it cannot be written whole)."""
        if not self.enabled:
            return ""
        key = self._key(parts)
        with self._lock:
            known = self._verdicts.get(key)
        if known is None:
            known = self._read(key)
        if known is None:
            model_bytes = whole()
            known = None if model_bytes is None else self._ask(model_bytes)
            if known is None:
                return ""
            self._write(key, known)
        with self._lock:
            self._verdicts[key] = known
        return known

    def _key(self, parts: Sequence[Any]) -> str:
        digest = hashlib.sha256()
        for part in parts:
            digest.update(part)
        settings = sorted(self.config.items())
        digest.update(repr((self.version, self.device, settings, hardware())).encode())
        return digest.hexdigest()[:40]

    def _ask(self, model_bytes: bytes) -> str | None:
        fd, path = tempfile.mkstemp(prefix="nxrt-openvino-claim-", suffix=".onnx")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(model_bytes)
            contained.run(compile_in_child, path, self.device, self.config, fork=False)
        except contained.NoHelper as exc:  # nothing can check it here: compiled as it is
            _log.info("OpenVINO's compile is not contained: %s", exc.reason)
            return None
        except contained.ChildDied as exc:
            if exc.records and exc.records[-1].startswith((b"error", b"compiled")):
                return ""  # it got as far as an answer; what ended it afterwards is not OV's
            _log.warning("OpenVINO %s crashed compiling a claim: %s", self.version, exc.reason)
            return (
                f"OpenVINO {self.version}'s {self.device} plugin crashes compiling it "
                f"({exc.reason}, in a separate process), so it is left to another EP"
            )
        finally:
            os.unlink(path)
        return ""

    def _path(self, key: str) -> str:
        return os.path.join(nxrt.cache_folder("openvino"), "verdicts", key)

    def _read(self, key: str) -> str | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return None

    def _write(self, key: str, verdict: str) -> None:
        path = self._path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, partial = tempfile.mkstemp(prefix=".verdict-", dir=os.path.dirname(path))
            with os.fdopen(fd, "wb") as f:
                f.write(verdict.encode() if verdict else _SAFE)
            os.replace(partial, path)  # concurrent writers: one whole file wins
        except OSError as exc:  # a read-only cache: the next process asks again
            _log.debug("cannot write %s: %s", path, exc)
