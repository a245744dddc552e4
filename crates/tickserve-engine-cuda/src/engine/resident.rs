//! A family run resident ([`ResidentModel`]): its graphs compiled as for
//! any family, and beside them its resident kernel ([`ResidentKernel`]),
//! one slot per row of its largest bucket. A run writes each row's inputs,
//! member and state into its slot's mailbox and waits for the answers: no
//! launch, no copy call, no stream synchronisation.
//!
//! The server keeps each sequence's state, as on the CPU, and hands it in
//! with every tick; the slot keeps the state its last tick left, so a tick
//! whose state is that one (the next tick of the sequence the slot last
//! ran) brings none over the bus, and any other (another sequence, a
//! restart, a state put through the API) is written with the tick. So
//! snapshots, the journal, windows, guards and hand-over read the state
//! where they always do, and nothing is read back from the device for them.
//!
//! A tick unanswered within the bound fails the family over to its graphs
//! for good, with one error logged: the same run goes on there, on the
//! same inputs and the state the server holds.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use tickserve_core::{Buckets, CompiledModel, EngineError, MemberId, Signature, Weight};

use super::CudaModel;
use crate::import::arrange;
use crate::kernels::Resident;
use crate::resident::ResidentKernel;

/// Rows of a resident kernel's weight table: the most members of a family
/// running resident on its kernel at once (the others run on its graphs).
pub const RESIDENT_MEMBERS: usize = 4096;

/// A family on one GPU run by its resident kernel, its graphs kept to fail
/// over to.
pub struct ResidentModel {
    /// `None` once failed over. Stopped before anything of the graphs is
    /// freed ([`Drop`]).
    kernel: Option<ResidentKernel>,
    /// The kernel did not return when told: nothing it may still read is
    /// freed, so the family's device memory is leaked.
    wedged: bool,
    /// The graphs: their pinned input buffers are where the executor writes
    /// a run's inputs, and they run the family once the kernel is lost.
    /// Dropped by [`Drop`], after the kernel has returned, or never.
    graphs: ManuallyDrop<CudaModel>,
    /// Each member's row of the kernel's weight table.
    rows: HashMap<MemberId, usize>,
    /// Rows of members removed, to reuse.
    free: Vec<usize>,
    /// Rows written so far.
    written: usize,
    /// Per bucket, per output: the last resident run's rows.
    outputs: Vec<Vec<Vec<u8>>>,
    /// Whether the last run was the graphs'.
    on_graphs: bool,
    /// The last run's slot of each of its rows.
    slots: Vec<usize>,
    family: String,
}

impl std::fmt::Debug for ResidentModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResidentModel")
            .field("graphs", &self.graphs)
            .field("resident", &self.kernel.is_some())
            .finish_non_exhaustive()
    }
}

impl ResidentModel {
    /// Starts `layout`'s kernel beside `graphs` (compiled, `first`'s weights
    /// added), one slot per row of the largest bucket, with a weight table
    /// of `members` rows, `first` in row 0; `bound` is the longest a tick
    /// may take before the family fails over. Where it cannot start: why,
    /// and the graphs back.
    pub(super) fn start(
        family: &str,
        graphs: CudaModel,
        layout: Resident,
        first: (MemberId, &[Weight]),
        (members, bound): (usize, Duration),
    ) -> Result<ResidentModel, (EngineError, Box<CudaModel>)> {
        // A slot per row of the largest bucket whose rows the device holds
        // at once (resident blocks never wait for a multiprocessor); the
        // larger buckets run on the graphs.
        let started = arrange(&graphs.plan, first.1)
            .map_err(EngineError::InvalidModel)
            .and_then(|weights| {
                let ctx: Arc<CudaContext> = Arc::clone(&graphs.ctx);
                let mut last = None;
                for &slots in graphs.buckets.sizes().iter().rev() {
                    match ResidentKernel::start(
                        &ctx,
                        graphs.ordinal(),
                        layout.clone(),
                        &weights,
                        members,
                        slots,
                        bound,
                    ) {
                        Err(e @ EngineError::Unsupported(_)) => last = Some(e),
                        other => return other,
                    }
                }
                Err(last
                    .unwrap_or_else(|| EngineError::Internal("a family of no buckets".to_string())))
            });
        let kernel = match started {
            Ok(kernel) => kernel,
            Err(e) => return Err((e, Box::new(graphs))),
        };
        let slots = kernel.slots();
        let outputs = graphs
            .buckets
            .sizes()
            .iter()
            .map(|&rows| {
                (kernel.layout().outputs.iter())
                    .map(|&(_, floats)| vec![0u8; rows * floats * 4])
                    .collect()
            })
            .collect();
        Ok(ResidentModel {
            kernel: Some(kernel),
            wedged: false,
            graphs: ManuallyDrop::new(graphs),
            rows: HashMap::from([(first.0, 0)]),
            free: Vec::new(),
            written: 1,
            outputs,
            on_graphs: false,
            slots: Vec::with_capacity(slots),
            family: family.to_string(),
        })
    }

