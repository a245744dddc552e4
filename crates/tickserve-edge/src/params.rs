//! The one parameter reader: every request parameter tickserve knows, read
//! by one rule for every front end.
//!
//! A front end only turns its protocol's parameter values into [`Param`]s (v2
//! gRPC's `InferParameter`, JSON values, the shared-memory parameter block);
//! [`Parameters::read`] and the binary-extension readers do the rest. Each
//! known parameter has one type; a value of another type is refused with an
//! error naming the parameter, the type expected and what came. Unknown
//! parameters are ignored, as Triton ignores them (they are the model's, not
//! the server's). The names are the constants below, in one place (Triton
//! keeps its reserved names in one place too, `src/common.h`).

use std::time::Duration;

use tickserve_core::Error;
use tickserve_core::monte_carlo::{DEFAULT_QUANTILES, MAX_QUANTILES, MonteCarlo, Summary};
use tickserve_core::sequence::{SequenceControl, SequenceId};

/// `timeout`: microseconds until the request stops being useful; 0 (or
/// absent) is no timeout, as in Triton.
pub const TIMEOUT: &str = "timeout";
/// `priority`: 1 is the highest level; 0 the model's default level.
pub const PRIORITY: &str = "priority";
/// `sequence_id`: which sequence the request continues (a number or a string).
pub const SEQUENCE_ID: &str = "sequence_id";
/// `sequence_start`: the request starts its sequence.
pub const SEQUENCE_START: &str = "sequence_start";
/// `sequence_end`: the request ends its sequence.
pub const SEQUENCE_END: &str = "sequence_end";
/// `mc_samples`: Monte Carlo's noisy copies per row.
pub const MC_SAMPLES: &str = "mc_samples";
/// `mc_noise_sigma`: the noise's standard deviation.
pub const MC_NOISE_SIGMA: &str = "mc_noise_sigma";
/// `mc_seed`: the noise generator's seed.
pub const MC_SEED: &str = "mc_seed";
/// `mc_output`: `moments`, `quantiles` or `samples`.
pub const MC_OUTPUT: &str = "mc_output";
/// `mc_quantiles`: the quantiles `mc_output = "quantiles"` returns.
pub const MC_QUANTILES: &str = "mc_quantiles";
/// `binary_data_output` (HTTP): every output goes back binary.
pub const BINARY_DATA_OUTPUT: &str = "binary_data_output";
/// `binary_data` (HTTP, per output): this output goes back binary.
pub const BINARY_DATA: &str = "binary_data";
/// `binary_data_size` (HTTP, per input): the input's bytes follow the JSON.
pub const BINARY_DATA_SIZE: &str = "binary_data_size";

/// The Monte Carlo parameters, `mc_samples` first.
const MONTE_CARLO: [&str; 5] = [MC_SAMPLES, MC_NOISE_SIGMA, MC_SEED, MC_OUTPUT, MC_QUANTILES];

/// A request parameter's value, whichever protocol carried it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Param<'a> {
    /// A boolean.
    Bool(bool),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    Uint(u64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(&'a str),
    /// A value no parameter takes, by what it is (`"a JSON object"`).
    Other(&'static str),
}

impl Param<'_> {
    /// What came, for an error message: its type and, when short, its value.
    pub fn describe(&self) -> String {
        match self {
            Param::Bool(b) => format!("the boolean {b}"),
            Param::Int(i) => format!("the integer {i}"),
            Param::Uint(u) => format!("the integer {u}"),
            Param::Float(x) => format!("the number {x}"),
            Param::Str(s) => format!("the string {}", tickserve_core::text::quote(s)),
            Param::Other(what) => (*what).to_string(),
        }
    }

    /// The value as an unsigned integer, when it is a non-negative integer.
    fn as_u64(&self) -> Option<u64> {
        match *self {
            Param::Uint(u) => Some(u),
            Param::Int(i) => u64::try_from(i).ok(),
            _ => None,
        }
    }
}

/// The error for parameter `name` of a request for `model`: `expected`, and
/// what came.
pub fn wrong(model: &str, name: &str, expected: &str, got: &Param<'_>) -> Error {
    Error::request(
        model,
        format!(
            "parameter {name} must be {expected}; got {}",
            got.describe()
        ),
    )
}

/// The request-level options a request's parameters set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parameters {
    /// `timeout`, when it sets one (0 and absent set none).
    pub timeout: Option<Duration>,
    /// `priority` (0: the model's default level).
    pub priority: u64,
    /// `sequence_id` and its flags, when the request names a sequence.
    pub sequence: Option<SequenceControl>,
    /// Monte Carlo (`mc_samples` and friends), when asked for.
    pub monte_carlo: Option<MonteCarlo>,
}

