"""The ``nxrt`` command, run as a user runs it: in a subprocess, with the real plugins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import onnx

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def nxrt(*args: str, env: dict[str, str] | None = None, ok: bool = True, cwd=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NXRT_")}
    full_env.update(env or {})
    result = subprocess.run(
        [sys.executable, "-m", "nxrt.tools.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
    )
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def test_providers_lists_the_cpu_ep():
    info = json.loads(nxrt("providers", "--json").stdout)
    (cpu,) = [p for p in info["providers"] if p["id"] == "cpu"]
    assert cpu["distribution"] == "nxrt-ep-cpu" and cpu["device_type"] == "cpu"
    assert "device:cpu" in cpu["capabilities"] and cpu["ops"] > 20
    assert "nxrt_register" in cpu["hooks"]
    table = nxrt("providers", "-v").stdout
    assert "cpu" in table and "nxrt-ep-cpu" in table and "hooks nxrt_ep_capabilities" in table


HEAVY = ("onnx", "onnx_ir", "ml_dtypes", "numba", "sympy", "mlx", "openvino", "onnxruntime")


def test_the_plain_listing_starts_no_ep_and_imports_no_backend():
    code = (
        "import sys\n"
        "from nxrt.tools.cli import main\n"
        "main(['providers'])\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
        "print(sorted(m for m in sys.modules if '.ops' in m and m.startswith('nxrt_ep_')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NXRT_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    *table, heavy, kernel_modules = done.stdout.strip().splitlines()
    assert heavy == "[]"
    assert "nxrt_ep_cpu.ops" not in kernel_modules  # counting ops is for -v and --json
    listing = "\n".join(table)
    assert re.search(r"^cpu\s+cpu\s+nxrt-ep-cpu \S+\s+cpu\s+numpy kernels", listing, re.M)
    assert "capabilities" not in listing.splitlines()[-3] and "providers -v" in listing


def test_providers_honours_the_plugin_switches():
    assert (
        json.loads(nxrt("providers", "--json", env={"NXRT_PLUGINS": ""}).stdout)["providers"] == []
    )
    disabled = nxrt("providers", "--json", env={"NXRT_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert json.loads(disabled.stdout)["providers"] == []
    allowed = nxrt("providers", "--json", env={"NXRT_PLUGINS": "cpu"})
    assert [p["id"] for p in json.loads(allowed.stdout)["providers"]] == ["cpu"]


def test_providers_shows_a_broken_plugin_with_its_reason(tmp_path):
    dist = tmp_path / "nxrt_ep_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nxrt-ep-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nxrt]\nbroken = nxrt_ep_broken\n")
    (tmp_path / "nxrt_ep_broken.py").write_text("raise ImportError('libbroken.so: not found')\n")
    env = {"PYTHONPATH": str(tmp_path)}
    info = json.loads(nxrt("providers", "--json", env=env).stdout)
    assert "cpu" in [p["id"] for p in info["providers"]]  # the others keep working
    (failure,) = info["failed"]
    assert failure["path"] == "nxrt_ep_broken" and "libbroken.so: not found" in failure["reason"]
    assert "libbroken.so: not found" in nxrt("providers", env=env).stdout


def test_run_without_a_model_classifies_the_embedded_digits():
    out = nxrt("run", "--repeat", "3", "--ep", "cpu").stdout
    assert "embedded digits_cnn.onnx" in out
    assert "cpu         8" in out  # the partition: nodes per EP (Conv+Relu fused into one)
    assert "accuracy: 98.22%" in out
    # like a benchmark: the first run apart, then the median of warm runs after a warm-up
    first, latency = [line for line in out.splitlines() if "run" in line and " ms" in line]
    assert re.fullmatch(r"first run \d+\.\d ms, includes compiling", first)
    assert re.match(r"latency: median \d+\.\d+ ms over 3 run\(s\), after 3 warm-up", latency)
    default = nxrt("run", "--ep", "cpu", "--warmup", "1").stdout
    assert "over 20 run(s), after 1 warm-up run(s)" in default


SHAPES_PLUGIN = """
import json, os
import numpy as np
import nxrt
from nxrt.provider import ExecutionProvider
from nxrt.registry import OpRegistry

OPS = OpRegistry("shapes")

@OPS.op("Relu", since=1)
def relu(x, /):
    with open(os.environ["SHAPES_LOG"], "a") as log:
        log.write(json.dumps(list(x.shape)) + "\\n")
    return np.maximum(x, 0)

@nxrt.hookimpl
def nxrt_register(registry):
    registry.add_provider("shapes", lambda config: ExecutionProvider(config, OPS))
    registry.add_kernels("shapes", OPS)
