"""Integer GEMM for the quantized ops: u8 x s8 products summed exactly in int32.

One register-tiled engine serves QLinearConv, QLinearMatMul, QGemm,
MatMulInteger and MatMulIntegerToFloat. A tile is ``ROWS`` rows of a
*broadcast* operand (each group of ``GROUP`` consecutive depth values one
32-bit word, broadcast to every lane) times ``WIDTH`` columns of a *vector*
operand packed in panels (``[groups][WIDTH]`` words), accumulated in
``ROWS x VECTORS`` int32 vector registers held over the whole depth; then an
epilogue (requantize, scale to float, or store int32) writes it out.

The multiply-add is chosen per instruction set (:func:`level`):

* ``vnni512`` (AVX512-VNNI): ``vpdpbusd`` on zmm, 64 u8 x s8 products per
  instruction, 4 depth values a word (one operand unsigned, one signed);
* ``vnni256`` (AVX-VNNI, or AVX512-VNNI with VL): ``vpdpbusd`` on ymm;
* ``pairs`` (AVX2 and older): both operands widened to int16 when packed (so
  any signedness and zero point fits), 2 depth values a word, summed by
  ``vpmaddwd`` (exact: two 16-bit products per 32-bit lane).

All three are exact integer arithmetic, so every level gives the same bits.
``vpmaddubsw`` (AVX2's u8 x s8 multiply-add) saturates its 16-bit pair sums
and is not used. A convolution's broadcast operand is its weights (packed
once) and its vector operand the image's patches, packed per run from a
channel-grouped, padded copy of the input (:func:`blocked_input`); a matrix
product broadcasts the activations' rows and packs the weights in panels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from nxrt_ep_cpu.jit import isa, njit


@dataclass(frozen=True)
class Level:
    """An integer multiply-add's vector shape and its tile."""

    name: str
    #: int32 lanes of one vector register.
    lanes: int
    #: depth values in one 32-bit word: 4 bytes (VNNI) or 2 int16 (pairs).
    group: int
    #: rows of the broadcast operand per tile, and vectors of the vector operand.
    rows: int
    vectors: int

    @property
    def width(self) -> int:
        return self.lanes * self.vectors

    @property
    def vnni(self) -> bool:
        return self.group == 4


#: AVX512-VNNI: 6 rows x 4 zmm (64 columns), 24 of the 32 zmm accumulate. VNNI on ymm and
#: the int16 pairs: 6 x 2 ymm (16 columns), 12 of AVX2's 16 registers.
LEVELS = {
    "vnni512": Level("vnni512", 16, 4, 6, 4),
    "vnni256": Level("vnni256", 8, 4, 6, 2),
    "pairs": Level("pairs", 8, 2, 6, 2),
}


def level() -> str:
    """The level of the CPU numba compiles for (``NUMBA_CPU_NAME``/``_FEATURES`` count)."""
    name, features = isa.target()
    return _level_of(name, features)


@functools.cache
def _level_of(name: str, features: str) -> str:
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")} if features else set()
    if not features:
        enabled = _default_features(name)
    if {"avx512f", "avx512vnni", "avx512bw"} <= enabled:
        return "vnni512"
    if "avxvnni" in enabled or {"avx512vnni", "avx512vl"} <= enabled:
        return "vnni256"
    return "pairs"


#: LLVM CPU names with AVX512-VNNI, and with AVX-VNNI but no AVX-512: the features a CPU
#: named without features (``NUMBA_CPU_FEATURES=``) has. A name not here gets the int16
#: pairs, which run everywhere (asking LLVM to select ``vpdpbusd`` for a CPU without it
#: aborts the process, so it is never probed).
_VNNI512_CPUS = frozenset(
    "cascadelake cooperlake icelake-client icelake-server tigerlake rocketlake "
    "sapphirerapids emeraldrapids graniterapids graniterapids-d diamondrapids znver4 "
    "znver5".split()
)
_VNNI256_CPUS = frozenset(
    "alderlake raptorlake meteorlake arrowlake arrowlake-s lunarlake pantherlake gracemont "
    "sierraforest grandridge clearwaterforest".split()
)


