//! `tickserve journal replay DIR --model-repository PATH`: every successful
//! record rerun on the model version it names, in the bucket it ran in,
//! with the Monte Carlo seed it used and, for a stateful model, the state
//! rows it read; each output compared bit for bit with the one the client
//! got.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use bytes::Bytes;
use serde::Serialize;
use tickserve_core::monte_carlo::{MonteCarlo, Summary};
use tickserve_core::sequence::{SequenceControl, SequenceId};
use tickserve_core::{DataType, InputTensor, ModelRequest, OutputTensor};
use tickserve_runtime::{ModelHandle, Runtime};

use crate::read::scan_dir;
use crate::schema::{INPUT, OUTPUT, STATE};

/// What `replay` found.
#[derive(Debug, Default, Serialize)]
pub struct ReplayReport {
    /// Records read.
    pub records: u64,
    /// Records rerun.
    pub replayed: u64,
    /// Records whose every output came back bit for bit.
    pub identical: u64,
    /// Records rerun whose client got no output to compare with (it asked
    /// for none, which journals of older servers hold).
    pub nothing_to_compare: u64,
    /// Records not rerun because they had failed (no prediction to compare).
    pub failed_originally: u64,
    /// Records that could not be rerun, and why (a version not loaded, a
    /// model file that differs).
    pub not_replayed: Vec<String>,
    /// Records whose outputs differ: which, and how.
    pub mismatches: Vec<String>,
    /// The largest absolute difference seen in any float output.
    pub worst_difference: f64,
    /// How the machine the records were computed on differs from this one
    /// (`cpu_isa: recorded '...', here '...'`), each once: a reason bits may
    /// differ, said before any comparison.
    pub machine_differences: Vec<String>,
}

impl ReplayReport {
    /// The report for people.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for m in &self.machine_differences {
            let _ = writeln!(out, "MACHINE DIFFERS: {m}");
        }
        for m in self.not_replayed.iter().take(50) {
            let _ = writeln!(out, "NOT REPLAYED: {m}");
        }
        for m in self.mismatches.iter().take(50) {
            let _ = writeln!(out, "MISMATCH: {m}");
        }
        let _ = writeln!(
            out,
            "{} records: {} replayed, {} bit-identical, {} with no output to compare, \
             {} mismatched (worst difference {:e}), {} failed originally, {} not replayed",
            self.records,
            self.replayed,
            self.identical,
            self.nothing_to_compare,
            self.mismatches.len(),
            self.worst_difference,
            self.failed_originally,
            self.not_replayed.len()
        );
        out
    }
}

/// Reruns every record under `dir` on `runtime`'s models, reading one
/// record batch at a time.
pub async fn replay(dir: &Path, runtime: &Runtime) -> Result<ReplayReport, String> {
    let journal = scan_dir(dir)?;
    let mut report = ReplayReport::default();
    let here = runtime.machine();
    for file in journal.streams.values().flatten() {
        for difference in machine_differences(&file.machine, &here) {
            if !report.machine_differences.contains(&difference) {
                report.machine_differences.push(difference);
            }
        }
    }
    let mut replay_id = 0u64;
    for (id, files) in &journal.streams {
        let handle = match runtime.model(&id.model, Some(&id.version)) {
            Ok(h) if h.digest == id.digest => Some(h),
            Ok(h) => {
                report.not_replayed.push(format!(
                    "{}/{}: the repository's model.onnx has digest {}, the records were made by {}",
                    id.model, id.version, h.digest, id.digest
                ));
                None
            }
            Err(e) => {
                report.not_replayed.push(format!(
                    "{}/{}: {}",
                    id.model,
                    id.version,
                    e.client_message()
                ));
                None
            }
        };
        for file in files {
            let batches = match file.batches() {
                Ok(batches) => batches,
                Err(e) => {
                    report
                        .not_replayed
                        .push(format!("{}: {e}", file.path.display()));
                    continue;
                }
            };
            // A partial batch at a file's end (a crash) is what verify
            // reports; the whole ones before it replay.
            for batch in batches.map_while(Result::ok) {
                report.records += batch.num_rows() as u64;
                let Some(handle) = &handle else {
                    continue;
                };
                for row in 0..batch.num_rows() {
                    replay_id += 1;
                    replay_row(handle, &batch, row, replay_id, &mut report).await;
                }
            }
        }
    }
    Ok(report)
}

async fn replay_row(
    handle: &Arc<ModelHandle>,
    batch: &RecordBatch,
    row: usize,
    replay_id: u64,
    report: &mut ReplayReport,
) {
    let number = column::<UInt64Type>(batch, "record", row).unwrap_or(0);
    let label = format!("{}/{} record {number}", handle.name, handle.version);
    let status = string(batch, "status", row).unwrap_or_default();
    if status != "ok" {
        report.failed_originally += 1;
        return;
    }
    match rerun(handle, batch, row, replay_id).await {
        Ok(_) if recorded_outputs(batch, row).is_empty() => {
            // The client asked for no output (an empty list, before that
            // asked for every one): rerun, with nothing to compare.
            report.replayed += 1;
            report.nothing_to_compare += 1;
        }
        Ok(outputs) => {
            report.replayed += 1;
            match compare(batch, row, &outputs, &mut report.worst_difference) {
                Ok(()) => report.identical += 1,
                Err(why) => report.mismatches.push(format!("{label}: {why}")),
            }
        }
        Err(why) => report.not_replayed.push(format!("{label}: {why}")),
    }
}

