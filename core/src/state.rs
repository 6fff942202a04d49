//! Every input of the page, as a person left it: the unit of sharing and storage.

use crate::number::{parse_whole_count, FieldError};
use crate::simple::{parse_activation_mb, parse_batch, parse_params, SimpleInputs};
use crate::{
    AllocatorMode, AttentionKernel, BackwardPrefetch, ByteUnit, Checkpointing, Compile,
    Fsdp1Sharding, Fsdp1Wrap, Generator, Gpu, Kernels, KvDtype, LossKind, Method, ObjectiveKind,
    Offload, Optimizer, OptimizerImpl, ParamUnit, Peft, PipelineSchedule, Precision,
    PrecisionRecipe, Preset, Quant4, Reference, Reshard, Sharding, SweepAxis, TpPlan, WeightFormat,
};

/// The `model` value that means "the pasted config.json" rather than a preset.
pub const CUSTOM_MODEL_KEY: &str = "custom";
/// Longest pasted `config.json` kept (and carried in a link).
pub const MAX_CONFIG_CHARS: usize = 20_000;
/// Longest sequence (or image side) accepted.
pub const MAX_SEQ_LEN: u64 = 1 << 24;
/// Most GPUs accepted.
pub const MAX_GPUS: u64 = 100_000;
/// DeepSpeed's default `reduce_bucket_size` (elements; `zero/config.py`, 0.19.8).
pub const DEEPSPEED_REDUCE_BUCKET_ELEMENTS: u64 = 500_000_000;
/// DeepSpeed's default `stage3_prefetch_bucket_size` (elements).
pub const DEEPSPEED_PREFETCH_BUCKET_ELEMENTS: u64 = 50_000_000;
/// Largest custom capacity accepted: 100 TiB.
pub const MAX_CAPACITY_MIB: u64 = 100 << 20;
/// MiB in one GiB: the CPU RAM field is typed in GiB.
const MIB_PER_GIB: u64 = 1024;
/// Largest CUDA context accepted.
pub const MAX_CONTEXT_MIB: u64 = 1 << 20;
/// Longest generation accepted.
pub const MAX_NEW_TOKENS: u64 = 1 << 24;
/// Most GRPO generations per prompt accepted.
pub const MAX_GENERATIONS: u64 = 1 << 16;
/// Largest LoRA rank accepted.
pub const MAX_LORA_RANK: u64 = 1 << 16;

/// Parses a whole count field in `1..=max` (or `0..=max` when `zero_ok`).
fn parse_count(text: &str, max: u64, what: &'static str, zero_ok: bool) -> Result<u64, FieldError> {
    match parse_whole_count(text, 1, max, what) {
        Err(FieldError::Zero) if zero_ok => Ok(0),
        other => other,
    }
}

/// A vision-language model's image fields: their section and their parsing.
#[cfg(feature = "vision")]
mod vision;
#[cfg(feature = "vision")]
pub use vision::{parse_image_size, VisionSettings, DEFAULT_IMAGES, DEFAULT_IMAGE_SIZE};

/// Which way the model is described.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Parameter count and activation size per sample, typed in.
    #[default]
    Simple,
    /// Everything derived from the model's architecture.
    Architecture,
}

impl Mode {
    /// Both modes, in the order the page offers them.
    pub const ALL: [Mode; 2] = [Mode::Simple, Mode::Architecture];

    /// Short stable key used in URLs.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Mode::Simple => "simple",
            Mode::Architecture => "arch",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Mode::Simple => "Simple",
            Mode::Architecture => "From architecture",
        }
    }

    /// The mode whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.key() == key)
    }
}

/// The inputs of the page, in sections that own their URL keys. Text fields keep exactly what
/// was typed, valid or not, so that a shared link shows the same page; they are parsed once
/// per change ([`crate::parse_page`]).
#[derive(Debug, PartialEq, Eq, Default)]
pub struct PageState {
    /// Simple or architecture mode.
    pub mode: Mode,
    /// Unit the figures are shown in.
    pub byte_unit: ByteUnit,
    /// What the sweep table and the chart vary: the batch or the sequence length.
    pub sweep_axis: SweepAxis,
    /// The simple mode: the parameter count, its unit and precision, the activation memory per sample.
    pub simple: SimpleModel,
    /// Architecture mode: which model (a preset, or the pasted config).
    pub model: ModelChoice,
    /// One step: batch, sequence, precision recipe, optimizer and the trainer's settings.
    pub step: StepSettings,
    /// A vision-language model's images and what trains of its vision side.
    #[cfg(feature = "vision")]
    pub vision: VisionSettings,
    /// The training method: full fine-tuning, LoRA or QLoRA and their settings.
    pub training: MethodSettings,
    /// Inference: generated tokens, the weights' format and the KV cache's dtype.
    pub inference: InferenceSettings,
    /// The device and the overheads on it.
    pub hardware: HardwareSettings,
    /// Several GPUs: data parallelism, sharding, tensor and expert parallelism, the global batch.
    pub parallel: ParallelSettings,
}

/// Written out rather than derived: the typed fields are copied by one loop through
/// [`PageState::text`], where a derived clone copies each string by code of its own. A new
/// string field does not compile here until it is named (and then copied only once it is
/// listed in `text_fields!`); every other field is copied as it is.
impl Clone for PageState {
    fn clone(&self) -> Self {
        let text = String::new;
        let mut copy = PageState {
            simple: SimpleModel {
                params: text(),
                activation_mb: text(),
                ..self.simple
            },
            model: ModelChoice {
                config_json: text(),
                ..self.model
            },
            step: StepSettings {
                batch: text(),
                seq_len: text(),
                generations: text(),
                max_prompt: text(),
                max_completion: text(),
                vllm_memory: text(),
                ..self.step
            },
            #[cfg(feature = "vision")]
            vision: VisionSettings {
                images: text(),
                image_size: text(),
                ..self.vision
            },
            training: MethodSettings {
                lora_rank: text(),
                lora_alpha: text(),
                lora_dropout: text(),
                lora_targets: text(),
                ..self.training
            },
            inference: InferenceSettings {
                new_tokens: text(),
                gpu_memory_utilization: text(),
                max_model_len: text(),
                max_num_seqs: text(),
                max_num_batched_tokens: text(),
                ..self.inference
            },
            hardware: HardwareSettings {
                custom_capacity_mib: text(),
                ram_gib: text(),
                cuda_context_mib: text(),
                allocator_reserve_percent: text(),
                safety_margin_percent: text(),
                ..self.hardware
            },
            parallel: ParallelSettings {
                num_gpus: text(),
                tensor_parallel: text(),
                expert_parallel: text(),
                context_parallel: text(),
                pipeline_parallel: text(),
                microbatches: text(),
                nccl_mib: text(),
                reduce_bucket: text(),
                prefetch_bucket: text(),
                gpus_per_node: text(),
                global_batch: text(),
                ..self.parallel
            },
            ..*self
        };
        for field in Field::ALL {
            if let (Some(from), Some(to)) = (self.text(field), copy.text_mut(field)) {
                to.clone_from(from);
            }
        }
        copy
    }
}

/// The sections' key tables: every field's URL key but the mode's, the unit's and the
/// sweep axis's.
const SECTION_KEYS: [&[(Field, &str)]; if cfg!(feature = "vision") { 8 } else { 7 }] = [
    SimpleModel::KEYS,
    ModelChoice::KEYS,
    StepSettings::KEYS,
    #[cfg(feature = "vision")]
    VisionSettings::KEYS,
    MethodSettings::KEYS,
    InferenceSettings::KEYS,
    HardwareSettings::KEYS,
    ParallelSettings::KEYS,
];

/// Every field's URL key by its variant index, gathered from the sections' tables at
/// compile time (a search through them was compiled into the page).
const FIELD_KEYS: [&str; Field::ALL.len()] = {
    let mut keys = [""; Field::ALL.len()];
    keys[Field::Mode as usize] = "m";
    keys[Field::ByteUnit as usize] = "u";
    keys[Field::SweepAxis as usize] = "sweep";
    let mut section = 0;
    while section < SECTION_KEYS.len() {
        let table = SECTION_KEYS[section];
        let mut i = 0;
        while i < table.len() {
            keys[table[i].0 as usize] = table[i].1;
            i += 1;
        }
        section += 1;
    }
    keys
};

/// A group of the page's inputs that owns their URL keys. Their text is read and written by
/// [`PageState::get`] and [`PageState::set`] through one table per kind of field (typed text,
/// choices), not by code per section: that code was compiled once per section and field.
pub trait Section {
    /// Its fields with their URL keys, in the order the URL lists them.
    const KEYS: &'static [(Field, &'static str)];
    /// Whether `field` is one of its own.
    fn owns(field: Field) -> bool {
        Self::KEYS.iter().any(|(f, _)| *f == field)
    }
}

/// The simple mode: the parameter count, its unit and precision, the activation memory per sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimpleModel {
    /// Parameter count as typed, in [`Self::params_unit`]s.
    pub params: String,
    /// The multiplier of the parameter count.
    pub params_unit: ParamUnit,
    /// Precision of the weights (simple mode).
    pub precision: Precision,
    /// Activation MB per sample as typed (simple mode).
    pub activation_mb: String,
}

impl Default for SimpleModel {
    fn default() -> Self {
        Self {
            params: "7".to_owned(),
            params_unit: ParamUnit::Billion,
            precision: Precision::Half,
            activation_mb: "512".to_owned(),
        }
    }
}

impl Section for SimpleModel {
    const KEYS: &'static [(Field, &'static str)] = &[
        (Field::Params, "p"),
        (Field::ParamsUnit, "pu"),
        (Field::Precision, "pr"),
        (Field::ActivationMb, "a"),
    ];
}

/// Architecture mode: which model (a preset, or the pasted config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelChoice {
    /// The preset, or `None` for the pasted config.
    pub preset: Option<Preset>,
    /// The pasted `config.json`, as pasted.
    pub config_json: String,
}

impl Default for ModelChoice {
    fn default() -> Self {
        Self {
            preset: Preset::from_key("llama3-8b"),
            config_json: String::new(),
        }
    }
}

impl Section for ModelChoice {
    const KEYS: &'static [(Field, &'static str)] =
        &[(Field::Model, "model"), (Field::Config, "cfg")];
}

