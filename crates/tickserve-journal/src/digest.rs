//! The chain that makes a gap or an edit visible: each record's `chain`
//! column is the SHA-256 of the previous record's chain and of this
//! record's every other column, in one canonical byte form (below). The
//! first record of a stream chains to [`genesis`], a digest of the run and
//! the model version, so records cannot move between streams unseen.
//!
//! The canonical form of a value: a null is the byte 0; any other value is
//! the byte 1 and then: a fixed-width value's little-endian bytes; a string
//! or binary value's length (u64, little-endian) and bytes; a boolean as one
//! byte; a list's length and then its items; a fixed-size list's items; a
//! struct's fields in order. Items of a primitive type without nulls are
//! the byte 2 and their bytes, in one piece.
//!
//! The writer and `verify` compute it the same way, from the record batch:
//! each column is resolved once per batch ([`Columns`]), then read row by
//! row without allocating.

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_buffer::NullBuffer;
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

/// A batch's columns but [`CHAIN`], resolved for reading row by row.
pub struct Columns<'a> {
    columns: Vec<Column<'a>>,
    scratch: Vec<u8>,
}

impl<'a> Columns<'a> {
    /// `batch`'s columns.
    pub fn of(batch: &'a RecordBatch) -> Columns<'a> {
        let columns = batch
            .schema_ref()
            .fields()
            .iter()
            .zip(batch.columns())
            .filter(|(field, _)| field.name() != CHAIN)
            .map(|(_, column)| Column::of(column.as_ref()))
            .collect();
        Columns {
            columns,
            scratch: Vec::with_capacity(1024),
        }
    }

    /// The chain digest of row `row` after `previous`.
    pub fn link(&mut self, previous: &ChainDigest, row: usize) -> ChainDigest {
        self.scratch.clear();
        self.scratch.extend_from_slice(previous);
        for column in &self.columns {
            column.value(row, &mut self.scratch);
        }
        Sha256::digest(self.scratch.as_slice()).into()
    }
}

/// One column, resolved: typed slices and child columns.
enum Column<'a> {
    /// Fixed-width values: `width` bytes each, from `values`.
    Fixed {
        values: &'a [u8],
        width: usize,
        nulls: Option<&'a NullBuffer>,
    },
    Boolean(&'a arrow_array::BooleanArray),
    /// Strings and binaries: `offsets` into `values`.
    Bytes {
        offsets: &'a [i32],
        values: &'a [u8],
        nulls: Option<&'a NullBuffer>,
    },
    List {
        offsets: &'a [i32],
        items: Box<Column<'a>>,
        nulls: Option<&'a NullBuffer>,
    },
    FixedList {
        size: usize,
        items: Box<Column<'a>>,
        nulls: Option<&'a NullBuffer>,
    },
    Struct {
        fields: Vec<Column<'a>>,
        nulls: Option<&'a NullBuffer>,
    },
    /// A type the journal does not write: its name, so that it still counts.
    Other(String),
}

impl<'a> Column<'a> {
    fn of(array: &'a dyn Array) -> Column<'a> {
        let nulls = array.nulls();
        match array.data_type() {
            Arrow::Boolean => Column::Boolean(array.as_boolean()),
            Arrow::Utf8 => Column::bytes(array.as_string::<i32>(), nulls),
            Arrow::Binary => Column::bytes(array.as_binary::<i32>(), nulls),
            Arrow::FixedSizeBinary(width) => {
                let a = array.as_fixed_size_binary();
                let width = usize::try_from(*width).unwrap_or(0);
                let values = a.value_data();
                Column::Fixed {
                    values: values.get(..a.len() * width).unwrap_or(values),
                    width,
                    nulls,
                }
            }
            Arrow::List(_) => {
                let a = array.as_list::<i32>();
                Column::List {
                    offsets: a.value_offsets(),
                    items: Box::new(Column::of(a.values().as_ref())),
                    nulls,
                }
            }
            Arrow::FixedSizeList(_, size) => {
                let a = array.as_fixed_size_list();
                Column::FixedList {
                    size: usize::try_from(*size).unwrap_or(0),
                    items: Box::new(Column::of(a.values().as_ref())),
                    nulls,
                }
            }
            Arrow::Struct(_) => Column::Struct {
                fields: array
                    .as_struct()
                    .columns()
                    .iter()
                    .map(|c| Column::of(c.as_ref()))
                    .collect(),
                nulls,
            },
            other => match primitive_values(array) {
                Some(values) => Column::Fixed {
                    values,
                    width: other.primitive_width().unwrap_or(1),
                    nulls,
                },
                None => Column::Other(other.to_string()),
            },
        }
    }

    /// A string or binary column.
    fn bytes<T: arrow_array::types::ByteArrayType<Offset = i32>>(
        a: &'a arrow_array::GenericByteArray<T>,
        nulls: Option<&'a NullBuffer>,
    ) -> Column<'a> {
        Column::Bytes {
            offsets: a.value_offsets(),
            values: a.values().as_slice(),
            nulls,
        }
    }

