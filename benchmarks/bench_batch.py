"""``nxrt batch`` on Ray Data against a hand-written single-process loop, same data, same cores.

Two datasets, each written once as Parquet (an ``id`` column and the model's
input) under ``--work``:

- images: ``--rows`` (default 10,000) random 3x224x224 images for a light
  model shipped in the onnx wheel (default ShuffleNet, a real architecture with
  a fixed batch dim of 1, so every row runs alone), stored as uint8 pixels with
  the normalization (Cast, x / 255) put in front of the model, as pipelines
  store decoded images (``--pixels float32``: stored normalized, 4x the bytes);
- tabular: ``--tabular-rows`` (default 200,000) rows of 16 float32 feature
  columns for a scikit-learn gradient-boosting regressor converted with
  skl2onnx (a free batch dim, run in batches of ``--tabular-batch``).

For each: the loop (one ``nxrt.InferenceSession`` with one intra-op thread per
core, reading the same Parquet files with pyarrow, ``run_batched`` per batch),
then ``nxrt batch`` with 1 and with 2 workers of one thread each (the command
itself, in a subprocess, starting its own local Ray), then ``nxrt batch`` with 2
workers over the same data with a near-zero-compute model (ReduceMax of each
row), whose time per batch is what Ray adds: reading, object-store transfer,
batching, scheduling, writing. The providers are decided once, by nxrt's
selection at one thread, and used everywhere. Outputs of ``nxrt batch`` are
compared with the loop's, by id, bit for bit.

    python benchmarks/bench_batch.py [--rows 10000] [--model shufflenet] [--work DIR]

Rows/s of ``nxrt batch`` are its job's (first read to last write, actors'
start-up included); "wall" adds starting Ray and the driver's checks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROW = (3, 224, 224)
FEATURES = 16
FILE_ROWS = 250


def cpu_info() -> str:
    """The CPU model, core count and load, from /proc (what every figure depends on)."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{model}, {os.cpu_count()} cores, load average {load:.1f}"


def write_images(folder: str, rows: int, dtype: str) -> None:
    """``rows`` seeded random images as Parquet files of FILE_ROWS rows (id, x tensor):
    uint8 pixels as decoded images are, or float32 already normalized."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray.data.extensions import ArrowTensorArray

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for start in range(0, rows, FILE_ROWS):
        n = min(FILE_ROWS, rows - start)
        if dtype == "uint8":
            x = rng.integers(0, 256, (n, *ROW), dtype=np.uint8)
        else:
            x = rng.random((n, *ROW), dtype=np.float32)
        table = pa.table({"id": np.arange(start, start + n), "x": ArrowTensorArray.from_numpy(x)})
        path = os.path.join(folder, f"part-{start // FILE_ROWS:05d}.parquet")
        pq.write_table(table, path, compression="none", use_dictionary=False)


def with_pixel_input(source: str, target: str) -> None:
    """The model with its image normalization in front: uint8 pixels in, ``x / 255`` to
    the network (what pipelines do to decoded images; 4x less data to move than float32)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(source)
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    (data,) = [i for i in graph.input if i.name not in weights]
    dims = [d.dim_value for d in data.type.tensor_type.shape.dim]
    pixels = helper.make_tensor_value_info("x", TensorProto.UINT8, dims)
    scale = numpy_helper.from_array(np.array(1 / 255, np.float32), "pixel_scale")
    nodes = [
        helper.make_node("Cast", ["x"], ["x_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x_float", "pixel_scale"], [data.name]),
    ]
    others = [i for i in graph.input if i.name != data.name]
    graph.ClearField("input")
    graph.input.extend([pixels, *others])
    graph.initializer.append(scale)
    for node in reversed(nodes):
        graph.node.insert(0, node)
    onnx.save(model, target)