/// One step: batch, sequence, precision recipe, optimizer and the trainer's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepSettings {
    /// Batch size as typed.
    pub batch: String,
    /// Tokens per sample (image side for vision models), as typed.
    pub seq_len: String,
    /// Precision recipe.
    pub recipe: PrecisionRecipe,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// How torch.optim runs it (HF Trainer's fused by default on a first visit; a link
    /// from before this setting reads as foreach, torch.optim's own default).
    pub optimizer_impl: OptimizerImpl,
    /// Attention kernel.
    pub attention: AttentionKernel,
    /// Activation checkpointing.
    pub checkpointing: Checkpointing,
    /// `torch.compile` (off by default; a link without `comp` is eager).
    pub compile: Compile,
    /// torchao's float8 training.
    pub float8: crate::Float8,
    /// How the head and its loss run (the trainer's loss).
    pub loss: LossKind,
    /// Documents packed into each row (position ids restart per document).
    pub packing: bool,
    /// Rows padded to the longest (an attention mask with zeros).
    pub padding: bool,
    /// torchtune's `optimizer_in_bwd` (each parameter stepped in its
    /// Gradient hook).
    pub optimizer_in_backward: bool,
    /// torchtune's `enable_activation_offloading`.
    pub activation_offload: bool,
    /// The layers' kernels: PyTorch's or Unsloth's.
    pub kernels: Kernels,
    /// Supervised, DPO or GRPO.
    pub objective: ObjectiveKind,
    /// Where DPO's (or GRPO's, with beta > 0) reference log-probabilities come from.
    pub reference: Reference,
    /// GRPO's completions per prompt, as typed.
    pub generations: String,
    /// Prompt tokens per sequence (DPO, GRPO), as typed.
    pub max_prompt: String,
    /// Completion tokens per sequence (DPO, GRPO), as typed.
    pub max_completion: String,
    /// What generates GRPO's completions.
    pub generator: Generator,
    /// Colocated vLLM's `gpu_memory_utilization`, as typed (a fraction of the device).
    pub vllm_memory: String,
}

impl Default for StepSettings {
    fn default() -> Self {
        Self {
            batch: "8".to_owned(),
            seq_len: "2048".to_owned(),
            recipe: PrecisionRecipe::AmpBf16,
            optimizer: Optimizer::AdamW,
            optimizer_impl: OptimizerImpl::Fused,
            attention: AttentionKernel::Sdpa,
            checkpointing: Checkpointing::None,
            compile: Compile::Off,
            float8: crate::Float8::Off,
            loss: LossKind::Hf,
            packing: false,
            padding: false,
            optimizer_in_backward: false,
            activation_offload: false,
            kernels: Kernels::Torch,
            objective: ObjectiveKind::Sft,
            reference: Reference::Separate,
            generations: "8".to_owned(),
            max_prompt: "512".to_owned(),
            max_completion: "512".to_owned(),
            generator: Generator::Model,
            vllm_memory: "0.3".to_owned(),
        }
    }
}

impl Section for StepSettings {
    const KEYS: &'static [(Field, &'static str)] = &[
        (Field::Batch, "b"),
        (Field::SeqLen, "s"),
        (Field::Recipe, "r"),
        (Field::Optimizer, "o"),
        (Field::OptimizerImpl, "oi"),
        (Field::Attention, "attn"),
        (Field::Checkpointing, "gc"),
        (Field::Compile, "comp"),
        (Field::Float8, "f8"),
        (Field::Loss, "loss"),
        (Field::Packing, "pack"),
        (Field::Padding, "pad"),
        (Field::OptimizerInBackward, "oib"),
        (Field::ActivationOffload, "ao"),
        (Field::Kernels, "kern"),
        (Field::Objective, "obj"),
        (Field::Reference, "ref"),
        (Field::Generations, "ng"),
        (Field::MaxPrompt, "mp"),
        (Field::MaxCompletion, "mc"),
        (Field::Generator, "gtr"),
        (Field::VllmMemory, "vllm"),
    ];
}

/// The training method: full fine-tuning, LoRA or QLoRA and their settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodSettings {
    /// Full fine-tuning, LoRA or QLoRA.
    pub method: Method,
    /// LoRA rank `r`, as typed.
    pub lora_rank: String,
    /// `lora_alpha`, as typed (it scales the adapters' output, not their memory).
    pub lora_alpha: String,
    /// `lora_dropout`, as typed.
    pub lora_dropout: String,
    /// Target modules: `all-linear`, `attention`, `mlp` or module names, as typed.
    pub lora_targets: String,
    /// Adapters in fp32 (peft's default) or in the base's dtype.
    pub lora_fp32: bool,
    /// The frozen base loaded in fp32 (`torch_dtype=torch.float32`) whatever the recipe.
    pub base_fp32: bool,
    /// QLoRA: the 4-bit type.
    pub quant: Quant4,
    /// QLoRA: double quantization.
    pub double_quant: bool,
    /// QLoRA: `prepare_model_for_kbit_training`.
    pub kbit_prepare: bool,
}

impl Default for MethodSettings {
    fn default() -> Self {
        Self {
            method: Method::Full,
            lora_rank: "16".to_owned(),
            lora_alpha: "32".to_owned(),
            lora_dropout: "0".to_owned(),
            lora_targets: "all-linear".to_owned(),
            lora_fp32: true,
            base_fp32: false,
            quant: Quant4::Nf4,
            double_quant: true,
            kbit_prepare: true,
        }
    }
}

impl Section for MethodSettings {
    const KEYS: &'static [(Field, &'static str)] = &[
        (Field::Method, "method"),
        (Field::LoraRank, "lr"),
        (Field::LoraAlpha, "la"),
        (Field::LoraDropout, "ld"),
        (Field::LoraTargets, "lt"),
        (Field::LoraDtype, "ldt"),
        (Field::BaseDtype, "bdt"),
        (Field::Quant, "q"),
        (Field::DoubleQuant, "dq"),
        (Field::KbitPrepare, "kbit"),
    ];
}

/// Inference: generated tokens, the weights' format and the KV cache's dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InferenceSettings {
    /// Tokens generated after the prompt (KV cache), as typed.
    pub new_tokens: String,
    /// How the weights are stored (quantization).
    pub weight_format: WeightFormat,
    /// The dtype of the KV cache.
    pub kv_dtype: KvDtype,
    /// Serve with vLLM: size its KV cache instead of one generation's.
    pub serve: bool,
    /// vLLM's `gpu_memory_utilization`, as typed (a fraction of the device).
    pub gpu_memory_utilization: String,
    /// vLLM's `max_model_len`, as typed (empty: the model's own).
    pub max_model_len: String,
    /// vLLM's `max_num_seqs`, as typed (empty: the device's default).
    pub max_num_seqs: String,
    /// vLLM's `max_num_batched_tokens`, as typed (empty: the device's default).
    pub max_num_batched_tokens: String,
    /// vLLM's `enforce_eager`: no CUDA graphs.
    pub enforce_eager: bool,
    /// vLLM samples with FlashInfer (its Docker image), else with PyTorch's sort.
    pub flashinfer_sampler: bool,
}

impl Default for InferenceSettings {
    fn default() -> Self {
        Self {
            new_tokens: "0".to_owned(),
            weight_format: WeightFormat::Recipe,
            kv_dtype: KvDtype::Model,
            serve: false,
            gpu_memory_utilization: "0.9".to_owned(),
            max_model_len: String::new(),
            max_num_seqs: String::new(),
            max_num_batched_tokens: String::new(),
            enforce_eager: false,
            flashinfer_sampler: false,
        }
    }
}

impl Section for InferenceSettings {
    const KEYS: &'static [(Field, &'static str)] = &[
        (Field::NewTokens, "gen"),
        (Field::WeightFormat, "wf"),
        (Field::KvDtype, "kvd"),
        (Field::Serve, "srv"),
        (Field::GpuMemoryUtilization, "gmu"),
        (Field::MaxModelLen, "mml"),
        (Field::MaxNumSeqs, "mns"),
        (Field::MaxNumBatchedTokens, "mbt"),
        (Field::EnforceEager, "eager"),
        (Field::FlashinferSampler, "fis"),
    ];
}

/// The device and the overheads on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HardwareSettings {
    /// The GPU (or other device), or `None` to plan for no GPU in particular.
    pub gpu: Option<Gpu>,
    /// Capacity of a custom GPU in MiB, as typed.
    pub custom_capacity_mib: String,
    /// Capacity of the CPU RAM in GiB (2^30 bytes), as typed.
    pub ram_gib: String,
    /// CUDA context in MiB, as typed.
    pub cuda_context_mib: String,
    /// Allocator reserve in percent of the peak, as typed (empty: what replaying the step
    /// through PyTorch's caching allocator finds).
    pub allocator_reserve_percent: String,
    /// The caching allocator's configuration (`expandable_segments`).
    pub allocator: AllocatorMode,
    /// Safety margin in percent of the capacity, as typed.
    pub safety_margin_percent: String,
}

impl Default for HardwareSettings {
    fn default() -> Self {
        Self {
            gpu: Some(Gpu::H100_80),
            custom_capacity_mib: "81920".to_owned(),
            ram_gib: "64".to_owned(),
            cuda_context_mib: "500".to_owned(),
            allocator_reserve_percent: String::new(),
            allocator: AllocatorMode::Default,
            safety_margin_percent: "5".to_owned(),
        }
    }
}

impl Section for HardwareSettings {
    const KEYS: &'static [(Field, &'static str)] = &[
        (Field::Gpu, "gpu"),
        (Field::CustomCapacity, "cap"),
        (Field::RamCapacity, "ram"),
        (Field::CudaContext, "ctx"),
        (Field::AllocatorReserve, "res"),
        (Field::Allocator, "alloc"),
        (Field::SafetyMargin, "margin"),
    ];
}

/// Several GPUs: data parallelism, sharding, tensor and expert parallelism, the global batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParallelSettings {
    /// Every GPU of the job (data-parallel groups x tensor x context x pipeline), as typed.
    pub num_gpus: String,
    /// How model state is sharded across them.
    pub sharding: Sharding,
    /// Tensor-parallel group size (architecture mode), as typed.
    pub tensor_parallel: String,
    /// Expert-parallel group size (architecture mode, mixtures of experts), as typed.
    pub expert_parallel: String,
    /// Sequence parallelism inside the tensor-parallel group.
    pub sequence_parallel: bool,
    /// Loss parallelism: the logits stay split over the vocabulary for the loss.
    pub loss_parallel: bool,
    /// Whose tensor-parallel plan.
    pub tp_plan: TpPlan,
    /// Context-parallel group size (architecture mode), as typed.
    pub context_parallel: String,
    /// FSDP2's `reshard_after_forward`.
    pub reshard_after_forward: Reshard,
    /// FSDP2: the embeddings and the head as their own units (torchtune's
    /// `custom_sharded_layers`), not in the root.
    pub shard_embeddings: bool,
    /// FSDP2's float8 all-gather (`enable_fsdp_float8_all_gather`).
    pub float8_all_gather: bool,
    /// FSDP1's `sharding_strategy`.
    pub fsdp1_sharding: Fsdp1Sharding,
    /// FSDP1's units (accelerate's `fsdp_auto_wrap_policy`).
    pub fsdp1_wrap: Fsdp1Wrap,
    /// FSDP1's `use_orig_params`.
    pub use_orig_params: bool,
    /// FSDP1's `backward_prefetch`.
    pub backward_prefetch: BackwardPrefetch,
    /// GPUs per node (FSDP1's `HYBRID_SHARD` shard group), as typed.
    pub gpus_per_node: String,
    /// Pipeline stages (architecture mode), as typed.
    pub pipeline_parallel: String,
    /// The pipeline's schedule.
    pub pipeline_schedule: PipelineSchedule,
    /// Micro-batches per optimizer step through the pipeline, as typed (empty: one per
    /// stage).
    pub microbatches: String,
    /// What FSDP2 or DeepSpeed keeps in host RAM.
    pub offload: Offload,
    /// GPU memory of one NCCL communicator in MiB, as typed.
    pub nccl_mib: String,
    /// DeepSpeed's `reduce_bucket_size` in elements, as typed.
    pub reduce_bucket: String,
    /// DeepSpeed's `stage3_prefetch_bucket_size` in elements, as typed.
    pub prefetch_bucket: String,
    /// Samples per optimizer step to reach with accumulation, as typed (empty: none).
    pub global_batch: String,
}

