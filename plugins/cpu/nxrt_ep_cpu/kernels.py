"""The cpu EP's kernel classes: how a numpy kernel reports a failure.

The executor calls a kernel's ``direct_call`` and hands what it raises to
``translate_error``; ``compute`` (constant folding, subgraphs, tests) does
the same translation itself. numpy's own errors (shapes that disagree at
run time, an index out of range) are the model's fault, not the EP's, so
they become :class:`~nxrt.errors.KernelFailed`; anything else stays an EP
bug. This module imports no kernel, so the provider and every op family
can import it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from nxrt.errors import KernelFailed, NxrtError
from nxrt.kernel import FunctionKernel, Kernel

if TYPE_CHECKING:
    from nxrt.host_parallel import HostParallel


def translate_error(exc: BaseException) -> BaseException:
    """numpy's errors as :class:`KernelFailed`; anything else unchanged (an EP bug)."""
    if isinstance(exc, (ValueError, IndexError, TypeError, ArithmeticError)):
        return KernelFailed(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, MemoryError):
        return KernelFailed(f"not enough memory: {exc}; check the input sizes")
    return exc


class NumpyKernel(Kernel):
    """A kernel whose numpy errors become :class:`KernelFailed`.

    Subclasses provide ``direct_call`` (``compute`` calls it, so the
    default, which calls ``compute``, would never return).
    """

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        try:
            out = self.direct_call(*inputs)
        except NxrtError:
            raise
        except Exception as exc:
            error = translate_error(exc)
            if error is exc:
                raise
            raise error from exc
        return out if isinstance(out, tuple) else (out,)

    def translate_error(self, exc: BaseException) -> BaseException:
        return translate_error(exc)


class CpuKernel(NumpyKernel, FunctionKernel):
    """A kernel function with its node's attributes bound (most cpu ops).

    ``direct_call`` is :class:`~nxrt.kernel.FunctionKernel`'s: the bound
    function itself, called without ``compute``'s list and tuple.
    """


def pool_team(parallel: HostParallel | None) -> int:
    """The parts a kernel made for a session's ``parallel`` splits its work into, in every
    run: the threads of the EP's own pool (``jit/threads.py``) it may use. numba is
    imported only for a session of several threads."""
    if parallel is None or parallel.threads < 2:
        return 1
    from nxrt_ep_cpu.jit.threads import claim

    return claim(parallel)


def run_team(team: int, parallel: HostParallel | None) -> int:
    """The threads that take a kernel's :func:`pool_team` parts in this run: 1 in a run the
    session makes on one thread (``HostParallel.active_threads``) and in a process forked
    since the kernel was made. It never changes a result, only who computes it."""
    if team < 2 or parallel is None or parallel.active_threads < 2:
        return 1
    return compiled("threads").team(team)


@functools.cache
def compiled(name: str) -> ModuleType:
    """The module ``nxrt_ep_cpu.jit.<name>``, imported on first use (numba with it), then
    looked up: an import statement in a kernel's call costs about 1 µs, as much as the
    whole call of a small kernel's Python."""
    return importlib.import_module(f"nxrt_ep_cpu.jit.{name}")
