//! FSDP2's own buffers in the allocator's replay, each on the CUDA stream PyTorch allocates
//! it on, so that the reserve of a rank counts the blocks one stream caches and another
//! cannot take (`CUDACachingAllocator.cpp` keeps each stream's free blocks apart).
//!
//! Derived from torch 2.15's `_fully_shard/_fsdp_collectives.py` and `_fsdp_param_group.py`
//! (no GPU ran it):
//! - an all-gather is made on the all-gather copy-in stream: the shard cast to the gathered
//!   dtype (`_get_param_all_gather_inputs`' flat copy), then the output of the whole unit
//!   (`all_gather_comm.allocate`), the copy freed once copied in;
//! - the copy-out makes the unit's unsharded parameters on the default stream. In forward the
//!   all-gather output lives on (`comm_ctx.all_gather_state`) until the next unit's copy-out
//!   (`release_all_gather_state_for_comm_reuse`), and the root's post-forward releases the
//!   last; in backward it is freed at its copy-out;
//! - in backward each unit prefetches the one before it once its own copy-out is done
//!   (`pre_backward`, `_backward_prefetch`);
//! - `post_backward` reshards the unit (its unsharded parameters freed), frees the previous
//!   unit's reduce-scatter input (`reduce_scatter_max_input_buffers` is 1), makes this one's on
//!   the default stream in `reduce_dtype`, frees the unit's unsharded gradients once copied in,
//!   and makes the reduce-scatter output on the reduce-scatter stream: the sharded gradient,
//!   alive until `zero_grad`. The root's post-backward callback frees the last input.
//!
//! The step's other tensors are the tape's, on the default stream; the sharded parameters and
//! optimizer state are the tape's over the group.

use crate::allocator::{BlockId, CachingAllocator};
use crate::Reshard;

use super::replay::Trained;

/// The default stream: the tape, the copy-out, the reduce-scatter inputs.
const DEFAULT: u8 = 0;
/// `all_gather_copy_in_stream`: the all-gather inputs and outputs.
const ALL_GATHER: u8 = 1;
/// `reduce_scatter_stream`: the reduce-scatter outputs, the sharded gradients.
const REDUCE_SCATTER: u8 = 2;

/// How FSDP2 runs the replayed step: one unit per layer and the root, full fine-tuning
/// without offload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fsdp2Streams {
    /// GPUs each parameter is split over.
    pub group: u64,
    /// Bytes per element of a gathered parameter (`param_dtype`).
    pub gathered_bytes: u64,
    /// Bytes per element of a reduce-scatter (`reduce_dtype`).
    pub reduced_bytes: u64,
    /// Bytes per element of the tape's gradients, which give each unit's elements.
    pub tape_gradient_bytes: u64,
    /// The layers' `reshard_after_forward`.
    pub reshard_after_forward: Reshard,
    /// The loss runs outside the root's forward (its backward before the root's
    /// pre-backward).
    pub loss_outside: bool,
}

impl Fsdp2Streams {
    /// `bytes` of the tape's whole state as one rank's shard.
    pub(crate) const fn shard(&self, bytes: u64) -> u64 {
        bytes.div_ceil(if self.group == 0 { 1 } else { self.group })
    }

    /// The elements of `trained` (the tape's gradients of one unit).
    fn elements(&self, trained: &[Trained]) -> u64 {
        let bytes: u64 = trained.iter().map(|t| t.grad).sum();
        bytes / self.tape_gradient_bytes.max(1)
    }
}

