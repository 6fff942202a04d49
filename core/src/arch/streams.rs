//! A sharded engine's own buffers in the allocator's replay, each on the CUDA stream PyTorch
//! allocates it on, so that the reserve of a rank counts the blocks one stream caches and
//! another cannot take (`CUDACachingAllocator.cpp` keeps each stream's free blocks apart,
//! and a block another stream still uses returns to its pool only once that stream is past
//! it).
//!
//! Derived from torch 2.15's sources (no GPU ran it; `validation/DISTRIBUTED.md`, "The
//! engines' streams").
//!
//! FSDP2 (`_fully_shard/_fsdp_collectives.py`, `_fsdp_param_group.py`):
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
//! FSDP1 (`fsdp/_runtime_utils.py`, `_flat_param.py`):
//! - `_unshard` makes the low-precision shard on the pre-unshard stream (mixed precision), then
//!   the padded unsharded flat parameter on the unshard stream, where it is gathered; the
//!   default stream computes with it;
//! - `_reshard` frees it after `_no_dispatch_record_stream` for the default stream: the block
//!   waits for that stream. With `limit_all_gathers` (accelerate's default) each reshard
//!   records a free event and each unshard first waits on the oldest when two are queued,
//!   so a unit's block comes back two unshards later;
//! - `_post_backward_hook` runs on the post-backward stream: the gradient cast to
//!   `reduce_dtype` (when it differs) and the sharded gradient (`empty_like(chunks[0])`) are
//!   made there, and autograd's gradient, `record_stream`ed for it, waits for it (here: until
//!   the next unit's reduction).
//!
//! DeepSpeed ZeRO (0.19.8's `zero/stage_1_and_2.py`, `zero/stage3.py`,
//! `zero/partition_parameters.py`; `validation/DEEPSPEED.md`):
//! - stages 1 and 2 keep the 16-bit parameters whole and run on the default stream
//!   (`overlap_comm` is off for them by default). The reduction bucket of
//!   `reduce_bucket_size` elements is made at the first gradient hook (`setup_buckets`) and
//!   freed at the backward's epilogue (`_release_ipg_buffers`). Each gradient is copied into
//!   it and freed, and each full bucket is flattened (`allreduce_bucket`: a copy) to be
//!   reduced. At the first reduction the rank's gradient partition is made
//!   (`copy_grads_in_partition`), alive until the step. Stage 2 reduces as the gradients
//!   come; stage 1 keeps them whole until the backward ends and then reduces them all;
//! - the step flattens the partition's gradients (a 16-bit copy), casts them to fp32,
//!   frees the copy and the partition, steps, and frees the fp32 gradients (per sub-group of
//!   at most `sub_group_size` elements in stage 3);
//! - stage 3 makes its bucket and its 16-bit gradient partition at start-up, for good. Each
//!   module is gathered on the all-gather stream and freed with `record_stream` for the
//!   default stream (`free_param`), except what the backward reuses within
//!   `max_reuse_distance` of the forward's end; the embeddings for their forward and
//!   again for their backward, the final norm and head from the last layer's forward to
//!   their backward. A full bucket is reduced on the reduce
//!   stream (`overlap_comm` is on): `reduce_scatter_coalesced` concatenates it (a copy)
//!   and its output is this rank's share;
//! - ZeRO-Offload (`offload_optimizer`) keeps the fp32 master, the moments and the fp32
//!   gradient partition in host RAM and steps on the CPU: no gradient partition on the GPU
//!   (stage 3's 16-bit one is pinned host memory) and no step buffers; stage 3's
//!   `offload_param` moves the parameters' partitions there too. (The GPU's staging buffer
//!   of stages 1 and 2, one largest tensor, is left out.)
//!
//! The step's other tensors are the tape's, on the default stream; the sharded parameters and
//! optimizer state are the tape's over the group.

use crate::allocator::{BlockId, CachingAllocator};
use crate::Reshard;