    /// Whether its ticks still run on the resident kernel.
    pub fn is_resident(&self) -> bool {
        self.kernel.is_some()
    }

    /// Its resident kernel, until it fails over.
    pub fn kernel(&self) -> Option<&ResidentKernel> {
        self.kernel.as_ref()
    }

    /// How many ticks brought their state to a slot that held another.
    pub fn states_given(&self) -> u64 {
        self.kernel
            .as_ref()
            .map_or(0, |k| k.mailboxes().states_given())
    }

    /// Bucket `bucket`'s first `rows` rows on the kernel (the rest is
    /// padding): row `r` with `members[r]` (rows past `members`:
    /// `members[0]`), each in the slot holding its state where one does
    /// ([`Mailboxes::place`]), every slot asked before any answer is
    /// awaited. A slot asked is always awaited, even where a later ask
    /// fails.
    ///
    /// [`Mailboxes::place`]: crate::mailbox::Mailboxes::place
    fn tick(
        &mut self,
        bucket: usize,
        rows: usize,
        members: &[MemberId],
    ) -> Result<(), EngineError> {
        let kernel = self
            .kernel
            .as_mut()
            .ok_or_else(|| EngineError::DeviceLost("no resident kernel".to_string()))?;
        let size = self.graphs.buckets_graphs[bucket].rows;
        let rows = rows.clamp(1, size);
        let graphs = &self.graphs;
        // Row `row` of input `i`: the bucket's bytes over its rows.
        let row_of = |row: usize, i: usize| {
            let all = graphs.input(bucket, i);
            let bytes = all.len() / size;
            &all[row * bytes..(row + 1) * bytes]
        };
        kernel.place(rows, row_of, &mut self.slots)?;
        let mut asked = 0;
        let mut failed = None;
        for (row, &slot) in self.slots.iter().enumerate() {
            let ask = members
                .get(row)
                .or(members.first())
                .ok_or_else(|| EngineError::Internal("a resident run of no rows".to_string()))
                .and_then(|member| {
                    self.rows.get(member).copied().ok_or_else(|| {
                        EngineError::Internal(format!("member {member} has no resident weights"))
                    })
                })
                .and_then(|table_row| kernel.ask(slot, table_row, |i| row_of(row, i)));
            if let Err(e) = ask {
                failed = Some(e);
                break;
            }
            asked += 1;
        }
        let outputs = &mut self.outputs[bucket];
        for (row, &slot) in self.slots.iter().enumerate().take(asked) {
            kernel.wait(slot, |o, bytes| {
                let n = bytes.len();
                outputs[o][row * n..(row + 1) * n].copy_from_slice(bytes);
            })?;
        }
        failed.map_or(Ok(()), Err)
    }

    /// Ends the kernel and runs the family on its graphs from now on.
    fn fail_over(&mut self, why: &EngineError) {
        tracing::error!(
            family = %self.family,
            device = %self.graphs.device,
            "the resident kernel failed ({why}); the family runs on its CUDA graphs from now on"
        );
        self.stop();
    }

    /// Tells the kernel to return and waits for it (within its bound);
    /// where it did not return, the family is wedged.
    fn stop(&mut self) {
        if let Some(mut kernel) = self.kernel.take()
            && let Err(e) = kernel.stop()
        {
            tracing::error!(family = %self.family, "{e}");
            self.wedged = true;
        }
    }

    /// Graph weights taken out of the graphs (the kernel never reads them):
    /// freed, in stream order while a resident kernel runs on the device
    /// ([`crate::residency`]); kept for good where the kernel was wedged.
    fn retire(&mut self, weights: Option<super::MemberWeights>) {
        if self.wedged {
            std::mem::forget(weights);
        }
    }
}