/// One replay's FSDP2 buffers alive, and the sharded gradients.
pub(crate) struct Fsdp2Replay {
    streams: Fsdp2Streams,
    /// Gathered bytes of the root (embeddings, final norm, head), and of each layer.
    root_bytes: u64,
    layer_bytes: Vec<u64>,
    /// The root's unsharded parameters, from its first forward to its post-backward.
    root: Option<BlockId>,
    /// The last forward all-gather output, freed at the next copy-out.
    all_gather_state: Option<BlockId>,
    /// A backward prefetch issued: the layer and its all-gather output.
    prefetched: Option<(usize, BlockId)>,
    /// Each layer's unsharded parameters, or the share it keeps after its forward.
    unsharded: Vec<Option<BlockId>>,
    kept: Vec<Option<BlockId>>,
    /// The last reduce-scatter input.
    reduce_input: Option<BlockId>,
    /// The reduce-scatter outputs: the sharded gradients the optimizer steps.
    pub grad_shards: Vec<BlockId>,
}

impl Fsdp2Replay {
    /// The buffers of a step whose root's gradients are `root` (the head's and the
    /// embeddings', a tied matrix once) and whose layers' are `layers`.
    pub(crate) fn new(
        streams: Fsdp2Streams,
        root: &[&[Trained]],
        layers: impl Iterator<Item = u64>,
    ) -> Self {
        let root_elements: u64 = root.iter().map(|t| streams.elements(t)).sum();
        let layer_bytes: Vec<u64> = layers
            .map(|bytes| {
                (bytes / streams.tape_gradient_bytes.max(1)).saturating_mul(streams.gathered_bytes)
            })
            .collect();
        let n = layer_bytes.len();
        Fsdp2Replay {
            root_bytes: root_elements.saturating_mul(streams.gathered_bytes),
            streams,
            layer_bytes,
            root: None,
            all_gather_state: None,
            prefetched: None,
            unsharded: vec![None; n],
            kept: vec![None; n],
            reduce_input: None,
            grad_shards: Vec::new(),
        }
    }

    /// `bytes` of the tape's whole state as one rank's shard.
    pub(crate) const fn shard(&self, bytes: u64) -> u64 {
        self.streams.shard(bytes)
    }

    /// The loss runs outside the root's forward.
    pub(crate) const fn loss_outside(&self) -> bool {
        self.streams.loss_outside
    }

    /// An all-gather of `bytes` on the copy-in stream: its output.
    fn all_gather(&self, a: &mut CachingAllocator, bytes: u64) -> BlockId {
        let copy_in = a.malloc_on(self.streams.shard(bytes), ALL_GATHER);
        let output = a.malloc_on(bytes, ALL_GATHER);
        a.free(copy_in);
        output
    }

    fn free(a: &mut CachingAllocator, block: Option<BlockId>) {
        if let Some(b) = block {
            a.free(b);
        }
    }

    /// The root's pre-forward: the root gathered.
    pub(crate) fn forward_start(&mut self, a: &mut CachingAllocator) {
        if self.root.is_some() {
            return;
        }
        let output = self.all_gather(a, self.root_bytes);
        self.root = Some(a.malloc_on(self.root_bytes, DEFAULT));
        Self::free(a, self.all_gather_state.replace(output));
    }

    /// Layer `i`'s pre-forward: gathered, the previous all-gather output released.
    pub(crate) fn before_forward(&mut self, a: &mut CachingAllocator, i: usize) {
        let bytes = self.layer_bytes.get(i).copied().unwrap_or(0);
        if self.unsharded.get(i).is_some_and(Option::is_some) {
            return;
        }
        let output = self.all_gather(a, bytes);
        Self::free(a, self.all_gather_state.take());
        let unsharded = a.malloc_on(bytes, DEFAULT);
        if let Some(slot) = self.unsharded.get_mut(i) {
            *slot = Some(unsharded);
        }
        self.all_gather_state = Some(output);
    }

    /// Layer `i`'s post-forward: resharded as `reshard_after_forward` says.
    pub(crate) fn after_forward(&mut self, a: &mut CachingAllocator, i: usize) {
        let bytes = self.layer_bytes.get(i).copied().unwrap_or(0);
        let kept = match self.streams.reshard_after_forward {
            Reshard::Off => return,
            Reshard::On => None,
            Reshard::To(r) => Some(a.malloc_on(bytes.div_ceil(r.max(1)), DEFAULT)),
        };
        if let Some(slot) = self.kept.get_mut(i) {
            *slot = kept;
        }
        Self::free(a, self.unsharded.get_mut(i).and_then(Option::take));
    }

