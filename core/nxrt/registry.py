"""The op registry: which kernel runs an op at an opset, and the answers of matching.

An EP's kernels live in an :class:`OpRegistry`. Each kernel is one function
plus one registration line, written as a decorator at its definition::

    ops = OpRegistry("cpu")

    @ops.op("Softmax", since=13)
    def softmax(x, /, *, axis=-1): ...

``since`` may be a tuple when one function serves several schema versions.
The registry computes each key's ``end_version`` from the next registration
of the same op and refuses overlaps, so dispatch takes the highest ``since``
not above the model's opset.

Which EPs exist is :mod:`nxrt.ep_registry`'s, a layer above the EP class.
"""

from __future__ import annotations

import bisect
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, cast

from typing_extensions import TypeVar

from nxrt._moved import moved_attribute
from nxrt.kernel import Cost

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.kernel import Kernel

#: The EP class a table's kernel factories receive (the EP the table is attached to);
#: a table declared as plain ``OpRegistry`` leaves it open.
EP = TypeVar("EP", default=Any)

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
KernelFactory = Callable[[EP, "ir.Node"], "Kernel"]


@dataclass
class KernelEntry:
    """One registered kernel: the function and what the executor must know about it."""

    key: OpKey
    fn: Callable[..., Any]
    const_inputs: tuple[int, ...] = ()
    view_output: int | None = None
    cost: CostFunction | None = None
    factory: KernelFactory[Any] | None = None

    @functools.cached_property
    def takes_output_count(self) -> bool:
        """Whether the kernel wants the node's output count as keyword ``_n_outputs``."""
        try:
            return OUTPUT_COUNT in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return False


@dataclass(frozen=True)
class KernelMatch:
    """An EP's answer to "can you run this node?": a cost, or a reason it cannot.

    A supported match carries the registry ``entry`` it matched, so the
    planner builds the kernel from it without looking the op up again; the
    host fills it from the EP's kernel table when a plugin answers without one.
    """

    supported: bool
    cost: Cost | None = None
    reason: str = ""
    key: OpKey | None = None
    entry: KernelEntry | None = None

    @classmethod
    def yes(
        cls, cost: Cost, key: OpKey | None = None, entry: KernelEntry | None = None
    ) -> KernelMatch:
        if key is None and entry is not None:
            key = entry.key
        return cls(True, cost=cost, key=key, entry=entry)

    @classmethod
    def no(cls, reason: str) -> KernelMatch:
        return cls(False, reason=reason)


#: The keyword through which a kernel may learn how many outputs its node has.
OUTPUT_COUNT = "_n_outputs"


class OpRegistry(Generic[EP]):
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
        factory: KernelFactory[EP] | None = None,
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


if not TYPE_CHECKING:  # so a type checker still reports a name that does not exist

    def __getattr__(name: str) -> Any:
        return moved_attribute(__name__, name)
