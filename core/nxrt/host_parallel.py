"""The session's own thread pool, lent to a kernel for one compute call.

Intra-op parallelism without oversubscription and without changing results.
BLAS's own threads are never used while a session runs: a session that
computes on host BLAS holds it at one thread for its whole life
(:meth:`HostParallel.hold_blas`), and a kernel that wants a parallel GEMM
splits it itself into a number of parts fixed when the kernel is created.
BLAS libraries split a product by their thread count (OpenBLAS's matrix-vector
product sums along its depth in one part per thread) and a per-run count would
make a session's outputs depend on how busy the machine was. Each run only
chooses how many of the session's threads take the fixed parts
(:attr:`HostParallel.active_threads`), which never changes what they compute.

The BLAS setting is process-wide, so every cap goes through one lock-protected
governor that applies the smallest active cap and restores the original thread
counts when the last cap ends.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

from nxrt.errors import InvalidArgument

T = TypeVar("T")
R = TypeVar("R")

_worker = threading.local()


class _BlasGovernor:
    """Process-wide BLAS thread caps: the smallest active cap wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._caps: collections.Counter[int] = collections.Counter()
        self._libraries: list[Any] | None = None
        self._modules_seen = 0
        self._original: list[tuple[Any, int]] = []
        self._current: dict[int, int] = {}  # id(library) -> the thread count last set

    def _blas_libraries(self) -> list[Any]:
        """The BLAS libraries loaded in the process, rescanned after new imports.

        A scan costs about 0.3 ms, too much per run; libraries arrive with
        imports (an EP loading its backend), so the module count says when to
        look again.
        """
        if self._libraries is None or self._modules_seen != len(sys.modules):
            from threadpoolctl import ThreadpoolController

            self._modules_seen = len(sys.modules)
            self._libraries = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        return self._libraries

    def _apply(self) -> None:
        if not self._caps:
            for library, threads in self._original:
                self._set_threads(library, threads)
            self._original = []
            return
        if not self._original:
            self._original = [(lib, lib.num_threads) for lib in self._blas_libraries()]
            self._current = {id(lib): threads for lib, threads in self._original}
        cap = min(self._caps)
        for library, threads in self._original:
            self._set_threads(library, max(1, min(cap, threads)))

    def _set_threads(self, library: Any, threads: int) -> None:
        """Set a BLAS library's thread count when it differs from the one last set: most caps
        change nothing, and each query or call is a round trip into the library."""
        if self._current.get(id(library)) != threads:
            library.set_num_threads(threads)
            self._current[id(library)] = threads

    def reassert(self) -> None:
        """Set again any library whose thread count was changed behind the governor's back
        (``threadpoolctl.threadpool_limits`` around a session's runs, say): about 1 us."""
        with self._lock:
            for library, _ in self._original:
                wanted = self._current.get(id(library))
                if wanted is not None and library.num_threads != wanted:
                    library.set_num_threads(wanted)

    def acquire(self, threads: int) -> None:
        """Add a cap of ``threads``; :meth:`release` removes it."""
        with self._lock:
            self._caps[threads] += 1
            self._apply()

    def release(self, threads: int) -> None:
        with self._lock:
            self._caps[threads] -= 1
            if not self._caps[threads]:
                del self._caps[threads]
            self._apply()

    @contextmanager
    def cap(self, threads: int) -> Iterator[None]:
        self.acquire(threads)
        try:
            yield
        finally:
            self.release(threads)


_governor = _BlasGovernor()


class _CapChooser:
    """Picks, per run, the thread count (``threads`` or 1) that has been faster.

    Keeps the last few run times of each count. Runs use ``threads`` until the
    other count is known to be faster; every ``explore``-th run tries the
    other, so that a change in the machine's load is noticed (trying both
    first cost a slow program's first runs: three of ResNet-50's first six ran
    on one thread). Counts are
    compared by their fastest kept run: a run slowed by something passing (another
    runtime's threads still spinning) does not tip the choice, where a core held by
    another process slows every run of the larger count. A count's
    first run is not kept: it pays what happens once (kernels loaded or
    compiled on first use, memory first touched), which would otherwise make
    whichever count ran first look slower.
    """

    def __init__(self, threads: int, keep: int = 5, explore: int = 16) -> None:
        self.counts = (max(1, threads), 1)
        self.times: dict[int, collections.deque[float]] = {
            count: collections.deque(maxlen=keep) for count in self.counts
        }
        self.explore = explore
        self.runs = 0
        self.best = self.counts[0]  # the faster count: ``threads`` until measured otherwise
        self._started: set[int] = set()  # counts whose first run has been dropped
        self._lock = threading.Lock()

    def choose(self) -> int:
        with self._lock:
            self.runs += 1
            best = self.best
            if self.runs % self.explore == 0:
                return self.counts[1] if best == self.counts[0] else self.counts[0]
            return best

    def record(self, count: int, seconds: float) -> None:
        with self._lock:
            if count not in self._started:
                self._started.add(count)
                return
            self.times[count].append(seconds)
            if len(self.times[count]) >= 2 and all(len(t) >= 2 for t in self.times.values()):
                self.best = min(self.counts, key=lambda c: min(self.times[c]))


def _in_worker() -> bool:
    return getattr(_worker, "active", False)


