//! The step's allocations replayed through PyTorch's caching allocator (`crate::allocator`),
//! to learn what it reserves beyond what it hands out.
//!
//! The tape knows every tensor a layer makes, its size and whether backward keeps it, so a
//! layer's forward is replayed tensor by tensor in the order it makes them. What the tape
//! does not order is approximated, and said here:
//! - a tensor backward does not keep is freed once the next one is made (its consumer has
//!   produced its output), the layer's output once the next layer's first tensor is made;
//! - outside the layers, the embeddings' saved tensors and the head's are one block each;
//!   the loss's tensors are made and freed one by one where its source is read
//!   ([`LossTensors`]: transformers' `ForCausalLMLoss`), else its forward transient and its
//!   gradient buffers are one block each;
//! - a layer's backward makes its transients, then its parameters' gradients (in order),
//!   frees the transients, makes the gradient of its input and frees what it saved;
//! - two steps run (the first creates the optimizer state after its backward, as
//!   `_init_group` does), with `zero_grad(set_to_none=True)` freeing the gradients;
//! - with gradient accumulation a step runs its micro-batches' forward and backward passes
//!   before its optimizer step; from the second on, each new gradient is made and freed once
//!   added into the one its parameter holds;
//! - with torchtune's optimizer in backward each parameter is stepped in its gradient's
//!   post-accumulate hook and its gradient freed (`zero_grad`) there: its gradient is made,
//!   its state on its first step, its step's temporaries made and freed, then the gradient
//!   freed; a tied matrix's head share waits for the embedding's, with which it is stepped at
//!   the end of backward; no optimizer step follows;
//! - per-op checkpointing keeps, beside each layer's input, what its policy saves: one block
//!   made after the layer's forward, freed after its backward;
//! - FSDP2's and FSDP1's buffers (full fine-tuning, LoRA and QLoRA, the state on the GPU)
//!   are replayed on the streams PyTorch makes them on, the state sharded
//!   ([`super::streams`]), offloaded or not; DDP's reducer buckets are made before the
//!   first step and kept ([`ddp_buckets`]); DeepSpeed ZeRO's bucket, gradient partition,
//!   gathers and step buffers are replayed too, ZeRO-Offload's state in host RAM.

use super::streams::{ShardedReplay, ShardedStreams};
use crate::allocator::{AllocatorMode, BlockId, CachingAllocator};

/// What the optimizer step allocates beyond its state, per trained tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepTemporaries {
    /// Nothing (fused, SGD).
    None,
    /// One tensor per trained tensor, all alive together (foreach AdamW's `_foreach_sqrt`).
    AllAtOnce,
    /// Two tensors of each trained tensor's size, one tensor at a time (for-loop AdamW).
    TwoPerTensor,
}

/// One trained tensor: its gradient and what its optimizer step allocates, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Trained {
    /// The gradient.
    pub grad: u64,
    /// The optimizer state the first step makes (0 for none), in the order it is made.
    pub states: [u64; 3],
    /// The step's temporary ([`StepTemporaries`] says how many live at once).
    pub temporary: u64,
    /// A tied matrix's head share: with the optimizer in backward, it waits (unstepped) for
    /// the embedding's share, which is stepped for both.
    pub waits: bool,
}

/// One step's allocations, in bytes per tensor.
pub(crate) struct StepAllocations<'a> {
    /// Weights, buffers and everything else alive from before the first step.
    pub persistent: Vec<u64>,
    /// How many of `persistent`'s first tensors are the model's parameters (the rest: fp32
    /// master weights and buffers).
    pub parameter_tensors: usize,
    /// The input batch.
    pub input: u64,
    /// Each layer's tensors in the order it makes them (its input first), with whether
    /// backward keeps them.
    pub layers: Vec<&'a [(u64, bool)]>,
    /// Which layers checkpointing recomputes (their forward keeps only the inputs).
    pub checkpointed: Vec<bool>,
    /// Elements of the parameters outside the layers (embeddings, final norm, head: a tied
    /// matrix once): the root unit a sharded engine gathers.
    pub root_parameters: u64,
    /// Of those, the embeddings' and the final norm's and head's (a tied matrix in both):
    /// what ZeRO-3 gathers apart.
    pub embedding_parameters: u64,
    pub head_parameters: u64,
    /// Elements of the parameters of a layer of each group (adapters included): the unit a
    /// sharded engine gathers per layer.
    pub group_parameters: Vec<u64>,
    /// What each recomputed layer's forward keeps beside its input (per-op checkpointing's
    /// saved matmul and attention outputs, one block per layer; empty: nothing).
    pub policy_saved: Vec<u64>,
    /// Saved before the layers (embeddings, rotary tables, masks).
    pub embeddings_saved: u64,
    /// Saved by the final norm, the head and the loss, beyond what `loss` makes.
    pub head_saved: u64,
    /// The loss's tensors, made and freed in order in the forward and the backward.
    pub loss: &'a LossTensors,
    /// A layer's backward transients.
    pub layer_backward: Vec<u64>,
    /// The gradient flowing between layers (one layer input's size).
    pub input_gradient: u64,
    /// Gradients of the head and final norm, made at the start of backward.
    pub head_gradients: Vec<Trained>,
    /// Gradients of the parameters of a layer of each group of identical layers (none
    /// when nothing trains).
    pub group_gradients: Vec<Vec<Trained>>,
    /// Each layer's group, an index into `group_gradients`.
    pub group_of: Vec<usize>,
    /// Gradients of the embeddings, made at the end of backward.
    pub embedding_gradients: Vec<Trained>,
    /// Optimizer state, the tensors of each trained tensor one after the other.
    pub states: Vec<u64>,
    /// The step's temporaries per trained tensor (bytes), and how they live.
    pub temporaries: (Vec<u64>, StepTemporaries),
    /// Whether a backward and an optimizer step run.
    pub trains: bool,
    /// torchtune's optimizer in backward: each parameter stepped as its gradient arrives.
    pub in_backward: bool,
    /// Forward and backward passes per optimizer step (gradient accumulation).
    pub micro_batches: u64,
}

