//! Parameter-efficient fine-tuning: LoRA adapters (peft 0.21) on a frozen base, optionally
//! quantized to 4 bits (bitsandbytes 0.50, QLoRA).
//!
//! What changes against full training, as `validation/PEFT.md` reads it off the libraries and
//! the harness measures it:
//! - only the adapters have gradients and optimizer state;
//! - a frozen linear keeps no input (autograd saves `mat1` only for the weight's gradient) and
//!   a frozen norm no normalised output; under autocast the frozen weight's 16-bit copy is still
//!   kept (`mat2`, for the input's gradient);
//! - each adapted linear keeps its input in the adapter's dtype (a copy of its own when the
//!   dtypes differ: fp32 adapters on a bf16 base), the dropout mask when `lora_dropout > 0`, and
//!   `lora_A`'s output (`tokens x r`);
//! - a 4-bit linear keeps nothing (bitsandbytes stores the packed weight on its context), its
//!   output takes its input's dtype, and it dequantizes its weight to 16 bits for a moment in
//!   forward and in backward.

use super::recipe::PrecisionRecipe;

/// How the model's weights are trained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Method {
    /// Every parameter trains.
    #[default]
    Full,
    /// LoRA adapters on a frozen base in the recipe's dtype.
    Lora,
    /// LoRA adapters on a frozen base quantized to 4 bits (bitsandbytes), compute in bf16.
    Qlora,
}

impl Method {
    /// Every method, in the order the page lists them.
    pub const ALL: [Method; 3] = [Method::Full, Method::Lora, Method::Qlora];

    /// Short stable key (URL, CLI).
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Method::Full => "full",
            Method::Lora => "lora",
            Method::Qlora => "qlora",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Method::Full => "Full fine-tuning",
            Method::Lora => "LoRA",
            Method::Qlora => "QLoRA (4-bit base)",
        }
    }

    /// The method whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.key() == key)
    }
}

/// The 4-bit data type of a QLoRA base (same storage; only the 16-entry code differs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Quant4 {
    /// NormalFloat 4.
    #[default]
    Nf4,
    /// 4-bit float.
    Fp4,
}

impl Quant4 {
    /// Both types.
    pub const ALL: [Quant4; 2] = [Quant4::Nf4, Quant4::Fp4];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Quant4::Nf4 => "nf4",
            Quant4::Fp4 => "fp4",
        }
    }

    /// The type whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|q| q.key() == key)
    }
}

/// A linear layer's place in its block, as peft's target module names pick it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    Q,
    K,
    V,
    /// A fused q/k/v projection (`qkv_proj`, GPT-2's `c_attn`).
    Qkv,
    /// The attention's output projection.
    O,
    Gate,
    Up,
    /// A fused gate/up projection (`gate_up_proj`).
    GateUp,
    /// The MLP's output projection.
    Down,
    /// A plain MLP's first projection (GPT-2's `c_fc`, BERT's `intermediate.dense`).
    Fc,
    /// Routers, latent-attention projections: adapted only by `all-linear`.
    Other,
    /// The output layer: never adapted, never quantized (peft and bitsandbytes leave it).
    Head,
}

