//! One GPU's share of a data-parallel step: PyTorch's FSDP2 as it allocates, phase by
//! phase, on top of the rank's tape (which tensor and context parallelism already split).

use crate::state::PlanInputs;
use crate::{
    BackwardMoment, CategoryBytes, Mesh, Offload, ParameterUnits, PeakEstimate, Phase,
    PrecisionRecipe, Reshard, ShardedState, TpPlan,
};

/// The mesh the op kinds see for `plan`: tensor parallelism (with sequence and loss
/// parallelism when it is on) and context parallelism.
pub(crate) fn mesh_of(plan: &PlanInputs) -> Mesh {
    let tensor = plan.tensor_parallel.max(1);
    Mesh {
        tensor,
        sequence_parallel: tensor > 1 && plan.sequence_parallel,
        // Megatron's loss is vocabulary-parallel whatever the switch says
        loss_parallel: tensor > 1 && (plan.loss_parallel || plan.tp_plan == TpPlan::Megatron),
        context: plan.context_parallel.max(1),
        plan: plan.tp_plan,
        stage: None,
    }
}

/// Whether the tape accumulates gradients over micro-batches: only then are gradients alive
/// in its forward.
fn accumulates(estimate: &PeakEstimate) -> bool {
    estimate
        .phase_peaks
        .iter()
        .any(|(p, c)| *p == Phase::Forward && c.gradients > 0)
}

/// `bytes * numerator / denominator`, without overflow on the way (the denominator taken
/// as at least 1): a share of a tape's bytes.
pub(crate) fn scale(bytes: u64, numerator: u64, denominator: u64) -> u64 {
    u64::try_from(crate::plan::mul_div(bytes, numerator, denominator.max(1))).unwrap_or(u64::MAX)
}

/// One FSDP2 rank: `fully_shard` on every layer and on the root, each parameter split on
/// its first dimension over the group (rank 0 holding the larger share of an uneven split).
/// What it holds beyond the tape was measured with PyTorch's own FSDP2 on a fake process
/// group (`validation/DISTRIBUTED.md`).
pub(crate) struct Fsdp2Rank {
    /// The sharded parameters, gradients and optimizer states.
    pub state: ShardedState,
    /// The root unit (embeddings, final norm, head) gathered: from its first forward to
    /// the end of backward (the root never reshards after forward). With the embeddings
    /// and the head as their own units (torchtune's `custom_sharded_layers`), the larger of
    /// them, which the loss and the end of backward hold gathered.
    root: u64,
    /// The largest layer gathered.
    layer: u64,
    /// Every layer gathered.
    layers: u64,
    /// What every layer keeps from its forward to its backward: nothing, all of it
    /// (`reshard_after_forward=False`) or its share of a smaller group (an int).
    kept: u64,
    /// One layer's gradients before their reduce-scatter: unsharded, then copied into the
    /// reduce-scatter input (in `reduce_dtype`).
    reduce: u64,
    /// The root's gradients on their way to its reduce-scatter, at the end of backward.
    root_reduce: u64,
    /// Bytes per element of a gathered parameter and of the tape's gradients: the root's
    /// unsharded gradients are the tape's, in the gathered dtype.
    gathered: u64,
    tape_gradient: u64,
    /// The tape's gradients, all of them.
    tape_gradients: u64,
    reshard_after_forward: Reshard,
    /// The loss is computed outside the model's forward (and so outside the root unit).
    loss_outside: bool,
    /// `CPUOffloadPolicy`: the shards live in host RAM and the CPU steps them.
    offloaded: bool,
    /// Gradient accumulation: each micro-batch's reduce-scatter adds into the sharded
    /// gradients, which then live through the later micro-batches' forward and backward.
    accumulating: bool,
    /// Host RAM the offloaded shards take.
    pub host_bytes: u64,
    group: u64,
    /// [`Fsdp2Settings::own_units`].
    own_units: bool,
}

