//! Inference storage formats: quantized weights and KV-cache dtypes, in exact bytes per block.
//!
//! Each format knows its own blocks (how many bits every so many elements take, scales
//! included), so the rest of the crate never matches on format names. The formats apply in
//! architecture mode when the optimizer is `none` (inference); training ignores them.
//!
//! # Which tensors a format quantizes
//! The memory model has no per-tensor listing outside `arch/`, so a model's weights are split
//! from [`Architecture::parameter_count`] and its shape: the token embedding (`vocab x hidden`),
//! the output head (another `vocab x hidden` unless tied; the classifier of a vision model),
//! the norm weights (`(2 x layers + 1) x hidden`), and the transformer layers (the rest).
//!
//! * Transformers-style formats (fp8, int8, int4 GPTQ/AWQ, nf4) quantize the layers' linear
//!   weights; the embedding, the head and the norms stay in 16 bits, as `transformers` leaves
//!   them (`modules_to_not_convert`: `lm_head`; `nn.Embedding` is never converted).
//! * GGUF formats follow llama.cpp's default mix (`llama_tensor_get_type`, no importance
//!   matrix): norms stay F32; the output head is Q6_K (Q8_0 for Q8_0); the token embedding
//!   takes the base type (the head's type when tied); and the `_M` mixes raise `attn_v`,
//!   `ffn_down` and `attn_output` in some layers (see [`WeightFormat::Q4KM`] and the others).
//!   Approximations: the per-layer sizes of `attn_v` and `attn_output` come from the first
//!   layer's heads, `ffn_down` is `hidden x intermediate` per dense layer and a third of the
//!   MLP for mixtures of experts; llama.cpp's bumps for 70B models and 8-expert models
//!   (`attn_v`/`attn_k` to Q5_K/Q8_0) and its fallbacks for rows not a multiple of 256 are
//!   left out. Llama-3-8B comes within 1% of the published files (tested).

use crate::{Architecture, PrecisionRecipe};

/// One quantization block: `bits` bits (values, scales and zero points together) for every
/// `elements` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// Elements per block.
    pub elements: u64,
    /// Bits one block takes.
    pub bits: u64,
}

impl Block {
    /// A plain dtype of `bytes` bytes per element.
    #[must_use]
    pub const fn plain(bytes: u64) -> Self {
        Self {
            elements: 1,
            bits: bytes * 8,
        }
    }

    /// Bytes of `n` elements stored in whole blocks, rounded up to a byte; `None` on overflow.
    #[must_use]
    pub fn bytes(self, n: u64) -> Option<u64> {
        n.div_ceil(self.elements.max(1))
            .checked_mul(self.bits)
            .map(|bits| bits.div_ceil(8))
    }

    /// Bits per element, in thousandths (4.5 bits = 4500), for labels.
    #[must_use]
    pub const fn millibits_per_element(self) -> u64 {
        self.bits * 1000 / if self.elements == 0 { 1 } else { self.elements }
    }
}

/// A llama.cpp tensor type (`ggml_type`) with its exact block (`ggml_type_size` bytes per
/// `ggml_blck_size` elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufType {
    /// 32-bit float (norms).
    F32,
    /// 16-bit float.
    F16,
    /// 32 weights: 32 int8 + an fp16 scale = 34 bytes.
    Q8_0,
    /// 32 weights: 16 bytes of nibbles + an fp16 scale = 18 bytes.
    Q4_0,
    /// 256-weight super-block: 210 bytes (6.5625 bits per weight).
    Q6K,
    /// 256-weight super-block: 176 bytes (5.5 bits per weight).
    Q5K,
    /// 256-weight super-block: 144 bytes (4.5 bits per weight).
    Q4K,
    /// 256-weight super-block: 110 bytes (3.4375 bits per weight).
    Q3K,
    /// 256-weight super-block: 84 bytes (2.625 bits per weight).
    Q2K,
}

