"""Classical ML models, converted as users convert them, on the cpu EP against ONNX Runtime.

scikit-learn estimators and pipelines go through skl2onnx; LightGBM and
XGBoost models through onnxmltools' converters (registered with skl2onnx, as
their documentation shows, so they also convert inside pipelines). Each
model is trained on a dataset scikit-learn ships (iris, breast cancer,
digits, diabetes, or a small corpus written here), converted with default
options (classifiers end in ZipMap: a list of dicts) and, for classifiers,
with ``zipmap=False``, then run through nxrt (``providers=["cpu"]``) and
ONNX Runtime: labels and other integer or string outputs must be equal,
scores within rtol 1e-4 (atol 1e-6), and ``get_inputs()`` / ``get_outputs()``
must name the same types.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightgbm
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import xgboost
from onnxmltools.convert.lightgbm.operator_converters.LightGbm import (
    convert_lightgbm,
)
from onnxmltools.convert.xgboost.operator_converters.XGBoost import (
    convert_xgboost,
)
from skl2onnx import convert_sklearn, to_onnx, update_registered_converter
from skl2onnx.common.data_types import (
    DictionaryType,
    FloatTensorType,
    Int64TensorType,
    StringTensorType,
)
from skl2onnx.common.shape_calculator import (
    calculate_linear_classifier_output_shapes,
    calculate_linear_regressor_output_shapes,
)
from sklearn import (
    calibration,
    cluster,
    compose,
    datasets,
    decomposition,
    discriminant_analysis,
    ensemble,
    feature_extraction,
    gaussian_process,
    impute,
    linear_model,
    multiclass,
    naive_bayes,
    neighbors,
    neural_network,
    pipeline,
    preprocessing,
    svm,
    tree,
)

import nxrt
from nxrt.errors import InvalidArgument, InvalidModel

RTOL, ATOL = 1e-4, 1e-6
#: Cases whose converter refuses the default ai.onnx.ml opset and asks for
#: "target_opset={'ai.onnx.ml': 3}", given as it asks.
ML_3_CASES = {
    "isolation_forest",
    "lightgbm_binary",
    "lightgbm_multiclass",
    "lightgbm_regressor",
    "xgboost_binary",
    "xgboost_multiclass",
    "xgboost_regressor",
}

update_registered_converter(
    lightgbm.LGBMClassifier,
    "LightGbmLGBMClassifier",
    calculate_linear_classifier_output_shapes,
    convert_lightgbm,
    options={"nocl": [True, False], "zipmap": [True, False, "columns"]},
)
update_registered_converter(
    lightgbm.LGBMRegressor,
    "LightGbmLGBMRegressor",
    calculate_linear_regressor_output_shapes,
    convert_lightgbm,
    options={"split": None},
)
update_registered_converter(
    xgboost.XGBClassifier,
    "XGBoostXGBClassifier",
    calculate_linear_classifier_output_shapes,
    convert_xgboost,
    options={"nocl": [True, False], "zipmap": [True, False, "columns"]},
)
update_registered_converter(
    xgboost.XGBRegressor,
    "XGBoostXGBRegressor",
    calculate_linear_regressor_output_shapes,
    convert_xgboost,
)


# -- data ----------------------------------------------------------------------------------------
@functools.cache
def data(name: str) -> tuple[np.ndarray, np.ndarray]:
    """A dataset scikit-learn ships, features as float32."""
    loader = {
        "iris": datasets.load_iris,
        "cancer": datasets.load_breast_cancer,
        "digits": datasets.load_digits,
        "diabetes": datasets.load_diabetes,
    }[name]
    x, y = loader(return_X_y=True)
    return x.astype(np.float32), y


CORPUS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the cat chased a mouse",
    "dogs and cats are friends",
    "my dog likes the park",
    "a mouse hid under the mat",
    "cats sleep on the sofa all day",
    "the park was full of dogs",
]
CORPUS_LABELS = np.array([0, 1, 0, 1, 1, 0, 0, 1])


def text_data() -> tuple[np.ndarray, np.ndarray]:
    return np.array(CORPUS * 3, dtype=object).reshape(-1, 1), np.tile(CORPUS_LABELS, 3)


def with_missing(x: np.ndarray) -> np.ndarray:
    """``x`` with about a tenth of its values NaN (fixed positions)."""
    rng = np.random.default_rng(0)
    x = x.copy()
    x[rng.random(x.shape) < 0.1] = np.nan
    return x


def categorical(x: np.ndarray) -> np.ndarray:
    """Numeric columns then two coarse integer columns derived from the first ones."""
    return np.hstack([x, np.floor(x[:, :2])]).astype(np.float32)


# -- cases ---------------------------------------------------------------------------------------
@dataclass
class Case:
    """An estimator to train on a dataset; ``classifier`` cases also run with ``zipmap=False``."""

    make: Callable[[], Any]
    dataset: str
    classifier: bool = True
    slow: bool = False
    prepare: Callable[[np.ndarray], np.ndarray] | None = None
    target: Callable[[np.ndarray], np.ndarray] | None = None


def pipe(*steps: Any) -> Callable[[], Any]:
    return lambda: pipeline.make_pipeline(*[s() if callable(s) else s for s in steps])


scaled = preprocessing.StandardScaler
SEED = {"random_state": 0}

CASES: dict[str, Case] = {
    # linear models
    "logistic_regression_iris": Case(
        pipe(scaled, lambda: linear_model.LogisticRegression()), "iris"
    ),
    "logistic_regression_binary": Case(pipe(scaled, linear_model.LogisticRegression), "cancer"),
    "sgd_classifier_log": Case(
        pipe(scaled, lambda: linear_model.SGDClassifier(loss="log_loss", **SEED)), "iris"
    ),
    "ridge_classifier": Case(pipe(scaled, linear_model.RidgeClassifier), "cancer"),
    "perceptron": Case(pipe(scaled, lambda: linear_model.Perceptron(**SEED)), "iris"),
    "sgd_classifier_hinge": Case(
        pipe(scaled, lambda: linear_model.SGDClassifier(loss="hinge", **SEED)), "cancer"
    ),
    "linear_regression": Case(linear_model.LinearRegression, "diabetes", classifier=False),
    "ridge": Case(linear_model.Ridge, "diabetes", classifier=False),
    "lasso": Case(lambda: linear_model.Lasso(alpha=0.1), "diabetes", classifier=False),
    "elastic_net": Case(lambda: linear_model.ElasticNet(alpha=0.01), "diabetes", classifier=False),
    "sgd_regressor": Case(
        pipe(scaled, lambda: linear_model.SGDRegressor(**SEED)), "diabetes", classifier=False
    ),
    "linear_discriminant": Case(discriminant_analysis.LinearDiscriminantAnalysis, "iris"),
    # SVMs
    "svc_rbf_probability": Case(pipe(scaled, lambda: svm.SVC(probability=True, **SEED)), "iris"),
    "svc_rbf_binary_probability": Case(
        pipe(scaled, lambda: svm.SVC(probability=True, **SEED)), "cancer"
    ),
    "svc_linear_binary": Case(pipe(scaled, lambda: svm.SVC(kernel="linear")), "cancer"),
    "svc_poly_multiclass": Case(pipe(scaled, lambda: svm.SVC(kernel="poly", degree=3)), "iris"),
    "nu_svc_sigmoid": Case(pipe(scaled, lambda: svm.NuSVC(kernel="sigmoid", nu=0.3)), "iris"),
    "svr_rbf": Case(pipe(scaled, svm.SVR), "diabetes", classifier=False),
    "nu_svr": Case(pipe(scaled, svm.NuSVR), "diabetes", classifier=False),
    "linear_svr": Case(pipe(scaled, lambda: svm.LinearSVR(**SEED)), "diabetes", classifier=False),
    "one_class_svm": Case(pipe(scaled, lambda: svm.OneClassSVM(nu=0.2)), "iris", classifier=False),
    # trees, forests, boosting
    "decision_tree": Case(lambda: tree.DecisionTreeClassifier(max_depth=5, **SEED), "iris"),
    "decision_tree_regressor": Case(
        lambda: tree.DecisionTreeRegressor(max_depth=6, **SEED), "diabetes", classifier=False
    ),
    "random_forest": Case(
        lambda: ensemble.RandomForestClassifier(n_estimators=30, **SEED), "iris", slow=True
    ),
    "random_forest_binary": Case(
        lambda: ensemble.RandomForestClassifier(n_estimators=30, max_depth=8, **SEED), "cancer"
    ),
    "random_forest_regressor": Case(
        lambda: ensemble.RandomForestRegressor(n_estimators=30, max_depth=8, **SEED),
        "diabetes",
        classifier=False,
    ),
    "extra_trees": Case(
        lambda: ensemble.ExtraTreesClassifier(n_estimators=30, max_depth=8, **SEED), "digits"
    ),
    "extra_trees_regressor": Case(
        lambda: ensemble.ExtraTreesRegressor(n_estimators=20, max_depth=8, **SEED),
        "diabetes",
        classifier=False,
    ),
    "gradient_boosting_binary": Case(
        lambda: ensemble.GradientBoostingClassifier(n_estimators=40, **SEED), "cancer"
    ),
    "gradient_boosting_multiclass": Case(
        lambda: ensemble.GradientBoostingClassifier(n_estimators=20, max_depth=2, **SEED),
        "digits",
        slow=True,
    ),
    "gradient_boosting_regressor": Case(
        lambda: ensemble.GradientBoostingRegressor(n_estimators=50, **SEED),
        "diabetes",
        classifier=False,
    ),
    "adaboost": Case(lambda: ensemble.AdaBoostClassifier(n_estimators=20, **SEED), "iris"),
    "adaboost_regressor": Case(
        lambda: ensemble.AdaBoostRegressor(n_estimators=20, **SEED), "diabetes", classifier=False
    ),
    "bagging": Case(
        lambda: ensemble.BaggingClassifier(
            tree.DecisionTreeClassifier(max_depth=4), n_estimators=10, **SEED
        ),
        "iris",
    ),
    "isolation_forest": Case(
        lambda: ensemble.IsolationForest(n_estimators=20, **SEED), "iris", classifier=False
    ),
    "lightgbm_binary": Case(
        lambda: lightgbm.LGBMClassifier(n_estimators=40, verbose=-1, **SEED), "cancer"
    ),
    "lightgbm_multiclass": Case(
        lambda: lightgbm.LGBMClassifier(n_estimators=20, verbose=-1, **SEED), "iris"
    ),
    "lightgbm_regressor": Case(
        lambda: lightgbm.LGBMRegressor(n_estimators=40, verbose=-1, **SEED),
        "diabetes",
        classifier=False,
    ),
    "xgboost_binary": Case(
        lambda: xgboost.XGBClassifier(n_estimators=30, max_depth=3, **SEED), "cancer"
    ),
    "xgboost_multiclass": Case(
        lambda: xgboost.XGBClassifier(n_estimators=20, max_depth=3, **SEED), "iris"
    ),
    "xgboost_regressor": Case(
        lambda: xgboost.XGBRegressor(n_estimators=30, max_depth=3, **SEED),
        "diabetes",
        classifier=False,
    ),
    # naive Bayes, neighbours, neural networks
    "gaussian_nb": Case(naive_bayes.GaussianNB, "iris"),
    "multinomial_nb": Case(naive_bayes.MultinomialNB, "digits"),
    "bernoulli_nb": Case(lambda: naive_bayes.BernoulliNB(binarize=4.0), "digits"),
    "k_neighbors": Case(lambda: neighbors.KNeighborsClassifier(n_neighbors=5), "iris"),
    "k_neighbors_regressor": Case(
        lambda: neighbors.KNeighborsRegressor(n_neighbors=5), "diabetes", classifier=False
    ),
    "mlp_classifier": Case(
        pipe(
            scaled,
            lambda: neural_network.MLPClassifier(hidden_layer_sizes=(16,), max_iter=300, **SEED),
        ),
        "iris",
    ),
    "mlp_regressor": Case(
        pipe(
            scaled,
            lambda: neural_network.MLPRegressor(hidden_layer_sizes=(16,), max_iter=300, **SEED),
        ),
        "diabetes",
        classifier=False,
    ),
    # preprocessing
    "min_max_scaler": Case(
        pipe(preprocessing.MinMaxScaler, linear_model.LogisticRegression), "iris"
    ),
    "max_abs_robust_scalers": Case(
        pipe(preprocessing.MaxAbsScaler, preprocessing.RobustScaler, linear_model.Ridge),
        "diabetes",
        classifier=False,
    ),
    "normalizer_l2": Case(
        pipe(lambda: preprocessing.Normalizer("l2"), linear_model.LogisticRegression), "iris"
    ),
    "normalizer_l1_max": Case(
        pipe(
            lambda: preprocessing.Normalizer("l1"),
            lambda: preprocessing.Normalizer("max"),
            linear_model.Ridge,
        ),
        "diabetes",
        classifier=False,
    ),
    "binarizer": Case(
        pipe(lambda: preprocessing.Binarizer(threshold=5.0), naive_bayes.BernoulliNB), "digits"
    ),
    "pca_logistic": Case(
        pipe(scaled, lambda: decomposition.PCA(5), linear_model.LogisticRegression), "digits"
    ),
    "polynomial_features": Case(
        pipe(lambda: preprocessing.PolynomialFeatures(2), linear_model.Ridge),
        "diabetes",
        classifier=False,
    ),
    "kbins_discretizer": Case(
        pipe(
            lambda: preprocessing.KBinsDiscretizer(4, encode="onehot-dense"),
            linear_model.LogisticRegression,
        ),
        "iris",
    ),
    "simple_imputer": Case(
        pipe(impute.SimpleImputer, tree.DecisionTreeClassifier), "cancer", prepare=with_missing
    ),
    "simple_imputer_constant": Case(
        pipe(
            lambda: impute.SimpleImputer(strategy="constant", fill_value=0.0),
            linear_model.Ridge,
        ),
        "diabetes",
        classifier=False,
        prepare=with_missing,
    ),
    "one_hot_encoder": Case(
        pipe(
            lambda: compose.ColumnTransformer(
                [
                    ("num", preprocessing.StandardScaler(), [0, 1, 2, 3]),
                    ("cat", preprocessing.OneHotEncoder(handle_unknown="ignore"), [4, 5]),
                ]
            ),
            linear_model.LogisticRegression,
        ),
        "iris",
        prepare=categorical,
    ),
    "column_transformer_imputer_scaler": Case(
        pipe(
            lambda: compose.ColumnTransformer(
                [
                    ("a", pipeline.make_pipeline(impute.SimpleImputer(), scaled()), [0, 1, 2]),
                    ("b", preprocessing.MinMaxScaler(), [3, 4, 5, 6]),
                ],
                remainder="passthrough",
            ),
            lambda: ensemble.RandomForestRegressor(n_estimators=10, max_depth=6, **SEED),
        ),
        "diabetes",
        classifier=False,
        prepare=with_missing,
    ),
    "feature_union": Case(
        pipe(
            lambda: pipeline.FeatureUnion(
                [("pca", decomposition.PCA(2)), ("scale", preprocessing.StandardScaler())]
            ),
            linear_model.LogisticRegression,
        ),
        "iris",
    ),
    "k_means": Case(lambda: cluster.KMeans(3, n_init=3, **SEED), "iris", classifier=False),
    # text
    "tfidf_logistic": Case(
        pipe(feature_extraction.text.TfidfVectorizer, linear_model.LogisticRegression), "text"
    ),
    "count_vectorizer_nb": Case(
        pipe(
            lambda: feature_extraction.text.CountVectorizer(ngram_range=(1, 2)),
            naive_bayes.MultinomialNB,
        ),
        "text",
    ),
    # ensembles of estimators
    "voting_soft": Case(
        lambda: ensemble.VotingClassifier(
            [
                ("lr", pipeline.make_pipeline(scaled(), linear_model.LogisticRegression())),
                ("dt", tree.DecisionTreeClassifier(max_depth=4, **SEED)),
                ("nb", naive_bayes.GaussianNB()),
            ],
            voting="soft",
            flatten_transform=False,
        ),
        "iris",
    ),
    "voting_hard": Case(
        lambda: ensemble.VotingClassifier(
            [
                ("lr", pipeline.make_pipeline(scaled(), linear_model.LogisticRegression())),
                ("dt", tree.DecisionTreeClassifier(max_depth=4, **SEED)),
                ("nb", naive_bayes.GaussianNB()),
            ],
            voting="hard",
            flatten_transform=False,
        ),
        "iris",
    ),
    "voting_regressor": Case(
        lambda: ensemble.VotingRegressor(
            [
                ("lr", linear_model.LinearRegression()),
                ("dt", tree.DecisionTreeRegressor(max_depth=5, **SEED)),
            ]
        ),
        "diabetes",
        classifier=False,
    ),
    "stacking_classifier": Case(
        lambda: ensemble.StackingClassifier(
            [
                ("lr", pipeline.make_pipeline(scaled(), linear_model.LogisticRegression())),
                ("rf", ensemble.RandomForestClassifier(n_estimators=10, max_depth=4, **SEED)),
            ],
            final_estimator=linear_model.LogisticRegression(),
        ),
        "iris",
        slow=True,
    ),
    "stacking_regressor": Case(
        lambda: ensemble.StackingRegressor(
            [
                ("ridge", linear_model.Ridge()),
                ("dt", tree.DecisionTreeRegressor(max_depth=4, **SEED)),
            ],
            final_estimator=linear_model.LinearRegression(),
        ),
        "diabetes",
        classifier=False,
    ),
    "one_vs_rest": Case(
        lambda: multiclass.OneVsRestClassifier(
            pipeline.make_pipeline(scaled(), linear_model.LogisticRegression())
        ),
        "iris",
    ),
    "calibrated_classifier": Case(
        lambda: calibration.CalibratedClassifierCV(
            pipeline.make_pipeline(scaled(), linear_model.LogisticRegression()), cv=3
        ),
        "cancer",
    ),
}


# -- conversion and running ----------------------------------------------------------------------
@functools.cache
def trained(name: str) -> tuple[Any, np.ndarray]:
    """The fitted estimator of a case and the rows it is evaluated on."""
    case = CASES[name]
    if case.dataset == "text":
        x, y = text_data()
        fit_x = x.ravel()
    else:
        x, y = data(case.dataset)
        if case.prepare is not None:
            x = case.prepare(x)
        fit_x = x
    model = case.make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(fit_x, y)
    step = max(1, len(x) // 60)
    return model, x[::step]


def _final(model: Any) -> Any:
    """The estimator whose output the zipmap option changes (a pipeline's last step)."""
    return model.steps[-1][1] if isinstance(model, pipeline.Pipeline) else model


@functools.cache
def converted(name: str, zipmap: bool) -> bytes:
    """The case's model as skl2onnx converts it (bytes), with or without ZipMap."""
    model, x = trained(name)
    options: dict[Any, Any] = {} if zipmap else {id(_final(model)): {"zipmap": False}}
    target = {"": 17, "ai.onnx.ml": 3} if name in ML_3_CASES else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if x.dtype == object:
            # ORT's StringNormalizer builds the locale it is given (default en_US.UTF-8,
            # often not installed); C.UTF-8 exists everywhere
            options[id(model.steps[0][1])] = {"locale": "C.UTF-8"}
            onx = convert_sklearn(
                model, initial_types=[("text", StringTensorType([None, 1]))], options=options
            )
        else:
            onx = to_onnx(model, x[:1], options=options or None, target_opset=target)
    return onx.SerializeToString()


def run_both(model: bytes, feeds: dict[str, Any]) -> tuple[Any, Any, list[Any], list[Any]]:
    """(nxrt session, ORT session, nxrt outputs, ORT outputs)."""
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    session = nxrt.InferenceSession(model, providers=["cpu"])
    return session, reference, session.run(None, feeds), reference.run(None, feeds)


def assert_same(got: Any, want: Any, where: str) -> None:
    """ORT's result and nxrt's agree: equal labels, close scores, equal dict keys."""
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert isinstance(g, dict) and list(g) == list(w), f"{where}[{i}] keys"
            np.testing.assert_allclose(
                list(g.values()), list(w.values()), rtol=RTOL, atol=ATOL, err_msg=f"{where}[{i}]"
            )
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "fc":
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=where)
    else:
        assert got.dtype.kind == want.dtype.kind, f"{where}: dtype {got.dtype} != {want.dtype}"
        if want.dtype == object:  # strings: str objects, as ONNX Runtime returns them
            kinds = {type(v) for v in got.flat}, {type(v) for v in want.flat}
            assert kinds[0] <= kinds[1] or not got.size, f"{where}: elements {kinds}"
        np.testing.assert_array_equal(got, want, err_msg=where)


