//! The vision side of vision-language models, as data: the tower's and projector's
//! parameters (read from `vision_config` by `families.rs`), the processor (from
//! `preprocessor_config`: the checkpoint's values, the class defaults differ), and each
//! processor's token arithmetic as transformers 5.24 computes it (`validation/VLM.md`, checked against the real
//! processors in `validation/VLM-processor-check.txt`). The step is in `vlm.rs`.

use super::error::EstimateError;

/// The largest image side accepted, in pixels (a processor resizes anything anyway; this
/// keeps every figure far from overflow).
pub const MAX_IMAGE_SIDE: u64 = 1 << 15;
/// The most images per sample accepted.
pub const MAX_IMAGES: u64 = 256;

/// Which vision-language architecture a config describes (its `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VlmKind {
    /// Qwen2.5-VL: windowed ViT (RMSNorm, SwiGLU), 2x2 patch merger.
    Qwen25Vl,
    /// Qwen3-VL: ViT (LayerNorm, GELU) with learned positions, merger and deepstack mergers.
    Qwen3Vl,
    /// Gemma 3: SigLIP at 896 x 896, 4x4 average pooling, 256 tokens per image.
    Gemma3,
    /// Idefics3 / SmolVLM: SigLIP on 512-pixel tiles, pixel-shuffle connector.
    Idefics3,
    /// LLaVA-NeXT (and LLaVA): CLIP or SigLIP on any-resolution tiles, MLP projector.
    LlavaNext,
    /// Mllama (Llama 3.2 Vision): tiled ViT read by cross-attention layers.
    Mllama,
}

/// How a processor turns an image into tiles, patches and tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Processor {
    /// `Qwen2VLImageProcessor.smart_resize`: sides rounded to `patch * merge`, the area kept
    /// within `min_pixels..=max_pixels`.
    Qwen {
        patch: u64,
        merge: u64,
        temporal: u64,
        min_pixels: u64,
        max_pixels: u64,
    },
    /// Every image resized to `side` x `side` (Gemma 3 without pan-and-scan; LLaVA 1.5's
    /// CLIP, its class position in the tower besides the patches).
    Fixed {
        side: u64,
        patch: u64,
        tokens: u64,
        markup: u64,
        class_token: bool,
    },
    /// Idefics3 / SmolVLM image splitting.
    Split {
        longest_edge: u64,
        tile: u64,
        patch: u64,
        tile_tokens: u64,
    },
    /// LLaVA-NeXT's any-resolution tiles: (height, width) pinpoints; `full` keeps the
    /// class token's feature (`vision_feature_select_strategy: "full"`).
    AnyRes {
        crop: u64,
        patch: u64,
        pinpoints: Vec<(u64, u64)>,
        full: bool,
    },
    /// Mllama: up to `max_tiles` tiles of `tile` pixels, always padded to `max_tiles`.
    Tiles {
        tile: u64,
        patch: u64,
        max_tiles: u64,
    },
}

/// One image as its processor lays it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ImageLayout {
    /// Placeholder tokens in the language model (replaced by the image's features; for
    /// Mllama the one `<|image|>` token).
    pub tokens: u64,
    /// Text tokens the processor adds around them (start / end markers, tile labels).
    pub markup: u64,
    /// Positions entering the tower (class and padding positions included).
    pub patches: u64,
    /// Tiles the tower runs on (1 for a whole image).
    pub tiles: u64,
    /// Patch grid (rows, columns) of a dynamic-resolution image (Qwen), else (0, 0).
    pub grid: (u64, u64),
}

/// The tower's geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tower {
    pub hidden: u64,
    pub inner: u64,
    pub heads: u64,
    pub layers: u64,
    pub patch: u64,
}

