"""Quantized models on the cpu EP: integer kernels, the QDQ and dynamic-quantization
passes, and issue 31's correctness bar on models ``onnxruntime.quantization`` writes.

* The integer kernels (``ops/_quant_gemm.py``, every engine level the CPU runs) give
  the very bits of the numpy kernels, whose integer sums are exact.
* The passes fold QDQ Conv/MatMul/Gemm/Add chains and MatMulInteger -> Cast -> Mul ->
  Add; the dynamic-quantization fusion changes no bit of nxrt's unfused run.
* The bar: nxrt's outputs are no further from ONNX Runtime with ``ORT_DISABLE_ALL`` (the
  operators as the spec writes them) than ONNX Runtime's optimized outputs are, and a
  classifier's top class is one ONNX Runtime gives with or without its optimizations.
* Determinism: the same bits on every run and at one or two threads.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import nxrt
from nxrt_ep_cpu.ops import _quant_gemm as qk
from nxrt_ep_cpu.ops import quant

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import int8_models  # noqa: E402

RNG = np.random.default_rng(31)


def _levels() -> list[str]:
    from nxrt_ep_cpu.jit import qgemm

    host = qgemm.level()
    return {"vnni512": ["vnni512", "vnni256", "pairs"], "vnni256": ["vnni256", "pairs"]}.get(
        host, ["pairs"]
    )


@pytest.fixture(params=_levels())
def level(request, monkeypatch):
    """Kernels built in the test use this engine level (one the CPU runs)."""
    from nxrt_ep_cpu.jit import qgemm

    monkeypatch.setattr(qgemm, "level", lambda: request.param)
    return request.param


def _ints(shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape, dtype=dtype)


def _scale(*shape) -> np.ndarray:
    return RNG.uniform(0.001, 0.02, shape).astype(np.float32)


# -- kernels against the numpy kernels -------------------------------------------------------

CONV_CASES = [
    # channels, height, width, filters, kernel, stride, pad, dilation, group
    (3, 17, 19, 16, 3, 2, 1, 1, 1),
    (16, 12, 12, 24, 1, 1, 0, 1, 1),
    (20, 9, 11, 12, 3, 1, 1, 2, 1),
    (12, 8, 8, 18, 3, 1, 1, 1, 3),
    (8, 10, 10, 8, 3, 2, 1, 1, 8),
    (6, 9, 11, 6, 3, 1, 2, 2, 6),
    (64, 7, 7, 70, 3, 1, 1, 1, 1),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
@pytest.mark.parametrize("weights", ["symmetric", "zero point"])
def test_qlinear_conv_kernel_is_the_numpy_kernel(level, case, x_type, weights):
    c, h, w, m, k, stride, pad, dilation, group = case
    x = _ints((2, c, h, w), x_type)
    wq = _ints((m, c // group, k, k), np.int8)
    w_zero = np.zeros(m, np.int8) if weights == "symmetric" else _ints((m,), np.int8)
    args = (
        x, _scale(), np.array(_ints((), x_type)), wq, _scale(m), w_zero, _scale() * 40,
        np.array(128, np.uint8), RNG.integers(-5000, 5000, m, dtype=np.int32),
    )  # fmt: skip
    attrs = {"strides": [stride] * 2, "pads": [pad] * 4, "dilations": [dilation] * 2}
    attrs["group"] = group
    kernel = qk.QLinearConvKernel(quant.q_linear_conv, attrs, None)
    got = kernel.run(*args)
    assert kernel._plan is not None, "the integer engine refused a case it takes"
    np.testing.assert_array_equal(got, quant.q_linear_conv(*args, **attrs))


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("a_type", [np.uint8, np.int8])
@pytest.mark.parametrize("b_type", [np.int8, np.uint8])
def test_matmul_integer_kernels_are_the_numpy_kernels(level, rows, a_type, b_type):
    k, n = 70, 45
    a = _ints((2, rows, k), a_type)
    b = _ints((k, n), b_type)
    a_zero, b_zero = np.array(_ints((), a_type)), _ints((n,), b_type)
    integer = qk.MatMulIntegerKernel(quant.mat_mul_integer, {}, None)
    np.testing.assert_array_equal(
        integer.run(a, b, a_zero, b_zero), quant.mat_mul_integer(a, b, a_zero, b_zero)
    )
    args = (a, b, _scale(), _scale(n), a_zero, b_zero, RNG.standard_normal(n).astype(np.float32))
    to_float = qk.MatMulIntegerToFloatKernel(quant.mat_mul_integer_to_float, {}, None)
    np.testing.assert_array_equal(to_float.run(*args), quant.mat_mul_integer_to_float(*args))
    args = (a, _scale(), a_zero, b, _scale(n), b_zero, _scale() * 60, np.array(7, np.int8))
    linear = qk.QLinearMatMulKernel(quant.q_linear_mat_mul, {}, None)
    np.testing.assert_array_equal(linear.run(*args), quant.q_linear_mat_mul(*args))
    assert integer._weights is not None and linear._weights is not None


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("quantized", [True, False])
def test_qgemm_kernel_is_the_numpy_kernel(level, trans_b, quantized):
    m, k, n = 3, 50, 33
    a = _ints((m, k), np.uint8)
    b = _ints((n, k) if trans_b else (k, n), np.int8)
    args = [a, _scale(), np.array(3, np.uint8), b, _scale(n), np.zeros(n, np.int8)]
    args.append(RNG.integers(-3000, 3000, n, dtype=np.int32))
    if quantized:
        args += [_scale() * 50, np.array(100, np.uint8)]
    attrs = {"alpha": 0.5, "transB": trans_b}
    kernel = qk.QGemmKernel(quant.q_gemm, attrs, None)
    np.testing.assert_array_equal(kernel.run(*args), quant.q_gemm(*args, **attrs))
    assert kernel._weights is not None


def test_elementwise_kernels_are_the_numpy_kernels():
    x = (RNG.standard_normal((3, 50, 7)) * 4).astype(np.float32)
    x[0, 0, :3] = [np.nan, 1e30, -1e30]
    quantize = qk.QuantizeKernel(quant.quantize_linear, {})
    for zero in (np.array(3, np.uint8), np.array(-9, np.int8), None):
        args = (x, np.array(0.03, np.float32), zero)
        np.testing.assert_array_equal(quantize.run(*args), quant.quantize_linear(*args))
    q = _ints((4, 33), np.int8)
    dequantize = qk.DequantizeKernel(quant.dequantize_linear, {})
    args = (q, np.array(0.07, np.float32), np.array(-3, np.int8))
    np.testing.assert_array_equal(dequantize.run(*args), quant.dequantize_linear(*args))
    dynamic = qk.DynamicQuantizeKernel(quant.dynamic_quantize_linear, {})
    for data in (x[1:], np.zeros((5, 5), np.float32), -np.abs(x[1:])):
        for got, want in zip(dynamic.run(data), quant.dynamic_quantize_linear(data)):
            np.testing.assert_array_equal(got, want)
    a, b = _ints((2, 8, 5, 5), np.uint8), _ints((2, 8, 5, 5), np.uint8)
    for relu in (0, 1):
        add = qk.QuantizedAddKernel(quant.quantized_add, {"relu": relu})
        args = (a, _scale(), np.array(128, np.uint8), b, _scale(), np.array(120, np.uint8),
                _scale(), np.array(0, np.uint8))  # fmt: skip
        np.testing.assert_array_equal(add.run(*args), quant.quantized_add(*args, relu=relu))


# -- models as onnxruntime.quantization writes them ------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tmp_path_factory.mktemp("int8"))


def _small(name: str, folder: str, mode: str) -> tuple[str, str, dict[str, np.ndarray]]:
    """A small model of ``test_determinism.py`` (or ``int8_models``) quantized as ``mode``."""
    import test_determinism

    model = {
        "cnn": test_determinism.cnn,
        "mlp": test_determinism.mlp,
        "attention": test_determinism.attention,
        "block": int8_models.block,
    }[name]()
    shape = {"cnn": (1, 1, 28, 28), "mlp": (1, 784), "attention": (1, 16, 128)}.get(name)
    float_path = os.path.join(folder, f"{name}.onnx")
    int8_path = os.path.join(folder, f"{name}.{mode}.onnx")
    if not os.path.exists(float_path):
        onnx.save(model, float_path)

    def feeds(seed: int) -> dict[str, np.ndarray]:
        if shape is None:
            return int8_models.feeds_for(model, seed)
        return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}

    if not os.path.exists(int8_path):
        int8_models.quantize(float_path, int8_path, mode, lambda seed: feeds(100 + seed))
    return float_path, int8_path, feeds(0)


def _ort(path: str, level=None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if level is not None:
        options.graph_optimization_level = level
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _nxrt(path: str, threads: int = 2, optimize: bool = True) -> nxrt.InferenceSession:
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads
    if not optimize:
        options.graph_optimization_level = nxrt.GraphOptimizationLevel.ORT_DISABLE_ALL
    return nxrt.InferenceSession(path, options, providers=["cpu"])


def _distance(outputs: list, reference: list) -> float:
    return max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
        for a, b in zip(outputs, reference, strict=True)
    )


def _bar(int8_path: str, feeds: dict[str, np.ndarray]) -> tuple[float, float, list, list, list]:
    unfused = _ort(int8_path, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feeds)
    fused = _ort(int8_path).run(None, feeds)
    ours = _nxrt(int8_path).run(None, feeds)
    return _distance(ours, unfused), _distance(fused, unfused), ours, fused, unfused


STATIC = ["cnn", "attention", "block", "squeezenet"]


@pytest.mark.parametrize("name", STATIC)
def test_static_qdq_models_meet_the_bar(name, folder):
    if name in int8_models.CNNS:
        _, int8_path, feeds = int8_models.build(name, folder)
    else:
        _, int8_path, feeds = _small(name, folder, "static")
    ours, theirs, got, fused, unfused = _bar(int8_path, feeds)
    assert ours <= theirs, f"nxrt {ours} from the unfused arithmetic, ONNX Runtime {theirs}"
    if np.asarray(unfused[0]).size == 1000:
        top = int(np.argmax(got[0]))
        assert top in {int(np.argmax(unfused[0])), int(np.argmax(fused[0]))}


def test_static_qdq_chains_become_integer_kernels(folder):
    _, int8_path, _ = int8_models.build("squeezenet", folder)
    ops = Counter(step.op_type for step in _nxrt(int8_path)._plan.steps)
    assert ops["QLinearConv"] == 26 and not ops["Conv"], ops
    _, int8_path, _ = _small("cnn", folder, "static")
    session = _nxrt(int8_path)
    ops = Counter(step.op_type for step in session._plan.steps)
    assert ops["QLinearConv"] == 4 and ops["QGemm"] == 1 and not ops["Conv"], ops
    assert session.get_partition().fused


@pytest.mark.parametrize("name", ["mlp", "attention", "block"])
def test_dynamic_quantization_fusion_changes_no_bit(name, folder):
    """MatMulInteger -> Cast -> Mul -> Add becomes one MatMulIntegerToFloat whose run is
    bit for bit nxrt's run of the four ops (its integer product is exact)."""
    _, int8_path, feeds = _small(name, folder, "dynamic")
    fused = _nxrt(int8_path)
    ops = Counter(step.op_type for step in fused._plan.steps)
    assert ops["MatMulIntegerToFloat"] and not ops["MatMulInteger"], ops
    plain = _nxrt(int8_path, optimize=False)
    assert "MatMulInteger" in {step.op_type for step in plain._plan.steps}
    for a, b in zip(fused.run(None, feeds), plain.run(None, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["mlp", "attention", "block"])
def test_dynamic_models_are_as_close_as_the_float_kernels_allow(name, folder):
    """The bar on dynamic models, up to what nxrt's float kernels (LayerNormalization,
    Softmax, Erf, float MatMul) differ from ONNX Runtime's on the float model: the integer
    parts add nothing of their own (see the test above), but a float difference upstream of
    a DynamicQuantizeLinear can move a value across a rounding boundary."""
    float_path, int8_path, feeds = _small(name, folder, "dynamic")
    ours, theirs, *_ = _bar(int8_path, feeds)
    floor = _distance(_nxrt(float_path).run(None, feeds), _ort(float_path).run(None, feeds))
    assert ours <= max(theirs, 4 * floor), (ours, theirs, floor)


@pytest.mark.parametrize("name,mode", [("squeezenet", "static"), ("block", "dynamic")])
def test_quantized_runs_are_deterministic(name, mode, folder):
    if name in int8_models.CNNS:
        _, int8_path, feeds = int8_models.build(name, folder)
    else:
        _, int8_path, feeds = _small(name, folder, mode)
    two, one = _nxrt(int8_path, threads=2), _nxrt(int8_path, threads=1)
    first = two.run(None, feeds)
    for session in (two, one):
        for _ in range(5):
            for a, b in zip(session.run(None, feeds), first, strict=True):
                np.testing.assert_array_equal(a, b)


# -- the instruction set ---------------------------------------------------------------------


def _dot_assembly(name: str) -> str:
    """The machine code of one multiply-add of level ``name``, compiled apart (not cached)."""
    import numba

    from nxrt_ep_cpu.jit import qgemm

    dot = qgemm.operations(name)["_dotv"]

    def body(acc, v, b):  # pragma: no cover - compiled by numba
        dot(acc, 0, v, 0, b, 0)

    kernel = numba.njit(cache=False)(body)
    lanes = qgemm.LEVELS[name].lanes
    acc, v, b = np.zeros(lanes, np.int32), np.ones(lanes, np.uint32), np.ones(1, np.uint32)
    kernel(acc, v, b)
    return "\n".join(kernel.inspect_asm().values())


def test_each_level_multiplies_with_its_instruction(level):
    code = _dot_assembly(level)
    if level.startswith("vnni"):
        assert "vpdpbusd" in code
        assert ("zmm" in code) == (level == "vnni512")
    else:
        assert "vpmaddwd" in code or "vpdpwssd" in code or "pmaddwd" in code


@pytest.mark.skipif(
    os.environ.get("NUMBA_CPU_NAME") != "haswell", reason="runs under make test-avx2"
)
def test_a_forced_avx2_target_uses_the_int16_pairs():
    from nxrt_ep_cpu.jit import qgemm

    assert qgemm.level() == "pairs"
