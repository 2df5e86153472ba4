"""Testing kit for EP authors, loaded by pytest as a plugin (entry point ``pytest11``).

Importing it is cheap and inert: fixtures build everything on request and
undo it at teardown. Fixtures:

- ``nxrt_pm`` — a fresh plugin manager (no entry points, builtins only,
  strict plugin loading), with every plugin registered during the test
  removed afterwards;
- ``hook_recorder`` — records every hook call made on ``nxrt_pm``, in
  order and repeats included, with its arguments and its result or exception.

Option: ``--nxrt-ep NAME`` adds the checks of :mod:`nxrt.tools.ep_suite` for
that EP (hook-level checks and the ONNX node conformance cases it accepts) to
the test run.

Helpers: :func:`register_plugin` (a context manager that always
unregisters), :func:`make_node_model` and :func:`run_node` (one-node models
through a real session pinned to one EP), :data:`LIGHT_MODELS` with
:func:`light_model_path` and :func:`dummy_feeds` (the onnx package's light
models and the input its backend runner gives them, from :mod:`nxrt.tools.light_models`).

The kit needs pytest, which the runtime does not: ``pip install "nxrt[kit]"``.
Without it, importing this module raises :class:`~nxrt.errors.MissingExtra`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nxrt.errors import MissingExtra
from nxrt.tools.light_models import LIGHT_MODELS, dummy_feeds, light_model_path

try:
    import pytest
except ImportError as exc:  # the runtime installs without pytest: the kit is an extra
    raise MissingExtra("nxrt's EP testing kit (nxrt.tools.testing)", "pytest", "kit") from exc

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from nxrt.host import NxrtPluginManager


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nxrt", "nxrt execution providers")
    group.addoption(
        "--nxrt-ep",
        dest="nxrt_ep",
        default=None,
        metavar="NAME",
        help="run nxrt's hook-level checks and ONNX conformance cases against EP NAME",
    )


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """With ``--nxrt-ep``, add the EP suite's tests to the run."""
    if not config.getoption("nxrt_ep"):
        return
    from pathlib import Path

    import nxrt.tools.ep_suite  # numpy, onnx and the host: too heavy for every pytest start

    module = pytest.Module.from_parent(session, path=Path(nxrt.tools.ep_suite.__file__))
    items.extend(item for item in module.collect() if isinstance(item, pytest.Item))


@contextlib.contextmanager
def register_plugin(pm: NxrtPluginManager, plugin: object, name: str) -> Iterator[object]:
    """Register ``plugin`` for the duration of a ``with`` block."""
    from nxrt.host import register_plugin as register

    register(pm, plugin, name)
    try:
        yield plugin
    finally:
        if pm.has_plugin(name):
            pm.unregister(name=name)


@dataclass
class HookCall:
    """One hook call: its arguments, then its result or the exception it raised."""

    hook: str
    kwargs: dict[str, Any]
    result: Any = None
    exception: BaseException | None = None


