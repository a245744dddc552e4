#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn an_infer_request_round_trips() {
    let data: Vec<u8> = (0..12u8).collect();
    let inputs = [TensorOut {
        name: "features",
        datatype: 11,
        dims: &[1, 3],
        data: &data,
    }];
    let mut buffer = vec![0xffu8; infer_request_len(&[], &inputs)];
    write_infer_request(&mut buffer, 42, 7 << 40 | 7, 500, &[], &inputs);
    assert_eq!(buffer.len() % 8, 0);
    let parsed = parse_request(&buffer).unwrap();
    assert_eq!(
        parsed,
        Request::Infer {
            request_id: 42,
            handle: 7 << 40 | 7,
            timeout_us: 500,
            parameters: vec![],
            inputs: vec![TensorRef {
                name: "features",
                datatype: 11,
                dims: vec![1, 3],
                data: &data
            }]
        }
    );
    // The data starts 8-byte aligned: readable in place as f32/f64.
    let Request::Infer { inputs, .. } = parsed else {
        unreachable!()
    };
    assert_eq!(
        (inputs[0].data.as_ptr() as usize - buffer.as_ptr() as usize) % 8,
        0
    );
}

#[test]
fn a_version_1_request_is_told_to_update() {
    let mut buffer = vec![0u8; lookup_request_len("m", "")];
    write_lookup_request(&mut buffer, 1, "m", "");
    buffer[..4].copy_from_slice(b"TSQ1");
    let e = parse_request(&buffer).unwrap_err().to_string();
    assert!(
        e.contains("version 1") && e.contains("update the client"),
        "{e}"
    );
}

#[test]
fn lookups_and_answers_round_trip() {
    let mut buffer = vec![0u8; lookup_request_len("alpha_mlp", "")];
    write_lookup_request(&mut buffer, 1, "alpha_mlp", "");
    assert_eq!(
        parse_request(&buffer).unwrap(),
        Request::Lookup {
            request_id: 1,
            name: "alpha_mlp",
            version: ""
        }
    );
    let input = TensorOut {
        name: "x",
        datatype: 11,
        dims: &[-1, 50],
        data: &[],
    };
    let output = TensorOut {
        name: "y",
        datatype: 11,
        dims: &[-1, 3],
        data: &[],
    };
    let mut buffer = vec![0u8; lookup_answer_len(&[input], &[output])];
    write_lookup_answer(&mut buffer, 1, 0x0123_4567_89ab_cdef, &[input], &[output]);
    let DecodedAnswer::Lookup {
        handle,
        inputs,
        outputs,
        ..
    } = parse_answer(&buffer).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        (handle, inputs[0].name, outputs[0].dims.clone()),
        (0x0123_4567_89ab_cdef, "x", vec![-1, 3])
    );
    let message = "model 'm': no such input";
    let mut buffer = vec![0u8; error_answer_len(message)];
    write_error_answer(&mut buffer, 9, ErrorCode::InvalidArgument, message);
    assert_eq!(
        parse_answer(&buffer).unwrap(),
        DecodedAnswer::Error {
            request_id: 9,
            code: ErrorCode::InvalidArgument,
            message
        }
    );
}

#[test]
fn hostile_messages_are_errors_not_panics() {
    let data = [0u8; 8];
    let inputs = [TensorOut {
        name: "x",
        datatype: 11,
        dims: &[1, 2],
        data: &data,
    }];
    let mut good = vec![0u8; infer_request_len(&[], &inputs)];
    write_infer_request(&mut good, 1, 0, 0, &[], &inputs);
    // Every truncation.
    for len in 0..good.len() {
        assert!(parse_request(&good[..len]).is_err(), "truncated at {len}");
    }
    // A data length past the end, and one that overflows.
    for data_len in [9u64, u64::MAX, u64::MAX - 3] {
        let mut bad = good.clone();
        bad[32 + 8..32 + 16].copy_from_slice(&data_len.to_le_bytes());
        assert!(parse_request(&bad).is_err());
    }
    // Too many tensors, too many dims, a wrong magic, a wrong kind.
    let mut bad = good.clone();
    bad[6..8].copy_from_slice(&u16::MAX.to_le_bytes());
    assert!(parse_request(&bad).unwrap_err().0.contains("at most 256"));
    let mut bad = good.clone();
    bad[32 + 3] = 200;
    assert!(parse_request(&bad).unwrap_err().0.contains("dimensions"));
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(parse_request(&bad).is_err());
    let mut bad = good;
    bad[4] = 9;
    assert!(parse_request(&bad).unwrap_err().0.contains("kind 9"));
    assert_eq!(request_id_of(&bad), 1);
}

