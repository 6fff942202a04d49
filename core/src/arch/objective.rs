//! Preference and reinforcement objectives as TRL 1.16.0 runs them: DPO (`DPOTrainer`) and
//! GRPO (`GRPOTrainer`), each step split into the phases it runs (generation, scoring,
//! training), the training phase being the supervised step's tape on what the trainer
//! feeds it.
//!
//! Every rule is read off TRL 1.16.0's source and checked against the harness
//! (`validation/rl.py`, `validation/RL.md`, `tests/fixtures/rl-measured.jsonl`): the
//! reference's weights and its no-gradient forward on top of the policy's saved tensors, the
//! generation's growing KV cache and last-token logits, the scoring passes' working set.
//! vLLM is not run: a colocated engine reserves `ceil(total x gpu_memory_utilization)` of
//! the device for the whole run (vLLM 0.31.0's `request_memory`), counted where the device
//! is known.

use super::arith::storage;
use super::config::Architecture;
use super::error::EstimateError;
use super::estimate::{
    rank_step, CategoryBytes, ObjectivePhases, PeakEstimate, Phase, TrainerTape, TrainingStep,
};
use super::loss::{TRL_FUSED_TOKENS, TRL_FUSED_VOCAB};
use super::mesh::Mesh;
use super::peft::Peft;
use super::recipe::{LossKind, PrecisionRecipe};
use super::replay::ReplayDevice;

/// What the step trains for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectiveKind {
    /// Supervised fine-tuning: one forward of the batch, the loss on its tokens.
    Sft,
    /// Direct preference optimization: chosen and rejected completions in one forward,
    /// against a reference.
    Dpo,
    /// Group relative policy optimization: completions generated per prompt, scored, then
    /// trained on.
    Grpo,
}

impl ObjectiveKind {
    /// Every objective, in the order the page lists them.
    pub const ALL: [ObjectiveKind; 3] =
        [ObjectiveKind::Sft, ObjectiveKind::Dpo, ObjectiveKind::Grpo];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            ObjectiveKind::Sft => "sft",
            ObjectiveKind::Dpo => "dpo",
            ObjectiveKind::Grpo => "grpo",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            ObjectiveKind::Sft => "Supervised (SFT)",
            ObjectiveKind::Dpo => "DPO (TRL 1.16)",
            ObjectiveKind::Grpo => "GRPO (TRL 1.16)",
        }
    }

    /// The objective whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.key() == key)
    }
}

/// Where the reference log-probabilities come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reference {
    /// A separate frozen copy of the policy, resident for the whole run.
    Separate,
    /// The LoRA policy with its adapters disabled (`use_adapter(model, None)`): no copy.
    AdaptersOff,
    /// DPO's `precompute_ref_log_probs`: one pass before training, no reference after.
    Precomputed,
    /// None: GRPO's default `beta = 0.0`.
    None,
}

impl Reference {
    /// Every choice, in the order the page lists them.
    pub const ALL: [Reference; 4] = [
        Reference::Separate,
        Reference::AdaptersOff,
        Reference::Precomputed,
        Reference::None,
    ];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Reference::Separate => "separate",
            Reference::AdaptersOff => "adapters-off",
            Reference::Precomputed => "precomputed",
            Reference::None => "none",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Reference::Separate => "Separate frozen copy",
            Reference::AdaptersOff => "LoRA base, adapters off",
            Reference::Precomputed => "Precomputed log-probs",
            Reference::None => "None (GRPO beta = 0)",
        }
    }

    /// The choice whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.key() == key)
    }
}

/// What generates GRPO's completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Generator {
    /// The policy's own `generate` (TRL's default `use_vllm=False`).
    Model,
    /// A vLLM engine in the training process, holding its share of the device.
    VllmColocated,
    /// A vLLM server on other GPUs.
    VllmServer,
}

