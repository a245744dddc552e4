//! Records of one model version into one Arrow record batch: numbered,
//! chained ([`crate::digest`]), every tensor a typed column.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, FixedSizeBinaryBuilder, Float64Builder, Int64Builder,
    ListBuilder, StringBuilder, StructBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::types::{DurationNanosecondType, TimestampNanosecondType};
use arrow_array::{
    ArrayRef, FixedSizeBinaryArray, FixedSizeListArray, ListArray, PrimitiveArray, RecordBatch,
    make_array,
};
use arrow_buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer, OffsetBuffer};
use arrow_schema::{ArrowError, DataType as Arrow, Field, SchemaRef};
use bytes::Bytes;
use tickserve_core::TensorSpec;

use crate::digest::{ChainDigest, Columns};
use crate::record::{Outputs, Record};
use crate::schema::{self, CHAIN, Layout, mc_output_fields};

/// Where a stream's numbering and chain stand.
#[derive(Debug, Clone)]
pub struct Position {
    /// The next record's number.
    pub next: u64,
    /// The last record's chain digest.
    pub chain: ChainDigest,
}

/// `records` (all of one model version, laid out as `layout`) as one batch
/// of `schema`, numbered and chained from `position`, which moves past
/// them; `dropped` is the run's count of dropped records so far.
pub fn build(
    schema: &SchemaRef,
    layout: &Layout,
    records: &[&Record],
    position: &mut Position,
    dropped: u64,
) -> Result<RecordBatch, ArrowError> {
    let n = records.len();
    let numbers: Vec<u64> = (0..n as u64).map(|i| position.next + i).collect();
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(PrimitiveArray::<arrow_array::types::UInt64Type>::from(
            numbers,
        )),
        Arc::new(PrimitiveArray::<arrow_array::types::UInt64Type>::from(
            vec![dropped; n],
        )),
        // The chain, filled in below once every other column is built (it
        // skips its own column, so these zeros do not count).
        Arc::new(FixedSizeBinaryArray::new(
            32,
            Buffer::from(vec![0u8; 32 * n]),
            None,
        )),
        Arc::new(timestamps(records.iter().map(|r| r.received))),
        Arc::new(timestamps(records.iter().map(|r| r.answered))),
        Arc::new(durations(records.iter().map(|r| r.queue))),
        Arc::new(durations(records.iter().map(|r| r.compute))),
        strings(records.iter().map(|r| Some(r.protocol))),
        strings(records.iter().map(|r| Some(r.id.as_str()))),
        strings(records.iter().map(|r| r.traceparent.as_deref())),
        strings(records.iter().map(|r| r.key.as_deref())),
        strings(records.iter().map(|r| Some(r.handle.name.as_str()))),
        strings(records.iter().map(|r| Some(r.handle.version.as_str()))),
        strings(records.iter().map(|r| Some(r.handle.digest.as_str()))),
        u32s(records.iter().map(|r| r.bucket)),
        strings(records.iter().map(|r| Some(r.status))),
        strings(records.iter().map(|r| r.error.as_deref())),
        Arc::new(PrimitiveArray::<arrow_array::types::UInt64Type>::from(
            records
                .iter()
                .map(|r| r.parameters.priority)
                .collect::<Vec<_>>(),
        )),
        strings(
            records
                .iter()
                .map(|r| r.parameters.sequence.as_ref().map(|s| s.0.as_str())),
        ),
        booleans(
            records
                .iter()
                .map(|r| r.parameters.sequence.as_ref().map(|s| s.1)),
        ),
        booleans(
            records
                .iter()
                .map(|r| r.parameters.sequence.as_ref().map(|s| s.2)),
        ),
        u32s(
            records
                .iter()
                .map(|r| r.parameters.monte_carlo.as_ref().map(|m| m.samples)),
        ),
        {
            let mut b = Float64Builder::with_capacity(n);
            for r in records {
                b.append_option(r.parameters.monte_carlo.as_ref().and_then(|m| m.sigma));
            }
            Arc::new(b.finish())
        },
        {
            let mut b = UInt64Builder::with_capacity(n);
            for r in records {
                b.append_option(r.parameters.monte_carlo.as_ref().map(|m| m.seed));
            }
            Arc::new(b.finish())
        },
        strings(
            records
                .iter()
                .map(|r| r.parameters.monte_carlo.as_ref().map(|m| m.output.as_str())),
        ),
        strings(records.iter().map(|r| {
            r.parameters
                .monte_carlo
                .as_ref()
                .and_then(|m| m.quantiles.as_deref())
        })),
        u32s(
            records
                .iter()
                .map(|r| r.inputs.as_ref().map(|(_, rows)| *rows as u32)),
        ),
        u32s(records.iter().map(|r| r.window_ticks)),
    ];
    for (i, spec) in layout.inputs.iter().enumerate() {
        let cells = records.iter().map(|r| {
            r.inputs
                .as_ref()
                .and_then(|(inputs, rows)| inputs.get(i).map(|d| (d, *rows)))
        });
        columns.push(rows_column(spec, cells)?);
    }
    for (i, spec) in layout.outputs.iter().enumerate() {
        // The model's own outputs (a Monte Carlo answer has its summaries
        // instead, in `mc_outputs`).
        let cells = records.iter().map(|r| {
            let rows = r.inputs.as_ref().map_or(0, |(_, rows)| *rows);
            match &r.outputs {
                Outputs::Model(outputs) => outputs
                    .iter()
                    .find(|(o, _)| *o == i)
                    .map(|(_, data)| (data, rows)),
                Outputs::MonteCarlo(_) => None,
            }
        });
        columns.push(rows_column(spec, cells)?);
    }
    for (i, spec) in layout.states.iter().enumerate() {
        let cells = records.iter().map(|r| r.state.get(i));
        columns.push(state_column(spec, cells)?);
    }
    columns.push(mc_outputs(records));
    // Every column but the chain is built: link each record to the last.
    let unchained = RecordBatch::try_new(Arc::clone(schema), columns.clone())?;
    let mut chain = FixedSizeBinaryBuilder::with_capacity(n, 32);
    let mut reader = Columns::of(&unchained);
    for row in 0..n {
        position.chain = reader.link(&position.chain, row);
        chain.append_value(position.chain)?;
    }
    position.next += n as u64;
    let index = schema.index_of(CHAIN)?;
    columns[index] = Arc::new(chain.finish());
    RecordBatch::try_new(Arc::clone(schema), columns)
}