"""


def test_run_measures_the_selection_at_the_shapes_it_runs(tmp_path):
    import numpy as np
    from onnx import TensorProto, helper, save

    dist = tmp_path / "nxrt_ep_shapes-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nxrt-ep-shapes\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nxrt]\nshapes = nxrt_ep_shapes\n")
    (tmp_path / "nxrt_ep_shapes.py").write_text(SHAPES_PLUGIN)
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [value("x", TensorProto.FLOAT, ["batch", 3])],
        [value("y", TensorProto.FLOAT, ["batch", 3])],
    )
    model = tmp_path / "relu.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    feed = tmp_path / "x.npy"
    np.save(feed, np.ones((6, 3), np.float32))
    log = tmp_path / "shapes.log"
    env = {
        "PYTHONPATH": str(tmp_path),
        "NXRT_PLUGINS": "cpu,shapes",
        "NXRT_CACHE_DIR": str(tmp_path / "cache"),
        "SHAPES_LOG": str(log),
    }
    out = nxrt("run", str(model), "--input", f"x={feed}", "--repeat", "2", env=env).stdout
    assert "shapes,cpu" in out  # measured by the default selection
    seen = {tuple(json.loads(line)) for line in log.read_text().splitlines()}
    assert seen == {(6, 3)}  # never batch 1


def test_run_a_model_with_an_input_file_and_a_profile(tmp_path):
    import numpy as np

    model = LIGHT_DIR / "light_squeezenet.onnx"
    feed = tmp_path / "x.npy"
    np.save(feed, np.zeros((1, 3, 224, 224), np.float32))
    result = nxrt(
        "run",
        *(str(model), "--input", f"data_0={feed}", "--profile", "--ep", "cpu"),
        *("--repeat", "2", "--warmup", "1"),
        cwd=tmp_path,
    )
    assert "softmaxout_1: float32[1, 1000, 1, 1]" in result.stdout
    (trace,) = tmp_path.glob("nxrt_profile_*.json")
    assert f"profile: {trace}" in result.stdout
    report = json.loads(nxrt("partition", str(model), "--json", "--ep", "cpu").stdout)
    kernels = report["nodes_per_ep"]["cpu"]
    runs = 1 + 1 + 2  # the first, the warm-up, the timed: every run is profiled
    assert report["folded"] and len(json.loads(trace.read_text())["traceEvents"]) == kernels * runs


def test_partition_reports_every_node(tmp_path):
    model = str(LIGHT_DIR / "light_resnet50.onnx")
    report = json.loads(nxrt("partition", model, "--json", "--ep", "cpu").stdout)
    placed = sum(len(p["nodes"]) for p in report["partitions"])
    assert placed + len(report["folded"]) + len(report["fused"]) == 415
    assert report["copies"] == [] and len(report["fused"]) >= 53  # every BatchNormalization
    assert report["nodes_per_ep"]["cpu"] == placed


def test_a_bad_model_is_a_typed_error_not_a_traceback(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01 not a model")
    result = nxrt("run", str(bad), ok=False)
    assert result.returncode == 1
    # an InvalidModel: the bytes are no ONNX model (onnxruntime says INVALID_PROTOBUF)
    assert result.stderr.startswith("nxrt: ModelNotParsed:") and "Traceback" not in result.stderr
    assert bad.read_bytes() == b"\x00\x01 not a model"


def test_providers_lists_a_plugin_that_registered_no_ep(tmp_path):
    dist = tmp_path / "nxrt_ep_empty-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nxrt-ep-empty\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nxrt]\nempty = nxrt_ep_empty\n")
    (tmp_path / "nxrt_ep_empty.py").write_text(
        "import nxrt\n\n\n@nxrt.hookimpl\ndef nxrt_register(registry):\n    pass\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    info = json.loads(nxrt("providers", "--json", env=env).stdout)
    plugins = {p["name"]: p for p in info["plugins"]}
    assert plugins["empty"]["eps"] == [] and plugins["empty"]["distribution"] == "nxrt-ep-empty"
    assert plugins["empty"]["hooks"] == ["nxrt_register"]
    assert plugins["cpu"]["eps"] == ["cpu"] and info["failed"] == []
    assert "empty" not in [p["plugin"] for p in info["providers"]]
    table = nxrt("providers", env=env).stdout
    assert re.search(r"^empty\s+nxrt-ep-empty 0\.1\s+0$", table, re.MULTILINE), table


def test_warmup_compiles_a_models_kernels_into_the_cache(tmp_path):
    from importlib import resources

    model = tmp_path / "digits.onnx"
    model.write_bytes((resources.files("nxrt") / "data" / "digits_cnn.onnx").read_bytes())
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba"), "NXRT_CACHE_DIR": str(tmp_path / "nxrt")}
    first = nxrt("warmup", str(model), env=env).stdout
    assert "cpu: warming up" in first and "0 found in the cache" in first
    assert re.search(r"(\d+) compiled kernels \(\1 compiled now", first), first
    # then the default selection, decided with every kernel compiled: complete, so cached
    assert re.search(r"selection: policy DEFAULT, chose \S+ \(in ", first), first
    assert "timed while still compiling" not in first and "not cached" not in first
    again = nxrt("warmup", str(model), "--ep", "cpu", env=env).stdout
    assert "0 compiled now" in again and "cpu: done" in again and "selection" not in again
    run = nxrt("run", str(model), env=env).stdout
    assert re.search(r"selection: policy DEFAULT, chose \S+ \(from the cache\)", run), run
    missing = nxrt("warmup", str(model), "--ep", "nosuch", env=env, ok=False)
    assert missing.returncode == 1 and "not installed" in missing.stderr