impl Default for ParallelSettings {
    fn default() -> Self {
        Self {
            num_gpus: "1".to_owned(),
            sharding: Sharding::Ddp,
            tensor_parallel: "1".to_owned(),
            expert_parallel: "1".to_owned(),
            sequence_parallel: false,
            loss_parallel: false,
            tp_plan: TpPlan::Torchtitan,
            context_parallel: "1".to_owned(),
            reshard_after_forward: Reshard::On,
            shard_embeddings: false,
            float8_all_gather: false,
            fsdp1_sharding: Fsdp1Sharding::Full,
            fsdp1_wrap: Fsdp1Wrap::None,
            use_orig_params: false,
            backward_prefetch: BackwardPrefetch::None,
            gpus_per_node: crate::plan::DEFAULT_GPUS_PER_NODE.to_string(),
            pipeline_parallel: "1".to_owned(),
            pipeline_schedule: PipelineSchedule::OneFOneB,
            microbatches: String::new(),
            offload: Offload::None,
            nccl_mib: crate::plan::NCCL_MIB_PER_COMMUNICATOR.to_string(),
            reduce_bucket: DEEPSPEED_REDUCE_BUCKET_ELEMENTS.to_string(),
            prefetch_bucket: DEEPSPEED_PREFETCH_BUCKET_ELEMENTS.to_string(),
            global_batch: String::new(),
        }
    }
}

impl Section for ParallelSettings {
    const KEYS: &'static [(Field, &'static str)] = &[
        (Field::NumGpus, "gpus"),
        (Field::Sharding, "shard"),
        (Field::TensorParallel, "tp"),
        (Field::ExpertParallel, "ep"),
        (Field::SequenceParallel, "sp"),
        (Field::LossParallel, "lp"),
        (Field::TpPlan, "tpp"),
        (Field::ContextParallel, "cp"),
        (Field::ReshardAfterForward, "raf"),
        (Field::ShardEmbeddings, "fse"),
        (Field::Float8AllGather, "f8ag"),
        (Field::Fsdp1Sharding, "f1s"),
        (Field::Fsdp1Wrap, "f1w"),
        (Field::UseOrigParams, "uop"),
        (Field::BackwardPrefetch, "bp"),
        (Field::GpusPerNode, "gpn"),
        (Field::PipelineParallel, "pp"),
        (Field::PipelineSchedule, "pps"),
        (Field::Microbatches, "mb"),
        (Field::Offload, "off"),
        (Field::NcclMib, "nccl"),
        (Field::ReduceBucket, "rbs"),
        (Field::PrefetchBucket, "pf"),
        (Field::GlobalBatch, "gb"),
    ];
}

/// The whole counts of the plan, in the order their errors are listed: the field, its
/// largest value, its unit, whether 0 is accepted and whether it may be left empty (the
/// allocator's reserve: the replay's; the micro-batches: one per stage; the global batch:
/// none).
const PLAN_COUNTS: [(Field, u64, &str, bool, bool); 13] = [
    (Field::CudaContext, MAX_CONTEXT_MIB, "MiB", true, false),
    (Field::AllocatorReserve, 1000, "percent", true, true),
    (Field::SafetyMargin, 99, "percent", true, false),
    (Field::NumGpus, MAX_GPUS, "GPUs", false, false),
    (Field::TensorParallel, 1024, "GPUs", false, false),
    (Field::ContextParallel, 1024, "GPUs", false, false),
    (Field::PipelineParallel, 1024, "stages", false, false),
    (Field::Microbatches, 4096, "micro-batches", false, true),
    (Field::NcclMib, MAX_CONTEXT_MIB, "MiB", true, false),
    (Field::ReduceBucket, 1 << 40, "elements", false, false),
    (Field::PrefetchBucket, 1 << 40, "elements", true, false),
    (Field::GpusPerNode, 1024, "GPUs", false, false),
    (
        Field::GlobalBatch,
        crate::MAX_BATCH * MAX_GPUS,
        "samples",
        false,
        true,
    ),
];

/// What the typed fields of the page parse to, or the error of each that does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanInputs {
    /// Capacity of the GPU in bytes, `None` when no GPU is chosen.
    pub capacity_bytes: Option<u64>,
    /// Overheads.
    pub overheads: crate::Overheads,
    /// Data-parallel GPUs: the job's GPUs over its tensor, context and pipeline groups.
    pub num_gpus: u64,
    /// Sharding.
    pub sharding: Sharding,
    /// Tensor-parallel group size.
    pub tensor_parallel: u64,
    /// Expert-parallel group size (divides the data-parallel GPUs).
    pub expert_parallel: u64,
    /// Sequence parallelism inside the tensor-parallel group.
    pub sequence_parallel: bool,
    /// Loss parallelism inside the tensor-parallel group.
    pub loss_parallel: bool,
    /// Whose tensor-parallel plan.
    pub tp_plan: TpPlan,
    /// Context-parallel group size.
    pub context_parallel: u64,
    /// FSDP2's `reshard_after_forward`.
    pub reshard_after_forward: Reshard,
    /// FSDP2: the embeddings and the head as their own units, not in the root.
    pub shard_embeddings: bool,
    /// FSDP1's strategy, units and settings.
    pub fsdp1: crate::Fsdp1,
    /// FSDP2 gathers the float8 linears' weights in float8 (torchao's tensorwise recipe
    /// with `enable_fsdp_float8_all_gather`).
    pub float8_all_gather: bool,
    /// Pipeline stages.
    pub pipeline_parallel: u64,
    /// The pipeline's schedule.
    pub pipeline_schedule: PipelineSchedule,
    /// Micro-batches per optimizer step through the pipeline.
    pub microbatches: u64,
    /// What FSDP2 or DeepSpeed keeps in host RAM.
    pub offload: Offload,
    /// NCCL's buffers per communicator (0 off CUDA).
    pub nccl_bytes_per_communicator: u64,
    /// DeepSpeed's `reduce_bucket_size`, elements.
    pub reduce_bucket_elements: u64,
    /// DeepSpeed's `stage3_prefetch_bucket_size`, elements.
    pub prefetch_bucket_elements: u64,
    /// Global batch to reach, if any.
    pub global_batch: Option<u64>,
    /// The caching allocator's configuration.
    pub allocator: AllocatorMode,
    /// Whether the allocator's reserve comes from replaying the step (no percentage typed,
    /// a CUDA device) rather than from `overheads`.
    pub replay_reserve: bool,
}

impl PlanInputs {
    /// Of the data-parallel GPUs, those each parameter is split over: all of them but
    /// under FSDP1's `HYBRID_SHARD` (a node's) and `NO_SHARD` (none).
    #[must_use]
    pub fn shard_group(&self) -> u64 {
        match self.sharding {
            Sharding::Fsdp1 => self.fsdp1.shard_group(self.num_gpus),
            _ => self.num_gpus.max(1),
        }
    }

    /// DDP wraps the model (over more than one GPU): its reducer holds a bucket per ~25 MB
    /// of gradients.
    #[must_use]
    pub(crate) fn ddp_reducer(&self) -> bool {
        self.sharding == Sharding::Ddp && self.shard_group() > 1
    }

    /// GPUs of one data-parallel replica: tensor x context x pipeline parallel.
    #[must_use]
    pub fn model_parallel_gpus(&self) -> u64 {
        self.tensor_parallel
            .max(1)
            .saturating_mul(self.context_parallel.max(1))
            .saturating_mul(self.pipeline_parallel.max(1))
    }

    /// Forward and backward passes per optimizer step at `batch` samples per GPU: as many
    /// as reach the global batch over the data-parallel GPUs (gradient accumulation), 1
    /// without a global batch. A pipeline's schedule runs its own micro-batches
    /// ([`Self::microbatches`]), so it accumulates nothing more here.
    #[must_use]
    pub fn micro_batches_at(&self, batch: u64) -> u64 {
        match self.global_batch {
            Some(global) if self.pipeline_parallel <= 1 && batch > 0 => {
                global.div_ceil(self.num_gpus.max(1)).div_ceil(batch).max(1)
            }
            _ => 1,
        }
    }

    /// Every GPU of the job.
    #[must_use]
    pub fn total_gpus(&self) -> u64 {
        self.num_gpus
            .max(1)
            .saturating_mul(self.model_parallel_gpus())
    }

    /// These inputs with the NCCL overhead of their groups: one communicator per parallel
    /// dimension of more than one GPU (data, tensor, context, pipeline, expert).
    #[must_use]
    pub fn with_communication(mut self) -> Self {
        let dimensions = [
            self.num_gpus,
            self.tensor_parallel,
            self.context_parallel,
            self.pipeline_parallel,
            self.expert_parallel,
        ]
        .iter()
        .filter(|&&g| g > 1)
        .count() as u64;
        self.overheads.communication_bytes =
            dimensions.saturating_mul(self.nccl_bytes_per_communicator);
        self
    }
}

