//! Everything the page (and the CLI) shows for one set of inputs, computed in one place.

use std::fmt;

use crate::formats::WeightShape;
use crate::rank::{mesh_of, reshard_after_forward, shard_step};
use crate::state::{Field, Mode, PageState, PlanInputs};
use crate::{
    fit_verdict, max_batch_that_fits, plan_accumulation, simple_breakdown_at_batch, sweep,
    AccumulationPlan, AllocatorPeaks, Architecture, AttentionKernel, Checkpointing, Compile,
    FitVerdict, KvDtype, LossKind, MaxBatch, Optimizer, OptimizerImpl, PeakEstimate, Phase,
    Precision, PrecisionRecipe, SavedPart, SimpleInputs, SweepRow, TrainingStep, WeightFormat,
    MAX_BATCH,
};

/// A vision-language model's images: their step and parameters.
#[cfg(feature = "vision")]
mod vision;

/// The longest sequence that fits and the sweep over sequence lengths.
mod sequence;

pub(crate) use sequence::{longest_sequence, sequence_sweep};
pub use sequence::{LongestSequence, SEQ_STEP};

/// A kind of memory in the breakdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PartKind {
    /// Model weights.
    Weights,
    /// Parameter gradients.
    Gradients,
    /// Optimizer states (with any FP32 master copy).
    OptimizerStates,
    /// Activations saved for backward (or live forward tensors in inference).
    Activations,
    /// Module buffers and the input batch.
    Buffers,
    /// Short-lived buffers (loss gradients, the optimizer's temporaries).
    Temporaries,
    /// The KV cache of generation.
    KvCache,
    /// A paged optimizer's state in CUDA managed memory: on the GPU, outside PyTorch's
    /// caching allocator (and so outside `max_memory_allocated`).
    PagedOptimizerStates,
    /// GRPO with colocated vLLM: the share of the device vLLM reserves for the whole run
    /// (`ceil(total x gpu_memory_utilization)`, vLLM 0.31.0's `request_memory`).
    VllmReservation,
}

impl PartKind {
    /// The `data-testid` of its line on the page, and its JSON key in the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            PartKind::Weights => "weights",
            PartKind::Gradients => "gradients",
            PartKind::OptimizerStates => "optimizer-states",
            PartKind::Activations => "activations",
            PartKind::Buffers => "buffers",
            PartKind::Temporaries => "temporaries",
            PartKind::KvCache => "kv-cache",
            PartKind::PagedOptimizerStates => "paged-optimizer-states",
            PartKind::VllmReservation => "vllm-reservation",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            PartKind::Weights => "Weights",
            PartKind::Gradients => "Gradients",
            PartKind::OptimizerStates => "Optimizer states",
            PartKind::Activations => "Activations",
            PartKind::Buffers => "Buffers and inputs",
            PartKind::Temporaries => "Temporaries",
            PartKind::KvCache => "KV cache",
            PartKind::PagedOptimizerStates => {
                "Paged optimizer states (outside PyTorch's allocator)"
            }
            PartKind::VllmReservation => {
                "vLLM's reservation (colocated, outside PyTorch's allocator)"
            }
        }
    }
}

impl PartKind {
    /// What to try when this kind takes the most memory and even batch 1 does not fit (the
    /// advisor lists the plans that do).
    #[must_use]
    pub const fn what_to_try(self) -> &'static str {
        match self {
            PartKind::OptimizerStates | PartKind::PagedOptimizerStates => {
                "Shard the optimizer states (ZeRO-1) over more GPUs, use an 8-bit optimizer, or train LoRA adapters."
            }
            PartKind::Weights | PartKind::Gradients => {
                "Shard the model (ZeRO-3 / FSDP) or split it (tensor parallelism) over more GPUs, or train QLoRA adapters on a 4-bit base."
            }
            PartKind::Activations | PartKind::Temporaries => {
                "Turn on activation checkpointing, shorten the sequence, or split the batch with gradient accumulation."
            }
            PartKind::KvCache => "Generate fewer tokens, quantize the KV cache, or run a smaller batch.",
            PartKind::Buffers => "Try a larger GPU.",
            PartKind::VllmReservation => {
                "Lower vllm_gpu_memory_utilization, or run vLLM as a server on other GPUs."
            }
        }
    }
}

impl Evaluation {
    /// The verdict in words: fits with how much left, or how much is missing; `None` when no
    /// device is chosen.
    #[must_use]
    pub fn verdict_text(&self, unit: crate::ByteUnit) -> Option<String> {
        let v = self.verdict.as_ref()?;
        let per_gpu = if self.per_gpu { " per GPU" } else { "" };
        Some(if v.fits() {
            format!(
                "Fits{per_gpu}: {} left.",
                crate::format_bytes(v.bytes_left(), unit)
            )
        } else {
            format!(
                "Does not fit{per_gpu}: {} missing.",
                crate::format_bytes(v.bytes_missing(), unit)
            )
        })
    }

    /// When even batch 1 does not fit: what it needs, what takes the most at the chosen
    /// batch, and what to try. `None` otherwise.
    #[must_use]
    pub fn nothing_fits_text(&self, unit: crate::ByteUnit) -> Option<String> {
        let Some(MaxBatch::NoneFits(at_one)) = self.max_batch else {
            return None;
        };
        let dominant = self.step.parts.iter().max_by_key(|(_, b)| *b);
        let why = dominant
            .map(|(k, b)| {
                format!(
                    " At the chosen batch, {} take the most: {}.",
                    k.label().to_ascii_lowercase(),
                    crate::format_bytes(*b, unit)
                )
            })
            .unwrap_or_default();
        Some(format!(
            "Even batch 1 does not fit: it needs {} of {} usable.{why} {}",
            crate::format_bytes(at_one.needed_bytes, unit),
            crate::format_bytes(at_one.usable_bytes, unit),
            dominant.map_or("Try a larger GPU.", |(k, _)| k.what_to_try()),
        ))
    }
}

/// The memory of one step at one batch, per GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepMemory {
    /// What is alive at the peak, by kind.
    pub parts: Vec<(PartKind, u64)>,
    /// The peak (simple mode: the sum of the parts).
    pub peak_bytes: u64,
    /// The phase of the peak (architecture mode).
    pub peak_phase: Option<Phase>,
    /// Weights + gradients + optimizer states held between steps.
    pub model_state_bytes: u64,
    /// Activations (saved for backward, or the KV cache in inference).
    pub activation_bytes: u64,
    /// Architecture mode: what the activations alive at the peak are for, summing exactly to
    /// the [`PartKind::Activations`] part. Empty in simple mode and when no activations are
    /// alive at the peak.
    pub activation_parts: Vec<(SavedPart, u64)>,
    /// Parameters with gradients: the adapters' under LoRA / QLoRA, all of them in full
    /// training, none in inference.
    pub trainable_params: u64,
    /// Part of `peak_bytes` a paged optimizer holds outside PyTorch's caching allocator.
    pub paged_bytes: u64,
    /// With pipeline parallelism, the stage whose GPU these figures are (the busiest).
    pub stage: Option<u64>,
    /// Micro-batches whose saved tensors that stage holds at most (1 without a pipeline).
    pub stage_in_flight: u64,
    /// Host RAM one GPU's process needs for what FSDP2 or DeepSpeed offloads (0 without).
    pub host_bytes: u64,
    /// DPO and GRPO: the peak of each phase per GPU, and which sets the step's peak.
    pub objective_phases: Option<PhasePeaks>,
}

impl StepMemory {
    /// Of the peak, what the caching allocator's reserve does not grow with: colocated
    /// vLLM's reservation and a paged optimizer's state ([`Overheads::outside_allocator_bytes`]).
    ///
    /// [`Overheads::outside_allocator_bytes`]: crate::Overheads::outside_allocator_bytes
    #[must_use]
    pub fn outside_allocator_bytes(&self) -> u64 {
        self.parts
            .iter()
            .filter(|(k, _)| *k == PartKind::VllmReservation)
            .fold(self.paged_bytes, |acc, (_, b)| acc.saturating_add(*b))
    }

    /// The plan's `overheads` for this step's verdicts: its memory outside the allocator
    /// set (the same at every batch: vLLM's share of the device, the optimizer's paged
    /// state).
    pub(crate) fn overheads(&self, overheads: &crate::Overheads) -> crate::Overheads {
        crate::Overheads {
            outside_allocator_bytes: self.outside_allocator_bytes(),
            ..*overheads
        }
    }
}

/// DPO's and GRPO's peaks per GPU by phase of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhasePeaks {
    /// GRPO's generation (the training process's memory meanwhile).
    pub generation_bytes: Option<u64>,
    /// The no-gradient log-probability passes, when any run.
    pub scoring_bytes: Option<u64>,
    /// Forward, backward and optimizer step.
    pub training_bytes: u64,
    /// The training phase's own peak moment (forward, backward or optimizer step).
    pub training_peak_phase: Phase,
    /// The phase that sets the step's peak.
    pub peak: crate::StepPhase,
}