/// The vision side of a vision-language model, beside its language model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct VisionLm {
    pub kind: VlmKind,
    pub tower: Tower,
    pub processor: Processor,
    /// The language model's hidden size (the projector's output).
    pub lm_hidden: u64,
    /// Parameter tensors of the tower (element counts).
    pub tower_params: Vec<u64>,
    /// Parameter tensors of the projector.
    pub projector_params: Vec<u64>,
    /// Language-model parameters the text reader does not hold (Mllama's cross-attention
    /// norms and gates, its 8 extra embedding rows).
    pub lm_extra_params: Vec<u64>,
    /// Qwen2.5-VL: blocks with full attention (the others attend within windows); window
    /// side in merged units.
    pub full_blocks: u64,
    pub window_units: u64,
    /// Qwen3-VL: deepstack mergers.
    pub deepstack: u64,
    /// Idefics3: pixel-shuffle factor.
    pub scale: u64,
    /// Mllama: gated global layers after the local ones, cross-attention layers of the
    /// language model, the projector's input width.
    pub global_layers: u64,
    pub cross_layers: u64,
    pub vision_output: u64,
    /// Language model's (query heads, key/value heads, head width), for Mllama's
    /// cross-attention.
    pub lm_heads: (u64, u64, u64),
    /// LLaVA: tower layers after `vision_feature_layer` (they run, but nothing reads their
    /// output). With the post-LayerNorm they get no gradient, so no optimizer state either.
    pub unused_layers: u64,
    /// Trailing entries of `tower_params` that never get a gradient.
    pub gradless_tail: usize,
    /// LLaVA: the class token's feature goes to the projector too (strategy "full").
    pub class_feature: bool,
}

/// The images of one step and what is trained of the vision side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VisionInputs {
    /// Images per sample.
    pub images: u64,
    /// Image width in pixels.
    pub width: u64,
    /// Image height in pixels.
    pub height: u64,
    /// Whether the vision tower is trained (`requires_grad`); frozen otherwise.
    pub tower_trained: bool,
    /// Whether the projector is trained.
    pub projector_trained: bool,
}

impl VisionInputs {
    /// The usual fine-tune: a frozen tower, a trained projector.
    #[must_use]
    pub const fn new(images: u64, width: u64, height: u64) -> Self {
        VisionInputs {
            images,
            width,
            height,
            tower_trained: false,
            projector_trained: true,
        }
    }
}

/// Python's `round` (half to even) on a positive figure.
fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

