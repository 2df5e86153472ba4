"""Start-up imports only what each step needs (issue 28, SPEC 10 "First use").

Listing providers reads entry points and the plugins' registration modules,
nothing else: no kernel module, no backend, not onnx. Creating a session
imports onnx and onnx_ir to read the model, and nothing heavier before it
has. Each check runs in a fresh interpreter and looks at ``sys.modules``; it
is a check of what is imported, never of how long it takes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from onnx import TensorProto, helper, save

#: What listing providers must not import (top-level packages).
HEAVY = ("onnx", "onnx_ir", "ml_dtypes", "numba", "sympy", "mlx", "openvino", "onnxruntime")
#: What reading a model may import (it needs onnx and onnx_ir), and what it must not yet.
BACKENDS = ("numba", "llvmlite", "mlx", "openvino", "onnxruntime")
#: The cpu EP's kernel modules: imported when a session first uses the cpu EP.
CPU_KERNELS = "nxrt_ep_cpu.ops"


def fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter, with the user's plugins and no NXRT_ switch;
    it prints one JSON line, returned."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NXRT_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def imported(names: tuple[str, ...]) -> str:
    """Code printing, as JSON, which of ``names`` (and the cpu kernel modules) are imported."""
    return (
        "import json, sys\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {names!r})\n"
        f"kernels = sorted(m for m in sys.modules if m.startswith({CPU_KERNELS!r}))\n"
    )


def test_listing_providers_imports_no_heavy_dependency():
    result = fresh(
        "import nxrt\n"
        "providers = nxrt.get_available_providers()\n"
        + imported(HEAVY)
        + "print(json.dumps({'providers': providers, 'heavy': heavy, 'kernels': kernels}))\n"
    )
    assert "CPUExecutionProvider" in result["providers"]
    assert result["heavy"] == []
    assert result["kernels"] == []


def test_creating_a_session_reads_the_model_before_any_backend_loads(tmp_path):
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [value("x", TensorProto.FLOAT, [2, 3])],
        [value("y", TensorProto.FLOAT, [2, 3])],
    )
    model = tmp_path / "relu.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    result = fresh(
        "import json, sys\n"
        "import nxrt, nxrt.pipeline.stages as pipeline\n"
        "seen = {}\n"
        "read = pipeline.load\n"
        "def load(*args):\n"
        "    seen['at_load'] = set(sys.modules)\n"
        "    return read(*args)\n"
        "pipeline.load = load\n"
        f"session = nxrt.InferenceSession({str(model)!r}, providers=['cpu'])\n"
        "modules = seen['at_load']\n"
        f"heavy = sorted(m for m in modules if m.split('.')[0] in {BACKENDS!r})\n"
        f"kernels = sorted(m for m in modules if m.startswith({CPU_KERNELS!r}))\n"
        "print(json.dumps({'heavy': heavy, 'kernels': kernels,\n"
        "                  'after': sorted(m for m in sys.modules if m == 'nxrt_ep_cpu.ops')}))\n"
    )
    assert result["heavy"] == [] and result["kernels"] == []
    assert result["after"] == [CPU_KERNELS]  # loaded once the cpu EP was chosen
