"""Batch inference past one process: an nxrt session as the predictor of Ray Data.

Users with a dataset already reach for Ray Data (``Dataset.map_batches`` with a
callable class, one actor per worker) for sharding, the worker pool, retries
and the output; nxrt plugs into it instead of growing a scheduler of its own.
``pip install "nxrt[ray]"`` brings Ray Data and pyarrow.

- :func:`run_batched` (no Ray needed): run more rows than the model's fixed
  batch dimension takes, split into chunks and concatenated.
- :class:`Predictor`: the callable class ``map_batches`` builds once per actor.
  It opens one session (model by path or through Ray's object store, see
  :class:`ModelPackage`), maps named columns to model inputs and outputs to
  columns, takes numpy, pandas and pyarrow batches (tensor columns included),
  and reports a row whose inference fails in :data:`ERROR_COLUMN` instead of
  dropping it or failing the job.
- :func:`predict`: ``map_batches`` wired the way nxrt needs it: the providers
  decided once in the driver (nxrt's measured selection, cached on disk) and
  passed to every worker, the first rows checked against the model's inputs
  before any worker starts (:class:`~nxrt.errors.InvalidColumn`), the actor
  pool sized to the cluster and restarted by Ray when a worker dies.
- :func:`run_job`: ``nxrt batch MODEL INPUT OUTPUT``: .npy or Parquet in,
  Parquet out, every input row written exactly once, failed rows listed.

Ray is imported only inside functions: ``import nxrt`` and ``import nxrt.tools.batch``
never import it. docs/scale-out.md has the cluster recipe and measurements.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import shutil
import tempfile
import time
import typing
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.errors import InvalidArgument, InvalidColumn, RuntimeFailure

if TYPE_CHECKING:
    import onnx
    import ray.data

    from nxrt.ort.session import InferenceSession, NodeArg, RunOptions, SessionOptions

#: The output column saying why a row failed ("" for a row that ran).
ERROR_COLUMN = "nxrt_error"
#: Rows per ``map_batches`` batch unless told otherwise.
DEFAULT_BATCH_SIZE = 64
#: ``nxrt batch``'s exit status when the job ran but some rows failed (each one reported).
EXIT_ROWS_FAILED = 3
#: Ray Data's column of ``read_numpy`` rows.
NUMPY_COLUMN = "data"

ModelLike = Any  # a path, model bytes, an onnx.ModelProto, a ModelPackage or a ray ObjectRef


# -- one process: more rows than one run takes --------------------------------------------------
def fixed_batch(session: InferenceSession, names: Sequence[str] | None = None) -> int | None:
    """The batch size the model's inputs fix on their first axis (``None`` when it is free).

    :param names: Only these inputs (default: all of them).
    """
    sizes = {
        int(arg.shape[0])
        for arg in session.get_inputs()
        if (names is None or arg.name in names) and arg.shape and isinstance(arg.shape[0], int)
    }
    if len(sizes) > 1:
        raise InvalidArgument(
            f"the model's inputs fix different batch sizes {sorted(sizes)} on their first axis; "
            "they cannot be fed rows of one dataset"
        )
    return sizes.pop() if sizes else None


def run_batched(
    session: InferenceSession,
    output_names: Sequence[str] | None,
    input_feed: Mapping[str, Any],
    *,
    batch_size: int | None = None,
    run_options: RunOptions | None = None,
) -> list[Any]:
    """``session.run`` for feeds holding more rows than one run of the model takes.

    The feeds are split on their first axis into chunks, each chunk is run, and
    the outputs are concatenated on their first axis. A model whose inputs fix
    the batch dimension (``[1, 3, 224, 224]``) runs chunks of that size, the last
    one padded by repeating its last row and the padding dropped from the
    outputs; a model with a free batch dimension runs chunks of ``batch_size``
    rows (default: every row in one run).

    The model must keep rows independent along that axis (each output row
    depends on its input row alone: classifiers, regressors, embedders); nxrt
    checks what shapes can show, so an output without the batch axis raises
    :class:`~nxrt.errors.InvalidArgument`. On BLAS-backed EPs a free-batch model
    may differ in the last bits between chunk sizes; a fixed-batch model never.
    """
    names = list(output_names or [o.name for o in session.get_outputs()])
    arrays = {name: np.asarray(value) for name, value in input_feed.items()}
    if any(a.ndim == 0 for a in arrays.values()):
        scalar = [n for n, a in arrays.items() if a.ndim == 0]
        raise InvalidArgument(f"run_batched splits feeds on their first axis; {scalar} have none")
    lengths = {len(a) for a in arrays.values()}
    if len(lengths) != 1:
        rows = {n: len(a) for n, a in arrays.items()}
        raise InvalidArgument(f"run_batched takes feeds with one row count; got {rows}")
    n = lengths.pop()
    if n == 0:
        raise InvalidArgument("run_batched got feeds with no rows")
    if batch_size is not None and batch_size < 1:
        raise InvalidArgument(f"batch_size must be >= 1, got {batch_size}")
    fixed = fixed_batch(session, list(arrays))
    chunk = fixed or batch_size or n
    if n == chunk:
        return session.run(names, arrays, run_options)
    parts: list[list[Any]] = []
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        feed = {name: a[start : start + rows] for name, a in arrays.items()}
        if fixed and rows < fixed:
            feed = {
                k: np.concatenate([v, np.repeat(v[-1:], fixed - rows, 0)]) for k, v in feed.items()
            }
        outputs = session.run(names, feed, run_options)
        expected = max(rows, fixed or 0)
        for name, value in zip(names, outputs):
            if np.ndim(value) == 0 or len(value) != expected:
                got = len(value) if np.ndim(value) else "no"
                raise InvalidArgument(
                    f"output {name!r} has {got} rows for a run of {expected}: it has no batch "
                    "axis, so the model cannot be run in chunks; run it on the whole feed"
                )
        parts.append([value[:rows] for value in outputs])
    return [_concatenate([part[i] for part in parts]) for i in range(len(names))]


def _concatenate(values: list[Any]) -> Any:
    if all(isinstance(v, np.ndarray) for v in values):
        return np.concatenate(values)
    return [item for value in values for item in value]  # sequence outputs: lists of rows


# -- batches and columns ------------------------------------------------------------------------
def batch_columns(batch: Any) -> tuple[dict[str, Any], str]:
    """A Ray Data batch as numpy columns (tensor columns as ``[rows, ...]`` arrays) and its
    format, ``"numpy"``, ``"pandas"`` or ``"pyarrow"``, so the result goes back in it."""
    if isinstance(batch, Mapping):
        return {str(k): _dense(np.asarray(v)) for k, v in batch.items()}, "numpy"
    module = type(batch).__module__
    if module.startswith("pandas"):
        return {str(c): _dense(_pandas_array(batch[c])) for c in batch.columns}, "pandas"
    if module.startswith("pyarrow"):
        return {n: _dense(_arrow_array(batch.column(n))) for n in batch.column_names}, "pyarrow"
    raise InvalidArgument(
        f"a batch is a dict of arrays, a pandas DataFrame or a pyarrow Table, not "
        f"{type(batch).__name__}"
    )


def _pandas_array(series: Any) -> np.ndarray:
    values = series.array
    if type(values).__name__ == "TensorArray":  # Ray's tensor extension: [rows, ...] at once
        return np.asarray(values.to_numpy())
    return series.to_numpy()


def _arrow_array(column: Any) -> np.ndarray:
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if hasattr(array, "to_numpy_ndarray"):  # Arrow's canonical fixed_shape_tensor
        return array.to_numpy_ndarray()
    if type(array).__name__.endswith("TensorArray"):  # Ray's tensor extensions
        return np.asarray(array.to_numpy())
    import pyarrow as pa

    kind = array.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _dense(np.array(array.to_pylist(), dtype=object))
    return array.to_numpy(zero_copy_only=False)


def _dense(array: np.ndarray) -> np.ndarray:
    """An object column of equal-shaped arrays (or lists) as one ``[rows, ...]`` array;
    anything else unchanged (a ragged column stays object, and the checks name it)."""
    if array.dtype != object or not len(array):
        return array
    first = array[0]
    if not isinstance(first, (np.ndarray, list, tuple)):
        return array
    try:
        return np.stack([np.asarray(row) for row in array])
    except ValueError:
        return array


def format_batch(columns: dict[str, Any], kind: str) -> Any:
    """Numpy columns as a batch of ``kind`` (what :func:`batch_columns` returned)."""
    if kind == "numpy":
        return columns
    if kind == "pandas":
        import pandas as pd

        return pd.DataFrame({name: _pandas_column(v) for name, v in columns.items()})
    import pyarrow as pa

    return pa.table({name: _arrow_column(v) for name, v in columns.items()})


def _pandas_column(values: Any) -> Any:
    array = np.asarray(values) if not isinstance(values, list) else values
    if isinstance(array, np.ndarray) and array.ndim > 1:
        try:
            from ray.data.extensions import TensorArray

            return TensorArray(array)
        except ImportError:
            return list(array)
    return array


def _arrow_column(values: Any) -> Any:
    import pyarrow as pa

    array = np.asarray(values) if not isinstance(values, list) else values
    if isinstance(array, np.ndarray) and array.ndim > 1:
        try:
            from ray.data.extensions import ArrowTensorArray

            return ArrowTensorArray.from_numpy(array)
        except ImportError:
            return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(array))
    if isinstance(array, np.ndarray) and array.dtype == object:
        return pa.array(list(array))
    return pa.array(array)


# -- columns to feeds ---------------------------------------------------------------------------
@dataclass(frozen=True)
class InputSpec:
    """A model input as rows see it: dtype and the shape of one row (``None``: a free dim)."""

    name: str
    type: str
    dtype: np.dtype
    row_shape: tuple[int | None, ...]

    @classmethod
    def of(cls, arg: NodeArg) -> InputSpec:
        from nxrt.pipeline.model import numpy_dtype_of

        if not arg.shape:
            raise InvalidArgument(
                f"model input {arg.name!r} has no batch axis (shape {arg.shape}): batch "
                "inference feeds rows on the first axis"
            )
        row = tuple(d if isinstance(d, int) else None for d in arg.shape[1:])
        return cls(arg.name, arg.type, numpy_dtype_of(arg.type), row)

    def describe(self) -> str:
        return f"{self.type} ({self.dtype}) rows of shape {_shape(self.row_shape)}"


def _shape(dims: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def resolve_columns(
    inputs: Sequence[InputSpec],
    columns: Sequence[str],
    input_columns: Mapping[str, str | Sequence[str]] | None = None,
    keep: Sequence[str] = (),
) -> dict[str, tuple[str, ...]]:
    """Which columns feed each model input: ``input_columns`` (input -> column, or columns
    stacked on a last axis), else the column named like the input, else, for a model of
    one input, the one column left that is not kept."""
    given = {
        name: (c,) if isinstance(c, str) else tuple(c) for name, c in (input_columns or {}).items()
    }
    known = {spec.name for spec in inputs}
    unknown = [name for name in given if name not in known]
    if unknown:
        raise InvalidArgument(
            f"input_columns names {unknown}, which are not inputs of the model; its inputs: "
            f"{sorted(known)}"
        )
    plan: dict[str, tuple[str, ...]] = {}
    for spec in inputs:
        if spec.name in given:
            plan[spec.name] = given[spec.name]
        elif spec.name in columns:
            plan[spec.name] = (spec.name,)
    left = [spec for spec in inputs if spec.name not in plan]
    free = [c for c in columns if c not in keep and all(c not in cs for cs in plan.values())]
    if len(left) == 1 and len(inputs) == 1 and len(free) == 1:
        plan[left[0].name] = (free[0],)
        left = []
    for spec in left:
        raise InvalidColumn(
            spec.name,
            spec.name,
            spec.describe(),
            f"no such column (columns: {list(columns)})",
            f"map one with input_columns / --input-column COL={spec.name}",
        )
    for spec in inputs:
        for column in plan[spec.name]:
            if column not in columns:
                raise InvalidColumn(
                    column,
                    spec.name,
                    spec.describe(),
                    f"no such column (columns: {list(columns)})",
                    "check the column's name, or map another one with --input-column",
                )
    return plan


def column_feeds(
    columns: Mapping[str, np.ndarray],
    plan: Mapping[str, tuple[str, ...]],
    specs: Mapping[str, InputSpec],
    *,
    cast: bool = False,
) -> dict[str, np.ndarray]:
    """The feeds of a batch, each checked against its input (dtype, rank, fixed dims); a
    column that does not fit raises :class:`~nxrt.errors.InvalidColumn` naming it."""
    feeds = {}
    for name, names in plan.items():
        spec = specs[name]
        label = ",".join(names)
        arrays = [np.asarray(columns[c]) for c in names]
        if len(arrays) > 1:
            kinds = {a.dtype for a in arrays}
            if len(kinds) > 1 or len({a.shape for a in arrays}) > 1:
                found = ", ".join(
                    f"{c}: {a.dtype}{list(a.shape[1:])}" for c, a in zip(names, arrays)
                )
                raise InvalidColumn(
                    label, name, spec.describe(), found, "stacked columns need one dtype and shape"
                )
            array = np.stack(arrays, axis=-1)
        else:
            array = arrays[0]
        other = f"or map another column with --input-column COL={name}"
        fix = f"convert the column, {other}"
        if array.dtype == object and array.ndim == 1 and spec.dtype != object:
            raise InvalidColumn(label, name, spec.describe(), "rows of different shapes", fix)
        if array.dtype != spec.dtype:
            if spec.dtype == object and array.dtype.kind in "USO":
                array = array.astype(object)
            elif cast and np.can_cast(array.dtype, spec.dtype, "same_kind"):
                array = array.astype(spec.dtype)
            else:
                found = f"{array.dtype} rows of shape {_shape(array.shape[1:])}"
                hint = (
                    f"convert the column (.astype(np.{spec.dtype.name})) or pass --cast "
                    f"(cast=True), {other}"
                )
                raise InvalidColumn(label, name, spec.describe(), found, hint)
        row = array.shape[1:]
        if len(row) != len(spec.row_shape) or any(
            want is not None and got != want for got, want in zip(row, spec.row_shape)
        ):
            found = f"{array.dtype} rows of shape {_shape(row)}"
            raise InvalidColumn(label, name, spec.describe(), found, fix)
        feeds[name] = np.ascontiguousarray(array)
    return feeds


# -- the model on a worker ----------------------------------------------------------------------
@dataclass(frozen=True)
class ModelPackage:
    """A model with the files beside it that it reads (external data, EPContext blobs of
    ``embed_mode=0``), as bytes: what reaches workers through Ray's object store when the
    model is not on a filesystem they share."""

    name: str
    model: bytes
    files: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def of(cls, model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> ModelPackage:
        """Pack a model path (with its side files), model bytes or a ModelProto."""
        from nxrt.pipeline.external_data import resolve_location
        from nxrt.pipeline.model import read_proto

        if not isinstance(model, (str, os.PathLike)):
            data = model if isinstance(model, bytes) else model.SerializeToString()
            return cls("model.onnx", bytes(data))
        path = os.fspath(model)
        proto = read_proto(path)
        base = os.path.dirname(os.path.abspath(path))
        files = {}
        for location, what in side_files(proto):
            with open(resolve_location(base, location, what), "rb") as f:
                files[location] = f.read()
        with open(path, "rb") as f:
            return cls(os.path.basename(path), f.read(), files)

    def open(self) -> tuple[str | bytes, str | None]:
        """What a session is built from: the bytes alone, or (side files) a path in a fresh
        folder holding the model and its files, returned second so the caller removes it."""
        if not self.files:
            return self.model, None
        folder = tempfile.mkdtemp(prefix="nxrt-model-")
        for location, data in {self.name: self.model, **self.files}.items():
            target = os.path.join(folder, *location.replace("\\", "/").split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
        return os.path.join(folder, self.name), folder


def side_files(proto: onnx.ModelProto) -> list[tuple[str, str]]:
    """The files a model reads beside itself: ``(location, what)`` for each external-data
    location and each EPContext blob file, once each, in graph order."""
    from nxrt.epcontext import EPCONTEXT_DOMAIN, EPCONTEXT_OP

    found: dict[str, str] = {}

    def tensor(t: Any) -> None:
        if t.data_location == 1:  # TensorProto.EXTERNAL
            entries = {e.key: e.value for e in t.external_data}
            found.setdefault(entries.get("location", ""), f"tensor {t.name!r}")

    def graph(g: Any) -> None:
        for t in g.initializer:
            tensor(t)
        for node in g.node:
            node_files(node)

    def node_files(node: Any) -> None:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == EPCONTEXT_OP and node.domain == EPCONTEXT_DOMAIN:
            mode = attrs.get("embed_mode")
            blob = attrs.get("ep_cache_context")
            if mode is not None and mode.i == 0 and blob is not None:
                found.setdefault(blob.s.decode("utf-8"), f"EPContext {node.name!r}")
        for attr in node.attribute:
            if attr.HasField("t"):
                tensor(attr.t)
            for t in attr.tensors:
                tensor(t)
            if attr.HasField("g"):
                graph(attr.g)
            for g in attr.graphs:
                graph(g)

    graph(proto.graph)
    for function in proto.functions:
        for node in function.node:
            node_files(node)
    return [(location, what) for location, what in found.items() if location]


def _actor_threads() -> int | None:
    """The CPUs Ray gave the running actor, as threads (``None`` outside a Ray worker)."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - the driver, or an old Ray: no assignment to read
        return None
    return max(1, round(cpus)) if cpus else None


