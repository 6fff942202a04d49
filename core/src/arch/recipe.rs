//! The knobs of one training step: precision recipe, attention kernel, checkpointing.

/// How weights, gradients, optimizer state and activations are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrecisionRecipe {
    /// Everything in fp32.
    Fp32,
    /// fp32 weights, gradients and state; forward and backward under `torch.autocast(bfloat16)`.
    AmpBf16,
    /// Like [`AmpBf16`](Self::AmpBf16) with fp16 autocast (same bytes).
    AmpFp16,
    /// The whole model in bf16: weights, gradients, optimizer state, activations.
    Bf16,
    /// DeepSpeed/Megatron style: bf16 weights and gradients, fp32 master weights and moments.
    MixedBf16,
    /// Like [`MixedBf16`](Self::MixedBf16) with fp16 weights and gradients.
    MixedFp16,
}

impl PrecisionRecipe {
    /// Every recipe, in the order the page lists them.
    pub const ALL: [PrecisionRecipe; 6] = [
        PrecisionRecipe::Fp32,
        PrecisionRecipe::AmpBf16,
        PrecisionRecipe::AmpFp16,
        PrecisionRecipe::Bf16,
        PrecisionRecipe::MixedBf16,
        PrecisionRecipe::MixedFp16,
    ];

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            PrecisionRecipe::Fp32 => "fp32",
            PrecisionRecipe::AmpBf16 => "amp-bf16",
            PrecisionRecipe::AmpFp16 => "amp-fp16",
            PrecisionRecipe::Bf16 => "bf16",
            PrecisionRecipe::MixedBf16 => "mixed-bf16",
            PrecisionRecipe::MixedFp16 => "mixed-fp16",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            PrecisionRecipe::Fp32 => "fp32",
            PrecisionRecipe::AmpBf16 => "AMP bf16 (fp32 weights, bf16 autocast)",
            PrecisionRecipe::AmpFp16 => "AMP fp16 (fp32 weights, fp16 autocast)",
            PrecisionRecipe::Bf16 => "Pure bf16",
            PrecisionRecipe::MixedBf16 => "Mixed bf16 (bf16 weights + fp32 master)",
            PrecisionRecipe::MixedFp16 => "Mixed fp16 (fp16 weights + fp32 master)",
        }
    }

    /// The recipe whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.key() == key)
    }

    /// Bytes per stored weight element.
    #[must_use]
    pub const fn weight_bytes(self) -> u64 {
        match self {
            PrecisionRecipe::Fp32 | PrecisionRecipe::AmpBf16 | PrecisionRecipe::AmpFp16 => 4,
            _ => 2,
        }
    }

    /// Bytes per gradient element (gradients take the dtype of the weights).
    #[must_use]
    pub const fn gradient_bytes(self) -> u64 {
        self.weight_bytes()
    }

    /// Bytes per optimizer-state element (moments, momentum).
    #[must_use]
    pub const fn optimizer_state_bytes(self) -> u64 {
        match self {
            PrecisionRecipe::Bf16 => 2,
            _ => 4,
        }
    }

    /// Whether an fp32 master copy of the weights is kept next to 16-bit weights.
    #[must_use]
    pub const fn master_weights(self) -> bool {
        matches!(
            self,
            PrecisionRecipe::MixedBf16 | PrecisionRecipe::MixedFp16
        )
    }

    /// Whether the forward runs under autocast (fp32 weights cast to 16 bits per matmul).
    #[must_use]
    pub const fn autocast(self) -> bool {
        matches!(self, PrecisionRecipe::AmpBf16 | PrecisionRecipe::AmpFp16)
    }

    /// Bytes per element of the tensors matmuls produce (the activation dtype).
    #[must_use]
    pub const fn activation_bytes(self) -> u64 {
        match self {
            PrecisionRecipe::Fp32 => 4,
            _ => 2,
        }
    }

    /// Bytes per element of the residual stream (fp32 under autocast: norms run in fp32).
    #[must_use]
    pub const fn residual_bytes(self) -> u64 {
        if self.autocast() {
            4
        } else {
            self.activation_bytes()
        }
    }
}

