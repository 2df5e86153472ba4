"""Every compiled kernel of the cpu EP goes through :func:`compiled_kernel`: no compile wall.

numba compiles a kernel's loops in seconds each, so a model's first session
used to wait most of a minute before its first answer. Here a node's kernel
comes in two tiers, built by two functions the op family hands over:

* tier 0, the numpy kernel (the reference every compiled kernel is tested
  against), which imports no numba and runs at once;
* tier 1, the compiled kernel, built (numba compiling its loops, or loading
  them from the disk cache) on the process's one background thread, then run
  once on stand-in inputs of the shapes the node's first run had (the
  graph's, before a run) so that loops compiled on first call, such as the
  split variants of a large batch, are compiled too; the node then switches
  to it. Only the kernels (and variants) the model uses are compiled.

At exit the builds not started are dropped and the one in progress is
waited for (one kernel's compile at most, and cached): numba cannot be
stopped midway safely (an exception raised into its thread can land in one
of LLVM's callbacks, which swallow it, and the interpreter then finalizes
under a running compile).

The session config entry (or cpu EP option) ``nxrt.cpu.compile`` chooses:

* ``background`` (the default): tiered as above. A node's outputs are the
  same within the cpu EP's tolerance before and after the switch, but not
  bit for bit: call ``session.wait_for_compiled()`` (or
  :func:`wait_for_compiled`) before comparing runs bit for bit;
* ``wait``: every compiled kernel is built, its loops compiled or loaded,
  before the session is returned; runs are bit-identical from the first.

``NXRT_CPU_COMPILE`` sets the default for sessions that set neither.

What is already compiled is used from the first run, so a warm cache gives
bit-identical runs from the first in either mode. A kernel this process built
before is built at creation (its loops are in memory). A kernel whose marker
is in the compile cache (written there once its loops were compiled into
numba's cache, :func:`cache_folder`) is loaded on the background thread,
ahead of any compile, while creation returns at once: loading starts numba
in the process (its import, its target's registries, the first loads: about
half a second that a fresh process cannot skip), and creation need not wait
for that. Such a node's first call waits for its load instead of running the
numpy tier. The cache folder is keyed by the nxrt-ep-cpu and numba versions
and a digest of the compiled sources, not by where they are installed, so
every checkout and virtual environment of one version shares it; each marker
also names the CPU (numba's index keys the code by it too).

This module imports no numba: only the background thread, building tier 1,
does.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import hashlib
import importlib.metadata
import logging
import os
import platform
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.errors import InvalidArgument
from nxrt.kernel import Kernel

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.provider import ExecutionProvider

#: Session config entry, and cpu EP option, that chooses how compiled kernels start.
MODE_OPTION = "nxrt.cpu.compile"
#: Environment variable giving the default of :data:`MODE_OPTION`.
MODE_ENV = "NXRT_CPU_COMPILE"
#: Tiered: the numpy kernel at once, the compiled one once built in the background.
BACKGROUND = "background"
#: Every compiled kernel built before the session is returned.
WAIT = "wait"
MODES = (BACKGROUND, WAIT)
#: Stand-in inputs above this many values keep only one item of their first axis.
_EXAMPLE_VALUES = 1 << 24
#: The size a stand-in gives unknown dimensions in its second run (a batch's, large
#: enough that the kernels take their split variants).
_LARGE = 64

_log = logging.getLogger(__name__)
_PACKAGE = Path(__file__).resolve().parent


# -- where compiled code is cached -----------------------------------------------------------------


def _digest(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def source_digest() -> str:
    """A digest of the compiled loops' shared sources (every module of ``jit/``, which
    the kernels inline from one another): part of the cache folder's name."""
    return _source_digest()


@functools.cache
def _source_digest() -> str:
    return _digest(sorted((_PACKAGE / "jit").glob("*.py")))


def cache_root() -> str:
    """``NUMBA_CACHE_DIR`` when set, else ``platformdirs.user_cache_dir("nxrt")/numba``."""
    root = os.environ.get("NUMBA_CACHE_DIR")
    if root:
        return root
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("nxrt"), "numba")


def cache_folder() -> str:
    """The folder of this version's compiled code: one per nxrt-ep-cpu version, numba
    version and digest of the compiled sources, shared by every checkout and venv."""
    return os.path.join(cache_root(), _version_tag())


