//! CUDA C for a family's resident kernel: launched once, one block per
//! slot, each waiting on its slot's mailbox in host memory mapped into the
//! device, running the whole plan for the tick it finds there, with the
//! member the tick names, writing the answer back and saying so. No launch,
//! no copy call and no stream synchronisation per tick; each slot keeps the
//! state its last tick left (the plan's state inputs and outputs, paired by
//! the model's `[[sequence.state]]`) in device memory, and a tick may bring
//! another.
//!
//! A slot's mailbox is [`Resident::mailbox_words`] `int` words (whole
//! 128-byte lines; slot `s`'s start `s` mailboxes in): word
//! [`ASKED_WORD`] the tick the host asks for (a counter it raises by one
//! per tick, from 1, back to 1 after `i32::MAX`, so it alternates and never
//! repeats the last; a negative value tells the slot's block to return),
//! [`MEMBER_WORD`] the tick's member (its row of the weight table),
//! [`GIVEN_WORD`] whether the tick brings its state (1) or runs on the kept
//! one (0); word [`ANSWERED_WORD`] the tick the block has answered (each
//! flag line on its own line); from [`DATA_WORD`] the tick's floats: the
//! non-state inputs, each state pair's region (the state given, then the
//! state after the tick), the non-state outputs ([`Resident`] gives the
//! offsets). The host writes the inputs, the member and the flag, then the
//! tick with release order; the block reads the tick with acquire order,
//! runs, writes the outputs and the state (to the mailbox and to its state
//! buffer), fences, and writes the answered tick with release order, which
//! the host reads with acquire order before the outputs. So between ticks a
//! slot's state buffer and its mailbox's state regions hold the same
//! floats: the host gives the state only when the one it holds differs.
//! The table is member-major: member `m`'s row at `table[m · (w + 1) ..]`,
//! its `w` weight pointers (the plan's weight slots) then the row's version
//! (raised by every write of the row, so weights held on chip are named by
//! it, never by an address a freed member's weights may hand on); each
//! block keeps its copy of its slot's state at `state[b · state_floats ..]`.
//!
//! Each block has [`RESIDENT_BLOCK`] threads: every step loops its elements
//! over them, with a block barrier between steps. A product whose columns'
//! weights lie side by side (an LSTM's, a transposed `MatMul`'s) takes a
//! warp a column (an LSTM: a warp a hidden unit, its four gates at once,
//! then the unit's cell), the lanes over the weights, so each load is one
//! coalesced line and each weight is read once; the others a thread a
//! column. The activations live in shared memory. The tick's table row is read afresh and the weights
//! through L2, so a member written to the table while the kernel runs is
//! read from the first tick naming it. The set it runs: products with
//! their elementwise chains (one over several groups: each block all of
//! it), LSTM and GRU layers (either reset) over one step, softmax and
//! layer normalization, and the copies,
//! rearrangements (slices, transposes, gathers), joins and elementwise
//! operations of two activations exporters write around them; a
//! convolution or a window is refused, named.

use std::fmt::Write;

use super::{c_float, epilogue, rearrange_index};
use crate::plan::{Cell, Elementwise, Op, Plan, ValueId};

/// Threads of the resident kernel's one block.
pub const RESIDENT_BLOCK: u32 = 256;

/// The mailbox's word of the tick the host asks for.
pub const ASKED_WORD: usize = 0;
/// The mailbox's word of the asked tick's member: its row of the weight
/// table.
pub const MEMBER_WORD: usize = 1;
/// The mailbox's word saying whether the asked tick brings its state (1:
/// in the state's region of the mailbox) or runs on the state the slot
/// kept (0).
pub const GIVEN_WORD: usize = 2;
/// The mailbox's word of the tick the kernel answered.
pub const ANSWERED_WORD: usize = 32;
/// The mailbox's word where the tick's floats start.
pub const DATA_WORD: usize = 64;

/// The most 4-byte words the block keeps in shared memory (activations,
/// the weight table): 48 KiB, what a block may declare statically.
const MAX_SHARED_FLOATS: usize = 12 * 1024;

