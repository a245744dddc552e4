//! Stateful sequences (Triton's sequence extension with implicit state): what
//! a model declares in `model.toml`, what a request says about its sequence,
//! and the split between the graph's signature and the one clients see.
//!
//! A stateful model's graph takes its recurrent state as inputs and gives the
//! next state as outputs (`h_in` → `h_out`). `[[sequence.state]]` pairs them;
//! clients then send only the other inputs (the tick) and see only the other
//! outputs: the server keeps each sequence's state between its requests
//! (`tickserve_runtime::sequences`). A request names its sequence with the
//! parameters `sequence_id` (an unsigned integer, or a string),
//! `sequence_start` and `sequence_end`, as Triton's clients send them.
//!
//! A window (`[[sequence.window]]`, `window.rs`) is state of another kind:
//! a graph input `[batch, N, F...]` holding the sequence's last N ticks;
//! clients send one tick under its name.

mod window;

pub use window::{MAX_WINDOW_TICKS, Warmup, WindowConfig, WindowSpec};

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Deserializer};

use crate::durations;
use crate::{Error, InputTensor, Name, OutputTensor, Signature, TensorSpec};

/// The longest `max_sequence_idle`: a trading week.
pub const MAX_SEQUENCE_IDLE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most sequences a model may keep (`max_sequences`).
pub const MAX_SEQUENCES: usize = 1_000_000;

/// The default `max_sequences`.
pub const DEFAULT_MAX_SEQUENCES: usize = 4096;

/// The longest string `sequence_id`, in bytes.
pub const MAX_SEQUENCE_ID_BYTES: usize = 256;

/// The most requests of one sequence waiting for their turn; one more is
/// refused (RESOURCE_EXHAUSTED). A sequence's requests run one at a time, so
/// a client that sends hundreds ahead gains nothing.
pub const MAX_PENDING_PER_SEQUENCE: usize = 64;

/// What happens to a request for a sequence that sat idle longer than
/// `max_sequence_idle`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdleAction {
    /// The sequence is gone: the request is refused (INVALID_ARGUMENT)
    /// naming the sequence and the idle limit, and the client starts it again.
    #[default]
    Error,
    /// The sequence starts afresh from its initial state, and the response
    /// says so (parameter `sequence_restarted`).
    Restart,
}

/// One state pair as `model.toml` writes it (`[[sequence.state]]`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// The graph input that takes the state.
    pub input: String,
    /// The graph output that becomes its next value.
    pub output: String,
    /// A file (relative to the model's directory) holding one row of the
    /// initial state, little-endian; absent: zeros.
    pub initial_file: Option<String>,
}

/// `[sequence]` in `model.toml`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SequenceConfig {
    /// A sequence idle this long ends (`"30m"`); `"0s"`, the default: never.
    #[serde(deserialize_with = "duration")]
    pub max_sequence_idle: Duration,
    /// `error` (the default) or `restart`.
    pub idle_action: IdleAction,
    /// The most sequences kept at once (default [`DEFAULT_MAX_SEQUENCES`]);
    /// a start beyond it is refused (RESOURCE_EXHAUSTED).
    pub max_sequences: Option<usize>,
    /// The state pairs.
    pub state: Vec<StateConfig>,
    /// The windows; a sequence model has state pairs, windows, or both.
    pub window: Vec<WindowConfig>,
    /// What a windowed sequence answers before its windows are full:
    /// `pad` (the default) or `wait`.
    pub window_warmup: Warmup,
    /// Serve a sequence only to the key that started it (where keys guard
    /// inference; docs/security.md): any other key is told the sequence is
    /// not active. Off by default.
    pub bind_to_key: bool,
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    crate::durations::deserialize(d)
}

/// Where a graph input's data comes from for a stateful model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputSource {
    /// The client's input at this index of the public signature.
    Client(usize),
    /// The sequence's state pair at this index.
    State(usize),
    /// The sequence's window at index `window`, with the client's tick,
    /// the input at index `client` of the public signature, last.
    Window {
        /// The window's index among [`SequenceSpec::windows`].
        window: usize,
        /// The tick's index among the public inputs.
        client: usize,
    },
}