def _default_features(name: str) -> set[str]:
    if name in _VNNI512_CPUS:
        return {"avx512f", "avx512vnni", "avx512bw", "avx512vl"}
    if name in _VNNI256_CPUS:
        return {"avxvnni"}
    return set()


def _probe_ir(bits: int, byte_operands: bool) -> str:
    lanes = bits // 32
    operand = f"<{lanes * 4} x i8>" if byte_operands else f"<{lanes} x i32>"
    vector = f"<{lanes} x i32>"
    return f"""
        declare {vector} @llvm.x86.avx512.vpdpbusd.{bits}({vector}, {operand}, {operand})
        define {vector} @probe({vector} %c, {operand} %a, {operand} %b) {{
          %r = call {vector} @llvm.x86.avx512.vpdpbusd.{bits}({vector} %c, {operand} %a,
                                                            {operand} %b)
          ret {vector} %r
        }}
        """


@functools.cache
def _byte_operands() -> bool:
    """Whether this LLVM declares ``vpdpbusd``'s operands as bytes (LLVM 21 on) rather
    than int32 words (older ones): the declaration the module must use."""
    try:
        module = llvm.parse_assembly(_probe_ir(512, True))
        module.verify()
    except RuntimeError:
        return False
    return "<64 x i8>" in str(module).split("vpdpbusd.512(")[1].split(")")[0]


# -- the multiply-add, as intrinsics ------------------------------------------------------------

_I32 = ir.IntType(32)
_I16 = ir.IntType(16)
_I8 = ir.IntType(8)


@intrinsic
def stack32(typingctx, size):  # pragma: no cover - numba typing
    """``size`` (a constant) int32 on the stack: accumulators no array aliases, which LLVM
    keeps in registers."""
    if not isinstance(size, types.IntegerLiteral):
        return None
    count = size.literal_value

    def codegen(context, builder, sig, args):
        slot = cgutils.alloca_once(builder, ir.ArrayType(_I32, count))
        return builder.bitcast(slot, _I32.as_pointer())

    return types.CPointer(types.int32)(size), codegen


@functools.cache
def operations(name: str) -> dict[str, object]:
    """``_dotv`` and ``_dotb`` for level ``name``: ``acc[ai:ai+LANES] += v[vi:vi+LANES] .
    b[bi]`` (int32 words; each lane's word of ``v`` against the one word ``b[bi]``, group
    by group). ``_dotv`` treats the vector's bytes as unsigned, ``_dotb`` the broadcast's
    (VNNI multiplies unsigned by signed bytes); with int16 pairs both are signed."""
    chosen = LEVELS[name]
    lanes = chosen.lanes
    vector = ir.VectorType(_I32, lanes)
    mask = ir.VectorType(_I32, lanes)

    def pointer(context, builder, array_type, array, index, as_type):  # pragma: no cover
        data = context.make_array(array_type)(context, builder, array).data
        return builder.bitcast(builder.gep(data, [index]), as_type.as_pointer())

    def combine(builder, acc, v, b, unsigned_vector):  # pragma: no cover - codegen
        if chosen.vnni:
            bits = lanes * 32
            wide = _byte_operands()
            operand = ir.VectorType(_I8, lanes * 4) if wide else vector
            function = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(vector, [vector, operand, operand]),
                f"llvm.x86.avx512.vpdpbusd.{bits}",
            )
            u, s = (v, b) if unsigned_vector else (b, v)
            if wide:
                u, s = builder.bitcast(u, operand), builder.bitcast(s, operand)
            return builder.call(function, [acc, u, s])
        halves = ir.VectorType(_I16, 2 * lanes)
        wide32 = ir.VectorType(_I32, 2 * lanes)
        x = builder.sext(builder.bitcast(v, halves), wide32)
        y = builder.sext(builder.bitcast(b, halves), wide32)
        product = builder.mul(x, y)
        even = builder.shuffle_vector(
            product, product, ir.Constant(mask, list(range(0, 2 * lanes, 2)))
        )
        odd = builder.shuffle_vector(
            product, product, ir.Constant(mask, list(range(1, 2 * lanes, 2)))
        )
        return builder.add(acc, builder.add(even, odd))

    def make(unsigned_vector: bool, label: str):
        def dot(typingctx, acc, ai, v, vi, b, bi):  # pragma: no cover - numba typing
            def codegen(context, builder, sig, args):
                pa = pointer(context, builder, sig.args[0], args[0], args[1], vector)
                pv = pointer(context, builder, sig.args[2], args[2], args[3], vector)
                pb = pointer(context, builder, sig.args[4], args[4], args[5], _I32)
                word = builder.load(pb, align=4)
                one = builder.insert_element(ir.Constant(vector, ir.Undefined), word, _I32(0))
                splat = builder.shuffle_vector(one, one, ir.Constant(mask, [0] * lanes))
                total = combine(
                    builder, builder.load(pa, align=4), builder.load(pv, align=4), splat,
                    unsigned_vector,
                )  # fmt: skip
                builder.store(total, pa, align=4)
                return context.get_dummy_value()

            return types.void(acc, ai, v, vi, b, bi), codegen

        dot.__name__ = dot.__qualname__ = f"{label}_{name}"
        return intrinsic(dot)

    return {"_dotv": make(True, "dotv"), "_dotb": make(False, "dotb")}