def check_model(model: bytes, feeds: dict[str, Any]) -> None:
    session, reference, got, want = run_both(model, feeds)
    assert [(a.name, a.type) for a in session.get_inputs()] == [
        (a.name, a.type) for a in reference.get_inputs()
    ]
    assert [(a.name, a.type) for a in session.get_outputs()] == [
        (a.name, a.type) for a in reference.get_outputs()
    ]
    for arg, g, w in zip(reference.get_outputs(), got, want):
        assert_same(g, w, arg.name)


def _params() -> list[Any]:
    params = []
    for name, case in CASES.items():
        marks = [pytest.mark.slow] if case.slow else []
        params.append(pytest.param(name, True, id=name, marks=marks))
        if case.classifier:
            params.append(pytest.param(name, False, id=f"{name}-no_zipmap", marks=marks))
    return params


@pytest.mark.parametrize(("name", "zipmap"), _params())
def test_converted_model_matches_onnxruntime(name: str, zipmap: bool) -> None:
    model, x = trained(name)
    onx = converted(name, zipmap)
    feed_name = "text" if x.dtype == object else "X"
    check_model(onx, {feed_name: x})


def test_there_are_forty_estimators_and_pipelines() -> None:
    assert len(CASES) >= 40


def test_zipmap_output_is_a_list_of_dicts_typed_like_onnxruntime() -> None:
    onx = converted("logistic_regression_iris", True)
    session = nxrt.InferenceSession(onx, providers=["cpu"])
    outputs = {a.name: a.type for a in session.get_outputs()}
    assert outputs == {
        "output_label": "tensor(int64)",
        "output_probability": "seq(map(int64,tensor(float)))",
    }
    _, x = trained("logistic_regression_iris")
    labels, probabilities = session.run(None, {"X": x[:3]})
    assert isinstance(probabilities, list) and len(probabilities) == 3
    assert sorted(probabilities[0]) == [0, 1, 2]
    assert all(isinstance(k, int) and isinstance(v, float) for k, v in probabilities[0].items())


