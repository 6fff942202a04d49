//! The step's allocations replayed through PyTorch's caching allocator (`crate::allocator`),
//! to learn what it reserves beyond what it hands out.
//!
//! The tape knows every tensor a layer makes, its size and whether backward keeps it, so a
//! layer's forward is replayed tensor by tensor in the order it makes them. What the tape
//! does not order is approximated, and said here:
//! - a tensor backward does not keep is freed once the next one is made (its consumer has
//!   produced its output), the layer's output once the next layer's first tensor is made;
//! - outside the layers, the embeddings' saved tensors, the head's and the loss's are one
//!   block each, and so are the loss's forward transient and its gradient buffers;
//! - a layer's backward makes its transients, then its parameters' gradients (in order),
//!   frees the transients, makes the gradient of its input and frees what it saved;
//! - two steps run (the first creates the optimizer state after its backward, as
//!   `_init_group` does), with `zero_grad(set_to_none=True)` freeing the gradients;
//! - data-parallel engines' buffers, offloading and the optimizer in backward are not
//!   replayed: the reserve beyond the peak is taken from the plain step of the same tape.

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

/// One step's allocations, in bytes per tensor.
pub(crate) struct StepAllocations<'a> {
    /// Weights, buffers and everything else alive from before the first step.
    pub persistent: Vec<u64>,
    /// The input batch.
    pub input: u64,
    /// Each layer's tensors in the order it makes them (its input first), with whether
    /// backward keeps them.
    pub layers: Vec<&'a [(u64, bool)]>,
    /// Which layers checkpointing recomputes (their forward keeps only the inputs).
    pub checkpointed: Vec<bool>,
    /// Saved before the layers (embeddings, rotary tables, masks).
    pub embeddings_saved: u64,
    /// Saved by the final norm, the head and the loss.
    pub head_saved: u64,
    /// The loss's forward transient.
    pub loss_forward: u64,
    /// The loss's gradient buffers at the start of backward.
    pub loss_buffers: u64,
    /// A layer's backward transients.
    pub layer_backward: Vec<u64>,
    /// The gradient flowing between layers (one layer input's size).
    pub input_gradient: u64,
    /// Gradients of the head and final norm, made at the start of backward.
    pub head_gradients: Vec<u64>,
    /// Gradients of each layer's parameters, in the layers' order.
    pub layer_gradients: Vec<Vec<u64>>,
    /// Gradients of the embeddings, made at the end of backward.
    pub embedding_gradients: Vec<u64>,
    /// Optimizer state per trained tensor, each a list of tensors.
    pub states: Vec<Vec<u64>>,
    /// The step's temporaries per trained tensor (bytes), and how they live.
    pub temporaries: (Vec<u64>, StepTemporaries),
    /// Whether a backward and an optimizer step run.
    pub trains: bool,
}

/// Peaks of a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorPeaks {
    /// `max_memory_allocated` over the replay.
    pub allocated_bytes: u64,
    /// `max_memory_reserved` over the replay.
    pub reserved_bytes: u64,
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

/// Replays two steps of `s` through a caching allocator in `mode`.
#[must_use]
pub(crate) fn replay(s: &StepAllocations<'_>, mode: AllocatorMode) -> AllocatorPeaks {
    let mut a = CachingAllocator::new(mode);
    for &bytes in &s.persistent {
        a.malloc(bytes);
    }
    let mut states_made = false;
    for _ in 0..2 {
        let input = a.malloc(s.input);
        let embeddings = a.malloc(s.embeddings_saved);
        let mut flow = Transient { pending: None };
        // under checkpointing each layer keeps its input (the previous layer's output)
        let mut layer_kept: Vec<Vec<BlockId>> = Vec::with_capacity(s.layers.len());
        for (i, log) in s.layers.iter().enumerate() {
            let mut kept = Vec::new();
            let recompute = s.checkpointed.get(i).copied().unwrap_or(false);
            if recompute && s.trains {
                kept.extend(flow.pending.take());
                let mut inner = Transient { pending: None };
                let mut scratch = Vec::new();
                layer_forward(&mut a, log, false, &mut inner, &mut scratch);
                flow.pending = inner.pending;
            } else {
                layer_forward(&mut a, log, s.trains, &mut flow, &mut kept);
            }
            layer_kept.push(kept);
        }
        let head = a.malloc(s.head_saved);
        let loss = a.malloc(s.loss_forward);
        a.free(loss);
        flow.flush(&mut a);
        if !s.trains {
            a.free(head);
            a.free(embeddings);
            a.free(input);
            continue;
        }
        // backward
        let buffers = a.malloc(s.loss_buffers);
        let mut grads: Vec<BlockId> = s.head_gradients.iter().map(|&b| a.malloc(b)).collect();
        a.free(head);
        let mut gradient = a.malloc(s.input_gradient);
        a.free(buffers);
        for (i, log) in s.layers.iter().enumerate().rev() {
            let mut recomputed = Vec::new();
            if s.checkpointed.get(i).copied().unwrap_or(false) {
                let mut inner = Transient { pending: None };
                layer_forward(&mut a, log, true, &mut inner, &mut recomputed);
                inner.flush(&mut a);
            }
            let transients: Vec<BlockId> = s.layer_backward.iter().map(|&b| a.malloc(b)).collect();
            if let Some(layer) = s.layer_gradients.get(i) {
                grads.extend(layer.iter().map(|&b| a.malloc(b)));
            }
            for t in transients {
                a.free(t);
            }
            let next = a.malloc(s.input_gradient);
            a.free(gradient);
            gradient = next;
            for t in recomputed {
                a.free(t);
            }
            if let Some(kept) = layer_kept.get_mut(i) {
                for t in kept.drain(..) {
                    a.free(t);
                }
            }
        }
        grads.extend(s.embedding_gradients.iter().map(|&b| a.malloc(b)));
        a.free(gradient);
        a.free(embeddings);
        a.free(input);
        // the optimizer step: state made on the first, then the temporaries
        if !states_made {
            for state in &s.states {
                for &bytes in state {
                    a.malloc(bytes);
                }
            }
            states_made = true;
        }
        let (sizes, kind) = &s.temporaries;
        match kind {
            StepTemporaries::None => {}
            StepTemporaries::AllAtOnce => {
                let temps: Vec<BlockId> = sizes.iter().map(|&b| a.malloc(b)).collect();
                for t in temps {
                    a.free(t);
                }
            }
            StepTemporaries::TwoPerTensor => {
                for &b in sizes {
                    let first = a.malloc(b);
                    let second = a.malloc(b);
                    a.free(first);
                    a.free(second);
                }
            }
        }
        for g in grads {
            a.free(g);
        }
    }
    AllocatorPeaks {
        allocated_bytes: a.peak_allocated(),
        reserved_bytes: a.peak_reserved(),
    }
}
