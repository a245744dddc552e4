//! Tensors as the client sends and receives them.

pub use tickserve_core::DataType;

/// A named tensor: datatype, shape (batch first) and little-endian data.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Its name (the model's input or output).
    pub name: String,
    /// Its element type.
    pub datatype: DataType,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Its elements, little-endian, row-major.
    pub data: Vec<u8>,
}

impl Tensor {
    /// An FP32 tensor of `shape` holding `values`.
    pub fn from_f32(name: &str, shape: &[i64], values: &[f32]) -> Tensor {
        Tensor {
            name: name.to_string(),
            datatype: DataType::Fp32,
            shape: shape.to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// An FP64 tensor of `shape` holding `values`.
    pub fn from_f64(name: &str, shape: &[i64], values: &[f64]) -> Tensor {
        Tensor {
            name: name.to_string(),
            datatype: DataType::Fp64,
            shape: shape.to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// The elements as f32, if it is FP32.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.datatype == DataType::Fp32).then(|| {
            self.data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    /// The elements as f64, if it is FP64.
    pub fn to_f64(&self) -> Option<Vec<f64>> {
        (self.datatype == DataType::Fp64).then(|| {
            self.data
                .chunks_exact(8)
                .map(|c| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(c);
                    f64::from_le_bytes(a)
                })
                .collect()
        })
    }
}