/// The default stream: the tape; FSDP2's copy-out and reduce-scatter inputs.
const DEFAULT: u8 = 0;
/// FSDP2's `all_gather_copy_in_stream`; FSDP1's unshard stream.
const GATHER: u8 = 1;
/// FSDP2's `reduce_scatter_stream`; FSDP1's post-backward stream: the sharded gradients.
const REDUCE: u8 = 2;
/// FSDP1's pre-unshard stream: the low-precision shards.
const PRE_UNSHARD: u8 = 3;

/// Which engine shards the step, and how it wraps the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShardedEngine {
    /// FSDP2 (`fully_shard` on each layer and on the root).
    Fsdp2,
    /// FSDP1 (`FullyShardedDataParallel`) with `limit_all_gathers`: each layer its unit
    /// (`transformer_based_wrap`), or the whole model one unit (accelerate's `NO_WRAP`).
    Fsdp1 {
        /// The whole model is one unit, the root.
        whole_model: bool,
    },
    /// DeepSpeed ZeRO; ZeRO-Offload when the streams are `offloaded` (the optimizer state,
    /// the fp32 gradients and the step on the CPU).
    Zero {
        /// The stage: 1 and 2 keep the parameters whole, 3 gathers each module.
        stage: u8,
        /// `reduce_bucket_size` (elements).
        bucket_elements: u64,
        /// ZeRO-3's `offload_param`: the parameters' partitions in host RAM too.
        parameters_offloaded: bool,
        /// Stages 1 and 2 training every parameter: the elements of the whole tensors the
        /// rank's partition touches, whose gradients it keeps (`None`: its share).
        partition_elements: Option<u64>,
    },
}

/// DeepSpeed's `max_reuse_distance` default (elements): at the turn from forward to
/// backward, ZeRO-3 keeps the parameters gathered that the backward reuses within it.
pub(crate) const DEEPSPEED_MAX_REUSE_ELEMENTS: u64 = 1_000_000_000;
/// DeepSpeed's `sub_group_size` default (elements): ZeRO-3's optimizer steps its partition
/// in sub-groups of at most this, each with its fp32 gradient.
pub(crate) const DEEPSPEED_SUB_GROUP_ELEMENTS: u64 = 1_000_000_000;

/// How a sharded engine runs the replayed step: full fine-tuning or LoRA (on a 4-bit base,
/// its layers gathered in their packed storage), with or without CPU offload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShardedStreams {
    /// The engine.
    pub engine: ShardedEngine,
    /// GPUs each parameter is split over.
    pub group: u64,
    /// Bytes per element of a gathered parameter (`param_dtype`).
    pub gathered_bytes: u64,
    /// Bytes per element of a reduction (`reduce_dtype`).
    pub reduced_bytes: u64,
    /// Bytes per element of a sharded parameter and of its gradient.
    pub sharded_bytes: u64,
    /// Bytes per element of the tape's gradients, which give the elements reduced.
    pub tape_gradient_bytes: u64,
    /// The layers' resharding after forward (FSDP1: `FULL_SHARD` reshards,
    /// `SHARD_GRAD_OP` keeps them).
    pub reshard_after_forward: Reshard,
    /// The loss runs outside the root's forward (its backward before the root's
    /// pre-backward).
    pub loss_outside: bool,
    /// The next unit is gathered before this one's gradients are computed (FSDP2 always,
    /// FSDP1 with `BACKWARD_PRE`).
    pub backward_prefetch: bool,
    /// The shards and the optimizer state live in host RAM and the CPU steps them. FSDP1's
    /// `CPUOffload(offload_params=True)`: each unshard copies the unit's shard in on the
    /// pre-unshard stream (`FlatParamHandle.pre_unshard`: `flat_param_to(device)`), which
    /// the all-gather reads (`_all_gather_flat_param` records it for the unshard stream and
    /// drops it). FSDP2's `CPUOffloadPolicy`: the shards are copied in on the all-gather
    /// copy-in stream, and each sharded gradient copied out and dropped.
    pub offloaded: bool,
}

