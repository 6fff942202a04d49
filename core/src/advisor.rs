//! The advisor: the settings to change so that a step fits, best first.
//!
//! # What it tries
//! Each setting a person can change is a *knob* with a chain of options, from the current
//! value (level 0) to the one that gives up most:
//!
//! | Knob | Options | [`Tier`] |
//! | --- | --- | --- |
//! | micro-batch | the largest that fits, with gradient accumulation to the global batch | same math |
//! | checkpointing | every layer, then every layer with its input offloaded to CPU memory (architecture mode, training) | same math |
//! | sharding | the ZeRO stages after the current one (inference: ZeRO-3 only), with 2+ GPUs | same math |
//! | GPUs | x2, x4 … x[`MAX_GPU_MULTIPLIER`] the data-parallel GPUs, same kind (discrete GPUs only) | same math |
//! | expert parallelism | x2, x4 … the group, dividing the GPUs (mixtures of experts) | same math |
//! | precision recipe | fp32 → AMP → mixed (fp32 master) → pure bf16 (fp16 family on GPUs without bf16) | precision |
//! | precision (simple mode) | fp32 → 16 bits (→ int8 for inference) | precision |
//! | weight format (inference) | bf16 → int8 → nf4, or the smaller GGUF types from a GGUF one | precision |
//! | KV-cache dtype (inference with generation) | fp8, or q8_0 → q4_0 with GGUF weights | precision |
//! | optimizer (training) | AdamW → bitsandbytes AdamW 8-bit → torch's Adafactor (simple mode: AdamW → SGD with momentum) | optimizer |
//! | training method (architecture mode, training) | full → LoRA → QLoRA (the page's defaults: r 16 on every linear, nf4 with double quantization, k-bit preparation) | fewer trained parameters |
//! | sequence (architecture mode, text) | /2, /4, /8, /16 | task |
//!
//! A *plan* sets every knob to one of its levels. More GPUs keep the global batch (the
//! `global_batch` field, or batch x GPUs): each GPU takes `ceil(global / GPUs)` samples, at
//! least one. With more GPUs than samples per step the global batch grows to the number of
//! GPUs: [`Tier::GlobalBatch`], ranked after the precision changes.
//!
//! # Which plans are listed, in which order
//! A plan is listed when it fits and no other fitting plan gives up less on every knob (all
//! levels lower or equal): turning on checkpointing when ZeRO-3 alone fits adds nothing. The
//! plans are ordered by [`RankKey`], a total order: the plans on the GPUs the person has
//! first, then those that need more; within each group, what is given up first (the tier, then
//! how far in each tier, from the task down), then the GPUs, the number of changes, the
//! compute overhead, and the levels themselves to break ties. How far a plan goes within a
//! tier comes before the number of changes: halving the sequence with checkpointing ranks
//! before cutting it to a sixteenth alone. At most [`PLANS_PER_TIER`] plans of each tier are
//! listed in each group, so that the list spans the kinds of change (more GPUs, lower precision, a lighter
//! optimizer, adapters, shorter sequences) rather than variants of the first; a plan left
//! out still hides the plans it dominates. When the step fits as it is, the one plan is the
//! unchanged configuration.
//!
//! # How it stays fast
//! The peak is assumed to shrink (or stay) when sharding, GPUs, expert parallelism,
//! optimizer, sequence, weight format or KV dtype move to a later option: the memory model's
//! own invariants (a larger batch never needs less; ZeRO stages never add). Checkpointing,
//! the recipe and the training method are not monotone (autocast's weight copies; QLoRA's
//! k-bit preparation runs the residual stream in fp32) and are tried one by one; nor is the
//! micro-batch (accumulation keeps every gradient alive through the later passes, which can
//! outweigh the activations a smaller micro-batch saves), tried both ways. The search walks the give-ups in rank order; for each it finds, by a binary
//! search over the GPU counts, the fewest GPUs with which the most memory-saving same-math
//! settings fit, and only evaluates plans from there, in rank order, stopping as soon as
//! `limit` plans are listed. A test compares it with a brute-force enumeration of the same
//! plans.

use std::fmt;

use crate::arch::STEADY_PASSES;
use crate::evaluate::{largest_batch, step_at, unsharded, Knobs, Parsed, Unsharded};
use crate::fasthash::FxHashMap;
use crate::rank::shard_step;
use crate::state::{Field, PageState, PlanInputs};
use crate::{
    fit_verdict, plan_accumulation, AccumulationPlan, Checkpointing, EvaluationError, FitVerdict,
    KvDtype, LossKind, MaxBatch, Method, Optimizer, Peft, Precision, PrecisionRecipe, Sharding,
    StepMemory, WeightFormat, BYTES_PER_MIB,
};

/// The most plans listed per [`Tier`] in each group (the GPUs the person has, more GPUs):
/// the list spans what a person can give up instead of
/// repeating variants of the first idea (ZeRO-2 or ZeRO-3, 16 GPUs or 32).
pub const PLANS_PER_TIER: usize = 2;

/// The largest factor the advisor multiplies the GPUs by.
pub const MAX_GPU_MULTIPLIER: u64 = 64;

/// What a person gives up with a change, from least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// The same math: checkpointing, micro-batches with accumulation, sharding, more GPUs,
    /// expert parallelism. Costs compute, communication or hardware.
    SameMath,
    /// A cheaper precision recipe, weight format or KV-cache dtype.
    Precision,
    /// More GPUs than samples per optimizer step: a larger global batch (training).
    GlobalBatch,
    /// An optimizer with less state.
    Optimizer,
    /// Fewer trained parameters: LoRA adapters on a frozen base.
    Lora,
    /// Fewer trained parameters on a base quantized to 4 bits (QLoRA).
    Qlora,
    /// A shorter sequence: a different task.
    Task,
}

impl Tier {
    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Tier::SameMath => "Same math",
            Tier::Precision => "Lower precision",
            Tier::GlobalBatch => "Larger global batch",
            Tier::Optimizer => "Lighter optimizer",
            Tier::Lora => "Fewer trained parameters (LoRA)",
            Tier::Qlora => "Fewer trained parameters on a 4-bit base (QLoRA)",
            Tier::Task => "Shorter sequences",
        }
    }
}

/// One change a plan makes to the inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Change {
    /// Turn on activation checkpointing (every layer; offloaded: the layer inputs in CPU
    /// memory).
    Checkpointing(Checkpointing),
    /// A loss that never holds the whole vocabulary-sized logits (the same loss value).
    Loss(LossKind),
    /// Smaller micro-batches with gradient accumulation keeping the global batch (in
    /// inference: the sequences in several passes).
    MicroBatch {
        /// Samples per GPU per pass.
        micro_batch: u64,
        /// Passes per optimizer step (per generation).
        accumulation_steps: u64,
        /// Whether the step trains (accumulation) or not (passes).
        training: bool,
    },
    /// Shard the model state with this ZeRO stage.
    Sharding(Sharding),
    /// More data-parallel GPUs of the same kind.
    Gpus {
        /// GPUs before.
        from: u64,
        /// GPUs after.
        to: u64,
        /// Training with more GPUs than samples per step: the global batch it grows to (one
        /// sample per GPU); `None` when the global batch stays.
        global_batch_grows_to: Option<u64>,
    },
    /// A larger expert-parallel group (mixtures of experts).
    ExpertParallel {
        /// Group size before.
        from: u64,
        /// Group size after.
        to: u64,
    },
    /// A cheaper precision recipe.
    Recipe(PrecisionRecipe),
    /// A cheaper precision (simple mode).
    Precision(Precision),
    /// Quantized weights (inference).
    WeightFormat(WeightFormat),
    /// A quantized KV cache (inference).
    KvDtype(KvDtype),
    /// An optimizer with less state.
    Optimizer(Optimizer),
    /// Train adapters instead of the whole model (LoRA), or on a 4-bit base (QLoRA).
    Method(Method),
    /// Shorter sequences.
    SeqLen {
        /// Tokens before.
        from: u64,
        /// Tokens after.
        to: u64,
    },
    /// DPO and GRPO: shorter completions.
    Completion {
        /// Tokens before.
        from: u64,
        /// Tokens after.
        to: u64,
    },
    /// GRPO: fewer completions per prompt.
    Generations {
        /// Generations before.
        from: u64,
        /// Generations after.
        to: u64,
    },
    /// DPO: the reference's log-probabilities from elsewhere (precomputed, or the LoRA
    /// base with its adapters off): the same loss.
    Reference(crate::Reference),
}

impl Change {
    /// What it gives up.
    #[must_use]
    pub const fn tier(&self) -> Tier {
        match self {
            Change::Gpus {
                global_batch_grows_to: Some(_),
                ..
            } => Tier::GlobalBatch,
            Change::Checkpointing(_)
            | Change::Loss(_)
            | Change::MicroBatch { .. }
            | Change::Sharding(_)
            | Change::Gpus { .. }
            | Change::ExpertParallel { .. } => Tier::SameMath,
            Change::Recipe(_)
            | Change::Precision(_)
            | Change::WeightFormat(_)
            | Change::KvDtype(_) => Tier::Precision,
            Change::Optimizer(_) => Tier::Optimizer,
            Change::Method(Method::Qlora) => Tier::Qlora,
            Change::Method(_) => Tier::Lora,
            Change::SeqLen { .. } | Change::Completion { .. } | Change::Generations { .. } => {
                Tier::Task
            }
            Change::Reference(_) => Tier::SameMath,
        }
    }

    /// Extra compute, in percent of the step.
    #[must_use]
    pub const fn compute_overhead_percent(&self) -> u64 {
        match self {
            // the forward runs twice: about a third of forward + backward (1 + 2)
            Change::Checkpointing(_) => 33,
            _ => 0,
        }
    }

