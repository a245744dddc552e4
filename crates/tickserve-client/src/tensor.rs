//! Tensors as the client sends and receives them.

/// A tensor's element type (the protocol's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    /// `BOOL`, one byte.
    Bool,
    /// `UINT8`.
    Uint8,
    /// `UINT16`.
    Uint16,
    /// `UINT32`.
    Uint32,
    /// `UINT64`.
    Uint64,
    /// `INT8`.
    Int8,
    /// `INT16`.
    Int16,
    /// `INT32`.
    Int32,
    /// `INT64`.
    Int64,
    /// `FP32`.
    Fp32,
    /// `FP64`.
    Fp64,
}

const ALL: [(DataType, &str, usize); 11] = [
    (DataType::Bool, "BOOL", 1),
    (DataType::Uint8, "UINT8", 1),
    (DataType::Uint16, "UINT16", 2),
    (DataType::Uint32, "UINT32", 4),
    (DataType::Uint64, "UINT64", 8),
    (DataType::Int8, "INT8", 1),
    (DataType::Int16, "INT16", 2),
    (DataType::Int32, "INT32", 4),
    (DataType::Int64, "INT64", 8),
    (DataType::Fp32, "FP32", 4),
    (DataType::Fp64, "FP64", 8),
];

impl DataType {
    /// The protocol's name (`FP32`).
    pub fn as_str(self) -> &'static str {
        ALL.iter()
            .find(|(d, _, _)| *d == self)
            .map_or("", |(_, n, _)| n)
    }

    /// The datatype called `name`.
    pub fn parse(name: &str) -> Option<DataType> {
        ALL.iter().find(|(_, n, _)| *n == name).map(|(d, _, _)| *d)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        ALL.iter()
            .find(|(d, _, _)| *d == self)
            .map_or(1, |(_, _, s)| *s)
    }
}

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