/// One state pair, resolved against the graph's signature.
#[derive(Debug, Clone, PartialEq)]
pub struct StateSpec {
    /// The graph input that takes it (name, datatype, dims).
    pub input: TensorSpec,
    /// Its index among the graph's inputs.
    pub input_index: usize,
    /// The graph output that becomes its next value.
    pub output: String,
    /// Its index among the graph's outputs.
    pub output_index: usize,
    /// One row of the initial value.
    pub initial: Bytes,
    /// The file it came from (relative to the model's directory); `None`: zeros.
    pub initial_file: Option<String>,
}

/// A stateful model's sequence settings, fixed at load.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceSpec {
    /// The state pairs, in `model.toml` order.
    pub states: Vec<StateSpec>,
    /// The windows, in `model.toml` order. A sequence's kept state is one
    /// row per state pair, then one window (N rows) per window.
    pub windows: Vec<WindowSpec>,
    /// What a windowed sequence answers before its windows are full.
    pub warmup: Warmup,
    /// The signature clients see: the graph's without the state inputs and
    /// outputs, and with one tick in place of each window.
    pub public: Signature,
    /// For each graph input, in graph order, where its data comes from.
    pub input_sources: Vec<InputSource>,
    /// For each public output, its index among the graph's outputs.
    pub output_indices: Vec<usize>,
    /// `max_sequence_idle`; `None`: never.
    pub max_idle: Option<Duration>,
    /// What an idle sequence's next request gets.
    pub idle_action: IdleAction,
    /// The most sequences kept at once.
    pub max_sequences: usize,
    /// `bind_to_key`.
    pub bind_to_key: bool,
}

impl SequenceSpec {
    /// Resolves `config` against the graph's `signature`; initial-state files
    /// are read from `model_dir`. `Ok(None)` for a model without state.
    pub fn resolve(
        config: &SequenceConfig,
        signature: &Signature,
        model_dir: &Path,
    ) -> Result<Option<SequenceSpec>, String> {
        if config.state.is_empty() && config.window.is_empty() {
            if *config != SequenceConfig::default() {
                return Err(
                    "sequence: declares no [[sequence.state]] pair and no [[sequence.window]]; \
                     a sequence model keeps its state in a graph input and output pair, or \
                     in a window input"
                        .to_string(),
                );
            }
            return Ok(None);
        }
        durations::check(
            "sequence.max_sequence_idle",
            config.max_sequence_idle,
            MAX_SEQUENCE_IDLE,
        )?;
        let max_sequences = config.max_sequences.unwrap_or(DEFAULT_MAX_SEQUENCES);
        if !(1..=MAX_SEQUENCES).contains(&max_sequences) {
            return Err(format!(
                "sequence.max_sequences is {max_sequences}; it must be 1 to {MAX_SEQUENCES}"
            ));
        }
        let mut states: Vec<StateSpec> = Vec::with_capacity(config.state.len());
        for (n, pair) in config.state.iter().enumerate() {
            let key = format!("sequence.state[{n}]");
            let input_index = signature.input_index(&pair.input).ok_or_else(|| {
                format!(
                    "{key}.input '{}' is not an input of the graph ({})",
                    pair.input,
                    signature.summary()
                )
            })?;
            let output_index = signature.output_index(&pair.output).ok_or_else(|| {
                format!(
                    "{key}.output '{}' is not an output of the graph ({})",
                    pair.output,
                    signature.summary()
                )
            })?;
            if states
                .iter()
                .any(|s| s.input_index == input_index || s.output_index == output_index)
            {
                return Err(format!(
                    "{key}: input '{}' or output '{}' is already in another state pair",
                    pair.input, pair.output
                ));
            }
            let input = signature.inputs[input_index].clone();
            let output = &signature.outputs[output_index];
            if input.datatype != output.datatype || input.dims != output.dims {
                return Err(format!(
                    "{key}: input '{}' is {} {} but output '{}' is {} {}; a state's next value \
                     must have its shape and datatype",
                    input.name,
                    input.datatype,
                    input.display_shape(),
                    output.name,
                    output.datatype,
                    output.display_shape()
                ));
            }
            let initial = initial_row(
                &key,
                pair.initial_file.as_deref(),
                model_dir,
                &input,
                "one row",
            )?;
            states.push(StateSpec {
                input,
                input_index,
                output: output.name.clone(),
                output_index,
                initial,
                initial_file: pair.initial_file.clone(),
            });
        }
        let mut windows: Vec<WindowSpec> = Vec::with_capacity(config.window.len());
        for (n, window) in config.window.iter().enumerate() {
            let window = WindowSpec::resolve(n, window, signature, model_dir)?;
            let taken = states.iter().any(|s| s.input_index == window.input_index)
                || windows.iter().any(|w| w.input_index == window.input_index);
            if taken {
                return Err(format!(
                    "sequence.window[{n}]: input '{}' is already a state or another window",
                    window.input.name
                ));
            }
            windows.push(window);
        }
        let mut public = Signature {
            inputs: Vec::new(),
            outputs: Vec::new(),
        };
        let mut input_sources = Vec::with_capacity(signature.inputs.len());
        for (index, spec) in signature.inputs.iter().enumerate() {
            if let Some(state) = states.iter().position(|s| s.input_index == index) {
                input_sources.push(InputSource::State(state));
            } else if let Some(window) = windows.iter().position(|w| w.input_index == index) {
                input_sources.push(InputSource::Window {
                    window,
                    client: public.inputs.len(),
                });
                public.inputs.push(windows[window].tick.clone());
            } else {
                input_sources.push(InputSource::Client(public.inputs.len()));
                public.inputs.push(spec.clone());
            }
        }
        let mut output_indices = Vec::new();
        for (index, spec) in signature.outputs.iter().enumerate() {
            if !states.iter().any(|s| s.output_index == index) {
                output_indices.push(index);
                public.outputs.push(spec.clone());
            }
        }
        if public.inputs.is_empty() || public.outputs.is_empty() {
            return Err(format!(
                "sequence: with its state pairs taken out the graph has no input or no \
                 output left for clients ({})",
                signature.summary()
            ));
        }
        Ok(Some(SequenceSpec {
            states,
            windows,
            warmup: config.window_warmup,
            public,
            input_sources,
            output_indices,
            max_idle: (!config.max_sequence_idle.is_zero()).then_some(config.max_sequence_idle),
            idle_action: config.idle_action,
            max_sequences,
            bind_to_key: config.bind_to_key,
        }))
    }
}