impl ShardedStreams {
    /// `bytes` of the tape's whole state as one rank's shard.
    pub(crate) const fn shard(&self, bytes: u64) -> u64 {
        bytes.div_ceil(if self.group == 0 { 1 } else { self.group })
    }

    /// The elements whose tape gradients are `bytes`.
    const fn gradient_elements(&self, bytes: u64) -> u64 {
        bytes
            / if self.tape_gradient_bytes == 0 {
                1
            } else {
                self.tape_gradient_bytes
            }
    }

    /// Gathered blocks are handed to the default stream with `record_stream` (FSDP1's
    /// `_reshard`, ZeRO-3's `free_param`), not freed on it.
    const fn recorded(&self) -> bool {
        !matches!(self.engine, ShardedEngine::Fsdp2)
    }

    /// DeepSpeed's stage and bucket (bytes), or `None` for FSDP.
    const fn zero(&self) -> Option<(u8, u64)> {
        match self.engine {
            ShardedEngine::Zero {
                stage,
                bucket_elements,
                ..
            } => Some((
                stage,
                bucket_elements.saturating_mul(self.tape_gradient_bytes),
            )),
            _ => None,
        }
    }

    const fn whole_model(&self) -> bool {
        matches!(self.engine, ShardedEngine::Fsdp1 { whole_model: true })
    }
}

/// One replay's engine buffers alive, and the sharded gradients.
pub(crate) struct ShardedReplay {
    streams: ShardedStreams,
    /// Gathered bytes of the root (embeddings, final norm, head; FSDP1's `NO_WRAP`: the
    /// whole model; ZeRO-3: the embeddings), and of each layer (0 for a layer in the root).
    root_bytes: u64,
    layer_bytes: Vec<u64>,
    /// The root's unsharded parameters, from its first forward to its post-backward
    /// (ZeRO-3: the embeddings', through their forward and again for their backward).
    root: Option<BlockId>,
    /// ZeRO-3's final norm and head, gathered bytes (0 for FSDP, whose root holds them),
    /// and their parameters, gathered after the last layer's forward and released after
    /// their backward.
    head_bytes: u64,
    head: Option<BlockId>,
    /// FSDP2: the last forward all-gather output, freed at the next copy-out.
    all_gather_state: Option<BlockId>,
    /// A backward prefetch issued: the layer, and FSDP2's all-gather output (FSDP1 gathers
    /// into the unsharded parameters themselves).
    prefetched: Option<(usize, Option<BlockId>)>,
    /// Each layer's unsharded parameters, or the share it keeps after its forward.
    unsharded: Vec<Option<BlockId>>,
    kept: Vec<Option<BlockId>>,
    /// FSDP2: the last reduce-scatter input.
    reduce_input: Option<BlockId>,
    /// FSDP1: resharded blocks whose free events are queued (`_free_event_queue`), oldest
    /// first; and autograd's gradients the post-backward stream still reads.
    freed: Vec<BlockId>,
    reading: Vec<BlockId>,
    /// The reductions' outputs: the sharded gradients the optimizer steps.
    grad_shards: Vec<BlockId>,
    /// ZeRO: the tape's gradients of one pass (bytes), the bucket and how full it is, the
    /// gradient partition of stages 1 and 2, and the step's fp32 gradients.
    gradient_bytes: u64,
    bucket: Option<BlockId>,
    filled: u64,
    partition: Option<BlockId>,
    fp32_gradients: Option<BlockId>,
    /// ZeRO-3: the first layer the backward reuses within `max_reuse_distance` of the
    /// forward's end (it and the layers after it stay gathered).
    reused_from: usize,
}

