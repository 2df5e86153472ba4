"""Op and EP registries: which kernel runs an op at an opset, and which EPs exist.

An EP's kernels live in an :class:`OpRegistry`. Each kernel is one function
plus one registration line, written as a decorator at its definition::

    ops = OpRegistry("cpu")

    @ops.op("Softmax", since=13)
    def softmax(x, /, *, axis=-1): ...

``since`` may be a tuple when one function serves several schema versions.
The registry computes each key's ``end_version`` from the next registration
of the same op and refuses overlaps, so dispatch takes the highest ``since``
not above the model's opset.
"""

from __future__ import annotations

import bisect
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from nxrt.kernel import Cost, KernelMatch

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.kernel import Kernel
    from nxrt.provider import EpConfig, ExecutionProvider

#: Both spellings of the default ONNX domain.
DEFAULT_DOMAINS = ("", "ai.onnx")


def normalize_domain(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


@dataclass(frozen=True, order=True)
class OpKey:
    """An op at a range of opset versions: ``since_version..end_version`` inclusive."""

    domain: str
    op_type: str
    since_version: int
    end_version: int | None = None  # None: still current

    def __str__(self) -> str:
        end = "" if self.end_version is None else str(self.end_version)
        return f"{self.domain or 'ai.onnx'}::{self.op_type}({self.since_version}..{end})"


#: A cost estimate from a node's input and output shapes (None where unknown).
CostFunction = Callable[["ir.Node"], Cost]
#: Builds a node's kernel from the EP and the node, for kernels that are not one bound
#: function (they plan per shape, or share state held by the EP).
KernelFactory = Callable[["ExecutionProvider", "ir.Node"], "Kernel"]


@dataclass
class KernelEntry:
    """One registered kernel: the function and what the executor must know about it."""

    key: OpKey
    fn: Callable[..., Any]
    const_inputs: tuple[int, ...] = ()
    view_output: int | None = None
    cost: CostFunction | None = None
    factory: KernelFactory | None = None

    @functools.cached_property
    def takes_output_count(self) -> bool:
        """Whether the kernel wants the node's output count as keyword ``_n_outputs``."""
        try:
            return OUTPUT_COUNT in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return False


#: The keyword through which a kernel may learn how many outputs its node has.
OUTPUT_COUNT = "_n_outputs"


class OpRegistry:
    """The kernels of one EP, keyed by :class:`OpKey`.

    An EP whose entries carry more than :class:`KernelEntry` does (mlx: element
    types, layout changes) subclasses both and sets :attr:`entry_type`; ``op``
    passes its extra keywords on to that class.
    """

    #: The class of the entries ``op`` makes.
    entry_type: type[KernelEntry] = KernelEntry

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._entries: dict[tuple[str, str], list[KernelEntry]] = {}

    def op(
        self,
        op_type: str,
        since: int | Sequence[int],
        *,
        domain: str = "",
        const_inputs: Sequence[int] = (),
        view_output: int | None = None,
        cost: CostFunction | None = None,
        factory: KernelFactory | None = None,
        **fields: Any,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``fn`` for ``op_type`` from each version in ``since``.

        ``factory(ep, node)``, when given, builds the node's kernel instead of
        binding ``fn`` to the node's attributes. ``fields`` are those of an
        :attr:`entry_type` beyond :class:`KernelEntry`'s.
        """
        versions = (since,) if isinstance(since, int) else tuple(since)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            for version in versions:
                self.add(
                    self.entry_type(
                        OpKey(normalize_domain(domain), op_type, version),
                        fn,
                        tuple(const_inputs),
                        view_output,
                        cost,
                        factory,
                        **fields,
                    )
                )
            return fn

        return register

    def add(self, entry: KernelEntry) -> None:
        """Add one kernel; an op registered twice at one version is refused."""
        key = entry.key
        versions = self._entries.setdefault((key.domain, key.op_type), [])
        sinces = [e.key.since_version for e in versions]
        if key.since_version in sinces:
            raise ValueError(f"{self.name}: {key} is registered twice")
        index = bisect.bisect(sinces, key.since_version)
        if key.end_version is not None and index < len(sinces):
            if key.end_version >= sinces[index]:
                raise ValueError(f"{self.name}: {key} overlaps {versions[index].key}")
        versions.insert(index, entry)
        self._close_ranges(versions)

    @staticmethod
    def _close_ranges(versions: list[KernelEntry]) -> None:
        for entry, following in zip(versions, versions[1:]):
            end = following.key.since_version - 1
            if entry.key.end_version != end:
                key = entry.key
                entry.key = OpKey(key.domain, key.op_type, key.since_version, end)

    def lookup(self, domain: str, op_type: str, opset: int) -> KernelEntry | None:
        """The kernel for ``op_type`` at ``opset``: the highest ``since`` not above it."""
        for entry in reversed(self._entries.get((normalize_domain(domain), op_type), [])):
            key = entry.key
            if key.since_version <= opset:
                return entry if key.end_version is None or opset <= key.end_version else None
        return None

    def match(self, node: ir.Node, opset: int) -> KernelMatch:
        """Kernel matching answered from the table, with a reason on refusal."""
        versions = self._entries.get((normalize_domain(node.domain), node.op_type))
        if not versions:
            return KernelMatch.no(f"{node.op_type} is not implemented")
        entry = self.lookup(node.domain, node.op_type, opset)
        if entry is None:
            have = ", ".join(str(e.key.since_version) for e in versions)
            return KernelMatch.no(f"{node.op_type} has kernels from opsets {have}, not {opset}")
        for index in entry.const_inputs:
            value = node.inputs[index] if index < len(node.inputs) else None
            if value is not None and value.const_value is None:
                return KernelMatch.no(f"input {index} of {node.op_type} must be a constant")
        cost = entry.cost(node) if entry.cost else estimate_cost(node)
        return KernelMatch.yes(cost, entry=entry)

    def keys(self) -> Iterator[OpKey]:
        for versions in self._entries.values():
            for entry in versions:
                yield entry.key

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    @property
    def op_types(self) -> set[tuple[str, str]]:
        return set(self._entries)


def estimate_cost(node: ir.Node) -> Cost:
    """A generic cost: one flop per output element, bytes of every known tensor."""
    flops = 0
    traffic: float = 0
    for value, is_output in [(v, False) for v in node.inputs] + [(v, True) for v in node.outputs]:
        if value is None or value.shape is None or value.dtype is None:
            continue
        if not all(isinstance(d, int) for d in value.shape):
            continue
        count = 1
        for dim in value.shape:
            count *= cast(int, dim)
        try:
            traffic += count * value.dtype.itemsize
        except TypeError:  # strings have no fixed size: count elements only
            pass
        if is_output:
            flops += count
    return Cost(flops, traffic)


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
