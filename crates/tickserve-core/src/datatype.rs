//! Tensor element types, named as the v2 inference protocol names them.
//!
//! Front ends parse the protocol's datatype strings into [`DataType`]; engines
//! map it to their own element types. Data always travels as little-endian
//! bytes, `size()` bytes per element (BOOL is one byte, 0 or 1).

use std::fmt;

/// An element type a tickserve model can take or give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `BOOL`: one byte, 0 or 1.
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

impl DataType {
    /// Every supported datatype.
    pub const ALL: [DataType; 11] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp32,
        DataType::Fp64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
        }
    }

    /// The protocol's name for this datatype (`"FP32"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
        }
    }

    /// Parses the protocol's name for a datatype; `None` for names tickserve
    /// does not serve (`FP16`, `BF16`, `BYTES`) or does not know.
    pub fn parse(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// True for FP32 and FP64, the types that can hold NaN or infinity.
    pub const fn is_float(self) -> bool {
        matches!(self, DataType::Fp32 | DataType::Fp64)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::parse(d.as_str()), Some(d));
        }
        assert_eq!(DataType::parse("FP16"), None);
        assert_eq!(DataType::parse("fp32"), None);
    }
}
