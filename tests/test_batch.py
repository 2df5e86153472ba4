"""Batch inference on Ray Data (issue 30, SPEC 12): ``nxrt.tools.batch`` and ``nxrt batch``.

The fast tests need no cluster: splitting a batch larger than the model's
fixed batch dim, the three batch formats, the column checks, model packages,
picklable options, and ``import nxrt`` staying free of Ray. The ``slow`` ones
run a real local Ray cluster (``ray.init(num_cpus=2)``, one per module, shut
down at its end): results bit-identical to a plain session over the same rows
with 1 and 2 workers, numpy, Parquet and .npy input, a worker killed mid-job
with every row still present once, fail-fast errors before any worker starts,
and failed rows reported by id with exit status 3.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys

import numpy as np
import onnx
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from onnx import TensorProto, helper, numpy_helper
from ray.data.extensions import ArrowTensorArray, TensorArray

import nxrt
from nxrt.errors import InvalidArgument, InvalidColumn
from nxrt.tools import batch, cli

RNG = np.random.default_rng(30)
IMAGE = (3, 16, 16)


# -- models ---------------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cnn_model(batch_dim: int | str = 1) -> onnx.ModelProto:
    """A small CNN with a fixed batch dim of 1, as exported image models have."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w2")
    fc = numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    value = helper.make_tensor_value_info
    return _model(
        nodes,
        [value("x", TensorProto.FLOAT, [batch_dim, *IMAGE])],
        [value("y", TensorProto.FLOAT, [batch_dim, 5])],
        [w1, w2, fc],
    )