    /// What to change, for a person.
    #[must_use]
    pub fn label(&self) -> String {
        match *self {
            Change::Checkpointing(Checkpointing::Offload) => {
                "Turn on activation checkpointing with the layer inputs offloaded to CPU memory"
                    .to_owned()
            }
            Change::Checkpointing(_) => "Turn on activation checkpointing (every layer)".to_owned(),
            Change::Loss(l) => format!("Loss: {}", l.label()),
            Change::MicroBatch {
                micro_batch,
                accumulation_steps,
                training: true,
            } => format!(
                "Micro-batch of {micro_batch} per GPU with {accumulation_steps} accumulation steps"
            ),
            Change::MicroBatch {
                micro_batch,
                accumulation_steps,
                training: false,
            } => format!(
                "{accumulation_steps} passes of {micro_batch} sequence{} per GPU",
                if micro_batch == 1 { "" } else { "s" }
            ),
            Change::Sharding(s) => format!("Shard with {}", s.label()),
            Change::Gpus {
                from,
                to,
                global_batch_grows_to: None,
            } => format!("{to} GPUs instead of {from}"),
            Change::Gpus {
                from,
                to,
                global_batch_grows_to: Some(global),
            } => format!("{to} GPUs instead of {from} (global batch {global})"),
            Change::ExpertParallel { from, to } => {
                format!("Expert parallelism over {to} GPUs instead of {from}")
            }
            Change::Recipe(r) => format!("Precision recipe: {}", r.label()),
            Change::Precision(p) => format!("Weights in {}", p.label()),
            Change::WeightFormat(f) => format!("Weights in {}", f.label()),
            Change::KvDtype(k) => format!("KV cache in {}", k.label()),
            Change::Optimizer(o) => format!("Optimizer: {}", o.label()),
            Change::Method(Method::Qlora) => {
                "QLoRA: a 4-bit nf4 base (double quantization) with LoRA adapters (r 16, every \
                 linear)"
                    .to_owned()
            }
            Change::Method(m) => format!("{}: adapters (r 16, every linear) on a frozen base", {
                m.label()
            }),
            Change::SeqLen { from, to } => format!("Sequences of {to} tokens instead of {from}"),
            Change::Completion { from, to } => {
                format!("Completions of {to} tokens instead of {from}")
            }
            Change::Generations { from, to } => {
                format!("{to} generations per prompt instead of {from}")
            }
            Change::Reference(r) => format!("Reference: {}", r.label()),
        }
    }

    /// What it costs, for a person.
    #[must_use]
    pub fn cost(&self) -> String {
        match *self {
            Change::Checkpointing(Checkpointing::Offload) => {
                "About a third more compute, and each layer's input copied to CPU memory and \
                 back (pinned host RAM)."
                    .to_owned()
            }
            Change::Checkpointing(_) => {
                "About a third more compute: each layer's forward runs again in backward."
                    .to_owned()
            }
            Change::Loss(_) => {
                "The same loss and gradients; the head runs in chunks (TRL's SFTTrainer does so \
                 by default), a few percent more compute."
                    .to_owned()
            }
            Change::MicroBatch {
                accumulation_steps,
                training: true,
                ..
            } => format!(
                "Same global batch and math; {accumulation_steps} smaller passes per optimizer \
                 step use the GPU less well."
            ),
            Change::MicroBatch {
                accumulation_steps,
                training: false,
                ..
            } => format!("Same outputs; {accumulation_steps} passes instead of one."),
            Change::Sharding(Sharding::Zero3) => {
                "Same math; parameters gathered layer by layer: about 1.5x the communication of \
                 DDP."
                    .to_owned()
            }
            Change::Sharding(_) => {
                "Same math; state split over the GPUs, about the communication of DDP.".to_owned()
            }
            Change::Gpus {
                from,
                to,
                global_batch_grows_to: None,
            } => format!(
                "{}x the hardware; each GPU takes a share of the global batch.",
                to / from.max(1)
            ),
            Change::Gpus {
                from,
                to,
                global_batch_grows_to: Some(_),
            } => format!(
                "{}x the hardware; more GPUs than samples per step: a larger global batch \
                 (retune the learning rate).",
                to / from.max(1)
            ),
            Change::ExpertParallel { .. } => {
                "Same math; tokens travel between GPUs (all-to-all) at every expert layer."
                    .to_owned()
            }
            Change::Recipe(PrecisionRecipe::Bf16) => {
                "No fp32 master weights: updates smaller than bf16's precision are lost \
                 (stochastic rounding or Kahan summation recover most)."
                    .to_owned()
            }
            Change::Recipe(PrecisionRecipe::MixedBf16 | PrecisionRecipe::MixedFp16) => {
                "16-bit weights and gradients with an fp32 master copy: about AMP's accuracy."
                    .to_owned()
            }
            Change::Recipe(PrecisionRecipe::AmpFp16) => {
                "Matmuls in fp16 under autocast; fp16 needs loss scaling.".to_owned()
            }
            Change::Recipe(_) => {
                "Matmuls in 16 bits under autocast: standard mixed precision.".to_owned()
            }
            Change::Precision(Precision::Int8) | Change::WeightFormat(_) => {
                "Quantized weights: some accuracy lost, more the fewer the bits.".to_owned()
            }
            Change::Precision(_) => "16-bit weights: standard mixed precision.".to_owned(),
            Change::KvDtype(_) => {
                "Quantized KV cache: a small accuracy loss, growing with the context.".to_owned()
            }
            Change::Optimizer(Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit) => {
                "AdamW with 1-byte moments (bitsandbytes): about AdamW's results, one more \
                 dependency."
                    .to_owned()
            }
            Change::Optimizer(Optimizer::Adafactor | Optimizer::AdafactorHf) => {
                "Factored second moments and no first moment: less state, often slower \
                 convergence; retune the learning rate."
                    .to_owned()
            }
            Change::Method(Method::Qlora) => {
                "Only the adapters train, on a base quantized to 4 bits: close to LoRA's \
                 quality, slower matmuls (dequantized on the fly)."
                    .to_owned()
            }
            Change::Method(_) => {
                "Only low-rank adapters train: a different fine-tune, usually close to full \
                 fine-tuning on narrow tasks, weaker on new knowledge."
                    .to_owned()
            }
            Change::Optimizer(Optimizer::SgdMomentum) => {
                "One state per weight instead of two: different training dynamics; retune the \
                 learning rate."
                    .to_owned()
            }
            Change::Optimizer(_) => {
                "No optimizer state: plain SGD trains transformers poorly.".to_owned()
            }
            Change::SeqLen { .. } => {
                "A different task: the model sees shorter contexts.".to_owned()
            }
            Change::Completion { .. } => "A different task: answers are cut shorter.".to_owned(),
            Change::Generations { .. } => {
                "Noisier advantages: smaller groups per prompt.".to_owned()
            }
            Change::Reference(_) => {
                "The same loss, without a reference's copy of the weights in memory.".to_owned()
            }
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Knobs, in the order of [`RankKey::levels`].
const KNOBS: usize = 14;
const MICRO: usize = 0;
const CKPT: usize = 1;
const SHARD: usize = 2;
const GPUS: usize = 3;
const EP: usize = 4;
const RECIPE: usize = 5;
const PRECISION: usize = 6;
const FORMAT: usize = 7;
const KV: usize = 8;
const OPTIMIZER: usize = 9;
const METHOD: usize = 10;
const SEQ: usize = 11;
const LOSS: usize = 12;
/// DPO's reference, GRPO's generations per prompt.
const OBJ: usize = 13;
/// The knobs that give something up (with checkpointing, the ones tried one by one).
const GIVE_UPS: [usize; 7] = [RECIPE, PRECISION, FORMAT, KV, OPTIMIZER, METHOD, SEQ];
/// The give-ups along which the peak shrinks (all but the recipe).
const MONOTONE_GIVE_UPS: [usize; 5] = [PRECISION, FORMAT, KV, OPTIMIZER, SEQ];

/// A plan: the level of every knob (0 = as it is).
type Levels = [u8; KNOBS];

/// `l` as one integer, the key of the search's cache: hashed as two words, where the
/// levels' 14 bytes were hashed byte slice by byte slice (a copy per word).
fn packed(l: &Levels) -> u128 {
    let mut bytes = [0u8; 16];
    if let Some(head) = bytes.get_mut(..KNOBS) {
        head.copy_from_slice(l);
    }
    u128::from_le_bytes(bytes)
}

/// What the search walks in order: whether more GPUs are needed, then the give-ups.
type Group = (bool, [u8; 5]);

/// The sort key of a plan: plans compare field by field, in this order (a total order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RankKey {
    /// Whether the plan needs more GPUs than the person has: the plans on their own
    /// hardware come first, whatever the others give up.
    pub more_gpus: bool,
    /// The most a change of the plan gives up.
    pub tier: Tier,
    /// How far the plan goes in the tiers that give something up, the task first: options
    /// down the sequence chain (or the completion and GRPO's generations chains), down the training-method chain (LoRA, QLoRA), down the
    /// optimizer chain, 1 when the global batch grows (more GPUs than samples per step),
    /// options down the precision chains (summed).
    pub give_up: [u8; 5],
    /// GPUs in all (data-parallel x tensor-parallel): hardware is given up before the
    /// number of settings that change.
    pub gpus: u64,
    /// How many settings change.
    pub changes: u8,
    /// Extra compute in percent (checkpointing: 33).
    pub compute_overhead_percent: u64,
    /// Tie-breaker: the option of each knob (micro-batch, checkpointing, sharding, GPUs,
    /// expert parallelism, recipe, precision, weight format, KV dtype, optimizer, training
    /// method, sequence (or DPO's and GRPO's completion), loss, DPO's reference or GRPO's
    /// generations).
    pub levels: [u8; KNOBS],
}

/// A configuration that fits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitPlan {
    /// What changes, in knob order (empty: it fits as it is).
    pub changes: Vec<Change>,
    /// Its place in the order of plans.
    pub rank: RankKey,
    /// The inputs it leads to (`encode_query(&plan.state)` links to it).
    pub state: PageState,
    /// Samples per GPU per pass.
    pub batch: u64,
    /// The peak per GPU at that batch.
    pub peak_bytes: u64,
    /// Its verdict on the device (it fits).
    pub verdict: FitVerdict,
    /// The largest batch per GPU that fits.
    pub max_batch: MaxBatch,
    /// Micro-batch x accumulation x GPUs, when the plan trains with a global batch to keep.
    pub accumulation: Option<AccumulationPlan>,
}

impl FitPlan {
    /// The heading of its group: "On your RTX 4090" (or "On your 8 × H100 80 GB") for a
    /// plan on the GPUs the inputs have, "On more GPUs" for the others.
    #[must_use]
    pub fn group_heading(&self) -> String {
        if self.rank.more_gpus {
            return "On more GPUs".to_owned();
        }
        let name = self.state.hardware.gpu.map_or("device", crate::Gpu::name);
        match self.rank.gpus {
            1 => format!("On your {name}"),
            n => format!("On your {n} × {name}"),
        }
    }
}

/// The options of every knob, the current one first.
#[derive(Clone, Debug, Default)]
struct Options {
    micro: usize,
    checkpointing: Vec<Checkpointing>,
    sharding: Vec<Sharding>,
    gpus: Vec<u64>,
    ep: Vec<u64>,
    recipe: Vec<PrecisionRecipe>,
    precision: Vec<Precision>,
    weight_format: Vec<WeightFormat>,
    kv: Vec<KvDtype>,
    optimizer: Vec<Optimizer>,
    method: Vec<Option<Peft>>,
    seq: Vec<u64>,
    loss: Vec<LossKind>,
    objective: Vec<crate::Objective>,
}

impl Options {
    fn counts(&self) -> [usize; KNOBS] {
        [
            self.micro,
            self.checkpointing.len(),
            self.sharding.len(),
            self.gpus.len(),
            self.ep.len(),
            self.recipe.len(),
            self.precision.len(),
            self.weight_format.len(),
            self.kv.len(),
            self.optimizer.len(),
            self.method.len(),
            self.seq.len(),
            self.loss.len(),
            self.objective.len(),
        ]
    }
}

/// `current` followed by the options after it in `chain` (just `current` when it is not in it).
fn after<T: Copy + PartialEq>(current: T, chain: &[T]) -> Vec<T> {
    let mut out = vec![current];
    if let Some(at) = chain.iter().position(|&c| c == current) {
        out.extend(chain.iter().skip(at + 1).copied());
    }
    out
}

/// Slack under which the pruning bound does not prune (rounding in the sharded figures).
const PRUNE_SLACK_BYTES: u64 = BYTES_PER_MIB;

/// Everything a search needs, parsed once.
struct Search<'a> {
    parsed: &'a Parsed,
    knobs: Knobs,
    plan: PlanInputs,
    capacity: u64,
    training: bool,
    /// Samples per optimizer step to keep.
    global: u64,
    options: Options,
    /// Peak by (levels without the micro-batch, [packed](packed), batch); `None` when it
    /// cannot be estimated.
    /// At batch 0 (no step has one): [`Self::fewest_gpus`] of each combination asked, which
    /// shares the map (one hash table's code less in the bundle).
    cache: FxHashMap<(u128, u64), Option<u64>>,
    /// The whole model's steps (what sharding does not change), found through `cache`: see
    /// [`Self::step`].
    estimates: Vec<Result<Unsharded, EvaluationError>>,
    /// [`Self::run`]'s ranked give-up combinations, made and sorted once: a search asked
    /// again (a plan dropped by its own replay) walks the same ones.
    combos: Vec<(RankKey, Levels)>,
}

