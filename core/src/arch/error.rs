//! Why a config cannot be read or a step cannot be estimated: below every other module of
//! `arch`, so that the readers, the op kinds and the estimate all use them without importing
//! one another.

use super::family::ModelFamily;
use std::fmt;

/// Why a config could not be turned into an [`Architecture`](super::Architecture).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The text is not JSON, or not a JSON object.
    InvalidJson(String),
    /// `model_type` names a family this estimator does not model.
    UnsupportedModelType(String),
    /// A required field is absent.
    MissingField(String),
    /// A field is present but unusable.
    InvalidField {
        /// The field's name.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::InvalidJson(e) => write!(f, "config is not a JSON object: {e}"),
            ConfigError::UnsupportedModelType(t) => write!(
                f,
                "model_type \"{t}\" is not supported (supported: {})",
                ModelFamily::supported_model_types()
            ),
            ConfigError::MissingField(name) => write!(f, "config field \"{name}\" is missing"),
            ConfigError::InvalidField { field, reason } => {
                write!(f, "config field \"{field}\" is invalid: {reason}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a step cannot be estimated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EstimateError {
    /// Batch size 0.
    ZeroBatch,
    /// Sequence length (or image side) 0.
    ZeroSeqLen,
    /// The model has learned position embeddings and cannot take longer sequences.
    SeqLenTooLong {
        /// The longest sequence the model accepts.
        max: u64,
    },
    /// A ViT takes images of exactly its configured side (its position embeddings are learned).
    ImageSizeMismatch {
        /// The configured image side in pixels.
        expected: u64,
    },
    /// flash-attn 2 runs only in 16 bits (fp32 weights need autocast) and for head sizes up
    /// to 256.
    Flash2Unsupported,
    /// A byte count does not fit in 64 bits.
    TooLarge,
    /// Tensor, context and pipeline parallelism split heads, positions and layers evenly
    /// (a pipeline: at least one layer per stage) or not at all.
    Unsplittable {
        /// What is split ("attention heads").
        what: &'static str,
        /// How many the model has.
        count: u64,
        /// The group it is split over.
        group: u64,
        /// What the group's members are ("tensor-parallel GPUs", "pipeline stages").
        over: &'static str,
    },
    /// A way of splitting the step that is not modelled for this model or setting.
    MeshUnsupported(&'static str),
    /// DPO or GRPO settings that do not go together (or a model they do not train).
    ObjectiveUnsupported(&'static str),
    /// Step settings that do not go together (a trainer refuses them).
    StepUnsupported(&'static str),
    /// Images for a text-only model, or images a processor cannot take.
    #[cfg(feature = "vision")]
    ImagesInvalid(&'static str),
}

impl fmt::Display for EstimateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EstimateError::ZeroBatch => write!(f, "batch size must be at least 1"),
            EstimateError::ZeroSeqLen => write!(
                f,
                "sequence length (image side for vision models) must be at least 1"
            ),
            EstimateError::SeqLenTooLong { max } => {
                write!(
                    f,
                    "this model has learned position embeddings for at most {max} tokens"
                )
            }
            EstimateError::ImageSizeMismatch { expected } => {
                write!(f, "this ViT takes {expected} x {expected} images only (learned position embeddings)")
            }
            EstimateError::Flash2Unsupported => write!(
                f,
                "flash_attention_2 runs in fp16/bf16 only (pick an AMP or 16-bit recipe) and for head sizes up to 256"
            ),
            EstimateError::TooLarge => write!(f, "the memory figure does not fit in 64 bits"),
            EstimateError::Unsplittable {
                what,
                count,
                group,
                over,
            } => write!(
                f,
                "the model's {count} {what} do not split evenly over {group} {over}"
            ),
            EstimateError::MeshUnsupported(why)
            | EstimateError::ObjectiveUnsupported(why)
            | EstimateError::StepUnsupported(why) => write!(f, "{why}"),
            #[cfg(feature = "vision")]
            EstimateError::ImagesInvalid(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for EstimateError {}