impl ShardedReplay {
    /// The buffers of a step whose root (embeddings, final norm, head) has `root`
    /// parameters, `(embeddings, head)` of them the embeddings' and the final norm's and
    /// head's (a tied matrix in both), whose layers have `layers` (elements each), and whose
    /// passes make `gradient_bytes` of the tape's gradients.
    pub(crate) fn new(
        streams: ShardedStreams,
        root: u64,
        (embeddings, head): (u64, u64),
        layers: impl Iterator<Item = u64>,
        gradient_bytes: u64,
    ) -> Self {
        // (ZeRO's stages 1 and 2 gather nothing; ZeRO-3 gathers each module as it runs:
        // the embeddings apart from the final norm and head)
        let gathers = !matches!(streams.zero(), Some((1 | 2, _)));
        let gathered_bytes = if gathers { streams.gathered_bytes } else { 0 };
        let (root, head) = match streams.zero() {
            Some((3, _)) => (embeddings, head),
            _ => (root, 0),
        };
        let root_bytes = root.saturating_mul(gathered_bytes);
        let mut layer_bytes: Vec<u64> = layers.map(|e| e.saturating_mul(gathered_bytes)).collect();
        let root_bytes = if streams.whole_model() {
            let layers: u64 = layer_bytes.iter().sum();
            layer_bytes.iter_mut().for_each(|b| *b = 0);
            root_bytes.saturating_add(layers)
        } else {
            root_bytes
        };
        let n = layer_bytes.len();
        let mut reused_from = n;
        if streams.zero().is_some() {
            let mut reused = 0u64;
            while let Some(&b) = reused_from.checked_sub(1).and_then(|i| layer_bytes.get(i)) {
                reused = reused.saturating_add(b / gathered_bytes.max(1));
                if reused > DEEPSPEED_MAX_REUSE_ELEMENTS {
                    break;
                }
                reused_from -= 1;
            }
        }
        ShardedReplay {
            streams,
            root_bytes,
            layer_bytes,
            root: None,
            head_bytes: head.saturating_mul(gathered_bytes),
            head: None,
            all_gather_state: None,
            prefetched: None,
            unsharded: vec![None; n],
            kept: vec![None; n],
            reduce_input: None,
            freed: Vec::new(),
            reading: Vec::new(),
            grad_shards: Vec::new(),
            gradient_bytes,
            bucket: None,
            filled: 0,
            partition: None,
            fp32_gradients: None,
            reused_from,
        }
    }

    /// The share of `bytes` of the tape's persistent state (a `parameter`, optimizer
    /// state, the step's temporaries) the GPU holds: none offloaded, a parameter whole under
    /// ZeRO's stages 1 and 2 (ZeRO-Offload moves only the optimizer, and ZeRO-3's
    /// `offload_param` the parameters).
    pub(crate) const fn resident_shard(&self, bytes: u64, parameter: bool) -> u64 {
        let on_host = match (self.streams.engine, parameter) {
            (ShardedEngine::Zero { stage: 1 | 2, .. }, true) => return bytes,
            (
                ShardedEngine::Zero {
                    parameters_offloaded,
                    ..
                },
                true,
            ) => parameters_offloaded,
            _ => self.streams.offloaded,
        };
        if on_host {
            0
        } else {
            self.streams.shard(bytes)
        }
    }

    /// What the engine makes at start-up beside the state: ZeRO-3's bucket and (its
    /// optimizer on the GPU) its gradient partition, for good.
    pub(crate) fn start(&mut self, a: &mut CachingAllocator) {
        if let Some((3, bucket)) = self.streams.zero() {
            a.malloc(bucket);
            if !self.streams.offloaded {
                a.malloc(self.streams.shard(self.gradient_bytes));
            }
        }
    }

    /// The whole model is one unit (FSDP1's `NO_WRAP`): the layers reduce nothing of their
    /// own.
    pub(crate) const fn whole_model(&self) -> bool {
        self.streams.whole_model()
    }

    /// The loss runs outside the root's forward.
    pub(crate) const fn loss_outside(&self) -> bool {
        self.streams.loss_outside
    }