impl StepAllocations<'_> {
    /// Bytes of the gradients one forward and backward pass makes.
    fn pass_gradient_bytes(&self) -> u64 {
        let root = gradient_bytes(&self.head_gradients)
            .saturating_add(gradient_bytes(&self.embedding_gradients));
        self.group_of.iter().fold(root, |all, &g| {
            all.saturating_add(self.group_gradients.get(g).map_or(0, |t| gradient_bytes(t)))
        })
    }
}

/// Bytes of `trained`'s gradients.
fn gradient_bytes(trained: &[Trained]) -> u64 {
    trained.iter().fold(0, |all, t| all.saturating_add(t.grad))
}

/// One event of the loss's replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LossOp {
    /// A tensor of this many bytes is made.
    Make(u64),
    /// The tensor made by the `n`-th [`LossOp::Make`] (forward and backward counted together)
    /// is freed.
    Free(usize),
    /// The head's parameter gradients are made (backward only; at the end without it).
    HeadGradients,
}

/// The loss's tensors in the order they are made and freed, from the head's output on.
/// A tensor the forward makes and does not free is saved for backward; whatever backward
/// leaves alive is freed once the gradient of the head's input is made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LossTensors {
    /// From the logits to the loss.
    pub forward: Vec<LossOp>,
    /// From the loss's gradient to the head's.
    pub backward: Vec<LossOp>,
}

impl LossTensors {
    /// A forward transient and backward buffers of one block each.
    #[must_use]
    pub(crate) fn blocks(forward: u64, backward: u64) -> Self {
        LossTensors {
            forward: vec![LossOp::Make(forward), LossOp::Free(0)],
            backward: vec![LossOp::Make(backward), LossOp::HeadGradients],
        }
    }

    /// Bytes the forward makes and leaves for backward.
    #[must_use]
    pub(crate) fn saved_bytes(&self) -> u64 {
        let made: Vec<u64> = self
            .forward
            .iter()
            .filter_map(|op| match op {
                LossOp::Make(b) => Some(*b),
                _ => None,
            })
            .collect();
        made.iter()
            .enumerate()
            .filter(|(i, _)| !self.forward.contains(&LossOp::Free(*i)))
            .map(|(_, &b)| b)
            .sum()
    }
}

/// Micro-batches after which an accumulated step's replay repeats itself: from the fourth
/// pass on, each pass finds the allocator's pools as the pass before left them, so its peaks
/// are the same (checked for every preset over batches, lengths, precisions, checkpointing,
/// optimizer kernels and both allocator modes by `examples/accumulation_replay.rs`; the third
/// pass still differs in a few, the fifth to the thirty-second never). Replaying at most
/// this many keeps a step of 64 micro-batches as quick to replay as one of four.
pub(crate) const STEADY_PASSES: u64 = 4;

/// Peaks of a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorPeaks {
    /// `max_memory_allocated` over the replay.
    pub allocated_bytes: u64,
    /// `max_memory_reserved` over the replay.
    pub reserved_bytes: u64,
    /// On a device of a given capacity ([`ReplayDevice`]): a request did not fit even after
    /// the allocator handed its cached segments back. The replay stops there, as the step
    /// would (PyTorch raises), so the peaks are those reached before it.
    pub out_of_memory: bool,
}

/// Where a step's allocations are replayed: the caching allocator's configuration, and
/// what `cudaMalloc` can hand out on the device (`None`: as much as the step asks for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplayDevice {
    /// The allocator's configuration.
    pub mode: AllocatorMode,
    /// Bytes `cudaMalloc` can hand out: the GPU less the CUDA context, NCCL's buffers and
    /// the safety margin. Near it the allocator releases its cached segments before it gives
    /// up, so the reserve a step needs there is smaller than on a larger device.
    pub capacity: Option<u64>,
    /// A sharded engine's buffers replayed on their streams, the state sharded (`None`: one
    /// GPU's step, or an engine whose buffers are not replayed).
    pub sharded: Option<ShardedStreams>,
    /// The step runs under DDP, whose reducer holds its gradient buckets for good.
    pub ddp: bool,
}

impl From<AllocatorMode> for ReplayDevice {
    fn from(mode: AllocatorMode) -> Self {
        ReplayDevice {
            mode,
            capacity: None,
            sharded: None,
            ddp: false,
        }
    }
}

/// DDP's first bucket and every later one (`dist._DEFAULT_FIRST_BUCKET_BYTES`, and
/// `bucket_cap_mb=25` as torch, accelerate and the HF Trainer leave it).
const DDP_BUCKET_CAPS: [u64; 2] = [1 << 20, 25 << 20];

