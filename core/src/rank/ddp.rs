//! The state split whole, without an engine modelled moment by moment: plain data
//! parallelism (with its reducer's buckets), and every step no engine below models (LoRA and
//! QLoRA, inference, ZeRO over expert parallelism), each category split as its engine splits
//! it.

use super::expert::DataParallel;
use super::fsdp2::PeftAdditions;
use crate::evaluate::{too_large, EvaluationError, PartKind, StepMemory};
use crate::state::PlanInputs;
use crate::{
    shard_model_state, Breakdown, CategoryBytes, Offload, ParameterUnits, PeakEstimate, Peft,
    Phase, ShardedState, Sharding, SimpleInputs, TrainingStep,
};

/// Simple mode's step per GPU: its state split by `plan`, its activations whole.
pub(super) fn simple_step(
    inputs: &SimpleInputs,
    b: &Breakdown,
    plan: &PlanInputs,
) -> Result<StepMemory, EvaluationError> {
    let state = shard_model_state(
        ShardedState {
            parameter_bytes: b.weights,
            gradient_bytes: b.gradients,
            optimizer_state_bytes: b.optimizer_states,
        },
        plan.sharding,
        plan.shard_group(),
        0,
    );
    let peak_bytes = state
        .total()
        .checked_add(b.activations)
        .ok_or_else(too_large)?;
    Ok(StepMemory {
        parts: vec![
            (PartKind::Weights, state.parameter_bytes),
            (PartKind::Gradients, state.gradient_bytes),
            (PartKind::OptimizerStates, state.optimizer_state_bytes),
            (PartKind::Activations, b.activations),
        ],
        peak_bytes,
        peak_phase: None,
        model_state_bytes: state.total(),
        activation_bytes: b.activations,
        activation_parts: Vec::new(),
        trainable_params: if inputs.optimizer.trains() {
            inputs.params
        } else {
            0
        },
        paged_bytes: 0,
        stage: None,
        stage_in_flight: 1,
        host_bytes: 0,
        objective_phases: None,
    })
}

/// A rank's state split category by category, at every moment of the tape.
pub(super) struct WholeState<'a> {
    dp: &'a DataParallel,
    /// The parameters gathered at a time (ZeRO-3's largest layer).
    gathered: u64,
    /// The optimizer states (and so the step's parameter-sized temporaries) are split.
    temporaries_split: bool,
    /// DDP's reducer buckets.
    ddp_buckets: u64,
    /// DeepSpeed's reduce bucket (`reduce_bucket_size` elements in the gradients' dtype,
    /// however little trains), and whether it is kept for good: ZeRO-3 makes it at
    /// start-up, ZeRO-1 and ZeRO-2 at the first gradient hook, freed at the backward's end.
    reduce_bucket: (u64, bool),
    /// FSDP's additions to a LoRA or QLoRA rank.
    peft: PeftAdditions,
    /// FSDP1's flat gradients of a LoRA rank whose units mix frozen and trained tensors
    /// (`use_orig_params=True`, the adapters inside their layer's flat parameter): a flat
    /// parameter's gradient is its whole shard, made at each unit's post-backward and held
    /// to the optimizer step (measured: `validation/FSDP1.md`). 0 otherwise.
    flat_gradients: u64,
    /// The tape's gradients, all of them (how far the backward has come).
    tape_gradients: u64,
    /// The share of a 4-bit base's quantization state another rank holds: FSDP2 shards
    /// torchao's `NF4Tensor` with its scalers (`nf4_split` chunks `quantized_scalers` and
    /// `quantization_factor` with the data), where FSDP1's flat parameters leave
    /// bitsandbytes' `quant_state`, a module attribute, whole on every rank.
    quant_state_elsewhere: u64,
    /// What FSDP or DeepSpeed keeps in host RAM for a LoRA or QLoRA rank (derived from
    /// their sources, not measured: FSDP2's `CPUOffloadPolicy` and FSDP1's `CPUOffload`
    /// keep the shards on the host and copy each unit's in to gather it; DeepSpeed's
    /// `offload_param` the partitions, `offload_optimizer` the gradients and the optimizer,
    /// which the CPU steps).
    offload: Offload,
}

