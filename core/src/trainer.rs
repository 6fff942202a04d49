//! The trainers people run, as the settings they choose by default: picking one on the page
//! sets the loss, packing, checkpointing and attention below it, each still changeable.

use crate::{
    AttentionKernel, Checkpointing, LossKind, Method, ObjectiveKind, OptimizerImpl, PageState,
    Reference,
};

/// A training framework at the version whose defaults it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Trainer {
    /// transformers' `Trainer` (5.x): the model's own loss, no checkpointing, SDPA.
    HfTrainer,
    /// TRL's `SFTTrainer` 1.7 to 1.14: `chunked_nll`, `gradient_checkpointing=True`.
    TrlSft113,
    /// TRL's `SFTTrainer` from 1.15: the fused head, `gradient_checkpointing=True`.
    TrlSft115,
    /// torchtune's full fine-tuning recipes (0.6): chunked output loss, activation
    /// checkpointing on, no packing.
    Torchtune,
    /// Axolotl set up for memory: sample packing, flash attention, checkpointing and its
    /// `cut_cross_entropy` plugin (its own defaults leave all four off).
    Axolotl,
    /// TRL 1.16's `DPOTrainer`: the fused head, checkpointing, a separate reference (the
    /// adapters-off base with LoRA).
    TrlDpo,
    /// TRL 1.16's `GRPOTrainer`: the fused head, checkpointing, `beta = 0` (no reference),
    /// 8 generations by the model itself.
    TrlGrpo,
}

/// What a trainer sets by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainerDefaults {
    /// The loss.
    pub loss: LossKind,
    /// Sequence packing.
    pub packing: bool,
    /// Activation checkpointing.
    pub checkpointing: Checkpointing,
    /// The attention implementation.
    pub attention: AttentionKernel,
    /// How its default optimizer runs: every trainer here steps AdamW fused (HF Trainer's
    /// `adamw_torch_fused`, which TRL inherits, with torch 2.8 or newer; torchtune's
    /// recipes' `fused: True`; Axolotl's default `adamw_torch_fused`).
    pub optimizer_impl: OptimizerImpl,
    /// What it trains for.
    pub objective: ObjectiveKind,
}

impl Trainer {
    /// Every trainer, in the order the page lists them.
    pub const ALL: [Trainer; 7] = [
        Trainer::HfTrainer,
        Trainer::TrlSft113,
        Trainer::TrlSft115,
        Trainer::Torchtune,
        Trainer::Axolotl,
        Trainer::TrlDpo,
        Trainer::TrlGrpo,
    ];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Trainer::HfTrainer => "hf",
            Trainer::TrlSft113 => "trl-1.13",
            Trainer::TrlSft115 => "trl",
            Trainer::Torchtune => "torchtune",
            Trainer::Axolotl => "axolotl",
            Trainer::TrlDpo => "trl-dpo",
            Trainer::TrlGrpo => "trl-grpo",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Trainer::HfTrainer => "HF Trainer (transformers)",
            Trainer::TrlSft113 => "TRL SFTTrainer 1.7-1.14",
            Trainer::TrlSft115 => "TRL SFTTrainer 1.15+",
            Trainer::Torchtune => "torchtune 0.6 full fine-tune",
            Trainer::Axolotl => "Axolotl: packing, flash attention, Cut Cross-Entropy",
            Trainer::TrlDpo => "TRL DPOTrainer 1.16",
            Trainer::TrlGrpo => "TRL GRPOTrainer 1.16",
        }
    }

    /// The trainer whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.key() == key)
    }

    /// Its defaults.
    #[must_use]
    pub const fn defaults(self) -> TrainerDefaults {
        let (loss, packing, checkpointing, attention) = match self {
            Trainer::HfTrainer => (
                LossKind::Hf,
                false,
                Checkpointing::None,
                AttentionKernel::Sdpa,
            ),
            Trainer::TrlSft113 => (
                LossKind::TrlChunked,
                false,
                Checkpointing::Full,
                AttentionKernel::Sdpa,
            ),
            Trainer::TrlSft115 | Trainer::TrlDpo | Trainer::TrlGrpo => (
                LossKind::TrlFused,
                false,
                Checkpointing::Full,
                AttentionKernel::Sdpa,
            ),
            Trainer::Torchtune => (
                LossKind::TorchtuneChunked,
                false,
                Checkpointing::Full,
                AttentionKernel::Sdpa,
            ),
            Trainer::Axolotl => (
                LossKind::Cce,
                true,
                Checkpointing::Full,
                AttentionKernel::Flash2,
            ),
        };
        TrainerDefaults {
            loss,
            packing,
            checkpointing,
            attention,
            optimizer_impl: OptimizerImpl::Fused,
            objective: match self {
                Trainer::TrlDpo => ObjectiveKind::Dpo,
                Trainer::TrlGrpo => ObjectiveKind::Grpo,
                _ => ObjectiveKind::Sft,
            },
        }
    }

    /// `state` with this trainer's defaults.
    pub fn apply(self, state: &mut PageState) {
        let d = self.defaults();
        state.step.loss = d.loss;
        state.step.packing = d.packing;
        state.step.checkpointing = d.checkpointing;
        state.step.attention = d.attention;
        state.step.optimizer_impl = d.optimizer_impl;
        state.step.objective = d.objective;
        state.step.reference = match d.objective {
            ObjectiveKind::Grpo => Reference::None,
            _ if state.training.method != Method::Full => Reference::AdaptersOff,
            _ => Reference::Separate,
        };
    }

    /// The trainer whose defaults `state` has, if any.
    #[must_use]
    pub fn matching(state: &PageState) -> Option<Self> {
        Self::ALL.into_iter().find(|t| {
            let d = t.defaults();
            d.loss == state.step.loss
                && d.packing == state.step.packing
                && d.checkpointing == state.step.checkpointing
                && d.attention == state.step.attention
                && d.optimizer_impl == state.step.optimizer_impl
                && d.objective == state.step.objective
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_trainer_is_recognised_from_its_defaults() {
        for t in Trainer::ALL {
            assert_eq!(Trainer::from_key(t.key()), Some(t));
            let mut state = PageState::default();
            t.apply(&mut state);
            assert_eq!(Trainer::matching(&state), Some(t), "{t:?}");
        }
        let mut state = PageState::default();
        Trainer::TrlSft113.apply(&mut state);
        state.step.loss = LossKind::Liger;
        assert_eq!(
            Trainer::matching(&state),
            None,
            "a changed default is custom"
        );
    }
}
