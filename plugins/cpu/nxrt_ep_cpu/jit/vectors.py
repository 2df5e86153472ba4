"""Vector operations of one width, as LLVM IR, for the register-tiled loops.

numba leaves fixed-width loops scalar (its SLP vectorizer is off), so the tiled
loops (``pointwise.py``, ``conv.py``'s channel-blocked depthwise one) spell their
vector loads, multiply-adds, shuffles and stores as the intrinsics below, built
for each vector width a level needs (:func:`operations`; ``isa.py``). Indices are
element offsets into flat arrays, unchecked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_FLOAT = ir.FloatType()
_INDEX = ir.IntType(64)
_INT = ir.IntType(32)


@intrinsic
def stack(typingctx, size):  # pragma: no cover - numba typing
    """``size`` (a constant) float32 on the stack: accumulators that no array can alias, so
    LLVM keeps them in registers (an array would be stored back after every multiply-add)."""
    if not isinstance(size, types.IntegerLiteral):
        return None
    count = size.literal_value

    def codegen(context, builder, sig, args):
        slot = cgutils.alloca_once(builder, ir.ArrayType(_FLOAT, count))
        return builder.bitcast(slot, _FLOAT.as_pointer())

    return types.CPointer(types.float32)(size), codegen


def _named(name: str) -> Callable[[Callable[..., Any]], Any]:
    """``numba.extending.intrinsic`` under ``name`` (one per width, told apart in traces)."""

    def wrap(function: Callable[..., Any]) -> Any:
        function.__name__ = function.__qualname__ = name
        return intrinsic(function)

    return wrap


@functools.cache
def operations(lanes: int, fused: bool = True) -> dict[str, Any]:
    """The intrinsics for vectors of ``lanes`` float32 (a power of two), by the names the
    tiled loops call them: ``fused``: multiply-adds are ``llvm.fma`` (one rounding);
    else ``llvm.fmuladd``, which LLVM fuses only where the target has FMA."""
    vector = ir.VectorType(_FLOAT, lanes)
    mask = ir.VectorType(_INT, lanes)
    madd = f"llvm.{'fma' if fused else 'fmuladd'}.v{lanes}f32"

    def at(context, builder, array_type, array, index):  # pragma: no cover - codegen
        """A pointer to ``array[index:index + lanes]`` as one vector (no bounds check)."""
        data = context.make_array(array_type)(context, builder, array).data
        return builder.bitcast(builder.gep(data, [index]), vector.as_pointer())

    def splat(builder, value):  # pragma: no cover - codegen
        one = builder.insert_element(ir.Constant(vector, ir.Undefined), value, _INT(0))
        return builder.shuffle_vector(one, one, ir.Constant(mask, [0] * lanes))

    def multiply_add(builder, a, b, c):  # pragma: no cover - codegen
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector, [vector] * 3), madd
        )
        return builder.call(function, [a, b, c])

    @_named(f"fma{lanes}")
    def fma(typingctx, acc, ai, x, xi, w, wi):  # pragma: no cover - numba typing
        """``acc[ai:] += x[xi:] * w[wi:]``, one vector each: one multiply-add."""

        def codegen(context, builder, sig, args):
            pa = at(context, builder, sig.args[0], args[0], args[1])
            px = at(context, builder, sig.args[2], args[2], args[3])
            pw = at(context, builder, sig.args[4], args[4], args[5])
            loads = [builder.load(p, align=4) for p in (px, pw, pa)]
            builder.store(multiply_add(builder, *loads), pa, align=4)
            return context.get_dummy_value()

        return types.void(acc, ai, x, xi, w, wi), codegen

    @_named(f"fmab{lanes}")
    def fmab(typingctx, acc, ai, x, xi, w, wi):  # pragma: no cover - numba typing
        """``acc[ai:] += x[xi:] * w[wi]``: one vector multiply-add against one value
        broadcast to every lane."""

        def codegen(context, builder, sig, args):
            pa = at(context, builder, sig.args[0], args[0], args[1])
            px = at(context, builder, sig.args[2], args[2], args[3])
            data = context.make_array(sig.args[4])(context, builder, args[4]).data
            weight = builder.load(builder.gep(data, [args[5]]), align=4)
            loads = [builder.load(px, align=4), splat(builder, weight), builder.load(pa, align=4)]
            builder.store(multiply_add(builder, *loads), pa, align=4)
            return context.get_dummy_value()

        return types.void(acc, ai, x, xi, w, wi), codegen

    @_named(f"fill{lanes}")
    def fill(typingctx, acc, ai, s):  # pragma: no cover - numba typing
        """``acc[ai:] = s`` in every lane."""

        def codegen(context, builder, sig, args):
            pa = at(context, builder, sig.args[0], args[0], args[1])
            value = context.cast(builder, args[2], sig.args[2], types.float32)
            builder.store(splat(builder, value), pa, align=4)
            return context.get_dummy_value()

        return types.void(acc, ai, s), codegen

    @_named(f"add{lanes}")
    def add(typingctx, acc, ai, z, zi):  # pragma: no cover - numba typing
        """``acc[ai:] += z[zi:]``, one vector."""

        def codegen(context, builder, sig, args):
            pa = at(context, builder, sig.args[0], args[0], args[1])
            pz = at(context, builder, sig.args[2], args[2], args[3])
            total = builder.fadd(builder.load(pa, align=4), builder.load(pz, align=4))
            builder.store(total, pa, align=4)
            return context.get_dummy_value()

        return types.void(acc, ai, z, zi), codegen

    @_named(f"copy{lanes}")
    def copy(typingctx, dst, di, src, si):  # pragma: no cover - numba typing
        """``dst[di:] = src[si:]``, one vector load and store."""

        def codegen(context, builder, sig, args):
            value = builder.load(at(context, builder, sig.args[2], args[2], args[3]), align=4)
            builder.store(value, at(context, builder, sig.args[0], args[0], args[1]), align=4)
            return context.get_dummy_value()

        return types.void(dst, di, src, si), codegen

    @_named(f"clamp{lanes}")
    def clamp(typingctx, acc, ai, lo, hi):  # pragma: no cover - numba typing
        """``acc[ai:] = clamp(acc[ai:], lo, hi)`` with compares and selects, as the scalar
        loops do: NaN stays NaN."""

        def codegen(context, builder, sig, args):
            pa = at(context, builder, sig.args[0], args[0], args[1])
            v = builder.load(pa, align=4)
            bounds = [context.cast(builder, args[i], sig.args[i], types.float32) for i in (2, 3)]
            for bound, op in ((bounds[0], "<"), (bounds[1], ">")):
                wide = splat(builder, bound)
                v = builder.select(builder.fcmp_ordered(op, v, wide), wide, v)
            builder.store(v, pa, align=4)
            return context.get_dummy_value()

        return types.void(acc, ai, lo, hi), codegen

    rounds = lanes.bit_length() - 1

    @_named(f"transpose{lanes}")
    def transpose(typingctx, dst, di, dstride, src, si, sstride):  # pragma: no cover
        """``dst[di + c * dstride + r] = src[si + r * sstride + c]`` for ``r, c < lanes``:
        ``lanes`` vector loads, log2(lanes) rounds of two-vector shuffles (each swaps one
        bit of the row and column numbers), ``lanes`` vector stores."""

        def codegen(context, builder, sig, args):
            d, d0, dstep, s_, s0, sstep = args
            rows = [
                builder.load(
                    at(
                        context,
                        builder,
                        sig.args[3],
                        s_,
                        builder.add(s0, builder.mul(sstep, _INDEX(r))),
                    ),
                    align=4,
                )
                for r in range(lanes)
            ]
            for k in range(rounds):
                bit = 1 << k
                low = ir.Constant(
                    mask, [c if not c & bit else lanes + (c ^ bit) for c in range(lanes)]
                )
                high = ir.Constant(mask, [lanes + c if c & bit else c ^ bit for c in range(lanes)])
                swapped = list(rows)
                for r in range(lanes):
                    if not r & bit:
                        a, b = rows[r], rows[r | bit]
                        swapped[r] = builder.shuffle_vector(a, b, low)
                        swapped[r | bit] = builder.shuffle_vector(a, b, high)
                rows = swapped
            for r in range(lanes):
                to = builder.add(d0, builder.mul(dstep, _INDEX(r)))
                builder.store(rows[r], at(context, builder, sig.args[0], d, to), align=4)
            return context.get_dummy_value()

        return types.void(dst, di, dstride, src, si, sstride), codegen

    return {
        "_fma": fma,
        "_fmab": fmab,
        "_fill": fill,
        "_add": add,
        "_copy": copy,
        "_clamp": clamp,
        "_transpose": transpose,
    }
