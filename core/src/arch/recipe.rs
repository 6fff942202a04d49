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
}

impl AttentionKernel {
    /// Both kernels.
    pub const ALL: [AttentionKernel; 2] = [AttentionKernel::Sdpa, AttentionKernel::Eager];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            AttentionKernel::Sdpa => "sdpa",
            AttentionKernel::Eager => "eager",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            AttentionKernel::Sdpa => "SDPA (fused, flash / memory-efficient)",
            AttentionKernel::Eager => "Eager (explicit softmax)",
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
}

impl Checkpointing {
    /// Both settings.
    pub const ALL: [Checkpointing; 3] = [
        Checkpointing::None,
        Checkpointing::Full,
        Checkpointing::Offload,
    ];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Checkpointing::None => "none",
            Checkpointing::Full => "full",
            Checkpointing::Offload => "offload",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Checkpointing::None => "No checkpointing",
            Checkpointing::Full => "Full (every layer)",
            Checkpointing::Offload => "Full, inputs offloaded to CPU",
        }
    }

    /// Whether layers are recomputed in backward.
    #[must_use]
    pub const fn recomputes(self) -> bool {
        !matches!(self, Checkpointing::None)
    }

    /// The setting whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.key() == key)
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
