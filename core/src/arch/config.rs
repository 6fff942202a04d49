//! Model architectures: HF `config.json` parsing, validation, parameter counting.

use serde_json::{Map, Value};
use std::fmt;

/// A supported model family (the HF `model_type`, or torchvision's ViT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelFamily {
    /// GPT-2 (`GPT2LMHeadModel`).
    Gpt2,
    /// Llama (`LlamaForCausalLM`).
    Llama,
    /// Mistral (`MistralForCausalLM`).
    Mistral,
    /// Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`, q/k/v biases).
    Qwen2,
    /// Gemma (`GemmaForCausalLM`).
    Gemma,
    /// Phi-3 (`Phi3ForCausalLM`, fused qkv and gate/up projections).
    Phi3,
    /// BERT (`BertForMaskedLM`).
    Bert,
    /// Vision Transformer (torchvision `vit_b_16` style).
    Vit,
}

impl ModelFamily {
    /// Every family.
    pub const ALL: [ModelFamily; 8] = [
        ModelFamily::Gpt2,
        ModelFamily::Llama,
        ModelFamily::Mistral,
        ModelFamily::Qwen2,
        ModelFamily::Gemma,
        ModelFamily::Phi3,
        ModelFamily::Bert,
        ModelFamily::Vit,
    ];

    /// The HF `model_type` string.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            ModelFamily::Gpt2 => "gpt2",
            ModelFamily::Llama => "llama",
            ModelFamily::Mistral => "mistral",
            ModelFamily::Qwen2 => "qwen2",
            ModelFamily::Gemma => "gemma",
            ModelFamily::Phi3 => "phi3",
            ModelFamily::Bert => "bert",
            ModelFamily::Vit => "vit",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            ModelFamily::Gpt2 => "GPT-2",
            ModelFamily::Llama => "Llama",
            ModelFamily::Mistral => "Mistral",
            ModelFamily::Qwen2 => "Qwen2",
            ModelFamily::Gemma => "Gemma",
            ModelFamily::Phi3 => "Phi-3",
            ModelFamily::Bert => "BERT",
            ModelFamily::Vit => "ViT",
        }
    }

    /// The family whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.key() == key)
    }

    pub(crate) const fn is_llama_like(self) -> bool {
        matches!(
            self,
            ModelFamily::Llama
                | ModelFamily::Mistral
                | ModelFamily::Qwen2
                | ModelFamily::Gemma
                | ModelFamily::Phi3
        )
    }
}