def test_string_labels_go_through_zipmap_with_string_keys() -> None:
    x, y = data("iris")
    names = np.array(["setosa", "versicolor", "virginica"], dtype=object)[y]
    model = tree.DecisionTreeClassifier(max_depth=3, **SEED).fit(x, names)
    onx = to_onnx(model, x[:1]).SerializeToString()
    check_model(onx, {"X": x[::5]})
    session = nxrt.InferenceSession(onx, providers=["cpu"])
    assert session.get_outputs()[1].type == "seq(map(string,tensor(float)))"


def test_dict_vectorizer_takes_a_map_input() -> None:
    rows = [{"a": 1.0, "b": 2.0}, {"a": 3.0, "c": 1.0}, {"b": 0.5, "c": 4.0}, {"a": 2.0}] * 5
    labels = [0, 1, 1, 0] * 5
    model = pipeline.make_pipeline(
        feature_extraction.DictVectorizer(sparse=False), linear_model.LogisticRegression()
    ).fit(rows, labels)
    onx = convert_sklearn(
        model, initial_types=[("d", DictionaryType(StringTensorType([1]), FloatTensorType([1])))]
    ).SerializeToString()
    session = nxrt.InferenceSession(onx, providers=["cpu"])
    reference = ort.InferenceSession(onx, providers=["CPUExecutionProvider"])
    assert (
        session.get_inputs()[0].type
        == reference.get_inputs()[0].type
        == "map(string,tensor(float))"
    )
    for row in rows[:4]:
        for g, w, arg in zip(
            session.run(None, {"d": row}), reference.run(None, {"d": row}), reference.get_outputs()
        ):
            assert_same(g, w, arg.name)
    with pytest.raises(nxrt.errors.InvalidArgument, match="map"):
        session.run(None, {"d": [1.0, 2.0]})


def test_int_keyed_dict_vectorizer() -> None:
    rows = [{1: 1.0, 5: 2.0}, {2: 3.0}, {1: 0.5, 2: 4.0, 5: 1.0}] * 4
    labels = [0, 1, 1] * 4
    model = pipeline.make_pipeline(
        feature_extraction.DictVectorizer(sparse=False), tree.DecisionTreeClassifier()
    ).fit(rows, labels)
    onx = convert_sklearn(
        model, initial_types=[("d", DictionaryType(Int64TensorType([1]), FloatTensorType([1])))]
    ).SerializeToString()
    for row in rows[:3]:
        check_model(onx, {"d": row})