impl Generator {
    /// Every choice, in the order the page lists them.
    pub const ALL: [Generator; 3] = [
        Generator::Model,
        Generator::VllmColocated,
        Generator::VllmServer,
    ];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Generator::Model => "model",
            Generator::VllmColocated => "vllm-colocated",
            Generator::VllmServer => "vllm-server",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Generator::Model => "The model's generate",
            Generator::VllmColocated => "vLLM colocated",
            Generator::VllmServer => "vLLM server (other GPUs)",
        }
    }

    /// The choice whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.key() == key)
    }
}

/// The objective of a step with its own settings. For DPO the step's batch counts pairs;
/// for GRPO it counts prompts, each generating [`generations`](Self::generations)
/// completions. The sequence is `max_prompt + max_completion` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Objective {
    /// Which objective.
    pub kind: ObjectiveKind,
    /// The reference (DPO; GRPO with `beta > 0`).
    pub reference: Reference,
    /// Prompt tokens per sequence.
    pub max_prompt: u64,
    /// Completion tokens per sequence (the scored ones).
    pub max_completion: u64,
    /// GRPO's `num_generations`: completions per prompt.
    pub generations: u64,
    /// GRPO: what generates.
    pub generator: Generator,
    /// GRPO with colocated vLLM: `vllm_gpu_memory_utilization`, per mille of the device.
    pub vllm_memory_permille: u32,
    /// GRPO's `steps_per_generation`: micro-batches the generation batch is split into
    /// (gradient accumulation steps, by default the same).
    pub steps_per_generation: u64,
    /// GRPO's `num_iterations`: passes over each generation batch.
    pub iterations: u64,
}

impl Objective {
    /// Supervised fine-tuning (the other fields unused).
    pub const SFT: Objective = Objective {
        kind: ObjectiveKind::Sft,
        reference: Reference::Separate,
        max_prompt: 512,
        max_completion: 512,
        generations: 8,
        generator: Generator::Model,
        vllm_memory_permille: 300,
        steps_per_generation: 1,
        iterations: 1,
    };

    /// Tokens per sequence.
    #[must_use]
    pub fn seq_len(&self) -> u64 {
        self.max_prompt.saturating_add(self.max_completion)
    }

    /// Whether GRPO computes the old policy's log-probabilities before training: with
    /// vLLM (its importance-sampling correction is on by default) or when a generation
    /// batch is trained on more than once (TRL 1.16 `grpo_trainer.py` l. 2643-2645, with
    /// gradient accumulation equal to `steps_per_generation`).
    #[must_use]
    pub fn old_log_probs(&self) -> bool {
        self.kind == ObjectiveKind::Grpo
            && (self.generator != Generator::Model || self.iterations > 1)
    }
}

/// Estimates one rank's step of `objective`: the supervised step as
/// [`estimate_rank`](super::estimate_rank) does for [`ObjectiveKind::Sft`], else the largest
/// of the objective's phases ([`PeakEstimate::objective`] says which); with `replay`, the
/// training phase's allocations replayed through the caching allocator.
///
/// # Errors
/// As [`estimate_rank`](super::estimate_rank), and for settings that do not go together (an
/// adapters-off reference without LoRA, a precomputed reference in GRPO, a generation batch
/// that does not split into its micro-batches).
pub fn estimate_objective(
    arch: &Architecture,
    step: &TrainingStep,
    peft: Option<&Peft>,
    mesh: &Mesh,
    objective: &Objective,
    replay: Option<ReplayDevice>,
) -> Result<PeakEstimate, EstimateError> {
    if objective.kind == ObjectiveKind::Sft {
        return rank_step(
            arch,
            step,
            peft,
            mesh,
            TrainerTape {
                replay,
                ..TrainerTape::default()
            },
        );
    }
    if !arch.is_causal_lm() || objective.max_completion == 0 || !step.optimizer.trains() {
        return Err(EstimateError::ObjectiveUnsupported(
            "DPO and GRPO train a causal language model with an optimizer on at least one completion token",
        ));
    }
    let is_grpo = objective.kind == ObjectiveKind::Grpo;
    if match objective.reference {
        Reference::AdaptersOff => peft.is_none(),
        Reference::Precomputed => is_grpo,
        Reference::None => !is_grpo,
        Reference::Separate => false,
    } {
        return Err(EstimateError::ObjectiveUnsupported(
            "this reference does not go with this step: DPO takes separate, precomputed or \
             adapters-off (LoRA, QLoRA), GRPO none (beta = 0), separate or adapters-off",
        ));
    }
    // DPOConfig's `disable_dropout=True` sets every dropout's p to 0, the model's and
    // LoRA's, and a dropout of p = 0 returns its input (ATen `_dropout`): nothing is kept
    // (GRPOConfig leaves them: `disable_dropout=False`)
    let undropped;
    let arch = match arch.spec.without_dropout() {
        Some(spec) if objective.kind == ObjectiveKind::Dpo => {
            undropped = Architecture {
                spec: Box::new(spec),
                ..arch.clone()
            };
            &undropped
        }
        _ => arch,
    };
    let without_dropout = peft.map(|f| Peft {
        dropout: f.dropout && objective.kind != ObjectiveKind::Dpo,
        ..*f
    });
    // TRL's autocast runs a base loaded in fp32 as AMP does
    let step = &TrainingStep {
        precision: peft.map_or(step.precision, |f| f.recipe(step.precision, true)),
        ..*step
    };
    let ctx = Ctx::new(arch, step, without_dropout.as_ref(), mesh);
    match objective.kind {
        ObjectiveKind::Dpo => dpo(&ctx, objective, replay),
        _ => grpo(&ctx, objective, replay),
    }
}

