//! The vision-language wrappers (`qwen2_5_vl`, `qwen3_vl`, `gemma3` with its `vision_config`,
//! `llava` / `llava_next`, `idefics3` / `smolvlm`, `mllama`): their language model through the
//! text readers above, their vision side into `vision.rs`'s data (the `vision` feature).

use super::super::vision::{Processor, Tower, VisionLm, VlmKind, MAX_IMAGE_SIDE};
use super::{decoder, Architecture, ConfigError, Map, ModelFamily, Reader, Value};
use super::{MAX_DIM, MAX_LAYERS};

/// Shown for every vision-language config.
const MULTIMODAL_NOTE: &str =
    "Vision-language model: the vision tower's and projector's weights are counted with or without images. Without images (a text-only batch) the vision side does not run: no vision activations, and no gradients or optimizer state for it, trained or not. With images the tower, its projector and the image tokens are counted in full. DPO, GRPO and tensor, context or pipeline parallelism are modelled for the language model alone, on text-only batches.";

/// Shown for an Idefics3 / SmolVLM config without its processor's `size`.
const IDEFICS3_EDGE_NOTE: &str =
    "No preprocessor size in this Idefics3 / SmolVLM config: each image is resized to a longest edge of 4 x the vision tower's image_size (as SmolVLM's published processors do: 2048 pixels for 512-pixel tiles), then split into tiles of the tower's size. To use the checkpoint's own, add its preprocessor_config.json to the pasted config as a \"preprocessor_config\" object (its size.longest_edge is read).";

/// The vision-language wrappers read here: their language model is one of the text
/// families, their vision side by [`read_vision`].
pub(super) fn vision_language(model_type: &str) -> Option<VlmKind> {
    Some(match model_type {
        "gemma3" => VlmKind::Gemma3,
        "qwen2_5_vl" => VlmKind::Qwen25Vl,
        "qwen3_vl" => VlmKind::Qwen3Vl,
        "idefics3" | "smolvlm" => VlmKind::Idefics3,
        "llava" | "llava_next" => VlmKind::LlavaNext,
        "mllama" => VlmKind::Mllama,
        _ => return None,
    })
}

/// A vision-language config: the language model from `text_config` (or, for the older flat
/// Qwen2.5-VL configs, from the top level), filled with its config class's defaults where
/// the published files rely on them, then the vision side, which `estimate_vlm` adds to the
/// step (its weights only on a text-only batch, as the note says).
pub(super) fn vision_language_model(
    kind: VlmKind,
    model_type: &str,
    m: &Map,
) -> Result<Architecture, ConfigError> {
    let mut outer = Reader::new(m);
    outer.record("model_type", model_type.into());
    let text = outer.object("text_config");
    outer.finish()?;
    let text = match text {
        Some(t) => t.clone(),
        None if kind == VlmKind::Qwen25Vl => {
            let mut t = m.clone();
            t.remove("vision_config");
            t.remove("preprocessor_config");
            t
        }
        None => return Err(ConfigError::MissingField("text_config".into())),
    };
    let text_type = text.get("model_type").and_then(Value::as_str).unwrap_or("");
    let family = match kind {
        VlmKind::Gemma3 => ModelFamily::Gemma3,
        VlmKind::Qwen25Vl => ModelFamily::Qwen2,
        VlmKind::Qwen3Vl => ModelFamily::Qwen3,
        VlmKind::Idefics3 | VlmKind::Mllama => ModelFamily::Llama,
        VlmKind::LlavaNext => match ModelFamily::from_key(text_type) {
            Some(f)
                if !matches!(
                    f,
                    ModelFamily::Gpt2
                        | ModelFamily::Opt
                        | ModelFamily::Bert
                        | ModelFamily::Roberta
                        | ModelFamily::XlmRoberta
                        | ModelFamily::Vit
                ) =>
            {
                f
            }
            Some(_) => {
                return Err(ConfigError::InvalidField {
                    field: "text_config.model_type".into(),
                    reason: "not a decoder language model".into(),
                })
            }
            None => ModelFamily::Llama,
        },
    };
    let mut text = text;
    // the language model's head is tied or not as the wrapper says
    if !text.contains_key("tie_word_embeddings") && kind != VlmKind::Gemma3 {
        if let Some(v) = m.get("tie_word_embeddings") {
            text.insert("tie_word_embeddings".into(), v.clone());
        }
    }
    // LLaVA configs leave the text model at its class's defaults (Mistral / Llama 7B)
    if kind == VlmKind::LlavaNext {
        let mistral = family == ModelFamily::Mistral;
        // (the class's grouped heads only where its head count is the default too)
        let kv_default = !text.contains_key("num_attention_heads");
        for (key, value) in [
            ("hidden_size", 4096u64),
            ("num_attention_heads", 32),
            ("num_hidden_layers", 32),
            ("intermediate_size", if mistral { 14336 } else { 11008 }),
            ("vocab_size", 32000),
            ("num_key_value_heads", if mistral { 8 } else { 32 }),
        ] {
            if !text.contains_key(key) && (key != "num_key_value_heads" || kv_default) {
                text.insert(key.into(), Value::from(value));
            }
        }
    }
    let cross_layers = match text.get("cross_attention_layers") {
        Some(Value::Array(a)) if kind == VlmKind::Mllama => a.len() as u64,
        _ => 0,
    };
    let mut inner = Reader::new(&text);
    let mut arch = decoder(family, &mut inner)?;
    if kind == VlmKind::Mllama {
        inner.record(
            "cross_attention_layers",
            text.get("cross_attention_layers")
                .cloned()
                .unwrap_or(Value::Array(Vec::new())),
        );
    }
    if let Some(t) = text.get("model_type") {
        inner.record("model_type", t.clone());
    }
    outer.record("text_config", Value::Object(inner.used));
    let has_vision = m.get("vision_config").is_some_and(|v| *v != Value::Null);
    let mut vision_notes = Vec::new();
    if has_vision || kind != VlmKind::Gemma3 {
        let heads = (arch.num_heads(), arch.num_kv_heads(), arch.head_dim());
        let vision = read_vision(
            kind,
            &mut outer,
            arch.hidden_size(),
            heads,
            arch.vocab_size(),
            cross_layers,
            &mut vision_notes,
        )?;
        arch.vlm = Some(Box::new(vision));
    }
    arch.notes.insert(0, MULTIMODAL_NOTE);
    arch.notes.extend(vision_notes);
    arch.compact = Value::Object(outer.used).to_string();
    Ok(arch)
}

