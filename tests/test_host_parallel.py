"""HostParallel: ordered parallel map, error propagation and BLAS thread caps."""

from __future__ import annotations

import os
import threading
import time

import numpy  # noqa: F401 - loads numpy's OpenBLAS, whose thread caps these tests check
import pytest
from threadpoolctl import threadpool_info

from nxrt.errors import InvalidArgument
from nxrt.host_parallel import HostParallel, _governor


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


needs_blas = pytest.mark.skipif(not blas_threads(), reason="no BLAS library is loaded")


def test_map_keeps_item_order() -> None:
    with HostParallel(4) as pool:
        assert pool.threads == 4

        def slow_square(x: int) -> int:
            time.sleep(0.001 * (8 - x))
            return x * x

        assert pool.map(slow_square, range(8)) == [x * x for x in range(8)]
        assert pool.map(slow_square, []) == []


def test_map_runs_on_the_calling_thread_and_pool_threads() -> None:
    with HostParallel(3) as pool:
        barrier = threading.Barrier(3, timeout=10)

        def meet(_: int) -> str:
            barrier.wait()
            return threading.current_thread().name

        names = pool.map(meet, range(3))
    assert len(set(names)) == 3
    assert names[0] == threading.current_thread().name  # the caller takes the first item
    assert all(name.startswith("nxrt-host") for name in names[1:])


def test_exceptions_propagate_to_the_caller() -> None:
    def fail_on_three(x: int) -> int:
        if x == 3:
            raise ValueError("item 3 is bad")
        return x

    with HostParallel(2) as pool:
        with pytest.raises(ValueError, match="item 3 is bad"):
            pool.map(fail_on_three, range(10))
        assert pool.map(abs, [-1, -2]) == [1, 2], "the pool stays usable after an error"
    with pytest.raises(ValueError, match="item 3 is bad"):
        HostParallel(1).map(fail_on_three, range(5))


def test_one_thread_runs_inline_and_starts_no_pool() -> None:
    pool = HostParallel(1)
    caller = threading.current_thread()
    assert pool.map(lambda _: threading.current_thread(), range(3)) == [caller] * 3
    assert pool._executor is None
    pool.close()


def test_threads_start_lazily_and_default_to_the_cores() -> None:
    pool = HostParallel()
    assert pool.threads == (os.cpu_count() or 1)
    assert HostParallel(0).threads == pool.threads
    assert pool._executor is None
    with pytest.raises(InvalidArgument):
        HostParallel(-2)


def test_nested_map_runs_inline() -> None:
    with HostParallel(2) as pool:
        result = pool.map(lambda x: sum(pool.map(lambda y: x * y, range(3))), range(4))
    assert result == [3 * x for x in range(4)]


def test_split_gives_contiguous_near_equal_ranges() -> None:
    pool = HostParallel(3)
    assert pool.split(10) == [range(0, 4), range(4, 7), range(7, 10)]
    assert pool.split(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert pool.split(2, 5) == [range(0, 1), range(1, 2)]
    assert pool.split(0, 4) == []
    with pytest.raises(InvalidArgument):
        pool.split(5, 0)


@needs_blas
def test_blas_limits_hold_blas_at_one_thread() -> None:
    """BLAS's own threads split a product by their count, so sessions never use them."""
    before = blas_threads()
    for threads in (1, 2):
        with HostParallel(threads) as pool:
            with pool.blas_limits() as limit:
                assert limit == 1
                assert blas_threads() == [1] * len(before)
    with HostParallel(2) as pool:
        seen = pool.map(lambda _: blas_threads(), range(4))
        assert seen == [[1] * len(before)] * 4, "one BLAS thread in each busy pool thread"
    assert blas_threads() == before


def test_close_stops_the_pool() -> None:
    pool = HostParallel(2)
    assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
    executor = pool._executor
    assert executor is not None
    pool.close()
    assert pool._executor is None
    with pytest.raises(RuntimeError, match="closed"):
        pool.map(abs, [-1, -2])
    pool.close()


def test_run_limits_settle_on_the_faster_blas_thread_count() -> None:
    from nxrt.host_parallel import _CapChooser

    chooser = _CapChooser(2, explore=4)
    seen = []
    for run in range(16):
        count = chooser.choose()
        seen.append(count)
        first = run in (0, 3)  # a count's first run pays one-time costs: not kept
        chooser.record(count, 1.0 if first else 0.010 if count == 1 else 0.030)
    # two threads until one is measured faster: its runs kept (the 8th, 12th) must number two
    assert seen[:12] == [2, 2, 2, 1, 2, 2, 2, 1, 2, 2, 2, 1]
    assert seen[12:] == [1, 1, 1, 2]  # then the faster, retrying the other


@needs_blas
def test_run_limits_hold_blas_and_choose_one_of_the_two_team_sizes() -> None:
    with HostParallel(2) as pool:
        teams = set()
        for _ in range(40):  # every 16th run tries the other count
            with pool.run_limits() as limit:
                assert limit == 1 and max(blas_threads()) == 1
                teams.add(pool.active_threads)
            assert pool.active_threads == 2
        assert teams == {1, 2}


@needs_blas
def test_a_cap_at_the_current_count_calls_no_blas_setter(monkeypatch) -> None:
    from nxrt.host_parallel import _governor

    calls = []
    for library in _governor._blas_libraries():
        current = library.num_threads
        monkeypatch.setattr(library, "set_num_threads", calls.append)
        with _governor.cap(current):
            pass
    assert calls == [], "a cap equal to the current count needs no call into the library"


@needs_blas
def test_a_held_cap_makes_runs_set_nothing(monkeypatch) -> None:
    """A session caps BLAS once (``hold_blas``); its runs then call into no BLAS library."""
    before = blas_threads()
    with HostParallel(2) as pool:
        pool.hold_blas()
        assert blas_threads() == [1] * len(before)
        calls: list[int] = []
        monkeypatch.setattr(_governor, "acquire", calls.append)
        for _ in range(10):
            with pool.run_limits() as limit:
                assert limit == 1
        assert calls == []
        monkeypatch.undo()
    assert blas_threads() == before, "closing the pool ends its cap"


@needs_blas
def test_a_session_holds_its_cap_until_it_is_collected() -> None:
    import gc

    import numpy as np
    from onnx import TensorProto, helper

    import nxrt

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = 1
    session = nxrt.InferenceSession(model.SerializeToString(), options, providers=["cpu"])
    assert _governor._caps[1] >= 1 and max(blas_threads()) == 1
    session.run(None, {"x": np.eye(4, dtype=np.float32)})
    del session
    gc.collect()
    assert not _governor._caps
