"""Old module paths of nxrt 0.1's flat layout, kept working until nxrt 0.2.

Plugins written against the flat layout import, for example, ``nxrt.optimizer``
or ``nxrt.residency``. Importing an old path gives the module at its new path
(the same module object, so ``isinstance`` and monkeypatching agree) and a
``DeprecationWarning`` that names the new path. Nothing here imports a moved
module before it is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: Names that moved from one module of the EP-author API to another: (old module, name)
#: -> new module. The old module's ``__getattr__`` answers them through ``moved_attribute``.
MOVED_NAMES = {
    ("nxrt.kernel", "KernelMatch"): "nxrt.registry",
    **{
        ("nxrt.registry", name): "nxrt.ep_registry"
        for name in ("EpDescriptor", "EpRegistry", "Registrar", "KernelTable")
    },
}


def moved_attribute(module: str, name: str) -> object:
    """``module.name`` from where it lives now, with a warning naming the new path."""
    new = MOVED_NAMES.get((module, name))
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is now {new}.{name}; the old path is removed in nxrt 0.2",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(new), name)


#: Old path -> new path.
MOVED = {
    "nxrt.builtin_hooks": "nxrt._builtin_hooks",
    "nxrt.files": "nxrt._files",
    "nxrt.capi.status": "nxrt._status",
    **{
        f"nxrt.{name}": f"nxrt.pipeline.{name}"
        for name in (
            "model values optimizer overrides selection partition executor "
            "weight_binding external_data contained"
        ).split()
    },
    **{
        f"nxrt.{name}": f"nxrt.ort.{name}"
        for name in "session ortvalue iobinding runtime devices backend lora sparse".split()
    },
    "nxrt.residency": "nxrt.moe.residency",
    "nxrt.reference": "nxrt.moe",
    "nxrt.reference.moe": "nxrt.moe.reference",
    **{
        f"nxrt.{name}": f"nxrt.tools.{name}"
        for name in "cli compile conformance ep_suite light_models testing batch".split()
    },
}
#: The version that drops the old paths.
REMOVED_IN = "0.2"


def warn(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path goes in nxrt {REMOVED_IN}: import {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warn(spec.name, self.new, stacklevel=8)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at its new path is already executed."""


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` (the new paths are ordinary modules)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import nxrt`` does)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
