"""The cpu EP's compiled activations, GEMM epilogues and the fusions that feed them.

Every compiled loop (``nxrt_ep_cpu.jit.elementwise``) is checked against its numpy
reference (the registered op function) and a float64 formula, on random values,
edge shapes and NaN/inf; every op against ONNX Runtime through a one-node model;
every fusion by the graph it leaves and by its outputs against ONNX Runtime on the
unfused model.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
from nxrt.errors import KernelFailed
from nxrt.host_parallel import HostParallel
from nxrt_ep_cpu.ops import elementwise, nn
from nxrt_ep_cpu.ops import math as math_ops

RNG = np.random.default_rng(20)
SPECIAL = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-40, 3.0, -3.0, 9.5, -9.5, 90, -90, 1e20],
    np.float32,
)
SHAPES = [(), (0,), (1,), (17,), (3, 0, 4), (2, 3, 5, 7), (1, 1153)]


def values(shape: tuple[int, ...], scale: float = 3.0) -> np.ndarray:
    """Random float32 values of ``shape``, with the special values spread through them."""
    x = np.asarray(RNG.standard_normal(shape) * scale, np.float32)
    flat = x.reshape(-1)
    if flat.size:
        spots = RNG.choice(flat.size, min(flat.size, SPECIAL.size), replace=False)
        flat[spots] = SPECIAL[: spots.size]
    return x


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(over="ignore"):
        return np.where(x >= 0, 1 / (1 + np.exp(-x)), np.exp(x) / (1 + np.exp(x)))


def _tanh_gelu64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _hard_sigmoid64(x, alpha=0.2, beta=0.5):
    return np.clip(alpha * x.astype(np.float64) + beta, 0, 1)


#: (name, params, numpy reference of the registered op, float64 formula)
ACTIVATIONS = [
    ("Relu", (), elementwise.relu, lambda x: np.maximum(x.astype(np.float64), 0)),
    (
        "Clip",
        (-1.5, 2.0),
        lambda x: elementwise.clip_6(x, min=-1.5, max=2.0),
        lambda x: np.clip(x.astype(np.float64), -1.5, 2.0),
    ),
    (
        "LeakyRelu",
        (0.1,),
        lambda x: elementwise.leaky_relu(x, alpha=0.1),
        lambda x: np.where(x < 0, x.astype(np.float64) * np.float32(0.1), x),
    ),
    ("Sigmoid", (), elementwise.sigmoid, _sigmoid64),
    ("Tanh", (), elementwise.tanh, lambda x: np.tanh(x.astype(np.float64))),
    ("Erf", (), math_ops.erf, _erf64),
    (
        "Gelu",
        (),
        math_ops.gelu,
        lambda x: x.astype(np.float64) * (1 + _erf64(x / np.sqrt(2))) / 2,
    ),
    ("FastGelu", (), lambda x: math_ops.gelu(x, approximate="tanh"), _tanh_gelu64),
    (
        "Swish",
        (),
        math_ops.swish,
        lambda x: x.astype(np.float64) * _sigmoid64(x),
    ),
    (
        "HardSigmoid",
        (0.25, 0.4),
        lambda x: math_ops.hard_sigmoid(x, alpha=0.25, beta=0.4),
        lambda x: _hard_sigmoid64(x, 0.25, 0.4),
    ),
    (
        "HardSwish",
        (),
        math_ops.hard_swish,
        lambda x: x.astype(np.float64) * _hard_sigmoid64(x, 1 / 6, 0.5),
    ),
]
IDS = [a[0] for a in ACTIVATIONS]


def _assert_close(got, want, rtol=2e-6, atol=1e-6):
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


@pytest.fixture(scope="module")
def compiled():
    from nxrt_ep_cpu.jit import elementwise as compiled_ops

    return compiled_ops


@pytest.fixture(scope="module")
def pool():
    with HostParallel(2) as parallel:
        yield parallel


# -- the compiled loops against their references ----------------------------------------------


@pytest.mark.parametrize(("name", "params", "reference", "exact"), ACTIVATIONS, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_each_loop_matches_the_numpy_op_and_the_exact_function(
    compiled, name, params, reference, exact, shape
):
    x = values(shape)
    act = compiled.Activation(name, params)
    y = act.map(x)
    assert y.dtype == np.float32 and y.shape == x.shape and y.flags.c_contiguous
    with np.errstate(all="ignore"):
        want = reference(x)
        best = exact(x)
    _assert_close(y, want)
    finite = np.isfinite(best)
    _assert_close(y[finite], best[finite], rtol=4e-6, atol=1e-6)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    in_place = x.copy()
    assert act(in_place)
    np.testing.assert_array_equal(in_place, y)


@pytest.mark.parametrize(("name", "params", "reference", "exact"), ACTIVATIONS, ids=IDS)
def test_a_call_split_across_the_pool_equals_the_serial_one(
    compiled, pool, name, params, reference, exact
):
    x = values((3, 1 << 18))
    act = compiled.Activation(name, params)
    np.testing.assert_array_equal(act.map(x, pool), act.map(x))
    rows = x.copy()
    bias = values((x.shape[1],), 1.0)
    serial = x.copy()
    act.epilogue(rows, bias, pool)
    act.epilogue(serial, bias)
    np.testing.assert_array_equal(rows, serial)


@pytest.mark.parametrize(("name", "params", "reference", "exact"), ACTIVATIONS, ids=IDS)
@pytest.mark.parametrize("shape", [(0, 5), (1, 1), (7, 33), (64, 3072)], ids=str)
def test_epilogue_adds_the_bias_and_activates_each_row(
    compiled, pool, name, params, reference, exact, shape
):
    y = values(shape)
    bias = values(shape[1:], 1.0)
    with np.errstate(all="ignore"):
        want, plain_want = reference(y + bias), reference(y)
    got = y.copy()
    compiled.Activation(name, params).epilogue(got, bias, pool)
    _assert_close(got, want)
    plain = y.copy()
    compiled.Activation(name, params).epilogue(plain, None)
    _assert_close(plain, plain_want)


def test_bias_alone_is_added_in_place(compiled, pool):
    y = values((300, 2000))
    bias = values((2000,))
    got = y.copy()
    compiled.add_bias(got, bias, pool)
    np.testing.assert_array_equal(got, y + bias)


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[:, :, 1:4],  # rows of 3 values, 5 apart: a band of a FusedConv output
        lambda a: a[1],
        lambda a: a[:, 1:3, :],  # 2 x 5 contiguous values per outer index
        lambda a: a[:, :, ::2],  # a strided last axis: the numpy form
        lambda a: a.transpose(0, 2, 1),
    ],
)
def test_in_place_form_takes_views_with_contiguous_rows(compiled, view):
    base = values((4, 6, 5))
    got = base.copy()
    target = view(got)
    expected = elementwise.sigmoid(view(base))
    activate = elementwise.inplace_activation("Sigmoid")
    activate(target)
    _assert_close(view(got), expected)
    mask = np.zeros(base.shape, bool)
    view(mask)[...] = True
    np.testing.assert_array_equal(got[~mask], base[~mask])


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("Relu", ()),
        ("Clip", (0.0, 6.0)),
        ("Clip", (1.0,)),
        ("LeakyRelu", (0.2,)),
        ("Sigmoid", ()),
        ("Tanh", ()),
        ("Gelu", ()),
        ("FastGelu", ()),
        ("Swish", ()),
        ("HardSigmoid", (0.2, 0.5)),
        ("HardSigmoid", (0.3,)),
        ("HardSwish", ()),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_inplace_activation_matches_its_numpy_form_for_every_dtype(name, params, dtype):
    with np.errstate(all="ignore"):
        x = values((3, 50)).astype(dtype)
        want = x.copy()
        elementwise._numpy_activation(name, params)(want)
        got = x.copy()
        elementwise.inplace_activation(name, params)(got)
    tolerance = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 2e-6}[dtype]
    _assert_close(got.astype(np.float64), want.astype(np.float64), rtol=tolerance, atol=tolerance)


def test_an_unknown_fused_activation_is_refused():
    with pytest.raises(KernelFailed, match="unknown fused activation"):
        elementwise.inplace_activation("Cube")
    a, b = RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4))
    with pytest.raises(KernelFailed, match="unknown fused activation"):
        nn.fused_mat_mul(a, b, activation="Cube")


def test_importing_the_ep_does_not_import_numba():
    code = (
        "import sys, nxrt, nxrt_ep_cpu.plugin, nxrt_ep_cpu.ops, nxrt_ep_cpu.fusions; "
        "assert 'numba' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- one-node models against ONNX Runtime -----------------------------------------------------


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 19 else 10
    return model


def _value(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _session(model, threads=2):
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads
    return nxrt.InferenceSession(model.SerializeToString(), options, providers=["cpu"])


def _compare(model, feeds, threads=2, rtol=2e-6, atol=1e-6):
    """nxrt's outputs against ONNX Runtime's on the same (unfused) model; the plan's steps."""
    session = _session(model, threads)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    got = session.run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        _assert_close(g, w, rtol=rtol, atol=atol)
    return session, [(step.op_type, step.kernel) for step in session._plan.steps]


