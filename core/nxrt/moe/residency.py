"""Expert residency: which experts of a mixture-of-experts layer are in memory.

A mixture-of-experts model may have far more expert weights than memory, yet
each token reads only ``top_k`` experts. Experts are the leading axis of every
weight tensor, so each expert's slices are contiguous byte ranges of the
mapped external data: an :class:`ExpertWeightGroup`. A policy plans which
groups stay resident under a byte budget (:func:`plan_residency`); before
each compute, :func:`prove_routed_residency` makes sure the experts the router
picked are resident, paging them in (copying their bytes out of the mapping
into owned memory, so the process's resident set reflects residency) and
evicting others by :class:`EvictionClass`, then least recently used.
:func:`plan_resize` changes the budget at a safe point between runs.
"""

from __future__ import annotations

import enum
import itertools
import mmap
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from nxrt.errors import InvalidArgument, OutOfMemory
from nxrt.memory import MemoryGovernor
from nxrt.tensor import ExternalMmapRegion

#: ``(bank id, expert index)``: one expert of one mixture-of-experts layer.
GroupKey = tuple[int, int]

_ALIGN = 64  # byte alignment of each slice inside a paged-in expert


class EvictionClass(enum.IntEnum):
    """Who gives way first when room is needed: lower classes, then least recently used."""

    #: Paged in on demand for routed tokens.
    STREAMED = 0
    #: Kept resident by the policy (hot in a usage profile); evicted only after every
    #: streamed expert.
    PROFILED = 1
    #: Planned resident with the whole bank; never evicted.
    PINNED = 2


@dataclass(frozen=True)
class ExpertSlice:
    """One weight input's slice for one expert: a contiguous region of a mapping."""

    input_index: int
    region: ExternalMmapRegion
    dtype: np.dtype
    shape: tuple[int, ...]
    source: Any = field(compare=False, repr=False)  # the MappedFile holding ``region``


@dataclass(frozen=True)
class ExpertWeightGroup:
    """Everything one expert reads (fc1/fc2 weights, scales, zero points), paged as one."""

    bank: int
    expert: int
    slices: tuple[ExpertSlice, ...]

    @property
    def key(self) -> GroupKey:
        return (self.bank, self.expert)

    @property
    def nbytes(self) -> int:
        return sum(s.region.len for s in self.slices)


@dataclass(frozen=True)
class FinalizedExpertBank:
    """The experts of one MoE node, registered with a residency manager."""

    bank: int
    num_experts: int
    groups: tuple[ExpertWeightGroup, ...]
    #: Op input positions whose weights this bank pages.
    inputs: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.groups)

    @property
    def expert_nbytes(self) -> int:
        return max((g.nbytes for g in self.groups), default=0)


def expert_weight_groups(
    weights: Mapping[int, Any], num_experts: int, bank: int = 0
) -> list[ExpertWeightGroup]:
    """Cut lazy weights (input index -> :class:`~nxrt.pipeline.external_data.ExternalLazyWeight`)
    into one group per expert.

    Each weight's leading axis is the expert, so expert ``e``'s slice is the
    ``e``-th of ``num_experts`` equal byte ranges of the weight's region.
    """
    if num_experts < 1:
        raise InvalidArgument(f"a bank needs at least one expert, got {num_experts}")
    per_expert: list[list[ExpertSlice]] = [[] for _ in range(num_experts)]
    for index, weight in sorted(weights.items()):
        shape = tuple(getattr(weight, "shape", ()))
        dtype = getattr(weight, "dtype", None)
        source = getattr(weight, "file", None)
        name = getattr(weight, "name", f"input {index}")
        if dtype is None or source is None or not shape:
            raise InvalidArgument(
                f"weight {name!r} is a lazy handle without a layout; it cannot be paged "
                "per expert (materialize it instead)"
            )
        if len(weight.regions) != 1:
            raise InvalidArgument(f"weight {name!r} spans {len(weight.regions)} regions, not 1")
        if shape[0] != num_experts:
            raise InvalidArgument(
                f"weight {name!r} has {shape[0]} experts on its leading axis, expected "
                f"{num_experts}"
            )
        if dtype.bitwidth % 8:
            raise InvalidArgument(f"weight {name!r} is bit-packed ({dtype.name}); use uint8")
        region = weight.regions[0]
        step, rest = divmod(region.len, num_experts)
        if rest:
            raise InvalidArgument(
                f"weight {name!r} has {region.len} bytes, not a multiple of {num_experts} experts"
            )
        np_dtype = np.dtype(dtype.numpy())
        for e in range(num_experts):
            sub = ExternalMmapRegion(region.mapping_id, region.offset + e * step, step)
            per_expert[e].append(ExpertSlice(index, sub, np_dtype, shape[1:], source))
    return [ExpertWeightGroup(bank, e, tuple(s)) for e, s in enumerate(per_expert)]


