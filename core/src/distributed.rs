//! One GPU's share of a data-parallel step: PyTorch's FSDP2 as it allocates, phase by
//! phase, on top of the rank's tape (which tensor and context parallelism already split).

use crate::state::PlanInputs;
use crate::{
    BackwardMoment, CategoryBytes, Mesh, ParameterUnits, PeakEstimate, Phase, PrecisionRecipe,
    ShardedState,
};

/// The mesh the op kinds see for `plan`: tensor parallelism (with sequence and loss
/// parallelism when it is on) and context parallelism.
pub(crate) fn mesh_of(plan: &PlanInputs) -> Mesh {
    let tensor = plan.tensor_parallel.max(1);
    Mesh {
        tensor,
        sequence_parallel: tensor > 1 && plan.sequence_parallel,
        loss_parallel: tensor > 1 && plan.loss_parallel,
        context: plan.context_parallel.max(1),
        stage: None,
    }
}

/// One FSDP2 rank: `fully_shard` on every layer and on the root, each parameter split on
/// its first dimension over the group (rank 0 holding the larger share of an uneven split).
/// What it holds beyond the tape was measured with PyTorch's own FSDP2 on a fake process
/// group (`validation/DISTRIBUTED.md`).
pub(crate) struct Fsdp2Rank {
    /// The sharded parameters, gradients and optimizer states.
    pub state: ShardedState,
    /// The root unit (embeddings, final norm, head) gathered: from its first forward to
    /// the end of backward (the root never reshards after forward).
    root: u64,
    /// The largest layer gathered.
    layer: u64,
    /// Every layer gathered (kept from forward to backward without `reshard_after_forward`).
    layers: u64,
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
    reshard_after_forward: bool,
    /// The loss is computed outside the model's forward (and so outside the root unit).
    loss_outside: bool,
    group: u64,
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
        reshard_after_forward: bool,
        loss_outside: bool,
    ) -> Self {
        let group = group.max(1);
        // bytes per element: sharded (the optimizer's parameter), gathered (compute),
        // reduced
        let (sharded, gathered, reduced) = if recipe.master_weights() {
            (4, 2, 4)
        } else {
            let b = recipe.weight_bytes();
            (b, b, b)
        };
        let persistent = |bytes: fn(&CategoryBytes) -> u64| {
            estimate
                .phase_peaks
                .iter()
                .map(|(_, c)| bytes(c))
                .max()
                .unwrap_or(0)
        };
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
        let optimizer_state_bytes =
            u64::try_from(u128::from(whole) * u128::from(shard) / u128::from(elems))
                .unwrap_or(u64::MAX)
                .saturating_sub(parameter_bytes.saturating_add(gradient_bytes));
        let state = ShardedState {
            parameter_bytes,
            gradient_bytes,
            optimizer_state_bytes,
        };
        Fsdp2Rank {
            state,
            root: units.root.saturating_mul(gathered),
            layer: units.largest_layer.saturating_mul(gathered),
            layers: units.layers.saturating_mul(gathered),
            reduce: units
                .largest_layer
                .saturating_mul(gathered.saturating_add(reduced)),
            root_reduce: units.root.saturating_mul(gathered.saturating_add(reduced)),
            gathered,
            tape_gradient: recipe.gradient_bytes().max(1),
            tape_gradients: persistent(|c| c.gradients),
            reshard_after_forward,
            loss_outside,
            group,
        }
    }

    /// The layers gathered: every one without `reshard_after_forward`, else `resharded`.
    fn layers_gathered(&self, resharded: u64) -> u64 {
        if self.reshard_after_forward {
            resharded
        } else {
            self.layers
        }
    }

    /// The tape's `bytes` of gradients in the gathered dtype.
    fn unsharded_gradients(&self, bytes: u64) -> u64 {
        u64::try_from(
            u128::from(bytes) * u128::from(self.gathered) / u128::from(self.tape_gradient),
        )
        .unwrap_or(u64::MAX)
    }

    /// The rank's memory in the forward or the optimizer step, whose whole-rank tape
    /// figures are `c` (the backward is [`Fsdp2Rank::at_backward`]'s).
    pub(crate) fn at(&self, phase: Phase, c: &CategoryBytes) -> CategoryBytes {
        let s = &self.state;
        match phase {
            // a layer's gathered weights, and the previous layer's all-gather output that
            // stays referenced until the next copy-out
            Phase::Forward => CategoryBytes {
                parameters: s
                    .parameter_bytes
                    .saturating_add(self.root)
                    .saturating_add(self.layer)
                    .saturating_add(self.layers_gathered(self.layer)),
                gradients: 0,
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            Phase::Backward => self.at_backward(BackwardMoment::Layers, c),
            // the optimizer steps the shards: its parameter-sized temporaries are shard-sized
            Phase::OptimizerStep => CategoryBytes {
                parameters: s.parameter_bytes,
                gradients: s.gradient_bytes,
                optimizer_states: s.optimizer_state_bytes,
                temporaries: c.temporaries.div_ceil(self.group),
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
                    .saturating_add(if self.reshard_after_forward {
                        0
                    } else {
                        self.root.saturating_add(self.layers)
                    }),
                gradients: 0,
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            BackwardMoment::Loss => CategoryBytes {
                parameters: shards.saturating_add(self.layers_gathered(self.layer)),
                gradients: 0,
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            // a layer's weights gathered again and the previous layer's prefetched, its
            // gradients on their way to the reduce-scatter; the layers behind it reduced
            // (their share of the tape's gradients, sharded)
            BackwardMoment::Layers => CategoryBytes {
                parameters: shards
                    .saturating_add(self.layers_gathered(self.layer.saturating_mul(2))),
                gradients: u64::try_from(
                    u128::from(s.gradient_bytes) * u128::from(c.gradients)
                        / u128::from(self.tape_gradients.max(1)),
                )
                .unwrap_or(u64::MAX)
                .min(s.gradient_bytes),
                optimizer_states: s.optimizer_state_bytes,
                temporaries: c.temporaries.saturating_add(self.reduce),
                ..*c
            },
            // the embeddings' gradients (the tape's, gathered dtype), then the root's
            // reduce-scatter input once they are summed
            BackwardMoment::Embedding => CategoryBytes {
                parameters: shards,
                gradients: s.gradient_bytes,
                optimizer_states: s.optimizer_state_bytes,
                temporaries: self
                    .unsharded_gradients(c.temporaries)
                    .max(self.root_reduce),
                ..*c
            },
        }
    }
}
