"""String kernels: concatenation, normalisation, splitting, regex matching, n-gram counts.

String tensors are numpy object arrays holding Python ``str``.
"""

from __future__ import annotations

import re

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op


def _text(s: str | bytes) -> str:
    return s.decode() if isinstance(s, bytes) else str(s)


def _strings(x: np.ndarray, op_name: str) -> np.ndarray:
    """``x`` as an object array of ``str``; other dtypes are refused."""
    if x.dtype.kind not in ("O", "U", "S"):
        raise KernelFailed(f"{op_name}: input must be a string tensor, not {x.dtype}")
    if x.dtype.kind == "O":
        return x
    return np.array([_text(s) for s in x.reshape(-1).tolist()], dtype=object).reshape(x.shape)


@op("StringConcat", since=20)
def string_concat(x: np.ndarray, y: np.ndarray, /) -> np.ndarray:
    """Element-wise ``x + y`` with broadcasting."""
    x = _strings(x, "StringConcat")
    y = _strings(y, "StringConcat")
    try:
        out = np.add(x, y, dtype=object)
    except ValueError as exc:
        raise KernelFailed(
            f"StringConcat: shapes {list(x.shape)} and {list(y.shape)} do not broadcast"
        ) from exc
    return np.asarray(out, dtype=object)


@op("StringNormalizer", since=10)
def string_normalizer(
    x: np.ndarray,
    /,
    *,
    case_change_action: str = "NONE",
    is_case_sensitive: int = 0,
    locale: str | None = None,
    stopwords: list[str] | None = None,
) -> np.ndarray:
    """Drop the stop-word elements of a ``[C]`` or ``[1, C]`` tensor, then change case.

    Stop words match whole elements (case-folded when ``is_case_sensitive`` is 0).
    When every element is dropped the result is one empty string, shaped ``[1]``
    or ``[1, 1]`` like the input's rank.
    """
    x = _strings(x, "StringNormalizer")
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise KernelFailed(
            f"StringNormalizer: input must have shape [C] or [1, C], not {list(x.shape)}"
        )
    action = _text(case_change_action)
    if action not in ("NONE", "LOWER", "UPPER"):
        raise KernelFailed(
            f"StringNormalizer: case_change_action must be NONE, LOWER or UPPER, not {action!r}"
        )
    values = [_text(s) for s in x.reshape(-1).tolist()]
    if stopwords:
        if is_case_sensitive:
            stops = {_text(w) for w in stopwords}
            values = [v for v in values if v not in stops]
        else:
            stops = {_text(w).lower() for w in stopwords}
            values = [v for v in values if v.lower() not in stops]
    if action == "LOWER":
        values = [v.lower() for v in values]
    elif action == "UPPER":
        values = [v.upper() for v in values]
    if not values:
        values = [""]
    out = np.array(values, dtype=object)
    return out.reshape(1, -1) if x.ndim == 2 else out