impl<'a> Search<'a> {
    fn new(state: &PageState, parsed: &'a Parsed, knobs: Knobs, mut plan: PlanInputs) -> Self {
        let capacity = plan.capacity_bytes.unwrap_or(0);
        let training = knobs.optimizer.trains();
        // Colocated vLLM's reservation is outside the allocator's reserve, the same for
        // every plan (no change touches the generator or its share). A paged optimizer's
        // state, outside it too, is left in the search's verdicts (a little more needed
        // than the page's: a plan at the edge may be left out) and out of a listed plan's
        // figures, made from its step.
        if training {
            plan.overheads.outside_allocator_bytes = knobs.objective.colocated_vllm_bytes(capacity);
        }
        let n = plan.num_gpus.max(1);
        let global = plan
            .global_batch
            .unwrap_or_else(|| knobs.batch.saturating_mul(n))
            .max(1);
        let model = match parsed {
            Parsed::Architecture(m) => Some(m),
            Parsed::Simple { .. } => None,
        };
        let arch = model.map(|m| &m.arch);
        let text_arch = arch.filter(|a| !a.is_vision());
        let inference_model = model.filter(|_| !training);
        // torchtune steps in backward only without gradient accumulation
        let mut o = Options {
            micro: if training && knobs.optimizer_in_backward {
                1
            } else {
                2
            },
            ..Options::default()
        };
        o.checkpointing = if arch.is_some() && training {
            match knobs.checkpointing {
                // a selective setting may go on to checkpointing every layer
                c @ (Checkpointing::EveryNth(_) | Checkpointing::Ops) => {
                    vec![c, Checkpointing::Full, Checkpointing::Offload]
                }
                c => after(c, &Checkpointing::ADVISED),
            }
        } else {
            vec![knobs.checkpointing]
        };
        o.sharding = if training || plan.sharding == Sharding::Zero3 {
            after(plan.sharding, &Sharding::ALL)
        } else {
            // without gradients or optimizer states only ZeRO-3 changes anything
            vec![plan.sharding, Sharding::Zero3]
        };
        // more of the same: discrete GPUs only (not Macs, not the CPU's RAM)
        o.gpus = if state.hardware.gpu.is_none_or(crate::Gpu::has_cuda_context) {
            (0..=MAX_GPU_MULTIPLIER.ilog2())
                .map(|k| n.saturating_mul(1 << k))
                .take_while(|&g| g <= crate::state::MAX_GPUS)
                .collect()
        } else {
            vec![n]
        };
        let most_gpus = o.gpus.last().copied().unwrap_or(n);
        o.ep = match arch {
            Some(a) if a.is_moe() => (0..=most_gpus.ilog2())
                .map(|k| plan.expert_parallel.max(1).saturating_mul(1 << k))
                .take_while(|&e| e <= most_gpus)
                .collect(),
            _ => vec![plan.expert_parallel],
        };
        if o.ep.is_empty() {
            o.ep.push(plan.expert_parallel);
        }
        o.recipe = match arch {
            Some(_) if training => {
                let fp16 = matches!(
                    knobs.recipe,
                    PrecisionRecipe::AmpFp16 | PrecisionRecipe::MixedFp16
                ) || (knobs.recipe == PrecisionRecipe::Fp32
                    && !state.hardware.gpu.is_none_or(crate::Gpu::supports_bf16));
                let chain: &[PrecisionRecipe] = if fp16 {
                    &[
                        PrecisionRecipe::Fp32,
                        PrecisionRecipe::AmpFp16,
                        PrecisionRecipe::MixedFp16,
                    ]
                } else {
                    &[
                        PrecisionRecipe::Fp32,
                        PrecisionRecipe::AmpBf16,
                        PrecisionRecipe::MixedBf16,
                        PrecisionRecipe::Bf16,
                    ]
                };
                after(knobs.recipe, chain)
            }
            _ => vec![knobs.recipe],
        };
        o.precision = match arch {
            None if training => after(knobs.precision, &[Precision::Fp32, Precision::Half]),
            None => after(knobs.precision, &Precision::ALL),
            Some(_) => vec![knobs.precision],
        };
        o.weight_format = match inference_model {
            Some(m) => {
                let current = knobs.weight_format;
                let bytes = |f: WeightFormat| {
                    f.shape_bytes(&m.shape)
                        .unwrap_or_else(|| m.n_params.saturating_mul(knobs.recipe.weight_bytes()))
                };
                // Macs and CPUs run GGUF (llama.cpp); bitsandbytes and int8 kernels are
                // CUDA's. GGUF stays GGUF.
                let cuda = state.hardware.gpu.is_none_or(crate::Gpu::has_cuda_context);
                let ladder: Vec<WeightFormat> = if current.is_gguf() || !cuda {
                    // WeightFormat::ALL lists the GGUF types from the largest down
                    WeightFormat::ALL
                        .into_iter()
                        .filter(|f| f.is_gguf())
                        .collect()
                } else {
                    vec![WeightFormat::Half, WeightFormat::Int8, WeightFormat::Nf4]
                };
                // from the current format, each option lighter than the one before it
                let mut chain = vec![current];
                for f in ladder {
                    if chain.last().is_some_and(|&last| bytes(f) < bytes(last)) {
                        chain.push(f);
                    }
                }
                chain
            }
            None => vec![knobs.weight_format],
        };
        let generates = matches!(parsed, Parsed::Architecture(m) if m.new_tokens > 0);
        o.kv = match text_arch {
            Some(_) if !training && generates => {
                if knobs.weight_format.is_gguf() {
                    after(
                        knobs.kv_dtype,
                        &[KvDtype::Model, KvDtype::Q8_0, KvDtype::Q4_0],
                    )
                } else {
                    after(knobs.kv_dtype, &[KvDtype::Model, KvDtype::Fp8])
                }
            }
            _ => vec![knobs.kv_dtype],
        };
        o.optimizer = if !training {
            vec![knobs.optimizer]
        } else if arch.is_some() {
            // each option keeps less state than the one before it (Adafactor: factored
            // second moments only), so the peak shrinks along the chain
            after(
                knobs.optimizer,
                &[Optimizer::AdamW, Optimizer::AdamW8bit, Optimizer::Adafactor],
            )
        } else {
            after(knobs.optimizer, &[Optimizer::AdamW, Optimizer::SgdMomentum])
        };
        o.method = match arch {
            Some(a) if training => method_chain(a, knobs.peft),
            _ => vec![knobs.peft],
        };
        // DPO and GRPO set their sequence from the prompt and completion, and always run
        // TRL's fused head
        let objective = knobs.objective;
        let sft = objective.kind == crate::ObjectiveKind::Sft;
        // DPO and GRPO: the completions shorten instead of the sequence
        let shortened = if sft {
            knobs.seq_len
        } else {
            objective.max_completion
        };
        o.seq = match text_arch {
            Some(_) => (0..=4)
                .map(|k| shortened >> k)
                .take_while(|&s| s >= 1)
                .collect(),
            None => vec![shortened],
        };
        // DPO's reference from elsewhere; GRPO's groups halved down to two
        o.objective = vec![objective];
        if training && text_arch.is_some() {
            match objective.kind {
                crate::ObjectiveKind::Dpo
                    if objective.reference != crate::Reference::Precomputed =>
                {
                    o.objective.push(crate::Objective {
                        reference: crate::Reference::Precomputed,
                        ..objective
                    });
                }
                crate::ObjectiveKind::Grpo => {
                    let mut g = objective.generations / 2;
                    while g >= 2 {
                        o.objective.push(crate::Objective {
                            generations: g,
                            ..objective
                        });
                        g /= 2;
                    }
                }
                _ => {}
            }
        }
        // a loss that keeps the logits whole gives way to TRL's chunked one (causal LMs)
        o.loss = match text_arch {
            Some(a)
                if training
                    && sft
                    && a.is_causal_lm()
                    && matches!(
                        knobs.loss,
                        LossKind::Hf | LossKind::TrlNll | LossKind::TorchtuneChunked
                    ) =>
            {
                vec![knobs.loss, LossKind::TrlChunked]
            }
            _ => vec![knobs.loss],
        };
        Self {
            parsed,
            knobs,
            plan,
            capacity,
            training,
            global,
            options: o,
            // (a search keeps a few thousand peaks: room for them from the start, rather
            // than the table rebuilt at each doubling)
            cache: FxHashMap::with_capacity_and_hasher(1 << 13, Default::default()),
            estimates: Vec::new(),
            combos: Vec::new(),
        }
    }

