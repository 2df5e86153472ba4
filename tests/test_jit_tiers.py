"""The cpu EP's compile tiers and its compile cache (``nxrt_ep_cpu.compiling``, ``jit/cache.py``).

Tier 0 (numpy) runs while tier 1 (compiled) is built in the background; the
tests hold the background thread to look at tier 0, then let it go. The cache
is shared by every checkout (keyed by version, source and CPU, not path) and
safe for processes compiling into it at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

import nxrt
from logits import assert_close_with_logits, with_logits
from nxrt.errors import InvalidArgument
from nxrt.kernel import Kernel
from nxrt.tools.light_models import dummy_feeds, light_model_path
from nxrt_ep_cpu import compiling, warmup

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "plugins" / "cpu" / "nxrt_ep_cpu"
DIGITS = (resources.files("nxrt") / "data" / "digits_cnn.onnx").read_bytes()


@pytest.fixture
def cold(monkeypatch, tmp_path):
    """An empty compile cache, and a process that remembers building nothing."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    monkeypatch.setattr(compiling, "_built", set())
    yield tmp_path / "numba"
    assert compiling.wait_for_compiled()


@pytest.fixture
def held(cold):
    """The background compiler busy until the test lets it go: kernels stay on tier 0."""
    gate = threading.Event()
    compiling._worker.submit(gate.wait, compiling.TieredKernel(Kernel()))
    yield gate
    gate.set()


def _session(model, mode: str, threads: int = 2) -> nxrt.InferenceSession:
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry(compiling.MODE_OPTION, mode)
    source = model.SerializeToString() if hasattr(model, "SerializeToString") else model
    return nxrt.InferenceSession(source, options, providers=["cpu"])


def _tiers(session) -> list[int]:
    return [
        s.kernel.tier for s in session._plan.steps if isinstance(s.kernel, compiling.TieredKernel)
    ]


def _feeds(session) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


