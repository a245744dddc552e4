#![allow(clippy::unwrap_used)]

use super::*;
use crate::DataType;

fn spec(name: &str, dims: &[usize]) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        datatype: DataType::Fp32,
        dims: dims.to_vec(),
    }
}

fn lstm_step() -> Signature {
    Signature {
        inputs: vec![spec("tick", &[8]), spec("h_in", &[16]), spec("c_in", &[16])],
        outputs: vec![
            spec("prediction", &[1]),
            spec("h_out", &[16]),
            spec("c_out", &[16]),
        ],
    }
}

fn pairs(pairs: &[(&str, &str)]) -> SequenceConfig {
    SequenceConfig {
        state: pairs
            .iter()
            .map(|(i, o)| StateConfig {
                input: i.to_string(),
                output: o.to_string(),
                initial_file: None,
            })
            .collect(),
        ..SequenceConfig::default()
    }
}

#[test]
fn state_pairs_leave_the_clients_signature() {
    let config = pairs(&[("h_in", "h_out"), ("c_in", "c_out")]);
    let spec = SequenceSpec::resolve(&config, &lstm_step(), Path::new("."))
        .unwrap()
        .unwrap();
    assert_eq!(spec.public.inputs, vec![spec_of("tick", 8)]);
    assert_eq!(spec.public.outputs, vec![spec_of("prediction", 1)]);
    assert_eq!(
        spec.input_sources,
        vec![
            InputSource::Client(0),
            InputSource::State(0),
            InputSource::State(1)
        ]
    );
    assert_eq!(spec.output_indices, vec![0]);
    assert_eq!(spec.states[1].initial.len(), 64);
    assert_eq!(spec.max_idle, None, "0s means never");
    assert_eq!(spec.max_sequences, DEFAULT_MAX_SEQUENCES);
}

fn spec_of(name: &str, n: usize) -> TensorSpec {
    spec(name, &[n])
}

#[test]
fn bad_state_pairs_are_refused_naming_the_key() {
    let signature = lstm_step();
    let cases = [
        (pairs(&[("h", "h_out")]), "sequence.state[0].input 'h'"),
        (pairs(&[("h_in", "prediction")]), "must have its shape"),
        (
            pairs(&[("h_in", "h_out"), ("h_in", "c_out")]),
            "already in another state pair",
        ),
        (
            SequenceConfig {
                max_sequence_idle: Duration::from_secs(30 * 24 * 3600),
                ..pairs(&[("h_in", "h_out")])
            },
            "max_sequence_idle",
        ),
        (
            SequenceConfig {
                max_sequences: Some(0),
                ..pairs(&[("h_in", "h_out")])
            },
            "max_sequences",
        ),
        (
            SequenceConfig {
                max_sequences: Some(8),
                ..SequenceConfig::default()
            },
            "declares no [[sequence.state]]",
        ),
    ];
    for (config, expected) in cases {
        let error = SequenceSpec::resolve(&config, &signature, Path::new(".")).unwrap_err();
        assert!(error.contains(expected), "{error}");
    }
}

/// A model with two windows of different lengths and a state pair.
fn windowed() -> SequenceSpec {
    let signature = Signature {
        inputs: vec![
            spec("long", &[4, 2]),
            spec("h_in", &[3]),
            spec("short", &[2, 1]),
        ],
        outputs: vec![spec("y", &[1]), spec("h_out", &[3])],
    };
    let config = SequenceConfig {
        window: ["long", "short"]
            .iter()
            .map(|name| WindowConfig {
                input: name.to_string(),
                initial_file: None,
            })
            .collect(),
        ..pairs(&[("h_in", "h_out")])
    };
    SequenceSpec::resolve(&config, &signature, Path::new("."))
        .unwrap()
        .unwrap()
}

fn window_tensor(name: &str, ticks: usize, features: usize) -> InputTensor {
    InputTensor {
        name: name.to_string(),
        datatype: crate::DataType::Fp32,
        shape: vec![1, ticks as i64, features as i64],
        data: Bytes::from(vec![1u8; ticks * features * 4]),
    }
}

