#![allow(clippy::unwrap_used)]

use super::*;
use tickserve_core::sequence::MAX_SEQUENCE_ID_BYTES;

fn read(pairs: &[(&str, Param<'_>)]) -> Result<Parameters, Error> {
    Parameters::read("m", pairs.iter().copied())
}

fn refused(pairs: &[(&str, Param<'_>)]) -> String {
    read(pairs).unwrap_err().to_string()
}

#[test]
fn nothing_asked_is_the_defaults() {
    assert_eq!(read(&[]).unwrap(), Parameters::default());
    assert_eq!(
        read(&[("some_model_parameter", Param::Other("a JSON object"))]).unwrap(),
        Parameters::default(),
        "unknown parameters are ignored, as in Triton"
    );
}

#[test]
fn a_parameter_given_twice_counts_its_last_value() {
    let twice = [
        (PRIORITY, Param::Str("high")),
        (TIMEOUT, Param::Int(5)),
        (PRIORITY, Param::Int(2)),
    ];
    let read = read(&twice).unwrap();
    assert_eq!(read.priority, 2, "the first value, a string, is not read");
    assert_eq!(read.timeout, Some(Duration::from_micros(5)));
    assert!(
        refused(&[(PRIORITY, Param::Int(2)), (PRIORITY, Param::Str("high"))]).contains("priority")
    );
}

#[test]
fn timeout_zero_is_no_timeout() {
    for zero in [Param::Int(0), Param::Uint(0)] {
        assert_eq!(read(&[(TIMEOUT, zero)]).unwrap().timeout, None);
    }
    assert_eq!(
        read(&[(TIMEOUT, Param::Int(250))]).unwrap().timeout,
        Some(Duration::from_micros(250))
    );
    assert_eq!(
        read(&[(TIMEOUT, Param::Uint(u64::MAX))]).unwrap().timeout,
        Some(Duration::from_micros(u64::MAX))
    );
}

#[test]
fn a_value_of_another_type_names_the_parameter_the_type_and_what_came() {
    for (pairs, words) in [
        (
            vec![(TIMEOUT, Param::Other("a JSON object"))],
            "parameter timeout must be an integer of 0 or more (microseconds; 0 is no timeout); got a JSON object",
        ),
        (vec![(TIMEOUT, Param::Int(-1))], "got the integer -1"),
        (vec![(TIMEOUT, Param::Str("5"))], "got the string \"5\""),
        (vec![(TIMEOUT, Param::Float(5.0))], "got the number 5"),
        (
            vec![(PRIORITY, Param::Str("1"))],
            "parameter priority must be",
        ),
        (vec![(PRIORITY, Param::Bool(true))], "got the boolean true"),
        (
            vec![(SEQUENCE_ID, Param::Other("a JSON list"))],
            "parameter sequence_id must be an unsigned integer or a string; got a JSON list",
        ),
        (
            vec![(SEQUENCE_ID, Param::Other("JSON null"))],
            "got JSON null",
        ),
        (
            vec![(SEQUENCE_START, Param::Other("a JSON object"))],
            "parameter sequence_start must be true or false",
        ),
        (
            vec![(MC_SAMPLES, Param::Other("a JSON object"))],
            "parameter mc_samples must be a positive integer",
        ),
    ] {
        let e = refused(&pairs);
        assert!(e.contains(words), "{pairs:?}: {e}");
    }
}

#[test]
fn sequences_are_named_as_triton_clients_name_them() {
    let got = read(&[
        (SEQUENCE_ID, Param::Uint(7)),
        (SEQUENCE_START, Param::Bool(true)),
    ])
    .unwrap();
    assert_eq!(
        got.sequence,
        Some(SequenceControl {
            id: SequenceId::Number(7),
            start: true,
            end: false,
            owner: None,
        })
    );
    let got = read(&[
        (SEQUENCE_ID, Param::Str("AAPL")),
        (SEQUENCE_END, Param::Bool(true)),
    ])
    .unwrap()
    .sequence
    .unwrap();
    assert_eq!(got.id, SequenceId::Text("AAPL".to_string()));
    assert!(got.end && !got.start);
    assert_eq!(
        read(&[(SEQUENCE_ID, Param::Int(0))]).unwrap().sequence,
        None
    );
}

#[test]
fn bad_sequence_parameters_are_clear_errors() {
    let long = "x".repeat(MAX_SEQUENCE_ID_BYTES + 1);
    let cases: Vec<(Vec<(&str, Param)>, &str)> = vec![
        (
            vec![(SEQUENCE_START, Param::Bool(true))],
            "need sequence_id",
        ),
        (
            vec![
                (SEQUENCE_ID, Param::Int(0)),
                (SEQUENCE_START, Param::Bool(true)),
            ],
            "sequence_id 0",
        ),
        (vec![(SEQUENCE_ID, Param::Int(-3))], "unsigned integer"),
        (vec![(SEQUENCE_ID, Param::Float(1.5))], "unsigned"),
        (vec![(SEQUENCE_ID, Param::Str(""))], "1 to 256 bytes"),
        (vec![(SEQUENCE_ID, Param::Str(&long))], "got 257"),
        (
            vec![
                (SEQUENCE_ID, Param::Uint(1)),
                (SEQUENCE_END, Param::Str("yes")),
            ],
            "sequence_end must be true or false",
        ),
    ];
    for (list, expected) in cases {
        let error = refused(&list);
        assert!(error.contains(expected), "{error}");
    }
}

#[test]
fn monte_carlo_parameters_parse_and_refuse() {
    assert_eq!(read(&[]).unwrap().monte_carlo, None);
    let mc = read(&[
        (MC_SAMPLES, Param::Int(64)),
        (MC_NOISE_SIGMA, Param::Str("0.5")),
        (MC_SEED, Param::Uint(7)),
        (MC_OUTPUT, Param::Str("quantiles")),
        (MC_QUANTILES, Param::Str("0.1, 0.9")),
    ])
    .unwrap()
    .monte_carlo
    .unwrap();
    assert_eq!(
        mc,
        MonteCarlo {
            samples: 64,
            sigma: Some(0.5),
            seed: Some(7),
            summary: Summary::Quantiles(vec![0.1, 0.9]),
        }
    );
    // A seed may come as a string of digits (HTTP JSON clients that keep
    // 64-bit integers exact); close quantiles are distinct outputs.
    let mc = read(&[
        (MC_SAMPLES, Param::Int(4)),
        (MC_SEED, Param::Str(" 42 ")),
        (MC_OUTPUT, Param::Str("quantiles")),
        (MC_QUANTILES, Param::Str("0.1,0.2,0.3")),
    ])
    .unwrap()
    .monte_carlo
    .unwrap();
    assert_eq!(mc.seed, Some(42));
    assert_eq!(mc.summary, Summary::Quantiles(vec![0.1, 0.2, 0.3]));
    // The summary: moments unless asked otherwise.
    let summary = |pairs: &[(&str, Param<'_>)]| read(pairs).unwrap().monte_carlo.unwrap().summary;
    let four = (MC_SAMPLES, Param::Int(4));
    assert_eq!(summary(&[four]), Summary::Moments);
    assert_eq!(
        summary(&[four, (MC_OUTPUT, Param::Str("moments"))]),
        Summary::Moments
    );
    assert_eq!(
        summary(&[four, (MC_OUTPUT, Param::Str("samples"))]),
        Summary::Samples
    );
    let quantiles = |list: &'static str| {
        vec![
            (MC_SAMPLES, Param::Int(4)),
            (MC_OUTPUT, Param::Str("quantiles")),
            (MC_QUANTILES, Param::Str(list)),
        ]
    };
    for (pairs, words) in [
        (
            vec![(MC_SAMPLES, Param::Int(4)), (MC_SEED, Param::Str("4x2"))],
            "an integer of 0 or more",
        ),
        (
            vec![
                (MC_SAMPLES, Param::Int(4)),
                (MC_OUTPUT, Param::Str("samples")),
                (MC_QUANTILES, Param::Str("0.5")),
            ],
            "needs mc_output",
        ),
        (quantiles("0,0.5"), "between 0 and 1"),
        (quantiles("0.5,1"), "between 0 and 1"),
        (vec![(MC_SAMPLES, Param::Int(0))], "positive integer"),
        (vec![(MC_SAMPLES, Param::Float(2.0))], "positive integer"),
        (
            vec![
                (MC_SAMPLES, Param::Int(4)),
                (MC_NOISE_SIGMA, Param::Float(-1.0)),
            ],
            "0 or more",
        ),
        (
            vec![(MC_NOISE_SIGMA, Param::Float(1.0))],
            "needs mc_samples",
        ),
        (
            vec![
                (MC_SAMPLES, Param::Int(4)),
                (MC_OUTPUT, Param::Str("median")),
            ],
            "\"median\"",
        ),
        (
            vec![
                (MC_SAMPLES, Param::Int(4)),
                (MC_QUANTILES, Param::Str("0.5")),
            ],
            "needs mc_output",
        ),
        (
            vec![
                (MC_SAMPLES, Param::Int(4)),
                (MC_OUTPUT, Param::Str("quantiles")),
                (MC_QUANTILES, Param::Str("1.5")),
            ],
            "between 0 and 1",
        ),
        (
            // Two quantiles that name one output (y_q50).
            vec![
                (MC_SAMPLES, Param::Int(4)),
                (MC_OUTPUT, Param::Str("quantiles")),
                (MC_QUANTILES, Param::Str("0.5,0.1,0.5000001")),
            ],
            "distinct",
        ),
    ] {
        let e = refused(&pairs);
        assert!(e.contains(words), "{pairs:?}: {e}");
    }
}

#[test]
fn a_flag_is_a_boolean_or_exactly_0_or_1() {
    for (given, want) in [
        (Param::Bool(false), false),
        (Param::Bool(true), true),
        (Param::Int(0), false),
        (Param::Int(1), true),
        (Param::Uint(0), false),
        (Param::Uint(1), true),
    ] {
        let read = flag("m", SEQUENCE_END, Some(given)).unwrap();
        assert_eq!(read, Some(want), "{given:?}");
    }
    for bad in [Param::Int(2), Param::Int(-1), Param::Uint(2)] {
        assert!(flag("m", SEQUENCE_END, Some(bad)).is_err(), "{bad:?}");
    }
    assert_eq!(flag("m", SEQUENCE_END, None).unwrap(), None);
}

#[test]
fn binary_extension_parameters_have_one_type_each() {
    assert_eq!(
        flag("m", BINARY_DATA, Some(Param::Bool(true))).unwrap(),
        Some(true)
    );
    let e = flag("m", BINARY_DATA_OUTPUT, Some(Param::Str("true")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("parameter binary_data_output must be true or false; got the string \"true\""),
        "{e}"
    );
    assert_eq!(
        byte_count("m", BINARY_DATA_SIZE, Some(Param::Uint(8))).unwrap(),
        Some(8)
    );
    let e = byte_count("m", BINARY_DATA_SIZE, Some(Param::Int(-8)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("parameter binary_data_size must be a byte count"),
        "{e}"
    );
}
