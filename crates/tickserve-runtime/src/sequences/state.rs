//! A tick's state gathered into its request and scattered back out of the
//! answer: the sequence's state rows go in their places among the graph's
//! inputs, and the state outputs come out of the answer as the next state;
//! each window, with the tick pushed in, takes the tick's place.

use bytes::Bytes;
use tickserve_core::InferResponse;
use tickserve_core::sequence::{InputSource, SequenceSpec};
use tickserve_core::validate::ValidRequest;

use crate::monte_carlo::Plan;

/// `request` (the client's inputs, Monte Carlo's noisy copies included) with
/// the sequence's `state` rows in their places, in the graph's input order,
/// and the state outputs asked for after the client's. With Monte Carlo the
/// `clean` row runs last, and every row gets the same state. A window input
/// gets, for each row, the sequence's window with that row's tick pushed
/// in. Also returns each window as the tick leaves it (with the clean tick):
/// the sequence's windows once the tick is answered.
pub(crate) fn with_state(
    spec: &SequenceSpec,
    mut request: ValidRequest,
    clean: Option<Vec<Bytes>>,
    state: &[Bytes],
) -> (ValidRequest, Vec<Bytes>) {
    let rows = request.rows + usize::from(clean.is_some());
    let mut client = std::mem::take(&mut request.inputs);
    if let Some(clean) = clean {
        for (noisy, row) in client.iter_mut().zip(clean) {
            let mut joined = Vec::with_capacity(noisy.len() + row.len());
            joined.extend_from_slice(noisy);
            joined.extend_from_slice(&row);
            *noisy = Bytes::from(joined);
        }
    }
    let kept_windows = state.get(spec.states.len()..).unwrap_or_default();
    let mut next_windows = vec![Bytes::new(); spec.windows.len()];
    let inputs = spec
        .input_sources
        .iter()
        .map(|source| match *source {
            InputSource::Window { window, client: at } => {
                let (Some(w), Some(kept)) = (spec.windows.get(window), kept_windows.get(window))
                else {
                    return Bytes::new();
                };
                let ticks = client.get(at).cloned().unwrap_or_default();
                let tick_bytes = w.tick.row_bytes().max(1);
                // The last row is the tick the sequence keeps (the clean
                // one, with Monte Carlo).
                let last = ticks.len().saturating_sub(tick_bytes);
                let next = w.push(kept, ticks.get(last..).unwrap_or_default());
                if let Some(slot) = next_windows.get_mut(window) {
                    *slot = next.clone();
                }
                if rows == 1 {
                    return next;
                }
                let mut all = Vec::with_capacity(rows * kept.len());
                for tick in ticks.chunks_exact(tick_bytes) {
                    all.extend_from_slice(&w.push(kept, tick));
                }
                Bytes::from(all)
            }
            InputSource::Client(i) => client.get_mut(i).map(std::mem::take).unwrap_or_default(),
            InputSource::State(s) => {
                let row = state.get(s).cloned().unwrap_or_default();
                if rows == 1 {
                    row
                } else {
                    Bytes::from(row.repeat(rows))
                }
            }
        })
        .collect();
    let outputs = request
        .outputs
        .iter()
        .filter_map(|&o| spec.output_indices.get(o).copied())
        .chain(spec.states.iter().map(|s| s.output_index))
        .collect();
    let request = ValidRequest {
        rows,
        inputs,
        outputs,
        bucket_rows: request.bucket_rows,
    };
    (request, next_windows)
}

/// Takes the state outputs (the last ones, see [`with_state`]) out of
/// `answer`: the sequence's next state. With Monte Carlo, `clean_row` is the
/// clean row's index: the state is that row's, and the row leaves the other
/// outputs too.
pub(crate) fn take_state(
    spec: &SequenceSpec,
    answer: &mut InferResponse,
    clean_row: Option<usize>,
) -> Vec<Bytes> {
    let at = answer.outputs.len().saturating_sub(spec.states.len());
    let states = answer.outputs.split_off(at);
    let Some(row) = clean_row else {
        return states.into_iter().map(|t| t.data).collect();
    };
    let rows = row + 1;
    for output in &mut answer.outputs {
        let row_bytes = output.data.len() / rows;
        output.data.truncate(row * row_bytes);
        if let Some(batch) = output.shape.first_mut() {
            *batch = row as i64;
        }
    }
    states
        .into_iter()
        .map(|t| {
            let row_bytes = t.data.len() / rows;
            Bytes::copy_from_slice(t.data.get(row * row_bytes..).unwrap_or_default())
        })
        .collect()
}

/// The clean row's index in a Monte Carlo run of a sequence: after every
/// noisy copy.
pub(crate) fn tick_row_of(monte_carlo: &Option<Plan>) -> Option<usize> {
    monte_carlo.as_ref().map(Plan::total_rows)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use super::*;
    use tickserve_core::sequence::{SequenceConfig, WindowConfig};
    use tickserve_core::{DataType, Signature, TensorSpec};

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn bytes(values: &[f32]) -> Bytes {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A window of 3 one-feature ticks beside an ordinary input `x`.
    fn spec() -> SequenceSpec {
        let t = |name: &str, dims: &[usize]| TensorSpec {
            name: name.to_string(),
            datatype: DataType::Fp32,
            dims: dims.to_vec(),
        };
        let signature = Signature {
            inputs: vec![t("x", &[1]), t("w", &[3, 1])],
            outputs: vec![t("y", &[1])],
        };
        let config = SequenceConfig {
            window: vec![WindowConfig {
                input: "w".into(),
                initial_file: None,
            }],
            ..SequenceConfig::default()
        };
        SequenceSpec::resolve(&config, &signature, Path::new("."))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn each_row_runs_on_the_window_with_its_tick_and_the_clean_tick_is_kept() {
        let spec = spec();
        let kept = vec![bytes(&[1.0, 2.0, 3.0])];
        // Two noisy copies of the tick (4.1, 4.2), the clean tick (4.0) after.
        let request = ValidRequest {
            rows: 2,
            inputs: vec![bytes(&[9.1, 9.2]), bytes(&[4.1, 4.2])],
            outputs: vec![0],
            bucket_rows: 0,
        };
        let clean = Some(vec![bytes(&[9.0]), bytes(&[4.0])]);
        let (request, next) = with_state(&spec, request, clean, &kept);
        assert_eq!(request.rows, 3);
        assert_eq!(floats(&request.inputs[0]), vec![9.1, 9.2, 9.0]);
        assert_eq!(
            floats(&request.inputs[1]),
            vec![2.0, 3.0, 4.1, 2.0, 3.0, 4.2, 2.0, 3.0, 4.0]
        );
        assert_eq!(floats(&next[0]), vec![2.0, 3.0, 4.0]);
        assert_eq!(
            floats(&kept[0]),
            vec![1.0, 2.0, 3.0],
            "the kept window is untouched"
        );
    }
}
