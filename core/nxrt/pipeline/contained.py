"""Run another library's C++ on an untrusted model where a crash cannot end the caller's process.

onnx's checker and shape inference are C++ nxrt does not control, and some
models crash them outright: a segmentation fault, not an exception (onnx
1.23's LabelEncoder inference on an untyped input, in every model skl2onnx
converts with ``decision_path``; EyeLike after GroupNormalization). No model
may take the caller's process down, so :func:`run` calls such a routine in a
disposable child process and returns only what the child reports through a
pipe. Where the child comes from:

- **the helper** (from the second call on in a process): a fresh interpreter
  started once (``python -m nxrt.pipeline.contained --serve``), which imports onnx and
  keeps a forked child of its own waiting for the next request (a spare, forked
  again after each one, while the caller goes on). A fork copies the page
  table of the forking process, and afterwards each page either process writes
  faults once; OpenBLAS also stops its threads before every fork. The helper
  is small, so its requests cost the caller about the same whatever the
  caller's size: measured (Linux, 2 busy cores), checking and inferring a
  small model takes 2.7 ms through the helper against 0.7 ms in process,
  and the same for a 100 MB model (its weights never leave the caller), where
  a direct fork takes 6.7 ms from a caller 100 MB resident and 19 ms from
  one 480 MB resident. The helper inherits none of the caller's threads or
  locks (it is started by ``subprocess``, not forked).
- **a direct fork** of the caller, while the helper is not ready yet (it
  takes a second or so to import onnx), when it is busy with another thread's
  request, and for the first call of a process (a script that creates one
  session never starts a helper). The model is handed over without being
  serialized; the child runs the task and ``os._exit`` and nothing else (no
  Python cleanup, no garbage collection; the caller's numba, OpenMP and BLAS
  threads do not exist in it). A forked child that hangs (a lock some other
  thread held at the fork) is retried in the helper.
- where ``os.fork`` does not exist, only the helper, which then runs each
  request itself: a crash ends it, and the next request starts another.
- ``NXRT_CONTAINED=inline`` runs the task in this process (for debugging, and
  the last resort where no child process can be started at all).

A task is a module-level function ``task(*args, emit)``; each ``emit(bytes)``
becomes one record of the list :func:`run` returns. A child that crashes,
raises or hangs raises :class:`ChildDied`, which carries the records sent
before, so the caller knows how far the child got and can fall back or raise
an nxrt error. Nothing a child sends is unpickled: replies are plain frames.
This module imports nothing of nxrt, so any module may use it.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import importlib
import logging
import os
import pickle
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

try:  # imported here, not in the child: an import there would cost every child a millisecond
    import resource
except ImportError:  # not on Windows, where no child is forked
    resource = None  # type: ignore[assignment]

logger = logging.getLogger("nxrt")

#: ``fork`` (the default where ``os.fork`` exists: the helper when ready, else a direct
#: fork), ``helper`` (always the helper, waiting for it to start; the default elsewhere)
#: or ``inline`` (no child: a crash ends this process).
MODE_ENV = "NXRT_CONTAINED"
#: Seconds a child may take before it is killed (default :data:`TIMEOUT_S`).
TIMEOUT_ENV = "NXRT_CONTAINED_TIMEOUT"
#: Long enough for shape inference on the largest models measured (a few seconds); a
#: child that takes longer is taken to be stuck.
TIMEOUT_S = 300.0
#: Seconds the helper may take to start (import onnx) when a call has to wait for it.
START_S = 120.0
#: Requests whose arguments pickle to more than this go to a direct fork instead, which
#: shares them with the child rather than copying them through a pipe.
HELPER_BYTES = 32 << 20
#: The modules whose tasks the helper runs: imported once, before it says it is ready
#: (``nxrt.contrib_ops`` registers nxrt's op schemas with onnx, and its first lookup
#: builds onnx's schema registry: 30-60 ms each child would pay again).
HELPER_IMPORTS = ("nxrt.pipeline.model", "nxrt.contrib_ops")

#: A frame: one kind byte, then the payload's length (8 bytes, little-endian), then it.
_HEADER = struct.Struct("<cQ")
#: Frame kinds: a record, the task's end, the task raised, the child died (the helper's
#: report), the child hung, the helper is ready, a request to the helper.
_RECORD, _DONE, _FAILED, _DIED, _HUNG, _READY, _REQUEST = b"R", b"D", b"E", b"X", b"H", b"!", b"Q"
_LAST = (_DONE, _FAILED, _DIED, _HUNG)
#: The exit status of a child whose task raised (after it sent a ``_FAILED`` frame).
_TASK_RAISED = 3
#: Signals whose handlers a forked child puts back to the default, so a crash ends the
#: child at once: no faulthandler dump, no handler of the parent's run in it.
_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
#: Thread pools the helper does not need (numpy's BLAS starts one at import).
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")

Emit = Callable[[bytes], None]


class ChildDied(Exception):
    """The child running a task crashed, raised or hung; ``records`` holds what it sent first.

    Not an nxrt error: the caller decides whether a dead child means a fallback
    or an :class:`nxrt.errors.NxrtError` for the user.
    """

    def __init__(self, reason: str, records: list[bytes]) -> None:
        super().__init__(reason)
        self.reason, self.records = reason, records


class TimedOut(ChildDied):
    """A child did not finish in time (a forked one may wait on a lock it inherited)."""


class NoHelper(ChildDied):
    """No child ran the task: the helper cannot start here (``run(..., fork=False)``)."""


def mode() -> str:
    """How :func:`run` contains a task here: ``fork``, ``helper`` or ``inline``."""
    chosen = os.environ.get(MODE_ENV, "").strip().lower()
    if chosen in ("inline", "helper"):
        return chosen
    return "fork" if hasattr(os, "fork") else "helper"


def timeout() -> float:
    """The seconds a child may run (``NXRT_CONTAINED_TIMEOUT``, else :data:`TIMEOUT_S`)."""
    try:
        return max(float(os.environ.get(TIMEOUT_ENV, TIMEOUT_S)), 0.001)
    except ValueError:
        return TIMEOUT_S


def run(
    task: Callable[..., None], *args: Any, in_helper: bool = True, fork: bool = True
) -> list[bytes]:
    """``task(*args, emit)`` in a child process; the records it emitted, in order.

    ``in_helper=False`` where the task needs something of this process the helper
    lacks (say, onnx schemas a plugin registered here): then a direct fork runs it,
    unless there is no fork. ``fork=False`` where this process must not be forked (a
    library here runs thread pools a fork would leave half there, as OpenVINO's do):
    then only the helper runs it, waited for. Raises :class:`ChildDied` when the child
    crashes, raises or times out.
    """
    how, limit = mode(), timeout()
    if how == "inline":
        return _run_inline(task, args)
    helper = _helper()
    data = None
    if in_helper or how == "helper" or not fork:
        data = helper.request(task, args, limit, wait=how == "helper" or not fork)
        if data is None and not fork:
            raise NoHelper("the nxrt helper process could not run it", [])
    if data is None and how == "fork":
        try:
            data = _forked_frames(task, args, limit)
        except OSError as exc:  # fork itself failed (ENOMEM, EAGAIN)
            logger.info("cannot fork (%s); asking the helper process", exc)
        if data is None or _last_kind(data) == _HUNG:  # a fresh interpreter inherits no lock
            data = helper.request(task, args, limit, wait=True) or data
    if data is None:
        logger.info("no child process can be started here; running %s inline", task.__name__)
        return _run_inline(task, args)
    return _outcome(data)


def _run_inline(task: Callable[..., None], args: tuple[Any, ...]) -> list[bytes]:
    records: list[bytes] = []
    try:
        task(*args, records.append)
    except Exception as exc:  # noqa: BLE001 - reported as a child's would be
        raise ChildDied(f"raised {type(exc).__name__}: {exc}", records) from exc
    return records


# -- a forked child ------------------------------------------------------------------------------
#: The write ends of the pipes of children still running, so each forked child closes
#: the others': a reader sees the end of its pipe when its own child ends, not when every
#: child forked meanwhile by another thread has.
_open_write_ends: set[int] = set()
_pipes_lock = threading.Lock()


def _forked_frames(task: Callable[..., None], args: tuple[Any, ...], limit: float) -> bytes:
    """The frames a forked child running ``task`` sends, ending in a ``_LAST`` kind (a
    ``_DIED`` or ``_HUNG`` frame added here when the child sent none)."""
    read_end, write_end = os.pipe()
    with _pipes_lock:
        _open_write_ends.add(write_end)
    try:
        pid = _fork()
    except BaseException:
        _forget(write_end)
        os.close(read_end)
        raise
    if pid == 0:  # the child: the task, then os._exit; nothing else of Python runs
        _child(task, args, write_end)
    _forget(write_end)
    reaped = False
    try:
        data, state = _read_frames(read_end, limit)
        if state == _HUNG:
            return _whole(data) + _frame(_HUNG, f"did not finish in {limit:g} s".encode())
        status = _reap(pid)  # (a direct fork is rare: the helper takes most requests)
        reaped = True
        if state == _DONE:
            return data
        return _whole(data) + _frame(_DIED, _describe_status(status).encode())
    finally:
        os.close(read_end)
        if not reaped:
            _kill(pid)


def _fork() -> int:
    if sys.version_info >= (3, 12):  # fork warns in a process with threads; the child is fine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return os.fork()
    return os.fork()


def _forget(write_end: int) -> None:
    # closed before it leaves the set: a child forked in between closes its copy (or, were
    # the number reused meanwhile, some unrelated copy of its own, which is harmless)
    os.close(write_end)
    with _pipes_lock:
        _open_write_ends.discard(write_end)


def _child(
    task: Callable[..., None] | None, args: tuple[Any, ...], write_end: int, request: int = -1
) -> None:
    """The forked child's whole life: ``task(*args)``, or with ``task=None`` the request
    read from the ``request`` pipe (a helper's spare child); never returns."""
    code = 0
    try:
        _quiet_crashes()
        # other threads' children's pipes: their readers must not wait for this child; no
        # lock is taken (another thread may have held it at the fork; none runs here now)
        for fd in list(_open_write_ends):
            if fd != write_end:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if task is None:
            body = _read_frame(request)
            if body is None:
                os._exit(0)  # the helper is gone, or stops this spare
            task, args = _task_of(body)
        task(*args, lambda payload: _send(write_end, _RECORD, payload))
        _send(write_end, _DONE, b"")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit
        code = _TASK_RAISED
        try:
            _send(write_end, _FAILED, f"{type(exc).__name__}: {exc}".encode(errors="replace"))
        except BaseException:  # noqa: BLE001, S110 - the parent sees the exit status instead
            pass
    finally:
        os._exit(code)


def _quiet_crashes() -> None:
    """No core dump and no inherited handler: a crash in the child just ends it. No garbage
    collection either: a collection would touch, and so copy, every page of the heap."""
    gc.disable()
    faulthandler.disable()
    if resource is not None:
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (OSError, ValueError):
            pass
    for name in _CRASH_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):
                pass


def _reap(pid: int) -> int | None:
    """The child's wait status (``None`` where SIGCHLD is ignored and nobody can wait)."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)


def _describe_status(status: int | None) -> str:
    if status is None:
        return "ended without a word"
    if os.WIFSIGNALED(status):
        return f"was killed by {_signal_name(os.WTERMSIG(status))}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# -- frames --------------------------------------------------------------------------------------
def _frame(kind: bytes, payload: bytes) -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


def _send(fd: int, kind: bytes, payload: bytes) -> None:
    _write(fd, _frame(kind, payload))


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _frames(data: bytes) -> list[tuple[bytes, bytes]]:
    """The whole frames at the start of ``data``, as ``(kind, payload)``."""
    frames, at = [], 0
    while at + _HEADER.size <= len(data):
        kind, size = _HEADER.unpack_from(data, at)
        start = at + _HEADER.size
        if start + size > len(data):
            break
        frames.append((kind, bytes(data[start : start + size])))
        at = start + size
    return frames


def _whole(data: bytes) -> bytes:
    """``data`` without a last frame cut short (the child died while writing it)."""
    return b"".join(_frame(kind, payload) for kind, payload in _frames(data))


def _last_kind(data: bytes) -> bytes | None:
    frames = _frames(data)
    return frames[-1][0] if frames else None


def _read_frames(fd: int, limit: float, last: tuple[bytes, ...] = _LAST) -> tuple[bytes, bytes]:
    """What arrives on ``fd`` up to a frame of a ``last`` kind; and why it stopped:
    ``_DONE`` (that frame came), ``_DIED`` (the pipe closed first) or ``_HUNG`` (time ran
    out). The writer sends nothing after such a frame until asked again."""
    if os.name == "nt":  # select() takes only sockets there
        return _read_frames_in_thread(fd, limit, last)
    data = bytearray()
    at = 0  # where the next frame starts
    deadline = time.monotonic() + limit
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            # (with no time left this still polls once: a helper may be ready by now)
            if not selector.select(max(deadline - time.monotonic(), 0.0)):
                return bytes(data), _HUNG
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return bytes(data), _DIED
            data += chunk
            while at + _HEADER.size <= len(data):
                kind, size = _HEADER.unpack_from(data, at)
                if at + _HEADER.size + size > len(data):
                    break
                at += _HEADER.size + size
                if kind in last:
                    return bytes(data), _DONE


def _read_frames_in_thread(fd: int, limit: float, last: tuple[bytes, ...]) -> tuple[bytes, bytes]:
    """:func:`_read_frames` by blocking reads in a thread, joined with a timeout."""
    data = bytearray()
    state = [_HUNG]

    def read() -> None:
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                state[0] = _DIED
                return
            data.extend(chunk)
            frames = _frames(bytes(data))
            if frames and frames[-1][0] in last:
                state[0] = _DONE
                return

    reader = threading.Thread(target=read, name="nxrt-contained-read", daemon=True)
    reader.start()
    reader.join(limit)
    return bytes(data), state[0]  # (a reader left waiting ends when its pipe is closed)


def _outcome(data: bytes) -> list[bytes]:
    """The records of a child's frames, or :class:`ChildDied` if it did not finish."""
    records: list[bytes] = []
    for kind, payload in _frames(data):
        if kind == _RECORD:
            records.append(payload)
        elif kind == _DONE:
            return records
        elif kind == _FAILED:
            raise ChildDied(f"raised {payload.decode(errors='replace')}", records)
        elif kind in (_DIED, _HUNG):
            error = TimedOut if kind == _HUNG else ChildDied
            raise error(payload.decode(errors="replace"), records)
    raise ChildDied("ended without a word", records)


# -- the helper ----------------------------------------------------------------------------------
class _Helper:
    """The caller's side of the helper interpreter (one per process, made by :func:`_helper`)."""

    #: How many helpers may die before they are ready, in one process, before no more starts.
    FAILED_STARTS = 2

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.ready = False
        self.calls = 0
        self.failed_starts = 0

    def request(
        self, task: Callable[..., None], args: tuple[Any, ...], limit: float, *, wait: bool
    ) -> bytes | None:
        """The frames of ``task(*args)`` run by the helper; ``None`` when it cannot take the
        request now (not started or not ready, unless ``wait``; busy; lost)."""
        self.calls += 1
        if not wait and (self.calls == 1 or task.__module__ not in HELPER_IMPORTS):
            # the first call of a process: a direct fork, and no helper yet; and a task the
            # helper has not imported might not import there
            return None
        if not self.lock.acquire(blocking=wait):
            return None
        try:
            if not self._ready(START_S if wait else 0.0):
                return None
            request = _request(task, args, limit)
            if len(request) > HELPER_BYTES and not wait:
                return None  # a direct fork shares such arguments instead of copying them
            assert self.process is not None and self.process.stdin and self.process.stdout
            try:
                _send(self.process.stdin.fileno(), _REQUEST, request)
                data, state = _read_frames(self.process.stdout.fileno(), limit + 30.0)
            except OSError as exc:  # the helper is gone (BrokenPipeError)
                data, state = b"", _DIED
                logger.info("the nxrt helper process is gone (%s)", exc)
            if state == _DONE:
                return data
            code = self._stop()
            if not hasattr(os, "fork") and state == _DIED:
                # it ran the task itself, and the task's crash ended it
                how = f"exited with status {code}"
                if code is not None and code < 0:
                    how = f"was killed by {_signal_name(-code)}"
                return _whole(data) + _frame(_DIED, how.encode())
            return None  # lost or stuck: the caller forks directly instead
        finally:
            self.lock.release()

    def _ready(self, wait: float) -> bool:
        """Whether the helper has started (starting it if need be), waiting up to ``wait``."""
        if self.process is not None and self.process.poll() is not None:
            self._stop()
        if self.process is None:
            if self.failed_starts >= self.FAILED_STARTS:
                return False
            self._start()
            if self.process is None:
                return False
        if self.ready:
            return True
        assert self.process.stdout is not None
        data, state = _read_frames(self.process.stdout.fileno(), wait, (_READY,))
        if state == _DONE:
            self.ready = True
        elif state == _DIED or data:  # (the ready frame comes in one write: never part of it)
            self.failed_starts += 1
            logger.info("the nxrt helper process could not start (status %s)", self._stop())
        return self.ready

    def _start(self) -> None:
        env = {**os.environ, **dict.fromkeys(_ONE_THREAD, "1")}
        # run from the folder holding nxrt: `-m` puts it first on sys.path, where the
        # caller's folder could shadow a module the helper imports
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nxrt.pipeline.contained", "--serve", *HELPER_IMPORTS],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=here,
                env=env,
                bufsize=0,
            )
        except OSError as exc:
            logger.info("cannot start the nxrt helper process (%s)", exc)
            self.failed_starts = self.FAILED_STARTS
            self.process = None

    def _stop(self) -> int | None:
        """End the helper (it reads no more requests); its exit status."""
        process, self.process, self.ready = self.process, None, False
        if process is None:
            return None
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        if process.poll() is None:
            process.kill()
        try:
            return process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None


