"""``InferenceSession``: ONNX Runtime's API over nxrt's plugin EPs.

Creation is :mod:`nxrt.pipeline`'s; this module holds the ONNX Runtime-shaped
classes around it (options, node args, the session) and the feed checks of ``run``.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from nxrt import pipeline
from nxrt.errors import InvalidArgument
from nxrt.executor import Profiler
from nxrt.host import NxrtPluginManager
from nxrt.model import numpy_dtype, type_string_of
from nxrt.partition import PartitionReport
from nxrt.pipeline import DISABLE_CPU_EP_FALLBACK, DISABLE_MODEL_COMPILE, ProviderRequest
from nxrt.selection import ExecutionProviderDevicePolicy
from nxrt.tensor import TensorMut, TensorView
from nxrt.values import is_map_type, map_feed

#: ONNX Runtime's name for the provider-selection policies.
OrtExecutionProviderDevicePolicy = ExecutionProviderDevicePolicy

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.weight import ExecutionProviderCapabilities

__all__ = [
    "DISABLE_CPU_EP_FALLBACK",
    "DISABLE_MODEL_COMPILE",
    "GraphOptimizationLevel",
    "InferenceSession",
    "NodeArg",
    "OrtExecutionProviderDevicePolicy",
    "RunOptions",
    "SessionOptions",
]


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


class SessionOptions:
    """Session settings, with ONNX Runtime's attribute names."""

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.enable_profiling = False
        self.profile_file_prefix = "nxrt_profile"
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self._config: dict[str, str] = {}
        self._selection_policy = ExecutionProviderDevicePolicy.DEFAULT

    def set_provider_selection_policy(self, policy: ExecutionProviderDevicePolicy | str) -> None:
        """How a session given no ``providers`` picks its EPs (see :mod:`nxrt.selection`).

        Takes an :class:`OrtExecutionProviderDevicePolicy` (ONNX Runtime's
        names: ``PREFER_CPU``, ``PREFER_GPU``, ``MAX_PERFORMANCE`` ..., plus
        nxrt's ``MEASURE``, the default, and ``PRIORITY``) or its name.
        """
        self._selection_policy = ExecutionProviderDevicePolicy.parse(policy)

    @property
    def provider_selection_policy(self) -> ExecutionProviderDevicePolicy:
        return self._selection_policy

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise InvalidArgument(f"session config entry {key!r} is not set")
        return self._config[key]

    def config_flag(self, key: str) -> bool:
        return self._config.get(key, "0") not in ("", "0")


class RunOptions:
    """Per-run settings, with ONNX Runtime's attribute names."""

    def __init__(self) -> None:
        self.log_severity_level = 2
        self.run_tag = ""


@dataclass(frozen=True)
class NodeArg:
    """A model input or output as ``get_inputs()`` describes it."""

    name: str
    shape: list[int | str | None]
    type: str


def _describe_values(values: Sequence[ir.Value]) -> list[NodeArg]:
    args = []
    for value in values:
        shape: list[int | str | None] = []
        if value.shape is not None:
            shape = [
                d if isinstance(d, int) else (d.value if d.value else None) for d in value.shape
            ]
        args.append(NodeArg(value.name, shape, type_string_of(value.type)))
    return args


def _host_array(value: Any) -> np.ndarray:
    """A feed that is not a numpy array: DLPack producers and buffers arrive zero-copy
    through :class:`~nxrt.tensor.TensorView` (which checks dtype and alignment); anything
    else through ``np.asarray``."""
    if hasattr(value, "__dlpack__") or isinstance(value, (TensorView, TensorMut)):
        return TensorView(value).array
    return np.asarray(value)


