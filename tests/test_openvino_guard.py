"""A model OpenVINO crashes on compiling never ends the caller's process.

OpenVINO 2026's CPU plugin dies with a segmentation fault compiling a
statically quantized DenseNet-121 as ``onnxruntime.quantization`` writes it
(QDQ around BatchNormalization, Mul and Add after a Concat). The openvino EP
compiles each claim in nxrt's helper process first (``nxrt_ep_openvino.guard``);
there the crash is a refusal, so the nodes run on cpu. Each case runs in a
fresh process: a crash that got through would end it, not the test run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from nxrt_ep_openvino import guard

import nxrt
from nxrt.pipeline import contained
from nxrt.tools.light_models import light_model_path

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
RUN = textwrap.dedent(
    """
    import sys, json, numpy as np, nxrt
    path, providers = sys.argv[1], sys.argv[2]
    session = nxrt.InferenceSession(path, providers=None if providers == "default" else
                                    providers.split(","))
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    out = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.save(sys.argv[3], out)
    print(json.dumps({"eps": sorted({n.ep for n in session.get_partition().nodes}),
                      "report": str(session.get_partition())}))
    """
)


def ort_run(path: str, x: np.ndarray, level: str) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if level == "disable"
        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def run(path: str, providers: str, out: str, cache: str, **env: str):
    # compiled kernels from the first run: the sessions compared run the same tier
    full = {**os.environ, "NXRT_CACHE_DIR": cache, "NXRT_CPU_COMPILE": "wait", **env}
    return subprocess.run(
        [sys.executable, "-c", RUN, path, providers, out], capture_output=True, text=True, env=full
    )


@pytest.fixture(scope="module")
def qdq_densenet(tmp_path_factory) -> str:
    """DenseNet-121 (the onnx package's light model, seeded weights) through
    ``quantize_static``: QDQ, per-channel int8 weights."""
    sys.path.insert(0, BENCHMARKS)
    try:
        import int8_models
    finally:
        sys.path.remove(BENCHMARKS)
    _, int8, _ = int8_models.build("densenet121", str(tmp_path_factory.mktemp("qdq")))
    return int8


@pytest.mark.slow
def test_a_model_openvino_crashes_on_runs_on_cpu_instead(qdq_densenet, tmp_path):
    cache = str(tmp_path / "cache")
    unguarded = run(
        qdq_densenet, "openvino,cpu", str(tmp_path / "x.npy"), cache, NXRT_OPENVINO_CONTAIN="0"
    )
    assert unguarded.returncode == -11, "OpenVINO no longer crashes here: pick another model"
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    unfused, fused = (ort_run(qdq_densenet, x, level) for level in ("disable", "all"))
    bar = np.abs(fused - unfused).max()  # the int8 bar: no further from the spec than ORT
    for providers in ("openvino,cpu", "default"):
        done = run(qdq_densenet, providers, str(tmp_path / "ov.npy"), cache)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert "openvino" not in report["eps"]
        if providers == "openvino,cpu":  # (the default session may choose another EP)
            assert report["eps"] == ["cpu"]
            assert "crashes compiling it (was killed by SIGSEGV" in report["report"]
        assert np.abs(np.load(tmp_path / "ov.npy") - unfused).max() <= bar
    verdicts = os.listdir(os.path.join(cache, "openvino", "verdicts"))
    assert any(open(os.path.join(cache, "openvino", "verdicts", v)).read() for v in verdicts)


def test_a_claim_is_compiled_in_the_helper_once_then_from_the_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("NXRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(guard.CrashGuard, "_verdicts", {})
    asked = []
    real = contained.run

    def counted(task, *args, **kwargs):
        if task is guard.compile_in_child:
            asked.append(task.__name__)
            assert kwargs == {"fork": False}  # never a fork of this process (OpenVINO's)
        return real(task, *args, **kwargs)

    monkeypatch.setattr(contained, "run", counted)
    model = light_model_path("squeezenet")
    first = nxrt.InferenceSession(model, providers=["openvino", "cpu"])
    assert asked == ["compile_in_child"]
    assert {n.ep for n in first.get_partition().nodes} == {"openvino"}
    (verdict,) = os.listdir(tmp_path / "openvino" / "verdicts")
    assert (tmp_path / "openvino" / "verdicts" / verdict).read_bytes() == b""  # it compiled
    monkeypatch.setattr(guard.CrashGuard, "_verdicts", {})  # a new process: from the disk
    nxrt.InferenceSession(model, providers=["openvino", "cpu"])
    assert asked == ["compile_in_child"]
    monkeypatch.setenv(guard.CONTAIN_ENV, "0")
    monkeypatch.setattr(guard.CrashGuard, "_verdicts", {})
    os.remove(tmp_path / "openvino" / "verdicts" / verdict)
    nxrt.InferenceSession(model, providers=["openvino", "cpu"])
    assert asked == ["compile_in_child"]  # turned off: nothing asked


def test_a_crash_in_the_helper_is_a_cached_refusal(tmp_path, monkeypatch):
    """The verdict of a crash (here the helper's child killed before it answers) is a
    reason that names it, kept on disk; a helper that cannot run at all decides nothing."""
    monkeypatch.setenv("NXRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(guard.CrashGuard, "_verdicts", {})
    keeper = guard.CrashGuard("test", "CPU", {})

    def killed(task, *args, **kwargs):
        raise contained.ChildDied("was killed by SIGSEGV", [])

    monkeypatch.setattr(contained, "run", killed)
    model = onnx.load(light_model_path("squeezenet")).SerializeToString()
    reason = keeper.crash([model], lambda: model)
    assert "crashes compiling it (was killed by SIGSEGV" in reason
    monkeypatch.setattr(guard.CrashGuard, "_verdicts", {})
    monkeypatch.setattr(contained, "run", lambda *a, **k: pytest.fail("asked again"))
    assert keeper.crash([model], lambda: model) == reason  # from the disk

    def no_helper(task, *args, **kwargs):
        raise contained.NoHelper("the nxrt helper process could not run it", [])

    monkeypatch.setattr(contained, "run", no_helper)
    assert keeper.crash([model, b"\0"], lambda: model) == ""
    assert keeper.crash([model, b"\1"], lambda: None) == ""  # cannot be written whole
    assert len(os.listdir(tmp_path / "openvino" / "verdicts")) == 1  # nothing kept for it