/// `parts` (summing to `whole`) scaled to sum exactly to `target`: each part in proportion,
/// the rounding left over given to the largest part. Empty when either sum is 0.
pub(crate) fn scale_parts(
    parts: &[(SavedPart, u64)],
    whole: u64,
    target: u64,
) -> Vec<(SavedPart, u64)> {
    if whole == 0 || target == 0 {
        return Vec::new();
    }
    if whole == target {
        return parts.to_vec();
    }
    let mut scaled: Vec<(SavedPart, u64)> = parts
        .iter()
        .map(|&(part, bytes)| {
            let share = u128::from(bytes) * u128::from(target) / u128::from(whole);
            (part, u64::try_from(share).unwrap_or(u64::MAX))
        })
        .collect();
    let sum = scaled.iter().fold(0u64, |a, (_, b)| a.saturating_add(*b));
    if let Some(largest) = scaled.iter_mut().max_by_key(|(_, b)| *b) {
        largest.1 = largest.1.saturating_add(target.saturating_sub(sum));
    }
    scaled.retain(|(_, b)| *b > 0);
    scaled
}

/// Why nothing can be computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvaluationError {
    /// Fields whose text does not parse, with their messages.
    Fields(Vec<(Field, String)>),
    /// The model (pasted config) cannot be used.
    Model(String),
    /// The step cannot be estimated (a sequence too long, a figure too large).
    Step(String),
}

impl fmt::Display for EvaluationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvaluationError::Fields(fields) => {
                let names: Vec<&str> = fields.iter().map(|(field, _)| field.label()).collect();
                write!(
                    f,
                    "Fix the highlighted fields to see the figures ({}).",
                    names.join(", ")
                )
            }
            EvaluationError::Model(why) => write!(f, "The model cannot be used: {why}"),
            EvaluationError::Step(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for EvaluationError {}

/// Everything shown for one set of inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evaluation {
    /// The parameter count of the model.
    pub n_params: u64,
    /// The chosen step, per GPU.
    pub step: StepMemory,
    /// The batch per GPU of the chosen step.
    pub batch: u64,
    /// The sweep table.
    pub sweep: Vec<SweepRow>,
    /// Whether it fits on the chosen GPU.
    pub verdict: Option<FitVerdict>,
    /// The largest batch per GPU that fits on the chosen GPU.
    pub max_batch: Option<MaxBatch>,
    /// Micro-batch x accumulation x GPUs for the global batch, when one is asked for.
    pub accumulation: Option<AccumulationPlan>,
    /// Whether figures are per GPU of several (sharding or tensor parallelism).
    pub per_gpu: bool,
    /// The caching allocator's replay of the step, when the reserve comes from it (its
    /// slack over its own peak is `plan.overheads.allocator_reserve_ppm`).
    pub allocator: Option<AllocatorPeaks>,
    /// The planning inputs used.
    pub plan: PlanInputs,
}

/// The model of a page, parsed once: what does not change when the settings the advisor
/// tries change.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Parsed {
    /// Simple mode.
    Simple {
        /// Parameters.
        params: u64,
        /// Activation bytes per sample.
        activation_bytes_per_sample: u64,
    },
    /// Architecture mode.
    Architecture(Box<ArchModel>),
}

/// A model of the architecture mode with the figures of its architecture that every step
/// uses, counted once.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ArchModel {
    /// The model.
    pub arch: Architecture,
    /// Generated tokens (inference).
    pub new_tokens: u64,
    /// [`Architecture::parameter_count`].
    pub n_params: u64,
    /// [`Architecture::largest_layer_parameter_count`].
    pub largest_layer: u64,
    /// [`Architecture::routed_expert_parameter_count`].
    pub routed: u64,
    /// What the weight formats need of the model.
    pub shape: WeightShape,
}

impl ArchModel {
    pub(crate) fn new(arch: Architecture, new_tokens: u64) -> Self {
        let n_params = arch.parameter_count();
        Self {
            n_params,
            largest_layer: arch.largest_layer_parameter_count(),
            routed: arch.routed_expert_parameter_count(),
            shape: WeightShape::counted(&arch, n_params),
            arch,
            new_tokens,
        }
    }
}

/// The settings of one step that a person can change without changing the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Knobs {
    /// Samples per step (per GPU).
    pub batch: u64,
    /// Tokens per sample (architecture mode).
    pub seq_len: u64,
    /// Weights' precision (simple mode).
    pub precision: Precision,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// How torch.optim runs it (architecture mode).
    pub optimizer_impl: OptimizerImpl,
    /// `torch.compile` (architecture mode).
    pub compile: Compile,
    /// Precision recipe (architecture mode).
    pub recipe: PrecisionRecipe,
    /// Attention kernel (architecture mode).
    pub attention: AttentionKernel,
    /// Activation checkpointing (architecture mode).
    pub checkpointing: Checkpointing,
    /// The trainer's loss (architecture mode).
    pub loss: LossKind,
    /// Packed documents per row (architecture mode).
    pub packing: bool,
    /// Padded rows (architecture mode).
    pub padding: bool,
    /// torchtune's optimizer in backward (architecture mode).
    pub optimizer_in_backward: bool,
    /// torchtune's activation offloading (architecture mode).
    pub activation_offload: bool,
    /// The layers' kernels (architecture mode).
    pub kernels: crate::Kernels,
    /// Weight format (architecture mode, inference).
    pub weight_format: WeightFormat,
    /// KV-cache dtype (architecture mode, inference).
    pub kv_dtype: KvDtype,
    /// LoRA / QLoRA (architecture mode), `None` for full fine-tuning.
    pub peft: Option<crate::Peft>,
    /// Supervised, DPO or GRPO with its settings (architecture mode).
    pub objective: crate::Objective,
    /// A vision-language model's images and what trains of its vision side (`None` for
    /// every other model).
    #[cfg(feature = "vision")]
    pub vision: Option<crate::VisionInputs>,
}

/// A model ready to be evaluated at any batch.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Model<'a> {
    Simple(SimpleInputs),
    Architecture {
        model: &'a ArchModel,
        step: TrainingStep,
        /// Inference in a quantized format: the weights' bytes (`None`: the recipe's).
        format_weight_bytes: Option<u64>,
        kv_dtype: KvDtype,
        /// LoRA / QLoRA, `None` for full fine-tuning.
        peft: Option<crate::Peft>,
        /// Supervised, DPO or GRPO.
        objective: crate::Objective,
        /// A vision-language model's images (`None`: the text model alone).
        #[cfg(feature = "vision")]
        vision: Option<crate::VisionInputs>,
    },
}

/// The part of a step's memory that does not depend on how it is spread over GPUs: what the
/// advisor reuses across sharding, GPU counts and expert parallelism.
#[derive(Clone, Debug)]
pub(crate) enum Unsharded {
    Simple(crate::Breakdown),
    /// The rank's estimate and its parameters by FSDP unit: the units are found here, once
    /// per estimate, since sharding it (every GPU count, every engine the advisor tries)
    /// reads them each time and listing them walks every tensor of the model. The same goes
    /// for the parameter tensors in the model's order, which ZeRO-1 and ZeRO-2 partition:
    /// listed by the first of them to ask.
    Architecture(
        Box<PeakEstimate>,
        crate::ParameterUnits,
        std::cell::OnceCell<Option<Vec<u64>>>,
    ),
}

pub(crate) fn fields_error(errors: Vec<(Field, crate::FieldError)>) -> EvaluationError {
    EvaluationError::Fields(
        errors
            .into_iter()
            .map(|(f, e)| (f, e.to_string()))
            .collect(),
    )
}

/// Parses the model of `state` and its step settings.
pub(crate) fn parse_model(
    state: &PageState,
    arch: Option<&Result<Architecture, crate::ConfigError>>,
) -> Result<(Parsed, Knobs), EvaluationError> {
    let knobs = |batch: u64, seq_len: u64| Knobs {
        batch,
        seq_len,
        precision: state.simple.precision,
        optimizer: state.step.optimizer,
        optimizer_impl: state.step.optimizer_impl,
        compile: state.step.compile,
        recipe: state.step.recipe,
        attention: state.step.attention,
        checkpointing: state.step.checkpointing,
        loss: state.step.loss,
        packing: state.step.packing,
        padding: state.step.padding,
        optimizer_in_backward: state.step.optimizer_in_backward,
        activation_offload: state.step.activation_offload,
        kernels: state.step.kernels,
        weight_format: state.inference.weight_format,
        kv_dtype: state.inference.kv_dtype,
        peft: None,
        objective: crate::Objective::SFT,
        #[cfg(feature = "vision")]
        vision: None,
    };
    match state.mode {
        Mode::Simple => {
            let inputs = state.simple_inputs().map_err(fields_error)?;
            Ok((
                Parsed::Simple {
                    params: inputs.params,
                    activation_bytes_per_sample: inputs.activation_bytes_per_sample,
                },
                knobs(inputs.batch, 0),
            ))
        }
        Mode::Architecture => {
            let mut errors = Vec::new();
            let batch =
                crate::parse_batch(&state.step.batch).map_err(|e| errors.push((Field::Batch, e)));
            let seq = state
                .parsed_seq_len()
                .map_err(|e| errors.push((Field::SeqLen, e)));
            let new_tokens = state
                .parsed_new_tokens()
                .map_err(|e| errors.push((Field::NewTokens, e)));
            let (Ok(batch), Ok(seq_len), Ok(new_tokens)) = (batch, seq, new_tokens) else {
                return Err(fields_error(errors));
            };
            let arch = match arch {
                Some(parsed) => parsed.clone(),
                None => state.architecture(),
            }
            .map_err(|e| EvaluationError::Model(e.to_string()))?;
            // (when serving, the scenario keeps the model for vLLM and refuses the rest)
            if let (Some(why), false) = (arch.serving_only(), state.serves()) {
                return Err(EvaluationError::Model(why.to_owned()));
            }
            let peft = state.parsed_peft(&arch);
            let objective = state.parsed_objective();
            // (the image fields' errors come after the objective's)
            #[cfg(feature = "vision")]
            let (objective, vision) = vision::with_images(state, &arch, objective);
            let (peft, objective) = match (peft, objective) {
                (Ok(p), Ok(o)) => (p, o),
                (p, o) => {
                    return Err(fields_error(
                        p.err().into_iter().chain(o.err()).flatten().collect(),
                    ))
                }
            };
            Ok((
                Parsed::Architecture(Box::new(ArchModel::new(arch, new_tokens))),
                Knobs {
                    peft,
                    objective,
                    #[cfg(feature = "vision")]
                    vision,
                    ..knobs(batch, seq_len)
                },
            ))
        }
    }
}