/// Which attention implementation the model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKernel {
    /// `scaled_dot_product_attention` with a fused kernel: no seq x seq matrix is kept.
    Sdpa,
    /// Explicit `softmax(QK^T)V`: keeps seq x seq probabilities (and dropout masks).
    Eager,
    /// transformers' `flash_attention_2` (flash-attn 2 or the kernels-hub build): saves q, k,
    /// v, its output, the log-sum-exp and its RNG state; packed or padded rows go through
    /// the varlen kernel with no mask.
    Flash2,
}

impl AttentionKernel {
    /// Both kernels.
    pub const ALL: [AttentionKernel; 3] = [
        AttentionKernel::Sdpa,
        AttentionKernel::Eager,
        AttentionKernel::Flash2,
    ];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            AttentionKernel::Sdpa => "sdpa",
            AttentionKernel::Eager => "eager",
            AttentionKernel::Flash2 => "flash2",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            AttentionKernel::Sdpa => "SDPA (fused, flash / memory-efficient)",
            AttentionKernel::Eager => "Eager (explicit softmax)",
            AttentionKernel::Flash2 => "flash_attention_2 (varlen, no mask)",
        }
    }

    /// The kernel whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.key() == key)
    }
}

/// Activation (gradient) checkpointing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Checkpointing {
    /// Every activation autograd needs is kept.
    None,
    /// Every transformer layer is checkpointed: only layer inputs are kept, one layer is
    /// recomputed at a time in backward.
    Full,
    /// Like [`Full`](Self::Full), the layer inputs offloaded to pinned CPU memory during the
    /// forward (transformers' `activation_checkpointing_enable(offload=True)`) and copied
    /// back one layer at a time in backward.
    Offload,
    /// Layer-level selective checkpointing of every Nth layer (2 to 8), as torchtitan's
    /// `selective` mode with `selective_ac_option = N` (v0.2.2) and torchtune's `ac_mode:
    /// selective` choose them: the blocks counted from 1 whose count N divides, so 0-based
    /// layers N-1, 2N-1, ...; the others keep everything.
    EveryNth(u8),
    /// torchtitan's per-op selective policy (v0.2.2, `_op_sac_save_list`): every layer is
    /// checkpointed, but the outputs of SDPA (with its log-sum-exp) and of every other `mm`
    /// (the first, third, ... bias-free linear of the layer) are saved, not recomputed.
    Ops,
}

/// Keys of [`Checkpointing::EveryNth`] from 2 to 8.
const EVERY_NTH_KEYS: [&str; 7] = [
    "every:2", "every:3", "every:4", "every:5", "every:6", "every:7", "every:8",
];
/// Labels of [`Checkpointing::EveryNth`] from 2 to 8.
const EVERY_NTH_LABELS: [&str; 7] = [
    "Every 2nd layer (selective, torchtitan / torchtune)",
    "Every 3rd layer (selective)",
    "Every 4th layer (selective)",
    "Every 5th layer (selective)",
    "Every 6th layer (selective)",
    "Every 7th layer (selective)",
    "Every 8th layer (selective)",
];

impl Checkpointing {
    /// Every setting, in the order the page lists them.
    pub const ALL: [Checkpointing; 11] = [
        Checkpointing::None,
        Checkpointing::Full,
        Checkpointing::Offload,
        Checkpointing::EveryNth(2),
        Checkpointing::EveryNth(3),
        Checkpointing::EveryNth(4),
        Checkpointing::EveryNth(5),
        Checkpointing::EveryNth(6),
        Checkpointing::EveryNth(7),
        Checkpointing::EveryNth(8),
        Checkpointing::Ops,
    ];