#[test]
fn windows_take_one_tick_in_the_clients_signature() {
    let w = windowed();
    assert_eq!(
        w.public.inputs,
        vec![spec("long", &[2]), spec("short", &[1])]
    );
    assert_eq!(
        w.input_sources,
        vec![
            InputSource::Window {
                window: 0,
                client: 0
            },
            InputSource::State(0),
            InputSource::Window {
                window: 1,
                client: 1
            },
        ]
    );
    assert_eq!(w.full_after(), 4);
    let initial = w.initial_state();
    assert_eq!(
        initial.iter().map(Bytes::len).collect::<Vec<_>>(),
        vec![12, 32, 8]
    );
}

#[test]
fn a_written_history_holds_as_many_ticks_in_every_window_as_fit() {
    let w = windowed();
    let h = InputTensor {
        name: "h_in".into(),
        datatype: crate::DataType::Fp32,
        shape: vec![1, 3],
        data: Bytes::from(vec![0u8; 12]),
    };
    // Three ticks: the long window holds 3, the short one its 2.
    let tensors = vec![
        h.clone(),
        window_tensor("long", 3, 2),
        window_tensor("short", 2, 1),
    ];
    let (rows, seen) = w.state_rows("m", tensors).unwrap();
    assert_eq!(seen, 3);
    assert_eq!(rows[1].len(), 32);
    assert_eq!(
        &rows[1][..8],
        &[0u8; 8],
        "the missing place holds the initial tick"
    );
    let read = w.state_tensors(&rows, seen);
    assert_eq!(read[1].shape, vec![1, 3, 2]);
    assert_eq!(read[2].shape, vec![1, 2, 1]);
    let cases = [
        (
            vec![
                h.clone(),
                window_tensor("long", 3, 2),
                window_tensor("short", 1, 1),
            ],
            "'short': expected 2 ticks",
        ),
        (
            vec![
                h.clone(),
                window_tensor("long", 5, 2),
                window_tensor("short", 2, 1),
            ],
            "k from 1 to 4",
        ),
        (
            vec![
                h.clone(),
                window_tensor("long", 0, 2),
                window_tensor("short", 2, 1),
            ],
            "k from 1 to 4",
        ),
        (
            vec![h, window_tensor("long", 3, 2)],
            "'short': expected a tensor for every",
        ),
    ];
    for (tensors, expected) in cases {
        let error = w.state_rows("m", tensors).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
    }
}

#[test]
fn an_initial_file_must_hold_one_row() {
    let dir = std::env::temp_dir().join(format!("seq-initial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("h0.bin"), [0u8; 60]).unwrap();
    let mut config = pairs(&[("h_in", "h_out")]);
    config.state[0].initial_file = Some("h0.bin".to_string());
    let error = SequenceSpec::resolve(&config, &lstm_step(), &dir).unwrap_err();
    assert!(error.contains("'h0.bin' holds 60 bytes"), "{error}");
    let server_path = dir.to_string_lossy().to_string();
    assert!(!error.contains(&server_path), "{error}");
    config.state[0].initial_file = Some("missing.bin".to_string());
    let error = SequenceSpec::resolve(&config, &lstm_step(), &dir).unwrap_err();
    assert!(error.contains("'missing.bin': no such file"), "{error}");
    assert!(!error.contains(&server_path), "{error}");
    config.state[0].initial_file = Some("h0.bin".to_string());
    let h0: Vec<u8> = (0..16).flat_map(|i| (i as f32).to_le_bytes()).collect();
    std::fs::write(dir.join("h0.bin"), &h0).unwrap();
    let spec = SequenceSpec::resolve(&config, &lstm_step(), &dir)
        .unwrap()
        .unwrap();
    assert_eq!(spec.states[0].initial.as_ref(), h0.as_slice());
    std::fs::remove_dir_all(&dir).unwrap();
}