/// A plan's resident kernel and where its tick's values go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resident {
    /// The module's CUDA C; its entry is `resident(int* box, const u64*
    /// table, float* state)`.
    pub source: String,
    /// Per plan input (in the plan's order): its float offset after
    /// [`DATA_WORD`] in the mailbox (a state input's: its pair's region)
    /// and its floats.
    pub inputs: Vec<(usize, usize)>,
    /// Per plan output: its float offset after [`DATA_WORD`] (a state
    /// output's: its pair's region) and its floats.
    pub outputs: Vec<(usize, usize)>,
    /// The state pairs, in the order given.
    pub state: Vec<Kept>,
    /// Floats of the mailbox after [`DATA_WORD`].
    pub mailbox_floats: usize,
    /// Words of one slot's mailbox: [`DATA_WORD`] and the floats, rounded
    /// up to whole 128-byte lines.
    pub mailbox_words: usize,
    /// Floats of one slot's state buffer.
    pub state_floats: usize,
    /// Pointers in one row of the weight table (the plan's weight slots);
    /// the row's version follows them.
    pub weight_slots: usize,
    /// Blocks a slot runs on: a thread-block cluster of this many, each
    /// computing its share of every step's columns (or hidden units) and
    /// storing them into every block's activations (distributed shared
    /// memory). 1: a block a slot.
    pub split: usize,
    /// Bytes of dynamic shared memory each block holds its share of the
    /// member's weights in (those that fit, step by step; the others are
    /// read through L2), loaded when a tick names other weights than the
    /// block holds. 0: every weight through L2.
    pub on_chip_bytes: usize,
}

/// The most blocks of a slot's cluster (the portable cluster size).
pub const MAX_SPLIT: usize = 8;

/// One state pair of a resident kernel: a plan input and output the block
/// keeps in its slot's state buffer, and their region of the mailbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    /// The plan input it is read from.
    pub input: usize,
    /// The plan output it is written to.
    pub output: usize,
    /// Its float offset after [`DATA_WORD`] in the mailbox: the state given
    /// with a tick, and the state after it.
    pub mailbox: usize,
    /// Its float offset in the slot's state buffer.
    pub offset: usize,
    /// Its floats.
    pub width: usize,
}

const PRELUDE: &str = r#"// Generated by tickserve's CUDA engine: one family's resident kernel.
typedef unsigned long long u64;
#ifndef TICKSERVE_EMULATED
#define SHARED(type, name, n) __shared__ type name[n]
#define DYNAMIC_SHARED(type, name, n) extern __shared__ type name[]
#define SYNC() __syncthreads()
#define FENCE() __threadfence_system()
#define LANES 32
#define SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void store_release(int* p, int v) {
    asm volatile("st.release.sys.global.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
#if CLUSTER > 1
// Every thread of every block of the slot's cluster: what each stored
// before, into any block's shared memory, is seen by all after.
#define CLUSTER_SYNC() asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory")
// `v` into the element at `local` of block `rank`'s shared memory.
__device__ __forceinline__ void CLUSTER_STORE(float* local, int rank, float v) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote) : "r"((unsigned)__cvta_generic_to_shared(local)), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
}
#else
#define CLUSTER_SYNC() SYNC()
#define CLUSTER_STORE(local, rank, v)
#endif
#endif
// Activation `i` is `v`, in this block and in every other block of the
// slot's cluster.
__device__ __forceinline__ void put(float* val, int i, float v, int part) {
    val[i] = v;
    for (int p = 0; p < CLUSTER; ++p)
        if (p != part) CLUSTER_STORE(val + i, p, v);
}
// A weight, read through L2 (`ld.global.cg`), which copies to the device
// keep coherent, never from a stale L1 line of a member swapped out.
struct Cg {
    const float* p;
    __device__ __forceinline__ float operator[](long long i) const { return __ldcg(p + i); }
};
// The member's weights: the table (one pointer per slot), read afresh at
// every tick into `slots`.
#define W(slot) (Cg{(const float*)slots[(slot)]})
"#;

/// `plan`'s resident kernel, its state the plan's inputs and outputs
/// paired by name in `state` (`(input, output)`, as `[[sequence.state]]`
/// pairs them); or why the plan cannot run resident.
pub fn resident(plan: &Plan, state: &[(&str, &str)]) -> Result<Resident, String> {
    resident_split(plan, state, 1, 0)
}