/// Runs the record's request again and returns its outputs.
async fn rerun(
    handle: &Arc<ModelHandle>,
    batch: &RecordBatch,
    row: usize,
    replay_id: u64,
) -> Result<Vec<OutputTensor>, String> {
    let rows = column::<UInt32Type>(batch, "rows", row).ok_or("it has no inputs")? as usize;
    let mut inputs = Vec::new();
    for spec in &handle.signature.inputs {
        let data = tensor_rows(batch, &format!("{INPUT}{}", spec.name), row)
            .ok_or_else(|| format!("input {} is missing", spec.name))?;
        inputs.push(InputTensor {
            name: spec.name.clone(),
            datatype: spec.datatype,
            shape: spec.shape_of(rows),
            data,
        });
    }
    let monte_carlo = column::<UInt32Type>(batch, "mc_samples", row).map(|samples| MonteCarlo {
        samples: samples as usize,
        sigma: column::<Float64Type>(batch, "mc_noise_sigma", row),
        seed: column::<UInt64Type>(batch, "mc_seed", row),
        summary: match string(batch, "mc_output", row).as_deref() {
            Some("quantiles") => Summary::Quantiles(
                string(batch, "mc_quantiles", row)
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|q| q.parse().ok())
                    .collect(),
            ),
            Some("samples") => Summary::Samples,
            _ => Summary::Moments,
        },
    });
    // A stateful model's tick reruns from the state it read, written into a
    // sequence of the replay's own.
    let sequence = match (handle.sequences(), string(batch, "sequence_id", row)) {
        (Some(sequences), Some(_)) => {
            let spec = sequences.spec();
            let mut state = Vec::new();
            let inputs = spec.states.iter().map(|s| &s.input);
            for input in inputs.chain(spec.windows.iter().map(|w| &w.input)) {
                let name = format!("{STATE}{}", input.name);
                state.push(
                    state_row(batch, &name, row)
                        .ok_or_else(|| format!("state {} is missing", input.name))?,
                );
            }
            // The windows held one tick fewer before the tick (as many, once full).
            let held = column::<UInt32Type>(batch, "window_ticks", row).unwrap_or(0);
            let before = u64::from(held.saturating_sub(1));
            let id = SequenceId::Text(format!("tickserve-replay-{replay_id}"));
            sequences
                .write(&id, state, before, None, None)
                .await
                .map_err(|e| e.client_message())?;
            Some(SequenceControl {
                id,
                start: false,
                end: true,
                owner: None,
            })
        }
        _ => None,
    };
    let request = ModelRequest {
        id: String::new(),
        inputs,
        outputs: None,
        deadline: None,
        monte_carlo,
        priority: 0,
        sequence,
    };
    let mut prepared = handle.prepare(request).map_err(|e| e.client_message())?;
    if let Some(bucket) = column::<UInt32Type>(batch, "bucket", row) {
        prepared.pin_bucket(bucket as usize);
    }
    let answer = handle.run(prepared).await.map_err(|e| e.client_message())?;
    Ok(answer.outputs)
}

/// Compares the rerun's `outputs` with the record's, bit for bit.
fn compare(
    batch: &RecordBatch,
    row: usize,
    outputs: &[OutputTensor],
    worst: &mut f64,
) -> Result<(), String> {
    let mut differences = Vec::new();
    let recorded = recorded_outputs(batch, row);
    for (name, datatype, data) in &recorded {
        let Some(now) = outputs.iter().find(|o| &o.name == name) else {
            differences.push(format!("{name}: not in the rerun's answer"));
            continue;
        };
        if now.data[..] == data[..] {
            continue;
        }
        let diff = max_difference(*datatype, data, &now.data);
        *worst = worst.max(diff);
        differences.push(format!("{name}: differs, largest difference {diff:e}"));
    }
    if differences.is_empty() {
        Ok(())
    } else {
        Err(differences.join("; "))
    }
}

/// Each name whose value differs between the machine that `recorded` and
/// this one (`here`), as words; nothing for a file that named no machine.
pub fn machine_differences(
    recorded: &std::collections::BTreeMap<String, String>,
    here: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    recorded
        .iter()
        .filter_map(|(name, then)| {
            let now = here.get(name).map_or("(not known here)", String::as_str);
            (then != now).then(|| format!("{name}: recorded '{then}', here '{now}'"))
        })
        .collect()
}