/// What every phase reads.
struct Ctx<'a> {
    arch: &'a Architecture,
    step: &'a TrainingStep,
    peft: Option<&'a Peft>,
    mesh: &'a Mesh,
    /// Bytes per element: stored weights, matmul outputs, the residual stream.
    weight: u64,
    act: u64,
    resid: u64,
    /// fp32 weights under autocast: a forward of weights that require grad caches a 16-bit
    /// copy of every Linear weight until it returns.
    casts_weights: bool,
    /// The rank's share of the tensor-parallel split.
    tp: u64,
}

impl<'a> Ctx<'a> {
    fn new(
        arch: &'a Architecture,
        step: &'a TrainingStep,
        peft: Option<&'a Peft>,
        mesh: &'a Mesh,
    ) -> Self {
        let p: PrecisionRecipe = step.precision;
        Self {
            arch,
            step,
            peft,
            mesh,
            weight: p.weight_bytes(),
            act: p.activation_bytes(),
            resid: p.residual_bytes(),
            casts_weights: p.autocast() && p.weight_bytes() == 4,
            tp: mesh.tensor.max(1),
        }
    }

    /// The training tape of `batch` rows of the objective's sequences, the loss scoring
    /// the completions through TRL's fused head.
    fn training(
        &self,
        batch: u64,
        o: &Objective,
        replay: Option<ReplayDevice>,
    ) -> Result<PeakEstimate, EstimateError> {
        let step = TrainingStep {
            batch,
            seq_len: o.seq_len(),
            loss: LossKind::TrlFused,
            ..*self.step
        };
        rank_step(
            self.arch,
            &step,
            self.peft,
            self.mesh,
            TrainerTape {
                replay,
                scored_per_row: Some(o.max_completion),
                // TRL's configs default to `bf16=True`: accelerate's autocast around every
                // forward, whatever the weights' dtype
                autocast: true,
                #[cfg(feature = "vision")]
                input_grad: false,
            },
        )
    }

    /// A separate reference: the policy's weights again, in its dtype (TRL loads it with
    /// `dtype = policy.dtype`), without gradients or optimizer state.
    fn reference_bytes(&self) -> u64 {
        self.arch
            .spec
            .parameter_tensors()
            .iter()
            .fold(0u64, |acc, &e| acc.saturating_add(st(e, self.weight)))
            / self.tp
    }

