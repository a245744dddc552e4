//! A model's fixed signature: its inputs and outputs, each with a name, a
//! datatype and fixed non-batch dimensions. The batch is always the first
//! dimension and is the only one that varies between requests.
//!
//! The ONNX reader builds signatures at load; validation checks requests
//! against them; executors size bucket buffers from them.

use crate::DataType;

/// One input or output of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name in the model.
    pub name: String,
    /// The element type.
    pub datatype: DataType,
    /// The dimensions after the batch dimension, all fixed.
    pub dims: Vec<usize>,
}

impl TensorSpec {
    /// Elements in one row (the product of the non-batch dimensions).
    pub fn row_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Bytes in one row.
    pub fn row_bytes(&self) -> usize {
        self.row_elements() * self.datatype.size()
    }

    /// The shape as the protocol reports it: `-1` for the batch, then the dims.
    pub fn protocol_shape(&self) -> Vec<i64> {
        std::iter::once(-1)
            .chain(self.dims.iter().map(|&d| d as i64))
            .collect()
    }

    /// The shape of `rows` rows of it: `[rows, dims...]`.
    pub fn shape_of(&self, rows: usize) -> Vec<i64> {
        std::iter::once(i64::try_from(rows).unwrap_or(i64::MAX))
            .chain(self.dims.iter().map(|&d| d as i64))
            .collect()
    }

    /// The shape written for people: `[batch, 30, 8]`.
    pub fn display_shape(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(ToString::to_string).collect();
        if dims.is_empty() {
            "[batch]".to_string()
        } else {
            format!("[batch, {}]", dims.join(", "))
        }
    }
}

/// The inputs and outputs of a model, in the model's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// The model's inputs.
    pub inputs: Vec<TensorSpec>,
    /// The model's outputs.
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    /// The position of the input called `name`.
    pub fn input_index(&self, name: &str) -> Option<usize> {
        self.inputs.iter().position(|t| t.name == name)
    }

    /// The position of the output called `name`.
    pub fn output_index(&self, name: &str) -> Option<usize> {
        self.outputs.iter().position(|t| t.name == name)
    }

    /// A one-line summary: `features FP32 [batch, 50] -> probabilities FP32 [batch, 3]`.
    pub fn summary(&self) -> String {
        let side = |specs: &[TensorSpec]| {
            specs
                .iter()
                .map(|t| format!("{} {} {}", t.name, t.datatype, t.display_shape()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!("{} -> {}", side(&self.inputs), side(&self.outputs))
    }
}