fn nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn timestamps(times: impl Iterator<Item = SystemTime>) -> PrimitiveArray<TimestampNanosecondType> {
    PrimitiveArray::<TimestampNanosecondType>::from(times.map(nanos).collect::<Vec<_>>())
        .with_timezone("UTC")
}

fn durations(times: impl Iterator<Item = Duration>) -> PrimitiveArray<DurationNanosecondType> {
    PrimitiveArray::<DurationNanosecondType>::from(
        times
            .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
            .collect::<Vec<_>>(),
    )
}

fn strings<'a>(values: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
    let mut b = StringBuilder::new();
    for v in values {
        b.append_option(v);
    }
    Arc::new(b.finish())
}

fn u32s(values: impl Iterator<Item = Option<u32>>) -> ArrayRef {
    let mut b = UInt32Builder::new();
    for v in values {
        b.append_option(v);
    }
    Arc::new(b.finish())
}

fn booleans(values: impl Iterator<Item = Option<bool>>) -> ArrayRef {
    let mut b = BooleanBuilder::new();
    for v in values {
        b.append_option(v);
    }
    Arc::new(b.finish())
}

/// A primitive array of `spec`'s element type over `data` (little-endian
/// elements, copied once into an aligned buffer).
fn elements(spec: &TensorSpec, data: MutableBuffer) -> Result<ArrayRef, ArrowError> {
    let element = schema::element(spec.datatype);
    let width = spec.datatype.size();
    let len = data.len() / width.max(1);
    let data = arrow_data::ArrayData::try_new(element, len, None, 0, vec![data.into()], vec![])?;
    Ok(make_array(data))
}

