//! The trainers people run, as the settings they choose by default: picking one on the page
//! sets the loss, packing, checkpointing and attention below it, each still changeable.

use crate::{
    AllocatorMode, AttentionKernel, Checkpointing, Kernels, LossKind, Method, ObjectiveKind,
    Optimizer, OptimizerImpl, PageState, PrecisionRecipe, Quant4, Reference,
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
    /// Unsloth 2026.3 (`FastLanguageModel.from_pretrained` and `get_peft_model` with their
    /// defaults, `validation/UNSLOTH.md` section 1): QLoRA NF4 with double quantization,
    /// r 16 on the 7 linears, dropout 0, fp32 adapters, bf16, "unsloth" offloaded
    /// checkpointing, its fused kernels; flash attention when installed; AdamW 8-bit as its
    /// notebooks set it. Its loss (a chunked fused cross-entropy sized from free memory)
    /// is counted as Cut Cross-Entropy, without the chunk.
    Unsloth,
    /// Unsloth 2024.12, the release behind its published context tables: the same defaults,
    /// Cut Cross-Entropy 24.11.4 as its loss.
    Unsloth2024,
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
    /// The layers' kernels.
    pub kernels: Kernels,
}

impl Trainer {
    /// Every trainer, in the order the page lists them.
    pub const ALL: [Trainer; 9] = [
        Trainer::HfTrainer,
        Trainer::TrlSft113,
        Trainer::TrlSft115,
        Trainer::Torchtune,
        Trainer::Axolotl,
        Trainer::TrlDpo,
        Trainer::TrlGrpo,
        Trainer::Unsloth,
        Trainer::Unsloth2024,
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
            Trainer::Unsloth => "unsloth",
            Trainer::Unsloth2024 => "unsloth-2024.12",
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
            Trainer::Unsloth => "Unsloth 2026.3: QLoRA and its kernels",
            Trainer::Unsloth2024 => "Unsloth 2024.12 (its published tables)",
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
            Trainer::Unsloth | Trainer::Unsloth2024 => (
                LossKind::Cce,
                false,
                Checkpointing::Offload,
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
            kernels: match self {
                Trainer::Unsloth => Kernels::Unsloth,
                Trainer::Unsloth2024 => Kernels::Unsloth2024,
                _ => Kernels::Torch,
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
        state.step.kernels = d.kernels;
        if d.kernels != Kernels::Torch {
            // from_pretrained(load_in_4bit=True) and get_peft_model's defaults; its own
            // preparation upcasts only the adapters
            let t = &mut state.training;
            t.method = Method::Qlora;
            "16".clone_into(&mut t.lora_rank);
            "16".clone_into(&mut t.lora_alpha);
            "0".clone_into(&mut t.lora_dropout);
            "all-linear".clone_into(&mut t.lora_targets);
            t.lora_fp32 = true;
            t.base_fp32 = false;
            t.quant = Quant4::Nf4;
            t.double_quant = true;
            t.kbit_prepare = false;
            state.step.recipe = PrecisionRecipe::Bf16;
            state.step.optimizer = Optimizer::AdamW8bit;
            // unsloth_zoo sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True at import
            state.hardware.allocator = AllocatorMode::Expandable;
        }
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
                && d.kernels == state.step.kernels
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_query, encode_query, evaluate};

    /// The page's state for `query` with `trainer`'s defaults.
    fn with(trainer: Trainer, query: &str) -> PageState {
        let mut state = decode_query(query).state;
        trainer.apply(&mut state);
        state
    }

    /// The step's peak on the page for `state` at `seq` tokens.
    #[track_caller]
    fn peak(state: &PageState, seq: u64) -> u64 {
        let mut state = state.clone();
        state.step.seq_len = seq.to_string();
        evaluate(&state).expect("an estimate").step.peak_bytes
    }

    #[test]
    fn unsloth_sets_its_defaults_and_a_link_keeps_them() {
        let state = with(
            Trainer::Unsloth,
            "m=arch&model=llama3.1-8b&gpu=t4&b=1&s=4096",
        );
        let t = &state.training;
        assert_eq!(
            (t.method, t.lora_rank.as_str(), t.lora_alpha.as_str()),
            (Method::Qlora, "16", "16")
        );
        assert_eq!(
            (t.lora_dropout.as_str(), t.lora_targets.as_str()),
            ("0", "all-linear")
        );
        assert!(t.lora_fp32 && t.double_quant && !t.kbit_prepare && t.quant == Quant4::Nf4);
        assert_eq!(state.step.kernels, Kernels::Unsloth);
        assert_eq!(state.step.checkpointing, Checkpointing::Offload);
        assert_eq!(state.step.optimizer, Optimizer::AdamW8bit);
        assert_eq!(state.hardware.allocator, AllocatorMode::Expandable);
        let back = decode_query(&encode_query(&state));
        assert!(back.notices.is_empty(), "{:?}", back.notices);
        assert_eq!(back.state, state);
        assert_eq!(Trainer::matching(&back.state), Some(Trainer::Unsloth));
    }

    /// Llama 3.1 8B under Unsloth 2024.12 at r 32: every token adds what section 8.3 of
    /// validation/UNSLOTH.md derives, s(7h + 2q + 2k + 4f + r) with the per-layer RoPE rows
    /// (2 x 2 x d_head x L), the log-sum-exp (4 x heads), two RMSNorm `r` and the token id.
    #[test]
    fn unsloth_2024_adds_the_derived_bytes_per_token() {
        let mut state = with(Trainer::Unsloth2024, "m=arch&model=llama3.1-8b&b=1&s=4096");
        "32".clone_into(&mut state.training.lora_rank);
        let (h, q, k, f, r, d, layers, heads) = (4096, 4096, 1024, 14_336, 32, 128, 32, 32);
        let per_token =
            2 * (7 * h + 2 * q + 2 * k + 4 * f + r) + 4 * d * layers + 4 * heads + 8 + 8;
        assert_eq!(per_token, 209_104);
        let (a, b) = (65_536, 131_072);
        assert_eq!((peak(&state, b) - peak(&state, a)) / (b - a), per_token);
        // 2026.3: no N x inner LoRA temporary and one RoPE cache per GPU, but the last
        // layer's input kept on the GPU beside the buffer the others come back into
        let mut today = with(Trainer::Unsloth, "m=arch&model=llama3.1-8b&b=1&s=4096");
        "32".clone_into(&mut today.training.lora_rank);
        let slope = (peak(&today, b) - peak(&today, a)) / (b - a);
        assert_eq!(per_token - slope, 2 * f + 4 * d * layers - 2 * h);
    }

    /// Every preset and both releases, short and long: a figure or a refusal, never a panic,
    /// and a figure only where the kernels are modelled.
    #[test]
    fn unsloth_on_every_preset_estimates_or_refuses() {
        for preset in crate::Preset::ALL {
            for trainer in [Trainer::Unsloth, Trainer::Unsloth2024] {
                for seq in ["1", "4096", "1000000"] {
                    let query = format!("m=arch&model={}&b=2&s={seq}&gpu=h100-80", preset.key());
                    let state = with(trainer, &query);
                    let family = preset.family();
                    let modelled = matches!(
                        family,
                        crate::ModelFamily::Llama
                            | crate::ModelFamily::Mistral
                            | crate::ModelFamily::Qwen3
                            | crate::ModelFamily::Gemma
                    );
                    if let Ok(e) = evaluate(&state) {
                        assert!(modelled, "{query}: {family:?}");
                        assert!(e.step.peak_bytes > 0 && e.step.host_bytes > 0, "{query}");
                    }
                }
            }
        }
    }

    #[test]
    fn unsloth_offloads_the_layer_inputs_to_host_memory() {
        let state = with(Trainer::Unsloth2024, "m=arch&model=llama3.1-8b&b=1&s=8192");
        let e = evaluate(&state).expect("an estimate");
        assert_eq!(e.step.host_bytes, 32 * 8192 * 4096 * 2);
    }

    #[test]
    fn unsloth_kernels_are_refused_where_they_are_not_modelled() {
        for query in [
            "m=arch&model=gpt2&b=1&s=512",
            "m=arch&model=qwen3-30b-a3b&b=1&s=512",
            "m=arch&model=llama3.2-1b&b=1&s=512&o=none",
            "m=arch&model=llama3.2-1b&b=1&s=512&ld=0.1",
        ] {
            let mut state = with(Trainer::Unsloth, query);
            let full = decode_query(query).state;
            // (the trainer's defaults, then what the query changes)
            state.step.optimizer = full.step.optimizer;
            state
                .training
                .lora_dropout
                .clone_from(&full.training.lora_dropout);
            let err = evaluate(&state).err().map(|e| e.to_string());
            assert!(
                err.as_deref()
                    .is_some_and(|e| e.contains("Unsloth's kernels are modelled")),
                "{query}: {err:?}"
            );
        }
        let mut full = with(Trainer::Unsloth, "m=arch&model=llama3.2-1b&b=1&s=512");
        full.training.method = Method::Full;
        assert!(evaluate(&full).is_err());
        // a sharded engine does not run its kernels; DDP does
        let mut sharded = with(
            Trainer::Unsloth,
            "m=arch&model=llama3.2-1b&b=1&s=512&gpus=2",
        );
        assert!(evaluate(&sharded).is_ok());
        sharded.parallel.sharding = crate::Sharding::Fsdp2;
        let err = evaluate(&sharded).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.ends_with("on one GPU or under DDP")));
    }

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