/// The flat buckets DDP's reducer allocates when the model is wrapped
/// (`_compute_bucket_assignment_by_size` over the trained parameters in reverse order: a
/// bucket closes once it holds at least its cap; `Reducer::initialize_buckets` makes each
/// one tensor). They are rebuilt in the order the gradients arrived after the first step,
/// which for a model run layer by layer is the same order, and stay allocated beside the
/// gradients (`gradient_as_bucket_view=False`, the default).
pub(crate) fn ddp_buckets(s: &StepAllocations<'_>) -> Vec<u64> {
    let layers = s.group_of.iter().rev().flat_map(|&g| {
        s.group_gradients
            .get(g)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .rev()
    });
    let reversed = s
        .head_gradients
        .iter()
        .rev()
        .chain(layers)
        .chain(s.embedding_gradients.iter().rev());
    let mut buckets = Vec::new();
    let mut filling = 0u64;
    for t in reversed {
        filling = filling.saturating_add(t.grad);
        if filling >= DDP_BUCKET_CAPS[usize::from(!buckets.is_empty())] {
            buckets.push(filling);
            filling = 0;
        }
    }
    if filling > 0 {
        buckets.push(filling);
    }
    buckets
}

impl AllocatorPeaks {
    /// What the allocator holds beyond its allocated peak.
    #[must_use]
    pub const fn slack_bytes(&self) -> u64 {
        self.reserved_bytes.saturating_sub(self.allocated_bytes)
    }
}

/// Makes a tensor that is freed once the next one is made.
struct Transient {
    pending: Option<BlockId>,
}

impl Transient {
    fn make(&mut self, a: &mut CachingAllocator, bytes: u64) -> BlockId {
        let id = a.malloc(bytes);
        if let Some(p) = self.pending.take() {
            a.free(p);
        }
        id
    }
    fn flush(&mut self, a: &mut CachingAllocator) {
        if let Some(p) = self.pending.take() {
            a.free(p);
        }
    }
}

/// Replays the forward of one layer: adds what backward keeps to `kept` (when `keep`), and
/// leaves the layer's output pending in `flow`.
fn layer_forward(
    a: &mut CachingAllocator,
    log: &[(u64, bool)],
    keep: bool,
    flow: &mut Transient,
    kept: &mut Vec<BlockId>,
) {
    let mut input = flow.pending.take();
    for (i, &(bytes, saved)) in log.iter().enumerate() {
        if i == 0 {
            // the input is the previous layer's output: kept if this layer saves it
            if saved && keep {
                kept.extend(input.take());
            }
            continue;
        }
        let id = flow.make(a, bytes);
        if i == 1 {
            // the input lives until the layer's first op has run
            if let Some(p) = input.take() {
                a.free(p);
            }
        }
        if saved && keep {
            kept.push(id);
        } else {
            flow.pending = Some(id);
        }
    }
    if let Some(p) = input {
        flow.pending.get_or_insert(p);
    }
}

/// The lists a replay fills, kept from one replay to the next so that their memory is
/// allocated once.
#[derive(Default)]
struct Scratch {
    /// What backward keeps, layer after layer.
    kept: Vec<BlockId>,
    /// Where each layer's part of `kept` starts.
    starts: Vec<usize>,
    /// What a checkpointed layer's recomputation keeps.
    recomputed: Vec<BlockId>,
    /// A layer's backward transients, or the optimizer step's temporaries.
    transients: Vec<BlockId>,
    /// The gradients, freed by the optimizer step.
    grads: Vec<BlockId>,
    /// Gradients waiting for another share before their step in backward.
    waiting: Vec<BlockId>,
    /// The loss's tensors, by the order they were made (`None` once freed).
    loss: Vec<Option<BlockId>>,
}

/// Runs the loss's `ops`, its tensors' blocks in `made`; `head_gradients` makes the head's.
fn loss_ops(
    a: &mut CachingAllocator,
    made: &mut Vec<Option<BlockId>>,
    ops: &[LossOp],
    head_gradients: &mut dyn FnMut(&mut CachingAllocator),
) {
    for op in ops {
        match *op {
            LossOp::Make(bytes) => made.push(Some(a.malloc(bytes))),
            LossOp::Free(n) => {
                if let Some(id) = made.get_mut(n).and_then(Option::take) {
                    a.free(id);
                }
            }
            LossOp::HeadGradients => head_gradients(a),
        }
    }
}

/// Frees the loss's tensors still alive.
fn free_loss(a: &mut CachingAllocator, made: &mut [Option<BlockId>]) {
    for id in made.iter_mut().filter_map(Option::take) {
        a.free(id);
    }
}

thread_local! {
    /// The allocator and the lists of the last replay, which the next one reuses (a replay
    /// otherwise spends a tenth of its time growing them).
    static SPARE: std::cell::RefCell<Option<(CachingAllocator, Scratch)>> =
        const { std::cell::RefCell::new(None) };
}

