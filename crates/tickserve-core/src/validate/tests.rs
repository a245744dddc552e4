use super::*;

#[test]
fn bool_bytes_other_than_0_and_1_are_read_as_true() {
    let signature = Signature {
        inputs: vec![TensorSpec {
            name: "mask".into(),
            datatype: crate::DataType::Bool,
            dims: vec![4],
        }],
        outputs: Vec::new(),
    };
    let request = InferRequest {
        model: "m".into(),
        version: None,
        request: ModelRequest {
            id: String::new(),
            inputs: vec![crate::InputTensor {
                name: "mask".into(),
                datatype: crate::DataType::Bool,
                shape: vec![1, 4],
                data: Bytes::from_static(&[0, 1, 2, 255]),
            }],
            outputs: None,
            deadline: None,
            monte_carlo: None,
            priority: 0,
            sequence: None,
        },
    };
    let limits = Limits {
        max_request_rows: 8,
        nan_policy: NanPolicy::Reject,
    };
    let valid = validate(&request, &signature, &limits).unwrap();
    assert_eq!(&valid.inputs[0][..], &[0, 1, 1, 1]);
}
use crate::{DataType, InputTensor};

fn signature() -> Signature {
    Signature {
        inputs: vec![TensorSpec {
            name: "x".into(),
            datatype: DataType::Fp32,
            dims: vec![2],
        }],
        outputs: vec![TensorSpec {
            name: "y".into(),
            datatype: DataType::Fp32,
            dims: vec![1],
        }],
    }
}

fn request(shape: Vec<i64>, values: &[f32]) -> InferRequest {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    InferRequest {
        model: "m".into(),
        version: None,
        request: ModelRequest {
            id: String::new(),
            inputs: vec![InputTensor {
                name: "x".into(),
                datatype: DataType::Fp32,
                shape,
                data: data.into(),
            }],
            outputs: None,
            deadline: None,
            monte_carlo: None,
            priority: 0,
            sequence: None,
        },
    }
}

const LIMITS: Limits = Limits {
    max_request_rows: 4,
    nan_policy: NanPolicy::Reject,
};

#[test]
fn accepts_a_fitting_request() {
    let valid = validate(&request(vec![2, 2], &[1.0; 4]), &signature(), &LIMITS).unwrap();
    assert_eq!(valid.rows, 2);
    assert_eq!(valid.outputs, vec![0]);
}

#[test]
fn refuses_with_named_problems() {
    let cases: Vec<(InferRequest, &str)> = vec![
        (
            request(vec![1, 3], &[1.0; 3]),
            "expected shape [batch, 2], got shape [1, 3]",
        ),
        (request(vec![2], &[1.0; 2]), "rank 2"),
        (request(vec![0, 2], &[]), "every dimension positive"),
        (request(vec![2, 2], &[1.0; 3]), "got 12 bytes"),
        (request(vec![5, 2], &[1.0; 10]), "more than the limit of 4"),
        (request(vec![1, 2], &[1.0, f32::NAN]), "NaN at element 1"),
        (
            request(vec![1, 2], &[f32::INFINITY, 1.0]),
            "inf at element 0",
        ),
    ];
    for (req, needle) in cases {
        let err = validate(&req, &signature(), &LIMITS).unwrap_err();
        assert!(err.to_string().contains(needle), "{err} lacks {needle}");
        assert!(err.to_string().contains("model 'm'"), "{err}");
    }
}

#[test]
fn nan_allowed_when_policy_allows() {
    let limits = Limits {
        nan_policy: NanPolicy::Allow,
        ..LIMITS
    };
    assert!(
        validate(
            &request(vec![1, 2], &[f32::NAN, 1.0]),
            &signature(),
            &limits
        )
        .is_ok()
    );
}

#[test]
fn unknown_missing_duplicate_inputs_and_outputs() {
    let mut req = request(vec![1, 2], &[1.0; 2]);
    req.request.inputs.push(req.request.inputs[0].clone());
    assert!(
        validate(&req, &signature(), &LIMITS)
            .unwrap_err()
            .to_string()
            .contains("more than once")
    );
    req.request.inputs[1].name = "z".into();
    assert!(
        validate(&req, &signature(), &LIMITS)
            .unwrap_err()
            .to_string()
            .contains("input 'z'")
    );
    req.request.inputs.clear();
    assert!(
        validate(&req, &signature(), &LIMITS)
            .unwrap_err()
            .to_string()
            .contains("no such input")
    );
    let mut req = request(vec![1, 2], &[1.0; 2]);
    req.request.outputs = Some(vec!["w".into()]);
    assert!(
        validate(&req, &signature(), &LIMITS)
            .unwrap_err()
            .to_string()
            .contains("unknown output 'w'")
    );
    req.request.inputs[0].datatype = DataType::Fp64;
    assert!(
        validate(&req, &signature(), &LIMITS)
            .unwrap_err()
            .to_string()
            .contains("expected datatype FP32, got FP64")
    );
}

