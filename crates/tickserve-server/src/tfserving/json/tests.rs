use super::*;
use tickserve_core::OutputTensor;

fn spec(name: &str, datatype: DataType, dims: Vec<usize>) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        datatype,
        dims,
    }
}

fn one_input() -> Signature {
    Signature {
        inputs: vec![spec("x:0", DataType::Fp32, vec![])],
        outputs: vec![spec("y:0", DataType::Fp32, vec![])],
    }
}

fn two_inputs() -> Signature {
    Signature {
        inputs: vec![
            spec("signal", DataType::Fp32, vec![3]),
            spec("sensor", DataType::Int64, vec![2, 2]),
        ],
        outputs: vec![spec("y", DataType::Fp32, vec![])],
    }
}

/// An answer of model `m` version 1 with `outputs`.
fn answer(outputs: Vec<OutputTensor>) -> InferResponse {
    InferResponse {
        model: "m".into(),
        version: "1".into(),
        id: String::new(),
        outputs,
        timing: Default::default(),
        sequence_restarted: false,
        bucket: 1,
        state_read: Vec::new(),
        window_ticks: None,
    }
}

fn floats(t: &InputTensor) -> Vec<f32> {
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn row_and_column_formats_agree() {
    let s = one_input();
    let rows = decode("m", &s, br#"{"instances": [1.0, 2.0, 5.0]}"#).unwrap();
    let columns = decode("m", &s, br#"{"inputs": [1.0, 2.0, 5.0]}"#).unwrap();
    let named = decode(
        "m",
        &s,
        br#"{"instances": [{"x": 1.0}, {"x": 2}, {"x:0": 5}]}"#,
    )
    .unwrap();
    for p in [&rows, &columns, &named] {
        assert_eq!(p.inputs[0].shape, vec![3]);
        assert_eq!(p.inputs[0].name, "x:0");
        assert_eq!(floats(&p.inputs[0]), vec![1.0, 2.0, 5.0]);
    }
    assert_eq!(rows.format, Format::Row);
    assert_eq!(columns.format, Format::Column);
}

#[test]
fn named_rows_gather_each_input() {
    let s = two_inputs();
    let body = br#"{"instances": [
        {"signal": [1, 2, 3], "sensor": [[1, 2], [3, 4]]},
        {"sensor": [[4, 5], [6, 8]], "signal": [3, 4, 1]}]}"#;
    let p = decode("m", &s, body).unwrap();
    assert_eq!(p.inputs[0].shape, vec![2, 3]);
    assert_eq!(p.inputs[1].shape, vec![2, 2, 2]);
    assert_eq!(floats(&p.inputs[0]), vec![1.0, 2.0, 3.0, 3.0, 4.0, 1.0]);
    let column = br#"{"inputs": {"signal": [[1, 2, 3], [3, 4, 1]], "sensor": [[[1, 2], [3, 4]], [[4, 5], [6, 8]]]}}"#;
    let c = decode("m", &s, column).unwrap();
    assert_eq!(c.inputs[0].data, p.inputs[0].data);
    assert_eq!(c.inputs[1].data, p.inputs[1].data);
}

#[test]
fn bad_bodies_are_named() {
    let s = one_input();
    let cases: [(&[u8], &str); 10] = [
        (br#"{"instances": [1], "inputs": [1]}"#, "both"),
        (br#"{"signature_name": "serving_default"}"#, "neither"),
        (
            br#"{"signature_name": "other", "instances": [1]}"#,
            "\"other\" not found",
        ),
        (br#"{"instances": [[1], 2]}"#, "ragged"),
        (br#"{"inputs": [[1, 2], [3]]}"#, "ragged"),
        (br#"{"instances": ["a"]}"#, "\"a\""),
        (br#"{"instances": [{"b64": "aGk="}]}"#, "DT_STRING"),
        (br#"{"instances": [{"z": 1}]}"#, "no input 'z'"),
        (br#"{"instances": []}"#, "empty"),
        (b"instances = [1, 2]", "JSON parse error"),
    ];
    for (body, expected) in cases {
        let e = decode("m", &s, body).unwrap_err().to_string();
        assert!(
            e.contains(expected),
            "{}: {e}",
            String::from_utf8_lossy(body)
        );
    }
    let e = decode("m", &two_inputs(), br#"{"instances": [1, 2]}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("has 2 inputs (signal, sensor)"), "{e}");
    let e = decode(
        "m",
        &two_inputs(),
        br#"{"instances": [{"signal": [1, 2, 3], "sensor": [[1, 2], [3, 4]]}, {"signal": [1, 2, 3]}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("instance 1 names 1 inputs; instance 0 names 2"),
        "{e}"
    );
}

fn typed(datatype: DataType) -> Signature {
    Signature {
        inputs: vec![spec("x", datatype, vec![])],
        outputs: vec![spec("y", DataType::Fp32, vec![])],
    }
}

fn refusal(signature: &Signature, body: &str) -> String {
    decode("m", signature, body.as_bytes())
        .map(|p| format!("decoded: {:?}", p.inputs[0].data))
        .unwrap_or_else(|e| e.to_string())
}

/// Each refusal of the tensor reader says what it expected and where.
#[test]
fn tensor_refusals_name_what_and_where() {
    let s = one_input();
    for (body, expected) in [
        (r#"{"instances": 5}"#, "expected a list of instances"),
        (r#"{"inputs": [1, 2, "x"]}"#, "\"x\" at element 2"),
        (r#"{"inputs": [1, null]}"#, "null at element 1"),
        (
            r#"{"inputs": [[1, 2], [3, [4]]]}"#,
            "nested to different depths",
        ),
    ] {
        let e = refusal(&s, body);
        assert!(e.contains(expected), "{body}: {e}");
    }
    let deep = format!(
        r#"{{"inputs": {}1{}}}"#,
        "[".repeat(MAX_RANK + 2),
        "]".repeat(MAX_RANK + 2)
    );
    let e = refusal(&s, &deep);
    assert!(
        e.contains(&format!("nested more than {MAX_RANK} deep")),
        "{e}"
    );
    let e = refusal(
        &two_inputs(),
        r#"{"instances": [{"signal": [1, 2, 3]}, 5]}"#,
    );
    assert!(
        e.contains("instance 1 must be an object") && e.contains("expected an object"),
        "{e}"
    );
    let e = refusal(
        &two_inputs(),
        r#"{"instances": [{"signal": [1, 2, 3]}, {"signal": [1, 2, 3], "sensor": [[1, 2], [3, 4]]}]}"#,
    );
    assert!(
        e.contains("instance 1 names input 'sensor', which instance 0 does not"),
        "{e}"
    );
}

/// Booleans, negative integers and non-finite tokens reach their
/// tensors; a non-finite token is a float and nothing else.
#[test]
fn every_json_scalar_kind_is_read_into_its_datatype() {
    assert_eq!(
        refusal(&typed(DataType::Bool), r#"{"inputs": [true, false, true]}"#),
        "decoded: b\"\\x01\\0\\x01\""
    );
    let p = decode("m", &typed(DataType::Int64), br#"{"inputs": [-1, -2]}"#).unwrap();
    let ints: Vec<i64> = p.inputs[0]
        .data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(ints, vec![-1, -2]);
    let p = decode(
        "m",
        &typed(DataType::Fp32),
        br#"{"inputs": [NaN, -Infinity]}"#,
    )
    .unwrap();
    let x = floats(&p.inputs[0]);
    assert!(x[0].is_nan() && x[1] == f32::NEG_INFINITY, "{x:?}");
    let e = refusal(&typed(DataType::Int64), r#"{"inputs": [1, NaN]}"#);
    assert!(e.contains("NaN at element 1"), "{e}");
}

/// Bare `NaN` / `Infinity` are quoted for serde_json, but never inside a
/// string, whatever escapes the string holds: `\"` does not end it, and
/// `\\` before a quote does not hide the quote that ends it.
#[test]
fn escapes_in_strings_are_read_before_bare_tokens() {
    for (text, quoted) in [
        (r#"["a\"NaN", NaN]"#, r#"["a\"NaN", "\u0000NaN"]"#),
        (r#"["a\\", NaN]"#, r#"["a\\", "\u0000NaN"]"#),
        (
            r#"["\\\"Infinity", -Infinity]"#,
            r#"["\\\"Infinity", "\u0000-Infinity"]"#,
        ),
        (
            r#"{"k\"": "v\\\"NaN\\", "x": NaN}"#,
            r#"{"k\"": "v\\\"NaN\\", "x": "\u0000NaN"}"#,
        ),
        // An escaped backslash then "u0000" is no U+0000.
        (r#"["\\u0000NaN", 1]"#, r#"["\\u0000NaN", 1]"#),
    ] {
        assert_eq!(quote_non_finite(text).unwrap(), quoted, "{text}");
    }
    assert!(quote_non_finite(r#"["\u0000NaN"]"#).is_err());
    let s = one_input();
    // An escaped quote in a field the decoder skips: the bare NaN after
    // the string is still the tensor's.
    let p = decode(
        "m",
        &s,
        br#"{"note": "say \"NaN\"", "instances": [NaN, 2.0]}"#,
    )
    .unwrap();
    let v = floats(&p.inputs[0]);
    assert!(v[0].is_nan() && v[1] == 2.0, "{v:?}");
}

/// A bare token where an object's key stands is not a key: the body is
/// not JSON, as for TF Serving, and no message shows the decoder's
/// marker; nor is one a string where a string is read.
#[test]
fn bare_tokens_are_values_only() {
    for (text, quoted) in [
        (r#"{NaN: 1}"#, r#"{NaN: 1}"#),
        (
            r#"{"a": [1, {Infinity: NaN}]}"#,
            r#"{"a": [1, {Infinity: "\u0000NaN"}]}"#,
        ),
        (r#"{"a": 1, NaN: 2}"#, r#"{"a": 1, NaN: 2}"#),
        (
            r#"[{"a": NaN}, NaN]"#,
            r#"[{"a": "\u0000NaN"}, "\u0000NaN"]"#,
        ),
    ] {
        assert_eq!(quote_non_finite(text).unwrap(), quoted, "{text}");
    }
    let s = one_input();
    for body in [
        r#"{"inputs": {NaN: [1.0]}}"#,
        r#"{NaN: 1, "instances": [1.0]}"#,
        r#"{"signature_name": NaN, "instances": [1.0]}"#,
    ] {
        let e = decode("m", &s, body.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("JSON parse error"), "{body}: {e}");
        assert!(!e.contains("u0000") && !e.contains('\0'), "{body}: {e}");
    }
}

/// The copy the quoting makes is counted from above, without a parse.
#[test]
fn the_expansion_bounds_the_copy() {
    assert_eq!(expansion(br#"{"instances": [1.0, 2.0]}"#), 0);
    for body in [
        r#"{"instances": [NaN, -Infinity, Infinity]}"#,
        r#"{"instances": [NaN], "note": "NaN"}"#,
    ] {
        let copy = quote_non_finite(body).unwrap();
        assert!(copy.len() <= expansion(body.as_bytes()), "{body}");
    }
}

/// TF Serving reads the bare tokens as floats, and refuses the quoted
/// strings `"NaN"` and `"Infinity"` in a float tensor.
#[test]
fn quoted_non_finite_strings_are_strings_not_floats() {
    let s = one_input();
    for body in [
        r#"{"instances": ["NaN", 1.0]}"#,
        r#"{"instances": ["Infinity", 1.0]}"#,
        r#"{"inputs": ["-Infinity", 1.0]}"#,
    ] {
        let e = decode("m", &s, body.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("values (a FP32 tensor"), "{body}: {e}");
        assert!(
            e.contains("got \"") && e.contains("finity\"") || e.contains("\"NaN\""),
            "{body}: {e}"
        );
    }
    let e = decode("m", &s, br#"{"instances": ["\u0000NaN"]}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("U+0000"), "{e}");
}

#[test]
fn non_finite_tokens_read_and_write() {
    let s = one_input();
    let p = decode(
        "m",
        &s,
        br#"{"instances": [NaN, Infinity, -Infinity, 1.5], "note": "NaN"}"#,
    )
    .unwrap();
    let v = floats(&p.inputs[0]);
    assert!(v[0].is_nan() && v[1] == f32::INFINITY && v[2] == f32::NEG_INFINITY && v[3] == 1.5);
    let response = answer(vec![OutputTensor {
        name: "y:0".into(),
        datatype: DataType::Fp32,
        shape: vec![4],
        data: [f32::NAN, f32::NEG_INFINITY, 0.1, 3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    }]);
    assert_eq!(
        String::from_utf8(encode(&response, Format::Row)).unwrap(),
        r#"{"predictions":[NaN,-Infinity,0.1,3.0]}"#
    );
    assert_eq!(
        String::from_utf8(encode(&response, Format::Column)).unwrap(),
        r#"{"outputs":[NaN,-Infinity,0.1,3.0]}"#
    );
}

#[test]
fn fp64_outputs_and_float_refusals_are_written_as_json_numbers() {
    let response = answer(vec![OutputTensor {
        name: "y".into(),
        datatype: DataType::Fp64,
        shape: vec![3],
        data: [1.5f64, f64::NAN, f64::NEG_INFINITY]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    }]);
    assert_eq!(
        String::from_utf8(encode(&response, Format::Column)).unwrap(),
        r#"{"outputs":[1.5,NaN,-Infinity]}"#
    );
    let e = refusal(&typed(DataType::Int64), r#"{"inputs": [1, 2.5]}"#);
    assert!(e.contains("2.5 at element 1"), "{e}");
}

#[test]
fn several_outputs_are_objects() {
    let response = answer(vec![
        OutputTensor {
            name: "a:0".into(),
            datatype: DataType::Int64,
            shape: vec![2, 2],
            data: [1i64, 2, 3, 4]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        },
        OutputTensor {
            name: "b".into(),
            datatype: DataType::Bool,
            shape: vec![2],
            data: vec![1u8, 0].into(),
        },
    ]);
    assert_eq!(
        String::from_utf8(encode(&response, Format::Row)).unwrap(),
        r#"{"predictions":[{"a":[1,2],"b":true},{"a":[3,4],"b":false}]}"#
    );
    assert_eq!(
        String::from_utf8(encode(&response, Format::Column)).unwrap(),
        r#"{"outputs":{"a":[[1,2],[3,4]],"b":[true,false]}}"#
    );
}

/// Every element is written as serde_json writes the same value (TF
/// Serving's tokens for the non-finite floats), straight into the answer.
#[test]
fn elements_are_written_as_serde_json_writes_them() {
    fn written(datatype: DataType, bytes: &[u8]) -> String {
        let mut out = Vec::new();
        write_scalar(&mut out, datatype, bytes);
        String::from_utf8(out).unwrap()
    }
    for x in [0.1f32, -2.05, 1e-7, 3.4e38, 0.0, -0.0, 16_777_217.0] {
        let want = serde_json::to_string(&x).unwrap();
        assert_eq!(written(DataType::Fp32, &x.to_le_bytes()), want);
    }
    for x in [0.1f64, -2.05, 1e-300, f64::MAX] {
        let want = serde_json::to_string(&x).unwrap();
        assert_eq!(written(DataType::Fp64, &x.to_le_bytes()), want);
    }
    for (x, token) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "Infinity"),
        (f32::NEG_INFINITY, "-Infinity"),
    ] {
        assert_eq!(written(DataType::Fp32, &x.to_le_bytes()), token);
        assert_eq!(written(DataType::Fp64, &f64::from(x).to_le_bytes()), token);
    }
    assert_eq!(
        written(DataType::Int64, &i64::MIN.to_le_bytes()),
        i64::MIN.to_string()
    );
    assert_eq!(
        written(DataType::Uint64, &u64::MAX.to_le_bytes()),
        u64::MAX.to_string()
    );
    assert_eq!(written(DataType::Int8, &[0xff]), "-1");
    assert_eq!(written(DataType::Uint16, &513u16.to_le_bytes()), "513");
    assert_eq!(written(DataType::Int32, &(-7i32).to_le_bytes()), "-7");
    assert_eq!(written(DataType::Uint32, &7u32.to_le_bytes()), "7");
    assert_eq!(written(DataType::Int16, &(-300i16).to_le_bytes()), "-300");
    assert_eq!(written(DataType::Uint8, &[200]), "200");
    assert_eq!(written(DataType::Bool, &[1]), "true");
    assert_eq!(written(DataType::Bool, &[0]), "false");
}

/// The one-pass reading decodes every body as the general reading does: the
/// same tensors and format, or the same refusal. Hand-picked bodies for six
/// signatures, then 20,000 mutations of them (bytes replaced, inserted and
/// removed, from a fixed seed).
#[test]
fn one_pass_reads_as_the_general_reading() {
    let seeds: &[&str] = &[
        r#"{"instances": [1.0, 2.5]}"#,
        r#"{"instances": [[1, 2], [3, 4]]}"#,
        r#"{"instances": [[[1], [2]], [[3], [4]]], "signature_name": "serving_default"}"#,
        r#"{"signature_name": "other", "instances": [1]}"#,
        r#"{"signature_name": null, "inputs": [[1, 2, 3]]}"#,
        r#"{"inputs": 7}"#,
        r#"{"inputs": {"x": [1, 2]}}"#,
        r#"{"instances": [{"x": 1}, {"x": 2}]}"#,
        r#"{"instances": [{"b64": "aGk="}]}"#,
        r#"{"instances": [[1, 2], [3]]}"#,
        r#"{"instances": [[1, [2]]]}"#,
        r#"{"instances": []}"#,
        r#"{"instances": [[]]}"#,
        r#"{"instances": [1], "inputs": [1]}"#,
        r#"{"instances": [1], "instances": [2]}"#,
        r#"{"signature_name": "a", "signature_name": "b", "instances": [1]}"#,
        r#"{"instances": null, "inputs": [1, 2]}"#,
        r#"{"instances": [NaN, Infinity, -Infinity, "NaN"]}"#,
        r#"{"instances": [true, false, 1e40, -3, "x"]}"#,
        r#"{"note": {"deep": [1, {"a": null}]}, "instances": [0.5]}"#,
        r#"{"instances": [1, 2]} trailing"#,
        r#"{"instances": [null]}"#,
        r#"[1, 2]"#,
        r#"{}"#,
        r#"{"signature_name": 3, "instances": [1]}"#,
        r#"{"instances": [18446744073709551615, -9223372036854775808]}"#,
    ];
    let rows_of = |datatype, width| Signature {
        inputs: vec![spec("x", datatype, vec![width])],
        outputs: vec![spec("y", DataType::Fp32, vec![])],
    };
    let signatures = [
        one_input(),
        two_inputs(),
        typed(DataType::Int64),
        typed(DataType::Bool),
        // Flat rows of floats: the one pass's typed reading.
        rows_of(DataType::Fp32, 2),
        rows_of(DataType::Fp64, 2),
    ];
    let check = |body: &[u8]| {
        for signature in &signatures {
            check_one_pass(signature, body);
        }
    };
    for seed in seeds {
        check(seed.as_bytes());
    }
    // The common bodies take the one pass (else the comparison is empty).
    for common in &seeds[..6] {
        assert!(one_pass::decode(&one_input(), common).is_some(), "{common}");
    }
    assert!(one_pass::decode(&rows_of(DataType::Fp32, 2), seeds[1]).is_some());
    let alphabet = b"[]{},:0123456789.-+eE\" nulltrfaNIy\\";
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |bound: usize| {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % bound as u64) as usize
    };
    for _ in 0..20_000 {
        let mut body = seeds[next(seeds.len())].as_bytes().to_vec();
        for _ in 0..1 + next(3) {
            let at = next(body.len() + 1);
            let byte = alphabet[next(alphabet.len())];
            match next(3) {
                0 if at < body.len() => body[at] = byte,
                1 if at < body.len() => {
                    body.remove(at);
                }
                _ => body.insert(at, byte),
            }
        }
        check(&body);
    }
}