/// [`resident`] with each slot on a cluster of `split` blocks (1 to
/// [`MAX_SPLIT`]), each computing `1 / split` of every step, and holding
/// its share of the weights in shared memory where a block may have
/// `on_chip` bytes of it in all (0: every weight through L2).
pub fn resident_split(
    plan: &Plan,
    state: &[(&str, &str)],
    split: usize,
    on_chip: usize,
) -> Result<Resident, String> {
    if !(1..=MAX_SPLIT).contains(&split) {
        return Err(format!(
            "a slot on {split} blocks; a cluster holds 1 to {MAX_SPLIT}"
        ));
    }
    let width = |v: ValueId| plan.values.get(v).map_or(0, |v| v.width);
    let mut offsets = Vec::with_capacity(plan.values.len());
    let mut total = 0usize;
    for value in &plan.values {
        offsets.push(total);
        // Widths come from the model file: added without overflow, then
        // held to the shared-memory limit below.
        total = total.saturating_add(value.width);
    }
    // A GRU that resets before its recurrent product needs every unit's
    // reset first: per such step, scratch for `r ⊙ h`, `z` and the input's
    // candidate product, after the values.
    let mut scratch = Vec::with_capacity(plan.steps.len());
    for step in &plan.steps {
        scratch.push(match &step.op {
            Op::Recurrent(layer)
                if layer.cell
                    == (Cell::Gru {
                        linear_before_reset: false,
                    }) =>
            {
                let at = total;
                total = total.saturating_add(layer.hidden.saturating_mul(3));
                Some(at)
            }
            _ => None,
        });
    }
    // The activations, the weight table (two words a slot) and the asked
    // tick, member and state flag. The mailbox holds activations only, so
    // this bounds it too.
    let shared = total
        .saturating_add(plan.weights.len().saturating_add(1).saturating_mul(2))
        .saturating_add(3);
    if shared > MAX_SHARED_FLOATS {
        return Err(format!(
            "its activations take {shared} words of shared memory; a resident block holds at \
             most {MAX_SHARED_FLOATS}"
        ));
    }
    let mut kept: Vec<Kept> = Vec::with_capacity(state.len());
    let mut state_floats = 0usize;
    for (input, output) in state {
        let i = plan.inputs.iter().position(|(n, _)| n == input);
        let o = plan.outputs.iter().position(|(n, _)| n == output);
        let (Some(i), Some(o)) = (i, o) else {
            return Err(format!(
                "the state pair {input} -> {output} names no input or output of the graph"
            ));
        };
        let w = width(plan.inputs[i].1);
        if width(plan.outputs[o].1) != w {
            return Err(format!(
                "the state pair {input} -> {output}: {w} floats in, {} out",
                width(plan.outputs[o].1)
            ));
        }
        if kept.iter().any(|k| k.input == i || k.output == o) {
            return Err(format!(
                "the state pair {input} -> {output} shares its input or output with another pair"
            ));
        }
        kept.push(Kept {
            input: i,
            output: o,
            mailbox: 0,
            offset: state_floats,
            width: w,
        });
        state_floats = state_floats.saturating_add(w);
    }
    // The mailbox: the non-state inputs, the state (given, then kept), the
    // non-state outputs.
    let mut mailbox = 0usize;
    let mut place = |w: usize| {
        let at = mailbox;
        mailbox = mailbox.saturating_add(w);
        at
    };
    let mut inputs: Vec<(usize, usize)> = plan.inputs.iter().map(|(_, v)| (0, width(*v))).collect();
    for (i, input) in inputs.iter_mut().enumerate() {
        if !kept.iter().any(|k| k.input == i) {
            input.0 = place(input.1);
        }
    }
    for k in &mut kept {
        k.mailbox = place(k.width);
        inputs[k.input].0 = k.mailbox;
    }
    let mut outputs: Vec<(usize, usize)> =
        plan.outputs.iter().map(|(_, v)| (0, width(*v))).collect();
    for (o, output) in outputs.iter_mut().enumerate() {
        output.0 = match kept.iter().find(|k| k.output == o) {
            Some(k) => k.mailbox,
            None => place(output.1),
        };
    }
    let mailbox_words = (DATA_WORD + mailbox).div_ceil(32) * 32;
    let mut body = String::new();
    // The tick's member's weights (its row of the table), the inputs from
    // the mailbox, the state from the mailbox where the host gave it, else
    // from the slot's state buffer.
    // The row's pointers, then its version.
    let _ = writeln!(
        body,
        "        const u64* row = table + (long long)asked[1] * {};",
        plan.weights.len() + 1
    );
    let _ = writeln!(
        body,
        "        for (int s = r; s <= {}; s += threads) slots[s] = ((volatile const u64*)row)[s];",
        plan.weights.len()
    );
    for (i, (_, v)) in plan.inputs.iter().enumerate() {
        if !kept.iter().any(|k| k.input == i) {
            let (to, from) = (
                format!("val[{}", offsets[*v]),
                format!("mail[{}", inputs[i].0),
            );
            copy(&mut body, width(*v), &to, &from);
        }
    }
    body.push_str("        if (asked[2]) {\n");
    for k in &kept {
        let to = format!("val[{}", offsets[plan.inputs[k.input].1]);
        copy(&mut body, k.width, &to, &format!("mail[{}", k.mailbox));
    }
    body.push_str("        } else {\n");
    for k in &kept {
        let to = format!("val[{}", offsets[plan.inputs[k.input].1]);
        copy(&mut body, k.width, &to, &format!("state[{}", k.offset));
    }
    body.push_str("        }\n");
    body.push_str("        SYNC();\n");
    // The steps; each weight panel (the block's share of a matrix) that
    // fits what is left of `on_chip` is held in `cache`, its loads in
    // `loads`.
    let mut steps = String::new();
    // What the block's own arrays leave (the activations, the table's row,
    // the tick's words, the held weights' row and version, and 64 bytes to
    // align them).
    let own = shared
        .saturating_add(4)
        .saturating_mul(4)
        .saturating_add(64);
    let mut cache = Cache::new(on_chip.saturating_sub(own) / 4);
    for (index, step) in plan.steps.iter().enumerate() {
        let out = offsets[step.output];
        let body = &mut steps;
        match &step.op {
            Op::MatMul {
                input,
                weight,
                transposed,
                groups: 1,
                k,
                n,
            } => {
                let (x, chain) = (offsets[*input], epilogue(&step.epilogue));
                // This block's share of the columns.
                let (lo, hi) = share(*n, split);
                let span = n.div_ceil(split);
                let w = if *transposed {
                    cache.rows(*weight, &[0], span, *k, (&lo, &hi)).map_or_else(
                        || format!("W({weight})[(long long)col * {k} + i]"),
                        |at| format!("cache[{at} + (col - {lo}) * {k} + i]"),
                    )
                } else {
                    cache
                        .columns(*weight, *k, *n, span, (&lo, &hi))
                        .map_or_else(
                            || format!("W({weight})[(long long)i * {n} + col]"),
                            |at| format!("cache[{at} + i * {span} + (col - {lo})]"),
                        )
                };
                if *transposed {
                    // A column's weights side by side: a warp per column,
                    // its lanes over them (one coalesced load a lane),
                    // summed across the warp.
                    let _ = write!(
                        body,
                        "        for (int col = {lo} + warp; col < {hi}; col += warps) {{
            float v = 0.0f;
            for (int i = lane; i < {k}; i += LANES) v += val[{x} + i] * {w};
            for (int o = LANES / 2; o > 0; o /= 2) v += SHFL_XOR(v, o);
            if (lane == 0) {{
{chain}            put(val, {out} + col, v, part);
            }}
        }}
        CLUSTER_SYNC();
"
                    );
                } else {
                    // A row's weights side by side: a thread per column
                    // (neighbouring threads, neighbouring weights).
                    let _ = write!(
                        body,
                        "        for (int col = {lo} + r; col < {hi}; col += threads) {{
            float v = 0.0f;
            for (int i = 0; i < {k}; ++i) v += val[{x} + i] * {w};
{chain}            put(val, {out} + col, v, part);
        }}
        CLUSTER_SYNC();
"
                    );
                }
            }
            Op::Recurrent(layer) => {
                if layer.steps != 1 {
                    return Err(format!(
                        "step {index} ({}) runs a window of {} steps; the resident kernel runs one tick",
                        step.nodes.join(", "),
                        layer.steps
                    ));
                }
                if !step.epilogue.is_empty() {
                    return Err(format!(
                        "step {index} ({}) has an elementwise chain after its recurrent layer",
                        step.nodes.join(", ")
                    ));
                }
                let (h, g) = (layer.hidden, layer.cell.gates() * layer.hidden);
                let (lo, hi) = share(h, split);
                let span = h.div_ceil(split);
                let state_of = |v: Option<ValueId>, at: &str| {
                    v.map_or_else(
                        || "0.0f".to_string(),
                        |v| format!("val[{} + {at}]", offsets[v]),
                    )
                };
                let (x, size) = (offsets[layer.input], layer.input_size);
                let h0 = layer.initial_h.map(|v| offsets[v]);
                // Matrix `w`'s rows `row + u` (a gate's, the unit's) times
                // `from`'s `width` floats, into the accumulators named: the
                // lanes over the floats, the block's rows on chip where they
                // fit.
                let mut products = |from: usize, width: usize, w: usize, rows: &[(usize, &str)]| {
                    let gates: Vec<usize> = rows.iter().map(|&(row, _)| row).collect();
                    let held = cache.rows(w, &gates, span, width, (&lo, &hi));
                    let mut code = format!(
                        "            for (int i = lane; i < {width}; i += LANES) {{
                const float x = val[{from} + i];
"
                    );
                    for (k, (row, acc)) in rows.iter().enumerate() {
                        let weight = match held {
                            Some(at) => {
                                format!("cache[{at} + ({k} * {span} + (u - {lo})) * {width} + i]")
                            }
                            None => format!("W({w})[(long long)({row} + u) * {width} + i]"),
                        };
                        let _ = writeln!(code, "                {acc} += x * {weight};");
                    }
                    code.push_str("            }\n");
                    code
                };
                // A gate's biases: the input's, the recurrence's.
                let bias = |gate: usize, of: usize| {
                    layer.b.map_or_else(
                        || "0.0f".to_string(),
                        |b| format!("W({b})[{} + u]", of * g + gate * h),
                    )
                };
                let mut stores = format!("                put(val, {out} + u, hn, part);\n");
                if let Some(c) = layer.last_c {
                    let _ = writeln!(
                        stores,
                        "                put(val, {} + u, cn, part);",
                        offsets[c]
                    );
                }
                if let Some(y) = layer.sequence {
                    let _ = writeln!(
                        stores,
                        "                put(val, {} + u, hn, part);",
                        offsets[y]
                    );
                }
                // A warp per hidden unit of the block's share, its gates'
                // products summed across the warp, then the unit's new
                // state by lane 0.
                let unit = |sums: &str, accumulators: &[&str], cell: &str| {
                    let declared: Vec<String> =
                        accumulators.iter().map(|a| format!("{a} = 0.0f")).collect();
                    let reduced: String = (accumulators.iter())
                        .map(|a| format!("                {a} += SHFL_XOR({a}, o);\n"))
                        .collect();
                    format!(
                        "        for (int u = {lo} + warp; u < {hi}; u += warps) {{
            float {declared};
{sums}            for (int o = LANES / 2; o > 0; o /= 2) {{
{reduced}            }}
            if (lane == 0) {{
{cell}            }}
        }}
        CLUSTER_SYNC();
",
                        declared = declared.join(", ")
                    )
                };
                match layer.cell {
                    Cell::Lstm => {
                        // The four gates (input, output, forget, cell:
                        // ONNX's order) at once: nothing reads another
                        // unit's gates, so no barrier until the layer's end.
                        let all = [(0, "a0"), (h, "a1"), (2 * h, "a2"), (3 * h, "a3")];
                        let mut sums = products(x, size, layer.w, &all);
                        if let Some(h0) = h0 {
                            sums.push_str(&products(h0, h, layer.r, &all));
                        }
                        let gate = |k: usize| format!("a{k} + {} + {}", bias(k, 0), bias(k, 1));
                        let cell = format!(
                            "                const float ig = {ig}, og = {og}, fg = {fg};
                const float cn = fg * {c0} + ig * tanhf({c});
                const float hn = og * tanhf(cn);
{stores}",
                            ig = sigmoid(&gate(0)),
                            og = sigmoid(&gate(1)),
                            fg = sigmoid(&gate(2)),
                            c = gate(3),
                            c0 = state_of(layer.initial_c, "u"),
                        );
                        body.push_str(&unit(&sums, &["a0", "a1", "a2", "a3"], &cell));
                    }
                    Cell::Gru {
                        linear_before_reset: true,
                    } => {
                        // Update, reset and candidate gates (ONNX's order) at
                        // once, the candidate's recurrent product apart (the
                        // reset scales it after): no barrier either.
                        let mut sums =
                            products(x, size, layer.w, &[(0, "a0"), (h, "a1"), (2 * h, "a2")]);
                        if let Some(h0) = h0 {
                            sums.push_str(&products(
                                h0,
                                h,
                                layer.r,
                                &[(0, "a0"), (h, "a1"), (2 * h, "a3")],
                            ));
                        }
                        let cell = format!(
                            "                const float z = {z}, rg = {r};
                const float n = tanhf(a2 + {wn} + rg * (a3 + {rn}));
                const float hn = (1.0f - z) * n + z * {hu};
{stores}",
                            z = sigmoid(&format!("a0 + {} + {}", bias(0, 0), bias(0, 1))),
                            r = sigmoid(&format!("a1 + {} + {}", bias(1, 0), bias(1, 1))),
                            wn = bias(2, 0),
                            rn = bias(2, 1),
                            hu = state_of(layer.initial_h, "u"),
                        );
                        body.push_str(&unit(&sums, &["a0", "a1", "a2", "a3"], &cell));
                    }
                    Cell::Gru {
                        linear_before_reset: false,
                    } => {
                        // The candidate's recurrent product reads every
                        // unit's reset: first each unit's update and reset
                        // (and `r ⊙ h` stored into every block), then, after
                        // the cluster's barrier, the candidate.
                        let at = scratch[index]
                            .ok_or_else(|| format!("step {index}: no scratch for its GRU"))?;
                        let (rh, zs, xs) = (at, at + h, at + 2 * h);
                        let mut sums =
                            products(x, size, layer.w, &[(0, "a0"), (h, "a1"), (2 * h, "a2")]);
                        if let Some(h0) = h0 {
                            sums.push_str(&products(h0, h, layer.r, &[(0, "a0"), (h, "a1")]));
                        }
                        let first = format!(
                            "                const float z = {z}, rg = {r};
                val[{zs} + u] = z;
                val[{xs} + u] = a2 + {wn};
                put(val, {rh} + u, rg * {hu}, part);
",
                            z = sigmoid(&format!("a0 + {} + {}", bias(0, 0), bias(0, 1))),
                            r = sigmoid(&format!("a1 + {} + {}", bias(1, 0), bias(1, 1))),
                            wn = bias(2, 0),
                            hu = state_of(layer.initial_h, "u"),
                        );
                        body.push_str(&unit(&sums, &["a0", "a1", "a2"], &first));
                        let sums = if h0.is_some() {
                            products(rh, h, layer.r, &[(2 * h, "a3")])
                        } else {
                            String::new()
                        };
                        let second = format!(
                            "                const float z = val[{zs} + u];
                const float n = tanhf(val[{xs} + u] + a3 + {rn});
                const float hn = (1.0f - z) * n + z * {hu};
{stores}",
                            rn = bias(2, 1),
                            hu = state_of(layer.initial_h, "u"),
                        );
                        body.push_str(&unit(&sums, &["a3"], &second));
                    }
                }
            }
            // Per-segment steps read a whole activation, which every block
            // holds: each block computes all of it, for itself (the same
            // floats in every block), with no barrier but its own.
            Op::Softmax { input, segment } => {
                let segment = (*segment).max(1);
                let (x, chain) = (offsets[*input], epilogue(&step.epilogue));
                // A warp a segment: its largest element, then the sum of
                // the exponentials, each summed across the warp.
                let _ = write!(
                    body,
                    "        for (int s = warp; s < {segments}; s += warps) {{
            const int at = s * {segment};
            float m = __int_as_float(0xff800000);
            for (int i = lane; i < {segment}; i += LANES) m = fmaxf(m, val[{x} + at + i]);
            for (int o = LANES / 2; o > 0; o /= 2) m = fmaxf(m, SHFL_XOR(m, o));
            float sum = 0.0f;
            for (int i = lane; i < {segment}; i += LANES) sum += expf(val[{x} + at + i] - m);
            for (int o = LANES / 2; o > 0; o /= 2) sum += SHFL_XOR(sum, o);
            for (int i = lane; i < {segment}; i += LANES) {{
                const int col = at + i;
                float v = expf(val[{x} + col] - m) / sum;
{chain}                val[{out} + col] = v;
            }}
        }}
        SYNC();