/// One image of `width` x `height` pixels as `p` lays it out (transformers 5.24; the
/// formulas and their checks are in `validation/VLM.md` and `VLM-processor-check.txt`).
///
/// # Errors
/// [`EstimateError::ImagesInvalid`] for an empty or oversized image.
pub(crate) fn layout(p: &Processor, width: u64, height: u64) -> Result<ImageLayout, EstimateError> {
    if width == 0 || height == 0 || width > MAX_IMAGE_SIDE || height > MAX_IMAGE_SIDE {
        return Err(EstimateError::ImagesInvalid(
            "an image's width and height must be 1 to 32768 pixels",
        ));
    }
    let (w, h) = (width as f64, height as f64);
    Ok(match *p {
        Processor::Qwen {
            patch,
            merge,
            temporal: _,
            min_pixels,
            max_pixels,
        } => {
            let f = (patch * merge) as f64;
            let mut hb = round_half_even(h / f) * f;
            let mut wb = round_half_even(w / f) * f;
            if hb * wb > max_pixels as f64 {
                let beta = (h * w / max_pixels as f64).sqrt();
                hb = f.max((h / beta / f).floor() * f);
                wb = f.max((w / beta / f).floor() * f);
            } else if hb * wb < min_pixels as f64 {
                let beta = (min_pixels as f64 / (h * w)).sqrt();
                hb = (h * beta / f).ceil() * f;
                wb = (w * beta / f).ceil() * f;
            }
            let gh = (hb as u64) / patch;
            let gw = (wb as u64) / patch;
            let patches = gh.checked_mul(gw).ok_or(EstimateError::TooLarge)?;
            ImageLayout {
                tokens: patches / (merge * merge),
                markup: 2,
                patches,
                tiles: 1,
                grid: (gh, gw),
            }
        }
        Processor::Fixed {
            side,
            patch,
            tokens,
            markup,
            class_token,
        } => ImageLayout {
            tokens,
            markup,
            patches: (side / patch) * (side / patch) + u64::from(class_token),
            tiles: 1,
            grid: (0, 0),
        },
        Processor::Split {
            longest_edge,
            tile,
            patch,
            tile_tokens,
        } => {
            // resize the longest edge to `longest_edge` (also upscaling), the other side
            // truncated and made even; capped at 4096
            let l = longest_edge.min(4096) as f64;
            let (mut rw, mut rh) = if w >= h {
                let nh = (l / (w / h)).floor();
                (l, nh + (nh % 2.0))
            } else {
                let nw = (l * (w / h)).floor();
                (nw + (nw % 2.0), l)
            };
            rw = rw.max(1.0);
            rh = rh.max(1.0);
            // round up to whole tiles, keeping the aspect ratio
            let m = tile as f64;
            let aspect = rw / rh;
            let (tw, th) = if rw >= rh {
                let tw = (rw / m).ceil() * m;
                (tw, ((tw / aspect).floor() / m).ceil() * m)
            } else {
                let th = (rh / m).ceil() * m;
                (((th * aspect).floor() / m).ceil() * m, th)
            };
            let (rows, cols) = ((th / m) as u64, (tw / m) as u64);
            let per_tile = (tile / patch) * (tile / patch);
            if th > m || tw > m {
                let tiles = rows * cols + 1;
                ImageLayout {
                    tokens: tiles * tile_tokens,
                    markup: 2 * rows * cols + rows + 4,
                    patches: tiles * per_tile,
                    tiles,
                    grid: (rows, cols),
                }
            } else {
                ImageLayout {
                    tokens: tile_tokens,
                    markup: 3,
                    patches: per_tile,
                    tiles: 1,
                    grid: (1, 1),
                }
            }
        }
        Processor::AnyRes {
            crop,
            patch,
            ref pinpoints,
            full,
        } => {
            // select_best_resolution: the most effective pixels, then the least waste
            let mut best = (0u64, 0u64);
            let (mut max_eff, mut min_waste) = (0u64, u64::MAX);
            for &(ph, pw) in pinpoints {
                let scale = (pw as f64 / w).min(ph as f64 / h);
                let dw = (w * scale) as u64;
                let dh = (h * scale) as u64;
                let eff = (dw * dh).min(width * height);
                let waste = (pw * ph).saturating_sub(eff);
                if eff > max_eff || (eff == max_eff && waste < min_waste) {
                    (max_eff, min_waste, best) = (eff, waste, (ph, pw));
                }
            }
            let (bh, bw) = best;
            let side = crop / patch;
            let tiles = (bh / crop) * (bw / crop) + 1;
            let (mut cur_h, mut cur_w) = (side * (bh / crop), side * (bw / crop));
            let round7 = |x: f64| round_half_even(x * 1e7) / 1e7;
            if w / h > cur_w as f64 / cur_h as f64 {
                let new_h = round7(h * (cur_w as f64 / w)) as u64;
                cur_h -= 2 * (cur_h.saturating_sub(new_h) / 2);
            } else {
                let new_w = round7(w * (cur_h as f64 / h)) as u64;
                cur_w -= 2 * (cur_w.saturating_sub(new_w) / 2);
            }
            ImageLayout {
                // unpadded features, a newline per row, the base image (CLS dropped)
                tokens: cur_h * cur_w + cur_h + side * side + u64::from(full),
                markup: 0,
                patches: tiles * (side * side + 1),
                tiles,
                grid: (cur_h, cur_w),
            }
        }
        Processor::Tiles {
            tile,
            patch,
            max_tiles,
        } => {
            // get_optimal_tiled_canvas over the arrangements a x b <= max_tiles (canvas
            // a*tile high, b*tile wide): the smallest upscale, else the largest downscale;
            // ties to the least area
            let mut up: Option<(f64, u64, u64)> = None;
            let mut down: Option<(f64, u64, u64)> = None;
            for a in 1..=max_tiles {
                for b in 1..=max_tiles {
                    if a * b > max_tiles {
                        continue;
                    }
                    let scale = ((a * tile) as f64 / h).min((b * tile) as f64 / w);
                    let area = a * b;
                    if scale >= 1.0 {
                        if up.is_none_or(|(s, ar, _)| scale < s || (scale == s && area < ar)) {
                            up = Some((scale, area, a * b));
                        }
                    } else if down.is_none_or(|(s, ar, _)| scale > s || (scale == s && area < ar)) {
                        down = Some((scale, area, a * b));
                    }
                }
            }
            let tiles = up.or(down).map_or(1, |(_, _, t)| t);
            let per_tile = (tile / patch) * (tile / patch) + 1;
            ImageLayout {
                tokens: 1,
                markup: 0,
                // the tower runs every tile slot, each padded to a multiple of 8
                patches: max_tiles * per_tile.div_ceil(8) * 8,
                tiles,
                grid: (0, 0),
            }
        }
    })
}

