#!/usr/bin/env python3
"""Exports small ONNX sequence models (LSTM, GRU) and dense networks with third-party exporters.

tickserve's CUDA engine imports ONNX graphs; scripts/dev/make_models.py writes its sample
models by hand, so those only hold what we thought to write. This script has PyTorch's
and tf2onnx's own exporters write the same kinds of models, to test the importer on
graphs nobody here wrote. It lays them out as a tickserve model repository:
DIR/NAME/1/model.onnx and DIR/NAME/model.toml (server defaults).

    .local/torch-venv/bin/python scripts/dev/export_sequence_models.py torch --repository DIR
    .local/tfs-venv/bin/python scripts/dev/export_sequence_models.py tf --repository DIR

`torch` needs torch, onnx, onnxscript and onnxruntime; `tf` needs tensorflow 2.15.1 and
tf2onnx 1.16.1, and onnxruntime to run what it wrote: in scripts/demo/tfserving_keras.sh's
venv, `pip install --no-deps onnxruntime==1.31.1` (with its dependencies it would move
protobuf to a version TensorFlow 2.15 cannot load); without it the models are written
and checked, not run. The models are tiny (8 features, hidden 16, windows of 12 steps).
Every input is float32 with a dynamic batch first and every other dimension fixed; every
output is batch-first. Weights are seeded, each ONNX file holds its weights (no external
data), and a rerun writes identical bytes (for tf, the script fixes PYTHONHASHSEED and
puts one of tf2onnx's node walks in name order; see export_tf).

torch (TorchScript exporter, opset 17):
  pt_lstm1       window [batch,12,8] -> LSTM(16) -> out[:, -1] -> Linear(16,1)
  pt_lstm2       window -> 2-layer LSTM(16) -> h_n[-1] -> Linear(16,1)
  pt_gru1        window -> GRU(16) -> out[:, -1] -> Linear(16,1)
  pt_gru2        window -> 2-layer GRU(16) -> h_n[-1] -> Linear(16,1)
  pt_lstm_state  one stateful tick of a 2-layer LSTM: tick [batch,8], h_in, c_in
                 [batch,2,16] -> prediction [batch,1], h_out, c_out [batch,2,16]
  pt_lstm_multi  window [batch,12,8], features [batch,4] -> LSTM(16) -> out[:, -1]
                 ++ features -> Linear(20,1)
  pt_mlp         features [batch,16] -> Linear(16,32) -> ReLU -> Linear(32,32) -> Tanh
                 -> Linear(32,1)
  pt_mlp_norm    features [batch,16] -> Linear(16,32) -> LayerNorm(32) -> Sigmoid
                 -> Linear(32,3) -> Softmax
torch (dynamo exporter, torch.export, its default opset (20 with torch 2.15); a model it
       fails on is reported and skipped):
  pt2_lstm1, pt2_gru2, pt2_mlp, pt2_mlp_norm   as pt_lstm1, pt_gru2, pt_mlp, pt_mlp_norm
tf (Keras models, tf2onnx.convert.from_keras, opset 17):
  tf_lstm1       window [None,12,8] -> LSTM(16) -> Dense(1)
  tf_lstm2       LSTM(16, return_sequences) -> LSTM(16) -> Dense(1)
  tf_gru1        GRU(16) (reset_after=True, the Keras default) -> Dense(1)
  tf_gru2        GRU(16, return_sequences) -> GRU(16) -> Dense(1)
  tf_gru_v1      GRU(16, reset_after=False) -> Dense(1) (tf2onnx 1.16.1 writes an ONNX
                 Loop of MatMul/Sigmoid/Tanh here, not a GRU)
  tf_lstm_multi  window [None,12,8], features [None,4] -> LSTM(16) ++ features -> Dense(1)
  tf_mlp         features [None,16] -> Dense(32, relu) -> Dense(32, tanh) -> Dense(1)
  tf_mlp_norm    features [None,16] -> Dense(32) -> LayerNormalization -> Dense(3, softmax)

Each model is run once with ONNX Runtime on a random batch of 3 and compared with the
framework's own output; one line per model lists its op types (first appearance,
subgraphs included), its opset, inputs and outputs.
"""
import argparse
import os
import pathlib
import sys