impl Role {
    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// The set of linears that get adapters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoraTargets(u16);

const ATTENTION: [Role; 5] = [Role::Q, Role::K, Role::V, Role::Qkv, Role::O];
const MLP: [Role; 5] = [Role::Gate, Role::Up, Role::GateUp, Role::Down, Role::Fc];

/// peft's module names per naming scheme, with the roles each one picks.
const LLAMA_NAMES: [(&str, &[Role]); 9] = [
    ("q_proj", &[Role::Q]),
    ("k_proj", &[Role::K]),
    ("v_proj", &[Role::V]),
    ("o_proj", &[Role::O]),
    ("gate_proj", &[Role::Gate]),
    ("up_proj", &[Role::Up]),
    ("down_proj", &[Role::Down]),
    ("qkv_proj", &[Role::Qkv]),
    ("gate_up_proj", &[Role::GateUp]),
];
const GPT2_NAMES: [(&str, &[Role]); 3] = [
    ("c_attn", &[Role::Qkv]),
    // attn.c_proj and mlp.c_proj share the name: peft adapts both
    ("c_proj", &[Role::O, Role::Down]),
    ("c_fc", &[Role::Fc]),
];
const BERT_NAMES: [(&str, &[Role]); 4] = [
    ("query", &[Role::Q]),
    ("key", &[Role::K]),
    ("value", &[Role::V]),
    // attention.output.dense, intermediate.dense and output.dense
    ("dense", &[Role::O, Role::Fc, Role::Down]),
];

const OPT_NAMES: [(&str, &[Role]); 6] = [
    ("q_proj", &[Role::Q]),
    ("k_proj", &[Role::K]),
    ("v_proj", &[Role::V]),
    ("out_proj", &[Role::O]),
    ("fc1", &[Role::Fc]),
    ("fc2", &[Role::Down]),
];

/// Which module names a model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Naming {
    Llama,
    Gpt2,
    Bert,
    Opt,
}

impl Naming {
    fn names(self) -> &'static [(&'static str, &'static [Role])] {
        match self {
            Naming::Llama => &LLAMA_NAMES,
            Naming::Gpt2 => &GPT2_NAMES,
            Naming::Bert => &BERT_NAMES,
            Naming::Opt => &OPT_NAMES,
        }
    }
}

/// Why a target list cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetsError {
    /// Nothing listed.
    Empty,
    /// A name the model has no module of; carries the name and the names it has.
    UnknownModule {
        /// The name given.
        name: String,
        /// The names this model's linears have.
        known: String,
    },
}

impl std::fmt::Display for TargetsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetsError::Empty => f.write_str("Name at least one module, or all-linear."),
            TargetsError::UnknownModule { name, known } => {
                write!(
                    f,
                    "This model has no module \"{name}\" (its linears: {known})."
                )
            }
        }
    }
}

impl LoraTargets {
    /// Every linear but the output layer (peft's `all-linear`).
    pub const ALL_LINEAR: LoraTargets = LoraTargets(!Role::Head.bit());

    fn of(roles: &[Role]) -> LoraTargets {
        LoraTargets(roles.iter().fold(0, |acc, r| acc | r.bit()))
    }

    /// The attention projections.
    #[must_use]
    pub fn attention() -> LoraTargets {
        Self::of(&ATTENTION)
    }

    /// The MLP projections.
    #[must_use]
    pub fn mlp() -> LoraTargets {
        Self::of(&MLP)
    }

    pub(crate) fn contains(self, role: Role) -> bool {
        self.0 & role.bit() != 0
    }

    /// `all-linear`, `attention`, `mlp`, or a comma-separated list of module names of the
    /// model (`q_proj,v_proj`).
    ///
    /// # Errors
    /// [`TargetsError`] for an empty list or a name the model does not have.
    pub(crate) fn parse(text: &str, naming: Naming) -> Result<LoraTargets, TargetsError> {
        match text.trim() {
            "all-linear" => return Ok(Self::ALL_LINEAR),
            "attention" => return Ok(Self::attention()),
            "mlp" => return Ok(Self::mlp()),
            _ => {}
        }
        let mut bits = 0;
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let roles = naming
                .names()
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, roles)| *roles)
                .ok_or_else(|| TargetsError::UnknownModule {
                    name: name.chars().take(40).collect(),
                    known: naming
                        .names()
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
            bits |= Self::of(roles).0;
        }
        if bits == 0 {
            return Err(TargetsError::Empty);
        }
        Ok(LoraTargets(bits))
    }
}

