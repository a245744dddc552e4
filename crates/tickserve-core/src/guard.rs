//! Output guards: bounds a model's answer must keep before it reaches a
//! client (`[[guard]]` in `model.toml`). A guard names an output and
//! optional `min` and `max` on every element, and for a sequence model
//! `max_step`, the most an element may move from the sequence's last
//! answered value; a non-finite element always trips. A tripped answer is withheld: the request gets
//! [`crate::Error::GuardTripped`], naming the output, the bound and the
//! element's position.
//!
//! A guard checks its output in every answer that carries it (a request that
//! names other outputs only gets none of this one's values, so there is
//! nothing of it to act on). A Monte Carlo answer carries an output's values
//! as summaries: the guard checks each that is a value the model could have
//! said (`NAME_mean`, every `NAME_qP`, `NAME_samples`), not `NAME_std`, a
//! spread.

use serde::Deserialize;

use crate::{DataType, InferResponse, OutputTensor};

/// One `[[guard]]` table of `model.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardConfig {
    /// The output it bounds.
    pub output: String,
    /// The least value an element may take.
    pub min: Option<f64>,
    /// The greatest value an element may take.
    pub max: Option<f64>,
    /// Sequence models: the most an element may differ from the same
    /// element of the sequence's last answered value.
    pub max_step: Option<f64>,
}

/// A guard, checked against a model's outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Guard {
    /// The output it bounds.
    pub output: String,
    /// The least value an element may take.
    pub min: Option<f64>,
    /// The greatest value an element may take.
    pub max: Option<f64>,
    /// The most an element may move from the sequence's last answer.
    pub max_step: Option<f64>,
}

/// What tripped a guard: which output, which bound, where and what.
#[derive(Debug, Clone, PartialEq)]
pub struct Trip {
    /// The output.
    pub output: String,
    /// The bound it broke: `finite`, `min`, `max` or `max_step` (the
    /// metric's label).
    pub guard: &'static str,
    /// The bound's words (`max = 1`, `finite`).
    pub bound: String,
    /// The element's position in the output, batch first (`[3, 0]`).
    pub position: Vec<usize>,
    /// The element's value.
    pub value: f64,
}

/// A model's guards, resolved against its outputs at load.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Guards(Vec<Guard>);

impl Guards {
    /// Checks `configs` against the model's `outputs` (name and datatype):
    /// each names a numeric output, its bounds are finite, `min <= max` and
    /// `max_step` is not negative (the caller checks that a `max_step` is on
    /// a sequence model).
    pub fn resolve(
        configs: &[GuardConfig],
        outputs: &[(&str, DataType)],
    ) -> Result<Guards, String> {
        let mut guards = Vec::with_capacity(configs.len());
        for (index, config) in configs.iter().enumerate() {
            let at = || format!("guard {} (output '{}')", index + 1, config.output);
            let Some((_, datatype)) = outputs.iter().find(|(name, _)| *name == config.output)
            else {
                let names: Vec<&str> = outputs.iter().map(|(name, _)| *name).collect();
                return Err(format!(
                    "{}: the model has no such output (its outputs: {})",
                    at(),
                    names.join(", ")
                ));
            };
            if *datatype == DataType::Bool {
                return Err(format!("{}: a BOOL output has no bounds", at()));
            }
            for (name, bound) in [
                ("min", config.min),
                ("max", config.max),
                ("max_step", config.max_step),
            ] {
                if bound.is_some_and(|b| !b.is_finite()) {
                    return Err(format!("{}: {name} must be a finite number", at()));
                }
            }
            if let (Some(min), Some(max)) = (config.min, config.max)
                && min > max
            {
                return Err(format!("{}: min ({min}) is above max ({max})", at()));
            }
            if config.max_step.is_some_and(|step| step < 0.0) {
                return Err(format!("{}: max_step must not be negative", at()));
            }
            guards.push(Guard {
                output: config.output.clone(),
                min: config.min,
                max: config.max,
                max_step: config.max_step,
            });
        }
        Ok(Guards(guards))
    }

    /// True when the model has no guard.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The outputs a `max_step` guard watches: a sequence keeps their last
    /// answered values.
    pub fn step_outputs(&self) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(|g| g.max_step.is_some())
            .map(|g| g.output.as_str())
    }

    /// The first element of `response` that trips a guard, if any;
    /// `previous` gives a sequence's last answered values of an output (for
    /// `max_step`).
    pub fn check<'p>(
        &self,
        response: &InferResponse,
        previous: impl Fn(&str) -> Option<&'p [u8]>,
    ) -> Option<Trip> {
        self.0.iter().find_map(|guard| {
            response
                .outputs
                .iter()
                .filter(|o| carries(&o.name, &guard.output))
                .find_map(|output| {
                    // A step compares the output itself, not a Monte Carlo summary.
                    let last = (*output.name == *guard.output)
                        .then(|| previous(&guard.output))
                        .flatten();
                    guard.check(output, last)
                })
        })
    }
}

