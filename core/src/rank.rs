//! One GPU's share of a step: the rank's tape (which tensor, context and pipeline
//! parallelism already cut: see [`mesh_of`] and [`crate::Stage`]) composed with its
//! data-parallel engine ([`ddp`], [`fsdp1`], [`fsdp2`], [`zero`]) and expert parallelism
//! ([`expert`]).
//!
//! [`shard_step`] is the one entry: it splits the tape's model state, asks the engine for the
//! rank's memory at every moment the tape weighed, adds what lives beside the engine (a KV
//! cache, a paged optimizer, a reference model, colocated vLLM) and reads the peak.

use crate::evaluate::{
    kv_cache_bytes, scale_parts, too_large, EvaluationError, Model, PartKind, PhasePeaks,
    StepMemory, Unsharded,
};
use crate::state::PlanInputs;
use crate::{CategoryBytes, Mesh, Offload, PeakEstimate, Phase, ShardedState, Sharding, TpPlan};

/// Plain data parallelism: the reducer's buckets and the state held whole.
mod ddp;
/// Expert parallelism: the routed experts' state split over the expert-parallel group.
mod expert;
/// PyTorch's FSDP1, as accelerate wraps a model.
mod fsdp1;
/// PyTorch's FSDP2.
mod fsdp2;
/// DeepSpeed ZeRO.
mod zero;

use ddp::WholeState;
use expert::DataParallel;
pub(crate) use fsdp1::reshard_after_forward;
use fsdp2::{Fsdp2Rank, Fsdp2Settings};
use zero::{ZeroRank, ZeroSettings};

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

/// The step of `whole` (the [`unsharded`](crate::evaluate::unsharded) step of `model` at
/// `batch`) per GPU, sharded as `plan` says. Without `with_parts` the activations are not
/// broken down (the advisor's searches need only the peak).
pub(crate) fn shard_step(
    model: &Model,
    whole: &Unsharded,
    plan: &PlanInputs,
    batch: u64,
    with_parts: bool,
    mesh: &Mesh,
) -> Result<StepMemory, EvaluationError> {
    match (model, whole) {
        (Model::Simple(inputs), Unsharded::Simple(b)) => ddp::simple_step(inputs, b, plan),
        (
            Model::Architecture {
                model,
                step,
                kv_dtype,
                peft,
                ..
            },
            Unsharded::Architecture(estimate, units, in_order),
        ) => {
            let arch = &model.arch;
            // (Unsloth trains on one GPU, or under accelerate's DDP; sharded engines do not
            // run its kernels)
            if step.kernels != crate::Kernels::Torch && plan.sharding != Sharding::Ddp {
                return Err(EvaluationError::Step(crate::arch::UNSLOTH_SCOPE.to_owned()));
            }
            // the GPUs each parameter is split over (FSDP1's NO_SHARD: none; HYBRID_SHARD:
            // a node's)
            let n = plan.shard_group();
            let dp = DataParallel::new(plan, n, arch, model.routed, estimate.n_params);
            let fsdp1_units = fsdp1::units(plan, units);
            let units = fsdp1_units.as_ref().unwrap_or(units);
            let (root_gathered, own_units) = fsdp2::root_gathered(plan, arch, units);
            // the tape is already one tensor-parallel rank's: only the KV cache (computed
            // here from the whole model) is split by it
            let kv = if step.optimizer.trains() || model.new_tokens == 0 || arch.is_vision() {
                0
            } else {
                kv_cache_bytes(
                    arch,
                    step.precision,
                    *kv_dtype,
                    batch,
                    step.seq_len,
                    model.new_tokens,
                )
                .ok_or_else(too_large)?
                    / mesh.tensor
            };
            // FSDP2 and DeepSpeed ZeRO, moment by moment (the tape's backward moments
            // each hold different units gathered); ZeRO over expert parallelism keeps the
            // whole-state split of [`WholeState`]
            let trains_all = step.optimizer.trains() && peft.is_none();
            let group = n.saturating_mul(mesh.context.max(1));
            let pipelined = mesh.stage.is_some_and(|s| s.stages > 1);
            let engine = match plan.sharding {
                Sharding::Fsdp2 if trains_all => Some(RankEngine::Fsdp2(Fsdp2Rank::new(
                    estimate,
                    units,
                    step.precision,
                    group,
                    &Fsdp2Settings {
                        reshard_after_forward: plan.reshard_after_forward,
                        // (a pipeline's loss is its schedule's, outside the stage)
                        loss_outside: mesh.loss_parallel || pipelined,
                        offloaded: plan.offload != Offload::None,
                        root_gathered,
                        own_units,
                        backward_prefetch: true,
                        float8_all_gather: plan.float8_all_gather,
                        pipelined,
                    },
                ))),
                // NO_SHARD in the parameters' own dtype holds the whole state as one GPU
                // does (no copy to gather): no engine to model. Under mixed precision it
                // still makes each unit's bf16 copy as it runs, a group of one.
                Sharding::Fsdp1 if trains_all && (n > 1 || step.precision.master_weights()) => {
                    Some(RankEngine::Fsdp2(fsdp1::rank(
                        estimate,
                        units,
                        step.precision,
                        group,
                        plan,
                        mesh.loss_parallel,
                    )))
                }
                Sharding::Zero1 | Sharding::Zero2 | Sharding::Zero3 if trains_all && dp.ep <= 1 => {
                    let settings = ZeroSettings {
                        partition_elements: (plan.sharding != Sharding::Zero3)
                            .then(|| {
                                in_order
                                    .get_or_init(|| arch.rank_parameter_tensors(mesh).ok())
                                    .as_deref()
                                    .map(|t| crate::arch::partition_touching(t, group))
                            })
                            .flatten(),
                        ..ZeroSettings::of(plan)
                    };
                    Some(RankEngine::Zero(ZeroRank::new(
                        estimate,
                        units,
                        step.precision,
                        group,
                        &settings,
                    )))
                }
                _ => None,
            };
            let whole = WholeState::new(
                &dp,
                estimate,
                units,
                step,
                peft.as_ref(),
                plan,
                root_gathered,
                own_units,
            );
            let beside = Beside::new(plan, &dp, estimate, engine.is_some(), group, kv);
            // (borrowed without an engine: the advisor shards thousands of steps)
            let peak = match &engine {
                Some(e) => Peak::read(e.moments(estimate).into_iter(), &beside),
                None => Peak::read(
                    estimate
                        .phase_peaks
                        .iter()
                        .map(|(phase, c)| (*phase, whole.at(*phase, c))),
                    &beside,
                ),
            }?;
            let (model_state, host_bytes) = match &engine {
                Some(e) => (e.state(), e.host_bytes()),
                None => {
                    let (gpu, host) = whole.state(estimate);
                    (gpu, host.total())
                }
            };
            // (offloaded checkpointing's layer inputs wait in host memory too)
            let host_bytes = host_bytes.saturating_add(estimate.host_activation_bytes);
            Ok(peak.step_memory(&StepFacts {
                estimate,
                trains: step.optimizer.trains(),
                beside: &beside,
                model_state,
                host_bytes,
                with_parts,
                mesh,
            }))
        }
        // a step of another model: never built so
        _ => Err(too_large()),
    }
}

