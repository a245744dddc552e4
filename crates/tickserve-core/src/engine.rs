//! The interface between executors and engines.
//!
//! An engine compiles a model once per signature bucket when it loads and hands
//! the result to the executor that owns it as a [`CompiledModel`]. Each bucket
//! has preallocated input and output buffers. A run is: the executor writes
//! rows into a bucket's input buffers and zero-pads the rest, calls
//! [`CompiledModel::run`] naming the member whose weights to use, and reads rows
//! out of the bucket's output buffers. Nothing is allocated or compiled per run.
//!
//! A compiled model serves one or more **members**: models of one family (equal
//! graph structure, different weight values). A model compiled with its weights
//! as constants has exactly one member, [`SOLE_MEMBER`]. A family compiled with
//! its weights as inputs takes members with [`CompiledModel::add_member`]: the
//! engine copies the member's weights once into its own memory, and a run binds
//! them without a copy.

use crate::{Buckets, DataType, Signature};

/// Identifies a member of a compiled family, unique within that family.
pub type MemberId = u32;

/// The member of a model compiled with its weights as constants.
pub const SOLE_MEMBER: MemberId = 0;

/// One weight tensor of a model, as the ONNX file stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Weight {
    /// The weight's name in the graph.
    pub name: String,
    /// Its element type.
    pub datatype: DataType,
    /// Its dimensions.
    pub dims: Vec<usize>,
    /// Its values, little-endian.
    pub data: Vec<u8>,
}

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

    /// Runs bucket `bucket` with `member`'s weights on what its input buffers hold.
    fn run(&mut self, bucket: usize, member: MemberId) -> Result<(), String>;

    /// Output `output` of bucket `bucket` after a run: `bucket size × row bytes`.
    fn output(&self, bucket: usize, output: usize) -> &[u8];

    /// Makes `weights` (every weight of the graph, by name) resident as
    /// `member`'s, ready to bind in every bucket. Compiles nothing. Fails for a
    /// model compiled with its weights as constants, or weights that do not
    /// match the graph.
    fn add_member(&mut self, member: MemberId, weights: &[Weight]) -> Result<(), String>;

    /// Frees `member`'s weights; later runs naming it fail.
    fn remove_member(&mut self, member: MemberId);

    /// The device's own time for the last run (CUDA events), where the
    /// engine measures it.
    fn device_time(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether any thread may run it (the caller's own, when its executor
    /// is idle). A GPU model runs only on its executor threads.
    fn runs_on_any_thread(&self) -> bool {
        true
    }
}
