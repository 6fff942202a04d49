//! Vision-language models: the vision tower, its projector, the image tokens each processor
//! makes, and one training step of the whole model (`validation/VLM.md`, measured rows in
//! `tests/fixtures/vlm-measured.jsonl`).
//!
//! The language model is one of the text families and runs on the text tape
//! (`estimate.rs`) over its whole sequence: text tokens plus, per image, the placeholder
//! tokens the image features replace and the processor's markup. The tower and the projector
//! are added around it, tensor by tensor as `VLM.md` lists them: their weights, the
//! gradients and optimizer state of the trained ones, the tensors a trained tower saves for
//! backward (a frozen tower runs without graph and saves nothing), the projector's, the
//! inputs (pixel values and the processors' extra tensors), and the moments of the step
//! where they add up: the end of the forward, the backward's moments (the tower's backward
//! runs after the language model's layers, before the token embedding's), and the optimizer
//! step. The vision side as data (readers, processors) is in `vision.rs`.

use super::config::Architecture;
use super::error::EstimateError;
use super::estimate::{
    optimizer_memory, rank_step, BackwardMoment, CategoryBytes, PeakEstimate, Phase, TrainerTape,
    TrainingStep,
};
use super::mesh::Mesh;
use super::ops::{add, mul, storage, SavedPart};
use super::peft::Peft;
use super::recipe::{Checkpointing, PrecisionRecipe};
use super::vision::{layout, ImageLayout, Processor, VisionInputs, VisionLm, VlmKind, MAX_IMAGES};

/// A vision-language model's vision side, as the page and the CLI ask for it.
impl Architecture {
    /// Whether this is a vision-language model (it takes images beside its text).
    #[must_use]
    pub fn is_vision_language(&self) -> bool {
        self.vlm.is_some()
    }
    /// Parameters of the vision tower and its projector (and a vision-language model's
    /// language-model parameters outside the text layers), 0 for a text-only model.
    #[must_use]
    pub fn vision_parameter_count(&self) -> u64 {
        self.vlm.as_deref().map_or(0, VisionLm::parameter_count)
    }
    /// Parameters of the vision side that `v` trains (the tower's, the projector's).
    #[must_use]
    pub fn vision_trainable_count(&self, v: &VisionInputs) -> u64 {
        self.vlm.as_deref().map_or(0, |x| {
            let sum = |t: &[u64]| t.iter().fold(0u64, |a, &b| a.saturating_add(b));
            let tower = if v.tower_trained {
                sum(&x.tower_params)
            } else {
                0
            };
            let projector = if v.projector_trained {
                sum(&x.projector_params)
            } else {
                0
            };
            tower.saturating_add(projector)
        })
    }
}

/// Images per sample and the language model's sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageTokens {
    /// One image's layout.
    pub layout: ImageLayout,
    /// Placeholder tokens per sample (all images).
    pub image_tokens: u64,
    /// Markup tokens per sample.
    pub markup_tokens: u64,
    /// The language model's sequence per sample: text, image and markup tokens.
    pub sequence: u64,
}

/// The image tokens of one sample of `text` text tokens with `v`'s images.
///
/// # Errors
/// [`EstimateError::ImagesInvalid`] for an image the processor cannot take or too many
/// images; [`EstimateError::TooLarge`] on overflow.
pub fn image_tokens(
    arch: &Architecture,
    text: u64,
    v: &VisionInputs,
) -> Result<ImageTokens, EstimateError> {
    let Some(vlm) = arch.vlm.as_deref() else {
        return Err(EstimateError::ImagesInvalid(
            "this is a text-only model: it takes no images",
        ));
    };
    if v.images > MAX_IMAGES {
        return Err(EstimateError::ImagesInvalid(
            "at most 256 images per sample",
        ));
    }
    let layout = layout(&vlm.processor, v.width, v.height)?;
    let image_tokens = mul(layout.tokens, v.images)?;
    let markup_tokens = mul(layout.markup, v.images)?;
    Ok(ImageTokens {
        layout,
        image_tokens,
        markup_tokens,
        sequence: add(add(text, image_tokens)?, markup_tokens)?,
    })
}

