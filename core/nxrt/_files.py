"""Writing files the safe way (never a half-written file, never the user's input), and
where nxrt and its EPs keep their caches."""

from __future__ import annotations

import os
import tempfile


def write_atomically(path: str, data: bytes | bytearray) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename in the same folder.

    A crash or a full disk leaves either the old file or the new one, never a
    mix; the file gets the permissions a plain ``open()`` would give it.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".nxrt-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def cache_folder(name: str) -> str:
    """The folder of one of nxrt's caches: ``$NXRT_CACHE_DIR/name``, else
    ``platformdirs.user_cache_dir("nxrt")/name`` (``nxrt.cache_folder``, for EPs too)."""
    root = os.environ.get("NXRT_CACHE_DIR")
    if not root:
        import platformdirs

        root = platformdirs.user_cache_dir("nxrt")
    return os.path.join(root, name)