impl Parsed {
    /// Parameters of the model.
    pub(crate) fn n_params(&self) -> u64 {
        match self {
            Parsed::Simple { params, .. } => *params,
            Parsed::Architecture(m) => m.n_params,
        }
    }

    /// The model with the step settings `knobs`.
    pub(crate) fn model(&self, knobs: &Knobs) -> Model<'_> {
        match self {
            Parsed::Simple {
                params,
                activation_bytes_per_sample,
            } => Model::Simple(SimpleInputs {
                params: *params,
                precision: knobs.precision,
                optimizer: knobs.optimizer,
                batch: knobs.batch,
                activation_bytes_per_sample: *activation_bytes_per_sample,
            }),
            Parsed::Architecture(model) => Model::Architecture {
                model,
                step: TrainingStep {
                    batch: knobs.batch,
                    seq_len: knobs.seq_len,
                    precision: knobs.recipe,
                    optimizer: knobs.optimizer,
                    optimizer_impl: knobs.optimizer_impl,
                    attention: knobs.attention,
                    checkpointing: knobs.checkpointing,
                    compile: knobs.compile,
                    loss: knobs.loss,
                    packing: knobs.packing,
                    padding: knobs.padding,
                    optimizer_in_backward: knobs.optimizer_in_backward,
                    activation_offload: knobs.activation_offload,
                    micro_batches: 1,
                    kernels: knobs.kernels,
                },
                format_weight_bytes: if knobs.optimizer.trains() {
                    None
                } else {
                    knobs.weight_format.shape_bytes(&model.shape)
                },
                kv_dtype: knobs.kv_dtype,
                peft: knobs.peft,
                objective: knobs.objective,
                #[cfg(feature = "vision")]
                vision: knobs.vision,
            },
        }
    }
}

fn batch_of(model: &Model) -> u64 {
    match model {
        Model::Simple(inputs) => inputs.batch,
        Model::Architecture { step, .. } => step.batch,
    }
}

/// Bytes of one KV-cache element in the model's dtype: the activations' dtype.
fn kv_element_bytes(recipe: PrecisionRecipe) -> u64 {
    if matches!(recipe, PrecisionRecipe::Fp32) {
        4
    } else {
        2
    }
}

/// The KV cache of `batch` sequences: a prompt of `prompt` tokens and `generated` more, as
/// HF transformers' cache holds it (see [`Architecture::kv_cache_elements_per_sample`]),
/// stored in `dtype`.
pub(crate) fn kv_cache_bytes(
    arch: &Architecture,
    recipe: PrecisionRecipe,
    dtype: KvDtype,
    batch: u64,
    prompt: u64,
    generated: u64,
) -> Option<u64> {
    let elements = batch.checked_mul(arch.kv_cache_elements_per_sample(prompt, generated)?)?;
    dtype.block(kv_element_bytes(recipe)).bytes(elements)
}

/// `estimate` with the weights stored in a quantized format of `weight_bytes`: quantized
/// layers dequantize one matmul at a time, so autocast's 16-bit weight copies go too.
fn with_weight_format(mut estimate: PeakEstimate, weight_bytes: u64) -> PeakEstimate {
    let copies = estimate
        .saved_parts
        .iter()
        .filter(|(p, _)| *p == SavedPart::WeightCopies)
        .fold(0u64, |a, (_, b)| a.saturating_add(*b));
    estimate
        .saved_parts
        .retain(|(p, _)| *p != SavedPart::WeightCopies);
    for (_, c) in &mut estimate.phase_peaks {
        c.parameters = weight_bytes;
        c.activations = c.activations.saturating_sub(copies);
    }
    estimate
}

const STEP_TOO_LARGE: &str = "The memory needed is too large to count (over 18 EB).";

pub(crate) fn too_large() -> EvaluationError {
    EvaluationError::Step(STEP_TOO_LARGE.to_owned())
}

/// The step's memory at `batch` per GPU, sharded as `plan` says.
pub(crate) fn step_at(
    model: &Model,
    plan: &PlanInputs,
    batch: u64,
) -> Result<StepMemory, EvaluationError> {
    let mesh = mesh_of(plan);
    let stages = plan.pipeline_parallel.max(1);
    if stages <= 1 || !matches!(model, Model::Architecture { .. }) {
        return shard_step(
            model,
            &unsharded(model, batch, plan.micro_batches_at(batch), &mesh, None)?,
            plan,
            batch,
            true,
            &mesh,
        );
    }
    // every stage's GPU, the busiest first (the earliest of equals)
    let mut busiest: Option<StepMemory> = None;
    for index in 0..stages {
        let mesh = crate::Mesh {
            stage: Some(crate::Stage {
                index,
                stages,
                microbatches: plan.microbatches.max(1),
                schedule: plan.pipeline_schedule,
            }),
            ..mesh
        };
        let step = shard_step(
            model,
            &unsharded(model, batch, 1, &mesh, None)?,
            plan,
            batch,
            true,
            &mesh,
        )?;
        if busiest
            .as_ref()
            .is_none_or(|b| step.peak_bytes > b.peak_bytes)
        {
            busiest = Some(step);
        }
    }
    busiest.ok_or_else(too_large)
}

/// One rank's step at `batch` on `mesh` (the whole model's on one GPU), before data-parallel
/// sharding, with `micro_batches` forward and backward passes per optimizer step (gradient
/// accumulation). `units`: the model's parameter units on `mesh` when they are known already
/// (the advisor's thousands of steps share one model and one mesh: finding them walks every
/// layer's tensors).
pub(crate) fn unsharded(
    model: &Model,
    batch: u64,
    micro_batches: u64,
    mesh: &crate::Mesh,
    units: Option<&crate::ParameterUnits>,
) -> Result<Unsharded, EvaluationError> {
    match model {
        Model::Simple(inputs) => simple_breakdown_at_batch(inputs, batch)
            .map(Unsharded::Simple)
            .map_err(|_| too_large()),
        Model::Architecture {
            model,
            step,
            format_weight_bytes,
            peft,
            objective,
            #[cfg(feature = "vision")]
            vision,
            ..
        } => {
            let step = TrainingStep {
                batch,
                micro_batches,
                ..*step
            };
            // with images, the vision-language model's step
            #[cfg(feature = "vision")]
            let estimate = vision::step(
                &model.arch,
                &step,
                peft.as_ref(),
                mesh,
                objective,
                vision.as_ref(),
            );
            #[cfg(not(feature = "vision"))]
            let estimate =
                crate::estimate_objective(&model.arch, &step, peft.as_ref(), mesh, objective, None);
            let mut estimate =
                estimate.map_err(|e| EvaluationError::Step(capitalise(&e.to_string())))?;
            if let Some(weights) = *format_weight_bytes {
                estimate = with_weight_format(estimate, weights);
            }
            // the estimate has already refused a mesh the model does not split over
            let units = match units {
                Some(units) => *units,
                None => model.arch.rank_parameter_units(mesh).unwrap_or_default(),
            };
            Ok(Unsharded::Architecture(
                Box::new(estimate),
                units,
                std::cell::OnceCell::new(),
            ))
        }
    }
}

fn capitalise(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => {
            // ASCII only: the messages are English, and Unicode case tables would weigh on the page.
            let mut out = String::from(first.to_ascii_uppercase());
            out.push_str(chars.as_str());
            if !out.ends_with('.') {
                out.push('.');
            }
            out
        }
        None => String::new(),
    }
}

/// Evaluates every figure the page shows for `state`.
///
/// # Errors
/// What keeps the figures from being computed: invalid fields, an unusable model, or a
/// step that cannot be estimated.
pub fn evaluate(state: &PageState) -> Result<Evaluation, EvaluationError> {
    crate::Scenario::parse(state)?.evaluate()
}