/// What the vision side adds to the step.
struct VisionBytes {
    /// Tensors the tower and the projector save for backward (and the language model's
    /// image-specific ones: the merge mask, Mllama's cross-attention).
    saved: u64,
    /// Inputs: pixel values and the processor's extra tensors, token ids and labels.
    inputs: u64,
    /// Alive at the end of the forward beyond what is saved (a frozen tower's output).
    forward_extra: u64,
    /// Of `saved`, what the language model's side keeps for the images (the merge mask,
    /// Mllama's cross-attention over the vision states): freed before the tower's backward.
    lm_side: u64,
    /// Of `saved`, the projector's.
    projector: u64,
    /// The projector's input and output (the gradients its backward makes of them).
    projector_io: (u64, u64),
    /// The largest transient of the tower's backward.
    backward_transient: u64,
    /// Saved tensors alive after backward: an unused LLaVA layer's attention side, held by
    /// a reference cycle in the forward's outputs (measured alive through the optimizer
    /// step).
    lingering: u64,
    /// A checkpointed tower's backward (SigLIP layers): the last layer recomputed, what it
    /// saves alive beside the checkpointed inputs while its MLP's backward runs, less the
    /// last layer's output and the post-LayerNorm's statistics (freed by then, as is the
    /// gradient of the projector's input); 0 where not modelled.
    recompute: u64,
}

/// A byte count in saturating arithmetic: a figure past 64 bits saturates here and fails
/// where the phases are totalled (`CategoryBytes::total`). Small code: the vision side's
/// many terms need no error path each.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct B(u64);

impl std::ops::Add for B {
    type Output = B;
    fn add(self, o: B) -> B {
        B(self.0.saturating_add(o.0))
    }
}

impl std::ops::AddAssign for B {
    fn add_assign(&mut self, o: B) {
        *self = *self + o;
    }
}

impl std::ops::Mul<u64> for B {
    type Output = B;
    // out of line, as `m`: inlined, each product spells out a 128-bit multiply
    #[inline(never)]
    fn mul(self, k: u64) -> B {
        B(self.0.saturating_mul(k))
    }
}

/// One storage of `elems` elements of `bytes` each, rounded to the allocator's block.
#[inline(never)]
fn r(elems: u64, bytes: u64) -> B {
    B(storage(elems, bytes).unwrap_or(u64::MAX))
}

/// Bytes of the storages of `elems` elements each of `bytes`, saturating.
fn sum_st(elems: &[u64], bytes: u64) -> u64 {
    elems.iter().fold(B(0), |acc, &e| acc + r(e, bytes)).0
}

/// `a * b` elements, saturating (out of line: inlined, each product spells out a 128-bit
/// multiply).
#[inline(never)]
fn m(a: u64, b: u64) -> u64 {
    a.saturating_mul(b)
}

/// Whether a frozen tower runs with a graph all the same: under gradient checkpointing
/// transformers' `enable_input_require_grads` hooks the input embeddings of every
/// sub-model that has them, the vision tower's too (`SmolVLMVisionTransformer.embeddings`,
/// SigLIP's `patch_embedding` in Gemma 3), so the embeddings' output requires grad and the
/// frozen tower's checkpointed layers keep their inputs and its backward runs (for the input
/// gradients only), and the projector after it keeps what it keeps after a trained tower.
/// Measured for Idefics3 / SmolVLM and Gemma 3 (`VLM.md`); the other towers are not measured
/// frozen under checkpointing.
fn frozen_tower_graph(vlm: &VisionLm, v: &VisionInputs, gc: bool) -> bool {
    gc && !v.tower_trained
        && v.images > 0
        && matches!(vlm.kind, VlmKind::Idefics3 | VlmKind::Gemma3)
}

