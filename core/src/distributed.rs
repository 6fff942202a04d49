//! One GPU's share of a data-parallel step: PyTorch's FSDP2 as it allocates, phase by
//! phase, on top of the rank's tape (which tensor and context parallelism already split).

use crate::state::PlanInputs;
use crate::{
    CategoryBytes, Mesh, ParameterUnits, PeakEstimate, Phase, PrecisionRecipe, ShardedState,
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
    reshard_after_forward: bool,
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
        let elems = units.root.saturating_add(units.layers);
        let shard = elems.div_ceil(group);
        // the same bytes per parameter as one GPU's state (the mixed recipes' fp32 master
        // is the sharded parameter itself), split over the group
        let whole = persistent(|c| c.parameters)
            .saturating_add(persistent(|c| c.gradients))
            .saturating_add(persistent(|c| c.optimizer_states));
        let parameter_bytes = shard.saturating_mul(sharded);
        let gradient_bytes = parameter_bytes;
        let state = ShardedState {
            parameter_bytes,
            gradient_bytes,
            optimizer_state_bytes: whole
                .div_ceil(group)
                .saturating_sub(parameter_bytes.saturating_add(gradient_bytes)),
        };
        Fsdp2Rank {
            state,
            root: units.root.saturating_mul(gathered),
            layer: units.largest_layer.saturating_mul(gathered),
            layers: units.layers.saturating_mul(gathered),
            reduce: units
                .largest_layer
                .saturating_mul(gathered.saturating_add(reduced)),
            reshard_after_forward,
            group,
        }
    }

    /// The rank's memory at `phase`, whose whole-rank tape figures are `c`.
    pub(crate) fn at(&self, phase: Phase, c: &CategoryBytes) -> CategoryBytes {
        let s = &self.state;
        let layers = |resharded: u64| {
            if self.reshard_after_forward {
                resharded
            } else {
                self.layers
            }
        };
        match phase {
            Phase::Forward => CategoryBytes {
                parameters: s
                    .parameter_bytes
                    .saturating_add(self.root)
                    .saturating_add(layers(0)),
                gradients: 0,
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            // a layer's backward: its weights gathered again and the previous layer's
            // prefetched, its gradients on their way to the reduce-scatter
            Phase::Backward => CategoryBytes {
                parameters: s
                    .parameter_bytes
                    .saturating_add(self.root)
                    .saturating_add(layers(self.layer.saturating_mul(2))),
                gradients: s.gradient_bytes,
                optimizer_states: s.optimizer_state_bytes,
                temporaries: c.temporaries.saturating_add(self.reduce),
                ..*c
            },
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
}
