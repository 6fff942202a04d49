//! The state split whole, without an engine modelled moment by moment: plain data
//! parallelism (with its reducer's buckets), and every step no engine below models (LoRA and
//! QLoRA, inference, ZeRO over expert parallelism), each category split as its engine splits
//! it.

use super::expert::DataParallel;
use super::fsdp2::PeftAdditions;
use crate::evaluate::{too_large, EvaluationError, PartKind, StepMemory};
use crate::state::PlanInputs;
use crate::{
    shard_model_state, Breakdown, CategoryBytes, ParameterUnits, PeakEstimate, Peft, Phase,
    ShardedState, Sharding, SimpleInputs, TrainingStep,
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
    /// FSDP2's additions to a LoRA or QLoRA rank.
    peft: PeftAdditions,
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
        let ddp_buckets = if plan.sharding == Sharding::Ddp && n > 1 && step.optimizer.trains() {
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
        WholeState {
            dp,
            gathered,
            temporaries_split: (plan.sharding.shards_optimizer_states() && n > 1) || dp.ep > 1,
            ddp_buckets,
            peft,
        }
    }

    /// The rank's memory at a moment of `phase` whose whole-rank tape figures are `c`.
    pub(super) fn at(&self, phase: Phase, c: &CategoryBytes) -> CategoryBytes {
        let root = if phase == Phase::OptimizerStep {
            0
        } else {
            self.peft.root
        }
        .saturating_add(self.peft.fp32_shards);
        let state = self.dp.shard(
            ShardedState {
                parameter_bytes: c.parameters,
                gradient_bytes: c.gradients,
                optimizer_state_bytes: c.optimizer_states,
            },
            self.gathered,
        );
        // The optimizer step's temporaries are parameter-sized: they shard with the
        // optimizer states.
        let temporaries = if phase == Phase::OptimizerStep && self.temporaries_split {
            let t = ShardedState {
                optimizer_state_bytes: c.temporaries,
                ..ShardedState::default()
            };
            self.dp.shard(t, 0).optimizer_state_bytes
        } else {
            c.temporaries
        };
        CategoryBytes {
            // (beside the shards, not within the whole model's bytes)
            parameters: state.parameter_bytes.saturating_add(root),
            gradients: state.gradient_bytes.saturating_add(self.ddp_buckets),
            optimizer_states: state.optimizer_state_bytes,
            activations: c.activations,
            temporaries,
            buffers: c.buffers,
        }
    }

    /// What the rank holds between steps.
    pub(super) fn state(&self, estimate: &PeakEstimate) -> ShardedState {
        let persistent = |bytes: fn(&CategoryBytes) -> u64| estimate.persistent(bytes);
        let state = self.dp.shard(
            ShardedState {
                parameter_bytes: persistent(|c| c.parameters),
                gradient_bytes: persistent(|c| c.gradients),
                optimizer_state_bytes: persistent(|c| c.optimizer_states),
            },
            self.gathered,
        );
        ShardedState {
            gradient_bytes: state.gradient_bytes.saturating_add(self.ddp_buckets),
            ..state
        }
    }
}
