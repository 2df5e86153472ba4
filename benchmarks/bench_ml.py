"""Classical ML models on nxrt's cpu EP against ONNX Runtime, interleaved in one run.

A 300-tree random forest, a 500-round gradient-boosting model (LightGBM, the
boosting library most converted models come from), a logistic regression and
an RBF SVM, each converted (skl2onnx / onnxmltools, ``zipmap=False`` so both
runtimes return the score tensor) and run on 10,000 rows of a synthetic
classification problem. Each round runs nxrt then ONNX Runtime once, so both
see the same machine state; the table shows medians and nxrt / ORT.

    python benchmarks/bench_ml.py [--rows 10000] [--rounds 15] [--models forest,boosting]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np


def _register_lightgbm() -> None:
    import lightgbm
    from onnxmltools.convert.lightgbm.operator_converters.LightGbm import convert_lightgbm
    from skl2onnx import update_registered_converter
    from skl2onnx.common.shape_calculator import calculate_linear_classifier_output_shapes

    update_registered_converter(
        lightgbm.LGBMClassifier,
        "LightGbmLGBMClassifier",
        calculate_linear_classifier_output_shapes,
        convert_lightgbm,
        options={"nocl": [True, False], "zipmap": [True, False, "columns"]},
    )


def models(x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], Any]]:
    """Estimators to train, by name (trained only when asked for)."""
    import lightgbm
    from sklearn import ensemble, linear_model, pipeline, preprocessing, svm

    def scaled(estimator: Any) -> Any:
        return pipeline.make_pipeline(preprocessing.StandardScaler(), estimator)

    return {
        "forest": lambda: ensemble.RandomForestClassifier(
            n_estimators=300, max_depth=12, n_jobs=-1, random_state=0
        ).fit(x, y),
        "boosting": lambda: lightgbm.LGBMClassifier(
            n_estimators=500, num_leaves=31, verbose=-1, random_state=0
        ).fit(x, y),
        "linear": lambda: scaled(linear_model.LogisticRegression(max_iter=500)).fit(x, y),
        "svm": lambda: scaled(svm.SVC(probability=True, random_state=0)).fit(x[:2000], y[:2000]),
    }


def describe(name: str) -> str:
    return {
        "forest": "random forest, 300 trees (depth 12)",
        "boosting": "LightGBM, 500 rounds",
        "linear": "logistic regression",
        "svm": "SVC rbf + probabilities",
    }[name]


def convert(model: Any, x: np.ndarray) -> bytes:
    from skl2onnx import to_onnx

    final = model.steps[-1][1] if hasattr(model, "steps") else model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = to_onnx(
            model,
            x[:1],
            options={id(final): {"zipmap": False}},
            target_opset={"": 17, "ai.onnx.ml": 3},
        )
    return onx.SerializeToString()


def timed(session: Any, feeds: dict[str, np.ndarray]) -> float:
    start = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", default="forest,boosting,linear,svm")
    args = parser.parse_args(argv)

    import onnxruntime as ort
    from sklearn.datasets import make_classification

    import nxrt

    _register_lightgbm()
    x, y = make_classification(
        n_samples=args.rows, n_features=20, n_informative=12, n_classes=3, random_state=0
    )
    x = x.astype(np.float32)
    makers = models(x, y)
    rows = []
    for name in args.models.split(","):
        start = time.perf_counter()
        model = makers[name]()
        onx = convert(model, x)
        trained = time.perf_counter() - start
        session = nxrt.InferenceSession(onx, providers=["cpu"])
        reference = ort.InferenceSession(onx, providers=["CPUExecutionProvider"])
        feeds = {"X": x}
        got, want = session.run(None, feeds), reference.run(None, feeds)
        labels_equal = bool(np.array_equal(got[0], want[0]))
        worst = float(np.max(np.abs(got[1] - want[1])))
        ours, theirs = [], []
        session.run(None, feeds)  # warm: compiled loops loaded, pages touched
        reference.run(None, feeds)
        for _ in range(args.rounds):
            ours.append(timed(session, feeds))
            theirs.append(timed(reference, feeds))
        a, b = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
        rows.append((describe(name), a, b, a / b, labels_equal, worst, trained))
        print(f"  {name}: trained and converted in {trained:.1f} s", file=sys.stderr)

    print(f"{args.rows} rows x 20 features, {args.rounds} interleaved rounds, medians")
    print(f"{'model':<38} {'nxrt ms':>9} {'ORT ms':>9} {'nxrt/ORT':>9}  labels  max |dscore|")
    for label, a, b, ratio, equal, worst, _ in rows:
        same = "equal" if equal else "DIFFER"
        print(f"{label:<38} {a:9.1f} {b:9.1f} {ratio:8.2f}x  {same:<6}  {worst:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