/// One input of the page, with its URL key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// [`PageState::mode`].
    Mode,
    /// [`PageState::params`].
    Params,
    /// [`PageState::params_unit`].
    ParamsUnit,
    /// [`PageState::precision`].
    Precision,
    /// [`PageState::optimizer`].
    Optimizer,
    /// [`StepSettings::optimizer_impl`].
    OptimizerImpl,
    /// [`PageState::batch`].
    Batch,
    /// [`PageState::activation_mb`].
    ActivationMb,
    /// [`PageState::byte_unit`].
    ByteUnit,
    /// [`PageState::preset`].
    Model,
    /// [`PageState::config_json`].
    Config,
    /// [`PageState::seq_len`].
    SeqLen,
    /// [`PageState::recipe`].
    Recipe,
    /// [`PageState::attention`].
    Attention,
    /// [`PageState::checkpointing`].
    Checkpointing,
    /// [`StepSettings::compile`].
    Compile,
    /// [`StepSettings::float8`].
    Float8,
    /// [`PageState::loss`].
    Loss,
    /// [`PageState::packing`].
    Packing,
    /// [`PageState::padding`].
    Padding,
    /// [`PageState::optimizer_in_backward`].
    OptimizerInBackward,
    /// [`PageState::activation_offload`].
    ActivationOffload,
    /// [`StepSettings::kernels`].
    Kernels,
    /// [`StepSettings::objective`].
    Objective,
    /// [`StepSettings::reference`].
    Reference,
    /// [`StepSettings::generations`].
    Generations,
    /// [`StepSettings::max_prompt`].
    MaxPrompt,
    /// [`StepSettings::max_completion`].
    MaxCompletion,
    /// [`StepSettings::generator`].
    Generator,
    /// [`StepSettings::vllm_memory`].
    VllmMemory,
    /// [`VisionSettings::images`].
    #[cfg(feature = "vision")]
    Images,
    /// [`VisionSettings::image_size`].
    #[cfg(feature = "vision")]
    ImageSize,
    /// [`VisionSettings::tower_trained`].
    #[cfg(feature = "vision")]
    VisionTower,
    /// [`VisionSettings::projector_trained`].
    #[cfg(feature = "vision")]
    Projector,
    /// [`PageState::method`].
    Method,
    /// [`PageState::lora_rank`].
    LoraRank,
    /// [`PageState::lora_alpha`].
    LoraAlpha,
    /// [`PageState::lora_dropout`].
    LoraDropout,
    /// [`PageState::lora_targets`].
    LoraTargets,
    /// [`PageState::lora_fp32`].
    LoraDtype,
    /// [`MethodSettings::base_fp32`].
    BaseDtype,
    /// [`PageState::quant`].
    Quant,
    /// [`PageState::double_quant`].
    DoubleQuant,
    /// [`PageState::kbit_prepare`].
    KbitPrepare,
    /// [`PageState::new_tokens`].
    NewTokens,
    /// [`PageState::weight_format`].
    WeightFormat,
    /// [`PageState::kv_dtype`].
    KvDtype,
    /// [`InferenceSettings::serve`].
    Serve,
    /// [`InferenceSettings::gpu_memory_utilization`].
    GpuMemoryUtilization,
    /// [`InferenceSettings::max_model_len`].
    MaxModelLen,
    /// [`InferenceSettings::max_num_seqs`].
    MaxNumSeqs,
    /// [`InferenceSettings::max_num_batched_tokens`].
    MaxNumBatchedTokens,
    /// [`InferenceSettings::enforce_eager`].
    EnforceEager,
    /// [`InferenceSettings::flashinfer_sampler`].
    FlashinferSampler,
    /// [`PageState::gpu`].
    Gpu,
    /// [`PageState::custom_capacity_mib`].
    CustomCapacity,
    /// [`PageState::ram_gib`].
    RamCapacity,
    /// [`PageState::cuda_context_mib`].
    CudaContext,
    /// [`PageState::allocator_reserve_percent`].
    AllocatorReserve,
    /// [`HardwareSettings::allocator`].
    Allocator,
    /// [`PageState::safety_margin_percent`].
    SafetyMargin,
    /// [`PageState::num_gpus`].
    NumGpus,
    /// [`PageState::sharding`].
    Sharding,
    /// [`PageState::tensor_parallel`].
    TensorParallel,
    /// [`PageState::expert_parallel`].
    ExpertParallel,
    /// [`ParallelSettings::sequence_parallel`].
    SequenceParallel,
    /// [`ParallelSettings::loss_parallel`].
    LossParallel,
    /// [`ParallelSettings::tp_plan`].
    TpPlan,
    /// [`ParallelSettings::context_parallel`].
    ContextParallel,
    /// [`ParallelSettings::reshard_after_forward`].
    ReshardAfterForward,
    /// [`ParallelSettings::shard_embeddings`].
    ShardEmbeddings,
    /// [`ParallelSettings::float8_all_gather`].
    Float8AllGather,
    /// [`ParallelSettings::fsdp1_sharding`].
    Fsdp1Sharding,
    /// [`ParallelSettings::fsdp1_wrap`].
    Fsdp1Wrap,
    /// [`ParallelSettings::use_orig_params`].
    UseOrigParams,
    /// [`ParallelSettings::backward_prefetch`].
    BackwardPrefetch,
    /// [`ParallelSettings::gpus_per_node`].
    GpusPerNode,
    /// [`ParallelSettings::pipeline_parallel`].
    PipelineParallel,
    /// [`ParallelSettings::pipeline_schedule`].
    PipelineSchedule,
    /// [`ParallelSettings::microbatches`].
    Microbatches,
    /// [`ParallelSettings::offload`].
    Offload,
    /// [`ParallelSettings::nccl_mib`].
    NcclMib,
    /// [`ParallelSettings::reduce_bucket`].
    ReduceBucket,
    /// [`ParallelSettings::prefetch_bucket`].
    PrefetchBucket,
    /// [`PageState::global_batch`].
    GlobalBatch,
    /// [`PageState::sweep_axis`].
    SweepAxis,
}

/// Longest text kept for a typed number: longer text is not a number a person typed.
const MAX_TEXT_FIELD_CHARS: usize = 64;

impl Field {
    /// Every field, in the order the URL lists them.
    pub const ALL: [Field; if cfg!(feature = "vision") { 86 } else { 82 }] = [
        Field::Mode,
        Field::Params,
        Field::ParamsUnit,
        Field::Precision,
        Field::Optimizer,
        Field::OptimizerImpl,
        Field::Batch,
        Field::ActivationMb,
        Field::ByteUnit,
        Field::Model,
        Field::SeqLen,
        Field::Recipe,
        Field::Attention,
        Field::Checkpointing,
        Field::Compile,
        Field::Float8,
        Field::Loss,
        Field::Packing,
        Field::Padding,
        Field::OptimizerInBackward,
        Field::ActivationOffload,
        Field::Kernels,
        Field::Objective,
        Field::Reference,
        Field::Generations,
        Field::MaxPrompt,
        Field::MaxCompletion,
        Field::Generator,
        Field::VllmMemory,
        #[cfg(feature = "vision")]
        Field::Images,
        #[cfg(feature = "vision")]
        Field::ImageSize,
        #[cfg(feature = "vision")]
        Field::VisionTower,
        #[cfg(feature = "vision")]
        Field::Projector,
        Field::Method,
        Field::LoraRank,
        Field::LoraAlpha,
        Field::LoraDropout,
        Field::LoraTargets,
        Field::LoraDtype,
        Field::BaseDtype,
        Field::Quant,
        Field::DoubleQuant,
        Field::KbitPrepare,
        Field::NewTokens,
        Field::WeightFormat,
        Field::KvDtype,
        Field::Serve,
        Field::GpuMemoryUtilization,
        Field::MaxModelLen,
        Field::MaxNumSeqs,
        Field::MaxNumBatchedTokens,
        Field::EnforceEager,
        Field::FlashinferSampler,
        Field::Gpu,
        Field::CustomCapacity,
        Field::RamCapacity,
        Field::CudaContext,
        Field::AllocatorReserve,
        Field::Allocator,
        Field::SafetyMargin,
        Field::NumGpus,
        Field::Sharding,
        Field::TensorParallel,
        Field::ExpertParallel,
        Field::SequenceParallel,
        Field::LossParallel,
        Field::TpPlan,
        Field::ContextParallel,
        Field::ReshardAfterForward,
        Field::ShardEmbeddings,
        Field::Float8AllGather,
        Field::Fsdp1Sharding,
        Field::Fsdp1Wrap,
        Field::UseOrigParams,
        Field::BackwardPrefetch,
        Field::GpusPerNode,
        Field::PipelineParallel,
        Field::PipelineSchedule,
        Field::Microbatches,
        Field::Offload,
        Field::NcclMib,
        Field::ReduceBucket,
        Field::PrefetchBucket,
        Field::GlobalBatch,
        Field::SweepAxis,
        Field::Config,
    ];

    /// The URL key (each section owns those of its fields).
    #[must_use]
    pub fn key(self) -> &'static str {
        FIELD_KEYS[self as usize]
    }

    /// What the field is, for notices.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Field::Mode => "mode",
            Field::Params => "parameters",
            Field::ParamsUnit => "parameter unit",
            Field::Precision => "precision",
            Field::Optimizer => "optimizer",
            Field::OptimizerImpl => "optimizer implementation",
            Field::Batch => "batch size",
            Field::ActivationMb => "activation MB per sample",
            Field::ByteUnit => "display unit",
            Field::Model => "model",
            Field::Config => "config.json",
            Field::SeqLen => "sequence length",
            Field::Recipe => "precision recipe",
            Field::Attention => "attention kernel",
            Field::Checkpointing => "activation checkpointing",
            Field::Compile => "torch.compile",
            Field::Float8 => "float8 training",
            Field::Float8AllGather => "FSDP2 float8 all-gather",
            Field::Loss => "loss",
            Field::Kernels => "kernels",
            Field::Packing => "sequence packing",
            Field::Padding => "padded rows",
            Field::OptimizerInBackward => "optimizer in backward",
            Field::ActivationOffload => "activation offloading",
            Field::Objective => "training objective",
            Field::Reference => "reference model",
            Field::Generations => "generations per prompt",
            Field::MaxPrompt => "prompt tokens",
            Field::MaxCompletion => "completion tokens",
            Field::Generator => "generator",
            Field::VllmMemory => "vLLM memory fraction",
            #[cfg(feature = "vision")]
            Field::Images => "images per sample",
            #[cfg(feature = "vision")]
            Field::ImageSize => "image size",
            #[cfg(feature = "vision")]
            Field::VisionTower => "vision tower",
            #[cfg(feature = "vision")]
            Field::Projector => "projector",
            Field::Method => "training method",
            Field::LoraRank => "LoRA rank",
            Field::LoraAlpha => "LoRA alpha",
            Field::LoraDropout => "LoRA dropout",
            Field::LoraTargets => "LoRA target modules",
            Field::LoraDtype => "adapter dtype",
            Field::BaseDtype => "base weights' dtype",
            Field::Quant => "4-bit type",
            Field::DoubleQuant => "double quantization",
            Field::KbitPrepare => "k-bit preparation",
            Field::NewTokens => "generated tokens",
            Field::WeightFormat => "weight format",
            Field::KvDtype => "KV-cache dtype",
            Field::Serve => "serve with vLLM",
            Field::GpuMemoryUtilization => "gpu_memory_utilization",
            Field::MaxModelLen => "max_model_len",
            Field::MaxNumSeqs => "max_num_seqs",
            Field::MaxNumBatchedTokens => "max_num_batched_tokens",
            Field::EnforceEager => "enforce_eager",
            Field::FlashinferSampler => "FlashInfer sampler",
            Field::Gpu => "GPU",
            Field::CustomCapacity => "custom capacity (MiB)",
            Field::RamCapacity => "CPU RAM (GiB)",
            Field::CudaContext => "CUDA context (MiB)",
            Field::AllocatorReserve => "allocator reserve (%)",
            Field::Allocator => "caching allocator",
            Field::SafetyMargin => "safety margin (%)",
            Field::NumGpus => "number of GPUs",
            Field::Sharding => "sharding",
            Field::TensorParallel => "tensor parallelism",
            Field::ExpertParallel => "expert parallelism",
            Field::SequenceParallel => "sequence parallelism",
            Field::LossParallel => "loss parallelism",
            Field::TpPlan => "tensor-parallel plan",
            Field::ContextParallel => "context parallelism",
            Field::ReshardAfterForward => "reshard after forward",
            Field::ShardEmbeddings => "embeddings as their own FSDP units",
            Field::Fsdp1Sharding => "FSDP1 sharding strategy",
            Field::Fsdp1Wrap => "FSDP1 wrapping",
            Field::UseOrigParams => "FSDP1 use_orig_params",
            Field::BackwardPrefetch => "FSDP1 backward prefetch",
            Field::GpusPerNode => "GPUs per node",
            Field::PipelineParallel => "pipeline parallelism",
            Field::PipelineSchedule => "pipeline schedule",
            Field::Microbatches => "micro-batches",
            Field::Offload => "offload",
            Field::NcclMib => "NCCL memory per communicator",
            Field::ReduceBucket => "reduce bucket",
            Field::PrefetchBucket => "prefetch bucket",
            Field::GlobalBatch => "global batch",
            Field::SweepAxis => "sweep axis",
        }
    }

    /// The field whose URL key is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.key() == key)
    }
}

