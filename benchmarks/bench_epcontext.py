"""Session creation with and without a compiled EPContext model, per EP, in one run.

For each EP that saves contexts (mlx, legacy_abi when installed), the script
compiles a light model once with ``nxrt compile``, then times creating a
session from the original model and from the compiled one, alternating, in
fresh subprocesses (so no cache of the first run helps the second), and
prints the ratio. Timed: creating the session, and creating it plus the first
run (MLX compiles lazily, on the first call); importing nxrt and the backend
libraries happens before the clock starts. Run::

    python benchmarks/bench_epcontext.py                 # squeezenet and resnet50
    python benchmarks/bench_epcontext.py --models resnet50 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import nxrt
from nxrt.tools.compile import compile_model
from nxrt.tools.light_models import light_model_path

CREATE = """
import importlib, sys, time
import nxrt
for backend in ("mlx.core", "onnxruntime"):  # library imports are not compilation: leave them out
    try:
        importlib.import_module(backend)
    except ImportError:
        pass
from nxrt.tools.light_models import dummy_feeds
t = time.perf_counter()
session = nxrt.InferenceSession(sys.argv[1], providers=sys.argv[2].split(","))
created = time.perf_counter()
session.run(None, dummy_feeds(session))
print(created - t, time.perf_counter() - t)
"""


def create_seconds(model: str, providers: str) -> tuple[float, float]:
    """Seconds to create the session, and to create it and run it once."""
    out = subprocess.run(
        [sys.executable, "-c", CREATE, model, providers], capture_output=True, text=True, check=True
    )
    created, first = out.stdout.strip().splitlines()[-1].split()
    return float(created), float(first)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["squeezenet", "resnet50"])
    parser.add_argument("--eps", nargs="+", default=["mlx", "legacy_abi"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    installed = nxrt.get_available_providers()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for ep in [e for e in args.eps if e in installed]:
            for name in args.models:
                source = light_model_path(name)
                compiled = str(Path(folder) / f"{name}_{ep}.onnx")
                compile_model(source, compiled, [ep, "cpu"])
                plain, loaded = [], []
                for _ in range(args.repeat):
                    plain.append(create_seconds(source, f"{ep},cpu"))
                    loaded.append(create_seconds(compiled, f"{ep},cpu"))
                a = [statistics.median(t[i] for t in plain) * 1000 for i in (0, 1)]
                b = [statistics.median(t[i] for t in loaded) * 1000 for i in (0, 1)]
                rows.append((ep, name, *a, *b))
    print(
        "| EP | model | create (ms) | + first run (ms) | create, EPContext (ms) "
        "| + first run, EPContext (ms) | speed-up to first result |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for ep, name, a0, a1, b0, b1 in rows:
        print(
            f"| {ep} | light_{name} | {a0:.0f} | {a1:.0f} | {b0:.0f} | {b1:.0f} | {a1 / b1:.1f}x |"
        )


if __name__ == "__main__":
    main()