UNARY = [
    ("Relu", 14, {}),
    ("Sigmoid", 13, {}),
    ("Tanh", 13, {}),
    ("Erf", 13, {}),
    ("Gelu", 20, {}),
    ("Gelu", 20, {"approximate": "tanh"}),
    ("LeakyRelu", 16, {"alpha": 0.1}),
    ("LeakyRelu", 16, {}),
    ("HardSigmoid", 6, {}),
    ("HardSigmoid", 6, {"alpha": 0.3, "beta": 0.6}),
    ("HardSwish", 14, {}),
    ("Clip", 6, {"min": -1.0, "max": 2.0}),
    ("Clip", 6, {}),
]


@pytest.mark.parametrize(("op_type", "opset", "attrs"), UNARY, ids=lambda v: str(v))
@pytest.mark.parametrize("shape", [(), (0, 3), (1,), (5, 17), (2, 3, 1 << 17)], ids=str)
def test_activation_ops_match_onnxruntime(op_type, opset, attrs, shape):
    x = values(shape)
    node = helper.make_node(op_type, ["x"], ["y"], **attrs)
    model = _model([node], [_value("x", shape)], [_value("y", shape)], opset=opset)
    _, steps = _compare(model, {"x": x})
    assert steps[0][1].variant == ("" if op_type == "Tanh" else "numba")