def _mark_worker() -> None:
    _worker.active = True


class HostParallel:
    """A fixed-size thread pool for intra-op work; threads start on first parallel use.

    ``threads`` of ``None`` or ``0`` means one per CPU core. Calls from inside a
    pool thread run inline, so nested ``map`` never deadlocks or oversubscribes.
    """

    def __init__(self, threads: int | None = None) -> None:
        if threads is None or threads == 0:
            threads = os.cpu_count() or 1
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise InvalidArgument(f"threads must be a non-negative integer, got {threads!r}")
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._busy = 0
        self._closed = False
        self._held = False
        #: The threads a kernel may split over in the current run (see :meth:`_choose_team`).
        self.active_threads = threads
        self._chooser = _CapChooser(threads)

    @property
    def threads(self) -> int:
        return self._threads

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("HostParallel is closed; create a new one")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self._threads,
                    thread_name_prefix="nxrt-host",
                    initializer=_mark_worker,
                )
            return self._executor

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(item) for item in items]``, run across the pool and the calling thread
        (which takes the first item); results keep item order.

        The first exception (in item order) is raised here once the started
        calls have finished; calls not yet started are cancelled.
        """
        items = list(items)
        if self._threads == 1 or len(items) <= 1 or _in_worker():
            if self._closed:
                raise RuntimeError("HostParallel is closed; create a new one")
            return [fn(item) for item in items]
        pool = self._pool()
        with self._lock:
            self._busy += 1
        try:
            with _governor.cap(1):
                futures: list[Future[R]] = [pool.submit(fn, item) for item in items[1:]]
                # the calling thread takes the first item: it is awake now, where a pool
                # thread may start milliseconds later on a busy machine
                first: list[R] = []
                error: BaseException | None = None
                _worker.active = True
                try:
                    first.append(fn(items[0]))
                except BaseException as exc:  # noqa: BLE001 - raised below, in item order
                    error = exc
                    for future in futures:
                        future.cancel()
                finally:
                    _worker.active = False
                _, pending = wait(futures, return_when=FIRST_EXCEPTION)
                if pending:
                    for future in pending:
                        future.cancel()
                    wait(pending)
                if error is not None:
                    raise error
                for future in futures:
                    failed = None if future.cancelled() else future.exception()
                    if failed is not None:
                        raise failed
                return [*first, *(future.result() for future in futures)]
        finally:
            with self._lock:
                self._busy -= 1

    def split(self, n: int, parts: int | None = None) -> list[range]:
        """``range(n)`` cut into at most ``parts`` contiguous, near-equal, non-empty chunks."""
        if n < 0:
            raise InvalidArgument(f"cannot split a negative count {n}")
        parts = self._threads if parts is None else parts
        if parts < 1:
            raise InvalidArgument(f"parts must be >= 1, got {parts}")
        parts = min(parts, n)
        if parts == 0:
            return []
        size, extra = divmod(n, parts)
        chunks = []
        start = 0
        for index in range(parts):
            stop = start + size + (1 if index < extra else 0)
            chunks.append(range(start, stop))
            start = stop
        return chunks

    @contextmanager
    def blas_limits(self) -> Iterator[int]:
        """BLAS held at one thread for a compute section; yields the cap (1).

        One thread always: a product's result must not depend on the count
        (see the module's docstring)."""
        with _governor.cap(1):
            yield 1

    @contextmanager
    def run_limits(self) -> Iterator[int]:
        """One session run: BLAS at one thread, and :attr:`active_threads` set to
        ``threads`` or 1, whichever the last few runs of each did faster (every 16th
        run tries the other count again); yields the BLAS cap (1).

        The pool's threads wait for each other, which pays on idle cores but
        collapses when another process holds one of them (measured here:
        ResNet-50 2-5x slower than on one thread). A concurrent run, or one
        from inside the pool, takes one thread. Kernels split into parts fixed
        at their creation, so the count chosen never changes a result.
        """
        with contextlib.nullcontext() if self._held else _governor.cap(1):
            if self._threads == 1 or self._busy or _in_worker():
                yield 1
                return
            # BLAS's threads must not run beside the pool's: the two spinning on the same
            # cores cost 5-30x, so a count someone else raised is put back first
            _governor.reassert()
            count = self._chooser.choose()
            self.active_threads = count
            start = time.perf_counter()
            try:
                yield 1
            finally:
                self.active_threads = self._threads
            self._chooser.record(count, time.perf_counter() - start)

    def hold_blas(self) -> None:
        """Hold BLAS at one thread until :meth:`release_blas` (or :meth:`close`): a session
        sets its cap once, when it is created, so its runs set nothing. Caps are
        process-wide; the last one to end gives BLAS its own thread counts back."""
        with self._lock:
            if self._held:
                return
            self._held = True
        _governor.acquire(1)

    def release_blas(self) -> None:
        """End :meth:`hold_blas`'s cap."""
        with self._lock:
            if not self._held:
                return
            self._held = False
        _governor.release(1)

    def close(self) -> None:
        """Stop the pool's threads, waiting for running work."""
        self.release_blas()
        with self._lock:
            executor, self._executor = self._executor, None
            self._closed = True
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> HostParallel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "started" if self._executor else "idle"
        return f"HostParallel(threads={self._threads}, {state})"


__all__ = ["HostParallel"]
