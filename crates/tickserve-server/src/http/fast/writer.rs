//! An answer's JSON header written by hand where every output goes back as
//! binary data and no name needs escaping: the bytes serde_json writes for
//! the same answer (`tests` below compare them), without its serializer's
//! per-character escaping checks and formatting machinery. Answers with JSON
//! tensor data are written by serde_json.

use tickserve_core::InferResponse;

/// Writes `response`'s JSON header to `body` when every output goes back
/// binary (`binary`: a flag per output) and no string needs escaping;
/// returns false, having written nothing, otherwise.
pub fn write(response: &InferResponse, binary: &[bool], body: &mut Vec<u8>) -> bool {
    let plain = binary.len() >= response.outputs.len()
        && binary.iter().take(response.outputs.len()).all(|&b| b)
        && [&*response.model, &*response.version, response.id.as_str()]
            .into_iter()
            .chain(response.outputs.iter().map(|o| o.name.as_str()))
            .all(|text| !needs_escape(text));
    if !plain {
        return false;
    }
    body.extend_from_slice(b"{\"model_name\":");
    text(&response.model, body);
    body.extend_from_slice(b",\"model_version\":");
    text(&response.version, body);
    if !response.id.is_empty() {
        body.extend_from_slice(b",\"id\":");
        text(&response.id, body);
    }
    if response.sequence_restarted || response.window_ticks.is_some() {
        body.extend_from_slice(b",\"parameters\":{");
        if response.sequence_restarted {
            body.extend_from_slice(b"\"sequence_restarted\":true");
        }
        if let Some(ticks) = response.window_ticks {
            if response.sequence_restarted {
                body.push(b',');
            }
            body.extend_from_slice(b"\"sequence_window_ticks\":");
            number(ticks, false, body);
        }
        body.push(b'}');
    }
    body.extend_from_slice(b",\"outputs\":[");
    for (i, output) in response.outputs.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(b"{\"name\":");
        text(&output.name, body);
        body.extend_from_slice(b",\"datatype\":");
        text(output.datatype.as_str(), body);
        body.extend_from_slice(b",\"shape\":[");
        for (j, &dim) in output.shape.iter().enumerate() {
            if j > 0 {
                body.push(b',');
            }
            number(dim.unsigned_abs(), dim < 0, body);
        }
        body.extend_from_slice(b"],\"parameters\":{\"binary_data_size\":");
        number(output.data.len() as u64, false, body);
        body.extend_from_slice(b"}}");
    }
    body.extend_from_slice(b"]}");
    true
}

/// Whether serde_json would escape a character of `text`.
fn needs_escape(text: &str) -> bool {
    text.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20)
}

/// A string that needs no escaping, quoted.
fn text(value: &str, body: &mut Vec<u8>) {
    body.push(b'"');
    body.extend_from_slice(value.as_bytes());
    body.push(b'"');
}

/// An integer in decimal, with a minus when `negative`.
fn number(mut value: u64, negative: bool, body: &mut Vec<u8>) {
    if negative {
        body.push(b'-');
    }
    // A one-row answer's dimensions and a small output's size: one digit.
    if value < 10 {
        body.push(b'0' + value as u8);
        return;
    }
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    body.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use tickserve_core::{DataType, Name, OutputTensor, Timing};

    use super::super::super::codec::json_header_of;
    use super::*;

    fn response(outputs: Vec<OutputTensor>) -> InferResponse {
        InferResponse {
            model: "alpha_mlp".into(),
            version: "1".into(),
            id: String::new(),
            outputs,
            timing: Timing {
                queue: Duration::ZERO,
                compute: Duration::from_micros(9),
            },
            sequence_restarted: false,
            bucket: 1,
            state_read: Vec::new(),
            window_ticks: None,
        }
    }

    fn output(name: &str, shape: Vec<i64>, bytes: usize) -> OutputTensor {
        OutputTensor {
            name: name.into(),
            datatype: DataType::Fp32,
            shape,
            data: Bytes::from(vec![0; bytes]),
        }
    }

    #[test]
    fn headers_are_written_as_serde_json_writes_them() {
        let two = vec![
            output("y", vec![1, 3], 12),
            output("é z", vec![-1, 0, i64::MAX, i64::MIN + 1], 0),
        ];
        let cases = vec![
            (response(vec![output("y", vec![1, 3], 12)]), vec![true]),
            (
                InferResponse {
                    id: "order-42".into(),
                    sequence_restarted: true,
                    window_ticks: Some(12_345),
                    ..response(two.clone())
                },
                vec![true, true, true],
            ),
            (
                InferResponse {
                    window_ticks: Some(0),
                    version: Name::default(),
                    ..response(two.clone())
                },
                vec![true, true],
            ),
            (
                InferResponse {
                    sequence_restarted: true,
                    ..response(Vec::new())
                },
                vec![],
            ),
        ];
        for (answer, flags) in cases {
            let mut written = Vec::new();
            assert!(write(&answer, &flags, &mut written), "{answer:?}");
            let mut expected = Vec::new();
            json_header_of(&answer, &flags, &mut expected);
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&expected)
            );
        }
    }

    #[test]
    fn json_data_and_escapes_are_left_to_serde_json() {
        let mut body = Vec::new();
        let one = response(vec![output("y", vec![1], 4)]);
        assert!(!write(&one, &[false], &mut body));
        assert!(!write(&one, &[], &mut body));
        let quoted = response(vec![output("a\"b", vec![1], 4)]);
        assert!(!write(&quoted, &[true], &mut body));
        let tab = InferResponse {
            id: "a\tb".into(),
            ..one
        };
        assert!(!write(&tab, &[true], &mut body));
        assert!(body.is_empty());
    }
}
