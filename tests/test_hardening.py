"""Bad input of every kind ends in a typed nxrt error, and nothing is lost.

One test per class of bad input (models, feeds, sizes, plugins), then the
long-running guarantees: concurrent runs agree with sequential ones, and
sessions created and dropped in a loop do not leak memory or threads.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
from nxrt.errors import (
    EpLoadFailed,
    EpPanicked,
    InvalidArgument,
    InvalidModel,
    KernelFailed,
    NoEpForOp,
    NxrtError,
    OutOfMemory,
)
from nxrt.host import Host
from nxrt.tools.testing import light_model_path

SQUEEZENET = light_model_path("squeezenet")


def model_of(nodes, inputs, outputs, initializers=(), opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *extra_opsets]
    return helper.make_model(graph, opset_imports=opsets)


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


# -- models ----------------------------------------------------------------------------------


def test_truncated_and_random_bytes_are_invalid_model():
    data = open(SQUEEZENET, "rb").read()
    for blob in (data[: len(data) // 2], data[:100], os.urandom(4096), b""):
        with pytest.raises(InvalidModel):
            nxrt.InferenceSession(blob)


@pytest.mark.parametrize(
    "nodes, inputs, message",
    [
        (
            [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
            [vi("x", [2])],
            "'y' has been used as output names multiple times",
        ),
        (
            [helper.make_node("Add", ["x", "ghost"], ["y"])],
            [vi("x", [2])],
            "ghost",
        ),
        (
            [helper.make_node("Relu", ["z"], ["w"]), helper.make_node("Relu", ["w"], ["z"])],
            [vi("x", [2])],
            "topologically sorted",
        ),
    ],
    ids=["duplicate-output", "dangling-input", "cycle"],
)
def test_malformed_graphs_are_invalid_model(nodes, inputs, message):
    output = nodes[-1].output[0]
    with pytest.raises(InvalidModel, match=message):
        nxrt.InferenceSession(model_of(nodes, inputs, [vi(output, [2])]))


def test_unknown_op_and_domain_are_no_ep_for_op():
    model = model_of(
        [helper.make_node("Frob", ["x"], ["y"], domain="com.unknown")],
        [vi("x", [2])],
        [vi("y", [2])],
        extra_opsets=[helper.make_opsetid("com.unknown", 1)],
    )
    with pytest.raises(NoEpForOp, match="com.unknown::Frob"):
        nxrt.InferenceSession(model, providers=["cpu"])


def test_an_opset_newer_than_supported_is_refused():
    model = model_of(
        [helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])], opset=99
    )
    with pytest.raises(InvalidModel, match="opset 99 .* newer than the newest"):
        nxrt.InferenceSession(model)


def test_dims_whose_byte_count_overflows_are_refused():
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**31, 2**31])
    weight.raw_data = b"\0" * 8
    model = model_of(
        [helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [2])], [vi("y", [2])], [weight]
    )
    with pytest.raises(InvalidModel, match="too large"):
        nxrt.InferenceSession(model)


def test_an_absurd_size_computed_at_run_time_is_a_typed_error():
    model = model_of(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill")],
        [vi("shape", [2], TensorProto.INT64)],
        [vi("y", None)],
    )
    session = nxrt.InferenceSession(model, providers=["cpu"])
    with pytest.raises(OutOfMemory, match="node 'fill'"):  # before numpy allocates
        session.run(None, {"shape": np.array([2**40, 2**40], np.int64)})
    with pytest.raises(KernelFailed, match="node 'fill'"):
        session.run(None, {"shape": np.array([-3, 2], np.int64)})
    (y,) = session.run(None, {"shape": np.array([2, 3], np.int64)})  # still usable
    assert y.shape == (2, 3)


def test_the_users_model_file_is_never_modified(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(open(SQUEEZENET, "rb").read())
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    session = nxrt.InferenceSession(str(path), providers=["cpu"])
    session.run(None, {"data_0": np.zeros((1, 3, 224, 224), np.float32)})
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime


# -- feeds -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def squeezenet():
    return nxrt.InferenceSession(SQUEEZENET, providers=["cpu"])


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({}, r"Required inputs \(\[.data_0.\]\) are missing"),
        ({"data_0": np.zeros((1, 3, 224, 224), np.float32), "extra": 1}, "unknown input"),
        ({"data_0": np.zeros((1, 3, 224, 224), np.int32)}, "dtype int32, expected float32"),
        ({"data_0": np.zeros((3, 224, 224), np.float32)}, "rank 3"),
        ({"data_0": np.zeros((1, 3, 224, 225), np.float32)}, "dim 225 on axis 3"),
        ({"data_0": "a string"}, "dtype <U8"),
    ],
)
def test_bad_feeds_say_what_was_expected(squeezenet, feeds, message):
    with pytest.raises(InvalidArgument, match=message):
        squeezenet.run(None, feeds)


def test_feeds_are_never_written_to(squeezenet):
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    x.flags.writeable = False
    strided = np.repeat(x, 2, axis=3)[..., ::2]
    before = strided.copy()
    a = squeezenet.run(None, {"data_0": x})[0]
    b = squeezenet.run(None, {"data_0": strided})[0]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(strided, before)


# -- plugins ----------------------------------------------------------------------------------


class Broken:
    """A plugin whose hooks misbehave in the way chosen."""

    def __init__(self, fault: str) -> None:
        self.fault = fault

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        if self.fault == "register raises":
            raise RuntimeError("boom")
        if self.fault == "register returns junk":
            registry.add_provider("broken", factory=42)

    @nxrt.hookimpl
    def nxrt_ep_capabilities(self, ep):
        if self.fault == "capabilities wrong type":
            return {"flags": ["nxrt"]}
        return None


@pytest.mark.parametrize(
    "fault", ["register raises", "register returns junk", "capabilities wrong type"]
)
def test_a_faulty_plugin_is_isolated(nxrt_pm, monkeypatch, fault):
    import nxrt_ep_cpu.plugin

    monkeypatch.delenv("NXRT_STRICT_PLUGINS")
    nxrt_pm.register(nxrt_ep_cpu.plugin, name="cpu")
    nxrt_pm.register(Broken(fault), name="broken")
    session = nxrt.InferenceSession(SQUEEZENET, providers=["cpu"], plugin_manager=nxrt_pm)
    assert session.get_providers() == ["cpu"]
    failures = [f for f in session._host.failures if isinstance(f, EpLoadFailed)]
    assert failures and all(f.path == "broken" for f in failures)
    session.run(None, {"data_0": np.zeros((1, 3, 224, 224), np.float32)})


def test_a_plugin_asked_for_by_name_fails_loudly_with_its_cause(nxrt_pm):
    class Unbuildable:
        @nxrt.hookimpl
        def nxrt_register(self, registry):
            def factory(config):
                raise ImportError("libaccel.so.3: cannot open shared object file")

            registry.add_provider("accel", factory)

    nxrt_pm.register(Unbuildable(), name="accel")
    with pytest.raises(EpLoadFailed, match="libaccel.so.3") as info:
        nxrt.InferenceSession(SQUEEZENET, providers=["accel"], plugin_manager=nxrt_pm)
    assert isinstance(info.value.__cause__, ImportError)
    assert not isinstance(info.value, EpPanicked)
    assert Host(nxrt_pm).build_registry().resolve("accel") is not None  # discovery was cheap


# -- another library's C++ that crashes -------------------------------------------------------
#: A model skl2onnx converts with ``decision_path`` (issue 33): onnx 1.23's shape inference
#: dies of a segmentation fault on its LabelEncoder, whose input nothing types.
REGRESSIONS = Path(__file__).parent / "regressions"
DECISION_PATH = REGRESSIONS / "decision_path_labelencoder_shape_inference.npz"

#: Run in a fresh interpreter: session(s) on the model, outputs against the expected ones.
_SESSION_SCRIPT = """
import logging, sys, threading
import numpy as np
import nxrt
from nxrt_fuzz.case import Case

