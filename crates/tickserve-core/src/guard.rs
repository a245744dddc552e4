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
//! nothing of it to act on), and only its output: another output whose name
//! begins with the guarded one's (`ret_q95` beside `ret`) is not its.
//! Only a Monte Carlo answer carries an output's values as summaries: there
//! the guard checks each that is a value the model could have said
//! (`NAME_mean`, every `NAME_qP`, `NAME_samples`), not `NAME_std`, a
//! spread. A trip names the guarded output and the answered tensor whose
//! element broke the bound.

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
    /// The guarded output.
    pub output: String,
    /// The answered tensor whose element broke the bound: the output
    /// itself, or one of its Monte Carlo summaries (`NAME_q95`).
    pub tensor: String,
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
    /// `monte_carlo`: the response is a Monte Carlo answer (its outputs are
    /// summaries); `previous` gives a sequence's last answered values of an
    /// output (for `max_step`).
    pub fn check<'p>(
        &self,
        response: &InferResponse,
        monte_carlo: bool,
        previous: impl Fn(&str) -> Option<&'p [u8]>,
    ) -> Option<Trip> {
        self.0.iter().find_map(|guard| {
            response
                .outputs
                .iter()
                .filter(|o| {
                    *o.name == *guard.output || (monte_carlo && summarises(&o.name, &guard.output))
                })
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
                    tensor: output.name.to_string(),
                    guard,
                    bound,
                    position: position(index, &output.shape),
                    value,
                })
            })
    }
}

/// Whether a Monte Carlo answer's output `name` holds values of the model's
/// output `output`: its mean, quantiles or samples.
fn summarises(name: &str, output: &str) -> bool {
    match name.strip_prefix(output) {
        Some("_mean" | "_samples") => true,
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
mod tests;