/// The item field and size of a row of `spec`.
fn fixed_size_list(spec: &TensorSpec) -> Result<(arrow_schema::FieldRef, i32), ArrowError> {
    match schema::row_type(spec) {
        Arrow::FixedSizeList(item, size) => Ok((item, size)),
        other => Err(ArrowError::SchemaError(format!(
            "a row of {} is {other}, not a fixed-size list",
            spec.name
        ))),
    }
}

/// A column of requests' rows of `spec`: per record its data and rows, or
/// `None` (null).
fn rows_column<'a>(
    spec: &TensorSpec,
    cells: impl Iterator<Item = Option<(&'a Bytes, usize)>>,
) -> Result<ArrayRef, ArrowError> {
    let row_bytes = spec.row_bytes();
    let mut values = MutableBuffer::new(0);
    let mut offsets = vec![0i32];
    let mut valid = Vec::new();
    let mut rows = 0i32;
    for cell in cells {
        match cell {
            Some((data, n)) if data.len() == n * row_bytes => {
                values.extend_from_slice(data);
                rows = rows.saturating_add(i32::try_from(n).unwrap_or(i32::MAX));
                valid.push(true);
            }
            _ => valid.push(false),
        }
        offsets.push(rows);
    }
    let (item, size) = fixed_size_list(spec)?;
    let items = elements(spec, values)?;
    let rows = FixedSizeListArray::try_new(item, size, items, None)?;
    let nulls = NullBuffer::new(BooleanBuffer::from(valid));
    Ok(Arc::new(ListArray::try_new(
        Arc::new(Field::new("item", schema::row_type(spec), false)),
        OffsetBuffer::new(offsets.into()),
        Arc::new(rows),
        Some(nulls),
    )?))
}

/// A column of one row of `spec` per record, or null.
fn state_column<'a>(
    spec: &TensorSpec,
    cells: impl Iterator<Item = Option<&'a Bytes>>,
) -> Result<ArrayRef, ArrowError> {
    let row_bytes = spec.row_bytes();
    let mut values = MutableBuffer::new(0);
    let mut valid = Vec::new();
    for cell in cells {
        match cell {
            Some(data) if data.len() == row_bytes => {
                values.extend_from_slice(data);
                valid.push(true);
            }
            _ => {
                values.extend_zeros(row_bytes);
                valid.push(false);
            }
        }
    }
    let (item, size) = fixed_size_list(spec)?;
    let items = elements(spec, values)?;
    let nulls = NullBuffer::new(BooleanBuffer::from(valid));
    Ok(Arc::new(FixedSizeListArray::try_new(
        item,
        size,
        items,
        Some(nulls),
    )?))
}

/// The `mc_outputs` column: a Monte Carlo answer's outputs, null for others.
fn mc_outputs(records: &[&Record]) -> ArrayRef {
    let fields = mc_output_fields();
    let entry = StructBuilder::new(
        fields.clone(),
        vec![
            Box::new(StringBuilder::new()),
            Box::new(StringBuilder::new()),
            Box::new(
                ListBuilder::new(Int64Builder::new()).with_field(Arc::new(Field::new(
                    "item",
                    Arrow::Int64,
                    false,
                ))),
            ),
            Box::new(BinaryBuilder::new()),
        ],
    );
    let mut list =
        ListBuilder::new(entry).with_field(Arc::new(Field::new_struct("item", fields, false)));
    for r in records {
        let Outputs::MonteCarlo(outputs) = &r.outputs else {
            list.append_null();
            continue;
        };
        let entry = list.values();
        for t in outputs {
            if let Some(b) = entry.field_builder::<StringBuilder>(0) {
                b.append_value(&t.name);
            }
            if let Some(b) = entry.field_builder::<StringBuilder>(1) {
                b.append_value(t.datatype.as_str());
            }
            if let Some(b) = entry.field_builder::<ListBuilder<Int64Builder>>(2) {
                b.values().append_slice(&t.shape);
                b.append(true);
            }
            if let Some(b) = entry.field_builder::<BinaryBuilder>(3) {
                b.append_value(&t.data);
            }
            entry.append(true);
        }
        list.append(true);
    }
    Arc::new(list.finish())
}