def kernels(name: str | None = None) -> SimpleNamespace:
    """The loops below compiled for level ``name`` (default: the target's, :func:`level`),
    with ``LEVEL``, ``LANES``, ``GROUP``, ``ROWS``, ``VECTORS`` and ``WIDTH``."""
    return _kernels(name or level())


@functools.cache
def _kernels(name: str) -> SimpleNamespace:
    chosen = LEVELS[name]
    constants = {
        "LEVEL": name,
        "LANES": chosen.lanes,
        "GROUP": chosen.group,
        "ROWS": chosen.rows,
        "VECTORS": chosen.vectors,
        "WIDTH": chosen.width,
        "STACK": chosen.rows * chosen.width,
        **operations(name),
    }
    return isa.specialize(globals(), f"q{name}", constants)


# -- packing, once per session (numpy) ------------------------------------------------------------


def words(values: np.ndarray, group: int) -> np.ndarray:
    """Integer ``values`` ``(..., depth)`` as 32-bit words of ``group`` consecutive depth values
    (bytes for 4, int16 for 2; the depth padded with zeros): ``(..., depth / group)`` uint32.
    Values must fit the element (int8 or uint8 bytes, int16 pairs)."""
    depth = values.shape[-1]
    padded = -(-depth // group) * group
    element = np.int16 if group == 2 else (np.uint8 if values.min(initial=0) >= 0 else np.int8)
    if group == 4 and values.max(initial=0) > 127 and values.min(initial=0) < 0:
        raise ValueError("bytes of a word must be all signed or all unsigned")
    out = np.zeros(values.shape[:-1] + (padded,), element)
    out[..., :depth] = values
    return np.ascontiguousarray(out).view(np.uint32)


def pack_rows(w: np.ndarray, name: str) -> np.ndarray:
    """Broadcast-operand rows ``(rows, depth)`` as words, rows padded to whole tiles."""
    chosen = LEVELS[name]
    rows = -(-w.shape[0] // chosen.rows) * chosen.rows
    packed = words(w, chosen.group)
    out = np.zeros((rows, packed.shape[1]), np.uint32)
    out[: w.shape[0]] = packed
    return out


def pack_panels(b: np.ndarray, name: str) -> np.ndarray:
    """A vector operand ``(depth, columns)`` as panels ``(panels, groups, WIDTH)`` of words
    (columns padded with zeros to whole panels)."""
    chosen = LEVELS[name]
    k, n = b.shape
    panels = -(-n // chosen.width)
    wide = np.zeros((panels * chosen.width, k), b.dtype)
    wide[:n] = b.T
    packed = words(wide, chosen.group)  # (columns, groups)
    return np.ascontiguousarray(packed.reshape(panels, chosen.width, -1).transpose(0, 2, 1))


# -- the loops (compiled per level) ------------------------------------------------------------
# They read their level's constants (``kernels``) as globals: LANES, GROUP, ROWS, VECTORS,
# WIDTH, STACK and the multiply-adds _dotv and _dotb.
# ruff: noqa: F821


# Indices are uint64: numba then leaves out the wraparound of negative indices, whose
# per-lane selects turn contiguous loops into gathers and scatters.
_U = np.uint64


@isa.tiled(inline="always")
def _tile_v(acc, v, b, bbase, bstride, groups):  # pragma: no cover - numba
    """``acc = b[rows] . v``: the vector operand (one panel) unsigned (a convolution's
    patches), ROWS rows of ``b`` from ``bbase``, ``bstride`` words apart."""
    for i in range(STACK):
        acc[i] = 0
    for g in range(_U(groups)):
        vi = g * _U(WIDTH)
        bi = _U(bbase) + g
        for r in range(ROWS):  # unrolled by LLVM: the offsets are constants
            for j in range(VECTORS):
                _dotv(acc, (r * VECTORS + j) * LANES, v, vi + _U(j * LANES), b,
                      bi + _U(r) * _U(bstride))  # fmt: skip


@isa.tiled(inline="always")
def _tile_b(acc, v, b, bbase, bstride, groups):  # pragma: no cover - numba
    """As :func:`_tile_v` with the broadcast operand unsigned (a matrix product's rows)."""
    for i in range(STACK):
        acc[i] = 0
    for g in range(_U(groups)):
        vi = g * _U(WIDTH)
        bi = _U(bbase) + g
        for r in range(ROWS):
            for j in range(VECTORS):
                _dotb(acc, (r * VECTORS + j) * LANES, v, vi + _U(j * LANES), b,
                      bi + _U(r) * _U(bstride))  # fmt: skip


@isa.tiled(inline="always")
def _requantize(acc, out, base, stride, rows, width, corr, mult, beta, row0, zy, lo, hi):
    # pragma: no cover - numba
    """``out[base + r * stride + j] = clamp(rint(float32(acc + corr[row]) * mult[row] +
    beta[row]) + zy, lo, hi)`` for a tile's ``rows`` x ``width``."""
    low, high = np.float32(lo - zy), np.float32(hi - zy)
    zero = np.int32(zy)
    for r in range(_U(rows)):
        m = _U(row0) + r
        c, f, o = corr[m], mult[m], beta[m]
        at = _U(base) + r * _U(stride)
        ai = r * _U(WIDTH)
        for j in range(_U(width)):
            y = np.rint(np.float32(np.int32(acc[ai + j] + c)) * f + o)
            y = low if y < low else y
            y = high if y > high else y
            out[at + j] = np.int32(y) + zero


@isa.tiled()
def blocked_input(x, out, flip, shift, pad, top, left):  # pragma: no cover - numba
    """One image ``x`` (groups, channels, height, width), integers, into ``out`` (groups,
    channel words, padded height, padded width) uint32: GROUP channels per word, as bytes
    ``x ^ flip`` (VNNI) or int16 ``x - shift`` (pairs); every padded position and missing
    channel holds ``pad`` (one word, all its values the padding value)."""
    groups, channels, height, width = x.shape
    words_per = out.shape[1]
    rows, cols = _U(out.shape[2]), _U(out.shape[3])
    whole = channels // GROUP
    flat = out.reshape(-1)
    plane = rows * cols
    top_, left_ = _U(top), _U(left)
    for g in range(groups):  # the border, and the words of missing channels
        for word in range(words_per):
            base = _U(g * words_per + word) * plane
            if word >= whole:
                for i in range(plane):
                    flat[base + i] = pad
                continue
            for i in range(top_ * cols):
                flat[base + i] = pad
            for i in range((top_ + _U(height)) * cols, plane):
                flat[base + i] = pad
            for h in range(top_, top_ + _U(height)):
                for i in range(left_):
                    flat[base + h * cols + i] = pad
                for i in range(left_ + _U(width), cols):
                    flat[base + h * cols + i] = pad
    mask = np.uint32(0xFF) if GROUP == 4 else np.uint32(0xFFFF)
    flips = np.uint32(flip) * np.uint32(0x01010101)
    for g in range(groups):
        for word in range(whole):  # GROUP channel rows as one row of words: vectorizes
            c = word * GROUP
            for h in range(height):
                at = (_U(g * words_per + word) * rows + _U(h) + top_) * cols + left_
                if GROUP == 4:
                    r0, r1, r2, r3 = x[g, c, h], x[g, c + 1, h], x[g, c + 2, h], x[g, c + 3, h]
                    for w in range(_U(width)):
                        flat[at + w] = (
                            (np.uint32(r0[w]) & mask)
                            | ((np.uint32(r1[w]) & mask) << np.uint32(8))
                            | ((np.uint32(r2[w]) & mask) << np.uint32(16))
                            | ((np.uint32(r3[w]) & mask) << np.uint32(24))
                        ) ^ flips
                else:
                    r0, r1 = x[g, c, h], x[g, c + 1, h]
                    for w in range(_U(width)):
                        flat[at + w] = (np.uint32(np.int32(r0[w]) - shift) & mask) | (
                            (np.uint32(np.int32(r1[w]) - shift) & mask) << np.uint32(16)
                        )
        if whole * GROUP < channels:  # the last word's channels, the rest padding
            word = whole
            for h in range(height):
                at = (_U(g * words_per + word) * rows + _U(h) + top_) * cols + left_
                for w in range(width):
                    value = pad
                    for c in range(whole * GROUP, channels):
                        part = np.uint32(8 * (c % 4)) if GROUP == 4 else np.uint32(16 * (c % 2))
                        if GROUP == 4:
                            item = (np.uint32(x[g, c, h, w]) & mask) ^ np.uint32(flip)
                        else:
                            item = np.uint32(np.int32(x[g, c, h, w]) - shift) & mask
                        value = (value & ~(mask << part)) | (item << part)
                    flat[at + _U(w)] = value


@isa.tiled(inline="always")
def _patches(xb, group, panel, p0, count, geo, taps):  # pragma: no cover - numba
    """Panel ``panel`` (taps x channel words, WIDTH) of pixels ``p0..p0+count`` of group
    ``group``: word ``(t, c)`` of pixel ``p`` is the input word of channel word ``c`` under
    tap ``t`` (``taps``: each tap's offset in the padded map); missing pixels are 0."""
    out_w, stride_h, stride_w = geo[0], geo[1], geo[2]
    words_per, rows, cols = xb.shape[1], xb.shape[2], xb.shape[3]
    plane = _U(rows * cols)
    flat = xb.reshape(-1)
    gbase = _U(group * words_per) * plane
    if count < WIDTH:
        for i in range(panel.size):
            panel[i] = 0
    step = _U(stride_w)
    done = 0
    while done < count:
        p = p0 + done
        oh, ow = p // out_w, p % out_w
        run = _U(min(count - done, out_w - ow))  # the pixels left on this output row
        start = _U(oh * stride_h * cols + ow * stride_w)
        for t in range(taps.size):
            tap = _U(taps[t])
            for c in range(_U(words_per)):
                src = gbase + c * plane + start + tap
                dst = (_U(t) * _U(words_per) + c) * _U(WIDTH) + _U(done)
                if stride_w == 1:
                    for i in range(run):
                        panel[dst + i] = flat[src + i]
                else:
                    for i in range(run):
                        panel[dst + i] = flat[src + i * step]
        done += int(run)


@isa.tiled()
def conv(xb, w, out, geo, taps, corr, mult, beta, zy, lo, hi, first, stop):  # pragma: no cover
    """Panels ``first..stop`` of a grouped convolution of one image.

    ``xb``: :func:`blocked_input`'s words; ``w``: (groups, rows padded to whole tiles, taps x
    channel words) words; ``out``: (filters, pixels) integers; ``geo``: output width,
    strides, pixels, filters per group, panels per group; ``taps``: each tap's offset in
    the padded map; ``corr``, ``mult``, ``beta``: per filter (see :func:`_requantize`).
    """
    pixels, per_group, panels = geo[3], geo[4], geo[5]
    groups_k = w.shape[2]
    flat = out.reshape(-1)
    acc = numba.carray(stack32(STACK), (STACK,))
    panel = np.empty(groups_k * WIDTH, np.uint32)
    blocks = w.shape[1] // ROWS
    for item in range(first, stop):
        group, chunk = item // panels, item % panels
        p0 = chunk * WIDTH
        count = min(WIDTH, pixels - p0)
        _patches(xb, group, panel, p0, count, geo, taps)
        wg = w[group].reshape(-1)
        for block in range(blocks):
            row0 = block * ROWS
            rows = min(ROWS, per_group - row0)
            if rows <= 0:
                break
            _tile_v(acc, panel, wg, row0 * groups_k, groups_k, groups_k)
            m0 = group * per_group + row0
            _requantize(acc, flat, m0 * pixels + p0, pixels, rows, count, corr, mult, beta,
                        m0, zy, lo, hi)  # fmt: skip


@isa.tiled(parallel=True)
def conv_team(xb, w, out, geo, taps, corr, mult, beta, zy, lo, hi, bounds):  # pragma: no cover
    """:func:`conv` on panels ``bounds[p]..bounds[p + 1]`` for each part ``p``, the parts
    spread over numba's pool (``jit/threads.py``)."""
    for p in numba.prange(bounds.size - 1):
        conv(xb, w, out, geo, taps, corr, mult, beta, zy, lo, hi, bounds[p], bounds[p + 1])


@isa.tiled(inline="always")
def _store(acc, out, mode, base, stride, rows, width, col0, corr, scale, bias, zy, lo, hi):
    # pragma: no cover - numba
    """A matrix product's tile to ``out``: ``mode`` 0 int32 ``acc + corr[col]``; 1 float32
    ``float32(acc + corr) * scale[col] (+ bias[col] when ``bias`` is not empty)``; 2 the
    integer ``clamp(rint(float32(acc + corr) * scale + bias) + zy, lo, hi)``."""
    has_bias = bias.size > 0
    c0 = _U(col0)
    for r in range(_U(rows)):
        at = _U(base) + r * _U(stride)
        ai = r * _U(WIDTH)
        if mode == 0:
            for j in range(_U(width)):
                out[at + j] = np.int32(acc[ai + j] + corr[c0 + j])
        elif mode == 1:
            if has_bias:
                for j in range(_U(width)):
                    n = c0 + j
                    y = np.float32(np.int32(acc[ai + j] + corr[n])) * scale[n]
                    out[at + j] = y + bias[n]
            else:
                for j in range(_U(width)):
                    n = c0 + j
                    out[at + j] = np.float32(np.int32(acc[ai + j] + corr[n])) * scale[n]
        else:
            low, high = np.float32(lo - zy), np.float32(hi - zy)
            zero = np.int32(zy)
            for j in range(_U(width)):
                n = c0 + j
                y = np.rint(np.float32(np.int32(acc[ai + j] + corr[n])) * scale[n] + bias[n])
                y = low if y < low else y
                y = high if y > high else y
                out[at + j] = np.int32(y) + zero


@isa.tiled()
def matmul(a, b, out, mode, corr, scale, bias, zy, lo, hi, first, stop):  # pragma: no cover
    """Items ``first..stop`` (panel-major: each weight panel then every row block) of
    ``a @ b``. ``a``: (rows padded to whole tiles, groups) words, the broadcast operand;
    ``b``: :func:`pack_panels`'s panels; ``out``: (rows, columns) of the mode's type (see
    :func:`_store`)."""
    groups = a.shape[1]
    m, n = out.shape[0], out.shape[1]
    blocks = a.shape[0] // ROWS
    flat = out.reshape(-1)
    av = a.reshape(-1)
    acc = numba.carray(stack32(STACK), (STACK,))
    for item in range(first, stop):
        panel, block = item // blocks, item % blocks
        row0 = block * ROWS
        col0 = panel * WIDTH
        _tile_b(acc, b[panel].reshape(-1), av, row0 * groups, groups, groups)
        rows = min(ROWS, m - row0)
        width = min(WIDTH, n - col0)
        _store(acc, flat, mode, row0 * n + col0, n, rows, width, col0, corr, scale, bias, zy,
               lo, hi)  # fmt: skip


@isa.tiled(parallel=True)
def matmul_team(a, b, out, mode, corr, scale, bias, zy, lo, hi, bounds):  # pragma: no cover
    """:func:`matmul` on items ``bounds[p]..bounds[p + 1]`` for each part ``p``."""
    for p in numba.prange(bounds.size - 1):
        matmul(a, b, out, mode, corr, scale, bias, zy, lo, hi, bounds[p], bounds[p + 1])


@isa.tiled()
def row_words(a, out, flip, shift):  # pragma: no cover - numba
    """Rows of integers ``a`` (rows, depth) into ``out`` (rows padded, groups) words:
    bytes ``a ^ flip`` (VNNI) or int16 ``a - shift`` (pairs), padding zero."""
    rows, depth = a.shape
    flat = out.reshape(-1)
    for i in range(flat.size):
        flat[i] = 0
    per = _U(out.shape[1] * GROUP)
    if GROUP == 4:
        bytes_ = flat.view(np.uint8)
        for r in range(_U(rows)):
            row = a[r]
            for k in range(_U(depth)):
                bytes_[r * per + k] = np.uint8(row[k]) ^ flip
    else:
        halves = flat.view(np.int16)
        for r in range(_U(rows)):
            row = a[r]
            for k in range(_U(depth)):
                halves[r * per + k] = np.int16(row[k]) - shift


# -- DynamicQuantizeLinear ---------------------------------------------------------------------


@njit
def quantize_range(x, y, scale, zero):  # pragma: no cover - numba
    """``y = clamp(rint(x / scale) + zero, 0, 255)`` as uint8, float32 throughout: the
    numpy DynamicQuantizeLinear's operations in its order (same bits), in one pass."""
    flat = x.reshape(-1)
    out = y.reshape(-1)
    for i in range(flat.size):
        q = np.rint(flat[i] / scale) + zero
        q = np.float32(0.0) if q < 0 else q
        q = np.float32(255.0) if q > 255 else q
        out[i] = np.uint8(q)


# -- QuantizeLinear, DequantizeLinear and their chains, per tensor ------------------------------
# Each is the float32 operations of the numpy kernels in the same order (same bits), in
# one pass instead of one numpy pass per operation.


@njit
def quantize(x, y, scale, zero, lo, hi):  # pragma: no cover - numba
    """``y = saturate(rint(x / scale) + zero)`` (float32; NaN saturates to ``lo``)."""
    flat = x.reshape(-1)
    out = y.reshape(-1)
    low, high = np.float32(lo), np.float32(hi)
    for i in range(flat.size):
        q = np.rint(flat[i] / scale) + zero
        q = low if q != q else q
        q = low if q < low else q
        q = high if q > high else q
        out[i] = np.int32(q)


@njit
def dequantize(x, y, scale, zero):  # pragma: no cover - numba
    """``y = (float32(x) - zero) * scale`` in float32."""
    flat = x.reshape(-1)
    out = y.reshape(-1)
    for i in range(flat.size):
        out[i] = (np.float32(flat[i]) - zero) * scale


@njit
def quantized_add(a, b, y, sa, za, sb, zb, sy, zy, relu, lo, hi):  # pragma: no cover - numba
    """``y = Q(DQ(a) + DQ(b))``, through a Relu when ``relu``: what DequantizeLinear,
    Add (or Sum), Relu and QuantizeLinear compute, in float32, in one pass."""
    fa = a.reshape(-1)
    fb = b.reshape(-1)
    out = y.reshape(-1)
    low, high = np.float32(lo), np.float32(hi)
    zero = np.float32(0.0)
    for i in range(fa.size):
        v = (np.float32(fa[i]) - za) * sa + (np.float32(fb[i]) - zb) * sb
        if relu:
            v = zero if v < zero else v
        q = np.rint(v / sy) + zy
        q = low if q < low else q
        q = high if q > high else q
        out[i] = np.int32(q)


# -- depthwise convolution ----------------------------------------------------------------------
# One filter per channel has too little depth for the GEMM tiles (nine taps): the sums run
# directly, a row of outputs at a time, in int32.


@njit
def shifted_input(x, out, shift, top, left):  # pragma: no cover - numba
    """One image ``x`` (channels, height, width) into ``out`` (channels, padded height,
    padded width) int16 as ``x - shift``, the padding 0 (the zero point's real value)."""
    channels, height, width = x.shape
    flat = out.reshape(-1)
    for i in range(flat.size):
        flat[i] = 0
    offset = _U(left)
    for c in range(channels):
        for h in range(height):
            row = out[c, h + top]
            src = x[c, h]
            for w in range(_U(width)):
                row[offset + w] = np.int16(np.int32(src[w]) - shift)


@njit
def depthwise(xp, w, out, geo, corr, mult, zy, lo, hi):  # pragma: no cover - numba
    """A depthwise convolution of :func:`shifted_input`'s ``xp``: ``w`` (channels, taps)
    int32, ``out`` (channels, out height, out width) integers, ``geo``: kernel height and
    width, strides, dilations; requantized as :func:`_requantize` (``corr``: the bias).

    At stride 1 each tap is one long loop over the padded plane (an output pixel at
    ``oh * padded_width + ow``, the columns between rows computed and dropped), so the
    loops are long enough to vectorize; other strides go a row at a time."""
    channels, out_h, out_w = out.shape
    cols = xp.shape[2]
    kh, kw, sh, sw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    low, high = np.float32(lo - zy), np.float32(hi - zy)
    zero = np.int32(zy)
    flat_out = _U((out_h - 1) * cols + out_w)
    acc = np.empty(out_h * cols, np.int32)
    step = _U(sw)
    for c in range(channels):
        f, b = mult[c], corr[c]
        plane = xp[c].reshape(-1)
        if sh == 1 and sw == 1:
            for p in range(flat_out):
                acc[p] = b
            for i in range(kh):
                for j in range(kw):
                    weight = w[c, i * kw + j]
                    off = _U(i * dh * cols + j * dw)
                    for p in range(flat_out):
                        acc[p] = np.int32(acc[p] + np.int32(plane[p + off]) * weight)
        else:
            for oh in range(out_h):
                base = _U(oh * cols)
                for q in range(_U(out_w)):
                    acc[base + q] = b
                for i in range(kh):
                    for j in range(kw):
                        weight = w[c, i * kw + j]
                        start = _U((oh * sh + i * dh) * cols + j * dw)
                        for q in range(_U(out_w)):
                            v = np.int32(plane[start + q * step])
                            acc[base + q] = np.int32(acc[base + q] + v * weight)
        for oh in range(out_h):
            dst = out[c, oh]
            base = _U(oh * cols)
            for q in range(_U(out_w)):
                y = np.rint(np.float32(acc[base + q]) * f)
                y = low if y < low else y
                y = high if y > high else y
                dst[q] = np.int32(y) + zero