class InferenceSession:
    """Runs an ONNX model on the installed execution providers.

    The ONNX Runtime-shaped shell around :func:`nxrt.pipeline.create`, which
    does all the work of creation; ``run`` validates the feeds and walks the plan.

    :param path_or_bytes: A model path, its bytes, or an ``onnx.ModelProto``.
    :param sess_options: :class:`SessionOptions`.
    :param providers: EP ids (or ONNX Runtime names such as
        ``CPUExecutionProvider``) or ``(id, options)`` pairs, highest priority
        first. Default: every installed EP, cpu last. cpu is appended as the
        fallback unless ``session.disable_cpu_ep_fallback`` is ``"1"``.
    :param provider_options: One options dict per entry of ``providers``.
    :param plugin_manager: The plugin manager to use (tests inject one);
        default: nxrt's shared one.
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto,
        sess_options: SessionOptions | None = None,
        providers: Sequence[ProviderRequest] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        *,
        plugin_manager: NxrtPluginManager | None = None,
        **kwargs: Any,
    ) -> None:
        from nxrt import default_plugin_manager

        if kwargs:
            raise InvalidArgument(
                f"InferenceSession got unexpected keyword argument(s) {sorted(kwargs)}; it "
                "takes path_or_bytes, sess_options, providers, provider_options"
            )
        self._options = sess_options or SessionOptions()
        options = self._options
        create_options = pipeline.CreateOptions(
            threads=options.intra_op_num_threads or None,
            optimize=options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_BASIC,
            fallback=not options.config_flag(pipeline.DISABLE_CPU_EP_FALLBACK),
            allow_compile=not options.config_flag(pipeline.DISABLE_MODEL_COMPILE),
            policy=options.provider_selection_policy,
            config=dict(options._config),
        )
        self._state = state = pipeline.create(
            path_or_bytes,
            pipeline.provider_requests(providers, provider_options),
            create_options,
            plugin_manager or default_plugin_manager(),
        )
        self._model = state.loaded.model
        self._host = state.host
        self._eps = state.providers.eps
        self._plan = state.plan
        self._parallel = state.parallel
        self._report = state.placement.report
        self._host_blas = state.uses_host_blas
        graph = self._model.graph
        initializer_names = set(graph.initializers)
        self._inputs = _describe_values(
            [v for v in graph.inputs if v.name not in initializer_names]
        )
        self._overridable = _describe_values(
            [v for v in graph.inputs if v.name in initializer_names]
        )
        self._outputs = _describe_values(graph.outputs)
        self._input_dtypes = {a.name: v for a, v in zip(self._inputs, self._input_values())}
        # built once: models that list their weights as inputs have hundreds of names
        self._expected_inputs = {a.name: a for a in self._inputs}
        self._overridable_names = frozenset(a.name for a in self._overridable)
        self._profiler = None
        if options.enable_profiling:
            stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
            self._profiler = Profiler(f"{options.profile_file_prefix}_{stamp}.json")

    def _input_values(self) -> list[ir.Value]:
        names = {a.name for a in self._inputs}
        return [v for v in self._model.graph.inputs if v.name in names]

    # -- ONNX Runtime's API -------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_providers(self) -> list[str]:
        return [ep.id for ep, _ in self._eps]

    def get_provider_options(self) -> dict[str, dict[str, Any]]:
        return {ep.id: dict(ep.config.options) for ep, _ in self._eps}

    def get_session_options(self) -> SessionOptions:
        return self._options

    def get_modelmeta(self) -> dict[str, Any]:
        return {
            "producer_name": self._model.producer_name,
            "graph_name": self._model.graph.name,
            "doc_string": self._model.doc_string,
            "custom_metadata_map": dict(self._model.metadata_props),
        }

    def get_partition(self) -> PartitionReport:
        """Which EP runs each node, the partitions, the copies, and every refusal."""
        return self._report

    def get_capabilities(self, ep_id: str) -> ExecutionProviderCapabilities:
        return self._state.providers.capabilities[ep_id]

    def end_profiling(self) -> str:
        """Write the Chrome trace and return its path ('' when profiling is off)."""
        return self._profiler.write() if self._profiler else ""

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: dict[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[Any]:
        """Compute ``output_names`` (all when ``None``) from ``input_feed``."""
        wanted = self._check_output_names(output_names)
        feeds = self._check_feeds(input_feed)
        if not self._host_blas:
            return self._plan.execute(feeds, wanted, self._profiler)
        with self._parallel.run_limits():
            return self._plan.execute(feeds, wanted, self._profiler)

    def _check_output_names(self, output_names: Sequence[str] | None) -> list[str]:
        if not output_names:
            return [o.name for o in self._outputs]
        known = [o.name for o in self._outputs]
        for name in output_names:
            if name not in known:
                raise InvalidArgument(f"{name!r} is not an output of the model; outputs: {known}")
        return list(output_names)

    def _check_feeds(self, input_feed: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(input_feed, dict):
            raise InvalidArgument("input_feed must be a dict of input name -> numpy array")
        expected = self._expected_inputs
        overridable = self._overridable_names
        unknown = [n for n in input_feed if n not in expected and n not in overridable]
        if unknown:
            raise InvalidArgument(
                f"unknown input name(s) {unknown}; the model's inputs are {self._describe_inputs()}"
            )
        missing = [n for n in expected if n not in input_feed]
        if missing:
            raise InvalidArgument(
                f"missing input(s) {missing}; the model's inputs are {self._describe_inputs()}"
            )
        feeds = {}
        for name, value in input_feed.items():
            value_info = self._input_dtypes.get(name)
            kind = type(value_info.type).__name__ if value_info is not None else "TensorType"
            if kind == "OptionalType" and value is not None:
                kind = type(value_info.type.elem_type).__name__
            if value_info is not None and is_map_type(value_info.type):
                feeds[name] = map_feed(name, value, value_info.type)  # dicts, as ORT takes them
                continue
            if kind == "SequenceType":
                if not isinstance(value, (list, tuple)):
                    raise InvalidArgument(f"input {name!r} is a sequence: pass a list of arrays")
                feeds[name] = [np.asarray(v) for v in value]
                continue
            if kind == "OptionalType" and value is None:
                feeds[name] = None
                continue
            array = value if isinstance(value, np.ndarray) else _host_array(value)
            if name in expected and kind == "TensorType":
                self._check_feed(expected[name], array)
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            feeds[name] = array
        return feeds

    def _check_feed(self, arg: NodeArg, array: np.ndarray) -> None:
        value = self._input_dtypes[arg.name]
        if value.dtype is not None:
            want = numpy_dtype(int(value.dtype))
            if array.dtype != want and not (want.kind in "OSU" and array.dtype.kind in "OSU"):
                raise InvalidArgument(
                    f"input {arg.name!r} has dtype {array.dtype}, expected {want} ({arg.type}); "
                    f"convert it with .astype(np.{want.name})"
                )
        if value.shape is None:
            return
        if array.ndim != len(arg.shape):
            raise InvalidArgument(
                f"input {arg.name!r} has rank {array.ndim} (shape {list(array.shape)}), "
                f"expected rank {len(arg.shape)} (shape {arg.shape})"
            )
        for axis, (got, want) in enumerate(zip(array.shape, arg.shape)):
            if isinstance(want, int) and got != want:
                raise InvalidArgument(
                    f"input {arg.name!r} has dim {got} on axis {axis} (shape "
                    f"{list(array.shape)}), expected {want} (shape {arg.shape})"
                )

    def _describe_inputs(self) -> str:
        return ", ".join(f"{a.name}: {a.type} {a.shape}" for a in self._inputs)
