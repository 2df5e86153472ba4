"""ONNX Runtime's TopK selection, step by step, for the results no rule pins down.

TopK's spec orders equal values by index, which makes a sorted result unique;
nxrt computes that with numpy (ONNX Runtime, as numpy, counts NaN as larger
than every number, and NaNs as equal). With ``sorted=0`` the spec leaves the
order open, and the order is the algorithm's: there nxrt replays what ONNX
Runtime's CPU kernel does, so both give the same answer: for ``k == 1`` a scan
that keeps the first best value; for small ``k`` a binary heap of its own;
otherwise libstdc++'s ``nth_element`` (introselect, as GCC implements it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Less = Callable[[int, int], bool]


def ort_top_k(values: Sequence[float], k: int, largest: bool, sort: bool) -> list[int]:
    # values become (is NaN, value) pairs: the tuples compare as ONNX Runtime's values do
    """The positions ONNX Runtime's TopK returns for one row, in its output order."""
    n = len(values)
    if k == 0:
        return []
    values = [(1, 0.0) if v != v else (0, v) for v in values]  # NaN above every number

    def better(a: int, b: int) -> bool:  # GreaterValueCmp / LesserValueCmp on positions
        va, vb = values[a], values[b]
        if largest:
            return va > vb or (va == vb and a < b)
        return va < vb or (va == vb and a < b)

    def beats(va, vb) -> bool:  # CompareValueOnly
        return va > vb if largest else va < vb

    if k == 1:
        best = 0
        for i in range(1, n):
            if beats(values[i], values[best]):
                best = i
        return [best]
    if k < 4 or math.log2(k) / math.log2(n) < 0.725:
        return _heap_top_k(values, k, sort, better, beats)
    holder = list(range(n))
    _nth_element(holder, k - 1, better)
    if sort:
        _sort(holder, 0, k, better)
    return holder[:k]


def _heapify(heap: list[int], i: int, k: int, cmp: Less) -> None:
    """ONNX Runtime's HeapifyIthPosition: the parent loses to neither child."""
    while True:
        left = 2 * i + 1
        right = left + 1
        if right < k:
            i_replaces_left = cmp(heap[i], heap[left])
            if i_replaces_left and cmp(heap[right], heap[left]):
                heap[i], heap[left] = heap[left], heap[i]
                i = left
            elif i_replaces_left or cmp(heap[i], heap[right]):
                heap[i], heap[right] = heap[right], heap[i]
                i = right
            else:
                break
        elif left < k and cmp(heap[i], heap[left]):
            heap[i], heap[left] = heap[left], heap[i]
            i = left
        else:
            break


def _heap_top_k(values: Sequence, k: int, sort: bool, cmp: Less, beats: Callable) -> list[int]:
    heap = [0] * k
    for item in range(k):
        heap[k - item - 1] = item
        _heapify(heap, k - item - 1, k, cmp)
    top = values[heap[0]]
    for item in range(k, len(values)):
        if beats(values[item], top):
            heap[0] = item
            _heapify(heap, 0, k, cmp)
            top = values[heap[0]]
    if not sort:
        return heap
    out = [0] * k
    for step in range(k):
        out[k - step - 1] = heap[0]
        heap[0] = heap[k - step - 1]
        _heapify(heap, 0, k - step - 1, cmp)
    return out


# -- libstdc++ (GCC) -------------------------------------------------------------------------------


def _lg(n: int) -> int:
    return n.bit_length() - 1


def _nth_element(a: list[int], nth: int, less: Less) -> None:
    first, last = 0, len(a)
    if first == last or nth == last:
        return
    depth = 2 * _lg(last - first)
    while last - first > 3:
        if depth == 0:
            _heap_select(a, first, nth + 1, last, less)
            a[first], a[nth] = a[nth], a[first]
            return
        depth -= 1
        cut = _partition_pivot(a, first, last, less)
        if cut <= nth:
            first = cut
        else:
            last = cut
    _insertion_sort(a, first, last, less)


def _sort(a: list[int], first: int, last: int, less: Less) -> None:
    if first == last:
        return
    _introsort_loop(a, first, last, 2 * _lg(last - first), less)
    if last - first > 16:
        _insertion_sort(a, first, first + 16, less)
        for i in range(first + 16, last):
            _linear_insert(a, i, less)
    else:
        _insertion_sort(a, first, last, less)


def _introsort_loop(a: list[int], first: int, last: int, depth: int, less: Less) -> None:
    while last - first > 16:
        if depth == 0:
            _heap_select(a, first, last, last, less)
            _sort_heap(a, first, last, less)
            return
        depth -= 1
        cut = _partition_pivot(a, first, last, less)
        _introsort_loop(a, cut, last, depth, less)
        last = cut


def _partition_pivot(a: list[int], first: int, last: int, less: Less) -> int:
    mid = first + (last - first) // 2
    _median_to_first(a, first, first + 1, mid, last - 1, less)
    lo, hi, pivot = first + 1, last, a[first]
    while True:
        while less(a[lo], pivot):
            lo += 1
        hi -= 1
        while less(pivot, a[hi]):
            hi -= 1
        if not lo < hi:
            return lo
        a[lo], a[hi] = a[hi], a[lo]
        lo += 1


def _median_to_first(a: list[int], result: int, x: int, y: int, z: int, less: Less) -> None:
    if less(a[x], a[y]):
        if less(a[y], a[z]):
            pick = y
        elif less(a[x], a[z]):
            pick = z
        else:
            pick = x
    elif less(a[x], a[z]):
        pick = x
    elif less(a[y], a[z]):
        pick = z
    else:
        pick = y
    a[result], a[pick] = a[pick], a[result]


def _insertion_sort(a: list[int], first: int, last: int, less: Less) -> None:
    if first == last:
        return
    for i in range(first + 1, last):
        if less(a[i], a[first]):
            value = a[i]
            a[first + 1 : i + 1] = a[first:i]
            a[first] = value
        else:
            _linear_insert(a, i, less)


def _linear_insert(a: list[int], last: int, less: Less) -> None:
    value = a[last]
    prev = last - 1
    while less(value, a[prev]):
        a[last] = a[prev]
        last = prev
        prev -= 1
    a[last] = value


def _adjust_heap(a: list[int], first: int, hole: int, length: int, value: int, less: Less) -> None:
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if less(a[first + child], a[first + child - 1]):
            child -= 1
        a[first + hole] = a[first + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        a[first + hole] = a[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and less(a[first + parent], value):
        a[first + hole] = a[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    a[first + hole] = value


def _make_heap(a: list[int], first: int, last: int, less: Less) -> None:
    length = last - first
    if length < 2:
        return
    parent = (length - 2) // 2
    while True:
        _adjust_heap(a, first, parent, length, a[first + parent], less)
        if parent == 0:
            return
        parent -= 1


def _pop_heap(a: list[int], first: int, last: int, result: int, less: Less) -> None:
    value = a[result]
    a[result] = a[first]
    _adjust_heap(a, first, 0, last - first, value, less)


def _heap_select(a: list[int], first: int, middle: int, last: int, less: Less) -> None:
    _make_heap(a, first, middle, less)
    for i in range(middle, last):
        if less(a[i], a[first]):
            _pop_heap(a, first, middle, i, less)


def _sort_heap(a: list[int], first: int, last: int, less: Less) -> None:
    while last - first > 1:
        last -= 1
        _pop_heap(a, first, last, last, less)
