//! The optimizer choice, shared by the simple and the architecture modes.

/// Which optimizer updates the weights, or `None` for inference.
///
/// Each variant knows how many parameter-sized state tensors it keeps, so the memory
/// model never matches on optimizer names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Optimizer {
    /// AdamW: first and second moments (two states per parameter).
    AdamW,
    /// SGD with momentum: one momentum buffer per parameter.
    SgdMomentum,
    /// Plain SGD: no state at all.
    Sgd,
    /// bitsandbytes `AdamW8bit`: both moments as 1-byte codes with an fp32 scale per block
    /// of 256 (tensors under 4096 elements keep fp32 moments).
    AdamW8bit,
    /// bitsandbytes `PagedAdamW8bit`: the same state, its large moments in CUDA managed
    /// memory outside PyTorch's caching allocator.
    PagedAdamW8bit,
    /// `torch.optim.Adafactor`: factored second moments (a row and a column vector per
    /// matrix), no first moment.
    Adafactor,
    /// transformers' `Adafactor` as HF Trainer's `optim="adafactor"` sets it up: factored
    /// fp32 second moments, no first moment, fp32 copies of each tensor during its update.
    AdafactorHf,
    /// Inference only: no gradients, no optimizer, forward pass under `no_grad`.
    None,
}

impl Optimizer {
    /// Every optimizer, in the order the page lists them.
    pub const ALL: [Optimizer; 8] = [
        Optimizer::AdamW,
        Optimizer::SgdMomentum,
        Optimizer::Sgd,
        Optimizer::AdamW8bit,
        Optimizer::PagedAdamW8bit,
        Optimizer::Adafactor,
        Optimizer::AdafactorHf,
        Optimizer::None,
    ];

    /// Parameter-sized state tensors the optimizer keeps between steps.
    #[must_use]
    pub const fn state_tensors_per_param(self) -> u64 {
        match self {
            Optimizer::AdamW => 2,
            Optimizer::SgdMomentum => 1,
            _ => 0,
        }
    }

    /// State bytes per parameter when only the parameter count is known (the simple mode):
    /// the block scales and the factored moments are well under 1%.
    #[must_use]
    pub const fn approximate_state_bytes_per_param(self) -> u64 {
        match self {
            Optimizer::AdamW => 8,
            Optimizer::SgdMomentum => 4,
            Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit => 2,
            _ => 0,
        }
    }

    /// Whether a backward pass runs (and so gradients exist).
    #[must_use]
    pub const fn trains(self) -> bool {
        !matches!(self, Optimizer::None)
    }

    /// Short stable key used in URLs, storage and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Optimizer::AdamW => "adamw",
            Optimizer::SgdMomentum => "sgd-momentum",
            Optimizer::Sgd => "sgd",
            Optimizer::AdamW8bit => "adamw8bit",
            Optimizer::PagedAdamW8bit => "paged-adamw8bit",
            Optimizer::Adafactor => "adafactor",
            Optimizer::AdafactorHf => "adafactor-hf",
            Optimizer::None => "none",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Optimizer::AdamW => "AdamW",
            Optimizer::SgdMomentum => "SGD with momentum",
            Optimizer::Sgd => "SGD (no momentum)",
            Optimizer::AdamW8bit => "AdamW 8-bit (bitsandbytes)",
            Optimizer::PagedAdamW8bit => "Paged AdamW 8-bit (bitsandbytes)",
            Optimizer::Adafactor => "Adafactor (torch.optim)",
            Optimizer::AdafactorHf => "Adafactor (transformers, HF Trainer)",
            Optimizer::None => "None (inference only)",
        }
    }

    /// The optimizer whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.key() == key)
    }

    /// Why the [`OptimizerImpl`] choice means nothing for this optimizer, or `None` where
    /// it is torch.optim's AdamW or SGD, which take `fused` / `foreach`.
    #[must_use]
    pub const fn ignores_implementation(self) -> Option<&'static str> {
        match self {
            Optimizer::AdamW | Optimizer::SgdMomentum | Optimizer::Sgd => None,
            // bitsandbytes 0.50.2, `optim/optimizer.py`: `Optimizer8bit.step` loops over the
            // parameters, each updated by `update_step` with its own blockwise 8-bit kernel
            // (`F.optimizer_update_8bit_blockwise`); it takes no `fused` or `foreach`
            Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit => Some(
                "bitsandbytes steps each parameter with its own 8-bit kernel (no fused or foreach)",
            ),
            // torch 2.15, `optim/_adafactor.py`, `adafactor`: no fused kernel, and
            // `foreach=None` (its default) runs `_single_tensor_adafactor`, which is what
            // the estimate models
            Optimizer::Adafactor => Some(
                "torch.optim.Adafactor has no fused kernel and is estimated as its default, one tensor at a time (foreach=None)",
            ),
            // transformers 5.24, `optimization.py`, `Adafactor.step`: a loop over the
            // parameters, no `fused` or `foreach`
            Optimizer::AdafactorHf => {
                Some("transformers' Adafactor steps one tensor at a time (no fused or foreach)")
            }
            Optimizer::None => Some("inference runs no optimizer"),
        }
    }
}

