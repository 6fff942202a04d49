//! Published models, usable without a `config.json`: each preset is a config read by the same
//! family reader as a pasted one (the files in `presets/` hold the fields the readers use).

use super::config::Architecture;
use super::error::ConfigError;
use super::families::parse_hf_config;
use super::family::ModelFamily;

/// A well-known model with its published configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Preset(usize);

struct PresetSpec {
    key: &'static str,
    label: &'static str,
    family: ModelFamily,
    default_seq_len: u64,
    config: &'static str,
}

macro_rules! presets {
    ($(($key:literal, $label:literal, $family:ident, $seq:literal)),* $(,)?) => {
        const PRESETS: &[PresetSpec] = &[$(PresetSpec {
            key: $key,
            label: $label,
            family: ModelFamily::$family,
            default_seq_len: $seq,
            config: include_str!(concat!("presets/", $key, ".json")),
        }),*];
    };
}

// Grouped by family, in the order the page lists them. Keys are URL ids: never change one.
presets![
    ("llama3.2-1b", "Llama 3.2 1B", Llama, 2048),
    ("llama3.2-3b", "Llama 3.2 3B", Llama, 2048),
    ("llama3-8b", "Llama 3 8B", Llama, 2048),
    ("llama3.1-8b", "Llama 3.1 8B", Llama, 2048),
    ("llama3-70b", "Llama 3 70B", Llama, 2048),
    ("llama3.3-70b", "Llama 3.3 70B", Llama, 2048),
    ("qwen3-0.6b", "Qwen3 0.6B", Qwen3, 2048),
    ("qwen3-1.7b", "Qwen3 1.7B", Qwen3, 2048),
    ("qwen3-4b", "Qwen3 4B", Qwen3, 2048),
    ("qwen3-8b", "Qwen3 8B", Qwen3, 2048),
    ("qwen3-14b", "Qwen3 14B", Qwen3, 2048),
    ("qwen3-32b", "Qwen3 32B", Qwen3, 2048),
    ("qwen2.5-0.5b", "Qwen2.5 0.5B", Qwen2, 2048),
    ("qwen2.5-7b", "Qwen2.5 7B", Qwen2, 2048),
    ("gemma3-1b", "Gemma 3 1B", Gemma3, 2048),
    ("gemma3-4b", "Gemma 3 4B (text)", Gemma3, 2048),
    ("gemma3-12b", "Gemma 3 12B (text)", Gemma3, 2048),
    ("gemma3-27b", "Gemma 3 27B (text)", Gemma3, 2048),
    ("gemma2-2b", "Gemma 2 2B", Gemma2, 2048),
    ("gemma2-9b", "Gemma 2 9B", Gemma2, 2048),
    ("gemma-2b", "Gemma 2B", Gemma, 2048),
    ("mistral-7b", "Mistral 7B v0.1", Mistral, 2048),
    ("phi4-mini", "Phi-4-mini (3.8B)", Phi3, 2048),
    ("phi3-mini", "Phi-3 mini 4k", Phi3, 4096),
    ("olmo2-1b", "OLMo 2 1B", Olmo2, 2048),
    ("olmo2-7b", "OLMo 2 7B", Olmo2, 2048),
    ("smollm3-3b", "SmolLM3 3B", SmolLm3, 2048),
    ("granite3.3-2b", "Granite 3.3 2B", Granite, 2048),
    ("granite3.3-8b", "Granite 3.3 8B", Granite, 2048),
    ("qwen3-30b-a3b", "Qwen3 30B-A3B (MoE)", Qwen3Moe, 2048),
    ("qwen3-235b-a22b", "Qwen3 235B-A22B (MoE)", Qwen3Moe, 2048),
    ("qwen1.5-moe-a2.7b", "Qwen1.5-MoE-A2.7B", Qwen2Moe, 2048),
    ("mixtral-8x7b", "Mixtral 8x7B", Mixtral, 2048),
    ("deepseek-v3", "DeepSeek-V3 (671B)", DeepseekV3, 2048),
    ("moonlight-16b-a3b", "Moonlight 16B-A3B", DeepseekV3, 2048),
    ("gpt-oss-20b", "gpt-oss-20b", GptOss, 2048),
    ("gpt-oss-120b", "gpt-oss-120b", GptOss, 2048),
    ("gpt2", "GPT-2 (124M)", Gpt2, 1024),
    ("gpt2-medium", "GPT-2 medium (355M)", Gpt2, 1024),
    ("gpt2-large", "GPT-2 large (774M)", Gpt2, 1024),
    ("opt-125m", "OPT 125M", Opt, 2048),
    ("opt-350m", "OPT 350M", Opt, 2048),
    ("bert-base", "BERT base (110M)", Bert, 512),
    ("roberta-base", "RoBERTa base (125M)", Roberta, 512),
    (
        "xlm-roberta-base",
        "XLM-RoBERTa base (278M)",
        XlmRoberta,
        512
    ),
    ("vit-b16", "ViT-B/16 (224 px)", Vit, 224),
];