    /// Whether training on the GPUs of `level` grows the global batch (more GPUs than
    /// samples per step).
    fn grows(&self, level: u8) -> bool {
        self.training && self.gpus_at(level) > self.global
    }

    fn gpus_at(&self, level: u8) -> u64 {
        self.options
            .gpus
            .get(usize::from(level))
            .copied()
            .unwrap_or(self.plan.num_gpus)
    }

    /// Samples per GPU per step with the GPUs of `level`: as typed on the current GPUs, else
    /// the global batch shared out (at least one).
    fn per_gpu_batch(&self, level: u8) -> u64 {
        if level == 0 {
            self.knobs.batch
        } else {
            self.knobs
                .batch
                .min(self.global.div_ceil(self.gpus_at(level).max(1)))
                .max(1)
        }
    }

    /// Whether the levels make a plan: sharding needs 2+ GPUs, the expert group must divide
    /// them, a smaller micro-batch needs a batch above 1.
    fn valid(&self, l: &Levels) -> bool {
        let n = self.gpus_at(l[GPUS]);
        let ep = self
            .options
            .ep
            .get(usize::from(l[EP]))
            .copied()
            .unwrap_or(1);
        (l[SHARD] == 0 || n > 1)
            && (l[EP] == 0 || (ep <= n && n.is_multiple_of(ep.max(1))))
            && (l[MICRO] == 0 || self.per_gpu_batch(l[GPUS]) > 1)
    }

    /// The knobs and planning inputs of `l` (the batch is the per-GPU batch before any
    /// micro-batch change).
    fn config(&self, l: &Levels) -> (Knobs, PlanInputs) {
        let o = &self.options;
        fn pick<T: Copy>(options: &[T], l: &Levels, knob: usize, current: T) -> T {
            l.get(knob)
                .and_then(|&x| options.get(usize::from(x)))
                .copied()
                .unwrap_or(current)
        }
        let k = self.knobs;
        let knobs = Knobs {
            batch: self.per_gpu_batch(l[GPUS]),
            seq_len: pick(&o.seq, l, SEQ, k.seq_len),
            precision: pick(&o.precision, l, PRECISION, k.precision),
            optimizer: pick(&o.optimizer, l, OPTIMIZER, k.optimizer),
            peft: pick(&o.method, l, METHOD, k.peft),
            recipe: pick(&o.recipe, l, RECIPE, k.recipe),
            attention: k.attention,
            loss: pick(&o.loss, l, LOSS, k.loss),
            packing: k.packing,
            padding: k.padding,
            optimizer_impl: k.optimizer_impl,
            compile: k.compile,
            optimizer_in_backward: k.optimizer_in_backward,
            activation_offload: k.activation_offload,
            kernels: k.kernels,
            checkpointing: pick(&o.checkpointing, l, CKPT, k.checkpointing),
            weight_format: pick(&o.weight_format, l, FORMAT, k.weight_format),
            kv_dtype: pick(&o.kv, l, KV, k.kv_dtype),
            objective: pick(&o.objective, l, OBJ, k.objective),
            #[cfg(feature = "vision")]
            vision: k.vision,
        };
        let mut knobs = knobs;
        if knobs.objective.kind != crate::ObjectiveKind::Sft {
            knobs.seq_len = k.seq_len;
            knobs.objective.max_completion = pick(&o.seq, l, SEQ, knobs.objective.max_completion);
            // a LoRA plan's reference is its base with the adapters off, as TRL makes it
            if knobs.peft.is_some()
                && k.peft.is_none()
                && knobs.objective.reference == crate::Reference::Separate
            {
                knobs.objective.reference = crate::Reference::AdaptersOff;
            }
        }
        let plan = PlanInputs {
            num_gpus: self.gpus_at(l[GPUS]),
            sharding: pick(&o.sharding, l, SHARD, self.plan.sharding),
            expert_parallel: pick(&o.ep, l, EP, self.plan.expert_parallel),
            // a plan trains to the global batch: a smaller micro-batch accumulates its
            // gradients over the passes (its link says so)
            global_batch: if self.training {
                Some(self.global)
            } else {
                self.plan.global_batch
            },
            ..self.plan
        }
        .with_communication();
        (knobs, plan)
    }

    /// The peak of `l` (a smaller micro-batch is evaluated at batch 1), cached.
    fn peak(&mut self, l: &Levels) -> Option<u64> {
        // (the key before the configuration: most calls find their peak cached)
        let batch = if l[MICRO] > 0 {
            1
        } else {
            self.per_gpu_batch(l[GPUS])
        };
        let mut key = *l;
        key[MICRO] = 0;
        if let Some(&peak) = self.cache.get(&(packed(&key), batch)) {
            return peak;
        }
        let (knobs, plan) = self.config(l);
        // (the peak read in place: `ok()` first moved the whole step)
        let peak = match self.step(l, knobs, &plan, batch) {
            Ok(s) => Some(s.peak_bytes),
            Err(_) => None,
        };
        self.cache.insert((packed(&key), batch), peak);
        peak
    }

    /// The step of `l`'s `knobs` at `batch` sharded as `plan` says: [`step_at`], with the
    /// whole model's estimate cached (sharding, GPUs and expert parallelism act after it).
    fn step(
        &mut self,
        l: &Levels,
        knobs: Knobs,
        plan: &PlanInputs,
        batch: u64,
    ) -> Result<StepMemory, EvaluationError> {
        let knobs = Knobs { batch, ..knobs };
        let model = self.parsed.model(&knobs);
        if plan.pipeline_parallel > 1 {
            // every stage's step, uncached
            return step_at(&model, plan, batch);
        }
        let mesh = crate::rank::mesh_of(plan);
        // The estimate depends on the give-ups and the batch alone: the mesh does not
        // change with the GPUs, sharding or expert parallelism, the KV dtype acts after the
        // estimate, and training ignores the weight format. Its index is kept in `cache`
        // under those levels, marked apart from the peaks (micro-batch level u8::MAX): a
        // hash lookup instead of comparing the settings of hundreds of estimates.
        let mut whole_key = *l;
        whole_key[MICRO] = u8::MAX;
        whole_key[SHARD] = 0;
        // the GPUs change the estimate only through gradient accumulation, whose replay
        // repeats itself from its fourth micro-batch on (the tape's, from its second)
        let micro_batches = plan.micro_batches_at(batch);
        whole_key[GPUS] = u8::try_from(micro_batches.min(STEADY_PASSES)).unwrap_or(u8::MAX);
        whole_key[EP] = 0;
        whole_key[KV] = 0;
        if self.training {
            whole_key[FORMAT] = 0;
        }
        let at = match self.cache.get(&(packed(&whole_key), batch)) {
            Some(&Some(at)) => usize::try_from(at).unwrap_or(usize::MAX),
            _ => {
                // the parameter units of an earlier estimate: every estimate of a search is
                // of one model on one mesh (the levels change the GPUs, sharding and expert
                // parallelism, which the mesh does not read)
                let units = self.estimates.iter().find_map(|e| match e {
                    Ok(Unsharded::Architecture(_, units, _)) => Some(units),
                    _ => None,
                });
                let whole = unsharded(&model, batch, micro_batches, &mesh, units);
                self.estimates.push(whole);
                let at = self.estimates.len() - 1;
                self.cache
                    .insert((packed(&whole_key), batch), Some(at as u64));
                at
            }
        };
        let Some(whole) = self.estimates.get(at) else {
            return Err(crate::evaluate::too_large());
        };
        match whole {
            Ok(whole) => shard_step(&model, whole, plan, batch, false, &mesh),
            Err(e) => Err(e.clone()),
        }
    }

    /// The step of `l`'s `knobs` at `batch`, its verdict and the largest batch that fits:
    /// what `evaluate`'s `fit_at` computes, through the cache.
    fn fit(
        &mut self,
        l: &Levels,
        knobs: Knobs,
        plan: &PlanInputs,
        batch: u64,
    ) -> Result<(StepMemory, FitVerdict, MaxBatch), EvaluationError> {
        let step = self.step(l, knobs, plan, batch)?;
        let overheads = step.overheads(&plan.overheads);
        let verdict = fit_verdict(step.peak_bytes, self.capacity, &overheads);
        let capacity = self.capacity;
        let (max_batch, _) = largest_batch(plan, capacity, &overheads, &mut |b| {
            self.step(l, knobs, plan, b)
        })?;
        Ok((step, verdict, max_batch))
    }

    /// Whether `peak` fits with the overheads of `l`'s groups (NCCL's grow with them).
    fn fits_peak(&self, l: &Levels, peak: u64) -> bool {
        let overheads = self.config(l).1.overheads;
        fit_verdict(peak, self.capacity, &overheads).fits()
    }

    fn fits(&mut self, l: &Levels) -> bool {
        self.peak(l).is_some_and(|p| self.fits_peak(l, p))
    }

    /// Whether `l` might fit: false only when it misses by more than the slack. NCCL's
    /// buffers are left out: they grow with the groups, not with what the pruning assumes
    /// saves memory (more GPUs, expert parallelism), so without them the bound holds.
    fn might_fit(&mut self, l: &Levels) -> bool {
        let overheads = crate::Overheads {
            communication_bytes: 0,
            ..self.plan.overheads
        };
        self.peak(l).is_some_and(|p| {
            fit_verdict(
                p.saturating_sub(PRUNE_SLACK_BYTES),
                self.capacity,
                &overheads,
            )
            .fits()
        })
    }

