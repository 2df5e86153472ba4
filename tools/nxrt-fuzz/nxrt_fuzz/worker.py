"""The fuzz worker process: reads one JSON command per line, answers one JSON line each.

Before each runtime runs, the worker reports the phase (``ort`` or ``nxrt``)
so the driver can tell whose crash or hang it was. Commands:
``gen`` (make case ``(seed, index)`` and classify it), ``make`` (make and
save it only) and ``eval`` (classify a saved case).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings

from nxrt_fuzz import execute
from nxrt_fuzz.build import Skip
from nxrt_fuzz.case import Case
from nxrt_fuzz.generate import generate_case
from nxrt_fuzz.run import FAILURES, FUZZER_ERROR, evaluate


def main(ep: str) -> None:
    warnings.simplefilter("ignore")
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt answers

    def say(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    execute.PHASE_HOOK = lambda phase: say({"phase": phase})
    for line in sys.stdin:
        command = json.loads(line)
        try:
            say(handle(command, ep, say))
        except Exception:  # noqa: BLE001 - the fuzzer's own error: report it, go on
            detail = traceback.format_exc()[-800:]
            say({"kind": FUZZER_ERROR, "detail": detail, "op": "", "ops": []})


def handle(command: dict, ep: str, say) -> dict:
    cmd, scratch = command["cmd"], command.get("dir", ".")
    if cmd in ("gen", "make"):
        seed, index = command["seed"], command["index"]
        say({"phase": "gen"})
        try:
            case = generate_case(seed, index, ep, command.get("ops"))
        except Skip as exc:
            return {
                "kind": "both refused",
                "detail": f"nothing generated: {exc}",
                "op": "",
                "ops": [],
            }
        if cmd == "make":
            path = os.path.join(scratch, f"case-{seed}-{index}.npz")
            case.save(path)
            return {"case": path}
    else:
        case = Case.load(command["path"])
    outcome = evaluate(case, ep)
    answer = {
        "kind": outcome.kind,
        "detail": outcome.detail,
        "op": outcome.op,
        "ops": case.ops,
        "on_ep": outcome.on_ep,
    }
    if outcome.kind in FAILURES or outcome.culprit is not None:
        culprit = outcome.culprit or case
        path = os.path.join(scratch, f"culprit-{os.getpid()}.npz")
        culprit.save(path)
        answer["culprit"] = path
    return answer


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
