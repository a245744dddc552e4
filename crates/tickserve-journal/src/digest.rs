//! The chain that makes a gap or an edit visible: each record's `chain`
//! column is the SHA-256 of the previous record's chain and of this
//! record's every other column, in one canonical byte form (below). The
//! first record of a stream chains to [`genesis`], a digest of the run and
//! the model version, so records cannot move between streams unseen.
//!
//! The canonical form of a value: a null is the byte 0; any other value is
//! the byte 1 and then: a fixed-width value's little-endian bytes; a string
//! or binary value's length (u64, little-endian) and bytes; a boolean as one
//! byte; a list's length and then each item; a fixed-size list's items; a
//! struct's fields in order.

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType as Arrow;
use sha2::{Digest, Sha256};

use crate::schema::CHAIN;

/// A chain digest.
pub type ChainDigest = [u8; 32];

/// Where the chain of `model` version `version` (file digest `digest`)
/// written by `run` begins.
pub fn genesis(run: &str, model: &str, version: &str, digest: &str) -> ChainDigest {
    let mut h = Sha256::new();
    for part in ["tickserve journal", run, model, version, digest] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// The chain digest of row `row` of `batch` after `previous`: every column
/// but [`CHAIN`] in canonical form. `scratch` is reused between calls.
pub fn link(
    previous: &ChainDigest,
    batch: &RecordBatch,
    row: usize,
    scratch: &mut Vec<u8>,
) -> ChainDigest {
    scratch.clear();
    scratch.extend_from_slice(previous);
    for (field, column) in batch.schema_ref().fields().iter().zip(batch.columns()) {
        if field.name() == CHAIN {
            continue;
        }
        value(column.as_ref(), row, scratch);
    }
    Sha256::digest(scratch.as_slice()).into()
}

/// Appends the canonical form of `array[row]` to `out`.
fn value(array: &dyn Array, row: usize, out: &mut Vec<u8>) {
    if array.is_null(row) {
        out.push(0);
        return;
    }
    out.push(1);
    match array.data_type() {
        Arrow::Boolean => out.push(u8::from(array.as_boolean().value(row))),
        Arrow::Utf8 => bytes(array.as_string::<i32>().value(row).as_bytes(), out),
        Arrow::Binary => bytes(array.as_binary::<i32>().value(row), out),
        Arrow::FixedSizeBinary(_) => out.extend_from_slice(array.as_fixed_size_binary().value(row)),
        Arrow::List(_) => {
            let items = array.as_list::<i32>().value(row);
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            values(items.as_ref(), out);
        }
        Arrow::FixedSizeList(_, _) => {
            let items = array.as_fixed_size_list().value(row);
            values(items.as_ref(), out);
        }
        Arrow::Struct(_) => {
            for column in array.as_struct().columns() {
                value(column.as_ref(), row, out);
            }
        }
        other => match other.primitive_width() {
            Some(width) => {
                let data = array.to_data();
                let from = (data.offset() + row) * width;
                out.extend_from_slice(&data.buffers()[0].as_slice()[from..from + width]);
            }
            None => bytes(format!("{other}").as_bytes(), out),
        },
    }
}

/// Appends every item of `array`: a primitive array without nulls as one
/// slice of its values (the same bytes as item by item, less the validity
/// byte before each, which is always 1 there).
fn values(array: &dyn Array, out: &mut Vec<u8>) {
    if let Some(width) = array.data_type().primitive_width()
        && array.null_count() == 0
    {
        let data = array.to_data();
        let from = data.offset() * width;
        let len = data.len() * width;
        out.push(2);
        out.extend_from_slice(&data.buffers()[0].as_slice()[from..from + len]);
        return;
    }
    for row in 0..array.len() {
        value(array, row, out);
    }
}

fn bytes(value: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    out.extend_from_slice(value);
}