/// `a x b`, saturating: one copy of the 128-bit multiply that checks it (`__multi3` in
/// WebAssembly) instead of one at each tensor.
#[inline(never)]
fn mul(a: u64, b: u64) -> u64 {
    a.saturating_mul(b)
}

#[inline(never)]
fn linear(v: &mut Vec<u64>, n_in: u64, n_out: u64, bias: bool) {
    v.push(mul(n_in, n_out));
    if bias {
        v.push(n_out);
    }
}

#[inline(never)]
fn layer_norm(v: &mut Vec<u64>, c: u64) {
    v.push(c);
    v.push(c);
}

/// A SigLIP / CLIP encoder layer: two LayerNorms, q/k/v/o with biases, fc1/fc2.
#[inline(never)]
fn encoder_layer(v: &mut Vec<u64>, c: u64, i: u64, bias: bool) {
    layer_norm(v, c);
    for _ in 0..4 {
        linear(v, c, c, bias);
    }
    layer_norm(v, c);
    linear(v, c, i, true);
    linear(v, i, c, true);
}

/// The tower fields of Qwen2.5-VL's and Qwen3-VL's `vision_config`, read in this order: width,
/// MLP width, heads, blocks, patch side.
const QWEN_TOWER: [&str; 5] = [
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "depth",
    "patch_size",
];
/// SigLIP's and CLIP's (Gemma 3, Idefics3, LLaVA).
const SIGLIP_TOWER: [&str; 5] = [
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_hidden_layers",
    "patch_size",
];
/// Mllama's.
const MLLAMA_TOWER: [&str; 5] = [
    "hidden_size",
    "intermediate_size",
    "attention_heads",
    "num_hidden_layers",
    "patch_size",
];

/// `vision_config`'s tower fields `names` (in [`QWEN_TOWER`]'s order), each defaulting to the
/// config class's value in `defaults` (errors kept in `r`). A loop over tables: each field
/// read at its own call site cost its arguments' code.
fn tower(r: &mut Reader, names: &[&str; 5], defaults: &[u64; 5]) -> Tower {
    const HI: [u64; 5] = [MAX_DIM, MAX_DIM, MAX_DIM, MAX_LAYERS, 4096];
    let mut v = [0; 5];
    for i in 0..5 {
        v[i] = r.opt(&[names[i]], defaults[i], 1, HI[i]);
    }
    let [hidden, inner, heads, layers, patch] = v;
    if !hidden.is_multiple_of(heads) {
        r.invalid(
            "vision_config.hidden_size",
            format!("{hidden} is not divisible by {heads} heads"),
        );
    }
    Tower {
        hidden,
        inner,
        heads,
        layers,
        patch,
    }
}

