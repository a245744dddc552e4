#!/usr/bin/env python3
"""Writes tickserve's sample model repository, deterministically.

    python scripts/dev/make_models.py config/models          # the shipped sample repository
    python scripts/dev/make_models.py --fixtures DIR         # extra models the tests use
    python scripts/dev/make_models.py --bench DIR            # the per-tick benchmark's models
    python scripts/dev/make_models.py --steps DIR            # one-tick recurrent models

Sample models (Triton layout, DIR/NAME/VERSION/model.onnx):
  alpha_mlp       float32 [batch, 50] -> Gemm 50x64 -> Relu -> Gemm 64x3 -> Softmax -> [batch, 3]
  seq_lstm        float32 [batch, 30, 8] -> ONNX LSTM (hidden 16) -> Gemm 16x1 -> [batch, 1]
  seq_lstm_step   one tick of seq_lstm, with its weights: tick [batch, 8], h_in, c_in [batch, 16]
                  -> prediction [batch, 1], h_out, c_out [batch, 16]; a stateful sequence
                  model (model.toml pairs h_in/h_out and c_in/c_out): the server keeps h, c
  seq_lstm_window seq_lstm's graph and weights as a windowed sequence model (model.toml
                  declares `window` a window): clients send one tick [1, 8], the server
                  keeps each sequence's last 30
  tick_000..007   float32 [batch, 16] -> Gemm 16x32 -> Relu -> Gemm 32x1 -> [batch, 1],
                  one architecture, eight sets of weights (one per instrument)

Fixtures (--fixtures) include cuda_ops: every op the CUDA engine imports for dense models, in
one graph; cuda_sequence_ops: every recurrent and layout op (LSTM in layout 1 with initial
states and Y, GRU in both reset modes, Transpose, Slice with a step, Gather, Concat, Shape
arithmetic folded); cuda_lstm_layout0 and cuda_lstm_layout1: one LSTM in both layouts; cuda_conv: three one-axis
convolutions (padding, stride, dilation, groups, SAME_UPPER); cuda_conv2d: a convolution over
two axes, which the engine refuses;
cuda_bidirectional and cuda_peephole: LSTMs the engine refuses by name; hostile_*: models whose
numbers wrap size arithmetic (a kernel of 0, a hidden size of 2^62, a negative dimension).

Benchmark models (--bench), the per-tick workloads trading desks compare servers on:
  bench_lstm         one tick of a 2-layer LSTM of 128 units on 32 features, stateful:
                     tick [batch, 32], h1_in, c1_in, h2_in, c2_in [batch, 128]
                     -> prediction [batch, 1] and the four states out (model.toml pairs them)
  bench_lstm_window  the same LSTM (the same weights) on a window of the last 100 ticks:
                     clients send one tick [1, 32], the server keeps the window
  bench_trees        a tree ensemble (TreeEnsembleRegressor) of 500 trees of depth 6 on
                     64 features -> score [batch, 1]

One-tick recurrent models (--steps), stateful (model.toml pairs h_in with h_out):
  gru_step, gru_step_reset0  one tick of a GRU of 24 units on 6 features, reset after the
                     recurrent product (linear_before_reset=1, PyTorch's) and before it
                     (0, ONNX's default): tick [batch, 6], h_in [batch, 24]
                     -> prediction [batch, 1], h_out [batch, 24]

Every weight comes from numpy's PCG64 generator with a fixed seed, and the files carry
no timestamps, so running the script twice writes identical bytes.
"""
import argparse
import functools
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


def weights(rng, *shape, scale=None):
    fan_in = shape[-1] if len(shape) > 1 else 1
    scale = scale if scale is not None else 1.0 / np.sqrt(fan_in)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def save(model, root, name, version=1, config=None):
    model.ir_version = IR_VERSION
    model.producer_name = "tickserve-make-models"
    onnx.checker.check_model(model)
    path = root / name / str(version)
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.onnx").write_bytes(model.SerializeToString())
    if config is not None:
        (root / name / "model.toml").write_text(config)


def mlp(rng, name, inputs, hidden, outputs, softmax=False, in_name="features", out_name="signal",
        batch_dim="batch", opsets=None):
    w1 = numpy_helper.from_array(weights(rng, hidden, inputs), "w1")
    b1 = numpy_helper.from_array(weights(rng, hidden, scale=0.1), "b1")
    w2 = numpy_helper.from_array(weights(rng, outputs, hidden), "w2")
    b2 = numpy_helper.from_array(weights(rng, outputs, scale=0.1), "b2")
    last = "logits" if softmax else out_name
    nodes = [
        helper.make_node("Gemm", [in_name, "w1", "b1"], ["h1"], transB=1),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "w2", "b2"], [last], transB=1),
    ]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], [out_name], axis=-1))
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, [batch_dim, inputs])],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, [batch_dim, outputs])],
        [w1, b1, w2, b2],
    )
    return helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", OPSET)])


