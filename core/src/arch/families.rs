//! Family readers: each turns its `config.json` into a [`ModelSpec`]. Adding a family is a
//! reader here, presets and measured rows; the op kinds and the estimator stay as they are.

use super::config::{Architecture, Reader, MAX_DIM, MAX_LAYERS, MAX_VOCAB};
use super::error::ConfigError;
use super::family::ModelFamily;
use super::hybrid;
use super::model::{
    Attention, EmbedScale, Embedding, Head, Latent, Layer, ModelSpec, Placement, QkNorm, Vision,
};
use super::ops::{
    Activation, ExpertAct, FeedForward, Mlp, MlpKind, Moe, NormKind, RmsStyle, Router,
};
use crate::json::{Map, Value};

/// The vision-language wrappers' readers (their vision side, their language model through
/// the readers here).
#[cfg(feature = "vision")]
mod vision;

/// Shown when a multimodal Gemma 3 config is read through its `text_config`.
#[cfg(not(feature = "vision"))]
pub(crate) const MULTIMODAL_NOTE: &str =
    "Multimodal config: only the language model (text_config) is estimated, not the vision tower.";

/// Shown for gpt-oss: its sinks exist in eager attention only.
pub(crate) const GPT_OSS_EAGER_NOTE: &str =
    "gpt-oss adds learned attention sinks, which only eager attention computes in transformers: the estimate uses eager attention.";
/// Shown for a gpt-oss checkpoint with MXFP4 experts.
pub(crate) const MXFP4_NOTE: &str =
    "The checkpoint stores its experts in MXFP4; transformers cannot train them so: they are dequantized (Mxfp4Config(dequantize=True)) and estimated at the chosen precision.";
/// Shown for every mixture of experts.
pub(crate) const MOE_NOTE: &str =
    "Experts run as transformers' default grouped experts (grouped_mm): activations grow with tokens x top-k, whatever the routing; weights, gradients and optimizer states cover every expert.";
/// Shown for Gemma 2 with SDPA, which transformers refuses (soft-capping).
pub(crate) const GEMMA2_EAGER_NOTE: &str =
    "Gemma 2 soft-caps its attention logits, which SDPA cannot do: transformers runs eager attention, and so does the estimate.";

/// Reads any supported config.
pub(crate) fn read(m: &Map) -> Result<Architecture, ConfigError> {
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
    #[cfg(feature = "vision")]
    if let Some(kind) = vision::vision_language(model_type) {
        return vision::vision_language_model(kind, model_type, m);
    }
    #[cfg(not(feature = "vision"))]
    if model_type == "gemma3" {
        // the multimodal wrapper: the language model is its text_config
        let mut outer = Reader::new(m);
        outer.record("model_type", "gemma3".into());
        let text = outer.required_object("text_config")?;
        let mut inner = Reader::new(text);
        let mut arch = decoder(ModelFamily::Gemma3, &mut inner)?;
        outer.record("text_config", Value::Object(inner.used));
        arch.notes.insert(0, MULTIMODAL_NOTE);
        arch.compact = Value::Object(outer.used).to_string();
        return Ok(arch);
    }
    if model_type == "qwen3_next" {
        let mut r = Reader::new(m);
        r.record("model_type", model_type.into());
        let fields = hybrid::qwen3_next_fields(&mut r);
        let mut arch = hybrid::qwen3_next(decoder(ModelFamily::Qwen2Moe, &mut r)?, fields);
        arch.compact = Value::Object(r.used).to_string();
        return Ok(arch);
    }
    if RECURRENT.contains(&model_type) {
        return Err(ConfigError::InvalidField {
            field: "model_type".into(),
            reason: format!(
                "\"{model_type}\" has linear-attention or state-space layers (a recurrent state, not keys and values per token): not modelled yet"
            ),
        });
    }
    let family = match model_type {
        "qwen2_5" => ModelFamily::Qwen2,
        t => ModelFamily::from_key(t)
            .ok_or_else(|| ConfigError::UnsupportedModelType(t.to_string()))?,
    };
    let mut r = Reader::new(m);
    r.record("model_type", model_type.into());
    let mut arch = match family {
        ModelFamily::Gpt2 => gpt2(&mut r)?,
        ModelFamily::Opt => opt(&mut r)?,
        ModelFamily::Bert | ModelFamily::Roberta | ModelFamily::XlmRoberta => {
            encoder(family, &mut r)?
        }
        ModelFamily::Vit => vit(&mut r)?,
        _ => decoder(family, &mut r)?,
    };
    arch.compact = Value::Object(r.used).to_string();
    Ok(arch)
}

/// Hybrid and recurrent families vLLM serves, refused by name: their linear-attention or
/// state-space layers (a recurrent state vLLM pools beside the KV cache, `MambaSpec`:
/// `validation/VLLM.md` 2) are not op kinds of the tape yet, and their states' shapes are not
/// read (Qwen3-Next's Gated DeltaNet is, for serving: `hybrid.rs`).
const RECURRENT: [&str; 13] = [
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
    "kimi_linear",
    "jamba",
    "falcon_h1",
    "nemotron_h",
    "granitemoehybrid",
    "bamba",
    "zamba2",
    "mamba",
    "mamba2",
];