",
                    segments = width(step.output) / segment,
                );
            }
            Op::LayerNorm {
                input,
                scale,
                bias,
                epsilon,
                segment,
            } => {
                let segment = (*segment).max(1);
                let (x, chain) = (offsets[*input], epilogue(&step.epilogue));
                let bias = bias.map_or_else(|| "0.0f".to_string(), |b| format!("W({b})[i]"));
                // A warp a segment: its mean, then its variance, each
                // summed across the warp.
                let _ = write!(
                    body,
                    "        for (int s = warp; s < {segments}; s += warps) {{
            const int at = s * {segment};
            float sum = 0.0f;
            for (int i = lane; i < {segment}; i += LANES) sum += val[{x} + at + i];
            for (int o = LANES / 2; o > 0; o /= 2) sum += SHFL_XOR(sum, o);
            const float mean = sum / {segment}.0f;
            float var = 0.0f;
            for (int i = lane; i < {segment}; i += LANES) {{
                const float d = val[{x} + at + i] - mean;
                var += d * d;
            }}
            for (int o = LANES / 2; o > 0; o /= 2) var += SHFL_XOR(var, o);
            const float inv = 1.0f / sqrtf(var / {segment}.0f + {epsilon});
            for (int i = lane; i < {segment}; i += LANES) {{
                const int col = at + i;
                float v = (val[{x} + col] - mean) * inv * W({scale})[i] + {bias};
{chain}                val[{out} + col] = v;
            }}
        }}
        SYNC();
