//! Domain logic of the training-memory estimator.
//!
//! Everything the page shows is computed here: validated inputs, the memory model of one
//! training step, batch-size sweeps and searches, table export and the query-string form
//! of the inputs. No web dependencies, so it is tested natively and shared with the CLI.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod advisor;
mod allocator;
mod bytes;
mod evaluate;
mod fasthash;
mod formats;
mod hub;
mod json;
mod number;
mod optimizer;
mod plan;
mod query;
mod rank;
mod scenario;
mod serve;
mod simple;
mod state;
mod sweep;
mod trainer;

pub use advisor::{fit_advice, Change, FitPlan, RankKey, Tier, MAX_GPU_MULTIPLIER, PLANS_PER_TIER};
pub use allocator::{AllocatorMode, BlockId, CachingAllocator};
pub use bytes::{format_bytes, format_in_unit, group_thousands, ByteUnit};
pub use evaluate::{
    evaluate, Evaluation, EvaluationError, LongestSequence, PartKind, PhasePeaks, StepMemory,
    SEQ_STEP,
};
pub use formats::{Block, GgufType, KvDtype, WeightFormat};
pub use hub::{
    read_config_body, wants_preprocessor, with_preprocessor, ConfigBody, HubError, HubId,
    HUB_ORIGIN, HUB_TIMEOUT_SECS, MAX_HUB_NAME_CHARS, MAX_HUB_REVISION_CHARS, PREPROCESSOR_FILE,
};
pub use number::FieldError;
pub use optimizer::{Optimizer, OptimizerImpl};
pub use plan::{
    apple_gpu_share_mib, fit_verdict, largest_peak_that_fits, max_batch_that_fits,
    plan_accumulation, shard_model_state, AccumulationPlan, BackwardPrefetch, DeviceKind,
    FitVerdict, Float8, Fsdp1, Fsdp1Sharding, Fsdp1Wrap, Gpu, MaxBatch, Offload, Overheads,
    Reshard, ShardedState, Sharding, BYTES_PER_MIB, NCCL_MIB_PER_COMMUNICATOR,
};
pub use query::{decode_query, encode_query, percent_decode, percent_encode, Decoded};
pub use scenario::{parse_page, Page, Scenario};
pub use serve::{
    serve_advice, serve_vllm, vllm_gib, Concurrency, ServeChange, ServeDevice, ServeInputs,
    ServeRow, Serving, VllmSettings, DEFAULT_UTILIZATION_PPM,
};
pub use simple::{
    parse_activation_mb, parse_batch, parse_params, simple_breakdown, simple_breakdown_at_batch,
    Breakdown, ParamUnit, Precision, SimpleInputs, TooLarge, BYTES_PER_MB, MAX_BATCH, MAX_PARAMS,
    SIMPLE_OPTIMIZERS,
};
#[cfg(feature = "vision")]
pub use state::{parse_image_size, VisionSettings, DEFAULT_IMAGES, DEFAULT_IMAGE_SIZE};
pub use state::{
    Field, HardwareSettings, InferenceSettings, MethodSettings, Mode, ModelChoice, PageState,
    ParallelSettings, PlanInputs, Section, SimpleModel, StepSettings, CUSTOM_MODEL_KEY,
    MAX_CONFIG_CHARS,
};
pub use sweep::{
    sweep, sweep_batches, sweep_cells, sweep_header, sweep_markdown, sweep_tsv, SweepAxis, SweepRow,
};
pub use trainer::{Trainer, TrainerDefaults};

// arch-begin (architecture mode: owned by core/src/arch/)
mod arch;

pub use arch::{
    estimate_objective, estimate_peak, estimate_peak_with, estimate_rank, estimate_rank_replayed,
    parse_hf_config, AllocatorPeaks, Architecture, AttentionKernel, BackwardMoment, CategoryBytes,
    Checkpointing, ChunksInFlight, Compile, ConfigError, EstimateError, Generator, Kernels,
    LoraTargets, LossKind, Mesh, Method, ModelFamily, Objective, ObjectiveKind, ObjectivePhases,
    ParameterUnits, PeakEstimate, Peft, Phase, PipelineSchedule, PrecisionRecipe, Preset, Quant4,
    Reference, ReplayDevice, SavedPart, ShardedEngine, ShardedStreams, Stage, StepPhase,
    TargetsError, TpPlan, TrainingStep, UnslothRelease,
};
#[cfg(feature = "vision")]
pub use arch::{
    estimate_vlm, image_tokens, ImageLayout, ImageTokens, VisionInputs, VlmKind, MAX_IMAGES,
    MAX_IMAGE_SIDE,
};
// arch-end
