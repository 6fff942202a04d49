//! A model as vLLM's V1 engine (v0.11.0) lays it out on one GPU of a tensor-parallel group:
//! the KV cache each attention layer asks for, the weights the rank loads and the
//! working set of the profiling forward. The engine's arithmetic over these (budget, pages,
//! groups, blocks, concurrency) is `crate::serve`.

use super::config::Architecture;
use super::hybrid::{output_gate, GatedDeltaNet};
use super::model::{Attention, Layer};
use super::ops::FeedForward;
use super::peft::Role;

/// vLLM pads the vocabulary of its embedding and head to a multiple of this
/// (`DEFAULT_VOCAB_PADDING_SIZE`, `vocab_parallel_embedding.py`) before splitting it.
const VOCAB_PADDING: u64 = 64;

/// What one layer keeps in the KV cache on one rank: per token (an attention layer), or per
/// request (a linear-attention layer's recurrent state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvLayer {
    /// Cache elements per token (K and V; MLA's latent and rope key; 0 for a state).
    pub elements_per_token: u64,
    /// Bytes of one request's recurrent state (`MambaSpec`), 0 for attention.
    pub state_bytes: u64,
    /// The sliding window, `None` for full attention.
    pub window: Option<u64>,
    /// Multi-head latent attention (its block size is the MLA backend's).
    pub latent: bool,
}

/// Key/value heads one rank holds: `max(1, kv_heads / tp)`, replicated when TP exceeds them
/// (`ModelConfig.get_num_kv_heads`).
fn kv_heads_per_rank(kv_heads: u64, tp: u64) -> u64 {
    (kv_heads / tp.max(1)).max(1)
}

/// A mixture's routed experts on one of `tp` ranks: how many it holds and the share of each
/// expert's inner width. With expert parallelism (`enable_expert_parallel`, EP = TP) a rank
/// holds whole experts, the first ranks one more when they do not divide evenly
/// (`determine_expert_map`); without it every rank holds every expert, its inner width split.
pub(crate) fn experts_on_rank(experts: u64, tp: u64, ep: bool) -> (u64, u64) {
    let tp = tp.max(1);
    if ep {
        (experts.div_ceil(tp), 1)
    } else {
        (experts, tp)
    }
}

/// Why a model does not split over `tp` ranks the way vLLM splits it, if it does not.
pub(crate) fn tp_error(arch: &Architecture, tp: u64) -> Option<String> {
    let tp = tp.max(1);
    if let Some(g) = arch.linear.as_deref().map(|l| l.mixer) {
        if g.key_heads % tp != 0 || g.value_heads % tp != 0 {
            return Some(format!(
                "vLLM splits the Gated DeltaNet's {} key and {} value heads over the tensor-parallel ranks: {tp} does not divide them.",
                g.key_heads, g.value_heads
            ));
        }
    }
    arch.spec.layers.iter().find_map(|l| {
        let a = &l.attention;
        if a.heads % tp != 0 {
            return Some(format!(
                "vLLM splits the {} attention heads over the tensor-parallel ranks: {tp} does not divide them.",
                a.heads
            ));
        }
        if a.latent.is_none() && !a.kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(a.kv_heads) {
            return Some(format!(
                "vLLM needs the {} key/value heads to divide, or be divided by, the tensor-parallel size {tp}.",
                a.kv_heads
            ));
        }
        None
    })
}

/// The KV cache of each attention layer on one of `tp` ranks (`Attention.get_kv_cache_spec`):
/// GQA heads split by TP, MLA's compressed latent whole on every rank
/// (`MLAAttentionSpec`, `num_kv_heads = 1`).
/// A hybrid's Gated DeltaNet layers keep one state per request (`MambaSpec`).
pub(crate) fn kv_layers(arch: &Architecture, tp: u64) -> Vec<KvLayer> {
    arch.spec
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let a = &l.attention;
            if let Some(g) = linear_mixer(arch, i) {
                return KvLayer {
                    elements_per_token: 0,
                    state_bytes: g.state_bytes_per_rank(tp),
                    window: None,
                    latent: false,
                };
            }
            match a.latent {
                Some(lat) => KvLayer {
                    elements_per_token: lat.kv_rank + lat.rope_dim,
                    state_bytes: 0,
                    window: None,
                    latent: true,
                },
                // vLLM's page holds K and V of `head_size` each
                None => KvLayer {
                    elements_per_token: 2 * kv_heads_per_rank(a.kv_heads, tp) * a.head_dim,
                    state_bytes: 0,
                    window: a.window,
                    latent: false,
                },
            }
        })
        .collect()
}