@pytest.mark.parametrize(
    ("lo", "hi"), [(-1.0, 1.0), (None, 6.0), (0.0, None), (None, None), (2.0, -1.0)]
)
def test_clip_with_bounds_as_inputs_matches_onnxruntime(lo, hi):
    x = values((4, 301))
    names, inits = ["x"], []
    for name, bound in (("lo", lo), ("hi", hi)):
        names.append(name if bound is not None else "")
        if bound is not None:
            inits.append(numpy_helper.from_array(np.array(bound, np.float32), name))
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Clip", names, ["y"])
    model = _model([node], [_value("x", x.shape)], [_value("y", x.shape)], inits, opset=13)
    _compare(model, {"x": x})


def test_other_dtypes_and_strided_inputs_keep_the_numpy_path():
    node = helper.make_node("Sigmoid", ["x"], ["y"])
    x64 = values((3, 7)).astype(np.float64)
    info = helper.make_tensor_value_info
    model = _model(
        [node], [info("x", TensorProto.DOUBLE, [3, 7])], [info("y", TensorProto.DOUBLE, [3, 7])]
    )
    _compare(model, {"x": x64})
    kernel = _session(model)._plan.steps[0].kernel
    strided = values((6, 8))[:, ::2]
    _assert_close(kernel.direct_call(strided.astype(np.float32)), elementwise.sigmoid(strided))