def test_label_encoder_and_string_categories() -> None:
    x, y = data("iris")
    colors = np.array(["red", "green", "blue", "green"], dtype=object)[np.arange(len(x)) % 4]
    encoder = preprocessing.OneHotEncoder().fit(colors.reshape(-1, 1))
    onx = convert_sklearn(
        encoder, initial_types=[("X", StringTensorType([None, 1]))]
    ).SerializeToString()
    check_model(onx, {"X": colors.reshape(-1, 1)[:12]})
    labels = preprocessing.LabelEncoder().fit(colors)
    onx = convert_sklearn(
        labels, initial_types=[("X", StringTensorType([None]))]
    ).SerializeToString()
    check_model(onx, {"X": colors[:12]})


def test_every_node_no_ep_can_run_is_named_at_once() -> None:
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Frobnicate", ["x"], ["a"], domain="com.example", name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="fine"),
        helper.make_node("Twiddle", ["b"], ["c"], domain="com.example", name="second"),
        helper.make_node("Frobnicate", ["c"], ["y"], domain="com.example", name="third"),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(nxrt.errors.NoEpForOp, match="com.example::Frobnicate at opset 1") as info:
        nxrt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    error = info.value
    assert isinstance(error, nxrt.errors.NoEpForNodes)
    assert (error.domain, error.op_type, error.opset) == ("com.example", "Frobnicate", 1)
    assert [n[0] for n in error.nodes] == ["first", "second", "third"]
    message = str(error)
    assert "3 nodes no EP can run" in message
    assert "com.example::Frobnicate(1), com.example::Twiddle(1)" in message
    assert "'second' com.example::Twiddle at opset 1: cpu: Twiddle is not implemented" in message


@pytest.mark.parametrize(
    "name", ["column_transformer_imputer_scaler", "one_hot_encoder", "voting_soft"]
)
def test_values_shape_inference_leaves_untyped_get_their_schema_types(name: str) -> None:
    """Scaler, Imputer, Normalizer and the tree ensembles have no ONNX inference function;
    their outputs (and what follows them, such as ColumnTransformer's Concat) are typed
    from the schemas, so an EP compiling claims can check what enters them."""
    from nxrt.pipeline.model import load_model

    model, _ = load_model(converted(name, True))
    untyped = [v.name for node in model.graph for v in node.outputs if v.name and v.type is None]
    assert not untyped
    _, x = trained(name)
    session, reference, got, want = run_both(converted(name, True), {"X": x})
    legacy = nxrt.InferenceSession(converted(name, True), providers=["legacy_abi", "cpu"])
    for arg, g, w in zip(reference.get_outputs(), legacy.run(None, {"X": x}), want):
        assert_same(g, w, arg.name)
    placement = {p.op_type: p.ep for p in legacy.get_partition().nodes}
    if CASES[name].classifier:
        assert placement["ZipMap"] == "cpu"  # a map cannot cross a claim's boundary


# -- single ops against ONNX Runtime, on ensembles no converter writes ---------------------------
def random_trees(rng: np.random.Generator, trees: int, features: int, modes: list[str]):
    """Node attributes of ``trees`` random binary trees (depth <= 4) and their leaves."""
    attrs: dict[str, list] = {
        k: []
        for k in (
            "nodes_treeids nodes_nodeids nodes_featureids nodes_values nodes_modes "
            "nodes_truenodeids nodes_falsenodeids nodes_missing_value_tracks_true".split()
        )
    }
    leaves = []
    for tree_id in range(trees):
        count = 0

        def grow(depth: int, tree_id: int = tree_id) -> int:
            nonlocal count
            node = count
            count += 1
            row = {"nodes_treeids": tree_id, "nodes_nodeids": node}
            if depth >= 4 or (depth > 0 and rng.random() < 0.3):
                row.update(nodes_featureids=0, nodes_values=0.0, nodes_modes="LEAF")
                row.update(nodes_truenodeids=0, nodes_falsenodeids=0)
                row["nodes_missing_value_tracks_true"] = 0
                for key, value in row.items():
                    attrs[key].append(value)
                leaves.append((tree_id, node))
                return node
            index = len(attrs["nodes_treeids"])
            for key in attrs:
                attrs[key].append(None)
            true, false = grow(depth + 1, tree_id), grow(depth + 1, tree_id)
            row.update(
                nodes_featureids=int(rng.integers(features)),
                nodes_values=float(np.float32(rng.normal())),
                nodes_modes=str(rng.choice(modes)),
                nodes_truenodeids=true,
                nodes_falsenodeids=false,
                nodes_missing_value_tracks_true=int(rng.random() < 0.5),
            )
            for key, value in row.items():
                attrs[key][index] = value
            return node

        grow(0)
    return attrs, leaves


def single_node_model(op: str, attrs: dict[str, Any], outputs: list[tuple[str, int]], opset: int):
    from onnx import TensorProto, helper

    node = helper.make_node(op, ["X"], [name for name, _ in outputs], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info(name, kind, None) for name, kind in outputs],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", opset)]
    )
    model.ir_version = 8
    return model.SerializeToString()