/// The outputs a record holds: its model outputs, or its Monte Carlo ones.
fn recorded_outputs(batch: &RecordBatch, row: usize) -> Vec<(String, DataType, Bytes)> {
    let mut out = Vec::new();
    let schema = batch.schema();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if let Some(name) = field.name().strip_prefix(OUTPUT) {
            let datatype = field
                .metadata()
                .get(crate::schema::DATATYPE)
                .and_then(|d| DataType::parse(d));
            if let (Some(datatype), Some(data)) = (datatype, list_bytes(column.as_ref(), row)) {
                out.push((name.to_string(), datatype, data));
            }
        }
    }
    let entries = batch
        .column_by_name("mc_outputs")
        .and_then(|mc| mc.as_list_opt::<i32>())
        .filter(|list| list.is_valid(row))
        .map(|list| list.value(row));
    if let Some(entries) = entries.as_ref().and_then(|e| e.as_struct_opt())
        && let (Some(names), Some(types), Some(data)) = (
            entries.column(0).as_string_opt::<i32>(),
            entries.column(1).as_string_opt::<i32>(),
            entries.column(3).as_binary_opt::<i32>(),
        )
    {
        for i in 0..entries.len() {
            if let Some(t) = DataType::parse(types.value(i)) {
                out.push((
                    names.value(i).to_string(),
                    t,
                    Bytes::copy_from_slice(data.value(i)),
                ));
            }
        }
    }
    out
}

/// The largest absolute difference between two float tensors (infinite for
/// integers or different lengths, which must match exactly).
fn max_difference(datatype: DataType, a: &[u8], b: &[u8]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    match datatype {
        DataType::Fp32 => a
            .chunks_exact(4)
            .zip(b.chunks_exact(4))
            .map(|(x, y)| {
                let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                let y = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
                f64::from((x - y).abs())
            })
            .fold(0.0, f64::max),
        DataType::Fp64 => a
            .chunks_exact(8)
            .zip(b.chunks_exact(8))
            .map(|(x, y)| {
                let x = f64::from_le_bytes(x.try_into().unwrap_or([0; 8]));
                let y = f64::from_le_bytes(y.try_into().unwrap_or([0; 8]));
                (x - y).abs()
            })
            .fold(0.0, f64::max),
        _ => f64::INFINITY,
    }
}

fn column<T: arrow_array::ArrowPrimitiveType>(
    batch: &RecordBatch,
    name: &str,
    row: usize,
) -> Option<T::Native> {
    let array = batch.column_by_name(name)?.as_primitive_opt::<T>()?;
    array.is_valid(row).then(|| array.value(row))
}

fn string(batch: &RecordBatch, name: &str, row: usize) -> Option<String> {
    let array = batch.column_by_name(name)?.as_string_opt::<i32>()?;
    array.is_valid(row).then(|| array.value(row).to_string())
}

/// A tensor column's cell (a list of rows) as little-endian bytes.
fn tensor_rows(batch: &RecordBatch, name: &str, row: usize) -> Option<Bytes> {
    list_bytes(batch.column_by_name(name)?.as_ref(), row)
}

fn list_bytes(column: &dyn Array, row: usize) -> Option<Bytes> {
    let list = column.as_list_opt::<i32>()?;
    if !list.is_valid(row) {
        return None;
    }
    let rows = list.value(row);
    let items = rows.as_fixed_size_list_opt()?.values();
    primitive_bytes(items.as_ref())
}

fn state_row(batch: &RecordBatch, name: &str, row: usize) -> Option<Bytes> {
    let column = batch.column_by_name(name)?.as_fixed_size_list_opt()?;
    if !column.is_valid(row) {
        return None;
    }
    primitive_bytes(column.value(row).as_ref())
}

/// A primitive array's values as little-endian bytes.
fn primitive_bytes(array: &dyn Array) -> Option<Bytes> {
    let width = array.data_type().primitive_width()?;
    let data = array.to_data();
    let from = data.offset() * width;
    let buffer = data.buffers().first()?;
    buffer
        .as_slice()
        .get(from..from + data.len() * width)
        .map(Bytes::copy_from_slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le<T: Copy, const N: usize>(values: &[T], bytes: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        values.iter().flat_map(|&v| bytes(v)).collect()
    }

    #[test]
    fn the_largest_difference_is_that_of_floats_and_infinite_otherwise() {
        let f32s = |v: &[f32]| le(v, f32::to_le_bytes);
        let f64s = |v: &[f64]| le(v, f64::to_le_bytes);
        let a = f32s(&[1.0, 2.0, -3.0]);
        assert_eq!(max_difference(DataType::Fp32, &a, &a), 0.0);
        assert_eq!(
            max_difference(DataType::Fp32, &a, &f32s(&[1.5, 2.0, -3.25])),
            0.5
        );
        assert_eq!(
            max_difference(DataType::Fp32, &a, &f32s(&[1.0, 2.0])),
            f64::INFINITY
        );
        let b = f64s(&[4.0, -1.0]);
        assert_eq!(
            max_difference(DataType::Fp64, &b, &f64s(&[4.0, -1.125])),
            0.125
        );
        assert_eq!(max_difference(DataType::Fp64, &b, &b), 0.0);
        let ints = le(&[1i32, 2], i32::to_le_bytes);
        assert_eq!(max_difference(DataType::Int32, &ints, &ints), f64::INFINITY);
    }
}