# -- planning --------------------------------------------------------------------------------


class ResidencyDecision(enum.Enum):
    """A plan's verdict on one expert."""

    RESIDENT = "resident"
    PAGED = "paged"


class ResidencyDegradationReason(enum.Enum):
    """Why a plan keeps less resident than the policy wanted."""

    BANK_EXCEEDS_BUDGET = "the experts do not all fit the budget; the rest are paged on demand"
    PROFILE_EXCEEDS_BUDGET = "not every expert the usage profile calls hot fits the budget"


class WholeBankReason(enum.Enum):
    """Why :class:`WholeBankResidentPolicy` decided as it did."""

    UNLIMITED = "no budget: the whole bank is resident"
    FITS = "the whole bank fits the budget"
    EXCEEDS_BUDGET = "the whole bank exceeds the budget"


@dataclass(frozen=True)
class ResidencyPolicyInput:
    """What a policy plans from: the groups and the budget (``None``: unlimited)."""

    groups: tuple[ExpertWeightGroup, ...]
    budget: int | None

    @property
    def total_bytes(self) -> int:
        return sum(g.nbytes for g in self.groups)

    @property
    def largest(self) -> int:
        return max((g.nbytes for g in self.groups), default=0)


@dataclass(frozen=True)
class ResidencyPlan:
    """What stays resident, what is paged on demand, and why anything was degraded."""

    budget: int | None
    decisions: Mapping[GroupKey, ResidencyDecision]
    classes: Mapping[GroupKey, EvictionClass]
    degradations: tuple[tuple[ResidencyDegradationReason, str], ...] = ()
    policy: str = ""
    whole_bank: WholeBankReason | None = None
    sizes: Mapping[GroupKey, int] = field(default_factory=dict)

    @property
    def resident(self) -> tuple[GroupKey, ...]:
        return tuple(k for k, d in self.decisions.items() if d is ResidencyDecision.RESIDENT)

    @property
    def paged(self) -> tuple[GroupKey, ...]:
        return tuple(k for k, d in self.decisions.items() if d is ResidencyDecision.PAGED)

    @property
    def degraded(self) -> bool:
        return bool(self.degradations)

    @property
    def resident_bytes(self) -> int:
        return sum(self.sizes.get(k, 0) for k in self.resident)

    def describe(self) -> str:
        text = (
            f"{self.policy}: {len(self.resident)} experts resident, {len(self.paged)} paged "
            f"(budget {'unlimited' if self.budget is None else f'{self.budget} bytes'})"
        )
        for reason, detail in self.degradations:
            text += f"; degraded: {reason.value} ({detail})"
        return text


@runtime_checkable
class ResidencyPolicy(Protocol):
    """Plans residency for a set of expert groups under a budget."""

    @property
    def name(self) -> str: ...

    def plan(self, policy_input: ResidencyPolicyInput) -> ResidencyPlan: ...


def _plan(
    policy_input: ResidencyPolicyInput,
    resident: Mapping[GroupKey, EvictionClass],
    degradations: Iterable[tuple[ResidencyDegradationReason, str]],
    policy: str,
    whole_bank: WholeBankReason | None = None,
) -> ResidencyPlan:
    decisions = {}
    classes = {}
    for group in policy_input.groups:
        if group.key in resident:
            decisions[group.key] = ResidencyDecision.RESIDENT
            classes[group.key] = resident[group.key]
        else:
            decisions[group.key] = ResidencyDecision.PAGED
            classes[group.key] = EvictionClass.STREAMED
    return ResidencyPlan(
        policy_input.budget,
        decisions,
        classes,
        tuple(degradations),
        policy,
        whole_bank,
        {g.key: g.nbytes for g in policy_input.groups},
    )