/// [`evaluate`] of inputs already parsed.
pub(crate) fn evaluate_parsed(
    plan: &PlanInputs,
    parsed: &Parsed,
    knobs: &Knobs,
) -> Result<Evaluation, EvaluationError> {
    let mut plan = *plan;
    let model = parsed.model(knobs);
    let batch = batch_of(&model);
    let allocator = resolve_reserve(&mut plan, &model, batch);
    let fit = fit_at(&model, &plan, batch)?;
    plan.overheads = fit.overheads;
    // a batch fits when it is no larger than the largest that fits (the same verdicts,
    // each batch's own allocator reserve among them)
    let sweep_rows = sweep(batch, MAX_BATCH, |b| {
        step_at(&model, &plan, b).map(|s| {
            let fits = fit.max_batch.map(|m| match m {
                MaxBatch::Fits(max) => {
                    b <= max
                        && (b >= fit.accumulation_share
                            || fit.accumulating_max.is_none_or(|a| b <= a))
                }
                MaxBatch::NoneFits(_) => false,
            });
            sweep_row(b, &s, fits)
        })
    });
    let accumulation = match (plan.global_batch, fit.max_batch) {
        (Some(target), Some(MaxBatch::Fits(max_micro))) => {
            plan_accumulation(target, max_micro, plan.num_gpus)
        }
        _ => None,
    };
    let evaluation = Evaluation {
        // peft counts the adapters among the model's parameters
        n_params: parsed.n_params().saturating_add(if knobs.peft.is_some() {
            fit.step.trainable_params
        } else {
            0
        }),
        step: fit.step,
        batch,
        sweep: sweep_rows,
        verdict: fit.verdict,
        max_batch: fit.max_batch,
        accumulation,
        per_gpu: plan.num_gpus > 1
            || plan.tensor_parallel > 1
            || plan.context_parallel > 1
            || plan.pipeline_parallel > 1,
        allocator,
        plan,
    };
    // with images, the vision tower and its projector are part of the model
    #[cfg(feature = "vision")]
    let evaluation = vision::with_vision_parameters(evaluation, parsed, knobs);
    Ok(evaluation)
}

impl Evaluation {
    /// What the caching allocator holds at the peak (`max_memory_reserved`): the peak and
    /// the allocator's reserve beyond it.
    #[must_use]
    pub fn reserved_bytes(&self) -> u64 {
        let reserve = crate::plan::ppm_of(
            self.step
                .peak_bytes
                .saturating_sub(self.plan.overheads.outside_allocator_bytes),
            self.plan.overheads.allocator_reserve_ppm,
        );
        self.step.peak_bytes.saturating_add(reserve)
    }
}

/// Sets `plan`'s allocator reserve from replaying `model`'s step at `batch` through the
/// caching allocator, when the plan asks for it (no percentage typed, a CUDA device, the
/// architecture mode), and returns the replay. The reserve is the replay's slack over its
/// own allocated peak, in parts per million, so that it scales with the peak at other
/// batches (the largest-batch search, the sweep) without replaying each. An FSDP2 or FSDP1
/// rank's replay is of its shards, with the engine's buffers on their streams.
pub(crate) fn resolve_reserve(
    plan: &mut PlanInputs,
    model: &Model,
    batch: u64,
) -> Option<AllocatorPeaks> {
    if !plan.replay_reserve {
        return None;
    }
    let Model::Architecture {
        model,
        step,
        peft,
        objective,
        #[cfg(feature = "vision")]
            vision: None,
        ..
    } = model
    else {
        // (a vision-language step with images is not replayed: the reserve stays the
        // typed one)
        return None;
    };
    let step = TrainingStep {
        batch,
        micro_batches: plan.micro_batches_at(batch),
        ..*step
    };
    let mesh = mesh_of(plan);
    let sharded = sharded_streams(plan, &mesh, &step, peft.as_ref());
    let ddp = plan.ddp_reducer();
    // What `cudaMalloc` can hand the allocator on this GPU: near it the allocator releases
    // its cached segments before it gives up, so a step that fits reserves less there than
    // on a device as large as it likes.
    let capacity = plan.capacity_bytes.map(|c| {
        let o = &plan.overheads;
        fit_verdict(0, c, o)
            .usable_bytes
            .saturating_sub(o.cuda_context_bytes)
            .saturating_sub(o.communication_bytes)
            .saturating_sub(o.outside_allocator_bytes)
    });
    let key = {
        use std::hash::{Hash, Hasher};
        // (Fx, not SipHash: the advisor's maps already bring it, and SipHash would be a
        // kilobyte more of bundle for this one key)
        let mut h = crate::fasthash::FxHasher::default();
        (
            &model.arch.spec,
            step,
            peft,
            mesh,
            plan.allocator,
            capacity,
            objective,
            sharded,
            ddp,
        )
            .hash(&mut h);
        h.finish()
    };
    let cached = REPLAYS.with(|r| {
        r.borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|&(_, replay)| replay)
    });
    let replay = match cached {
        Some(replay) => replay,
        None => {
            // ZeRO-1 and ZeRO-2 training every parameter keep the whole tensors their
            // partition touches: listed only for a replay not cached (the key holds the
            // model, the mesh and the group they follow from)
            let mut sharded = sharded;
            if let Some(crate::ShardedStreams {
                engine:
                    crate::ShardedEngine::Zero {
                        stage: 1 | 2,
                        partition_elements,
                        ..
                    },
                group,
                ..
            }) = sharded.as_mut()
            {
                if peft.is_none() {
                    *partition_elements = model.arch.zero_partition_elements(&mesh, *group).ok();
                }
            }
            let on = |capacity| {
                crate::estimate_objective(
                    &model.arch,
                    &step,
                    peft.as_ref(),
                    &mesh,
                    objective,
                    Some(crate::ReplayDevice {
                        mode: plan.allocator,
                        capacity,
                        sharded,
                        ddp,
                    }),
                )
                .ok()
                .and_then(|e| e.allocator)
            };
            // a step that runs out of memory on the GPU (its replay there stops where it ran
            // out): how much more it needs comes from a device large enough for it
            let replay = match on(capacity) {
                Some(r) if r.out_of_memory => on(None),
                r => r,
            };
            REPLAYS.with(|r| {
                let mut r = r.borrow_mut();
                if r.len() >= MAX_CACHED_REPLAYS {
                    r.clear();
                }
                r.push((key, replay));
            });
            replay
        }
    }?;
    let ppm =
        u128::from(replay.slack_bytes()) * 1_000_000 / u128::from(replay.allocated_bytes.max(1));
    plan.overheads.allocator_reserve_ppm = u64::try_from(ppm).unwrap_or(u64::MAX);
    Some(replay)
}

/// How a sharded engine runs `step` on a rank of `plan`, for the replay to put its buffers on
/// their streams: FSDP2, FSDP1 or DeepSpeed ZeRO sharding over more than one GPU, training
/// every parameter or LoRA adapters (on a 4-bit base too, when the base is stored in the
/// recipe's dtype), the state on the GPU or offloaded to the host. The dtypes are [`crate::rank`]'s engines': FSDP2's mixed recipes gather
/// in bf16 and reduce in fp32, accelerate's FSDP1 reduces in bf16 too; fp32 shards.
fn sharded_streams(
    plan: &PlanInputs,
    mesh: &crate::Mesh,
    step: &TrainingStep,
    peft: Option<&crate::Peft>,
) -> Option<crate::ShardedStreams> {
    let group = plan.shard_group().saturating_mul(mesh.context.max(1));
    let engine = match plan.sharding {
        crate::Sharding::Fsdp2 => crate::ShardedEngine::Fsdp2,
        crate::Sharding::Fsdp1 => crate::ShardedEngine::Fsdp1 {
            whole_model: plan.fsdp1.wrap == crate::Fsdp1Wrap::None,
        },
        other => {
            let stage = other.zero_stage()?;
            crate::ShardedEngine::Zero {
                stage,
                bucket_elements: plan.reduce_bucket_elements,
                parameters_offloaded: stage == 3
                    && plan.offload == crate::Offload::OptimizerAndParams,
                // (set by `resolve_reserve` when it replays)
                partition_elements: None,
            }
        }
    };
    let fsdp1 = matches!(engine, crate::ShardedEngine::Fsdp1 { .. });
    let zero = matches!(engine, crate::ShardedEngine::Zero { .. });
    // (a 4-bit base's units are laid out in its packed storage, which is the load dtype:
    // one dtype per unit only when that is the recipe's and nothing was cast to fp32)
    let mixed_dtypes = peft.is_some_and(|p| {
        p.quantized() && (p.kbit_prepare || p.base_fp32 || step.precision.master_weights())
    });
    let offloaded = plan.offload != crate::Offload::None;
    if !step.optimizer.trains() || mixed_dtypes || group <= 1 {
        return None;
    }
    let recipe = step.precision;
    let (gathered_bytes, reduced_bytes, sharded_bytes) = if recipe.master_weights() {
        (2, if fsdp1 { 2 } else { 4 }, 4)
    } else {
        let b = recipe.weight_bytes();
        (b, b, b)
    };
    Some(crate::ShardedStreams {
        engine,
        group,
        gathered_bytes,
        reduced_bytes,
        sharded_bytes,
        tape_gradient_bytes: recipe.gradient_bytes().max(1),
        reshard_after_forward: reshard_after_forward(plan),
        loss_outside: mesh.loss_parallel,
        // (ZeRO-3's prefetch of 5e7 elements is left out)
        backward_prefetch: !fsdp1 && !zero
            || plan.fsdp1.backward_prefetch == crate::BackwardPrefetch::Pre && fsdp1,
        offloaded,
    })
}

