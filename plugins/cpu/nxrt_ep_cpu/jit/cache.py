"""numba's disk cache for the cpu EP's loops, keyed by version, source and CPU, not by path.

numba's own locators name a function's cache folder after the absolute path
of its source file, so every new checkout or virtual environment compiled
everything again. :class:`KernelCache` keeps numba's format (an index per
function, one data file per compiled signature) in the folder of
:func:`nxrt_ep_cpu.compiling.cache_folder` (nxrt-ep-cpu and numba versions and
a digest of ``jit/``; ``NUMBA_CACHE_DIR`` still chooses the root), one
subfolder per module. The index is stamped with the digest of the function's
own source file; its entries are keyed, as numba keys them, by signature, CPU
name and features, and the function's bytecode.

Several processes may compile into one cache at once: every file is written to
a temporary name and renamed into place (numba's own writer), and a data file
is named after its entry's key, written before the index names it, so two
processes saving different signatures of one function never write the same
data file, and an index entry never points at a file not yet complete. Adding
an entry to an index (read, add, write) holds an advisory lock on a file beside
it, for the milliseconds that takes and never during a compile, so two processes
adding entries at once keep both; the lock goes with its process, however that
ends. Where there is no ``fcntl`` (Windows) the update is merged again until it
holds, and two writers at once may lose one entry, compiled again later.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from numba.core.caching import (
    CompileResultCacheImpl,
    FunctionCache,
    IndexDataCacheFile,
    _CacheLocator,
)

from nxrt_ep_cpu.compiling import cache_folder


@functools.cache
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


_ensured: set[str] = set()


class KernelLocator(_CacheLocator):
    """Where a cpu EP loop is cached: ``cache_folder()/<module>``, whatever its path."""

    def __init__(self, py_func: Any, py_file: str) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(cache_folder(), py_func.__module__)

    def ensure_cache_path(self) -> None:
        path = self._cache_path
        if path in _ensured:
            return
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()  # writable, or OSError
        _ensured.add(path)

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> str:
        st = os.stat(self._py_file)
        return _file_digest(self._py_file, st.st_mtime_ns, st.st_size)

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> KernelLocator | None:
        if not os.path.exists(py_file):
            return None
        self = cls(py_func, py_file)
        try:
            self.ensure_cache_path()
        except OSError:
            return None  # not writable: numba then refuses to cache the function
        return self


class _KernelCacheImpl(CompileResultCacheImpl):
    _locator_classes = [KernelLocator]  # noqa: RUF012 - numba's class attribute


class _KernelCacheFile(IndexDataCacheFile):
    """numba's index and data files, each data file named after its entry's key and
    written before the index names it (see the module docstring)."""

    def save(self, key: Any, data: Any) -> None:
        name = self._data_name_pattern.format(number=0).replace(
            ".0.nbc", f".{hashlib.sha256(repr(key).encode()).hexdigest()[:20]}.nbc"
        )
        self._save_data(name, data)
        with _locked(self._index_path + ".lock"):
            for _ in range(3):  # without a lock, another process may replace it meanwhile
                overloads = self._load_index()
                if overloads.get(key) == name:
                    return
                overloads[key] = name
                self._save_index(overloads)


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (made if need be) while the block runs; no
    lock where ``fcntl`` is missing or the file cannot be opened."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class KernelCache(FunctionCache):
    """numba's function cache in :class:`KernelLocator`'s folder, safe for concurrent
    writers (:class:`_KernelCacheFile`)."""

    _impl_class = _KernelCacheImpl

    def __init__(self, py_func: Any) -> None:
        super().__init__(py_func)
        self._cache_file = _KernelCacheFile(
            cache_path=self._cache_path,
            filename_base=self._impl.filename_base,
            source_stamp=self._impl.locator.get_source_stamp(),
        )