    /// autocast's 16-bit copies of every Linear weight of the layers (`with_head`: and the
    /// head, which `generate` runs as a plain Linear).
    fn weight_casts(&self, with_head: bool) -> u64 {
        let spec = &self.arch.spec;
        let mut total = spec.layer_groups().0.iter().fold(0u64, |acc, (l, count)| {
            let layer = l
                .linear_params(false)
                .iter()
                .fold(0u64, |a, &e| a.saturating_add(st(e, 2)));
            acc.saturating_add(layer.saturating_mul(*count))
        });
        if with_head {
            total = total.saturating_add(st(
                self.arch.vocab_size().saturating_mul(spec.token_width()),
                2,
            ));
        }
        total / self.tp
    }

    /// What one decoder layer holds at its peak in a no-grad forward of `tokens` tokens,
    /// besides the weights: the MLP's three inner tensors next to four of the residual
    /// stream (hidden, residual, normed input, output), or, with per-head q/k norms, the
    /// query's fp32 norm (measured: `validation/RL.md`); matmul outputs of `act` bytes.
    fn layer_working_set(&self, tokens: u64, act: u64) -> u64 {
        let mut worst = 0;
        for (l, _) in self.arch.spec.layer_groups().0 {
            let h = st(tokens.saturating_mul(l.attention.hidden), self.resid);
            let inner = tokens.saturating_mul(l.mlp.inner_per_token() / self.tp);
            let mlp = st(inner, act)
                .saturating_mul(3)
                .saturating_add(h.saturating_mul(4));
            worst = worst.max(mlp);
            if l.attention.qk_norm.is_some() {
                let q = tokens.saturating_mul(l.attention.heads * l.attention.head_dim / self.tp);
                let norm = st(q, 4)
                    .saturating_mul(2)
                    .saturating_add(st(q, act))
                    .saturating_add(h.saturating_mul(3));
                worst = worst.max(norm);
            }
        }
        worst
    }

    /// The fused head's no-gradient pass on `scored` of `tokens` rows: the final norm's
    /// output, the scored rows' copy, one logits tile, the running statistics, targets and
    /// the mask's nonzero indices (and under autocast the tiles' 16-bit casts).
    fn head_working_set(&self, tokens: u64, scored: u64) -> u64 {
        let h = self.arch.spec.token_width();
        let v = self.arch.vocab_size().min(TRL_FUSED_VOCAB);
        let m = scored.min(TRL_FUSED_TOKENS);
        let compute = if self.act == 4 && !self.step.precision.autocast() {
            4
        } else {
            2
        };
        let mut total = st(tokens.saturating_mul(h), self.resid)
            .saturating_add(st(scored.saturating_mul(h), self.resid))
            .saturating_add(st(m * v, compute))
            .saturating_add(st(scored, 4).saturating_mul(10))
            .saturating_add(st(scored, 8).saturating_mul(3));
        if self.casts_weights {
            total = total
                .saturating_add(st(m.saturating_mul(h), 2))
                .saturating_add(st(v.saturating_mul(h), 2));
        }
        total
    }

    /// A no-gradient forward's working set through the fused head (the reference's, or a
    /// scoring pass's): a layer's or the head's, whichever is larger, and the weight
    /// copies when the weights run under autocast and require grad.
    fn scoring_working_set(&self, tokens: u64, scored: u64, casts: bool) -> u64 {
        let working = self
            .layer_working_set(tokens, self.act)
            .max(self.head_working_set(tokens, scored));
        if casts && self.casts_weights {
            working.saturating_add(self.weight_casts(false))
        } else {
            working
        }
    }
}

/// Bytes of a tensor of `elems` elements of `bytes` each as the caching allocator rounds
/// it (saturating: a figure past 64 bits fails when the phases are totalled).
fn st(elems: u64, bytes: u64) -> u64 {
    storage(elems, bytes).unwrap_or(u64::MAX)
}