def dense_model() -> onnx.ModelProto:
    """A free-batch tabular model: ``tanh(x @ W)``."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((6, 3)).astype("f4"), "W")
    value = helper.make_tensor_value_info
    return _model(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
        [value("x", TensorProto.FLOAT, ["N", 6])],
        [value("y", TensorProto.FLOAT, ["N", 3])],
        [w],
    )


def gather_model() -> onnx.ModelProto:
    """``GatherElements(x, idx)``: a row whose index is out of range fails to run."""
    value = helper.make_tensor_value_info
    return _model(
        [helper.make_node("GatherElements", ["x", "idx"], ["y"], axis=1)],
        [value("x", TensorProto.FLOAT, ["N", 4]), value("idx", TensorProto.INT64, ["N", 1])],
        [value("y", TensorProto.FLOAT, ["N", 1])],
    )


def session(model: onnx.ModelProto, threads: int = 1) -> nxrt.InferenceSession:
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads
    return nxrt.InferenceSession(model.SerializeToString(), options, providers=["cpu"])


def per_row(sess: nxrt.InferenceSession, x: np.ndarray) -> np.ndarray:
    """The plain session over each row on its own: what a batch-1 model computes."""
    return np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(len(x))])


@pytest.fixture
def cnn_path(tmp_path) -> str:
    path = str(tmp_path / "cnn.onnx")
    onnx.save(cnn_model(), path)
    return path


# -- one process ----------------------------------------------------------------------------------
def test_import_nxrt_imports_no_ray():
    code = (
        "import sys, json, nxrt, nxrt.tools.batch, nxrt.tools.cli\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('ray', 'pyarrow', 'pandas'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_session_options_pickle():
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = 3
    options.add_session_config_entry("nxrt.selection.budget_ms", "100")
    options.set_provider_selection_policy("PREFER_CPU")
    options.add_initializer("w", nxrt.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32)))
    back = pickle.loads(pickle.dumps(options))
    assert back.intra_op_num_threads == 3
    assert back.get_session_config_entry("nxrt.selection.budget_ms") == "100"
    assert back.provider_selection_policy == options.provider_selection_policy
    assert np.array_equal(back._initializers["w"].numpy(), np.ones(2, np.float32))


def test_session_from_bytes_or_path(tmp_path, cnn_path):
    x = RNG.standard_normal((1, *IMAGE)).astype(np.float32)
    with open(cnn_path, "rb") as f:
        from_bytes = nxrt.InferenceSession(f.read(), providers=["cpu"]).run(None, {"x": x})[0]
    from_path = nxrt.InferenceSession(cnn_path, providers=["cpu"]).run(None, {"x": x})[0]
    assert np.array_equal(from_bytes, from_path)


def test_run_batched_splits_a_fixed_batch_and_concatenates():
    sess = session(cnn_model())
    x = RNG.standard_normal((7, *IMAGE)).astype(np.float32)
    (y,) = batch.run_batched(sess, None, {"x": x})
    assert y.shape == (7, 5)
    assert np.array_equal(y, per_row(sess, x))
    with pytest.raises(InvalidArgument, match="dim 7 on axis 0"):
        sess.run(None, {"x": x})  # what run_batched is for


def test_run_batched_pads_the_last_chunk_of_a_fixed_batch():
    sess = session(cnn_model(batch_dim=4))
    x = RNG.standard_normal((10, *IMAGE)).astype(np.float32)
    (y,) = batch.run_batched(sess, None, {"x": x})
    assert y.shape == (10, 5)
    assert np.array_equal(y[:4], sess.run(None, {"x": x[:4]})[0])
    last = np.concatenate([x[8:], np.repeat(x[-1:], 2, 0)])
    assert np.array_equal(y[8:], sess.run(None, {"x": last})[0][:2])


def test_run_batched_free_batch_in_chunks():
    sess = session(dense_model())
    x = RNG.standard_normal((10, 6)).astype(np.float32)
    (y,) = batch.run_batched(sess, ["y"], {"x": x}, batch_size=4)
    chunks = [sess.run(None, {"x": x[i : i + 4]})[0] for i in (0, 4, 8)]
    assert np.array_equal(y, np.concatenate(chunks))
    assert np.array_equal(batch.run_batched(sess, None, {"x": x})[0], sess.run(None, {"x": x})[0])


def test_run_batched_refuses_an_output_without_batch_axis():
    value = helper.make_tensor_value_info
    model = _model(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)],
        [value("x", TensorProto.FLOAT, [2, 3])],
        [value("s", TensorProto.FLOAT, [])],
    )
    with pytest.raises(InvalidArgument, match="no batch axis"):
        batch.run_batched(session(model), None, {"x": np.ones((5, 3), np.float32)})


def _formats(x: np.ndarray, ids: np.ndarray) -> dict[str, object]:
    return {
        "numpy": {"id": ids, "x": x},
        "pandas": pd.DataFrame({"id": ids, "x": TensorArray(x)}),
        "pyarrow": pa.table({"id": ids, "x": ArrowTensorArray.from_numpy(x)}),
    }


@pytest.mark.parametrize("kind", ["numpy", "pandas", "pyarrow"])
def test_predictor_takes_each_batch_format(kind, cnn_path):
    x = RNG.standard_normal((5, *IMAGE)).astype(np.float32)
    ids = np.arange(5)
    predictor = batch.Predictor(cnn_path, providers=["cpu"], keep=["id"], threads=1)
    result = predictor(_formats(x, ids)[kind])
    columns, back = batch.batch_columns(result)
    assert back == kind
    assert sorted(columns) == ["id", "nxrt_error", "y"]
    assert np.array_equal(columns["id"], ids)
    assert np.array_equal(columns["y"], per_row(session(cnn_model()), x))
    assert list(columns["nxrt_error"]) == [""] * 5


def test_predictor_maps_columns_to_inputs_and_outputs_to_columns():
    model = dense_model().SerializeToString()
    features = {f"f{i}": RNG.standard_normal(4).astype(np.float32) for i in range(6)}
    predictor = batch.Predictor(
        model,
        providers=["cpu"],
        input_columns={"x": list(features)},
        output_columns={"y": "score"},
    )
    result = predictor(features)
    stacked = np.stack(list(features.values()), axis=-1)
    assert np.array_equal(result["score"], session(dense_model()).run(None, {"x": stacked})[0])


def test_predictor_reports_failed_rows_and_keeps_them():
    predictor = batch.Predictor(gather_model().SerializeToString(), providers=["cpu"], keep=["id"])
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    idx = np.array([[0], [9], [1], [2], [-7]])
    result = predictor({"id": np.arange(5), "x": x, "idx": idx})
    assert np.array_equal(result["id"], np.arange(5))
    errors = list(result[batch.ERROR_COLUMN])
    assert [bool(e) for e in errors] == [False, True, False, False, True]
    assert "KernelFailed" in errors[1] and "GatherElements" in errors[1]
    assert np.array_equal(result["y"][[0, 2, 3], 0], [0.0, 9.0, 14.0])
    assert np.isnan(result["y"][[1, 4], 0]).all()


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ({"pixels": np.zeros((2, *IMAGE), np.float32), "mask": np.arange(2)}, "no such column"),
        ({"x": np.zeros((2, *IMAGE), np.float64)}, r"expected tensor\(float\).*found float64"),
        ({"x": np.zeros((2, 3, 8, 8), np.float32)}, r"shape \[3, 16, 16\], found .* \[3, 8, 8\]"),
    ],
    ids=["missing", "dtype", "shape"],
)
def test_bad_columns_name_the_column_and_the_expected_type(columns, match, cnn_path):
    predictor = batch.Predictor(cnn_path, providers=["cpu"])
    with pytest.raises(InvalidColumn, match=match) as info:
        batch.check_first_rows(predictor, columns)
    assert (info.value.column, info.value.input_name) == ("x", "x")


def test_cast_converts_same_kind_columns(cnn_path):
    predictor = batch.Predictor(cnn_path, providers=["cpu"], cast=True)
    x = RNG.standard_normal((2, *IMAGE))
    assert np.array_equal(
        predictor({"x": x})["y"], per_row(session(cnn_model()), x.astype(np.float32))
    )


def test_model_package_carries_external_data(tmp_path):
    model = dense_model()
    os.makedirs(tmp_path / "weights")
    onnx.save(
        model,
        str(tmp_path / "dense.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights/dense.bin",
        size_threshold=0,
    )
    package = batch.ModelPackage.of(str(tmp_path / "dense.onnx"))
    assert list(package.files) == ["weights/dense.bin"]
    restored = pickle.loads(pickle.dumps(package))
    predictor = batch.Predictor(restored, providers=["cpu"])
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    assert np.array_equal(predictor({"x": x})["y"], session(dense_model()).run(None, {"x": x})[0])


def test_side_files_lists_external_data_and_epcontext_blobs():
    value = helper.make_tensor_value_info
    context = helper.make_node(
        "EPContext",
        ["x"],
        ["y"],
        domain="com.microsoft",
        embed_mode=0,
        ep_cache_context="blobs/part0.bin",
        source="mlx",
    )
    weight = numpy_helper.from_array(np.ones(3, np.float32), "w")
    weight.data_location = TensorProto.EXTERNAL
    weight.ClearField("raw_data")
    weight.external_data.add(key="location", value="w.bin")
    model = _model(
        [context],
        [value("x", TensorProto.FLOAT, [1, 3])],
        [value("y", TensorProto.FLOAT, [1, 3])],
        [weight],
    )
    assert batch.side_files(model) == [("w.bin", "tensor 'w'"), ("blobs/part0.bin", "EPContext ''")]


# -- a real local Ray cluster ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    """A local Ray of 2 CPUs for the module, shut down (its processes gone) at the end."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _map_workers() -> list[int]:
    """Pids of this process's Ray Data map workers (descendants whose title says so)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if not f.read().startswith(b"ray::MapWorker"):
                    continue
        except OSError:
            continue
        pid = parent = int(entry)
        while parent > 1:
            try:
                with open(f"/proc/{parent}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                break
            if parent == me:
                found.append(pid)
                break
    return found


def _blocks(x: np.ndarray, rows: int) -> list[pd.DataFrame]:
    """``x`` with ids, in blocks of ``rows`` rows (so Ray's batches of ``rows`` are these)."""
    return [
        pd.DataFrame({"id": np.arange(i, min(i + rows, len(x))), "x": TensorArray(x[i : i + rows])})
        for i in range(0, len(x), rows)
    ]


def _collect(ds) -> dict[str, np.ndarray]:
    frame = ds.to_pandas().sort_values("id")
    return {c: np.stack(frame[c].to_numpy()) for c in frame.columns}


@pytest.mark.slow
def test_worker_sizing_leaves_a_cpu_for_reads(cluster):
    assert batch.worker_sizing(None) == (2, 0.5)
    assert batch.worker_sizing(1) == (1, 1.0)
    assert batch.worker_sizing(2, threads=2) == (2, 0.5)
    with pytest.raises(InvalidArgument, match="leave none"):
        batch.worker_sizing(300)


@pytest.mark.slow
def test_actor_threads_come_from_its_cpus(cluster):
    threads = ray.remote(num_cpus=2)(batch._actor_threads)
    assert ray.get(threads.remote()) == 2


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_results_are_bit_identical_to_a_plain_session(cluster, cnn_path, tmp_path, workers):
    x = RNG.standard_normal((120, *IMAGE)).astype(np.float32)
    ds = ray.data.from_pandas(_blocks(x, 20))
    out = _collect(
        batch.predict(ds, cnn_path, workers=workers, batch_size=20, providers=["cpu"], keep=["id"])
    )
    assert np.array_equal(out["id"], np.arange(120))
    assert np.array_equal(out["y"], per_row(session(cnn_model()), x))
    # a free-batch model: Ray's batches are the blocks here, and so are the plain runs
    dense = str(tmp_path / "dense.onnx")
    onnx.save(dense_model(), dense)
    t = RNG.standard_normal((90, 6)).astype(np.float32)
    ds = ray.data.from_pandas(
        [pd.DataFrame({"id": np.arange(i, i + 30), "x": list(t[i : i + 30])}) for i in (0, 30, 60)]
    )
    # and the model through Ray's object store, as for workers on other machines
    run = batch.predict(
        ds,
        dense,
        workers=workers,
        batch_size=30,
        providers=["cpu"],
        keep=["id"],
        ship="object-store",
    )
    out = _collect(run)
    plain = session(dense_model())
    want = np.concatenate([plain.run(None, {"x": t[i : i + 30]})[0] for i in (0, 30, 60)])
    assert np.array_equal(out["y"], want)


@pytest.mark.slow
def test_default_providers_are_decided_once_in_the_driver(cluster, cnn_path):
    x = RNG.standard_normal((4, *IMAGE)).astype(np.float32)
    plan = batch.plan_batch(ray.data.from_pandas(_blocks(x, 4)), cnn_path, workers=1)
    assert plan.providers and all(isinstance(p, str) for p in plan.providers)
    assert plan.constructor["providers"] == plan.providers
    again = batch.driver_session(cnn_path, None, None, 1, batch.DEFAULT_BATCH_SIZE)
    assert again.get_partition().selection.from_cache  # the decision is shared, not re-measured
    assert batch.decided_providers(again) == plan.providers
    assert plan.constructor["output_specs"] == {"y": ("float32", (5,))}


@pytest.mark.slow
def test_bad_input_fails_in_the_driver_before_any_worker(cluster, cnn_path):
    before = set(_map_workers())  # the last test's actors may still be on their way out
    x = RNG.standard_normal((8, *IMAGE))  # float64: the model takes float32
    ds = ray.data.from_pandas(_blocks(x, 4))
    with pytest.raises(InvalidColumn, match=r"column 'x' .* expected tensor\(float\)"):
        batch.predict(ds, cnn_path, workers=2, providers=["cpu"])
    with pytest.raises(InvalidColumn, match="no such column"):
        batch.predict(ds, cnn_path, input_columns={"x": "pixels"}, providers=["cpu"])
    assert set(_map_workers()) <= before


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_every_row_is_there_once(cluster, cnn_path):
    before = set(_map_workers())
    x = RNG.standard_normal((600, *IMAGE)).astype(np.float32)
    ds = batch.predict(
        ray.data.from_pandas(_blocks(x, 10)),
        cnn_path,
        workers=2,
        batch_size=10,
        providers=["cpu"],
        keep=["id"],
    )
    ids, ys, killed = [], [], None
    for part in ds.iter_batches(batch_size=None, batch_format="numpy"):
        ids.extend(part["id"].tolist())
        ys.append(part["y"])
        if killed is None:  # one of this job's two actors, with batches in flight
            killed = min(set(_map_workers()) - before)
            os.kill(killed, signal.SIGKILL)
    assert killed is not None and killed not in _map_workers()
    assert sorted(ids) == list(range(600))
    y = np.concatenate(ys)[np.argsort(ids)]
    assert np.array_equal(y, per_row(session(cnn_model()), x))


def _write_parquet_input(folder, x: np.ndarray, rows: int) -> None:
    os.makedirs(folder)
    for i in range(0, len(x), rows):
        table = pa.table(
            {"id": np.arange(i, i + rows), "x": ArrowTensorArray.from_numpy(x[i : i + rows])}
        )
        pq.write_table(table, os.path.join(folder, f"part-{i:05d}.parquet"))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_nxrt_batch_over_parquet_with_tensor_columns(cluster, cnn_path, tmp_path, workers):
    x = RNG.standard_normal((150, *IMAGE)).astype(np.float32)
    _write_parquet_input(tmp_path / "in", x, 50)
    result = batch.run_job(
        cnn_path,
        str(tmp_path / "in"),
        str(tmp_path / "out"),
        workers=workers,
        batch_size=25,
        providers=["cpu"],
        keep=["id"],
    )
    assert (result.input_rows, result.rows, result.failed, result.workers) == (150, 150, 0, workers)
    assert "150 rows in" in result.line() and "rows/s" in result.line()
    table = pq.read_table(tmp_path / "out").to_pandas().sort_values("id")
    assert np.array_equal(table["id"], np.arange(150))
    assert np.array_equal(np.stack(table["y"].to_numpy()), per_row(session(cnn_model()), x))
    assert set(table[batch.ERROR_COLUMN]) == {""}
    with pytest.raises(InvalidArgument, match="exists"):
        batch.run_job(cnn_path, str(tmp_path / "in"), str(tmp_path / "out"), providers=["cpu"])


@pytest.mark.slow
def test_nxrt_batch_reports_failed_rows_by_id(cluster, tmp_path):
    model = str(tmp_path / "gather.onnx")
    onnx.save(gather_model(), model)
    os.makedirs(tmp_path / "in")
    idx = np.zeros((40, 1), np.int64)
    idx[[3, 17, 31]] = 99
    frame = pd.DataFrame({"id": np.arange(40) + 1000, "idx": list(idx)})
    frame["x"] = list(np.ones((40, 4), np.float32))
    frame.to_parquet(tmp_path / "in" / "rows.parquet")
    output = str(tmp_path / "out")
    status = cli.main(
        [
            "batch",
            model,
            str(tmp_path / "in"),
            output,
            "--workers=2",
            "--batch-size=8",
            "--providers=cpu",
            "--keep=id",
        ]
    )
    assert status == batch.EXIT_ROWS_FAILED
    assert sum(pq.read_metadata(p).num_rows for p in _parquet_files(output)) == 40
    with open(output + ".errors.jsonl") as f:
        failures = [json.loads(line) for line in f]
    assert sorted(f["id"] for f in failures) == [1003, 1017, 1031]
    assert all("GatherElements" in f["error"] for f in failures)


def _parquet_files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".parquet"))


@pytest.mark.slow
def test_nxrt_batch_command_over_npy_files(cnn_path, tmp_path):
    """The command as users run it: its own local Ray, .npy files in, the last line."""
    os.makedirs(tmp_path / "in")
    x = RNG.standard_normal((60, *IMAGE)).astype(np.float32)
    for i in range(3):
        np.save(tmp_path / "in" / f"{i}.npy", x[i * 20 : (i + 1) * 20])
    done = subprocess.run(
        [sys.executable, "-m", "nxrt.tools.cli", "batch", cnn_path, str(tmp_path / "in" / "*.npy")]
        + [str(tmp_path / "out"), "--workers", "2", "--providers", "cpu", "--keep", "path"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("60 rows in ") and "rows/s (2 worker(s), 0 failed)" in last
    table = pq.read_table(tmp_path / "out").to_pandas()
    assert len(table) == 60
    plain = session(cnn_model())
    assert table["path"].nunique() == 3
    for name, rows in table.groupby("path"):
        stored = np.load(tmp_path / "in" / os.path.basename(name))
        got = np.stack(rows["y"].to_numpy())
        want = per_row(plain, stored)
        assert sorted(map(tuple, got)) == sorted(map(tuple, want))