/// Layer `i`'s Gated DeltaNet, if it is a hybrid's linear-attention layer.
fn linear_mixer(arch: &Architecture, i: usize) -> Option<GatedDeltaNet> {
    let linear = arch.linear.as_deref()?;
    linear.is_linear.get(i).copied()?.then_some(linear.mixer)
}

/// One rank's weights by how a checkpoint format stores them (elements).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RankWeights {
    /// Kept in 16 bits by every quantized format: embeddings, head, norms, biases, routers.
    pub sixteen_bit: u64,
    /// Weights of the linears (attention, dense MLPs, shared experts).
    pub linear: u64,
    /// Weights of the routed experts.
    pub experts: u64,
    /// Bytes of the rotary `cos_sin_cache` tables (the model's dtype; gpt-oss asks fp32).
    pub rope_table_bytes: u64,
}

impl RankWeights {
    fn add(&mut self, sixteen_bit: u64, linear: u64, experts: u64) {
        self.sixteen_bit = self.sixteen_bit.saturating_add(sixteen_bit);
        self.linear = self.linear.saturating_add(linear);
        self.experts = self.experts.saturating_add(experts);
    }
}

/// One attention block's weights on a rank: column-parallel q (and MLA's q_b, kv_b),
/// k and v by the rank's key/value heads, row-parallel o; MLA's low-rank `q_a` and
/// `kv_a_proj_with_mqa` replicated (`ReplicatedLinear`). Biases of column-parallel
/// linears split with them; o's bias is whole.
fn attention_weights(a: &Attention, tp: u64, w: &mut RankWeights) {
    let kv_share = |n: u64| n / a.kv_heads.max(1) * kv_heads_per_rank(a.kv_heads, tp);
    let linears = a.roled_linears();
    let latent_replicated = |i: usize| {
        // q_a (with a q rank) and kv_a are the replicated ones, in `linears` order
        let q_a = a.latent.is_some_and(|l| l.q_rank.is_some());
        a.latent.is_some() && ((q_a && i == 0) || i == usize::from(q_a) + 1)
    };
    for (i, (role, l)) in linears.into_iter().enumerate() {
        let bias = if l.bias { l.n_out } else { 0 };
        let (weights, bias) = match role {
            Role::O => (l.n_in / tp * l.n_out, bias),
            Role::K | Role::V => (l.n_in * kv_share(l.n_out), kv_share(bias)),
            Role::Qkv => {
                let q = a.heads * a.head_dim;
                let kv = l.n_out.saturating_sub(q);
                let out = q / tp + kv_share(kv);
                (l.n_in * out, if l.bias { out } else { 0 })
            }
            _ if latent_replicated(i) => (l.n_in * l.n_out, bias),
            _ => (l.n_in * (l.n_out / tp), bias / tp),
        };
        w.add(bias, weights, 0);
    }
}

/// One layer's weights on a rank: its attention, its MLP split by TP (a mixture's routed
/// experts as [`experts_on_rank`] lays them out; the router replicated), its norms whole.
///
/// A hybrid's layer has a Gated DeltaNet (`mixer`) in place of its attention, or a gate on its
/// attention's output (`output_gate`: q_proj's second half).
fn layer_weights(
    l: &Layer,
    (mixer, output_gate_of): (Option<GatedDeltaNet>, bool),
    tp: u64,
    ep: bool,
    w: &mut RankWeights,
) {
    let before = *w;
    match mixer {
        Some(g) => {
            let (sixteen_bit, linear) = g.weights_per_rank(l.attention.hidden, tp);
            w.add(sixteen_bit, linear, 0);
        }
        None => attention_weights(&l.attention, tp, w),
    }
    if output_gate_of && mixer.is_none() {
        w.add(0, output_gate(&l.attention) / tp, 0);
    }
    let mut attention = Vec::new();
    l.attention.params(&mut attention);
    let mut mlp = Vec::new();
    l.mlp.params(&mut mlp);
    match &l.mlp {
        FeedForward::Dense(_) => {
            let all: u64 = mlp.iter().sum();
            w.add(0, all / tp, 0);
        }
        FeedForward::Moe(m) => {
            let routed = m.routed_params();
            let biases = if m.expert_bias {
                m.experts * (2 * m.inner + m.hidden)
            } else {
                0
            };
            let all: u64 = mlp.iter().sum();
            let router = m.hidden * m.experts + if m.router_bias { m.experts } else { 0 };
            let gate = if m.shared_gate { m.hidden } else { 0 };
            let shared = all.saturating_sub(routed + router + gate);
            // (`routed` and `biases` are whole multiples of the experts)
            let (local, split) = experts_on_rank(m.experts, tp, ep);
            let on_rank = |all: u64| all / m.experts.max(1) * local / split;
            w.add(
                router + gate + on_rank(biases),
                shared / tp,
                on_rank(routed - biases),
            );
        }
    }
    // norms (and q/k norms, sinks): what the layer has beyond its attention and MLP
    let total: u64 = l.params().iter().sum();
    let counted: u64 = attention.iter().chain(&mlp).sum();
    w.add(total.saturating_sub(counted), 0, 0);
    debug_assert!(w.linear >= before.linear);
}