impl GgufType {
    /// Its block.
    #[must_use]
    pub const fn block(self) -> Block {
        let (elements, bytes) = match self {
            GgufType::F32 => (1, 4),
            GgufType::F16 => (1, 2),
            GgufType::Q8_0 => (32, 34),
            GgufType::Q4_0 => (32, 18),
            GgufType::Q6K => (256, 210),
            GgufType::Q5K => (256, 176),
            GgufType::Q4K => (256, 144),
            GgufType::Q3K => (256, 110),
            GgufType::Q2K => (256, 84),
        };
        Block {
            elements,
            bits: bytes * 8,
        }
    }
}

/// Which GGUF type a kind of tensor takes in a layer, by llama.cpp's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum LayerRule {
    /// Every layer.
    All(GgufType),
    /// `use_more_bits(i, n)` layers (the first and last eighth and every third between:
    /// about half) take `more`, the others `rest`.
    MoreBits { more: GgufType, rest: GgufType },
    /// The first `count` layers take `first`, the others `rest`.
    First {
        count: FirstLayers,
        first: GgufType,
        rest: GgufType,
    },
    /// `wide` when the model shares each key/value head among at least 4 query heads
    /// (`n_gqa() >= 4`), else `narrow`.
    ByGqa { wide: GgufType, narrow: GgufType },
}

