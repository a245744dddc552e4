use super::super::super::request_header::{comparable as shown, json_header};
use super::*;

const HEADERS: [&str; 4] = [
    r#"{"inputs":[{"name":"features","shape":[1,16],"datatype":"FP32","parameters":{"binary_data_size":64}}],"parameters":{"binary_data_output":true}}"#,
    r#" { "id" : "order-42", "inputs" : [ { "datatype" : "INT64", "name" : "x", "shape" : [ -1, 0, 123456789012345678 ] }, {"name":"é","shape":[],"datatype":"BOOL"} ] , "outputs" : [ {"name":"y","parameters":{"binary_data":false}} , {"name":""} ], "parameters" : { "sequence_id" : -7, "sequence_start" : true, "priority" : 2, "tag" : "a b", "n": null } } "#,
    r#"{"inputs":[],"outputs":[]}"#,
    r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","parameters":{}}],"parameters":{}}"#,
];

#[test]
fn plain_headers_read_as_serde_json_reads_them() {
    for text in HEADERS {
        let plain = header(text.as_bytes()).expect("plain");
        let json = json_header(text.as_bytes()).unwrap();
        assert_eq!(shown(&plain), shown(&json), "{text}");
    }
}

#[test]
fn anything_else_is_left_to_serde_json() {
    for text in [
        r#"{"inputs":[{"name":"x\"","shape":[1],"datatype":"FP32"}]}"#,
        r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#,
        r#"{"inputs":[{"name":"x","shape":[1.0],"datatype":"FP32"}]}"#,
        r#"{"inputs":[{"name":"x","shape":[-0],"datatype":"FP32"}]}"#,
        r#"{"inputs":[{"name":"x","shape":[01],"datatype":"FP32"}]}"#,
        r#"{"inputs":[{"name":"x","shape":[1234567890123456789],"datatype":"FP32"}]}"#,
        r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","extra":1}]}"#,
        r#"{"inputs":[],"inputs":[]}"#,
        r#"{"inputs":[],"parameters":{"timeout":1.5}}"#,
        r#"{"inputs":[],"parameters":{"a":{"b":1}}}"#,
        r#"{"outputs":[]}"#,
        r#"{"inputs":[]} x"#,
    ] {
        assert!(header(text.as_bytes()).is_none(), "{text}");
    }
}

/// The eight-at-a-time search finds what a byte-by-byte one finds, at
/// every position and length, and tells ASCII from the rest wherever a
/// non-ASCII byte stands (before, at or after the special byte).
#[test]
fn the_word_search_finds_the_first_special_byte() {
    for len in 0..24 {
        for at in 0..=len {
            for high in (0..len).map(Some).chain([None]) {
                for special_byte in [b'"', b'\\', 0x00, 0x1f, b'a'] {
                    let mut bytes: Vec<u8> = (0..len).map(|i| [b'x', 0x7f, b' '][i % 3]).collect();
                    if let Some(high) = high {
                        bytes[high] = [0xc3, 0xff, 0x80][high % 3];
                    }
                    if at < len {
                        bytes[at] = special_byte;
                        // A later special byte does not move the first.
                        if at + 1 < len {
                            bytes[at + 1] = b'"';
                        }
                    }
                    let expected = bytes
                        .iter()
                        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                        .map(|at| (at, bytes[..at].is_ascii()));
                    assert_eq!(special(&bytes), expected, "{bytes:?}");
                }
            }
        }
    }
}

/// Whatever is read here, serde_json reads alike: mutations of real
/// headers, cut and changed, each reading compared.
#[test]
fn what_is_read_here_serde_json_reads_alike() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let alphabet = b" \t\n{}[]:,\"-0123456789.eEtrufalsn\\x\xc3\xa9\xff";
    let (mut read, mut tried) = (0, 0);
    for text in HEADERS {
        for _ in 0..5000 {
            let mut bytes = text.as_bytes().to_vec();
            for _ in 0..1 + random() % 3 {
                let at = (random() as usize) % bytes.len();
                let byte = alphabet[(random() as usize) % alphabet.len()];
                match random() % 3 {
                    0 => bytes[at] = byte,
                    1 => {
                        bytes.remove(at);
                    }
                    _ => bytes.insert(at, byte),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            tried += 1;
            let Some(plain) = header(&bytes) else {
                continue;
            };
            read += 1;
            let text = String::from_utf8_lossy(&bytes);
            let json = json_header(&bytes);
            let Ok(json) = json else {
                panic!(
                    "read here, refused by serde_json: {text}: {json:?}",
                    json = json.err()
                );
            };
            assert_eq!(shown(&plain), shown(&json), "{text}");
        }
    }
    assert!(read > tried / 20 && read < tried, "{read} of {tried} read");
}