MODELS = {
    "digits": lambda: DIGITS,
    # with their softmax's logits as outputs: the probabilities of equal huge logits are
    # ill-conditioned (tests/logits.py)
    "squeezenet": lambda: with_logits(light_model_path("squeezenet")),
    "shufflenet": lambda: with_logits(light_model_path("shufflenet")),
    **dict(warmup.small_models()),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_node_gives_the_same_outputs_before_and_after_its_compiled_kernel_takes_over(name, held):
    model = MODELS[name]()
    session = _session(model, compiling.BACKGROUND)
    tiers = _tiers(session)
    assert tiers and set(tiers) == {0}, "every compiled kernel starts on its numpy tier"
    feeds = dummy_feeds(session) if name in ("squeezenet", "shufflenet") else _feeds(session)
    if name == "non-max suppression":
        feeds["boxes"] = np.sort(feeds["boxes"] * 10, axis=-1)
    before = [session.run(None, feeds) for _ in range(3)]
    for run in before[1:]:  # the numpy tier is deterministic too, on two threads
        for got, want in zip(run, before[0], strict=True):
            np.testing.assert_array_equal(got, want)
    held.set()
    assert session.wait_for_compiled()
    tiered = [s.kernel for s in session._plan.steps]
    errors = [k.error for k in tiered if isinstance(k, compiling.TieredKernel)]
    assert set(_tiers(session)) == {1}, [e for e in errors if e is not None]
    after = session.run(None, feeds)
    for got, want in zip(after, before[0], strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
    if name in ("squeezenet", "shufflenet"):
        assert_close_with_logits(model, after, before[0])
        return
    for got, want in zip(after, before[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_wait_mode_returns_compiled_kernels_and_marks_them_in_the_cache(cold):
    session = _session(DIGITS, compiling.WAIT)
    assert _tiers(session) == []
    assert session.wait_for_compiled(timeout=0)
    marks = list(Path(compiling.cache_folder(), "kernels").rglob("*"))
    assert [m for m in marks if m.is_file()], "each compiled kernel leaves a marker"


def test_the_mode_is_a_provider_option_too_and_is_checked(cold):
    session = nxrt.InferenceSession(
        DIGITS, providers=[("cpu", {compiling.MODE_OPTION: compiling.WAIT})]
    )
    assert _tiers(session) == []
    with pytest.raises(InvalidArgument, match="nxrt.cpu.compile"):
        nxrt.InferenceSession(DIGITS, providers=[("cpu", {compiling.MODE_OPTION: "later"})])


def test_kernels_found_in_the_cache_are_used_from_the_first_run(cold):
    want = _session(DIGITS, compiling.WAIT)  # compiles into the cache, markers included
    feeds = _feeds(want)
    expected = want.run(None, feeds)[0]
    compiling._built.clear()  # as a new process on the same cache
    before = dict(compiling.counts)
    session = _session(DIGITS, compiling.BACKGROUND)
    assert compiling.counts["cached"] > before.get("cached", 0)
    assert compiling.counts["background"] == before.get("background", 0), "nothing compiles"
    steps = session._plan.steps
    loading = [s.kernel for s in steps if isinstance(s.kernel, compiling.TieredKernel)]
    assert loading and all(k.loading for k in loading), "loaded on the background thread"
    first = session.run(None, feeds)[0]  # waits for the loads, never runs the numpy tier
    assert set(_tiers(session)) == {1}
    assert first.tobytes() == expected.tobytes()


def test_loads_from_the_cache_go_before_compiles(cold):
    _session(DIGITS, compiling.WAIT)
    compiling._built.clear()
    gate, order = threading.Event(), []
    compiling._worker.submit(gate.wait, compiling.TieredKernel(Kernel()))  # the thread is busy
    compiling._worker.submit(lambda: order.append("compile"), compiling.TieredKernel(Kernel()))
    session = _session(DIGITS, compiling.BACKGROUND)  # its kernels' loads queue behind a compile
    compiling._worker.submit(lambda: order.append("load"), compiling.TieredKernel(Kernel()), True)
    gate.set()
    session.run(None, _feeds(session))
    assert compiling.wait_for_compiled()
    assert order == ["load", "compile"]


def test_holding_compiles_waits_for_the_build_in_progress_and_starts_no_other(cold):
    """What selection times its candidates in: no compile runs beside a timed run."""
    gate, order = threading.Event(), []
    compiling._worker.submit(gate.wait, compiling.TieredKernel(Kernel()))  # in progress
    compiling._worker.submit(lambda: order.append("compile"), compiling.TieredKernel(Kernel()))
    with compiling.hold_compiles(timeout=0.05):  # the build in progress outlasts the wait
        gate.set()
        assert not compiling.wait_for_compiled(timeout=0.2)  # the compile does not start
        compiling._worker.submit(
            lambda: order.append("load"), compiling.TieredKernel(Kernel()), True
        )
        assert compiling._worker.wait(timeout=5) is False and order == ["load"]  # loads go on
    assert compiling.wait_for_compiled(timeout=30) and order == ["load", "compile"]
    started = threading.Event()
    compiling._worker.submit(
        lambda: (started.set(), threading.Event().wait(0.3)), compiling.TieredKernel(Kernel())
    )
    started.wait(5)
    with compiling.hold_compiles(timeout=30):  # waits for the build in progress
        assert compiling.wait_for_compiled(timeout=0)


def test_wait_for_compiled_makes_runs_bit_identical(held):
    session = _session(DIGITS, compiling.BACKGROUND)
    feeds = _feeds(session)
    assert not session.wait_for_compiled(timeout=0)  # still held
    held.set()
    assert session.wait_for_compiled() and compiling.wait_for_compiled(timeout=None)
    runs = {session.run(None, feeds)[0].tobytes() for _ in range(20)}
    assert len(runs) == 1


def test_a_discarded_sessions_builds_leave_the_queue(held):
    kept, discarded = _session(DIGITS, compiling.BACKGROUND), _session(DIGITS, compiling.BACKGROUND)
    for ep, _ in discarded._state.providers.eps:
        ep.cancel_compiles()  # what selection does to the candidates it did not choose
    held.set()
    assert kept.wait_for_compiled() and set(_tiers(kept)) == {1}
    assert set(_tiers(discarded)) == {0}  # they keep their numpy kernels, and still run
    errors = {repr(s.kernel.error) for s in discarded._plan.steps if hasattr(s.kernel, "error")}
    assert errors == {repr(RuntimeError("its session was discarded"))}
    feeds = _feeds(kept)
    np.testing.assert_allclose(
        discarded.run(None, feeds)[0], kept.run(None, feeds)[0], rtol=1e-4, atol=1e-6
    )


def test_a_kernel_that_fails_to_compile_keeps_its_numpy_tier(held, monkeypatch):
    from nxrt_ep_cpu.ops._conv_gemm import ConvKernel

    real = ConvKernel.__init__

    def without_compiler(self, *args, compiled: bool = True, **kwargs) -> None:
        if compiled:
            raise RuntimeError("no compiler here")
        real(self, *args, compiled=compiled, **kwargs)

    monkeypatch.setattr(ConvKernel, "__init__", without_compiler)
    session = _session(DIGITS, compiling.BACKGROUND)
    conv = next(s.kernel for s in session._plan.steps if "Conv" in s.op_type)
    held.set()
    assert session.wait_for_compiled()
    assert conv.tier == 0 and "no compiler" in repr(conv.error)
    assert set(_tiers(session)) == {0, 1}  # the other nodes took their compiled kernels
    feeds = _feeds(session)
    monkeypatch.setattr(ConvKernel, "__init__", real)
    want = _session(DIGITS, compiling.WAIT).run(None, feeds)[0]
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-5)


def test_example_inputs_follow_the_plan():
    session = _session(DIGITS, compiling.WAIT)
    conv = next(s for s in session._plan.steps if "Conv" in s.op_type)
    node = next(n for n in session._model.graph if n.name == conv.name)
    x, w, *_ = compiling.example_inputs(node)
    assert x.dtype == np.float32 and x.flags.writeable
    assert not w.flags.writeable  # a constant, read-only as the plan holds it


def _run(code: str, env: dict[str, str], *paths: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **env}
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
    )


def test_the_numpy_tier_imports_no_numba(tmp_path):
    code = """
        import sys
        from importlib import resources
        import numpy as np
        import nxrt
        from nxrt_ep_cpu import compiling
        compiling._worker.submit = lambda job, kernel, first=False: None  # nothing is built
        model = (resources.files("nxrt") / "data" / "digits_cnn.onnx").read_bytes()
        session = nxrt.InferenceSession(model, providers=["cpu"])
        session.run(None, {"pixels": np.ones((4, 1, 8, 8), np.float32)})
        assert "numba" not in sys.modules, "numba imported"
    """
    done = _run(code, {compiling.MODE_ENV: compiling.BACKGROUND, "NUMBA_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_process_that_exits_while_compiling_exits_cleanly(tmp_path):
    # exit as soon as the session exists: its kernels are compiling in the background
    code = """
        from importlib import resources
        import nxrt
        from nxrt_ep_cpu import compiling
        model = (resources.files("nxrt") / "data" / "digits_cnn.onnx").read_bytes()
        session = nxrt.InferenceSession(model, providers=["cpu"])
        assert not compiling.wait_for_compiled(timeout=0), "nothing was compiling"
    """
    done = _run(code, {compiling.MODE_ENV: compiling.BACKGROUND, "NUMBA_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    # the build in progress at exit was finished and cached; the others were dropped
    markers = list(tmp_path.glob("*/kernels/*/*"))
    assert markers, sorted(str(p) for p in tmp_path.rglob("*"))[:20]


RACER = """
    from nxrt_ep_cpu.jit import njit

    @njit
    def add(a, b):
        return a + b
"""


def test_two_processes_compile_into_one_empty_cache_at_once(tmp_path):
    """Both finish; a third process then loads every signature both compiled (data files
    named by their keys: none overwrote the other's) and the kernels they marked."""
    (tmp_path / "racer.py").write_text(textwrap.dedent(RACER))
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), compiling.MODE_ENV: compiling.WAIT}
    code = """
        import os, sys, time
        from importlib import resources
        import numpy as np
        import nxrt
        import racer
        go, dtype, out = sys.argv[1], sys.argv[2], sys.argv[3]
        while not os.path.exists(go):
            time.sleep(0.01)
        racer.add(np.ones(3, dtype), np.ones(3, dtype))
        model = (resources.files("nxrt") / "data" / "digits_cnn.onnx").read_bytes()
        session = nxrt.InferenceSession(model, providers=["cpu"])
        x = np.linspace(0, 16, 64 * 8, dtype=np.float32).reshape(8, 1, 8, 8)
        np.save(out, session.run(None, {"pixels": x})[0])
    """
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(go), dtype, str(tmp_path / dtype)],
            env={**os.environ, **env, "PYTHONPATH": str(tmp_path)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for dtype in ("float32", "int64")
    ]
    go.touch()
    for proc in procs:
        _, err = proc.communicate()
        assert proc.returncode == 0, err[-3000:]
    assert not list((tmp_path / "cache").rglob("*.tmp.*")), "a temporary file was left"
    check = """
        import numpy as np
        from importlib import resources
        import nxrt, racer
        from nxrt_ep_cpu import compiling
        for dtype in ("float32", "int64"):
            assert (racer.add(np.ones(3, dtype), np.ones(3, dtype)) == 2).all()
        hits = sum(racer.add.stats.cache_hits.values())
        assert hits == 2, (hits, racer.add.stats)
        model = (resources.files("nxrt") / "data" / "digits_cnn.onnx").read_bytes()
        session = nxrt.InferenceSession(model, providers=["cpu"])
        assert compiling.counts["background"] == 0, compiling.counts  # all marked
        x = np.linspace(0, 16, 64 * 8, dtype=np.float32).reshape(8, 1, 8, 8)
        y = session.run(None, {"pixels": x})[0]
        for name in ("float32", "int64"):
            assert np.array_equal(y, np.load(f"{name}.npy")), name
    """
    env[compiling.MODE_ENV] = compiling.BACKGROUND
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(check)],
        env={**os.environ, **env, "PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_cache_is_shared_by_checkouts_of_one_version(tmp_path):
    """Two copies of the package at different paths: what one compiled, the other loads."""
    for copy in ("a", "b"):
        shutil.copytree(
            PACKAGE, tmp_path / copy / "nxrt_ep_cpu", ignore=shutil.ignore_patterns("__pycache__")
        )
    code = """
        import sys
        import numpy as np
        from nxrt_ep_cpu.jit import pool
        assert sys.argv[1] in pool.__file__, pool.__file__
        none = np.zeros((0, 1, 1), np.float32)
        pool.max_pool2d(none, none, np.ones(9, np.int64), 0, 0)
        print(sum(pool.max_pool2d.stats.cache_hits.values()))
    """
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    hits = []
    for copy in ("a", "b"):
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), str(tmp_path / copy)],
            env={**os.environ, **env, "PYTHONPATH": str(tmp_path / copy)},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        hits.append(int(done.stdout.split()[-1]))
    assert hits == [0, 1]
    folders = [p.name for p in (tmp_path / "cache").iterdir()]
    assert len(folders) == 1 and str(tmp_path) not in folders[0]


def test_warmup_compiles_a_model_into_the_cache(cold, tmp_path):
    path = tmp_path / "digits.onnx"
    path.write_bytes(DIGITS)
    (line,) = warmup.warmup(path)
    assert "compiled kernels" in line
    compiling._built.clear()
    before = dict(compiling.counts)
    session = _session(DIGITS, compiling.BACKGROUND)
    assert compiling.counts["background"] == before.get("background", 0), "nothing compiles"
    session.run(None, _feeds(session))
    assert set(_tiers(session)) == {1}