impl SequenceSpec {
    /// A signature whose inputs are the state and window inputs: what a
    /// state write sends, decoded as an inference request's inputs are.
    pub fn state_signature(&self) -> Signature {
        Signature {
            inputs: self
                .states
                .iter()
                .map(|s| s.input.clone())
                .chain(self.windows.iter().map(|w| w.input.clone()))
                .collect(),
            outputs: Vec::new(),
        }
    }

    /// What a sequence that has seen no tick keeps: each state pair's
    /// initial row, then each window's initial window.
    pub fn initial_state(&self) -> Vec<Bytes> {
        self.states
            .iter()
            .map(|s| s.initial.clone())
            .chain(self.windows.iter().map(|w| w.initial.clone()))
            .collect()
    }

    /// The ticks that fill every window (the longest window's length); 0
    /// for a model without windows.
    pub fn full_after(&self) -> u64 {
        self.windows
            .iter()
            .map(|w| w.length as u64)
            .max()
            .unwrap_or(0)
    }

    /// The state a client wrote, in the model's order, and the ticks its
    /// windows hold: every state input once, by name, with its datatype,
    /// shape `[1, dims...]` and bytes; every window once, shape
    /// `[1, k, F...]` with k from 1 to N, oldest tick first (fewer than N:
    /// the places before them hold the initial tick). With several windows,
    /// each holds as many ticks as it would after the same ticks.
    pub fn state_rows(
        &self,
        model: &str,
        tensors: Vec<InputTensor>,
    ) -> Result<(Vec<Bytes>, u64), Error> {
        let pairs = self.states.len();
        let mut rows: Vec<Option<Bytes>> = vec![None; pairs + self.windows.len()];
        let mut held = vec![0usize; self.windows.len()];
        for tensor in tensors {
            let state = self.states.iter().position(|s| s.input.name == tensor.name);
            let window = self
                .windows
                .iter()
                .position(|w| w.input.name == tensor.name);
            let (index, spec) = match (state, window) {
                (Some(i), _) => (i, &self.states[i].input),
                (None, Some(w)) => (pairs + w, &self.windows[w].input),
                (None, None) => {
                    return Err(Error::input(
                        model,
                        &tensor.name,
                        format!(
                            "one of the model's state or window inputs ({})",
                            self.state_names()
                        ),
                        "a tensor that is neither",
                    ));
                }
            };
            if tensor.datatype != spec.datatype {
                return Err(Error::input(
                    model,
                    &tensor.name,
                    format!("datatype {}", spec.datatype),
                    tensor.datatype.to_string(),
                ));
            }
            let data = match window {
                None => {
                    let expected = spec.shape_of(1);
                    if tensor.shape != expected || tensor.data.len() != spec.row_bytes() {
                        return Err(Error::input(
                            model,
                            &tensor.name,
                            format!("shape {expected:?} ({} bytes)", spec.row_bytes()),
                            format!("shape {:?} ({} bytes)", tensor.shape, tensor.data.len()),
                        ));
                    }
                    tensor.data
                }
                Some(w) => {
                    let window = &self.windows[w];
                    let ticks = window_ticks(&tensor.shape, &window.tick)
                        .filter(|k| (1..=window.length).contains(k))
                        .filter(|k| tensor.data.len() == k * window.tick.row_bytes());
                    let Some(ticks) = ticks else {
                        let dims: String =
                            window.tick.dims.iter().map(|d| format!(", {d}")).collect();
                        return Err(Error::input(
                            model,
                            &tensor.name,
                            format!(
                                "shape [1, k{dims}] with k from 1 to {} (k ticks, oldest \
                                 first; {} bytes each)",
                                window.length,
                                window.tick.row_bytes()
                            ),
                            format!("shape {:?} ({} bytes)", tensor.shape, tensor.data.len()),
                        ));
                    };
                    held[w] = ticks;
                    window.fill(&tensor.data)
                }
            };
            if rows[index].replace(data).is_some() {
                return Err(Error::input(model, &tensor.name, "once", "twice"));
            }
        }
        let seen = held.iter().copied().max().unwrap_or(0) as u64;
        for (window, &k) in self.windows.iter().zip(&held) {
            if k != 0 && k != window.held(seen) {
                return Err(Error::input(
                    model,
                    &window.input.name,
                    format!(
                        "{} ticks: the windows hold the same ticks, as many as fit (another \
                         window holds {seen})",
                        window.held(seen)
                    ),
                    format!("{k} ticks"),
                ));
            }
        }
        let names = self
            .states
            .iter()
            .map(|s| &s.input.name)
            .chain(self.windows.iter().map(|w| &w.input.name));
        let rows = rows
            .into_iter()
            .zip(names)
            .map(|(row, name)| {
                row.ok_or_else(|| {
                    Error::input(model, name, "a tensor for every state and window", "none")
                })
            })
            .collect::<Result<Vec<Bytes>, Error>>()?;
        Ok((rows, seen))
    }

