"""The plugin host: builds plugin managers and is the only code that calls hooks.

``get_plugin_manager`` is a factory (no import-time global): it adds the
hookspecs, registers the builtin plugins, then loads each entry point of group
``nxrt`` on its own, turning any failure into an :class:`EpLoadFailed` record.
:class:`Host` is the typed facade over ``pm.hook``; it calls one plugin at a
time so one plugin's exception never stops the others.

Switches (named after pytest's):

- ``NXRT_DISABLE_PLUGIN_AUTOLOAD=1`` — load no entry points;
- ``NXRT_PLUGINS=cpu,mlx`` — load only these entry points (empty: none);
- ``NXRT_DISABLED_PLUGINS=name,...`` — block these plugins;
- ``NXRT_STRICT_PLUGINS=1`` — raise a plugin's load error instead of recording it;
- ``NXRT_TRACE_HOOKS=1`` — print every hook call, its arguments and result.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy

from nxrt import hookspecs
from nxrt.ep_registry import EpRegistry, Registrar
from nxrt.errors import EpLoadFailed, EpPanicked, NxrtError
from nxrt.kernel import Kernel, SubgraphClaim
from nxrt.registry import KernelMatch
from nxrt.weight import ExecutionProviderCapabilities

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.epcontext import EpContext
    from nxrt.provider import ExecutionProvider

logger = logging.getLogger("nxrt")

ENTRY_POINT_GROUP = "nxrt"

#: Core's own hookimpl modules, registered before any entry point.
BUILTIN_PLUGINS: tuple[str, ...] = ("nxrt._builtin_hooks",)


@dataclass(frozen=True)
class PluginInfo:
    """Where a loaded plugin came from (shown by ``nxrt providers -v``)."""

    name: str
    value: str
    distribution: str = ""
    version: str = ""


class NxrtPluginManager(pluggy.PluginManager):
    """A plugin manager that also keeps load failures and plugin origins."""

    def __init__(self) -> None:
        super().__init__(ENTRY_POINT_GROUP)
        self.load_failures: list[EpLoadFailed] = []
        self.plugin_info: dict[str, PluginInfo] = {}
        #: ONNX Runtime plugin-EP libraries registered by path, ``{name: path}``; every
        #: plugin sees them when it registers its EPs (``Registrar.ep_libraries``).
        self.ep_libraries: dict[str, str] = {}

    def record_failure(self, failure: EpLoadFailed) -> None:
        if str(failure) not in {str(f) for f in self.load_failures}:
            logger.warning("%s", failure)
            self.load_failures.append(failure)


def _env_list(name: str) -> list[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def _strict() -> bool:
    return os.environ.get("NXRT_STRICT_PLUGINS", "") not in ("", "0")


def get_plugin_manager(
    *,
    autoload: bool = True,
    plugins: Sequence[str] | None = None,
    blocked: Sequence[str] = (),
) -> NxrtPluginManager:
    """Build a fresh plugin manager: hookspecs, builtins, then entry points.

    :param autoload: Load entry points of group ``nxrt`` (also turned off by
        ``NXRT_DISABLE_PLUGIN_AUTOLOAD=1``).
    :param plugins: Entry-point names to load; ``None`` means all, or the
        ``NXRT_PLUGINS`` list when that is set.
    :param blocked: Plugin names never to register.
    """
    pm = NxrtPluginManager()
    pm.add_hookspecs(hookspecs)
    for name in (*blocked, *(_env_list("NXRT_DISABLED_PLUGINS") or [])):
        pm.set_blocked(name)
    for module_name in BUILTIN_PLUGINS:
        pm.register(importlib.import_module(module_name), name=module_name)
    if autoload and os.environ.get("NXRT_DISABLE_PLUGIN_AUTOLOAD", "") in ("", "0"):
        allowed = list(plugins) if plugins is not None else _env_list("NXRT_PLUGINS")
        load_entry_points(pm, allowed)
    pm.check_pending()
    if os.environ.get("NXRT_TRACE_HOOKS", "") not in ("", "0"):
        trace_hooks(pm)
    return pm


def load_entry_points(pm: NxrtPluginManager, allowed: Sequence[str] | None = None) -> None:
    """Load each ``nxrt`` entry point on its own; a failure becomes a record."""
    from importlib_metadata import entry_points

    seen: set[str] = set()
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in seen or (allowed is not None and entry.name not in allowed):
            continue
        seen.add(entry.name)
        if pm.is_blocked(entry.name) or pm.has_plugin(entry.name):
            continue
        try:
            register_plugin(pm, entry.load(), entry.name)
        except Exception as exc:  # noqa: BLE001 - any plugin error is isolated
            failure = EpLoadFailed(entry.value, _describe(exc))
            if _strict():
                raise failure from exc
            pm.record_failure(failure)
            continue
        dist = getattr(entry, "dist", None)
        pm.plugin_info[entry.name] = PluginInfo(
            entry.name,
            entry.value,
            getattr(dist, "name", "") or "",
            getattr(dist, "version", "") or "",
        )


def register_plugin(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    """Register ``plugin`` and check its hooks at once (unknown hooks are refused)."""
    pm.register(plugin, name=name)
    unknown = [caller.name for caller in pm.get_hookcallers(plugin) or [] if caller.spec is None]
    if unknown:
        pm.unregister(plugin)
        raise pluggy.PluginValidationError(
            plugin, f"plugin {name!r} implements unknown hooks: {', '.join(unknown)}"
        )


def trace_hooks(pm: pluggy.PluginManager) -> None:
    """Print every hook call to stderr (``NXRT_TRACE_HOOKS=1``)."""

    def before(hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        names = [impl.plugin_name for impl in impls]
        print(f"nxrt hook {hook_name}({kwargs}) -> {names}", file=sys.stderr)

    def after(
        outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        print(f"nxrt hook {hook_name} returned {outcome.get_result()!r}", file=sys.stderr)

    pm.add_hookcall_monitoring(before, after)


def _describe(exc: BaseException) -> str:
    """One line with the exception and where it was raised: the full cause, not a wrapper."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