/// The bytes the vision side saves in one step of `b` samples.
#[allow(clippy::too_many_lines)]
fn vision_bytes(
    vlm: &VisionLm,
    v: &VisionInputs,
    it: &ImageTokens,
    b: u64,
    p: PrecisionRecipe,
    gc: bool,
    lm_trained: bool,
) -> VisionBytes {
    let e = p.activation_bytes();
    let amp = p.autocast();
    let resid = p.residual_bytes();
    let t = vlm.tower;
    let (c, i, h) = (t.hidden, t.inner, t.heads);
    let d = c / h.max(1);
    let n_img = m(b, v.images);
    let lay = it.layout;
    // positions in the tower over the batch
    let n = m(n_img, lay.patches);
    let nc = m(n, c);
    let ni = m(n, i);
    let bs = m(b, it.sequence);
    let mut saved = B(0);
    let tower = v.tower_trained && v.images > 0;
    // a frozen tower with a graph (checkpointing's input hook)
    let graph = frozen_tower_graph(vlm, v, gc);
    let projector = v.projector_trained && v.images > 0;
    // SigLIP / CLIP layer (VLM.md): residuals, LayerNorm stats and outputs, q/k/v, flash
    // output and log-sum-exp, the MLP's inner tensors (quick-GELU keeps its sigmoid too)
    let encoder_layer = |inner_tensors: u64| -> B {
        if amp {
            r(nc, 4) * 2 + r(nc, 2) * 8 + r(ni, 2) * inner_tensors + r(n, 4) * 4 + r(m(n, h), 4)
        } else {
            r(nc, e) * 8 + r(ni, e) * inner_tensors + r(n, e) * 4 + r(m(n, h), 4)
        }
    };
    let mut forward_extra = B(0);
    let mut lingering = B(0);
    let mut lm_side = B(0);
    let mut recompute = B(0);
    let mut proj_saved = B(0);
    let projector_io;
    // token ids and labels
    let mut inputs = r(bs, 8) * 2;
    match vlm.kind {
        VlmKind::Qwen25Vl | VlmKind::Qwen3Vl => {
            let (patch, temporal) = match vlm.processor {
                Processor::Qwen {
                    patch, temporal, ..
                } => (patch, temporal),
                _ => (t.patch, 2),
            };
            let row = 3 * temporal * patch * patch;
            // pixel_values (fp32 rows), image_grid_thw, mm_token_type_ids
            inputs += r(m(n, row), 4) + r(m(n_img, 3), 8) + r(bs, 8);
            let q3 = vlm.kind == VlmKind::Qwen3Vl;
            if tower {
                if gc {
                    saved += r(nc, e) * t.layers;
                } else {
                    let per_block_common = if q3 {
                        // 11 r(eNC) + 2 r(eNI) + 4 stats (flash out counted per image below)
                        // (under autocast the two residuals the LayerNorms keep are fp32
                        // and so are their stats; each linear's bf16 input cast takes the
                        // place of the LayerNorm output it reads)
                        r(nc, e) * 8
                            + r(ni, e) * 2
                            + r(nc, resid) * 2
                            + r(n, if amp { 4 } else { e }) * 4
                    } else {
                        // two RMSNorms (fp32 x, rsqrt, bf16 normalized, weight product), the
                        // rotary q/k, the fused qkv, the cat, four SwiGLU tensors
                        let norm = r(nc, 4) + r(n, 4) + r(nc, e) * 2;
                        let x = norm * 2 + r(nc, e) * 2 + r(m(nc, 3), e) + r(nc, e) + r(ni, e) * 4;
                        if amp {
                            x + r(nc, 2)
                        } else {
                            x
                        }
                    };
                    // SDPA per segment: one per image (full blocks), one per window
                    let (gh, gw) = lay.grid;
                    let seg = |len: u64| r(m(len, c), e) + r(m(len, h), 4);
                    let full = seg(lay.patches);
                    let window = if q3 {
                        full
                    } else {
                        let u = vlm.window_units.max(1);
                        let (mh, mw) = (gh / vlm.scale.max(1), gw / vlm.scale.max(1));
                        // whole windows of u x u merged units, and the smaller ones
                        // at the bottom and right edges
                        let (full_rows, rest_rows) = (mh / u, mh % u);
                        let (full_cols, rest_cols) = (mw / u, mw % u);
                        let units = vlm.scale * vlm.scale;
                        let mut total = B(0);
                        for (count, rows, cols) in [
                            (m(full_rows, full_cols), u, u),
                            (full_rows, u, rest_cols),
                            (full_cols, rest_rows, u),
                            (1, rest_rows, rest_cols),
                        ] {
                            let len = m(units, m(rows, cols));
                            if len > 0 {
                                total += seg(len) * count;
                            }
                        }
                        total
                    };
                    let full_blocks = if q3 {
                        t.layers
                    } else {
                        vlm.full_blocks.min(t.layers)
                    };
                    saved += (per_block_common + full * n_img) * full_blocks
                        + (per_block_common + window * n_img) * (t.layers - full_blocks);
                }
                // the patch embedding's 16-bit pixel copy, rotary cos/sin
                saved += r(m(n, row), e) + r(m(n, d), 4) * 2;
                saved += if q3 {
                    // interpolated learned positions: indices and weights
                    r(m(n, 4), 8) + r(m(n, 4), 4)
                } else {
                    // the window permutation's index and its inverse
                    r(n / 4, 8) * 2
                };
            }
            if projector {
                proj_saved = if q3 {
                    // LayerNorm (stats, output, its input when the tower is trained), fc1,
                    // GELU; each deepstack merger likewise after the shuffle
                    let x = r(n, e) * 2 + r(nc, e) * 3;
                    let deep = r(n / 4, e) * 2 + r(nc, e) * if tower { 3 } else { 4 };
                    let x = if tower { x + r(nc, e) } else { x };
                    x + deep * vlm.deepstack
                } else if tower {
                    r(nc, 4) + r(n, 4) + r(nc, e) * 4
                } else {
                    r(nc, e) * 4
                };
            }
            projector_io = (
                r(nc, e),
                r(m(n / (vlm.scale * vlm.scale).max(1), vlm.lm_hidden), e),
            );
            if !tower {
                forward_extra = r(nc, e);
            }
        }
        VlmKind::Gemma3 | VlmKind::Idefics3 | VlmKind::LlavaNext => {
            let side = match vlm.processor {
                Processor::Fixed { side, .. } => side,
                Processor::Split { tile, .. } => tile,
                Processor::AnyRes { crop, .. } => crop,
                _ => 0,
            };
            let tiles = m(n_img, lay.tiles);
            let pixels = m(m(tiles, 3), m(side, side));
            inputs += r(pixels, 4);
            inputs += match vlm.kind {
                // token_type_ids
                VlmKind::Gemma3 => r(bs, 8),
                // the int64 pixel attention mask
                VlmKind::Idefics3 => r(m(tiles, m(side, side)), 8),
                // image_sizes
                _ => r(m(n_img, 2), 8),
            };
            let clip = vlm.kind == VlmKind::LlavaNext;
            if tower {
                if gc {
                    saved += r(nc, resid) * t.layers;
                } else {
                    saved += encoder_layer(if clip { 3 } else { 2 }) * t.layers;
                    if vlm.unused_layers > 0 {
                        // vision_feature_layer -2: the last layer runs unused, its saved
                        // tensors held by the outputs but for its GELU and output residual;
                        // its attention side outlives the backward
                        saved = B(saved.0.saturating_sub((r(ni, e) + r(nc, e)).0));
                        lingering = encoder_layer(0);
                    }
                }
                // the convolution's 16-bit pixel copy; LayerNorm stats after the layers
                // (and the pre-LayerNorm's for CLIP); position ids for Idefics3
                saved += r(pixels, e) + r(n, resid) * 2;
                if clip {
                    saved += r(n, resid) * 2 + r(nc, resid);
                }
                if vlm.kind == VlmKind::Idefics3 {
                    saved += r(n, 8);
                }
                // SigLIP's post-LayerNorm keeps its input, the last layer's output (CLIP's
                // normalises the class token of the pooled output only)
                if !clip {
                    saved += r(nc, resid);
                }
            } else if graph {
                // each checkpointed layer's input (the embeddings' output first), the
                // post-LayerNorm's input and stats; nothing for the frozen weights
                saved += r(nc, resid) * t.layers + r(nc, resid) + r(n, resid) * 2;
                // the last layer recomputed in the backward: with frozen weights no linear
                // keeps its input; q, k, v, the flash output, its log-sum-exp and RNG
                // state, the mid residual, the LayerNorms' statistics, the GELU's input
                let layer = r(nc, e) * 5 + r(ni, e) + r(n, resid) * 4 + r(m(n, h), 4) + B(1024);
                recompute = B(layer.0.saturating_sub((r(nc, resid) + r(n, resid) * 2).0));
                // (the hook makes the embeddings' output a leaf that requires grad: the
                // backward's last step accumulates its `.grad`, freed with the graph;
                // MemTracker holds that leaf, so the measurement keeps both through the
                // optimizer step: VLM.md)
            }
            // the projector's rows: LLaVA's features per tile (without the class token's
            // unless the strategy is "full")
            let per_tile = lay.patches / lay.tiles.max(1);
            let rows = m(
                tiles,
                per_tile.saturating_sub(u64::from(!vlm.class_feature)),
            );
            if projector {
                proj_saved = match vlm.kind {
                    VlmKind::Gemma3 => {
                        let tokens = m(n_img, lay.tokens);
                        let pooled = m(tokens, c);
                        let norm = if tower || graph {
                            r(nc, e) + r(pooled, 4) * 2 + r(tokens, 4)
                        } else {
                            r(pooled, 4)
                        };
                        norm + r(pooled, e)
                    }
                    VlmKind::Idefics3 => r(nc, e),
                    _ => r(m(rows, c), e) + r(m(rows, vlm.lm_hidden), e) * 2,
                };
            }
            projector_io = match vlm.kind {
                VlmKind::LlavaNext => (r(m(rows, c), e), r(m(rows, vlm.lm_hidden), e)),
                _ => (r(nc, e), r(m(m(n_img, lay.tokens), vlm.lm_hidden), e)),
            };
            if !tower {
                forward_extra = r(nc, e);
            }
        }
        VlmKind::Mllama => {
            let (tile, max_tiles) = match vlm.processor {
                Processor::Tiles {
                    tile, max_tiles, ..
                } => (tile, max_tiles),
                _ => (560, 4),
            };
            let slots = m(n_img, max_tiles);
            let pixels = m(m(slots, 3), m(tile, tile));
            let per_tile = (tile / t.patch) * (tile / t.patch) + 1;
            let real = m(slots, per_tile);
            // pixel values, aspect-ratio ids and mask, the cross-attention mask
            inputs +=
                r(pixels, 4) + r(n_img, 8) + r(slots, 8) + r(m(bs, m(v.images, max_tiles)), 8);
            if tower {
                let layer = encoder_layer(2);
                let global = layer + r(nc, e) * 2 + B(1024);
                saved += layer * t.layers + global * vlm.global_layers;
                // the last global layer's output residual is not saved
                if vlm.global_layers > 0 {
                    saved = B(saved.0.saturating_sub(r(nc, e).0));
                }
                // the aspect-ratio mask, shared by every layer
                let l = lay.patches / max_tiles.max(1) * max_tiles;
                saved += r(m(n_img, m(l, l)), e);
                // pixel copy, tile position embeddings, pre-LayerNorm stats, padded input,
                // post-tile embedding output
                saved += r(pixels, e) + r(m(real, c), e) * 3 + r(real, e) * 2 + r(nc, e);
            }
            if projector {
                proj_saved = r(m(real, vlm.vision_output), e);
            }
            projector_io = (
                r(m(real, vlm.vision_output), e),
                r(m(real, vlm.lm_hidden), e),
            );
            if !tower {
                forward_extra = r(m(real, vlm.vision_output), e);
            }
            // cross-attention layers over the projected vision states
            let (hq, hkv, hd) = vlm.lm_heads;
            let tv = m(n_img, m(max_tiles, per_tile));
            let tv_per = m(v.images, m(max_tiles, per_tile));
            if v.images > 0 {
                // k_norm (fp32 input, rsqrt, 16-bit output), repeat_kv's K and V, the
                // additive mask padded to 8, q_norm, the gates and the gated outputs
                let kv = m(tv, m(hkv, hd));
                let q = m(bs, m(hq, hd));
                let cross = if gc {
                    // a checkpointed cross-attention layer keeps its arguments: the
                    // projected states (kept once below) and the cross-attention mask
                    r(m(bs, tv_per), e)
                } else {
                    r(kv, 4)
                        + r(m(tv, hkv), 4)
                        + r(kv, e)
                        + r(m(tv, m(hq, hd)), e) * 2
                        + r(m(bs, tv_per.div_ceil(8).saturating_mul(8)), e)
                        + r(q, 4)
                        + r(m(bs, hq), 4)
                        + r(q, e) * 2
                        + B(1024)
                        + r(m(bs, vlm.lm_hidden), e) * 2
                };
                lm_side += cross * vlm.cross_layers;
                if vlm.cross_layers > 0 {
                    // the projected states (k/v input) and the row mask, once
                    lm_side += r(m(tv, vlm.lm_hidden), e) + r(bs, e);
                }
            }
        }
    }
    // masked_scatter of the image features keeps its mask when anything before it trains
    if vlm.kind != VlmKind::Mllama && v.images > 0 && (lm_trained || projector || tower || graph) {
        lm_side += r(bs, 1);
    }
    // autocast's 16-bit copies of the trained vision weights
    if amp {
        if tower {
            for &x in vlm.tower_params.iter().filter(|&&x| x > c) {
                saved += r(x, 2);
            }
        }
        if projector {
            for &x in vlm
                .projector_params
                .iter()
                .filter(|&&x| x > vlm.lm_hidden.max(c))
            {
                saved += r(x, 2);
            }
        }
    }
    let backward_transient = if tower || graph {
        r(ni, e) * 2 + r(nc, resid)
    } else {
        B(0)
    };
    VisionBytes {
        saved: (saved + proj_saved + lm_side).0,
        inputs: inputs.0,
        forward_extra: forward_extra.0,
        lm_side: lm_side.0,
        projector: proj_saved.0,
        projector_io: (projector_io.0 .0, projector_io.1 .0),
        backward_transient: backward_transient.0,
        lingering: lingering.0,
        recompute: recompute.0,
    }
}