    fn layer(&self, i: usize) -> u64 {
        self.layer_bytes.get(i).copied().unwrap_or(0)
    }

    fn free(a: &mut CachingAllocator, block: Option<BlockId>) {
        if let Some(b) = block {
            a.free(b);
        }
    }

    /// FSDP2's all-gather of `bytes` on the copy-in stream: its output. Offloaded, each
    /// shard is first copied in from the host in its own dtype (`FSDPParam.all_gather_inputs`:
    /// `.to(device)`), on the same stream.
    fn all_gather(&self, a: &mut CachingAllocator, bytes: u64) -> BlockId {
        let s = &self.streams;
        let staged = s.offloaded.then(|| {
            let shard = s.shard(bytes) / s.gathered_bytes.max(1) * s.sharded_bytes;
            a.malloc_on(shard, GATHER)
        });
        let copy_in = a.malloc_on(s.shard(bytes), GATHER);
        let output = a.malloc_on(bytes, GATHER);
        Self::free(a, staged);
        a.free(copy_in);
        output
    }

    /// FSDP1's `_unshard` of `bytes`: the rate limiter, then the unsharded flat parameter on
    /// the unshard stream (its low-precision shard made and freed on the pre-unshard stream).
    fn unshard(&mut self, a: &mut CachingAllocator, bytes: u64) -> BlockId {
        if self.freed.len() >= 2 {
            a.release(self.freed.remove(0));
        }
        // (FSDP1: a mixed recipe's low-precision shard, or offloaded, the shard copied in;
        // ZeRO-3 gathers its 16-bit partitions, copied in when offloaded)
        let staged = match self.streams.engine {
            ShardedEngine::Zero {
                parameters_offloaded,
                ..
            } => parameters_offloaded,
            _ => self.streams.gathered_bytes < self.streams.sharded_bytes || self.streams.offloaded,
        };
        let shard = staged.then(|| a.malloc_on(self.streams.shard(bytes), PRE_UNSHARD));
        let unsharded = a.malloc_on(bytes, GATHER);
        Self::free(a, shard);
        unsharded
    }

    /// Resharding `block`: FSDP1's waits for the default stream and its free event, FSDP2's
    /// is freed.
    fn reshard(&mut self, a: &mut CachingAllocator, block: Option<BlockId>) {
        let Some(b) = block else { return };
        if self.streams.recorded() {
            a.free_in_use(b);
            self.freed.push(b);
        } else {
            a.free(b);
        }
    }

    /// The root's pre-forward: the root gathered.
    pub(crate) fn forward_start(&mut self, a: &mut CachingAllocator) {
        if self.root.is_some() || self.root_bytes == 0 {
            return;
        }
        if self.streams.recorded() {
            self.root = Some(self.unshard(a, self.root_bytes));
            return;
        }
        let output = self.all_gather(a, self.root_bytes);
        self.root = Some(a.malloc_on(self.root_bytes, DEFAULT));
        Self::free(a, self.all_gather_state.replace(output));
    }

    /// Layer `i`'s pre-forward: gathered (FSDP2: the previous all-gather output released).
    pub(crate) fn before_forward(&mut self, a: &mut CachingAllocator, i: usize) {
        if i == 0 && self.head_bytes > 0 {
            // (ZeRO-3: the embeddings' forward is done)
            let embeddings = self.root.take();
            self.reshard(a, embeddings);
        }
        let bytes = self.layer(i);
        if bytes == 0 || self.unsharded.get(i).is_some_and(Option::is_some) {
            return;
        }
        let unsharded = if self.streams.recorded() {
            self.unshard(a, bytes)
        } else {
            let output = self.all_gather(a, bytes);
            Self::free(a, self.all_gather_state.take());
            self.all_gather_state = Some(output);
            a.malloc_on(bytes, DEFAULT)
        };
        if let Some(slot) = self.unsharded.get_mut(i) {
            *slot = Some(unsharded);
        }
    }