    /// The root's post-forward: the last forward all-gather output released.
    pub(crate) fn forward_end(&mut self, a: &mut CachingAllocator) {
        Self::free(a, self.all_gather_state.take());
    }

    /// The root's pre-backward: the last layer prefetched.
    pub(crate) fn backward_start(&mut self, a: &mut CachingAllocator) {
        self.prefetch(a, self.layer_bytes.len().checked_sub(1));
    }

    fn prefetch(&mut self, a: &mut CachingAllocator, layer: Option<usize>) {
        let Some(i) = layer else { return };
        if self.unsharded.get(i).is_some_and(Option::is_some) {
            return;
        }
        let bytes = self.layer_bytes.get(i).copied().unwrap_or(0);
        let output = self.all_gather(a, bytes);
        self.prefetched = Some((i, output));
    }

    /// Layer `i`'s pre-backward: its copy-out (freeing its all-gather output), then the
    /// layer before it prefetched.
    pub(crate) fn before_backward(&mut self, a: &mut CachingAllocator, i: usize) {
        if self.unsharded.get(i).is_some_and(Option::is_none) {
            let bytes = self.layer_bytes.get(i).copied().unwrap_or(0);
            let output = match self.prefetched.take() {
                Some((j, output)) if j == i => output,
                other => {
                    self.prefetched = other;
                    self.all_gather(a, bytes)
                }
            };
            let unsharded = a.malloc_on(bytes, DEFAULT);
            a.free(output);
            if let Some(slot) = self.unsharded.get_mut(i) {
                *slot = Some(unsharded);
            }
            Self::free(a, self.kept.get_mut(i).and_then(Option::take));
        }
        self.prefetch(a, i.checked_sub(1));
    }

    /// A unit's post-backward: resharded, then its `gradients` (of `bytes` in the gathered
    /// dtype) reduce-scattered; `keep` keeps the sharded gradient (else it is added into
    /// the one kept, as accumulation does).
    fn reduce(
        &mut self,
        a: &mut CachingAllocator,
        bytes: u64,
        gradients: impl Iterator<Item = BlockId>,
        keep: bool,
    ) {
        Self::free(a, self.reduce_input.take());
        let elements = bytes / self.streams.gathered_bytes.max(1);
        let input_bytes = elements.saturating_mul(self.streams.reduced_bytes);
        let input = a.malloc_on(input_bytes, DEFAULT);
        for g in gradients {
            a.free(g);
        }
        let output = a.malloc_on(self.streams.shard(input_bytes), REDUCE_SCATTER);
        if keep {
            self.grad_shards.push(output);
        } else {
            a.free(output);
        }
        self.reduce_input = Some(input);
    }

    /// Layer `i`'s post-backward, its `gradients` made by its backward.
    pub(crate) fn after_backward(
        &mut self,
        a: &mut CachingAllocator,
        i: usize,
        gradients: impl Iterator<Item = BlockId>,
        keep: bool,
    ) {
        Self::free(a, self.unsharded.get_mut(i).and_then(Option::take));
        let bytes = self.layer_bytes.get(i).copied().unwrap_or(0);
        self.reduce(a, bytes, gradients, keep);
    }

    /// The root's post-backward and the final callback: the root resharded, its
    /// `gradients` reduce-scattered, the last reduce-scatter input freed.
    pub(crate) fn backward_end(
        &mut self,
        a: &mut CachingAllocator,
        gradients: impl Iterator<Item = BlockId>,
        keep: bool,
    ) {
        Self::free(a, self.root.take());
        self.reduce(a, self.root_bytes, gradients, keep);
        Self::free(a, self.reduce_input.take());
        Self::free(a, self.prefetched.take().map(|(_, b)| b));
    }
}