/// How FSDP2 wraps and runs the model, beside the tape and its units.
pub(crate) struct Fsdp2Settings {
    /// `reshard_after_forward` of the layers.
    pub reshard_after_forward: Reshard,
    /// The loss is computed outside the model's forward (and so outside the root unit).
    pub loss_outside: bool,
    /// `CPUOffloadPolicy`.
    pub offloaded: bool,
    /// The elements held gathered as the root: the root unit's, or with the embeddings
    /// and the head as their own units (torchtune's `custom_sharded_layers`) the larger.
    pub root_gathered: u64,
    /// The embeddings and the head are their own units: after the head's backward they
    /// reshard and reduce its gradient, so the layers' backward holds neither.
    pub own_units: bool,
}

impl Fsdp2Rank {
    /// The rank of a group of `group` GPUs for the tape `estimate` (one tensor-parallel
    /// rank's whole step) whose parameters are `units`, in the precision `recipe` names:
    /// the mixed recipes are FSDP2's `MixedPrecisionPolicy(param_dtype=bf16,
    /// reduce_dtype=fp32)` on fp32 parameters; the others keep the parameters' dtype.
    pub(crate) fn new(
        estimate: &PeakEstimate,
        units: &ParameterUnits,
        recipe: PrecisionRecipe,
        group: u64,
        settings: &Fsdp2Settings,
    ) -> Self {
        let &Fsdp2Settings {
            reshard_after_forward,
            loss_outside,
            offloaded,
            root_gathered,
            own_units,
        } = settings;
        let group = group.max(1);
        // bytes per element: sharded (the optimizer's parameter), gathered (compute),
        // reduced
        let (sharded, gathered, reduced) = if recipe.master_weights() {
            (4, 2, 4)
        } else {
            let b = recipe.weight_bytes();
            (b, b, b)
        };
        let persistent = |bytes: fn(&CategoryBytes) -> u64| estimate.persistent(bytes);
        let shard = units.sharded_elements(group);
        // the same bytes per parameter as one GPU's state (the mixed recipes' fp32 master
        // is the sharded parameter itself), split over the group
        let whole = persistent(|c| c.parameters)
            .saturating_add(persistent(|c| c.gradients))
            .saturating_add(persistent(|c| c.optimizer_states));
        let elems = units.root.saturating_add(units.layers).max(1);
        let parameter_bytes = shard.saturating_mul(sharded);
        let gradient_bytes = parameter_bytes;
        // a padded shard carries its optimizer states at the same padding
        let optimizer_state_bytes = scale(whole, shard, elems)
            .saturating_sub(parameter_bytes.saturating_add(gradient_bytes));
        let shards = ShardedState {
            parameter_bytes,
            gradient_bytes,
            optimizer_state_bytes,
        };
        // offloaded, the GPU holds only what is gathered and reduced
        let (state, host_bytes) = if offloaded {
            (ShardedState::default(), shards.total())
        } else {
            (shards, 0)
        };
        Fsdp2Rank {
            state,
            root: root_gathered.saturating_mul(gathered),
            layer: units.largest_layer.saturating_mul(gathered),
            layers: units.layers.saturating_mul(gathered),
            kept: reshard_after_forward
                .kept(units.layers)
                .saturating_mul(gathered),
            reduce: units
                .largest_layer
                .saturating_mul(gathered.saturating_add(reduced)),
            root_reduce: root_gathered.saturating_mul(gathered.saturating_add(reduced)),
            gathered,
            tape_gradient: recipe.gradient_bytes().max(1),
            tape_gradients: persistent(|c| c.gradients),
            reshard_after_forward,
            loss_outside,
            offloaded,
            accumulating: accumulates(estimate),
            host_bytes,
            group,
            own_units,
        }
    }

    /// The sharded gradients alive before any layer's backward: all of them from the second
    /// micro-batch of an accumulated step on.
    fn accumulated(&self) -> u64 {
        if self.accumulating {
            self.state.gradient_bytes
        } else {
            0
        }
    }