impl Guard {
    /// The first element of `output` outside this guard's bounds; `last`
    /// is the sequence's last answered values of the output, for `max_step`
    /// (compared element by element when it holds as many).
    fn check(&self, output: &OutputTensor, last: Option<&[u8]>) -> Option<Trip> {
        let width = output.datatype.size();
        let last = last.filter(|l| l.len() == output.data.len());
        output
            .data
            .chunks_exact(width)
            .enumerate()
            .find_map(|(index, bytes)| {
                let value = element(output.datatype, bytes)?;
                let step = |step: f64| {
                    let before = last
                        .and_then(|l| l.get(index * width..(index + 1) * width))
                        .and_then(|b| element(output.datatype, b))?;
                    ((value - before).abs() > step).then(|| {
                        (
                            "max_step",
                            format!("max_step = {step} of the last answer, {before}"),
                        )
                    })
                };
                let broke = if !value.is_finite() {
                    Some(("finite", "finite".to_string()))
                } else if self.min.is_some_and(|min| value < min) {
                    self.min.map(|min| ("min", format!("min = {min}")))
                } else if self.max.is_some_and(|max| value > max) {
                    self.max.map(|max| ("max", format!("max = {max}")))
                } else {
                    self.max_step.and_then(step)
                };
                broke.map(|(guard, bound)| Trip {
                    output: self.output.clone(),
                    guard,
                    bound,
                    position: position(index, &output.shape),
                    value,
                })
            })
    }
}

/// Whether an answer's output `name` holds values of the model's output
/// `output`: itself, or its Monte Carlo mean, quantiles or samples.
fn carries(name: &str, output: &str) -> bool {
    match name.strip_prefix(output) {
        Some("" | "_mean" | "_samples") => true,
        Some(rest) => rest
            .strip_prefix("_q")
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit() || b == b'.')),
        None => false,
    }
}

/// One little-endian element (`bytes` is exactly its width) as a number;
/// `None` for BOOL (never guarded).
fn element(datatype: DataType, bytes: &[u8]) -> Option<f64> {
    Some(match datatype {
        DataType::Bool => return None,
        DataType::Uint8 => f64::from(u8::from_le_bytes(bytes.try_into().ok()?)),
        DataType::Int8 => f64::from(i8::from_le_bytes(bytes.try_into().ok()?)),
        DataType::Uint16 => f64::from(u16::from_le_bytes(bytes.try_into().ok()?)),
        DataType::Int16 => f64::from(i16::from_le_bytes(bytes.try_into().ok()?)),
        DataType::Uint32 => f64::from(u32::from_le_bytes(bytes.try_into().ok()?)),
        DataType::Int32 => f64::from(i32::from_le_bytes(bytes.try_into().ok()?)),
        DataType::Fp32 => f64::from(f32::from_le_bytes(bytes.try_into().ok()?)),
        // Integers past 2^53 round; a bound that close to them is no risk limit.
        DataType::Uint64 => u64::from_le_bytes(bytes.try_into().ok()?) as f64,
        DataType::Int64 => i64::from_le_bytes(bytes.try_into().ok()?) as f64,
        DataType::Fp64 => f64::from_le_bytes(bytes.try_into().ok()?),
    })
}

/// Element `index` of a row-major tensor of `shape` as coordinates.
fn position(index: usize, shape: &[i64]) -> Vec<usize> {
    let mut rest = index;
    let mut at = vec![0; shape.len()];
    for (axis, &dim) in shape.iter().enumerate().rev() {
        let dim = usize::try_from(dim).unwrap_or(1).max(1);
        at[axis] = rest % dim;
        rest /= dim;
    }
    at
}

#[cfg(test)]
mod tests {
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
            self.check(response, |_| None)
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
        assert_eq!(g.check(&answer(&[0.75, -0.3], vec![1, 2]), previous), None);
        let trip = g
            .check(&answer(&[0.75, -0.8], vec![1, 2]), previous)
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
        assert_eq!(g.check(&answer(&[9.0, 9.0], vec![1, 2]), short), None);
        // A Monte Carlo summary is not stepped.
        let mut mean = answer(&[9.0, 9.0], vec![1, 2]);
        mean.outputs[0].name = "signal_mean".into();
        assert_eq!(g.check(&mean, previous), None);
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
    fn another_output_is_not_checked_and_monte_carlo_values_are() {
        let g = guards(None, Some(1.0));
        for (name, checked) in [
            ("other", false),
            ("signal_std", false),
            ("signals", false),
            ("signal_q", false),
            ("signal", true),
            ("signal_mean", true),
            ("signal_q95", true),
            ("signal_q2.5", true),
            ("signal_samples", true),
        ] {
            let mut high = answer(&[5.0], vec![1, 1]);
            high.outputs[0].name = name.into();
            assert_eq!(g.check_now(&high).is_some(), checked, "{name}");
        }
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
}