/// Why a config could not be turned into an [`Architecture`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The text is not JSON, or not a JSON object.
    InvalidJson(String),
    /// `model_type` names a family this estimator does not model.
    UnsupportedModelType(String),
    /// A required field is absent.
    MissingField(String),
    /// A field is present but unusable.
    InvalidField {
        /// The field's name.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::InvalidJson(e) => write!(f, "config is not a JSON object: {e}"),
            ConfigError::UnsupportedModelType(t) => write!(
                f,
                "model_type \"{t}\" is not supported (supported: gpt2, llama, mistral, qwen2, gemma, phi3, bert, vit)"
            ),
            ConfigError::MissingField(name) => write!(f, "config field \"{name}\" is missing"),
            ConfigError::InvalidField { field, reason } => write!(f, "config field \"{field}\" is invalid: {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A validated transformer architecture: everything the memory model needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Architecture {
    pub(crate) family: ModelFamily,
    pub(crate) layers: u64,
    pub(crate) hidden: u64,
    pub(crate) heads: u64,
    pub(crate) kv_heads: u64,
    pub(crate) head_dim: u64,
    pub(crate) intermediate: u64,
    /// Vocabulary (text) or number of classes (vision).
    pub(crate) vocab: u64,
    /// Learned positions (GPT-2, BERT), or 0 for rotary models.
    pub(crate) max_positions: u64,
    pub(crate) tie_embeddings: bool,
    pub(crate) qkv_bias: bool,
    pub(crate) o_bias: bool,
    pub(crate) mlp_bias: bool,
    pub(crate) type_vocab: u64,
    pub(crate) attn_dropout: bool,
    pub(crate) hidden_dropout: bool,
    pub(crate) python_gelu: bool,
    pub(crate) image_size: u64,
    pub(crate) patch_size: u64,
    /// Sliding-window attention span (Mistral, Phi-3, Qwen2 with `use_sliding_window`), 0 = none.
    pub(crate) sliding_window: u64,
}

const MAX_LAYERS: u64 = 10_000;
const MAX_DIM: u64 = 1 << 20;
const MAX_VOCAB: u64 = 1 << 24;

impl Architecture {
    /// The model family.
    #[must_use]
    pub fn family(&self) -> ModelFamily {
        self.family
    }
    /// Transformer layers.
    #[must_use]
    pub fn num_layers(&self) -> u64 {
        self.layers
    }
    /// Hidden (model) width.
    #[must_use]
    pub fn hidden_size(&self) -> u64 {
        self.hidden
    }
    /// Attention (query) heads.
    #[must_use]
    pub fn num_heads(&self) -> u64 {
        self.heads
    }
    /// Key/value heads (fewer than query heads under GQA).
    #[must_use]
    pub fn num_kv_heads(&self) -> u64 {
        self.kv_heads
    }
    /// Width of one attention head.
    #[must_use]
    pub fn head_dim(&self) -> u64 {
        self.head_dim
    }
    /// MLP inner width.
    #[must_use]
    pub fn intermediate_size(&self) -> u64 {
        self.intermediate
    }
    /// Vocabulary size (text) or number of classes (vision).
    #[must_use]
    pub fn vocab_size(&self) -> u64 {
        self.vocab
    }
    /// Whether the input embedding and the output head share their weight.
    #[must_use]
    pub fn tie_word_embeddings(&self) -> bool {
        self.tie_embeddings
    }
    /// Whether this is a vision model (its `seq_len` is the image side in pixels).
    #[must_use]
    pub fn is_vision(&self) -> bool {
        self.family == ModelFamily::Vit
    }
    /// Longest sequence the model accepts (learned position embeddings), if limited.
    #[must_use]
    pub fn max_positions(&self) -> Option<u64> {
        (self.max_positions > 0 && !self.is_vision()).then_some(self.max_positions)
    }
    /// Sliding-window attention span, if the model uses one.
    #[must_use]
    pub fn sliding_window(&self) -> Option<u64> {
        (self.sliding_window > 0).then_some(self.sliding_window)
    }
    /// Image side in pixels (vision models; 0 otherwise).
    #[must_use]
    pub fn image_size(&self) -> u64 {
        self.image_size
    }
    /// Patch side in pixels (vision models; 0 otherwise).
    #[must_use]
    pub fn patch_size(&self) -> u64 {
        self.patch_size
    }

    /// Parameters as PyTorch counts them (tied weights once).
    #[must_use]
    pub fn parameter_count(&self) -> u64 {
        self.parameter_tensors()
            .iter()
            .fold(0, |a, &b| a.saturating_add(b))
    }

    /// Parameters of the largest transformer layer (what an FSDP all-gather materialises).
    #[must_use]
    pub fn largest_layer_parameter_count(&self) -> u64 {
        self.layer_tensors()
            .iter()
            .fold(0, |a, &b| a.saturating_add(b))
    }

    /// Element counts of the weights and biases of one layer's matmuls (what autocast casts).
    pub(crate) fn layer_linears(&self) -> Vec<u64> {
        let (h, i) = (self.hidden, self.intermediate);
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut v = Vec::new();
        let mut lin = |n_in: u64, n_out: u64, bias: bool| {
            v.push(n_in * n_out);
            if bias {
                v.push(n_out);
            }
        };
        match self.family {
            ModelFamily::Gpt2 => {
                lin(h, 3 * h, true);
                lin(h, h, true);
                lin(h, i, true);
                lin(i, h, true);
            }
            ModelFamily::Bert => {
                for _ in 0..4 {
                    lin(h, h, true);
                }
                lin(h, i, true);
                lin(i, h, true);
            }
            ModelFamily::Vit => {
                lin(h, 3 * h, true);
                lin(h, h, true);
                lin(h, i, true);
                lin(i, h, true);
            }
            ModelFamily::Phi3 => {
                lin(h, q + 2 * kv, self.qkv_bias);
                lin(q, h, self.o_bias);
                lin(h, 2 * i, self.mlp_bias);
                lin(i, h, self.mlp_bias);
            }
            _ => {
                lin(h, q, self.qkv_bias);
                lin(h, kv, self.qkv_bias);
                lin(h, kv, self.qkv_bias);
                lin(q, h, self.o_bias);
                lin(h, i, self.mlp_bias);
                lin(h, i, self.mlp_bias);
                lin(i, h, self.mlp_bias);
            }
        }
        v
    }

    /// Element counts of every parameter tensor of one layer.
    pub(crate) fn layer_tensors(&self) -> Vec<u64> {
        let h = self.hidden;
        let mut v = self.layer_linears();
        match self.family {
            ModelFamily::Gpt2 | ModelFamily::Bert | ModelFamily::Vit => v.extend([h, h, h, h]),
            _ => v.extend([h, h]),
        }
        v
    }

    /// Element counts of the matmul weights outside the layers (heads) that autocast casts.
    pub(crate) fn head_linears(&self) -> Vec<u64> {
        let (h, v) = (self.hidden, self.vocab);
        match self.family {
            ModelFamily::Bert => vec![h * h, h, v * h, v],
            ModelFamily::Vit => vec![v * h, v, h * 3 * self.patch_size * self.patch_size, h],
            _ => vec![v * h],
        }
    }

    /// Element counts of the parameters whose gradients exist once backward reaches the last
    /// layer: the head (and a tied embedding), final norm, and the last layer's output matmul.
    pub(crate) fn head_tensors(&self) -> Vec<u64> {
        let (h, v, i) = (self.hidden, self.vocab, self.intermediate);
        let mut t = match self.family {
            ModelFamily::Gpt2 => vec![h, h, v * h],
            ModelFamily::Bert => vec![h * h, h, h, h, v, v * h],
            ModelFamily::Vit => vec![h, h, v * h, v],
            _ => vec![h, v * h],
        };
        t.push(i * h);
        if self.mlp_bias {
            t.push(h);
        }
        t
    }

    /// Element counts of every parameter tensor of the model (tied weights once).
    pub(crate) fn parameter_tensors(&self) -> Vec<u64> {
        let (h, v) = (self.hidden, self.vocab);
        let mut t = Vec::new();
        match self.family {
            ModelFamily::Gpt2 => t.extend([v * h, self.max_positions * h]),
            ModelFamily::Bert => {
                t.extend([v * h, self.max_positions * h, self.type_vocab * h, h, h])
            }
            ModelFamily::Vit => {
                let p = self.patch_size;
                t.extend([h * 3 * p * p, h, h, self.vit_tokens() * h]);
            }
            _ => t.push(v * h),
        }
        for _ in 0..self.layers {
            t.extend(self.layer_tensors());
        }
        match self.family {
            ModelFamily::Gpt2 => t.extend([h, h]),
            ModelFamily::Bert => t.extend([h * h, h, h, h, v]),
            ModelFamily::Vit => t.extend([h, h, v * h, v]),
            _ => t.push(h),
        }
        if !self.tie_embeddings && self.family != ModelFamily::Vit {
            t.push(v * h);
        }
        t
    }

    /// Tokens per image for a ViT at its configured size: patches plus the class token.
    pub(crate) fn vit_tokens(&self) -> u64 {
        let side = self.image_size.checked_div(self.patch_size).unwrap_or(0);
        side * side + 1
    }

    /// A compact HF-style `config.json` that [`parse_hf_config`] turns back into `self`.
    #[must_use]
    pub fn to_config_json(&self) -> String {
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("model_type", self.family.key().into());
        match self.family {
            ModelFamily::Gpt2 => {
                put("n_embd", self.hidden.into());
                put("n_layer", self.layers.into());
                put("n_head", self.heads.into());
                put("n_inner", self.intermediate.into());
                put("n_positions", self.max_positions.into());
                put("vocab_size", self.vocab.into());
                put(
                    "activation_function",
                    if self.python_gelu { "gelu_new" } else { "gelu" }.into(),
                );
                put(
                    "attn_pdrop",
                    if self.attn_dropout { 0.1 } else { 0.0 }.into(),
                );
                put(
                    "resid_pdrop",
                    if self.hidden_dropout { 0.1 } else { 0.0 }.into(),
                );
                put("tie_word_embeddings", self.tie_embeddings.into());
            }
            ModelFamily::Vit => {
                put("hidden_size", self.hidden.into());
                put("num_hidden_layers", self.layers.into());
                put("num_attention_heads", self.heads.into());
                put("intermediate_size", self.intermediate.into());
                put("image_size", self.image_size.into());
                put("patch_size", self.patch_size.into());
                put("num_labels", self.vocab.into());
            }
            _ => {
                put("hidden_size", self.hidden.into());
                put("num_hidden_layers", self.layers.into());
                put("num_attention_heads", self.heads.into());
                put("intermediate_size", self.intermediate.into());
                put("vocab_size", self.vocab.into());
                put("tie_word_embeddings", self.tie_embeddings.into());
                let p = |b: bool| if b { 0.1 } else { 0.0 };
                if self.family == ModelFamily::Bert {
                    put("max_position_embeddings", self.max_positions.into());
                    put("type_vocab_size", self.type_vocab.into());
                    put("attention_probs_dropout_prob", p(self.attn_dropout).into());
                    put("hidden_dropout_prob", p(self.hidden_dropout).into());
                } else {
                    put("num_key_value_heads", self.kv_heads.into());
                    put("head_dim", self.head_dim.into());
                    put("attention_dropout", p(self.attn_dropout).into());
                    if self.family == ModelFamily::Qwen2 {
                        // Qwen2 always has q/k/v biases and no o bias.
                    } else {
                        put("attention_bias", self.qkv_bias.into());
                    }
                    if self.family == ModelFamily::Llama {
                        put("mlp_bias", self.mlp_bias.into());
                    }
                    if self.family == ModelFamily::Phi3 {
                        put("resid_pdrop", p(self.hidden_dropout).into());
                    }
                    if self.sliding_window > 0 {
                        put("sliding_window", self.sliding_window.into());
                        if self.family == ModelFamily::Qwen2 {
                            put("use_sliding_window", true.into());
                        }
                    }
                }
            }
        }
        Value::Object(m).to_string()
    }
}

fn get_u64(m: &Map<String, Value>, names: &[&str]) -> Result<Option<u64>, ConfigError> {
    for name in names {
        match m.get(*name) {
            None | Some(Value::Null) => continue,
            Some(v) => {
                return v
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| ConfigError::InvalidField {
                        field: (*name).to_string(),
                        reason: format!("expected a non-negative integer, got {v}"),
                    })
            }
        }
    }
    Ok(None)
}