    fn is_null(nulls: Option<&NullBuffer>, row: usize) -> bool {
        nulls.is_some_and(|n| n.is_null(row))
    }

    /// Appends the canonical form of row `row` to `out`.
    fn value(&self, row: usize, out: &mut Vec<u8>) {
        let nulls = match self {
            Column::Fixed { nulls, .. }
            | Column::Bytes { nulls, .. }
            | Column::List { nulls, .. }
            | Column::FixedList { nulls, .. }
            | Column::Struct { nulls, .. } => *nulls,
            Column::Boolean(a) => a.nulls(),
            Column::Other(_) => None,
        };
        if Self::is_null(nulls, row) {
            out.push(0);
            return;
        }
        out.push(1);
        match self {
            Column::Fixed { values, width, .. } => {
                out.extend_from_slice(slice(values, row * width, *width));
            }
            Column::Boolean(a) => out.push(u8::from(a.value(row))),
            Column::Bytes {
                offsets, values, ..
            } => {
                let (from, to) = span(offsets, row);
                let bytes = slice(values, from, to.saturating_sub(from));
                out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                out.extend_from_slice(bytes);
            }
            Column::List { offsets, items, .. } => {
                let (from, to) = span(offsets, row);
                out.extend_from_slice(&((to.saturating_sub(from)) as u64).to_le_bytes());
                items.values(from, to, out);
            }
            Column::FixedList { size, items, .. } => {
                items.values(row * size, (row + 1) * size, out);
            }
            Column::Struct { fields, .. } => {
                for field in fields {
                    field.value(row, out);
                }
            }
            Column::Other(name) => out.extend_from_slice(name.as_bytes()),
        }
    }

    /// Appends items `from..to`: fixed-width items without nulls in one
    /// piece, others one by one.
    fn values(&self, from: usize, to: usize, out: &mut Vec<u8>) {
        if let Column::Fixed {
            values,
            width,
            nulls: None,
        } = self
        {
            out.push(2);
            out.extend_from_slice(slice(values, from * width, (to - from) * width));
            return;
        }
        for row in from..to {
            self.value(row, out);
        }
    }
}

/// The value bytes of a primitive array of a type the journal writes.
fn primitive_values(array: &dyn Array) -> Option<&[u8]> {
    use arrow_array::types::*;
    use arrow_schema::TimeUnit;
    macro_rules! bytes {
        ($t:ty) => {
            array
                .as_primitive_opt::<$t>()
                .map(|a| a.values().inner().as_slice())
        };
    }
    match array.data_type() {
        Arrow::UInt8 => bytes!(UInt8Type),
        Arrow::UInt16 => bytes!(UInt16Type),
        Arrow::UInt32 => bytes!(UInt32Type),
        Arrow::UInt64 => bytes!(UInt64Type),
        Arrow::Int8 => bytes!(Int8Type),
        Arrow::Int16 => bytes!(Int16Type),
        Arrow::Int32 => bytes!(Int32Type),
        Arrow::Int64 => bytes!(Int64Type),
        Arrow::Float32 => bytes!(Float32Type),
        Arrow::Float64 => bytes!(Float64Type),
        Arrow::Timestamp(TimeUnit::Nanosecond, _) => bytes!(TimestampNanosecondType),
        Arrow::Duration(TimeUnit::Nanosecond) => bytes!(DurationNanosecondType),
        _ => None,
    }
}

/// `values[from..from + len]`, or what of it there is (a malformed file
/// reads short rather than panicking; its chain then fails).
fn slice(values: &[u8], from: usize, len: usize) -> &[u8] {
    let end = from.saturating_add(len).min(values.len());
    values.get(from.min(end)..end).unwrap_or_default()
}

/// Row `row`'s offsets.
fn span(offsets: &[i32], row: usize) -> (usize, usize) {
    let at = |i: usize| {
        offsets
            .get(i)
            .and_then(|&o| usize::try_from(o).ok())
            .unwrap_or(0)
    };
    (at(row), at(row + 1))
}
