//! The common `:predict` body read in one pass: `instances` as a list of
//! unnamed values, or `inputs` as one unnamed tensor, for a model of one
//! input. The numbers go straight into the input's bytes as the parser meets
//! them; for a float input of one dimension (a flat list per instance) they
//! are read as numbers directly, without the nesting walk.
//!
//! [`super::super::decode`]'s general reading parses the body into raw JSON values
//! first (to find `signature_name` and the format wherever they are, and
//! whether instances name their inputs), then each instance again, then its
//! numbers: three walks over every number. This reading walks them once, and
//! answers only a body the general reading would accept: anything else (named
//! inputs, `{"b64": ...}`, both formats or neither, any error at all) returns
//! `None`, and the general reading then answers, with its own messages. Both
//! read through serde_json; a unit test checks they decode alike.

use std::borrow::Cow;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tickserve_core::{DataType, InputTensor, Signature, TensorSpec};

use super::super::{Format, Nesting, NestingSeed};

/// The most bytes reserved ahead for one value (the signature's own shape,
/// not the client's, decides it; a model with huge rows grows as it reads).
const MAX_RESERVE: usize = 1 << 20;

/// The body's tensors and its `signature_name`, when it is the common case
/// and reads without an error; `None` for everything else.
pub(in crate::tfserving::json) fn decode(
    signature: &Signature,
    text: &str,
) -> Option<(Option<String>, Format, InputTensor)> {
    let [spec] = signature.inputs.as_slice() else {
        return None;
    };
    let mut body = Body {
        spec,
        signature_name: None,
        read: None,
    };
    let mut reader = serde_json::Deserializer::from_str(text);
    (&mut reader).deserialize_map(&mut body).ok()?;
    reader.end().ok()?;
    let (format, tensor) = body.read?;
    Some((body.signature_name, format, tensor))
}

/// The top-level object being read.
struct Body<'s> {
    spec: &'s TensorSpec,
    signature_name: Option<String>,
    /// The tensor, once `instances` or `inputs` has been read.
    read: Option<(Format, InputTensor)>,
}

/// Any reason to leave the body to the general reading (its message is
/// never shown).
fn general<E: de::Error>() -> E {
    E::custom("left to the general reading")
}

impl<'de> Visitor<'de> for &mut Body<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a :predict body")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut named_signature = false;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "signature_name" => {
                    if named_signature {
                        return Err(general());
                    }
                    named_signature = true;
                    self.signature_name = map.next_value::<Option<String>>()?;
                }
                "instances" | "inputs" => {
                    // A second tensor (both formats, or one twice) is the
                    // general reading's to refuse.
                    if self.read.is_some() {
                        return Err(general());
                    }
                    let format = if key == "instances" {
                        Format::Row
                    } else {
                        Format::Column
                    };
                    let mut tensor = Tensor::new(self.spec);
                    match format {
                        Format::Row => map.next_value_seed(Rows(&mut tensor))?,
                        Format::Column => map.next_value_seed(Whole(&mut tensor, false))?,
                    }
                    self.read = Some((format, tensor.finish(format).ok_or_else(general)?));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// The one input's bytes and shape so far.
struct Tensor<'s> {
    spec: &'s TensorSpec,
    data: Vec<u8>,
    /// Instances read (the row format).
    rows: usize,
    /// Each value's shape (every instance's must be the first's).
    shape: Option<Vec<usize>>,
}