    /// The settings the advisor tries, least memory-saving first.
    pub const ADVISED: [Checkpointing; 3] = [
        Checkpointing::None,
        Checkpointing::Full,
        Checkpointing::Offload,
    ];

    /// Index of `EveryNth(n)` in the key tables (N outside 2..=8 reads as 8).
    const fn nth_index(n: u8) -> usize {
        if n < 2 {
            0
        } else if n > 8 {
            6
        } else {
            n as usize - 2
        }
    }

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Checkpointing::None => "none",
            Checkpointing::Full => "full",
            Checkpointing::Offload => "offload",
            Checkpointing::EveryNth(n) => EVERY_NTH_KEYS[Self::nth_index(n)],
            Checkpointing::Ops => "ops",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Checkpointing::None => "No checkpointing",
            Checkpointing::Full => "Full (every layer)",
            Checkpointing::Offload => "Full, inputs offloaded to CPU",
            Checkpointing::EveryNth(n) => EVERY_NTH_LABELS[Self::nth_index(n)],
            Checkpointing::Ops => "Per op (torchtitan: SDPA and every other matmul saved)",
        }
    }

    /// Whether layers are recomputed in backward.
    #[must_use]
    pub const fn recomputes(self) -> bool {
        !matches!(self, Checkpointing::None)
    }

    /// Whether the 0-based layer `index` is checkpointed.
    #[must_use]
    pub const fn checkpoints_layer(self, index: usize) -> bool {
        match self {
            Checkpointing::None => false,
            Checkpointing::EveryNth(n) => (index + 1).is_multiple_of(Self::nth_index(n) + 2),
            _ => true,
        }
    }

    /// The setting whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.key() == key)
    }
}

/// The kernels a decoder layer runs under LoRA: PyTorch's ops as transformers and peft
/// call them, or Unsloth's (`FastLanguageModel`: its fused LoRA QKV, O and MLP autograd
/// functions, in-place RoPE, RMSNorm saving its input, "unsloth" offloaded checkpointing),
/// derived from source in `validation/UNSLOTH.md` (Triton: nothing of it runs here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Kernels {
    /// transformers' layers and peft's adapters.
    #[default]
    Torch,
    /// Unsloth 2026.3 (unsloth 2026.3.5, unsloth_zoo 2026.3.4): what people run today.
    Unsloth,
    /// Unsloth 2024.12 (unsloth 2024.12.4, unsloth_zoo 2024.12.1, cut-cross-entropy
    /// 24.11.4, transformers 4.47): the release its published context tables measured.
    Unsloth2024,
}

/// What differs between Unsloth's releases, as data ([`Kernels::unsloth`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnslothRelease {
    /// `matmul_lora` adds the adapters' output as a new N x out tensor, and the MLP's
    /// backward its gate's share of the input's gradient as a new N x hidden one (2024.12),
    /// not in place with `addmm_` (from 2025-03).
    pub lora_output_temporary: bool,
    /// One RoPE cos/sin cache per layer (transformers 4.47's per-layer `rotary_emb`),
    /// built at 32,768 rows and grown in steps of 8,192 to the sequence; else one per GPU
    /// grown to `max(max_seq_length, max_position_embeddings)`.
    pub rope_per_layer: bool,
    /// Dequantized weights go to one global buffer of the largest linear (2026), not to a
    /// fresh tensor per call (2024.12).
    pub dequant_buffer: bool,
    /// `UnslothCheckpointFunction` (unsloth_zoo from 2025-01): the last layer's input is
    /// saved on the GPU, not offloaded, and the others come back into one GPU buffer that
    /// lives through the step; 2024.12's checkpointer copies each back to a fresh tensor.
    pub keeps_last_input: bool,
    /// Cut Cross-Entropy 24.11.4's backward allocates the head weight's gradient even
    /// for a frozen head (`dc = torch.zeros_like(c)`).
    pub head_gradient_always: bool,
}