import numpy as np

FEATURES = 8
HIDDEN = 16
WINDOW = 12
EXTRA = 4  # the `features` input of the multi-input models
DENSE_FEATURES = 16  # the dense networks' `features` input
DENSE_HIDDEN = 32
VERIFY_BATCH = 3

MODEL_TOML = (
    "# Exported by scripts/dev/export_sequence_models.py ({exporter}); server defaults.\n"
)
# pt_lstm_state is served as a stateful model: the server carries h and c per sequence.
STATE_TOML = """
[[sequence.state]]
input = "h_in"
output = "h_out"

[[sequence.state]]
input = "c_in"
output = "c_out"
"""


# ---------------------------------------------------------------- common (onnx, ort)


def model_paths(repository, name):
    """DIR/NAME/1/model.onnx, with its folders made, and DIR/NAME/model.toml."""
    version = pathlib.Path(repository) / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    return version / "model.onnx", version.parent / "model.toml"


def op_types(graph, seen=None):
    """Distinct op types in order of first appearance, subgraphs (Loop, Scan, If) included."""
    import onnx

    seen = [] if seen is None else seen
    for node in graph.node:
        if node.op_type not in seen:
            seen.append(node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                op_types(attr.g, seen)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    op_types(sub, seen)
    return seen


def dims(value_info):
    shape = value_info.type.tensor_type.shape
    if not value_info.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_param if d.HasField("dim_param") else
            (d.dim_value if d.HasField("dim_value") else "?") for d in shape.dim]


def describe(value_info):
    import onnx

    elem = onnx.TensorProto.DataType.Name(value_info.type.tensor_type.elem_type).lower()
    shape = dims(value_info)
    return f"{value_info.name}:{elem}{shape if shape is not None else '[?]'}"


def layout_problems(model):
    """What breaks the repository's rule: float32, dynamic batch first, the rest fixed."""
    import onnx

    problems = []
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for value in values:
            if value.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
                problems.append(f"{kind} {value.name} is not float32")
            shape = dims(value)
            if not shape:
                problems.append(f"{kind} {value.name} has no shape")
                continue
            if isinstance(shape[0], int):
                problems.append(f"{kind} {value.name} has a fixed first dimension")
            if kind == "input" and any(not isinstance(d, int) for d in shape[1:]):
                problems.append(f"{kind} {value.name} has a dynamic non-batch dimension")
    return problems


def external_data(model):
    import onnx

    return [t.name for t in model.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL]


def random_feed(model, batch, rng):
    """A random float32 batch for every graph input (their non-batch dims are fixed)."""
    return {value.name: rng.standard_normal([batch] + dims(value)[1:]).astype(np.float32)
            for value in model.graph.input}


def check_and_report(path, name, feed, expected):
    """Loads the file, checks it, runs it in ONNX Runtime, prints the model's line."""
    import onnx

    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    problems = layout_problems(model) + [
        f"external data: {t}" for t in external_data(model)]
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), "?")
    print(f"{name}: {' '.join(op_types(model.graph))}")
    print(f"    opset {opset}; inputs {', '.join(describe(v) for v in model.graph.input)}; "
          f"outputs {', '.join(describe(v) for v in model.graph.output)}")
    if ort is None:  # see the module docstring
        print(f"    onnxruntime is not installed in this venv: not run; "
              f"{path.stat().st_size} bytes")
    else:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs = session.run(None, feed)
        diffs = [float(np.max(np.abs(got - want))) for got, want in zip(outputs, expected)]
        print(f"    ort batch {VERIFY_BATCH}: output shapes "
              f"{[list(o.shape) for o in outputs]}, max |ort - framework| "
              f"{max(diffs):.2e}; {path.stat().st_size} bytes")
    for problem in problems:
        print(f"    WARNING: {problem}")
    return model


# ---------------------------------------------------------------- torch


