//! Architecture mode: the peak memory of one training step, derived tensor by tensor from a
//! model's architecture.
//!
//! # A model is data
//! A family reader (`families.rs`) turns a `config.json` into a `ModelSpec` (`model.rs`): the
//! embeddings, a list of layers, the final norm, the head and its loss. A layer is built from
//! a small set of op kinds (`ops.rs`, `model.rs`): linear, LayerNorm / RMSNorm in three styles
//! (pre, post or both around a sub-block), q/k norms, rotary embedding (full, partial, none),
//! attention (its kernel chosen as PyTorch's CUDA dispatch does), activations, dropout,
//! soft-capping, attention sinks, latent attention, mixtures of experts, residual adds. Each op
//! kind owns its rules: the parameters it holds and what autograd saves for backward in each
//! precision recipe. What varies per layer is per layer (sliding or full attention, rotary or
//! not, dense MLP or experts).
//!
//! # Modules, bottom up
//! `arith` (overflow-checked byte arithmetic, the allocator's 512-byte rounding) and `error`
//! (why a config or a step fails) import nothing above them; then `family` (the `model_type`s),
//! `peft` (adapters' rules), `ops` (the op kinds), `recipe` (the step's choices), `shape` (one
//! step as the op kinds see it), `loss` (the trainers' heads and losses), `model` (a model as
//! data and its forward tape), `mesh` (one tensor-parallel rank's share of a model), `vision`
//! (a vision-language model's vision side as data, its processors' token arithmetic), `config`
//! (a validated `Architecture`), `hybrid` (Qwen3-Next's Gated DeltaNet layers, for serving),
//! `families` (the readers and `parse_hf_config`, the dispatch
//! above them), `presets`, `estimate` (the step's moments) and `vlm` (vision-language models,
//! on top of `estimate`). No module imports one above it, so a new input of the op kinds (a
//! device mesh) is one more field of `shape`.
//!
//! # How the estimate works
//! The forward is emulated on a tape: each op creates tensors and marks the ones its backward
//! keeps; a tensor kept by several ops (a norm's output read by three projections) counts
//! once, a view (a slice of a fused projection) is its base's storage. Every storage is
//! rounded up to 512 bytes (the CUDA caching allocator's block). Each distinct layer runs once.
//! Persistent state is counted per parameter tensor: weights, gradients, optimizer state
//! (AdamW: two moments plus a 512-byte step counter per tensor; SGD with momentum: one
//! buffer) and, for the mixed recipes, an fp32 master copy; under autocast the cast cache
//! keeps a 16-bit copy of every matmul weight.
//!
//! The peak is the largest of: the forward's end (saved activations plus the loss's logits),
//! the start of backward (saved activations plus the loss's gradient buffers, or one
//! recomputed layer under checkpointing), the end of backward (all gradients, the embedding's
//! gradient being made: three embedding-sized buffers for a tied weight), and the optimizer
//! step (weights, gradients, state and foreach AdamW's parameter-sized temporary); with eager
//! attention also inside the last and the first layers' attention backward (score-sized
//! gradients, with nearly every parameter gradient in the first). Inference
//! (`Optimizer::None`) is weights plus the largest live forward tensors at one of three
//! moments: inside the last layer's eager attention, inside its MLP, or at the head (with
//! autocast's copies of the weights cast so far; `validation/peak_live.py` lists them).
//!
//! # Parameter-efficient fine-tuning
//! LoRA and QLoRA (`peft.rs`) run on the same tape: the base is frozen, so a linear keeps no
//! input and a norm no normalised output; each adapted linear keeps its input in the
//! adapters' dtype and its rank-r output; the first layer keeps nothing before its first
//! adapter unless checkpointing enabled input gradients; a 4-bit base keeps nothing and its
//! output takes its input's dtype. Only the adapters have gradients and optimizer state
//! (AdamW, 8-bit AdamW with its per-block scales, paged or not, Adafactor).
//!
//! Every rule was read off PyTorch's and transformers' behaviour and checked against the
//! harness in `validation/` (per-tensor dumps and measured rows in `tests/fixtures/`).
//!
//! Vision convention: for ViT, `TrainingStep::seq_len` holds the image side in pixels (224);
//! tokens are `(side / patch)^2 + 1` (the class token).
//!
//! # Vision-language models
//! `families/vision.rs` reads the vision side of `qwen2_5_vl`, `qwen3_vl`, `gemma3`, `llava` /
//! `llava_next`, `idefics3` / `smolvlm` and `mllama` configs beside their language model (a
//! text family, read as above) into `vision.rs`'s data: the tower's and projector's parameters,
//! each processor's token arithmetic (a pure function of the image's pixels); `vlm.rs`'s
//! `estimate_vlm` runs the language model on the text tape over text + image + markup tokens
//! and adds the tower and the projector as `validation/VLM.md` lists them (a frozen tower saves
//! nothing; its backward runs after the language model's layers and before the token
//! embedding's). There `TrainingStep::seq_len` is the text tokens per sample; the images come
//! in a `VisionInputs` beside the step.
//!
//! All of it is behind the `vision` feature (on by default; the page's bundle leaves it off):
//! without it `vision.rs`, `vlm.rs` and `families/vision.rs` are not compiled and a `gemma3`
//! config is read through its `text_config` alone, with a note saying so.

mod arith;
mod config;
mod error;
mod estimate;
mod families;
mod family;
mod hybrid;
mod loss;
mod mesh;
mod model;
mod objective;
mod ops;
mod peft;
mod presets;
mod recipe;
mod replay;
pub(crate) mod served;
mod shape;
mod streams;
mod unsloth;
#[cfg(feature = "vision")]
mod vision;
#[cfg(feature = "vision")]
mod vlm;

pub(crate) use config::partition_touching;
pub use config::{Architecture, ParameterUnits};
pub use error::{ConfigError, EstimateError};
pub(crate) use estimate::UNSLOTH_SCOPE;
pub use estimate::{
    estimate_peak, estimate_peak_with, estimate_rank, estimate_rank_replayed, BackwardMoment,
    CategoryBytes, ObjectivePhases, PeakEstimate, Phase, StepPhase, TrainingStep,
};
pub use families::parse_hf_config;
pub use family::ModelFamily;
pub use mesh::{ChunksInFlight, Mesh, PipelineSchedule, Stage, TpPlan};
pub(crate) use objective::vllm_reservation_bytes;
pub use objective::{estimate_objective, Generator, Objective, ObjectiveKind, Reference};
pub use ops::SavedPart;
pub use peft::{LoraTargets, Method, Peft, Quant4, TargetsError};
pub use presets::Preset;
pub use recipe::{
    AttentionKernel, Checkpointing, Compile, Kernels, LossKind, PrecisionRecipe, UnslothRelease,
};
pub(crate) use replay::STEADY_PASSES;
pub use replay::{AllocatorPeaks, ReplayDevice};
pub use streams::{ShardedEngine, ShardedStreams};
pub(crate) use streams::{DEEPSPEED_MAX_REUSE_ELEMENTS, DEEPSPEED_SUB_GROUP_ELEMENTS};
#[cfg(feature = "vision")]
pub use vision::{ImageLayout, VisionInputs, VlmKind, MAX_IMAGES, MAX_IMAGE_SIDE};
#[cfg(feature = "vision")]
pub use vlm::{estimate_vlm, image_tokens, ImageTokens};