/// Replays two steps of `s` through a caching allocator on `device`.
#[must_use]
pub(crate) fn replay(s: &StepAllocations<'_>, device: ReplayDevice) -> AllocatorPeaks {
    let (mut a, mut scratch) = match SPARE.with(|spare| spare.borrow_mut().take()) {
        Some((mut a, scratch)) => {
            a.reset(device.mode);
            (a, scratch)
        }
        None => (CachingAllocator::new(device.mode), Scratch::default()),
    };
    if let Some(capacity) = device.capacity {
        a.set_capacity(capacity);
    }
    // (the optimizer in backward steps whole gradients: no sharded engine is replayed
    // under it)
    let mut sharded = device
        .sharded
        .filter(|_| s.trains && !s.in_backward)
        .map(|f| {
            let layers = s
                .group_of
                .iter()
                .map(|&g| s.group_parameters.get(g).copied().unwrap_or(0));
            let root_parts = (s.embedding_parameters, s.head_parameters);
            ShardedReplay::new(
                f,
                s.root_parameters,
                root_parts,
                layers,
                s.pass_gradient_bytes(),
            )
        });
    if device.ddp && s.trains {
        for bytes in ddp_buckets(s) {
            a.malloc(bytes);
        }
    }
    replay_with(&mut a, &mut scratch, s, sharded.as_mut());
    let peaks = AllocatorPeaks {
        allocated_bytes: a.peak_allocated(),
        reserved_bytes: a.peak_reserved(),
        out_of_memory: a.out_of_memory(),
    };
    SPARE.with(|spare| *spare.borrow_mut() = Some((a, scratch)));
    peaks
}

fn replay_with(
    a: &mut CachingAllocator,
    scratch: &mut Scratch,
    s: &StepAllocations<'_>,
    mut sharded: Option<&mut ShardedReplay>,
) {
    // a sharded engine holds each persistent tensor's shard, and shards the optimizer's state
    // (offloaded, both are the host's)
    let shard = |bytes: u64, parameter: bool, f: &Option<&mut ShardedReplay>| match f {
        Some(f) => f.resident_shard(bytes, parameter),
        None => bytes,
    };
    for (i, &bytes) in s.persistent.iter().enumerate() {
        a.malloc(shard(bytes, i < s.parameter_tensors, &sharded));
    }
    if let Some(f) = sharded.as_deref_mut() {
        f.start(a);
    }
    let mut states_made = false;
    let passes = if s.trains {
        s.micro_batches.clamp(1, STEADY_PASSES)
    } else {
        1
    };
    for _ in 0..2 {
        scratch.grads.clear();
        for pass in 0..passes {
            forward_backward(
                a,
                scratch,
                s,
                pass == 0,
                !states_made,
                sharded.as_deref_mut(),
            );
            if a.out_of_memory() {
                return;
            }
        }
        if !s.trains {
            continue;
        }
        if s.in_backward {
            // every parameter was stepped in backward, its state made by its first step
            states_made = true;
            continue;
        }
        let Scratch {
            transients, grads, ..
        } = scratch;
        // the optimizer step: state made on the first, then the temporaries
        if !states_made {
            for &bytes in &s.states {
                a.malloc(shard(bytes, false, &sharded));
            }
            states_made = true;
        }
        let (sizes, kind) = &s.temporaries;
        match sharded.as_deref_mut() {
            Some(f) => {
                f.step_start(a);
                let shards: Vec<u64> = sizes.iter().map(|&b| f.resident_shard(b, false)).collect();
                step_temporaries(a, transients, &shards, *kind);
                f.step_end(a);
            }
            None => step_temporaries(a, transients, sizes, *kind),
        }
        for &g in grads.iter() {
            a.free(g);
        }
    }
}

/// An optimizer step's temporaries of `sizes`, made and freed as `kind` says.
fn step_temporaries(
    a: &mut CachingAllocator,
    transients: &mut Vec<BlockId>,
    sizes: &[u64],
    kind: StepTemporaries,
) {
    match kind {
        StepTemporaries::None => {}
        StepTemporaries::AllAtOnce => {
            transients.clear();
            transients.extend(sizes.iter().map(|&b| a.malloc(b)));
            for &t in transients.iter() {
                a.free(t);
            }
        }
        StepTemporaries::TwoPerTensor => {
            for &b in sizes {
                tensor_step_temporaries(a, b, StepTemporaries::TwoPerTensor);
            }
        }
    }
}

/// One trained tensor's step temporaries of `bytes` each, made and freed.
fn tensor_step_temporaries(a: &mut CachingAllocator, bytes: u64, kind: StepTemporaries) {
    match kind {
        StepTemporaries::None => {}
        StepTemporaries::AllAtOnce => {
            let t = a.malloc(bytes);
            a.free(t);
        }
        StepTemporaries::TwoPerTensor => {
            let first = a.malloc(bytes);
            let second = a.malloc(bytes);
            a.free(first);
            a.free(second);
        }
    }
}

