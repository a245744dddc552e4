//! Sequence windows: a graph input `[batch, N, F...]` that the server fills
//! with a sequence's last N ticks. Clients send one tick, `[1, F...]`, under
//! the input's name; the server keeps the window, oldest tick first, and
//! runs the model on the window with the new tick last.
//!
//! A window is kept as its N rows, contiguous, as the graph takes them: a
//! tick makes the next window in one copy (the N-1 newest rows, then the
//! tick), which is the model's input and, once the tick is answered, the
//! sequence's window. A tick that fails never touches the kept one.

use std::path::Path;

use bytes::Bytes;
use serde::Deserialize;

use crate::{Signature, TensorSpec};

/// The longest window, in ticks: a sanity bound on `model.toml`, far above
/// any window model (the graph's own dimension is the real length).
pub const MAX_WINDOW_TICKS: usize = 1 << 20;

/// One window as `model.toml` writes it (`[[sequence.window]]`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WindowConfig {
    /// The graph input that takes the window, shape `[batch, N, F...]`.
    pub input: String,
    /// A file (relative to the model's directory) holding one tick,
    /// little-endian, that fills the window's places no tick has reached
    /// yet; absent: zeros.
    pub initial_file: Option<String>,
}

/// How a windowed sequence answers before its window holds N ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Warmup {
    /// The model runs on the window with its missing places filled (zeros
    /// or the window's `initial_file`); the default.
    #[default]
    Pad,
    /// The tick is kept but the model does not run: the answer has no
    /// outputs, only the parameter `sequence_window_ticks`, until the
    /// windows are full.
    Wait,
}

/// One window, resolved against the graph's signature.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowSpec {
    /// The graph input that takes it (dims `[N, F...]`).
    pub input: TensorSpec,
    /// Its index among the graph's inputs.
    pub input_index: usize,
    /// What a client sends under the input's name: one tick (dims `[F...]`).
    pub tick: TensorSpec,
    /// N: the ticks it holds.
    pub length: usize,
    /// The window of a sequence that has seen no tick: N copies of the
    /// initial tick.
    pub initial: Bytes,
    /// The file its initial tick came from; `None`: zeros.
    pub initial_file: Option<String>,
}

impl WindowSpec {
    /// Resolves window `index` of `model.toml` against `signature`.
    pub(super) fn resolve(
        index: usize,
        config: &WindowConfig,
        signature: &Signature,
        model_dir: &Path,
    ) -> Result<WindowSpec, String> {
        let key = format!("sequence.window[{index}]");
        let input_index = signature.input_index(&config.input).ok_or_else(|| {
            format!(
                "{key}.input '{}' is not an input of the graph ({})",
                config.input,
                signature.summary()
            )
        })?;
        let input = signature.inputs[input_index].clone();
        let Some((&length, rest)) = input.dims.split_first() else {
            return Err(format!(
                "{key}: input '{}' is {} {}; a window input has shape [batch, N, ...] \
                 (N ticks of the rest)",
                input.name,
                input.datatype,
                input.display_shape()
            ));
        };
        if !(1..=MAX_WINDOW_TICKS).contains(&length) {
            return Err(format!(
                "{key}: input '{}' holds {length} ticks; a window holds 1 to {MAX_WINDOW_TICKS}",
                input.name
            ));
        }
        let tick = TensorSpec {
            name: input.name.clone(),
            datatype: input.datatype,
            dims: rest.to_vec(),
        };
        let one = super::initial_row(
            &key,
            config.initial_file.as_deref(),
            model_dir,
            &tick,
            "one tick",
        )?;
        Ok(WindowSpec {
            initial: Bytes::from(one.repeat(length)),
            input,
            input_index,
            tick,
            length,
            initial_file: config.initial_file.clone(),
        })
    }

    /// The window after one more tick: the newest N-1 ticks of `window`,
    /// then `tick` (one tick's bytes).
    pub fn push(&self, window: &[u8], tick: &[u8]) -> Bytes {
        let keep = window.get(tick.len()..).unwrap_or_default();
        let mut next = Vec::with_capacity(keep.len() + tick.len());
        next.extend_from_slice(keep);
        next.extend_from_slice(tick);
        Bytes::from(next)
    }

