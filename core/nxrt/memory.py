"""The memory governor: a byte budget, with every reservation accounted by site.

Whoever holds memory on a device under a limit (paged-in experts, caches)
reserves it here first, so going over the limit is an :class:`OutOfMemory`
naming the request and what was left, rather than the machine swapping.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

from nxrt.errors import InvalidArgument, OutOfMemory


class MemoryGovernor:
    """A byte budget (``None``: unlimited) and the bytes reserved against it, per site."""

    def __init__(self, budget: int | None = None, device: str = "cpu") -> None:
        self.device = device
        self._budget = _check_budget(budget)
        self._sites: Counter[str] = Counter()
        self._used = 0
        self._peak = 0
        self._lock = threading.Lock()

    @property
    def budget(self) -> int | None:
        return self._budget

    @property
    def used(self) -> int:
        return self._used

    @property
    def peak(self) -> int:
        """The most bytes ever reserved at once."""
        return self._peak

    @property
    def available(self) -> int | None:
        """Bytes left under the budget (``None`` when unlimited)."""
        with self._lock:
            return None if self._budget is None else max(self._budget - self._used, 0)

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more could be reserved now."""
        with self._lock:
            return self._budget is None or self._used + nbytes <= self._budget

    def check(self, nbytes: int) -> None:
        """Refuse a request that could never fit, even with nothing else reserved."""
        if self._budget is not None and nbytes > self._budget:
            raise OutOfMemory(nbytes, self._budget)

    def reserve(self, site: str, nbytes: int) -> None:
        """Account ``nbytes`` to ``site``; :class:`OutOfMemory` when it does not fit."""
        if nbytes < 0:
            raise InvalidArgument(f"cannot reserve {nbytes} bytes")
        with self._lock:
            if self._budget is not None and self._used + nbytes > self._budget:
                raise OutOfMemory(nbytes, max(self._budget - self._used, 0))
            self._sites[site] += nbytes
            self._used += nbytes
            self._peak = max(self._peak, self._used)

    def release(self, site: str, nbytes: int) -> None:
        with self._lock:
            held = self._sites.get(site, 0)
            if nbytes > held:
                raise InvalidArgument(f"site {site!r} releases {nbytes} bytes but holds {held}")
            self._sites[site] -= nbytes
            if not self._sites[site]:
                del self._sites[site]
            self._used -= nbytes

    def set_budget(self, budget: int | None) -> None:
        """A new budget; reservations above it stay until released (the caller evicts)."""
        with self._lock:
            self._budget = _check_budget(budget)

    def usage_by_site(self) -> dict[str, int]:
        with self._lock:
            return dict(self._sites)

    def __repr__(self) -> str:
        limit = "unlimited" if self._budget is None else f"{self._budget} bytes"
        return f"MemoryGovernor({self.device}: {self._used} bytes used of {limit})"


def _check_budget(budget: int | None) -> int | None:
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise InvalidArgument(f"a memory budget must be a byte count >= 0, got {budget!r}")
    return budget


def parse_bytes(value: int | str | None) -> int | None:
    """A byte count from an option value: ``123``, ``"64MB"``, ``"1.5GiB"``; ``None`` passes."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise InvalidArgument(f"expected a byte count, got {value!r}")
    if isinstance(value, int):
        return _check_budget(value)
    text = str(value).strip().lower().replace(" ", "")
    units = {
        "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
        "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
        "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "b": 1,
    }  # fmt: skip
    factor = 1
    for suffix, size in units.items():
        if text.endswith(suffix):
            text, factor = text[: -len(suffix)], size
            break
    try:
        number = float(text)
    except ValueError:
        raise InvalidArgument(
            f"expected a byte count such as 268435456, '256MiB' or '1.5GB', got {value!r}"
        ) from None
    if number < 0 or number != number:
        raise InvalidArgument(f"a byte count must be >= 0, got {value!r}")
    return int(number * factor)


def available_memory() -> int | None:
    """Bytes the machine can still hand out without swapping (``None``: unknown).

    Linux's ``MemAvailable`` (free memory plus what the kernel can reclaim),
    else the free physical pages ``sysconf`` reports.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_allocation(nbytes: int, budget: int | None = None) -> None:
    """Raise :class:`OutOfMemory` *before* allocating ``nbytes`` that cannot fit.

    A kernel calls this with its workspace size and its session's memory
    budget (an EP's ``memory_limit``, ``None`` when unlimited). The request
    must fit both the budget and the machine's available memory, so an
    oversized input ends in a typed error naming both numbers instead of
    numpy's ``MemoryError`` or the kernel's OOM killer.
    """
    limits = [b for b in (budget, available_memory()) if b is not None]
    if limits and nbytes > min(limits):
        raise OutOfMemory(nbytes, min(limits))


#: Arrays smaller than this are not checked by :func:`check_elements`: nothing that small can
#: exhaust a machine, and reading its free memory costs more than allocating them.
CHECK_FROM = 64 << 20


def check_elements(count: int, itemsize: int, budget: int | None = None) -> None:
    """:func:`check_allocation` for an array of ``count`` elements of ``itemsize`` bytes,
    for kernels whose output size comes from an input's values (ConstantOfShape, Expand,
    Tile, Range, OneHot); small arrays skip the check."""
    nbytes = int(count) * int(itemsize)
    if nbytes >= CHECK_FROM or (budget is not None and nbytes > budget):
        check_allocation(nbytes, budget)


__all__ = [
    "CHECK_FROM",
    "MemoryGovernor",
    "available_memory",
    "check_allocation",
    "check_elements",
    "parse_bytes",
]


class Workspace:
    """Scratch buffers an EP's kernels borrow for one call and give back, reused across runs.

    Keys say what a buffer is (shape, dtype, layout); concurrent runs simply
    get more buffers, since a taken buffer belongs to one call until it is
    given back. Conv's zero-bordered inputs, for one, pay for their zero
    padding once instead of on every run.
    """

    def __init__(self) -> None:
        self._free: dict[Hashable, list[Any]] = {}

    def take(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """A free buffer for ``key``, or a new one from ``make()``."""
        free = self._free.get(key)
        if free:
            try:
                return free.pop()
            except IndexError:
                pass  # another thread took the last one
        return make()

    def give(self, key: Hashable, buffer: Any) -> None:
        """Return a buffer taken for ``key``."""
        self._free.setdefault(key, []).append(buffer)
