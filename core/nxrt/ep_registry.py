"""Which EPs exist: what discovery knows of each, and what a plugin's hook registers.

A plugin's ``nxrt_register`` hook receives a :class:`Registrar` and declares
each EP it provides with a factory and, optionally, its kernel table; the host
collects the descriptors into the :class:`EpRegistry` a session chooses from.
This sits above :mod:`nxrt.provider` (a descriptor builds an EP), which sits
above :mod:`nxrt.registry` (an EP holds its kernel table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from nxrt.registry import OpRegistry

if TYPE_CHECKING:
    from nxrt.provider import EpConfig, ExecutionProvider

#: What ``add_kernels`` takes: the kernel table, or a function that imports and returns it
#: when a session first needs it (so listing EPs imports no kernel module).
KernelTable = OpRegistry | Callable[[], OpRegistry]


@dataclass
class EpDescriptor:
    """What discovery knows of an EP without opening its backend library."""

    id: str
    factory: Callable[[EpConfig], ExecutionProvider]
    plugin: str = ""
    device_type: str = "cpu"
    context_sources: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    #: The kernel table as registered: an :class:`OpRegistry`, or its loader (see ``ops``).
    kernels: KernelTable | None = None
    description: str = ""
    priority: int = 0  # orders the default providers list only (higher first)

    @property
    def ops(self) -> OpRegistry | None:
        """The EP's kernel table; one registered as a loader is loaded on first use.

        Loading imports the plugin's kernel modules (and what they import), which
        is why discovery and ``get_available_providers()`` never read this. A
        loader that fails is the plugin's :class:`~nxrt.errors.EpLoadFailed`, with
        its cause.
        """
        kernels = self.kernels
        if kernels is None or isinstance(kernels, OpRegistry):
            return kernels
        try:
            table = kernels()
            if not isinstance(table, OpRegistry):
                raise TypeError(
                    f"the kernel loader of EP {self.id!r} returned {type(table).__name__}, "
                    "not an OpRegistry"
                )
        except Exception as exc:
            from nxrt.errors import EpLoadFailed

            reason = f"loading the kernels of EP {self.id!r}: {type(exc).__name__}: {exc}"
            raise EpLoadFailed(self.plugin or self.id, reason) from exc
        self.kernels = table
        return table

    @ops.setter
    def ops(self, value: OpRegistry | None) -> None:
        self.kernels = value

    @property
    def ops_loaded(self) -> bool:
        """Whether ``ops`` is at hand without importing anything."""
        return self.kernels is None or isinstance(self.kernels, OpRegistry)


@dataclass
class EpRegistry:
    """Every EP the loaded plugins provide; priority comes from the session, not from here."""

    providers: dict[str, EpDescriptor] = field(default_factory=dict)

    def add(self, descriptor: EpDescriptor) -> None:
        if descriptor.id in self.providers:
            existing = self.providers[descriptor.id].plugin
            raise ValueError(f"EP id {descriptor.id!r} is already provided by plugin {existing!r}")
        self.providers[descriptor.id] = descriptor

    def resolve(self, name: str) -> EpDescriptor | None:
        """An EP by id or by alias (ONNX Runtime's names, e.g. ``CPUExecutionProvider``)."""
        if name in self.providers:
            return self.providers[name]
        for descriptor in self.providers.values():
            if name in descriptor.aliases:
                return descriptor
        return None

    def default_order(self) -> list[str]:
        """Every installed EP by declared priority (then name), ``cpu`` last: the default
        ``providers`` list. A session's own ``providers`` always overrides it."""
        ids = sorted(self.providers, key=lambda i: (-self.providers[i].priority, i))
        return [i for i in ids if i != "cpu"] + (["cpu"] if "cpu" in self.providers else [])


class Registrar:
    """What ``nxrt_register`` receives: validates each addition and knows the plugin.

    Additions are staged and committed only when the plugin's hook returns,
    so a plugin that fails half-way leaves nothing behind.

    ``ep_libraries`` (read-only, ``{registration name: path}``) are the ONNX
    Runtime plugin-EP libraries registered with
    ``nxrt.register_execution_provider_library``: a plugin that bridges to ONNX
    Runtime (legacy_abi) registers an EP for each.
    """

    def __init__(self, plugin: str, ep_libraries: Mapping[str, str] | None = None) -> None:
        self.plugin = plugin
        self.staged: list[EpDescriptor] = []
        self.ep_libraries: Mapping[str, str] = MappingProxyType(dict(ep_libraries or {}))

    def add_provider(
        self,
        id: str,
        factory: Callable[[EpConfig], ExecutionProvider],
        *,
        device_type: str = "cpu",
        context_sources: Sequence[str] = (),
        aliases: Sequence[str] = (),
        description: str = "",
        priority: int = 0,
    ) -> None:
        """Declare an EP; ``factory(config)`` builds it when a session asks for it.

        ``priority`` only orders the default ``providers`` list (higher first):
        a device EP that should win by default declares more than a host one.
        """
        if not isinstance(id, str) or not id.isidentifier():
            raise TypeError(f"EP id must be an identifier string, got {id!r}")
        if not callable(factory):
            raise TypeError(f"factory of EP {id!r} must be callable, got {factory!r}")
        if any(d.id == id for d in self.staged):
            raise ValueError(f"EP {id!r} registered twice by plugin {self.plugin!r}")
        for source in context_sources:
            if not isinstance(source, str) or not source:
                raise TypeError(f"context source keys of EP {id!r} must be non-empty strings")
        self.staged.append(
            EpDescriptor(
                id=id,
                factory=factory,
                plugin=self.plugin,
                device_type=str(device_type),
                context_sources=tuple(context_sources),
                aliases=tuple(aliases),
                description=description,
                priority=int(priority),
            )
        )

    def add_kernels(self, id: str, ops: KernelTable) -> None:
        """Attach a kernel table to an EP this plugin registered.

        ``ops`` is the :class:`OpRegistry`, or a function without arguments that
        returns it: pass the function (e.g. one that imports the plugin's ``ops``
        package) so that listing providers does not import the kernel modules;
        it is called once, when a session first needs the table.
        """
        if not isinstance(ops, OpRegistry) and not callable(ops):
            raise TypeError(
                f"kernels of EP {id!r} must be an OpRegistry or a function returning one, "
                f"got {type(ops).__name__}"
            )
        for descriptor in self.staged:
            if descriptor.id == id:
                descriptor.kernels = ops
                return
        raise ValueError(f"plugin {self.plugin!r} adds kernels to EP {id!r} it did not register")