class Host:
    """The typed facade over the plugin manager; the only caller of ``pm.hook``."""

    def __init__(self, pm: NxrtPluginManager) -> None:
        self.pm = pm
        self.failures: list[NxrtError] = list(pm.load_failures)
        self._callers: dict[tuple[str, str], Any] = {}

    def _caller(self, hook_name: str, plugin_name: str) -> Any:
        """A hook caller limited to one plugin (plus the builtins for defaults)."""
        key = (hook_name, plugin_name)
        if key not in self._callers:
            keep = {plugin_name, *BUILTIN_PLUGINS}
            others = [p for name, p in self.pm.list_name_plugin() if name not in keep]
            self._callers[key] = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
        return self._callers[key]

    def _implementers(self, hook_name: str) -> list[str]:
        """Plugins implementing a hook, in registration order."""
        impls = getattr(self.pm.hook, hook_name).get_hookimpls()
        return list(dict.fromkeys(impl.plugin_name for impl in impls))

    def _fail(self, plugin_name: str, exc: BaseException) -> None:
        info = self.pm.plugin_info.get(plugin_name)
        failure = EpLoadFailed(info.value if info else plugin_name, _describe(exc))
        if _strict():
            raise failure from exc
        self.failures.append(failure)
        self.pm.record_failure(failure)

    # -- registration ------------------------------------------------------------------------
    def build_registry(self) -> EpRegistry:
        """Ask every plugin to register its EPs; a failing plugin is dropped whole."""
        registry = EpRegistry()
        for name in self._implementers("nxrt_register"):
            registrar = Registrar(name, getattr(self.pm, "ep_libraries", None))
            try:
                self._caller("nxrt_register", name)(registry=registrar)
                for descriptor in registrar.staged:
                    existing = registry.resolve(descriptor.id)
                    if existing is not None:
                        raise ValueError(
                            f"EP id {descriptor.id!r} is already provided by plugin "
                            f"{existing.plugin!r}"
                        )
            except Exception as exc:  # noqa: BLE001
                self._fail(name, exc)
                continue
            for descriptor in registrar.staged:
                registry.add(descriptor)
        return registry

    # -- capability advertisement ------------------------------------------------------------
    def capabilities(self, ep: ExecutionProvider, owner: str) -> ExecutionProviderCapabilities:
        """The EP's capabilities; answers from plugins that do not own it are refused."""
        answer = ExecutionProviderCapabilities.stock()
        for name in self._implementers("nxrt_ep_capabilities"):
            try:
                results = self._caller("nxrt_ep_capabilities", name)(ep=ep)
                for result in results:
                    if not isinstance(result, ExecutionProviderCapabilities):
                        raise TypeError(
                            "nxrt_ep_capabilities must return ExecutionProviderCapabilities, "
                            f"got {type(result).__name__}"
                        )
                    if name != owner:
                        raise ValueError(f"answered capabilities for EP {ep.id!r} it does not own")
                    answer = result
            except Exception as exc:  # noqa: BLE001
                self._fail(name, exc)
        return answer

    # -- kernel matching and claims ----------------------------------------------------------
    def claim_subgraphs(
        self,
        ep: ExecutionProvider,
        owner: str,
        graph: ir.Graph,
        nodes: list[ir.Node],
        opsets: dict[str, int] | None = None,
    ) -> list[SubgraphClaim]:
        """The EP's claims; a raising or malformed answer is no claim, and a recorded failure."""
        try:
            caller = self._caller("nxrt_claim_subgraphs", owner)
            claims = caller(ep=ep, graph=graph, nodes=nodes, opsets=dict(opsets or {}))
            if claims is None:
                return []
            claims = list(claims)
            if not all(isinstance(c, SubgraphClaim) for c in claims):
                raise TypeError("nxrt_claim_subgraphs must return a list of SubgraphClaim")
            return claims
        except Exception as exc:  # noqa: BLE001
            self.hook_failed(exc, ep=ep.id, cause=f"claiming subgraphs: {exc!r}")
            return []

    def match_kernel(
        self, ep: ExecutionProvider, owner: str, node: ir.Node, opset: int
    ) -> KernelMatch:
        """The EP's answer for one node, with the kernel entry the planner will build from.

        A supported answer without an entry gets the EP's registered kernel for
        the op; an EP that says yes but has no such kernel is refused (and its
        plugin's failure recorded), so the node goes to the next EP.
        """
        try:
            match = self._caller("nxrt_match_kernel", owner)(ep=ep, node=node, opset=opset)
            if match is None:
                return KernelMatch.no(f"EP {ep.id!r} has no kernel table")
            if not isinstance(match, KernelMatch):
                raise TypeError(
                    f"nxrt_match_kernel must return a KernelMatch, got {type(match).__name__}"
                )
            if match.supported and match.entry is None:
                entry = ep.ops.lookup(node.domain, node.op_type, opset) if ep.ops else None
                if entry is None:
                    raise LookupError(
                        f"nxrt_match_kernel said EP {ep.id!r} runs {node.op_type} at opset "
                        f"{opset}, but the EP registered no kernel for it (add_kernels)"
                    )
                match = dataclasses.replace(match, entry=entry, key=match.key or entry.key)
            return match
        except Exception as exc:  # noqa: BLE001
            self.hook_failed(exc, ep=ep.id, op_type=node.op_type, cause=repr(exc))
            return KernelMatch.no(f"nxrt_match_kernel failed: {exc}")

    def hook_failed(self, exc: BaseException, **where: str) -> None:
        """Record a hook's failure during session creation; raise it in strict mode."""
        failure = EpPanicked(**where)
        if _strict():
            raise failure from exc
        self.failures.append(failure)

    # -- optimizer passes --------------------------------------------------------------------
    def optimizer_passes(self, ep: ExecutionProvider, owner: str) -> list[Any]:
        """The graph passes the EP contributes (empty when its plugin has none)."""
        import onnx_ir as ir

        try:
            passes = self._caller("nxrt_optimizer_passes", owner)(ep=ep)
            if passes is None:
                return []
            passes = list(passes)
            for item in passes:
                if not isinstance(item, ir.passes.PassBase):
                    raise TypeError(
                        "nxrt_optimizer_passes must return onnx_ir passes, got "
                        f"{type(item).__name__}"
                    )
            return passes
        except Exception as exc:  # noqa: BLE001
            self.hook_failed(exc, ep=ep.id, cause=f"contributing optimizer passes: {exc!r}")
            return []

    # -- EPContext ---------------------------------------------------------------------------
    def save_context(
        self, ep: ExecutionProvider, owner: str, claim: SubgraphClaim, kernel: Kernel
    ) -> EpContext | None:
        return self._caller("nxrt_save_context", owner)(ep=ep, claim=claim, kernel=kernel)

    def load_context(self, ep: ExecutionProvider, owner: str, context: EpContext) -> Kernel:
        kernel = self._caller("nxrt_load_context", owner)(ep=ep, context=context)
        return kernel if kernel is not None else ep.load_context(context)

    # -- ahead-of-time compiling -------------------------------------------------------------
    def warmup(self, ep: ExecutionProvider, owner: str, model: str | None) -> list[str] | None:
        """What the EP's plugin compiled into its caches (``None``: nothing to warm); its
        exception propagates (``nxrt warmup`` reports it per EP)."""
        lines = self._caller("nxrt_warmup", owner)(ep=ep, model=model)
        return None if lines is None else [str(line) for line in lines]
