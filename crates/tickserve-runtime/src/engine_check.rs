//! The load-time check that lets a model run on the compiled CPU engine:
//! its family's graph compiled by that engine and by ONNX Runtime for one
//! row and for three, each bucket run on the same seeded random rows, and
//! every output compared. One element further than [`TOLERANCE`] from ONNX
//! Runtime's (relative, or absolute below 1; an output that is not FP32, a
//! classifier's INT64 label, not equal) keeps the model off the compiled
//! engine, naming the output and the element.

use tickserve_core::{Buckets, CompileRequest, DataType, Device, Engine, SOLE_MEMBER, Weight};
use tickserve_onnx::ModelGraph;
use tickserve_plan::reference::random_rows;

/// The largest difference the check lets through: `|ours − theirs| /
/// max(|theirs|, 1)`.
pub const TOLERANCE: f64 = 1e-5;

/// The rows of the check's buckets.
const SIZES: [usize; 2] = [1, 3];

/// Compiles `graph` (with `weights`, a family's first member's) on
/// `compiled` and on `reference`, runs both on the same rows and returns the
/// largest difference, or why the compiled engine may not take the model.
pub fn same_answers(
    model: &str,
    compiled: &dyn Engine<ModelGraph>,
    reference: &dyn Engine<ModelGraph>,
    graph: &ModelGraph,
    weights: Option<&[Weight]>,
) -> Result<f64, String> {
    let buckets = Buckets::new(&SIZES, None)?;
    let family = format!("{model} (engine check)");
    let request = CompileRequest {
        family: &family,
        graph,
        buckets: &buckets,
        weights,
        device: Device::Cpu,
        check: true,
        resident: None,
    };
    let mut ours = compiled
        .compile(&request)
        .map_err(|e| format!("cannot compile it: {e}"))?;
    let mut theirs = reference
        .compile(&request)
        .map_err(|e| format!("cannot be checked: ONNX Runtime cannot compile it: {e}"))?;
    let mut worst = 0.0f64;
    for (bucket, &rows) in SIZES.iter().enumerate() {
        let inputs = ours.signature().inputs.clone();
        for (i, spec) in inputs.iter().enumerate() {
            if spec.datatype != DataType::Fp32 {
                return Err(format!(
                    "takes input '{}' as {}, not FP32",
                    spec.name, spec.datatype
                ));
            }
            let floats = random_rows(
                (rows * 31 + i) as u64,
                rows * spec.dims.iter().product::<usize>(),
            );
            let bytes: Vec<u8> = floats.iter().flat_map(|v| v.to_le_bytes()).collect();
            ours.input_mut(bucket, i).copy_from_slice(&bytes);
            theirs.input_mut(bucket, i).copy_from_slice(&bytes);
        }
        ours.run(bucket, SOLE_MEMBER)
            .map_err(|e| format!("failed its check run: {e}"))?;
        theirs
            .run(bucket, SOLE_MEMBER)
            .map_err(|e| format!("cannot be checked: ONNX Runtime failed: {e}"))?;
        for (o, spec) in ours.signature().outputs.iter().enumerate() {
            if spec.datatype != DataType::Fp32 {
                let (a, b) = (ours.output(bucket, o), theirs.output(bucket, o));
                if a != b {
                    let element = a
                        .iter()
                        .zip(b)
                        .position(|(x, y)| x != y)
                        .map_or(0, |at| at / spec.datatype.size().max(1));
                    return Err(format!(
                        "answers differently from ONNX Runtime: output '{}' ({}), {rows} rows: \
                         element {element} differs ({} bytes against {})",
                        spec.name,
                        spec.datatype,
                        a.len(),
                        b.len()
                    ));
                }
                continue;
            }
            let (a, b) = (
                floats(ours.output(bucket, o)),
                floats(theirs.output(bucket, o)),
            );
            let (diff, element) = difference(&a, &b).ok_or_else(|| {
                format!(
                    "gives {} floats of output '{}' for {rows} rows; ONNX Runtime {}",
                    a.len(),
                    spec.name,
                    b.len()
                )
            })?;
            if diff > TOLERANCE {
                return Err(format!(
                    "answers differently from ONNX Runtime: output '{}', {rows} rows, element \
                     {element}: {} against {} (difference {diff:.2e}, at most {TOLERANCE:.0e})",
                    spec.name, a[element], b[element]
                ));
            }
            worst = worst.max(diff);
        }
    }
    Ok(worst)
}

/// Little-endian bytes as floats.
fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The largest `|a − b| / max(|b|, 1)` and where; `None` when the lengths
/// differ. A NaN on one side only counts as infinitely far; a NaN on both
/// is the same answer (a tree ensemble's `SOFTMAX_ZERO` over no score gives
/// NaN on both engines).
pub fn difference(ours: &[f32], theirs: &[f32]) -> Option<(f64, usize)> {
    if ours.len() != theirs.len() {
        return None;
    }
    let mut worst = (0.0f64, 0usize);
    for (i, (&a, &b)) in ours.iter().zip(theirs).enumerate() {
        let (a, b) = (f64::from(a), f64::from(b));
        let rel = if a.is_nan() && b.is_nan() {
            0.0
        } else if a.is_nan() || b.is_nan() {
            f64::INFINITY
        } else {
            (a - b).abs() / b.abs().max(1.0)
        };
        if rel > worst.0 {
            worst = (rel, i);
        }
    }
    Some(worst)
}

/// One input of the fuzz target `against_onnx_runtime`
/// (`fuzz/fuzz_targets/against_onnx_runtime.rs`): a random tree ensemble or
/// dense network (`tickserve_engine_cpu::fuzzing::models`) built from
/// `data`, put through [`same_answers`] on the compiled CPU engine against
/// `reference` (ONNX Runtime). Panics on a difference, a failed run, or a
/// dense network the compiled engine refuses; a forest either engine refuses
/// (PROBIT, the class layouts ONNX Runtime leaves undefined) passes. Not an
/// API.
#[doc(hidden)]
pub fn fuzz_against_onnx_runtime(reference: &dyn Engine<ModelGraph>, data: &[u8]) {
    use tickserve_engine_cpu::fuzzing::models::{Choices, FromBytes, forest, mlp};
    let mut d = FromBytes(data);
    let is_forest = d.chance(50);
    let bytes = if is_forest {
        forest(&mut d)
    } else {
        mlp(&mut d)
    };
    let onnx = tickserve_onnx::OnnxModel::parse(&bytes).expect("the generator writes ONNX");
    let signature = onnx
        .signature(&tickserve_core::config::ModelConfig::default())
        .expect("the generator writes a servable signature");
    let graph = ModelGraph { onnx, signature };
    let compiled = tickserve_engine_cpu::CpuEngine::new();
    match same_answers("fuzz", &compiled, reference, &graph, None) {
        Ok(_) => {}
        Err(e)
            if e.starts_with("answers differently")
                || e.starts_with("failed its check run")
                || e.starts_with("gives")
                || !is_forest =>
        {
            panic!("{e}")
        }
        Err(_) => {}
    }
}