",
                    segments = width(step.output) / segment,
                    epsilon = c_float(*epsilon),
                );
            }
            // A product over several groups (a batched MatMul of a
            // reshaped row): small where exporters write one, so each
            // block computes all of it, a thread a column, through L2.
            Op::MatMul {
                input,
                weight,
                transposed,
                groups,
                k,
                n,
            } => {
                let x = offsets[*input];
                let w = if *transposed {
                    format!("W({weight})[(long long)c * {k} + i]")
                } else {
                    format!("W({weight})[(long long)i * {n} + c]")
                };
                let _ = write!(
                    body,
                    "        for (int col = r; col < {columns}; col += threads) {{
            const int g = col / {n}, c = col % {n};
            float v = 0.0f;
            for (int i = 0; i < {k}; ++i) v += val[{x} + g * {k} + i] * {w};
{chain}            val[{out} + col] = v;
        }}
        SYNC();
",
                    columns = groups.saturating_mul(*n),
                    chain = epilogue(&step.epilogue),
                );
            }
            // The layout and elementwise steps exporters write around the
            // products and cells (a state's slice, a gate's sum, a join)
            // are cheap: like the per-segment steps, each block computes
            // all of the output for itself.
            Op::Copy { input } => {
                let x = offsets[*input];
                local(
                    body,
                    width(step.output),
                    &format!("val[{x} + col]"),
                    &step.epilogue,
                    out,
                );
            }
            Op::Binary { a, b, op } => {
                let load = format!(
                    "val[{} + col] {} val[{} + col]",
                    offsets[*a],
                    op.symbol(),
                    offsets[*b]
                );
                local(body, width(step.output), &load, &step.epilogue, out);
            }
            Op::Rearrange {
                input,
                dims,
                strides,
                offset,
            } => {
                let at = rearrange_index(dims, strides, *offset);
                let load = format!("val[{} + ({at})]", offsets[*input]);
                local(body, width(step.output), &load, &step.epilogue, out);
            }
            Op::Concat {
                inputs,
                outer,
                chunks,
            } => {
                // Each input's floats to their places in every block of
                // the row: block `e / chunk`, after the inputs before it.
                let block: usize = chunks.iter().sum();
                let chain = epilogue(&step.epilogue);
                let mut before = 0usize;
                for (input, &chunk) in inputs.iter().zip(chunks) {
                    let x = offsets[*input];
                    let _ = write!(
                        body,
                        "        for (int e = r; e < {count}; e += threads) {{
            const int col = e / {chunk} * {block} + {before} + e % {chunk};
            float v = val[{x} + e];
{chain}            val[{out} + col] = v;
        }}
",
                        count = outer.saturating_mul(chunk),
                        chunk = chunk.max(1),
                    );
                    before += chunk;
                }
                body.push_str("        SYNC();\n");
            }
            other => {
                return Err(format!(
                    "step {index} ({}) is {}; the resident kernel runs products, LSTM and GRU layers, softmax, layer normalization, and copies, rearrangements, joins and elementwise operations of activations",
                    step.nodes.join(", "),
                    op_name(other)
                ));
            }
        }
    }
    // The weights held on chip, loaded when the tick's row and version are
    // not the ones held.
    if cache.used > 0 {
        let version = plan.weights.len();
        let _ = write!(
            body,
            "        if (held[0] != slots[{version}] || held[1] != (u64)asked[1]) {{
{loads}            SYNC();
            if (r == 0) {{
                held[0] = slots[{version}];
                held[1] = (u64)asked[1];
            }}
        }}
