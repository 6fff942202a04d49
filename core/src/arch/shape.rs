//! What one step looks like to the op kinds: its batch, sequence, dtypes, attention path,
//! loss and adapters. Below the model and the losses, which both read it.

use super::ops::Dtypes;
use super::peft::TapePeft;
use super::recipe::{Compile, LossKind};

/// What the attention of one step sees.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepShape {
    pub batch: u64,
    pub seq: u64,
    pub eager: bool,
    /// transformers' `flash_attention_2`: the flash kernel whatever the mask (varlen for
    /// packed or padded rows, its own sliding window), plus its RNG state.
    pub flash2: bool,
    /// Every layer gets a 4-D mask: padded rows, or packed documents (a block-causal mask
    /// built from the restarting position ids) under SDPA or eager.
    pub mask: bool,
    /// The trainer's loss (causal language models).
    pub loss: LossKind,
    /// Bytes per element of the head weight's gradient (0 when it is frozen).
    pub head_grad_bytes: u64,
    /// Bytes per element of the head weight.
    pub head_weight_bytes: u64,
    pub d: Dtypes,
    /// LoRA / QLoRA on a frozen base.
    pub peft: Option<TapePeft>,
    /// Sequence parallelism: the residual stream (norms, dropout, residual adds, the layers'
    /// inputs) holds one of this many slices of the tokens; 1 without it.
    pub seq_shards: u64,
    /// Width of the logits the loss reads: the whole vocabulary, unless loss parallelism
    /// leaves each tensor-parallel rank its slice.
    pub loss_vocab: u64,
    /// Loss parallelism (PyTorch's `loss_parallel`): the cross-entropy runs on each rank's
    /// slice of the vocabulary.
    pub loss_parallel: bool,
    /// Megatron-LM's vocabulary-parallel cross-entropy: softmax and gradient in place of
    /// the fp32 logits slice.
    pub in_place_loss: bool,
    /// `torch.compile`: the blocks (and the loss) run as the partitioner's graphs.
    pub compile: Compile,
    /// The layers run under activation checkpointing (any policy): what they save in the
    /// forward is not what backward reads.
    pub checkpointed: bool,
    /// Tokens per row the loss scores (labels not -100), when not all of them: DPO's and
    /// GRPO's completions, their prompts masked out.
    pub scored_per_row: Option<u64>,
    /// Unsloth's kernels run the model: no rotary tables made per forward (its layers read
    /// slices of their caches), and its RMSNorm for the final norm, which keeps its input
    /// and `r`.
    pub unsloth: bool,
}

impl StepShape {
    /// Tokens of the residual stream on this rank (a slice under sequence parallelism).
    pub fn stream_tokens(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.seq_shards.max(1))
    }
}