/// The planning inputs and the model of `state`, with every field error at once.
pub(crate) fn parse_all(
    state: &PageState,
    arch: Option<&Result<Architecture, crate::ConfigError>>,
) -> Result<(PlanInputs, Parsed, Knobs), EvaluationError> {
    let plan = state.plan_inputs().map_err(fields_error);
    let model = parse_model(state, arch);
    match (plan, model) {
        (Ok(plan), Ok((parsed, knobs))) => Ok((plan, parsed, knobs)),
        (Err(EvaluationError::Fields(mut a)), Err(EvaluationError::Fields(b))) => {
            a.extend(b);
            Err(EvaluationError::Fields(a))
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// The step at one batch with its verdict and the largest batch that fits.
pub(crate) struct Fit {
    /// The step.
    pub step: StepMemory,
    /// Whether it fits (a device is chosen).
    pub verdict: Option<FitVerdict>,
    /// The largest batch per GPU that fits (a device is chosen).
    pub max_batch: Option<MaxBatch>,
    /// The global batch's share of a GPU (1 without one): smaller batches accumulate
    /// gradients over several passes.
    pub accumulation_share: u64,
    /// When the share fits, the largest smaller batch that still fits with its gradients
    /// alive through every pass (0: none): the batches between it and the share do not.
    pub accumulating_max: Option<u64>,
    /// The overheads the verdicts used (the step's memory outside the allocator set).
    pub overheads: crate::Overheads,
}

/// Replays kept for the steps asked again (more than a page asks for at once).
const MAX_CACHED_REPLAYS: usize = 256;

thread_local! {
    /// The allocator replays of recent steps, by a hash of everything the replay reads: a
    /// keystroke in the batch field replays only the new batch, and the largest-batch
    /// search's neighbours and the advisor's plans are replayed once. (A replay is a pure
    /// function of its key: the cache changes no figure.) A list searched in order rather
    /// than a hash map: a few hundred keys compare in no time, and the bundle is spared a
    /// hash table of its own.
    static REPLAYS: std::cell::RefCell<Vec<(u64, Option<AllocatorPeaks>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Most batches the largest-batch search replays through the allocator beyond its guess.
const MAX_REFINE_REPLAYS: u32 = 24;

/// The step of `model` at `batch`, its verdict and the largest batch that fits. With the
/// allocator's reserve replayed (`plan.replay_reserve`), `plan`'s reserve is `batch`'s; the
/// search finds the largest batch with it, then holds the batches around that guess to
/// their own replays, so that the largest batch fits and the next does not, each by its
/// own verdict.
pub(crate) fn fit_at(model: &Model, plan: &PlanInputs, batch: u64) -> Result<Fit, EvaluationError> {
    fit_with(model, plan, batch, &mut |b| step_at(model, plan, b))
}

/// [`fit_at`] with the step at each batch from `step_of` (the advisor's, from its cache of
/// estimates: only the peaks are read beyond `batch`'s step).
pub(crate) fn fit_with(
    model: &Model,
    plan: &PlanInputs,
    batch: u64,
    step_of: &mut dyn FnMut(u64) -> Result<StepMemory, EvaluationError>,
) -> Result<Fit, EvaluationError> {
    let step = step_of(batch)?;
    let capacity = plan.capacity_bytes;
    let overheads = step.overheads(&plan.overheads);
    let verdict = capacity.map(|c| fit_verdict(step.peak_bytes, c, &overheads));
    let share = plan.micro_batches_at(1).clamp(1, MAX_BATCH);
    let mut accumulating_max = None;
    let max_batch = match capacity {
        Some(c) => {
            let (guess, below) = largest_batch(plan, c, &overheads, step_of)?;
            accumulating_max = below;
            Some(
                if plan.replay_reserve && matches!(model, Model::Architecture { .. }) {
                    refine_max_batch(guess, |b| {
                        // (the reserve changes the verdict, not the peak)
                        let peak = step_of(b).ok()?.peak_bytes;
                        if b > 1 {
                            // a batch that does not fit without any reserve needs no replay
                            let bare = crate::Overheads {
                                allocator_reserve_ppm: 0,
                                ..overheads
                            };
                            let bare = fit_verdict(peak, c, &bare);
                            if !bare.fits() {
                                return Some(bare);
                            }
                        }
                        let mut own = *plan;
                        resolve_reserve(&mut own, model, b);
                        let own = crate::Overheads {
                            allocator_reserve_ppm: own.overheads.allocator_reserve_ppm,
                            ..overheads
                        };
                        Some(fit_verdict(peak, c, &own))
                    })
                } else {
                    guess
                },
            )
        }
        None => None,
    };
    Ok(Fit {
        step,
        verdict,
        max_batch,
        accumulation_share: share,
        accumulating_max,
        overheads,
    })
}

/// The largest batch per GPU whose peak fits `capacity` with `overheads`, and, when the
/// global batch's share of a GPU fits, the largest smaller batch that fits (0: none).
///
/// Peaks rise with the batch, except where gradient accumulation stops: below the global
/// batch's share every gradient lives through the forward and the backward of the later
/// passes, from the share on one pass takes it whole. So the search runs from the share up
/// when the share fits, below it otherwise.
pub(crate) fn largest_batch(
    plan: &PlanInputs,
    capacity: u64,
    overheads: &crate::Overheads,
    step_of: &mut dyn FnMut(u64) -> Result<StepMemory, EvaluationError>,
) -> Result<(MaxBatch, Option<u64>), EvaluationError> {
    let share = plan.micro_batches_at(1).clamp(1, MAX_BATCH);
    let mut search = |low: u64, high: u64| {
        let found = max_batch_that_fits(high - low + 1, capacity, overheads, |k| {
            step_of(low + k - 1).map(|s| s.peak_bytes)
        })?;
        Ok::<_, EvaluationError>(match found {
            MaxBatch::Fits(k) => MaxBatch::Fits(low + k - 1),
            none => none,
        })
    };
    let above = search(share, MAX_BATCH)?;
    if share == 1 {
        return Ok((above, None));
    }
    let below = search(1, share - 1)?;
    Ok(match (above, below) {
        (MaxBatch::Fits(_), MaxBatch::Fits(b)) => (above, Some(b)),
        (MaxBatch::Fits(_), MaxBatch::NoneFits(_)) => (above, Some(0)),
        (MaxBatch::NoneFits(_), _) => (below, None),
    })
}

/// The largest batch that fits when each batch has its own verdict (`verdict_at`, `None`
/// where the step cannot be estimated): from `guess`, down until a batch fits, then up
/// while the next one fits, at most [`MAX_REFINE_REPLAYS`] verdicts.
fn refine_max_batch(
    guess: MaxBatch,
    mut verdict_at: impl FnMut(u64) -> Option<FitVerdict>,
) -> MaxBatch {
    let mut batch = match guess {
        MaxBatch::Fits(b) => b,
        MaxBatch::NoneFits(_) => 1,
    };
    let mut budget = MAX_REFINE_REPLAYS;
    loop {
        let Some(v) = verdict_at(batch) else {
            return guess;
        };
        if v.fits() {
            break;
        }
        if batch == 1 {
            return MaxBatch::NoneFits(v);
        }
        if budget == 0 {
            return guess;
        }
        budget -= 1;
        batch -= 1;
    }
    while batch < MAX_BATCH && budget > 0 {
        budget -= 1;
        if verdict_at(batch + 1).is_some_and(|v| v.fits()) {
            batch += 1;
        } else {
            break;
        }
    }
    MaxBatch::Fits(batch)
}

/// The sweep row of `step` at `batch`: every column at the peak.
pub(crate) fn sweep_row(batch: u64, step: &StepMemory, fits: Option<bool>) -> SweepRow {
    let part = |kinds: &[PartKind]| {
        step.parts
            .iter()
            .filter(|(k, _)| kinds.contains(k))
            .fold(0u64, |a, (_, b)| a.saturating_add(*b))
    };
    SweepRow {
        batch,
        model_state_bytes: part(&[
            PartKind::Weights,
            PartKind::Gradients,
            PartKind::OptimizerStates,
        ]),
        activation_bytes: part(&[PartKind::Activations]),
        total_bytes: step.peak_bytes,
        peak_phase: step.peak_phase,
        is_selected: false,
        fits,
        tokens: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_query, encode_query, Checkpointing, Gpu, Optimizer, Preset};
    use proptest::prelude::*;

    #[test]
    fn simple_default_is_the_issue_example() {
        let state = {
            let mut page_state = PageState::default();
            page_state.hardware.gpu = None;
            page_state
        };
        let e = evaluate(&state).unwrap();
        assert_eq!(e.step.peak_bytes, 102_096_000_000);
        assert_eq!(e.step.parts[0], (PartKind::Weights, 14_000_000_000));
        assert_eq!(e.sweep.len(), 7);
        assert!(e.verdict.is_none());
    }

    #[test]
    fn the_verdict_counts_what_the_caching_allocator_reserves() {
        let at = |query: &str| evaluate(&decode_query(query).state).unwrap();
        let base = "m=arch&model=llama3.2-1b&b=8&s=4096&r=bf16&gc=full&gpu=h100-80&oi=foreach";
        let default = at(&format!("{base}&alloc=default&res="));
        let expandable = at(&format!("{base}&alloc=expandable&res="));
        let typed = at(&format!("{base}&alloc=default&res=5"));
        // the same tensors, what the allocator holds differs
        assert_eq!(default.step.peak_bytes, expandable.step.peak_bytes);
        assert!(default.allocator.is_some() && typed.allocator.is_none());
        assert_ne!(default.reserved_bytes(), expandable.reserved_bytes());
        assert!(expandable.reserved_bytes() > expandable.step.peak_bytes);
        // the loss's fp32 tensors leave segments the next ones reuse: a reserve of a few
        // percent (the loss replayed as one block per phase reserved a third more)
        assert!(default.reserved_bytes() < default.step.peak_bytes / 100 * 110);
        // where the device has room, an expandable segment keeps the hole the freed logits
        // leave before their gradients (more reserved than by default here); near the
        // capacity it unmaps it, so the largest batch is larger (below)
        assert_eq!(
            typed.reserved_bytes(),
            typed.step.peak_bytes + typed.step.peak_bytes / 20
        );
        for e in [&default, &expandable, &typed] {
            let v = e.verdict.unwrap();
            assert_eq!(v.peak_bytes + v.allocator_reserve_bytes, e.reserved_bytes());
            assert_eq!(
                v.needed_bytes,
                e.reserved_bytes() + v.cuda_context_bytes + v.communication_bytes
            );
        }
        // the largest batch is searched with the same reserve
        let Some(MaxBatch::Fits(small)) = default.max_batch else {
            panic!()
        };
        let Some(MaxBatch::Fits(large)) = expandable.max_batch else {
            panic!()
        };
        assert!(small < large, "{small} {large}");
        // an old link's flat 5% (its default) is replayed; a typed one is kept
        assert!(at("m=arch&model=gpt2&s=1024&res=5").allocator.is_some());
        assert!(at("m=arch&model=gpt2&s=1024&res=5&alloc=default")
            .allocator
            .is_none());
        // the simple mode has no tape to replay: 5%
        let simple = at("p=7&pu=B&b=8&a=512&res=");
        assert!(simple.allocator.is_none());
        assert_eq!(
            simple.reserved_bytes(),
            simple.step.peak_bytes + simple.step.peak_bytes / 20
        );
    }

    #[test]
    fn the_largest_batch_fits_by_its_own_replay_and_the_next_does_not() {
        for query in [
            "m=arch&model=llama3-8b&s=2048&b=1&r=amp-bf16&gc=full&method=qlora&o=paged-adamw8bit&gpu=rtx4090",
            "m=arch&model=llama3.2-1b&s=4096&b=2&r=bf16&gc=full&gpu=h100-80",
            "m=arch&model=qwen3-0.6b&s=2048&b=1&r=bf16&gpu=rtx4090&alloc=expandable",
        ] {
            let e = evaluate(&decode_query(query).state).unwrap();
            let Some(MaxBatch::Fits(max)) = e.max_batch else {
                panic!("{query}: {:?}", e.max_batch)
            };
            let at = |b: u64| {
                let mut state = decode_query(query).state;
                state.step.batch = b.to_string();
                evaluate(&state).unwrap()
            };
            assert!(at(max).verdict.unwrap().fits(), "{query}: {max}");
            assert!(!at(max + 1).verdict.unwrap().fits(), "{query}: {max} + 1");
            assert_eq!(at(max).max_batch, e.max_batch, "{query}");
            for row in &e.sweep {
                assert_eq!(row.fits, Some(row.batch <= max), "{query}: {row:?}");
            }
        }
    }

    #[test]
    fn max_batch_matches_the_verdict_of_the_sweep() {
        let state = decode_query("p=1&pu=B&b=8&a=2000&gpu=a100-80").state;
        let e = evaluate(&state).unwrap();
        let Some(MaxBatch::Fits(max)) = e.max_batch else {
            panic!("{:?}", e.max_batch)
        };
        let at = |b: u64| {
            let s = {
                let mut page_state = state.clone();
                page_state.step.batch = b.to_string();
                page_state
            };
            evaluate(&s).unwrap().verdict.unwrap().fits()
        };
        assert!(at(max));
        assert!(!at(max + 1));
        for row in e.sweep {
            assert_eq!(row.fits, Some(row.batch <= max));
        }
    }

    #[test]
    fn expert_parallelism_splits_the_experts_state() {
        let at = |query: &str| {
            let state = decode_query(query).state;
            let e = evaluate(&state).unwrap();
            let part = |k: PartKind| {
                e.step
                    .parts
                    .iter()
                    .find(|(p, _)| *p == k)
                    .map_or(0, |(_, b)| *b)
            };
            (part(PartKind::Weights), e.step.model_state_bytes)
        };
        let base = "m=arch&model=qwen3-30b-a3b&b=1&s=1024&r=bf16&n=8&shard=ddp";
        let (w1, m1) = at(base);
        let (w8, m8) = at(&format!("{base}&ep=8"));
        // about 95% of Qwen3-30B-A3B's parameters are routed experts
        assert!(w8 * 5 < w1, "{w8} vs {w1}");
        assert!(m8 * 5 < m1);
        // a dense model ignores it
        let dense = "m=arch&model=llama3.2-1b&b=1&s=1024&n=8&shard=ddp";
        assert_eq!(at(dense), at(&format!("{dense}&ep=8")));
        // the group must divide the GPUs
        let bad = {
            let mut page_state = decode_query(base).state;
            page_state.parallel.expert_parallel = "3".to_owned();
            page_state
        };
        assert!(matches!(
            bad.plan_inputs(),
            Err(errors) if errors.iter().any(|(f, e)| *f == Field::ExpertParallel
                && e.to_string().contains("Must divide"))
        ));
    }

    #[test]
    fn seventy_b_does_not_fit_one_gpu() {
        let state = decode_query("m=arch&model=llama3-70b&b=1&s=2048&gpu=h100-80").state;
        let e = evaluate(&state).unwrap();
        assert!(matches!(e.max_batch, Some(MaxBatch::NoneFits(_))));
        assert!(!e.verdict.unwrap().fits());
    }

    /// The DPO and GRPO plans of the issue: each phase counted, the peak the largest.
    /// DPO's `disable_dropout=True` turns GPT-2's dropouts off: its step is that of the
    /// same model without dropout; supervised training keeps the masks.
    #[test]
    fn dpo_runs_without_the_models_dropout() {
        let gpt2 = include_str!("arch/presets/gpt2.json");
        let undropped = gpt2.replace("0.1", "0.0");
        assert_ne!(gpt2, undropped);
        let peak = |config: &str, objective: &str| {
            let query = format!(
                "m=arch&model={}&cfg={}&b=4&r=bf16&gc=none&{objective}&gpu=h100-80",
                crate::CUSTOM_MODEL_KEY,
                crate::query::percent_encode(config)
            );
            eval(&query).step.peak_bytes
        };
        let dpo = "obj=dpo&ref=separate&mp=256&mc=256";
        assert_eq!(peak(gpt2, dpo), peak(&undropped, dpo));
        assert!(peak(gpt2, "s=512") > peak(&undropped, "s=512"));
    }

    #[test]
    fn dpo_and_grpo_steps_name_their_phases() {
        // DPO on an 8B model with LoRA (the adapters-off reference) on a 24 GB GPU
        let dpo = eval(
            "m=arch&model=llama3-8b&b=1&r=bf16&gc=full&loss=trl-fused&obj=dpo&ref=adapters-off\
             &mp=256&mc=256&method=lora&gpu=rtx4090",
        );
        let phases = dpo.step.objective_phases.expect("DPO phases");
        assert_eq!(phases.generation_bytes, None);
        assert_eq!(phases.scoring_bytes, None);
        assert_eq!(phases.training_bytes, dpo.step.peak_bytes);
        assert!(dpo.verdict.unwrap().fits(), "{}", dpo.step.peak_bytes);
        // a separate reference adds a whole copy of the weights
        let separate = eval(
            "m=arch&model=llama3-8b&b=1&r=bf16&gc=full&obj=dpo&ref=separate&mp=256&mc=256\
             &method=lora&gpu=rtx4090",
        );
        assert!(separate.step.peak_bytes > dpo.step.peak_bytes + 15_000_000_000);
        // GRPO on 1.7B with 8 generations on one 80 GB GPU; colocated vLLM takes its share
        let grpo = |generator: &str| {
            eval(&format!(
                "m=arch&model=qwen3-1.7b&b=1&r=bf16&gc=full&obj=grpo&ref=none&ng=8&mp=256&mc=1024\
                 &gtr={generator}&gpu=h100-80"
            ))
        };
        let model = grpo("model");
        let phases = model.step.objective_phases.expect("GRPO phases");
        assert!(phases.generation_bytes.is_some());
        assert_eq!(
            phases.scoring_bytes, None,
            "beta = 0 and no vLLM: no scoring"
        );
        assert!(model.verdict.unwrap().fits());
        let vllm = grpo("vllm-colocated");
        let reserved = part(&vllm, PartKind::VllmReservation);
        let total = vllm.plan.capacity_bytes.expect("a device");
        assert_eq!(reserved, (total * 3).div_ceil(10), "ceil(total x 0.3)");
        // the allocator's reserve grows with the training tensors, not with vLLM's pool
        let verdict = vllm.verdict.expect("a device");
        let ppm = vllm.plan.overheads.allocator_reserve_ppm;
        assert_eq!(vllm.plan.overheads.outside_allocator_bytes, reserved);
        assert_eq!(
            verdict.allocator_reserve_bytes,
            crate::plan::ppm_of(vllm.step.peak_bytes - reserved, ppm)
        );
        assert_eq!(
            vllm.reserved_bytes(),
            vllm.step.peak_bytes + verdict.allocator_reserve_bytes
        );
        assert!(vllm.step.objective_phases.unwrap().scoring_bytes.is_some());
        // the objective's settings travel in the link
        let state = decode_query(
            "m=arch&obj=grpo&ref=separate&ng=16&mp=128&mc=4096&gtr=vllm-colocated&vllm=0.45",
        )
        .state;
        assert_eq!(decode_query(&encode_query(&state)).state, state);
    }

    #[test]
    fn sharding_divides_per_gpu_memory() {
        let one =
            evaluate(&decode_query("m=arch&model=llama3-8b&b=1&s=2048&gpu=h100-80").state).unwrap();
        let peak = |shard: &str| {
            let q = format!("m=arch&model=llama3-8b&b=1&s=2048&gpu=h100-80&gpus=8&shard={shard}");
            let e = evaluate(&decode_query(&q).state).unwrap();
            assert!(e.per_gpu);
            e.step.peak_bytes
        };
        let ddp = peak("ddp");
        // ZeRO-1 holds every gradient until the boundary, ZeRO-2 reduces through its
        // buckets while the activations are still alive: either may peak higher
        assert!(peak("zero1") < ddp && peak("zero2") < ddp);
        assert!(peak("zero3") < peak("zero2").min(peak("zero1")));
        assert!(peak("zero3") < one.step.peak_bytes / 2);
        assert!(peak("fsdp2") < one.step.peak_bytes / 2);
    }

    #[test]
    fn kv_cache_counts_grouped_query_heads() {
        let base = "m=arch&model=llama3-8b&o=none&r=bf16&b=4&s=1024";
        let without = evaluate(&decode_query(base).state).unwrap();
        let with = evaluate(&decode_query(&format!("{base}&gen=1024")).state).unwrap();
        let kv = with
            .step
            .parts
            .iter()
            .find(|(k, _)| *k == PartKind::KvCache)
            .map(|(_, b)| *b)
            .unwrap();
        // 4 x 2048 tokens x 32 layers x 2 x 8 KV heads x 128 x 2 bytes.
        assert_eq!(kv, 4 * 2048 * 32 * 2 * 8 * 128 * 2);
        assert!(with.step.peak_bytes > without.step.peak_bytes);
    }

    #[test]
    fn custom_gpu_and_accumulation() {
        let state = decode_query("p=1&pu=B&b=8&a=1000&gpu=custom&cap=40000&n=4&gb=1024").state;
        let e = evaluate(&state).unwrap();
        let plan = e.accumulation.unwrap();
        assert!(plan.global_batch() >= 1024);
        assert_eq!(plan.num_gpus, 4);
        assert_eq!(Gpu::from_key("custom"), Some(Gpu::Custom));
    }

    fn activations_and_parts(query: &str) -> (u64, Vec<(SavedPart, u64)>) {
        let decoded = decode_query(query);
        assert!(decoded.notices.is_empty(), "{query}: {:?}", decoded.notices);
        let e = evaluate(&decoded.state).unwrap();
        let activations = e
            .step
            .parts
            .iter()
            .find(|(k, _)| *k == PartKind::Activations)
            .map_or(0, |(_, b)| *b);
        (activations, e.step.activation_parts)
    }

    #[test]
    fn activation_parts_sum_to_the_activations_at_the_peak() {
        for query in [
            "m=arch&model=gpt2&b=4&s=1024&r=amp-bf16",
            "m=arch&model=gemma2-2b&b=2&s=2048&r=bf16",
            "m=arch&model=gemma3-1b&b=2&s=2048&r=amp-bf16&gc=full",
            "m=arch&model=qwen3-8b&b=1&s=2048&r=bf16&o=none",
            "m=arch&model=llama3-8b&b=3&s=2048&r=amp-bf16&tp=4&gpus=4",
            "m=arch&model=llama3-8b&b=1&s=2048&r=bf16",
        ] {
            let (activations, parts) = activations_and_parts(query);
            let sum: u64 = parts.iter().map(|(_, b)| *b).sum();
            assert_eq!(sum, activations, "{query}");
            assert_eq!(parts.is_empty(), activations == 0, "{query}");
        }
        let (_, qwen3) = activations_and_parts("m=arch&model=qwen3-0.6b&b=1&s=1024");
        assert!(qwen3.iter().any(|(p, _)| *p == SavedPart::QkNorms));
        let simple = evaluate(&decode_query("p=1&pu=B&b=8&a=2000").state).unwrap();
        assert!(simple.step.activation_parts.is_empty());
    }

    #[test]
    fn scaled_parts_keep_their_sum() {
        let parts = [
            (SavedPart::Mlp, 7),
            (SavedPart::Attention, 5),
            (SavedPart::Norms, 1),
        ];
        let scaled = scale_parts(&parts, 13, 6);
        assert_eq!(scaled.iter().map(|(_, b)| b).sum::<u64>(), 6);
        assert_eq!(scale_parts(&parts, 13, 13), parts.to_vec());
        assert!(scale_parts(&parts, 13, 0).is_empty());
        assert!(scale_parts(&[], 0, 5).is_empty());
    }

    fn part(e: &Evaluation, kind: PartKind) -> u64 {
        e.step
            .parts
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, b)| *b)
    }

    #[track_caller]
    fn eval(query: &str) -> Evaluation {
        let decoded = decode_query(query);
        assert!(decoded.notices.is_empty(), "{query}: {:?}", decoded.notices);
        evaluate(&decoded.state).unwrap()
    }

    #[test]
    fn inference_weights_take_the_format_s_bytes() {
        let base = "m=arch&model=llama3-8b&o=none&b=1&s=1024";
        let arch = Preset::from_key("llama3-8b")
            .unwrap()
            .architecture()
            .unwrap();
        let recipe = eval(&format!("{base}&r=bf16"));
        for format in [WeightFormat::Q4KM, WeightFormat::Nf4, WeightFormat::Fp8] {
            let q = eval(&format!("{base}&r=bf16&wf={}", format.key()));
            assert_eq!(
                part(&q, PartKind::Weights),
                format.weight_bytes(&arch).unwrap(),
                "{format:?}"
            );
            assert!(q.step.peak_bytes < recipe.step.peak_bytes, "{format:?}");
        }
        // AMP keeps fp32 weights and autocast's 16-bit copies; 16-bit weights keep neither
        let amp = eval(&format!("{base}&r=amp-bf16"));
        let half = eval(&format!("{base}&r=amp-bf16&wf=bf16"));
        assert_eq!(part(&half, PartKind::Weights), 2 * arch.parameter_count());
        assert!(amp
            .step
            .activation_parts
            .iter()
            .any(|(p, _)| *p == SavedPart::WeightCopies));
        assert!(!half
            .step
            .activation_parts
            .iter()
            .any(|(p, _)| *p == SavedPart::WeightCopies));
        assert!(part(&half, PartKind::Activations) < part(&amp, PartKind::Activations));
        // training ignores the format and the KV dtype
        let train = "m=arch&model=llama3-8b&b=1&s=1024&r=bf16";
        assert_eq!(
            eval(train).step,
            eval(&format!("{train}&wf=q4_k_m&kvd=q4_0")).step
        );
    }

    #[track_caller]
    fn kv_of(kvd: &str) -> u64 {
        let e = eval(&format!(
            "m=arch&model=llama3-8b&o=none&r=bf16&b=4&s=1024&gen=1024&kvd={kvd}"
        ));
        part(&e, PartKind::KvCache)
    }

    #[test]
    fn kv_cache_dtypes() {
        let model = kv_of("model");
        assert_eq!(model, 4 * 2048 * 32 * 2 * 8 * 128 * 2);
        assert_eq!(kv_of("fp8"), model / 2);
        assert_eq!(kv_of("q8_0"), model / 2 / 32 * 34);
        assert_eq!(kv_of("q4_0"), model / 2 / 32 * 18);
    }

    #[test]
    fn cpu_ram_and_macs_have_no_cuda_context() {
        let cpu = eval("m=arch&model=gpt2&b=1&s=512&gpu=cpu&ram=32");
        let v = cpu.verdict.unwrap();
        assert_eq!(v.capacity_bytes, 32 << 30);
        assert_eq!(v.cuda_context_bytes, 0);
        let half = eval("m=arch&model=gpt2&b=1&s=512&gpu=cpu&ram=15.5");
        assert_eq!(half.verdict.unwrap().capacity_bytes, 15_872 << 20);
        let mac = eval("m=arch&model=gpt2&b=1&s=512&gpu=mac-16");
        let v = mac.verdict.unwrap();
        assert_eq!(v.capacity_bytes, (16 << 30) / 3 * 2 / (1 << 20) * (1 << 20));
        assert_eq!(v.cuda_context_bytes, 0);
        let gpu = eval("m=arch&model=gpt2&b=1&s=512&gpu=rtx4090");
        assert_eq!(gpu.verdict.unwrap().cuda_context_bytes, 500 << 20);
        // a bad RAM size is an error only while the CPU is chosen, and a notice in a link
        let bad = {
            let mut page_state = decode_query("m=arch&model=gpt2&gpu=cpu").state;
            page_state.hardware.ram_gib = "0".to_owned();
            page_state
        };
        assert!(matches!(
            evaluate(&bad),
            Err(EvaluationError::Fields(f)) if f.iter().any(|(field, _)| *field == Field::RamCapacity)
        ));
        assert_eq!(decode_query("ram=-4&gpu=h100-80").notices.len(), 1);
    }

    #[test]
    fn zero_activations_per_sample_are_the_model_state() {
        let e = eval("p=7&pu=B&b=8&a=0&gpu=none");
        assert_eq!(e.step.peak_bytes, e.step.model_state_bytes);
        assert_eq!(part(&e, PartKind::Activations), 0);
        assert!(e.sweep.iter().all(|r| r.total_bytes == e.step.peak_bytes));
    }

    #[test]
    fn sweep_columns_add_up_to_the_peak_at_its_moment() {
        for query in [
            "m=arch&model=llama3-8b&b=4&s=2048&r=amp-bf16",
            "m=arch&model=gpt2&b=8&s=1024&r=bf16&gc=full",
            "m=arch&model=qwen3-8b&o=none&b=2&s=1024&gen=512",
            "m=arch&model=llama3-8b&b=1&s=2048&n=8&shard=zero3",
        ] {
            let e = eval(query);
            for row in &e.sweep {
                assert_eq!(
                    row.model_state_bytes + row.activation_bytes + row.other_bytes(),
                    row.total_bytes,
                    "{query}: {row:?}"
                );
                assert!(row.peak_phase.is_some());
            }
            let selected = e.sweep.iter().find(|r| r.is_selected).unwrap();
            assert_eq!(selected.peak_phase, e.step.peak_phase);
        }
        // at batch 1 the peak of Llama-3-8B training is the optimizer step: the gradients
        // count, the activations do not
        let e = eval("m=arch&model=llama3-8b&b=1&s=512&r=amp-bf16");
        let first = &e.sweep[0];
        assert_eq!(first.peak_phase, Some(Phase::OptimizerStep));
        assert_eq!(first.activation_bytes, 0);
        // simple mode: the columns are as they were
        let simple = eval("p=7&pu=B&b=8&a=512");
        let row = simple.sweep.iter().find(|r| r.is_selected).unwrap();
        assert_eq!(row.model_state_bytes, simple.step.model_state_bytes);
        assert_eq!(row.activation_bytes, simple.step.activation_bytes);
        assert_eq!(row.other_bytes(), 0);
        assert_eq!(row.peak_phase, None);
    }

    proptest! {
        #[test]
        fn never_panics_on_any_link(query in "[a-z]{1,6}=[-0-9a-z.%]{0,12}(&[a-z]{1,6}=[-0-9a-z.%]{0,12}){0,8}") {
            let _ = evaluate(&decode_query(&query).state);
        }
    }

    /// The QLoRA recipe people run on one 24 GB card: Llama 3 8B, nf4 with double
    /// quantization, prepare_model_for_kbit_training, r 16 on every linear, paged AdamW 8-bit,
    /// checkpointing (measured at 12.41 GiB by validation/peft.py at batch 1, seq 2048).
    const QLORA_8B: &str = "m=arch&model=llama3-8b&s=2048&b=1&r=amp-bf16&o=paged-adamw8bit\
        &gc=full&method=qlora&lr=16&lt=all-linear&q=nf4&dq=on&kbit=on&gpu=rtx4090";

    #[test]
    fn qlora_on_an_8b_model_fits_a_24_gb_gpu() {
        let e = eval(QLORA_8B);
        assert_eq!(e.step.trainable_params, 41_943_040);
        assert!(
            e.verdict.as_ref().is_some_and(FitVerdict::fits),
            "{:?}",
            e.verdict
        );
        let Some(MaxBatch::Fits(max)) = e.max_batch else {
            panic!("{:?}", e.max_batch)
        };
        assert!((1..=8).contains(&max), "{max}");
        // the paged state is its own line and counts in the peak the verdict uses
        let paged = e
            .step
            .parts
            .iter()
            .find(|(k, _)| *k == PartKind::PagedOptimizerStates)
            .map(|(_, b)| *b);
        assert_eq!(paged, Some(44_040_192));
        assert_eq!(e.step.paged_bytes, 44_040_192);
        // in CUDA managed memory: outside the caching allocator's reserve
        assert_eq!(e.plan.overheads.outside_allocator_bytes, 44_040_192);
        let v = e.verdict.expect("a device");
        assert_eq!(
            v.allocator_reserve_bytes,
            crate::plan::ppm_of(
                e.step.peak_bytes - 44_040_192,
                e.plan.overheads.allocator_reserve_ppm
            )
        );
        let listed: u64 = e.step.parts.iter().map(|(_, b)| b).sum();
        assert_eq!(listed, e.step.peak_bytes);
        // one past the largest batch does not fit
        let over = eval(&QLORA_8B.replace("b=1", &format!("b={}", max + 1)));
        assert!(!over.verdict.unwrap().fits());
        // full fine-tuning of the same model is far from fitting
        let full = eval(&QLORA_8B.replace("method=qlora", "method=full"));
        assert!(!full.verdict.unwrap().fits());
        assert_eq!(full.step.trainable_params, 8_030_261_248);
    }

    #[test]
    fn fsdp1_settings_round_trip_and_travel_only_with_fsdp1() {
        let query = "m=arch&model=llama3.2-1b&gpus=16&shard=fsdp1&f1s=hybrid&f1w=layers&uop=on\
            &bp=post&gpn=8";
        let decoded = decode_query(query);
        assert!(decoded.notices.is_empty(), "{:?}", decoded.notices);
        let state = decoded.state;
        assert_eq!(state.parallel.fsdp1_sharding, crate::Fsdp1Sharding::Hybrid);
        assert_eq!(
            state.parallel.backward_prefetch,
            crate::BackwardPrefetch::Post
        );
        let link = crate::encode_query(&state);
        for key in ["f1s=hybrid", "f1w=layers", "uop=on", "bp=post", "gpn=8"] {
            assert!(link.contains(key), "{key} in {link}");
        }
        let again = decode_query(&link);
        assert!(again.notices.is_empty(), "{:?}", again.notices);
        assert_eq!(again.state, state);
        // HYBRID_SHARD over 2 nodes of 8: each parameter split over 8
        let plan = state.plan_inputs().expect("plan");
        assert_eq!(plan.shard_group(), 8);
        // the other engines' links stay as they were
        let mut fsdp2 = state;
        fsdp2.set(Field::Sharding, "fsdp2").expect("fsdp2");
        assert!(!crate::encode_query(&fsdp2).contains("f1s="));
        // whole nodes only
        let mut odd = fsdp2;
        odd.set(Field::Sharding, "fsdp1").expect("fsdp1");
        odd.set(Field::GpusPerNode, "6").expect("6");
        let errors = odd.plan_inputs().expect_err("6 does not divide 16");
        assert!(
            errors.iter().any(|(f, _)| *f == Field::GpusPerNode),
            "{errors:?}"
        );
    }

    #[test]
    fn peft_settings_round_trip_through_the_url() {
        let query = "m=arch&model=qwen3-8b&method=lora&lr=64&la=128&ld=0.05&lt=q_proj,v_proj\
            &ldt=model&q=fp4&dq=off&kbit=off&gc=offload&o=adafactor-hf";
        let state = decode_query(query).state;
        assert_eq!(state.training.method, crate::Method::Lora);
        assert_eq!(state.training.lora_rank, "64");
        assert_eq!(state.training.lora_targets, "q_proj,v_proj");
        assert!(
            !state.training.lora_fp32
                && !state.training.double_quant
                && !state.training.kbit_prepare
        );
        assert_eq!(state.training.quant, crate::Quant4::Fp4);
        assert_eq!(state.step.checkpointing, Checkpointing::Offload);
        assert_eq!(state.step.optimizer, Optimizer::AdafactorHf);
        let again = decode_query(&crate::encode_query(&state));
        assert!(again.notices.is_empty(), "{:?}", again.notices);
        assert_eq!(again.state, state);
    }

    #[track_caller]
    fn peft_field_error(query: &str, field: Field, message: &str) {
        match evaluate(&decode_query(query).state) {
            Err(EvaluationError::Fields(errors)) => assert!(
                errors
                    .iter()
                    .any(|(f, m)| *f == field && m.starts_with(message)),
                "{query}: {errors:?}"
            ),
            other => panic!("{query}: {other:?}"),
        }
    }

    #[test]
    fn peft_mistakes_name_their_field() {
        let base = "m=arch&model=llama3-8b&method=lora";
        peft_field_error(
            &format!("{base}&lt=c_attn"),
            Field::LoraTargets,
            "This model has no module \"c_attn\" (its linears: q_proj, k_proj",
        );
        peft_field_error(
            &format!("{base}&lt=,"),
            Field::LoraTargets,
            "Name at least one",
        );
        let e = evaluate(&{
            let mut page_state = decode_query(base).state;
            page_state.training.lora_dropout = "1".to_owned();
            page_state
        });
        assert!(format!("{e:?}").contains("Must be below 1"), "{e:?}");
        let e = evaluate(&{
            let mut page_state = decode_query(base).state;
            page_state.training.lora_rank = "0".to_owned();
            page_state
        });
        assert!(format!("{e:?}").contains("LoraRank"), "{e:?}");
        // full fine-tuning ignores the LoRA fields
        let e = evaluate(&{
            let mut page_state = decode_query("m=arch&model=llama3-8b").state;
            page_state.training.lora_targets = "nonsense".to_owned();
            page_state
        });
        assert!(e.is_ok(), "{e:?}");
    }
}