/// DPO: `[chosen; rejected]` in one forward of twice the batch; the reference's forward
/// under `no_grad` on top of everything the policy's forward saved.
fn dpo(
    ctx: &Ctx<'_>,
    o: &Objective,
    replay: Option<ReplayDevice>,
) -> Result<PeakEstimate, EstimateError> {
    let rows = ctx.step.batch.saturating_mul(2);
    let seq = o.seq_len();
    let mut e = ctx.training(rows, o, replay)?;
    let tokens = rows.saturating_mul(seq) / ctx.mesh.context.max(1);
    let scored = rows.saturating_mul(o.max_completion);
    let reference = if o.reference == Reference::Separate {
        ctx.reference_bytes()
    } else {
        0
    };
    // input ids, attention mask and completion mask, where the tape counts the ids
    let inputs = st(rows.saturating_mul(seq), 8).saturating_mul(2);
    add_everywhere(&mut e, reference, inputs);
    let mut scoring = None;
    match o.reference {
        Reference::Separate | Reference::AdaptersOff => {
            // a frozen base (adapters off) keeps no weight copies
            let working =
                ctx.scoring_working_set(tokens, scored, o.reference == Reference::Separate);
            if let Some((_, fwd)) = e.phase_peaks.iter_mut().find(|(p, _)| *p == Phase::Forward) {
                let window = CategoryBytes {
                    temporaries: working,
                    ..*fwd
                };
                if window.total() > fwd.total() {
                    *fwd = window;
                }
            }
        }
        // the pass before training holds the weights only
        _ => {
            let working = ctx.scoring_working_set(tokens, scored, ctx.peft.is_none());
            let fwd = first_phase(&e);
            scoring = Some(CategoryBytes {
                parameters: fwd.parameters,
                buffers: fwd.buffers,
                temporaries: working,
                ..CategoryBytes::default()
            });
        }
    }
    finish(e, None, 0, scoring, reference, None)
}

/// GRPO: the generation batch of `prompts x generations` sequences generated, scored when
/// the old policy's or the reference's log-probabilities are needed, then trained on in
/// micro-batches.
fn grpo(
    ctx: &Ctx<'_>,
    o: &Objective,
    replay: Option<ReplayDevice>,
) -> Result<PeakEstimate, EstimateError> {
    let generations = o.generations.max(1);
    let sequences = ctx.step.batch.saturating_mul(generations);
    let split = o.steps_per_generation.max(1);
    if !sequences.is_multiple_of(split) {
        return Err(EstimateError::ObjectiveUnsupported(
            "prompts x generations must split into steps_per_generation micro-batches",
        ));
    }
    let micro = sequences / split;
    let seq = o.seq_len();
    let (prompt, completion) = (o.max_prompt, o.max_completion);
    let mut e = ctx.training(micro, o, replay)?;
    if split > 1 {
        // gradient accumulation over the micro-batches (`gradient_accumulation_steps` =
        // `steps_per_generation` by default): after the first, every moment of a later
        // micro-batch holds all the gradients
        let grads = e
            .phase_peaks
            .iter()
            .map(|(_, c)| c.gradients)
            .max()
            .unwrap_or(0);
        let accumulated = |c: &mut CategoryBytes| c.gradients = c.gradients.max(grads);
        e.phase_peaks.iter_mut().for_each(|(_, c)| accumulated(c));
        e.backward_moments
            .iter_mut()
            .for_each(|(_, c)| accumulated(c));
        // the backward's peak may now be another of its moments
        let largest = e
            .backward_moments
            .iter()
            .map(|(_, c)| *c)
            .max_by_key(|c| c.total().unwrap_or(u64::MAX));
        if let (Some(largest), Some((_, bwd))) = (
            largest,
            e.phase_peaks
                .iter_mut()
                .find(|(p, _)| *p == Phase::Backward),
        ) {
            if largest.total() > bwd.total() {
                *bwd = largest;
            }
        }
    }
    let reference = if o.reference == Reference::Separate {
        ctx.reference_bytes()
    } else {
        0
    };
    let kinds = u64::from(o.old_log_probs()) + u64::from(o.reference != Reference::None);
    // the generation batch (prompt and completion ids and masks) and the log-probabilities
    // scored ahead, kept through training
    let batch_inputs = st(sequences.saturating_mul(prompt), 8)
        .saturating_add(st(sequences.saturating_mul(completion), 8))
        .saturating_mul(2);
    let log_probs = st(sequences.saturating_mul(completion), 4).saturating_mul(kinds);
    add_everywhere(&mut e, reference, batch_inputs.saturating_add(log_probs));
    // between steps: weights, optimizer state, buffers (gradients are set to None)
    let first = first_phase(&e);
    let at_start = |extra: u64| CategoryBytes {
        parameters: first.parameters,
        buffers: first
            .buffers
            .saturating_sub(log_probs)
            .saturating_add(extra),
        optimizer_states: first.optimizer_states,
        ..CategoryBytes::default()
    };
    let (generation, kv) = match o.generator {
        Generator::Model => {
            let (c, kv) = generation(ctx, sequences, prompt, completion);
            (
                CategoryBytes {
                    activations: c.activations,
                    temporaries: c.temporaries,
                    ..at_start(0)
                },
                kv,
            )
        }
        // vLLM holds its own memory: this process keeps its state meanwhile
        _ => (at_start(0), 0),
    };
    let scoring = (kinds > 0).then(|| CategoryBytes {
        temporaries: ctx.scoring_working_set(
            micro.saturating_mul(seq) / ctx.mesh.context.max(1),
            micro.saturating_mul(completion),
            ctx.peft.is_none(),
        ),
        ..at_start(log_probs)
    });
    finish(
        e,
        Some(generation),
        kv,
        scoring,
        reference,
        o.colocated_vllm_permille(),
    )
}