_helpers: dict[int, _Helper] = {}


def _helper() -> _Helper:
    """This process's helper: a process forked from one that had a helper gets its own."""
    return _helpers.setdefault(os.getpid(), _Helper())


def _after_fork_in_child() -> None:
    """A lock another thread held at the fork would never be released here."""
    global _pipes_lock
    _pipes_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _stop_helper() -> None:
    helper = _helpers.get(os.getpid())
    if helper is not None:
        helper._stop()


#: A request's payload starts with the seconds its child may take (a little-endian double).
_LIMIT = struct.Struct("<d")


def _request(task: Callable[..., None], args: tuple[Any, ...], limit: float) -> bytes:
    """What the helper is sent to run ``task(*args)``: its limit, then the pickled call."""
    call = (task.__module__, task.__qualname__, args)
    return _LIMIT.pack(limit) + pickle.dumps(call, pickle.HIGHEST_PROTOCOL)


def _task_of(body: bytes) -> tuple[Callable[..., None], tuple[Any, ...]]:
    module, qualname, args = pickle.loads(body[_LIMIT.size :])  # noqa: S301 - from our caller
    task: Any = importlib.import_module(module)
    for part in qualname.split("."):
        task = getattr(task, part)
    return task, args


class _Spare:
    """A child the helper forks before it is needed, waiting for the next request: the
    fork is then off the path of the request (it is made while the caller goes on)."""

    def __init__(self, out: int) -> None:
        request_read, self.request = os.pipe()
        self.reply, reply_write = os.pipe()
        self.pid = _fork()
        if self.pid == 0:
            for fd in (out, self.request, self.reply, 0):  # the caller's pipes must close
                os.close(fd)  # when the helper ends, whatever its spare is doing
            _child(None, (), reply_write, request_read)
        os.close(request_read)
        os.close(reply_write)

    def run(self, body: bytes) -> bytes:
        """The frames of the request ``body``, ending in a ``_LAST`` kind."""
        limit = _LIMIT.unpack_from(body)[0]
        try:
            _send(self.request, _REQUEST, body)
        except OSError:
            pass  # it died waiting: the reply says how
        data, state = _read_frames(self.reply, limit)
        if state == _DONE:
            return data
        if state == _HUNG:
            return _whole(data) + _frame(_HUNG, f"did not finish in {limit:g} s".encode())
        return _whole(data) + _frame(_DIED, _describe_status(self.end()).encode())

    def end(self) -> int | None:
        """Close its pipes, kill it if it still runs, reap it; its wait status."""
        for fd in (self.request, self.reply):
            if fd >= 0:
                os.close(fd)
        self.request = self.reply = -1
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        os.kill(self.pid, signal.SIGKILL)
        return _reap(self.pid)


