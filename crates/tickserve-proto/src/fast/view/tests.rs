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

#[test]
fn the_common_shape_reads_as_prost_decodes_it() {
    let [plain, full, typed, output_parameters] = requests().try_into().unwrap();
    for message in [plain, full] {
        let bytes = message.encode_to_vec();
        let view = infer_request(&bytes, 64).expect("read in place");
        assert!(
            view.agrees_with(&bytes, &message),
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
    message.inputs[0].shape = vec![1; MAX_RANK + 1];
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
    assert!(view.agrees_with(&bytes, &message));
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
            assert!(view.agrees_with(&bytes, &message), "{bytes:?}: {view:?}");
            assert_eq!(check_infer_request(&bytes), Ok(()));
        }
    }
    // The mutations reach both sides.
    assert!(read > tried / 10 && read < tried, "{read} of {tried} read");
}