    /// A sequence's state as tensors named by their inputs: each state
    /// pair's row, shape `[1, dims...]`; each window's ticks held after
    /// `seen` ticks, oldest first, shape `[1, k, F...]`.
    pub fn state_tensors(&self, rows: &[Bytes], seen: u64) -> Vec<OutputTensor> {
        let pairs = self
            .states
            .iter()
            .zip(rows)
            .map(|(state, row)| OutputTensor {
                name: Name::from(&state.input.name),
                datatype: state.input.datatype,
                shape: state.input.shape_of(1),
                data: row.clone(),
            });
        let windows = self
            .windows
            .iter()
            .zip(rows.get(self.states.len()..).unwrap_or_default())
            .map(|(window, rows)| {
                let held = window.held(seen);
                let mut shape = window.tick.shape_of(held);
                shape.insert(0, 1);
                OutputTensor {
                    name: Name::from(&window.input.name),
                    datatype: window.input.datatype,
                    shape,
                    data: window.newest(rows, held),
                }
            });
        pairs.chain(windows).collect()
    }

    fn state_names(&self) -> String {
        self.states
            .iter()
            .map(|s| s.input.name.as_str())
            .chain(self.windows.iter().map(|w| w.input.name.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// k, for a window tensor of shape `[1, k, dims...]` where `tick` has `dims`.
fn window_ticks(shape: &[i64], tick: &TensorSpec) -> Option<usize> {
    let (&one, rest) = shape.split_first()?;
    let (&k, dims) = rest.split_first()?;
    let same = dims.len() == tick.dims.len()
        && dims
            .iter()
            .zip(&tick.dims)
            .all(|(&d, &t)| u64::try_from(d).ok() == Some(t as u64));
    (one == 1 && same).then(|| usize::try_from(k).ok())?
}

/// One row of `spec` read from `file` (relative to `model_dir`); zeros
/// when there is no file. Errors name the file as `model.toml` writes it,
/// never by the server's own path: load failures are shown to clients.
fn initial_row(
    key: &str,
    file: Option<&str>,
    model_dir: &Path,
    spec: &TensorSpec,
    what: &str,
) -> Result<Bytes, String> {
    let row_bytes = spec.row_bytes();
    let Some(file) = file else {
        return Ok(Bytes::from(vec![0u8; row_bytes]));
    };
    let shown = format!("{key}.initial_file '{file}'");
    let wrong_size = |held: String| {
        format!(
            "{shown} holds {held} bytes; {what} of '{}' ({} {}) is {row_bytes}",
            spec.name,
            spec.datatype,
            spec.display_shape()
        )
    };
    // A file of the model's own may say its size; past the limit, only that
    // it is too long.
    let limit = u64::try_from(row_bytes)
        .unwrap_or(u64::MAX)
        .max(crate::files::MAX_CONFIG_BYTES);
    let bytes = match crate::files::read(model_dir, file, &shown, limit) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Err(format!("{shown}: no such file in the model's directory")),
        Err(e) if matches!(e.problem, crate::files::Problem::TooLarge(_)) => {
            return Err(wrong_size(format!("more than {limit}")));
        }
        Err(e) => return Err(e.to_string()),
    };
    if bytes.len() != row_bytes {
        return Err(wrong_size(bytes.len().to_string()));
    }
    Ok(Bytes::from(bytes))
}

/// A sequence's id: Triton's `sequence_id`, an unsigned integer or a string
/// (the two never name the same sequence).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SequenceId {
    /// A number (never 0, which Triton reserves for "no sequence").
    Number(u64),
    /// A string of 1 to [`MAX_SEQUENCE_ID_BYTES`] bytes.
    Text(String),
}

impl std::fmt::Display for SequenceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SequenceId::Number(n) => write!(f, "{n}"),
            SequenceId::Text(s) => write!(f, "{s:?}"),
        }
    }
}

