//! Published model configurations, usable without a `config.json`.

use super::config::{Architecture, ModelFamily};

/// A well-known model with its published configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// GPT-2 small (124M).
    Gpt2Small,
    /// GPT-2 medium (355M).
    Gpt2Medium,
    /// GPT-2 large (774M).
    Gpt2Large,
    /// BERT base, uncased, masked-LM head.
    BertBase,
    /// Llama 3.2 1B.
    Llama32_1B,
    /// Llama 3 8B.
    Llama3_8B,
    /// Llama 3 70B.
    Llama3_70B,
    /// Mistral 7B v0.1.
    Mistral7B,
    /// Qwen2.5 0.5B.
    Qwen25_0_5B,
    /// Qwen2.5 7B.
    Qwen25_7B,
    /// Gemma 2B.
    Gemma2B,
    /// Phi-3 mini 4k.
    Phi3Mini,
    /// ViT-B/16 (torchvision `vit_b_16`, 224 px).
    VitB16,
}

struct Dims {
    family: ModelFamily,
    layers: u64,
    hidden: u64,
    heads: u64,
    kv: u64,
    head_dim: u64,
    inter: u64,
    vocab: u64,
    tie: bool,
}

impl Preset {
    /// Every preset, in the order the page lists them.
    pub const ALL: [Preset; 13] = [
        Preset::Gpt2Small,
        Preset::Gpt2Medium,
        Preset::Gpt2Large,
        Preset::BertBase,
        Preset::Llama32_1B,
        Preset::Llama3_8B,
        Preset::Llama3_70B,
        Preset::Mistral7B,
        Preset::Qwen25_0_5B,
        Preset::Qwen25_7B,
        Preset::Gemma2B,
        Preset::Phi3Mini,
        Preset::VitB16,
    ];

