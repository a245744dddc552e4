#!/usr/bin/env python3
"""Exports tree ensembles with LightGBM's, XGBoost's and scikit-learn's own ONNX converters.

tickserve's compiled CPU engine reads `TreeEnsembleRegressor` and `TreeEnsembleClassifier`
nodes (ai.onnx.ml); scripts/dev/make_models.py writes its tree models by hand, so those only
hold what we thought to write. This script has onnxmltools and skl2onnx write the models a
desk trains, to test the engine on graphs nobody here wrote. It lays them out as a tickserve
model repository: DIR/NAME/1/model.onnx and DIR/NAME/model.toml (server defaults).

    python3 -m venv .local/trees-venv
    .local/trees-venv/bin/pip install lightgbm==4.7.0 xgboost==3.2.0 scikit-learn==1.9.1 \\
        skl2onnx==1.20.0 onnxmltools==1.16.0 onnx==1.23.2 onnxruntime==1.31.1 numpy==2.4.6
    .local/trees-venv/bin/python scripts/dev/export_tree_models.py --repository DIR

Every model reads one FP32 input `input` of [batch, 16] features. The training rows hold
NaN (one value in ten) for LightGBM and XGBoost, so their trees send missing values down
learned sides (`nodes_missing_value_tracks_true`). Classifiers are written without ZipMap
(`zipmap=False`): a label (INT64 [batch]) and the probabilities (FP32 [batch, classes]).

  lgb_reg        LGBMRegressor, 30 trees of 15 leaves (TreeEnsembleRegressor + Identity)
  lgb_bin        LGBMClassifier, two classes (LOGISTIC; label Cast, probabilities Mul 1)
  lgb_multi      LGBMClassifier, three classes (SOFTMAX)
  xgb_reg        XGBRegressor, 30 trees of depth 4 (base_values)
  xgb_bin        XGBClassifier, two classes (one class id, LOGISTIC: ONNX Runtime's binary case)
  xgb_multi      XGBClassifier, three classes (SOFTMAX, base_values)
  skl_rf         RandomForestRegressor, 12 trees of depth 6 (AVERAGE)
  skl_et2        ExtraTreesRegressor, two targets, 8 trees of depth 5 (AVERAGE)
  skl_gbr        GradientBoostingRegressor, 30 trees of depth 3 (SUM, base_values)
  skl_rfc        RandomForestClassifier, labels -1/0/1 (sell, hold, buy), 10 trees of depth 5
  skl_gbc_bin    GradientBoostingClassifier, two classes (LOGISTIC, one base value)
  skl_gbc        GradientBoostingClassifier, three classes (SOFTMAX, base_values)
  skl_dt_bin     DecisionTreeClassifier, two classes, depth 6 (weights on both classes)

scikit-learn 1.9.1's HistGradientBoosting* cannot be written by skl2onnx 1.20.0 (its
converter fails on the model's attributes), so there is none here.

Each model is run with ONNX Runtime on 200 random rows and compared with the framework's
own prediction (1e-5 relative; the predicted label must be equal where the top two
probabilities differ by more than 1e-5); one line per model lists its nodes and outputs.
"""
import argparse
import pathlib
import sys
import warnings

import numpy as np

FEATURES = 16
ROWS = 2000
SEED = 20261205


def data(nan: bool):
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    signal = x[:, 0] + 0.5 * x[:, 1] ** 2 - 0.8 * x[:, 2] * x[:, 3] + 0.3 * rng.normal(size=ROWS)
    if nan:
        x[rng.random(size=x.shape) < 0.1] = np.nan
    y = signal.astype(np.float32)
    two = np.stack([y, (x[:, 4] - x[:, 5]).astype(np.float32)], axis=1) if not nan else None
    binary = (signal > 0.3).astype(np.int64)
    three = np.digitize(signal, [-0.3, 0.6]).astype(np.int64)  # 0, 1, 2
    return x, y, two, binary, three