def lstm_weights(rng, features, hidden):
    """An LSTM's input, recurrent and bias weights and a one-output head, drawn in this
    order (so `lstm` and `lstm_step` with equal generators have equal weights)."""
    return [
        numpy_helper.from_array(weights(rng, 1, 4 * hidden, features), "lstm_w"),
        numpy_helper.from_array(weights(rng, 1, 4 * hidden, hidden), "lstm_r"),
        numpy_helper.from_array(weights(rng, 1, 8 * hidden, scale=0.1), "lstm_b"),
        numpy_helper.from_array(weights(rng, 1, hidden), "head_w"),
        numpy_helper.from_array(weights(rng, 1, scale=0.1), "head_b"),
    ]


def lstm(rng, name, seq, features, hidden, seq_dim=None):
    # ONNX LSTM wants [seq, batch, features]: transpose the batch-first input.
    w, r, b, wo, bo = lstm_weights(rng, features, hidden)
    axes = numpy_helper.from_array(np.array([0], dtype=np.int64), "squeeze_axes")
    nodes = [
        helper.make_node("Transpose", ["window"], ["window_t"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["window_t", "lstm_w", "lstm_r", "lstm_b"], ["", "h_last"],
                         hidden_size=hidden),
        helper.make_node("Squeeze", ["h_last", "squeeze_axes"], ["h"]),
        helper.make_node("Gemm", ["h", "head_w", "head_b"], ["prediction"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("window", TensorProto.FLOAT,
                                       ["batch", seq_dim or seq, features])],
        [helper.make_tensor_value_info("prediction", TensorProto.FLOAT, ["batch", 1])],
        [w, r, b, wo, bo, axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def lstm_step(rng, name, features, hidden):
    """One step of `lstm` (same weights for the same generator): the state comes in and out."""
    w, r, b, wo, bo = lstm_weights(rng, features, hidden)
    axes = numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")
    nodes = [
        helper.make_node("Unsqueeze", ["tick", "axes"], ["x"]),
        helper.make_node("Unsqueeze", ["h_in", "axes"], ["h0"]),
        helper.make_node("Unsqueeze", ["c_in", "axes"], ["c0"]),
        helper.make_node("LSTM", ["x", "lstm_w", "lstm_r", "lstm_b", "", "h0", "c0"],
                         ["", "h1", "c1"], hidden_size=hidden),
        helper.make_node("Squeeze", ["h1", "axes"], ["h_out"]),
        helper.make_node("Squeeze", ["c1", "axes"], ["c_out"]),
        helper.make_node("Gemm", ["h_out", "head_w", "head_b"], ["prediction"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("tick", TensorProto.FLOAT, ["batch", features]),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["batch", hidden]),
         helper.make_tensor_value_info("c_in", TensorProto.FLOAT, ["batch", hidden])],
        [helper.make_tensor_value_info("prediction", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["batch", hidden]),
         helper.make_tensor_value_info("c_out", TensorProto.FLOAT, ["batch", hidden])],
        [w, r, b, wo, bo, axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


SEQ_LSTM_STEP_TOML = """\
# One tick of seq_lstm, stateful: clients send only `tick`; the server keeps h and c
# per sequence (docs/sequences.md).
[sequence]
max_sequence_idle = "0s"   # never expire: a sequence lives for the trading day
max_sequences = 4096

[[sequence.state]]
input = "h_in"
output = "h_out"

[[sequence.state]]
input = "c_in"
output = "c_out"
"""


def every_cuda_op(rng):
    """x [batch, 24] through every op the CUDA engine imports; outputs [batch, 16] and [batch, 3]."""
    init = [
        numpy_helper.from_array(np.array([0, 4, 6], dtype=np.int64), "shape"),
        numpy_helper.from_array(weights(rng, 6, 8), "w1"),
        numpy_helper.from_array(weights(rng, 8, scale=0.1), "b1"),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(8)).astype(np.float32), "ln_scale"),
        numpy_helper.from_array(weights(rng, 8, scale=0.1), "ln_bias"),
        numpy_helper.from_array(weights(rng, 32, 16), "w2"),
        numpy_helper.from_array(weights(rng, 16, scale=0.1), "b2"),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(16)).astype(np.float32), "bn_scale"),
        numpy_helper.from_array(weights(rng, 16, scale=0.1), "bn_bias"),
        numpy_helper.from_array(weights(rng, 16, scale=0.1), "bn_mean"),
        numpy_helper.from_array((0.5 + rng.random(16)).astype(np.float32), "bn_var"),
        numpy_helper.from_array(weights(rng, 16, scale=1.0), "gain"),
        numpy_helper.from_array(np.array([0.25], dtype=np.float32), "offset"),
        numpy_helper.from_array((1.5 + rng.random((1, 16))).astype(np.float32), "divisor"),
        numpy_helper.from_array(weights(rng, 3, 16), "w3"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["x3"]),
        helper.make_node("MatMul", ["x3", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["h1"]),
        helper.make_node("LeakyRelu", ["h1"], ["a1"], alpha=0.2),
        helper.make_node("LayerNormalization", ["a1", "ln_scale", "ln_bias"], ["n1"], axis=-1,
                         epsilon=1e-5),
        helper.make_node("Flatten", ["n1"], ["f1"], axis=1),
        helper.make_node("Gemm", ["f1", "w2", "b2"], ["g2"], alpha=0.5, beta=2.0),
        helper.make_node("BatchNormalization", ["g2", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
                         ["bn"], epsilon=1e-3),
        helper.make_node("Tanh", ["bn"], ["t"]),
        helper.make_node("Identity", ["t"], ["t_id"]),
        helper.make_node("Mul", ["t_id", "gain"], ["scaled"]),
        helper.make_node("Sub", ["offset", "scaled"], ["shifted"]),
        helper.make_node("Div", ["shifted", "divisor"], ["ratio"]),
        helper.make_node("Sigmoid", ["ratio"], ["s"]),
        helper.make_node("Constant", [], ["half"],
                         value=numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half")),
        helper.make_node("Sub", ["s", "half"], ["centred"]),
        helper.make_node("Relu", ["centred"], ["r"]),
        helper.make_node("Add", ["s", "r"], ["sum"]),
        helper.make_node("Softmax", ["sum"], ["probabilities"], axis=-1),
        helper.make_node("Gemm", ["sum", "w3"], ["head"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "cuda_ops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 24])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 16]),
         helper.make_tensor_value_info("head", TensorProto.FLOAT, ["batch", 3])],
        init,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


SEQ_LSTM_WINDOW_TOML = """\
# seq_lstm as a windowed sequence model: clients send one tick [1, 8] under `window`;
# the server keeps each sequence's last 30 ticks and runs the LSTM on them
# (docs/sequences.md, "Windows").
[sequence]
max_sequence_idle = "0s"   # never expire: a sequence lives for the trading day
max_sequences = 4096
window_warmup = "pad"      # before 30 ticks, the missing places hold zeros

[[sequence.window]]
input = "window"
"""


def every_sequence_op(rng):
    """window [batch, 6, 4] and h0 [batch, 5] through every recurrent and layout op the CUDA
    engine imports; outputs y [batch, 8], gru_seq [batch, 3, 5] and joined [batch, 10]."""
    seq, features, hidden = 6, 4, 5

    def cell_weights(gates, inputs):
        return (weights(rng, 1, gates * hidden, inputs), weights(rng, 1, gates * hidden, hidden),
                weights(rng, 1, 2 * gates * hidden, scale=0.1))

    w_lstm, r_lstm, b_lstm = cell_weights(4, features)
    gru_weights = functools.partial(cell_weights, 3)

    w_g1, r_g1, b_g1 = gru_weights(hidden)
    w_g2, r_g2, b_g2 = gru_weights(hidden)
    init = [
        numpy_helper.from_array(w_lstm, "w_lstm"), numpy_helper.from_array(r_lstm, "r_lstm"),
        numpy_helper.from_array(b_lstm, "b_lstm"),
        numpy_helper.from_array(w_g1, "w_g1"), numpy_helper.from_array(r_g1, "r_g1"),
        numpy_helper.from_array(b_g1, "b_g1"),
        numpy_helper.from_array(w_g2, "w_g2"), numpy_helper.from_array(r_g2, "r_g2"),
        numpy_helper.from_array(b_g2, "b_g2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "last"),
        numpy_helper.from_array(np.array([-7], dtype=np.int64), "before_first"),
        numpy_helper.from_array(np.array([-2], dtype=np.int64), "back2"),
        numpy_helper.from_array(np.array(-1, dtype=np.int64), "last_scalar"),
        numpy_helper.from_array(np.array([hidden], dtype=np.int64), "hidden"),
        numpy_helper.from_array(weights(rng, 10, 8), "head_w"),
    ]
    nodes = [
        # An LSTM with its initial h, from window and h0 (ONNX Runtime runs layout 0 only:
        # see cuda_lstm_layout1 for the batch-first layout).
        helper.make_node("Transpose", ["window"], ["window_t"], perm=[1, 0, 2]),
        helper.make_node("Unsqueeze", ["h0", "axis0"], ["h0_3"]),
        helper.make_node("LSTM", ["window_t", "w_lstm", "r_lstm", "b_lstm", "", "h0_3"],
                         ["lstm_y", "lstm_h", "lstm_c"], hidden_size=hidden),
        # Y [6, 1, batch, 5] -> [6, batch, 5] for a GRU, its zeros made from its shape.
        helper.make_node("Squeeze", ["lstm_y", "axis1"], ["lstm_seq_t"]),
        helper.make_node("Shape", ["lstm_seq_t"], ["seq_shape"]),
        helper.make_node("Gather", ["seq_shape", "axis1"], ["batch_dim"], axis=0),
        helper.make_node("Concat", ["axis1", "batch_dim", "hidden"], ["zeros_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["zeros_shape"], ["zeros"],
                         value=numpy_helper.from_array(np.array([0.0], dtype=np.float32))),
        helper.make_node("GRU", ["lstm_seq_t", "w_g1", "r_g1", "b_g1", "", "zeros"],
                         ["gru_y", "gru_h"], hidden_size=hidden, linear_before_reset=1),
        # The GRU's every other step, newest first: Y [6, 1, batch, 5] sliced with step -2.
        helper.make_node("Slice", ["gru_y", "last", "before_first", "axis0", "back2"],
                         ["gru_every_other"]),
        helper.make_node("Squeeze", ["gru_every_other", "axis1"], ["gru_picked"]),
        helper.make_node("Transpose", ["gru_picked"], ["gru_seq"], perm=[1, 0, 2]),
        # A second GRU (reset before the product) on the LSTM's sequence, its last step.
        helper.make_node("GRU", ["lstm_seq_t", "w_g2", "r_g2", "b_g2"], ["gru2_y"],
                         hidden_size=hidden, linear_before_reset=0),
        helper.make_node("Gather", ["gru2_y", "last_scalar"], ["gru2_last_3"], axis=0),
        helper.make_node("Squeeze", ["gru2_last_3", "axis0"], ["gru2_last"]),
        # The LSTM's cell state beside the second GRU's last step, then a product.
        helper.make_node("Squeeze", ["lstm_c", "axis0"], ["c_last"]),
        helper.make_node("Concat", ["c_last", "gru2_last"], ["joined"], axis=1),
        # A transpose of the non-batch axes: [batch, 5, 2] -> [batch, 2, 5], flattened.
        helper.make_node("Reshape", ["joined", "joined_shape"], ["joined_3"]),
        helper.make_node("Transpose", ["joined_3"], ["swapped"], perm=[0, 2, 1]),
        helper.make_node("Flatten", ["swapped"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "head_w"], ["y"]),
    ]
    init.append(numpy_helper.from_array(np.array([0, 5, 2], dtype=np.int64), "joined_shape"))
    graph = helper.make_graph(
        nodes, "cuda_sequence_ops",
        [helper.make_tensor_value_info("window", TensorProto.FLOAT, ["batch", seq, features]),
         helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["batch", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("gru_seq", TensorProto.FLOAT, ["batch", 3, hidden]),
         helper.make_tensor_value_info("joined", TensorProto.FLOAT, ["batch", 2 * hidden])],
        init,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def lstm_layouts(rng):
    """One LSTM over window [batch, 6, 4] with initial states h0, c0 [batch, 5], written in
    layout 0 (with Transposes) and in layout 1 (batch first): outputs y [batch, 6, 5], h and c
    [batch, 5]. ONNX Runtime runs only the first."""
    w, r, b = weights(rng, 1, 20, 4), weights(rng, 1, 20, 5), weights(rng, 1, 40, scale=0.1)
    init = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(r, "r"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2")]
    io = ([helper.make_tensor_value_info("window", TensorProto.FLOAT, ["batch", 6, 4]),
           helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["batch", 5]),
           helper.make_tensor_value_info("c0", TensorProto.FLOAT, ["batch", 5])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6, 5]),
           helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", 5]),
           helper.make_tensor_value_info("c", TensorProto.FLOAT, ["batch", 5])])
    layout0 = [
        helper.make_node("Transpose", ["window"], ["window_t"], perm=[1, 0, 2]),
        helper.make_node("Unsqueeze", ["h0", "axis0"], ["h0_3"]),
        helper.make_node("Unsqueeze", ["c0", "axis0"], ["c0_3"]),
        helper.make_node("LSTM", ["window_t", "w", "r", "b", "", "h0_3", "c0_3"],
                         ["y4", "h3", "c3"], hidden_size=5),
        helper.make_node("Squeeze", ["y4", "axis1"], ["y_t"]),
        helper.make_node("Transpose", ["y_t"], ["y"], perm=[1, 0, 2]),
        helper.make_node("Squeeze", ["h3", "axis0"], ["h"]),
        helper.make_node("Squeeze", ["c3", "axis0"], ["c"]),
    ]
    layout1 = [
        helper.make_node("Unsqueeze", ["h0", "axis1"], ["h0_3"]),
        helper.make_node("Unsqueeze", ["c0", "axis1"], ["c0_3"]),
        helper.make_node("LSTM", ["window", "w", "r", "b", "", "h0_3", "c0_3"],
                         ["y4", "h3", "c3"], hidden_size=5, layout=1),
        helper.make_node("Squeeze", ["y4", "axis2"], ["y"]),
        helper.make_node("Squeeze", ["h3", "axis1"], ["h"]),
        helper.make_node("Squeeze", ["c3", "axis1"], ["c"]),
    ]
    return [helper.make_model(helper.make_graph(nodes, name, *io, init),
                              opset_imports=[helper.make_opsetid("", OPSET)])
            for nodes, name in [(layout0, "cuda_lstm_layout0"), (layout1, "cuda_lstm_layout1")]]


def conv1d(rng):
    """x [batch, 4, 16] (features over time) through three one-axis convolutions: padded
    with a bias and a Relu; strided, dilated and grouped; SAME_UPPER with a stride; a head
    on the flattened result. Output y [batch, 3]."""
    init = [
        numpy_helper.from_array(weights(rng, 6, 4, 3), "c1_w"),
        numpy_helper.from_array(weights(rng, 6, scale=0.1), "c1_b"),
        numpy_helper.from_array(weights(rng, 6, 3, 3), "c2_w"),
        numpy_helper.from_array(weights(rng, 4, 6, 2), "c3_w"),
        numpy_helper.from_array(weights(rng, 16, 3), "head_w"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c1_w", "c1_b"], ["c1"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2_w"], ["c2"], kernel_shape=[3], strides=[2],
                         dilations=[2], group=2, pads=[2, 1]),
        helper.make_node("Conv", ["c2", "c3_w"], ["c3"], strides=[2], auto_pad="SAME_UPPER"),
        helper.make_node("Flatten", ["c3"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "head_w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "cuda_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        init,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def refused_lstm(rng, name, **variant):
    """An LSTM over window [batch, 6, 4] in a variant the CUDA engine refuses."""
    directions = 2 if variant.get("direction") == "bidirectional" else 1
    w, r, b = (np.concatenate([m] * directions)
               for m in (weights(rng, 1, 20, 4), weights(rng, 1, 20, 5),
                         weights(rng, 1, 40, scale=0.1)))
    init = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(r, "r"),
            numpy_helper.from_array(b, "b")]
    inputs = ["window", "w", "r", "b"]
    if variant.pop("peepholes", False):
        init.append(numpy_helper.from_array(weights(rng, 1, 15, scale=0.1), "p"))
        inputs += ["", "", "", "p"]
    inputs[0] = "window_t"
    nodes = [
        helper.make_node("Transpose", ["window"], ["window_t"], perm=[1, 0, 2]),
        helper.make_node("LSTM", inputs, ["", "h"], hidden_size=5, **variant),
        helper.make_node("Transpose", ["h"], ["h_t"], perm=[1, 0, 2]),
        helper.make_node("Flatten", ["h_t"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("window", TensorProto.FLOAT, ["batch", 6, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5 * directions])],
        init,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def hostile_geometry(root):
    """Models whose numbers wrap size arithmetic (the CUDA importer refuses each, naming
    the node): hostile_conv_kernel0, a convolution whose weight has a kernel of 0;
    hostile_lstm_huge, an LSTM of hidden size 2^62 whose empty weights match 4 x 2^62
    wrapped to 0; hostile_negative_dim, a MatMul weight with a negative dimension. Saved
    without onnx's checker, which a hostile file would not pass either."""
    def unchecked(graph, name):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        model.producer_name = "tickserve-make-models"
        path = root / name / "1"
        path.mkdir(parents=True, exist_ok=True)
        (path / "model.onnx").write_bytes(model.SerializeToString())

    unchecked(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]),
         helper.make_node("Flatten", ["c"], ["y"], axis=1)], "hostile_conv_kernel0",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 0], [])]), "hostile_conv_kernel0")
    hidden = 2 ** 62
    unchecked(helper.make_graph(
        [helper.make_node("Transpose", ["window"], ["window_t"], perm=[1, 0, 2]),
         helper.make_node("LSTM", ["window_t", "w", "r"], ["", "h"], hidden_size=hidden),
         helper.make_node("Transpose", ["h"], ["h_t"], perm=[1, 0, 2]),
         helper.make_node("Flatten", ["h_t"], ["y"], axis=1)], "hostile_lstm_huge",
        [helper.make_tensor_value_info("window", TensorProto.FLOAT, ["batch", 6, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [helper.make_tensor("w", TensorProto.FLOAT, [1, 0, 4], []),
         helper.make_tensor("r", TensorProto.FLOAT, [1, 0, hidden], [])]), "hostile_lstm_huge")
    negative = helper.make_tensor("w", TensorProto.FLOAT, [4, 2], np.zeros(8, np.float32))
    negative.dims[:] = [-4, -2]
    unchecked(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "hostile_negative_dim",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [negative]), "hostile_negative_dim")


def sample_repository(root):
    save(mlp(np.random.default_rng(1), "alpha_mlp", 50, 64, 3, softmax=True,
             out_name="probabilities"), root, "alpha_mlp")
    save(lstm(np.random.default_rng(2), "seq_lstm", 30, 8, 16), root, "seq_lstm")
    save(lstm_step(np.random.default_rng(2), "seq_lstm_step", 8, 16), root, "seq_lstm_step",
         config=SEQ_LSTM_STEP_TOML)
    save(lstm(np.random.default_rng(2), "seq_lstm", 30, 8, 16), root, "seq_lstm_window",
         config=SEQ_LSTM_WINDOW_TOML)
    for i in range(8):
        save(mlp(np.random.default_rng(100 + i), "tick_mlp", 16, 32, 1), root, f"tick_{i:03d}")


def fixtures(root):
    """Models that exercise the loader's and the front ends' edge cases."""
    # Two versions of one model, both served (the default policy serves the
    # highest only), each with a label: the highest is the default.
    save(mlp(np.random.default_rng(10), "versioned", 4, 8, 2), root, "versioned", 1)
    save(mlp(np.random.default_rng(11), "versioned", 4, 8, 2), root, "versioned", 2,
         config='version_policy = "all"\n\n[labels]\nstable = 1\ncanary = 2\n')
    # A dynamic sequence dimension, unfixed: refused at load, naming the dimension.
    save(lstm(np.random.default_rng(12), "dyn_seq", 10, 4, 8, seq_dim="seq"), root, "dyn_seq")
    # The same, fixed in model.toml, with small buckets and a small row limit.
    save(lstm(np.random.default_rng(12), "dyn_seq_fixed", 10, 4, 8, seq_dim="seq"), root,
         "dyn_seq_fixed", config='buckets = [1, 2, 4]\nmax_request_rows = 8\n\n[dimensions]\nseq = 10\n')
    # Several inputs of several datatypes.
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.DOUBLE),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.DOUBLE),
        helper.make_node("Mul", ["ids_f", "mask_f"], ["masked"]),
        helper.make_node("Add", ["masked", "scale"], ["total"]),
        helper.make_node("Cast", ["total"], ["total_i"], to=TensorProto.INT32),
    ]
    graph = helper.make_graph(
        nodes, "typed_io",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", 3]),
         helper.make_tensor_value_info("scale", TensorProto.DOUBLE, ["batch", 3])],
        [helper.make_tensor_value_info("total", TensorProto.DOUBLE, ["batch", 3]),
         helper.make_tensor_value_info("total_i", TensorProto.INT32, ["batch", 3])],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), root, "typed_io")
    # A gradient-boosted tree ensemble: reads NaN as a missing value, so NaN is allowed.
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["features"], ["score"], domain="ai.onnx.ml",
        n_targets=1, nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2],
        nodes_featureids=[0, 0, 0], nodes_values=[0.5, 0.0, 0.0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0],
        nodes_falsenodeids=[2, 0, 0], nodes_missing_value_tracks_true=[1, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
        target_weights=[-1.0, 1.0], aggregate_function="SUM",
    )
    graph = helper.make_graph(
        [tree], "tree_gbt",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                 helper.make_opsetid("ai.onnx.ml", 3)]),
         root, "tree_gbt")
    # Every op of the CUDA engine's set in one graph, with two outputs.
    save(every_cuda_op(np.random.default_rng(13)), root, "cuda_ops")
    save(every_sequence_op(np.random.default_rng(14)), root, "cuda_sequence_ops")
    save(conv1d(np.random.default_rng(17)), root, "cuda_conv")
    conv2d = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[2, 2]),
         helper.make_node("Flatten", ["c"], ["y"], axis=1)], "cuda_conv2d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(weights(np.random.default_rng(18), 1, 1, 2, 2), "w")])
    save(helper.make_model(conv2d, opset_imports=[helper.make_opsetid("", OPSET)]), root,
         "cuda_conv2d")
    for model in lstm_layouts(np.random.default_rng(16)):
        save(model, root, model.graph.name)
    hostile_geometry(root)
    save(refused_lstm(np.random.default_rng(15), "cuda_bidirectional", direction="bidirectional"),
         root, "cuda_bidirectional")
    save(refused_lstm(np.random.default_rng(15), "cuda_peephole", peepholes=True), root,
         "cuda_peephole")
    # Rows that depend on each other (each row minus the mean over the batch):
    # served without batching requests together, or refused when model.toml says so.
    for name, config in [("batch_mean", None), ("batch_mean_refused", 'mixed_rows = "refuse"\n')]:
        graph = helper.make_graph(
            [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1),
             helper.make_node("Sub", ["x", "mean"], ["centered"])],
            name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
            [helper.make_tensor_value_info("centered", TensorProto.FLOAT, ["batch", 4])],
        )
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), root, name,
             config=config)
    # TF Serving's half_plus_two (y = 0.5 x + 2, one float per row), named as
    # tf2onnx names tensors ("x:0"), at TF Serving's test version 123; NaN passes
    # (TF Serving's JSON conformance examples send it).
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x:0", "half"], ["halved"]),
         helper.make_node("Add", ["halved", "two"], ["y:0"])],
        "half_plus_two",
        [helper.make_tensor_value_info("x:0", TensorProto.FLOAT, ["batch"])],
        [helper.make_tensor_value_info("y:0", TensorProto.FLOAT, ["batch"])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
         numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), root,
         "half_plus_two", 123, config='nan_policy = "allow"\n')
    # Two inputs of two datatypes and two outputs, for TF Serving's named rows and columns:
    # total = sum(signal) + sum(sensor), doubled = 2 sensor.
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["signal:0", "axis1"], ["signal_sum"], keepdims=0),
         helper.make_node("ReduceSum", ["sensor", "axes12"], ["sensor_sum"], keepdims=0),
         helper.make_node("Cast", ["sensor_sum"], ["sensor_sum_f"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["signal_sum", "sensor_sum_f"], ["total"]),
         helper.make_node("Mul", ["sensor", "two_i"], ["doubled:0"])],
        "tf_two_inputs",
        [helper.make_tensor_value_info("signal:0", TensorProto.FLOAT, ["batch", 5]),
         helper.make_tensor_value_info("sensor", TensorProto.INT64, ["batch", 2, 2])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch"]),
         helper.make_tensor_value_info("doubled:0", TensorProto.INT64, ["batch", 2, 2])],
        [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
         numpy_helper.from_array(np.array([1, 2], np.int64), "axes12"),
         numpy_helper.from_array(np.array(2, np.int64), "two_i")],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), root,
         "tf_two_inputs")
    # Not an ONNX file at all: refused at load while the others serve.
    bad = root / "broken" / "1"
    bad.mkdir(parents=True, exist_ok=True)
    (bad / "model.onnx").write_bytes(b"this is not an onnx model")