/// One micro-batch's forward and (when the step trains) backward; the gradients go to
/// `grads` on the `first` pass, and are made and freed (added into them) on the others.
/// With the optimizer in backward each is stepped as it comes, its state made when
/// `make_states`.
fn forward_backward(
    a: &mut CachingAllocator,
    scratch: &mut Scratch,
    s: &StepAllocations<'_>,
    first: bool,
    make_states: bool,
    mut sharded: Option<&mut ShardedReplay>,
) {
    let Scratch {
        kept,
        starts,
        recomputed,
        transients,
        grads,
        waiting,
        loss,
    } = scratch;
    let mut gradients = Gradients {
        grads,
        waiting,
        // (a sharded engine frees each pass's gradients once reduced, and adds the shards)
        first: first || sharded.is_some(),
        stepped: s.in_backward.then_some((make_states, s.temporaries.1)),
    };
    let input = a.malloc(s.input);
    if let Some(f) = sharded.as_deref_mut() {
        f.forward_start(a);
    }
    let embeddings = a.malloc(s.embeddings_saved);
    let mut flow = Transient { pending: None };
    // under checkpointing each layer keeps its input (the previous layer's output)
    kept.clear();
    starts.clear();
    for (i, log) in s.layers.iter().enumerate() {
        // out of memory on the device: the step stops here (see `AllocatorPeaks`)
        if a.out_of_memory() {
            return;
        }
        starts.push(kept.len());
        if let Some(f) = sharded.as_deref_mut() {
            f.before_forward(a, i);
        }
        let recompute = s.checkpointed.get(i).copied().unwrap_or(false);
        if recompute && s.trains {
            kept.extend(flow.pending.take());
            let mut inner = Transient { pending: None };
            // (a forward that keeps nothing adds nothing to `kept`)
            layer_forward(a, log, false, &mut inner, kept);
            if let Some(&bytes) = s.policy_saved.get(i).filter(|&&b| b > 0) {
                kept.push(a.malloc(bytes));
            }
            flow.pending = inner.pending;
        } else {
            layer_forward(a, log, s.trains, &mut flow, kept);
        }
        if let Some(f) = sharded.as_deref_mut() {
            f.after_forward(a, i);
        }
    }
    let head = a.malloc(s.head_saved);
    let loss_outside = sharded.as_deref().is_some_and(ShardedReplay::loss_outside);
    if let Some(f) = sharded.as_deref_mut().filter(|_| loss_outside) {
        f.forward_end(a);
    }
    loss.clear();
    loss_ops(a, loss, &s.loss.forward, &mut |_| {});
    flow.flush(a);
    if let Some(f) = sharded.as_deref_mut().filter(|_| !loss_outside) {
        f.forward_end(a);
    }
    if !s.trains {
        free_loss(a, loss);
        a.free(head);
        a.free(embeddings);
        a.free(input);
        return;
    }
    // backward
    if let Some(f) = sharded.as_deref_mut().filter(|_| !loss_outside) {
        f.backward_start(a);
    }
    let mut head_gradients = false;
    let head_from = gradients.grads.len();
    loss_ops(a, loss, &s.loss.backward, &mut |a| {
        gradients.add(a, &s.head_gradients);
        head_gradients = true;
    });
    if !head_gradients {
        gradients.add(a, &s.head_gradients);
    }
    if let Some(f) = sharded.as_deref_mut() {
        let head_bytes = gradient_bytes(&s.head_gradients);
        f.gradient_hooks(a, head_bytes, gradients.grads, head_from);
    }
    if let Some(f) = sharded.as_deref_mut().filter(|_| loss_outside) {
        f.backward_start(a);
    }
    a.free(head);
    let mut gradient = a.malloc(s.input_gradient);
    free_loss(a, loss);
    for (i, log) in s.layers.iter().enumerate().rev() {
        if a.out_of_memory() {
            return;
        }
        if let Some(f) = sharded.as_deref_mut() {
            f.before_backward(a, i);
        }
        recomputed.clear();
        if s.checkpointed.get(i).copied().unwrap_or(false) {
            let mut inner = Transient { pending: None };
            layer_forward(a, log, true, &mut inner, recomputed);
            inner.flush(a);
        }
        transients.clear();
        transients.extend(s.layer_backward.iter().map(|&b| a.malloc(b)));
        let layer = s.group_of.get(i).and_then(|&g| s.group_gradients.get(g));
        let made_from = gradients.grads.len();
        if let Some(layer) = layer {
            gradients.add(a, layer);
        }
        for &t in transients.iter() {
            a.free(t);
        }
        let next = a.malloc(s.input_gradient);
        a.free(gradient);
        gradient = next;
        for &t in recomputed.iter() {
            a.free(t);
        }
        // this layer's part is the end of `kept`: the layers after it freed theirs
        if let Some(&start) = starts.get(i) {
            for t in kept.drain(start.min(kept.len())..) {
                a.free(t);
            }
        }
        if let Some(f) = sharded.as_deref_mut() {
            let bytes = layer.map_or(0, |t| gradient_bytes(t));
            f.after_backward(a, i, bytes, gradients.grads, made_from, first);
        }
    }
    let embeddings_from = gradients.grads.len();
    gradients.add(a, &s.embedding_gradients);
    if let Some(f) = sharded {
        let embedding_bytes = gradient_bytes(&s.embedding_gradients);
        f.gradient_hooks(a, embedding_bytes, gradients.grads, embeddings_from);
        // what is left: the root's, and the layers' a whole-model unit did not reduce
        let left = if f.whole_model() {
            s.pass_gradient_bytes()
        } else {
            gradient_bytes(&s.head_gradients).saturating_add(embedding_bytes)
        };
        f.backward_end(a, left, gradients.grads, first);
    }
    for g in gradients.waiting.drain(..) {
        a.free(g);
    }
    a.free(gradient);
    a.free(embeddings);
    a.free(input);
}

/// Where a backward's new gradients go.
struct Gradients<'s> {
    /// Those the optimizer step frees.
    grads: &'s mut Vec<BlockId>,
    /// Those waiting for another share before their step in backward.
    waiting: &'s mut Vec<BlockId>,
    /// The first micro-batch: the gradients are kept (on the others they are added in
    /// place into the kept ones: made, then freed).
    first: bool,
    /// The optimizer in backward: whether its first step makes the state, and how its
    /// temporaries live.
    stepped: Option<(bool, StepTemporaries)>,
}

