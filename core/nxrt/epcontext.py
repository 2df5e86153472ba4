"""EPContext: a compiled partition in ONNX Runtime's on-disk form, and who can load it.

An ``EPContext`` node (domain ``com.microsoft``) carries a compiled partition
and the ``source`` key of the EP that can load it. :class:`EpContext` is its
runtime form; :class:`EpContextRegistry` maps source keys to EPs, built from
the keys each EP declares, so loading is a dict lookup rather than a chain.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nxrt.errors import DuplicateContextSource, NoEpForContext, UnsupportedContext
from nxrt.registry import EpDescriptor

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


def build_ep_context_registry(descriptors: Iterable[EpDescriptor]) -> EpContextRegistry:
    """Collect every EP's declared source keys; two EPs with one key is an error."""
    registry = EpContextRegistry()
    for descriptor in descriptors:
        for key in descriptor.context_sources:
            registry.add(key, descriptor.id)
    return registry
