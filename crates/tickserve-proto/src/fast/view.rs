//! A `ModelInferRequest` read in place: the names, datatypes and shapes of a
//! request as views of the received bytes, and each raw tensor as a range of
//! them, without the owned copies prost makes of every string (an
//! allocation, a copy and a UTF-8 check each, and a walk of the limits
//! before it).
//!
//! Only the common shape is read this way: tensors in `raw_input_contents`,
//! no typed `contents`, no `parameters` on an input or an output, at most a
//! given number of inputs, outputs and request parameters, at most
//! [`MAX_RANK`] dimensions. Anything else, and anything malformed, reads as
//! `None`: the caller decodes the message with prost behind
//! [`crate::bounded`]'s walk instead, which answers it as before (its limits,
//! prost's errors). So a message read here is one prost decodes to the same
//! request, and one the walk lets through (`tests` below check both).

use std::ops::Range;

use prost::Message as _;
use smallvec::SmallVec;

use crate::bounded::{MAX_RANK, varint_at as varint};
use crate::inference::InferParameter;

/// A `ModelInferRequest` of the common shape, borrowing from its bytes (a
/// request's few inputs and outputs kept inline: the view lives for one
/// request's decoding).
#[derive(Debug, Default, PartialEq)]
pub struct InferRequestView<'a> {
    /// `model_name`.
    pub model_name: &'a str,
    /// `model_version`.
    pub model_version: &'a str,
    /// `id`.
    pub id: &'a str,
    /// `parameters`, in the order they came (prost's map keeps the last of a
    /// repeated name; look up from the end).
    pub parameters: Vec<(&'a str, InferParameter)>,
    /// `inputs`.
    pub inputs: SmallVec<[InputView<'a>; 2]>,
    /// The names of `outputs`.
    pub outputs: SmallVec<[&'a str; 2]>,
    /// Where each `raw_input_contents` entry lies in the bytes.
    pub raw_input_contents: SmallVec<[Range<usize>; 2]>,
}

/// An `InferInputTensor` without contents or parameters.
#[derive(Debug, Default, PartialEq)]
pub struct InputView<'a> {
    /// `name`.
    pub name: &'a str,
    /// `datatype`.
    pub datatype: &'a str,
    /// `shape`.
    pub shape: Vec<i64>,
}

impl InferRequestView<'_> {
    /// Whether this reading of `bytes` says what prost's decoding of them,
    /// `message`, says: every field, each input's and output's, and each
    /// raw content's bytes. The unit tests and the `grpc_request` fuzz
    /// target hold the reading to it.
    pub fn agrees_with(&self, bytes: &[u8], message: &crate::inference::ModelInferRequest) -> bool {
        let view = self;
        // Each value by its encoding: a NaN read alike is the same value
        // (as a float it is unequal to itself). A repeated name keeps its
        // last value, as prost's map does.
        let encoded = |value: &InferParameter| value.encode_to_vec();
        let parameters: std::collections::HashMap<&str, Vec<u8>> = view
            .parameters
            .iter()
            .map(|(key, value)| (*key, encoded(value)))
            .collect();
        let decoded: std::collections::HashMap<&str, Vec<u8>> = message
            .parameters
            .iter()
            .map(|(key, value)| (key.as_str(), encoded(value)))
            .collect();
        view.model_name == message.model_name
            && view.model_version == message.model_version
            && view.id == message.id
            && parameters == decoded
            && view.inputs.len() == message.inputs.len()
            && view.inputs.iter().zip(&message.inputs).all(|(v, m)| {
                v.name == m.name
                    && v.datatype == m.datatype
                    && v.shape == m.shape
                    && m.parameters.is_empty()
                    && m.contents.is_none()
            })
            && view.outputs.len() == message.outputs.len()
            && view
                .outputs
                .iter()
                .zip(&message.outputs)
                .all(|(v, m)| *v == m.name && m.parameters.is_empty())
            && view.raw_input_contents.len() == message.raw_input_contents.len()
            && view
                .raw_input_contents
                .iter()
                .zip(&message.raw_input_contents)
                .all(|(range, m)| bytes.get(range.clone()) == Some(&m[..]))
    }
}

/// Reads `bytes` as a `ModelInferRequest` of the common shape with at most
/// `max_entries` inputs, outputs, raw contents and request parameters each;
/// `None` for any other message (see the module's documentation).
pub fn infer_request(bytes: &[u8], max_entries: usize) -> Option<InferRequestView<'_>> {
    let mut view = InferRequestView::default();
    let mut fields = Fields { bytes, at: 0 };
    while let Some(field) = fields.next()? {
        match field {
            Field::Bytes(1, range) => view.model_name = text(bytes, range)?,
            Field::Bytes(2, range) => view.model_version = text(bytes, range)?,
            Field::Bytes(3, range) => view.id = text(bytes, range)?,
            Field::Bytes(4, range) => {
                if view.parameters.len() == max_entries {
                    return None;
                }
                view.parameters.push(parameter(bytes, range)?);
            }
            Field::Bytes(5, range) => {
                if view.inputs.len() == max_entries {
                    return None;
                }
                view.inputs.push(input(bytes, range)?);
            }
            Field::Bytes(6, range) => {
                if view.outputs.len() == max_entries {
                    return None;
                }
                view.outputs.push(output(bytes, range)?);
            }
            Field::Bytes(7, range) => {
                if view.raw_input_contents.len() == max_entries {
                    return None;
                }
                view.raw_input_contents.push(range);
            }
            // A known field in a wire type prost refuses.
            field if field.number() <= 7 => return None,
            // Unknown fields are skipped, as prost skips them.
            _ => {}
        }
    }
    Some(view)
}