    /// A window of which the last `ticks` places hold `ticks` (bytes of
    /// whole ticks, at most N), the places before them the initial tick.
    pub fn fill(&self, ticks: &[u8]) -> Bytes {
        let missing = self.initial.len().saturating_sub(ticks.len());
        let mut window = Vec::with_capacity(self.initial.len());
        window.extend_from_slice(self.initial.get(..missing).unwrap_or_default());
        window.extend_from_slice(ticks);
        Bytes::from(window)
    }

    /// The ticks a window holds after `seen` ticks of its sequence: N at most.
    pub fn held(&self, seen: u64) -> usize {
        usize::try_from(seen).map_or(self.length, |s| s.min(self.length))
    }

    /// The newest `held` ticks of `window`, oldest first (a read shows these).
    pub fn newest(&self, window: &Bytes, held: usize) -> Bytes {
        let bytes = held.saturating_mul(self.tick.row_bytes()).min(window.len());
        window.slice(window.len() - bytes..)
    }
}

#[cfg(test)]
mod tests {
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

    fn window(length: usize) -> WindowSpec {
        let signature = Signature {
            inputs: vec![spec("w", &[length, 2])],
            outputs: vec![spec("y", &[1])],
        };
        let config = WindowConfig {
            input: "w".into(),
            initial_file: None,
        };
        WindowSpec::resolve(0, &config, &signature, Path::new(".")).unwrap()
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn tick(a: f32, b: f32) -> Vec<u8> {
        [a.to_le_bytes(), b.to_le_bytes()].concat()
    }

    #[test]
    fn a_tick_shifts_the_window_and_lands_last() {
        let w = window(3);
        assert_eq!(w.tick.dims, vec![2]);
        assert_eq!(floats(&w.initial), vec![0.0; 6]);
        let one = w.push(&w.initial, &tick(1.0, 2.0));
        let two = w.push(&one, &tick(3.0, 4.0));
        let three = w.push(&two, &tick(5.0, 6.0));
        let four = w.push(&three, &tick(7.0, 8.0));
        assert_eq!(floats(&two), vec![0.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!(floats(&four), vec![3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        assert_eq!(floats(&w.newest(&two, w.held(2))), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(w.held(7), 3);
        assert_eq!(floats(&w.newest(&four, w.held(7))), floats(&four));
    }

    #[test]
    fn a_written_history_fills_the_newest_places() {
        let w = window(3);
        let history = [tick(1.0, 2.0), tick(3.0, 4.0)].concat();
        assert_eq!(
            floats(&w.fill(&history)),
            vec![0.0, 0.0, 1.0, 2.0, 3.0, 4.0]
        );
    }

    #[test]
    fn an_initial_file_holds_one_tick_that_fills_the_missing_places() {
        let dir = std::env::temp_dir().join(format!("window-initial-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let signature = Signature {
            inputs: vec![spec("w", &[3, 2])],
            outputs: vec![spec("y", &[1])],
        };
        let config = WindowConfig {
            input: "w".into(),
            initial_file: Some("w0.bin".into()),
        };
        std::fs::write(dir.join("w0.bin"), tick(0.5, -0.5)).unwrap();
        let w = WindowSpec::resolve(0, &config, &signature, &dir).unwrap();
        assert_eq!(floats(&w.initial), vec![0.5, -0.5, 0.5, -0.5, 0.5, -0.5]);
        assert_eq!(
            floats(&w.fill(&tick(1.0, 2.0))),
            vec![0.5, -0.5, 0.5, -0.5, 1.0, 2.0]
        );
        // A whole window in the file is not one tick: refused, named as
        // model.toml writes it.
        std::fs::write(dir.join("w0.bin"), w.initial.as_ref()).unwrap();
        let error = WindowSpec::resolve(0, &config, &signature, &dir).unwrap_err();
        assert!(
            error.contains("sequence.window[0].initial_file 'w0.bin' holds 24 bytes; one tick"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_window_needs_a_length_dimension() {
        let signature = Signature {
            inputs: vec![spec("w", &[])],
            outputs: vec![spec("y", &[1])],
        };
        let config = WindowConfig {
            input: "w".into(),
            initial_file: None,
        };
        let error = WindowSpec::resolve(0, &config, &signature, Path::new(".")).unwrap_err();
        assert!(error.contains("sequence.window[0]: input 'w'"), "{error}");
        let config = WindowConfig {
            input: "nope".into(),
            initial_file: None,
        };
        let error = WindowSpec::resolve(0, &config, &signature, Path::new(".")).unwrap_err();
        assert!(error.contains("sequence.window[0].input 'nope'"), "{error}");
    }
}