@op("StringSplit", since=20)
def string_split(
    x: np.ndarray, /, *, delimiter: str | None = None, maxsplit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Split each element; pieces are padded with ``""`` to the longest split.

    No (or an empty) delimiter splits on runs of whitespace, ignoring leading and
    trailing whitespace, also after the last split ``maxsplit`` allows (Python's
    ``str.split`` keeps it there; onnxruntime does not, and the spec says
    nothing), and an empty string has no pieces; ``maxsplit`` bounds the number
    of splits per element. Returns the
    pieces (shape ``x.shape + [max pieces]``) and the piece counts.
    """
    x = _strings(x, "StringSplit")
    sep = _text(delimiter) if delimiter is not None else None
    if sep == "":
        sep = None
    limit = -1 if maxsplit is None else int(maxsplit)
    # an empty string has no pieces, with a delimiter too (Python gives [""]; onnxruntime 0)
    pieces = [_text(s).split(sep, limit) if _text(s) else [] for s in x.reshape(-1).tolist()]
    if sep is None:
        pieces = [p[:-1] + [p[-1].rstrip()] if p else p for p in pieces]
    counts = np.array([len(p) for p in pieces], dtype=np.int64).reshape(x.shape)
    width = max((len(p) for p in pieces), default=0)
    out = np.full((len(pieces), width), "", dtype=object)
    for i, p in enumerate(pieces):
        out[i, : len(p)] = p
    return out.reshape(*x.shape, width), counts


@op("RegexFullMatch", since=20)
def regex_full_match(x: np.ndarray, /, *, pattern: str | None = None) -> np.ndarray:
    """Whether each element matches ``pattern`` in full (RE2 syntax, run by Python ``re``)."""
    x = _strings(x, "RegexFullMatch")
    if pattern is None:
        raise KernelFailed("RegexFullMatch: the pattern attribute is required")
    try:
        regex = re.compile(_text(pattern))
    except re.error as exc:
        raise KernelFailed(f"RegexFullMatch: invalid pattern {pattern!r}: {exc}") from exc
    flat = [regex.fullmatch(_text(s)) is not None for s in x.reshape(-1).tolist()]
    return np.array(flat, dtype=np.bool_).reshape(x.shape)


@op("TfIdfVectorizer", since=9)
def tf_idf_vectorizer(
    x: np.ndarray,
    /,
    *,
    max_gram_length: int,
    max_skip_count: int,
    min_gram_length: int,
    mode: str,
    ngram_counts: list[int],
    ngram_indexes: list[int],
    pool_int64s: list[int] | None = None,
    pool_strings: list[str] | None = None,
    weights: list[float] | None = None,
) -> np.ndarray:
    """Count the pool's n-grams (with up to ``max_skip_count`` skips) in each row of ``x``.

    ``x`` is ``[C]`` (output ``[output_size]``) or ``[B, C]`` (output ``[B, output_size]``);
    unigrams are counted once, longer n-grams once per skip distance.
    """
    mode = _text(mode)
    if mode not in ("TF", "IDF", "TFIDF"):
        raise KernelFailed(f"TfIdfVectorizer: mode must be TF, IDF or TFIDF, not {mode!r}")
    if (pool_int64s is None) == (pool_strings is None):
        raise KernelFailed("TfIdfVectorizer: set exactly one of pool_int64s and pool_strings")
    if x.ndim not in (0, 1, 2):
        raise KernelFailed(f"TfIdfVectorizer: input must be [C] or [B, C], not {list(x.shape)}")
    output_size = max(ngram_indexes) + 1 if ngram_indexes else 0
    rows = x.reshape(1, -1) if x.ndim < 2 else x
    if pool_strings is not None:
        pool = np.array([_text(s) for s in pool_strings], dtype=object)
        rows = _strings(rows, "TfIdfVectorizer")
    else:
        if rows.dtype.kind not in "iu":
            raise KernelFailed(
                f"TfIdfVectorizer: an int64 pool needs an integer input, not {rows.dtype}"
            )
        pool = np.asarray(pool_int64s, dtype=np.int64)
        rows = rows.astype(np.int64)

    # The pool's items as vocabulary ids, and the input's (-1 where not in the pool).
    vocab, pool_ids = np.unique(pool, return_inverse=True)
    pos = np.searchsorted(vocab, rows) if len(vocab) else np.zeros(rows.shape, np.int64)
    pos = np.minimum(pos, max(len(vocab) - 1, 0))
    known = vocab[pos] == rows if len(vocab) else np.zeros(rows.shape, bool)
    x_ids = np.where(known, pos, -1).astype(np.int64)

    counts = np.zeros((rows.shape[0], output_size), dtype=np.int64)
    bounds = [*ngram_counts, len(pool)]
    ngram_id = 0
    for size, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]), 1):
        n_grams = max(end - start, 0) // size
        grams = pool_ids[start : start + n_grams * size].reshape(n_grams, size)
        columns = np.asarray(ngram_indexes[ngram_id : ngram_id + n_grams], dtype=np.int64)
        ngram_id += n_grams
        if n_grams == 0 or not min_gram_length <= size <= max_gram_length:
            continue
        skips = range(max_skip_count + 1) if size > 1 else range(1)
        for skip in skips:
            span = (size - 1) * (skip + 1) + 1
            if span > rows.shape[1]:
                break
            starts = np.arange(rows.shape[1] - span + 1)
            windows = x_ids[:, starts[:, None] + np.arange(size) * (skip + 1)]
            _count_matches(windows, grams, columns, counts)

    w = np.float32(1)
    if weights:  # "the i-th element in weights is the weight of the i-th n-gram in pool"
        w = np.ones(output_size, dtype=np.float32)
        w[np.asarray(ngram_indexes, dtype=np.int64)[: len(weights)]] = weights[: len(ngram_indexes)]
    if mode == "TF":
        out = counts.astype(np.float32)
    elif mode == "IDF":
        out = np.where(counts > 0, w, np.float32(0)).astype(np.float32)
    else:
        out = (counts * w).astype(np.float32)
    return out[0] if x.ndim < 2 else out


def _count_matches(
    windows: np.ndarray, grams: np.ndarray, columns: np.ndarray, counts: np.ndarray
) -> None:
    """Add 1 to ``counts[row, column]`` for every window equal to one of the pool's grams."""
    batch, n_windows, size = windows.shape
    flat = windows.reshape(-1, size)
    both = np.concatenate([grams, flat])
    _, inverse = np.unique(both, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    gram_keys, window_keys = inverse[: len(grams)], inverse[len(grams) :]
    order = np.argsort(gram_keys, kind="stable")
    sorted_keys = gram_keys[order]
    # The last of equal grams wins, as a later pool entry overrides an earlier one.
    pos = np.maximum(np.searchsorted(sorted_keys, window_keys, side="right") - 1, 0)
    hit = sorted_keys[pos] == window_keys
    row = np.repeat(np.arange(batch), n_windows)[hit]
    np.add.at(counts, (row, columns[order[pos[hit]]]), 1)