/// What a rank holds beside its model state and the tape, whatever its engine.
struct Beside {
    /// Inference's KV cache, in the forward.
    kv: u64,
    /// A paged optimizer's state, held on the GPU through the whole step.
    paged: u64,
    /// Colocated vLLM's share of the device's memory.
    vllm: u64,
    /// DPO's and GRPO's separate reference model, which the engines' moments (the policy's)
    /// leave out.
    reference: u64,
}

impl Beside {
    fn new(
        plan: &PlanInputs,
        dp: &DataParallel,
        estimate: &PeakEstimate,
        engine: bool,
        group: u64,
        kv: u64,
    ) -> Self {
        let objective = estimate.objective.as_deref();
        // TRL prepares the reference with the same engine (sharded under FSDP2 and ZeRO-3)
        let reference = match objective {
            Some(o) if engine && o.reference_param_bytes > 0 => {
                if matches!(
                    plan.sharding,
                    Sharding::Fsdp2 | Sharding::Fsdp1 | Sharding::Zero3
                ) {
                    o.reference_param_bytes.div_ceil(group.max(1))
                } else {
                    o.reference_param_bytes
                }
            }
            _ => 0,
        };
        // colocated vLLM holds its share of the device's total memory whatever runs
        let vllm = match (objective.and_then(|o| o.vllm_permille), plan.capacity_bytes) {
            (Some(permille), Some(capacity)) => {
                crate::arch::vllm_reservation_bytes(capacity, permille)
            }
            _ => 0,
        };
        let paged = ShardedState {
            optimizer_state_bytes: estimate.paged_bytes,
            ..ShardedState::default()
        };
        Beside {
            kv,
            paged: dp.shard(paged, 0).optimizer_state_bytes,
            vllm,
            reference,
        }
    }
}

/// What the step's figures need besides its peak moment.
struct StepFacts<'a> {
    estimate: &'a PeakEstimate,
    /// The step trains (else it is inference).
    trains: bool,
    beside: &'a Beside,
    /// What the rank holds between steps.
    model_state: ShardedState,
    host_bytes: u64,
    with_parts: bool,
    mesh: &'a Mesh,
}