/// Estimates one step of a vision-language model: `step.seq_len` is the text tokens per
/// sample, `v` the images and what of the vision side trains; LoRA (`peft`) applies to the
/// language model only.
///
/// # Errors
/// As [`estimate_peak_with`](super::estimate_peak_with), and [`EstimateError::ImagesInvalid`] for a text-only model or
/// an image the processor cannot take.
#[allow(clippy::too_many_lines)]
pub fn estimate_vlm(
    arch: &Architecture,
    step: &TrainingStep,
    peft: Option<&Peft>,
    v: &VisionInputs,
) -> Result<PeakEstimate, EstimateError> {
    let Some(vlm) = arch.vlm.as_deref() else {
        return Err(EstimateError::ImagesInvalid(
            "this is a text-only model: it takes no images",
        ));
    };
    let it = image_tokens(arch, step.seq_len, v)?;
    let lm_step = TrainingStep {
        seq_len: it.sequence,
        // Gemma 3's processor marks image tokens (token_type_ids): transformers builds a
        // materialised bidirectional-within-image mask for every layer, as for padded rows
        padding: step.padding || (vlm.kind == VlmKind::Gemma3 && v.images > 0),
        ..*step
    };
    // the tower's backward runs: it trains, or a frozen one runs with a graph
    let tower_backward =
        v.tower_trained || frozen_tower_graph(vlm, v, step.checkpointing != Checkpointing::None);
    let tape = TrainerTape {
        // the image features need a gradient when the projector or the tower trains (or
        // the tower runs with a graph), and so do the merged embeddings the first layer
        // reads (Mllama's reach the cross-attention layers instead)
        input_grad: vlm.kind != VlmKind::Mllama
            && v.images > 0
            && (v.projector_trained || tower_backward),
        ..TrainerTape::default()
    };
    let mut lm = rank_step(arch, &lm_step, peft, &Mesh::SINGLE, tape)?;
    // Mllama on a text-only batch: MllamaTextModel skips its cross-attention layers
    // (`cross_attention_states is None`), so they save nothing and their weights (and
    // adapters) get no gradient and no optimizer state; their weights stay. The text tape
    // models each as one of the (equal) self-attention layers: the step is that of the
    // layers that run, with the skipped layers' weights beside it.
    let mut skipped_weights = 0;
    let cross = usize::try_from(vlm.cross_layers).unwrap_or(usize::MAX);
    if v.images == 0 && cross > 0 && cross < arch.spec.layers.len() {
        let mut running = arch.clone();
        running.spec.layers.truncate(arch.spec.layers.len() - cross);
        let ran = rank_step(&running, &lm_step, peft, &Mesh::SINGLE, tape)?;
        let params = |e: &PeakEstimate| e.phase_peaks.first().map_or(0, |(_, c)| c.parameters);
        skipped_weights = params(&lm).saturating_sub(params(&ran));
        lm = PeakEstimate {
            n_params: lm.n_params,
            trainable_params: lm.trainable_params,
            ..ran
        };
    }
    let p = step.precision;
    let b = step.batch;
    let trains = step.optimizer.trains();
    let gc = step.checkpointing != Checkpointing::None;
    let lm_trained = peft.is_none();
    let vb = vision_bytes(vlm, v, &it, b, p, gc, lm_trained && trains);
    let v_inputs = vb.inputs.saturating_sub(r(m(b, it.sequence), 8).0);
    // weights, and what trains
    let mut all = vlm.tower_params.clone();
    all.extend(&vlm.projector_params);
    all.extend(&vlm.lm_extra_params);
    let weights = sum_st(&all, p.weight_bytes()).saturating_add(skipped_weights);
    // What gets a gradient (and so optimizer state): the trained parts that run. On a
    // text-only batch the tower and the projector do not run (nor Mllama's
    // cross-attention layers): their gradients stay None and AdamW makes no state for them.
    let runs = v.images > 0;
    let mut trained: Vec<(u64, u64)> = Vec::new();
    if trains {
        if v.tower_trained && runs {
            let with_grad = vlm.tower_params.len().saturating_sub(vlm.gradless_tail);
            trained.extend(vlm.tower_params.iter().take(with_grad).map(|&e| (e, 1)));
        }
        if v.projector_trained && runs {
            trained.extend(vlm.projector_params.iter().map(|&e| (e, 1)));
        }
        if lm_trained {
            trained.extend(vlm.lm_extra_running(runs).iter().map(|&e| (e, 1)));
        }
    }
    let grad_bytes = p.gradient_bytes();
    let trained_elems: Vec<u64> = trained.iter().map(|&(e, _)| e).collect();
    let grads = sum_st(&trained_elems, grad_bytes);
    let opt = optimizer_memory(
        step.optimizer,
        step.optimizer_impl,
        &trained,
        p.optimizer_state_bytes(),
        grad_bytes,
    )?;
    let master = if p.master_weights() {
        sum_st(&trained_elems, 4)
    } else {
        0
    };
    let states = opt.resident.saturating_add(master);
    let saved = if trains { vb.saved } else { 0 };
    let with_base = |c: &CategoryBytes| CategoryBytes {
        parameters: c.parameters.saturating_add(weights),
        buffers: c.buffers.saturating_add(v_inputs),
        optimizer_states: c.optimizer_states.saturating_add(states),
        ..*c
    };
    let mut phases = Vec::new();
    let mut moments = Vec::new();
    for (phase, c) in &lm.phase_peaks {
        let mut x = with_base(c);
        match phase {
            Phase::Forward => {
                x.activations = x.activations.saturating_add(saved);
                x.temporaries = x.temporaries.saturating_add(vb.forward_extra);
            }
            Phase::OptimizerStep => {
                x.activations = x.activations.saturating_add(vb.lingering);
                x.gradients = x.gradients.saturating_add(grads);
                x.temporaries = x.temporaries.saturating_add(opt.temporary);
            }
            _ => {}
        }
        phases.push((*phase, x));
    }
    if trains {
        // The order of the backward: the tower and projector ran before the token
        // embedding in the forward for every family but Mllama (whose language model, token
        // embedding included, runs after the vision model), so their backward comes after
        // the language model's layers and before the embedding's; Mllama's after the
        // embedding's, from its cross-attention layers.
        let embedding_first = vlm.kind == VlmKind::Mllama;
        let tower_side = vb.saved.saturating_sub(vb.lm_side);
        for (m, c) in &lm.backward_moments {
            let mut x = with_base(c);
            if *m == BackwardMoment::Embedding && !embedding_first {
                x.gradients = x.gradients.saturating_add(grads);
                x.activations = x.activations.saturating_add(vb.lingering);
            } else if *m == BackwardMoment::Embedding {
                x.activations = x.activations.saturating_add(tower_side);
            } else {
                x.activations = x.activations.saturating_add(saved);
            }
            moments.push((*m, x));
        }
        // Inside the projector's backward and then the tower's: the language model's
        // gradients (without the embedding's where it comes later), the tower's and
        // projector's saved tensors; the projector's weight gradients being made with the
        // gradients of its output and input; then, in the tower, one layer's transients.
        let opt_phase = lm
            .phase_peaks
            .iter()
            .find(|(ph, _)| *ph == Phase::OptimizerStep)
            .map(|(_, c)| *c);
        if let (Some(o), true) = (
            opt_phase,
            v.images > 0 && (tower_backward || v.projector_trained),
        ) {
            let embedding = if lm_trained && !embedding_first {
                sum_st(&arch.spec.embedding_parameter_tensors(), grad_bytes)
            } else {
                0
            };
            let extra = if lm_trained {
                sum_st(&vlm.lm_extra_params, grad_bytes)
            } else {
                0
            };
            let proj_grads = if v.projector_trained {
                sum_st(&vlm.projector_params, grad_bytes)
            } else {
                0
            };
            // the merged embeddings' gradient waits for the embedding's backward
            let waiting = if embedding_first {
                0
            } else {
                r(m(m(b, it.sequence), arch.hidden_size()), p.residual_bytes()).0
            };
            let lm_grads = o.gradients.saturating_sub(embedding).saturating_add(extra);
            let base = with_base(&CategoryBytes {
                temporaries: 0,
                ..o
            });
            let (proj_in, proj_out) = vb.projector_io;
            let projector = CategoryBytes {
                gradients: lm_grads,
                activations: tower_side,
                temporaries: proj_grads
                    .saturating_add(proj_out)
                    .saturating_add(if tower_backward { proj_in } else { 0 })
                    .saturating_add(waiting),
                ..base
            };
            moments.push((BackwardMoment::Layers, projector));
            if tower_backward {
                moments.push((
                    BackwardMoment::Layers,
                    CategoryBytes {
                        gradients: lm_grads.saturating_add(proj_grads),
                        activations: tower_side
                            .saturating_sub(vb.projector)
                            .saturating_add(vb.recompute),
                        temporaries: vb
                            .backward_transient
                            .saturating_add(if vb.recompute > 0 { 0 } else { proj_in })
                            .saturating_add(waiting),
                        ..base
                    },
                ));
            }
        }
        if let Some((_, bwd)) = phases.iter_mut().find(|(ph, _)| *ph == Phase::Backward) {
            let mut best = *bwd;
            let mut best_total = 0;
            for (_, c) in &moments {
                let t = c.total().ok_or(EstimateError::TooLarge)?;
                if t > best_total {
                    best_total = t;
                    best = *c;
                }
            }
            *bwd = best;
        }
    }
    let mut best = (Phase::Forward, CategoryBytes::default(), 0u64);
    for (ph, c) in &phases {
        let t = c.total().ok_or(EstimateError::TooLarge)?;
        if t > best.2 || (t == best.2 && *ph == Phase::OptimizerStep) {
            best = (*ph, *c, t);
        }
    }
    // requires_grad: the trained parts whether they run or not (the tower's unused tail too)
    let mut requires_grad: Vec<&[u64]> = Vec::new();
    if trains {
        if v.tower_trained {
            requires_grad.push(&vlm.tower_params);
        }
        if v.projector_trained {
            requires_grad.push(&vlm.projector_params);
        }
        if lm_trained {
            requires_grad.push(&vlm.lm_extra_params);
        }
    }
    let trainable = requires_grad
        .iter()
        .flat_map(|t| t.iter())
        .fold(0u64, |acc, &e| acc.saturating_add(e));
    let mut saved_parts = lm.saved_parts.clone();
    if saved > 0 {
        saved_parts.push((SavedPart::Vision, saved));
    }
    Ok(PeakEstimate {
        saved_parts,
        n_params: lm.n_params.saturating_add(vlm.parameter_count()),
        peak_bytes: best.2,
        peak_phase: best.0,
        at_peak: best.1,
        phase_peaks: phases,
        backward_moments: moments,
        saved_activation_bytes: lm.saved_activation_bytes.saturating_add(saved),
        trainable_params: lm.trainable_params.saturating_add(trainable),
        allocator: None,
        objective: None,
        ..lm
    })
}