fn arch(family: ModelFamily, spec: ModelSpec, max_seq: Option<u64>) -> Architecture {
    let n_params = spec
        .parameter_tensors()
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b));
    Architecture {
        family,
        n_params,
        spec: Box::new(spec),
        max_seq,
        positions: None,
        checkpoint: None,
        notes: Vec::new(),
        compact: String::new(),
        #[cfg(feature = "vision")]
        vlm: None,
        linear: None,
    }
}

/// Heads, key/value heads and head width, validated against each other; `defaults` (heads,
/// key/value heads, head width) stand in for absent fields where the family's config class
/// has them. Errors are kept in `r` (nothing before the reader's `finish` divides by these).
fn heads(
    r: &mut Reader,
    hidden: u64,
    hidden_name: &str,
    heads_names: &[&str],
    gqa: bool,
    defaults: Option<(u64, u64, u64)>,
) -> (u64, u64, u64) {
    let heads = match defaults {
        Some((d, _, _)) => r.opt(heads_names, d, 1, MAX_DIM),
        None => r.req(heads_names, 1, MAX_DIM),
    };
    let kv = if gqa {
        r.u64(&["num_key_value_heads"])
            .unwrap_or(defaults.map_or(heads, |(_, kv, _)| kv.min(heads)))
    } else {
        heads
    };
    let kv = r.range("num_key_value_heads", kv, 1, heads);
    if heads % kv != 0 {
        r.invalid(
            "num_key_value_heads",
            format!("{heads} attention heads are not a multiple of {kv} key/value heads"),
        );
    }
    let explicit = if gqa { r.u64(&["head_dim"]) } else { None };
    let head_dim = match explicit.or(defaults.map(|(_, _, d)| d)) {
        Some(d) => r.range("head_dim", d, 1, MAX_DIM),
        None => {
            if !hidden.is_multiple_of(heads) {
                r.invalid(
                    hidden_name,
                    format!("{hidden} is not divisible by {heads} heads"),
                );
            }
            hidden / heads
        }
    };
    // (both at most MAX_DIM: no overflow)
    if heads * head_dim > MAX_DIM {
        r.invalid(
            "head_dim",
            format!("{heads} heads of {head_dim} exceed {MAX_DIM} attention channels"),
        );
    }
    (heads, kv, head_dim)
}

/// The longest context read from a config (16M tokens: beyond any model's).
const MAX_POSITIONS: u64 = 1 << 24;

/// What a rotary model's config says of its positions, as vLLM v0.11.0 reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Positions {
    /// The longest `max_model_len` vLLM derives (`_get_and_verify_max_len`:
    /// `max_position_embeddings`, times the rope scaling factor except for llama3, longrope
    /// and Gemma 3; yarn's from `original_max_position_embeddings`).
    pub context: u64,
    /// Rows of the rotary `cos_sin_cache` one rope module holds (linear, dynamic and yarn
    /// scaling tabulate `factor` times the positions).
    pub rope_rows: u64,
}