def torch_models():
    """(name, module, input names, output names, example inputs) for each PyTorch model."""
    import torch
    from torch import nn

    class Window(nn.Module):
        """window [batch, 12, 8] -> RNN -> Linear(16, 1) on out[:, -1] or h_n[-1]."""

        def __init__(self, rnn, head_on):
            super().__init__()
            self.rnn = rnn
            self.head = nn.Linear(HIDDEN, 1)
            self.head_on = head_on

        def forward(self, window):
            out, state = self.rnn(window)
            if self.head_on == "out":
                last = out[:, -1, :]
            else:
                h_n = state[0] if isinstance(state, tuple) else state
                last = h_n[-1]
            return self.head(last)

    class State(nn.Module):
        """One tick of a 2-layer LSTM with its state batch-first in and out."""

        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(FEATURES, HIDDEN, num_layers=2, batch_first=True)
            self.head = nn.Linear(HIDDEN, 1)

        def forward(self, tick, h_in, c_in):
            h0 = h_in.permute(1, 0, 2).contiguous()
            c0 = c_in.permute(1, 0, 2).contiguous()
            out, (h, c) = self.lstm(tick.unsqueeze(1), (h0, c0))
            prediction = self.head(out[:, -1, :])
            return prediction, h.permute(1, 0, 2), c.permute(1, 0, 2)

    class Multi(nn.Module):
        """window and features -> LSTM out[:, -1] ++ features -> Linear(20, 1)."""

        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(FEATURES, HIDDEN, batch_first=True)
            self.head = nn.Linear(HIDDEN + EXTRA, 1)

        def forward(self, window, features):
            out, _ = self.lstm(window)
            return self.head(torch.cat([out[:, -1, :], features], dim=1))

    def dense(norm):
        """features [batch, 16] -> the dense network of pt_mlp (norm: of pt_mlp_norm)."""
        if norm:
            return nn.Sequential(
                nn.Linear(DENSE_FEATURES, DENSE_HIDDEN), nn.LayerNorm(DENSE_HIDDEN),
                nn.Sigmoid(), nn.Linear(DENSE_HIDDEN, 3), nn.Softmax(dim=1))
        return nn.Sequential(
            nn.Linear(DENSE_FEATURES, DENSE_HIDDEN), nn.ReLU(),
            nn.Linear(DENSE_HIDDEN, DENSE_HIDDEN), nn.Tanh(), nn.Linear(DENSE_HIDDEN, 1))

    def window_model(kind, layers, head_on):
        rnn = getattr(nn, kind)(FEATURES, HIDDEN, num_layers=layers, batch_first=True)
        return Window(rnn, head_on)

    batch = 2  # the example batch the exporters trace with (dynamic in the graph)
    window = torch.randn(batch, WINDOW, FEATURES)
    single = (["window"], ["prediction"], (window,))
    # Each model's weights come from its own seed, so one model's change moves no other.
    specs = [
        ("pt_lstm1", lambda: window_model("LSTM", 1, "out"), *single),
        ("pt_lstm2", lambda: window_model("LSTM", 2, "h_n"), *single),
        ("pt_gru1", lambda: window_model("GRU", 1, "out"), *single),
        ("pt_gru2", lambda: window_model("GRU", 2, "h_n"), *single),
        ("pt_lstm_state", State, ["tick", "h_in", "c_in"],
         ["prediction", "h_out", "c_out"],
         (torch.randn(batch, FEATURES), torch.randn(batch, 2, HIDDEN),
          torch.randn(batch, 2, HIDDEN))),
        ("pt_lstm_multi", Multi, ["window", "features"], ["prediction"],
         (window, torch.randn(batch, EXTRA))),
        ("pt_mlp", lambda: dense(False), ["features"], ["prediction"],
         (torch.randn(batch, DENSE_FEATURES),)),
        ("pt_mlp_norm", lambda: dense(True), ["features"], ["probabilities"],
         (torch.randn(batch, DENSE_FEATURES),)),
    ]
    for seed, (name, make, inputs, outputs, example) in enumerate(specs):
        torch.manual_seed(seed)
        yield name, make().eval(), inputs, outputs, example


def strip_node_metadata(graph):
    """Drops the dynamo exporter's per-node metadata_props (FX node, module stack, stack
    trace with absolute paths of this checkout and venv): they would make the bytes
    depend on where the script ran, and they are over half the file."""
    import onnx

    for node in graph.node:
        del node.metadata_props[:]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                strip_node_metadata(attr.g)
            for sub in attr.graphs:
                strip_node_metadata(sub)