ENSEMBLE_SEEDS = range(12)
LAYOUTS = [(2, True), (2, False), (3, False)]  # (classes, only the second class weighted)
POSTS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"]


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=["binary_one_class", "binary", "multiclass"])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_tree_classifiers_match_onnxruntime(seed: int, layout, post: str) -> None:
    """Binary and multiclass, one or both classes weighted, signed or positive weights,
    0-2 base values, each transform, every branch mode, NaN and missing-value tracking."""
    from onnx import TensorProto

    rng = np.random.default_rng(seed + 10 * POSTS.index(post) + 100 * LAYOUTS.index(layout))
    classes, one_class = layout
    modes = (
        ["BRANCH_LEQ"]
        if seed == 0
        else list(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"])
    )
    attrs, leaves = random_trees(rng, int(rng.integers(1, 8)), 5, modes)
    class_ids, class_nodes, class_trees, weights = [], [], [], []
    for tree_id, node in leaves:
        for c in [1 - seed % 2] if one_class else range(classes):
            class_trees.append(tree_id)
            class_nodes.append(node)
            class_ids.append(c)
            w = rng.random() if seed == 0 else rng.normal()
            weights.append(float(np.float32(w)))
    attrs.update(
        class_ids=class_ids,
        class_nodeids=class_nodes,
        class_treeids=class_trees,
        class_weights=weights,
        classlabels_int64s=list(range(10, 10 + classes)),
        post_transform=post,
    )
    bases = int(rng.integers(3)) if classes == 2 else int(rng.integers(2)) * classes
    if bases:
        attrs["base_values"] = [float(np.float32(v)) for v in rng.normal(size=bases)]
    x = rng.normal(size=(40, 5)).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    x[::7, 0] = attrs["nodes_values"][0]  # hits the first split exactly (EQ / NEQ / LEQ)
    outputs = [("Y", TensorProto.INT64), ("Z", TensorProto.FLOAT)]
    for opset in (1, 3):
        model = single_node_model("TreeEnsembleClassifier", attrs, outputs, opset)
        _, _, got, want = run_both(model, {"X": x})
        assert_same(got[0], want[0], "labels")
        assert_same(got[1], want[1], "scores")


@pytest.mark.parametrize("seed", ENSEMBLE_SEEDS)
def test_random_tree_regressors_match_onnxruntime(seed: int) -> None:
    from onnx import TensorProto

    rng = np.random.default_rng(100 + seed)
    targets = [1, 3][seed % 2]
    modes = ["BRANCH_LT"] if seed % 3 == 0 else ["BRANCH_LEQ", "BRANCH_GT", "BRANCH_NEQ"]
    attrs, leaves = random_trees(rng, int(rng.integers(1, 8)), 4, modes)
    ids, nodes, trees, weights = [], [], [], []
    for tree_id, node in leaves:
        for t in range(targets):
            trees.append(tree_id)
            nodes.append(node)
            ids.append(t)
            weights.append(float(np.float32(rng.normal())))
    attrs.update(
        target_ids=ids,
        target_nodeids=nodes,
        target_treeids=trees,
        target_weights=weights,
        n_targets=targets,
        aggregate_function=["SUM", "AVERAGE", "MIN", "MAX"][seed % 4],
        post_transform="NONE" if targets == 1 else ["NONE", "SOFTMAX", "LOGISTIC"][seed % 3],
    )
    if seed % 3:
        attrs["base_values"] = [float(np.float32(v)) for v in rng.normal(size=targets)]
    x = rng.normal(size=(50, 4)).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    for opset in (1, 3):
        model = single_node_model("TreeEnsembleRegressor", attrs, [("Y", TensorProto.FLOAT)], opset)
        _, _, got, want = run_both(model, {"X": x})
        assert_same(got[0], want[0], "scores")


MIXED = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


@pytest.mark.parametrize(
    ("modes", "tracks", "uniform"),
    [
        (["BRANCH_LEQ"], False, 0),
        (["BRANCH_LT"], False, 1),
        (["BRANCH_LEQ"], True, 2),
        (["BRANCH_LT"], True, 3),
        (MIXED, True, -1),
    ],
    ids=["leq", "lt", "leq_missing", "lt_missing", "mixed"],
)
def test_compiled_walk_agrees_with_the_numpy_reference(modes, tracks, uniform) -> None:
    from nxrt_ep_cpu.ops import ml_tree_walk
    from nxrt_ep_cpu.ops.ml_trees import RegressorPlan

    rng = np.random.default_rng(7)
    attrs, leaves = random_trees(rng, 20, 6, modes)
    if not tracks:
        attrs["nodes_missing_value_tracks_true"] = [0] * len(attrs["nodes_modes"])
    plan = RegressorPlan(
        **attrs,
        target_ids=[0] * len(leaves),
        target_nodeids=[n for _, n in leaves],
        target_treeids=[t for t, _ in leaves],
        target_weights=list(rng.normal(size=len(leaves))),
        n_targets=1,
    )
    x = rng.normal(size=(700, 6))
    x[rng.random(x.shape) < 0.1] = np.nan
    assert ml_tree_walk._compiled() is not None, "numba is a dependency of nxrt-ep-cpu"
    assert plan.forest.packed[2] == uniform
    compiled = ml_tree_walk.leaf_scores(plan.forest, x, extremes=True)
    reference = ml_tree_walk.aggregate_numpy(
        plan.forest, ml_tree_walk.walk_numpy(plan.forest, x), False
    )
    for a, b in zip(compiled, reference):
        np.testing.assert_array_equal(a, b)


def op_model(op: str, inputs, outputs, attrs: dict[str, Any], domain: str = "ai.onnx.ml") -> bytes:
    """A one-node model; ``inputs`` and ``outputs`` are (name, elem type, shape) triples."""
    from onnx import helper

    node = helper.make_node(op, [n for n, _, _ in inputs], [n for n, _, _ in outputs], **attrs)
    node.domain = domain
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    if domain not in ("", "ai.onnx.ml"):
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString()


def _ops_cases() -> list[Any]:
    from onnx import TensorProto as T

    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 4)).astype(np.float32)
    x[0, 1] = 0.0
    xi = rng.integers(-2, 5, size=(6, 4)).astype(np.int64)
    xs = np.array([["a", "b"], ["c", "zz"], ["b", "a"]], dtype=object)
    f, i64, s = T.FLOAT, T.INT64, T.STRING
    coef = [float(v) for v in rng.normal(size=12)]
    kernel = [0.1, 0.0, 2.0]
    one = [("X", f, None)]
    scores = [("Y", i64, None), ("Z", f, None)]
    nan_x = np.where(x > 1, np.nan, x).astype(np.float32)
    cases = [
        (
            "scaler",
            "Scaler",
            one,
            [("Y", f, None)],
            {"offset": [0.5, 0.0, 1.0, 2.0], "scale": [1.0, 2.0, -1.0, 0.5]},
            x,
        ),
        (
            "scaler_int",
            "Scaler",
            [("X", i64, None)],
            [("Y", f, None)],
            {"offset": [1.0, 0.0, 2.0, 3.0], "scale": [0.5, 1.0, 2.0, 4.0]},
            xi,
        ),
        ("normalizer_max", "Normalizer", one, [("Y", f, None)], {"norm": "MAX"}, x),
        ("normalizer_l1", "Normalizer", one, [("Y", f, None)], {"norm": "L1"}, x),
        (
            "normalizer_l2_int",
            "Normalizer",
            [("X", i64, None)],
            [("Y", f, None)],
            {"norm": "L2"},
            xi,
        ),
        (
            "imputer_nan",
            "Imputer",
            one,
            [("Y", f, None)],
            {"imputed_value_floats": [1.0, 2.0, 3.0, 4.0], "replaced_value_float": float("nan")},
            nan_x,
        ),
        (
            "imputer_int",
            "Imputer",
            [("X", i64, None)],
            [("Y", i64, None)],
            {"imputed_value_int64s": [9], "replaced_value_int64": 0},
            xi,
        ),
        (
            "one_hot_int",
            "OneHotEncoder",
            [("X", i64, None)],
            [("Y", f, None)],
            {"cats_int64s": [0, 1, 3, 4]},
            xi,
        ),
        ("one_hot_float", "OneHotEncoder", one, [("Y", f, None)], {"cats_int64s": [0, 1, -1]}, x),
        (
            "one_hot_strings",
            "OneHotEncoder",
            [("X", s, None)],
            [("Y", f, None)],
            {"cats_strings": ["a", "b", "c"]},
            xs,
        ),
        (
            "category_to_int",
            "CategoryMapper",
            [("X", s, None)],
            [("Y", i64, None)],
            {"cats_strings": ["a", "b"], "cats_int64s": [5, 7], "default_int64": -3},
            xs,
        ),
        (
            "category_to_string",
            "CategoryMapper",
            [("X", i64, None)],
            [("Y", s, None)],
            {"cats_strings": ["a", "b"], "cats_int64s": [1, 3], "default_string": "?"},
            xi,
        ),
        ("binarizer", "Binarizer", one, [("Y", f, None)], {"threshold": 0.2}, x),
        (
            "linear_classifier_multi",
            "LinearClassifier",
            one,
            scores,
            {
                "coefficients": coef,
                "intercepts": [0.1, -0.2, 0.3],
                "classlabels_ints": [4, 5, 6],
                "post_transform": "SOFTMAX",
            },
            x,
        ),
        (
            "linear_classifier_binary_one_row",
            "LinearClassifier",
            one,
            [("Y", s, None), ("Z", f, None)],
            {
                "coefficients": coef[:4],
                "intercepts": [0.1],
                "classlabels_strings": ["no", "yes"],
                "post_transform": "LOGISTIC",
            },
            x,
        ),
        (
            "linear_classifier_binary_raw",
            "LinearClassifier",
            one,
            scores,
            {"coefficients": coef[:4], "intercepts": [0.1], "classlabels_ints": [2, 9]},
            x,
        ),
        (
            "linear_regressor_targets",
            "LinearRegressor",
            one,
            [("Y", f, None)],
            {"coefficients": coef[:8], "intercepts": [1.0, -1.0], "targets": 2},
            x,
        ),
        (
            "svm_linear_mode",
            "SVMClassifier",
            one,
            scores,
            {
                "coefficients": coef,
                "rho": [0.5],
                "classlabels_ints": [0, 1, 2],
                "kernel_type": "LINEAR",
                "kernel_params": kernel,
            },
            x,
        ),
        (
            "svm_binary_logistic",
            "SVMClassifier",
            one,
            scores,
            {
                "coefficients": [1.0, -1.0, 0.5],
                "support_vectors": coef,
                "vectors_per_class": [2, 1],
                "rho": [0.2],
                "classlabels_ints": [0, 1],
                "kernel_type": "RBF",
                "kernel_params": [0.3, 0.0, 3.0],
                "post_transform": "LOGISTIC",
            },
            x,
        ),
        (
            "svm_regressor_linear",
            "SVMRegressor",
            one,
            [("Y", f, None)],
            {"coefficients": coef[:4], "rho": [0.25], "kernel_params": kernel},
            x,
        ),
        (
            "svm_regressor_one_class",
            "SVMRegressor",
            one,
            [("Y", f, None)],
            {
                "coefficients": [1.0, -1.0],
                "support_vectors": coef[:8],
                "n_supports": 2,
                "rho": [0.1],
                "kernel_type": "RBF",
                "kernel_params": [0.5, 0.0, 3.0],
                "one_class": 1,
            },
            x,
        ),
        (
            "feature_vectorizer",
            "FeatureVectorizer",
            [("A", f, None), ("B", f, None)],
            [("Y", f, None)],
            {"inputdimensions": [3, 5]},
            (x, x[:, :2].copy()),
        ),
        (
            "array_feature_extractor",
            "ArrayFeatureExtractor",
            [("X", f, None), ("I", i64, None)],
            [("Y", f, None)],
            {},
            (x, np.array([3, 0], dtype=np.int64)),
        ),
        (
            "label_encoder",
            "LabelEncoder",
            [("X", s, None)],
            [("Y", i64, None)],
            {"keys_strings": ["a", "b", "c"], "values_int64s": [1, 2, 3], "default_int64": 0},
            xs,
        ),
        (
            "zip_map_strings",
            "ZipMap",
            one,
            [("Z", None, None)],
            {"classlabels_strings": ["w", "x", "y", "z"]},
            x,
        ),
    ]
    return cases


