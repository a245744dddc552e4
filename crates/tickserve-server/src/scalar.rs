//! A JSON scalar written as tensor bytes: what both JSON front ends (v2's
//! `data` and TF Serving's `instances` / `inputs`) do with each number.

use tickserve_core::DataType;

/// One JSON scalar.
#[derive(Debug, Clone, Copy)]
pub enum Scalar {
    /// `true` or `false`.
    Bool(bool),
    /// A negative integer (or any that fits `i64`).
    Int(i64),
    /// An integer over `i64::MAX`.
    Uint(u64),
    /// Any other number.
    Float(f64),
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Uint(u) => write!(f, "{u}"),
            Scalar::Float(x) => write!(
                f,
                "{}",
                serde_json::Number::from_f64(*x).map_or_else(|| x.to_string(), |n| n.to_string())
            ),
        }
    }
}

/// Appends `v` as `datatype` (little-endian), range-checked; the error names the value.
pub fn push_scalar(out: &mut Vec<u8>, datatype: DataType, v: Scalar) -> Result<(), String> {
    fn int<T: TryFrom<i64> + TryFrom<u64>>(v: Scalar) -> Result<T, String> {
        match v {
            Scalar::Int(i) => T::try_from(i).map_err(|_| format!("{v} (out of range)")),
            Scalar::Uint(u) => T::try_from(u).map_err(|_| format!("{v} (out of range)")),
            _ => Err(format!("{v}")),
        }
    }
    let float = |v: Scalar| match v {
        Scalar::Int(i) => Ok(i as f64),
        Scalar::Uint(u) => Ok(u as f64),
        Scalar::Float(x) => Ok(x),
        Scalar::Bool(_) => Err(format!("{v}")),
    };
    match datatype {
        DataType::Bool => match v {
            Scalar::Bool(b) => out.push(u8::from(b)),
            other => return Err(format!("{other}")),
        },
        DataType::Uint8 => out.extend(int::<u8>(v)?.to_le_bytes()),
        DataType::Uint16 => out.extend(int::<u16>(v)?.to_le_bytes()),
        DataType::Uint32 => out.extend(int::<u32>(v)?.to_le_bytes()),
        DataType::Uint64 => out.extend(int::<u64>(v)?.to_le_bytes()),
        DataType::Int8 => out.extend(int::<i8>(v)?.to_le_bytes()),
        DataType::Int16 => out.extend(int::<i16>(v)?.to_le_bytes()),
        DataType::Int32 => out.extend(int::<i32>(v)?.to_le_bytes()),
        DataType::Int64 => out.extend(int::<i64>(v)?.to_le_bytes()),
        DataType::Fp32 => out.extend((float(v)? as f32).to_le_bytes()),
        DataType::Fp64 => out.extend(float(v)?.to_le_bytes()),
    }
    Ok(())
}