",
            loads = cache.loads
        );
    }
    body.push_str(&steps);
    // The answer to the mailbox (by the cluster's first block: every block
    // holds all of it), the state kept by every block, for its next tick.
    body.push_str("        if (part == 0) {\n");
    for (o, (_, v)) in plan.outputs.iter().enumerate() {
        let from = format!("val[{}", offsets[*v]);
        copy(
            &mut body,
            width(*v),
            &format!("mail[{}", outputs[o].0),
            &from,
        );
    }
    body.push_str("        }\n");
    for k in &kept {
        let from = format!("val[{}", offsets[plan.outputs[k.output].1]);
        copy(&mut body, k.width, &format!("state[{}", k.offset), &from);
    }
    let source = format!(
        "#define CLUSTER {split}
{PRELUDE}extern \"C\" __global__ void resident(int* box, const u64* table, float* state) {{
    SHARED(float, val, {values});
    SHARED(int, asked, 3);
    SHARED(u64, slots, {weights} + 1);
{dynamic}    const int r = threadIdx.x, threads = blockDim.x;
    // Warps: a product whose columns' weights lie side by side takes a warp
    // a column, its lanes over the weights.
    const int lane = r % LANES, warp = r / LANES, warps = threads / LANES;
    // This block's slot (its mailbox) and its part of the slot's cluster;
    // its own copy of the slot's state.
    const int part = blockIdx.x % CLUSTER;
    box += (long long)(blockIdx.x / CLUSTER) * {mailbox_words};
    state += (long long)blockIdx.x * {state_words};
    volatile float* mail = (volatile float*)(box + {DATA_WORD});
{held}    int last = 0;
    for (;;) {{
        if (r == 0) {{
            int t;
            while ((t = load_acquire(box + {ASKED_WORD})) == last) {{
            }}
            asked[0] = t;
            asked[1] = ((volatile int*)box)[{MEMBER_WORD}];
            asked[2] = ((volatile int*)box)[{GIVEN_WORD}];
        }}
        // Every block of the cluster has its last tick done (so no store
        // of this one lands on activations it still reads) and this one
        // asked.
        CLUSTER_SYNC();
        const int t = asked[0];
        if (t < 0) return;
        last = t;
{body}        FENCE();
        SYNC();
        if (part == 0 && r == 0) store_release(box + {ANSWERED_WORD}, t);
    }}
}}
",
        values = total.max(1),
        weights = plan.weights.len().max(1),
        state_words = state_floats,
        dynamic = if cache.used > 0 {
            format!(
                "    // The block's share of the member's weights, and whose they are.
    DYNAMIC_SHARED(float, cache, {floats});
    SHARED(u64, held, 2);
",
                floats = cache.used
            )
        } else {
            String::new()
        },
        held = if cache.used > 0 {
            "    if (threadIdx.x == 0) held[0] = held[1] = ~0ull;\n    SYNC();\n"
        } else {
            ""
        },
    );
    Ok(Resident {
        source,
        inputs,
        outputs,
        state: kept,
        mailbox_floats: mailbox,
        mailbox_words,
        state_floats,
        weight_slots: plan.weights.len(),
        split,
        on_chip_bytes: cache.used * 4,
    })
}