impl<'a> WholeState<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        dp: &'a DataParallel,
        estimate: &PeakEstimate,
        units: &ParameterUnits,
        step: &TrainingStep,
        peft: Option<&Peft>,
        plan: &PlanInputs,
        root_gathered: u64,
        own_units: bool,
    ) -> Self {
        let n = dp.n;
        let whole_params = estimate.persistent(|c| c.parameters);
        let rank_params = units.root.saturating_add(units.layers).max(1);
        let gathered =
            u128::from(whole_params) * u128::from(units.largest_layer) / u128::from(rank_params);
        let gathered = u64::try_from(gathered).unwrap_or(u64::MAX);
        // DDP's reducer allocates a flat bucket per ~25 MB of gradients at construction:
        // a second copy of every gradient, unless `gradient_as_bucket_view=True` (off by
        // default in torch, Accelerate and the HF Trainer; torch's DDP docstring: it
        // "saves memory equal to the total gradients size")
        let ddp_buckets = if plan.ddp_reducer() && step.optimizer.trains() {
            // the rank's gradients: an expert-parallel rank holds its experts' only
            dp.shard(
                ShardedState {
                    gradient_bytes: estimate.persistent(|c| c.gradients),
                    ..ShardedState::default()
                },
                0,
            )
            .gradient_bytes
        } else {
            0
        };
        let reduce_bucket = match plan.sharding.zero_stage() {
            Some(stage) if step.optimizer.trains() => (
                plan.reduce_bucket_elements
                    .saturating_mul(step.precision.gradient_bytes()),
                stage == 3,
            ),
            _ => (0, false),
        };
        let flat_gradients = match peft {
            Some(p) if !p.quantized() => {
                super::fsdp1::lora_flat_gradients(plan, units, step.precision)
            }
            _ => 0,
        };
        let quant_state_elsewhere = match peft {
            Some(p) if p.quantized() && plan.sharding == Sharding::Fsdp2 && n > 1 => {
                let q = estimate.quant_state_bytes;
                q - q.div_ceil(n)
            }
            _ => 0,
        };
        let peft = match peft {
            Some(p) if matches!(plan.sharding, Sharding::Fsdp2 | Sharding::Fsdp1) && n > 1 => {
                PeftAdditions::new(
                    p,
                    step.precision,
                    super::fsdp1::reshard_after_forward(plan),
                    units,
                    whole_params,
                    root_gathered,
                    own_units,
                    gathered,
                    n,
                )
            }
            _ => PeftAdditions::default(),
        };
        // (DDP cannot offload: the page refuses it)
        let offload = if step.optimizer.trains() && plan.sharding != Sharding::Ddp {
            plan.offload
        } else {
            Offload::None
        };
        WholeState {
            dp,
            gathered,
            quant_state_elsewhere,
            flat_gradients,
            tape_gradients: estimate.persistent(|c| c.gradients),
            temporaries_split: (plan.sharding.shards_optimizer_states() && n > 1) || dp.ep > 1,
            ddp_buckets,
            reduce_bucket,
            peft,
            offload,
        }
    }

    /// The rank's memory at a moment of `phase` whose whole-rank tape figures are `c`.
    pub(super) fn at(&self, phase: Phase, c: &CategoryBytes) -> CategoryBytes {
        let root = if phase == Phase::OptimizerStep {
            0
        } else {
            self.peft.root
        }
        .saturating_add(if self.params_offloaded() {
            0
        } else {
            self.peft.fp32_shards
        });
        let (state, _) = self.place(ShardedState {
            parameter_bytes: c.parameters,
            gradient_bytes: c.gradients,
            optimizer_state_bytes: c.optimizer_states,
        });
        // The optimizer step's temporaries are parameter-sized: they shard with the
        // optimizer states (and are the CPU's when it steps them).
        let temporaries = if phase == Phase::OptimizerStep && self.offload != Offload::None {
            0
        } else if phase == Phase::OptimizerStep && self.temporaries_split {
            let t = ShardedState {
                optimizer_state_bytes: c.temporaries,
                ..ShardedState::default()
            };
            self.dp.shard(t, 0).optimizer_state_bytes
        } else {
            c.temporaries
        };
        let (bucket, kept) = self.reduce_bucket;
        let temporaries = if kept || phase == Phase::Backward {
            temporaries.saturating_add(bucket)
        } else {
            temporaries
        };
        // (offloaded, they are copied to the host as each unit's backward ends)
        let flat_gradients = match phase {
            _ if self.params_offloaded() => 0,
            Phase::OptimizerStep => self.flat_gradients,
            Phase::Backward => super::scale(self.flat_gradients, c.gradients, self.tape_gradients),
            _ => 0,
        };
        CategoryBytes {
            // (beside the shards, not within the whole model's bytes)
            parameters: state.parameter_bytes.saturating_add(root),
            gradients: state
                .gradient_bytes
                .saturating_add(self.ddp_buckets)
                .saturating_add(flat_gradients),
            optimizer_states: state.optimizer_state_bytes,
            activations: c.activations,
            temporaries,
            buffers: c.buffers.saturating_sub(self.quant_state_elsewhere),
        }
    }

    /// What the rank holds between steps on the GPU, and in host RAM.
    pub(super) fn state(&self, estimate: &PeakEstimate) -> (ShardedState, ShardedState) {
        let persistent = |bytes: fn(&CategoryBytes) -> u64| estimate.persistent(bytes);
        let (state, host) = self.place(ShardedState {
            parameter_bytes: persistent(|c| c.parameters),
            gradient_bytes: persistent(|c| c.gradients),
            optimizer_state_bytes: persistent(|c| c.optimizer_states),
        });
        let (fp32_shards, flat_gradients) = if self.params_offloaded() {
            (self.peft.fp32_shards, self.flat_gradients)
        } else {
            (0, 0)
        };
        let host = ShardedState {
            parameter_bytes: host.parameter_bytes.saturating_add(fp32_shards),
            gradient_bytes: host.gradient_bytes.saturating_add(flat_gradients),
            ..host
        };
        let state = ShardedState {
            gradient_bytes: state.gradient_bytes.saturating_add(self.ddp_buckets),
            ..state
        };
        (state, host)
    }

    /// The parameters' shards live in host RAM.
    fn params_offloaded(&self) -> bool {
        self.offload == Offload::OptimizerAndParams
    }

    /// `whole` split over the GPUs: what the rank holds on the GPU (its shards and what
    /// is gathered), and what the engine keeps in host RAM.
    fn place(&self, whole: ShardedState) -> (ShardedState, ShardedState) {
        let held = self.dp.shard(whole, self.gathered);
        if self.offload == Offload::None {
            return (held, ShardedState::default());
        }
        // the gathered parameters are the GPU's whatever is offloaded
        let shards = self
            .dp
            .shard(whole, 0)
            .parameter_bytes
            .min(held.parameter_bytes);
        let parameters_out = if self.params_offloaded() { shards } else { 0 };
        (
            ShardedState {
                parameter_bytes: held.parameter_bytes - parameters_out,
                ..ShardedState::default()
            },
            ShardedState {
                parameter_bytes: parameters_out,
                ..held
            },
        )
    }
}