    /// `l` with the same-math knobs that are monotone (micro-batch, sharding, expert
    /// parallelism) at their most memory-saving valid option for its GPUs.
    fn most_saving(&self, l: &Levels) -> Levels {
        let mut m = *l;
        let n = self.gpus_at(l[GPUS]);
        m[SHARD] = if n > 1 {
            level(self.options.sharding.len().saturating_sub(1))
        } else {
            0
        };
        m[EP] = 0;
        for (i, &ep) in self.options.ep.iter().enumerate() {
            if ep <= n && n.is_multiple_of(ep.max(1)) {
                m[EP] = level(i);
            }
        }
        m[MICRO] = u8::from(self.per_gpu_batch(l[GPUS]) > 1);
        m
    }

    /// Whether `l` with the knobs `dims` at their last option, the most GPUs and the most
    /// memory-saving same-math settings might fit. When it does not, neither does `l` with
    /// any option of `dims` and any same-math settings.
    fn corner_might_fit(&mut self, l: &Levels, dims: &[usize]) -> bool {
        let counts = self.options.counts();
        let mut corner = *l;
        for &d in dims {
            corner[d] = level(counts[d].saturating_sub(1));
        }
        corner[GPUS] = level(counts[GPUS].saturating_sub(1));
        let corner = self.most_saving(&corner);
        self.might_fit_sharded(&corner)
    }

    /// Whether `l` might fit with one of the sharding options: none saves the most in
    /// every case (ZeRO's buckets against FSDP2's gathered units, ZeRO-1's whole
    /// gradients against ZeRO-2's reductions).
    fn might_fit_sharded(&mut self, l: &Levels) -> bool {
        // a smaller micro-batch does not always need less: gradient accumulation keeps every
        // gradient alive through the later passes, which can outweigh the activations it saves
        (0..=l[MICRO]).any(|micro| {
            let mut probe = *l;
            probe[MICRO] = micro;
            self.might_fit_sharded_at(&probe)
        })
    }

    fn might_fit_sharded_at(&mut self, l: &Levels) -> bool {
        if self.gpus_at(l[GPUS]) <= 1 {
            return self.might_fit(l);
        }
        let options = level(self.options.sharding.len());
        (0..options).any(|shard| {
            let mut probe = *l;
            probe[SHARD] = shard;
            self.valid(&probe) && self.might_fit(&probe)
        })
    }

    /// The fewest GPUs (level) with which `l`'s give-ups and checkpointing might fit, with
    /// the most memory-saving same-math settings; `None` when not even the most GPUs do.
    /// Cached: the search asks it for each range of GPUs a combination is tried on.
    fn fewest_gpus(&mut self, l: &Levels) -> Option<u8> {
        if let Some(&fewest) = self.cache.get(&(packed(l), 0)) {
            return fewest.map(|g| u8::try_from(g).unwrap_or(u8::MAX));
        }
        let fewest = self.find_fewest_gpus(l);
        self.cache.insert((packed(l), 0), fewest.map(u64::from));
        fewest
    }

    fn find_fewest_gpus(&mut self, l: &Levels) -> Option<u8> {
        // First the corners that settle many combinations with one estimate: every
        // monotone give-up at its last option, then the sequence alone.
        if !self.corner_might_fit(l, &MONOTONE_GIVE_UPS) || !self.corner_might_fit(l, &[SEQ]) {
            return None;
        }
        let top = level(self.options.gpus.len().saturating_sub(1));
        // one level after the other: more GPUs add NCCL's buffers, so a small model may
        // fit one GPU and not two
        (0..=top).find(|&g| {
            let mut probe = *l;
            probe[GPUS] = g;
            let probe = self.most_saving(&probe);
            self.might_fit_sharded(&probe)
        })
    }

    fn rank(&self, l: &Levels) -> RankKey {
        // fewer GRPO generations change the task as shorter completions do
        let grpo = self.knobs.objective.kind == crate::ObjectiveKind::Grpo;
        let give_up = [
            l[SEQ].saturating_add(if grpo { l[OBJ] } else { 0 }),
            l[METHOD],
            l[OPTIMIZER],
            u8::from(self.grows(l[GPUS])),
            l[RECIPE]
                .saturating_add(l[PRECISION])
                .saturating_add(l[FORMAT])
                .saturating_add(l[KV]),
        ];
        let tier = if give_up[0] > 0 {
            Tier::Task
        } else if l[METHOD] > 0 {
            if self
                .options
                .method
                .get(usize::from(l[METHOD]))
                .copied()
                .flatten()
                .is_some_and(|p| p.quantized())
            {
                Tier::Qlora
            } else {
                Tier::Lora
            }
        } else if give_up[2] > 0 {
            Tier::Optimizer
        } else if give_up[3] > 0 {
            Tier::GlobalBatch
        } else if give_up[4] > 0 {
            Tier::Precision
        } else {
            Tier::SameMath
        };
        RankKey {
            more_gpus: l[GPUS] > 0,
            tier,
            give_up,
            gpus: self
                .gpus_at(l[GPUS])
                .saturating_mul(self.plan.model_parallel_gpus()),
            changes: level(l.iter().filter(|&&x| x > 0).count()),
            compute_overhead_percent: if l[CKPT] > 0 {
                Change::Checkpointing(Checkpointing::Full).compute_overhead_percent()
            } else {
                0
            },
            levels: *l,
        }
    }

    /// Every combination of give-ups and checkpointing, as levels (the rest at 0).
    fn give_up_combinations(&self) -> Vec<Levels> {
        let counts = self.options.counts();
        let mut knobs = vec![CKPT, LOSS, OBJ];
        knobs.extend(GIVE_UPS);
        odometer(&knobs, &counts)
    }

    /// The listed plans, best first (see the module docs).
    fn run(&mut self, limit: usize) -> Vec<Levels> {
        // every fitting plan no other dominates, in rank order: what later plans are checked
        // against, listed or not
        let mut found: Vec<Levels> = Vec::new();
        let mut listed: Vec<Levels> = Vec::new();
        if limit == 0 {
            return listed;
        }
        let counts = self.options.counts();
        let top = level(counts[GPUS]);
        // the GPU levels that keep the global batch, then those that grow it
        let keeps = (0..top).take_while(|&g| !self.grows(g)).count();
        let keeps = level(keeps);
        // each give-up combination three times: on the GPUs the person has, on more that
        // keep the global batch, and on more that grow it
        let cuts = [0, 1, keeps.max(1), top].map(|c| c.min(top));
        // each combination with its window's first GPU level, ranked: the rank orders by
        // (more GPUs, give-ups) as the groups do (the tier follows the give-ups), and sorting
        // the same type as the candidates below keeps one sort in the bundle
        let mut combos = std::mem::take(&mut self.combos);
        if combos.is_empty() {
            for combo in self.give_up_combinations() {
                for gpus in cuts.windows(2).map(|w| w[0]..w[1]) {
                    if !gpus.is_empty() {
                        let mut probe = combo;
                        probe[GPUS] = gpus.start;
                        combos.push((self.rank(&probe), probe));
                    }
                }
            }
            sort_ranked(&mut combos);
        }
        // the same-math settings every combination tries (one list for the whole search)
        let same_math = odometer(&[MICRO, SHARD, EP], &counts);
        let group_of = |rank: &RankKey| -> Group { (rank.more_gpus, rank.give_up) };
        // (the rest of the key depends on the same-math knobs: ordered within each group)
        let mut i = 0;
        while i < combos.len() && listed.len() < limit {
            let group = combos.get(i).map(|(r, _)| group_of(r));
            let mut candidates: Vec<(RankKey, Levels)> = Vec::new();
            while let Some((rank, probe)) = combos.get(i) {
                if Some(group_of(rank)) != group {
                    break;
                }
                i += 1;
                // the window: from its first level to the next cut
                let start = probe[GPUS];
                let end = cuts.iter().copied().find(|&c| c > start).unwrap_or(start);
                let mut combo = *probe;
                combo[GPUS] = 0;
                // every plan of this combination gives up at least what it does
                if found.iter().any(|f| dominates(f, &combo)) {
                    continue;
                }
                let Some(fewest) = self.fewest_gpus(&combo) else {
                    continue;
                };
                for g in fewest.max(start)..end {
                    for m in &same_math {
                        let mut l = combo;
                        l[GPUS] = g;
                        l[MICRO] = m[MICRO];
                        l[SHARD] = m[SHARD];
                        l[EP] = m[EP];
                        if self.valid(&l) {
                            candidates.push((self.rank(&l), l));
                        }
                    }
                }
            }
            sort_ranked(&mut candidates);
            for (rank, l) in candidates {
                if listed.len() >= limit {
                    break;
                }
                if found.iter().any(|f| dominates(f, &l)) {
                    continue;
                }
                if self.fits(&l) {
                    found.push(l);
                    if listed
                        .iter()
                        .filter(|x| {
                            let r = self.rank(x);
                            (r.more_gpus, r.tier) == (rank.more_gpus, rank.tier)
                        })
                        .count()
                        < PLANS_PER_TIER
                    {
                        listed.push(l);
                    }
                }
            }
        }
        self.combos = combos;
        listed
    }