@pytest.mark.parametrize(
    ("op", "inputs", "outputs", "attrs", "feed"),
    [pytest.param(*case[1:], id=case[0]) for case in _ops_cases()],
)
def test_single_ml_op_matches_onnxruntime(op, inputs, outputs, attrs, feed) -> None:
    from onnx import TensorProto, helper

    if op == "ZipMap":
        model = helper.make_model(
            helper.make_graph(
                [helper.make_node(op, ["X"], ["Z"], domain="ai.onnx.ml", **attrs)],
                "g",
                [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
                [
                    helper.make_value_info(
                        "Z",
                        helper.make_sequence_type_proto(
                            helper.make_map_type_proto(
                                TensorProto.STRING,
                                helper.make_tensor_type_proto(TensorProto.FLOAT, None),
                            )
                        ),
                    )
                ],
            ),
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)],
        )
        model.ir_version = 8
        onx = model.SerializeToString()
    else:
        onx = op_model(op, inputs, outputs, attrs)
    feeds = dict(zip([n for n, _, _ in inputs], feed if isinstance(feed, tuple) else (feed,)))
    check_model(onx, feeds)


@pytest.mark.parametrize(
    "attrs",
    [
        {"mark": 0, "mincharnum": 1, "pad_value": "#", "tokenexp": "[a-zA-Z0-9_]+"},
        {"mark": 1, "mincharnum": 2, "pad_value": "#", "tokenexp": "[a-z]+"},
        {"mark": 0, "mincharnum": 1, "pad_value": "", "separators": [" ", ","]},
        {"mark": 1, "mincharnum": 1, "pad_value": "_", "separators": [""]},
        {"mark": 0, "mincharnum": 3, "pad_value": "0", "separators": ["[.,;] ?", " "]},
    ],
    ids=["tokenexp", "tokenexp_marked_min2", "separators", "characters_marked", "regex_separators"],
)
def test_tokenizer_matches_onnxruntime(attrs: dict[str, Any]) -> None:
    from onnx import TensorProto

    texts = np.array(
        [["the cat, sat", "on a mat."], ["dogs; ran far", ""], ["x", "a bb ccc dddd"]],
        dtype=object,
    )
    onx = op_model(
        "Tokenizer",
        [("X", TensorProto.STRING, None)],
        [("Y", TensorProto.STRING, None)],
        attrs,
        domain="com.microsoft",
    )
    check_model(onx, {"X": texts})


def test_cast_map_matches_onnxruntime() -> None:
    from onnx import TensorProto, helper

    # ONNX Runtime's Python API cannot feed a map(int64, string): float maps only
    for value_type, cast_to, form in [
        (TensorProto.FLOAT, "TO_FLOAT", "DENSE"),
        (TensorProto.FLOAT, "TO_INT64", "SPARSE"),
        (TensorProto.FLOAT, "TO_STRING", "DENSE"),
        (TensorProto.FLOAT, "TO_FLOAT", "SPARSE"),
    ]:
        out = {"TO_FLOAT": TensorProto.FLOAT, "TO_INT64": TensorProto.INT64}.get(
            cast_to, TensorProto.STRING
        )
        map_type = helper.make_map_type_proto(
            TensorProto.INT64, helper.make_tensor_type_proto(value_type, None)
        )
        node = helper.make_node(
            "CastMap", ["X"], ["Y"], domain="ai.onnx.ml", cast_to=cast_to, map_form=form, max_map=5
        )
        model = helper.make_model(
            helper.make_graph(
                [node],
                "g",
                [helper.make_value_info("X", map_type)],
                [helper.make_tensor_value_info("Y", out, None)],
            ),
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)],
        )
        model.ir_version = 8
        values = (
            {3: 2.5, 0: -1.0, 1: 7.0} if value_type == TensorProto.FLOAT else {3: "2.5", 1: "7"}
        )
        check_model(model.SerializeToString(), {"X": values})


# -- decision_path / decision_leaf ----------------------------------------------------------------
#: Tree models skl2onnx converts with ``decision_path`` (a LabelEncoder with string outputs
#: after a TreeEnsembleRegressor) and ``decision_leaf``: onnx 1.23's shape inference crashes
#: the process on every ``decision_path`` model (nxrt contains it, :mod:`nxrt.pipeline.contained`).
DECISION_TREES = {
    "decision_tree_classifier": (tree.DecisionTreeClassifier, "iris"),
    "decision_tree_regressor": (tree.DecisionTreeRegressor, "diabetes"),
    "extra_tree_classifier": (tree.ExtraTreeClassifier, "iris"),
    "extra_tree_regressor": (tree.ExtraTreeRegressor, "diabetes"),
    "extra_trees_classifier": (ensemble.ExtraTreesClassifier, "iris"),
    "extra_trees_regressor": (ensemble.ExtraTreesRegressor, "diabetes"),
}
DECISION_OPTIONS = {
    "path": {"decision_path": True},
    "leaf": {"decision_leaf": True},
    "path_and_leaf": {"decision_path": True, "decision_leaf": True},
}