    /// Layer `i`'s post-forward: resharded as `reshard_after_forward` says (ZeRO-3: unless
    /// the backward reuses it soon).
    pub(crate) fn after_forward(&mut self, a: &mut CachingAllocator, i: usize) {
        if i + 1 == self.layer_bytes.len() && self.head_bytes > 0 && self.head.is_none() {
            // (ZeRO-3: the final norm and head, before they run)
            self.head = Some(self.unshard(a, self.head_bytes));
        }
        let bytes = self.layer(i);
        if bytes == 0 || i >= self.reused_from {
            return;
        }
        let kept = match self.streams.reshard_after_forward {
            Reshard::Off => return,
            Reshard::On => None,
            Reshard::To(r) => Some(a.malloc_on(bytes.div_ceil(r.max(1)), DEFAULT)),
        };
        if let Some(slot) = self.kept.get_mut(i) {
            *slot = kept;
        }
        let unsharded = self.unsharded.get_mut(i).and_then(Option::take);
        self.reshard(a, unsharded);
    }

    /// The root's post-forward: FSDP2's last forward all-gather output released.
    pub(crate) fn forward_end(&mut self, a: &mut CachingAllocator) {
        Self::free(a, self.all_gather_state.take());
    }

    /// The root's pre-backward: the last layer prefetched.
    pub(crate) fn backward_start(&mut self, a: &mut CachingAllocator) {
        if self.streams.backward_prefetch {
            self.prefetch(a, self.layer_bytes.len().checked_sub(1));
        }
    }

    fn prefetch(&mut self, a: &mut CachingAllocator, layer: Option<usize>) {
        let Some(i) = layer else { return };
        let bytes = self.layer(i);
        if bytes == 0 || self.unsharded.get(i).is_some_and(Option::is_some) {
            return;
        }
        if self.streams.recorded() {
            let unsharded = self.unshard(a, bytes);
            if let Some(slot) = self.unsharded.get_mut(i) {
                *slot = Some(unsharded);
            }
            self.prefetched = Some((i, None));
        } else {
            let output = self.all_gather(a, bytes);
            self.prefetched = Some((i, Some(output)));
        }
    }

    /// Layer `i`'s pre-backward: gathered (FSDP2: its copy-out, freeing its all-gather
    /// output), then the layer before it prefetched.
    pub(crate) fn before_backward(&mut self, a: &mut CachingAllocator, i: usize) {
        if i + 1 == self.layer_bytes.len() {
            // (ZeRO-3: the head's backward is done)
            let head = self.head.take();
            self.reshard(a, head);
        }
        let bytes = self.layer(i);
        if bytes > 0 && self.unsharded.get(i).is_some_and(Option::is_none) {
            let unsharded = if self.streams.recorded() {
                self.unshard(a, bytes)
            } else {
                let output = match self.prefetched.take() {
                    Some((j, Some(output))) if j == i => output,
                    other => {
                        self.prefetched = other;
                        self.all_gather(a, bytes)
                    }
                };
                let unsharded = a.malloc_on(bytes, DEFAULT);
                a.free(output);
                unsharded
            };
            if let Some(slot) = self.unsharded.get_mut(i) {
                *slot = Some(unsharded);
            }
            Self::free(a, self.kept.get_mut(i).and_then(Option::take));
        }
        if self.streams.backward_prefetch {
            self.prefetch(a, i.checked_sub(1));
        }
    }

