//! PyTorch's FSDP1 (`FullyShardedDataParallel`) as accelerate wraps a model, on one rank.
//!
//! Measured per rank on a fake process group (`validation/FSDP1.md`, rows in
//! `core/tests/fixtures/fsdp1-measured.jsonl`): FSDP1's flat parameters allocate as FSDP2's
//! per-parameter shards do, unit for unit, so a rank is [`Fsdp2Rank`] over FSDP1's units:
//! - `FULL_SHARD` reshards each unit after its forward, `SHARD_GRAD_OP` keeps it gathered to
//!   its backward (FSDP2's `reshard_after_forward=False`), `HYBRID_SHARD` is `FULL_SHARD`
//!   within a node's shard group, `NO_SHARD` holds everything as one GPU does (no engine);
//! - accelerate's default `NO_WRAP` makes the whole model one unit, which as FSDP's root is
//!   gathered from the first forward to the end of backward;
//! - one flat parameter per unit is split evenly whatever its tensors' shapes (no expert
//!   dimension padded to the group).

use super::fsdp2::{Fsdp2Rank, Fsdp2Settings};
use crate::state::PlanInputs;
use crate::{
    BackwardPrefetch, Fsdp1Sharding, Fsdp1Wrap, Offload, ParameterUnits, PeakEstimate,
    PrecisionRecipe, Reshard, Sharding,
};

/// FSDP1's units of the model whose FSDP2 units are `units` (`None` under another engine).
pub(super) fn units(plan: &PlanInputs, units: &ParameterUnits) -> Option<ParameterUnits> {
    if plan.sharding != Sharding::Fsdp1 {
        return None;
    }
    // flat: no tensor is split on its own first dimension
    let flat = ParameterUnits {
        routed: 0,
        experts: 0,
        ..*units
    };
    Some(match plan.fsdp1.wrap {
        Fsdp1Wrap::Layers => flat,
        Fsdp1Wrap::None => ParameterUnits {
            root: units.root.saturating_add(units.layers),
            largest_layer: 0,
            layers: 0,
            largest_layer_linears: 0,
            layers_linears: 0,
            ..flat
        },
    })
}

/// The rank of a shard group of `group` GPUs (context parallelism included) for the tape
/// `estimate`, in `recipe`, over FSDP1's [`units`].
pub(super) fn rank(
    estimate: &PeakEstimate,
    units: &ParameterUnits,
    recipe: PrecisionRecipe,
    group: u64,
    plan: &PlanInputs,
    loss_outside: bool,
) -> Fsdp2Rank {
    Fsdp2Rank::new(
        estimate,
        units,
        recipe,
        group,
        &Fsdp2Settings {
            reshard_after_forward: reshard_after_forward(plan),
            loss_outside,
            offloaded: plan.offload != Offload::None,
            root_gathered: units.root,
            own_units: false,
            // (NO_PREFETCH and BACKWARD_POST measured alike: one layer gathered)
            backward_prefetch: plan.fsdp1.backward_prefetch == BackwardPrefetch::Pre,
            float8_all_gather: false,
            // (torch's pipelining runs FSDP1 as a plain module: a reduction per micro-batch)
            pipelined: false,
        },
    )
}

/// FSDP2's `reshard_after_forward` that `plan`'s engine amounts to: FSDP1's follows its
/// strategy (a `sharding_strategy` always filled wins over accelerate's
/// `reshard_after_forward`).
pub(crate) fn reshard_after_forward(plan: &PlanInputs) -> Reshard {
    match (plan.sharding, plan.fsdp1.sharding) {
        (Sharding::Fsdp1, Fsdp1Sharding::GradOp) => Reshard::Off,
        (Sharding::Fsdp1, _) => Reshard::On,
        _ => plan.reshard_after_forward,
    }
}

/// The gradients FSDP1 makes for a LoRA rank's flat parameters that mix frozen and trained
/// tensors: with `use_orig_params=True` the adapters sit in their layer's flat parameter
/// (NO_WRAP: in the one unit), whose gradient is the whole shard in its dtype (fp32 under a
/// mixed recipe, accelerate's upcast); without it FSDP1 refuses mixed flat parameters, so the
/// adapters are their own units (PEFT's `fsdp_auto_wrap_policy`) and nothing is added.
pub(super) fn lora_flat_gradients(
    plan: &PlanInputs,
    units: &ParameterUnits,
    recipe: PrecisionRecipe,
) -> u64 {
    if plan.sharding != Sharding::Fsdp1 || !plan.fsdp1.use_orig_params {
        return 0;
    }
    // the units holding adapters: the layers (the root's embeddings and head are frozen);
    // under NO_WRAP the one unit, which [`units`] made the root
    let mixed = match plan.fsdp1.wrap {
        Fsdp1Wrap::Layers => units.layers,
        Fsdp1Wrap::None => units.root,
    };
    let bytes = if recipe.master_weights() {
        4
    } else {
        recipe.weight_bytes()
    };
    mixed.div_ceil(plan.shard_group()).saturating_mul(bytes)
}