impl VisionLm {
    /// Parameters of the tower, the projector and the language model's extra ones.
    pub(crate) fn parameter_count(&self) -> u64 {
        self.tower_params
            .iter()
            .chain(&self.projector_params)
            .chain(&self.lm_extra_params)
            .fold(0u64, |a, &b| a.saturating_add(b))
    }
    /// Of the language model's extra parameters, those that run on a step with images
    /// (`images`) or on a text-only one: Mllama's cross-attention layers (their norms and
    /// gates first, four per layer) are skipped without images, its embedding rows run.
    pub(crate) fn lm_extra_running(&self, images: bool) -> &[u64] {
        let skipped = if images {
            0
        } else {
            usize::try_from(self.cross_layers.saturating_mul(4)).unwrap_or(usize::MAX)
        };
        &self.lm_extra_params[skipped.min(self.lm_extra_params.len())..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::error::ConfigError;

    /// (width, height) -> (tokens, markup, patches).
    type Case = ((u64, u64), (u64, u64, u64));

    #[track_caller]
    fn check(p: &Processor, cases: &[Case]) {
        for &((w, h), (tokens, markup, patches)) in cases {
            let l = layout(p, w, h).expect("a layout");
            assert_eq!(
                (l.tokens, l.markup, l.patches),
                (tokens, markup, patches),
                "{w}x{h}"
            );
        }
    }

    const SIZES: [(u64, u64); 10] = [
        (224, 224),
        (336, 336),
        (448, 448),
        (672, 448),
        (1000, 600),
        (1024, 768),
        (336, 1008),
        (1344, 896),
        (1344, 1344),
        (2000, 300),
    ];

    fn with(tokens: [u64; 10], markup: [u64; 10], patches: [u64; 10]) -> Vec<Case> {
        (0..10)
            .map(|k| (SIZES[k], (tokens[k], markup[k], patches[k])))
            .collect()
    }

    /// `validation/VLM-processor-check.txt`: every size, as the real processors lay it out.
    #[test]
    fn qwen_smart_resize_matches_the_processor() {
        let q25 = Processor::Qwen {
            patch: 14,
            merge: 2,
            temporal: 2,
            min_pixels: 3136,
            max_pixels: 12_845_056,
        };
        check(
            &q25,
            &with(
                [64, 144, 256, 384, 756, 999, 432, 1536, 2304, 781],
                [2; 10],
                [256, 576, 1024, 1536, 3024, 3996, 1728, 6144, 9216, 3124],
            ),
        );
        let q3 = Processor::Qwen {
            patch: 16,
            merge: 2,
            temporal: 2,
            min_pixels: 65_536,
            max_pixels: 16_777_216,
        };
        check(
            &q3,
            &with(
                [64, 100, 196, 294, 589, 768, 320, 1176, 1764, 558],
                [2; 10],
                [256, 400, 784, 1176, 2356, 3072, 1280, 4704, 7056, 2232],
            ),
        );
        // the class default max_pixels gives 70 x 70 patches at 1344 x 1344
        let default = Processor::Qwen {
            patch: 14,
            merge: 2,
            temporal: 2,
            min_pixels: 3136,
            max_pixels: 1_003_520,
        };
        check(&default, &[((1344, 1344), (1225, 2, 4900))]);
    }

    #[test]
    fn gemma3_and_smolvlm_match_the_processor() {
        let g = Processor::Fixed {
            side: 896,
            patch: 14,
            tokens: 256,
            markup: 4,
            class_token: false,
        };
        check(&g, &with([256; 10], [4; 10], [4096; 10]));
        let s = Processor::Split {
            longest_edge: 2048,
            tile: 512,
            patch: 16,
            tile_tokens: 64,
        };
        check(
            &s,
            &with(
                [1088, 1088, 1088, 832, 832, 832, 576, 832, 1088, 320],
                [40, 40, 40, 31, 31, 31, 24, 31, 40, 13],
                [
                    17408, 17408, 17408, 13312, 13312, 13312, 9216, 13312, 17408, 5120,
                ],
            ),
        );
    }

    #[test]
    fn llava_next_and_mllama_match_the_processor() {
        let l = Processor::AnyRes {
            crop: 336,
            patch: 14,
            pinpoints: vec![(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)],
            full: false,
        };
        check(
            &l,
            &with(
                [1176, 1176, 2928, 2144, 1948, 2340, 2376, 2144, 2928, 1306],
                [0; 10],
                [1731, 1731, 2885, 2885, 2885, 2885, 2308, 2885, 2885, 2308],
            ),
        );
        let m = Processor::Tiles {
            tile: 560,
            patch: 14,
            max_tiles: 4,
        };
        check(&m, &with([1; 10], [0; 10], [6432; 10]));
        let tiles: Vec<u64> = SIZES
            .iter()
            .map(|&(w, h)| layout(&m, w, h).expect("a layout").tiles)
            .collect();
        assert_eq!(tiles, [1, 1, 1, 2, 4, 4, 2, 4, 4, 4]);
    }

    /// Python's arithmetic where a side rounds to nothing: 10 x 1000 pixels has no row
    /// of 28 until the area is scaled up to `min_pixels`.
    #[test]
    fn qwen_scales_a_sliver_up_to_min_pixels() {
        let q25 = Processor::Qwen {
            patch: 14,
            merge: 2,
            temporal: 2,
            min_pixels: 3136,
            max_pixels: 12_845_056,
        };
        check(&q25, &[((1000, 10), (20, 2, 80))]);
        // an absurd min_pixels is an overflow error, not a panic
        let huge = Processor::Qwen {
            patch: 1,
            merge: 1,
            temporal: 1,
            min_pixels: 1 << 40,
            max_pixels: 1 << 40,
        };
        assert!(layout(&huge, 1, 1).is_ok());
    }

    #[track_caller]
    fn rejects(json: &str, field: &str) {
        match crate::arch::parse_hf_config(json) {
            Err(ConfigError::InvalidField { field: f, .. } | ConfigError::MissingField(f)) => {
                assert!(f.contains(field), "{f} for {json}");
            }
            other => panic!("{json}: {other:?}"),
        }
    }

    #[test]
    fn malformed_vision_configs_are_errors() {
        let text = r#""text_config": {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}"#;
        rejects(
            &format!(r#"{{"model_type": "qwen2_5_vl", {text}}}"#),
            "vision_config",
        );
        rejects(
            &format!(
                r#"{{"model_type": "qwen2_5_vl", {text}, "vision_config": {{"hidden_size": 30, "num_heads": 4}}}}"#
            ),
            "hidden_size",
        );
        rejects(
            &format!(
                r#"{{"model_type": "qwen2_5_vl", {text}, "vision_config": {{}}, "preprocessor_config": {{"min_pixels": 100, "max_pixels": 10}}}}"#
            ),
            "max_pixels",
        );
        rejects(
            &format!(
                r#"{{"model_type": "qwen2_5_vl", {text}, "vision_config": {{}}, "preprocessor_config": 3}}"#
            ),
            "preprocessor_config",
        );
        rejects(
            &format!(
                r#"{{"model_type": "llava_next", {text}, "vision_config": {{}}, "image_grid_pinpoints": [[336]]}}"#
            ),
            "image_grid_pinpoints",
        );
        rejects(
            &format!(
                r#"{{"model_type": "qwen3_vl", {text}, "vision_config": {{"depth": 2, "deepstack_visual_indexes": [5]}}}}"#
            ),
            "deepstack",
        );
    }

    /// Every measured config reads back from its compact form (the page keeps that form).
    #[test]
    fn vision_configs_round_trip_through_their_compact_form() {
        for text in [
            include_str!("../../../validation/configs/qwen2.5-vl-7b-4l.json"),
            include_str!("../../../validation/configs/qwen3-vl-4b-4l.json"),
            include_str!("../../../validation/configs/gemma3-4b-vl-6l.json"),
            include_str!("../../../validation/configs/smolvlm2-500m.json"),
            include_str!("../../../validation/configs/llava-v1.6-mistral-7b-4l.json"),
            include_str!("../../../validation/configs/llama3.2-11b-vision-5l.json"),
        ] {
            let arch = crate::arch::parse_hf_config(text).expect("a config");
            assert!(arch.is_vision_language());
            let back = crate::arch::parse_hf_config(&arch.to_config_json());
            assert_eq!(back.as_ref(), Ok(&arch), "{}", arch.to_config_json());
        }
    }

    /// llava-hf/llava-1.5-7b-hf's config.json (transformers 4.36 save), the text model at
    /// LlamaConfig's defaults: 7,063,427,072 parameters as the Hub lists them; one 336-pixel
    /// image, 576 features (the class token's dropped), 577 positions in CLIP.
    #[test]
    fn llava_one_five_reads_at_its_class_defaults() {
        let config = r#"{"architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100, "image_token_index": 32000, "model_type": "llava", "pad_token_id": 32001, "projector_hidden_act": "gelu", "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05, "torch_dtype": "float16", "vocab_size": 32064}, "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.36.0.dev0", "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096, "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768, "vocab_size": 32000}, "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "vocab_size": 32064}"#;
        let arch = crate::arch::parse_hf_config(config).expect("a config");
        assert_eq!(
            arch.parameter_count() + arch.vision_parameter_count(),
            7_063_427_072
        );
        let vlm = arch.vlm.as_deref().expect("a vision side");
        check(&vlm.processor, &[((1000, 600), (576, 0, 577))]);
        let back = crate::arch::parse_hf_config(&arch.to_config_json());
        assert_eq!(back.as_ref(), Ok(&arch));
        let full = config.replace("\"default\"", "\"full\"");
        let arch = crate::arch::parse_hf_config(&full).expect("a config");
        let vlm = arch.vlm.as_deref().expect("a vision side");
        check(&vlm.processor, &[((336, 336), (577, 0, 577))]);
    }

    /// Qwen/Qwen2.5-VL-7B-Instruct's config.json as published (transformers 4.41: the
    /// text fields at the top level, `rope_scaling.type` "mrope"): 8,292,166,656 parameters
    /// as the Hub lists them, and the checkpoint's processor without a preprocessor block.
    #[test]
    fn a_flat_qwen2_5_vl_config_reads() {
        let config = r#"{"architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000, "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": true, "use_sliding_window": false, "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2}, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064}"#;
        let arch = crate::arch::parse_hf_config(config).expect("a config");
        assert_eq!(
            arch.parameter_count() + arch.vision_parameter_count(),
            8_292_166_656
        );
        let vlm = arch.vlm.as_deref().expect("a vision side");
        // 1280-pixel images as the issue asks: 92 x 92 patches, 2,116 tokens
        check(&vlm.processor, &[((1280, 1280), (2116, 2, 8464))]);
        let back = crate::arch::parse_hf_config(&arch.to_config_json());
        assert_eq!(back.as_ref(), Ok(&arch));
    }

    /// An Idefics3 / SmolVLM config pasted without its processor's `size`: the longest
    /// edge is 4 x the tower's `image_size` (SmolVLM's published processors: 2048 for
    /// 512-pixel tiles, not Idefics3's class default 1456), and the model's notes say so.
    #[test]
    fn a_smolvlm_config_without_its_size_takes_four_tiles_a_side() {
        let full = include_str!("../../../validation/configs/smolvlm2-500m.json");
        let mut v: serde_json::Value = serde_json::from_str(full).expect("JSON");
        v["vision_config"]
            .as_object_mut()
            .expect("vision_config")
            .remove("size");
        v.as_object_mut()
            .expect("config")
            .remove("preprocessor_config");
        let arch = crate::arch::parse_hf_config(&v.to_string()).expect("a config");
        let vlm = arch.vlm.as_deref().expect("a vision side");
        assert!(matches!(
            vlm.processor,
            Processor::Split {
                longest_edge: 2048,
                tile: 512,
                ..
            }
        ));
        // as with the checkpoint's own processor (1344 x 896: 3 x 4 tiles + 1)
        check(&vlm.processor, &[((1344, 896), (832, 31, 13312))]);
        assert!(arch
            .notes()
            .iter()
            .any(|n| n.contains("4 x the vision tower's image_size")));
        let back = crate::arch::parse_hf_config(&arch.to_config_json());
        assert_eq!(back.as_ref(), Ok(&arch));
        // Idefics3's 364-pixel tiles: 1456, its class default
        v["vision_config"]["image_size"] = 364.into();
        v["vision_config"]["patch_size"] = 14.into();
        v["vision_config"]["max_image_size"] = serde_json::json!({"longest_edge": 364});
        let arch = crate::arch::parse_hf_config(&v.to_string()).expect("a config");
        let vlm = arch.vlm.as_deref().expect("a vision side");
        assert!(matches!(
            vlm.processor,
            Processor::Split {
                longest_edge: 1456,
                tile: 364,
                ..
            }
        ));
        // the checkpoint's size given: no note
        let arch = crate::arch::parse_hf_config(full).expect("a config");
        assert!(!arch
            .notes()
            .iter()
            .any(|n| n.contains("4 x the vision tower's image_size")));
    }

    #[test]
    fn empty_and_huge_images_are_refused() {
        let g = Processor::Fixed {
            side: 896,
            patch: 14,
            tokens: 256,
            markup: 4,
            class_token: false,
        };
        assert!(layout(&g, 0, 10).is_err());
        assert!(layout(&g, 10, MAX_IMAGE_SIDE + 1).is_err());
    }
}