/// One `InferInputTensor`; `None` where it has contents or parameters.
fn input(bytes: &[u8], within: Range<usize>) -> Option<InputView<'_>> {
    let mut view = InputView::default();
    let mut fields = Fields::within(bytes, within)?;
    while let Some(field) = fields.next()? {
        match field {
            Field::Bytes(1, range) => view.name = text(bytes, range)?,
            Field::Bytes(2, range) => view.datatype = text(bytes, range)?,
            // Packed, as every encoder writes it.
            Field::Bytes(3, range) => {
                let mut at = range.start;
                while at < range.end {
                    let (value, next) = varint(&bytes[..range.end], at)?;
                    dimension(&mut view.shape, value)?;
                    at = next;
                }
            }
            // One dimension, unpacked: prost takes both.
            Field::Varint(3, value) => dimension(&mut view.shape, value)?,
            // Contents, parameters, or a field in a wire type prost refuses.
            field if field.number() <= 5 => return None,
            _ => {}
        }
    }
    Some(view)
}

/// Adds one dimension to `shape`; `None` past [`MAX_RANK`].
fn dimension(shape: &mut Vec<i64>, value: u64) -> Option<()> {
    if shape.len() == MAX_RANK {
        return None;
    }
    // An int64 is its varint's bits, as prost reads it.
    shape.push(value as i64);
    Some(())
}

/// One `InferRequestedOutputTensor`'s name; `None` where it has parameters.
fn output(bytes: &[u8], within: Range<usize>) -> Option<&str> {
    let mut name = "";
    let mut fields = Fields::within(bytes, within)?;
    while let Some(field) = fields.next()? {
        match field {
            Field::Bytes(1, range) => name = text(bytes, range)?,
            // Parameters, or a field in a wire type prost refuses.
            field if field.number() <= 2 => return None,
            _ => {}
        }
    }
    Some(name)
}

/// One entry of a `parameters` map: its key and its value, decoded by prost.
fn parameter(bytes: &[u8], within: Range<usize>) -> Option<(&str, InferParameter)> {
    let mut key = "";
    let mut value = InferParameter::default();
    let mut fields = Fields::within(bytes, within)?;
    while let Some(field) = fields.next()? {
        match field {
            Field::Bytes(1, range) => key = text(bytes, range)?,
            // A repeated message field merges, as prost merges it.
            Field::Bytes(2, range) => value.merge(&bytes[range]).ok()?,
            field if field.number() <= 2 => return None,
            _ => {}
        }
    }
    Some((key, value))
}

/// The UTF-8 text at `range` of `bytes`.
fn text(bytes: &[u8], range: Range<usize>) -> Option<&str> {
    std::str::from_utf8(&bytes[range]).ok()
}

/// A field of a message: its number and where its value lies.
enum Field {
    /// A length-delimited value (wire type 2).
    Bytes(u64, Range<usize>),
    /// A varint value (wire type 0).
    Varint(u64, u64),
    /// A fixed-width value (wire types 1 and 5).
    Fixed(u64),
}

impl Field {
    /// The field's number.
    fn number(&self) -> u64 {
        match self {
            Field::Bytes(number, _) | Field::Varint(number, _) | Field::Fixed(number) => *number,
        }
    }
}

/// The fields of one message, in order.
struct Fields<'a> {
    /// The bytes, ending where the message ends.
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    /// The fields of the message at `range` of `bytes`.
    fn within(bytes: &'a [u8], range: Range<usize>) -> Option<Fields<'a>> {
        Some(Fields {
            bytes: bytes.get(..range.end)?,
            at: range.start,
        })
    }

    /// The next field; `Some(None)` at the message's end, `None` where the
    /// bytes are malformed (or hold a group, which no v2 message has).
    fn next(&mut self) -> Option<Option<Field>> {
        if self.at == self.bytes.len() {
            return Some(None);
        }
        let (key, at) = varint(self.bytes, self.at)?;
        let number = key >> 3;
        // Field numbers are 1 to 2^29 - 1, as prost checks.
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return None;
        }
        let (field, next) = match key & 7 {
            0 => {
                let (value, next) = varint(self.bytes, at)?;
                (Field::Varint(number, value), next)
            }
            1 => (Field::Fixed(number), at.checked_add(8)?),
            2 => {
                let (len, start) = varint(self.bytes, at)?;
                let end = start.checked_add(usize::try_from(len).ok()?)?;
                (Field::Bytes(number, start..end), end)
            }
            5 => (Field::Fixed(number), at.checked_add(4)?),
            _ => return None,
        };
        if next > self.bytes.len() {
            return None;
        }
        self.at = next;
        Some(Some(field))
    }
}

#[cfg(test)]
mod tests;
