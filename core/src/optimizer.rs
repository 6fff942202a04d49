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
    /// Inference only: no gradients, no optimizer, forward pass under `no_grad`.
    None,
}

impl Optimizer {
    /// Every optimizer, in the order the page lists them.
    pub const ALL: [Optimizer; 4] = [
        Optimizer::AdamW,
        Optimizer::SgdMomentum,
        Optimizer::Sgd,
        Optimizer::None,
    ];

    /// Parameter-sized state tensors the optimizer keeps between steps.
    #[must_use]
    pub const fn state_tensors_per_param(self) -> u64 {
        match self {
            Optimizer::AdamW => 2,
            Optimizer::SgdMomentum => 1,
            Optimizer::Sgd | Optimizer::None => 0,
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
            Optimizer::None => "None (inference only)",
        }
    }

    /// The optimizer whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.key() == key)
    }
}
