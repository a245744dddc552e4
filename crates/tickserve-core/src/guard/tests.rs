#![allow(clippy::unwrap_used)]

use super::*;

fn answer(values: &[f32], shape: Vec<i64>) -> InferResponse {
    InferResponse {
        model: "m".into(),
        version: "1".into(),
        id: String::new(),
        outputs: vec![OutputTensor {
            name: "signal".into(),
            datatype: DataType::Fp32,
            shape,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }],
        timing: Default::default(),
        sequence_restarted: false,
        bucket: 1,
        state_read: Vec::new(),
        window_ticks: None,
    }
}

fn guards(min: Option<f64>, max: Option<f64>) -> Guards {
    let config = GuardConfig {
        output: "signal".into(),
        min,
        max,
        max_step: None,
    };
    Guards::resolve(&[config], &[("signal", DataType::Fp32)]).unwrap()
}

impl Guards {
    /// `check` with no sequence behind the answer.
    fn check_now(&self, response: &InferResponse) -> Option<Trip> {
        self.check(response, false, |_| None)
    }

    fn check_monte_carlo(&self, response: &InferResponse) -> Option<Trip> {
        self.check(response, true, |_| None)
    }
}

#[test]
fn a_step_compares_each_element_with_the_last_answer_and_only_the_output_itself() {
    let config = GuardConfig {
        output: "signal".into(),
        min: None,
        max: None,
        max_step: Some(0.25),
    };
    let g = Guards::resolve(&[config], &[("signal", DataType::Fp32)]).unwrap();
    assert_eq!(g.step_outputs().collect::<Vec<_>>(), ["signal"]);
    let last: Vec<u8> = [0.5f32, -0.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let previous = |name: &str| (name == "signal").then_some(last.as_slice());
    // Within the step (0.25 exactly passes), then past it.
    assert_eq!(
        g.check(&answer(&[0.75, -0.3], vec![1, 2]), false, previous),
        None
    );
    let trip = g
        .check(&answer(&[0.75, -0.8], vec![1, 2]), false, previous)
        .unwrap();
    assert_eq!((trip.guard, trip.position), ("max_step", vec![0, 1]));
    assert!(
        trip.bound
            .contains("max_step = 0.25 of the last answer, -0.5"),
        "{}",
        trip.bound
    );
    // No last answer (a sequence's first tick), or one of another size: no step.
    assert_eq!(g.check_now(&answer(&[9.0, 9.0], vec![1, 2])), None);
    let short = |_: &str| Some(&last[..4]);
    assert_eq!(
        g.check(&answer(&[9.0, 9.0], vec![1, 2]), false, short),
        None
    );
    // A Monte Carlo summary is not stepped.
    let mut mean = answer(&[9.0, 9.0], vec![1, 2]);
    mean.outputs[0].name = "signal_mean".into();
    assert_eq!(g.check(&mean, true, previous), None);
    let negative = GuardConfig {
        output: "signal".into(),
        min: None,
        max: None,
        max_step: Some(-1.0),
    };
    let error = Guards::resolve(&[negative], &[("signal", DataType::Fp32)]).unwrap_err();
    assert!(error.contains("max_step must not be negative"), "{error}");
}

#[test]
fn each_bound_trips_naming_where_and_a_value_at_a_bound_passes() {
    let g = guards(Some(-1.0), Some(1.0));
    assert_eq!(
        g.check_now(&answer(&[-1.0, 0.0, 1.0, 0.5], vec![2, 2])),
        None
    );
    let trip = g
        .check_now(&answer(&[0.0, 0.0, 0.0, 1.5], vec![2, 2]))
        .unwrap();
    assert_eq!(
        (trip.guard, trip.bound.as_str(), trip.position, trip.value),
        ("max", "max = 1", vec![1, 1], 1.5)
    );
    let trip = g.check_now(&answer(&[0.0, -2.0], vec![2, 1])).unwrap();
    assert_eq!((trip.guard, trip.position), ("min", vec![1, 0]));
    // Non-finite trips whatever the bounds, and with none.
    for g in [g, guards(None, None)] {
        let trip = g.check_now(&answer(&[0.0, f32::NAN], vec![1, 2])).unwrap();
        assert_eq!((trip.guard, trip.position), ("finite", vec![0, 1]));
        assert!(g.check_now(&answer(&[f32::INFINITY], vec![1, 1])).is_some());
    }
}

#[test]
fn another_output_is_not_checked_and_monte_carlo_values_are_only_in_a_monte_carlo_answer() {
    let g = guards(None, Some(1.0));
    for (name, plain, monte_carlo) in [
        ("other", false, false),
        ("signal_std", false, false),
        ("signals", false, false),
        ("signal_q", false, false),
        ("signal", true, true),
        // In a plain answer these are other outputs of the model (quantile
        // regression names its outputs so), never this guard's.
        ("signal_mean", false, true),
        ("signal_q95", false, true),
        ("signal_q2.5", false, true),
        ("signal_samples", false, true),
    ] {
        let mut high = answer(&[5.0], vec![1, 1]);
        high.outputs[0].name = name.into();
        assert_eq!(g.check_now(&high).is_some(), plain, "{name}");
        assert_eq!(
            g.check_monte_carlo(&high).is_some(),
            monte_carlo,
            "{name} (Monte Carlo)"
        );
    }
    // A trip names the guarded output and the tensor that broke the bound.
    let mut summary = answer(&[5.0], vec![1, 1]);
    summary.outputs[0].name = "signal_q95".into();
    let trip = g.check_monte_carlo(&summary).unwrap();
    assert_eq!(
        (trip.output.as_str(), trip.tensor.as_str()),
        ("signal", "signal_q95")
    );
    // A model with `ret` (guarded, within) and `ret_q95` (not guarded, out
    // of the bound): nothing trips.
    let mut both = answer(&[0.5], vec![1, 1]);
    let mut other = both.outputs[0].clone();
    other.name = "signal_q95".into();
    other.data = bytes::Bytes::from(12.0f32.to_le_bytes().to_vec());
    both.outputs.push(other);
    assert_eq!(g.check_now(&both), None);
}

#[test]
fn a_guard_that_cannot_hold_is_refused_at_load() {
    let resolve = |output: &str, min: Option<f64>, max: Option<f64>| {
        let config = GuardConfig {
            output: output.into(),
            min,
            max,
            max_step: None,
        };
        Guards::resolve(
            &[config],
            &[("signal", DataType::Fp32), ("flag", DataType::Bool)],
        )
        .unwrap_err()
    };
    assert!(resolve("nope", None, None).contains("no such output (its outputs: signal, flag)"));
    assert!(resolve("flag", None, Some(1.0)).contains("BOOL"));
    assert!(resolve("signal", Some(f64::NAN), None).contains("min must be a finite"));
    assert!(resolve("signal", Some(2.0), Some(1.0)).contains("min (2) is above max (1)"));
}

#[test]
fn integers_and_doubles_are_read_as_numbers() {
    let cases: [(DataType, Vec<u8>); 4] = [
        (DataType::Int64, (-7i64).to_le_bytes().to_vec()),
        (DataType::Uint8, vec![7]),
        (DataType::Int16, (-7i16).to_le_bytes().to_vec()),
        (DataType::Fp64, (-7.0f64).to_le_bytes().to_vec()),
    ];
    for (datatype, bytes) in cases {
        let value = element(datatype, &bytes).unwrap();
        assert_eq!(value.abs(), 7.0, "{datatype:?}");
    }
    assert_eq!(element(DataType::Bool, &[1]), None);
}

#[test]
fn equal_bounds_and_a_step_of_zero_are_bounds_not_errors() {
    let config = |min, max, max_step| GuardConfig {
        output: "signal".into(),
        min,
        max,
        max_step,
    };
    let outputs = [("signal", DataType::Fp32)];
    let pinned = Guards::resolve(&[config(Some(1.0), Some(1.0), Some(0.0))], &outputs).unwrap();
    assert!(!pinned.is_empty());
    assert!(Guards::resolve(&[], &outputs).unwrap().is_empty());
    let error = Guards::resolve(&[config(Some(1.0), Some(0.5), None)], &outputs).unwrap_err();
    assert!(error.contains("min (1) is above max (0.5)"), "{error}");
    let error = Guards::resolve(&[config(None, None, Some(-0.1))], &outputs).unwrap_err();
    assert!(error.contains("max_step must not be negative"), "{error}");
}