    /// The plan of `l`, evaluated as the page would.
    fn plan_of(&mut self, state: &PageState, l: &Levels) -> Result<FitPlan, EvaluationError> {
        let (mut knobs, plan) = self.config(l);
        let n = plan.num_gpus.max(1);
        let per_gpu = knobs.batch;
        let mut changes = Vec::new();
        let mut accumulation = None;
        let mut passes = None;
        if l[MICRO] > 0 {
            let largest = match self.fit(l, knobs, &plan, 1)?.2 {
                MaxBatch::Fits(b) => b.min(per_gpu),
                MaxBatch::NoneFits(_) => 1,
            };
            let target = if self.training {
                self.global
            } else {
                per_gpu.saturating_mul(n)
            };
            let a = plan_accumulation(target, largest, n).unwrap_or(AccumulationPlan {
                micro_batch: 1,
                accumulation_steps: per_gpu,
                num_gpus: n,
            });
            knobs.batch = a.micro_batch;
            passes = Some(a);
        } else if l[GPUS] > 0 || self.plan.global_batch.is_some() {
            accumulation = Some(AccumulationPlan {
                micro_batch: per_gpu,
                accumulation_steps: self.global.div_ceil(n).div_ceil(per_gpu.max(1)).max(1),
                num_gpus: n,
            });
        }
        if let Some(a) = passes {
            changes.push(Change::MicroBatch {
                micro_batch: a.micro_batch,
                accumulation_steps: a.accumulation_steps,
                training: self.training,
            });
            accumulation = Some(a);
        }
        // inference accumulates nothing: its passes are in the change
        let accumulation = accumulation.filter(|_| self.training);
        let o = &self.options;
        if l[CKPT] > 0 {
            changes.push(Change::Checkpointing(knobs.checkpointing));
        }
        if l[LOSS] > 0 {
            changes.push(Change::Loss(knobs.loss));
        }
        if l[SHARD] > 0 {
            changes.push(Change::Sharding(plan.sharding));
        }
        if l[GPUS] > 0 {
            changes.push(Change::Gpus {
                from: self.plan.num_gpus,
                to: n,
                global_batch_grows_to: (self.training && n > self.global).then_some(n),
            });
        }
        if l[EP] > 0 {
            changes.push(Change::ExpertParallel {
                from: self.plan.expert_parallel,
                to: plan.expert_parallel,
            });
        }
        if l[RECIPE] > 0 {
            changes.push(Change::Recipe(knobs.recipe));
        }
        if l[PRECISION] > 0 {
            changes.push(Change::Precision(knobs.precision));
        }
        if l[FORMAT] > 0 {
            changes.push(Change::WeightFormat(knobs.weight_format));
        }
        if l[KV] > 0 {
            changes.push(Change::KvDtype(knobs.kv_dtype));
        }
        if l[OPTIMIZER] > 0 {
            changes.push(Change::Optimizer(knobs.optimizer));
        }
        if l[METHOD] > 0 {
            changes.push(Change::Method(
                knobs.peft.map_or(Method::Full, |p| p.method),
            ));
        }
        let rl = knobs.objective.kind != crate::ObjectiveKind::Sft;
        let (was, now) = (self.knobs.objective, knobs.objective);
        if l[SEQ] > 0 && rl {
            changes.push(Change::Completion {
                from: was.max_completion,
                to: now.max_completion,
            });
        } else if l[SEQ] > 0 {
            changes.push(Change::SeqLen {
                from: o.seq.first().copied().unwrap_or(knobs.seq_len),
                to: knobs.seq_len,
            });
        }
        if now.generations != was.generations {
            changes.push(Change::Generations {
                from: was.generations,
                to: now.generations,
            });
        }
        if now.reference != was.reference {
            changes.push(Change::Reference(now.reference));
        }
        // the plan's own step replayed through the allocator, as its link's page will
        let mut plan = plan;
        crate::evaluate::resolve_reserve(&mut plan, &self.parsed.model(&knobs), knobs.batch);
        // the figures its link's page shows (the largest batch held to each batch's own
        // allocator replay)
        // (each batch's step from the search's estimates, which the largest-batch search
        // and its neighbours' replays otherwise estimate again)
        let parsed = self.parsed;
        let fit = crate::evaluate::fit_with(&parsed.model(&knobs), &plan, knobs.batch, &mut |b| {
            self.step(l, knobs, &plan, b)
        })?;
        let (step, verdict, max_batch) = (
            fit.step,
            fit.verdict.ok_or_else(no_device)?,
            fit.max_batch.ok_or_else(no_device)?,
        );
        // only what changes is rewritten: the rest stays as typed
        let mut next = state.clone();
        if knobs.batch != self.knobs.batch {
            next.step.batch = knobs.batch.to_string();
        }
        if l[GPUS] > 0 {
            // the field holds the job's GPUs: the data-parallel ones times the other groups
            next.parallel.num_gpus = n.saturating_mul(plan.model_parallel_gpus()).to_string();
        }
        if l[EP] > 0 {
            next.parallel.expert_parallel = plan.expert_parallel.to_string();
        }
        if l[SEQ] > 0 && rl {
            next.step.max_completion = now.max_completion.to_string();
        } else if l[SEQ] > 0 {
            next.step.seq_len = knobs.seq_len.to_string();
        }
        if now.generations != was.generations {
            next.step.generations = now.generations.to_string();
        }
        next.step.reference = now.reference;
        next.parallel.sharding = plan.sharding;
        next.step.optimizer = knobs.optimizer;
        next.step.checkpointing = knobs.checkpointing;
        next.step.loss = knobs.loss;
        next.simple.precision = knobs.precision;
        next.step.recipe = knobs.recipe;
        next.inference.weight_format = knobs.weight_format;
        next.inference.kv_dtype = knobs.kv_dtype;
        if l[METHOD] > 0 {
            if let Some(peft) = knobs.peft {
                if self.knobs.peft.is_none() {
                    // the adapters of the page's defaults (what `method_chain` chose)
                    let defaults = PageState::default();
                    next.training.lora_rank = defaults.training.lora_rank;
                    next.training.lora_dropout = defaults.training.lora_dropout;
                    next.training.lora_targets = defaults.training.lora_targets;
                    next.training.lora_fp32 = defaults.training.lora_fp32;
                    next.training.base_fp32 = defaults.training.base_fp32;
                }
                next.training.method = peft.method;
                next.training.quant = peft.quant;
                next.training.double_quant = peft.double_quant;
                next.training.kbit_prepare = peft.kbit_prepare;
            }
        }
        // the page plans accumulation for a global batch: name it when steps are needed
        if accumulation.is_some_and(|a| a.accumulation_steps > 1) {
            next.parallel.global_batch = self.global.to_string();
        }
        Ok(FitPlan {
            changes,
            rank: self.rank(l),
            state: next,
            batch: knobs.batch,
            peak_bytes: step.peak_bytes,
            verdict,
            max_batch,
            accumulation,
        })
    }
}

/// The training methods after `current`: full fine-tuning, then LoRA with the page's
/// defaults (r 16 on every linear, fp32 adapters, no dropout), then QLoRA on the same adapters
/// (nf4, double quantization, k-bit preparation). A LoRA setup keeps its adapters for QLoRA.
fn method_chain(arch: &crate::Architecture, current: Option<Peft>) -> Vec<Option<Peft>> {
    let defaults = PageState::default();
    let qlora = |lora: Peft| Peft {
        method: Method::Qlora,
        quant: defaults.training.quant,
        double_quant: defaults.training.double_quant,
        kbit_prepare: defaults.training.kbit_prepare,
        ..lora
    };
    match current {
        // the page's LoRA fields at their defaults, read by the page's own parser
        None => match ({
            let mut lora = PageState::default();
            lora.training.method = Method::Lora;
            lora
        })
        .parsed_peft(arch)
        {
            Ok(Some(lora)) => vec![None, Some(lora), Some(qlora(lora))],
            _ => vec![None],
        },
        Some(p) if p.method == Method::Lora => vec![current, Some(qlora(p))],
        Some(_) => vec![current],
    }
}

fn level(i: usize) -> u8 {
    u8::try_from(i).unwrap_or(u8::MAX)
}

/// Every combination of the options of `knobs` (`counts` options each), the others at 0.
fn odometer(knobs: &[usize], counts: &[usize; KNOBS]) -> Vec<Levels> {
    let mut out = Vec::new();
    let mut l: Levels = [0; KNOBS];
    loop {
        out.push(l);
        let mut carried = true;
        for &k in knobs {
            let count = counts.get(k).copied().unwrap_or(1).max(1);
            if let Some(x) = l.get_mut(k) {
                if usize::from(*x) + 1 < count {
                    *x += 1;
                    carried = false;
                    break;
                }
                *x = 0;
            }
        }
        if carried {
            return out;
        }
    }
}

/// Sorts ranked plans in ascending order by a heapsort: a few hundred bytes of wasm where
/// `sort_unstable` compiled its quicksort, small-sort and heapsort fallback. The order is
/// the same: a plan's rank and levels compare as a total order whose equal elements are
/// identical.
// (generic for its test; the advisor sorts one type)
fn sort_ranked<T: Ord>(v: &mut [T]) {
    // moves `v[root]` down the heap `v[..end]` until neither child is larger
    fn sift_down<T: Ord>(v: &mut [T], mut root: usize, end: usize) {
        loop {
            let mut child = 2 * root + 1;
            if child >= end {
                return;
            }
            if child + 1 < end && v[child] < v[child + 1] {
                child += 1;
            }
            if v[root] >= v[child] {
                return;
            }
            v.swap(root, child);
            root = child;
        }
    }
    let n = v.len();
    for root in (0..n / 2).rev() {
        sift_down(v, root, n);
    }
    for end in (1..n).rev() {
        v.swap(0, end);
        sift_down(v, 0, end);
    }
}

/// Whether `a` gives up no more than `b` on every knob (and is another plan).
fn dominates(a: &Levels, b: &Levels) -> bool {
    a != b && a.iter().zip(b).all(|(x, y)| x <= y)
}

fn no_device() -> EvaluationError {
    EvaluationError::Fields(vec![(
        Field::Gpu,
        "Choose a GPU (or another device) to fit the step on.".to_owned(),
    )])
}

/// The configurations that fit on the chosen device, best first, at most `limit` of them
/// (see the module docs for what is tried and how plans are ordered). Empty when nothing the
/// advisor tries fits; one plan without changes when the step fits as it is.
///
/// # Errors
/// What keeps `state` from being evaluated ([`evaluate`](crate::evaluate)'s errors), or a
/// [`Field::Gpu`] error when no device is chosen.
pub fn fit_advice(state: &PageState, limit: usize) -> Result<Vec<FitPlan>, EvaluationError> {
    crate::Scenario::parse(state)?.advise(state, limit)
}