/// The positions of a rotary decoder (`None` without `max_position_embeddings`), its rope
/// scaling `rope` as [`rope`] found it.
fn positions(
    r: &mut Reader,
    family: ModelFamily,
    rope: Option<(&'static str, &Map)>,
) -> Option<Positions> {
    let max = r.u64(&["max_position_embeddings"])?.clamp(1, MAX_POSITIONS);
    let Some((name, o)) = rope else {
        return Some(Positions {
            context: max,
            rope_rows: max,
        });
    };
    let kind = o
        .get("rope_type")
        .or_else(|| o.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = o
        .get("factor")
        .and_then(Value::as_f64)
        .filter(|f| f.is_finite() && *f >= 1.0 && *f <= 1024.0)
        .unwrap_or(1.0);
    // what serving reads of it travels in the compact config
    let mut kept = Map::new();
    for k in [
        "rope_type",
        "type",
        "factor",
        "original_max_position_embeddings",
    ] {
        if let Some(v) = o.get(k) {
            kept.insert(k.to_owned(), v.clone());
        }
    }
    r.record(name, Value::Object(kept));
    let original = o
        .get("original_max_position_embeddings")
        .and_then(Value::as_u64)
        .map_or(max, |n| n.clamp(1, MAX_POSITIONS));
    // (at most 2^24 x 1024: no overflow, and exact in f64)
    let times = |n: u64| (n as f64 * factor) as u64;
    let scaled = match kind {
        "yarn" => times(original),
        "linear" | "dynamic" => times(max),
        _ => max,
    };
    let context = if ["su", "longrope", "llama3", "default", "mrope"].contains(&kind)
        || family == ModelFamily::Gemma3
    {
        max
    } else {
        scaled
    };
    Some(Positions {
        context,
        rope_rows: scaled,
    })
}

/// Checks `rope_scaling` / `rope_parameters`: the type must be one transformers implements.
/// None of them changes training memory (they rescale frequencies), but an unknown one is a
/// typo. Returns the first of them given, with its name (what serving reads).
fn rope<'a>(r: &mut Reader<'a>) -> Option<(&'static str, &'a Map)> {
    let mut first = None;
    for name in ["rope_scaling", "rope_parameters"] {
        let Some(o) = r.object(name) else {
            continue;
        };
        first = first.or(Some((name, o)));
        let kind = o.get("rope_type").or_else(|| o.get("type"));
        match kind {
            None | Some(Value::Null) => {}
            Some(Value::String(t))
                if [
                    "default",
                    "linear",
                    "dynamic",
                    "yarn",
                    "longrope",
                    "llama3",
                    "su",
                    // Qwen2-VL / Qwen2.5-VL's multimodal rotary (the default's frequencies)
                    #[cfg(feature = "vision")]
                    "mrope",
                ]
                .contains(&t.as_str()) => {}
            Some(v) => r.invalid(
                name,
                format!(
                    "rope type {v} is not one of default, linear, dynamic, yarn, longrope, llama3"
                ),
            ),
        }
    }
    first
}

/// Which layers use a sliding window: `layer_types` when given, else the family's rule
/// (errors kept in `r`).
fn windows(family: ModelFamily, r: &mut Reader, layers: u64) -> Vec<Option<u64>> {
    let n = usize::try_from(layers).unwrap_or(usize::MAX);
    let window = |r: &mut Reader, default: u64| -> Option<u64> {
        let w = r.opt(&["sliding_window"], default, 0, u64::MAX);
        (w > 0).then_some(w)
    };
    if let Some(types) = r.array("layer_types") {
        if types.len() != n {
            r.invalid(
                "layer_types",
                format!("has {} entries for {layers} layers", types.len()),
            );
            return vec![None; n];
        }
        let w = window(r, 0);
        return types
            .iter()
            .map(|t| match t.as_str() {
                // (a hybrid's linear-attention layers: `hybrid.rs` reads which they are)
                Some("full_attention" | "linear_attention") => None,
                Some("sliding_attention") => {
                    if w.is_none() {
                        r.fail(ConfigError::MissingField("sliding_window".into()));
                    }
                    w
                }
                _ => {
                    r.invalid(
                        "layer_types",
                        format!("{t} is neither \"full_attention\" nor \"sliding_attention\""),
                    );
                    None
                }
            })
            .collect();
    }
    // the family's rule, as one loop: layer i slides from layer `from` on, except every
    // `every`-th (each rule a loop of its own cost its code). None left out is
    // `every = u64::MAX`, not 0 behind a guard: wasm-opt's --ignore-implicit-traps may
    // compute the remainder ahead of its guard, and a remainder by zero traps.
    const NONE_LEFT_OUT: u64 = u64::MAX;
    let (w, from, every) = match family {
        ModelFamily::Mistral | ModelFamily::Phi3 | ModelFamily::Mixtral => {
            (window(r, 0), 0, NONE_LEFT_OUT)
        }
        ModelFamily::Qwen2
        | ModelFamily::Qwen3
        | ModelFamily::SmolLm3
        | ModelFamily::Qwen2Moe
        | ModelFamily::Qwen3Moe
            if r.bool("use_sliding_window", false) =>
        {
            let w = window(r, 0);
            (
                w,
                r.opt(&["max_window_layers"], layers, 0, MAX_LAYERS),
                NONE_LEFT_OUT,
            )
        }
        // every odd layer (1-based)
        ModelFamily::Gemma2 => (window(r, 4096), 0, 2),
        ModelFamily::Gemma3 => {
            let w = window(r, 4096);
            (w, 0, r.opt(&["sliding_window_pattern"], 6, 1, MAX_LAYERS))
        }
        // (`Exaone4Config`: every `sliding_window_pattern`-th layer global)
        ModelFamily::Exaone4 => {
            let w = window(r, 4096);
            (w, 0, r.opt(&["sliding_window_pattern"], 4, 1, MAX_LAYERS))
        }
        _ => (None, 0, NONE_LEFT_OUT),
    };
    (0..layers)
        .map(|i| {
            if i >= from && !(i + 1).is_multiple_of(every) {
                w
            } else {
                None
            }
        })
        .collect()
}

/// Decoder-only families with rotary embeddings: Llama and its descendants.
fn decoder(family: ModelFamily, r: &mut Reader) -> Result<Architecture, ConfigError> {
    use ModelFamily as F;
    let g3 = family == F::Gemma3;
    // Gemma 3's multimodal configs leave most text fields at Gemma3TextConfig's defaults
    let dflt = |v: u64| g3.then_some(v);
    let hidden = match dflt(2304) {
        Some(d) => r.opt(&["hidden_size"], d, 1, MAX_DIM),
        None => r.req(&["hidden_size"], 1, MAX_DIM),
    };
    let layers = match dflt(26) {
        Some(d) => r.opt(&["num_hidden_layers"], d, 1, MAX_LAYERS),
        None => r.req(&["num_hidden_layers"], 1, MAX_LAYERS),
    };
    let (heads, kv_heads, head_dim) = heads(
        r,
        hidden,
        "hidden_size",
        &["num_attention_heads"],
        true,
        g3.then_some((8, 4, 256)),
    );
    // multi-head latent attention: q/k heads of nope + rope dims, values of their own size
    let latent = if family == F::DeepseekV3 {
        let rope_dim = r.req(&["qk_rope_head_dim"], 1, MAX_DIM);
        let nope_dim = r.req(&["qk_nope_head_dim"], 0, MAX_DIM);
        Some(Latent {
            q_rank: r
                .u64(&["q_lora_rank"])
                .map(|q| r.range("q_lora_rank", q, 1, MAX_DIM)),
            kv_rank: r.req(&["kv_lora_rank"], 1, MAX_DIM),
            rope_dim,
            nope_dim,
        })
    } else {
        None
    };
    let (head_dim, v_head_dim) = match latent {
        Some(l) => (l.nope_dim + l.rope_dim, r.req(&["v_head_dim"], 1, MAX_DIM)),
        None => (head_dim, head_dim),
    };
    let intermediate = match dflt(9216) {
        Some(d) => r.opt(&["intermediate_size"], d, 1, 1 << 22),
        None => r.req(&["intermediate_size"], 1, 1 << 22),
    };
    let vocab = match dflt(262_208) {
        Some(d) => r.opt(&["vocab_size"], d, 1, MAX_VOCAB),
        None => r.req(&["vocab_size"], 1, MAX_VOCAB),
    };
    let rope_scaling = rope(r);
    let served = positions(r, family, rope_scaling);
    let gemma = matches!(family, F::Gemma | F::Gemma2 | F::Gemma3);
    let tied = r.bool("tie_word_embeddings", gemma || family == F::SmolLm3);
    let attention_bias = r.bool("attention_bias", false);
    let (qkv_bias, o_bias) = match family {
        F::Qwen2 | F::Qwen2Moe => (true, false),
        F::Phi3 => (false, false),
        _ => (attention_bias, attention_bias),
    };
    let mlp_bias = match family {
        F::Llama | F::Granite | F::SmolLm3 => r.bool("mlp_bias", false),
        _ => false,
    };
    let probs_dropout = r.prob(&["attention_dropout"], 0.0);
    let hidden_dropout = if family == F::Phi3 {
        r.prob(&["resid_pdrop"], 0.0)
    } else {
        false
    };
    let rotary_dim = if family == F::Phi3 {
        match r.positive("partial_rotary_factor") {
            None => head_dim,
            Some(f) if f <= 1.0 => {
                // transformers: int(head_dim * partial_rotary_factor)
                let d = (head_dim as f64 * f) as u64;
                r.range("partial_rotary_factor", d, 1, head_dim)
            }
            Some(_) => {
                // the typed value, not the f64: formatting floats would pull a float printer
                // into the bundle
                r.invalid("partial_rotary_factor", "must be in (0, 1]".into());
                head_dim
            }
        }
    } else if let Some(l) = latent {
        l.rope_dim
    } else {
        head_dim
    };
    let ropes: Vec<bool> = if family == F::SmolLm3 {
        match r.array("no_rope_layers") {
            Some(list) if list.len() as u64 != layers => {
                r.invalid(
                    "no_rope_layers",
                    format!("has {} entries for {layers} layers", list.len()),
                );
                Vec::new()
            }
            Some(list) => list
                .iter()
                .map(|v| match v.as_u64() {
                    Some(0) => false,
                    Some(1) => true,
                    _ => {
                        r.invalid(
                            "no_rope_layers",
                            format!("entries are 1 (rotary) or 0 (none), got {v}"),
                        );
                        true
                    }
                })
                .collect(),
            None => {
                let every = r.opt(&["no_rope_layer_interval"], 4, 1, MAX_LAYERS);
                (0..layers)
                    .map(|i| !(i + 1).is_multiple_of(every))
                    .collect()
            }
        }
    } else {
        vec![true; layers as usize]
    };
    let windows = windows(family, r, layers);
    // EXAONE 4's global layers take no positions beside sliding ones ("global NoPE")
    let ropes: Vec<bool> = if family == F::Exaone4 && windows.iter().any(Option::is_some) {
        windows.iter().map(Option::is_some).collect()
    } else {
        ropes
    };
    let (attn_softcap, final_softcap) = if matches!(family, F::Gemma2 | F::Gemma3) {
        (
            r.positive("attn_logit_softcapping").is_some(),
            r.positive("final_logit_softcapping").is_some(),
        )
    } else {
        (false, false)
    };
    let (embed_scale, logits_scaled) = match family {
        F::Granite => {
            r.positive("embedding_multiplier");
            r.positive("residual_multiplier");
            r.positive("attention_multiplier");
            r.positive("logits_scaling");
            (EmbedScale::Scalar, true)
        }
        _ if gemma => (EmbedScale::Tensor, false),
        _ => (EmbedScale::None, false),
    };
    let (norm, placement, qk_norm) = match family {
        F::Gemma | F::Gemma2 => (RmsStyle::Gemma, Placement::Pre, None),
        F::Gemma3 => (
            RmsStyle::Gemma,
            Placement::Sandwich,
            Some(QkNorm {
                style: RmsStyle::Gemma,
                per_head: true,
            }),
        ),
        F::Qwen3 => (
            RmsStyle::Llama,
            Placement::Pre,
            Some(QkNorm {
                style: RmsStyle::Llama,
                per_head: true,
            }),
        ),
        F::Qwen3Moe => (
            RmsStyle::Llama,
            Placement::Pre,
            Some(QkNorm {
                style: RmsStyle::Llama,
                per_head: true,
            }),
        ),
        F::GptOss => (RmsStyle::Olmo2, Placement::Pre, None),
        F::Exaone4 => (
            RmsStyle::Llama,
            Placement::Post,
            Some(QkNorm {
                style: RmsStyle::Llama,
                per_head: true,
            }),
        ),
        F::Olmo2 => (
            RmsStyle::Olmo2,
            Placement::Post,
            Some(QkNorm {
                style: RmsStyle::Olmo2,
                per_head: false,
            }),
        ),
        _ => (RmsStyle::Llama, Placement::Pre, None),
    };
    let placement = if family == F::Gemma2 {
        Placement::Sandwich
    } else {
        placement
    };
    let mlp = Mlp {
        kind: MlpKind::Gated {
            fused: family == F::Phi3,
        },
        hidden,
        inner: intermediate,
        bias: mlp_bias,
        act: Activation::Kernel,
    };
    let moe = moe(family, r, hidden);
    let mut layers = Vec::with_capacity(windows.len());
    for (i, (window, rope)) in windows.iter().zip(&ropes).enumerate() {
        let ffn = match moe {
            Some(m) if sparse_layer(family, r, i as u64) => FeedForward::Moe(m),
            _ => FeedForward::Dense(mlp),
        };
        layers.push(Layer {
            attention: Attention {
                hidden,
                heads,
                kv_heads,
                head_dim,
                fused_qkv: family == F::Phi3,
                qkv_bias,
                o_bias,
                qk_norm,
                rotary_dim: rope.then_some(rotary_dim),
                window: *window,
                softcap: attn_softcap,
                sinks: family == F::GptOss,
                latent,
                v_head_dim,
                probs_dropout,
                softmax_fp32: true,
                rope_keeps_dtype: family == F::Olmo2,
                rope_concat: family == F::Phi3,
            },
            mlp: ffn,
            norm: NormKind::Rms(norm),
            placement,
            hidden_dropout,
        });
    }
    let any_rope = ropes.iter().any(|r| *r);
    // one rotary module (inv_freq and original_inv_freq); Gemma 3 has a local and a global one
    let rotary_modules = match (any_rope, g3) {
        (false, _) => 0,
        (true, true) => 2,
        (true, false) => 1,
    };
    let mut buffers = vec![(rotary_dim / 2, 4); 2 * rotary_modules];
    if family == F::DeepseekV3 {
        // each router's e_score_correction_bias (fp32)
        for l in &layers {
            if let FeedForward::Moe(m) = l.mlp {
                buffers.push((m.experts, 4));
            }
        }
    }
    if g3 {
        buffers.push((1, 4)); // embed_scale
    }
    // gpt-oss's MXFP4 experts: the last field read
    let quant_method = r
        .object("quantization_config")
        .and_then(|q| q.get("quant_method"))
        .and_then(Value::as_str);
    let mxfp4 = family == F::GptOss && quant_method == Some("mxfp4");
    // the format the checkpoint's weights are stored in, for serving (compressed-tensors
    // names several: left to the weight-format choice)
    let checkpoint = match quant_method {
        Some("awq" | "gptq" | "awq_marlin" | "gptq_marlin") => {
            Some(crate::WeightFormat::Int4Group128)
        }
        Some("fp8") => Some(crate::WeightFormat::Fp8),
        Some("mxfp4") => Some(crate::WeightFormat::Mxfp4),
        _ => None,
    };
    r.finish()?;
    let spec = ModelSpec {
        embeds: true,
        heads: true,
        embedding: Embedding {
            vocab,
            hidden,
            positions: 0,
            token_types: 0,
            index_tensors: 0,
            norm: false,
            dropout: false,
            scale: embed_scale,
            proj: 0,
        },
        vision: None,
        layers,
        final_norm: Some(NormKind::Rms(norm)),
        head: Head::CausalLm {
            softcap: final_softcap,
            scaled: logits_scaled,
            loss_in_graph: true,
        },
        tied,
        // gpt-oss rotates the two halves of each head with tables of half its width
        rotary_width: if family == F::GptOss {
            rotary_dim / 2
        } else {
            rotary_dim
        },
        rotary_per_attention_type: g3,
        rotary_fp32: family == F::Olmo2,
        buffers,
    };
    let mut a = arch(family, spec, None);
    a.positions = served;
    a.checkpoint = checkpoint;
    if family == F::Gemma2 && attn_softcap {
        a.notes.push(GEMMA2_EAGER_NOTE);
    }
    if family == F::GptOss {
        a.notes.push(GPT_OSS_EAGER_NOTE);
        if mxfp4 {
            r.record(
                "quantization_config",
                Value::Object(Map::from([(
                    "quant_method".to_owned(),
                    Value::String("mxfp4".to_owned()),
                )])),
            );
            a.notes.push(MXFP4_NOTE);
        }
    }
    if moe.is_some() {
        a.notes.push(MOE_NOTE);
    }
    Ok(a)
}

/// The routed experts of a MoE family, if it is one.
fn moe(family: ModelFamily, r: &mut Reader, hidden: u64) -> Option<Moe> {
    use ModelFamily as F;
    let (experts_names, inner_names): (&[&str], &[&str]) = match family {
        F::Mixtral | F::GptOss => (&["num_local_experts"], &["intermediate_size"]),
        F::Qwen2Moe | F::Qwen3Moe => (&["num_experts"], &["moe_intermediate_size"]),
        F::DeepseekV3 => (&["n_routed_experts"], &["moe_intermediate_size"]),
        _ => return None,
    };
    let experts = r.req(experts_names, 1, 1 << 16);
    let top_k = r.req(&["num_experts_per_tok", "experts_per_token"], 1, experts);
    let inner = r.req(inner_names, 1, 1 << 22);
    let norm_topk = |r: &mut Reader, default| r.bool("norm_topk_prob", default);
    let (router, shared_inner, shared_gate) = match family {
        F::Mixtral => (
            Router::Softmax {
                norm_topk: true,
                weights_fp32: true,
            },
            0,
            false,
        ),
        F::Qwen2Moe => (
            Router::Softmax {
                norm_topk: norm_topk(r, false),
                weights_fp32: false,
            },
            r.opt(&["shared_expert_intermediate_size"], 0, 0, 1 << 22),
            true,
        ),
        F::Qwen3Moe => (
            Router::Softmax {
                norm_topk: norm_topk(r, false),
                weights_fp32: false,
            },
            0,
            false,
        ),
        F::DeepseekV3 => {
            let groups = r.opt(&["n_group"], 1, 1, experts);
            let topk_groups = r.opt(&["topk_group"], 1, 1, groups);
            let shared = r.opt(&["n_shared_experts"], 0, 0, 1 << 10);
            (
                Router::SigmoidGrouped {
                    groups,
                    topk_groups,
                    norm_topk: norm_topk(r, true),
                },
                shared.saturating_mul(inner),
                false,
            )
        }
        _ => (Router::TopkSoftmax, 0, false),
    };
    let gpt_oss = family == F::GptOss;
    Some(Moe {
        hidden,
        experts,
        top_k,
        inner,
        router,
        router_bias: gpt_oss,
        expert_bias: gpt_oss,
        act: if gpt_oss {
            ExpertAct::ClampedSwiglu
        } else {
            ExpertAct::Glu
        },
        shared_inner,
        shared_gate: shared_gate && shared_inner > 0,
    })
}

/// Whether layer `i` of a MoE family routes to experts (else it is a dense MLP).
fn sparse_layer(family: ModelFamily, r: &mut Reader, i: u64) -> bool {
    use ModelFamily as F;
    match family {
        F::Qwen2Moe | F::Qwen3Moe => {
            let step = r.opt(&["decoder_sparse_step"], 1, 1, MAX_LAYERS);
            let dense_only = match r.array("mlp_only_layers") {
                Some(list) => list.iter().any(|v| v.as_u64() == Some(i)),
                None => false,
            };
            !dense_only && (i + 1).is_multiple_of(step)
        }
        F::DeepseekV3 => i >= r.opt(&["first_k_dense_replace"], 0, 0, MAX_LAYERS),
        _ => true,
    }
}

fn gpt2(r: &mut Reader) -> Result<Architecture, ConfigError> {
    let hidden = r.req(&["n_embd", "hidden_size"], 1, MAX_DIM);
    let layers = r.req(&["n_layer", "num_hidden_layers"], 1, MAX_LAYERS);
    let (heads, _, head_dim) = heads(
        r,
        hidden,
        "n_embd",
        &["n_head", "num_attention_heads"],
        false,
        None,
    );
    let intermediate = r.opt(&["n_inner"], 4 * hidden, 1, 1 << 22);
    let vocab = r.req(&["vocab_size"], 1, MAX_VOCAB);
    let positions = r.opt(&["n_positions", "n_ctx"], 1024, 1, MAX_VOCAB);
    let tied = r.bool("tie_word_embeddings", true);
    let attn_dropout = r.prob(&["attn_pdrop"], 0.1);
    let resid_dropout = r.prob(&["resid_pdrop"], 0.1);
    let embd_dropout = r.prob(&["embd_pdrop"], if resid_dropout { 0.1 } else { 0.0 });
    let act = match r.string("activation_function") {
        None | Some("gelu_new") => Activation::PythonGeluTanh,
        Some(_) => Activation::Kernel,
    };
    r.finish()?;
    let layer = Layer {
        attention: Attention {
            fused_qkv: true,
            probs_dropout: attn_dropout,
            ..Attention::classic(hidden, heads, head_dim)
        },
        mlp: FeedForward::Dense(Mlp::plain(hidden, intermediate, act)),
        norm: NormKind::LayerNorm,
        placement: Placement::Pre,
        hidden_dropout: resid_dropout,
    };
    let spec = ModelSpec {
        embeds: true,
        heads: true,
        embedding: Embedding {
            vocab,
            hidden,
            positions,
            token_types: 0,
            index_tensors: 0,
            norm: false,
            dropout: embd_dropout,
            scale: EmbedScale::None,
            proj: 0,
        },
        vision: None,
        layers: vec![layer; layers as usize],
        final_norm: Some(NormKind::LayerNorm),
        head: Head::CausalLm {
            softcap: false,
            scaled: false,
            loss_in_graph: false,
        },
        tied,
        rotary_width: 0,
        rotary_per_attention_type: false,
        rotary_fp32: false,
        buffers: Vec::new(),
    };
    Ok(arch(ModelFamily::Gpt2, spec, Some(positions)))
}

/// OPT (`OPTForCausalLM`, transformers' `modeling_opt.py`): learned positions with two extra
/// rows (`OPTLearnedPositionalEmbedding`'s offset), looked up by `batch x seq` int64 ids built
/// per forward (kept by the lookup); q/k/v/out projections and `fc1`/`fc2` with biases
/// (`enable_bias`); ReLU by default; dropout after each sub-block, none on the embeddings;
/// LayerNorms before the sub-blocks with a final one (`do_layer_norm_before`), or after the
/// residual adds without a final one (opt-350m); `project_in` / `project_out` when
/// `word_embed_proj_dim` differs from `hidden_size`; the head tied to the token embeddings.
fn opt(r: &mut Reader) -> Result<Architecture, ConfigError> {
    let (hidden, layers, heads, head_dim) = encoder_shape(r);
    let ffn = r.req(&["ffn_dim"], 1, 1 << 22);
    let vocab = r.req(&["vocab_size"], 1, MAX_VOCAB);
    let max_positions = r.opt(&["max_position_embeddings"], 2048, 1, MAX_VOCAB);
    let proj = r.opt(&["word_embed_proj_dim"], hidden, 1, MAX_DIM);
    let pre_norm = r.bool("do_layer_norm_before", true);
    let remove_final_norm = r.bool("_remove_final_layer_norm", false);
    let bias = r.bool("enable_bias", true);
    if !r.bool("layer_norm_elementwise_affine", true) {
        r.invalid(
            "layer_norm_elementwise_affine",
            "LayerNorms without weights are not modelled".into(),
        );
    }
    let tied = r.bool("tie_word_embeddings", true);
    let dropout = r.prob(&["dropout"], 0.1);
    let attn_dropout = r.prob(&["attention_dropout"], 0.0);
    let act = match r.string("activation_function") {
        None | Some("relu") => Activation::Relu,
        Some(_) => Activation::Kernel,
    };
    r.finish()?;
    let layer = Layer {
        attention: Attention {
            qkv_bias: bias,
            o_bias: bias,
            probs_dropout: attn_dropout,
            // eager: softmax(..., dtype=float32).to(query.dtype)
            softmax_fp32: true,
            ..Attention::classic(hidden, heads, head_dim)
        },
        mlp: FeedForward::Dense(Mlp {
            bias,
            ..Mlp::plain(hidden, ffn, act)
        }),
        norm: NormKind::LayerNorm,
        placement: if pre_norm {
            Placement::Pre
        } else {
            Placement::PostResidual
        },
        hidden_dropout: dropout,
    };
    let spec = ModelSpec {
        embeds: true,
        heads: true,
        embedding: Embedding {
            vocab,
            hidden,
            positions: max_positions + 2,
            token_types: 0,
            index_tensors: 1,
            norm: false,
            dropout: false,
            scale: EmbedScale::None,
            proj: if proj == hidden { 0 } else { proj },
        },
        vision: None,
        layers: vec![layer; layers as usize],
        final_norm: (pre_norm && !remove_final_norm).then_some(NormKind::LayerNorm),
        head: Head::CausalLm {
            softcap: false,
            scaled: false,
            loss_in_graph: true,
        },
        tied,
        rotary_width: 0,
        rotary_per_attention_type: false,
        rotary_fp32: false,
        buffers: Vec::new(),
    };
    Ok(arch(ModelFamily::Opt, spec, Some(max_positions)))
}

/// Width, layers, heads and head width of a model with one key/value head per query head
/// (the BERT family, ViT, OPT).
fn encoder_shape(r: &mut Reader) -> (u64, u64, u64, u64) {
    let hidden = r.req(&["hidden_size"], 1, MAX_DIM);
    let layers = r.req(&["num_hidden_layers"], 1, MAX_LAYERS);
    let (heads, _, head_dim) = heads(
        r,
        hidden,
        "hidden_size",
        &["num_attention_heads"],
        false,
        None,
    );
    (hidden, layers, heads, head_dim)
}

/// BERT, RoBERTa and XLM-RoBERTa as masked-LM encoders.
fn encoder(family: ModelFamily, r: &mut Reader) -> Result<Architecture, ConfigError> {
    let roberta = family != ModelFamily::Bert;
    let (hidden, layers, heads, head_dim) = encoder_shape(r);
    let intermediate = r.req(&["intermediate_size"], 1, 1 << 22);
    let vocab = r.req(&["vocab_size"], 1, MAX_VOCAB);
    let positions = r.opt(
        &["max_position_embeddings"],
        if roberta { 514 } else { 512 },
        1,
        MAX_VOCAB,
    );
    // RoBERTa numbers positions from padding_idx + 1, so two rows are never used by text
    let pad = if roberta {
        r.opt(&["pad_token_id"], 1, 0, MAX_VOCAB) + 1
    } else {
        0
    };
    if positions <= pad {
        r.invalid(
            "max_position_embeddings",
            format!("{positions} leaves no position after the padding offset {pad}"),
        );
    }
    let token_types = r.opt(&["type_vocab_size"], 2, 0, MAX_VOCAB);
    let tied = r.bool("tie_word_embeddings", true);
    let attn_dropout = r.prob(&["attention_probs_dropout_prob"], 0.1);
    let hidden_dropout = r.prob(&["hidden_dropout_prob"], 0.1);
    // (before `positions - pad`)
    r.finish()?;
    let layer = Layer {
        attention: Attention {
            fused_qkv: false,
            probs_dropout: attn_dropout,
            ..Attention::classic(hidden, heads, head_dim)
        },
        mlp: FeedForward::Dense(Mlp::plain(hidden, intermediate, Activation::Kernel)),
        norm: NormKind::LayerNorm,
        placement: Placement::PostResidual,
        hidden_dropout,
    };
    let spec = ModelSpec {
        embeds: true,
        heads: true,
        embedding: Embedding {
            vocab,
            hidden,
            positions,
            token_types,
            index_tensors: if roberta { 2 } else { 0 },
            norm: true,
            dropout: hidden_dropout,
            scale: EmbedScale::None,
            proj: 0,
        },
        vision: None,
        layers: vec![layer; layers as usize],
        final_norm: None,
        head: Head::MaskedLm,
        tied,
        rotary_width: 0,
        rotary_per_attention_type: false,
        rotary_fp32: false,
        // position_ids and token_type_ids buffers (int64)
        buffers: vec![(positions, 8), (positions, 8)],
    };
    Ok(arch(family, spec, Some(positions - pad)))
}

fn vit(r: &mut Reader) -> Result<Architecture, ConfigError> {
    let (hidden, layers, heads, head_dim) = encoder_shape(r);
    let intermediate = r.opt(&["intermediate_size", "mlp_dim"], 4 * hidden, 1, 1 << 22);
    let classes = r.opt(&["num_labels", "num_classes"], 1000, 1, MAX_VOCAB);
    let image = r.opt(&["image_size"], 224, 1, 1 << 16);
    let patch = r.opt(&["patch_size"], 16, 1, image);
    if !image.is_multiple_of(patch) {
        r.invalid(
            "image_size",
            format!("{image} is not a multiple of patch_size {patch}"),
        );
    }
    r.finish()?;
    let layer = Layer {
        attention: Attention {
            fused_qkv: true,
            probs_dropout: false,
            ..Attention::classic(hidden, heads, head_dim)
        },
        mlp: FeedForward::Dense(Mlp::plain(hidden, intermediate, Activation::Kernel)),
        norm: NormKind::LayerNorm,
        placement: Placement::Pre,
        hidden_dropout: false,
    };
    let spec = ModelSpec {
        embeds: true,
        heads: true,
        embedding: Embedding {
            vocab: classes,
            hidden,
            positions: 0,
            token_types: 0,
            index_tensors: 0,
            norm: false,
            dropout: false,
            scale: EmbedScale::None,
            proj: 0,
        },
        vision: Some(Vision { image, patch }),
        layers: vec![layer; layers as usize],
        final_norm: Some(NormKind::LayerNorm),
        head: Head::ImageClassifier,
        tied: false,
        rotary_width: 0,
        rotary_per_attention_type: false,
        rotary_fp32: false,
        buffers: Vec::new(),
    };
    Ok(arch(ModelFamily::Vit, spec, None))
}

/// Parses a Hugging Face `config.json` (or the compact form of [`Architecture::to_config_json`]).
///
/// # Errors
/// [`ConfigError`] naming the offending field or `model_type`.
pub fn parse_hf_config(json: &str) -> Result<Architecture, ConfigError> {
    let value = crate::json::parse(json).map_err(|e| ConfigError::InvalidJson(e.to_string()))?;
    let m = value
        .as_object()
        .ok_or_else(|| ConfigError::InvalidJson("top level is not an object".into()))?;
    read(m)
}