    /// The layers gathered: every one without `reshard_after_forward`, else what they kept
    /// and the `running` ones.
    fn layers_gathered(&self, running: u64) -> u64 {
        match self.reshard_after_forward {
            Reshard::Off => self.layers,
            _ => self.kept.saturating_add(running),
        }
    }

    /// The tape's `bytes` of gradients in the gathered dtype.
    fn unsharded_gradients(&self, bytes: u64) -> u64 {
        scale(bytes, self.gathered, self.tape_gradient)
    }

    /// The rank's memory in the forward or the optimizer step, whose whole-rank tape
    /// figures are `c` (the backward is [`Fsdp2Rank::at_backward`]'s).
    pub(crate) fn at(&self, phase: Phase, c: &CategoryBytes) -> CategoryBytes {
        let s = &self.state;
        match phase {
            // a layer's gathered weights, and the previous layer's all-gather output that
            // stays referenced until the next copy-out (generation and scoring are
            // no-gradient forwards, gathered the same way)
            Phase::Forward | Phase::Generation | Phase::Scoring => CategoryBytes {
                parameters: s
                    .parameter_bytes
                    .saturating_add(self.root)
                    .saturating_add(self.layer)
                    .saturating_add(self.layers_gathered(self.layer)),
                gradients: self.accumulated(),
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            Phase::Backward => self.at_backward(BackwardMoment::Layers, c),
            // the optimizer steps the shards: its parameter-sized temporaries are shard-sized
            Phase::OptimizerStep => CategoryBytes {
                parameters: s.parameter_bytes,
                gradients: s.gradient_bytes,
                optimizer_states: s.optimizer_state_bytes,
                temporaries: if self.offloaded {
                    0
                } else {
                    c.temporaries.div_ceil(self.group)
                },
                ..*c
            },
        }
    }

    /// The rank's memory at the backward `moment`, whose whole-rank tape figures are `c`.
    pub(crate) fn at_backward(&self, moment: BackwardMoment, c: &CategoryBytes) -> CategoryBytes {
        let s = &self.state;
        let shards = s.parameter_bytes.saturating_add(self.root);
        match moment {
            // no layer has reduced yet. A loss inside the model's forward (transformers')
            // runs its backward after the root's pre-backward gathered the root (and the
            // last layer's all-gather output is still held); a loss outside it
            // (torchtitan's, which loss parallel implies) runs before
            BackwardMoment::Loss if self.loss_outside => CategoryBytes {
                parameters: s
                    .parameter_bytes
                    .saturating_add(match self.reshard_after_forward {
                        Reshard::Off => self.root.saturating_add(self.layers),
                        _ => self.kept,
                    }),
                gradients: self.accumulated(),
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            BackwardMoment::Loss => CategoryBytes {
                parameters: shards.saturating_add(self.layers_gathered(self.layer)),
                gradients: self.accumulated(),
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            // a layer's weights gathered again and the previous layer's prefetched, its
            // gradients on their way to the reduce-scatter; the layers behind it reduced
            // (their share of the tape's gradients, sharded)
            BackwardMoment::Layers => {
                // with their own units the head has resharded and its gradient (the
                // tape's, unsharded) is reduced before the layers' backward (measured:
                // validation/distributed.py --shard-embeddings)
                let (root, head_gradient) = if self.own_units {
                    (
                        self.root,
                        scale(self.root, self.tape_gradient, self.gathered),
                    )
                } else {
                    (0, 0)
                };
                CategoryBytes {
                    parameters: shards
                        .saturating_sub(root)
                        .saturating_add(self.layers_gathered(self.layer.saturating_mul(2))),
                    gradients: scale(s.gradient_bytes, c.gradients, self.tape_gradients)
                        .min(s.gradient_bytes),
                    optimizer_states: s.optimizer_state_bytes,
                    temporaries: c
                        .temporaries
                        .saturating_sub(head_gradient)
                        .saturating_add(self.reduce),
                    ..*c
                }
            }
            // the embeddings' gradients (the tape's, gathered dtype) made with the root
            // gathered; then the root reshards before its reduce-scatter input is filled
            // from the unsharded gradients (`FSDPParamGroup.post_backward`: `reshard()`
            // before `foreach_reduce`)
            BackwardMoment::Embedding => {
                let making = CategoryBytes {
                    parameters: shards,
                    gradients: s.gradient_bytes,
                    optimizer_states: s.optimizer_state_bytes,
                    temporaries: self.unsharded_gradients(c.temporaries),
                    ..*c
                };
                let reducing = CategoryBytes {
                    parameters: s.parameter_bytes,
                    temporaries: self.root_reduce,
                    ..making
                };
                let total = |m: &CategoryBytes| m.total().unwrap_or(u64::MAX);
                if total(&reducing) > total(&making) {
                    reducing
                } else {
                    making
                }
            }
        }
    }
}

/// DeepSpeed's `max_reuse_distance` default (elements): at the turn from forward to
/// backward, ZeRO-3 keeps the parameters gathered that the backward reuses within it.
const DEEPSPEED_MAX_REUSE_ELEMENTS: u64 = 1_000_000_000;
/// DeepSpeed's `sub_group_size` default (elements): the optimizer steps ZeRO-3's partition
/// in sub-groups of at most this, each with its fp32 gradient.
const DEEPSPEED_SUB_GROUP_ELEMENTS: u64 = 1_000_000_000;

/// One DeepSpeed ZeRO rank, as `validation/DEEPSPEED.md` reads DeepSpeed 0.19.8's source
/// (no GPU ran it): stages 1 and 2 keep the 16-bit parameters whole and split the fp32
/// master and moments (and, stage 2, the gradients); stage 3 splits the parameters too and
/// gathers each module as it runs. A reduction bucket of `reduce_bucket_size` elements is
/// allocated at the first gradient (stage 3: at start-up, for good).
pub(crate) struct ZeroRank {
    /// What the rank holds between steps.
    pub state: ShardedState,
    stage: u8,
    /// The whole model's gradients (as the tape counts them) and this rank's partition.
    gradients_whole: u64,
    gradient_part: u64,
    /// The reduction bucket, and the flattened copy a reduction makes of it.
    bucket: u64,
    reduce_copy: u64,
    /// ZeRO-3's gathered parameters while a module runs (largest module plus the prefetch),
    /// and at the turn from forward to backward.
    working_set: u64,
    turn_set: u64,
    /// ZeRO-3: one module's gradients, whole, before their reduce-scatter.
    module_gradients: u64,
    /// The optimizer step's own buffers: the flattened 16-bit gradient and its fp32 copy.
    step_buffers: u64,
    /// ZeRO-Offload: the GPU's staging buffer for the gradients going to the CPU.
    offload_staging: u64,
    offload: Offload,
    /// Host RAM the rank's offloaded state takes.
    pub host_bytes: u64,
    group: u64,
}

/// DeepSpeed's settings that move memory.
pub(crate) struct ZeroSettings {
    pub stage: u8,
    pub offload: Offload,
    pub reduce_bucket_elements: u64,
    pub prefetch_bucket_elements: u64,
}

impl ZeroRank {
    /// The rank of a group of `group` GPUs for the tape `estimate` whose parameters are
    /// `units`, in `recipe` (DeepSpeed's `bf16` is the recipe `mixed-bf16`).
    pub(crate) fn new(
        estimate: &PeakEstimate,
        units: &ParameterUnits,
        recipe: PrecisionRecipe,
        group: u64,
        settings: &ZeroSettings,
    ) -> Self {
        let group = group.max(1);
        let persistent = |bytes: fn(&CategoryBytes) -> u64| estimate.persistent(bytes);
        let elements = units.root.saturating_add(units.layers).max(1);
        let part = elements.div_ceil(group);
        let share = |bytes: u64| scale(bytes, part, elements);
        let (w, g) = (recipe.weight_bytes(), recipe.gradient_bytes());
        let parameters_whole = persistent(|c| c.parameters);
        let gradients_whole = persistent(|c| c.gradients);
        let stage = settings.stage;
        let offload = settings.offload;
        let optimizer_offloaded = offload != Offload::None;
        let params_offloaded = offload == Offload::OptimizerAndParams && stage == 3;
        let parameters = if stage == 3 {
            share(parameters_whole)
        } else {
            parameters_whole
        };
        let optimizer_part = share(persistent(|c| c.optimizer_states));
        let gradient_part = share(gradients_whole);
        let bucket = settings.reduce_bucket_elements.saturating_mul(g);
        let largest_module = units.largest_layer.max(units.largest_root_tensor);
        let state = ShardedState {
            parameter_bytes: if params_offloaded { 0 } else { parameters },
            gradient_bytes: if stage >= 2 && !optimizer_offloaded {
                gradient_part
            } else {
                0
            },
            optimizer_state_bytes: if optimizer_offloaded {
                0
            } else {
                optimizer_part
            },
        };
        // host: the fp32 master and moments, the fp32 gradient partition and (stage 3) the
        // 16-bit one, (stages 1-2) a 16-bit staging copy of the parameters' partition
        let host_bytes = if optimizer_offloaded {
            let fp32_gradients = part.saturating_mul(4);
            let sixteen_bit = part.saturating_mul(w);
            let mut host = optimizer_part
                .saturating_add(fp32_gradients)
                .saturating_add(sixteen_bit);
            if params_offloaded {
                host = host.saturating_add(parameters);
            }
            host
        } else {
            0
        };
        ZeroRank {
            state,
            stage,
            gradients_whole,
            gradient_part,
            bucket,
            reduce_copy: settings
                .reduce_bucket_elements
                .min(elements)
                .saturating_mul(g),
            working_set: largest_module
                .saturating_add(settings.prefetch_bucket_elements)
                .min(elements)
                .saturating_mul(w),
            turn_set: DEEPSPEED_MAX_REUSE_ELEMENTS
                .max(largest_module)
                .min(elements)
                .saturating_mul(w),
            module_gradients: units.largest_layer.saturating_mul(g),
            step_buffers: part
                .min(DEEPSPEED_SUB_GROUP_ELEMENTS)
                .saturating_mul(g.saturating_add(4)),
            offload_staging: if optimizer_offloaded {
                largest_module.saturating_mul(g)
            } else {
                0
            },
            offload,
            host_bytes,
            group,
        }
    }

    /// ZeRO-3 keeps the bucket from start-up; stages 1 and 2 from the first gradient.
    fn resident_bucket(&self) -> u64 {
        if self.stage == 3 {
            self.bucket
        } else {
            0
        }
    }

    /// The rank's memory in the forward or the optimizer step, whose tape figures are `c`.
    pub(crate) fn at(&self, phase: Phase, c: &CategoryBytes) -> CategoryBytes {
        let s = &self.state;
        match phase {
            // generation and scoring are no-gradient forwards
            Phase::Forward | Phase::Generation | Phase::Scoring => CategoryBytes {
                parameters: s.parameter_bytes.saturating_add(if self.stage == 3 {
                    self.working_set
                } else {
                    0
                }),
                // stage 3 allocates its gradient partition at start-up; stage 2 at the
                // first reduction; with accumulation the gradients (stage 1) or their
                // partition (stage 2) live from the first micro-batch on
                gradients: self.held_gradients(c),
                optimizer_states: s.optimizer_state_bytes,
                temporaries: c.temporaries.saturating_add(self.resident_bucket()),
                ..*c
            },
            Phase::Backward => self.at_backward(BackwardMoment::Layers, c),
            // stepped on the CPU with the optimizer offloaded; on the GPU, the flattened
            // gradient partition and its fp32 copy, then the tape's own step temporaries
            // over the partition
            Phase::OptimizerStep => CategoryBytes {
                parameters: s.parameter_bytes,
                gradients: if self.offload == Offload::None {
                    self.gradient_part
                } else {
                    0
                },
                optimizer_states: s.optimizer_state_bytes,
                temporaries: if self.offload == Offload::None {
                    self.step_buffers
                        .saturating_add(c.temporaries.div_ceil(self.group))
                        .saturating_add(self.resident_bucket())
                } else {
                    self.resident_bucket()
                },
                ..*c
            },
        }
    }

    /// The gradients the tape holds at a moment whose figures are `c`, as the stage keeps
    /// them: whole until the boundary (stage 1), their share of the partition (stage 2), the
    /// partition allocated at start-up (stage 3).
    fn held_gradients(&self, c: &CategoryBytes) -> u64 {
        let s = &self.state;
        match self.stage {
            1 => c.gradients,
            3 => s.gradient_bytes,
            _ => scale(s.gradient_bytes, c.gradients, self.gradients_whole).min(s.gradient_bytes),
        }
    }

    /// The rank's memory at the backward `moment`, whose tape figures are `c`.
    pub(crate) fn at_backward(&self, moment: BackwardMoment, c: &CategoryBytes) -> CategoryBytes {
        let s = &self.state;
        let gradients = self.held_gradients(c);
        let reducing = if moment == BackwardMoment::Loss {
            self.resident_bucket()
        } else if self.stage == 1 && moment == BackwardMoment::Layers {
            // without overlap_comm, stage 1's hooks only set the bucket up: it reduces at
            // the accumulation boundary, after the embeddings' backward
            self.bucket
        } else {
            self.bucket
                .saturating_add(self.reduce_copy)
                .saturating_add(self.offload_staging)
        };
        let gathered = match (self.stage, moment) {
            (3, BackwardMoment::Loss) => self.turn_set,
            (3, _) => self.working_set,
            _ => 0,
        };
        let module_gradients = if self.stage == 3 && moment != BackwardMoment::Loss {
            self.module_gradients
        } else {
            0
        };
        CategoryBytes {
            parameters: s.parameter_bytes.saturating_add(gathered),
            gradients,
            optimizer_states: s.optimizer_state_bytes,
            temporaries: c
                .temporaries
                .saturating_add(reducing)
                .saturating_add(module_gradients),
            ..*c
        }
    }
}

/// The data-parallel engine of a rank whose memory is modelled moment by moment.
pub(crate) enum RankEngine {
    /// PyTorch's FSDP2.
    Fsdp2(Fsdp2Rank),
    /// DeepSpeed ZeRO.
    Zero(ZeroRank),
}

impl RankEngine {
    /// What the rank holds between steps.
    pub(crate) fn state(&self) -> ShardedState {
        match self {
            RankEngine::Fsdp2(f) => f.state,
            RankEngine::Zero(z) => z.state,
        }
    }

    /// Host RAM its offloaded state takes.
    pub(crate) fn host_bytes(&self) -> u64 {
        match self {
            RankEngine::Fsdp2(f) => f.host_bytes,
            RankEngine::Zero(z) => z.host_bytes,
        }
    }

    /// The rank's memory at every moment the tape weighed, each with its phase.
    pub(crate) fn moments(&self, estimate: &PeakEstimate) -> Vec<(Phase, CategoryBytes)> {
        // (room for them all from the start: the advisor asks this of thousands of steps)
        let mut out =
            Vec::with_capacity(estimate.phase_peaks.len() + estimate.backward_moments.len());
        for (phase, c) in &estimate.phase_peaks {
            if *phase == Phase::Backward && !estimate.backward_moments.is_empty() {
                for (m, c) in &estimate.backward_moments {
                    out.push((
                        *phase,
                        match self {
                            RankEngine::Fsdp2(f) => f.at_backward(*m, c),
                            RankEngine::Zero(z) => z.at_backward(*m, c),
                        },
                    ));
                }
            } else {
                out.push((
                    *phase,
                    match self {
                        RankEngine::Fsdp2(f) => f.at(*phase, c),
                        RankEngine::Zero(z) => z.at(*phase, c),
                    },
                ));
            }
        }
        out
    }
}
