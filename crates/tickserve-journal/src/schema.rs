//! The Arrow schema of one model version's records: fixed columns for what
//! every record has, and one typed column per input, output and state.
//!
//! A tensor column holds a request's rows as a list of fixed-size lists
//! (`input.x`: `List<FixedSizeList<Float32, 8>>` for 8 features); its field
//! metadata names the datatype (`tickserve.datatype`: `FP32`) and the row
//! shape (`tickserve.shape`: `[30, 8]`). A state column holds the one row a
//! tick read, or for a window the N ticks it held before the tick
//! (`window_ticks` of them real, counting the tick: the rest initial). Monte Carlo answers, whose outputs depend on the request's
//! `mc_output`, go in `mc_outputs` (name, datatype, shape, little-endian
//! bytes per output).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{DataType as Arrow, Field, Fields, Schema, SchemaRef, TimeUnit};
use tickserve_core::{DataType, TensorSpec};
use tickserve_runtime::ModelHandle;

/// Schema metadata: the journal format's version.
pub const FORMAT: &str = "tickserve.journal";
/// The format version written.
pub const FORMAT_VERSION: &str = "1";
/// Schema metadata: the run (one server process) that wrote the file.
pub const RUN: &str = "tickserve.run";
/// Schema metadata: the model's name.
pub const MODEL: &str = "tickserve.model";
/// Schema metadata: the model's version.
pub const VERSION: &str = "tickserve.version";
/// Schema metadata: the SHA-256 of the `model.onnx` that answered.
pub const DIGEST: &str = "tickserve.model_digest";
/// Schema metadata: what the predictions were computed on (JSON: the
/// server's version, the engine's build, the CPU and its instruction-set
/// extensions, the GPUs, the OS), for `journal replay` to compare.
pub const MACHINE: &str = "tickserve.machine";
/// Schema metadata: the number of the file's first record.
pub const FIRST_RECORD: &str = "tickserve.first_record";
/// Field metadata: a tensor column's datatype (`FP32`).
pub const DATATYPE: &str = "tickserve.datatype";
/// Field metadata: a tensor column's row shape (`[30, 8]`).
pub const SHAPE: &str = "tickserve.shape";

/// Column prefixes of the tensor columns.
pub const INPUT: &str = "input.";
/// See [`INPUT`].
pub const OUTPUT: &str = "output.";
/// See [`INPUT`].
pub const STATE: &str = "state.";
/// The column that chains each record to the one before it.
pub const CHAIN: &str = "chain";

/// What a model version's records hold: its tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The inputs clients send, in signature order.
    pub inputs: Vec<TensorSpec>,
    /// The outputs, in signature order.
    pub outputs: Vec<TensorSpec>,
    /// A stateful model's state inputs, then its window inputs, in
    /// `model.toml` order.
    pub states: Vec<TensorSpec>,
}