@dataclass(frozen=True)
class WholeBankResidentPolicy:
    """Everything resident (pinned) when it fits; otherwise every expert is paged."""

    name: str = "whole-bank"

    def plan(self, policy_input: ResidencyPolicyInput) -> ResidencyPlan:
        total, budget = policy_input.total_bytes, policy_input.budget
        if budget is None or total <= budget:
            reason = WholeBankReason.UNLIMITED if budget is None else WholeBankReason.FITS
            pinned = dict.fromkeys((g.key for g in policy_input.groups), EvictionClass.PINNED)
            return _plan(policy_input, pinned, (), self.name, reason)
        detail = (
            f"the bank needs {total} bytes and the budget is {budget}; experts are paged in "
            "when routed"
        )
        degradation = (ResidencyDegradationReason.BANK_EXCEEDS_BUDGET, detail)
        return _plan(policy_input, {}, [degradation], self.name, WholeBankReason.EXCEEDS_BUDGET)


@dataclass(frozen=True, init=False)
class StaticProfileResidencyPolicy:
    """The hottest experts by a usage profile stay resident; the others are paged.

    ``profile`` maps an expert index to how often it was routed (a sequence is
    indexed by expert). Room for ``stream_slots`` of the largest expert is kept
    free so routed cold experts can still be paged in.
    """

    profile: Mapping[int, float]
    stream_slots: int
    name: str

    def __init__(
        self,
        profile: Mapping[int, float] | Sequence[float],
        stream_slots: int = 1,
        name: str = "static-profile",
    ) -> None:
        if not isinstance(profile, Mapping):
            profile = dict(enumerate(profile))
        usage = {int(k): float(v) for k, v in profile.items()}
        if any(v < 0 for v in usage.values()):
            raise InvalidArgument("usage profile counts must be >= 0")
        if stream_slots < 0:
            raise InvalidArgument(f"stream_slots must be >= 0, got {stream_slots}")
        object.__setattr__(self, "profile", usage)
        object.__setattr__(self, "stream_slots", stream_slots)
        object.__setattr__(self, "name", name)

    def plan(self, policy_input: ResidencyPolicyInput) -> ResidencyPlan:
        budget = policy_input.budget
        hot = sorted(
            (g for g in policy_input.groups if self.profile.get(g.expert, 0.0) > 0),
            key=lambda g: (-self.profile[g.expert], g.bank, g.expert),
        )
        if budget is None:
            kept: dict[GroupKey, EvictionClass]
            kept = dict.fromkeys((g.key for g in hot), EvictionClass.PROFILED)
            return _plan(policy_input, kept, (), self.name)
        room = budget - self.stream_slots * policy_input.largest
        kept = {}
        used = 0
        for group in hot:
            if used + group.nbytes <= room:
                kept[group.key] = EvictionClass.PROFILED
                used += group.nbytes
        degradations = []
        if len(kept) < len(hot):
            degradations.append(
                (
                    ResidencyDegradationReason.PROFILE_EXCEEDS_BUDGET,
                    f"{len(kept)} of {len(hot)} profiled experts fit in {max(room, 0)} bytes "
                    f"(budget {budget} less room to stream {self.stream_slots} expert(s))",
                )
            )
        if len(kept) < len(policy_input.groups):
            degradations.append(
                (
                    ResidencyDegradationReason.BANK_EXCEEDS_BUDGET,
                    f"{len(policy_input.groups) - len(kept)} experts are paged in when routed",
                )
            )
        return _plan(policy_input, kept, degradations, self.name)


def plan_residency(
    groups: Iterable[ExpertWeightGroup],
    budget: int | None,
    policy: ResidencyPolicy | None = None,
) -> ResidencyPlan:
    """The policy's plan for ``groups`` under ``budget`` bytes (``None``: unlimited).

    One expert alone larger than the budget can never be computed:
    :class:`~nxrt.errors.OutOfMemory` (requested: the expert, available: the budget).
    """
    groups = tuple(groups)
    governor = MemoryGovernor(budget)
    for group in groups:
        governor.check(group.nbytes)
    policy = policy or WholeBankResidentPolicy()
    plan = policy.plan(ResidencyPolicyInput(groups, budget))
    if budget is not None and plan.resident_bytes > budget:
        raise InvalidArgument(
            f"policy {policy.name!r} planned {plan.resident_bytes} resident bytes over a "
            f"budget of {budget}"
        )
    return plan


# -- resizing --------------------------------------------------------------------------------


class ResizeDirection(enum.Enum):
    GROW = "grow"
    SHRINK = "shrink"
    UNCHANGED = "unchanged"