impl Drop for ResidentModel {
    fn drop(&mut self) {
        self.stop();
        if self.wedged {
            tracing::error!(
                family = %self.family,
                "the resident kernel did not return: the family's device memory is kept"
            );
            return;
        }
        // SAFETY: dropped once, here, and `self.graphs` is not used after.
        unsafe { ManuallyDrop::drop(&mut self.graphs) };
    }
}

impl CompiledModel for ResidentModel {
    fn signature(&self) -> &Signature {
        self.graphs.signature()
    }

    fn buckets(&self) -> &Buckets {
        self.graphs.buckets()
    }

    fn device(&self) -> &str {
        self.graphs.device()
    }

    fn input_mut(&mut self, bucket: usize, input: usize) -> &mut [u8] {
        self.graphs.input_mut(bucket, input)
    }

    fn run(&mut self, bucket: usize, member: MemberId) -> Result<(), EngineError> {
        self.run_members(bucket, &[member])
    }

    fn run_members(&mut self, bucket: usize, members: &[MemberId]) -> Result<(), EngineError> {
        let rows = self.graphs.buckets_graphs[bucket].rows;
        self.run_rows(bucket, rows, members)
    }

    /// Only the batch's rows tick: a padding row would take a slot, and
    /// with it the state some sequence left there.
    fn run_rows(
        &mut self,
        bucket: usize,
        rows: usize,
        members: &[MemberId],
    ) -> Result<(), EngineError> {
        // A member the kernel's table lacks (full, or its upload failed)
        // runs on the graphs, which hold every member; so does a bucket of
        // more rows than the kernel has slots.
        let in_table = members.iter().all(|m| self.rows.contains_key(m));
        let fits = (self.kernel.as_ref()).is_some_and(|k| {
            (self.graphs.buckets_graphs.get(bucket)).is_some_and(|b| b.rows <= k.slots())
        });
        if fits && in_table {
            match self.tick(bucket, rows, members) {
                Ok(()) => {
                    self.on_graphs = false;
                    return Ok(());
                }
                Err(lost @ EngineError::DeviceLost(_)) => self.fail_over(&lost),
                Err(other) => return Err(other),
            }
        }
        self.on_graphs = true;
        self.graphs.run_members(bucket, members)
    }

    fn mixes_members(&self) -> bool {
        true
    }

    fn output(&self, bucket: usize, output: usize) -> &[u8] {
        if self.on_graphs {
            self.graphs.output(bucket, output)
        } else {
            &self.outputs[bucket][output]
        }
    }

    fn add_member(&mut self, member: MemberId, weights: &[Weight]) -> Result<(), EngineError> {
        // A member replaced: its old graph weights are taken out first, put
        // back if the new ones fail, retired otherwise.
        let old = self.graphs.take_member(member);
        if let Err(e) = self.graphs.add_member(member, weights) {
            if let Some(old) = old {
                self.graphs.members.insert(member, old);
            }
            return Err(e);
        }
        self.retire(old);
        let Some(kernel) = self.kernel.as_mut() else {
            return Ok(());
        };
        // A member replaced keeps its row; a new one takes a free row.
        let (row, new) = match self.rows.get(&member) {
            Some(&row) => (row, false),
            None => (self.free.last().copied().unwrap_or(self.written), true),
        };
        let put = arrange(&self.graphs.plan, weights)
            .map_err(EngineError::InvalidModel)
            .and_then(|arranged| kernel.put(row, &arranged));
        match put {
            Ok(()) => {
                if new && self.free.last() == Some(&row) {
                    self.free.pop();
                }
                self.written = self.written.max(row + 1);
                self.rows.insert(member, row);
            }
            Err(e) => {
                // Never its old weights on the kernel: it runs on the graphs.
                tracing::warn!(
                    family = %self.family,
                    member,
                    "member runs on the CUDA graphs, not resident: {e}"
                );
                if self.rows.remove(&member).is_some() {
                    self.free.push(row);
                }
            }
        }
        Ok(())
    }

    fn remove_member(&mut self, member: MemberId) {
        let weights = self.graphs.take_member(member);
        self.retire(weights);
        if let Some(row) = self.rows.remove(&member) {
            self.free.push(row);
        }
    }

    fn device_time(&self) -> Option<Duration> {
        if self.on_graphs {
            self.graphs.device_time()
        } else {
            None
        }
    }

    /// A run makes no CUDA call (mailboxes in host memory; the failover's
    /// graph launch makes the context current on its thread first), so a
    /// request may run it on its own thread when the executor is idle: no
    /// hand-over to the executor's thread on the tick's path.
    fn runs_on_any_thread(&self) -> bool {
        true
    }
}