@dataclass
class HookRecorder:
    """Every hook call made through one plugin manager, in call order, repeats included.

    A hook called once per node or per EP appears once per call, each with its
    own arguments and result, so a test can check the whole sequence.
    """

    calls_made: list[HookCall] = field(default_factory=list)
    _open: list[HookCall] = field(default_factory=list, repr=False)

    def before(self, hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """pluggy's monitoring callback on entry: open a call."""
        call = HookCall(hook_name, dict(kwargs))
        self.calls_made.append(call)
        self._open.append(call)

    def after(
        self, outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        """pluggy's monitoring callback on exit: close the innermost open call."""
        call = self._open.pop()
        call.exception = outcome.exception
        if outcome.exception is None:
            call.result = outcome.get_result()

    def calls(self, hook: str) -> list[HookCall]:
        """Every call of ``hook``, in order."""
        return [c for c in self.calls_made if c.hook == hook]

    def last(self, hook: str) -> HookCall:
        calls = self.calls(hook)
        if not calls:
            raise AssertionError(f"hook {hook} was never called")
        return calls[-1]

    def names(self, *, collapse_repeats: bool = True) -> list[str]:
        """Hook names in call order; by default a run of calls of one hook shows once.

        The collapsed form states the phases (every node's ``nxrt_match_kernel``
        is one step); ``collapse_repeats=False`` lists one name per call.
        """
        names: list[str] = []
        for call in self.calls_made:
            if not collapse_repeats or not names or names[-1] != call.hook:
                names.append(call.hook)
        return names


@pytest.fixture
def nxrt_pm(monkeypatch: pytest.MonkeyPatch) -> Iterator[NxrtPluginManager]:
    """A fresh plugin manager with builtins only, strict about plugin errors."""
    from nxrt.host import BUILTIN_PLUGINS, get_plugin_manager

    monkeypatch.setenv("NXRT_STRICT_PLUGINS", "1")
    pm = get_plugin_manager(autoload=False)
    yield pm
    for name, _ in list(pm.list_name_plugin()):
        if name not in BUILTIN_PLUGINS and pm.has_plugin(name):
            pm.unregister(name=name)


@pytest.fixture
def hook_recorder(nxrt_pm: NxrtPluginManager) -> Iterator[HookRecorder]:
    """Record the hook calls made through ``nxrt_pm``."""
    recorder = HookRecorder()
    undo = nxrt_pm.add_hookcall_monitoring(recorder.before, recorder.after)
    yield recorder
    undo()


def make_node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    *,
    outputs: Sequence[str] = ("y",),
    opset: int = 21,
    domain: str = "",
    initializers: Mapping[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    """A one-node model; ``inputs`` become graph inputs, ``initializers`` weights."""
    import onnx
    from onnx import helper, numpy_helper

    initializers = dict(initializers or {})
    names = [*inputs, *initializers]
    node = helper.make_node(op_type, names, list(outputs), domain=domain, **dict(attrs or {}))
    graph_inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)
        )
        for name, array in inputs.items()
    ]
    graph_outputs = _output_infos(node, graph_inputs, initializers, opset, outputs)
    graph = helper.make_graph(
        [node],
        f"{op_type}_test",
        graph_inputs,
        graph_outputs,
        [numpy_helper.from_array(array, name) for name, array in initializers.items()],
    )
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=onnx.IR_VERSION)


def run_node(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    *,
    ep: str = "cpu",
    plugin_manager: NxrtPluginManager | None = None,
    **model_args: Any,
) -> list[Any]:
    """Run a one-node model through a real session pinned to ``ep`` (no fallback)."""
    import nxrt
    from nxrt.ort.session import DISABLE_CPU_EP_FALLBACK

    model = make_node_model(op_type, inputs, attrs, **model_args)
    options = nxrt.SessionOptions()
    options.add_session_config_entry(DISABLE_CPU_EP_FALLBACK, "1")
    session = nxrt.InferenceSession(
        model.SerializeToString(), options, providers=[ep], plugin_manager=plugin_manager
    )
    return session.run(None, dict(inputs))


def _output_infos(
    node: onnx.NodeProto,
    graph_inputs: list[onnx.ValueInfoProto],
    initializers: Mapping[str, np.ndarray],
    opset: int,
    outputs: Sequence[str],
) -> list[onnx.ValueInfoProto]:
    """Output value infos typed by ONNX's own inference (rank left unknown when it fails)."""
    import onnx
    from onnx import helper

    types = {vi.name: vi.type for vi in graph_inputs}
    for name, array in initializers.items():
        types[name] = helper.make_tensor_type_proto(
            helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)
        )
    inferred: dict[str, onnx.TypeProto] = {}
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        inferred = onnx.shape_inference.infer_node_outputs(schema, node, types)
    except Exception:  # noqa: BLE001 - custom or unknown op: fall back to the first input's type
        pass
    fallback = next(iter(types.values())).tensor_type.elem_type if types else onnx.TensorProto.FLOAT
    infos = []
    for name in outputs:
        if name in inferred and inferred[name].tensor_type.elem_type:
            infos.append(helper.make_value_info(name, inferred[name]))
        else:
            infos.append(helper.make_tensor_value_info(name, fallback, None))
    return infos


__all__ = [
    "LIGHT_MODELS",
    "HookCall",
    "HookRecorder",
    "dummy_feeds",
    "light_model_path",
    "make_node_model",
    "register_plugin",
    "run_node",
]