def export_torch(repository):
    import logging
    import warnings

    import onnx
    import torch

    # The exporters' deprecation and tracing warnings, and the dynamo exporter's note
    # that torchvision is absent, say nothing about these models.
    warnings.simplefilter("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)

    torch.manual_seed(0)
    np.random.seed(0)
    rng = np.random.default_rng(0)
    failed = []
    models = {name: rest for name, *rest in torch_models()}

    def verify(path, name, module, onnx_model_inputs):
        feed = random_feed(onnx.load(str(path)), VERIFY_BATCH, rng)
        with torch.no_grad():
            want = module(*(torch.from_numpy(feed[n]) for n in onnx_model_inputs))
        want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
        check_and_report(path, name, feed, want)

    # TorchScript exporter.
    for name, (module, inputs, outputs, example) in models.items():
        path, toml = model_paths(repository, name)
        torch.onnx.export(
            module, example, str(path), dynamo=False, opset_version=17,
            input_names=inputs, output_names=outputs,
            dynamic_axes={n: {0: "batch"} for n in inputs + outputs})
        toml.write_text(MODEL_TOML.format(exporter="torch.onnx TorchScript exporter")
                        + (STATE_TOML if name == "pt_lstm_state" else ""))
        verify(path, name, module, inputs)

    # Dynamo exporter (torch.export); a failure is reported, and the model skipped.
    for name, source in (("pt2_lstm1", "pt_lstm1"), ("pt2_gru2", "pt_gru2"),
                         ("pt2_mlp", "pt_mlp"), ("pt2_mlp_norm", "pt_mlp_norm")):
        module, inputs, outputs, example = models[source]
        batch = torch.export.Dim("batch", min=1, max=4096)
        path, toml = model_paths(repository, name)
        try:
            program = torch.onnx.export(
                module, example, dynamo=True, verbose=False,
                input_names=inputs, output_names=outputs,
                dynamic_shapes=tuple({0: batch} for _ in inputs))
            model = program.model_proto
            strip_node_metadata(model.graph)
            onnx.save(model, str(path))  # weights inline: the model is far below 2 GB
            toml.write_text(MODEL_TOML.format(exporter="torch.onnx dynamo exporter"))
            verify(path, name, module, inputs)
        except Exception as error:  # noqa: BLE001 - any exporter failure skips the model
            print(f"{name}: FAILED to export ({type(error).__name__}: {error})")
            failed.append(name)
            for leftover in (path, toml):
                leftover.unlink(missing_ok=True)
            for folder in (path.parent, toml.parent):
                if folder.exists() and not any(folder.iterdir()):
                    folder.rmdir()
    return failed


# ---------------------------------------------------------------- tf


def tf_models():
    """(name, keras model) for each Keras model, with fixed layer names."""
    import tensorflow as tf

    keras = tf.keras
    layers = keras.layers

    def sequential(name, *body):
        window = keras.Input(shape=(WINDOW, FEATURES), name="window")
        return keras.Sequential(
            [window, *body, layers.Dense(1, name="prediction")], name=name)

    def dense(name, norm):
        features = keras.Input(shape=(DENSE_FEATURES,), name="features")
        if norm:
            body = [layers.Dense(DENSE_HIDDEN, name="dense_a"),
                    layers.LayerNormalization(name="norm"),
                    layers.Dense(3, activation="softmax", name="probabilities")]
        else:
            body = [layers.Dense(DENSE_HIDDEN, activation="relu", name="dense_a"),
                    layers.Dense(DENSE_HIDDEN, activation="tanh", name="dense_b"),
                    layers.Dense(1, name="prediction")]
        return keras.Sequential([features, *body], name=name)

    def multi(name):
        window = keras.Input(shape=(WINDOW, FEATURES), name="window")
        features = keras.Input(shape=(EXTRA,), name="features")
        x = layers.LSTM(HIDDEN, name="lstm")(window)
        x = layers.Concatenate(name="concat")([x, features])
        prediction = layers.Dense(1, name="prediction")(x)
        return keras.Model([window, features], prediction, name=name)

    specs = [
        ("tf_lstm1", lambda n: sequential(n, layers.LSTM(HIDDEN, name="lstm"))),
        ("tf_lstm2", lambda n: sequential(
            n, layers.LSTM(HIDDEN, return_sequences=True, name="lstm_a"),
            layers.LSTM(HIDDEN, name="lstm_b"))),
        ("tf_gru1", lambda n: sequential(n, layers.GRU(HIDDEN, name="gru"))),
        ("tf_gru2", lambda n: sequential(
            n, layers.GRU(HIDDEN, return_sequences=True, name="gru_a"),
            layers.GRU(HIDDEN, name="gru_b"))),
        ("tf_gru_v1", lambda n: sequential(
            n, layers.GRU(HIDDEN, reset_after=False, name="gru"))),
        ("tf_lstm_multi", multi),
        ("tf_mlp", lambda n: dense(n, False)),
        ("tf_mlp_norm", lambda n: dense(n, True)),
    ]
    for seed, (name, make) in enumerate(specs):
        keras.backend.clear_session()
        tf.random.set_seed(seed)
        keras.utils.set_random_seed(seed)
        model = make(name)
        # Keras starts biases at zero (the LSTM's forget gate at one): tf2onnx would
        # then drop the Dense layer's Add and share one bias between layers, and a
        # fixture with zero biases cannot catch an importer that mishandles them.
        # Random weights everywhere, from this model's seed.
        rng = np.random.default_rng(seed)
        model.set_weights([rng.normal(0.0, 0.3, w.shape).astype(np.float32)
                           for w in model.get_weights()])
        yield name, model


def export_tf(repository):
    import logging

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads
    import onnx
    import tensorflow as tf
    import tf2onnx
    import tf2onnx.graph

    # tf2onnx lists a graph's nodes from a set of node objects (Graph.
    # extract_sub_graph_nodes, which its unused-node pruning uses too), so their order
    # follows object ids and changes from run to run, and with it which of two
    # duplicate constants survives and the numbers in the names it makes: the same graph
    # under other names, other bytes. Listing them in name order makes reruns identical.
    graph_class = tf2onnx.graph.Graph
    extract = graph_class.extract_sub_graph_nodes

    def extract_by_name(self, *args, **kwargs):
        return sorted(extract(self, *args, **kwargs), key=lambda node: node.name)

    graph_class.extract_sub_graph_nodes = extract_by_name
    tf.get_logger().setLevel(logging.ERROR)
    tf2onnx.logging.set_level(logging.ERROR)
    tf.random.set_seed(0)
    np.random.seed(0)
    rng = np.random.default_rng(0)
    for name, model in tf_models():
        if name.startswith("tf_mlp"):
            signature = [tf.TensorSpec([None, DENSE_FEATURES], tf.float32, name="features")]
        else:
            signature = [tf.TensorSpec([None, WINDOW, FEATURES], tf.float32, name="window")]
        if len(model.inputs) == 2:
            signature.append(tf.TensorSpec([None, EXTRA], tf.float32, name="features"))
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=signature, opset=17)
        path, toml = model_paths(repository, name)
        onnx.save(proto, str(path))
        toml.write_text(MODEL_TOML.format(exporter="tf2onnx from Keras"))
        feed = random_feed(proto, VERIFY_BATCH, rng)
        want = model([feed[s.name] for s in signature] if len(signature) > 1
                     else feed[signature[0].name], training=False)
        check_and_report(path, name, feed, [np.asarray(want)])
    return []


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exporter", choices=["torch", "tf"],
                        help="which exporters to run (each needs its own venv)")
    parser.add_argument("--repository", required=True, type=pathlib.Path,
                        help="model repository to write DIR/NAME/1/model.onnx into")
    args = parser.parse_args()
    if args.exporter == "tf" and os.environ.get("PYTHONHASHSEED") != "0":
        # tf2onnx orders the graph's functions (a Keras loop's body and condition) by
        # iterating a set of their names, so the numbered names it gives their nodes
        # follow Python's per-process string hashing: fix the seed, once, by re-exec.
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    args.repository.mkdir(parents=True, exist_ok=True)
    failed = export_torch(args.repository) if args.exporter == "torch" \
        else export_tf(args.repository)
    if failed:
        print(f"skipped (export failed): {' '.join(failed)}", file=sys.stderr)


if __name__ == "__main__":
    main()
