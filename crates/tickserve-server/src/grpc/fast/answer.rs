//! A unary answer written straight from the core's response: the bytes
//! prost writes for [`convert::encode`]'s `ModelInferResponse`, without
//! building that message first (a datatype string per output, the moves of
//! every name and list into it). Answers with typed contents or response
//! parameters are left to prost.

use bytes::BufMut;
use smallvec::SmallVec;
use tickserve_core::{InferResponse, OutputTensor};

use crate::grpc::{convert, pb};

/// A unary inference answer, as the handler gives it to the codec.
pub struct UnaryAnswer {
    /// The core's response.
    pub response: InferResponse,
    /// Whether its outputs go back as `raw_output_contents`.
    pub raw: bool,
}

impl UnaryAnswer {
    /// The generated message (what prost encodes).
    pub fn message(self) -> pb::ModelInferResponse {
        convert::encode(self.response, self.raw)
    }

    /// Writes the answer as a `ModelInferResponse` to `buf`: the same bytes
    /// as prost's for [`UnaryAnswer::message`].
    pub fn encode(self, buf: &mut impl BufMut) {
        let response = &self.response;
        if !self.raw || response.sequence_restarted || response.window_ticks.is_some() {
            prost::Message::encode_raw(&self.message(), buf);
            return;
        }
        // Fields in number order, defaults left out, as prost writes them;
        // gathered on the stack and written to `buf` in a few slices (each
        // write to tonic's buffer checks its room).
        let mut head = Head::new();
        text(1, &response.model, &mut head);
        text(2, &response.version, &mut head);
        text(3, &response.id, &mut head);
        for output in &response.outputs {
            key(5, &mut head);
            varint(output_len(output) as u64, &mut head);
            text(1, &output.name, &mut head);
            text(2, output.datatype.as_str(), &mut head);
            if !output.shape.is_empty() {
                key(3, &mut head);
                varint(shape_len(&output.shape) as u64, &mut head);
                for &dim in &output.shape {
                    varint(dim as u64, &mut head);
                }
            }
        }
        // Every entry of a repeated field, empty ones too.
        for output in &response.outputs {
            key(6, &mut head);
            varint(output.data.len() as u64, &mut head);
            buf.put_slice(&head);
            head.clear();
            buf.put_slice(&output.data);
        }
        buf.put_slice(&head);
    }
}

/// The bytes of an answer before its raw contents.
type Head = SmallVec<[u8; 256]>;

/// The key of length-delimited field `number`.
fn key(number: u8, head: &mut Head) {
    head.push((number << 3) | 2);
}

/// A string field, left out when empty.
fn text(number: u8, value: &str, head: &mut Head) {
    if !value.is_empty() {
        key(number, head);
        varint(value.len() as u64, head);
        head.extend_from_slice(value.as_bytes());
    }
}

/// A varint.
fn varint(mut value: u64, head: &mut Head) {
    while value >= 0x80 {
        head.push(value as u8 | 0x80);
        value >>= 7;
    }
    head.push(value as u8);
}

/// The bytes of a varint.
fn varint_len(value: u64) -> usize {
    // One byte per 7 bits, at least one.
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

/// The bytes of a length-delimited field of `len` bytes (one-byte key).
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// The bytes of a packed shape's values.
fn shape_len(shape: &[i64]) -> usize {
    shape.iter().map(|&dim| varint_len(dim as u64)).sum()
}

/// The bytes of an `InferOutputTensor` without contents or parameters.
fn output_len(output: &OutputTensor) -> usize {
    let text_len = |value: &str| {
        if value.is_empty() {
            0
        } else {
            field_len(value.len())
        }
    };
    let shape = if output.shape.is_empty() {
        0
    } else {
        field_len(shape_len(&output.shape))
    };
    text_len(&output.name) + text_len(output.datatype.as_str()) + shape
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use tickserve_core::{DataType, Name, Timing};

    use super::*;

    fn response(outputs: Vec<OutputTensor>) -> InferResponse {
        InferResponse {
            model: "alpha_mlp".into(),
            version: Name::default(),
            id: String::new(),
            outputs,
            timing: Timing {
                queue: Duration::ZERO,
                compute: Duration::from_micros(12),
            },
            sequence_restarted: false,
            bucket: 1,
            state_read: Vec::new(),
            window_ticks: None,
        }
    }

    fn output(name: &str, shape: Vec<i64>, data: Vec<u8>) -> OutputTensor {
        OutputTensor {
            name: name.into(),
            datatype: DataType::Fp32,
            shape,
            data: Bytes::from(data),
        }
    }

    #[test]
    fn answers_are_written_as_prost_writes_their_message() {
        let long = "n".repeat(300);
        let cases = vec![
            response(vec![output("y", vec![1, 3], vec![7; 12])]),
            InferResponse {
                version: "2".into(),
                id: "order-42".into(),
                ..response(vec![
                    output("", vec![], vec![]),
                    output(&long, vec![-1, 1 << 40, 0, 127, 128], vec![1; 200]),
                ])
            },
            response(Vec::new()),
            // Left to prost.
            InferResponse {
                sequence_restarted: true,
                ..response(vec![output("y", vec![1], vec![0; 4])])
            },
            InferResponse {
                window_ticks: Some(3),
                ..response(vec![output("y", vec![1], vec![0; 4])])
            },
        ];
        for case in cases {
            for raw in [true, false] {
                let expected = prost::Message::encode_to_vec(&convert::encode(case.clone(), raw));
                let mut written = Vec::new();
                UnaryAnswer {
                    response: case.clone(),
                    raw,
                }
                .encode(&mut written);
                assert_eq!(written, expected, "raw {raw}: {case:?}");
            }
        }
    }

    #[test]
    fn varint_lengths_count_every_byte() {
        for value in [0, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            let mut buf = Head::new();
            varint(value, &mut buf);
            assert_eq!(varint_len(value), buf.len(), "{value}");
        }
    }
}
