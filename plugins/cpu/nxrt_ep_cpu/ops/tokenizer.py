"""``com.microsoft::Tokenizer``, the contrib op skl2onnx emits for text vectorizers.

CountVectorizer and TfidfVectorizer pipelines become StringNormalizer ->
Tokenizer -> TfIdfVectorizer. The op is ONNX Runtime's, not ONNX's, so its
schema is registered with onnx here (once, when the cpu EP's kernels load):
the checker then validates Tokenizer nodes and shape inference types their
output, which types the TfIdfVectorizer after it. Semantics are ONNX
Runtime's: each string of ``X`` (``[C]`` or ``[N, C]``) becomes a row of
tokens, padded with ``pad_value`` to the longest row, optionally between the
start (0x02) and end (0x03) marks. Patterns are matched with Python's ``re``
in ASCII mode (RE2's ``\\w`` and ``\\b`` are ASCII); RE2's leftmost-longest
choice between alternatives is not reproduced.
"""

from __future__ import annotations

import functools
import re
import threading

import numpy as np
import onnx
import onnx.defs

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

DOMAIN = "com.microsoft"
START, END = "\x02", "\x03"
_lock = threading.Lock()


def _schema() -> onnx.defs.OpSchema:
    schema = onnx.defs.OpSchema
    attr = schema.AttrType
    return schema(
        "Tokenizer",
        DOMAIN,
        1,
        "Splits each string of X into tokens, by separator or token expressions.",
        inputs=[schema.FormalParameter("X", "T", "Strings to tokenize, [C] or [N, C].")],
        outputs=[schema.FormalParameter("Y", "T", "Tokens, X's shape plus one axis.")],
        type_constraints=[("T", ["tensor(string)"], "Strings only.")],
        attributes=[
            schema.Attribute(
                "mark", attr.INT, "Put 0x02 / 0x03 marks around each row.", required=True
            ),
            schema.Attribute("pad_value", attr.STRING, "Pads rows to the longest.", required=True),
            schema.Attribute(
                "mincharnum", attr.INT, "Shortest token kept, in characters.", required=True
            ),
            schema.Attribute("separators", attr.STRINGS, "Separator expressions.", required=False),
            schema.Attribute(
                "tokenexp", attr.STRING, "An expression tokens match.", required=False
            ),
        ],
    )


def _infer(ctx) -> None:
    """Y is a string tensor of X's rank plus one (the token axis has no fixed size)."""
    x = ctx.get_input_type(0)
    out = onnx.TypeProto()
    out.tensor_type.elem_type = onnx.TensorProto.STRING
    if x is not None and x.HasField("tensor_type") and x.tensor_type.HasField("shape"):
        out.tensor_type.shape.dim.extend(x.tensor_type.shape.dim)
        out.tensor_type.shape.dim.add()
    ctx.set_output_type(0, out)


def register_schema() -> None:
    """Make onnx know ``com.microsoft::Tokenizer`` (idempotent)."""
    with _lock:
        if not onnx.defs.has("Tokenizer", 1, DOMAIN):
            schema = _schema()
            schema.set_type_and_shape_inference_function(_infer)
            onnx.defs.register_schema(schema)


register_schema()


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.ASCII)
    except re.error:
        try:
            return re.compile(pattern)
        except re.error as exc:
            raise KernelFailed(f"Tokenizer: cannot read the expression {pattern!r}: {exc}") from exc


def _split(text: str, separators: list[re.Pattern[str]], shortest: int) -> list[str]:
    """Cut at every separator match, each separator in turn over the pieces so far."""
    pieces = [text]
    for separator in separators:
        cut: list[str] = []
        for piece in pieces:
            start = 0
            while True:
                found = separator.search(piece, start)
                if found is None:
                    if len(piece) - start >= shortest:
                        cut.append(piece[start:])
                    break
                if found.start() - start >= shortest:
                    cut.append(piece[start : found.start()])
                start = found.end() if found.end() > found.start() else found.start() + 1
                if start > len(piece):
                    break
        pieces = cut
    return pieces


def _match(text: str, expression: re.Pattern[str], shortest: int) -> list[str]:
    """Every match of the token expression at least ``shortest`` characters long; a
    shorter match moves the search on by one character."""
    tokens, start = [], 0
    while start <= len(text):
        found = expression.search(text, start)
        if found is None:
            break
        if found.end() - found.start() >= shortest:
            tokens.append(found.group())
            start = found.end() if found.end() > found.start() else found.start() + 1
        else:
            start = found.start() + 1
    return tokens


@op("Tokenizer", since=1, domain=DOMAIN)
def tokenizer(
    x: np.ndarray,
    /,
    *,
    mark: int,
    mincharnum: int,
    pad_value: str,
    separators: list[str] | None = None,
    tokenexp: str | None = None,
) -> np.ndarray:
    """The tokens of every string, ``X``'s shape plus a token axis, padded to the longest."""
    if x.ndim not in (1, 2):
        raise KernelFailed(f"Tokenizer: the input must be [C] or [N, C], not {x.ndim}-D")
    if mincharnum < 1:
        raise KernelFailed(f"Tokenizer: mincharnum must be positive, not {mincharnum}")
    texts = [v.decode() if isinstance(v, bytes) else str(v) for v in x.reshape(-1).tolist()]
    pad = pad_value.decode() if isinstance(pad_value, bytes) else str(pad_value)
    seps = [s.decode() if isinstance(s, bytes) else str(s) for s in separators or []]
    if seps == [""] or (not seps and tokenexp == "."):
        rows = [list(t) for t in texts]  # one token per character
    elif seps:
        if any(not s for s in seps):
            raise KernelFailed("Tokenizer: separators must not be empty")
        patterns = [_compile(s) for s in seps]
        rows = [_split(t, patterns, mincharnum) for t in texts]
    elif tokenexp:
        expression = _compile(tokenexp)
        rows = [_match(t, expression, mincharnum) for t in texts]
    else:
        raise KernelFailed("Tokenizer: set separators or tokenexp")
    longest = max((len(r) for r in rows), default=0)
    if longest == 0:
        return np.empty((*x.shape, 0), dtype=object)
    width = longest + (2 if mark else 0)
    out = np.full((len(rows), width), pad, dtype=object)
    for i, row in enumerate(rows):
        filled = [START, *row, END] if mark else row
        out[i, : len(filled)] = filled
    return out.reshape(*x.shape, width)