impl Gradients<'_> {
    fn add(&mut self, a: &mut CachingAllocator, trained: &[Trained]) {
        for t in trained {
            let g = a.malloc(t.grad);
            match self.stepped {
                // torchtune 0.6.1 (`training/memory.py`, `register_optim_in_bwd_hooks`):
                // the post-accumulate-grad hook runs the parameter's own optimizer's
                // `step()` (its `_init_group` makes the state the first time), then
                // `zero_grad()` frees the gradient
                Some(_) if t.waits => self.waiting.push(g),
                Some((make_states, kind)) => {
                    if make_states {
                        for &b in &t.states {
                            a.malloc(b);
                        }
                    }
                    tensor_step_temporaries(a, t.temporary, kind);
                    a.free(g);
                }
                None if self.first => self.grads.push(g),
                None => a.free(g),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::streams::ShardedEngine;

    const MIB: u64 = 1 << 20;

    /// A loss that allocates nothing.
    static NO_LOSS: LossTensors = LossTensors {
        forward: Vec::new(),
        backward: Vec::new(),
    };

    /// A one-layer step: two weights of 8 MiB (the embedding's and the layer's), the layer
    /// keeping 4 MiB for backward, AdamW's two 8 MiB moments per weight and foreach's 8 MiB
    /// temporary per weight; with `tied_head`, the head's share of a tied embedding waits
    /// through backward.
    fn one_layer(log: &[(u64, bool)], in_backward: bool, tied_head: bool) -> StepAllocations<'_> {
        let weight = Trained {
            grad: 8 * MIB,
            states: [8 * MIB, 8 * MIB, 0],
            temporary: 8 * MIB,
            waits: false,
        };
        StepAllocations {
            persistent: vec![8 * MIB, 8 * MIB],
            parameter_tensors: 2,
            input: 0,
            layers: vec![log],
            checkpointed: vec![false],
            root_parameters: 2 * MIB,
            embedding_parameters: MIB,
            head_parameters: MIB,
            group_parameters: vec![2 * MIB],
            policy_saved: Vec::new(),
            embeddings_saved: 0,
            head_saved: 0,
            loss: &NO_LOSS,
            layer_backward: Vec::new(),
            input_gradient: 0,
            head_gradients: if tied_head {
                vec![Trained {
                    waits: true,
                    ..weight
                }]
            } else {
                Vec::new()
            },
            group_gradients: vec![vec![weight]],
            group_of: vec![0],
            embedding_gradients: vec![weight],
            states: vec![8 * MIB; 4],
            temporaries: (vec![8 * MIB; 2], StepTemporaries::AllAtOnce),
            trains: true,
            in_backward,
            micro_batches: 1,
        }
    }

    #[track_caller]
    fn allocated_peak_mib(s: &StepAllocations<'_>, expected: u64) {
        let peaks = replay(s, AllocatorMode::Default.into());
        assert_eq!(peaks.allocated_bytes, expected * MIB);
    }

    /// The plain step holds both gradients, the four moments and both temporaries at its
    /// optimizer step (16 + 16 + 32 + 16 MiB); the optimizer in backward steps each weight
    /// as its gradient comes and frees it: at most one gradient and one temporary beside
    /// the other weight's moments and the kept activation, in the second step (16 weights,
    /// 32 moments, the layer's 4, its gradient 8 and temporary 8); a tied head share held
    /// through backward adds its 8.
    #[test]
    fn the_optimizer_in_backward_steps_each_gradient_as_it_comes() {
        let log = [(0, false), (4 * MIB, true)];
        allocated_peak_mib(&one_layer(&log, false, false), 80);
        allocated_peak_mib(&one_layer(&log, true, false), 68);
        allocated_peak_mib(&one_layer(&log, true, true), 76);
    }

    /// `peaks` are `allocated` MiB allocated and `reserved` MiB reserved.
    #[track_caller]
    fn peaks_mib(peaks: AllocatorPeaks, allocated: u64, reserved: u64) {
        assert_eq!(
            (peaks.allocated_bytes, peaks.reserved_bytes),
            (allocated * MIB, reserved * MIB)
        );
    }

    /// A four-layer step of [`one_layer`]'s layers, each layer's weight of 160 MiB (its
    /// fp32 gradient), on an expandable-segments device (one segment per pool and stream,
    /// mapped 20 MiB at a time), replayed as `sharded` says.
    fn four_layers(log: &[(u64, bool)], sharded: Option<ShardedStreams>) -> AllocatorPeaks {
        let mut step = one_layer(log, false, false);
        step.group_parameters = vec![40 * MIB];
        step.group_gradients = vec![vec![Trained {
            grad: 160 * MIB,
            states: [160 * MIB, 160 * MIB, 0],
            temporary: 160 * MIB,
            waits: false,
        }]];
        step.layers = vec![log; 4];
        step.checkpointed = vec![false; 4];
        step.group_of = vec![0; 4];
        step.persistent = vec![8 * MIB; 5];
        step.states = vec![8 * MIB; 10];
        step.temporaries.0 = vec![8 * MIB; 5];
        let device = ReplayDevice {
            mode: AllocatorMode::Expandable,
            capacity: None,
            sharded,
            ddp: false,
        };
        replay(&step, device)
    }

    /// Two GPUs of `engine` in a mixed recipe (fp32 shards and tape gradients, bf16
    /// gathered: a layer is 80 MiB gathered).
    fn two_gpus(engine: ShardedEngine) -> ShardedStreams {
        let fsdp1 = engine != ShardedEngine::Fsdp2;
        ShardedStreams {
            engine,
            group: 2,
            gathered_bytes: 2,
            reduced_bytes: if fsdp1 { 2 } else { 4 },
            sharded_bytes: 4,
            tape_gradient_bytes: 4,
            reshard_after_forward: crate::Reshard::On,
            loss_outside: false,
            backward_prefetch: !fsdp1,
            offloaded: false,
        }
    }

    /// FSDP2 over two GPUs: the state is halved, but what its streams cache stays apart from
    /// the default stream's blocks (the all-gather outputs, the gradient shards), so the
    /// rank reserves more than the whole step.
    #[test]
    fn fsdp2_s_streams_cache_their_own_blocks() {
        let log = [(0, false), (4 * MIB, true)];
        let whole = four_layers(&log, None);
        peaks_mib(whole, 808, 940);
        let rank = four_layers(&log, Some(two_gpus(ShardedEngine::Fsdp2)));
        peaks_mib(rank, 712, 1040);
    }

    /// Per-op checkpointing keeps what its policy saves beside each layer's input, from the
    /// layer's forward to its backward. Without an optimizer state, a checkpointed step's
    /// peak is the end of its backward: the weights' 16 MiB and both gradients' 16; with a
    /// policy of 6 MiB it is the layer's backward: the weights, the policy's 6, the
    /// recomputed 4 and the layer's gradient 8.
    #[test]
    fn per_op_checkpointing_keeps_the_policy_s_tensors_to_the_backward() {
        let log = [(0, false), (4 * MIB, true)];
        let mut step = one_layer(&log, false, false);
        step.checkpointed = vec![true];
        step.states = Vec::new();
        step.temporaries.0 = Vec::new();
        allocated_peak_mib(&step, 32);
        step.policy_saved = vec![6 * MIB];
        allocated_peak_mib(&step, 34);
    }

    /// FSDP1's `NO_WRAP` gathers the whole model as one unit on its unshard stream, from
    /// the first forward to the end of backward: the rank holds more than its layer-wise
    /// wrapping does.
    #[test]
    fn fsdp1_without_wrapping_gathers_the_whole_model() {
        let log = [(0, false), (4 * MIB, true)];
        let layers = four_layers(
            &log,
            Some(two_gpus(ShardedEngine::Fsdp1 { whole_model: false })),
        );
        let whole = four_layers(
            &log,
            Some(two_gpus(ShardedEngine::Fsdp1 { whole_model: true })),
        );
        // (four layers of 80 MiB and the root's 4 gathered at once)
        assert!(
            whole.allocated_bytes >= layers.allocated_bytes + 3 * 80 * MIB,
            "{whole:?} {layers:?}"
        );
    }

    /// FSDP1 gathers each layer into a block of its unshard stream, which the default stream
    /// computes with (`record_stream`): a resharded layer's block comes back only when the
    /// rate limiter waits on its free event, two all-gathers later: three gathered layers
    /// stay reserved on that stream.
    #[test]
    fn fsdp1_s_resharded_layers_wait_for_the_default_stream() {
        let log = [(0, false), (4 * MIB, true)];
        let whole = four_layers(&log, None);
        let rank = four_layers(
            &log,
            Some(two_gpus(ShardedEngine::Fsdp1 { whole_model: false })),
        );
        assert!(
            rank.allocated_bytes < whole.allocated_bytes,
            "{rank:?} {whole:?}"
        );
        // (freed at once, the unshard stream would hold two layers: 900 MiB)
        peaks_mib(rank, 548, 980);
    }

    /// [`four_layers`] over two GPUs of `engine`, the state on the GPU and offloaded.
    fn on_the_gpu_and_offloaded(
        log: &[(u64, bool)],
        engine: ShardedEngine,
    ) -> (AllocatorPeaks, AllocatorPeaks) {
        let streams = two_gpus(engine);
        let offloaded = ShardedStreams {
            offloaded: true,
            ..streams
        };
        (
            four_layers(log, Some(streams)),
            four_layers(log, Some(offloaded)),
        )
    }

    /// FSDP1's `CPUOffload`: the shards, the optimizer state and the step's temporaries
    /// are the host's (the rank's 20 + 40 + 20 MiB of them not allocated), and each unshard
    /// stages the unit's shard on the pre-unshard stream.
    #[test]
    fn fsdp1_offloaded_keeps_its_state_on_the_host_and_stages_each_shard() {
        let log = [(0, false), (4 * MIB, true)];
        let (on_gpu, offloaded) =
            on_the_gpu_and_offloaded(&log, ShardedEngine::Fsdp1 { whole_model: false });
        peaks_mib(on_gpu, 548, 980);
        // 60 MiB fewer at the peak (the shards and the state); the staged shards cached on
        // the pre-unshard stream keep the reserve's slack as it was
        peaks_mib(offloaded, 488, 920);
    }

    /// FSDP2's `CPUOffloadPolicy`: the state is the host's, each all-gather first copies the
    /// unit's fp32 shard in on the copy-in stream, and each sharded gradient leaves for the
    /// host as soon as it is reduced.
    #[test]
    fn fsdp2_offloaded_stages_each_shard_and_keeps_no_gradient() {
        let log = [(0, false), (4 * MIB, true)];
        let (on_gpu, offloaded) = on_the_gpu_and_offloaded(&log, ShardedEngine::Fsdp2);
        peaks_mib(on_gpu, 712, 1040);
        peaks_mib(offloaded, 496, 800);
    }

    /// DeepSpeed ZeRO over two GPUs, its bucket of 100 MiB of gradients, the optimizer on
    /// the GPU or offloaded (`offloaded`: the optimizer; `Some(true)`: ZeRO-3's parameters
    /// too), peaks at `allocated` and reserves `reserved` MiB.
    #[track_caller]
    fn zero_peaks_mib(stage: u8, offloaded: Option<bool>, allocated: u64, reserved: u64) {
        let log = [(0, false), (4 * MIB, true)];
        let engine = ShardedEngine::Zero {
            stage,
            bucket_elements: 25 * MIB,
            parameters_offloaded: offloaded == Some(true),
            partition_elements: None,
        };
        let streams = ShardedStreams {
            offloaded: offloaded.is_some(),
            ..two_gpus(engine)
        };
        peaks_mib(four_layers(&log, Some(streams)), allocated, reserved);
    }

    /// ZeRO's step holds the rank's gradient partition (half of the 648 MiB of gradients),
    /// its flattened copy and its fp32 cast (324 MiB each: the tape's gradients are fp32
    /// here) beside the state. Stages 1 and 2 keep the two parameters whole (16 MiB), halve
    /// the other persistent tensors (12) and the moments (40): 1,040 MiB. Stage 3 halves
    /// every persistent tensor (20) and keeps its 100 MiB bucket and its gradient partition
    /// from start-up: 1,132 MiB; its layers gathered on the all-gather stream and its
    /// buckets concatenated on the reduce stream reserve 480 MiB more than stage 2's.
    #[test]
    fn zero_s_step_holds_the_partition_its_copy_and_its_fp32_cast() {
        for (stage, allocated, reserved) in [(1, 1040, 1160), (2, 1040, 1160), (3, 1132, 1640)] {
            zero_peaks_mib(stage, None, allocated, reserved);
        }
    }

    /// ZeRO-Offload steps on the CPU: the master weights, the moments, the gradient
    /// partition and the step's buffers are the host's. Stage 2's peak is then a layer's
    /// backward: the whole parameters (16 MiB), the kept activations (16), the bucket (100)
    /// and the layer's gradient (160); stage 1's the end of backward, every gradient whole
    /// (648) beside the bucket and the parameters. Stage 3 keeps its four layers gathered
    /// from the forward on (their 168 M elements are within `max_reuse_distance`): 320 MiB
    /// beside its parameters' halves (8 MiB; none with `offload_param`), the bucket, the
    /// activations and a layer's gradient; the embeddings and the head are gathered only
    /// while they run.
    #[test]
    fn zero_offload_leaves_the_step_to_the_cpu() {
        let cases = [
            (1, false, 764, 780),
            (2, false, 292, 300),
            (3, false, 604, 800),
            (3, true, 596, 822),
        ];
        for (stage, parameters, allocated, reserved) in cases {
            zero_peaks_mib(stage, Some(parameters), allocated, reserved);
        }
    }

    /// On a device too small for it, the step stops where it runs out (as PyTorch raises):
    /// the optimizer step's moments and temporaries, the plain step's peak of 80 MiB, are
    /// never allocated.
    #[test]
    fn a_replay_stops_where_the_device_runs_out() {
        let log = [(0, false), (4 * MIB, true)];
        let step = one_layer(&log, false, false);
        let peaks = replay(
            &step,
            ReplayDevice {
                mode: AllocatorMode::Default,
                capacity: Some(30 * MIB),
                sharded: None,
                ddp: false,
            },
        );
        assert!(peaks.out_of_memory);
        assert!(peaks.allocated_bytes < 80 * MIB, "{peaks:?}");
        // the same step on a device large enough runs to its peak
        allocated_peak_mib(&step, 80);
    }

    /// DDP's buckets close once they hold their cap, taken over the trained tensors from
    /// the last to the first: 1 MiB for the first (the head's half MiB and the last
    /// layer's 20 MiB weight), 25 MiB for the others. The replay holds them beside the step:
    /// its allocated peak grows by all of them.
    #[test]
    fn ddp_buckets_fill_from_the_last_parameter_to_their_caps() {
        let trained = |mib: u64, div: u64| Trained {
            grad: mib * MIB / div,
            states: [0; 3],
            temporary: 0,
            waits: false,
        };
        let log = [(0, false), (4 * MIB, true)];
        let mut step = one_layer(&log, false, false);
        step.head_gradients = vec![trained(1, 2)];
        step.group_gradients = vec![vec![trained(10, 1), trained(20, 1)]];
        step.layers = vec![&log; 2];
        step.checkpointed = vec![false; 2];
        step.group_of = vec![0; 2];
        step.embedding_gradients = vec![trained(30, 1)];
        let buckets = ddp_buckets(&step);
        assert_eq!(buckets, [41 * MIB / 2, 30 * MIB, 40 * MIB]);
        let plain = replay(&step, AllocatorMode::Default.into());
        let with_buckets = replay(
            &step,
            ReplayDevice {
                ddp: true,
                ..AllocatorMode::Default.into()
            },
        );
        assert_eq!(
            with_buckets.allocated_bytes,
            plain.allocated_bytes + buckets.iter().sum::<u64>()
        );
    }
}