impl Kernels {
    /// Every choice, in the order the page lists them.
    pub const ALL: [Kernels; 3] = [Kernels::Torch, Kernels::Unsloth, Kernels::Unsloth2024];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Kernels::Torch => "torch",
            Kernels::Unsloth => "unsloth",
            Kernels::Unsloth2024 => "unsloth-2024.12",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Kernels::Torch => "PyTorch (transformers, peft)",
            Kernels::Unsloth => "Unsloth 2026.3",
            Kernels::Unsloth2024 => "Unsloth 2024.12 (its published tables)",
        }
    }

    /// The release's differences, for Unsloth's kernels.
    #[must_use]
    pub const fn unsloth(self) -> Option<UnslothRelease> {
        match self {
            Kernels::Torch => None,
            Kernels::Unsloth => Some(UnslothRelease {
                lora_output_temporary: false,
                rope_per_layer: false,
                dequant_buffer: true,
                keeps_last_input: true,
                head_gradient_always: false,
            }),
            Kernels::Unsloth2024 => Some(UnslothRelease {
                lora_output_temporary: true,
                rope_per_layer: true,
                dequant_buffer: false,
                keeps_last_input: false,
                head_gradient_always: true,
            }),
        }
    }

    /// The choice whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.key() == key)
    }
}

/// `torch.compile` around the training step (issue contract `--compile off|layers|model`).
/// What the compiled regions save is AOTAutograd's min-cut partitioner's choice, measured
/// in `validation/COMPILE.md` (Llama, Qwen3, GPT-2): the norms keep their input and
/// statistics instead of eager's fp32 upcasts, pointwise chains (activations) keep only
/// their input, and the loss keeps the logits in their own dtype with per-token statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Compile {
    /// Eager PyTorch.
    #[default]
    Off,
    /// Each transformer block compiled on its own, the loss eager (torchtitan's
    /// `apply_compile` before it compiled the loss in 2025-04; a torchtune full-finetune recipe
    /// with a loss other than its chunked ones, where `compile_loss`'s result is dropped).
    Blocks,
    /// Each transformer block compiled on its own, and the loss on its own (torchtitan's
    /// `apply_compile`, torchtune's `compile_model` + `compile_loss`): the embeddings, the
    /// final norm and the head stay eager.
    Layers,
    /// The whole model with its loss (HF Trainer's `torch_compile=True`): the final norm is
    /// compiled too and the rotary tables are recomputed in backward.
    Model,
}

impl Compile {
    /// Every setting, in the order the page lists them.
    pub const ALL: [Compile; 4] = [
        Compile::Off,
        Compile::Blocks,
        Compile::Layers,
        Compile::Model,
    ];

    /// Short stable key (the URL's and the CLI's).
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Compile::Off => "off",
            Compile::Blocks => "blocks",
            Compile::Layers => "layers",
            Compile::Model => "model",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Compile::Off => "Off (eager)",
            Compile::Blocks => "Per block, loss eager (torchtitan before 2025-04)",
            Compile::Layers => "Per block + loss (torchtitan, torchtune)",
            Compile::Model => "Whole model (HF Trainer torch_compile)",
        }
    }

    /// The setting whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.key() == key)
    }

    /// Whether the transformer blocks run compiled.
    #[must_use]
    pub const fn blocks(self) -> bool {
        !matches!(self, Compile::Off)
    }

    /// Whether the loss runs compiled (on its own, or in the whole model's graph).
    #[must_use]
    pub const fn loss(self) -> bool {
        matches!(self, Compile::Layers | Compile::Model)
    }

    /// Whether the final norm and the rotary tables are inside the compiled graph.
    #[must_use]
    pub const fn whole_model(self) -> bool {
        matches!(self, Compile::Model)
    }
}