    /// Short stable URL id.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Preset::Gpt2Small => "gpt2",
            Preset::Gpt2Medium => "gpt2-medium",
            Preset::Gpt2Large => "gpt2-large",
            Preset::BertBase => "bert-base",
            Preset::Llama32_1B => "llama3.2-1b",
            Preset::Llama3_8B => "llama3-8b",
            Preset::Llama3_70B => "llama3-70b",
            Preset::Mistral7B => "mistral-7b",
            Preset::Qwen25_0_5B => "qwen2.5-0.5b",
            Preset::Qwen25_7B => "qwen2.5-7b",
            Preset::Gemma2B => "gemma-2b",
            Preset::Phi3Mini => "phi3-mini",
            Preset::VitB16 => "vit-b16",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Preset::Gpt2Small => "GPT-2 (124M)",
            Preset::Gpt2Medium => "GPT-2 medium (355M)",
            Preset::Gpt2Large => "GPT-2 large (774M)",
            Preset::BertBase => "BERT base (110M)",
            Preset::Llama32_1B => "Llama 3.2 1B",
            Preset::Llama3_8B => "Llama 3 8B",
            Preset::Llama3_70B => "Llama 3 70B",
            Preset::Mistral7B => "Mistral 7B v0.1",
            Preset::Qwen25_0_5B => "Qwen2.5 0.5B",
            Preset::Qwen25_7B => "Qwen2.5 7B",
            Preset::Gemma2B => "Gemma 2B",
            Preset::Phi3Mini => "Phi-3 mini 4k",
            Preset::VitB16 => "ViT-B/16 (224 px)",
        }
    }

    /// The preset whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.key() == key)
    }

    /// A typical sequence length (for ViT: the image side, 224).
    #[must_use]
    pub const fn default_seq_len(self) -> u64 {
        match self {
            Preset::Gpt2Small | Preset::Gpt2Medium | Preset::Gpt2Large => 1024,
            Preset::BertBase => 512,
            Preset::VitB16 => 224,
            Preset::Phi3Mini => 4096,
            _ => 2048,
        }
    }

    fn dims(self) -> Dims {
        use ModelFamily as F;
        let d = |family, layers, hidden, heads, kv, head_dim, inter, vocab, tie| Dims {
            family,
            layers,
            hidden,
            heads,
            kv,
            head_dim,
            inter,
            vocab,
            tie,
        };
        match self {
            Preset::Gpt2Small => d(F::Gpt2, 12, 768, 12, 12, 64, 3072, 50257, true),
            Preset::Gpt2Medium => d(F::Gpt2, 24, 1024, 16, 16, 64, 4096, 50257, true),
            Preset::Gpt2Large => d(F::Gpt2, 36, 1280, 20, 20, 64, 5120, 50257, true),
            Preset::BertBase => d(F::Bert, 12, 768, 12, 12, 64, 3072, 30522, true),
            Preset::Llama32_1B => d(F::Llama, 16, 2048, 32, 8, 64, 8192, 128256, true),
            Preset::Llama3_8B => d(F::Llama, 32, 4096, 32, 8, 128, 14336, 128256, false),
            Preset::Llama3_70B => d(F::Llama, 80, 8192, 64, 8, 128, 28672, 128256, false),
            Preset::Mistral7B => d(F::Mistral, 32, 4096, 32, 8, 128, 14336, 32000, false),
            Preset::Qwen25_0_5B => d(F::Qwen2, 24, 896, 14, 2, 64, 4864, 151936, true),
            Preset::Qwen25_7B => d(F::Qwen2, 28, 3584, 28, 4, 128, 18944, 152064, false),
            Preset::Gemma2B => d(F::Gemma, 18, 2048, 8, 1, 256, 16384, 256000, true),
            Preset::Phi3Mini => d(F::Phi3, 32, 3072, 32, 32, 96, 8192, 32064, false),
            Preset::VitB16 => d(F::Vit, 12, 768, 12, 12, 64, 3072, 1000, false),
        }
    }

    /// The published architecture.
    #[must_use]
    pub fn architecture(self) -> Architecture {
        let d = self.dims();
        let f = d.family;
        Architecture {
            family: f,
            layers: d.layers,
            hidden: d.hidden,
            heads: d.heads,
            kv_heads: d.kv,
            head_dim: d.head_dim,
            intermediate: d.inter,
            vocab: d.vocab,
            max_positions: match f {
                ModelFamily::Gpt2 => 1024,
                ModelFamily::Bert => 512,
                _ => 0,
            },
            tie_embeddings: d.tie,
            qkv_bias: matches!(
                f,
                ModelFamily::Gpt2 | ModelFamily::Bert | ModelFamily::Vit | ModelFamily::Qwen2
            ),
            o_bias: matches!(f, ModelFamily::Gpt2 | ModelFamily::Bert | ModelFamily::Vit),
            mlp_bias: matches!(f, ModelFamily::Gpt2 | ModelFamily::Bert | ModelFamily::Vit),
            type_vocab: if f == ModelFamily::Bert { 2 } else { 0 },
            attn_dropout: matches!(f, ModelFamily::Gpt2 | ModelFamily::Bert),
            hidden_dropout: matches!(f, ModelFamily::Gpt2 | ModelFamily::Bert),
            python_gelu: f == ModelFamily::Gpt2,
            image_size: if f == ModelFamily::Vit { 224 } else { 0 },
            patch_size: if f == ModelFamily::Vit { 16 } else { 0 },
            sliding_window: match self {
                Preset::Mistral7B => 4096,
                Preset::Phi3Mini => 2047,
                _ => 0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::parse_hf_config;

    #[test]
    fn presets_round_trip_and_keys_are_unique() {
        for p in Preset::ALL {
            assert_eq!(Preset::from_key(p.key()), Some(p));
            let a = p.architecture();
            assert_eq!(parse_hf_config(&a.to_config_json()), Ok(a.clone()), "{p:?}");
        }
    }

    #[track_caller]
    fn params(p: Preset, expected: u64) {
        assert_eq!(p.architecture().parameter_count(), expected, "{p:?}");
    }

    #[test]
    fn preset_counts_match_pytorch() {
        params(Preset::Gpt2Small, 124_439_808);
        params(Preset::Gpt2Medium, 354_823_168);
        params(Preset::Llama32_1B, 1_235_814_400);
        params(Preset::Llama3_8B, 8_030_261_248);
        params(Preset::BertBase, 109_514_298);
        params(Preset::VitB16, 86_567_656);
        params(Preset::Mistral7B, 7_241_732_096);
        params(Preset::Qwen25_0_5B, 494_032_768);
    }
}
