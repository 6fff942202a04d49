//! DeepSpeed ZeRO (stages 1-3) as it allocates on one rank, phase by phase, on top of the
//! rank's tape.

use super::scale;
use crate::state::PlanInputs;
use crate::{
    BackwardMoment, CategoryBytes, Offload, ParameterUnits, PeakEstimate, Phase, PrecisionRecipe,
    ShardedState,
};

use crate::arch::{DEEPSPEED_MAX_REUSE_ELEMENTS, DEEPSPEED_SUB_GROUP_ELEMENTS};

/// One DeepSpeed ZeRO rank, as `validation/DEEPSPEED.md` reads DeepSpeed 0.19.8's source
/// (no GPU ran it): stages 1 and 2 keep the 16-bit parameters whole and split the fp32
/// master and moments (and, stage 2, the gradients); stage 3 splits the parameters too and
/// gathers each module as it runs. A reduction bucket of `reduce_bucket_size` elements is
/// allocated at the first gradient (stage 3: at start-up, for good).
pub(crate) struct ZeroRank {
    /// What the rank holds between steps.
    pub state: ShardedState,
    stage: u8,
    /// This rank's gradient partition.
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
    /// ZeRO-1 and ZeRO-2: the elements of the whole tensors the busiest rank's partition
    /// touches, whose gradients it keeps (`None`: its share of the model).
    pub partition_elements: Option<u64>,
}

impl ZeroSettings {
    /// The settings of a ZeRO stage `plan` names.
    pub(crate) fn of(plan: &PlanInputs) -> Self {
        ZeroSettings {
            stage: plan.sharding.zero_stage().unwrap_or(3),
            offload: plan.offload,
            reduce_bucket_elements: plan.reduce_bucket_elements,
            prefetch_bucket_elements: plan.prefetch_bucket_elements,
            partition_elements: None,
        }
    }
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
        let gradient_part = match settings.partition_elements {
            Some(e) if stage < 3 => e.saturating_mul(g).min(gradients_whole),
            _ => share(gradients_whole),
        };
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
    /// them: whole until the boundary (stage 1); the partition, made whole at the first
    /// reduction, once the gradients overflow the bucket (stage 2:
    /// `copy_grads_in_partition`; before it they are the bucket's); the partition allocated
    /// at start-up (stage 3).
    fn held_gradients(&self, c: &CategoryBytes) -> u64 {
        let s = &self.state;
        match self.stage {
            1 => c.gradients,
            3 => s.gradient_bytes,
            _ if c.gradients > self.bucket => s.gradient_bytes,
            _ => 0,
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
