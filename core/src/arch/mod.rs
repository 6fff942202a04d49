//! Architecture mode: the peak memory of one training step, derived tensor by tensor from a
//! transformer's architecture.
//!
//! # How the model works
//! Every tensor is one storage rounded up to 512 bytes (the CUDA caching allocator's block).
//! Persistent state is counted per parameter tensor: weights, gradients (dtype of the weights),
//! optimizer state (AdamW: two moments plus a 512-byte step counter per tensor; SGD with
//! momentum: one buffer) and, for the mixed recipes, an fp32 master copy.
//!
//! Activations follow what autograd saves in the Hugging Face / torchvision forward of each
//! family, in the dtype each op produces: norm inputs and statistics, every matmul input
//! (under autocast, each linear keeps its own 16-bit cast of its input and autocast keeps a
//! 16-bit copy of every weight), q/k/v, the attention output and log-sum-exp of the fused
//! kernel (eager attention adds the seq x seq probabilities, their dropout mask and the
//! dropped probabilities), MLP intermediates, 1-byte dropout masks, and the fp32
//! `log_softmax` of the logits that the loss keeps.
//!
//! The attention kernel follows PyTorch's CUDA dispatch (sm80+): flash for 16-bit inputs
//! without a mask (GQA allowed; keeps output + fp32 logsumexp), memory-efficient otherwise
//! (logsumexp padded to 32), and the math fallback (seq x seq softmax kept, k/v repeated) for
//! fp32 with grouped-query attention, which the memory-efficient kernel cannot do. HF passes a
//! mask only when a sliding window is shorter than the sequence.
//!
//! The peak is the largest of: the forward's end (saved activations plus the loss's logits),
//! the start of backward (saved activations plus the loss's gradient buffers, or one
//! recomputed layer under checkpointing), the end of backward (all gradients), and the
//! optimizer step (weights, gradients, state and foreach AdamW's parameter-sized temporary).
//! Under checkpointing only layer inputs are saved, but with autocast the forward's weight-cast
//! cache still holds every layer's 16-bit weight copies until the forward ends.
//! Inference (`Optimizer::None`) is weights plus the largest live forward tensors.
//!
//! Vision convention: for ViT, `TrainingStep::seq_len` holds the image side in pixels (224);
//! tokens are `(side / patch)^2 + 1` (the class token).

mod config;
mod estimate;
mod families;
mod model;
mod ops;
mod presets;
mod recipe;

pub use config::{parse_hf_config, Architecture, ConfigError, ModelFamily};
pub use estimate::{
    estimate_peak, CategoryBytes, EstimateError, PeakEstimate, Phase, TrainingStep,
};
pub use ops::SavedPart;
pub use presets::Preset;
pub use recipe::{AttentionKernel, Checkpointing, PrecisionRecipe};
