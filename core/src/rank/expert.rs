//! Expert parallelism: the routed experts' share of the model state is split over the
//! expert-parallel group, then sharded over the GPUs holding the same experts; the rest is
//! sharded over all the data-parallel GPUs.

use crate::state::PlanInputs;
use crate::{shard_model_state, Architecture, ShardedState, Sharding};

/// How the model state that no engine models moment by moment is split over the
/// data-parallel GPUs (and the expert-parallel group within them).
#[derive(Clone, Copy)]
pub(super) struct DataParallel {
    sharding: Sharding,
    /// Data-parallel GPUs (FSDP1: those each parameter is split over).
    pub n: u64,
    /// GPUs the routed experts are split over (1: none).
    pub ep: u64,
    /// The routed experts' parameters, and the model's.
    routed: u64,
    n_params: u64,
}

impl DataParallel {
    pub(super) fn new(
        plan: &PlanInputs,
        n: u64,
        arch: &Architecture,
        routed: u64,
        n_params: u64,
    ) -> Self {
        // (the group first: a group of one is 1 whatever the model, and `is_moe` walks
        // the layers, on each of the advisor's thousands of steps)
        let ep = if plan.expert_parallel > 1 && n > 1 && arch.is_moe() {
            plan.expert_parallel.clamp(1, n)
        } else {
            1
        };
        DataParallel {
            sharding: plan.sharding,
            n,
            ep,
            routed,
            n_params,
        }
    }

    /// The routed experts' share of `bytes` of the whole model's state.
    fn experts_of(&self, bytes: u64) -> u64 {
        let share = u128::from(bytes) * u128::from(self.routed) / u128::from(self.n_params.max(1));
        u64::try_from(share).unwrap_or(u64::MAX)
    }

    /// One GPU's share of `whole`, with `gathered` bytes of parameters gathered at a time
    /// (ZeRO-3's largest layer).
    pub(super) fn shard(&self, whole: ShardedState, gathered: u64) -> ShardedState {
        let (sharding, n, ep) = (self.sharding, self.n, self.ep);
        if ep <= 1 {
            return shard_model_state(whole, sharding, n, gathered);
        }
        let experts = ShardedState {
            parameter_bytes: self.experts_of(whole.parameter_bytes).div_ceil(ep),
            gradient_bytes: self.experts_of(whole.gradient_bytes).div_ceil(ep),
            optimizer_state_bytes: self.experts_of(whole.optimizer_state_bytes).div_ceil(ep),
        };
        let rest = ShardedState {
            parameter_bytes: whole.parameter_bytes - self.experts_of(whole.parameter_bytes),
            gradient_bytes: whole.gradient_bytes - self.experts_of(whole.gradient_bytes),
            optimizer_state_bytes: whole.optimizer_state_bytes
                - self.experts_of(whole.optimizer_state_bytes),
        };
        let a = shard_model_state(rest, sharding, n, gathered);
        let b = shard_model_state(experts, sharding, n / ep, 0);
        ShardedState {
            parameter_bytes: a.parameter_bytes.saturating_add(b.parameter_bytes),
            gradient_bytes: a.gradient_bytes.saturating_add(b.gradient_bytes),
            optimizer_state_bytes: a
                .optimizer_state_bytes
                .saturating_add(b.optimizer_state_bytes),
        }
    }
}