def stacked_lstm_weights(rng, features, hidden, layers):
    """Each layer's input, recurrent and bias weights, then a one-output head."""
    out = []
    for layer in range(layers):
        width = features if layer == 0 else hidden
        out += [numpy_helper.from_array(weights(rng, 1, 4 * hidden, width), f"w{layer + 1}"),
                numpy_helper.from_array(weights(rng, 1, 4 * hidden, hidden), f"r{layer + 1}"),
                numpy_helper.from_array(weights(rng, 1, 8 * hidden, scale=0.1), f"b{layer + 1}")]
    out += [numpy_helper.from_array(weights(rng, 1, hidden), "head_w"),
            numpy_helper.from_array(weights(rng, 1, scale=0.1), "head_b")]
    return out


def bench_lstm_step(rng, features=32, hidden=128, layers=2):
    """One tick of a stacked LSTM: each layer's h and c come in and go out."""
    init = stacked_lstm_weights(rng, features, hidden, layers)
    init.append(numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"))
    nodes = [helper.make_node("Unsqueeze", ["tick", "axes"], ["x0"])]
    inputs = [helper.make_tensor_value_info("tick", TensorProto.FLOAT, ["batch", features])]
    outputs = []
    for layer in range(1, layers + 1):
        nodes += [
            helper.make_node("Unsqueeze", [f"h{layer}_in", "axes"], [f"h{layer}_0"]),
            helper.make_node("Unsqueeze", [f"c{layer}_in", "axes"], [f"c{layer}_0"]),
            helper.make_node("LSTM", [f"x{layer - 1}", f"w{layer}", f"r{layer}", f"b{layer}", "",
                                      f"h{layer}_0", f"c{layer}_0"],
                             [f"y{layer}", f"h{layer}_1", f"c{layer}_1"], hidden_size=hidden),
            # Y is [seq 1, directions 1, batch, hidden]: the next layer's [1, batch, hidden].
            helper.make_node("Squeeze", [f"y{layer}", "axes"], [f"x{layer}"]),
            helper.make_node("Squeeze", [f"h{layer}_1", "axes"], [f"h{layer}_out"]),
            helper.make_node("Squeeze", [f"c{layer}_1", "axes"], [f"c{layer}_out"]),
        ]
        for name in (f"h{layer}", f"c{layer}"):
            inputs.append(helper.make_tensor_value_info(f"{name}_in", TensorProto.FLOAT,
                                                        ["batch", hidden]))
            outputs.append(helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT,
                                                         ["batch", hidden]))
    nodes.append(helper.make_node("Gemm", [f"h{layers}_out", "head_w", "head_b"], ["prediction"],
                                  transB=1))
    outputs.insert(0, helper.make_tensor_value_info("prediction", TensorProto.FLOAT, ["batch", 1]))
    graph = helper.make_graph(nodes, "bench_lstm", inputs, outputs, init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def bench_lstm_window(rng, seq=100, features=32, hidden=128, layers=2):
    """The same stacked LSTM (the same weights for the same generator) on a window."""
    init = stacked_lstm_weights(rng, features, hidden, layers)
    init.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"))
    init.append(numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"))
    nodes = [helper.make_node("Transpose", ["window"], ["x0"], perm=[1, 0, 2])]
    for layer in range(1, layers + 1):
        nodes += [
            helper.make_node("LSTM", [f"x{layer - 1}", f"w{layer}", f"r{layer}", f"b{layer}"],
                             [f"y{layer}", f"h{layer}"], hidden_size=hidden),
            helper.make_node("Squeeze", [f"y{layer}", "axis1"], [f"x{layer}"]),
        ]
    nodes += [helper.make_node("Squeeze", [f"h{layers}", "axis0"], ["h_last"]),
              helper.make_node("Gemm", ["h_last", "head_w", "head_b"], ["prediction"], transB=1)]
    graph = helper.make_graph(
        nodes, "bench_lstm_window",
        [helper.make_tensor_value_info("window", TensorProto.FLOAT, ["batch", seq, features])],
        [helper.make_tensor_value_info("prediction", TensorProto.FLOAT, ["batch", 1])],
        init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def bench_trees(rng, trees=500, depth=6, features=64):
    """A regression tree ensemble: `trees` full binary trees of `depth`, random splits."""
    attrs = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values",
                             "nodes_modes", "nodes_truenodeids", "nodes_falsenodeids",
                             "nodes_missing_value_tracks_true", "target_treeids",
                             "target_nodeids", "target_ids", "target_weights")}
    inner = 2 ** depth - 1
    for tree in range(trees):
        for node in range(2 * inner + 1):
            leaf = node >= inner
            attrs["nodes_treeids"].append(tree)
            attrs["nodes_nodeids"].append(node)
            attrs["nodes_featureids"].append(0 if leaf else int(rng.integers(features)))
            attrs["nodes_values"].append(0.0 if leaf else float(rng.standard_normal()))
            attrs["nodes_modes"].append("LEAF" if leaf else "BRANCH_LEQ")
            attrs["nodes_truenodeids"].append(0 if leaf else 2 * node + 1)
            attrs["nodes_falsenodeids"].append(0 if leaf else 2 * node + 2)
            attrs["nodes_missing_value_tracks_true"].append(0 if leaf else 1)
            if leaf:
                attrs["target_treeids"].append(tree)
                attrs["target_nodeids"].append(node)
                attrs["target_ids"].append(0)
                attrs["target_weights"].append(float(rng.standard_normal() * 0.01))
    node = helper.make_node("TreeEnsembleRegressor", ["features"], ["score"], domain="ai.onnx.ml",
                            n_targets=1, aggregate_function="SUM", **attrs)
    graph = helper.make_graph(
        [node], "bench_trees",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                   helper.make_opsetid("ai.onnx.ml", 3)])