fn req_u64(m: &Map<String, Value>, names: &[&str]) -> Result<u64, ConfigError> {
    get_u64(m, names)?
        .ok_or_else(|| ConfigError::MissingField(names.first().copied().unwrap_or("?").to_string()))
}

fn get_bool(m: &Map<String, Value>, name: &str, default: bool) -> Result<bool, ConfigError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ConfigError::InvalidField {
            field: name.to_string(),
            reason: format!("expected true or false, got {v}"),
        }),
    }
}

fn get_prob(m: &Map<String, Value>, names: &[&str], default: f64) -> Result<bool, ConfigError> {
    for name in names {
        match m.get(*name) {
            None | Some(Value::Null) => continue,
            Some(v) => {
                let p = v
                    .as_f64()
                    .filter(|p| (0.0..1.0).contains(p))
                    .ok_or_else(|| ConfigError::InvalidField {
                        field: (*name).to_string(),
                        reason: format!("expected a probability in [0, 1), got {v}"),
                    })?;
                return Ok(p > 0.0);
            }
        }
    }
    Ok(default > 0.0)
}

#[track_caller]
fn check_range(field: &str, v: u64, lo: u64, hi: u64) -> Result<u64, ConfigError> {
    if v < lo || v > hi {
        Err(ConfigError::InvalidField {
            field: field.to_string(),
            reason: format!("{v} is outside {lo}..={hi}"),
        })
    } else {
        Ok(v)
    }
}