/// How `torch.optim` runs the update over the parameters: the same math, different
/// temporaries and step counters on the GPU (read from torch 2.15's `torch/optim/adam.py`
/// and `sgd.py`; measured under fake mode: `validation/OPTIMIZERS.md`).
///
/// It applies to AdamW and SGD; bitsandbytes' optimizers run their own kernels and
/// Adafactor is stepped one tensor at a time whatever is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptimizerImpl {
    /// `fused=True` (`torch._fused_adamw_`): one kernel updates in place; each parameter's
    /// `step` counter is a tensor on the GPU. HF Trainer's and TRL's default
    /// (`adamw_torch_fused`) with torch 2.8 or newer.
    Fused,
    /// `foreach=True`, torch.optim's default on CUDA: AdamW's `_foreach_sqrt` of every
    /// second moment at once allocates one parameter-sized temporary; `step` counters stay
    /// CPU tensors.
    Foreach,
    /// `foreach=False`: one parameter at a time; AdamW's `denom` needs two temporaries the
    /// size of the largest parameter (`sqrt()`, then its division, both alive at once).
    ForLoop,
}

impl OptimizerImpl {
    /// Every implementation, in the order the page lists them.
    pub const ALL: [OptimizerImpl; 3] = [
        OptimizerImpl::Fused,
        OptimizerImpl::Foreach,
        OptimizerImpl::ForLoop,
    ];

    /// Short stable key used in URLs, storage and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            OptimizerImpl::Fused => "fused",
            OptimizerImpl::Foreach => "foreach",
            OptimizerImpl::ForLoop => "forloop",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            OptimizerImpl::Fused => "fused (one kernel, in place)",
            OptimizerImpl::Foreach => "foreach (torch.optim's default)",
            OptimizerImpl::ForLoop => "for-loop (foreach=False)",
        }
    }

    /// The implementation whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.key() == key)
    }

    /// Whether each parameter's `step` counter is a tensor on the GPU (a 512-byte block):
    /// `capturable or fused` puts it on the parameter's device, otherwise it is a CPU
    /// scalar tensor.
    #[must_use]
    pub const fn step_counter_on_device(self) -> bool {
        matches!(self, OptimizerImpl::Fused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only torch.optim's AdamW and SGD take the kernel choice: the estimate of every other
    /// optimizer is the same whatever is asked, and says why.
    #[test]
    fn the_kernel_choice_applies_to_torch_optim_s_adamw_and_sgd() {
        #[track_caller]
        fn check(optimizer: Optimizer, takes: bool, why: &str) {
            let ignored = optimizer.ignores_implementation();
            assert_eq!(ignored.is_none(), takes, "{optimizer:?}");
            assert!(
                ignored.unwrap_or("").contains(why),
                "{optimizer:?}: {ignored:?}"
            );
        }
        for (optimizer, takes, why) in [
            (Optimizer::AdamW, true, ""),
            (Optimizer::SgdMomentum, true, ""),
            (Optimizer::Sgd, true, ""),
            (Optimizer::AdamW8bit, false, "bitsandbytes"),
            (Optimizer::PagedAdamW8bit, false, "bitsandbytes"),
            (Optimizer::Adafactor, false, "foreach=None"),
            (Optimizer::AdafactorHf, false, "transformers"),
            (Optimizer::None, false, "inference"),
        ] {
            check(optimizer, takes, why);
        }
    }
}