/// The weights one of `tp` ranks loads (`Model loading took`): the vocabulary padded to 64 and
/// split, each layer as [`layer_weights`], and the rotary tables (one per attention type for
/// Gemma 3, whose local and global layers rotate with different bases).
pub(crate) fn rank_weights(arch: &Architecture, tp: u64, ep: bool) -> RankWeights {
    let tp = tp.max(1);
    let spec = &arch.spec;
    let mut w = RankWeights::default();
    let vocab = spec.embedding.vocab.next_multiple_of(VOCAB_PADDING) / tp;
    let table = vocab * spec.embedding.hidden;
    let tables = if spec.tied { table } else { 2 * table };
    let outside: u64 = spec.outside_parameter_tensors().iter().sum();
    let whole_tables = if spec.tied { 1 } else { 2 } * spec.embedding.vocab * spec.embedding.hidden;
    w.add(tables + outside.saturating_sub(whole_tables), 0, 0);
    let gated = arch.linear.as_deref().is_some_and(|l| l.output_gate);
    for (i, l) in spec.layers.iter().enumerate() {
        let hybrid = (linear_mixer(arch, i), gated);
        layer_weights(l, hybrid, tp, ep, &mut w);
    }
    if let (Some(p), Some(rotary)) = (
        arch.positions,
        spec.layers.iter().find_map(|l| l.attention.rotary_dim),
    ) {
        let kinds = if spec.rotary_per_attention_type { 2 } else { 1 };
        let bytes = if arch.family == super::ModelFamily::GptOss {
            4
        } else {
            2
        };
        w.rope_table_bytes = p
            .rope_rows
            .saturating_mul(rotary)
            .saturating_mul(kinds * bytes);
    }
    w
}

