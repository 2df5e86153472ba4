"""Every error nxrt raises, one class per failure, all under :class:`NxrtError`.

The first group mirrors the seed's ``EpError`` variants with the same fields;
the rest cover the model, the feeds and the weights. Each message says what
went wrong and what to do next.

Each class also derives from the ONNX Runtime exception classes
(:mod:`nxrt._status`) naming the status onnxruntime reports for the same
failure, so code written for onnxruntime (``except Fail``, ``except
InvalidArgument``) catches nxrt's errors unchanged.
"""

from __future__ import annotations

from typing import Any

from nxrt import _status as status


class NxrtError(Exception):
    """Base class of every error nxrt raises on purpose."""


class NoEpForOp(NxrtError, status.Fail, status.NotImplemented):
    """No execution provider can run a node."""

    def __init__(self, domain: str, op_type: str, opset: int, detail: str = "") -> None:
        self.domain, self.op_type, self.opset, self.detail = domain, op_type, opset, detail
        name = f"{domain or 'ai.onnx'}::{op_type}"
        msg = f"no EP handler for {name} at opset {opset} on any available device"
        if detail:
            msg += f"; {detail}"
        msg += (
            ". Install an EP that supports it (`nxrt providers` lists what is installed)"
            " or add one to `providers`."
        )
        super().__init__(msg)


class NoEpForNodes(NoEpForOp):
    """Several nodes no execution provider can run: every one is listed at once.

    The fields of :class:`NoEpForOp` (and the first line of the message) are
    the first such node's, so code catching ``NoEpForOp`` is unchanged;
    ``nodes`` holds ``(node, domain, op_type, opset, why)`` for each of them,
    in graph order, so a user fixing a model sees all that is missing.
    """

    #: How many nodes the message lists before it counts the rest.
    SHOWN = 40

    def __init__(self, nodes: list[tuple[str, str, str, int, str]]) -> None:
        self.nodes = list(nodes)
        name, domain, op_type, opset, why = self.nodes[0]
        super().__init__(domain, op_type, opset, f"node {name!r} was refused by {why}")
        if len(self.nodes) == 1:
            return
        ops = sorted({f"{d or 'ai.onnx'}::{o}({v})" for _, d, o, v, _ in self.nodes})
        lines = [f"{len(self.nodes)} nodes no EP can run ({len(ops)} ops: {', '.join(ops)}):"]
        for name, domain, op_type, opset, why in self.nodes[: self.SHOWN]:
            lines.append(f"  {name!r} {domain or 'ai.onnx'}::{op_type} at opset {opset}: {why}")
        if len(self.nodes) > self.SHOWN:
            lines.append(f"  ... and {len(self.nodes) - self.SHOWN} more")
        self.args = (self.args[0] + "\n" + "\n".join(lines),)


class KernelFailed(NxrtError, status.Fail, status.RuntimeException):
    """A kernel raised while computing; names the node, op and EP when known."""

    def __init__(self, message: str, *, node: str = "", op_type: str = "", ep: str = "") -> None:
        self.message, self.node, self.op_type, self.ep = message, node, op_type, ep
        where = f" in node {node!r} ({op_type}) on EP {ep!r}" if node or op_type else ""
        super().__init__(f"kernel execution failed{where}: {message}")


class EpPanicked(NxrtError, status.Fail, status.RuntimeException):
    """An EP raised something that is not an nxrt error; the session stays usable."""

    def __init__(self, *, node: str = "", op_type: str = "", ep: str = "", cause: str = "") -> None:
        self.node, self.op_type, self.ep, self.cause = node, op_type, ep, cause
        if node:
            where = f" in node {node!r} ({op_type})"
        else:
            where = f" on a {op_type} node" if op_type else ""
        super().__init__(
            f"EP {ep!r} failed{where}: {cause}. This is a bug in the EP; report it to the "
            "EP's authors (every other EP, and a created session, keep working)."
        )


class EpLoadFailed(NxrtError, status.Fail):
    """A plugin could not be loaded or registered; other plugins keep working."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"EP plugin load failed: {path}: {reason}")


class OutOfMemory(NxrtError, status.Fail):
    """An allocation would exceed a device's byte budget."""

    def __init__(self, requested: int, available: int, where: str = "") -> None:
        self.requested, self.available, self.where = requested, available, where
        super().__init__(
            f"device OOM{' in ' + where if where else ''}: requested {requested} bytes, "
            f"available {available}; raise the EP's memory_limit or use a smaller model or batch."
        )


class AlignmentError(NxrtError, status.InvalidArgument):
    """A buffer's address is not aligned as its dtype or EP requires."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(f"allocation alignment mismatch{': ' + reason if reason else ''}")


class InvalidTensorView(NxrtError, status.InvalidArgument):
    """A tensor view's dtype, shape, strides or byte length do not agree."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid tensor view: {reason}")


class NotInitialized(NxrtError, status.Fail):
    """An execution provider was used before ``initialize()``."""

    def __init__(self, ep: str = "") -> None:
        self.ep = ep
        super().__init__(
            f"EP {ep + ' ' if ep else ''}not initialized: call initialize() before using it"
        )


class NoEpForContext(NxrtError, status.Fail, status.NotImplemented):
    """No installed EP owns an EPContext node's ``source`` key."""

    def __init__(self, source_key: str | None, detail: str = "") -> None:
        self.source_key = source_key
        super().__init__(
            detail
            or f"no EP is registered for EPContext source key {source_key!r}; install the EP "
            "that compiled this model or recompile it with `nxrt compile`."
        )