def _open_model(model: ModelLike) -> tuple[Any, str | None]:
    """A session source from what the driver sent, and a folder to remove afterwards."""
    if type(model).__name__ == "ObjectRef":
        import ray

        model = ray.get(model)
    if isinstance(model, ModelPackage):
        return model.open()
    return model, None


def _describe_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


class Predictor:
    """The callable class of Ray Data's ``map_batches``: one nxrt session per actor.

    Ray builds it once per actor, so the model is loaded and compiled once, not
    per batch (Ray's batch-inference idiom)::

        ds.map_batches(
            nxrt.tools.batch.Predictor,
            fn_constructor_kwargs={"model": "model.onnx", "providers": ["cpu"], "keep": ["id"]},
            compute=ray.data.ActorPoolStrategy(size=4),
            num_cpus=1,
            batch_size=64,
        )

    :func:`predict` makes this call for you, with the providers decided once and
    the first rows checked. Each call returns the kept columns, one column per
    output and :data:`ERROR_COLUMN`, in the batch's own format. A row whose
    inference fails keeps its place: its outputs are filled (NaN, 0 or "") and
    its error is in :data:`ERROR_COLUMN`, so no row is ever dropped.

    :param model: A path (on a filesystem every worker sees), model bytes, a
        :class:`ModelPackage`, or an ``ObjectRef`` of either (Ray's object store).
    :param sess_options: Session options (picklable); ``intra_op_num_threads``
        unset is taken from ``threads``.
    :param providers: The session's providers; ``None``: nxrt's selection on the
        worker (:func:`predict` passes the driver's decision instead).
    :param input_columns: Model input -> column (or columns, stacked on a last
        axis); by default each input reads the column of its name.
    :param output_columns: Model output -> column (default: the output's name).
    :param keep: Columns passed through unchanged (an id, a path).
    :param threads: Intra-op threads; default: the CPUs Ray gave the actor
        (its ``num_cpus``), at least 1.
    :param batch_size: Rows per run for a model with a free batch dimension
        (default: the whole batch); a fixed one is run in its own size.
    :param cast: Cast columns to the input's dtype where numpy's ``same_kind`` allows.
    :param output_specs: Output -> ``(dtype, row shape)``, to fill the rows that
        fail before any row has run (:func:`predict` measures them).
    """

    def __init__(
        self,
        model: ModelLike,
        *,
        sess_options: SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        input_columns: Mapping[str, str | Sequence[str]] | None = None,
        output_columns: Mapping[str, str] | None = None,
        keep: Sequence[str] = (),
        threads: int | None = None,
        batch_size: int | None = None,
        cast: bool = False,
        output_specs: Mapping[str, tuple[str, tuple[int, ...]]] | None = None,
        session: InferenceSession | None = None,
    ) -> None:
        import nxrt

        if session is None:
            options = copy.copy(sess_options) if sess_options is not None else None
            threads = threads or _actor_threads()
            if threads and (options is None or not options.intra_op_num_threads):
                options = options or nxrt.SessionOptions()
                options.intra_op_num_threads = int(threads)
            source, folder = _open_model(model)
            session = nxrt.InferenceSession(source, options, providers=providers)
            if folder is not None:  # external data is mapped: the folder lives with the session
                weakref.finalize(self, shutil.rmtree, folder, True)
        self.session = session
        self.specs = {arg.name: InputSpec.of(arg) for arg in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]
        self.output_columns = {n: (output_columns or {}).get(n, n) for n in self.output_names}
        self.input_columns = dict(input_columns or {})
        self.keep = list(keep)
        clash = set(self.keep) & ({*self.output_columns.values(), ERROR_COLUMN})
        if clash:
            raise InvalidArgument(
                f"kept column(s) {sorted(clash)} would be overwritten by the model's outputs; "
                "rename the outputs with output_columns / --output-column OUTPUT=COL"
            )
        self.batch_size = batch_size
        self.cast = cast
        self.output_specs = {
            name: (np.dtype(dtype), tuple(shape))
            for name, (dtype, shape) in (output_specs or {}).items()
        }
        for arg in session.get_outputs():  # fully static outputs need no measuring
            if arg.name not in self.output_specs and arg.shape and arg.type.startswith("tensor("):
                if all(isinstance(d, int) for d in arg.shape[1:]):
                    from nxrt.pipeline.model import numpy_dtype_of

                    dims = typing.cast("tuple[int, ...]", tuple(arg.shape[1:]))  # all int: checked
                    self.output_specs[arg.name] = (numpy_dtype_of(arg.type), dims)
        self._plan: dict[str, tuple[str, ...]] | None = None
        self._planned_for: tuple[str, ...] = ()

    def plan(self, columns: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Which columns feed which input (resolved once per set of columns)."""
        if self._plan is None or self._planned_for != tuple(columns):
            missing = [c for c in self.keep if c not in columns]
            if missing:
                raise InvalidArgument(
                    f"kept column(s) {missing} are not in the data; columns: {list(columns)}"
                )
            self._plan = resolve_columns(
                list(self.specs.values()), columns, self.input_columns, self.keep
            )
            self._planned_for = tuple(columns)
        return self._plan

    def feeds(self, columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The checked feeds of numpy columns (raises :class:`~nxrt.errors.InvalidColumn`)."""
        return column_feeds(columns, self.plan(list(columns)), self.specs, cast=self.cast)

    def __call__(self, batch: Any) -> Any:
        columns, kind = batch_columns(batch)
        rows = len(next(iter(columns.values()))) if columns else 0
        self.plan(list(columns))
        result: dict[str, Any] = {name: columns[name] for name in self.keep}
        outputs, errors = self.infer(columns, rows)
        for name in self.output_names:
            result[self.output_columns[name]] = outputs[name]
        result[ERROR_COLUMN] = errors
        return format_batch(result, kind)

    def infer(self, columns: Mapping[str, np.ndarray], rows: int) -> tuple[dict[str, Any], Any]:
        """Every output for ``rows`` rows and each row's error ("" where it ran). A batch
        that fails is run again row by row, so only the rows that fail are marked."""
        errors = np.full(rows, "", dtype=object)
        if rows == 0:
            return {n: self._filled(n, 0) for n in self.output_names}, errors
        try:
            values = run_batched(
                self.session, self.output_names, self.feeds(columns), batch_size=self.batch_size
            )
        except Exception:  # noqa: BLE001 - which rows failed is found next, one by one
            pass
        else:
            self._learn(values)
            return dict(zip(self.output_names, values)), errors
        per_row: list[list[Any] | None] = []
        for i in range(rows):
            try:
                row = {name: column[i : i + 1] for name, column in columns.items()}
                values = run_batched(self.session, self.output_names, self.feeds(row))
            except Exception as exc:  # noqa: BLE001 - the row is reported, the job goes on
                errors[i] = _describe_error(exc)
                per_row.append(None)
            else:
                self._learn(values)
                per_row.append(values)
        good = [i for i, v in enumerate(per_row) if v is not None]
        if 1 < len(good) < rows:  # the rows that ran, run again together: as a batch computes
            kept = {name: column[good] for name, column in columns.items()}
            try:
                together = run_batched(
                    self.session, self.output_names, self.feeds(kept), batch_size=self.batch_size
                )
            except Exception:  # noqa: BLE001 - keep the rows' own results
                pass
            else:
                for j, i in enumerate(good):
                    per_row[i] = [value[j : j + 1] for value in together]
        outputs = {}
        for k, name in enumerate(self.output_names):
            parts = [v[k] if v is not None else self._filled(name, 1) for v in per_row]
            outputs[name] = _concatenate(parts)
        return outputs, errors

    def _learn(self, values: list[Any]) -> None:
        for name, value in zip(self.output_names, values):
            if name not in self.output_specs and isinstance(value, np.ndarray) and value.ndim:
                self.output_specs[name] = (value.dtype, value.shape[1:])

    def _filled(self, name: str, rows: int) -> np.ndarray:
        """Rows of output ``name`` for rows that failed: NaN, 0 or ""."""
        spec = self.output_specs.get(name)
        if spec is None:
            raise RuntimeFailure(
                f"rows failed before output {name!r} was ever computed, so its shape is unknown "
                "and the rows cannot be kept; pass output_specs (nxrt.tools.batch.predict does)"
            )
        dtype, shape = spec
        fill: Any = np.nan if dtype.kind in "fc" else ("" if dtype.kind in "OUS" else 0)
        return np.full((rows, *shape), fill, dtype=dtype)


# -- the driver ---------------------------------------------------------------------------------
def worker_sizing(workers: int | None, threads: int = 1) -> tuple[int, float]:
    """How many actors to start and how many CPUs each asks Ray for.

    Ray Data's read and write tasks need one CPU each, and a pool whose actors
    hold every CPU of the cluster leaves them waiting forever
    (ray-project/ray#44687). So the actors' share is cut to leave one CPU free;
    each actor still runs ``threads`` threads. Default workers: one per
    ``threads`` CPUs of the cluster.
    """
    import ray

    total = float(ray.cluster_resources().get("CPU", 0.0))
    if threads < 1:
        raise InvalidArgument(f"threads must be >= 1, got {threads}")
    if workers is None:
        workers = max(1, int(total // threads))
    if workers < 1:
        raise InvalidArgument(f"workers must be >= 1, got {workers}")
    cpus = float(threads)
    if workers * cpus > total - 1:
        cpus = (total - 1) / workers
    if cpus < 0.01:
        raise InvalidArgument(
            f"the Ray cluster has {total:g} CPU(s): {workers} worker(s) would leave none for "
            "Ray Data's read and write tasks; start Ray with more (`ray start --num-cpus=N`, "
            "logical CPUs may exceed cores) or run fewer workers"
        )
    return workers, round(cpus, 4)


def decided_providers(session: InferenceSession) -> list[str]:
    """The providers a session ended with: its selection's choice when it measured (or read
    the cache), else the EPs it runs; what the driver passes to every worker."""
    report = session.get_partition().selection
    if report is not None and report.choice:
        return list(report.choice)
    return session.get_providers()


def driver_session(
    model: Any,
    sess_options: SessionOptions | None,
    providers: Sequence[Any] | None,
    threads: int,
    batch_size: int,
) -> InferenceSession:
    """The driver's session: built like a worker's (same threads) and, with no providers,
    measured at the batch the workers will run, so the selection decided (and cached)
    here is the workers' decision too."""
    import nxrt
    from nxrt.pipeline.model import read_proto
    from nxrt.pipeline.selection import DIMS

    options = copy.copy(sess_options) if sess_options is not None else nxrt.SessionOptions()
    options._config = dict(options._config)
    if not options.intra_op_num_threads:
        options.intra_op_num_threads = threads
    if providers is None and DIMS not in options._config:
        proto = (
            read_proto(model) if not isinstance(model, ModelPackage) else read_proto(model.model)
        )
        names = {
            i.type.tensor_type.shape.dim[0].dim_param
            for i in proto.graph.input
            if i.type.tensor_type.shape.dim and i.type.tensor_type.shape.dim[0].dim_param
        }
        if names:
            options.add_session_config_entry(DIMS, ",".join(f"{n}={batch_size}" for n in names))
    source = model
    folder = None
    if isinstance(model, ModelPackage):
        source, folder = model.open()
    session = nxrt.InferenceSession(source, options, providers=providers)
    if folder is not None:
        weakref.finalize(session, shutil.rmtree, folder, True)
    return session


def check_first_rows(predictor: Predictor, batch: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Fail fast, in the driver: the first rows' columns against the model's inputs
    (:class:`~nxrt.errors.InvalidColumn` names the column and the expected type), then
    one run for the outputs' dtypes and row shapes. A row that fails only to run is not
    fatal here: workers report it like any other."""
    columns, _ = batch_columns(batch)
    feeds = predictor.feeds(columns)
    try:
        values = run_batched(predictor.session, predictor.output_names, feeds)
    except Exception:  # noqa: BLE001 - reported by the worker that runs it
        values = []
    predictor._learn(values)
    return {n: (str(d), tuple(s)) for n, (d, s) in predictor.output_specs.items()}


def _ship(model: Any, ship: str) -> Any:
    """What workers get: the path (``"path"``: a filesystem they share), or the model and
    its side files in Ray's object store (``"object-store"``). ``"auto"``: the path on a
    one-node cluster, the object store otherwise."""
    import ray

    if ship not in ("auto", "path", "object-store"):
        raise InvalidArgument(f"ship is 'auto', 'path' or 'object-store', not {ship!r}")
    is_path = isinstance(model, (str, os.PathLike))
    if ship == "auto":
        ship = (
            "path"
            if is_path and len([n for n in ray.nodes() if n.get("Alive")]) <= 1
            else ("object-store")
        )
    if ship == "path":
        if not is_path:
            raise InvalidArgument("ship='path' needs a model path; bytes go by the object store")
        return os.path.abspath(os.fspath(model))
    return ray.put(model if isinstance(model, ModelPackage) else ModelPackage.of(model))


@dataclass
class BatchPlan:
    """What the driver decided for a job: the pool, each actor's CPUs, the providers every
    worker gets, and the :class:`Predictor`'s arguments."""

    workers: int
    cpus: float
    providers: list[Any]
    batch_size: int
    constructor: dict[str, Any]

    def apply(self, ds: ray.data.Dataset) -> ray.data.Dataset:
        """``ds.map_batches`` with this plan's predictor pool.

        A worker that dies is restarted and its batches re-run: Ray Data gives
        actor pools ``max_restarts=-1`` and ``max_task_retries=-1`` unless told
        otherwise (passing them again is deprecated as of Ray 2.60), and the
        killed-worker test holds Ray to it.
        """
        import ray.data

        return ds.map_batches(
            Predictor,
            fn_constructor_kwargs=self.constructor,
            batch_size=self.batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=self.workers),
            num_cpus=self.cpus,
        )


def plan_batch(
    ds: ray.data.Dataset,
    model: Any,
    *,
    workers: int | None = None,
    threads: int = 1,
    batch_size: int = DEFAULT_BATCH_SIZE,
    providers: Sequence[Any] | None = None,
    sess_options: SessionOptions | None = None,
    input_columns: Mapping[str, str | Sequence[str]] | None = None,
    output_columns: Mapping[str, str] | None = None,
    keep: Sequence[str] = (),
    cast: bool = False,
    ship: str = "auto",
    check: bool = True,
) -> BatchPlan:
    """The driver's half of :func:`predict` (same parameters): decide, check, ship."""
    workers, cpus = worker_sizing(workers, threads)
    session = driver_session(model, sess_options, providers, threads, batch_size)
    chosen = list(providers) if providers is not None else decided_providers(session)
    kwargs: dict[str, Any] = dict(
        sess_options=sess_options,
        input_columns=input_columns,
        output_columns=output_columns,
        keep=list(keep),
        threads=threads,
        batch_size=batch_size,
        cast=cast,
    )
    specs = None
    if check:
        local = Predictor(model, session=session, **kwargs)
        specs = check_first_rows(local, ds.take_batch(1, batch_format="numpy"))
    constructor = {"model": _ship(model, ship), "providers": chosen, "output_specs": specs}
    return BatchPlan(workers, cpus, chosen, batch_size, {**constructor, **kwargs})


def predict(ds: ray.data.Dataset, model: Any, **options: Any) -> ray.data.Dataset:
    """``ds.map_batches`` with an nxrt :class:`Predictor` on every worker.

    In the driver, before any worker starts: the providers are decided once
    (``providers=None``: nxrt's measured selection, at the workers' thread count
    and batch, cached on disk) and the same list goes to every worker; with
    ``check`` (default) the first row is read and checked against the model's
    inputs, so a missing column or a wrong dtype or shape raises
    :class:`~nxrt.errors.InvalidColumn` now, not in a worker an hour in.

    The pool has ``workers`` actors (default: one per ``threads`` CPUs of the
    cluster, see :func:`worker_sizing`), each running ``threads`` threads. A
    worker process that dies is restarted by Ray and its batches are run again,
    so every row comes out once.

    :param options: Those of :func:`plan_batch`: ``workers``, ``threads``,
        ``batch_size``, ``providers``, ``sess_options``, ``input_columns``,
        ``output_columns``, ``keep``, ``cast``, ``ship`` (``"path"``,
        ``"object-store"`` or ``"auto"``: the path on a one-node cluster),
        ``check``.
    :returns: The lazy dataset of kept columns, outputs and :data:`ERROR_COLUMN`.
    """
    return plan_batch(ds, model, **options).apply(ds)


# -- nxrt batch ---------------------------------------------------------------------------------
@dataclass
class JobResult:
    """What ``nxrt batch`` did: rows in and out, failed rows, time, and where things went."""

    input_rows: int
    rows: int
    failed: int
    seconds: float
    workers: int
    providers: list[str]
    output: str
    errors_path: str = ""
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        """The last line ``nxrt batch`` prints: rows, seconds, rows per second."""
        failed = f"{self.failed} failed (see {self.errors_path})" if self.failed else "0 failed"
        return (
            f"{self.rows} rows in {self.seconds:.2f} s: {self.rows_per_second:.1f} rows/s "
            f"({self.workers} worker(s), {failed})"
        )


def input_files(source: str, fmt: str = "auto") -> tuple[list[str], str]:
    """The files ``nxrt batch`` reads and their format (``"npy"`` or ``"parquet"``): a file,
    a folder (every .npy or .parquet file below it), a glob, or a URI Ray Data reads
    (``s3://...``: what nodes of a cluster share), passed on as it is."""
    if fmt not in ("auto", "npy", "parquet"):
        raise InvalidArgument(f"format is 'auto', 'npy' or 'parquet', not {fmt!r}")
    if "://" in source:
        if fmt == "auto":
            fmt = next((k for k in ("npy", "parquet") if source.endswith("." + k)), "")
            if not fmt:
                raise InvalidArgument(f"pass --format npy|parquet for input {source!r}")
        return [source], fmt
    if os.path.isdir(source):
        listed = glob.glob(os.path.join(source, "**", "*"), recursive=True)
    elif glob.has_magic(source):
        listed = glob.glob(source, recursive=True)
    elif os.path.isfile(source):
        listed = [source]
    else:
        raise InvalidArgument(f"input {source!r} is not a file, a folder or a glob that matches")
    files = sorted(p for p in listed if p.endswith((".npy", ".parquet")) and os.path.isfile(p))
    if listed == [source] and not files:
        files = [source]  # a file named as it is: --format says what it holds
    kinds = {"npy" if p.endswith(".npy") else "parquet" for p in files}
    if fmt == "auto":
        if len(kinds) != 1:
            found = "both .npy and .parquet files" if kinds else "no .npy or .parquet file"
            raise InvalidArgument(f"input {source!r} holds {found}; pass --format npy|parquet")
        fmt = kinds.pop()
    elif len(files) > 1:
        files = [p for p in files if p.endswith("." + fmt)]
    if not files:
        raise InvalidArgument(f"input {source!r} holds no {fmt} file")
    return files, fmt


def count_rows(files: Sequence[str], fmt: str) -> int | None:
    """The rows of the input, from headers and footers (no data read); ``None`` for .npy
    files behind a URI (Ray counts those)."""
    if fmt == "npy":
        if any("://" in p for p in files):
            return None
        return sum(int(np.load(p, mmap_mode="r", allow_pickle=False).shape[0]) for p in files)
    import pyarrow.dataset as pads

    return int(pads.dataset(list(files), format="parquet").count_rows())


def read_input(files: Sequence[str], fmt: str, keep: Sequence[str] = ()) -> ray.data.Dataset:
    """The input as a Ray Data dataset: ``read_numpy`` (column :data:`NUMPY_COLUMN`, and
    ``path`` when it is kept) or ``read_parquet`` (tensor columns included)."""
    import ray.data

    if fmt == "npy":
        return ray.data.read_numpy(list(files), include_paths="path" in keep)
    return ray.data.read_parquet(list(files))


def _connect(address: str | None) -> bool:
    """Join the cluster at ``address``, or start a local Ray sized to this machine; returns
    whether this call connected (and so should disconnect). A driver already connected
    (a test, a notebook) is used as it is."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=max(2, os.cpu_count() or 1), include_dashboard=False)
    return True


def _written(output: str, keep: Sequence[str]) -> tuple[int, list[dict[str, Any]]]:
    """Rows written under ``output`` and, for each failed row, where it is, its kept
    columns and its error (reads only the footers and those columns)."""
    import pyarrow.dataset as pads

    dataset = pads.dataset(output, format="parquet")
    rows = 0
    failures = []
    for fragment in dataset.get_fragments():
        table = fragment.to_table(columns=[*keep, ERROR_COLUMN])
        errors = table.column(ERROR_COLUMN).to_pylist()
        for index, error in enumerate(errors):
            if error:
                row = {"file": os.path.basename(fragment.path), "row": index}
                row.update({k: _plain(table.column(k)[index].as_py()) for k in keep})
                row["error"] = error
                failures.append(row)
        rows += len(errors)
    return rows, failures


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def run_job(
    model: str,
    source: str,
    output: str,
    *,
    workers: int | None = None,
    threads: int = 1,
    batch_size: int = DEFAULT_BATCH_SIZE,
    address: str | None = None,
    providers: Sequence[Any] | None = None,
    input_columns: Mapping[str, str | Sequence[str]] | None = None,
    output_columns: Mapping[str, str] | None = None,
    keep: Sequence[str] = (),
    cast: bool = False,
    fmt: str = "auto",
    errors_path: str | None = None,
    overwrite: bool = False,
    ship: str = "auto",
) -> JobResult:
    """``nxrt batch``: read ``source``, run ``model`` over every row, write Parquet to
    ``output`` (one column per output, the ``keep`` columns, :data:`ERROR_COLUMN`).

    Every input row is written exactly once: the output's row count is checked
    against the input's (a mismatch raises :class:`~nxrt.errors.RuntimeFailure`),
    and rows whose inference failed are listed, with their kept columns (pass an
    id with ``keep``), file and row, in ``errors_path`` (default
    ``OUTPUT.errors.jsonl``). ``seconds`` is the job's wall time from the first
    read to the last write, actor start-up included, the driver's checks not.
    """
    if "://" not in output and (
        os.path.isdir(output) and os.listdir(output) or os.path.isfile(output)
    ):
        if not overwrite:
            raise InvalidArgument(f"output {output!r} exists; remove it or pass --overwrite")
        if os.path.isdir(output):
            shutil.rmtree(output)
        else:
            os.remove(output)
    files, fmt = input_files(source, fmt)
    expected = count_rows(files, fmt)
    owned = _connect(address)
    try:
        ds = read_input(files, fmt, keep)
        if expected is None:
            expected = ds.count()
        plan = plan_batch(
            ds,
            model,
            workers=workers,
            threads=threads,
            batch_size=batch_size,
            providers=providers,
            input_columns=input_columns,
            output_columns=output_columns,
            keep=keep,
            cast=cast,
            ship="path" if ship == "auto" and not address else ship,
        )
        start = time.perf_counter()
        plan.apply(ds).write_parquet(output)
        seconds = time.perf_counter() - start
    finally:
        if owned:
            import ray

            ray.shutdown()
    rows, failures = _written(output, keep)
    if rows != expected:
        raise RuntimeFailure(
            f"the input has {expected} rows but {rows} were written to {output!r}; this is a "
            "bug: report it with the job's Ray logs"
        )
    path = ""
    if failures:
        local = output.rstrip("/\\") if "://" not in output else "nxrt-batch"
        path = errors_path or local + ".errors.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for failure in failures:
                f.write(json.dumps(failure, default=str) + "\n")
    return JobResult(
        expected, rows, len(failures), seconds, plan.workers, plan.providers, output, path, failures
    )


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "ERROR_COLUMN",
    "EXIT_ROWS_FAILED",
    "BatchPlan",
    "InputSpec",
    "JobResult",
    "ModelPackage",
    "Predictor",
    "batch_columns",
    "column_feeds",
    "decided_providers",
    "fixed_batch",
    "format_batch",
    "plan_batch",
    "predict",
    "resolve_columns",
    "run_batched",
    "run_job",
    "side_files",
    "worker_sizing",
]