/// A `{"longest_edge": n}`-style size, or a plain number, from the preprocessor block.
fn edge(o: Option<&Value>, key: &str) -> Option<u64> {
    match o {
        Some(Value::Object(m)) => m.get(key).and_then(Value::as_u64),
        Some(v) => v.as_u64(),
        None => None,
    }
}

/// Reads the vision side of a multimodal config whose language model `lm_hidden` wide with
/// `lm_heads` (query heads, key/value heads, head width) was read already; records the
/// fields used in `outer`.
fn read_vision(
    kind: VlmKind,
    outer: &mut Reader,
    lm_hidden: u64,
    lm_heads: (u64, u64, u64),
    lm_vocab: u64,
    cross_layers: u64,
    notes: &mut Vec<&'static str>,
) -> Result<VisionLm, ConfigError> {
    // The readers of the vision_config (`r`) and of the preprocessor block (`pr`) hand their
    // first error on to the reader that reads next (`adopt`), and `outer` reports it at the
    // end: one exit for all of them. (A bad preprocessor block's error, kept in `outer`, comes
    // before all of theirs.)
    let vc = outer.required_object("vision_config")?;
    let pre = outer.object("preprocessor_config");
    let empty = Map::new();
    let pre_map = pre.unwrap_or(&empty);
    let mut r = Reader::new(vc);
    let mut pr = Reader::new(pre_map);
    let mut tower_params = Vec::new();
    let mut projector_params = Vec::new();
    let mut lm_extra_params = Vec::new();
    let mut keep_pre = true;
    // what the branches set, the rest of the VisionLm built at the end (a placeholder
    // processor replaced in place cost a drop at each)
    let (mut full_blocks, mut window_units, mut deepstack, mut scale) = (0, 0, 0, 1);
    let (mut global_layers, mut vision_output, mut unused_layers) = (0, 0, 0);
    let mut gradless_tail = 0;
    let mut class_feature = false;
    let processor;
    let tower = match kind {
        VlmKind::Qwen25Vl | VlmKind::Qwen3Vl => {
            let q3 = kind == VlmKind::Qwen3Vl;
            let t = tower(
                &mut r,
                &QWEN_TOWER,
                if q3 {
                    &[1152, 4304, 16, 27, 16]
                } else {
                    &[1280, 3420, 16, 32, 14]
                },
            );
            let temporal = r.opt(&["temporal_patch_size"], 2, 1, 16);
            let merge = r.opt(&["spatial_merge_size"], 2, 1, 16);
            let out_hidden = r.opt(&["out_hidden_size"], lm_hidden, 1, MAX_DIM);
            let (c, i) = (t.hidden, t.inner);
            let kernel = 3 * temporal * t.patch * t.patch;
            let mc = mul(c, merge * merge);
            if q3 {
                linear(&mut tower_params, kernel, c, true);
                let positions = r.opt(&["num_position_embeddings"], 2304, 1, 1 << 24);
                tower_params.push(mul(positions, c));
                for _ in 0..t.layers {
                    layer_norm(&mut tower_params, c);
                    layer_norm(&mut tower_params, c);
                    linear(&mut tower_params, c, 3 * c, true);
                    linear(&mut tower_params, c, c, true);
                    linear(&mut tower_params, c, i, true);
                    linear(&mut tower_params, i, c, true);
                }
                let deep = match r.array("deepstack_visual_indexes") {
                    Some(a) => {
                        if !a.iter().all(|v| v.as_u64().is_some_and(|x| x < t.layers)) {
                            r.invalid(
                                "vision_config.deepstack_visual_indexes",
                                "expected block indexes below the depth".into(),
                            );
                        }
                        a.len() as u64
                    }
                    None => 0,
                };
                // the merger (LayerNorm before the shuffle) and each deepstack merger
                // (LayerNorm after it)
                for norm in std::iter::once(c).chain(std::iter::repeat_n(mc, deep as usize)) {
                    layer_norm(&mut projector_params, norm);
                    linear(&mut projector_params, mc, mc, true);
                    linear(&mut projector_params, mc, out_hidden, true);
                }
                deepstack = deep;
            } else {
                linear(&mut tower_params, kernel, c, false);
                for _ in 0..t.layers {
                    tower_params.push(c);
                    tower_params.push(c);
                    linear(&mut tower_params, c, 3 * c, true);
                    linear(&mut tower_params, c, c, true);
                    linear(&mut tower_params, c, i, true);
                    linear(&mut tower_params, c, i, true);
                    linear(&mut tower_params, i, c, true);
                }
                projector_params.push(c);
                linear(&mut projector_params, mc, mc, true);
                linear(&mut projector_params, mc, out_hidden, true);
                let full = match r.array("fullatt_block_indexes") {
                    Some(a) => a
                        .iter()
                        .filter(|v| v.as_u64().is_some_and(|x| x < t.layers))
                        .count() as u64,
                    None => t.layers,
                };
                full_blocks = full;
                let window = r.opt(&["window_size"], 112, 1, 1 << 16);
                window_units = (window / merge / t.patch).max(1);
            }
            pr.adopt(&mut r);
            // the checkpoint's preprocessor (the class defaults differ: VLM.md)
            let (min_default, max_default) = if q3 {
                (65_536, 16_777_216)
            } else {
                (3_136, 12_845_056)
            };
            let size = pre_map.get("size");
            let min_pixels = edge(pre_map.get("min_pixels"), "")
                .or_else(|| edge(size, "shortest_edge"))
                .unwrap_or(min_default);
            let max_pixels = edge(pre_map.get("max_pixels"), "")
                .or_else(|| edge(size, "longest_edge"))
                .unwrap_or(max_default);
            let min_pixels = pr.range("preprocessor_config.min_pixels", min_pixels, 1, 1 << 40);
            let max_pixels = pr.range(
                "preprocessor_config.max_pixels",
                max_pixels,
                min_pixels,
                1 << 40,
            );
            let patch = pr.opt(&["patch_size"], t.patch, 1, 4096);
            let merge_p = pr.opt(&["merge_size"], merge, 1, 16);
            let temporal_p = pr.opt(&["temporal_patch_size"], temporal, 1, 16);
            pr.record("min_pixels", Value::from(min_pixels));
            pr.record("max_pixels", Value::from(max_pixels));
            processor = Processor::Qwen {
                patch,
                merge: merge_p,
                temporal: temporal_p,
                min_pixels,
                max_pixels,
            };
            scale = merge;
            t
        }
        VlmKind::Gemma3 | VlmKind::Idefics3 | VlmKind::LlavaNext => {
            let clip = kind == VlmKind::LlavaNext
                && r.string("model_type").unwrap_or("clip_vision_model") == "clip_vision_model";
            let t = tower(
                &mut r,
                &SIGLIP_TOWER,
                match kind {
                    VlmKind::Gemma3 => &[1152, 4304, 16, 27, 14],
                    VlmKind::Idefics3 => &[1152, 3072, 16, 12, 32],
                    _ if clip => &[768, 3072, 12, 12, 32],
                    _ => &[768, 3072, 12, 12, 16],
                },
            );
            let image = r.opt(
                &["image_size"],
                match kind {
                    VlmKind::Gemma3 => 896,
                    VlmKind::Idefics3 => 224,
                    _ => 224,
                },
                1,
                MAX_IMAGE_SIDE,
            );
            if image < t.patch {
                r.invalid(
                    "vision_config.image_size",
                    "smaller than the patch size".into(),
                );
            }
            // the vision_config's fields all read: the wrapper's follow
            outer.adopt(&mut r);
            let (c, i) = (t.hidden, t.inner);
            let grid = image / t.patch;
            let positions = grid * grid + u64::from(clip);
            if clip {
                tower_params.push(c); // class embedding
            }
            linear(&mut tower_params, 3 * t.patch * t.patch, c, !clip);
            tower_params.push(mul(positions, c));
            if clip {
                layer_norm(&mut tower_params, c); // pre_layrnorm
            }
            for _ in 0..t.layers {
                encoder_layer(&mut tower_params, c, i, true);
            }
            layer_norm(&mut tower_params, c); // post_layernorm
            match kind {
                VlmKind::Gemma3 => {
                    // mm_input_projection_weight, mm_soft_emb_norm
                    projector_params.push(mul(c, lm_hidden));
                    projector_params.push(c);
                    let tokens = outer.opt(&["mm_tokens_per_image"], 256, 1, 1 << 20);
                    let side = edge(pre_map.get("size"), "height").unwrap_or(image);
                    let side =
                        outer.range("preprocessor_config.size", side, t.patch, MAX_IMAGE_SIDE);
                    processor = Processor::Fixed {
                        side,
                        patch: t.patch,
                        tokens,
                        // "\n\n" <start_of_image> ... <end_of_image> "\n\n"
                        markup: 4,
                        class_token: false,
                    };
                }
                VlmKind::Idefics3 => {
                    scale = outer.opt(&["scale_factor"], 2, 1, 64);
                    linear(
                        &mut projector_params,
                        mul(c, scale * scale),
                        lm_hidden,
                        false,
                    );
                    let tile = edge(pre_map.get("max_image_size"), "longest_edge")
                        .or_else(|| edge(vc.get("max_image_size"), "longest_edge"))
                        .unwrap_or(image);
                    let tile = outer.range(
                        "preprocessor_config.max_image_size",
                        tile,
                        t.patch,
                        MAX_IMAGE_SIDE,
                    );
                    // without the processor's size, SmolVLM's published processors' rule:
                    // the longest edge 4 tiles of the tower's side (2048 for 512-pixel
                    // tiles; Idefics3's class default 4 x 364 is the same rule)
                    let longest = edge(pre_map.get("size"), "longest_edge")
                        .or_else(|| edge(vc.get("size"), "longest_edge"))
                        .unwrap_or_else(|| {
                            notes.push(IDEFICS3_EDGE_NOTE);
                            mul(4, image)
                        });
                    let longest = outer.range("preprocessor_config.size", longest, 1, 1 << 16);
                    let per_tile = (tile / t.patch) * (tile / t.patch);
                    let tile_tokens = (per_tile / (scale * scale)).max(1);
                    processor = Processor::Split {
                        longest_edge: longest,
                        tile,
                        patch: t.patch,
                        tile_tokens,
                    };
                }
                _ => {
                    // hidden_states[vision_feature_layer]: the layers after it and the
                    // post-LayerNorm feed nothing
                    let unused = match outer_i64(outer, "vision_feature_layer") {
                        Some(k) if k < 0 => (k.unsigned_abs() - 1).min(t.layers),
                        Some(k) => t.layers.saturating_sub(k.unsigned_abs()),
                        None => 1,
                    };
                    unused_layers = unused;
                    gradless_tail = usize::try_from(unused).unwrap_or(0) * 16 + 2;
                    linear(&mut projector_params, c, lm_hidden, true);
                    linear(&mut projector_params, lm_hidden, lm_hidden, true);
                    // "default" drops the class token's feature, "full" keeps it
                    let full = match outer.string("vision_feature_select_strategy") {
                        None | Some("default") => false,
                        Some("full") => true,
                        Some(_) => {
                            outer.invalid(
                                "vision_feature_select_strategy",
                                "expected \"default\" or \"full\"".into(),
                            );
                            false
                        }
                    };
                    class_feature = full;
                    let grid = image / t.patch;
                    let tokens = grid * grid + u64::from(full);
                    // LLaVA 1.5: one image of the tower's size, its features as they are
                    let next =
                        outer.used.get("model_type").and_then(Value::as_str) != Some("llava");
                    if !next {
                        processor = Processor::Fixed {
                            side: image,
                            patch: t.patch,
                            tokens,
                            markup: 0,
                            class_token: clip,
                        };
                        // (its compact form keeps no preprocessor block)
                        keep_pre = false;
                    } else {
                        // LLaVA-NeXT's newline feature after each row of tiles
                        projector_params.push(lm_hidden);
                        // [height, width] pairs, each a multiple of the tower's side
                        let pair = |p: &Value| match p {
                            Value::Array(a) => match a.as_slice() {
                                [h, w] => h.as_u64().zip(w.as_u64()).filter(|&(h, w)| {
                                    (1..=MAX_IMAGE_SIDE).contains(&h)
                                        && (1..=MAX_IMAGE_SIDE).contains(&w)
                                        && h.is_multiple_of(image)
                                        && w.is_multiple_of(image)
                                }),
                                _ => None,
                            },
                            _ => None,
                        };
                        let pins = match outer.array("image_grid_pinpoints") {
                        Some(a) => a.iter().map(pair).collect::<Option<Vec<_>>>().unwrap_or_else(|| {
                            outer.invalid(
                                "image_grid_pinpoints",
                                "expected [height, width] pairs of multiples of the tower's image size".into(),
                            );
                            Vec::new()
                        }),
                        None => vec![(image, 2 * image), (2 * image, image), (2 * image, 2 * image)],
                    };
                        if pins.is_empty() || pins.len() > 64 {
                            outer.invalid(
                                "image_grid_pinpoints",
                                "expected 1 to 64 resolutions".into(),
                            );
                        }
                        processor = Processor::AnyRes {
                            crop: image,
                            patch: t.patch,
                            pinpoints: pins,
                            full,
                        };
                    }
                }
            }
            t
        }
        VlmKind::Mllama => {
            let t = tower(&mut r, &MLLAMA_TOWER, &[1280, 5120, 16, 32, 14]);
            let global = r.opt(&["num_global_layers"], 8, 0, MAX_LAYERS);
            let image = r.opt(&["image_size"], 560, t.patch, MAX_IMAGE_SIDE);
            let max_tiles = r.opt(&["max_num_tiles"], 4, 1, 16);
            let ratios = match r.array("supported_aspect_ratios") {
                Some(a) => a.len() as u64,
                None => 8,
            };
            let output = r.opt(&["vision_output_dim"], 7680, 1, MAX_DIM);
            pr.adopt(&mut r);
            let (c, i) = (t.hidden, t.inner);
            let per_tile = (image / t.patch) * (image / t.patch) + 1;
            linear(&mut tower_params, 3 * t.patch * t.patch, c, false);
            tower_params.push(c); // class embedding
                                  // gated positional embedding: gate, embedding, tile embedding
            tower_params.push(1);
            tower_params.push(mul(per_tile, c));
            tower_params.push(mul(ratios + 1, mul(mul(max_tiles, per_tile), c)));
            // pre- and post-tile positional embeddings: embedding and gate each
            for _ in 0..2 {
                tower_params.push(mul(ratios + 1, max_tiles * c));
                tower_params.push(1);
            }
            layer_norm(&mut tower_params, c);
            layer_norm(&mut tower_params, c);
            for l in 0..t.layers.saturating_add(global) {
                encoder_layer(&mut tower_params, c, i, false);
                if l >= t.layers {
                    tower_params.push(1);
                    tower_params.push(1);
                }
            }
            linear(&mut projector_params, output, lm_hidden, true);
            // the language model's cross-attention layers: q/k norms over the head width
            // and two tanh gates each; 8 more embedding rows than the head's vocabulary
            for _ in 0..cross_layers {
                lm_extra_params.extend([lm_heads.2, lm_heads.2, 1, 1]);
            }
            lm_extra_params.push(mul(lm_hidden, 8));
            let tile = edge(pre_map.get("size"), "height").unwrap_or(image);
            let tile = pr.range("preprocessor_config.size", tile, t.patch, MAX_IMAGE_SIDE);
            let tiles = pr.opt(&["max_image_tiles"], max_tiles, 1, 16);
            processor = Processor::Tiles {
                tile,
                patch: t.patch,
                max_tiles: tiles,
            };
            global_layers = global;
            vision_output = output;
            let _ = lm_vocab;
            t
        }
    };
    outer.adopt(&mut pr);
    outer.finish()?;
    outer.record("vision_config", Value::Object(r.used));
    if let Some(p) = pre.filter(|_| keep_pre) {
        // keep what decides the token arithmetic, so that the compact form reads back alike
        let mut kept = pr.used;
        for key in [
            "size",
            "max_image_size",
            "min_pixels",
            "max_pixels",
            "max_image_tiles",
            "image_seq_len",
        ] {
            if let Some(v) = p.get(key) {
                kept.insert(key.to_string(), v.clone());
            }
        }
        outer.record("preprocessor_config", Value::Object(kept));
    }
    Ok(VisionLm {
        kind,
        tower,
        processor,
        lm_hidden,
        tower_params,
        projector_params,
        lm_extra_params,
        full_blocks,
        window_units,
        deepstack,
        scale,
        global_layers,
        cross_layers,
        vision_output,
        lm_heads,
        unused_layers,
        gradless_tail,
        class_feature,
    })
}

/// A signed integer field of the wrapper config (`vision_feature_layer`); a list of layers
/// counts as none unused (`None`, the error kept, if invalid).
fn outer_i64(outer: &mut Reader, name: &str) -> Option<i64> {
    match outer.raw(name) {
        None | Some(Value::Array(_)) => None,
        Some(v) => match v.as_f64() {
            Some(x) if x.fract() == 0.0 && x.abs() < 1e6 => Some(x as i64),
            _ => {
                outer.invalid(name, "expected a layer index".into());
                None
            }
        },
    }
}