/// [`fit_advice`] of inputs already parsed (`state` is what the plans' links change).
pub(crate) fn advise_parsed(
    state: &PageState,
    plan: &PlanInputs,
    parsed: &Parsed,
    knobs: Knobs,
    limit: usize,
) -> Result<Vec<FitPlan>, EvaluationError> {
    if plan.capacity_bytes.is_none() {
        return Err(no_device());
    }
    // the page's own errors first (a sequence the model cannot take, a figure too large)
    let model = parsed.model(&knobs);
    step_at(&model, plan, knobs.batch)?;
    // every plan is held to the reserve the page's own step needs
    let mut plan = *plan;
    crate::evaluate::resolve_reserve(&mut plan, &model, knobs.batch);
    let mut search = Search::new(state, parsed, knobs, plan);
    // the search holds every plan to the page's reserve; a plan whose own replay reserves
    // more may not fit after all: it is dropped, and the search asked for more
    let mut asked = limit;
    // each plan is evaluated once, however often the search is asked again
    // (a few dozen at most: a list, which weighs less in the bundle than a map)
    let mut evaluated: Vec<(Levels, FitPlan)> = Vec::new();
    loop {
        let found = search.run(asked);
        let mut plans = Vec::new();
        for l in &found {
            let plan = match evaluated.iter().find(|(e, _)| e == l) {
                Some((_, plan)) => plan.clone(),
                None => {
                    let plan = search.plan_of(state, l)?;
                    evaluated.push((*l, plan.clone()));
                    plan
                }
            };
            if plan.verdict.fits() {
                plans.push(plan);
            }
            if plans.len() == limit {
                break;
            }
        }
        if plans.len() == limit || found.len() < asked || asked >= limit.saturating_mul(3) {
            return Ok(plans);
        }
        asked = asked.saturating_add(limit - plans.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluate::parse_all;
    use crate::{decode_query, encode_query, evaluate, Gpu, Preset};
    use proptest::prelude::*;

    /// Every plan of the same space, by brute force: all fitting plans not dominated by
    /// another fitting plan, sorted, the first `limit`.
    fn brute_force(search: &mut Search, limit: usize) -> Vec<Levels> {
        let counts = search.options.counts();
        let all: Vec<usize> = (0..KNOBS).collect();
        let mut fitting: Vec<Levels> = Vec::new();
        for l in odometer(&all, &counts) {
            if search.valid(&l) && search.fits(&l) {
                fitting.push(l);
            }
        }
        let mut kept: Vec<(RankKey, Levels)> = fitting
            .iter()
            .filter(|l| !fitting.iter().any(|f| dominates(f, l)))
            .map(|l| (search.rank(l), *l))
            .collect();
        kept.sort_unstable();
        let mut listed: Vec<(RankKey, Levels)> = Vec::new();
        for (rank, l) in kept {
            if listed.len() < limit
                && listed
                    .iter()
                    .filter(|(r, _)| (r.more_gpus, r.tier) == (rank.more_gpus, rank.tier))
                    .count()
                    < PLANS_PER_TIER
            {
                listed.push((rank, l));
            }
        }
        listed.into_iter().map(|(_, l)| l).collect()
    }

    fn advice(query: &str, limit: usize) -> Vec<FitPlan> {
        let decoded = decode_query(query);
        assert!(decoded.notices.is_empty(), "{query}: {:?}", decoded.notices);
        fit_advice(&decoded.state, limit).unwrap()
    }

    #[track_caller]
    fn every_plan_fits(query: &str, plans: &[FitPlan]) {
        for p in plans {
            let e = evaluate(&p.state).unwrap();
            let v = e.verdict.unwrap();
            assert!(v.fits(), "{query}: {:?} does not fit: {v:?}", p.changes);
            assert_eq!(e.step.peak_bytes, p.peak_bytes, "{query}: {:?}", p.changes);
            assert_eq!(e.max_batch, Some(p.max_batch), "{query}");
            // the link leads to the same state
            let back = decode_query(&encode_query(&p.state));
            assert!(back.notices.is_empty(), "{:?}", back.notices);
            assert_eq!(back.state, p.state);
        }
        assert!(
            plans.windows(2).all(|w| w[0].rank < w[1].rank),
            "{query}: not in rank order"
        );
    }

    #[test]
    fn llama3_8b_on_an_rtx_4090() {
        let query = "m=arch&model=llama3-8b&gpu=rtx4090";
        let state = decode_query(query).state;
        assert_eq!(state.hardware.gpu, Some(Gpu::Rtx4090));
        assert!(!evaluate(&state).unwrap().verdict.unwrap().fits());
        let plans = advice(query, 5);
        assert!(!plans.is_empty());
        every_plan_fits(query, &plans);
        // the plans on the one GPU the person has come first, then those on more
        assert_eq!(
            plans[0].state.parallel.num_gpus, "1",
            "{:?}",
            plans[0].changes
        );
        assert!(!plans[0].rank.more_gpus);
        assert_eq!(plans[0].group_heading(), "On your RTX 4090");
        assert!(plans.windows(2).all(|w| w[0].rank <= w[1].rank));
        let more = advice(query, 12);
        every_plan_fits(query, &more);
        let first_more = more
            .iter()
            .position(|p| p.rank.more_gpus)
            .expect("plans on more GPUs");
        assert!(first_more > 0);
        assert!(more[first_more..].iter().all(|p| p.rank.more_gpus));
        // among those, the best still trains every parameter with AdamW: sharded over 16
        // GPUs, one sample each (on 8 the ranks' all-gather and reduce-scatter streams
        // cache more than a 4090 has left); a lighter optimizer comes later
        let best = &more[first_more];
        assert_eq!(best.group_heading(), "On more GPUs");
        assert!(best.rank.tier <= Tier::GlobalBatch, "{:?}", best.changes);
        assert!(best.state.parallel.num_gpus.parse::<u64>().unwrap() <= 16);
        for group in [&more[..first_more], &more[first_more..]] {
            assert!(group.windows(2).all(|w| w[0].rank.tier <= w[1].rank.tier));
        }
    }

    /// A small model with a large vocabulary: the logits are what does not fit, and TRL's
    /// chunked loss (the same math) is the first plan; BERT's masked-LM head is offered none.
    #[test]
    fn a_chunked_loss_comes_first_when_the_logits_do_not_fit() {
        let query = "m=arch&model=qwen3-0.6b&gpu=rtx4090&b=3&s=2048&r=bf16";
        let plans = advice(query, 6);
        every_plan_fits(query, &plans);
        assert_eq!(plans[0].changes, [Change::Loss(LossKind::TrlChunked)]);
        assert_eq!(plans[0].rank.tier, Tier::SameMath);
        assert_eq!(plans[0].state.step.loss, LossKind::TrlChunked);
        assert!(encode_query(&plans[0].state).contains("loss=trl-chunked"));
        let bert = advice("m=arch&model=bert-base&gpu=t4&b=256&s=512", 12);
        assert!(bert
            .iter()
            .all(|p| !p.changes.iter().any(|c| matches!(c, Change::Loss(_)))));
    }

    /// The example: a QLoRA plan fits where full fine-tuning does not, with the
    /// page's adapters (r 16 on every linear, nf4, double quantization, k-bit preparation).
    #[test]
    fn llama3_8b_qlora_on_an_rtx_4090() {
        let query = "m=arch&model=llama3-8b&gpu=rtx4090&b=1&s=2048";
        let plans = advice(query, 12);
        every_plan_fits(query, &plans);
        let qlora = plans
            .iter()
            .find(|p| p.changes.contains(&Change::Method(Method::Qlora)))
            .expect("a QLoRA plan");
        assert_eq!(qlora.rank.tier, Tier::Qlora);
        assert_eq!(qlora.state.training.method, Method::Qlora);
        assert_eq!(qlora.state.training.lora_rank, "16");
        assert_eq!(qlora.state.training.lora_targets, "all-linear");
        assert!(qlora.state.training.double_quant && qlora.state.training.kbit_prepare);
        assert_eq!(qlora.state.parallel.num_gpus, "1");
        // at most PLANS_PER_TIER a tier in each group
        for tier in [
            Tier::SameMath,
            Tier::GlobalBatch,
            Tier::Optimizer,
            Tier::Lora,
            Tier::Task,
        ] {
            for more_gpus in [false, true] {
                let n = plans
                    .iter()
                    .filter(|p| (p.rank.more_gpus, p.rank.tier) == (more_gpus, tier))
                    .count();
                assert!(n <= PLANS_PER_TIER);
            }
        }
        // a LoRA setup goes on to QLoRA with its own adapters
        let lora = "m=arch&model=llama3-8b&gpu=rtx4090&b=1&s=2048&method=lora&lr=8&lt=attention";
        let plans = advice(lora, 12);
        every_plan_fits(lora, &plans);
        let q = plans
            .iter()
            .find(|p| p.changes.contains(&Change::Method(Method::Qlora)))
            .expect("a QLoRA plan");
        assert_eq!(q.state.training.lora_rank, "8");
        assert_eq!(q.state.training.lora_targets, "attention");
    }

    #[test]
    fn macs_and_cpus_get_no_more_devices() {
        for (query, format) in [
            (
                "m=arch&model=llama3-70b&o=none&r=bf16&b=1&s=2048&gen=2048&gpu=mac-128",
                WeightFormat::Q8_0,
            ),
            (
                "m=arch&model=llama3-70b&o=none&r=bf16&b=1&s=2048&gen=2048&gpu=cpu&ram=64",
                // 57.9 GB of Q6_K weights and the cache fit in 64 of RAM less the 5% margin
                WeightFormat::Q6K,
            ),
        ] {
            let plans = advice(query, 5);
            every_plan_fits(query, &plans);
            assert_eq!(plans[0].changes, [Change::WeightFormat(format)], "{query}");
            for p in &plans {
                assert!(
                    !p.changes
                        .iter()
                        .any(|c| matches!(c, Change::Gpus { .. } | Change::Sharding(_))),
                    "{query}: {:?}",
                    p.changes
                );
            }
        }
    }

    #[test]
    fn a_step_that_fits_is_its_own_plan() {
        let query = "m=arch&model=gpt2&b=2&s=512&gpu=h100-80";
        let plans = advice(query, 5);
        assert_eq!(plans.len(), 1);
        assert!(plans[0].changes.is_empty());
        assert_eq!(plans[0].rank.tier, Tier::SameMath);
        let state = decode_query(query).state;
        assert_eq!(plans[0].state, state);
    }

    #[test]
    fn inference_suggests_quantized_weights() {
        // Llama-3-8B in bf16 fits a 24 GB GPU with a 2,048-token cache; a 16 GB T4 needs
        // quantized weights or a second GPU.
        let query = "m=arch&model=llama3-8b&o=none&r=bf16&b=1&s=1024&gen=1024&gpu=rtx3090&n=1";
        let plans = advice(query, 3);
        every_plan_fits(query, &plans);
        assert!(plans[0].changes.is_empty(), "{:?}", plans[0].changes);
        let query = "m=arch&model=llama3-8b&o=none&r=bf16&b=1&s=1024&gen=1024&gpu=t4";
        let plans = advice(query, 4);
        every_plan_fits(query, &plans);
        assert!(
            plans.iter().any(|p| p
                .changes
                .iter()
                .any(|c| matches!(c, Change::WeightFormat(_)))),
            "{:?}",
            plans.iter().map(|p| &p.changes).collect::<Vec<_>>()
        );
        // GGUF stays GGUF, with a llama.cpp cache
        let query = "m=arch&model=llama3-8b&o=none&r=bf16&b=1&s=8192&gen=8192&wf=q8_0&gpu=mac-8";
        let plans = advice(query, 4);
        every_plan_fits(query, &plans);
        for p in &plans {
            assert!(p.state.inference.weight_format.is_gguf());
        }
    }

    #[test]
    fn simple_mode_and_micro_batches() {
        let query = "p=1&pu=B&b=64&a=2000&gpu=a100-40";
        let plans = advice(query, 4);
        every_plan_fits(query, &plans);
        // the micro-batch alone keeps the global batch of 64
        let first = &plans[0];
        assert!(
            matches!(first.changes[..], [Change::MicroBatch { .. }]),
            "{:?}",
            first.changes
        );
        let a = first.accumulation.unwrap();
        assert!(a.global_batch() >= 64);
        assert_eq!(first.state.parallel.global_batch, "64");
    }

    #[test]
    fn no_device_no_advice() {
        let state = decode_query("m=arch&model=gpt2&gpu=none").state;
        assert!(matches!(
            fit_advice(&state, 3),
            Err(EvaluationError::Fields(f)) if f[0].0 == Field::Gpu
        ));
        let bad = decode_query("m=arch&model=gpt2&s=999999").state;
        assert!(fit_advice(&bad, 3).is_err());
    }

    #[test]
    fn nothing_fits_nothing_listed() {
        let plans = advice("m=arch&model=deepseek-v3&gpu=t4&b=1&s=512", 3);
        assert!(plans.is_empty());
    }

    #[test]
    fn change_labels() {
        for (c, label) in [
            (
                Change::Checkpointing(Checkpointing::Full),
                "Turn on activation checkpointing (every layer)",
            ),
            (
                Change::Gpus {
                    from: 1,
                    to: 8,
                    global_batch_grows_to: None,
                },
                "8 GPUs instead of 1",
            ),
            (
                Change::MicroBatch {
                    micro_batch: 2,
                    accumulation_steps: 4,
                    training: true,
                },
                "Micro-batch of 2 per GPU with 4 accumulation steps",
            ),
            (
                Change::SeqLen {
                    from: 2048,
                    to: 1024,
                },
                "Sequences of 1024 tokens instead of 2048",
            ),
        ] {
            assert_eq!(c.label(), label);
            assert!(!c.cost().is_empty());
        }
        assert!(Tier::SameMath < Tier::Precision && Tier::Optimizer < Tier::Task);
    }

    /// DPO's and GRPO's own knobs: a precomputed reference (the same loss), fewer
    /// generations and shorter completions (a different task), each link carrying them.
    #[test]
    fn objectives_offer_their_own_knobs() {
        let plans = |query: &str| {
            let state = decode_query(query).state;
            fit_advice(&state, 12).expect("plans")
        };
        let dpo = plans(
            "m=arch&model=qwen3-1.7b&r=bf16&b=4&obj=dpo&ref=separate&mp=512&mc=1536&gc=full\
             &gpu=custom&cap=14000",
        );
        let precomputed = dpo
            .iter()
            .find(|p| {
                p.changes
                    .contains(&Change::Reference(crate::Reference::Precomputed))
            })
            .expect("a precomputed reference");
        assert_eq!(
            Change::Reference(crate::Reference::Precomputed).tier(),
            Tier::SameMath
        );
        assert_eq!(
            precomputed.state.step.reference,
            crate::Reference::Precomputed
        );
        let grpo = plans(
            "m=arch&model=qwen3-0.6b&r=bf16&b=2&obj=grpo&ref=none&ng=16&mp=256&mc=4096&gc=full\
             &gpu=custom&cap=12000",
        );
        assert!(grpo.iter().any(|p| p
            .changes
            .iter()
            .any(|c| matches!(c, Change::Generations { from: 16, .. }))));
        assert!(grpo.iter().any(|p| p
            .changes
            .iter()
            .any(|c| matches!(c, Change::Completion { from: 4096, .. }))));
        for p in &grpo {
            // every plan's link gives the figures it promised
            let e = crate::evaluate(&p.state).expect("the plan's page");
            assert_eq!(e.step.peak_bytes, p.peak_bytes, "{:?}", p.changes);
        }
        // with colocated vLLM too: its reservation is outside the allocator's reserve in the
        // plans' verdicts as on their pages
        let colocated = plans(
            "m=arch&model=qwen3-1.7b&r=bf16&b=4&obj=grpo&ref=none&ng=8&mp=256&mc=2048&gc=full\
             &gtr=vllm-colocated&vllm=0.5&gpu=h100-80",
        );
        assert!(!colocated.is_empty());
        for p in &colocated {
            let e = crate::evaluate(&p.state).expect("the plan's page");
            assert!(e.plan.overheads.outside_allocator_bytes > 40_000_000_000);
            assert_eq!(e.step.peak_bytes, p.peak_bytes, "{:?}", p.changes);
            assert_eq!(e.max_batch, Some(p.max_batch), "{:?}", p.changes);
            assert_eq!(e.verdict, Some(p.verdict), "{:?}", p.changes);
        }
    }

    /// Small models, random settings and capacities: the pruned search lists exactly the
    /// first plans of the brute force.
    fn same_as_brute_force(query: &str, limit: usize) -> Result<(), TestCaseError> {
        let state = decode_query(query).state;
        let Ok((plan, parsed, knobs)) = parse_all(&state, None) else {
            return Ok(());
        };
        if plan.capacity_bytes.is_none()
            || step_at(&parsed.model(&knobs), &plan, knobs.batch).is_err()
        {
            return Ok(());
        }
        let mut search = Search::new(&state, &parsed, knobs, plan);
        let fast = search.run(limit);
        let mut again = Search::new(&state, &parsed, knobs, plan);
        let slow = brute_force(&mut again, limit);
        prop_assert_eq!(fast, slow, "{}", query);
        Ok(())
    }

    proptest! {
        #[test]
        fn sort_ranked_sorts(mut v in proptest::collection::vec((0u8..4, 0u8..4), 0..200)) {
            let mut sorted = v.clone();
            sorted.sort_unstable();
            sort_ranked(&mut v);
            prop_assert_eq!(v, sorted);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn pruned_search_equals_brute_force(
            model in prop::sample::select(vec!["gpt2", "qwen3-0.6b", "llama3.2-1b", "qwen1.5-moe-a2.7b"]),
            recipe in prop::sample::select(PrecisionRecipe::ALL.map(PrecisionRecipe::key).to_vec()),
            optimizer in prop::sample::select(vec!["adamw", "sgd-momentum", "adamw8bit", "none"]),
            method in prop::sample::select(vec!["full", "lora", "qlora"]),
            batch in 1u64..9,
            seq in prop::sample::select(vec![256u64, 512, 1024, 2048]),
            gen in prop::sample::select(vec![0u64, 256]),
            n in 1u64..3,
            shard in prop::sample::select(vec!["ddp", "zero1", "zero3"]),
            capacity_mib in 300u64..24_000,
            limit in 1usize..6,
        ) {
            let query = format!(
                "m=arch&model={model}&r={recipe}&o={optimizer}&b={batch}&s={seq}&gen={gen}\
                 &n={n}&shard={shard}&gpu=custom&cap={capacity_mib}&method={method}"
            );
            same_as_brute_force(&query, limit)?;
        }

        #[test]
        fn objective_pruned_search_equals_brute_force(
            model in prop::sample::select(vec!["qwen3-0.6b", "llama3.2-1b"]),
            objective in prop::sample::select(vec!["obj=dpo&ref=separate", "obj=dpo&ref=precomputed", "obj=grpo&ref=none&ng=8", "obj=grpo&ref=separate&ng=4&gtr=vllm-server"]),
            method in prop::sample::select(vec!["full", "lora"]),
            batch in 1u64..5,
            completion in prop::sample::select(vec![128u64, 512, 1024]),
            capacity_mib in 2_000u64..40_000,
            limit in 1usize..6,
        ) {
            let query = format!(
                "m=arch&model={model}&r=bf16&o=adamw&b={batch}&{objective}&mp=128&mc={completion}\
                 &gc=full&gpu=custom&cap={capacity_mib}&method={method}"
            );
            same_as_brute_force(&query, limit)?;
        }

        #[test]
        fn simple_pruned_search_equals_brute_force(
            params in 1u64..40,
            act in 0u64..3000,
            batch in 1u64..64,
            pr in prop::sample::select(vec!["fp32", "fp16"]),
            o in prop::sample::select(vec!["adamw", "sgd-momentum", "none"]),
            n in 1u64..4,
            capacity_mib in 300u64..60_000,
            limit in 1usize..8,
        ) {
            let query = format!(
                "p={params}&pu=B&a={act}&b={batch}&pr={pr}&o={o}&n={n}&gpu=custom&cap={capacity_mib}"
            );
            same_as_brute_force(&query, limit)?;
        }

        #[test]
        fn advice_never_panics(query in "[a-z]{1,6}=[-0-9a-z.%_]{0,12}(&[a-z]{1,6}=[-0-9a-z.%_]{0,12}){0,8}") {
            let _ = fit_advice(&decode_query(&query).state, 3);
        }
    }

    #[test]
    fn every_preset_s_plans_fit_on_an_rtx_4090() {
        for preset in Preset::ALL {
            let query = format!(
                "m=arch&model={}&s={}&gpu=rtx4090",
                preset.key(),
                preset.default_seq_len()
            );
            let plans = advice(&query, 3);
            every_plan_fits(&query, &plans);
        }
    }
}