#[test]
fn parameters_round_trip_after_the_header() {
    let data = [0u8; 8];
    let inputs = [TensorOut {
        name: "tick",
        datatype: 11,
        dims: &[1, 2],
        data: &data,
    }];
    let parameters = [
        Parameter {
            name: "sequence_id",
            value: ParamValue::Str("AAPL"),
        },
        Parameter {
            name: "sequence_start",
            value: ParamValue::Bool(true),
        },
        Parameter {
            name: "priority",
            value: ParamValue::Uint(1),
        },
        Parameter {
            name: "timeout",
            value: ParamValue::Int(-5),
        },
        Parameter {
            name: "mc_noise_sigma",
            value: ParamValue::Double(0.25),
        },
    ];
    let mut buffer = vec![0xffu8; infer_request_len(&parameters, &inputs)];
    write_infer_request(&mut buffer, 9, 3, 0, &parameters, &inputs);
    assert_eq!(buffer[5], FLAG_PARAMETERS);
    let Request::Infer {
        parameters: read,
        inputs: tensors,
        ..
    } = parse_request(&buffer).unwrap()
    else {
        unreachable!()
    };
    assert_eq!(read, parameters);
    assert_eq!(tensors[0].name, "tick");
    assert_eq!(
        (tensors[0].data.as_ptr() as usize - buffer.as_ptr() as usize) % 8,
        0,
        "the data stays 8-byte aligned after the block"
    );
    // Every truncation, a version from the future, too many parameters,
    // an unknown kind, a number of the wrong width, an unknown flag.
    for len in 0..buffer.len() {
        assert!(parse_request(&buffer[..len]).is_err(), "truncated at {len}");
    }
    let block = HEADER_BYTES;
    let mut bad = buffer.clone();
    bad[block] = 2;
    assert!(parse_request(&bad).unwrap_err().0.contains("version 2"));
    let mut bad = buffer.clone();
    bad[block + 2..block + 4].copy_from_slice(&65u16.to_le_bytes());
    assert!(parse_request(&bad).unwrap_err().0.contains("at most 64"));
    let mut bad = buffer.clone();
    bad[block + 8 + 2] = 9;
    assert!(parse_request(&bad).unwrap_err().0.contains("kind 9"));
    let mut bad = buffer.clone();
    bad[block + 8 + 4..block + 8 + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(parse_request(&bad).is_err());
    let mut bad = buffer.clone();
    bad[5] = 0x81;
    assert!(parse_request(&bad).unwrap_err().0.contains("flags"));
    // A request without the flag reads as before the block existed.
    let mut plain = vec![0u8; infer_request_len(&[], &inputs)];
    write_infer_request(&mut plain, 9, 3, 0, &[], &inputs);
    assert_eq!(plain[5], 0);
    let Request::Infer { parameters, .. } = parse_request(&plain).unwrap() else {
        unreachable!()
    };
    assert!(parameters.is_empty());
}

/// A buffer of exactly `len` bytes filled with a byte no field below
/// holds: after a write, none of it may be left (a `*_len` that says too
/// much leaves it; one that says too little panics in the write).
const UNWRITTEN: u8 = 0xab;

fn assert_filled(buffer: &[u8], what: &str) {
    assert!(
        !buffer.contains(&UNWRITTEN),
        "{what}: the length function counts bytes the writer never writes"
    );
}

#[test]
fn every_length_is_exactly_what_its_writer_writes() {
    let mut b = vec![UNWRITTEN; lookup_request_len("alpha_mlp", "12")];
    write_lookup_request(&mut b, 3, "alpha_mlp", "12");
    assert_filled(&b, "lookup request");
    assert_eq!(
        parse_request(&b).unwrap(),
        Request::Lookup {
            request_id: 3,
            name: "alpha_mlp",
            version: "12"
        }
    );
    let message = "model 'm': an error of some length";
    let mut b = vec![UNWRITTEN; error_answer_len(message)];
    write_error_answer(&mut b, 3, ErrorCode::NotFound, message);
    assert_filled(&b, "error answer");
    let data: Vec<u8> = (0..12).collect();
    let out = [TensorOut {
        name: "y",
        datatype: 11,
        dims: &[1, 3],
        data: &data,
    }];
    let inp = [TensorOut {
        name: "x",
        datatype: 11,
        dims: &[-1, 50],
        data: &[],
    }];
    let mut b = vec![UNWRITTEN; lookup_answer_len(&inp, &out)];
    write_lookup_answer(&mut b, 3, 5, &inp, &out);
    assert_filled(&b, "lookup answer");
    let mut b = vec![UNWRITTEN; infer_answer_len(&out)];
    write_infer_answer(&mut b, 3, 17, 23, &out);
    assert_filled(&b, "infer answer");
    assert_eq!(
        parse_answer(&b).unwrap(),
        DecodedAnswer::Infer {
            request_id: 3,
            queue_us: 17,
            compute_us: 23,
            outputs: vec![TensorRef {
                name: "y",
                datatype: 11,
                dims: vec![1, 3],
                data: &data
            }]
        }
    );
    // A string parameter longer than a number's 8 bytes.
    let parameters = [Parameter {
        name: "sequence_id",
        value: ParamValue::Str("a string id longer than eight bytes"),
    }];
    let mut b = vec![UNWRITTEN; infer_request_len(&parameters, &out)];
    write_infer_request(&mut b, 3, 5, 0, &parameters, &out);
    assert_filled(&b, "infer request with a string parameter");
    let Request::Infer {
        parameters: read, ..
    } = parse_request(&b).unwrap()
    else {
        unreachable!()
    };
    assert_eq!(read, parameters);
    assert_eq!(request_id_of(&b), 3);
}

#[test]
fn every_datatype_and_error_code_round_trips() {
    for (code, name) in DATATYPES {
        assert_eq!(datatype_name(code), Some(name));
        assert_eq!(datatype_code(name), Some(code));
    }
    assert_eq!(datatype_name(0), None);
    assert_eq!(datatype_name(15), None);
    assert_eq!(datatype_code("FP33"), None);
    let names = [
        (ErrorCode::InvalidArgument, "INVALID_ARGUMENT"),
        (ErrorCode::NotFound, "NOT_FOUND"),
        (ErrorCode::PayloadTooLarge, "PAYLOAD_TOO_LARGE"),
        (ErrorCode::Unavailable, "UNAVAILABLE"),
        (ErrorCode::ResourceExhausted, "RESOURCE_EXHAUSTED"),
        (ErrorCode::DeadlineExceeded, "DEADLINE_EXCEEDED"),
        (ErrorCode::Internal, "INTERNAL"),
        (ErrorCode::FailedPrecondition, "FAILED_PRECONDITION"),
        (ErrorCode::Withheld, "OUT_OF_RANGE"),
    ];
    for (code, name) in names {
        assert_eq!(code.as_str(), name);
        let mut b = vec![0u8; error_answer_len(name)];
        write_error_answer(&mut b, 4, code, name);
        assert_eq!(
            parse_answer(&b).unwrap(),
            DecodedAnswer::Error {
                request_id: 4,
                code,
                message: name
            }
        );
    }
    assert_eq!(ErrorCode::from_byte(0), None);
    assert_eq!(ErrorCode::from_byte(9), Some(ErrorCode::Withheld));
    assert_eq!(ErrorCode::from_byte(10), None);
}

/// An infer request with `parameters` and `inputs`, written.
fn request(parameters: &[Parameter<'_>], inputs: &[TensorOut<'_>]) -> Vec<u8> {
    let mut b = vec![0u8; infer_request_len(parameters, inputs)];
    write_infer_request(&mut b, 1, 2, 0, parameters, inputs);
    b
}

#[test]
fn every_limit_admits_exactly_its_value_and_refuses_one_more() {
    let tensor = |name: &'static str, dims: &'static [i64]| TensorOut {
        name,
        datatype: 11,
        dims,
        data: &[],
    };
    // Tensor names: MAX_NAME_BYTES.
    let at = "n".repeat(MAX_NAME_BYTES);
    let over = "n".repeat(MAX_NAME_BYTES + 1);
    let at: &'static str = Box::leak(at.into_boxed_str());
    let over: &'static str = Box::leak(over.into_boxed_str());
    assert!(parse_request(&request(&[], &[tensor(at, &[1])])).is_ok());
    let e = parse_request(&request(&[], &[tensor(over, &[1])])).unwrap_err();
    assert!(e.0.contains("at most 1024"), "{e}");
    // Dimensions: MAX_RANK.
    let dims_at: &'static [i64] = Box::leak(vec![1i64; MAX_RANK].into_boxed_slice());
    let dims_over: &'static [i64] = Box::leak(vec![1i64; MAX_RANK + 1].into_boxed_slice());
    assert!(parse_request(&request(&[], &[tensor("x", dims_at)])).is_ok());
    let e = parse_request(&request(&[], &[tensor("x", dims_over)])).unwrap_err();
    assert!(e.0.contains("dimensions"), "{e}");
    // Tensors: MAX_TENSORS.
    let many = vec![tensor("x", &[1]); MAX_TENSORS];
    assert!(parse_request(&request(&[], &many)).is_ok());
    let more = vec![tensor("x", &[1]); MAX_TENSORS + 1];
    assert!(parse_request(&request(&[], &more)).is_err());
    // Parameters: MAX_PARAMETERS of them, names and values of
    // MAX_PARAMETER_BYTES.
    let p = |name: &'static str, value: &'static str| Parameter {
        name,
        value: ParamValue::Str(value),
    };
    let x = [tensor("x", &[1])];
    let enough = vec![p("k", "v"); MAX_PARAMETERS];
    assert!(parse_request(&request(&enough, &x)).is_ok());
    let too_many = vec![p("k", "v"); MAX_PARAMETERS + 1];
    assert!(parse_request(&request(&too_many, &x)).is_err());
    let long: &'static str = Box::leak("v".repeat(MAX_PARAMETER_BYTES).into_boxed_str());
    let longer: &'static str = Box::leak("v".repeat(MAX_PARAMETER_BYTES + 1).into_boxed_str());
    for (parameter, ok) in [
        (p(long, "v"), true),
        (p("k", long), true),
        (p(longer, "v"), false),
        (p("k", longer), false),
    ] {
        let written = request(&[parameter], &x);
        let parsed = parse_request(&written);
        assert_eq!(parsed.is_ok(), ok, "{parsed:?}");
    }
    // A lookup answer naming every tensor an input is whole; one naming
    // more inputs than tensors is not.
    let inputs = [tensor("a", &[-1, 2]), tensor("b", &[-1, 2])];
    let mut b = vec![0u8; lookup_answer_len(&inputs, &[])];
    write_lookup_answer(&mut b, 1, 2, &inputs, &[]);
    assert!(parse_answer(&b).is_ok());
    b[HEADER_BYTES - 4..HEADER_BYTES].copy_from_slice(&3u32.to_le_bytes());
    assert!(parse_answer(&b).unwrap_err().0.contains("more inputs"));
}