BENCH_LSTM_TOML = """\
# One tick of a 2-layer LSTM, stateful: clients send only `tick`; the server keeps each
# layer's h and c per sequence (docs/sequences.md).
[sequence]
max_sequence_idle = "0s"
max_sequences = 65536
""" + "".join(f'\n[[sequence.state]]\ninput = "{n}_in"\noutput = "{n}_out"\n'
              for n in ("h1", "c1", "h2", "c2"))

BENCH_LSTM_WINDOW_TOML = """\
# The same LSTM on each sequence's last 100 ticks, kept by the server (docs/sequences.md).
[sequence]
max_sequence_idle = "0s"
max_sequences = 65536
window_warmup = "pad"

[[sequence.window]]
input = "window"
"""


def gru_step(rng, name, features, hidden, linear_before_reset):
    """One tick of a GRU: the state h comes in and out, a one-output head."""
    init = [
        numpy_helper.from_array(weights(rng, 1, 3 * hidden, features), "gru_w"),
        numpy_helper.from_array(weights(rng, 1, 3 * hidden, hidden), "gru_r"),
        numpy_helper.from_array(weights(rng, 1, 6 * hidden, scale=0.1), "gru_b"),
        numpy_helper.from_array(weights(rng, 1, hidden), "head_w"),
        numpy_helper.from_array(weights(rng, 1, scale=0.1), "head_b"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["tick", "axes"], ["x"]),
        helper.make_node("Unsqueeze", ["h_in", "axes"], ["h0"]),
        helper.make_node("GRU", ["x", "gru_w", "gru_r", "gru_b", "", "h0"], ["", "h1"],
                         hidden_size=hidden, linear_before_reset=linear_before_reset),
        helper.make_node("Squeeze", ["h1", "axes"], ["h_out"]),
        helper.make_node("Gemm", ["h_out", "head_w", "head_b"], ["prediction"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("tick", TensorProto.FLOAT, ["batch", features]),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["batch", hidden])],
        [helper.make_tensor_value_info("prediction", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["batch", hidden])],
        init,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


GRU_STEP_TOML = """\
# One tick of a GRU, stateful: the server keeps h per sequence.
[[sequence.state]]
input = "h_in"
output = "h_out"
"""


def steps_repository(root):
    """One-tick recurrent models (scripts/dev/make_models.py --steps)."""
    save(gru_step(np.random.default_rng(600), "gru_step", 6, 24, 1), root, "gru_step",
         config=GRU_STEP_TOML)
    save(gru_step(np.random.default_rng(601), "gru_step_reset0", 6, 24, 0), root,
         "gru_step_reset0", config=GRU_STEP_TOML)


def bench_repository(root):
    """The per-tick benchmark's models (scripts/dev/make_models.py --bench)."""
    save(bench_lstm_step(np.random.default_rng(500)), root, "bench_lstm", config=BENCH_LSTM_TOML)
    save(bench_lstm_window(np.random.default_rng(500)), root, "bench_lstm_window",
         config=BENCH_LSTM_WINDOW_TOML)
    save(bench_trees(np.random.default_rng(501)), root, "bench_trees")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=pathlib.Path)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--fixtures", action="store_true",
                       help="write the test fixtures instead of the sample repository")
    which.add_argument("--bench", action="store_true",
                       help="write the per-tick benchmark's models instead")
    which.add_argument("--steps", action="store_true",
                       help="write the one-tick recurrent models instead")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    if args.fixtures:
        fixtures(args.root)
    elif args.bench:
        bench_repository(args.root)
    elif args.steps:
        steps_repository(args.root)
    else:
        sample_repository(args.root)


if __name__ == "__main__":
    main()