    /// A unit's post-backward reduction of its `gradients` (autograd's, `bytes` of the
    /// tape's: its trained parameters' only); `keep` keeps the sharded gradient (else it is
    /// added into the one kept, as accumulation does).
    fn reduce(&mut self, a: &mut CachingAllocator, bytes: u64, gradients: &[BlockId], keep: bool) {
        let s = self.streams;
        if gradients.is_empty() {
            return;
        }
        let elements = s.gradient_elements(bytes);
        let reduced = elements.saturating_mul(s.reduced_bytes);
        let output = if s.recorded() {
            for g in self.reading.drain(..) {
                a.release(g);
            }
            // autograd's gradient is in the gathered dtype: cast to `reduce_dtype` when it
            // differs
            let cast = (s.gathered_bytes != s.reduced_bytes).then(|| a.malloc_on(reduced, REDUCE));
            for &g in gradients {
                a.free_in_use(g);
                self.reading.push(g);
            }
            let output = a.malloc_on(s.shard(reduced), REDUCE);
            Self::free(a, cast);
            output
        } else {
            Self::free(a, self.reduce_input.take());
            let input = a.malloc_on(reduced, DEFAULT);
            for &g in gradients {
                a.free(g);
            }
            self.reduce_input = Some(input);
            a.malloc_on(s.shard(reduced), REDUCE)
        };
        // the sharded gradient in the sharded parameter's dtype (FSDP1's
        // `_cast_grad_to_param_dtype`, FSDP2's `_to_dtype_if_needed`), on the same stream
        let output = if s.sharded_bytes == s.reduced_bytes {
            output
        } else {
            let cast = a.malloc_on(s.shard(elements.saturating_mul(s.sharded_bytes)), REDUCE);
            a.free(output);
            cast
        };
        // (FSDP2 offloaded copies it to the host and drops it: `foreach_reduce`)
        let kept_on_gpu = s.recorded() || !s.offloaded;
        if keep && kept_on_gpu {
            self.grad_shards.push(output);
        } else {
            a.free(output);
        }
    }

    /// ZeRO's gradient hooks for the gradients just made, `gradients[from..]` (`bytes` of
    /// the tape's): the bucket made at the first (stages 1 and 2); from stage 2 on, each
    /// copied into it and freed, a full bucket reduced first. (FSDP reduces per unit.)
    pub(crate) fn gradient_hooks(
        &mut self,
        a: &mut CachingAllocator,
        bytes: u64,
        gradients: &mut Vec<BlockId>,
        from: usize,
    ) {
        let Some((stage, bucket)) = self.streams.zero() else {
            return;
        };
        if stage < 3 && self.bucket.is_none() {
            self.bucket = Some(a.malloc(bucket));
        }
        if stage > 1 {
            for g in gradients.drain(from.min(gradients.len())..) {
                a.free(g);
            }
            self.fill(a, bytes);
        }
    }

    /// `bytes` of gradients copied into ZeRO's bucket, a bucket they overflow reduced first.
    fn fill(&mut self, a: &mut CachingAllocator, bytes: u64) {
        let Some((_, bucket)) = self.streams.zero() else {
            return;
        };
        if self.filled.saturating_add(bytes) > bucket {
            self.reduce_bucket(a);
        }
        self.filled = self.filled.saturating_add(bytes).min(bucket);
    }

    /// ZeRO's bucket reduced: flattened (stage 3: concatenated and reduce-scattered on the
    /// reduce stream), and its share copied into the rank's gradient partition, made at the
    /// first reduction in stages 1 and 2.
    fn reduce_bucket(&mut self, a: &mut CachingAllocator) {
        let Some((stage, _)) = self.streams.zero() else {
            return;
        };
        if self.filled == 0 {
            return;
        }
        let stream = if stage == 3 { REDUCE } else { DEFAULT };
        let copy = a.malloc_on(self.filled, stream);
        let output = (stage == 3).then(|| a.malloc_on(self.streams.shard(self.filled), REDUCE));
        Self::free(a, output);
        a.free(copy);
        // (offloaded, the share goes to the host's fp32 gradients)
        if stage < 3 && self.partition.is_none() && !self.streams.offloaded {
            let share = self.streams.shard(self.gradient_bytes);
            let bytes = match self.streams.engine {
                ShardedEngine::Zero {
                    partition_elements: Some(e),
                    ..
                } => e
                    .saturating_mul(self.streams.tape_gradient_bytes)
                    .min(self.gradient_bytes)
                    .max(share),
                _ => share,
            };
            self.partition = Some(a.malloc(bytes));
        }
        self.filled = 0;
    }