/// Both sides of `max_request_rows`: exactly the limit passes, one more
/// row is refused.
#[test]
fn exactly_max_request_rows_pass_and_one_more_is_refused() {
    let valid = validate(&request(vec![4, 2], &[1.0; 8]), &signature(), &LIMITS).unwrap();
    assert_eq!(valid.rows, 4);
    let err = validate(&request(vec![5, 2], &[1.0; 10]), &signature(), &LIMITS).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooManyRows {
                rows: 5,
                limit: 4,
                ..
            }
        ),
        "{err}"
    );
}

/// Every input carries the same rows; the error names both inputs.
#[test]
fn inputs_of_different_rows_are_refused() {
    let signature = Signature {
        inputs: vec![
            TensorSpec {
                name: "x".into(),
                datatype: DataType::Fp32,
                dims: vec![2],
            },
            TensorSpec {
                name: "w".into(),
                datatype: DataType::Fp32,
                dims: vec![1],
            },
        ],
        outputs: signature().outputs,
    };
    let mut req = request(vec![2, 2], &[1.0; 4]);
    let three_rows: Vec<u8> = [1f32; 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    req.request.inputs.push(InputTensor {
        name: "w".into(),
        datatype: DataType::Fp32,
        shape: vec![3, 1],
        data: three_rows.into(),
    });
    let err = validate(&req, &signature, &LIMITS).unwrap_err().to_string();
    assert!(
        err.contains("input 'w': expected 2 rows, as input 'x' has, got 3 rows"),
        "{err}"
    );
    let two_rows: Vec<u8> = [1f32; 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    req.request.inputs[1].shape = vec![2, 1];
    req.request.inputs[1].data = two_rows.into();
    assert_eq!(validate(&req, &signature, &LIMITS).unwrap().rows, 2);
}

/// A BOOL tensor whose every byte is over 1 is normalized too.
#[test]
fn bool_bytes_all_over_1_are_read_as_true() {
    assert_eq!(
        &normalized_bools(&Bytes::from_static(&[2, 255, 7, 9]))[..],
        &[1, 1, 1, 1]
    );
    assert_eq!(
        &normalized_bools(&Bytes::from_static(&[0, 1, 1, 0]))[..],
        &[0, 1, 1, 0]
    );
}

/// The all-finite pass agrees with `is_finite` on the edges of both
/// widths: the largest finite value, the smallest subnormal, -0, the
/// infinities, quiet and signalling NaNs, found at any place.
#[test]
fn every_non_finite_value_is_found_wherever_it_is() {
    let f32s = [f32::MAX, f32::MIN, f32::from_bits(1), -0.0, 1.0];
    let bad32 = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc0_0000),
    ];
    let f64s = [f64::MAX, f64::MIN, f64::from_bits(1), -0.0, 1.0];
    let bad64 = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::from_bits(0x7ff0_0000_0000_0001),
        f64::from_bits(0xfff8_0000_0000_0000),
    ];
    for len in [1usize, 7, 8, 9, 33] {
        let good: Vec<f32> = (0..len).map(|i| f32s[i % f32s.len()]).collect();
        let bytes: Vec<u8> = good.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(first_non_finite(4, &bytes), None, "{good:?}");
        let good: Vec<f64> = (0..len).map(|i| f64s[i % f64s.len()]).collect();
        let bytes: Vec<u8> = good.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(first_non_finite(8, &bytes), None, "{good:?}");
        for at in 0..len {
            for bad in bad32 {
                let mut values: Vec<f32> = (0..len).map(|i| f32s[i % f32s.len()]).collect();
                values[at] = bad;
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let (index, _) = first_non_finite(4, &bytes).expect("found");
                assert_eq!(index, at, "{bad} among {len}");
            }
            for bad in bad64 {
                let mut values: Vec<f64> = (0..len).map(|i| f64s[i % f64s.len()]).collect();
                values[at] = bad;
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let (index, _) = first_non_finite(8, &bytes).expect("found");
                assert_eq!(index, at, "{bad} among {len}");
            }
        }
    }
}

/// NaN and infinity are found in FP64 data as in FP32, at their index.
#[test]
fn non_finite_fp64_values_are_found_at_their_index() {
    let data: Vec<u8> = [1.0f64, 2.0, f64::NAN, f64::INFINITY]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let (index, value) = first_non_finite(8, &data).unwrap();
    assert_eq!(index, 2);
    assert!(value.is_nan());
    let finite: Vec<u8> = [1.0f64, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(first_non_finite(8, &finite), None);
}

/// An unknown input or output is answered with the model's own names.
#[test]
fn unknown_names_are_answered_with_the_model_s_names() {
    let mut req = request(vec![1, 2], &[1.0; 2]);
    req.request.inputs[0].name = "z".into();
    let err = validate(&req, &signature(), &LIMITS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("one of the model's inputs ('x')"), "{err}");
    let mut req = request(vec![1, 2], &[1.0; 2]);
    req.request.outputs = Some(vec!["w".into()]);
    let err = validate(&req, &signature(), &LIMITS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("one of the model's outputs ('y')"), "{err}");
}
