"""Sequence and optional kernels.

A sequence is a Python list of arrays and an empty optional is ``None``.
Kernels build new lists and never change the ones they receive; elements are
shared between lists, as Identity shares arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op


def _position(position: np.ndarray, length: int, op_name: str, *, insert: bool = False) -> int:
    """A position in ``[-length, length - 1]`` (``length`` too when inserting), made >= 0."""
    index = int(np.asarray(position).reshape(-1)[0])
    upper = length if insert else length - 1
    if not -length <= index <= upper:
        raise KernelFailed(
            f"{op_name}: position {index} is out of range for a sequence of length {length}"
        )
    return index + length if index < 0 else index


def _sequence(value: Any, op_name: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise KernelFailed(f"{op_name}: expected a sequence, got {type(value).__name__}")
    return list(value)


@op("SequenceConstruct", since=11)
def sequence_construct(*inputs: np.ndarray) -> list[np.ndarray]:
    """A sequence holding the inputs, in order."""
    return list(inputs)


@op("SequenceEmpty", since=11)
def sequence_empty(*, dtype: int | None = None) -> list[np.ndarray]:
    """An empty sequence (its element type only matters to type inference)."""
    return []


@op("SequenceAt", since=11, view_output=0)
def sequence_at(input_sequence: list[np.ndarray], position: np.ndarray, /) -> np.ndarray:
    """The element at ``position`` (negative counts from the end)."""
    items = _sequence(input_sequence, "SequenceAt")
    return items[_position(position, len(items), "SequenceAt")].view()


@op("SequenceInsert", since=11)
def sequence_insert(
    input_sequence: list[np.ndarray],
    tensor: np.ndarray,
    position: np.ndarray | None = None,
    /,
) -> list[np.ndarray]:
    """A new sequence with ``tensor`` inserted at ``position`` (appended by default)."""
    items = _sequence(input_sequence, "SequenceInsert")
    if position is None:
        items.append(tensor)
    else:
        items.insert(_position(position, len(items), "SequenceInsert", insert=True), tensor)
    return items


@op("SequenceErase", since=11)
def sequence_erase(
    input_sequence: list[np.ndarray], position: np.ndarray | None = None, /
) -> list[np.ndarray]:
    """A new sequence without the element at ``position`` (the last one by default)."""
    items = _sequence(input_sequence, "SequenceErase")
    if not items:
        raise KernelFailed("SequenceErase: the sequence is empty")
    index = len(items) - 1 if position is None else _position(position, len(items), "SequenceErase")
    del items[index]
    return items


@op("SequenceLength", since=11)
def sequence_length(input_sequence: list[np.ndarray], /) -> np.ndarray:
    """The number of elements, as an int64 scalar."""
    return np.array(len(_sequence(input_sequence, "SequenceLength")), dtype=np.int64)


@op("ConcatFromSequence", since=11)
def concat_from_sequence(
    input_sequence: list[np.ndarray], /, *, axis: int, new_axis: int = 0
) -> np.ndarray:
    """Concatenate the elements along ``axis``, or stack them on a new axis."""
    items = _sequence(input_sequence, "ConcatFromSequence")
    if not items:
        raise KernelFailed("ConcatFromSequence: the sequence is empty")
    if new_axis:
        return np.stack(items, axis=axis)
    return np.concatenate(items, axis=axis)


@op("SplitToSequence", since=(11, 24))
def split_to_sequence(
    data: np.ndarray,
    split: np.ndarray | None = None,
    /,
    *,
    axis: int = 0,
    keepdims: int = 1,
) -> list[np.ndarray]:
    """Split along ``axis`` into a sequence.

    ``split`` is a chunk length (a scalar; the last chunk may be shorter) or
    the list of lengths; without it every element is one slice, whose axis is
    dropped when ``keepdims=0``.
    """
    if not -data.ndim <= axis < data.ndim:
        raise KernelFailed(f"SplitToSequence: axis {axis} is out of range for rank {data.ndim}")
    axis %= data.ndim
    dim = data.shape[axis]
    if split is None:
        parts = np.split(data, dim, axis=axis) if dim else []
        if not keepdims:
            return [np.squeeze(p, axis=axis).copy() for p in parts]
        return [p.copy() for p in parts]
    split = np.asarray(split)
    if split.ndim == 0:
        length = int(split)
        if length <= 0:
            raise KernelFailed(f"SplitToSequence: split {length} must be positive")
        sizes = [length] * (dim // length) + ([dim % length] if dim % length else [])
    else:
        sizes = [int(s) for s in split.reshape(-1)]
    if sum(sizes) != dim or min(sizes, default=0) < 0:
        raise KernelFailed(f"SplitToSequence: sizes {sizes} must be non-negative and sum to {dim}")
    return [p.copy() for p in np.split(data, np.cumsum(sizes)[:-1], axis=axis)]


@op("Optional", since=(15, 28))
def optional(value: Any = None, /, *, type: Any = None) -> Any:
    """An optional holding the input, or an empty one (None) when there is no input."""
    return value


@op("OptionalHasElement", since=(15, 18, 28))
def optional_has_element(value: Any = None, /) -> np.ndarray:
    """Whether the optional holds a value (an absent input counts as empty)."""
    return np.array(value is not None)


@op("OptionalGetElement", since=(15, 18, 28), view_output=0)
def optional_get_element(value: Any, /) -> Any:
    """The value inside the optional (a plain tensor or sequence passes through)."""
    if value is None:
        raise KernelFailed("OptionalGetElement: the optional is empty")
    return value.view() if isinstance(value, np.ndarray) else value