impl<'s> Tensor<'s> {
    fn new(spec: &'s TensorSpec) -> Tensor<'s> {
        Tensor {
            spec,
            data: Vec::new(),
            rows: 0,
            shape: None,
        }
    }

    /// Reads one value (an instance, or the whole column tensor) through
    /// `read`, which walks it into a [`Nesting`]; false when its shape
    /// differs from the first value's or cannot be told.
    fn value<E: de::Error>(
        &mut self,
        read: impl FnOnce(NestingSeed<'_, '_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.reserve_one();
        let mut state = Nesting {
            datatype: self.spec.datatype,
            out: &mut self.data,
            rank: None,
            dims: Vec::new(),
            count: 0,
        };
        read(NestingSeed {
            state: &mut state,
            depth: 0,
        })?;
        let rank = state.rank.unwrap_or(0);
        let shape: Vec<usize> = state
            .dims
            .iter()
            .take(rank)
            .copied()
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(general)?;
        self.shaped(shape)
    }

    /// Reads one instance that must be a flat list of numbers, for a float
    /// input of one dimension: each number straight into the bytes, as the
    /// nesting walk would write it (an integer or a float, as f64, then as
    /// the input's type); anything else is the general reading's.
    fn flat_row<'de, A: SeqAccess<'de>>(&mut self, mut seq: A) -> Result<(), A::Error> {
        self.reserve_one();
        let mut length = 0usize;
        while let Some(x) = seq.next_element::<f64>()? {
            match self.spec.datatype {
                DataType::Fp32 => self.data.extend_from_slice(&(x as f32).to_le_bytes()),
                _ => self.data.extend_from_slice(&x.to_le_bytes()),
            }
            length += 1;
        }
        self.shaped(vec![length])
    }

    /// Room for one more value of the signature's shape (a row of the row
    /// format): the bytes grow once, not once per doubling.
    fn reserve_one(&mut self) {
        let bytes = self
            .spec
            .dims
            .iter()
            .try_fold(self.spec.datatype.size(), |n, &d| n.checked_mul(d))
            .unwrap_or(0);
        self.data.reserve(bytes.min(MAX_RESERVE));
    }

    /// Counts a value of `shape`, which must be the first value's.
    fn shaped<E: de::Error>(&mut self, shape: Vec<usize>) -> Result<(), E> {
        match &self.shape {
            None => self.shape = Some(shape),
            Some(first) if *first != shape => return Err(general()),
            Some(_) => {}
        }
        self.rows += 1;
        Ok(())
    }

    /// The input tensor: instances stacked on a batch axis (the row format),
    /// or the value as it is (the column format). `None` for no instances.
    fn finish(self, format: Format) -> Option<InputTensor> {
        let shape = self.shape?;
        let dims = match format {
            Format::Row => std::iter::once(self.rows).chain(shape).collect(),
            Format::Column => shape,
        };
        Some(InputTensor {
            name: self.spec.name.clone(),
            datatype: self.spec.datatype,
            shape: dims.into_iter().map(|d| d as i64).collect(),
            data: self.data.into(),
        })
    }
}

/// The `instances` list.
struct Rows<'t, 's>(&'t mut Tensor<'s>);

impl<'de> DeserializeSeed<'de> for Rows<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Rows<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of instances")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let spec = self.0.spec;
        let flat = matches!(spec.datatype, DataType::Fp32 | DataType::Fp64) && spec.dims.len() == 1;
        while seq.next_element_seed(Whole(&mut *self.0, flat))?.is_some() {}
        Ok(())
    }
}

/// One unnamed value: an instance, or the column format's tensor; `flat`: an
/// instance of a one-dimensional float input, whose list is read as numbers
/// ([`Tensor::flat_row`]). An object (named inputs, `{"b64": ...}`) is the
/// general reading's.
struct Whole<'t, 's>(&'t mut Tensor<'s>, bool);

impl<'de> DeserializeSeed<'de> for Whole<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Whole<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a tensor's value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        if self.1 {
            self.0.flat_row(seq)
        } else {
            self.0.value(|nesting| nesting.visit_seq(seq))
        }
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.0.value(|nesting| nesting.visit_bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.0.value(|nesting| nesting.visit_i64(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.0.value(|nesting| nesting.visit_u64(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.0.value(|nesting| nesting.visit_f64(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.value(|nesting| nesting.visit_str(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<(), A::Error> {
        Err(general())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(general())
    }
}