class ResizeSafePoint(enum.Enum):
    """Where a resize was applied: never while a compute holds paged experts."""

    #: At the start of a compute, with no other compute in flight.
    BETWEEN_RUNS = "between runs"
    #: On request, the manager being idle.
    IDLE = "idle"


@dataclass(frozen=True)
class ResidencyResizeRequest:
    """A new budget in bytes (``None``: unlimited)."""

    budget: int | None


@dataclass(frozen=True)
class ResizeRejection:
    """A resize that cannot be honoured, and the smallest budget that could."""

    reason: str
    requested: int | None
    minimum: int


@dataclass(frozen=True)
class ResidencyResizePlan:
    """The new plan and how residency changes to reach it."""

    direction: ResizeDirection
    old_budget: int | None
    new_budget: int | None
    plan: ResidencyPlan
    #: Experts the new plan makes resident that the old one did not.
    admit: tuple[GroupKey, ...]
    #: Experts resident under the old plan that the new one pages.
    demote: tuple[GroupKey, ...]


@dataclass(frozen=True)
class ResidencyResizeOutcome:
    """What applying a resize did (or why it was refused)."""

    request: ResidencyResizeRequest
    safe_point: ResizeSafePoint | None
    plan: ResidencyResizePlan | None = None
    rejection: ResizeRejection | None = None
    evicted: tuple[GroupKey, ...] = ()
    admitted: tuple[GroupKey, ...] = ()

    @property
    def applied(self) -> bool:
        return self.plan is not None


def _direction(old: int | None, new: int | None) -> ResizeDirection:
    if old == new:
        return ResizeDirection.UNCHANGED
    if new is None or (old is not None and new > old):
        return ResizeDirection.GROW
    return ResizeDirection.SHRINK


def plan_resize(
    current: ResidencyPlan,
    groups: Iterable[ExpertWeightGroup],
    request: ResidencyResizeRequest,
    policy: ResidencyPolicy | None = None,
) -> ResidencyResizePlan | ResizeRejection:
    """Plan the move from ``current`` to ``request.budget``, or say why it cannot be done."""
    groups = tuple(groups)
    largest = max((g.nbytes for g in groups), default=0)
    budget = request.budget
    if budget is not None and (isinstance(budget, bool) or budget < 0):
        return ResizeRejection(f"a budget must be a byte count >= 0, got {budget!r}", budget, 0)
    if budget is not None and budget < largest:
        return ResizeRejection(
            f"a budget of {budget} bytes cannot hold one expert of {largest} bytes",
            budget,
            largest,
        )
    new = plan_residency(groups, budget, policy)
    old_resident, new_resident = set(current.resident), set(new.resident)
    return ResidencyResizePlan(
        _direction(current.budget, budget),
        current.budget,
        budget,
        new,
        tuple(sorted(new_resident - old_resident)),
        tuple(sorted(old_resident - new_resident)),
    )


# -- paging ----------------------------------------------------------------------------------