def models():
    """(name, exporter, fitted model, NaN in training rows)."""
    import lightgbm as lgb
    import xgboost as xgb
    from sklearn.ensemble import (ExtraTreesRegressor, GradientBoostingClassifier,
                                  GradientBoostingRegressor, RandomForestClassifier,
                                  RandomForestRegressor)
    from sklearn.tree import DecisionTreeClassifier

    x_nan, y_nan, _, bin_nan, three_nan = data(nan=True)
    x, y, two, binary, three = data(nan=False)
    lgb_common = dict(n_estimators=30, num_leaves=15, random_state=1, deterministic=True,
                      n_jobs=1, verbose=-1)
    xgb_common = dict(n_estimators=30, max_depth=4, random_state=1, n_jobs=1, tree_method="exact")
    yield "lgb_reg", "lightgbm", lgb.LGBMRegressor(**lgb_common).fit(x_nan, y_nan), True
    yield "lgb_bin", "lightgbm", lgb.LGBMClassifier(**lgb_common).fit(x_nan, bin_nan), True
    yield "lgb_multi", "lightgbm", lgb.LGBMClassifier(**lgb_common).fit(x_nan, three_nan), True
    yield "xgb_reg", "xgboost", xgb.XGBRegressor(**xgb_common).fit(x_nan, y_nan), True
    yield "xgb_bin", "xgboost", xgb.XGBClassifier(**xgb_common).fit(x_nan, bin_nan), True
    yield "xgb_multi", "xgboost", xgb.XGBClassifier(**xgb_common).fit(x_nan, three_nan), True
    yield "skl_rf", "sklearn", RandomForestRegressor(
        n_estimators=12, max_depth=6, random_state=1).fit(x, y), False
    yield "skl_et2", "sklearn", ExtraTreesRegressor(
        n_estimators=8, max_depth=5, random_state=1).fit(x, two), False
    yield "skl_gbr", "sklearn", GradientBoostingRegressor(
        n_estimators=30, max_depth=3, random_state=1).fit(x, y), False
    yield "skl_rfc", "sklearn", RandomForestClassifier(
        n_estimators=10, max_depth=5, random_state=1).fit(x, three - 1), False
    yield "skl_gbc_bin", "sklearn", GradientBoostingClassifier(
        n_estimators=20, max_depth=3, random_state=1).fit(x, binary), False
    yield "skl_gbc", "sklearn", GradientBoostingClassifier(
        n_estimators=15, max_depth=3, random_state=1).fit(x, three), False
    yield "skl_dt_bin", "sklearn", DecisionTreeClassifier(
        max_depth=6, random_state=1).fit(x, binary), False


def convert(exporter, model):
    if exporter == "sklearn":
        from skl2onnx import convert_sklearn
        from skl2onnx.common.data_types import FloatTensorType
        options = {"zipmap": False} if hasattr(model, "predict_proba") else None
        return convert_sklearn(model, initial_types=[("input", FloatTensorType([None, FEATURES]))],
                               options=options)
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType
    types = [("input", FloatTensorType([None, FEATURES]))]
    if exporter == "lightgbm":
        return onnxmltools.convert_lightgbm(model, initial_types=types, zipmap=False)
    return onnxmltools.convert_xgboost(model, initial_types=types)


def verify(name, path, model, nan):
    import onnxruntime as ort
    rng = np.random.default_rng(7)
    x = rng.normal(size=(200, FEATURES)).astype(np.float32)
    if nan:
        x[rng.random(size=x.shape) < 0.1] = np.nan
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input": x})
    if hasattr(model, "predict_proba"):
        label, proba = got
        want = model.predict_proba(x).astype(np.float32)
        np.testing.assert_allclose(proba, want, rtol=1e-5, atol=1e-6, err_msg=name)
        top = np.sort(want, axis=1)
        clear = top[:, -1] - top[:, -2] > 1e-5
        np.testing.assert_array_equal(label.reshape(-1)[clear], model.predict(x)[clear], err_msg=name)
    else:
        want = model.predict(x).astype(np.float32).reshape(got[0].shape)
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5, err_msg=name)


def main():
    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser()
    p.add_argument("--repository", required=True, type=pathlib.Path)
    args = p.parse_args()
    for name, exporter, model, nan in models():
        onnx_model = convert(exporter, model)
        onnx_model.graph.name = name  # the converters name graphs with a random UUID
        version = args.repository / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        path = version / "model.onnx"
        path.write_bytes(onnx_model.SerializeToString())
        toml = f"# Exported by scripts/dev/export_tree_models.py ({exporter}); server defaults.\n"
        if name == "skl_et2":
            # skl2onnx declares a multi-target regressor's output [N, 1]; it gives [N, 2].
            toml += "\n# skl2onnx declares the output [batch, 1]; the model gives two targets.\n"
            toml += "[outputs.variable]\ndims = [2]\n"
        (args.repository / name / "model.toml").write_text(toml)
        verify(name, path, model, nan)
        nodes = " ".join(n.op_type for n in onnx_model.graph.node)
        outputs = ", ".join(o.name for o in onnx_model.graph.output)
        print(f"{name}: {nodes} -> {outputs}; matches {exporter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