/// What colocated vLLM reserves of a device of `capacity_bytes` at
/// `gpu_memory_utilization` = `permille` / 1000: `ceil(total x utilization)` (vLLM 0.31.0
/// `request_memory`), whatever the step runs.
pub(crate) fn vllm_reservation_bytes(capacity_bytes: u64, permille: u32) -> u64 {
    u64::try_from((u128::from(capacity_bytes) * u128::from(permille.min(1000))).div_ceil(1000))
        .unwrap_or(u64::MAX)
}

impl Objective {
    /// Colocated vLLM's `gpu_memory_utilization` in per mille (GRPO with a colocated
    /// generator; `None` otherwise).
    fn colocated_vllm_permille(&self) -> Option<u32> {
        (self.kind == ObjectiveKind::Grpo && self.generator == Generator::VllmColocated)
            .then_some(self.vllm_memory_permille.min(1000))
    }

    /// Colocated vLLM's reservation on a device of `capacity_bytes` (0 without one).
    pub(crate) fn colocated_vllm_bytes(&self, capacity_bytes: u64) -> u64 {
        self.colocated_vllm_permille().map_or(0, |permille| {
            vllm_reservation_bytes(capacity_bytes, permille)
        })
    }
}

/// `model.generate` of `sequences` rows under `no_grad` with transformers' `DynamicCache`:
/// the largest of the prefill and the last token, as what is alive beyond the state
/// (activations: the KV cache; temporaries: the rest), and the cache's bytes.
fn generation(ctx: &Ctx<'_>, sequences: u64, prompt: u64, completion: u64) -> (CategoryBytes, u64) {
    let spec = &ctx.arch.spec;
    let tp = ctx.tp;
    // accelerate's autocast wraps the policy's own forward: a PeftModel's `generate` runs its
    // base model's `generate`, whose forward is not wrapped (peft's
    // PeftModelForCausalLM.generate -> base_model.generate), so an adapted model generates in
    // its weights' dtype (measured: an AMP policy's KV cache is fp32)
    let autocast = ctx.casts_weights && ctx.peft.is_none();
    let act = if autocast { ctx.act } else { ctx.weight };
    // fp32 weights under autocast: the key leaves rotary (fp32 tables) or its fp32 norm in
    // fp32, the value the projection's 16 bits
    let per_layer = |l: &super::model::Layer, positions: u64| -> (u64, u64) {
        let a = &l.attention;
        let key_bytes = if !autocast {
            act
        } else if a.rotary_dim.is_some() || a.qk_norm.is_some() {
            4
        } else {
            2
        };
        let value_bytes = if autocast { 2 } else { act };
        let kept = a.window.map_or(positions, |w| positions.min(w));
        let rows = sequences.saturating_mul(a.kv_heads.div_ceil(tp).saturating_mul(kept));
        (
            st(rows.saturating_mul(a.head_dim), key_bytes),
            st(rows.saturating_mul(a.v_head_dim), value_bytes),
        )
    };
    let (groups, _) = spec.layer_groups();
    let cache = |positions: u64| -> u64 {
        groups.iter().fold(0u64, |acc, (l, count)| {
            let (k, v) = per_layer(l, positions);
            acc.saturating_add(k.saturating_add(v).saturating_mul(*count))
        })
    };
    let last = prompt.saturating_add(completion).saturating_sub(1);
    let logits = st(sequences.saturating_mul(ctx.arch.vocab_size()), 4);
    // `torch.cat` of the old and the new value tensor while a layer appends
    let growing = groups
        .iter()
        .map(|(l, _)| per_layer(l, last.saturating_sub(1)).1)
        .max()
        .unwrap_or(0);
    // the previous token's fp32 logits and probabilities stay bound through the next
    // forward, beside this one's
    let decode_extra = growing
        .saturating_add(logits.saturating_mul(2))
        .max(logits.saturating_mul(4));
    let casts = if autocast { ctx.weight_casts(true) } else { 0 };
    let kv_last = cache(last);
    let kv_prompt = cache(prompt);
    let prefill_extra = ctx
        .layer_working_set(sequences.saturating_mul(prompt), act)
        .saturating_add(logits);
    let (kv, rest) =
        if kv_last.saturating_add(decode_extra) >= kv_prompt.saturating_add(prefill_extra) {
            (kv_last, decode_extra)
        } else {
            (kv_prompt, prefill_extra)
        };
    (
        CategoryBytes {
            activations: kv,
            temporaries: rest.saturating_add(casts),
            ..CategoryBytes::default()
        },
        kv,
    )
}