def tabular_model(path: str) -> None:
    """A gradient-boosting regressor over FEATURES columns, converted with skl2onnx."""
    from skl2onnx import to_onnx
    from sklearn.ensemble import GradientBoostingRegressor

    rng = np.random.default_rng(1)
    x = rng.standard_normal((5000, FEATURES)).astype(np.float32)
    y = x[:, 0] * 2 + np.sin(x[:, 1]) + x[:, 2] * x[:, 3]
    model = GradientBoostingRegressor(n_estimators=100, max_depth=4, random_state=0).fit(x, y)
    onnx_model = to_onnx(model, x[:1], target_opset={"": 17, "ai.onnx.ml": 3})
    with open(path, "wb") as f:
        f.write(onnx_model.SerializeToString())


def write_tabular(folder: str, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(2)
    per_file = max(1, rows // 8)
    for k, start in enumerate(range(0, rows, per_file)):
        n = min(per_file, rows - start)
        columns = {"id": np.arange(start, start + n)}
        columns.update(
            {f"f{i}": rng.standard_normal(n).astype(np.float32) for i in range(FEATURES)}
        )
        pq.write_table(pa.table(columns), os.path.join(folder, f"part-{k:05d}.parquet"))


def null_model(path: str, input_name: str, shape: list[int | str], elem_type: int) -> None:
    """ReduceMax over each row: the same input as the real model, almost no compute."""
    import onnx
    from onnx import helper

    axes = list(range(1, len(shape)))
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["axes"], value_ints=axes),
            helper.make_node("ReduceMax", [input_name, "axes"], ["peak"], keepdims=0),
        ],
        "null",
        [helper.make_tensor_value_info(input_name, elem_type, shape)],
        [helper.make_tensor_value_info("peak", elem_type, [shape[0]])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def loop(
    model: str,
    folder: str,
    columns: list[str],
    input_name: str,
    providers: list[str],
    batch: int,
    threads: int | None = None,
) -> tuple[float, dict[int, np.ndarray], int]:
    """The hand-written single-process loop: one session, one thread per core, every file
    read with pyarrow, batches of ``batch`` rows through ``run_batched``."""
    import pyarrow.parquet as pq

    import nxrt
    from nxrt.tools.batch import batch_columns, run_batched

    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads or os.cpu_count() or 1
    session = nxrt.InferenceSession(model, options, providers=providers)
    files = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    results: dict[int, np.ndarray] = {}
    rows = 0
    start = time.perf_counter()
    for path in files:
        table = pq.read_table(path)
        for offset in range(0, table.num_rows, batch):
            part, _ = batch_columns(table.slice(offset, batch))
            x = (
                part[columns[0]]
                if len(columns) == 1
                else np.stack([part[c] for c in columns], axis=-1)
            )
            (y,) = run_batched(session, None, {input_name: np.ascontiguousarray(x)})
            for i, value in zip(part["id"].tolist(), y):
                results[i] = value
            rows += len(x)
    return time.perf_counter() - start, results, rows


LAST = re.compile(r"^(\d+) rows in ([\d.]+) s: ([\d.]+) rows/s")


def nxrt_batch(
    model: str, folder: str, out: str, workers: int, batch: int, providers: list[str], extra: list
) -> dict[str, Any]:
    """``nxrt batch`` in a subprocess, as users run it; its last line parsed."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "nxrt.tools.cli", "batch", model, folder, out]
    command += ["--workers", str(workers), "--threads", "1", "--batch-size", str(batch)]
    command += ["--providers", ",".join(providers), "--keep", "id", *extra]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"nxrt batch failed ({done.returncode}):\n{done.stderr[-4000:]}")
    last = done.stdout.strip().splitlines()[-1]
    match = LAST.match(last)
    if not match:
        raise SystemExit(f"unexpected last line: {last!r}")
    rows, seconds, rate = int(match[1]), float(match[2]), float(match[3])
    return {"rows": rows, "seconds": seconds, "rows_per_s": rate, "wall": wall, "line": last}


def read_output(out: str, column: str) -> dict[int, np.ndarray]:
    import pyarrow.parquet as pq

    from nxrt.tools.batch import batch_columns

    columns, _ = batch_columns(pq.read_table(out, columns=["id", column]))
    return dict(zip(columns["id"].tolist(), columns[column]))


def same(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def bench(
    name: str,
    model: str,
    folder: str,
    columns: list[str],
    batch: int,
    providers: list[str],
    work: str,
) -> list[dict[str, Any]]:
    import onnx

    proto = onnx.load(model, load_external_data=False)
    graph_input = proto.graph.input[0]
    input_name = graph_input.name
    output = proto.graph.output[0].name
    shape = [d.dim_value or d.dim_param or "N" for d in graph_input.type.tensor_type.shape.dim]
    extra = [] if len(columns) == 1 else ["--input-column", f"{','.join(columns)}={input_name}"]
    print(f"[{name}] loop ...", flush=True)
    loop_s, expected, rows = loop(model, folder, columns, input_name, providers, batch)
    table = [
        {
            "run": f"loop, 1 process x {os.cpu_count()} threads",
            "rows": rows,
            "seconds": loop_s,
            "rows_per_s": rows / loop_s,
            "wall": loop_s,
            "exact": "reference",
            "load": os.getloadavg()[0],
        }
    ]
    one_thread = None
    for workers in (1, 2):
        print(f"[{name}] nxrt batch, {workers} worker(s) ...", flush=True)
        out = os.path.join(work, f"{name}-out-{workers}")
        result = nxrt_batch(model, folder, out, workers, batch, providers, extra)
        result["run"] = f"nxrt batch, {workers} worker(s) x 1 thread"
        got = read_output(out, output)
        result["exact"] = "yes" if same(expected, got) else "NO"
        if result["exact"] == "NO":  # an EP whose sums run in another order on 2 threads?
            if one_thread is None:
                _, one_thread, _ = loop(model, folder, columns, input_name, providers, batch, 1)
            if same(one_thread, got):
                result["exact"] = "no; = a 1-thread session (the EP sums in another order on 2)"
        result["load"] = os.getloadavg()[0]
        table.append(result)
    print(f"[{name}] Ray's share (null model, 2 workers, one file then all) ...", flush=True)
    null = os.path.join(work, f"{name}-null.onnx")
    elem_type = graph_input.type.tensor_type.elem_type
    null_model(
        null, input_name, shape if len(columns) == 1 else [shape[0], len(columns)], elem_type
    )
    files = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    small = nxrt_batch(
        null, files[0], os.path.join(work, f"{name}-null-1"), 2, batch, providers, extra
    )
    full = nxrt_batch(
        null, folder, os.path.join(work, f"{name}-null-all"), 2, batch, providers, extra
    )
    batches_small, batches_full = -(-small["rows"] // batch), -(-rows // batch)
    # worker-seconds per batch past the first file; what is left of the one-file job is fixed
    per_batch = 2 * (full["seconds"] - small["seconds"]) / max(1, batches_full - batches_small)
    fixed = small["seconds"] - per_batch * batches_small / 2
    for label, result in (("one file", small), ("all", full)):
        result["run"] = f"nxrt batch, 2 workers, null model, {label} (Ray's share)"
        result["exact"] = "-"
        result["load"] = os.getloadavg()[0]
        table.append(result)
    table[-1]["overhead_ms_per_batch"] = per_batch * 1000
    table[-1]["fixed_s"] = fixed
    one, two = table[1]["rows_per_s"], table[2]["rows_per_s"]
    table[2]["vs_1_worker"] = two / one
    table[2]["vs_loop"] = two / table[0]["rows_per_s"]
    return table


def render(name: str, table: list[dict[str, Any]], batch: int) -> str:
    lines = [
        f"### {name} (batch {batch})",
        "",
        "| run | rows | job s | rows/s | wall s | load after | outputs = loop |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['run']} | {r['rows']} | {r['seconds']:.1f} | {r['rows_per_s']:.1f} | "
            f"{r['wall']:.1f} | {r['load']:.1f} | {r['exact']} |"
        )
    two, null = table[2], table[-1]
    lines.append("")
    if null["overhead_ms_per_batch"] > 0:
        share = (
            f"Ray's share: {null['overhead_ms_per_batch']:.1f} ms of a worker per batch of "
            f"{batch} rows (reading, object-store transfer, batching, writing), and "
            f"{null['fixed_s']:.1f} s fixed per job (planning, actors' start and model load)"
        )
    else:  # the one-file job took longer than the whole one: noise beyond the difference
        share = "Ray's share: not measurable in this run (the two null jobs' noise exceeds it)"
    lines.append(
        f"2 workers / 1 worker: **{two['vs_1_worker']:.2f}x**; 2 workers / loop: "
        f"**{two['vs_loop']:.2f}x**. {share}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000, help="image rows")
    parser.add_argument(
        "--model", default="shufflenet", help="a light model (nxrt.tools.light_models)"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="image rows per batch")
    parser.add_argument(
        "--pixels",
        choices=("uint8", "float32"),
        default="uint8",
        help="uint8: images stored as pixels, the model normalizes (default); float32: "
        "stored normalized, the light model as it is (4x the bytes through Ray)",
    )
    parser.add_argument("--tabular-rows", type=int, default=200_000)
    parser.add_argument("--tabular-batch", type=int, default=4096)
    parser.add_argument("--providers", help="comma-separated (default: nxrt's selection, once)")
    parser.add_argument("--work", help="data and outputs (default: a folder under $TMPDIR)")
    parser.add_argument("--only", choices=("images", "tabular"), help="one dataset only")
    parser.add_argument("--json", help="also write the tables as JSON here")
    args = parser.parse_args(argv)

    from nxrt.tools.batch import decided_providers, driver_session
    from nxrt.tools.light_models import light_model_path

    work = args.work or os.path.join(tempfile.gettempdir(), "nxrt-bench-batch")
    os.makedirs(work, exist_ok=True)
    print(f"CPU: {cpu_info()}", flush=True)
    report: dict[str, Any] = {"cpu": cpu_info(), "tables": {}}
    runs = []
    if args.only in (None, "images"):
        model = light_model_path(args.model)
        if args.pixels == "uint8":
            model = os.path.join(work, f"{args.model}-uint8.onnx")
            with_pixel_input(light_model_path(args.model), model)
        folder = os.path.join(work, f"images-{args.pixels}-{args.rows}")
        if not os.path.isdir(folder):
            print(f"writing {args.rows} images to {folder} ...", flush=True)
            write_images(folder, args.rows, args.pixels)
        name = f"{args.model} 3x224x224, {args.pixels} pixels"
        runs.append((name, model, folder, ["x"], args.batch_size))
    if args.only in (None, "tabular"):
        model = os.path.join(work, "boosting.onnx")
        if not os.path.exists(model):
            tabular_model(model)
        folder = os.path.join(work, f"tabular-{args.tabular_rows}")
        if not os.path.isdir(folder):
            write_tabular(folder, args.tabular_rows)
        features = [f"f{i}" for i in range(FEATURES)]
        runs.append(("gradient boosting, 16 features", model, folder, features, args.tabular_batch))
    out = []
    for name, model, folder, columns, batch in runs:
        if args.providers:
            providers = args.providers.split(",")
        else:
            providers = decided_providers(driver_session(model, None, None, 1, batch))
        print(f"[{name}] providers: {','.join(providers)}", flush=True)
        table = bench(name, model, folder, columns, batch, providers, work)
        report["tables"][name] = {"providers": providers, "batch": batch, "rows": table}
        out.append(render(f"{name}, providers {','.join(providers)}", table, batch))
    print(f"\nCPU: {cpu_info()} (at the end)\n")
    print("\n\n".join(out))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