impl SequenceId {
    /// An id from a client's string, checked: 1 to [`MAX_SEQUENCE_ID_BYTES`] bytes.
    pub fn text(model: &str, text: &str) -> Result<SequenceId, Error> {
        if text.is_empty() || text.len() > MAX_SEQUENCE_ID_BYTES {
            return Err(Error::request(
                model,
                format!(
                    "a string sequence_id must have 1 to {MAX_SEQUENCE_ID_BYTES} bytes; got {}",
                    text.len()
                ),
            ));
        }
        Ok(SequenceId::Text(text.to_string()))
    }

    /// An id from a client's number, checked: not 0.
    pub fn number(model: &str, n: u64) -> Result<SequenceId, Error> {
        if n == 0 {
            return Err(Error::request(
                model,
                "sequence_id 0 names no sequence (Triton's rule); use 1 or more, or a string",
            ));
        }
        Ok(SequenceId::Number(n))
    }
}

/// What a request says about its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceControl {
    /// Which sequence.
    pub id: SequenceId,
    /// `sequence_start`: the sequence begins (again) with this request, from
    /// its initial state.
    pub start: bool,
    /// `sequence_end`: the sequence ends after this request; its state is dropped.
    pub end: bool,
    /// The key the request carried, where keys guard inference: a model
    /// with `bind_to_key` serves a sequence only to the key that started it.
    pub owner: Option<KeyId>,
}

/// Which key a request carried: the first 8 bytes of the key's SHA-256
/// digest (the key itself is never kept beside a sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; 8]);

#[cfg(test)]
mod tests;