def _serve(modules: list[str]) -> None:
    """The helper's side: import the task modules once, then run each request from stdin in
    a spare forked child (or, without fork, itself) and send its frames back on stdout."""
    # Ctrl-C in a terminal reaches the whole process group: the caller handles it, and
    # the helper stays for its next request
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in modules:
        importlib.import_module(module)
    out = os.dup(1)
    os.dup2(2, 1)  # anything a task prints goes to stderr, not into the frames
    forks = hasattr(os, "fork")
    spare = _Spare(out) if forks else None
    _send(out, _READY, b"")
    while True:
        body = _read_frame(0)
        if body is None:  # the caller is gone, or stops us
            if spare is not None:
                spare.end()
            return
        if spare is not None:
            data = spare.run(body)
            _write(out, data)
            if _last_kind(data) in (_DONE, _FAILED):
                _reap(spare.pid)  # it is exiting; the caller no longer waits for it
            spare.end()
            spare = _Spare(out)
            continue
        try:
            records = _run_inline(*_task_of(body))
        except ChildDied as died:
            _write(out, b"".join(_frame(_RECORD, r) for r in died.records))
            _send(out, _FAILED, died.reason.removeprefix("raised ").encode(errors="replace"))
            continue
        _write(out, b"".join(_frame(_RECORD, r) for r in records) + _frame(_DONE, b""))


def _read_frame(fd: int) -> bytes | None:
    """One frame's payload from a blocking ``fd``; ``None`` at its end."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    return _read_exact(fd, _HEADER.unpack(header)[1])


def _read_exact(fd: int, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


__all__ = [
    "MODE_ENV",
    "TIMEOUT_ENV",
    "TIMEOUT_S",
    "ChildDied",
    "TimedOut",
    "mode",
    "run",
    "timeout",
]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve(sys.argv[2:])