/// A LoRA or QLoRA setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Peft {
    /// LoRA or QLoRA ([`Method::Full`] is no `Peft` at all).
    pub method: Method,
    /// The adapters' rank `r`.
    pub rank: u64,
    /// Whether `lora_dropout > 0` (a mask per adapted linear).
    pub dropout: bool,
    /// Which linears get adapters.
    pub targets: LoraTargets,
    /// Adapters in fp32 (peft's default `autocast_adapter_dtype=True`) or in the base's dtype.
    pub adapter_fp32: bool,
    /// QLoRA: the 4-bit type.
    pub quant: Quant4,
    /// QLoRA: double quantization (8-bit absmax with a second level of fp32 constants).
    pub double_quant: bool,
    /// QLoRA: `prepare_model_for_kbit_training` (the unquantized parameters upcast to fp32).
    pub kbit_prepare: bool,
    /// The base loaded in fp32 (`torch_dtype=torch.float32`, as peft's FSDP LoRA example
    /// loads it) whatever the recipe's weight dtype: QLoRA's unquantized parameters and its
    /// 4-bit weights' `quant_state.dtype` (their dequantized copies) too.
    pub base_fp32: bool,
}

impl Peft {
    /// Whether the base is 4-bit.
    #[must_use]
    pub fn quantized(&self) -> bool {
        self.method == Method::Qlora
    }

    /// The recipe the step really runs with `recipe` asked for: a base loaded in fp32 is
    /// fp32 already under AMP; under a 16-bit recipe nothing casts it, so the step runs in
    /// fp32, or, under the trainer's own bf16 autocast (TRL's `bf16=True`: accelerate's
    /// autocast around the forward), as AMP runs it.
    #[must_use]
    pub fn recipe(&self, recipe: PrecisionRecipe, trainer_autocast: bool) -> PrecisionRecipe {
        if !self.base_fp32 || recipe.weight_bytes() == 4 {
            recipe
        } else if trainer_autocast {
            PrecisionRecipe::AmpBf16
        } else {
            PrecisionRecipe::Fp32
        }
    }
}

/// What the forward tape needs to know of a PEFT setup.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TapePeft {
    pub rank: u64,
    pub dropout: bool,
    pub targets: LoraTargets,
    /// Bytes per element of the adapters (and so of their input outside autocast).
    pub adapter_bytes: u64,
    pub quantized: bool,
    /// Whether the embeddings' output requires a gradient (checkpointing enables it):
    /// without it, the first layer keeps nothing until its first adapter.
    pub input_grad: bool,
    /// The trainer's autocast wraps a 16-bit model's forward (TRL's `bf16=True`).
    pub autocast: bool,
}

/// Weights per absmax in bitsandbytes' 4-bit blocks (its default `blocksize`, and Unsloth's
/// pre-quantized models' too).
pub(crate) const FOUR_BIT_BLOCK: u64 = 64;