/// The error of a choice field: the keys it takes (not generic: one copy for every type).
fn expected_one_of(keys: &mut dyn Iterator<Item = &'static str>) -> String {
    let mut message = "expected one of ".to_owned();
    for (i, key) in keys.enumerate() {
        if i > 0 {
            message.push_str(", ");
        }
        message.push_str(key);
    }
    message.push('.');
    message
}

/// A fraction below 1 (a probability, a share of the device) as typed, in thousandths.
fn fraction_permille(text: &str) -> Result<u64, FieldError> {
    crate::number::parse_rounded_amount(text, 1000, 999).map_err(|e| match e {
        FieldError::TooLarge { .. } => {
            FieldError::Other("Must be below 1 (a fraction).".to_owned())
        }
        e => e,
    })
}

/// vLLM's typed settings, parsed ([`PageState::parsed_vllm_fields`]).
struct VllmFields {
    utilization_ppm: u32,
    max_model_len: Option<u64>,
    max_num_seqs: Option<u64>,
    max_num_batched_tokens: Option<u64>,
}

/// The longest `max_model_len` or `max_num_batched_tokens` typed in (16M tokens).
const MAX_SERVED_TOKENS: u64 = 1 << 24;
/// The most `max_num_seqs` typed in.
const MAX_NUM_SEQS: u64 = 1 << 16;

/// vLLM's `gpu_memory_utilization`: a fraction in (0, 1], in parts per million.
fn parse_utilization(text: &str) -> Result<u32, FieldError> {
    crate::number::parse_rounded_amount(text, 1_000_000, 1_000_000)
        .map(|ppm| u32::try_from(ppm).unwrap_or(1_000_000))
        .map_err(|e| match e {
            FieldError::TooLarge { .. } => {
                FieldError::Other("At most 1 (the whole device).".to_owned())
            }
            e => e,
        })
}

/// A count in `1..=max`, or `None` for an empty field (vLLM's default).
fn parse_optional_count(text: &str, max: u64) -> Result<Option<u64>, FieldError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    parse_count(text, max, "tokens", false).map(Some)
}

const fn on_off(value: bool) -> &'static str {
    if value {
        "on"
    } else {
        "off"
    }
}

/// Adapters in fp32, or in the base model's dtype.
const fn adapter_dtype_key(fp32: bool) -> &'static str {
    if fp32 {
        "fp32"
    } else {
        "model"
    }
}

/// The keys of an on/off switch: `true` first.
const ON_OFF: [&str; 2] = [on_off(true), on_off(false)];
/// The keys of the adapters' dtype: fp32 (`true`) first.
const ADAPTER_DTYPES: [&str; 2] = [adapter_dtype_key(true), adapter_dtype_key(false)];
/// The keys of the frozen base's dtype: the recipe's (the default) first, then fp32.
const BASE_DTYPES: [&str; 2] = ["recipe", "fp32"];