class UnsupportedContext(NxrtError, status.Fail, status.NotImplemented):
    """An EP does not implement EPContext save/load."""

    def __init__(self, ep: str) -> None:
        self.ep = ep
        super().__init__(f"EP {ep} does not support EPContext save/load")


class DuplicateContextSource(NxrtError, status.Fail):
    """Two EPs advertise the same EPContext ``source`` key."""

    def __init__(self, source_key: str, existing: str, new: str) -> None:
        self.source_key, self.existing, self.new = source_key, existing, new
        super().__init__(
            f"duplicate EPContext source key {source_key!r}: already registered to "
            f"{existing!r}, cannot re-register to {new!r}; uninstall or block one of the plugins."
        )


class InvalidModel(NxrtError, status.Fail, status.InvalidGraph):
    """The model cannot be parsed, fails the checker, or its graph is malformed."""


class InvalidPlacement(NxrtError, status.Fail):
    """The EPs' claims cannot be run in any order (a bug in an EP's claims)."""

    def __init__(self, claims: list[str], detail: str = "") -> None:
        self.claims = claims
        names = ", ".join(repr(c) for c in claims) or "none"
        super().__init__(
            f"the placement cannot be scheduled: claims {names} depend on each other in a "
            f"cycle{': ' + detail if detail else ''}. Report it to the authors of those EPs; "
            "run without one of them (providers=[...]) meanwhile."
        )


class InvalidArgument(NxrtError, status.InvalidArgument, ValueError):
    """A call was given a value it cannot use (feeds, options, providers...)."""


class UnknownProvider(InvalidArgument, RuntimeError):
    """A provider name that no installed EP answers to and onnxruntime does not know (a
    typo): onnxruntime raises ``RuntimeError: Unknown Provider Type: NAME`` there."""

    def __init__(self, name: str, detail: str = "") -> None:
        self.name = name
        super().__init__(f"Unknown Provider Type: {name}{'. ' + detail if detail else ''}")


class InvalidColumn(InvalidArgument):
    """A dataset column cannot feed the model input it is mapped to (batch inference,
    :mod:`nxrt.tools.batch`): it is missing, or its dtype or per-row shape is not the input's.
    Raised in the driver, on the first rows, before any worker starts."""

    def __init__(self, column: str, input_name: str, expected: str, found: str, fix: str) -> None:
        self.column, self.input_name = column, input_name
        self.expected, self.found = expected, found
        super().__init__(
            f"column {column!r} cannot feed model input {input_name!r}: expected {expected}, "
            f"found {found}; {fix}"
        )


class ModelNotFound(InvalidModel, status.NoSuchFile):
    """The model file does not exist (onnxruntime's NO_SUCHFILE)."""


class ModelNotParsed(InvalidModel, status.InvalidProtobuf):
    """The bytes or the file are not a serialized ONNX model (onnxruntime's INVALID_PROTOBUF)."""


class RuntimeFailure(NxrtError, status.Fail, RuntimeError):
    """A request nxrt cannot carry out where onnxruntime raises a ``RuntimeError``: a config
    entry that was never set, a binding to a name the model lacks, memory on a device no
    installed EP has, a run stopped by ``RunOptions.terminate``."""


class WeightHandleError(NxrtError, status.Fail):
    """A weight handle could not be built, negotiated or bound (seed: ``WeightHandleError``)."""

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and self.args == other.args

    def __hash__(self) -> int:
        return hash((type(self), self.args))


class InvalidResident(WeightHandleError):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid resident weight: {reason}")


class MissingRegions(WeightHandleError):
    def __init__(self) -> None:
        super().__init__("lazy weight requires at least one external mmap region")


class Unsupported(WeightHandleError):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"unsupported: {reason}")


class InvalidExternalData(NxrtError, status.Fail):
    """A tensor's external data is outside the model folder, out of bounds or mis-sized."""


class MissingExtra(NxrtError, ImportError):
    """A part of nxrt that needs an optional dependency was used without it.

    The runtime installs without them; the message names the extra that brings
    the missing package. An ``ImportError`` too, so ``except ImportError`` guards
    written for the missing package still catch it.
    """

    def __init__(self, feature: str, package: str, extra: str) -> None:
        self.feature, self.package, self.extra = feature, package, extra
        super().__init__(
            f'{feature} needs {package}, which is not installed: pip install "nxrt[{extra}]"',
            name=package,
        )


__all__ = [
    "AlignmentError",
    "DuplicateContextSource",
    "EpLoadFailed",
    "EpPanicked",
    "InvalidArgument",
    "InvalidColumn",
    "InvalidPlacement",
    "InvalidExternalData",
    "InvalidModel",
    "InvalidResident",
    "InvalidTensorView",
    "KernelFailed",
    "MissingExtra",
    "MissingRegions",
    "ModelNotFound",
    "ModelNotParsed",
    "NoEpForContext",
    "NoEpForNodes",
    "NoEpForOp",
    "NotInitialized",
    "NxrtError",
    "OutOfMemory",
    "RuntimeFailure",
    "UnknownProvider",
    "UnsupportedContext",
    "Unsupported",
    "WeightHandleError",
]
