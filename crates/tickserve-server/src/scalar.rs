//! JSON numbers written as tensor bytes: [`push_scalar`], what both JSON
//! front ends (v2's `data` and TF Serving's `instances` / `inputs`) do with
//! each number, and [`json_to_bytes`], v2's `data` list (flat or nested)
//! read through it.

use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde_json::value::RawValue;
use tickserve_core::{DataType, Error};

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

/// Converts JSON tensor data (flat or nested, row-major) straight into
/// little-endian bytes of `datatype`, reading no more elements than `shape`
/// holds (the validation that follows says what was wrong).
pub fn json_to_bytes(
    model: &str,
    input: &str,
    datatype: DataType,
    shape: &[i64],
    raw: &RawValue,
) -> Result<Vec<u8>, Error> {
    let text = raw.get();
    // Each JSON element takes at least two bytes ("0,"), so the text bounds
    // the element count whatever the shape claims.
    let elements = shape
        .iter()
        .try_fold(1usize, |n, &d| {
            usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
        })
        .unwrap_or(usize::MAX)
        .min(text.len() / 2 + 1);
    let mut out = Vec::with_capacity(elements.saturating_mul(datatype.size()));
    let mut count = 0usize;
    let mut reader = serde_json::Deserializer::from_str(text);
    let seed = Elements {
        datatype,
        out: &mut out,
        count: &mut count,
        limit: elements,
    };
    seed.deserialize(&mut reader)
        .and_then(|()| reader.end())
        .map_err(|e| {
            let what = e.to_string();
            // Our own messages carry " at element N"; serde's line/column
            // positions mean nothing to a client here.
            let what = what.split(" at line ").next().unwrap_or(&what).to_string();
            Error::input(model, input, format!("{datatype} values"), what)
        })?;
    Ok(out)
}

/// Reads tensor elements of one datatype into `out`, nested lists flattened.
struct Elements<'o> {
    datatype: DataType,
    out: &'o mut Vec<u8>,
    count: &'o mut usize,
    limit: usize,
}

impl Elements<'_> {
    fn reborrow(&mut self) -> Elements<'_> {
        Elements {
            datatype: self.datatype,
            out: self.out,
            count: self.count,
            limit: self.limit,
        }
    }

    fn push<E: de::Error>(self, value: Scalar) -> Result<(), E> {
        let index = *self.count;
        if index >= self.limit {
            return Err(E::custom(format!(
                "more elements than the shape holds ({} at least)",
                index + 1
            )));
        }
        push_scalar(self.out, self.datatype, value)
            .map_err(|what| E::custom(format!("{what} at element {index}")))?;
        *self.count += 1;
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Elements<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Elements<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} values, flat or nested in lists", self.datatype)
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.reborrow())?.is_some() {}
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.push(Scalar::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.push(Scalar::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.push(Scalar::Uint(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.push(Scalar::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        let index = *self.count;
        Err(E::custom(format!(
            "the string {} at element {index}",
            tickserve_core::text::quote(v)
        )))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        let index = *self.count;
        Err(E::custom(format!("null at element {index}")))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        let index = *self.count;
        Err(de::Error::custom(format!("an object at element {index}")))
    }
}