/// Bytes of one 4-bit weight of `elems` elements on the GPU: the packed data (the parameter)
/// and its quantization state (buffers): absmax per block of 64 (fp32, or uint8 with a
/// second-level fp32 absmax per 256 blocks and an fp32 offset) and the 16-entry code.
pub(crate) fn four_bit_bytes(elems: u64, double_quant: bool) -> (u64, u64) {
    use super::arith::storage;
    let packed = storage(elems.div_ceil(2), 1).unwrap_or(u64::MAX);
    let blocks = elems.div_ceil(FOUR_BIT_BLOCK);
    let state = if double_quant {
        [
            storage(blocks, 1),
            storage(blocks.div_ceil(256), 4),
            storage(1, 4),
            storage(16, 4),
        ]
        .into_iter()
        .map(|b| b.unwrap_or(u64::MAX))
        .fold(0u64, u64::saturating_add)
    } else {
        storage(blocks, 4)
            .unwrap_or(u64::MAX)
            .saturating_add(storage(16, 4).unwrap_or(u64::MAX))
    };
    (packed, state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        for m in Method::ALL {
            assert_eq!(Method::from_key(m.key()), Some(m));
        }
        for q in Quant4::ALL {
            assert_eq!(Quant4::from_key(q.key()), Some(q));
        }
    }

    #[track_caller]
    fn targets(text: &str, naming: Naming, has: &[Role], lacks: &[Role]) {
        let t = LoraTargets::parse(text, naming).expect(text);
        for r in has {
            assert!(t.contains(*r), "{text} should adapt {r:?}");
        }
        for r in lacks {
            assert!(!t.contains(*r), "{text} should not adapt {r:?}");
        }
    }

    #[test]
    fn target_names_pick_their_linears() {
        use Role::*;
        targets(
            "all-linear",
            Naming::Llama,
            &[Q, K, V, O, Gate, Up, Down, Other],
            &[Head],
        );
        targets(
            "attention",
            Naming::Llama,
            &[Q, K, V, O, Qkv],
            &[Gate, Down, Head],
        );
        targets("mlp", Naming::Llama, &[Gate, Up, Down, GateUp], &[Q, O]);
        targets("q_proj, v_proj", Naming::Llama, &[Q, V], &[K, O, Gate]);
        targets("c_attn", Naming::Gpt2, &[Qkv], &[O, Down, Fc]);
        targets("c_proj", Naming::Gpt2, &[O, Down], &[Qkv, Fc]);
        targets("query,value", Naming::Bert, &[Q, V], &[K, O]);
        targets("out_proj,fc1,fc2", Naming::Opt, &[O, Fc, Down], &[Q, K, V]);
    }

    #[test]
    fn unknown_or_missing_names_are_refused() {
        assert_eq!(
            LoraTargets::parse("c_attn", Naming::Llama),
            Err(TargetsError::UnknownModule {
                name: "c_attn".into(),
                known: "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, \
                        qkv_proj, gate_up_proj"
                    .into()
            })
        );
        assert_eq!(
            LoraTargets::parse(" , ", Naming::Gpt2),
            Err(TargetsError::Empty)
        );
    }

    #[track_caller]
    fn runs_as(
        base_fp32: bool,
        asked: PrecisionRecipe,
        trainer_autocast: bool,
        runs: PrecisionRecipe,
    ) {
        let peft = Peft {
            method: Method::Lora,
            rank: 16,
            dropout: false,
            targets: LoraTargets::ALL_LINEAR,
            adapter_fp32: true,
            quant: Quant4::Nf4,
            double_quant: true,
            kbit_prepare: true,
            base_fp32,
        };
        assert_eq!(peft.recipe(asked, trainer_autocast), runs);
    }

    /// A base loaded in fp32 is what AMP loads; under a 16-bit recipe nothing casts it (the
    /// step runs in fp32) unless the trainer's own autocast does (as AMP).
    #[test]
    fn an_fp32_base_runs_as_fp32_or_amp() {
        use PrecisionRecipe::*;
        for asked in PrecisionRecipe::ALL {
            runs_as(false, asked, false, asked);
            runs_as(false, asked, true, asked);
        }
        for asked in [Fp32, AmpBf16, AmpFp16] {
            runs_as(true, asked, false, asked);
            runs_as(true, asked, true, asked);
        }
        for asked in [Bf16, MixedBf16, MixedFp16] {
            runs_as(true, asked, false, Fp32);
            runs_as(true, asked, true, AmpBf16);
        }
    }

    /// Real CPU `Params4bit` of a [1000, 4096] weight (bitsandbytes 0.50.2, validation/PEFT.md):
    /// 2,048,000 packed bytes, 64,000 fp32 absmax (or uint8 + 250 fp32 second-level values).
    #[test]
    fn four_bit_storage_matches_bitsandbytes() {
        let n = 1000 * 4096;
        assert_eq!(four_bit_bytes(n, false), (2_048_000, 256_000 + 512));
        assert_eq!(
            four_bit_bytes(n, true),
            (2_048_000, 64_000 + 1024 + 512 + 512)
        );
    }
}
