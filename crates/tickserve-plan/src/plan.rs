//! The forward pass as the engines run it: a list of steps over
//! batch-first fp32 activations, each a product, a row operation or an
//! elementwise pass, followed by a fused chain of elementwise operations.
//!
//! A plan is made once per family by [`crate::import`]. The compiled CPU
//! engine runs it natively; the CUDA engine lowers it into cuBLAS calls and
//! NVRTC kernels, captured as one CUDA graph per bucket. [`crate::reference`]
//! evaluates a plan in plain Rust: the meaning the importer and both engines'
//! kernels are checked against.
//!
//! Every activation is a [`Value`]: for each batch row, `width` contiguous
//! floats (the row-major flattening of the tensor's non-batch dimensions).
//! Weights are referred to by slot; each member of a family fills every slot
//! with its own tensors, and a run reaches them through the member's row of
//! device pointers.

/// Index of an activation in [`Plan::values`].
pub type ValueId = usize;

/// Index of a weight in [`Plan::weights`].
pub type WeightId = usize;

/// An activation: `width` floats per batch row.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    /// Its non-batch dimensions.
    pub dims: Vec<usize>,
    /// Their product: floats per batch row.
    pub width: usize,
}

/// A weight slot: what each member must provide under this name.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightSlot {
    /// The tensor's name in the graph.
    pub name: String,
    /// Its dimensions.
    pub dims: Vec<usize>,
    /// Its element count.
    pub len: usize,
}

/// A binary arithmetic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

impl BinaryOp {
    /// Applies the operation.
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
        }
    }

    /// The C operator.
    pub fn symbol(self) -> char {
        match self {
            BinaryOp::Add => '+',
            BinaryOp::Sub => '-',
            BinaryOp::Mul => '*',
            BinaryOp::Div => '/',
        }
    }
}

/// An operation applied to each element on its own, with its position in the
/// row (`column`, `0..width`) when it reads a weight.
#[derive(Debug, Clone, PartialEq)]
pub enum Elementwise {
    /// `max(x, 0)`.
    Relu,
    /// `x` if positive, else `alpha · x`.
    LeakyRelu(f32),
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `factor · x` (Gemm's alpha).
    Scale(f32),
    /// `x op (coef · w[column % period])`, or `(coef · w[...]) op x` when
    /// `reversed`: a weight broadcast along the row (`period` = its length; 1
    /// for a scalar).
    Weight {
        /// The operation.
        op: BinaryOp,
        /// The weight.
        weight: WeightId,
        /// The weight's length; it repeats along the row.
        period: usize,
        /// The weight is the left operand.
        reversed: bool,
        /// A factor on the weight (Gemm's beta; 1 otherwise).
        coef: f32,
    },
    /// `x + bias[(column / inner) % channels]`: a bias per channel of a
    /// `[channels, inner]` row (a convolution's).
    ChannelBias {
        /// One value per channel.
        bias: WeightId,
        /// Channel count.
        channels: usize,
        /// Elements per channel within a row.
        inner: usize,
    },
    /// Inference-mode batch normalization over channel `(column / inner) %
    /// channels`: `(x - mean) / sqrt(var + epsilon) · scale + bias`.
    BatchNorm {
        /// Per-channel scale.
        scale: WeightId,
        /// Per-channel bias.
        bias: WeightId,
        /// Per-channel running mean.
        mean: WeightId,
        /// Per-channel running variance.
        var: WeightId,
        /// Added to the variance.
        epsilon: f32,
        /// Channel count (the first non-batch dimension).
        channels: usize,
        /// Elements per channel within a row (product of the later dimensions).
        inner: usize,
    },
}

/// The main operation of a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `output[m, n] = input[m, k] · W` over `m = batch · groups` rows: `W`
    /// is `[k, n]`, or `[n, k]` when `transposed` (Gemm with `transB`).
    MatMul {
        /// The activation multiplied.
        input: ValueId,
        /// The weight matrix.
        weight: WeightId,
        /// `W` is stored `[n, k]`.
        transposed: bool,
        /// Product rows per batch row (`input.width / k`).
        groups: usize,
        /// Inner dimension.
        k: usize,
        /// Output columns.
        n: usize,
    },
    /// `output = a op b`, elementwise over two activations of equal shape.
    Binary {
        /// Left operand.
        a: ValueId,
        /// Right operand.
        b: ValueId,
        /// The operation.
        op: BinaryOp,
    },
    /// Softmax over consecutive segments of `segment` elements of each row.
    Softmax {
        /// The activation.
        input: ValueId,
        /// Elements normalised together.
        segment: usize,
    },
    /// Layer normalization over consecutive segments of `segment` elements:
    /// `(x - mean) / sqrt(var + epsilon) · scale + bias`.
    LayerNorm {
        /// The activation.
        input: ValueId,
        /// Scale, `segment` long.
        scale: WeightId,
        /// Bias, `segment` long, if any.
        bias: Option<WeightId>,
        /// Added to the variance.
        epsilon: f32,
        /// Elements normalised together.
        segment: usize,
    },
    /// `output = input` (the start of an elementwise chain that could not be
    /// fused into the step that made its input).
    Copy {
        /// The activation copied.
        input: ValueId,
    },
    /// Each row's floats picked by position: element `j` of an output row,
    /// as the multi-index `(o_0, …)` over `dims`, is input element
    /// `offset + Σ o_d · strides[d]` of the same row. A transpose of the
    /// non-batch axes, a slice (steps of any sign) and a gather of one index
    /// are each one of these.
    Rearrange {
        /// The activation read.
        input: ValueId,
        /// The output row's dimensions.
        dims: Vec<usize>,
        /// Input elements between neighbours along each output dimension.
        strides: Vec<isize>,
        /// The input element of output element 0.
        offset: usize,
    },
    /// Rows joined piece by piece: each output row is, for each of `outer`
    /// blocks, `chunks[i]` floats of input `i` in turn.
    Concat {
        /// The activations joined, in order.
        inputs: Vec<ValueId>,
        /// Blocks per row (the product of the dimensions before the axis).
        outer: usize,
        /// Floats each input adds to a block.
        chunks: Vec<usize>,
    },
    /// A recurrent layer over a window: the step's output is the last
    /// hidden state.
    Recurrent(Box<Recurrent>),
    /// A convolution over one axis (ONNX Conv on `[batch, channels,
    /// length]`): `out[m, l] = Σ_c Σ_k x[c, l·stride + k·dilation − pad] ·
    /// w[m, c, k]` over the channels of `m`'s group, zero outside the input.
    Conv1d(Box<Conv1d>),
}