const COUNT: usize = 46;

impl Preset {
    /// Every preset, grouped by family in the order the page lists them.
    pub const ALL: [Preset; COUNT] = {
        let mut all = [Preset(0); COUNT];
        let mut i = 0;
        while i < COUNT {
            all[i] = Preset(i);
            i += 1;
        }
        all
    };

    fn spec(self) -> &'static PresetSpec {
        &PRESETS[self.0 % PRESETS.len()]
    }

    /// Short stable URL id.
    #[must_use]
    pub fn key(self) -> &'static str {
        self.spec().key
    }

    /// Name shown to a person.
    #[must_use]
    pub fn label(self) -> &'static str {
        self.spec().label
    }

    /// The family (the page groups presets by it).
    #[must_use]
    pub fn family(self) -> ModelFamily {
        self.spec().family
    }

    /// The preset whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.key() == key)
    }

    /// A typical sequence length (for ViT: the image side, 224).
    #[must_use]
    pub fn default_seq_len(self) -> u64 {
        self.spec().default_seq_len
    }

    /// The published configuration, as the family reader turns it into a model.
    ///
    /// # Errors
    /// Never for the shipped presets (a test reads each); typed so that a broken preset file
    /// shows as a config error rather than a crash.
    pub fn architecture(self) -> Result<Architecture, ConfigError> {
        parse_hf_config(self.spec().config)
    }

    /// The preset's config text (the fields its reader uses).
    #[must_use]
    pub fn config_json(self) -> &'static str {
        self.spec().config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_round_trip_and_keys_are_unique() {
        assert_eq!(PRESETS.len(), COUNT);
        for p in Preset::ALL {
            assert_eq!(Preset::from_key(p.key()), Some(p));
            let a = p
                .architecture()
                .unwrap_or_else(|e| panic!("{}: {e}", p.key()));
            assert_eq!(a.family(), p.family(), "{}", p.key());
            assert_eq!(
                parse_hf_config(&a.to_config_json()),
                Ok(a.clone()),
                "{}",
                p.key()
            );
        }
    }

    #[track_caller]
    fn params(key: &str, expected: u64) {
        let a = Preset::from_key(key).map(Preset::architecture);
        assert_eq!(
            a.map(|a| a.map(|a| a.parameter_count())),
            Some(Ok(expected)),
            "{key}"
        );
    }

    /// PyTorch's counts for the same configs (transformers 5.24 on the meta device; see
    /// validation/README.md), the torchvision count for ViT-B/16.
    #[test]
    fn preset_counts_match_pytorch() {
        for (key, n) in [
            ("gpt2", 124_439_808),
            ("gpt2-medium", 354_823_168),
            ("llama3.2-1b", 1_235_814_400),
            ("llama3-8b", 8_030_261_248),
            ("bert-base", 109_514_298),
            ("vit-b16", 86_567_656),
            ("mistral-7b", 7_241_732_096),
            ("qwen2.5-0.5b", 494_032_768),
            ("gemma-2b", 2_506_172_416),
            ("phi3-mini", 3_821_079_552),
            ("llama3.1-8b", 8_030_261_248),
            ("llama3.2-3b", 3_212_749_824),
            ("llama3.3-70b", 70_553_706_496),
            ("qwen3-0.6b", 596_049_920),
            ("qwen3-1.7b", 1_720_574_976),
            ("qwen3-4b", 4_022_468_096),
            ("qwen3-8b", 8_190_735_360),
            ("qwen3-14b", 14_768_307_200),
            ("qwen3-32b", 32_762_123_264),
            ("gemma2-2b", 2_614_341_888),
            ("gemma2-9b", 9_241_705_984),
            ("gemma3-1b", 999_885_952),
            ("gemma3-4b", 3_880_263_168),
            ("gemma3-12b", 11_766_034_176),
            ("gemma3-27b", 27_009_346_304),
            ("olmo2-1b", 1_484_916_736),
            ("olmo2-7b", 7_298_617_344),
            ("smollm3-3b", 3_075_098_624),
            ("phi4-mini", 3_836_021_760),
            ("granite3.3-2b", 2_533_539_840),
            ("granite3.3-8b", 8_170_864_640),
            ("roberta-base", 124_697_433),
            ("xlm-roberta-base", 278_295_186),
            ("mixtral-8x7b", 46_702_792_704),
            ("qwen3-30b-a3b", 30_532_122_624),
            ("qwen3-235b-a22b", 235_093_634_560),
            ("qwen1.5-moe-a2.7b", 14_315_784_192),
            ("deepseek-v3", 671_026_404_352),
            ("moonlight-16b-a3b", 15_960_108_544),
            ("gpt-oss-20b", 20_914_757_184),
            ("gpt-oss-120b", 116_829_156_672),
            ("opt-125m", 125_239_296),
            ("opt-350m", 331_196_416),
        ] {
            params(key, n);
        }
    }
}
