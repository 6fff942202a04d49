//! The model families the readers know, by their `model_type`.

/// A supported model family (the HF `model_type`, or torchvision's ViT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelFamily {
    /// GPT-2 (`GPT2LMHeadModel`).
    Gpt2,
    /// OPT (`OPTForCausalLM`: learned positions, ReLU MLP, pre- or post-norm, optional
    /// `project_in` / `project_out`).
    Opt,
    /// Llama 2/3/3.1/3.2/3.3 (`LlamaForCausalLM`, any `rope_scaling`).
    Llama,
    /// Mistral (`MistralForCausalLM`, sliding window).
    Mistral,
    /// Qwen2 / Qwen2.5 (q/k/v biases, optional sliding window from `max_window_layers`).
    Qwen2,
    /// Qwen3 (q/k RMSNorm per head).
    Qwen3,
    /// Gemma (`GemmaForCausalLM`).
    Gemma,
    /// Gemma 2 (pre- and post-norms, soft-capping, interleaved sliding window).
    Gemma2,
    /// Gemma 3 language model (`gemma3_text`; a `gemma3` config is read through `text_config`).
    Gemma3,
    /// OLMo 2 (norms after the sub-blocks, q/k norm over the whole projection).
    Olmo2,
    /// EXAONE 4.0 (norms after each sub-block as OLMo 2, q/k RMSNorm per head, three
    /// sliding-window layers to one global layer without rotary embedding).
    Exaone4,
    /// SmolLM3 (layers without rotary embedding).
    SmolLm3,
    /// Granite (embedding, residual, attention and logits multipliers).
    Granite,
    /// Phi-3 and Phi-4-mini (fused projections, partial rotary).
    Phi3,
    /// Mixtral (mixture of experts on every layer).
    Mixtral,
    /// Qwen2-MoE / Qwen1.5-MoE (routed experts plus a gated shared expert).
    Qwen2Moe,
    /// Qwen3-MoE (routed experts, q/k norms).
    Qwen3Moe,
    /// DeepSeek-V3 and Moonlight (multi-head latent attention, sigmoid-routed experts with
    /// shared experts, dense first layers).
    DeepseekV3,
    /// gpt-oss (attention sinks, alternating sliding and full layers, experts with biases).
    GptOss,
    /// BERT (`BertForMaskedLM`).
    Bert,
    /// RoBERTa (`RobertaForMaskedLM`).
    Roberta,
    /// XLM-RoBERTa (`XLMRobertaForMaskedLM`).
    XlmRoberta,
    /// Vision Transformer (torchvision `vit_b_16` style).
    Vit,
}

impl ModelFamily {
    /// Every family, in the order the page groups them.
    pub const ALL: [ModelFamily; 23] = [
        ModelFamily::Llama,
        ModelFamily::Qwen3,
        ModelFamily::Qwen2,
        ModelFamily::Gemma3,
        ModelFamily::Gemma2,
        ModelFamily::Gemma,
        ModelFamily::Mistral,
        ModelFamily::Phi3,
        ModelFamily::Olmo2,
        ModelFamily::Exaone4,
        ModelFamily::SmolLm3,
        ModelFamily::Granite,
        ModelFamily::Mixtral,
        ModelFamily::Qwen3Moe,
        ModelFamily::Qwen2Moe,
        ModelFamily::DeepseekV3,
        ModelFamily::GptOss,
        ModelFamily::Gpt2,
        ModelFamily::Opt,
        ModelFamily::Bert,
        ModelFamily::Roberta,
        ModelFamily::XlmRoberta,
        ModelFamily::Vit,
    ];

    /// The HF `model_type` string.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            ModelFamily::Gpt2 => "gpt2",
            ModelFamily::Opt => "opt",
            ModelFamily::Llama => "llama",
            ModelFamily::Mistral => "mistral",
            ModelFamily::Qwen2 => "qwen2",
            ModelFamily::Qwen3 => "qwen3",
            ModelFamily::Gemma => "gemma",
            ModelFamily::Gemma2 => "gemma2",
            ModelFamily::Gemma3 => "gemma3_text",
            ModelFamily::Olmo2 => "olmo2",
            ModelFamily::Exaone4 => "exaone4",
            ModelFamily::SmolLm3 => "smollm3",
            ModelFamily::Granite => "granite",
            ModelFamily::Phi3 => "phi3",
            ModelFamily::Mixtral => "mixtral",
            ModelFamily::Qwen2Moe => "qwen2_moe",
            ModelFamily::Qwen3Moe => "qwen3_moe",
            ModelFamily::DeepseekV3 => "deepseek_v3",
            ModelFamily::GptOss => "gpt_oss",
            ModelFamily::Bert => "bert",
            ModelFamily::Roberta => "roberta",
            ModelFamily::XlmRoberta => "xlm-roberta",
            ModelFamily::Vit => "vit",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            ModelFamily::Gpt2 => "GPT-2",
            ModelFamily::Opt => "OPT",
            ModelFamily::Llama => "Llama",
            ModelFamily::Mistral => "Mistral",
            ModelFamily::Qwen2 => "Qwen2",
            ModelFamily::Qwen3 => "Qwen3",
            ModelFamily::Gemma => "Gemma",
            ModelFamily::Gemma2 => "Gemma 2",
            ModelFamily::Gemma3 => "Gemma 3",
            ModelFamily::Olmo2 => "OLMo 2",
            ModelFamily::Exaone4 => "EXAONE 4",
            ModelFamily::SmolLm3 => "SmolLM3",
            ModelFamily::Granite => "Granite",
            ModelFamily::Phi3 => "Phi-3 / Phi-4-mini",
            ModelFamily::Mixtral => "Mixtral (MoE)",
            ModelFamily::Qwen2Moe => "Qwen2-MoE",
            ModelFamily::Qwen3Moe => "Qwen3-MoE",
            ModelFamily::DeepseekV3 => "DeepSeek-V3 (MLA, MoE)",
            ModelFamily::GptOss => "gpt-oss (MoE)",
            ModelFamily::Bert => "BERT",
            ModelFamily::Roberta => "RoBERTa",
            ModelFamily::XlmRoberta => "XLM-RoBERTa",
            ModelFamily::Vit => "ViT",
        }
    }

    /// The family whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.key() == key)
    }

    /// The `model_type` values accepted, for messages and `--help`.
    #[must_use]
    pub fn supported_model_types() -> String {
        let mut v: Vec<&str> = Self::ALL.iter().map(|f| f.key()).collect();
        v.insert(
            v.iter()
                .position(|k| *k == "gemma3_text")
                .map_or(0, |i| i + 1),
            "gemma3",
        );
        v.insert(
            v.iter().position(|k| *k == "qwen2").map_or(0, |i| i + 1),
            "qwen2_5",
        );
        // (read for serving with vLLM only)
        v.insert(
            v.iter()
                .position(|k| *k == "qwen2_moe")
                .map_or(0, |i| i + 1),
            "qwen3_next",
        );
        // the vision-language wrappers, read around their language model
        #[cfg(feature = "vision")]
        v.extend([
            "qwen2_5_vl",
            "qwen3_vl",
            "llava",
            "llava_next",
            "idefics3",
            "smolvlm",
            "mllama",
        ]);
        v.join(", ")
    }
}
