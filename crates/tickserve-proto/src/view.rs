//! A `ModelInferRequest` read in place: the names, datatypes and shapes of a
//! request as views of the received bytes, and each raw tensor as a range of
//! them, without the owned copies prost makes of every string (an
//! allocation, a copy and a UTF-8 check each, and a walk of the limits
//! before it).
//!
//! Only the common shape is read this way: tensors in `raw_input_contents`,
//! no typed `contents`, no `parameters` on an input or an output, at most a
//! given number of inputs, outputs and request parameters, at most
//! [`MAX_DIMS`] dimensions. Anything else, and anything malformed, reads as
//! `None`: the caller decodes the message with prost behind
//! [`crate::bounded`]'s walk instead, which answers it as before (its limits,
//! prost's errors). So a message read here is one prost decodes to the same
//! request, and one the walk lets through (`tests` below check both).

use std::ops::Range;

use prost::Message as _;
use smallvec::SmallVec;

use crate::bounded::{MAX_DIMS, varint_at as varint};
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

/// Adds one dimension to `shape`; `None` past [`MAX_DIMS`].
fn dimension(shape: &mut Vec<i64>, value: u64) -> Option<()> {
    if shape.len() == MAX_DIMS {
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
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::bounded::check_infer_request;
    use crate::inference::infer_parameter::ParameterChoice;
    use crate::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
    use crate::inference::{InferTensorContents, ModelInferRequest};

    fn parameter(choice: ParameterChoice) -> InferParameter {
        InferParameter {
            parameter_choice: Some(choice),
        }
    }

    /// Requests of the common shape, and around it.
    fn requests() -> Vec<ModelInferRequest> {
        let input = |name: &str, shape: Vec<i64>| InferInputTensor {
            name: name.into(),
            datatype: "FP32".into(),
            shape,
            ..Default::default()
        };
        let plain = ModelInferRequest {
            model_name: "alpha_mlp".into(),
            inputs: vec![input("features", vec![1, 16])],
            raw_input_contents: vec![vec![7u8; 64].into()],
            ..Default::default()
        };
        let full = ModelInferRequest {
            model_name: "tick_007".into(),
            model_version: "3".into(),
            id: "order-42".into(),
            parameters: HashMap::from([
                (
                    "priority".into(),
                    parameter(ParameterChoice::Uint64Param(1)),
                ),
                (
                    "sequence_id".into(),
                    parameter(ParameterChoice::Int64Param(-5)),
                ),
                (
                    "sequence_start".into(),
                    parameter(ParameterChoice::BoolParam(true)),
                ),
                (
                    "tag".into(),
                    parameter(ParameterChoice::StringParam("é".into())),
                ),
            ]),
            inputs: vec![input("a", vec![2, -1, 1 << 40]), input("b", vec![])],
            outputs: vec![
                InferRequestedOutputTensor {
                    name: "y".into(),
                    ..Default::default()
                },
                InferRequestedOutputTensor::default(),
            ],
            raw_input_contents: vec![vec![1u8; 24].into(), bytes::Bytes::new()],
        };
        let typed = ModelInferRequest {
            inputs: vec![InferInputTensor {
                contents: Some(InferTensorContents {
                    fp32_contents: vec![1.0],
                    ..Default::default()
                }),
                ..input("x", vec![1])
            }],
            ..plain.clone()
        };
        let output_parameters = ModelInferRequest {
            outputs: vec![InferRequestedOutputTensor {
                name: "y".into(),
                parameters: HashMap::from([(
                    "binary_data".into(),
                    parameter(ParameterChoice::BoolParam(true)),
                )]),
            }],
            ..plain.clone()
        };
        vec![plain, full, typed, output_parameters]
    }

    /// Whether `view` reads as prost's decoding of the same bytes.
    fn same(view: &InferRequestView<'_>, bytes: &[u8], message: &ModelInferRequest) -> bool {
        let parameters: HashMap<String, InferParameter> = view
            .parameters
            .iter()
            .map(|(key, value)| (key.to_string(), value.clone()))
            .collect();
        view.model_name == message.model_name
            && view.model_version == message.model_version
            && view.id == message.id
            && parameters == message.parameters
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
                .all(|(range, m)| bytes[range.clone()] == m[..])
    }

    #[test]
    fn the_common_shape_reads_as_prost_decodes_it() {
        let [plain, full, typed, output_parameters] = requests().try_into().unwrap();
        for message in [plain, full] {
            let bytes = message.encode_to_vec();
            let view = infer_request(&bytes, 64).expect("read in place");
            assert!(
                same(&view, &bytes, &message),
                "{view:?} against {message:?}"
            );
        }
        // What the view leaves to prost.
        for message in [typed, output_parameters] {
            assert_eq!(infer_request(&message.encode_to_vec(), 64), None);
        }
    }

    #[test]
    fn limits_leave_the_message_to_the_walk() {
        let mut message = requests().remove(0);
        message.inputs[0].shape = vec![1; MAX_DIMS + 1];
        assert_eq!(infer_request(&message.encode_to_vec(), 64), None);
        let mut message = requests().remove(0);
        message.raw_input_contents = vec![bytes::Bytes::new(); 3];
        assert!(infer_request(&message.encode_to_vec(), 3).is_some());
        assert_eq!(infer_request(&message.encode_to_vec(), 2), None);
    }

    #[test]
    fn an_unpacked_shape_and_repeated_names_read_as_prost_reads_them() {
        // inputs { name "x", shape 2 (unpacked), shape [3] (packed), name "z" },
        // model_name "a", model_name "b", an unknown fixed64 field 9.
        let input = [
            0x0a, 1, b'x', 0x18, 2, 0x1a, 1, 3, 0x0a, 1, b'z', 0x12, 4, b'F', b'P', b'3', b'2',
        ];
        let mut bytes = vec![0x2a, input.len() as u8];
        bytes.extend_from_slice(&input);
        bytes.extend_from_slice(&[0x0a, 1, b'a', 0x0a, 1, b'b']);
        bytes.extend_from_slice(&[0x49, 0, 0, 0, 0, 0, 0, 0, 0]);
        let message = ModelInferRequest::decode(&bytes[..]).unwrap();
        let view = infer_request(&bytes, 64).unwrap();
        assert_eq!(view.model_name, "b");
        assert_eq!(view.inputs[0].shape, [2, 3]);
        assert!(same(&view, &bytes, &message));
    }

    /// Every byte string the view reads is one prost decodes the same way and
    /// the walk lets through: mutations of real requests, cut and changed.
    #[test]
    fn what_the_view_reads_prost_decodes_alike() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut read, mut tried) = (0, 0);
        for message in requests() {
            let original = message.encode_to_vec();
            for _ in 0..5000 {
                let mut bytes = original.clone();
                for _ in 0..1 + random() % 3 {
                    let at = (random() as usize) % bytes.len();
                    match random() % 4 {
                        0 => bytes[at] = random() as u8,
                        1 => bytes[at] ^= 1 << (random() % 8),
                        2 => bytes.truncate(at),
                        _ => bytes.insert(at, random() as u8),
                    }
                    if bytes.is_empty() {
                        break;
                    }
                }
                tried += 1;
                let Some(view) = infer_request(&bytes, 64) else {
                    continue;
                };
                read += 1;
                let decoded = ModelInferRequest::decode(&bytes[..]);
                let Ok(message) = decoded else {
                    panic!("the view read {bytes:?}, which prost refuses: {decoded:?}");
                };
                assert!(same(&view, &bytes, &message), "{bytes:?}: {view:?}");
                assert_eq!(check_infer_request(&bytes), Ok(()));
            }
        }
        // The mutations reach both sides.
        assert!(read > tried / 10 && read < tried, "{read} of {tried} read");
    }
}