class PagedWeight:
    """One expert's slices, copied out of the mapping into memory this process owns."""

    __slots__ = ("arrays", "eviction_class", "group", "last_used", "users")

    def __init__(self, group: ExpertWeightGroup, eviction_class: EvictionClass) -> None:
        self.group = group
        self.eviction_class = eviction_class
        self.last_used = 0
        self.users = 0
        offsets, size = [], 0
        for piece in group.slices:
            offsets.append(size)
            size += -(-piece.region.len // _ALIGN) * _ALIGN
        # Anonymous memory of its own, so eviction gives it back to the system at once.
        raw = np.frombuffer(mmap.mmap(-1, size), np.uint8) if size else np.empty(0, np.uint8)
        arrays: dict[int, np.ndarray] = {}
        for piece, start in zip(group.slices, offsets):
            target = raw[start : start + piece.region.len]
            piece.source.copy_out(piece.region, target)
            array = target.view(piece.dtype).reshape(piece.shape)
            array.flags.writeable = False
            arrays[piece.input_index] = array
        self.arrays = arrays

    @property
    def nbytes(self) -> int:
        return self.group.nbytes


@dataclass(frozen=True)
class AdmissionPolicyInput:
    """What eviction chooses from: bytes to admit, bytes free, and the evictable experts."""

    needed: int
    free: int
    #: ``(key, eviction class, last use tick, bytes)`` of each expert that may be evicted.
    candidates: tuple[tuple[GroupKey, EvictionClass, int, int], ...]


def choose_victims(admission: AdmissionPolicyInput) -> list[GroupKey] | None:
    """Experts to evict to admit ``needed`` bytes: lowest class, then least recently used.

    ``None`` when evicting every candidate would still not make room.
    """
    free = admission.free
    victims: list[GroupKey] = []
    for key, _, _, nbytes in sorted(admission.candidates, key=lambda c: (c[1], c[2], c[0])):
        if free >= admission.needed:
            break
        victims.append(key)
        free += nbytes
    return victims if free >= admission.needed else None


@dataclass(frozen=True)
class RoutedResidencyCoverage:
    """How a proof covered the routed experts."""

    bank: int
    experts: tuple[int, ...]
    hits: tuple[int, ...]
    paged_in: tuple[int, ...]
    evicted: tuple[GroupKey, ...]


class RoutedResidencyProof:
    """Every routed expert is resident and held until the proof is released.

    Use as a context manager; ``weights(e)`` maps each paged input position to
    the expert's array.
    """

    def __init__(
        self,
        manager: ExpertResidencyManager,
        coverage: RoutedResidencyCoverage,
        entries: dict[int, PagedWeight],
    ) -> None:
        self.manager = manager
        self.coverage = coverage
        self._entries = entries

    def weights(self, expert: int) -> Mapping[int, np.ndarray]:
        if self._entries is None:
            raise InvalidArgument("this residency proof was released")
        return self._entries[expert].arrays

    def release(self) -> None:
        if self._entries is not None:
            self.manager._release(self._entries.values())
            self._entries = None  # type: ignore[assignment]

    def __enter__(self) -> RoutedResidencyProof:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class ExpertResidencyManager:
    """Pages experts of one or more banks in and out under one byte budget (thread-safe)."""

    def __init__(self, budget: int | None = None, policy: ResidencyPolicy | None = None) -> None:
        self.policy: ResidencyPolicy = policy or WholeBankResidentPolicy()
        self.governor = MemoryGovernor(budget)
        self._cond = threading.Condition()
        self._banks: dict[int, FinalizedExpertBank] = {}
        self._groups: dict[GroupKey, ExpertWeightGroup] = {}
        self._entries: dict[GroupKey, PagedWeight] = {}
        self._plan = plan_residency((), budget, self.policy)
        self._bank_ids = itertools.count()
        self._tick = itertools.count(1)
        self._pending: ResidencyResizeRequest | None = None
        self.last_resize: ResidencyResizeOutcome | None = None
        self.stats = {"hits": 0, "page_ins": 0, "evictions": 0, "bytes_paged_in": 0}

    @property
    def budget(self) -> int | None:
        return self.governor.budget

    @property
    def plan(self) -> ResidencyPlan:
        return self._plan

    @property
    def resident_bytes(self) -> int:
        return self.governor.used

    def resident_experts(self, bank: FinalizedExpertBank) -> list[int]:
        with self._cond:
            return sorted(e for b, e in self._entries if b == bank.bank)

    # -- banks ---------------------------------------------------------------------------
    def register_bank(self, weights: Mapping[int, Any], num_experts: int) -> FinalizedExpertBank:
        """Add an MoE node's lazy weights; re-plan and preload what the plan keeps resident."""
        with self._cond:
            bank_id = next(self._bank_ids)
            groups = expert_weight_groups(weights, num_experts, bank_id)
            plan = plan_residency([*self._groups.values(), *groups], self.budget, self.policy)
            bank = FinalizedExpertBank(bank_id, num_experts, tuple(groups), tuple(sorted(weights)))
            self._banks[bank_id] = bank
            self._groups.update((g.key, g) for g in groups)
            self._adopt(plan)
            return bank

    def _adopt(self, plan: ResidencyPlan) -> tuple[list[GroupKey], list[GroupKey]]:
        """Make ``plan`` current: reclassify, evict down to budget, preload its residents."""
        self._plan = plan
        for key, entry in self._entries.items():
            entry.eviction_class = plan.classes.get(key, EvictionClass.STREAMED)
        evicted = self._evict_to_fit(0)
        admitted = []
        for key in plan.resident:
            if key in self._entries:
                continue
            group = self._groups[key]
            if not self._make_room(group.nbytes, protect={key}, evicted=evicted):
                continue
            self._page_in(group, plan.classes[key])
            admitted.append(key)
        return evicted, admitted

    # -- proofs --------------------------------------------------------------------------
    def waves(self, bank: FinalizedExpertBank, experts: Iterable[int]) -> list[list[int]]:
        """Split routed experts into groups that each fit the budget at once.

        Experts already resident come first, so they are used before anything
        is evicted to page the others in.
        """
        routed = sorted({int(e) for e in experts})
        budget = self.budget
        if budget is None or not routed:
            return [routed] if routed else []
        with self._cond:
            keys = {(bank.bank, e) for e in routed}
            held = {
                k: entry
                for k, entry in self._entries.items()
                if k not in keys and entry.eviction_class >= EvictionClass.PROFILED
            }
            pinned = sum(
                e.nbytes for e in held.values() if e.eviction_class is EvictionClass.PINNED
            )
            capacity = budget - sum(e.nbytes for e in held.values())
            sizes = {e: self._groups[(bank.bank, e)].nbytes for e in routed}
            if max(sizes.values()) > capacity:
                capacity = budget - pinned
            resident = [e for e in routed if (bank.bank, e) in self._entries]
        order = resident + [e for e in routed if e not in set(resident)]
        waves: list[list[int]] = []
        used = capacity + 1
        for e in order:
            if sizes[e] > capacity:
                raise OutOfMemory(sizes[e], max(capacity, 0))
            if used + sizes[e] > capacity:
                waves.append([])
                used = 0
            waves[-1].append(e)
            used += sizes[e]
        return waves

    def prove(
        self, bank: FinalizedExpertBank, experts: Iterable[int], timeout: float | None = None
    ) -> RoutedResidencyProof:
        """Page in and hold every expert of ``experts`` (see :func:`prove_routed_residency`)."""
        routed = sorted({int(e) for e in experts})
        keys = [(bank.bank, e) for e in routed]
        for key in keys:
            if key not in self._groups:
                raise InvalidArgument(f"expert {key[1]} is not in bank {bank.bank}")
        total = sum(self._groups[k].nbytes for k in keys)
        budget = self.budget
        if budget is not None and total > budget:
            raise OutOfMemory(total, budget)
        with self._cond:
            evicted: list[GroupKey] = []
            while True:
                missing = [k for k in keys if k not in self._entries]
                needed = sum(self._groups[k].nbytes for k in missing)
                if self._make_room(needed, protect=set(keys), evicted=evicted):
                    break
                if not any(e.users for k, e in self._entries.items() if k not in keys):
                    free = self.governor.available or 0
                    raise OutOfMemory(needed, free)
                if not self._cond.wait(timeout):
                    raise OutOfMemory(needed, self.governor.available or 0)
            hits = tuple(k[1] for k in keys if k in self._entries)
            for key in missing:
                self._page_in(self._groups[key], self._plan.classes.get(key))
            tick = next(self._tick)
            entries = {}
            for key in keys:
                entry = self._entries[key]
                entry.users += 1
                entry.last_used = tick
                entries[key[1]] = entry
            self.stats["hits"] += len(hits)
            coverage = RoutedResidencyCoverage(
                bank.bank, tuple(routed), hits, tuple(k[1] for k in missing), tuple(evicted)
            )
            return RoutedResidencyProof(self, coverage, entries)

    def _release(self, entries: Iterable[PagedWeight]) -> None:
        with self._cond:
            for entry in entries:
                entry.users -= 1
            self._cond.notify_all()

    def _make_room(self, needed: int, protect: set[GroupKey], evicted: list[GroupKey]) -> bool:
        """Evict (class, then LRU) until ``needed`` more bytes fit; False if it cannot."""
        budget = self.budget
        if budget is None:
            return True
        free = budget - self.governor.used
        if needed <= free:
            return True
        candidates = tuple(
            (k, e.eviction_class, e.last_used, e.nbytes)
            for k, e in self._entries.items()
            if k not in protect and not e.users and e.eviction_class < EvictionClass.PINNED
        )
        victims = choose_victims(AdmissionPolicyInput(needed, free, candidates))
        if victims is None:
            return False
        for key in victims:
            self._evict(key)
            evicted.append(key)
        return True

    def _evict_to_fit(self, needed: int) -> list[GroupKey]:
        """After a budget cut: evict idle experts (any class) until usage fits again."""
        evicted: list[GroupKey] = []
        budget = self.budget
        if budget is None:
            return evicted
        idle = sorted(
            (e.eviction_class, e.last_used, k) for k, e in self._entries.items() if not e.users
        )
        for _, _, key in idle:
            if self.governor.used + needed <= budget:
                break
            self._evict(key)
            evicted.append(key)
        return evicted

    def _page_in(self, group: ExpertWeightGroup, eviction_class: EvictionClass | None) -> None:
        self.governor.reserve(_site(group.key), group.nbytes)
        try:
            entry = PagedWeight(group, eviction_class or EvictionClass.STREAMED)
        except BaseException:
            self.governor.release(_site(group.key), group.nbytes)
            raise
        self._entries[group.key] = entry
        self.stats["page_ins"] += 1
        self.stats["bytes_paged_in"] += group.nbytes

    def _evict(self, key: GroupKey) -> None:
        entry = self._entries.pop(key)
        self.governor.release(_site(key), entry.nbytes)
        self.stats["evictions"] += 1

    # -- resizing ------------------------------------------------------------------------
    def request_resize(self, request: ResidencyResizeRequest | int | None) -> None:
        """Ask for a new budget, applied at the next safe point (the next compute's start)."""
        if not isinstance(request, ResidencyResizeRequest):
            request = ResidencyResizeRequest(request)
        with self._cond:
            self._pending = request

    def safe_point(
        self, point: ResizeSafePoint = ResizeSafePoint.BETWEEN_RUNS
    ) -> ResidencyResizeOutcome | None:
        """Apply a pending resize if no compute holds experts; its outcome, else ``None``."""
        with self._cond:
            if self._pending is None:
                return None
            if any(e.users for e in self._entries.values()):
                return None
            request, self._pending = self._pending, None
            outcome = self._apply_resize(request, point)
            self.last_resize = outcome
            return outcome

    def resize(self, budget: int | None) -> ResidencyResizeOutcome:
        """Resize now if idle, otherwise at the next safe point (the outcome says which)."""
        self.request_resize(budget)
        outcome = self.safe_point(ResizeSafePoint.IDLE)
        if outcome is None:
            return ResidencyResizeOutcome(ResidencyResizeRequest(budget), None)
        return outcome

    def _apply_resize(
        self, request: ResidencyResizeRequest, point: ResizeSafePoint
    ) -> ResidencyResizeOutcome:
        planned = plan_resize(self._plan, self._groups.values(), request, self.policy)
        if isinstance(planned, ResizeRejection):
            return ResidencyResizeOutcome(request, point, rejection=planned)
        self.governor.set_budget(request.budget)
        evicted, admitted = self._adopt(planned.plan)
        return ResidencyResizeOutcome(
            request, point, planned, evicted=tuple(evicted), admitted=tuple(admitted)
        )

    def __repr__(self) -> str:
        return (
            f"ExpertResidencyManager({len(self._entries)}/{len(self._groups)} experts resident, "
            f"{self.governor})"
        )


def _site(key: GroupKey) -> str:
    return f"expert:{key[0]}:{key[1]}"


def prove_routed_residency(
    manager: ExpertResidencyManager,
    bank: FinalizedExpertBank,
    experts: Iterable[int],
    timeout: float | None = None,
) -> RoutedResidencyProof:
    """Make every routed expert resident within the budget and hold it for one compute.

    Missing experts are paged in, evicting idle experts by class then least
    recently used; when others are held by concurrent computes, it waits for
    them. Experts that together exceed the budget raise
    :class:`~nxrt.errors.OutOfMemory`: split them with
    :meth:`ExpertResidencyManager.waves` first.
    """
    return manager.prove(bank, experts, timeout)


__all__ = [
    "AdmissionPolicyInput",
    "EvictionClass",
    "ExpertResidencyManager",
    "ExpertSlice",
    "ExpertWeightGroup",
    "FinalizedExpertBank",
    "GroupKey",
    "PagedWeight",
    "ResidencyDecision",
    "ResidencyDegradationReason",
    "ResidencyPlan",
    "ResidencyPolicy",
    "ResidencyPolicyInput",
    "ResidencyResizeOutcome",
    "ResidencyResizePlan",
    "ResidencyResizeRequest",
    "ResizeDirection",
    "ResizeRejection",
    "ResizeSafePoint",
    "RoutedResidencyCoverage",
    "RoutedResidencyProof",
    "StaticProfileResidencyPolicy",
    "WholeBankReason",
    "WholeBankResidentPolicy",
    "choose_victims",
    "expert_weight_groups",
    "plan_residency",
    "plan_resize",
    "prove_routed_residency",
]
