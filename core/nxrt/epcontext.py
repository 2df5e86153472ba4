"""EPContext: a compiled partition in ONNX Runtime's on-disk form, and who can load it.

An ``EPContext`` node (domain ``com.microsoft``) carries a compiled partition
and the ``source`` key of the EP that can load it. :class:`EpContext` is its
runtime form; :class:`EpContextRegistry` maps source keys to EPs, built from
the keys each EP declares, so loading is a dict lookup rather than a chain.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from nxrt.errors import DuplicateContextSource, InvalidModel, NoEpForContext, UnsupportedContext

if TYPE_CHECKING:
    import onnx_ir as ir

EPCONTEXT_OP = "EPContext"
EPCONTEXT_DOMAIN = "com.microsoft"


@dataclass
class EpContext:
    """The attributes of an ``EPContext`` node, as ONNX Runtime's schema defines them."""

    source: str | None
    ep_cache_context: bytes = b""
    main_context: int = 1
    embed_mode: int = 1
    ep_sdk_version: str = ""
    onnx_model_filename: str = ""
    hardware_architecture: str = ""
    partition_name: str = ""
    notes: str = ""
    max_size: int = 0
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


@dataclass
class EpContextRegistry:
    """Source key -> EP id, with every key owned by exactly one EP."""

    owners: dict[str, str] = field(default_factory=dict)
    context_eps: set[str] = field(default_factory=set)

    def add(self, source_key: str, ep_id: str) -> None:
        existing = self.owners.get(source_key)
        if existing is not None and existing != ep_id:
            raise DuplicateContextSource(source_key, existing, ep_id)
        self.owners[source_key] = ep_id
        self.context_eps.add(ep_id)

    def owner(self, source_key: str | None) -> str:
        """The EP that loads contexts with this key, or ``NoEpForContext``."""
        if source_key is None or source_key not in self.owners:
            raise NoEpForContext(source_key)
        return self.owners[source_key]

    def require_support(self, ep_id: str) -> None:
        """Refuse an EP that declared no context source keys."""
        if ep_id not in self.context_eps:
            raise UnsupportedContext(ep_id)


class DeclaresContextSources(Protocol):
    """What the context registry reads of an EP's descriptor (an ``EpDescriptor``)."""

    @property
    def id(self) -> str: ...

    @property
    def context_sources(self) -> tuple[str, ...]: ...


def build_ep_context_registry(
    descriptors: Iterable[DeclaresContextSources],
) -> EpContextRegistry:
    """Collect every EP's declared source keys; two EPs with one key is an error."""
    registry = EpContextRegistry()
    for descriptor in descriptors:
        for key in descriptor.context_sources:
            registry.add(key, descriptor.id)
    return registry


def is_context_node(node: ir.Node) -> bool:
    return node.op_type == EPCONTEXT_OP and node.domain == EPCONTEXT_DOMAIN


def _attribute(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def read_context(node: ir.Node, base_dir: str | None) -> EpContext:
    """An ``EPContext`` node as an :class:`EpContext`, read the way ONNX Runtime reads it.

    Unknown attributes are ignored and missing ones take their defaults. With
    ``embed_mode=0`` the blob is a file beside the model, whose path must
    stay inside the model's folder (no absolute path, no ``..``, no symlink
    out of it).
    """
    name = cast(str, _attribute(node, "partition_name", "") or node.name)
    blob = _attribute(node, "ep_cache_context", b"")
    blob = blob.encode("utf-8") if isinstance(blob, str) else bytes(blob)
    embed_mode = int(_attribute(node, "embed_mode", 1))
    if embed_mode == 0:
        blob = _read_side_file(blob.decode("utf-8", errors="replace"), base_dir, name)
    elif embed_mode != 1:
        raise InvalidModel(f"EPContext {name!r} has embed_mode {embed_mode}; it must be 0 or 1")
    return EpContext(
        source=_attribute(node, "source", None) or None,
        ep_cache_context=blob,
        main_context=int(_attribute(node, "main_context", 1)),
        embed_mode=embed_mode,
        ep_sdk_version=str(_attribute(node, "ep_sdk_version", "")),
        onnx_model_filename=str(_attribute(node, "onnx_model_filename", "")),
        hardware_architecture=str(_attribute(node, "hardware_architecture", "")),
        partition_name=name,
        notes=str(_attribute(node, "notes", "")),
        max_size=int(_attribute(node, "max_size", 0)),
        inputs=[cast(str, v.name) if v is not None else "" for v in node.inputs],
        outputs=[cast(str, v.name) for v in node.outputs],
    )


def _read_side_file(location: str, base_dir: str | None, name: str) -> bytes:
    from nxrt.pipeline.external_data import resolve_location

    if base_dir is None:
        raise InvalidModel(
            f"EPContext {name!r} keeps its blob in the file {location!r} (embed_mode=0); "
            "load the model from its path so the file can be found next to it"
        )
    with open(resolve_location(base_dir, location, f"EPContext {name}"), "rb") as f:
        return f.read()


def context_attributes(context: EpContext, blob_or_path: bytes) -> dict[str, Any]:
    """The attributes an ``EPContext`` node is written with (every one ORT's schema has)."""
    return {
        "main_context": context.main_context,
        "ep_cache_context": blob_or_path,
        "embed_mode": context.embed_mode,
        "ep_sdk_version": context.ep_sdk_version,
        "onnx_model_filename": context.onnx_model_filename,
        "hardware_architecture": context.hardware_architecture,
        "partition_name": context.partition_name,
        "source": context.source or "",
        "notes": context.notes,
        "max_size": context.max_size,
    }