/// The weight panels a block holds on chip: where each starts in `cache`,
/// and the code that loads them.
struct Cache {
    /// Floats left.
    left: usize,
    /// Floats taken (0: nothing is held on chip).
    used: usize,
    /// The loads, block-strided.
    loads: String,
}

impl Cache {
    fn new(floats: usize) -> Cache {
        Cache {
            left: floats,
            used: 0,
            loads: String::new(),
        }
    }

    /// Takes `floats` where they fit: their start in `cache`.
    fn take(&mut self, floats: usize) -> Option<usize> {
        if floats == 0 || floats > self.left {
            return None;
        }
        let at = self.used;
        self.left -= floats;
        self.used += floats;
        Some(at)
    }

    /// Rows of weight `weight` (rows of `len` floats, side by side), the
    /// block's `span` of them after each of `gates` (a row offset each),
    /// its share `[lo, hi)`: `cache[at + (g · span + u) · len + i]` holds
    /// row `gates[g] + lo + u`'s float `i`. `None`: they do not fit.
    fn rows(
        &mut self,
        weight: usize,
        gates: &[usize],
        span: usize,
        len: usize,
        (lo, hi): (&str, &str),
    ) -> Option<usize> {
        let floats = gates.len().checked_mul(span)?.checked_mul(len)?;
        let at = self.take(floats)?;
        let rows: String = (gates.iter().enumerate())
            .map(|(g, row)| format!("g == {g} ? {row} : "))
            .collect();
        let _ = write!(
            self.loads,
            "            for (int e = r; e < {floats}; e += threads) {{
                const int g = e / ({span} * {len}), u = (e / {len}) % {span}, i = e % {len};
                if ({lo} + u < {hi}) cache[{at} + e] = W({weight})[(long long)(({rows}0) + {lo} + u) * {len} + i];
            }}
"
        );
        Some(at)
    }

    /// Columns of weight `weight` (`k` rows of `n`), the block's `span` of
    /// them from its share `[lo, hi)`: `cache[at + i · span + c]` holds row
    /// `i`'s column `lo + c`. `None`: they do not fit.
    fn columns(
        &mut self,
        weight: usize,
        k: usize,
        n: usize,
        span: usize,
        (lo, hi): (&str, &str),
    ) -> Option<usize> {
        let floats = k.checked_mul(span)?;
        let at = self.take(floats)?;
        let _ = write!(
            self.loads,
            "            for (int e = r; e < {floats}; e += threads) {{
                const int i = e / {span}, c = e % {span};
                if ({lo} + c < {hi}) cache[{at} + e] = W({weight})[(long long)i * {n} + {lo} + c];
            }}