/// Parses a Hugging Face `config.json` (or the compact form of [`Architecture::to_config_json`]).
///
/// # Errors
/// [`ConfigError`] naming the offending field or `model_type`.
pub fn parse_hf_config(json: &str) -> Result<Architecture, ConfigError> {
    let value: Value =
        serde_json::from_str(json).map_err(|e| ConfigError::InvalidJson(e.to_string()))?;
    let m = value
        .as_object()
        .ok_or_else(|| ConfigError::InvalidJson("top level is not an object".into()))?;
    let model_type = match m.get("model_type") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Err(ConfigError::InvalidField {
                field: "model_type".into(),
                reason: "expected a string".into(),
            })
        }
        None => return Err(ConfigError::MissingField("model_type".into())),
    };
    let family = match model_type {
        "qwen2_5" => ModelFamily::Qwen2,
        t => ModelFamily::from_key(t)
            .ok_or_else(|| ConfigError::UnsupportedModelType(t.to_string()))?,
    };
    if let Some(rp) = m.get("rope_parameters") {
        if !(rp.is_object() || rp.is_null()) {
            return Err(ConfigError::InvalidField {
                field: "rope_parameters".into(),
                reason: "expected an object".into(),
            });
        }
    }
    let gpt = family == ModelFamily::Gpt2;
    let hidden = check_range(
        if gpt { "n_embd" } else { "hidden_size" },
        req_u64(
            m,
            if gpt {
                &["n_embd", "hidden_size"]
            } else {
                &["hidden_size"]
            },
        )?,
        1,
        MAX_DIM,
    )?;
    let layers = check_range(
        if gpt { "n_layer" } else { "num_hidden_layers" },
        req_u64(
            m,
            if gpt {
                &["n_layer", "num_hidden_layers"]
            } else {
                &["num_hidden_layers"]
            },
        )?,
        1,
        MAX_LAYERS,
    )?;
    let heads_name = if gpt { "n_head" } else { "num_attention_heads" };
    let heads = check_range(
        heads_name,
        req_u64(m, &[heads_name, "num_attention_heads"])?,
        1,
        MAX_DIM,
    )?;
    // Only the llama-like families have grouped-query attention (GPT-2, BERT and ViT ignore
    // the field, and `to_config_json` writes it for the llama-like ones only).
    let explicit_kv_heads = if family.is_llama_like() {
        get_u64(m, &["num_key_value_heads"])?
    } else {
        None
    };
    let kv_heads = check_range(
        "num_key_value_heads",
        explicit_kv_heads.unwrap_or(heads),
        1,
        heads,
    )?;
    if heads % kv_heads != 0 {
        return Err(ConfigError::InvalidField {
            field: "num_key_value_heads".into(),
            reason: format!(
                "{heads} attention heads are not a multiple of {kv_heads} key/value heads"
            ),
        });
    }
    let explicit_head_dim = if family.is_llama_like() {
        get_u64(m, &["head_dim"])?
    } else {
        None
    };
    let head_dim = match explicit_head_dim {
        Some(d) => check_range("head_dim", d, 1, MAX_DIM)?,
        None => {
            if hidden % heads != 0 {
                return Err(ConfigError::InvalidField {
                    field: if gpt { "n_embd" } else { "hidden_size" }.into(),
                    reason: format!("{hidden} is not divisible by {heads} heads"),
                });
            }
            hidden / heads
        }
    };
    if heads.saturating_mul(head_dim) > MAX_DIM {
        return Err(ConfigError::InvalidField {
            field: "head_dim".into(),
            reason: format!("{heads} heads of {head_dim} exceed {MAX_DIM} attention channels"),
        });
    }
    let intermediate = match family {
        ModelFamily::Gpt2 => get_u64(m, &["n_inner"])?.unwrap_or(4 * hidden),
        ModelFamily::Vit => get_u64(m, &["intermediate_size", "mlp_dim"])?.unwrap_or(4 * hidden),
        _ => req_u64(m, &["intermediate_size"])?,
    };
    let intermediate = check_range(
        if gpt { "n_inner" } else { "intermediate_size" },
        intermediate,
        1,
        1 << 22,
    )?;
    let (vocab, vocab_name) = if family == ModelFamily::Vit {
        (
            get_u64(m, &["num_labels", "num_classes"])?.unwrap_or(1000),
            "num_labels",
        )
    } else {
        (req_u64(m, &["vocab_size"])?, "vocab_size")
    };
    let vocab = check_range(vocab_name, vocab, 1, MAX_VOCAB)?;
    let max_positions = match family {
        ModelFamily::Gpt2 => check_range(
            "n_positions",
            get_u64(m, &["n_positions", "n_ctx"])?.unwrap_or(1024),
            1,
            MAX_VOCAB,
        )?,
        ModelFamily::Bert => check_range(
            "max_position_embeddings",
            get_u64(m, &["max_position_embeddings"])?.unwrap_or(512),
            1,
            MAX_VOCAB,
        )?,
        _ => 0,
    };
    let tie_default = matches!(
        family,
        ModelFamily::Gpt2 | ModelFamily::Gemma | ModelFamily::Bert
    );
    let tie_embeddings = get_bool(m, "tie_word_embeddings", tie_default)?;
    let attention_bias = get_bool(m, "attention_bias", false)?;
    let (qkv_bias, o_bias) = match family {
        ModelFamily::Qwen2 => (true, false),
        ModelFamily::Gpt2 | ModelFamily::Bert | ModelFamily::Vit => (true, true),
        _ => (attention_bias, attention_bias),
    };
    let mlp_bias = match family {
        ModelFamily::Llama => get_bool(m, "mlp_bias", false)?,
        ModelFamily::Gpt2 | ModelFamily::Bert | ModelFamily::Vit => true,
        _ => false,
    };
    let type_vocab = if family == ModelFamily::Bert {
        check_range(
            "type_vocab_size",
            get_u64(m, &["type_vocab_size"])?.unwrap_or(2),
            0,
            MAX_VOCAB,
        )?
    } else {
        0
    };
    let (attn_dropout, hidden_dropout) = match family {
        ModelFamily::Gpt2 => (
            get_prob(m, &["attn_pdrop"], 0.1)?,
            get_prob(m, &["resid_pdrop"], 0.1)?,
        ),
        ModelFamily::Bert => (
            get_prob(m, &["attention_probs_dropout_prob"], 0.1)?,
            get_prob(m, &["hidden_dropout_prob"], 0.1)?,
        ),
        ModelFamily::Vit => (false, false),
        ModelFamily::Phi3 => (
            get_prob(m, &["attention_dropout"], 0.0)?,
            get_prob(m, &["resid_pdrop"], 0.0)?,
        ),
        _ => (get_prob(m, &["attention_dropout"], 0.0)?, false),
    };
    let python_gelu = gpt
        && match m.get("activation_function") {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s == "gelu_new",
            Some(v) => {
                return Err(ConfigError::InvalidField {
                    field: "activation_function".into(),
                    reason: format!("expected a string, got {v}"),
                })
            }
        };
    let (image_size, patch_size) = if family == ModelFamily::Vit {
        let image = check_range(
            "image_size",
            get_u64(m, &["image_size"])?.unwrap_or(224),
            1,
            1 << 16,
        )?;
        let patch = check_range(
            "patch_size",
            get_u64(m, &["patch_size"])?.unwrap_or(16),
            1,
            image,
        )?;
        if image % patch != 0 {
            return Err(ConfigError::InvalidField {
                field: "image_size".into(),
                reason: format!("{image} is not a multiple of patch_size {patch}"),
            });
        }
        (image, patch)
    } else {
        (0, 0)
    };
    let sliding_window = match family {
        ModelFamily::Mistral | ModelFamily::Phi3 => get_u64(m, &["sliding_window"])?.unwrap_or(0),
        ModelFamily::Qwen2 if get_bool(m, "use_sliding_window", false)? => {
            get_u64(m, &["sliding_window"])?.unwrap_or(0)
        }
        _ => 0,
    };
    Ok(Architecture {
        family,
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        vocab,
        max_positions,
        tie_embeddings,
        qkv_bias,
        o_bias,
        mlp_bias,
        type_vocab,
        attn_dropout,
        hidden_dropout,
        python_gelu,
        image_size,
        patch_size,
        sliding_window,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn count(path: &str, expected: u64) {
        let text = std::fs::read_to_string(format!(
            "{}/tests/fixtures/configs/{path}",
            env!("CARGO_MANIFEST_DIR")
        ));
        if let Ok(text) = text {
            let arch = parse_hf_config(&text).expect("parses");
            assert_eq!(arch.parameter_count(), expected, "{path}");
        }
    }

    #[test]
    fn parameter_counts_match_pytorch() {
        count("gpt2.json", 124_439_808);
        count("gpt2-medium.json", 354_823_168);
        count("llama-1b.json", 1_235_814_400);
        count("llama3-8b.json", 8_030_261_248);
        count("bert-base.json", 109_514_298);
        count("gemma-2b.json", 2_506_172_416);
        count("mistral-7b.json", 7_241_732_096);
        count("phi3-mini-4k.json", 3_821_079_552);
        count("qwen2.5-0.5b.json", 494_032_768);
    }

    #[track_caller]
    fn rejects(json: &str, field: &str) {
        match parse_hf_config(json) {
            Err(e) => assert!(e.to_string().contains(field), "{e} should name {field}"),
            Ok(a) => panic!("accepted {a:?}"),
        }
    }

    #[test]
    fn rejects_bad_fields() {
        rejects("[1]", "JSON");
        rejects("{\"model_type\":\"t5\"}", "t5");
        rejects(
            "{\"model_type\":\"llama\",\"hidden_size\":64}",
            "num_hidden_layers",
        );
        rejects(
            "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":0,\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":8}",
            "num_hidden_layers",
        );
        rejects(
            "{\"model_type\":\"llama\",\"hidden_size\":65,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":8}",
            "hidden_size",
        );
        rejects(
            "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":3,\"intermediate_size\":8,\"vocab_size\":8}",
            "num_key_value_heads",
        );
    }

    #[test]
    fn accepts_old_and_new_rope_fields() {
        let base = "\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":8";
        let old = parse_hf_config(&format!("{{{base},\"rope_theta\":10000.0}}"));
        let new = parse_hf_config(&format!(
            "{{{base},\"rope_parameters\":{{\"rope_theta\":500000.0,\"rope_type\":\"default\"}}}}"
        ));
        assert!(old.is_ok() && old == new);
        assert_eq!(old.map(|a| a.tie_word_embeddings()), Ok(false));
    }
}