def decision_model(name: str, option: str) -> tuple[bytes, np.ndarray, Any]:
    """A tree model of :data:`DECISION_TREES` converted with a :data:`DECISION_OPTIONS` entry
    (the model bytes, rows to evaluate, the fitted estimator)."""
    kind, dataset = DECISION_TREES[name]
    x, y = data(dataset)
    extra = {"n_estimators": 3} if issubclass(kind, ensemble.BaseEnsemble) else {}
    model = kind(max_depth=3, random_state=0, **extra).fit(x, y)
    options = dict(DECISION_OPTIONS[option])
    if hasattr(model, "predict_proba"):
        options["zipmap"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = to_onnx(model, x[:1], options={id(model): options}, target_opset=18)
    return onx.SerializeToString(), x[::7], model


@pytest.mark.parametrize("option", list(DECISION_OPTIONS))
@pytest.mark.parametrize("name", list(DECISION_TREES))
def test_decision_path_and_leaf_match_onnxruntime(name: str, option: str) -> None:
    """Labels, probabilities (or predictions), the decision-path strings and the leaf
    indices, as ONNX Runtime gives them; the path strings are scikit-learn's too."""
    onx, x, model = decision_model(name, option)
    session, reference, got, want = run_both(onx, {"X": x})
    outputs = [arg.name for arg in reference.get_outputs()]
    assert [(a.name, a.type) for a in session.get_outputs()] == [
        (a.name, a.type) for a in reference.get_outputs()
    ]
    for where, g, w in zip(outputs, got, want):
        assert_same(g, w, where)
    if "decision_path" in outputs:
        paths = got[outputs.index("decision_path")]
        assert paths.dtype == object and isinstance(paths.flat[0], str)
        estimators = getattr(model, "estimators_", [model])
        for column, estimator in enumerate(estimators):
            nodes = estimator.decision_path(x).toarray()
            expected = ["".join(str(v) for v in row) for row in nodes]
            assert list(paths[:, column]) == expected, f"{name}: tree {column}'s paths"


# -- contrib ops, model-local functions, string labels, map feeds, sparse initializers --------
CDIST = {"optim": "cdist"}
IRIS_NAMES = np.array(["setosa", "versicolor", "virginica"], dtype=object)


def _fitted(make: Callable[[], Any], x: np.ndarray, y: Any = None) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make().fit(x, y) if y is not None else make().fit(x)


def _convert(model: Any, x: np.ndarray, options: dict | None = None, opset: int = 18) -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = {id(model): options} if options else None
        return to_onnx(model, x[:1], options=options, target_opset=opset).SerializeToString()


def _imputer_data() -> np.ndarray:
    """Random rows with about a tenth missing: no exact ties between neighbours, whose
    order float32 rounding would decide (iris has identical rows)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((60, 5)).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    return x


def _random_rows() -> np.ndarray:
    return np.random.default_rng(2).standard_normal((60, 4)).astype(np.float32)


def _cdist_cases() -> dict[str, Callable[[], tuple[bytes, np.ndarray]]]:
    """Estimators skl2onnx converts to com.microsoft::CDist with ``optim: cdist``."""
    x, y = data("iris")
    x64 = x.astype(np.float64)
    target = x[:, 0]

    def case(make, fit_x, fit_y=None, options=CDIST, feed=None):
        def build() -> tuple[bytes, np.ndarray]:
            model = _fitted(make, fit_x, fit_y)
            return _convert(model, fit_x, options), (fit_x if feed is None else feed)[::4]

        return build

    return {
        "knn_classifier": case(lambda: neighbors.KNeighborsClassifier(3), x, y),
        "knn_classifier_string_labels": case(
            lambda: neighbors.KNeighborsClassifier(3), x, IRIS_NAMES[y]
        ),
        "knn_regressor": case(lambda: neighbors.KNeighborsRegressor(3), x, target),
        "knn_regressor_double": case(lambda: neighbors.KNeighborsRegressor(3), x64, target),
        # a radius past every distance: skl2onnx's -1 for a missing neighbour makes both
        # runtimes refuse the model's ArrayFeatureExtractor
        "radius_classifier": case(lambda: neighbors.RadiusNeighborsClassifier(20.0), x, y),
        "radius_regressor": case(lambda: neighbors.RadiusNeighborsRegressor(20.0), x, target),
        "gaussian_process_double": case(gaussian_process.GaussianProcessRegressor, x64, target),
        "kernel_pca": case(lambda: decomposition.KernelPCA(2, kernel="rbf"), x),
        # random rows: iris repeats rows, and neighbours at equal distances are ordered by
        # how each runtime's GEMM rounds
        "local_outlier_factor": case(
            lambda: neighbors.LocalOutlierFactor(novelty=True), _random_rows()
        ),
    }


CDIST_CASES = _cdist_cases()


@pytest.mark.parametrize("name", list(CDIST_CASES))
def test_cdist_conversions_match_onnxruntime(name: str) -> None:
    """skl2onnx's cdist path: com.microsoft::CDist, summed in ONNX Runtime's order, so the
    neighbours found (and their ties) are the same."""
    onx, x = CDIST_CASES[name]()
    assert b"CDist" in onx
    check_model(onx, {"X": x})


def test_knn_imputer_expands_its_model_local_functions() -> None:
    """KNNImputer's conversion defines ``local_domain::dict_idx_map`` and seven more
    functions (at opsets 14 to 18 in an opset-18 model): expanded, not refused."""
    x = _imputer_data()
    onx = _convert(_fitted(lambda: impute.KNNImputer(n_neighbors=3), x), x)
    assert {f.name for f in onnx.load_from_string(onx).functions} >= {"dict_idx_map"}
    check_model(onx, {"X": x[::3]})


def _function_model(function_opset: int, op: str = "Add"):
    """A model calling a local function ``my::twice(x) = LeakyRelu(op(x, x), alpha)`` (an
    attribute reference), the function at ``function_opset`` of ai.onnx, the model at 18."""
    from onnx import TensorProto, helper

    if op == "ReduceSum":
        combine = helper.make_node(op, ["x"], ["s"], keepdims=0)
    else:
        combine = helper.make_node(op, ["x", "x"], ["s"])
    leaky = helper.make_node("LeakyRelu", ["s"], ["y"])
    leaky.attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    body = [combine, leaky]
    function = helper.make_function(
        "my", "twice", ["x"], ["y"], body, [helper.make_opsetid("", function_opset)], ["alpha"]
    )
    call = helper.make_node("twice", ["X"], ["Y"], domain="my", alpha=3.0)
    graph = helper.make_graph(
        [call],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("my", 1)],
        functions=[function],
    )
    model.ir_version = 9
    return model.SerializeToString()


@pytest.mark.parametrize("function_opset", [18, 16])
def test_local_function_with_attribute_matches_onnxruntime(function_opset: int) -> None:
    """A function called with an attribute, at the model's opset or an older one whose Add
    is the same schema: inlined as the spec defines a call."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    check_model(_function_model(function_opset), {"X": x})


def test_local_function_whose_op_changed_between_opsets_is_refused() -> None:
    """ReduceSum at opset 11 (axes as an attribute) is not ReduceSum at 18 (axes as an
    input): inlined into the opset-18 graph it would mean something else."""
    with pytest.raises(InvalidModel, match="not compatible|differs between the two"):
        nxrt.InferenceSession(_function_model(11, "ReduceSum"), providers=["cpu"])


@pytest.mark.parametrize(("alternate_sign", "dtype"), [(True, np.float32), (False, np.float64)])
def test_feature_hasher_matches_onnxruntime(alternate_sign: bool, dtype: Any) -> None:
    """FeatureHasher converts to com.microsoft::MurmurHash3 over the strings' UTF-8."""
    words = np.array([["cat", "dog"], ["Äpfel", ""], ["a b", "cat"], ["x", "yy"]], dtype=object)
    model = feature_extraction.FeatureHasher(
        n_features=16, input_type="string", alternate_sign=alternate_sign, dtype=dtype
    ).fit(words)
    onx = convert_sklearn(
        model, initial_types=[("input", StringTensorType([None, 2]))], target_opset=18
    ).SerializeToString()
    check_model(onx, {"input": words})
    got = nxrt.InferenceSession(onx, providers=["cpu"]).run(None, {"input": words})[0]
    np.testing.assert_allclose(got, model.transform(words).toarray())


@pytest.mark.parametrize("positive", [1, 0])
@pytest.mark.parametrize(
    "keys",
    [
        np.array([0, 1, -1, 123456], np.int32),
        np.array([0, 1, 2**32 - 1], np.uint32),
        np.array([1, -5, 2**40], np.int64),
        np.array([2**64 - 1, 7], np.uint64),
        np.array([1.5, -0.0, np.nan], np.float32),
        np.array([1.5, 1e300], np.float64),
        np.array(["", "a", "hello", "Äpfel", "abcdefg"], dtype=object),
    ],
    ids=["int32", "uint32", "int64", "uint64", "float32", "float64", "string"],
)
def test_murmur_hash3_hashes_each_dtype_as_onnxruntime(keys: np.ndarray, positive: int) -> None:
    """A number's own bytes (4 or 8, little-endian), a string's UTF-8; ``seed`` (here
    negative: its low 32 bits) and ``positive`` (uint32, or the same bits as int32)."""
    from onnx import TensorProto, helper

    elem = (
        TensorProto.STRING if keys.dtype == object else helper.np_dtype_to_tensor_dtype(keys.dtype)
    )
    out = TensorProto.UINT32 if positive else TensorProto.INT32
    onx = op_model(
        "MurmurHash3",
        [("X", elem, list(keys.shape))],
        [("Y", out, list(keys.shape))],
        {"positive": positive, "seed": -7},
        domain="com.microsoft",
    )
    check_model(onx, {"X": keys})


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cdist_op_matches_onnxruntime(metric: str, dtype: Any) -> None:
    from onnx import helper

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 3)).astype(dtype), rng.normal(size=(4, 3)).astype(dtype)
    b[1] = a[2]  # a zero distance, where the sum can cancel below zero
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    onx = op_model(
        "CDist",
        [("A", elem, [5, 3]), ("B", elem, [4, 3])],
        [("C", elem, [5, 4])],
        {"metric": metric},
        domain="com.microsoft",
    )
    check_model(onx, {"A": a, "B": b})


def _string_classifiers() -> dict[str, Callable[[], Any]]:
    """Classifiers whose class labels are strings (skl2onnx keeps them in string
    initializers, which come out of nxrt as ``str``, as from ONNX Runtime)."""
    three = [
        ("lr", lambda: linear_model.LogisticRegression(max_iter=500)),
        ("dt", lambda: tree.DecisionTreeClassifier(max_depth=3, **SEED)),
        ("nb", naive_bayes.GaussianNB),
    ]

    def voting(kind: str, weights: Any = None) -> Callable[[], Any]:
        return lambda: ensemble.VotingClassifier(
            [(n, m()) for n, m in three], voting=kind, weights=weights, flatten_transform=False
        )

    weights = np.array([1.0, 2.0, 3.0])
    return {
        "voting_soft": voting("soft"),
        "voting_hard": voting("hard"),
        "voting_soft_weighted": voting("soft", weights),
        "voting_hard_weighted": voting("hard", weights),
        "one_vs_rest": lambda: multiclass.OneVsRestClassifier(
            linear_model.LogisticRegression(max_iter=500)
        ),
        "sgd_hinge": lambda: linear_model.SGDClassifier(loss="hinge", **SEED),
        "qda": discriminant_analysis.QuadraticDiscriminantAnalysis,
        "knn": lambda: neighbors.KNeighborsClassifier(3),
        "svc_pipeline": lambda: pipeline.make_pipeline(
            preprocessing.StandardScaler(), svm.SVC(probability=True, **SEED)
        ),
    }