"
        );
        Some(at)
    }
}

/// This block's share of `n` columns (or units) of a cluster of `split`
/// blocks: the bounds `[lo, hi)` as C expressions of its `part`.
fn share(n: usize, split: usize) -> (String, String) {
    if split == 1 {
        ("0".to_string(), n.to_string())
    } else {
        (
            format!("({n} * part / {split})"),
            format!("({n} * (part + 1) / {split})"),
        )
    }
}

/// A step each block computes all of for itself: column `col` of the
/// `width` is `load` through the step's elementwise chain; a block barrier
/// after.
fn local(body: &mut String, width: usize, load: &str, chain: &[Elementwise], out: usize) {
    let _ = write!(
        body,
        "        for (int col = r; col < {width}; col += threads) {{
            float v = {load};
{}            val[{out} + col] = v;
        }}
        SYNC();
",
        epilogue(chain)
    );
}

/// A block-strided copy of `width` floats: `to + j` from `from + j`, each
/// an array and its first index (`"val[8"`).
fn copy(body: &mut String, width: usize, to: &str, from: &str) {
    let _ = writeln!(
        body,
        "        for (int j = r; j < {width}; j += threads) {to} + j] = {from} + j];"
    );
}

fn sigmoid(v: &str) -> String {
    format!("1.0f / (1.0f + expf(-({v})))")
}

/// An op's name in a refusal.
fn op_name(op: &Op) -> &'static str {
    match op {
        Op::MatMul { .. } => "a product",
        Op::Binary { .. } => "an elementwise operation of two activations",
        Op::Softmax { .. } => "a softmax",
        Op::LayerNorm { .. } => "a layer normalization",
        Op::Copy { .. } => "a copy",
        Op::Rearrange { .. } => "a rearrangement",
        Op::Concat { .. } => "a concatenation",
        Op::Recurrent(_) => "a recurrent layer",
        Op::Conv1d(_) => "a convolution",
    }
}