@functools.cache
def _version_tag() -> str:
    from nxrt_ep_cpu import __version__

    try:
        numba_version = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        numba_version = "none"
    return f"cpu-{__version__}-numba-{numba_version}-{source_digest()[:16]}"


def cpu_tag() -> str:
    """What names this machine's CPU as numba compiles for it (its model and flags, and
    the ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` overrides): a marker is valid only on
    the CPU its code was compiled for."""
    return _cpu_tag(os.environ.get("NUMBA_CPU_NAME", ""), os.environ.get("NUMBA_CPU_FEATURES", ""))


@functools.cache
def _cpu_tag(name: str, features: str) -> str:
    parts = [platform.machine(), name, features]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    parts.append(line.strip())
                elif not line.strip() and len(parts) > 3:
                    break  # the first processor says it for all of them
    except OSError:
        parts.append(platform.processor())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _marker(key: str) -> str:
    return os.path.join(cache_folder(), "kernels", cpu_tag(), key)


def _cached(key: str) -> bool:
    return os.path.exists(_marker(key))


def _mark(key: str) -> None:
    """Record that the compiled code of ``key`` is in numba's cache (an empty file: made
    atomically, so concurrent writers need no lock)."""
    path = _marker(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as exc:  # a read-only cache: the next process compiles again
        _log.debug("cannot write %s: %s", path, exc)


# -- the mode --------------------------------------------------------------------------------------


def compile_mode(ep: ExecutionProvider) -> str:
    """``nxrt.cpu.compile`` for ``ep``: its EP option, else the session config entry, else
    ``NXRT_CPU_COMPILE``, else ``background``."""
    config = ep.config
    value = (
        config.options.get(MODE_OPTION)
        or config.session_config.get(MODE_OPTION)
        or os.environ.get(MODE_ENV)
        or BACKGROUND
    )
    value = str(value)
    if value not in MODES:
        raise InvalidArgument(f"{MODE_OPTION} must be one of {', '.join(MODES)}, got {value!r}")
    return value


# -- the two tiers ---------------------------------------------------------------------------------


class TieredKernel(Kernel):
    """The numpy kernel until the compiled one is built, then the compiled one.

    The executor holds :attr:`direct_call`, a function that calls whichever
    tier is current; the switch is one attribute assignment, so a call takes
    one tier or the other, never a mixture. The first call records its inputs'
    shapes and types (:attr:`seen`): the compiled kernel is run on stand-ins of
    those before it takes over, so that what it compiles on a first call at
    those shapes (the split variants of a large batch) is compiled then, not in
    a run.
    """

    def __init__(self, reference: Kernel, *, loading: bool = False) -> None:
        self._kernel = reference
        #: The compiled code is in the cache, being loaded: the first call waits for it
        #: rather than run the numpy tier, so runs are bit-identical from the first.
        self.loading = loading
        self._reference_call = reference.direct_call
        self._call: Callable[..., Any] = self._record
        self.view_output = reference.view_output
        #: 0 while the numpy kernel runs, 1 once the compiled one does.
        self.tier = 0
        #: Why the compiled kernel could not be built (the node then stays on tier 0).
        self.error: BaseException | None = None
        #: Shape, dtype and writeability of each input of the first call (None before).
        self.seen: list[tuple[tuple[int, ...], np.dtype, bool] | None] | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()

    @property
    def kernel(self) -> Kernel:
        """The kernel of the current tier."""
        return self._kernel

    @property
    def variant(self) -> str:  # type: ignore[override]
        return self._kernel.variant

    @property
    def variant_reason(self) -> str:  # type: ignore[override]
        reason = self._kernel.variant_reason
        if self.tier:
            return reason
        doing = "loading from the cache" if self.loading else "compiling"
        why = doing if self.error is None else f"{doing} failed: {self.error!r}"
        return f"{reason} (numpy tier, {why})".lstrip()

    @property
    def direct_call(self) -> Callable[..., Any]:
        return self._run

    def _run(self, *inputs: Any) -> Any:
        return self._call(*inputs)

    def _record(self, *inputs: Any) -> Any:
        """The first call on tier 0: note its inputs, then stop noting (a kernel whose
        code is loading from the cache waits for it first)."""
        if self.loading:
            self._done.wait()
        with self._lock:
            if self.seen is None:
                self.seen = [
                    (x.shape, x.dtype, bool(x.flags.writeable))
                    if isinstance(x, np.ndarray)
                    else None
                    for x in inputs
                ]
            if self.tier == 0:
                self._call = self._reference_call
            call = self._call
        return call(*inputs)

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        return self._kernel.compute(inputs)

    def translate_error(self, exc: BaseException) -> BaseException:
        return self._kernel.translate_error(exc)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the compiled kernel is built (or failed); whether it was."""
        return self._done.wait(timeout)

    def _promote(self, fast: Kernel) -> None:
        with self._lock:
            self._kernel = fast
            self._call = fast.direct_call
            self.tier = 1
            self._reference_call = None  # type: ignore[assignment]  # freed with its kernel
        self._done.set()

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self._done.set()

    def __repr__(self) -> str:
        return f"TieredKernel(tier {self.tier}: {self._kernel!r})"


class Compiles:
    """The background builds one EP (one session) started, for ``wait_for_compiled``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._pending: list[TieredKernel] = []
        self._lock = threading.Lock()

    def add(self, kernel: TieredKernel) -> None:
        with self._lock:
            self._pending.append(kernel)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every background build has finished; False when ``timeout`` (s)
        ran out first."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            pending = list(self._pending)
        for kernel in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not kernel.wait(left):
                return False
        with self._lock:
            self._pending = [k for k in self._pending if not k._done.is_set()]
        return True

    def cancel(self) -> None:
        """Drop the builds not yet started: their kernels keep the numpy tier."""
        with self._lock:
            pending, self._pending = self._pending, []
        _worker.drop(pending)


_compiles: weakref.WeakKeyDictionary[Any, Compiles] = weakref.WeakKeyDictionary()
_compiles_lock = threading.Lock()


def compiles_of(ep: ExecutionProvider) -> Compiles:
    """The builds ``ep`` started (its compile mode read once, from its config)."""
    with _compiles_lock:
        found = _compiles.get(ep)
        if found is None:
            found = _compiles[ep] = Compiles(compile_mode(ep))
        return found


#: Keys whose compiled kernel this process has built: their loops are in memory.
_built: set[str] = set()
#: Compiled kernels made so far, by how: ``compiled`` (loops compiled, or loaded without a
#: marker, at creation), ``cached`` (marker found), ``memory`` (built before in this
#: process), ``background`` (tiered).
counts: collections.Counter[str] = collections.Counter()


def compiled_kernel(
    ep: ExecutionProvider,
    node: ir.Node,
    fast: Callable[[], Kernel],
    reference: Callable[[], Kernel],
    *,
    key: Hashable | None = None,
) -> Kernel:
    """The kernel of ``node`` whose fast tier is compiled: the one helper every compiled
    kernel of the cpu EP goes through.

    :param fast: Builds the compiled kernel; it may import numba and compile (or load)
        its loops while it builds. Called on the background thread, or here.
    :param reference: Builds the numpy kernel with the same results (within the cpu
        EP's tolerance): tier 0. It must not import numba.
    :param key: What decides which loops ``fast`` compiles (default: the node's op,
        attributes, input types and shapes, and the session's threads); kernels with
        one key share their compiled code, and its marker in the compile cache.
    :returns: ``fast()`` when this process built its code before or the mode is
        ``wait``; else a :class:`TieredKernel` on ``reference()`` that switches to
        ``fast()`` once it is built in the background (or, when its code is in the disk
        cache, loaded there, its first call waiting for that).
    """
    name = node_key(ep, node, fast) if key is None else _hash(("key", key))
    compiles = compiles_of(ep)
    how = "memory" if name in _built else "cached" if _cached(name) else ""
    if how == "memory" or compiles.mode == WAIT:
        kernel = fast()
        if not how:
            _warm(kernel, node)
            _mark(name)
        _built.add(name)
        counts[how or "compiled"] += 1
        return kernel
    loading = how == "cached"
    tiered = TieredKernel(reference(), loading=loading)
    compiles.add(tiered)
    counts["cached" if loading else "background"] += 1

    def build() -> None:
        try:
            kernel = fast()
            seen = tiered.seen
            _warm(kernel, node, seen, large=not loading)
            if seen is None and tiered.seen is not None:  # a run came meanwhile: its shapes
                _warm(kernel, node, tiered.seen)
        except BaseException as exc:  # noqa: BLE001 - the node keeps its numpy kernel
            _log.warning("cpu EP: node %r keeps its numpy kernel: %r", node.name, exc)
            tiered._fail(exc)
            return
        if not loading:
            _mark(name)
        _built.add(name)
        tiered._promote(kernel)

    _worker.submit(build, tiered, first=loading)
    return tiered


def node_key(ep: ExecutionProvider, node: ir.Node, recipe: Any = None) -> str:
    """The default key of :func:`compiled_kernel`: what a node's compiled kernel depends on."""
    threads = ep.parallel.threads if ep.parallel is not None else 1
    parts: list[Any] = [getattr(recipe, "__qualname__", repr(recipe)), node.domain, node.op_type]
    parts += [threads, len(node.outputs)]
    for attr_name, attr in sorted(node.attributes.items()):
        parts.append((attr_name, repr(attr.value)))
    for value in node.inputs:
        if value is None:
            parts.append(None)
            continue
        shape = None if value.shape is None else tuple(str(d) for d in value.shape)
        parts.append((str(value.dtype), shape, value.const_value is not None))
    return _hash(tuple(parts))


def _hash(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:32]


# -- stand-in inputs -------------------------------------------------------------------------------


def example_inputs(
    node: ir.Node, seen: Sequence[Any] | None = None, unknown: int = 1
) -> list[Any] | None:
    """Inputs of ``node``'s types and shapes, as a run passes them: the constants
    themselves (read-only, as the plan holds them), ones elsewhere, of the shapes and
    types a run gave (``seen``, from :attr:`TieredKernel.seen`) or else of the graph's
    (each unknown dimension ``unknown``); a large first axis is cut to 1. ``None``
    where a type cannot be made up."""
    inputs: list[Any] = []
    for index, value in enumerate(node.inputs):
        if value is None:
            inputs.append(None)
            continue
        given = seen[index] if seen is not None and index < len(seen) else None
        if value.const_value is not None and not value.is_graph_input():
            try:
                array = value.const_value.numpy()
            except Exception:  # noqa: BLE001 - lazy weights and such: no stand-in
                return None
            if not isinstance(array, np.ndarray):
                return None
            array = array.view()
            array.flags.writeable = False
            inputs.append(array)
            continue
        if given is not None:
            shape, dtype, writeable = list(given[0]), given[1], given[2]
            if dtype.kind not in "biuf":
                return None
            if shape and int(np.prod(shape)) > _EXAMPLE_VALUES:
                shape[0] = 1
            array = np.ones(shape, dtype)
            array.flags.writeable = writeable
            inputs.append(array)
            continue
        if value.shape is None or value.dtype is None:
            return None
        try:
            dtype = np.dtype(value.dtype.numpy())
        except Exception:  # noqa: BLE001 - strings, sequences, maps: no stand-in
            return None
        if dtype.kind not in "biuf":
            return None
        shape = [d if isinstance(d, int) else unknown for d in value.shape]
        if shape and int(np.prod(shape)) > _EXAMPLE_VALUES:
            shape[0] = 1
        inputs.append(np.ones(shape, dtype))
    return inputs


def _warm(
    kernel: Kernel, node: ir.Node, seen: Sequence[Any] | None = None, *, large: bool = True
) -> None:
    """Run ``kernel`` on stand-in inputs (:func:`example_inputs`), so that loops compiled
    (or loaded) on their first call are compiled now: at the shapes a run gave, else at
    the graph's, its unknown dimensions at 1 and, as a batch would be and unless not
    ``large``, at :data:`_LARGE` (the split variants); a failure is only logged (a run
    then compiles what it needs)."""
    sizes = [1]
    if (
        large
        and seen is None
        and any(
            v is not None and v.shape is not None and not all(isinstance(d, int) for d in v.shape)
            for v in node.inputs
        )
    ):
        sizes.append(_LARGE)
    for unknown in sizes:
        inputs = example_inputs(node, seen, unknown)
        if inputs is None:
            return
        try:
            kernel.direct_call(*inputs)
        except Exception as exc:  # noqa: BLE001 - stand-ins a kernel refuses
            _log.debug("cpu EP: stand-in run of %r failed: %r", node.name, exc)


# -- the background thread -------------------------------------------------------------------------


#: Seconds exit waits at most for the compiling thread to stop.
_EXIT_WAIT_S = 30.0


class _Worker:
    """The process's one compiling thread: numba compiles under one global lock anyway.

    A daemon thread; at exit it finishes the build in progress (:meth:`stop`) and
    drops the rest. In a process forked while it was
    building, numba's compiler lock may be held by a thread the child does not
    have: there every build fails at once and its nodes keep their numpy kernels.
    """

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[Callable[[], None], TieredKernel]] = (
            collections.deque()
        )
        #: Loads from the cache, served before any compile: a first run waits for them.
        self._loads: collections.deque[tuple[Callable[[], None], TieredKernel]] = (
            collections.deque()
        )
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._current: TieredKernel | None = None
        self._busy = 0
        self._closed = ""
        #: Holds in force (:meth:`held`): no compile starts while one is; loads still do.
        self._held = 0

    def submit(self, job: Callable[[], None], kernel: TieredKernel, first: bool = False) -> None:
        """Queue ``job`` (building ``kernel``); ``first`` jobs go before every compile."""
        with self._cv:
            if self._closed:
                kernel._fail(RuntimeError(self._closed))
                return
            (self._loads if first else self._queue).append((job, kernel))
            self._busy += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="nxrt-cpu-compile", daemon=True
                )
                self._thread.start()
            self._cv.notify()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._loads and not (self._queue and not self._held):
                    if self._closed:
                        break
                    self._cv.wait()
                if self._closed:
                    return
                job, self._current = (self._loads or self._queue).popleft()
            try:
                job()
            finally:
                with self._cv:
                    self._current = None
                    self._busy -= 1
                    self._cv.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self._busy == 0, timeout)

    @contextlib.contextmanager
    def held(self, timeout: float | None = None) -> Iterator[None]:
        """No compile starts inside: the build in progress is waited for first (at most
        ``timeout`` seconds), so that what runs inside is timed without a compile beside
        it. Loads from the cache go on (a first run may be waiting for one)."""
        with self._cv:
            self._held += 1
            self._cv.wait_for(lambda: self._current is None, timeout)
        try:
            yield
        finally:
            with self._cv:
                self._held -= 1
                self._cv.notify_all()

    def drop(self, kernels: Sequence[TieredKernel]) -> None:
        """Take the builds of ``kernels`` off the queue; one in progress finishes (and is
        cached for the next process), so every process moves the compile cache on."""
        ids = {id(k) for k in kernels}
        with self._cv:
            dropped = [k for _, k in (*self._loads, *self._queue) if id(k) in ids]
            self._loads = collections.deque(e for e in self._loads if id(e[1]) not in ids)
            self._queue = collections.deque(e for e in self._queue if id(e[1]) not in ids)
            self._busy -= len(dropped)
            self._cv.notify_all()
        for kernel in dropped:
            kernel._fail(RuntimeError("its session was discarded"))

    def _close(self, why: str) -> threading.Thread | None:
        """Take no more builds; fail those not started. Returns the thread to join."""
        with self._cv:
            self._closed = why
            dropped = [kernel for _, kernel in (*self._loads, *self._queue)]
            self._loads.clear()
            self._queue.clear()
            self._busy -= len(dropped)
            self._cv.notify_all()
            thread = self._thread
        for kernel in dropped:
            kernel._fail(RuntimeError(why))
        return thread

    def stop(self) -> None:
        """At exit: drop the builds not started and wait for the one in progress (at
        most :data:`_EXIT_WAIT_S`), so the interpreter never finalizes under a compile."""
        thread = self._close("the process is exiting")
        if thread is None or thread is threading.current_thread() or not thread.is_alive():
            return
        thread.join(_EXIT_WAIT_S)

    def _after_fork(self) -> None:
        self._cv = threading.Condition()
        self._thread = None
        building, self._current = self._current, None
        if building is not None:
            self._busy -= 1
            building._fail(RuntimeError("forked while compiling"))
            self._close("forked while compiling")
        elif self._loads or self._queue:
            self._thread = threading.Thread(
                target=self._serve, name="nxrt-cpu-compile", daemon=True
            )
            self._thread.start()


_worker = _Worker()
atexit.register(_worker.stop)
os.register_at_fork(after_in_child=_worker._after_fork)


def wait_for_compiled(timeout: float | None = None) -> bool:
    """Block until every compiled kernel this process is building in the background is
    built (or failed); False when ``timeout`` (seconds) ran out first. For one session,
    ``session.wait_for_compiled()``."""
    return _worker.wait(timeout)


def hold_compiles(timeout: float | None = None) -> contextlib.AbstractContextManager[None]:
    """Start no background compile inside the ``with`` block (the one in progress is waited
    for first, at most ``timeout`` seconds): selection times its candidates inside one."""
    return _worker.held(timeout)