STRING_CLASSIFIERS = _string_classifiers()


@pytest.mark.parametrize("zipmap", [True, False])
@pytest.mark.parametrize("binary", [False, True], ids=["three_classes", "binary"])
@pytest.mark.parametrize("name", list(STRING_CLASSIFIERS))
def test_string_label_classifiers_match_onnxruntime(name: str, binary: bool, zipmap: bool):
    x, y = data("iris")
    labels = np.array(["no", "yes"], dtype=object)[(y > 0).astype(int)] if binary else IRIS_NAMES[y]
    model = _fitted(STRING_CLASSIFIERS[name], x, labels)
    options = None if zipmap else {"zipmap": False}
    final = _final(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = to_onnx(
            model, x[:1], options={id(final): options} if options else None, target_opset=18
        ).SerializeToString()
    check_model(onx, {"X": x[::5]})
    label = nxrt.InferenceSession(onx, providers=["cpu"]).run(None, {"X": x[:3]})[0]
    assert label.dtype == object and all(type(v) is str for v in label.flat)


def _string_op(op: str, inputs, attrs=None, inits=(), domain="", opset=18):
    """A one-node model over string tensors; ``inputs`` are (name, elem type, shape)."""
    from onnx import helper

    node = helper.make_node(op, [n for n, _, _ in inputs], ["Y"], domain=domain, **(attrs or {}))
    feeds = [i for i in inputs if i[0] not in {t.name for t in inits}]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in feeds],
        [onnx.ValueInfoProto(name="Y")],
        list(inits),
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("ai.onnx.ml", 3)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString()


def _string_path_cases() -> list[Any]:
    from onnx import TensorProto as T
    from onnx import helper

    words = helper.make_tensor("W", T.STRING, [3], ["a", "zz", "Äpfel"])
    x = np.array(["a", "bb", "", "Äpfel", "a"], dtype=object)
    i64 = np.array([2, 0], np.int64)
    cases = [
        (
            "gather_initializer",
            "Gather",
            [("W", T.STRING, [3]), ("I", T.INT64, [2])],
            {},
            [words],
            {"I": i64},
        ),
        (
            "concat_initializer",
            "Concat",
            [("W", T.STRING, [3]), ("X", T.STRING, [5])],
            {"axis": 0},
            [words],
            {"X": x},
        ),
        (
            "where_initializer",
            "Where",
            [("B", T.BOOL, [3]), ("W", T.STRING, [3]), ("X", T.STRING, [3])],
            {},
            [words],
            {"B": np.array([1, 0, 1], bool), "X": x[:3].copy()},
        ),
        ("identity_initializer", "Identity", [("W", T.STRING, [3])], {}, [words], {}),
        (
            "array_feature_extractor",
            "ArrayFeatureExtractor",
            [("W", T.STRING, [3]), ("I", T.INT64, [2])],
            {},
            [words],
            {"I": i64},
        ),
        (
            "label_encoder_strings",
            "LabelEncoder",
            [("X", T.STRING, [5])],
            {"keys_strings": ["a", "Äpfel"], "values_strings": ["A", "Ä"], "default_string": "?"},
            [],
            {"X": x},
        ),
        (
            "label_encoder_to_int",
            "LabelEncoder",
            [("X", T.STRING, [5])],
            {"keys_strings": ["a", "bb"], "values_int64s": [1, 2]},
            [],
            {"X": x},
        ),
        (
            "identity_of_numpy_unicode",
            "Identity",
            [("X", T.STRING, [5])],
            {},
            [],
            {"X": x.astype(str)},
        ),
    ]
    for name, value in [
        ("float", np.array([1.5, 2.0, np.nan, -0.0, np.inf, 1e-5, 1 / 3], np.float32)),
        ("double", np.array([1 / 3, 2.0, -np.inf, 1e23], np.float64)),
        ("float16", np.array([1.5, 0.1], np.float16)),
        ("bool", np.array([True, False])),
        ("int8", np.array([-3, 7], np.int8)),
    ]:
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        cases.append(
            (
                f"cast_{name}_to_string",
                "Cast",
                [("X", elem, list(value.shape))],
                {"to": T.STRING},
                [],
                {"X": value},
            )
        )
    texts = np.array(["1.5", " 3", "1e3", "-2", "0x1"], dtype=object)
    for name, to in [
        ("float", T.FLOAT),
        ("double", T.DOUBLE),
        ("int64", T.INT64),
        ("uint8", T.UINT8),
        ("bool", T.BOOL),
    ]:
        cases.append(
            (f"cast_string_to_{name}", "Cast", [("X", T.STRING, [5])], {"to": to}, [], {"X": texts})
        )
    return cases


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "inits", "feeds"),
    [pytest.param(*c[1:], id=c[0]) for c in _string_path_cases()],
)
def test_string_paths_match_onnxruntime(op, inputs, attrs, inits, feeds) -> None:
    """Every op strings flow through in converted models gives ONNX Runtime's values as
    ``str`` objects: string initializers, numbers written as C's ``%.8g`` (NaN, INF),
    text read as C++'s ``stod`` / ``stoll`` read it."""
    domain = "ai.onnx.ml" if op in ("ArrayFeatureExtractor", "LabelEncoder") else ""
    check_model(_string_op(op, inputs, attrs, inits, domain), feeds)


def test_dict_vectorizer_takes_numpy_values_as_onnxruntime() -> None:
    """A map feed's values as float() reads them: numpy floats and bools, 0-d arrays."""
    rows = [{"a": 1.0, "b": 2.0}, {"b": 3.0, "c": 1.0}]
    model = feature_extraction.DictVectorizer(sparse=False).fit(rows)
    onx = convert_sklearn(
        model,
        initial_types=[("d", DictionaryType(StringTensorType([1]), FloatTensorType([1])))],
        target_opset=18,
    ).SerializeToString()
    for row in [
        {"a": np.array(1.5, dtype=np.float32), "b": np.float64(2.0)},
        {"a": True, "c": np.bool_(True)},
        {"b": np.int64(3), "c": np.array(2)},
    ]:
        check_model(onx, {"d": row})
    session = nxrt.InferenceSession(onx, providers=["cpu"])
    with pytest.raises(InvalidArgument, match="not a number"):
        session.run(None, {"d": {"a": "1"}})  # text, which ONNX Runtime refuses too


@pytest.mark.parametrize("coordinates", [False, True], ids=["linear", "coordinates"])
def test_sparse_initializer_with_unsorted_indices_runs(coordinates: bool) -> None:
    """COO indices out of order (the checker wants them sorted; ONNX Runtime loads them)."""
    from onnx import TensorProto, helper

    values = helper.make_tensor("W", TensorProto.FLOAT, [5], [1, 2, 3, 4, 5])
    if coordinates:
        where = [[0, 0], [1, 0], [1, 2], [2, 1], [0, 2]]
        indices = helper.make_tensor("i", TensorProto.INT64, [5, 2], np.ravel(where).tolist())
    else:
        indices = helper.make_tensor("i", TensorProto.INT64, [5], [0, 3, 5, 7, 2])
    graph = helper.make_graph(
        [helper.make_node("Add", ["W", "X"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 3])],
    )
    graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [3, 3]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    check_model(model.SerializeToString(), {"X": np.ones((3, 3), np.float32)})


def test_sparse_initializer_index_outside_is_refused() -> None:
    from onnx import TensorProto, helper

    values = helper.make_tensor("W", TensorProto.FLOAT, [2], [1, 2])
    indices = helper.make_tensor("i", TensorProto.INT64, [2], [3, 9])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["Y"])],
        "g",
        [],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 3])],
    )
    graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [3, 3]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(InvalidModel, match="outside"):
        nxrt.InferenceSession(model.SerializeToString(), providers=["cpu"])