impl Parameters {
    /// Reads every request-level parameter of a request for `model` from
    /// its `entries` (name and value, in the order the request gives them),
    /// in one pass: a name given twice counts once, with its last value (a
    /// protobuf map's rule for a repeated key, and JSON readers'); a name
    /// the server does not read is the model's, and is passed over.
    pub fn read<'n, 'a>(
        model: &str,
        entries: impl IntoIterator<Item = (&'n str, Param<'a>)>,
    ) -> Result<Parameters, Error> {
        let mut given = Given::default();
        for (name, value) in entries {
            given.set(name, value);
        }
        if given.is_empty() {
            return Ok(Parameters::default());
        }
        let get = |name: &str| given.get(name);
        Ok(Parameters {
            timeout: timeout(model, get(TIMEOUT))?,
            priority: priority(model, get(PRIORITY))?,
            sequence: sequence(model, &get)?,
            monte_carlo: monte_carlo(model, &get)?,
        })
    }
}

/// The request-level parameters the server reads.
const REQUEST_LEVEL: [&str; 10] = [
    TIMEOUT,
    PRIORITY,
    SEQUENCE_ID,
    SEQUENCE_START,
    SEQUENCE_END,
    MC_SAMPLES,
    MC_NOISE_SIGMA,
    MC_SEED,
    MC_OUTPUT,
    MC_QUANTILES,
];

/// The values a request gave the [`REQUEST_LEVEL`] parameters, in their
/// order: the last of each.
#[derive(Default)]
struct Given<'a>([Option<Param<'a>>; REQUEST_LEVEL.len()]);

impl<'a> Given<'a> {
    /// Keeps `value` if `name` is one of them.
    fn set(&mut self, name: &str, value: Param<'a>) {
        if let Some(slot) = REQUEST_LEVEL
            .iter()
            .position(|known| *known == name)
            .and_then(|i| self.0.get_mut(i))
        {
            *slot = Some(value);
        }
    }

    /// None of them given.
    fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    fn get(&self, name: &str) -> Option<Param<'a>> {
        let i = REQUEST_LEVEL.iter().position(|known| *known == name)?;
        self.0.get(i).copied().flatten()
    }
}

/// `timeout`: microseconds, an integer of 0 or more; 0 is no timeout.
fn timeout(model: &str, value: Option<Param<'_>>) -> Result<Option<Duration>, Error> {
    let Some(value) = value else {
        return Ok(None);
    };
    match value.as_u64() {
        Some(0) => Ok(None),
        Some(us) => Ok(Some(Duration::from_micros(us))),
        None => Err(wrong(
            model,
            TIMEOUT,
            "an integer of 0 or more (microseconds; 0 is no timeout)",
            &value,
        )),
    }
}

/// `priority`: an integer of 0 or more.
fn priority(model: &str, value: Option<Param<'_>>) -> Result<u64, Error> {
    let Some(value) = value else {
        return Ok(0);
    };
    value.as_u64().ok_or_else(|| {
        wrong(
            model,
            PRIORITY,
            "an integer of 0 or more (1 is the highest level)",
            &value,
        )
    })
}

/// A flag: a boolean (Triton's clients send `bool_param`), or 0 / 1.
pub fn flag(model: &str, name: &str, value: Option<Param<'_>>) -> Result<Option<bool>, Error> {
    match value {
        None => Ok(None),
        Some(Param::Bool(b)) => Ok(Some(b)),
        Some(Param::Int(n @ (0 | 1))) => Ok(Some(n == 1)),
        Some(Param::Uint(n @ (0 | 1))) => Ok(Some(n == 1)),
        Some(other) => Err(wrong(model, name, "true or false", &other)),
    }
}

/// A byte count (`binary_data_size`): an integer of 0 or more.
pub fn byte_count(model: &str, name: &str, value: Option<Param<'_>>) -> Result<Option<u64>, Error> {
    match value {
        None => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            wrong(
                model,
                name,
                "a byte count (an integer of 0 or more)",
                &value,
            )
        }),
    }
}