/// The profiling forward's torch peak on a rank, in bytes (`_dummy_run(max_num_tokens)`
/// without a KV cache; `validation/VLLM.md` 9.2): the largest of one layer's stages over
/// `tokens` tokens in the 16-bit model dtype, `requests` rows, pages of `block` tokens.
///
/// A dense layer's stages (vLLM's all-reduces are out of place): the qkv GEMM, rope and
/// attention (`h + 3(q+kv)/t`), gate_up (`2h + 2I/t`), SiluAndMul (`h + 3I/t`), the
/// all-reduce (`3h`). A mixture (`fused_experts_impl`, `VLLM_FUSED_MOE_CHUNK_SIZE` tokens at
/// a time) holds the stream and the router's logits, fp32 weights and int32 ids per choice,
/// the sorted ids, `cache13` `[C, k, max(2I/t, h)]` and `cache2` `[C*k, I/t]`. MLA adds
/// a throwaway `[W, heads/t, nope + v]` for the context's up-projection.
pub(crate) fn forward_peak_bytes(
    arch: &Architecture,
    tp: u64,
    ep: bool,
    tokens: u64,
    requests: u64,
    max_model_len: u64,
    block: u64,
) -> u64 {
    const B: u64 = 2;
    const MOE_CHUNK_TOKENS: u64 = 32 * 1024;
    /// `moe_align_block_size`'s padding per expert (Triton's BLOCK_SIZE_M).
    const BLOCK_M: u64 = 64;
    let tp = tp.max(1);
    let m = tokens;
    arch.spec
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let a = &l.attention;
            let h = a.hidden;
            let q = a.heads * a.head_dim / tp;
            let kv = kv_heads_per_rank(a.kv_heads, tp) * a.head_dim;
            let mut attention = match linear_mixer(arch, i) {
                Some(g) => gated_delta_net_bytes(g, h, tp, m),
                None => B * m * (h + 3 * (q + kv)),
            };
            if let Some(lat) = a.latent {
                let w = (8 * max_model_len)
                    .max(4 * requests * block)
                    .min(65_536)
                    .max(requests * block);
                attention += B * w * (a.heads / tp) * (lat.nope_dim + a.v_head_dim);
            }
            let all_reduce = if tp > 1 { B * m * 3 * h } else { 0 };
            let mlp = match &l.mlp {
                FeedForward::Dense(d) => {
                    let i = d.inner / tp;
                    B * m * (h + 3 * i).max(2 * h + 2 * i)
                }
                FeedForward::Moe(e) => {
                    // with expert parallelism every rank runs its experts on all the tokens,
                    // their inner width whole
                    let (k, i) = (e.top_k, e.inner / experts_on_rank(e.experts, tp, ep).1);
                    let c = m.min(MOE_CHUNK_TOKENS);
                    let shared = if e.shared_inner > 0 { B * m * h } else { 0 };
                    let reduce = if tp > 1 { B * m * h } else { 0 };
                    B * m * (2 * h + e.experts)
                        + 12 * m * k
                        + 4 * (c * k + e.experts * BLOCK_M)
                        + B * c * k * ((2 * i).max(h) + i)
                        + shared
                        + reduce
                }
            };
            attention.max(mlp).max(all_reduce)
        })
        .max()
        .unwrap_or(0)
}

/// A Gated DeltaNet layer's stage in the profile over `tokens` tokens on one of `tp` ranks,
/// in bytes (`Qwen3NextGatedDeltaNet.forward`, derived, not measured): beside the stream, the
/// two in-projections' outputs, the convolution's output over its channels, the chunked
/// delta rule's output and the state it keeps at each chunk's start (FLA's
/// `chunk_gated_delta_rule_fwd_h`, chunks of 64 tokens, the model's dtype). A mixture's
/// experts or the sampler outweigh it at vLLM's defaults.
fn gated_delta_net_bytes(g: GatedDeltaNet, hidden: u64, tp: u64, tokens: u64) -> u64 {
    const B: u64 = 2;
    const CHUNK: u64 = 64;
    let (keys, values) = (
        g.key_heads * g.key_dim / tp,
        g.value_heads * g.value_dim / tp,
    );
    let heads = g.value_heads / tp;
    let projections = 2 * keys + 2 * values + 2 * heads;
    let per_token = hidden + projections + g.conv_channels() / tp + values;
    let chunk_states = tokens.div_ceil(CHUNK) * heads * g.key_dim * g.value_dim;
    B * (tokens * per_token + chunk_states)
}

/// The sampler's warm-up in the profile on `requests` rows (`_dummy_sampler_run`,
/// `validation/VLLM.md` 9.1), in bytes: the forward's `hidden_states` `[T, h]` still live,
/// the rows' hidden states and logits, and per logit `per_logit` bytes beside the 16-bit
/// logits over the vocabulary padded to 64 (36 for PyTorch's top-k/top-p sort: the fp32
/// copy, sorted values, int64 indices and the sort's scratch; 12 for FlashInfer's).
pub(crate) fn sampler_peak_bytes(
    arch: &Architecture,
    tokens: u64,
    requests: u64,
    per_logit: u64,
) -> u64 {
    let (vocab, h) = (arch.spec.embedding.vocab, arch.spec.embedding.hidden);
    let padded = vocab.next_multiple_of(VOCAB_PADDING);
    2 * tokens * h + 4 * requests * h + requests * (2 * padded + per_logit * vocab)
}

