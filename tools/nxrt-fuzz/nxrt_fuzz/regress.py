"""Keep a minimized failure as a regression case: ``python -m nxrt_fuzz.regress CASE NAME``.

The case is re-run on onnxruntime and its outputs become the expected ones;
with ``--known ID`` (an entry of :mod:`nxrt_fuzz.known`) nxrt's outputs are
kept instead, because there onnxruntime is the one that departs from the
spec, or, where the spec refuses the model, none: nxrt must refuse it. The
note records which, so the regression test knows what to check.
"""

from __future__ import annotations

import argparse
import os

from nxrt_fuzz.case import Case
from nxrt_fuzz.run import run_nxrt, run_onnxruntime

KNOWN_PREFIX = "known: "
#: The note of a known-difference case nxrt must refuse (it then has no expected outputs).
REFUSES = "nxrt refuses: "


def keep(source: str, name: str, folder: str, known: str = "") -> str:
    """Write ``source`` as ``folder/name.npz`` with its expected outputs; returns the path."""
    case = Case.load(source)
    outputs = run_nxrt(case) if known else run_onnxruntime(case)
    found = case.note.split(";", 1)[0]
    if isinstance(outputs, str) and known:  # the spec refuses it, and so does nxrt
        case.expected = {}
        found = f"{REFUSES}{outputs[:200]}"
    elif isinstance(outputs, str):
        raise SystemExit(f"onnxruntime does not run {source}: {outputs}")
    else:
        case.expected = dict(zip(case.output_names(), outputs))
    case.note = f"{KNOWN_PREFIX}{known}; {found}" if known else found
    path = os.path.join(folder, f"{name}.npz")
    case.save(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m nxrt_fuzz.regress", description=__doc__)
    parser.add_argument("case", help="a saved case (.npz), e.g. from fuzz-out/")
    parser.add_argument("name", help="the regression's name, e.g. clip_default_bounds")
    parser.add_argument("--known", default="", help="the known-difference id it shows")
    parser.add_argument("--folder", default=os.path.join("tests", "regressions"))
    args = parser.parse_args()
    print(keep(args.case, args.name, args.folder, args.known))


if __name__ == "__main__":
    main()