    /// Layer `i`'s post-backward: resharded, and its gradients, `gradients[from..]` (`bytes`
    /// of the tape's), reduced (a layer of FSDP1's whole-model unit leaves them to the
    /// root's; ZeRO's go through its hooks).
    pub(crate) fn after_backward(
        &mut self,
        a: &mut CachingAllocator,
        i: usize,
        bytes: u64,
        gradients: &mut Vec<BlockId>,
        from: usize,
        keep: bool,
    ) {
        // (a no-op for FSDP)
        self.gradient_hooks(a, bytes, gradients, from);
        if self.layer(i) == 0 {
            return;
        }
        let unsharded = self.unsharded.get_mut(i).and_then(Option::take);
        self.reshard(a, unsharded);
        if self.streams.zero().is_some() {
            return;
        }
        let from = from.min(gradients.len());
        self.reduce(a, bytes, &gradients[from..], keep);
        gradients.truncate(from);
    }

    /// The root's post-backward and the final callback: the root resharded, the gradients
    /// left, `gradients` (`bytes` of the tape's: FSDP1's whole-model unit's are all of
    /// them), reduced, and whatever waited on another stream released. ZeRO's epilogue:
    /// stage 1 reduces every gradient, the last bucket is reduced, and stages 1 and 2 free
    /// their bucket.
    pub(crate) fn backward_end(
        &mut self,
        a: &mut CachingAllocator,
        bytes: u64,
        gradients: &mut Vec<BlockId>,
        keep: bool,
    ) {
        let root = self.root.take();
        self.reshard(a, root);
        if self.head_bytes > 0 {
            // (ZeRO-3: the embeddings gathered again for their backward)
            let head = self.head.take();
            self.reshard(a, head);
            let embeddings = (self.root_bytes > 0).then(|| self.unshard(a, self.root_bytes));
            self.reshard(a, embeddings);
        }
        if self.streams.zero().is_some() {
            for g in gradients.drain(..) {
                a.free(g);
            }
            if matches!(self.streams.zero(), Some((1, _))) {
                self.fill(a, self.gradient_bytes);
            }
            self.reduce_bucket(a);
            Self::free(a, self.bucket.take());
        } else {
            self.reduce(a, bytes, gradients, keep);
        }
        gradients.clear();
        Self::free(a, self.reduce_input.take());
        if let Some((i, output)) = self.prefetched.take() {
            Self::free(a, output);
            let unsharded = self.unsharded.get_mut(i).and_then(Option::take);
            self.reshard(a, unsharded);
        }
        for b in self.freed.drain(..).chain(self.reading.drain(..)) {
            a.release(b);
        }
    }

    /// Before the optimizer's step: ZeRO flattens the partition's gradients (a 16-bit
    /// copy; stage 3 one sub-group at a time), casts them to fp32, and frees the copy and
    /// the partition.
    pub(crate) fn step_start(&mut self, a: &mut CachingAllocator) {
        let Some((stage, _)) = self.streams.zero() else {
            return;
        };
        if self.streams.offloaded {
            return;
        }
        let g = self.streams.tape_gradient_bytes.max(1);
        let mut elements = self.streams.shard(self.gradient_bytes) / g;
        if stage == 3 {
            elements = elements.min(DEEPSPEED_SUB_GROUP_ELEMENTS);
        }
        let flat = a.malloc(elements.saturating_mul(g));
        self.fp32_gradients = Some(a.malloc(elements.saturating_mul(4)));
        a.free(flat);
        Self::free(a, self.partition.take());
    }

    /// After the optimizer's step: the sharded gradients (ZeRO's fp32 ones) freed.
    pub(crate) fn step_end(&mut self, a: &mut CachingAllocator) {
        Self::free(a, self.fp32_gradients.take());
        for g in self.grad_shards.drain(..) {
            a.free(g);
        }
    }
}