/// The training tape's first phase (the forward), whose state every phase starts from.
fn first_phase(e: &PeakEstimate) -> CategoryBytes {
    e.phase_peaks.first().map(|(_, c)| *c).unwrap_or_default()
}

/// Adds a separate reference's weights and the trainer's own inputs to every moment of the
/// training tape (the peak is found anew over them all).
fn add_everywhere(e: &mut PeakEstimate, parameters: u64, buffers: u64) {
    let grow = |c: &mut CategoryBytes| {
        c.parameters = c.parameters.saturating_add(parameters);
        c.buffers = c.buffers.saturating_add(buffers);
    };
    e.phase_peaks.iter_mut().for_each(|(_, c)| grow(c));
    e.backward_moments.iter_mut().for_each(|(_, c)| grow(c));
}

/// The step's peak over its phases, the training tape's moments among them.
fn finish(
    mut e: PeakEstimate,
    generation: Option<CategoryBytes>,
    kv_cache_bytes: u64,
    scoring: Option<CategoryBytes>,
    reference_param_bytes: u64,
    vllm_permille: Option<u32>,
) -> Result<PeakEstimate, EstimateError> {
    let mut phases: Vec<(Phase, CategoryBytes)> =
        [(Phase::Generation, generation), (Phase::Scoring, scoring)]
            .into_iter()
            .filter_map(|(p, c)| c.map(|c| (p, c)))
            .collect();
    phases.append(&mut e.phase_peaks);
    let mut best = (Phase::Forward, CategoryBytes::default(), 0);
    for (phase, c) in &phases {
        let t = c.total().ok_or(EstimateError::TooLarge)?;
        // (ties: the later moment, as the training tape reports them)
        if t >= best.2 {
            best = (*phase, *c, t);
        }
    }
    e.phase_peaks = phases;
    (e.peak_phase, e.at_peak, e.peak_bytes) = best;
    e.objective = Some(Box::new(ObjectivePhases {
        kv_cache_bytes,
        reference_param_bytes,
        vllm_permille,
    }));
    Ok(e)
}