/// `sequence_id`, `sequence_start` and `sequence_end` (also what the
/// sequence-state API reads to name its sequence).
pub fn sequence<'a>(
    model: &str,
    get: &impl Fn(&str) -> Option<Param<'a>>,
) -> Result<Option<SequenceControl>, Error> {
    let start = flag(model, SEQUENCE_START, get(SEQUENCE_START))?.unwrap_or(false);
    let end = flag(model, SEQUENCE_END, get(SEQUENCE_END))?.unwrap_or(false);
    let id = match get(SEQUENCE_ID) {
        None | Some(Param::Int(0) | Param::Uint(0)) if !start && !end => return Ok(None),
        None => {
            return Err(Error::request(
                model,
                "sequence_start and sequence_end need sequence_id (which sequence)",
            ));
        }
        Some(Param::Str(s)) => SequenceId::text(model, s)?,
        Some(value) => match value.as_u64() {
            Some(n) => SequenceId::number(model, n)?,
            None => {
                return Err(wrong(
                    model,
                    SEQUENCE_ID,
                    "an unsigned integer or a string",
                    &value,
                ));
            }
        },
    };
    Ok(Some(SequenceControl {
        id,
        start,
        end,
        owner: None,
    }))
}

/// The Monte Carlo parameters; `None` when `mc_samples` is absent (and no
/// other `mc_` parameter is given).
fn monte_carlo<'a>(
    model: &str,
    get: &impl Fn(&str) -> Option<Param<'a>>,
) -> Result<Option<MonteCarlo>, Error> {
    let Some(samples) = get(MC_SAMPLES) else {
        if let Some(other) = MONTE_CARLO[1..].iter().find(|p| get(p).is_some()) {
            return Err(Error::request(
                model,
                format!("parameter {other} needs mc_samples (the number of noisy copies per row)"),
            ));
        }
        return Ok(None);
    };
    let samples = match samples.as_u64() {
        Some(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
        _ => return Err(wrong(model, MC_SAMPLES, "a positive integer", &samples)),
    };
    let sigma = match get(MC_NOISE_SIGMA) {
        None => None,
        Some(value) => {
            let sigma = match value {
                Param::Float(x) => Some(x),
                Param::Int(i) => Some(i as f64),
                Param::Uint(u) => Some(u as f64),
                Param::Str(s) => s.trim().parse::<f64>().ok(),
                Param::Bool(_) | Param::Other(_) => None,
            };
            match sigma {
                Some(x) if x.is_finite() && x >= 0.0 => Some(x),
                _ => {
                    return Err(wrong(
                        model,
                        MC_NOISE_SIGMA,
                        "a finite number of 0 or more",
                        &value,
                    ));
                }
            }
        }
    };
    let seed = match get(MC_SEED) {
        None => None,
        Some(Param::Str(s)) if s.trim().parse::<u64>().is_ok() => s.trim().parse::<u64>().ok(),
        Some(value) => match value.as_u64() {
            Some(seed) => Some(seed),
            None => return Err(wrong(model, MC_SEED, "an integer of 0 or more", &value)),
        },
    };
    let quantiles = match get(MC_QUANTILES) {
        None => None,
        Some(value @ Param::Str(list)) => {
            let values: Option<Vec<f64>> = list
                .split(',')
                .map(|q| {
                    q.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|q| *q > 0.0 && *q < 1.0)
                })
                .collect();
            // Each quantile names an output (NAME_qP, P in percent to 4
            // decimals): two that name the same output are one too many.
            let distinct = |v: &[f64]| {
                let mut keys: Vec<i64> = v.iter().map(|q| (q * 1e6).round() as i64).collect();
                keys.sort_unstable();
                keys.windows(2).all(|w| w[0] != w[1])
            };
            match values {
                Some(v) if !v.is_empty() && v.len() <= MAX_QUANTILES && distinct(&v) => Some(v),
                _ => {
                    return Err(wrong(
                        model,
                        MC_QUANTILES,
                        &format!(
                            "1 to {MAX_QUANTILES} distinct comma-separated numbers between 0 \
                             and 1"
                        ),
                        &value,
                    ));
                }
            }
        }
        Some(other) => {
            return Err(wrong(
                model,
                MC_QUANTILES,
                "a string like \"0.05,0.5,0.95\"",
                &other,
            ));
        }
    };
    let summary = match get(MC_OUTPUT) {
        None | Some(Param::Str("moments")) if quantiles.is_none() => Summary::Moments,
        Some(Param::Str("quantiles")) => {
            Summary::Quantiles(quantiles.unwrap_or_else(|| DEFAULT_QUANTILES.to_vec()))
        }
        Some(Param::Str("samples")) if quantiles.is_none() => Summary::Samples,
        None | Some(Param::Str("moments" | "samples")) => {
            return Err(Error::request(
                model,
                "parameter mc_quantiles needs mc_output = \"quantiles\"",
            ));
        }
        Some(other) => {
            return Err(wrong(
                model,
                MC_OUTPUT,
                "\"moments\", \"quantiles\" or \"samples\"",
                &other,
            ));
        }
    };
    Ok(Some(MonteCarlo {
        samples,
        sigma,
        seed,
        summary,
    }))
}

#[cfg(test)]
mod tests;