/// One rank's routed experts as vLLM's MXFP4 kernels hold them: their bytes, each expert's
/// inner width split over `tp` and rounded up to `pad_inner`, the hidden width rounded up to
/// `pad_hidden`, 4-bit weights with an 8-bit scale per 32 and 16-bit biases
/// (`Mxfp4MoEMethod.create_weights`); and the unpadded biases' elements [`rank_weights`]
/// counted among the 16-bit ones.
pub(crate) fn mxfp4_experts(
    arch: &Architecture,
    tp: u64,
    ep: bool,
    pad_inner: u64,
    pad_hidden: u64,
) -> (u64, u64) {
    let tp = tp.max(1);
    arch.spec
        .layers
        .iter()
        .fold((0, 0), |(bytes, counted), l| match &l.mlp {
            FeedForward::Moe(m) => {
                let (local, split) = experts_on_rank(m.experts, tp, ep);
                let i = (m.inner / split).next_multiple_of(pad_inner.max(1));
                let h = m.hidden.next_multiple_of(pad_hidden.max(1));
                // w13 [E, 2i, h] and w2 [E, h, i]: half a byte per weight, a byte per 32
                let weights = 3 * i * h;
                let biases = if m.expert_bias { 2 * (2 * i + h) } else { 0 };
                let unpadded = if m.expert_bias {
                    local * (2 * m.inner + m.hidden) / split
                } else {
                    0
                };
                (
                    bytes + local * (weights / 2 + weights / 32 + biases),
                    counted + unpadded,
                )
            }
            FeedForward::Dense(_) => (bytes, counted),
        })
}

/// What v0.11.0's profile adds for a vision-language model (`profile_run`'s encoder part,
/// `validation/VLLM.md` 9.7), on one of `tp` ranks, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EncoderProfile {
    /// Dummy items of the largest modality run through the tower in one batch.
    pub items: u64,
    /// The encoder budget, `max(max_num_batched_tokens, tokens per item)`.
    pub budget: u64,
    /// The items' features kept in the encoder cache through the language model's forward
    /// and the sampler, each padded to the whole budget when shorter (PR #25810).
    pub kept_bytes: u64,
    /// The peak of the encoder's own run: its largest layer stage over every position of
    /// every item, or its outputs beside their padded copies.
    pub run_bytes: u64,
}

/// [`EncoderProfile`] of `arch` (`None`: a text model), or why vLLM v0.11.0 would not serve
/// it as it is modelled here.
#[cfg(feature = "vision")]
pub(crate) fn encoder_profile(
    arch: &Architecture,
    tp: u64,
    batched: u64,
    seqs: u64,
    max_model_len: u64,
) -> Result<Option<EncoderProfile>, &'static str> {
    use super::vision::{layout, Processor, VlmKind};
    /// V1's default `limit_mm_per_prompt` per modality.
    const ITEMS_PER_PROMPT: u64 = 999;
    /// Qwen2.5-VL's dummy video: at most 14 frames, two per temporal patch.
    const VIDEO_FRAME_PAIRS: u64 = 7;
    let Some(vlm) = arch.vlm.as_deref() else {
        return Ok(None);
    };
    let tp = tp.max(1);
    let largest = |w: u64, h: u64| layout(&vlm.processor, w, h).unwrap_or_default();
    // the largest item: (its placeholder tokens, the features the encoder outputs, the
    // positions entering the tower)
    let (item, out, positions) = match (&vlm.kind, &vlm.processor) {
        (VlmKind::Mllama, _) => return Err(
            "vLLM 0.11 no longer serves Llama 3.2 Vision (Mllama): its last release was 0.10.2.",
        ),
        (
            VlmKind::Qwen3Vl,
            &Processor::Qwen {
                patch,
                merge,
                temporal,
                ..
            },
        ) => {
            // a video, whose every token vLLM books as 12.5 (the timestamps' text around
            // it): the largest image's 16,384 tokens never outweigh it
            let image = largest(MAX_SIDE, MAX_SIDE);
            let side = (image.grid.0 * patch, image.grid.1 * patch);
            let video = |frames| qwen3_vl_video(side, (patch, merge, temporal), frames);
            let frames = if video(3).0 > max_model_len {
                2
            } else {
                QWEN3_VL_MAX_FRAMES
            };
            let (tokens, patches) = video(frames);
            (tokens * 25 / 2, tokens, patches)
        }
        (VlmKind::Qwen25Vl, _) => {
            // the image at max_pixels, or from max_model_len 2 x 16,384 on, a video of up
            // to 14 frames at that size
            let image = largest(MAX_SIDE, MAX_SIDE);
            let pairs = (max_model_len / image.tokens.max(1)).clamp(1, VIDEO_FRAME_PAIRS);
            (
                image.tokens * pairs,
                image.tokens * pairs,
                image.patches * pairs,
            )
        }
        (_, Processor::AnyRes { pinpoints, .. }) => {
            let l = pinpoints
                .iter()
                .map(|&(h, w)| largest(w, h))
                .max_by_key(|l| l.tokens)
                .unwrap_or_default();
            (l.tokens + l.markup, l.tokens, l.patches)
        }
        (_, Processor::Split { longest_edge, .. }) => {
            let l = largest(*longest_edge, *longest_edge);
            (l.tokens + l.markup, l.tokens, l.patches)
        }
        _ => {
            let l = largest(MAX_SIDE, MAX_SIDE);
            (l.tokens + l.markup, l.tokens, l.patches)
        }
    };
    let item = item.max(1);
    let budget = batched.max(item);
    let items = (budget / item)
        .min(seqs.saturating_mul((max_model_len / item).clamp(1, ITEMS_PER_PROMPT)))
        .max(1);
    // Qwen3-VL's deepstack mergers' features travel beside the main merger's
    let width = vlm.lm_hidden * (1 + vlm.deepstack);
    let features = |rows: u64| items.saturating_mul(rows).saturating_mul(2 * width);
    let padded = if out < budget { features(budget) } else { 0 };
    // the tower's largest stage per position, its linears split by TP (`mm_encoder_tp_mode`
    // "weights"): attention (no score matrix: xFormers / FlashAttention) or the MLP (GELU's
    // two inner tensors, SwiGLU's three)
    let t = vlm.tower;
    let inner = if matches!(vlm.kind, VlmKind::Qwen25Vl) {
        3
    } else {
        2
    } * t.inner
        / tp;
    let stage = (2 * t.hidden + 4 * t.hidden / tp).max(t.hidden + inner);
    let tower = items.saturating_mul(positions).saturating_mul(2 * stage);
    Ok(Some(EncoderProfile {
        items,
        budget,
        kept_bytes: if padded > 0 { padded } else { features(out) },
        run_bytes: tower.max(features(out).saturating_add(padded)),
    }))
}