/// How the language-model head and its cross-entropy run: the trainers differ in what they
/// keep of the vocabulary-sized logits (see `validation/LOSSES.md` for each one's source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum LossKind {
    /// transformers' own loss (the model computes it from `labels`, as HF Trainer runs it):
    /// the logits in the model's dtype, upcast to fp32, cross-entropy.
    #[default]
    Hf,
    /// TRL's `loss_type="nll"` up to v1.13: [`Hf`](Self::Hf) plus SFTTrainer's no-gradient
    /// entropy and token-accuracy metrics on the full logits.
    TrlNll,
    /// TRL's `chunked_nll` (its default from v1.7 to v1.13): head and loss per 256 valid
    /// tokens under non-reentrant checkpointing, no vocabulary-sized tensor kept.
    TrlChunked,
    /// TRL from v1.15: the fused head (`ChunkedLogProbFunction`, Triton), whose backward
    /// builds fp32 gradients of the hidden states and of the whole head weight.
    TrlFused,
    /// torchtune's `CEWithChunkedOutputLoss`: the decoder returns 8 chunks of logits, each
    /// upcast to fp32 on its own.
    TorchtuneChunked,
    /// Liger-Kernel's fused linear cross-entropy: chunked head and loss, the gradients
    /// computed in the forward.
    Liger,
    /// Apple's Cut Cross-Entropy: blockwise log-sum-exp, no logits at all.
    Cce,
}

impl LossKind {
    /// Every loss, in the order the page lists them.
    pub const ALL: [LossKind; 7] = [
        LossKind::Hf,
        LossKind::TrlNll,
        LossKind::TrlChunked,
        LossKind::TrlFused,
        LossKind::TorchtuneChunked,
        LossKind::Liger,
        LossKind::Cce,
    ];

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            LossKind::Hf => "hf",
            LossKind::TrlNll => "trl-nll",
            LossKind::TrlChunked => "trl-chunked",
            LossKind::TrlFused => "trl-fused",
            LossKind::TorchtuneChunked => "torchtune-chunked",
            LossKind::Liger => "liger",
            LossKind::Cce => "cce",
        }
    }

    /// Name shown to a person, with which trainer uses it by default.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            LossKind::Hf => "transformers' loss (HF Trainer)",
            LossKind::TrlNll => "TRL nll + metrics on the logits (SFT before 1.7)",
            LossKind::TrlChunked => "TRL chunked_nll, 256-token chunks (SFT 1.7-1.14)",
            LossKind::TrlFused => "TRL fused head, Triton (SFT from 1.15)",
            LossKind::TorchtuneChunked => "torchtune chunked output, 8 chunks (torchtune)",
            LossKind::Liger => "Liger fused linear CE (use_liger_kernel)",
            LossKind::Cce => "Cut Cross-Entropy (Axolotl's cut_cross_entropy)",
        }
    }

    /// The loss whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.key() == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        for p in PrecisionRecipe::ALL {
            assert_eq!(PrecisionRecipe::from_key(p.key()), Some(p));
        }
        for a in AttentionKernel::ALL {
            assert_eq!(AttentionKernel::from_key(a.key()), Some(a));
        }
        for c in Checkpointing::ALL {
            assert_eq!(Checkpointing::from_key(c.key()), Some(c));
        }
        for l in LossKind::ALL {
            assert_eq!(LossKind::from_key(l.key()), Some(l));
        }
        assert_eq!(PrecisionRecipe::from_key("fp64"), None);
    }

    #[track_caller]
    fn bytes(p: PrecisionRecipe, w: u64, g: u64, s: u64, master: bool) {
        assert_eq!(
            (
                p.weight_bytes(),
                p.gradient_bytes(),
                p.optimizer_state_bytes(),
                p.master_weights()
            ),
            (w, g, s, master),
            "{p:?}"
        );
    }

    #[test]
    fn recipes_carry_their_bytes() {
        bytes(PrecisionRecipe::Fp32, 4, 4, 4, false);
        bytes(PrecisionRecipe::AmpBf16, 4, 4, 4, false);
        bytes(PrecisionRecipe::Bf16, 2, 2, 2, false);
        bytes(PrecisionRecipe::MixedBf16, 2, 2, 4, true);
    }
}