/// How many first layers a [`LayerRule::First`] covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum FirstLayers {
    /// A fixed count.
    Exactly(u64),
    /// `n_layer / 16`.
    Sixteenth,
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`.
const fn use_more_bits(i: u64, n: u64) -> bool {
    // `i - n / 8` cannot underflow: the first test failed
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

impl LayerRule {
    /// Layers (of `n`) in the higher type, and the two types.
    fn split(self, n: u64, gqa: u64) -> (u64, GgufType, GgufType) {
        match self {
            LayerRule::All(t) => (0, t, t),
            LayerRule::MoreBits { more, rest } => (
                (0..n).filter(|&i| use_more_bits(i, n)).count() as u64,
                more,
                rest,
            ),
            LayerRule::First { count, first, rest } => {
                let k = match count {
                    FirstLayers::Exactly(k) => k.min(n),
                    FirstLayers::Sixteenth => n / 16,
                };
                (k, first, rest)
            }
            LayerRule::ByGqa { wide, narrow } => {
                let t = if gqa >= 4 { wide } else { narrow };
                (0, t, t)
            }
        }
    }
}

/// llama.cpp's default mix of one `LLAMA_FTYPE_MOSTLY_*` file type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct GgufMix {
    /// The file type's default type (every 2-D weight not listed below, token embedding
    /// included).
    base: GgufType,
    /// `attn_v` (one per layer).
    attn_v: LayerRule,
    /// `ffn_down` (one per layer, experts together).
    ffn_down: LayerRule,
    /// `attn_output`.
    attn_output: GgufType,
    /// `output` (the head; the token embedding when tied).
    output: GgufType,
}

/// How a format stores the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Scheme {
    /// The precision recipe's weights, as in training.
    Recipe,
    /// Every weight in one block type.
    Uniform(Block),
    /// Transformers-style: the layers' weights in `block`, plus `row_scale_bits` per row of
    /// `hidden` weights (per-output-channel scales); embedding, head and norms in 16 bits.
    Layers { block: Block, row_scale_bits: u64 },
    /// llama.cpp's mix.
    Gguf(GgufMix),
    /// The routed experts' weights in `block`, everything else in 16 bits (gpt-oss's MXFP4
    /// checkpoints quantize only the experts).
    Experts(Block),
}

/// How the weights are stored for inference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    /// As the precision recipe says (fp32 for the fp32 and AMP recipes, 16 bits for the
    /// others): what training would load.
    #[default]
    Recipe,
    /// bf16 or fp16: 2 bytes per weight, everything.
    Half,
    /// fp8 (e4m3): 1 byte per layer weight (per-tensor scales, negligible, left out).
    Fp8,
    /// int8 with an fp32 scale per output channel (bitsandbytes `LLM.int8()` keeps `SCB`
    /// per row): 1 byte per weight + 4 bytes per row of `hidden` weights.
    Int8,
    /// int4 with group-wise scales, group 128 (GPTQ / AWQ): per 128 weights, 64 bytes of
    /// nibbles + an fp16 scale + a 4-bit zero point (532 bits, 4.16 bits per weight). GPTQ's
    /// `g_idx` (one int32 per input channel) is left out.
    Int4Group128,
    /// bitsandbytes nf4: 4 bits per weight + an fp32 absmax per block of 64 (4.5 bits).
    Nf4,
    /// bitsandbytes nf4 with double quantization (QLoRA): the absmax of each 64 in 8 bits,
    /// plus an fp32 scale per 256 of those blocks (67,616 bits per 16,384 weights: 4.127 bits).
    Nf4Double,
    /// GGUF Q8_0: 34 bytes per 32 weights everywhere (the head too).
    Q8_0,
    /// GGUF Q6_K: 210 bytes per 256 weights everywhere.
    Q6K,
    /// GGUF Q5_K_M: Q5_K, with `attn_v` and `ffn_down` in Q6_K in about half the layers
    /// (`use_more_bits`) and the head in Q6_K.
    Q5KM,
    /// GGUF Q4_K_M: Q4_K, with `attn_v` and `ffn_down` in Q6_K in about half the layers
    /// (`use_more_bits`) and the head in Q6_K.
    Q4KM,
    /// GGUF Q3_K_M: Q3_K, with `attn_v` in Q5_K in the first 2 layers and Q4_K after,
    /// `ffn_down` in Q5_K in the first sixteenth and Q4_K after, `attn_output` in Q4_K and the
    /// head in Q6_K.
    Q3KM,
    /// GGUF Q2_K: Q2_K, with `attn_v` in Q4_K (Q3_K with fewer than 4 query heads per
    /// key/value head), `ffn_down` and `attn_output` in Q3_K and the head in Q6_K.
    Q2K,
    /// MXFP4 experts (gpt-oss): the routed experts in 4-bit e2m1 with an 8-bit e8m0 scale
    /// per 32 (17 bytes per 32 weights), everything else in bf16.
    Mxfp4,
}

impl WeightFormat {
    /// Every format, in the order the page lists them.
    pub const ALL: [WeightFormat; 14] = [
        WeightFormat::Recipe,
        WeightFormat::Half,
        WeightFormat::Fp8,
        WeightFormat::Int8,
        WeightFormat::Int4Group128,
        WeightFormat::Nf4,
        WeightFormat::Nf4Double,
        WeightFormat::Q8_0,
        WeightFormat::Q6K,
        WeightFormat::Q5KM,
        WeightFormat::Q4KM,
        WeightFormat::Q3KM,
        WeightFormat::Q2K,
        WeightFormat::Mxfp4,
    ];

    /// How the format stores weights: the one table of the formats' data.
    const fn scheme(self) -> Scheme {
        use GgufType as T;
        /// A K-quant mix: the head in Q6_K.
        const fn k_mix(
            base: GgufType,
            attn_v: LayerRule,
            ffn_down: LayerRule,
            attn_output: GgufType,
        ) -> Scheme {
            Scheme::Gguf(GgufMix {
                base,
                attn_v,
                ffn_down,
                attn_output,
                output: GgufType::Q6K,
            })
        }
        /// Q6_K in the `use_more_bits` layers, `rest` in the others.
        const fn more_q6(rest: GgufType) -> LayerRule {
            LayerRule::MoreBits {
                more: GgufType::Q6K,
                rest,
            }
        }
        match self {
            WeightFormat::Recipe => Scheme::Recipe,
            WeightFormat::Half => Scheme::Uniform(Block::plain(2)),
            WeightFormat::Fp8 => Scheme::Layers {
                block: Block::plain(1),
                row_scale_bits: 0,
            },
            WeightFormat::Int8 => Scheme::Layers {
                block: Block::plain(1),
                row_scale_bits: 32,
            },
            WeightFormat::Int4Group128 => Scheme::Layers {
                block: Block {
                    elements: 128,
                    bits: 128 * 4 + 16 + 4,
                },
                row_scale_bits: 0,
            },
            WeightFormat::Nf4 => Scheme::Layers {
                block: Block {
                    elements: 64,
                    bits: 64 * 4 + 32,
                },
                row_scale_bits: 0,
            },
            WeightFormat::Nf4Double => Scheme::Layers {
                block: Block {
                    elements: 256 * 64,
                    bits: 256 * 64 * 4 + 256 * 8 + 32,
                },
                row_scale_bits: 0,
            },
            WeightFormat::Q8_0 => Scheme::Gguf(GgufMix {
                base: T::Q8_0,
                attn_v: LayerRule::All(T::Q8_0),
                ffn_down: LayerRule::All(T::Q8_0),
                attn_output: T::Q8_0,
                output: T::Q8_0,
            }),
            WeightFormat::Q6K => k_mix(
                T::Q6K,
                LayerRule::All(T::Q6K),
                LayerRule::All(T::Q6K),
                T::Q6K,
            ),
            WeightFormat::Q5KM => k_mix(T::Q5K, more_q6(T::Q5K), more_q6(T::Q5K), T::Q5K),
            WeightFormat::Q4KM => k_mix(T::Q4K, more_q6(T::Q4K), more_q6(T::Q4K), T::Q4K),
            WeightFormat::Q3KM => k_mix(
                T::Q3K,
                LayerRule::First {
                    count: FirstLayers::Exactly(2),
                    first: T::Q5K,
                    rest: T::Q4K,
                },
                LayerRule::First {
                    count: FirstLayers::Sixteenth,
                    first: T::Q5K,
                    rest: T::Q4K,
                },
                T::Q4K,
            ),
            WeightFormat::Q2K => k_mix(
                T::Q2K,
                LayerRule::ByGqa {
                    wide: T::Q4K,
                    narrow: T::Q3K,
                },
                LayerRule::All(T::Q3K),
                T::Q3K,
            ),
            WeightFormat::Mxfp4 => Scheme::Experts(Block {
                elements: 32,
                bits: 32 * 4 + 8,
            }),
        }
    }

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            WeightFormat::Recipe => "recipe",
            WeightFormat::Half => "bf16",
            WeightFormat::Fp8 => "fp8",
            WeightFormat::Int8 => "int8",
            WeightFormat::Int4Group128 => "int4-g128",
            WeightFormat::Nf4 => "nf4",
            WeightFormat::Nf4Double => "nf4-dq",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Q6K => "q6_k",
            WeightFormat::Q5KM => "q5_k_m",
            WeightFormat::Q4KM => "q4_k_m",
            WeightFormat::Q3KM => "q3_k_m",
            WeightFormat::Q2K => "q2_k",
            WeightFormat::Mxfp4 => "mxfp4",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            WeightFormat::Recipe => "As the precision recipe (not quantized)",
            WeightFormat::Half => "bf16 / fp16 (2 bytes)",
            WeightFormat::Fp8 => "fp8 (1 byte)",
            WeightFormat::Int8 => "int8, per-channel scales (bitsandbytes LLM.int8)",
            WeightFormat::Int4Group128 => "int4, group 128 (GPTQ / AWQ)",
            WeightFormat::Nf4 => "nf4 (bitsandbytes 4-bit)",
            WeightFormat::Nf4Double => "nf4 + double quantization (QLoRA)",
            WeightFormat::Q8_0 => "GGUF Q8_0",
            WeightFormat::Q6K => "GGUF Q6_K",
            WeightFormat::Q5KM => "GGUF Q5_K_M",
            WeightFormat::Q4KM => "GGUF Q4_K_M",
            WeightFormat::Q3KM => "GGUF Q3_K_M",
            WeightFormat::Q2K => "GGUF Q2_K",
            WeightFormat::Mxfp4 => "MXFP4 experts (gpt-oss)",
        }
    }

    /// The format whose [`key`](Self::key) is `key` (`fp16` is read as bf16 / fp16, and
    /// GGUF names in capitals too).
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        if key == "fp16" {
            return Some(WeightFormat::Half);
        }
        Self::ALL
            .into_iter()
            .find(|f| f.key().eq_ignore_ascii_case(key))
    }

    /// Whether the weights are a llama.cpp GGUF file.
    #[must_use]
    pub const fn is_gguf(self) -> bool {
        matches!(self.scheme(), Scheme::Gguf(_))
    }

    /// How vLLM holds a checkpoint in this format: the block of the linears' weights and the
    /// block of the routed experts' (embeddings, head, norms and routers stay in 16 bits;
    /// int8's per-row scales, a tenth of a percent, are left out); `None` for a llama.cpp
    /// file. The recipe's format is a 16-bit checkpoint: vLLM serves fp32 ones in 16 bits.
    #[must_use]
    pub(crate) const fn vllm_blocks(self) -> Option<(Block, Block)> {
        match self.scheme() {
            Scheme::Recipe => Some((Block::plain(2), Block::plain(2))),
            Scheme::Uniform(b) | Scheme::Layers { block: b, .. } => Some((b, b)),
            Scheme::Experts(b) => Some((Block::plain(2), b)),
            Scheme::Gguf(_) => None,
        }
    }

    /// Bytes of `arch`'s weights in this format, or `None` for [`WeightFormat::Recipe`]
    /// (the recipe's bytes, counted tensor by tensor by the memory model).
    #[must_use]
    pub fn weight_bytes(self, arch: &Architecture) -> Option<u64> {
        self.shape_bytes(&WeightShape::of(arch))
    }

    /// [`weight_bytes`](Self::weight_bytes) of a model of `shape`.
    pub(crate) fn shape_bytes(self, shape: &WeightShape) -> Option<u64> {
        let bytes = |block: Block, n: u64| block.bytes(n).unwrap_or(u64::MAX);
        let half = Block::plain(2);
        let total = match self.scheme() {
            Scheme::Recipe => return None,
            Scheme::Uniform(block) => bytes(block, shape.total),
            Scheme::Layers {
                block,
                row_scale_bits,
            } => {
                let rows = shape.layers / shape.hidden.max(1);
                let scales = Block {
                    elements: 1,
                    bits: row_scale_bits,
                };
                bytes(half, shape.embedding)
                    .saturating_add(bytes(half, shape.head))
                    .saturating_add(bytes(half, shape.norms))
                    .saturating_add(bytes(block, shape.layers))
                    .saturating_add(bytes(scales, rows))
            }
            Scheme::Gguf(mix) => shape.gguf_bytes(mix),
            Scheme::Experts(block) => {
                bytes(half, shape.total - shape.experts).saturating_add(bytes(block, shape.experts))
            }
        };
        Some(total)
    }

    /// The bytes of the weights for `arch` stored this way, or as `recipe` stores them when
    /// this is [`WeightFormat::Recipe`] (2 or 4 bytes per parameter, no rounding), for
    /// comparing formats.
    #[must_use]
    pub fn approximate_bytes(self, arch: &Architecture, recipe: PrecisionRecipe) -> u64 {
        self.weight_bytes(arch)
            .unwrap_or_else(|| arch.parameter_count().saturating_mul(recipe.weight_bytes()))
    }
}

/// A model's weights split into the parts formats treat differently (elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WeightShape {
    total: u64,
    hidden: u64,
    n_layers: u64,
    /// The token embedding (0 for vision models).
    embedding: u64,
    /// The untied output head (the classifier of a vision model).
    head: u64,
    /// Norm weights: two per layer and a final one.
    norms: u64,
    /// Everything else: the layers' matrices.
    layers: u64,
    /// `attn_v` of one layer.
    attn_v: u64,
    /// `attn_output` of one layer.
    attn_output: u64,
    /// `ffn_down` of one layer.
    ffn_down: u64,
    /// Query heads per key/value head.
    gqa: u64,
    /// The routed experts' weights (0 for a dense model).
    experts: u64,
}

impl WeightShape {
    pub(crate) fn of(arch: &Architecture) -> Self {
        Self::counted(arch, arch.parameter_count())
    }

    /// The shape of `arch`, whose [`Architecture::parameter_count`] is `total`.
    pub(crate) fn counted(arch: &Architecture, total: u64) -> Self {
        let hidden = arch.hidden_size();
        let n_layers = arch.num_layers();
        let table = arch.vocab_size().saturating_mul(hidden);
        let (embedding, head) = if arch.is_vision() {
            (0, table)
        } else if arch.tie_word_embeddings() {
            (table, 0)
        } else {
            (table, table)
        };
        let left = total.saturating_sub(embedding).saturating_sub(head);
        let norms = n_layers
            .saturating_mul(2)
            .saturating_add(1)
            .saturating_mul(hidden)
            .min(left);
        let layers = left - norms;
        let per_layer = layers / n_layers.max(1);
        let heads = arch.num_heads();
        let kv_heads = arch.num_kv_heads();
        let head_dim = arch.head_dim();
        let attn_v = hidden
            .saturating_mul(kv_heads)
            .saturating_mul(head_dim)
            .min(per_layer);
        let attn_output = hidden
            .saturating_mul(heads)
            .saturating_mul(head_dim)
            .min(per_layer - attn_v);
        let attention = hidden
            .saturating_mul(heads.saturating_add(kv_heads))
            .saturating_mul(head_dim)
            .saturating_add(attn_v)
            .saturating_add(attn_output)
            .min(per_layer);
        let mlp = per_layer - attention;
        let ffn_down = if arch.is_moe() {
            mlp / 3
        } else {
            hidden.saturating_mul(arch.intermediate_size()).min(mlp)
        };
        Self {
            total,
            hidden,
            n_layers,
            embedding,
            head,
            norms,
            layers,
            attn_v,
            attn_output,
            ffn_down,
            gqa: heads / kv_heads.max(1),
            experts: arch.routed_expert_parameter_count().min(total),
        }
    }

    /// Bytes of the GGUF file's tensors under `mix`.
    fn gguf_bytes(&self, mix: GgufMix) -> u64 {
        let n = self.n_layers;
        let bytes = |t: GgufType, elements: u64| t.block().bytes(elements).unwrap_or(u64::MAX);
        // `count` layers of one `per_layer`-sized tensor in `more`, the rest in `rest`
        let split = |rule: LayerRule, per_layer: u64| {
            let (count, more, rest) = rule.split(n, self.gqa);
            bytes(more, per_layer)
                .saturating_mul(count)
                .saturating_add(bytes(rest, per_layer).saturating_mul(n - count))
        };
        // tied: the token embedding is quantized as the output
        let embedding = if self.head == 0 { mix.output } else { mix.base };
        let listed = self
            .attn_v
            .saturating_add(self.attn_output)
            .saturating_add(self.ffn_down)
            .saturating_mul(n);
        let rest = self.layers.saturating_sub(listed);
        bytes(embedding, self.embedding)
            .saturating_add(bytes(mix.output, self.head))
            .saturating_add(bytes(GgufType::F32, self.norms))
            .saturating_add(split(mix.attn_v, self.attn_v))
            .saturating_add(split(mix.ffn_down, self.ffn_down))
            .saturating_add(bytes(mix.attn_output, self.attn_output).saturating_mul(n))
            .saturating_add(bytes(mix.base, rest))
    }
}

/// The dtype of the KV cache in generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    /// The activations' dtype (2 bytes; 4 for the fp32 recipe), as HF transformers keeps it.
    #[default]
    Model,
    /// fp8 (e4m3 / e5m2), 1 byte per element (vLLM `kv_cache_dtype="fp8"`).
    Fp8,
    /// llama.cpp `q8_0`: 34 bytes per 32 elements.
    Q8_0,
    /// llama.cpp `q4_0`: 18 bytes per 32 elements.
    Q4_0,
}

impl KvDtype {
    /// Every dtype, in the order the page lists them.
    pub const ALL: [KvDtype; 4] = [KvDtype::Model, KvDtype::Fp8, KvDtype::Q8_0, KvDtype::Q4_0];

    /// The block of one cache element, when the model's activations take `model_bytes`.
    #[must_use]
    pub const fn block(self, model_bytes: u64) -> Block {
        match self {
            KvDtype::Model => Block::plain(model_bytes),
            KvDtype::Fp8 => Block::plain(1),
            KvDtype::Q8_0 => GgufType::Q8_0.block(),
            KvDtype::Q4_0 => GgufType::Q4_0.block(),
        }
    }

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            KvDtype::Model => "model",
            KvDtype::Fp8 => "fp8",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            KvDtype::Model => "The model's dtype",
            KvDtype::Fp8 => "fp8 (1 byte)",
            KvDtype::Q8_0 => "q8_0 (llama.cpp, 8.5 bits)",
            KvDtype::Q4_0 => "q4_0 (llama.cpp, 4.5 bits)",
        }
    }

    /// The dtype whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.key().eq_ignore_ascii_case(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Preset;

    fn arch(key: &str) -> Architecture {
        Preset::from_key(key).unwrap().architecture().unwrap()
    }

    #[track_caller]
    fn block(t: GgufType, elements: u64, bytes: u64) {
        assert_eq!(
            t.block(),
            Block {
                elements,
                bits: bytes * 8
            },
            "{t:?}"
        );
    }

    #[test]
    fn gguf_blocks_are_llama_cpp_s() {
        block(GgufType::Q8_0, 32, 34);
        block(GgufType::Q4_0, 32, 18);
        block(GgufType::Q6K, 256, 210);
        block(GgufType::Q5K, 256, 176);
        block(GgufType::Q4K, 256, 144);
        block(GgufType::Q3K, 256, 110);
        block(GgufType::Q2K, 256, 84);
    }

    #[test]
    fn blocks_round_up() {
        let q8 = GgufType::Q8_0.block();
        assert_eq!(q8.bytes(32), Some(34));
        assert_eq!(q8.bytes(33), Some(68));
        assert_eq!(q8.bytes(0), Some(0));
        assert_eq!(Block::plain(2).bytes(3), Some(6));
        assert_eq!(q8.bytes(u64::MAX), None);
        assert_eq!(WeightFormat::Nf4.scheme_bits(), 4500);
        assert_eq!(WeightFormat::Nf4Double.scheme_bits(), 4126);
        assert_eq!(WeightFormat::Int4Group128.scheme_bits(), 4156);
    }

    impl WeightFormat {
        fn scheme_bits(self) -> u64 {
            match self.scheme() {
                Scheme::Layers { block, .. } | Scheme::Uniform(block) => {
                    block.millibits_per_element()
                }
                _ => 0,
            }
        }
    }

    #[test]
    fn use_more_bits_is_about_half() {
        // Llama-3-8B: 32 layers, 4 + 4 at the ends and 8 of the 24 between.
        assert_eq!((0..32).filter(|&i| use_more_bits(i, 32)).count(), 16);
        assert!(use_more_bits(0, 32) && use_more_bits(31, 32) && use_more_bits(6, 32));
        assert!(!use_more_bits(4, 32) && !use_more_bits(5, 32));
    }

    /// Published GGUF files of Meta-Llama-3-8B-Instruct (the file list of
    /// `bartowski/Meta-Llama-3-8B-Instruct-GGUF`, sizes as Hugging Face prints them, in GB),
    /// each within 1% (the files hold metadata and a tokenizer too).
    #[track_caller]
    fn llama3_8b(format: WeightFormat, published_gb: f64) {
        let bytes = format.weight_bytes(&arch("llama3-8b")).unwrap() as f64;
        let ratio = bytes / (published_gb * 1e9);
        assert!(
            (0.99..=1.01).contains(&ratio),
            "{format:?}: {:.3} GB vs {published_gb} GB",
            bytes / 1e9
        );
    }

    #[test]
    fn gguf_mixes_match_published_files() {
        llama3_8b(WeightFormat::Q8_0, 8.54);
        llama3_8b(WeightFormat::Q6K, 6.60);
        llama3_8b(WeightFormat::Q5KM, 5.73);
        llama3_8b(WeightFormat::Q4KM, 4.92);
        llama3_8b(WeightFormat::Q3KM, 4.02);
        llama3_8b(WeightFormat::Q2K, 3.18);
    }

    #[test]
    fn transformers_formats_keep_embeddings_in_16_bits() {
        let a = arch("llama3-8b");
        let p = a.parameter_count();
        let table = a.vocab_size() * a.hidden_size();
        assert_eq!(WeightFormat::Half.weight_bytes(&a), Some(2 * p));
        assert_eq!(WeightFormat::Recipe.weight_bytes(&a), None);
        let fp8 = WeightFormat::Fp8.weight_bytes(&a).unwrap();
        // embedding and head (untied) in 16 bits, the rest in 1 byte (norms: 16 bits, tiny)
        assert!(
            fp8 > p + 2 * table && fp8 < p + 2 * table + 1_000_000,
            "{fp8}"
        );
        let int8 = WeightFormat::Int8.weight_bytes(&a).unwrap();
        assert!(
            int8 > fp8 && int8 - fp8 < (p / 4096) * 4 + 1,
            "{int8} vs {fp8}"
        );
        // 4-bit formats: ordered by their bits per weight
        let bytes = |f: WeightFormat| f.weight_bytes(&a).unwrap();
        assert!(bytes(WeightFormat::Nf4) > bytes(WeightFormat::Int4Group128));
        assert!(bytes(WeightFormat::Int4Group128) > bytes(WeightFormat::Nf4Double));
        // a tied model counts its table once
        let tied = arch("llama3.2-1b");
        assert!(tied.tie_word_embeddings());
        let t = tied.vocab_size() * tied.hidden_size();
        let q = WeightFormat::Fp8.weight_bytes(&tied).unwrap();
        assert!(q > tied.parameter_count() + t && q < tied.parameter_count() + t + 1_000_000);
    }

    #[test]
    fn every_format_on_every_preset_is_smaller_than_fp32() {
        for preset in Preset::ALL {
            let a = preset.architecture().unwrap();
            for f in WeightFormat::ALL {
                let bytes = f.approximate_bytes(&a, PrecisionRecipe::Fp32);
                assert!(bytes <= 4 * a.parameter_count(), "{f:?} {}", preset.key());
                assert!(bytes > a.parameter_count() / 4, "{f:?} {}", preset.key());
            }
        }
    }

    #[test]
    fn keys_round_trip() {
        for f in WeightFormat::ALL {
            assert_eq!(WeightFormat::from_key(f.key()), Some(f));
        }
        assert_eq!(WeightFormat::from_key("Q4_K_M"), Some(WeightFormat::Q4KM));
        assert_eq!(WeightFormat::from_key("fp16"), Some(WeightFormat::Half));
        for k in KvDtype::ALL {
            assert_eq!(KvDtype::from_key(k.key()), Some(k));
        }
        assert_eq!(KvDtype::from_key("int3"), None);
    }

    #[test]
    fn kv_blocks() {
        assert_eq!(KvDtype::Model.block(2).bytes(64), Some(128));
        assert_eq!(KvDtype::Model.block(4).bytes(64), Some(256));
        assert_eq!(KvDtype::Fp8.block(2).bytes(64), Some(64));
        assert_eq!(KvDtype::Q8_0.block(2).bytes(64), Some(68));
        assert_eq!(KvDtype::Q4_0.block(2).bytes(64), Some(36));
    }
}