/// vLLM 0.11.0's cap on a Qwen3-VL dummy video's frames (`_MAX_FRAMES_PER_VIDEO`).
#[cfg(feature = "vision")]
const QWEN3_VL_MAX_FRAMES: u64 = 24_576;

/// The pixels of a whole Qwen3-VL video clip (the shipped `video_preprocessor_config`'s
/// `size.longest_edge`, 24,576 frames of 32 x 32).
#[cfg(feature = "vision")]
const QWEN3_VL_VIDEO_PIXELS: f64 = 25_165_824.0;

/// A Qwen3-VL dummy video of `frames` frames resized from `side` (height, width), as
/// `_get_vision_info` lays it out with transformers' video `smart_resize`: the clip's pixels
/// capped as a whole, frames paired; (its placeholder tokens, the patches entering the
/// tower). vLLM's frame search stops at the first count whose tokens exceed
/// `max_model_len`: 3 frames of 2,880 x 2,880 (16,200 tokens) are the most, so below that
/// length it keeps 2 frames; from it on the frames shrink to 32 x 32 and grow to the cap.
#[cfg(feature = "vision")]
fn qwen3_vl_video(
    side: (u64, u64),
    (patch, merge, temporal): (u64, u64, u64),
    frames: u64,
) -> (u64, u64) {
    let f = (patch * merge) as f64;
    let (h, w) = (side.0 as f64, side.1 as f64);
    let mut hb = (h / f).round_ties_even() * f;
    let mut wb = (w / f).round_ties_even() * f;
    let t = temporal.max(1);
    let t_bar = (frames as f64 / t as f64).round_ties_even() * t as f64;
    if t_bar * hb * wb > QWEN3_VL_VIDEO_PIXELS {
        let beta = (frames as f64 * h * w / QWEN3_VL_VIDEO_PIXELS).sqrt();
        hb = f.max((h / beta / f).floor() * f);
        wb = f.max((w / beta / f).floor() * f);
    }
    let grid_t = ((frames + frames % t) / t).max(1);
    let patches = grid_t * (hb as u64 / patch.max(1)) * (wb as u64 / patch.max(1));
    (patches / (merge * merge).max(1), patches)
}

/// A side larger than any processor keeps: the largest image it makes.
#[cfg(feature = "vision")]
const MAX_SIDE: u64 = super::vision::MAX_IMAGE_SIDE;