/// The rank's peak moment, and each phase's own peak.
struct Peak {
    phase: Phase,
    /// The rank's memory at its peak, the reference model with the parameters.
    at: CategoryBytes,
    bytes: u64,
    /// DPO and GRPO: the generation's and the scoring's peaks.
    generation: Option<u64>,
    scoring: Option<u64>,
    /// The training phases' peak (the optimizer step winning ties).
    training: (Phase, u64),
}

impl Peak {
    /// The peak of the rank's `moments`, with what lives `beside` them.
    fn read(
        moments: impl Iterator<Item = (Phase, CategoryBytes)>,
        beside: &Beside,
    ) -> Result<Peak, EvaluationError> {
        let mut generation = None::<u64>;
        let mut scoring = None::<u64>;
        let mut training = (Phase::Forward, 0u64);
        let mut best: Option<(Phase, CategoryBytes, u64)> = None;
        for (phase, c) in moments {
            let at = CategoryBytes {
                parameters: c.parameters.saturating_add(beside.reference),
                ..c
            };
            let total = at
                .total()
                .and_then(|t| {
                    t.checked_add(if phase == Phase::Forward {
                        beside.kv
                    } else {
                        0
                    })
                })
                .and_then(|t| t.checked_add(beside.paged))
                .and_then(|t| t.checked_add(beside.vllm))
                .ok_or_else(too_large)?;
            match phase {
                Phase::Generation => generation = Some(generation.map_or(total, |t| t.max(total))),
                Phase::Scoring => scoring = Some(scoring.map_or(total, |t| t.max(total))),
                _ if total > training.1
                    || (total == training.1 && phase == Phase::OptimizerStep) =>
                {
                    training = (phase, total);
                }
                _ => {}
            }
            if best.as_ref().is_none_or(|(_, _, t)| total > *t) {
                best = Some((phase, at, total));
            }
        }
        let (phase, at, bytes) = best.ok_or_else(too_large)?;
        Ok(Peak {
            phase,
            at,
            bytes,
            generation,
            scoring,
            training,
        })
    }

    /// The step's figures, read at this peak.
    fn step_memory(&self, facts: &StepFacts) -> StepMemory {
        let &StepFacts {
            estimate,
            trains,
            beside,
            model_state,
            host_bytes,
            with_parts,
            mesh,
        } = facts;
        let (phase, c) = (self.phase, &self.at);
        let mut parts = vec![
            (PartKind::Weights, c.parameters),
            (PartKind::Gradients, c.gradients),
            (PartKind::OptimizerStates, c.optimizer_states),
            (PartKind::Activations, c.activations),
            (PartKind::Temporaries, c.temporaries),
            (PartKind::Buffers, c.buffers),
        ];
        let kv_at_peak = if phase == Phase::Forward {
            beside.kv
        } else {
            0
        };
        if kv_at_peak > 0 {
            parts.push((PartKind::KvCache, kv_at_peak));
        }
        let objective = estimate.objective.as_deref();
        // the generation's cache is among its activations: shown as what it is
        if let (Phase::Generation, Some(o)) = (phase, objective) {
            let cache = o.kv_cache_bytes.min(c.activations);
            if let Some((_, a)) = parts.iter_mut().find(|(k, _)| *k == PartKind::Activations) {
                *a -= cache;
            }
            parts.push((PartKind::KvCache, cache));
        }
        if beside.vllm > 0 {
            parts.push((PartKind::VllmReservation, beside.vllm));
        }
        if beside.paged > 0 {
            parts.push((PartKind::PagedOptimizerStates, beside.paged));
        }
        let activation_bytes = if trains {
            estimate.saved_activation_bytes
        } else {
            beside.kv.max(c.activations)
        };
        // The saved parts sum to the forward's activations; the peak's are those (or none).
        let forward_activations = estimate
            .phase_peaks
            .iter()
            .find(|(p, _)| *p == Phase::Forward)
            .map_or(0, |(_, c)| c.activations);
        let activation_parts = if with_parts {
            scale_parts(&estimate.saved_parts, forward_activations, c.activations)
        } else {
            Vec::new()
        };
        StepMemory {
            parts,
            peak_bytes: self.bytes,
            peak_phase: Some(phase),
            model_state_bytes: model_state.total().saturating_add(beside.paged),
            activation_bytes,
            activation_parts,
            trainable_params: estimate.trainable_params,
            paged_bytes: beside.paged,
            stage: mesh.stage.map(|s| s.index),
            stage_in_flight: mesh.stage.map_or(1, |s| s.in_flight()),
            host_bytes,
            objective_phases: objective.is_some().then_some(PhasePeaks {
                generation_bytes: self.generation,
                scoring_bytes: self.scoring,
                training_bytes: self.training.1,
                training_peak_phase: self.training.0,
                peak: match phase {
                    Phase::Generation => crate::StepPhase::Generation,
                    Phase::Scoring => crate::StepPhase::Scoring,
                    _ => crate::StepPhase::Training,
                },
            }),
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