impl Layout {
    /// The layout of `handle`'s records.
    pub fn of(handle: &ModelHandle) -> Layout {
        Layout {
            inputs: handle.signature.inputs.clone(),
            outputs: handle.signature.outputs.clone(),
            states: handle
                .settings
                .sequence
                .as_ref()
                .map(|s| {
                    let states = s.states.iter().map(|s| s.input.clone());
                    states
                        .chain(s.windows.iter().map(|w| w.input.clone()))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The schema of a file of `model` version `version` (file digest
    /// `digest`) written by `run` on `machine` (JSON), whose first record is
    /// `first`.
    pub fn schema(
        &self,
        run: &str,
        (model, version, digest): (&str, &str, &str),
        machine: &str,
        first: u64,
    ) -> SchemaRef {
        let mut fields = vec![
            Field::new("record", Arrow::UInt64, false),
            Field::new("dropped_so_far", Arrow::UInt64, false),
            Field::new(CHAIN, Arrow::FixedSizeBinary(32), false),
            Field::new(
                "received",
                Arrow::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                false,
            ),
            Field::new(
                "answered",
                Arrow::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                false,
            ),
            Field::new("queue", Arrow::Duration(TimeUnit::Nanosecond), false),
            Field::new("compute", Arrow::Duration(TimeUnit::Nanosecond), false),
            Field::new("protocol", Arrow::Utf8, false),
            Field::new("request_id", Arrow::Utf8, false),
            Field::new("traceparent", Arrow::Utf8, true),
            Field::new("key", Arrow::Utf8, true),
            Field::new("model", Arrow::Utf8, false),
            Field::new("version", Arrow::Utf8, false),
            Field::new("model_digest", Arrow::Utf8, false),
            Field::new("bucket", Arrow::UInt32, true),
            Field::new("status", Arrow::Utf8, false),
            Field::new("error", Arrow::Utf8, true),
            Field::new("priority", Arrow::UInt64, false),
            Field::new("sequence_id", Arrow::Utf8, true),
            Field::new("sequence_start", Arrow::Boolean, true),
            Field::new("sequence_end", Arrow::Boolean, true),
            Field::new("mc_samples", Arrow::UInt32, true),
            Field::new("mc_noise_sigma", Arrow::Float64, true),
            Field::new("mc_seed", Arrow::UInt64, true),
            Field::new("mc_output", Arrow::Utf8, true),
            Field::new("mc_quantiles", Arrow::Utf8, true),
            Field::new("rows", Arrow::UInt32, true),
            Field::new("window_ticks", Arrow::UInt32, true),
        ];
        for spec in &self.inputs {
            fields.push(rows_field(INPUT, spec));
        }
        for spec in &self.outputs {
            fields.push(rows_field(OUTPUT, spec));
        }
        for spec in &self.states {
            fields.push(tensor_field(&format!("{STATE}{}", spec.name), spec, true));
        }
        fields.push(Field::new(
            "mc_outputs",
            Arrow::List(Arc::new(Field::new_struct(
                "item",
                mc_output_fields(),
                false,
            ))),
            true,
        ));
        let metadata = HashMap::from([
            (FORMAT.to_string(), FORMAT_VERSION.to_string()),
            (RUN.to_string(), run.to_string()),
            (MODEL.to_string(), model.to_string()),
            (VERSION.to_string(), version.to_string()),
            (DIGEST.to_string(), digest.to_string()),
            (MACHINE.to_string(), machine.to_string()),
            (FIRST_RECORD.to_string(), first.to_string()),
        ]);
        Arc::new(Schema::new_with_metadata(fields, metadata))
    }
}

/// The fields of one `mc_outputs` entry.
pub fn mc_output_fields() -> Fields {
    Fields::from(vec![
        Field::new("name", Arrow::Utf8, false),
        Field::new("datatype", Arrow::Utf8, false),
        Field::new(
            "shape",
            Arrow::List(Arc::new(Field::new("item", Arrow::Int64, false))),
            false,
        ),
        Field::new("data", Arrow::Binary, false),
    ])
}

/// The Arrow type of a tensor element of `datatype` (`BOOL` as its bytes,
/// 0 or 1, so that every record replays bit for bit).
pub fn element(datatype: DataType) -> Arrow {
    match datatype {
        DataType::Bool | DataType::Uint8 => Arrow::UInt8,
        DataType::Uint16 => Arrow::UInt16,
        DataType::Uint32 => Arrow::UInt32,
        DataType::Uint64 => Arrow::UInt64,
        DataType::Int8 => Arrow::Int8,
        DataType::Int16 => Arrow::Int16,
        DataType::Int32 => Arrow::Int32,
        DataType::Int64 => Arrow::Int64,
        DataType::Fp32 => Arrow::Float32,
        DataType::Fp64 => Arrow::Float64,
    }
}

/// One row of `spec`: a fixed-size list of its elements.
pub fn row_type(spec: &TensorSpec) -> Arrow {
    Arrow::FixedSizeList(
        Arc::new(Field::new("item", element(spec.datatype), false)),
        i32::try_from(spec.row_elements()).unwrap_or(i32::MAX),
    )
}

/// A column of a request's rows of `spec`.
fn rows_field(prefix: &str, spec: &TensorSpec) -> Field {
    let row = Field::new("item", row_type(spec), false);
    Field::new(
        format!("{prefix}{}", spec.name),
        Arrow::List(Arc::new(row)),
        true,
    )
    .with_metadata(tensor_metadata(spec))
}

/// A column of one row of `spec`.
fn tensor_field(name: &str, spec: &TensorSpec, nullable: bool) -> Field {
    Field::new(name, row_type(spec), nullable).with_metadata(tensor_metadata(spec))
}

fn tensor_metadata(spec: &TensorSpec) -> HashMap<String, String> {
    HashMap::from([
        (DATATYPE.to_string(), spec.datatype.as_str().to_string()),
        (SHAPE.to_string(), format!("{:?}", spec.dims)),
    ])
}