/// The typed fields and where each keeps its text: one list from which both accessors are
/// written, so that [`PageState::get`] and [`PageState::set`] read and write every typed
/// field by one path instead of one per field.
macro_rules! text_fields {
    ($($(#[$cfg:meta])* $field:ident => $section:ident . $name:ident,)*) => {
        impl PageState {
            /// The text of a typed field as typed (`None` for a choice).
            fn text(&self, field: Field) -> Option<&String> {
                Some(match field {
                    $($(#[$cfg])* Field::$field => &self.$section.$name,)*
                    _ => return None,
                })
            }

            /// [`Self::text`], to write.
            fn text_mut(&mut self, field: Field) -> Option<&mut String> {
                Some(match field {
                    $($(#[$cfg])* Field::$field => &mut self.$section.$name,)*
                    _ => return None,
                })
            }
        }
    };
}

text_fields! {
    Params => simple.params,
    ActivationMb => simple.activation_mb,
    Config => model.config_json,
    Batch => step.batch,
    SeqLen => step.seq_len,
    Generations => step.generations,
    MaxPrompt => step.max_prompt,
    MaxCompletion => step.max_completion,
    VllmMemory => step.vllm_memory,
    #[cfg(feature = "vision")]
    Images => vision.images,
    #[cfg(feature = "vision")]
    ImageSize => vision.image_size,
    LoraRank => training.lora_rank,
    LoraAlpha => training.lora_alpha,
    LoraDropout => training.lora_dropout,
    LoraTargets => training.lora_targets,
    NewTokens => inference.new_tokens,
    GpuMemoryUtilization => inference.gpu_memory_utilization,
    MaxModelLen => inference.max_model_len,
    MaxNumSeqs => inference.max_num_seqs,
    MaxNumBatchedTokens => inference.max_num_batched_tokens,
    CustomCapacity => hardware.custom_capacity_mib,
    RamCapacity => hardware.ram_gib,
    CudaContext => hardware.cuda_context_mib,
    AllocatorReserve => hardware.allocator_reserve_percent,
    SafetyMargin => hardware.safety_margin_percent,
    NumGpus => parallel.num_gpus,
    TensorParallel => parallel.tensor_parallel,
    ExpertParallel => parallel.expert_parallel,
    ContextParallel => parallel.context_parallel,
    PipelineParallel => parallel.pipeline_parallel,
    Microbatches => parallel.microbatches,
    NcclMib => parallel.nccl_mib,
    ReduceBucket => parallel.reduce_bucket,
    PrefetchBucket => parallel.prefetch_bucket,
    GpusPerNode => parallel.gpus_per_node,
    GlobalBatch => parallel.global_batch,
}

/// The keys of `T`'s choices in the order of `T::ALL`, a table built at compile time: every
/// choice field is then read by one search over its table, where a generic search was
/// compiled once per type. Without `by key` it also checks that `T::ALL` lists the variants
/// in the order they are declared, so that a value's index among its keys is `value as
/// usize` ([`PageState::choice_index`]); `by key` for the types whose values are written
/// by their own `key()` instead.
macro_rules! keys_of {
    ($t:ty) => {{
        const _: () = {
            let mut i = 0;
            while i < <$t>::ALL.len() {
                assert!(<$t>::ALL[i] as usize == i, "ALL out of declaration order");
                i += 1;
            }
        };
        keys_of!($t, by key)
    }};
    ($t:ty, by key) => {{
        const KEYS: [&str; <$t>::ALL.len()] = {
            let mut keys = [""; <$t>::ALL.len()];
            let mut i = 0;
            while i < keys.len() {
                keys[i] = <$t>::ALL[i].key();
                i += 1;
            }
            keys
        };
        &KEYS
    }};
}

impl Field {
    /// The keys of a choice field, in the order its message lists them (index `i` is
    /// `T::ALL[i]`, or `true` first for most switches). Empty for typed text, and for the
    /// model and the resharding, which read their keys their own way.
    fn choice_keys(self) -> &'static [&'static str] {
        match self {
            Field::Mode => keys_of!(Mode),
            Field::ByteUnit => keys_of!(ByteUnit),
            Field::SweepAxis => keys_of!(SweepAxis),
            Field::ParamsUnit => keys_of!(ParamUnit),
            Field::Precision => keys_of!(Precision),
            Field::Recipe => keys_of!(PrecisionRecipe),
            Field::Optimizer => keys_of!(Optimizer),
            Field::OptimizerImpl => keys_of!(OptimizerImpl),
            Field::Attention => keys_of!(AttentionKernel),
            Field::Checkpointing => keys_of!(Checkpointing, by key),
            Field::Compile => keys_of!(Compile),
            Field::Float8 => keys_of!(crate::Float8),
            Field::Loss => keys_of!(LossKind),
            Field::Kernels => keys_of!(Kernels),
            Field::Packing
            | Field::Padding
            | Field::OptimizerInBackward
            | Field::ActivationOffload
            | Field::DoubleQuant
            | Field::KbitPrepare
            | Field::SequenceParallel
            | Field::LossParallel
            | Field::ShardEmbeddings
            | Field::Float8AllGather
            | Field::UseOrigParams
            | Field::Serve
            | Field::EnforceEager
            | Field::FlashinferSampler => &ON_OFF,
            Field::Fsdp1Sharding => keys_of!(Fsdp1Sharding),
            Field::Fsdp1Wrap => keys_of!(Fsdp1Wrap),
            Field::BackwardPrefetch => keys_of!(BackwardPrefetch),
            Field::Objective => keys_of!(ObjectiveKind),
            Field::Reference => keys_of!(Reference),
            Field::Generator => keys_of!(Generator),
            #[cfg(feature = "vision")]
            Field::VisionTower => &vision::TOWER_KEYS,
            #[cfg(feature = "vision")]
            Field::Projector => &vision::PROJECTOR_KEYS,
            Field::Method => keys_of!(Method),
            Field::LoraDtype => &ADAPTER_DTYPES,
            Field::BaseDtype => &BASE_DTYPES,
            Field::Quant => keys_of!(Quant4),
            Field::WeightFormat => keys_of!(WeightFormat),
            Field::KvDtype => keys_of!(KvDtype),
            Field::Gpu => keys_of!(Gpu),
            Field::Allocator => keys_of!(AllocatorMode),
            Field::Sharding => keys_of!(Sharding, by key),
            Field::TpPlan => keys_of!(TpPlan),
            Field::PipelineSchedule => keys_of!(PipelineSchedule, by key),
            Field::Offload => keys_of!(Offload),
            _ => &[],
        }
    }
}

impl PageState {
    /// Whether `field` goes into links: every field but the image fields and the sweep
    /// axis at their defaults, float8's, FSDP1's and vLLM's settings when unused (so that
    /// every other link stays as it was).
    #[must_use]
    pub fn travels(&self, field: Field) -> bool {
        if field == Field::SweepAxis {
            return self.sweep_axis != SweepAxis::Batch;
        }
        // float8, only when asked for (links without it stay as they were)
        match field {
            Field::Float8 => return self.step.float8 != crate::Float8::Off,
            Field::Float8AllGather => return self.parallel.float8_all_gather,
            _ => {}
        }
        // FSDP1's settings, only with FSDP1 (links of the other engines stay as they were)
        if matches!(
            field,
            Field::Fsdp1Sharding
                | Field::Fsdp1Wrap
                | Field::UseOrigParams
                | Field::BackwardPrefetch
                | Field::GpusPerNode
        ) {
            return self.parallel.sharding == Sharding::Fsdp1;
        }
        // vLLM's settings, only when serving (links of every other step stay as they were)
        if matches!(
            field,
            Field::Serve
                | Field::GpuMemoryUtilization
                | Field::MaxModelLen
                | Field::MaxNumSeqs
                | Field::MaxNumBatchedTokens
                | Field::EnforceEager
                | Field::FlashinferSampler
        ) {
            return self.inference.serve;
        }
        #[cfg(feature = "vision")]
        return self.vision.travels(field);
        #[cfg(not(feature = "vision"))]
        {
            let _ = field;
            true
        }
    }

    /// The value of `field` as its URL text (what its control shows), `None` for the config
    /// while a preset is the model.
    #[must_use]
    pub fn get(&self, field: Field) -> Option<String> {
        match field {
            // The config travels only when it is the model, in compact form when it parses.
            Field::Config => {
                let json = &self.model.config_json;
                if self.model.preset.is_some() || json.is_empty() {
                    return None;
                }
                Some(
                    crate::parse_hf_config(json)
                        .map_or_else(|_| json.clone(), |a| a.to_config_json()),
                )
            }
            Field::ReshardAfterForward => Some(self.parallel.reshard_after_forward.key()),
            _ => {
                let text = self.text(field).map(String::as_str);
                text.or_else(|| self.choice_key(field)).map(str::to_owned)
            }
        }
    }

    /// The key of a choice field's value (`None` for typed text).
    fn choice_key(&self, field: Field) -> Option<&'static str> {
        match (field, self.hardware.gpu) {
            (Field::Model, _) => Some(self.model.preset.map_or(CUSTOM_MODEL_KEY, Preset::key)),
            (Field::Gpu, None) => Some("none"),
            (Field::Checkpointing, _) => Some(self.step.checkpointing.key()),
            (Field::Sharding, _) => Some(self.parallel.sharding.key()),
            (Field::PipelineSchedule, _) => Some(self.parallel.pipeline_schedule.key()),
            _ => field.choice_keys().get(self.choice_index(field)?).copied(),
        }
    }

    /// The index of a choice field's value among [`Field::choice_keys`] (`None` for typed
    /// text): a value's variant index, as `keys_of!` checks.
    fn choice_index(&self, field: Field) -> Option<usize> {
        let (st, tr, par) = (&self.step, &self.training, &self.parallel);
        Some(match field {
            Field::Mode => self.mode as usize,
            Field::ByteUnit => self.byte_unit as usize,
            Field::SweepAxis => self.sweep_axis as usize,
            Field::ParamsUnit => self.simple.params_unit as usize,
            Field::Precision => self.simple.precision as usize,
            Field::Recipe => st.recipe as usize,
            Field::Optimizer => st.optimizer as usize,
            Field::OptimizerImpl => st.optimizer_impl as usize,
            Field::Attention => st.attention as usize,
            Field::Compile => st.compile as usize,
            Field::Float8 => st.float8 as usize,
            Field::Float8AllGather => usize::from(!self.parallel.float8_all_gather),
            Field::Loss => st.loss as usize,
            // the switches list `true` first
            Field::Packing => usize::from(!st.packing),
            Field::Padding => usize::from(!st.padding),
            Field::OptimizerInBackward => usize::from(!st.optimizer_in_backward),
            Field::ActivationOffload => usize::from(!st.activation_offload),
            Field::Kernels => st.kernels as usize,
            Field::Objective => st.objective as usize,
            Field::Reference => st.reference as usize,
            Field::Generator => st.generator as usize,
            // the image switches list their default first: frozen, trained
            #[cfg(feature = "vision")]
            Field::VisionTower => usize::from(self.vision.tower_trained),
            #[cfg(feature = "vision")]
            Field::Projector => usize::from(!self.vision.projector_trained),
            Field::Method => tr.method as usize,
            Field::LoraDtype => usize::from(!tr.lora_fp32),
            Field::BaseDtype => usize::from(tr.base_fp32),
            Field::Quant => tr.quant as usize,
            Field::DoubleQuant => usize::from(!tr.double_quant),
            Field::KbitPrepare => usize::from(!tr.kbit_prepare),
            Field::WeightFormat => self.inference.weight_format as usize,
            Field::KvDtype => self.inference.kv_dtype as usize,
            Field::Serve => usize::from(!self.inference.serve),
            Field::EnforceEager => usize::from(!self.inference.enforce_eager),
            Field::FlashinferSampler => usize::from(!self.inference.flashinfer_sampler),
            Field::Gpu => self.hardware.gpu? as usize,
            Field::Allocator => self.hardware.allocator as usize,
            Field::SequenceParallel => usize::from(!par.sequence_parallel),
            Field::ShardEmbeddings => usize::from(!par.shard_embeddings),
            Field::UseOrigParams => usize::from(!par.use_orig_params),
            Field::Fsdp1Sharding => par.fsdp1_sharding as usize,
            Field::Fsdp1Wrap => par.fsdp1_wrap as usize,
            Field::BackwardPrefetch => par.backward_prefetch as usize,
            Field::LossParallel => usize::from(!par.loss_parallel),
            Field::TpPlan => par.tp_plan as usize,
            Field::Offload => par.offload as usize,
            _ => return None,
        })
    }

    /// Sets `field` from its URL text.
    ///
    /// # Errors
    /// Why the text is not a value of that field; the field is left as it was.
    pub fn set(&mut self, field: Field, value: &str) -> Result<(), String> {
        if let Some(text) = self.text_mut(field) {
            // typed numbers are short; a pasted config.json may be long
            let max = if field == Field::Config {
                MAX_CONFIG_CHARS
            } else {
                MAX_TEXT_FIELD_CHARS
            };
            if value.chars().count() > max {
                return Err(format!("longer than {max} characters."));
            }
            value.clone_into(text);
            return Ok(());
        }
        self.set_choice(field, value).ok_or_else(|| match field {
            Field::ReshardAfterForward => "Enter on, off or a number of GPUs.".to_owned(),
            Field::Model => expected_one_of(&mut Preset::ALL.into_iter().map(Preset::key)),
            _ => expected_one_of(&mut field.choice_keys().iter().copied()),
        })
    }

    /// Sets a choice field from its key: `None`, and the field left as it was, when the
    /// key is none of its choices.
    fn set_choice(&mut self, field: Field, value: &str) -> Option<()> {
        match field {
            // read their own way: other spellings, case-insensitive names, values beside
            // the choices
            Field::ParamsUnit => self.simple.params_unit = ParamUnit::from_key(value)?,
            Field::WeightFormat => self.inference.weight_format = WeightFormat::from_key(value)?,
            Field::KvDtype => self.inference.kv_dtype = KvDtype::from_key(value)?,
            Field::Model if value == CUSTOM_MODEL_KEY => self.model.preset = None,
            Field::Model => self.model.preset = Some(Preset::from_key(value)?),
            Field::Gpu if value == "none" => self.hardware.gpu = None,
            Field::ReshardAfterForward => {
                self.parallel.reshard_after_forward = Reshard::from_key(value)?;
            }
            _ => {
                let i = field.choice_keys().iter().position(|k| *k == value)?;
                // `i` indexes the keys, which are `ALL`'s: `get` never fails, and compiles no
                // panic path per type
                let (st, tr, par) = (&mut self.step, &mut self.training, &mut self.parallel);
                match field {
                    Field::Mode => self.mode = *Mode::ALL.get(i)?,
                    Field::ByteUnit => self.byte_unit = *ByteUnit::ALL.get(i)?,
                    Field::SweepAxis => self.sweep_axis = *SweepAxis::ALL.get(i)?,
                    Field::Precision => self.simple.precision = *Precision::ALL.get(i)?,
                    Field::Recipe => st.recipe = *PrecisionRecipe::ALL.get(i)?,
                    Field::Optimizer => st.optimizer = *Optimizer::ALL.get(i)?,
                    Field::OptimizerImpl => st.optimizer_impl = *OptimizerImpl::ALL.get(i)?,
                    Field::Attention => st.attention = *AttentionKernel::ALL.get(i)?,
                    Field::Checkpointing => st.checkpointing = *Checkpointing::ALL.get(i)?,
                    Field::Compile => st.compile = *Compile::ALL.get(i)?,
                    Field::Float8 => st.float8 = *crate::Float8::ALL.get(i)?,
                    Field::Float8AllGather => par.float8_all_gather = i == 0,
                    Field::Loss => st.loss = *LossKind::ALL.get(i)?,
                    Field::Packing => st.packing = i == 0,
                    Field::Padding => st.padding = i == 0,
                    Field::OptimizerInBackward => st.optimizer_in_backward = i == 0,
                    Field::ActivationOffload => st.activation_offload = i == 0,
                    Field::Kernels => st.kernels = *Kernels::ALL.get(i)?,
                    Field::Objective => st.objective = *ObjectiveKind::ALL.get(i)?,
                    Field::Reference => st.reference = *Reference::ALL.get(i)?,
                    Field::Generator => st.generator = *Generator::ALL.get(i)?,
                    // the image switches list their default first: frozen, trained
                    #[cfg(feature = "vision")]
                    Field::VisionTower => self.vision.tower_trained = i == 1,
                    #[cfg(feature = "vision")]
                    Field::Projector => self.vision.projector_trained = i == 0,
                    Field::Method => tr.method = *Method::ALL.get(i)?,
                    Field::LoraDtype => tr.lora_fp32 = i == 0,
                    Field::BaseDtype => tr.base_fp32 = i == 1,
                    Field::Quant => tr.quant = *Quant4::ALL.get(i)?,
                    Field::DoubleQuant => tr.double_quant = i == 0,
                    Field::KbitPrepare => tr.kbit_prepare = i == 0,
                    Field::Serve => self.inference.serve = i == 0,
                    Field::EnforceEager => self.inference.enforce_eager = i == 0,
                    Field::FlashinferSampler => self.inference.flashinfer_sampler = i == 0,
                    Field::Gpu => self.hardware.gpu = Some(*Gpu::ALL.get(i)?),
                    Field::Allocator => self.hardware.allocator = *AllocatorMode::ALL.get(i)?,
                    Field::Sharding => par.sharding = *Sharding::ALL.get(i)?,
                    Field::SequenceParallel => par.sequence_parallel = i == 0,
                    Field::ShardEmbeddings => par.shard_embeddings = i == 0,
                    Field::UseOrigParams => par.use_orig_params = i == 0,
                    Field::Fsdp1Sharding => par.fsdp1_sharding = *Fsdp1Sharding::ALL.get(i)?,
                    Field::Fsdp1Wrap => par.fsdp1_wrap = *Fsdp1Wrap::ALL.get(i)?,
                    Field::BackwardPrefetch => {
                        par.backward_prefetch = *BackwardPrefetch::ALL.get(i)?
                    }
                    Field::LossParallel => par.loss_parallel = i == 0,
                    Field::TpPlan => par.tp_plan = *TpPlan::ALL.get(i)?,
                    Field::PipelineSchedule => {
                        par.pipeline_schedule = *PipelineSchedule::ALL.get(i)?
                    }
                    Field::Offload => par.offload = *Offload::ALL.get(i)?,
                    _ => {}
                }
            }
        }
        Some(())
    }

    /// The parsed sequence length (image side for vision models).
    ///
    /// # Errors
    /// The message for the field.
    pub fn parsed_seq_len(&self) -> Result<u64, FieldError> {
        parse_count(&self.step.seq_len, MAX_SEQ_LEN, "tokens", false)
    }

    /// The training objective with its settings (those of DPO and GRPO parsed only when
    /// chosen).
    ///
    /// # Errors
    /// The fields and their messages.
    pub fn parsed_objective(&self) -> Result<crate::Objective, Vec<(Field, FieldError)>> {
        let st = &self.step;
        if st.objective == ObjectiveKind::Sft {
            return Ok(crate::Objective::SFT);
        }
        let mut errors = Vec::new();
        let grpo = st.objective == ObjectiveKind::Grpo;
        let prompt = parse_count(&st.max_prompt, MAX_SEQ_LEN, "tokens", true)
            .map_err(|e| errors.push((Field::MaxPrompt, e)));
        let completion = parse_count(&st.max_completion, MAX_SEQ_LEN, "tokens", false)
            .map_err(|e| errors.push((Field::MaxCompletion, e)));
        let generations = if grpo {
            parse_count(&st.generations, MAX_GENERATIONS, "generations", false)
                .map_err(|e| errors.push((Field::Generations, e)))
        } else {
            Ok(1)
        };
        let vllm = if grpo && st.generator == Generator::VllmColocated {
            fraction_permille(&st.vllm_memory).map_err(|e| errors.push((Field::VllmMemory, e)))
        } else {
            Ok(300)
        };
        let (Ok(max_prompt), Ok(max_completion), Ok(generations), Ok(vllm)) =
            (prompt, completion, generations, vllm)
        else {
            return Err(errors);
        };
        Ok(crate::Objective {
            kind: st.objective,
            reference: st.reference,
            max_prompt,
            max_completion,
            generations,
            generator: st.generator,
            vllm_memory_permille: u32::try_from(vllm).unwrap_or(300),
            steps_per_generation: 1,
            iterations: 1,
        })
    }

    /// The LoRA rank, whether `lora_alpha` is a number (it scales the adapters' output, not
    /// their memory) and whether dropout is on.
    fn lora_numbers(
        &self,
    ) -> (
        Result<u64, FieldError>,
        Result<(), FieldError>,
        Result<bool, FieldError>,
    ) {
        let rank = parse_count(&self.training.lora_rank, MAX_LORA_RANK, "ranks", false);
        let alpha =
            crate::number::parse_rounded_amount(&self.training.lora_alpha, 1000, u64::MAX / 2)
                .map(|_| ());
        let dropout = match fraction_permille(&self.training.lora_dropout) {
            Ok(_) => Ok(true),
            Err(FieldError::Zero) => Ok(false),
            Err(e) => Err(e),
        };
        (rank, alpha, dropout)
    }

    /// The LoRA / QLoRA setup of `arch` (`None` for full fine-tuning), or the error of each
    /// PEFT field that does not parse.
    ///
    /// # Errors
    /// The fields and their messages.
    pub fn parsed_peft(
        &self,
        arch: &crate::Architecture,
    ) -> Result<Option<Peft>, Vec<(Field, FieldError)>> {
        if self.training.method == Method::Full {
            return Ok(None);
        }
        let mut errors = Vec::new();
        let (rank, alpha, dropout) = self.lora_numbers();
        let rank = rank.map_err(|e| errors.push((Field::LoraRank, e)));
        let _ = alpha.map_err(|e| errors.push((Field::LoraAlpha, e)));
        let dropout = dropout.map_err(|e| errors.push((Field::LoraDropout, e)));
        let targets = arch
            .lora_targets(&self.training.lora_targets)
            .map_err(|e| errors.push((Field::LoraTargets, FieldError::Other(e.to_string()))));
        let (Ok(rank), Ok(dropout), Ok(targets)) = (rank, dropout, targets) else {
            return Err(errors);
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Some(Peft {
            method: self.training.method,
            rank,
            dropout,
            targets,
            adapter_fp32: self.training.lora_fp32,
            quant: self.training.quant,
            double_quant: self.training.double_quant,
            kbit_prepare: self.training.kbit_prepare,
            base_fp32: self.training.base_fp32,
        }))
    }

    /// The CPU RAM capacity in MiB (typed in GiB, rounded to the MiB).
    ///
    /// # Errors
    /// The message for the field.
    pub fn parsed_ram_mib(&self) -> Result<u64, FieldError> {
        crate::number::parse_rounded_amount(&self.hardware.ram_gib, MIB_PER_GIB, MAX_CAPACITY_MIB)
    }

    /// The parsed number of generated tokens (0 = no generation).
    ///
    /// # Errors
    /// The message for the field.
    pub fn parsed_new_tokens(&self) -> Result<u64, FieldError> {
        parse_count(&self.inference.new_tokens, MAX_NEW_TOKENS, "tokens", true)
    }

    /// vLLM's typed fields, parsed (what the page checks as typed, and serving reads).
    ///
    /// # Errors
    /// The fields that do not parse, with why.
    fn parsed_vllm_fields(&self) -> Result<VllmFields, Vec<(Field, FieldError)>> {
        let inf = &self.inference;
        let mut errors = Vec::new();
        let mut keep = |field: Field, e: FieldError| errors.push((field, e));
        let utilization = parse_utilization(&inf.gpu_memory_utilization)
            .map_err(|e| keep(Field::GpuMemoryUtilization, e));
        let len = parse_optional_count(&inf.max_model_len, MAX_SERVED_TOKENS)
            .map_err(|e| keep(Field::MaxModelLen, e));
        let seqs = parse_optional_count(&inf.max_num_seqs, MAX_NUM_SEQS)
            .map_err(|e| keep(Field::MaxNumSeqs, e));
        let batched = parse_optional_count(&inf.max_num_batched_tokens, MAX_SERVED_TOKENS)
            .map_err(|e| keep(Field::MaxNumBatchedTokens, e));
        match (utilization, len, seqs, batched) {
            (
                Ok(utilization_ppm),
                Ok(max_model_len),
                Ok(max_num_seqs),
                Ok(max_num_batched_tokens),
            ) => Ok(VllmFields {
                utilization_ppm,
                max_model_len,
                max_num_seqs,
                max_num_batched_tokens,
            }),
            _ => Err(errors),
        }
    }

    /// vLLM's settings and the device as its worker sees it, when serving is on (the
    /// tensor-parallel size is the plan's, set by [`Scenario::serve`](crate::Scenario::serve)).
    ///
    /// # Errors
    /// The vLLM fields that do not parse, and a missing or unusable device.
    pub fn vllm_inputs(&self) -> Result<Option<crate::ServeInputs>, Vec<(Field, String)>> {
        let inf = &self.inference;
        if !self.serves() {
            return Ok(None);
        }
        let fields = self.parsed_vllm_fields();
        let mut errors: Vec<(Field, String)> = fields.as_ref().err().map_or(Vec::new(), |e| {
            e.iter().map(|(f, e)| (*f, e.to_string())).collect()
        });
        let custom = parse_count(
            &self.hardware.custom_capacity_mib,
            MAX_CAPACITY_MIB,
            "MiB",
            false,
        )
        .ok();
        let device = match self.hardware.gpu {
            None => {
                errors.push((
                    Field::Gpu,
                    "Pick a GPU: vLLM sizes its KV cache from the device's memory.".to_owned(),
                ));
                None
            }
            Some(gpu) => match gpu.serve_device(custom) {
                Some(d) => Some(d),
                None => {
                    errors.push((
                        Field::Gpu,
                        "vLLM serves on CUDA and ROCm GPUs: pick one, or a custom GPU.".to_owned(),
                    ));
                    None
                }
            },
        };
        match (fields, device) {
            (Ok(v), Some(d)) if errors.is_empty() => Ok(Some((
                d,
                crate::VllmSettings {
                    utilization_ppm: v.utilization_ppm,
                    tensor_parallel: 1,
                    max_model_len: v.max_model_len,
                    max_num_seqs: v.max_num_seqs,
                    max_num_batched_tokens: v.max_num_batched_tokens,
                    weight_format: inf.weight_format,
                    kv_dtype: inf.kv_dtype,
                    enforce_eager: inf.enforce_eager,
                    flashinfer_sampler: inf.flashinfer_sampler,
                    expert_parallel: false,
                },
            ))),
            _ => Err(errors),
        }
    }

    /// Whether vLLM serves the model: serving on, and no optimizer (inference).
    #[must_use]
    pub fn serves(&self) -> bool {
        self.inference.serve && !self.step.optimizer.trains()
    }

    /// The model of the architecture mode: the preset's, or the pasted config's.
    ///
    /// # Errors
    /// Why the pasted config cannot be used.
    pub fn architecture(&self) -> Result<crate::Architecture, crate::ConfigError> {
        match self.model.preset {
            Some(preset) => preset.architecture(),
            None => crate::parse_hf_config(&self.model.config_json),
        }
    }

    /// The error of each planning field that does not parse, by field.
    #[must_use]
    pub fn plan_field_errors(&self) -> Vec<(Field, FieldError)> {
        self.plan_inputs().err().unwrap_or_default()
    }

    /// The planning inputs (GPU, overheads, GPUs, sharding, accumulation target).
    ///
    /// # Errors
    /// Every invalid planning field with its message.
    pub fn plan_inputs(&self) -> Result<PlanInputs, Vec<(Field, FieldError)>> {
        let mut errors = Vec::new();
        let mut check = |field: Field, result: Result<u64, FieldError>| match result {
            Ok(v) => Some(v),
            Err(e) => {
                errors.push((field, e));
                None
            }
        };
        let capacity_mib = match self.hardware.gpu {
            Some(Gpu::Custom) => check(
                Field::CustomCapacity,
                parse_count(
                    &self.hardware.custom_capacity_mib,
                    MAX_CAPACITY_MIB,
                    "MiB",
                    false,
                ),
            ),
            Some(Gpu::CpuRam) => check(Field::RamCapacity, self.parsed_ram_mib()),
            Some(gpu) => gpu.capacity_mib(),
            None => Some(0),
        };
        // one loop over the table, in its order (that of the errors), where each count was
        // parsed by code of its own
        let [context, reserve, margin, gpus, tp, cp, pp, microbatches, nccl, reduce_bucket, prefetch_bucket, gpus_per_node, global] =
            PLAN_COUNTS.map(|(field, max, what, zero_ok, optional)| {
                let text = self.text(field).map_or("", String::as_str);
                if optional && text.trim().is_empty() {
                    return Some(None);
                }
                check(field, parse_count(text, max, what, zero_ok)).map(Some)
            });
        let [context, margin, gpus, tp, cp, pp, nccl, reduce_bucket, prefetch_bucket, gpus_per_node] =
            [
                context,
                margin,
                gpus,
                tp,
                cp,
                pp,
                nccl,
                reduce_bucket,
                prefetch_bucket,
                gpus_per_node,
            ]
            .map(Option::flatten);
        // empty: one micro-batch per stage
        let microbatches = microbatches.and_then(|m| m.or(pp));
        let mut late = Vec::new();
        // the GPUs are the data-parallel groups times the tensor, context and pipeline
        // groups: the groups must divide them
        let groups = [tp, cp, pp]
            .into_iter()
            .try_fold(1u64, |acc, g| acc.checked_mul(g.unwrap_or(1)))
            .unwrap_or(u64::MAX);
        let gpus = gpus.and_then(|total| {
            if total % groups == 0 {
                Some(total / groups)
            } else {
                late.push((
                    Field::NumGpus,
                    FieldError::MustBeMultiple {
                        of: "tensor × context × pipeline parallel",
                        factor: groups,
                    },
                ));
                None
            }
        });
        let ep = match parse_count(&self.parallel.expert_parallel, MAX_GPUS, "GPUs", false) {
            Ok(ep) => match gpus {
                // (vLLM's expert parallelism spans the tensor-parallel group instead:
                // `Scenario::serve` checks it)
                Some(n) if ep > 1 && n % ep != 0 && !self.serves() => {
                    late.push((
                        Field::ExpertParallel,
                        FieldError::MustDivide {
                            what: "the data-parallel GPUs",
                            total: n,
                        },
                    ));
                    None
                }
                _ => Some(ep),
            },
            Err(e) => {
                late.push((Field::ExpertParallel, e));
                None
            }
        };
        if let (Reshard::To(r), Some(n)) = (self.parallel.reshard_after_forward, gpus) {
            let group = n.saturating_mul(cp.unwrap_or(1));
            if group % r != 0 {
                late.push((
                    Field::ReshardAfterForward,
                    FieldError::MustDivide {
                        what: "the data-parallel GPUs",
                        total: group,
                    },
                ));
            }
        }
        // torchao's `Float8LinearConfig` refuses the float8 all-gather without tensorwise
        // scaling
        if self.parallel.float8_all_gather
            && self.parallel.sharding == Sharding::Fsdp2
            && self.step.float8 != crate::Float8::Tensorwise
        {
            late.push((
                Field::Float8AllGather,
                FieldError::Other(
                    "torchao gathers float8 weights with tensorwise scaling only.".to_owned(),
                ),
            ));
        }
        // HYBRID_SHARD shards within a node and replicates across nodes: whole nodes
        if let (Sharding::Fsdp1, Fsdp1Sharding::Hybrid, Some(n), Some(node)) = (
            self.parallel.sharding,
            self.parallel.fsdp1_sharding,
            gpus,
            gpus_per_node,
        ) {
            if n > node && n % node != 0 {
                late.push((
                    Field::GpusPerNode,
                    FieldError::MustDivide {
                        what: "the data-parallel GPUs",
                        total: n,
                    },
                ));
            }
        }
        if self.parallel.offload != Offload::None
            && !matches!(
                self.parallel.sharding,
                Sharding::Fsdp2
                    | Sharding::Fsdp1
                    | Sharding::Zero1
                    | Sharding::Zero2
                    | Sharding::Zero3
            )
        {
            late.push((
                Field::Offload,
                FieldError::Other("Offload needs FSDP or DeepSpeed ZeRO.".to_owned()),
            ));
        }
        // FSDP1's `CPUOffload` has one switch, `offload_params`, which moves the optimizer
        // with them
        if self.parallel.offload == Offload::Optimizer && self.parallel.sharding == Sharding::Fsdp1
        {
            late.push((
                Field::Offload,
                FieldError::Other(
                    "FSDP1's CPUOffload moves the parameters with the optimizer: choose optimizer + parameters."
                        .to_owned(),
                ),
            ));
        }
        if self.parallel.offload == Offload::OptimizerAndParams
            && matches!(self.parallel.sharding, Sharding::Zero1 | Sharding::Zero2)
        {
            late.push((
                Field::Offload,
                FieldError::Other("DeepSpeed offloads parameters only under ZeRO-3.".to_owned()),
            ));
        }
        errors.extend(late);
        match (
            capacity_mib,
            context,
            reserve,
            margin,
            gpus,
            tp,
            ep,
            global,
            (cp, pp, microbatches),
            (nccl, reduce_bucket, prefetch_bucket, gpus_per_node),
        ) {
            (
                Some(cap),
                Some(context),
                Some(reserve),
                Some(margin),
                Some(gpus),
                Some(tp),
                Some(ep),
                Some(global),
                (Some(cp), Some(pp), Some(microbatches)),
                (Some(nccl), Some(reduce_bucket), Some(prefetch_bucket), Some(gpus_per_node)),
            ) if errors.is_empty() => Ok(PlanInputs {
                capacity_bytes: self.hardware.gpu.map(|_| cap * crate::BYTES_PER_MIB),
                overheads: crate::Overheads {
                    // Macs and CPUs have no CUDA context.
                    cuda_context_bytes: if self.hardware.gpu.is_none_or(Gpu::has_cuda_context) {
                        context * crate::BYTES_PER_MIB
                    } else {
                        0
                    },
                    allocator_reserve_ppm: reserve.map_or(crate::plan::DEFAULT_RESERVE_PPM, |p| {
                        p * crate::plan::PPM_PER_PERCENT
                    }),
                    safety_margin_percent: margin,
                    communication_bytes: 0,
                    outside_allocator_bytes: 0,
                },
                num_gpus: gpus,
                sharding: self.parallel.sharding,
                tensor_parallel: tp,
                expert_parallel: ep,
                sequence_parallel: self.parallel.sequence_parallel,
                loss_parallel: self.parallel.loss_parallel,
                tp_plan: self.parallel.tp_plan,
                context_parallel: cp,
                reshard_after_forward: self.parallel.reshard_after_forward,
                shard_embeddings: self.parallel.shard_embeddings,
                float8_all_gather: self.parallel.float8_all_gather
                    && self.step.float8 == crate::Float8::Tensorwise,
                fsdp1: crate::Fsdp1 {
                    sharding: self.parallel.fsdp1_sharding,
                    wrap: self.parallel.fsdp1_wrap,
                    use_orig_params: self.parallel.use_orig_params,
                    backward_prefetch: self.parallel.backward_prefetch,
                    gpus_per_node,
                },
                pipeline_parallel: pp,
                pipeline_schedule: self.parallel.pipeline_schedule,
                microbatches,
                offload: self.parallel.offload,
                // NCCL runs on CUDA (and ROCm) GPUs only
                nccl_bytes_per_communicator: if self.hardware.gpu.is_none_or(Gpu::has_cuda_context)
                {
                    nccl * crate::BYTES_PER_MIB
                } else {
                    0
                },
                reduce_bucket_elements: reduce_bucket,
                prefetch_bucket_elements: prefetch_bucket,
                global_batch: global,
                allocator: self.hardware.allocator,
                // only CUDA's caching allocator is replayed
                replay_reserve: reserve.is_none()
                    && self.hardware.gpu.is_none_or(Gpu::has_cuda_context),
            }
            .with_communication()),
            _ => Err(errors),
        }
    }

    /// The typed fields whose text does not parse, with why.
    #[must_use]
    pub fn invalid_text_fields(&self) -> Vec<(Field, FieldError)> {
        let mut invalid = Vec::new();
        let (rank, alpha, dropout) = self.lora_numbers();
        // one loop, where a push per field was compiled once per field
        for (field, result) in [
            (
                Field::Params,
                parse_params(&self.simple.params, self.simple.params_unit).map(drop),
            ),
            (Field::Batch, parse_batch(&self.step.batch).map(drop)),
            (
                Field::ActivationMb,
                parse_activation_mb(&self.simple.activation_mb).map(drop),
            ),
            (Field::SeqLen, self.parsed_seq_len().map(drop)),
            (Field::NewTokens, self.parsed_new_tokens().map(drop)),
            (Field::LoraRank, rank.map(drop)),
            (Field::LoraAlpha, alpha),
            (Field::LoraDropout, dropout.map(drop)),
        ] {
            if let Err(e) = result {
                invalid.push((field, e));
            }
        }
        if let Err(errors) = self.parsed_objective() {
            invalid.extend(errors);
        }
        if let Err(errors) = self.parsed_vllm_fields() {
            invalid.extend(errors);
        }
        invalid.extend(self.plan_field_errors());
        // The custom capacity is checked even while another GPU is chosen: it travels in
        // links all the same.
        if self.hardware.gpu != Some(Gpu::Custom) {
            if let Err(e) = parse_count(
                &self.hardware.custom_capacity_mib,
                MAX_CAPACITY_MIB,
                "MiB",
                false,
            ) {
                invalid.push((Field::CustomCapacity, e));
            }
        }
        if self.hardware.gpu != Some(Gpu::CpuRam) {
            if let Err(e) = self.parsed_ram_mib() {
                invalid.push((Field::RamCapacity, e));
            }
        }
        invalid
    }

    /// Puts the default text back into `field`.
    pub fn reset(&mut self, field: Field) {
        let defaults = PageState::default();
        if let Some(value) = defaults.get(field) {
            // The default of every field is valid, so this cannot fail.
            let _ = self.set(field, &value);
        }
    }

    /// The simple mode's inputs, or the error of each field that does not parse.
    ///
    /// # Errors
    /// Every invalid field with its message.
    pub fn simple_inputs(&self) -> Result<SimpleInputs, Vec<(Field, FieldError)>> {
        match (
            parse_params(&self.simple.params, self.simple.params_unit),
            parse_batch(&self.step.batch),
            parse_activation_mb(&self.simple.activation_mb),
        ) {
            (Ok(params), Ok(batch), Ok(activation_bytes_per_sample)) => Ok(SimpleInputs {
                params,
                precision: self.simple.precision,
                optimizer: self.step.optimizer,
                batch,
                activation_bytes_per_sample,
            }),
            (params, batch, activation) => Err([
                (Field::Params, params.err()),
                (Field::Batch, batch.err()),
                (Field::ActivationMb, activation.err()),
            ]
            .into_iter()
            .filter_map(|(field, error)| error.map(|e| (field, e)))
            .collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field but the mode and the unit belongs to exactly one section, and every URL
    /// key names one field.
    #[test]
    fn sections_own_every_field_once() {
        let tables = SECTION_KEYS;
        for field in Field::ALL {
            let owners = tables
                .iter()
                .filter(|t| t.iter().any(|(f, _)| *f == field))
                .count();
            let top = matches!(field, Field::Mode | Field::ByteUnit | Field::SweepAxis);
            assert_eq!(owners, usize::from(!top), "{field:?}");
            assert_eq!(Field::from_key(field.key()), Some(field), "{field:?}");
        }
        let listed: usize = tables.iter().map(|t| t.len()).sum();
        assert_eq!(listed + 3, Field::ALL.len());
    }

    /// Every field is typed text or a choice with its keys (but the model and the resharding,
    /// which read theirs their own way), so that `set` writes every one.
    #[test]
    fn every_field_is_text_or_a_choice() {
        let state = PageState::default();
        for field in Field::ALL {
            let choice = !field.choice_keys().is_empty()
                || matches!(field, Field::Model | Field::ReshardAfterForward);
            assert!(state.text(field).is_some() != choice, "{field:?}");
        }
    }

    /// Every key of every choice field sets that choice, which reads back as that key.
    #[test]
    fn every_choice_reads_back_its_key() {
        for field in Field::ALL {
            for key in field.choice_keys() {
                let mut state = PageState::default();
                state.set(field, key).unwrap();
                assert_eq!(state.choice_key(field), Some(*key), "{field:?}");
            }
        }
    }

    /// A clone carries every field: each typed one, and the others as they are.
    #[test]
    fn clones_carry_every_field() {
        let mut state = PageState::default();
        for (i, field) in Field::ALL.into_iter().enumerate() {
            if let Some(text) = state.text_mut(field) {
                *text = format!("text {i}");
            }
        }
        state.set(Field::Model, CUSTOM_MODEL_KEY).unwrap();
        state.set(Field::Gpu, "none").unwrap();
        state.set(Field::Packing, "on").unwrap();
        assert_eq!(state.clone(), state);
        assert_eq!(PageState::default().clone(), PageState::default());
    }

    /// Each section reads back what it wrote, field by field, at the defaults.
    #[test]
    fn every_field_round_trips_through_its_section() {
        let defaults = PageState::default();
        for field in Field::ALL {
            let mut state = PageState::default();
            if let Some(text) = defaults.get(field) {
                state.set(field, &text).unwrap();
                assert_eq!(state, defaults, "{field:?}");
            }
        }
    }
}
