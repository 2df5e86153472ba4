"""The ORT graph ABI bridge: a claim compiled into a standalone model, and how it runs.

:class:`PluginCompiledKernel` is one claim as ONNX Runtime sees it: a model of
its own (the claim's nodes, its boundary values as graph inputs and outputs
with their types and shapes, the initializers it reads, the model's opsets)
and the ORT session built from it. :class:`PluginExecutionPlan` decides how
values cross into and out of those sessions on every ``run``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.claims import standalone_model
from nxrt.errors import KernelFailed
from nxrt.kernel import Kernel

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.kernel import SubgraphClaim

#: Initializers at least this large reach ORT as OrtValues over nxrt's own
#: arrays (``add_external_initializers``) instead of being copied into the
#: model bytes; smaller ones stay inline so ORT can fold shapes and constants.
#: Only plain numpy dtypes go that way (ml_dtypes' bfloat16 or int4 arrays are
#: not laid out as ORT's tensors are).
EXTERNAL_INITIALIZER_BYTES = 1 << 16

#: Builds an ORT session from model bytes and the initializers handed over in memory.
SessionFactory = Callable[[bytes, Mapping[str, np.ndarray]], Any]

#: ONNX types numpy knows only through ml_dtypes, which ORT's Python API takes and
#: returns as raw bytes: ORT's type string -> ``onnx.TensorProto`` enum name.
RAW_TYPES = {
    "tensor(bfloat16)": "BFLOAT16",
    "tensor(float8e4m3fn)": "FLOAT8E4M3FN",
    "tensor(float8e4m3fnuz)": "FLOAT8E4M3FNUZ",
    "tensor(float8e5m2)": "FLOAT8E5M2",
    "tensor(float8e5m2fnuz)": "FLOAT8E5M2FNUZ",
    "tensor(float8e8m0)": "FLOAT8E8M0",
}


def _as_feed(value: Any) -> Any:
    """Scalars become arrays; sequences (lists) and maps go to ORT as they are."""
    if isinstance(value, (np.generic, int, float, bool)):
        return np.asarray(value)
    return value


def _raw_to_numpy(value: Any, dtype: np.dtype) -> np.ndarray:
    """An OrtValue of an ml_dtypes type as numpy: a view for float8, a copy for bfloat16."""
    import ctypes

    shape = tuple(value.shape())
    try:
        return value.numpy().view(dtype).reshape(shape)  # float8 arrives as uint8
    except Exception:  # noqa: BLE001 - bfloat16: ORT has no numpy type for it
        pass
    count = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if not count:
        return np.empty(shape, dtype)
    buffer = (ctypes.c_uint8 * count).from_address(value.data_ptr())
    # numpy's stub leaves out ctypes arrays, which export the buffer protocol
    return np.frombuffer(buffer, np.uint8).copy().view(dtype).reshape(shape)  # type: ignore[call-overload]


class PluginExecutionPlan:
    """How one EP's compiled kernels pass values to and from their ORT sessions.

    On the host, ``InferenceSession.run`` with numpy feeds is already
    zero-copy both ways: ORT wraps a contiguous numpy input in place and
    returns each output as a numpy array over its own buffer. IOBinding adds
    only cost there (one Relu of 1000 floats: 14 us per call through ``run``,
    47 us through a fresh IOBinding), so host kernels call the session's C++
    ``run`` directly, skipping the Python wrapper's per-call checks. On a device (CUDA), outputs are
    bound to device memory and handed on as ``OrtValue``s, so consecutive
    claims on the device never round-trip through the host; ``io_binding``
    forces that path on the host as well.

    :param device: ORT's device name for outputs, ``"cpu"`` or ``"cuda"``.
    :param device_id: The device ordinal.
    :param io_binding: Use IOBinding (default: only off the host).
    """

    def __init__(self, device: str = "cpu", device_id: int = 0, *, io_binding: bool | None = None):
        self.device = device
        self.device_id = device_id
        self.io_binding = device != "cpu" if io_binding is None else io_binding
        #: Every kernel compiled for the EP, in compile order.
        self.kernels: list[PluginCompiledKernel] = []

    def runner(
        self, session: Any, feeds: Sequence[tuple[int, str]], outputs: Sequence[str]
    ) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        """The function a kernel's ``compute`` calls: inputs in claim order, outputs in order."""
        types = {a.name: a.type for a in [*session.get_inputs(), *session.get_outputs()]}
        if any(types.get(name) in RAW_TYPES for name in [*(n for _, n in feeds), *outputs]):
            return self._raw_runner(session, feeds, outputs, types)
        if self.io_binding:
            return self._binding_runner(session, feeds, outputs)
        run = session._sess.run  # the C++ call; the wrapper only re-validates feed names
        names = list(outputs)
        pairs = tuple(feeds)
        ndarray = np.ndarray

        def run_on_host(inputs: Sequence[Any]) -> tuple[Any, ...]:
            feed = {}
            for index, name in pairs:
                value = inputs[index]
                feed[name] = value if type(value) is ndarray else _as_feed(value)
            try:
                return tuple(run(names, feed, None))
            except Exception as exc:  # noqa: BLE001 - ORT's errors carry its own reason
                raise KernelFailed(f"ONNX Runtime: {exc}") from exc

        return run_on_host

    @staticmethod
    def _raw_runner(
        session: Any,
        feeds: Sequence[tuple[int, str]],
        outputs: Sequence[str],
        types: Mapping[str, str],
    ) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        """bfloat16 and float8 values: numpy (through ml_dtypes) and ORT agree on the bytes only.

        Inputs are wrapped as ``OrtValue``s of the ONNX type over the same
        memory; float8 outputs come back as uint8 and are viewed as their
        type, bfloat16 ones (which ORT will not hand to numpy) are copied out.
        """
        import onnx
        import onnxruntime as ort

        def onnx_type(name: str) -> int:
            return getattr(onnx.TensorProto, RAW_TYPES[types[name]])

        raw_in = {n: onnx_type(n) for _, n in feeds if types.get(n) in RAW_TYPES}
        raw_out = {
            n: onnx.helper.tensor_dtype_to_np_dtype(onnx_type(n))
            for n in outputs
            if types.get(n) in RAW_TYPES
        }
        names = list(outputs)
        pairs = tuple(feeds)

        def run_raw(inputs: Sequence[Any]) -> tuple[Any, ...]:
            feed = {}
            for index, name in pairs:
                value = inputs[index]
                if name in raw_in:
                    array = np.ascontiguousarray(value)
                    storage = array.view(np.uint16 if array.itemsize == 2 else np.uint8)
                    feed[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                        storage, raw_in[name]
                    )
                else:
                    feed[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
            try:
                results = session.run_with_ort_values(names, feed)
            except Exception as exc:  # noqa: BLE001
                raise KernelFailed(f"ONNX Runtime: {exc}") from exc
            return tuple(
                _raw_to_numpy(value, raw_out[name]) if name in raw_out else value.numpy()
                for name, value in zip(names, results)
            )

        return run_raw

    def _binding_runner(
        self, session: Any, feeds: Sequence[tuple[int, str]], outputs: Sequence[str]
    ) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        import onnxruntime as ort

        device, device_id, on_host = self.device, self.device_id, self.device == "cpu"
        names = list(outputs)
        pairs = tuple(feeds)

        def run_with_binding(inputs: Sequence[Any]) -> tuple[Any, ...]:
            binding = session.io_binding()  # one per call: bindings are not thread-safe
            for index, name in pairs:
                value = inputs[index]
                if isinstance(value, ort.OrtValue):
                    binding.bind_ortvalue_input(name, value)
                else:
                    binding.bind_cpu_input(name, np.ascontiguousarray(value))
            for name in names:
                binding.bind_output(name, device, device_id)
            try:
                session.run_with_iobinding(binding)
            except Exception as exc:  # noqa: BLE001
                raise KernelFailed(f"ONNX Runtime: {exc}") from exc
            results = binding.get_outputs()
            if on_host:
                return tuple(value.numpy() for value in results)
            return tuple(results)

        return run_with_binding


class PluginCompiledKernel(Kernel):
    """One claim compiled into a standalone ONNX model run by an ORT session.

    :param session: The ORT ``InferenceSession`` of the standalone model.
    :param inputs: The value names ``compute`` receives, in order (a claim's
        boundary inputs, initializers included: those are already in the
        model, so their arrays are not passed on).
    :param outputs: The value names ``compute`` returns, in order.
    :param plan: The EP's execution plan, which decides how values cross.
    :param model_bytes: Rebuilds the model bytes (with every initializer
        inline) for EPContext; the kernel keeps no copy of its weights.
    :param name: The partition name, for traces and contexts.
    """

    variant = "onnxruntime"

    def __init__(
        self,
        session: Any,
        inputs: Sequence[str],
        outputs: Sequence[str],
        plan: PluginExecutionPlan,
        model_bytes: Callable[[], bytes],
        *,
        name: str = "",
        external: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.session = session
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.name = name
        self._model_bytes = model_bytes
        self._external = dict(external or {})  # ORT reads these arrays in place: keep them alive
        fed = {arg.name for arg in session.get_inputs()}
        feeds = [(i, n) for i, n in enumerate(self.inputs) if n in fed]
        missing = fed - {n for _, n in feeds}
        if missing:
            raise KernelFailed(
                f"the compiled partition needs inputs {sorted(missing)} it is not given"
            )
        self.providers = list(session.get_providers())
        self.variant_reason = (
            f"{len(self.inputs)} -> {len(self.outputs)} values on {self.providers[0]}"
        )
        self._run = plan.runner(session, feeds, self.outputs)
        plan.kernels.append(self)

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        return self._run(inputs)

    def model_bytes(self) -> bytes:
        """The standalone model with every initializer inline (EPContext's blob)."""
        return self._model_bytes()

    @classmethod
    def compile(
        cls,
        claim: SubgraphClaim,
        graph: ir.Graph,
        plan: PluginExecutionPlan,
        make_session: SessionFactory,
    ) -> PluginCompiledKernel:
        """Build the standalone model of ``claim`` and its session."""
        model, external = standalone_model(
            claim,
            graph,
            external_threshold=EXTERNAL_INITIALIZER_BYTES,
            producer_name="nxrt-ep-legacy-abi",
        )
        session = make_session(model.SerializeToString(), external)
        del model

        def full_bytes() -> bytes:  # rebuilt when a context is saved, never kept
            model = standalone_model(claim, graph, producer_name="nxrt-ep-legacy-abi")[0]
            return model.SerializeToString()

        return cls(
            session,
            claim.inputs,
            claim.outputs,
            plan,
            full_bytes,
            name=claim.name,
            external=external,
        )

    @classmethod
    def from_bytes(
        cls,
        blob: bytes,
        inputs: Sequence[str],
        outputs: Sequence[str],
        plan: PluginExecutionPlan,
        make_session: SessionFactory,
        *,
        name: str = "",
    ) -> PluginCompiledKernel:
        """Rebuild a kernel from saved model bytes, without partitioning anything again."""
        session = make_session(blob, {})
        if not outputs:
            outputs = [arg.name for arg in session.get_outputs()]
        if not inputs:
            inputs = [arg.name for arg in session.get_inputs()]
        return cls(session, inputs, outputs, plan, lambda: blob, name=name)

    def __repr__(self) -> str:
        return f"PluginCompiledKernel({self.name!r}, {self.providers[0] if self.providers else ''})"