# -- dense layers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((3, 5, 7), (7, 4)),
        ((2, 3, 5, 7), (7, 4)),
        ((7,), (7, 4)),
        ((0, 7), (7, 4)),
        ((3, 0), (0, 4)),
        ((2, 3, 0), (0, 4)),
        ((5, 7), (7,)),
        ((2, 5, 7), (2, 7, 3)),
        ((2, 1, 5, 7), (3, 7, 4)),
        ((16, 49, 96), (96, 384)),
        ((2, 12, 128, 64), (2, 12, 64, 128)),
        ((12, 50, 64), (12, 64, 30)),
        ((96, 64), (3, 64, 50)),
        ((1, 1024), (1024, 1000)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_matches_numpy_as_one_gemm_on_the_rows(shape_a, shape_b, dtype, threads):
    """One thread: BLAS; two: the EP's pool, each GEMM split or a batch spread."""
    a, b = values(shape_a, 1.0).astype(dtype), values(shape_b, 1.0).astype(dtype)
    a[np.isinf(a) | (np.abs(a) > 10)] = 1
    b[np.isinf(b) | (np.abs(b) > 10)] = 1
    with HostParallel(threads) as parallel:
        kernel = nn.MatMulKernel(nn.mat_mul, {}, parallel)
        got = kernel.direct_call(a, b)
        transposed = (
            kernel.direct_call(a, np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2))
            if b.ndim > 1
            else got
        )
    want = np.matmul(a, b)
    _assert_close(transposed, want, rtol=1e-5, atol=1e-4)
    assert got.dtype == want.dtype and got.shape == want.shape
    _assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "activation", ["", "Relu", "Tanh", "Sigmoid", "Gelu", "FastGelu", "Swish", "HardSwish"]
)
@pytest.mark.parametrize(("shape_a", "n"), [((1, 197, 64), 96), ((8, 32), 40), ((3, 0, 8), 5)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_fused_matmul_matches_its_reference(activation, shape_a, n, with_bias):
    a = RNG.standard_normal(shape_a).astype(np.float32)
    b = RNG.standard_normal((shape_a[-1], n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32) if with_bias else None
    attrs = {"activation": activation}
    with HostParallel(2) as parallel:
        kernel = nn.FusedMatMulKernel(nn.fused_mat_mul, attrs, parallel)
        got = kernel.direct_call(a, b, bias)
    want = nn.fused_mat_mul(a, b, bias, activation=activation)
    assert got.shape == want.shape
    _assert_close(got, want, rtol=1e-5, atol=1e-5)
    wide = nn.FusedMatMulKernel(nn.fused_mat_mul, attrs, None).direct_call(
        a.astype(np.float64),
        b.astype(np.float64),
        None if bias is None else bias.astype(np.float64),
    )
    assert wide.dtype == np.float64


@pytest.mark.parametrize(
    ("m", "k", "n", "attrs", "c_shape"),
    [
        (8, 256, 256, {"transB": 1}, (256,)),
        (1, 768, 100, {}, (1, 100)),
        (1, 768, 100, {"transB": 1}, (100,)),
        (64, 256, 256, {"transA": 1, "alpha": 0.5, "beta": 2.0}, (64, 256)),
        (5, 3, 4, {"beta": 0.0}, (4,)),
        (5, 3, 4, {}, (5, 1)),
        (5, 3, 4, {}, ()),
        (5, 3, 4, {}, None),
    ],
)
def test_gemm_matches_onnxruntime(m, k, n, attrs, c_shape):
    a_shape = (k, m) if attrs.get("transA") else (m, k)
    b_shape = (n, k) if attrs.get("transB") else (k, n)
    a = RNG.standard_normal(a_shape).astype(np.float32)
    inits = [numpy_helper.from_array(RNG.standard_normal(b_shape).astype(np.float32), "b")]
    inputs = ["a", "b"]
    if c_shape is not None:
        inits.append(numpy_helper.from_array(RNG.standard_normal(c_shape).astype(np.float32), "c"))
        inputs.append("c")
    node = helper.make_node("Gemm", inputs, ["y"], **attrs)
    model = _model([node], [_value("a", a_shape)], [_value("y", [m, n])], inits, opset=13)
    session, steps = _compare(model, {"a": a}, rtol=1e-4, atol=1e-4)
    gemm = next(n for n in session._plan.steps if n.op_type == "Gemm")
    # constant weights are stored untransposed, except for a matrix-vector product
    assert gemm.kernel.trans_b == (bool(attrs.get("transB")) and m == 1)


def test_gemm_weights_read_by_two_nodes_stay_transposed():
    w = RNG.standard_normal((6, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w"], ["y1"], transB=1, name="g1"),
        helper.make_node("Gemm", ["x", "w"], ["y2"], transB=1, name="g2"),
    ]
    model = _model(
        nodes,
        [_value("x", [3, 4])],
        [_value("y1", [3, 6]), _value("y2", [3, 6])],
        [numpy_helper.from_array(w, "w")],
    )
    _, steps = _compare(model, {"x": RNG.standard_normal((3, 4)).astype(np.float32)})
    assert all(kernel.trans_b for _, kernel in steps)


# -- fusions -----------------------------------------------------------------------------------


def _conv_model(tail, opset=17, residual=False, channels=6):
    """Conv (3x3, 6 filters) followed by the nodes ``tail(c)`` makes; output ``y``."""
    w = (RNG.standard_normal((channels, 4, 3, 3)) * 0.3).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(RNG.standard_normal(channels).astype(np.float32), "b"),
    ]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv")]
    inputs = [_value("x", [1, 4, 9, 9])]
    start = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"], name="residual"))
        inputs.append(_value("z", [1, channels, 9, 9]))
        start = "s"
    more, extra = tail(start)
    inits += extra
    return _model(nodes + more, inputs, [_value("y", [1, channels, 9, 9])], inits, opset)


def _feeds(model):
    return {
        i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in model.graph.input
    }


def swish(v):
    return [
        helper.make_node("Sigmoid", [v], ["sig"], name="sigmoid"),
        helper.make_node("Mul", ["sig", v], ["y"], name="mul"),
    ], []


SIXTH = float(np.float32(1 / 6))


def hard_swish_13(v, alpha=SIXTH):
    return [
        helper.make_node("HardSigmoid", [v], ["hs"], alpha=alpha, beta=0.5, name="hsig"),
        helper.make_node("Mul", [v, "hs"], ["y"], name="mul"),
    ], []


@pytest.mark.parametrize(
    ("tail", "opset", "activation"),
    [
        (swish, 17, "Swish"),
        (hard_swish_13, 13, "HardSwish"),
        (lambda v: ([helper.make_node("HardSwish", [v], ["y"], name="act")], []), 14, "HardSwish"),
        (
            lambda v: ([helper.make_node("HardSigmoid", [v], ["y"], name="act")], []),
            14,
            "HardSigmoid",
        ),
    ],
    ids=["silu", "hardswish-13", "hardswish-14", "hardsigmoid"],
)
@pytest.mark.parametrize("residual", [False, True])
def test_conv_activations_of_mobile_models_fuse_into_one_fused_conv(
    tail, opset, activation, residual
):
    model = _conv_model(tail, opset, residual)
    session, steps = _compare(model, _feeds(model), rtol=1e-5, atol=1e-5)
    assert [op for op, _ in steps] == ["FusedConv"]
    names = {name for name, _ in session.get_partition().fused}
    assert "conv" not in names and names >= ({"residual"} if residual else set())


@pytest.mark.parametrize(
    "tail",
    [
        # the sigmoid is read twice
        lambda v: (
            [
                helper.make_node("Sigmoid", [v], ["sig"]),
                helper.make_node("Mul", [v, "sig"], ["m"]),
                helper.make_node("Add", ["m", "sig"], ["y"]),
            ],
            [],
        ),
        # HardSigmoid with other constants: x * HardSigmoid(x) is not HardSwish
        lambda v: hard_swish_13(v, alpha=0.2),
        # a gate of another value
        lambda v: (
            [
                helper.make_node("Neg", [v], ["n"]),
                helper.make_node("Sigmoid", ["n"], ["sig"]),
                helper.make_node("Mul", [v, "sig"], ["y"]),
            ],
            [],
        ),
    ],
    ids=["gate-read-twice", "other-hard-sigmoid", "gate-of-another-value"],
)
def test_gated_activations_that_differ_are_left_alone(tail):
    model = _conv_model(tail, 13)
    _, steps = _compare(model, _feeds(model), rtol=1e-5, atol=1e-5)
    assert steps[0][0] == "Conv"


def _constants(**values_):
    return [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in values_.items()]


def tanh_gelu(v, cube="pow", half="first", out="y"):
    """GELU's tanh form as exporters write it (GPT-2's gelu_new), result ``out``."""
    nodes = []
    if cube == "pow":
        nodes.append(helper.make_node("Pow", [v, "three"], ["x3"]))
    else:
        nodes += [
            helper.make_node("Mul", [v, v], ["x2"]),
            helper.make_node("Mul", ["x2", v], ["x3"]),
        ]
    nodes += [
        helper.make_node("Mul", ["c", "x3"], ["cx3"]),
        helper.make_node("Add", [v, "cx3"], ["inner"]),
        helper.make_node("Mul", ["inner", "k"], ["arg"]),
        helper.make_node("Tanh", ["arg"], ["t"]),
        helper.make_node("Add", ["one", "t"], ["t1"]),
    ]
    if half == "first":
        nodes += [
            helper.make_node("Mul", [v, "half"], ["hx"]),
            helper.make_node("Mul", ["hx", "t1"], [out]),
        ]
    elif half == "last":
        nodes += [
            helper.make_node("Mul", [v, "t1"], ["xt"]),
            helper.make_node("Mul", ["xt", "half"], [out]),
        ]
    else:
        nodes += [
            helper.make_node("Mul", ["t1", "half"], ["ht"]),
            helper.make_node("Mul", [v, "ht"], [out]),
        ]
    consts = _constants(three=3.0, c=0.044715, k=math.sqrt(2 / math.pi), one=1.0, half=0.5)
    return nodes, consts


def erf_gelu(v, half="last"):
    nodes = [
        helper.make_node("Div", [v, "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["t1"]),
    ]
    if half == "last":
        nodes += [
            helper.make_node("Mul", [v, "t1"], ["xt"]),
            helper.make_node("Mul", ["xt", "half"], ["y"]),
        ]
    elif half == "first":
        nodes += [
            helper.make_node("Mul", [v, "half"], ["hx"]),
            helper.make_node("Mul", ["hx", "t1"], ["y"]),
        ]
    else:
        nodes += [
            helper.make_node("Mul", ["t1", "half"], ["ht"]),
            helper.make_node("Mul", [v, "ht"], ["y"]),
        ]
    return nodes, _constants(sqrt2=math.sqrt(2), one=1.0, half=0.5)


def _mlp_model(tail, shape=(2, 5, 16), n=24, opset=17):
    """MatMul by constant weights, bias Add, then the nodes ``tail(h)`` makes."""
    inits = [
        numpy_helper.from_array(
            (RNG.standard_normal((shape[-1], n)) * 0.5).astype(np.float32), "w"
        ),
        numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "bias"], ["h"], name="add"),
    ]
    more, extra = tail("h")
    out = [_value("y", [*shape[:-1], n])]
    return _model(nodes + more, [_value("x", list(shape))], out, inits + extra, opset)


@pytest.mark.parametrize(
    ("tail", "activation"),
    [
        (lambda v: tanh_gelu(v, "pow", "first"), "FastGelu"),
        (lambda v: tanh_gelu(v, "mul", "last"), "FastGelu"),
        (lambda v: tanh_gelu(v, "pow", "inside"), "FastGelu"),
        (lambda v: erf_gelu(v, "last"), "Gelu"),
        (lambda v: erf_gelu(v, "first"), "Gelu"),
        (lambda v: erf_gelu(v, "inside"), "Gelu"),
        (swish, "Swish"),
        (lambda v: ([helper.make_node("HardSwish", [v], ["y"])], []), "HardSwish"),
        (lambda v: ([helper.make_node("Gelu", [v], ["y"], approximate="tanh")], []), "FastGelu"),
    ],
    ids=[
        "tanh-pow-half-first",
        "tanh-mul-half-last",
        "tanh-pow-half-inside",
        "erf-half-last",
        "erf-half-first",
        "erf-half-inside",
        "silu",
        "hardswish",
        "gelu-20-tanh",
    ],
)
def test_transformer_activations_fuse_into_the_matmul(tail, activation):
    nodes, _ = tail("h")
    opset = 20 if any(node.op_type in ("Gelu", "HardSwish") for node in nodes) else 17
    model = _mlp_model(tail, opset=opset)
    _, steps = _compare(model, _feeds(model), rtol=1e-5, atol=1e-5)
    assert [op for op, _ in steps] == ["FusedMatMul"]
    assert steps[0][1].attrs["activation"] == activation


@pytest.mark.parametrize(
    "constants",
    [
        {"c": 0.0447},  # rounded: not GELU to float32 rounding
        {"k": 0.79788},
        {"three": 2.0},
    ],
)
def test_tanh_gelu_with_other_constants_is_left_alone(constants):
    def tail(v):
        nodes, consts = tanh_gelu(v)
        changed = [
            numpy_helper.from_array(np.array(constants[c.name], np.float32), c.name)
            if c.name in constants
            else c
            for c in consts
        ]
        return nodes, changed

    model = _mlp_model(tail)
    _, steps = _compare(model, _feeds(model), rtol=1e-5, atol=1e-5)
    assert [op for op, _ in steps][0] == "FusedMatMul"
    assert "activation" not in steps[0][1].attrs or not steps[0][1].attrs["activation"]
    assert "Tanh" in [op for op, _ in steps]


def test_gelu_input_read_outside_the_chain_is_not_fused():
    def tail(v):
        nodes, consts = tanh_gelu(v, out="g")
        return [*nodes, helper.make_node("Add", ["g", v], ["y"])], consts

    model = _mlp_model(tail)
    _, steps = _compare(model, _feeds(model), rtol=1e-5, atol=1e-5)
    assert "Tanh" in [op for op, _ in steps]


def test_a_vit_sized_mlp_block_matches_onnxruntime():
    """ViT-B/16's feed-forward layer (fewer rows): one FusedMatMul, its exact GELU applied on
    the session's pool."""
    model = _mlp_model(lambda v: erf_gelu(v), shape=(1, 197, 768), n=3072)
    _, steps = _compare(model, _feeds(model), rtol=1e-4, atol=1e-4)
    assert [op for op, _ in steps] == ["FusedMatMul"]