logging.basicConfig(level=logging.INFO, format="%(message)s")
case = Case.load(sys.argv[1])
model = case.model.SerializeToString()
threads = int(sys.argv[2])
failures = []

def one():
    try:
        for _ in range(2):
            session = nxrt.InferenceSession(model, providers=["cpu"])
            got = session.run(None, case.feeds)
            for name, value in zip(case.output_names(), got):
                want = case.expected[name]
                if want.dtype.kind == "f":
                    np.testing.assert_allclose(value, want, rtol=1e-6)
                else:
                    assert value.tolist() == want.tolist(), (name, value, want)
    except BaseException as exc:
        failures.append(repr(exc))

workers = [threading.Thread(target=one) for _ in range(threads)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
print("failures:", failures)
print("outputs agree" if not failures else "outputs differ")
"""


def _python(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_onnx_shape_inference_still_crashes_on_the_decision_path_model():
    """The premise of the tests below (onnx 1.23): if onnx fixes it, they still hold, and
    this one says the workaround's premise is gone."""
    script = (
        "import sys, onnx; from nxrt_fuzz.case import Case; "
        "onnx.shape_inference.infer_shapes(Case.load(sys.argv[1]).model)"
    )
    done = _python("-c", script, str(DECISION_PATH))
    assert done.returncode == -signal.SIGSEGV, (done.returncode, done.stderr[-2000:])


@pytest.mark.parametrize(
    "mode, threads",
    [("fork", 1), ("helper", 1), ("fork", 4)],
    ids=["direct_fork", "helper_process", "four_threads"],
)
def test_a_model_that_crashes_onnx_runs_and_its_process_lives(mode, threads):
    """A session on a model that crashes onnx's shape inference: the process lives, the
    model runs and gives onnxruntime's outputs, and the log says what happened."""
    done = _python(
        "-c", _SESSION_SCRIPT, str(DECISION_PATH), str(threads), env={"NXRT_CONTAINED": mode}
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    assert "outputs agree" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "onnx's shape inference crashed on this model" in done.stderr
    assert "was killed by SIGSEGV" in done.stderr


#: Tasks for :func:`nxrt.pipeline.contained.run`, written to a module the helper can import too.
_TASKS = """
import ctypes

def double(value, emit):
    emit(value * 2)

def crash(emit):
    emit(b"before the crash")
    ctypes.string_at(0)

def fail(emit):
    emit(b"before the error")
    raise ValueError("a Python error")
"""

_RUN_SCRIPT = """
import json
from nxrt.pipeline import contained
import tasks

report = {"double": contained.run(tasks.double, b"ab")[0].decode()}
for name in ("crash", "fail"):
    try:
        contained.run(getattr(tasks, name))
    except contained.ChildDied as died:
        report[name] = [died.reason, [r.decode() for r in died.records]]
report["after"] = contained.run(tasks.double, b"cd")[0].decode()
print(json.dumps(report))
"""


@pytest.mark.parametrize("mode", ["fork", "helper"])
def test_a_crash_in_a_contained_task_is_reported_with_what_it_sent(tmp_path, mode):
    """A segmentation fault or an exception in the child ends only the child: the caller
    gets :class:`~nxrt.pipeline.contained.ChildDied` with the records sent before, and goes on."""
    (tmp_path / "tasks.py").write_text(_TASKS)
    env = {"NXRT_CONTAINED": mode, "PYTHONPATH": str(tmp_path)}
    done = _python("-c", _RUN_SCRIPT, env=env)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["double"] == "abab" and report["after"] == "cdcd"
    assert report["crash"] == ["was killed by SIGSEGV", ["before the crash"]]
    assert report["fail"] == ["raised ValueError: a Python error", ["before the error"]]


def test_a_checker_that_does_not_finish_in_time_is_an_invalid_model(monkeypatch):
    """A child that outlives ``NXRT_CONTAINED_TIMEOUT`` is killed, and a model whose check
    never finished is refused with a message that says so."""
    count = 20000
    nodes = [helper.make_node("Identity", [f"v{i}"], [f"v{i + 1}"]) for i in range(count)]
    model = model_of(nodes, [vi("v0", [2])], [vi(f"v{count}", [2])])
    monkeypatch.setenv("NXRT_CONTAINED_TIMEOUT", "0.001")
    with pytest.raises(InvalidModel, match="did not finish in 0.001 s"):
        nxrt.InferenceSession(model.SerializeToString(), providers=["cpu"])


# -- time and memory --------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_sessions_created_and_dropped_do_not_leak():
    model = model_of(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Relu", ["h"], ["y"]),
        ],
        [vi("x", ["n", 64])],
        [vi("y", ["n", 64])],
        [numpy_helper.from_array(np.ones((64, 64), np.float32), "w")],
    ).SerializeToString()
    x = np.ones((4, 64), np.float32)

    def cycle(count):
        for _ in range(count):
            session = nxrt.InferenceSession(model, providers=["cpu"])
            session.run(None, {"x": x})
            del session
        gc.collect()

    cycle(100)  # warm caches and allocator pools
    threads, rss = threading.active_count(), rss_bytes()
    cycle(1000)
    growth = rss_bytes() - rss
    assert threading.active_count() <= threads
    assert growth < 20 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 1,000 sessions"


def test_errors_are_all_nxrt_errors():
    for name in ("InvalidModel", "InvalidArgument", "NoEpForOp", "KernelFailed", "EpPanicked"):
        assert issubclass(getattr(nxrt.errors, name), NxrtError)
