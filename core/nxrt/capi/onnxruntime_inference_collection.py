"""``onnxruntime.capi.onnxruntime_inference_collection``: where onnxruntime defines its Python
classes, and where some code imports them from (``OrtValue``, ``IOBinding``,
``check_and_normalize_provider_args``...)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from nxrt.ort.devices import OrtDevice, OrtDeviceVendorId
from nxrt.ort.iobinding import IOBinding
from nxrt.ort.lora import AdapterFormat
from nxrt.ort.ortvalue import OrtValue, copy_tensors
from nxrt.ort.session import InferenceSession
from nxrt.ort.sparse import SparseTensor

#: onnxruntime's base class of ``InferenceSession``; nxrt has the one class.
Session = InferenceSession

ProviderArg = str | tuple[str, dict[Any, Any]]


def check_and_normalize_provider_args(
    providers: Sequence[ProviderArg] | None,
    provider_options: Sequence[dict[Any, Any]] | None,
    available_provider_names: Sequence[str],
) -> tuple[list[str], list[dict[str, str]]]:
    """``providers`` and ``provider_options`` as two parallel lists, names and options
    dicts of strings, the way onnxruntime's wrappers normalize them.

    ``providers`` holds names or ``(name, options)`` pairs; ``provider_options``,
    when given, one dict per name (and then the names must be plain strings). A
    name not in ``available_provider_names`` is kept with a warning; a repeated
    name is dropped with a warning. Anything else malformed is a ``ValueError``.
    """
    if providers is None:
        return [], []
    if not isinstance(providers, Sequence) or isinstance(providers, str):
        raise ValueError("'providers' should be a sequence.")
    pairs: list[tuple[str, dict[Any, Any]]] = []
    if provider_options is not None:
        if not isinstance(provider_options, Sequence) or isinstance(provider_options, str):
            raise ValueError("'provider_options' should be a sequence.")
        if len(providers) != len(provider_options):
            raise ValueError(
                "'providers' and 'provider_options' should be the same length if both are given."
            )
        if not all(isinstance(p, str) for p in providers):
            raise ValueError(
                "Only string values for 'providers' are supported if 'provider_options' is given."
            )
        if not all(isinstance(o, dict) for o in provider_options):
            raise ValueError("'provider_options' values must be dicts.")
        pairs = [(str(p), o) for p, o in zip(providers, provider_options)]
    else:
        for provider in providers:
            if isinstance(provider, str):
                pairs.append((provider, {}))
            elif (
                isinstance(provider, tuple)
                and len(provider) == 2
                and isinstance(provider[0], str)
                and isinstance(provider[1], dict)
            ):
                pairs.append(provider)
            else:
                raise ValueError(
                    "'providers' values must be either strings or (string, dict) tuples."
                )
    normalized: dict[str, dict[str, str]] = {}
    for name, options in pairs:
        if name not in available_provider_names:
            warnings.warn(
                f"Specified provider '{name}' is not in available provider names. Available "
                f"providers: '{', '.join(available_provider_names)}'",
                stacklevel=2,
            )
        if name in normalized:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=2)
            continue
        normalized[name] = {str(k): str(v) for k, v in options.items()}
    return list(normalized), list(normalized.values())


__all__ = [
    "AdapterFormat",
    "IOBinding",
    "InferenceSession",
    "OrtDevice",
    "OrtDeviceVendorId",
    "OrtValue",
    "Session",
    "SparseTensor",
    "check_and_normalize_provider_args",
    "copy_tensors",
]
