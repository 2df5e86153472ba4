"""The instruction-set level the cpu EP's register-tiled loops are built for, and its tiles.

numba compiles for one target: the host CPU, or the one ``NUMBA_CPU_NAME`` and
``NUMBA_CPU_FEATURES`` name (so that an AVX-512 machine builds and runs what an AVX2 one
does). The loops that hold tiles of accumulators in vector registers (``pointwise.py``'s
1x1 convolution, ``conv.py``'s channel-blocked depthwise one) size them to that target:
a tile sized for AVX-512's 32 registers of 16 float32 needs twice the registers on
AVX2, whose 16 registers hold 8, and spills. :func:`level` reads the effective target as
numba does; :data:`LEVELS` holds each level's shapes; :func:`specialize` compiles a
module's tiled loops for one level.

Every level's loops run on every target (a wider vector is split in two, a narrower one
leaves lanes idle), only slower off their own, so the tests check each level's tiles
wherever they run. Each output value sums the same terms in the same order at every
level (tiles differ in how many outputs they hold, not in how one is summed), so a
level never changes a result; only the generic level, for CPUs without FMA, rounds each
multiply and add apart.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm
from numba.core import config

from nxrt_ep_cpu.jit import njit


@dataclass(frozen=True)
class Level:
    """One instruction-set level's vector width and tile shapes (float32)."""

    name: str
    #: float32 lanes of one vector register, and the registers there are.
    lanes: int
    registers: int
    #: Whether the multiply-adds are fused (``llvm.fma``); else ``llvm.fmuladd``.
    fma: bool
    #: 1x1 convolution, pixels in the lanes: filters per tile (a tile is ``rows`` x two
    #: vectors of pixels, so ``2 * rows`` accumulators).
    rows: int
    #: 1x1 convolution, filters in the lanes: pixels per tile (two vectors of filters
    #: each, so ``2 * lane_pixels`` accumulators).
    lane_pixels: int
    #: Multiply-adds per nanosecond of the 1x1 tiles on one core (measured), for splits.
    tile_rate: float
    #: Share of extra pixels the pixel tiles compute from which a 1x1 convolution puts
    #: filters in the lanes instead.
    lane_waste: float

    @property
    def width(self) -> int:
        """Pixels of one 1x1 tile: two vectors."""
        return 2 * self.lanes

    @property
    def lane_block(self) -> int:
        """Filters of one filter-lanes tile: two vectors."""
        return 2 * self.lanes


#: AVX-512: 32 zmm of 16 float32; 8 filters x 32 pixels is 16 accumulators, and the
#: filter-lanes tile 32 filters x 8 pixels the same. AVX2: 16 ymm of 8; 6 x 16 is 12
#: (the classic 6x16 sgemm micro-kernel), leaving registers for the loads and
#: broadcasts, and 16 filters x 6 pixels the same (measured on the AVX2 target: 1.4-1.7x
#: faster than AVX-512's tiles split in two). AVX2 puts filters in the lanes from less
#: waste: a 7x7 map's 49 pixels take 56 in its tiles, one a half tile whose six
#: accumulators leave the FMA units idle a quarter of the time (filters in the lanes
#: measured 5-15% faster there). Generic (SSE2, or another architecture): 16 registers
#: of 4; 4 x 8 and 8 x 4.
LEVELS = {
    "avx512": Level("avx512", 16, 32, True, 8, 8, tile_rate=40.0, lane_waste=1.15),
    "avx2": Level("avx2", 8, 16, True, 6, 6, tile_rate=20.0, lane_waste=1.12),
    "generic": Level("generic", 4, 16, False, 4, 4, tile_rate=6.0, lane_waste=1.15),
}

_forced = threading.local()


def target() -> tuple[str, str]:
    """The CPU name and feature string numba compiles for (``numba.core.codegen``'s rule:
    ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` where set, else the host's)."""
    from numba.core.codegen import get_host_cpu_features

    name = config.CPU_NAME or llvm.get_host_cpu_name()
    features = config.CPU_FEATURES
    if features is None:
        features = get_host_cpu_features()
    return name, features


@functools.cache
def _level_of(name: str, features: str) -> str:
    if features:
        enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    else:
        enabled = _default_features(name)
    if "avx512f" in enabled:
        return "avx512"
    if {"avx2", "fma"} <= enabled:
        return "avx2"
    return "generic"


def _default_features(name: str) -> set[str]:
    """The features LLVM gives CPU ``name`` when none are named (``NUMBA_CPU_FEATURES=``),
    read from the code it emits for a 16-lane multiply-add: 512-bit registers for
    AVX-512, 256-bit ones and FMA for AVX2."""
    module = llvm.parse_assembly(
        """
        declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
        define <16 x float> @probe(<16 x float> %a, <16 x float> %b, <16 x float> %c) {
          %r = call <16 x float> @llvm.fma.v16f32(<16 x float> %a, <16 x float> %b,
                                                  <16 x float> %c)
          ret <16 x float> %r
        }
        """
    )
    llvm.initialize_native_target()  # what numba's codegen does before it compiles
    llvm.initialize_native_asmprinter()
    try:
        machine = llvm.Target.from_default_triple().create_target_machine(cpu=name, features="")
        code = machine.emit_assembly(module)
    except RuntimeError:
        return set()
    found = set()
    if "zmm" in code:
        found.add("avx512f")
    if "ymm" in code and "vfmadd" in code:
        found |= {"avx2", "fma"}
    return found


def level() -> str:
    """The level of the target numba compiles for: ``avx512`` where it has AVX-512F, else
    ``avx2`` with AVX2 and FMA, else ``generic`` (a test may force one: :func:`forced`)."""
    chosen = getattr(_forced, "level", None)
    return chosen or _level_of(*target())


@contextlib.contextmanager
def forced(name: str) -> Iterator[Level]:
    """Kernels planned inside this block (on this thread) use level ``name``'s tiles,
    whatever the target: the tests run every level's tiles on any machine."""
    previous = getattr(_forced, "level", None)
    _forced.level = name
    try:
        yield LEVELS[name]
    finally:
        _forced.level = previous


def tiled(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a loop that reads its level's constants as globals: :func:`specialize` compiles
    it once per level with ``options`` (:func:`~nxrt_ep_cpu.jit.njit`'s), and the
    function itself stays plain Python."""

    def mark(function: Callable[..., Any]) -> Callable[..., Any]:
        function.tiled_options = options  # type: ignore[attr-defined]
        return function

    return mark


def specialize(
    namespace: dict[str, Any], name: str, constants: dict[str, Any], cache: bool = True
) -> Any:
    """The :func:`tiled` functions of a module (``namespace``: its globals), each compiled
    for level ``name`` against the module's globals with ``constants`` laid over them
    (``cache=False``: not through the disk cache, so that numba shows their assembly).

    Each copy is named ``<function>_<level>``, so numba caches every level's machine
    code apart on disk (its cache names entries by function, not by globals)."""
    scope = dict(namespace)
    scope.update(constants)
    marked = {key: f for key, f in namespace.items() if hasattr(f, "tiled_options")}
    for key, function in marked.items():
        copy = types.FunctionType(
            function.__code__, scope, function.__name__, function.__defaults__
        )
        copy.__qualname__ = f"{function.__qualname__}_{name}"
        copy.__module__ = function.__module__
        copy.__doc__ = function.__doc__
        scope[key] = njit(**function.tiled_options, cache=cache)(copy)
    return types.SimpleNamespace(**constants, **{key: scope[key] for key in marked})