/// A one-axis convolution's shape (see [`Op::Conv1d`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conv1d {
    /// The activation, `channels × length` per row.
    pub input: ValueId,
    /// Weights, `[out_channels, channels / groups, kernel]`.
    pub weight: WeightId,
    /// Input channels.
    pub channels: usize,
    /// Input length.
    pub length: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel width.
    pub kernel: usize,
    /// Step between outputs.
    pub stride: usize,
    /// Step between a kernel's taps.
    pub dilation: usize,
    /// Zeros before the input.
    pub pad: usize,
    /// Channel groups.
    pub groups: usize,
    /// Output length.
    pub out_length: usize,
}

/// A recurrent cell, as ONNX defines it (its default activations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    /// LSTM, gates `i, o, f, c`: `c_t = f ⊙ c_{t-1} + i ⊙ tanh(·)`,
    /// `h_t = o ⊙ tanh(c_t)`, `i, o, f` sigmoids.
    Lstm,
    /// GRU, gates `z, r, h`: `h_t = (1 - z) ⊙ ĥ + z ⊙ h_{t-1}`, where the
    /// candidate `ĥ = tanh(x·W_hᵀ + r ⊙ (h_{t-1}·R_hᵀ + Rb_h) + Wb_h)` when
    /// `linear_before_reset`, else `tanh(x·W_hᵀ + (r ⊙ h_{t-1})·R_hᵀ + Rb_h
    /// + Wb_h)`.
    Gru {
        /// ONNX's `linear_before_reset` (PyTorch's and Keras's default GRU).
        linear_before_reset: bool,
    },
}

impl Cell {
    /// Gates per hidden unit: 4 (LSTM) or 3 (GRU).
    pub fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru { .. } => 3,
        }
    }
}

/// A forward recurrent layer (ONNX LSTM or GRU, one direction) over every
/// step of each row's window.
#[derive(Debug, Clone, PartialEq)]
pub struct Recurrent {
    /// The cell.
    pub cell: Cell,
    /// The window: `steps × input_size` floats per row, step-major.
    pub input: ValueId,
    /// The initial hidden state (`hidden` per row); zeros when absent.
    pub initial_h: Option<ValueId>,
    /// The LSTM's initial cell state; zeros when absent.
    pub initial_c: Option<ValueId>,
    /// Input weights, `[gates · hidden, input_size]`.
    pub w: WeightId,
    /// Recurrent weights, `[gates · hidden, hidden]`.
    pub r: WeightId,
    /// Biases, `[2 · gates · hidden]`: the input's then the recurrence's.
    pub b: Option<WeightId>,
    /// Window length.
    pub steps: usize,
    /// Floats per step of the window.
    pub input_size: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Every step's hidden state (`steps × hidden` per row), if read.
    pub sequence: Option<ValueId>,
    /// The LSTM's last cell state (`hidden` per row), if read.
    pub last_c: Option<ValueId>,
}

/// One step: its operation, then its fused elementwise chain, into `output`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The main operation.
    pub op: Op,
    /// Applied to each element of the operation's result, in order.
    pub epilogue: Vec<Elementwise>,
    /// Where the result goes.
    pub output: ValueId,
    /// The ONNX nodes this step carries out, for logs.
    pub nodes: Vec<String>,
}

/// A model's forward pass, independent of the batch size.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Every activation.
    pub values: Vec<Value>,
    /// Graph inputs, in the signature's order: name and value.
    pub inputs: Vec<(String, ValueId)>,
    /// Graph outputs, in the graph's order: name and value.
    pub outputs: Vec<(String, ValueId)>,
    /// Weight slots, in the order members provide them.
    pub weights: Vec<WeightSlot>,
    /// Constants read at import that shape the plan (a Reshape's shape): a
    /// member whose own copy differs cannot join.
    pub baked: Vec<(String, Vec<u8>)>,
    /// The steps, in execution order.
    pub steps: Vec<Step>,
}

impl Plan {
    /// How many steps are products (cuBLAS calls) and how many are kernels.
    pub fn counts(&self) -> (usize, usize) {
        let products = self
            .steps
            .iter()
            .filter(|s| matches!(s.op, Op::MatMul { .. }))
            .count();
        let kernels = self
            .steps
            .iter()
            .filter(|s| !matches!(s.op, Op::MatMul { .. }) || !s.epilogue.is_empty())
            .count();
        (products, kernels)
    }
}
