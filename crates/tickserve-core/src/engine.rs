//! The interface between executors and engines.
//!
//! An engine compiles a model once per signature bucket when it loads and hands
//! the result to the executor that owns it as a [`CompiledModel`]. Each bucket
//! has preallocated input and output buffers. A run is: the executor (later,
//! the batcher) writes rows into a bucket's input buffers and zero-pads the
//! rest, calls [`CompiledModel::run`], and reads rows out of the bucket's
//! output buffers. Nothing is allocated or compiled per run.

use crate::{Buckets, Signature};

/// A model compiled for every bucket on one device, owned by one executor thread.
pub trait CompiledModel: Send {
    /// The model's signature (outputs resolved by the warm-up runs).
    fn signature(&self) -> &Signature;

    /// The batch sizes compiled, ascending.
    fn buckets(&self) -> &Buckets;

    /// The device label used in logs and metrics (`cpu`).
    fn device(&self) -> &str;

    /// Input `input` of bucket `bucket`: `bucket size × row bytes`, little-endian.
    fn input_mut(&mut self, bucket: usize, input: usize) -> &mut [u8];

    /// Runs bucket `bucket` on what its input buffers hold.
    fn run(&mut self, bucket: usize) -> Result<(), String>;

    /// Output `output` of bucket `bucket` after a run: `bucket size × row bytes`.
    fn output(&self, bucket: usize, output: usize) -> &[u8];
}
