//! Unsloth's fast path (`FastLanguageModel` with its `fast_lora` kernels), derived from the
//! pinned source in `validation/UNSLOTH.md`: its kernels are Triton and its checkpointing
//! copies to host memory on a CUDA stream, so nothing of it runs in the harness.
//!
//! A decoder layer under `LoRA_QKV`, `LoRA_W` and `LoRA_MLP` saves, in place of autograd's
//! per-op tensors: the input RMSNorm's input X and fp32 `r` (not its output); the normed
//! input once for q, k and v; Q and K rotated in place, V and the attention's output and
//! log-sum-exp; the second RMSNorm's input and `r`; the normed input of the MLP, and its
//! gate and up outputs `e` and `g` (the activation is recomputed in backward). The MLP's
//! backward then holds the gradient of the activation (`DW`, N x inner) beside the
//! incoming gradient, and the 4-bit weight dequantized for `matmul_lora`.

use super::arith::{add, mul, storage, Res};
use super::model::Layer;
use super::peft::FOUR_BIT_BLOCK;
use super::recipe::UnslothRelease;

/// transformers 4.47's `LlamaRotaryEmbedding` cache rows at load (`min(4 * 8192, max_pos)`).
const ROPE_FIRST_ROWS: u64 = 32_768;
/// Unsloth's RoPE caches grow to the next multiple of this many rows.
const ROPE_STEP_ROWS: u64 = 8_192;
/// unsloth_zoo's pinned host buffers for the offloaded layer inputs, and each one's
/// elements at start-up (`initialize_unsloth_gradient_checkpointing`).
const STAGING_BUFFERS: u64 = 200;
const STAGING_ELEMS: u64 = 128 * 1024;
/// unsloth_zoo's smallest GPU buffer for the reloaded layer input, elements.
const GC_BUFFER_FLOOR: u64 = 1 << 20;

/// The width of one of a layer's tensors per token.
#[derive(Clone, Copy)]
enum Width {
    /// The hidden size, in the compute dtype.
    Hidden,
    /// The query heads' width.
    Q,
    /// The key heads' width.
    K,
    /// The value heads' width.
    V,
    /// The MLP's inner width.
    Inner,
    /// One fp32 value per query head (the log-sum-exp).
    Heads,
    /// One fp32 value (an RMSNorm's `r`).
    Row,
    /// Qwen3's q_norm input (Q before it): nothing without q/k norms.
    QNormed,
    /// Its k_norm input.
    KNormed,
    /// Their fp32 `r`, one per head and token.
    QkRows,
}

/// One layer's tensors in the order its forward makes them, with whether backward keeps
/// them.
const LAYER: [(Width, bool); 20] = [
    (Width::Hidden, true),  // the layer's input, RMSNorm's X
    (Width::Row, true),     // its r
    (Width::Hidden, true),  // the normed input, LoRA_QKV's X
    (Width::Q, true),       // Q (rotated in place)
    (Width::K, true),       // K (rotated in place)
    (Width::V, true),       // V
    (Width::QNormed, true), // q_norm's input
    (Width::KNormed, true), // k_norm's input
    (Width::QkRows, true),  // their r
    (Width::Heads, true),   // the attention's log-sum-exp
    (Width::Q, true),       // its output, LoRA_W's X
    (Width::Hidden, false), // the output projection
    (Width::Hidden, true),  // the residual sum, the second RMSNorm's X
    (Width::Row, true),     // its r
    (Width::Hidden, true),  // the normed input, LoRA_MLP's X
    (Width::Inner, true),   // e, the gate's output
    (Width::Inner, true),   // g, the up projection's output
    (Width::Inner, false),  // the activation's output (recomputed in backward)
    (Width::Hidden, false), // the down projection
    (Width::Hidden, false), // the residual sum, the layer's output
];

/// One layer's forward as the replay reads it: each tensor's bytes in the order it is made
/// with whether backward keeps it, the layer's input first (RMSNorm saves it).
pub(crate) fn layer_log(l: &Layer, tokens: u64, act: u64) -> Res<Vec<(u64, bool)>> {
    let a = &l.attention;
    let (q, k) = (mul(a.heads, a.head_dim)?, mul(a.kv_heads, a.head_dim)?);
    let qk_norm = a.qk_norm.is_some();
    let mut log = Vec::with_capacity(LAYER.len());
    for (width, kept) in LAYER {
        let (elems, bytes) = match width {
            Width::Hidden => (a.hidden, act),
            Width::Q => (q, act),
            Width::K => (k, act),
            Width::V => (mul(a.kv_heads, a.v_head_dim)?, act),
            Width::Inner => (l.mlp.inner(), act),
            Width::Heads => (a.heads, 4),
            Width::Row => (1, 4),
            Width::QNormed | Width::KNormed | Width::QkRows if !qk_norm => continue,
            Width::QNormed => (q, act),
            Width::KNormed => (k, act),
            Width::QkRows => (a.heads + a.kv_heads, 4),
        };
        log.push((storage(mul(tokens, elems)?, bytes)?, kept));
    }
    Ok(log)
}

/// What one recomputed layer holds during its backward beyond its reloaded input: what its
/// forward saved and its own output, which the checkpoint's backward keeps referenced while
/// it runs `torch.autograd.backward(output, dY)`.
pub(crate) fn recomputed(log: &[(u64, bool)]) -> Res<u64> {
    let saved = log
        .iter()
        .skip(1)
        .filter(|(_, kept)| *kept)
        .try_fold(0, |acc, (bytes, _)| add(acc, *bytes))?;
    add(saved, log.last().map_or(0, |(bytes, _)| *bytes))
}

/// The MLP's backward transients beside the incoming gradient: `DW`, the activation's
/// gradient, and at `matmul_lora(dY, downW.t(), ...)` either the dequantized weight or
/// (2024.12) the adapters' N x inner output added to the base's.
pub(crate) fn mlp_backward(
    l: &Layer,
    tokens: u64,
    act: u64,
    rank: u64,
    quantized: bool,
    release: UnslothRelease,
) -> Res<Vec<u64>> {
    let dw = storage(mul(tokens, l.mlp.inner())?, act)?;
    let x_a = storage(mul(tokens, rank)?, act)?;
    let matmul_lora = if release.lora_output_temporary {
        // `out += (X @ A) @ B`: a new N x inner tensor; the 4-bit weight was dequantized
        // to a fresh tensor and freed (`del W`) before it
        let lora_out = add(dw, x_a)?;
        // later, `dX += de @ gateW.t()`: the gate's weight dequantized (its absmax freed)
        // beside a new N x hidden product
        let gate_share = storage(mul(tokens, l.attention.hidden)?, act)?;
        if quantized {
            let weight = mul(l.attention.hidden, l.mlp.inner())?;
            let first = dequantized(l, act)?.max(lora_out);
            first.max(add(storage(weight, act)?, gate_share)?)
        } else {
            lora_out.max(gate_share)
        }
    } else {
        // the weight goes to the global buffer; `addmm_` adds X @ A @ B in place
        x_a
    };
    Ok(vec![dw, matmul_lora])
}

/// The largest linear of `l` dequantized (`fast_dequantize`): the weight in the compute
/// dtype and its fp32 absmax.
pub(crate) fn dequantized(l: &Layer, act: u64) -> Res<u64> {
    l.roled_linears().iter().try_fold(0, |acc: u64, (_, lin)| {
        let n = mul(lin.n_in, lin.n_out)?;
        Ok(acc.max(add(
            storage(n, act)?,
            storage(n.div_ceil(FOUR_BIT_BLOCK), 4)?,
        )?))
    })
}

/// unsloth_zoo's pinned host buffers, made at start-up: 200 of 128 Ki elements.
pub(crate) fn pinned_staging(act: u64) -> Res<u64> {
    mul(STAGING_BUFFERS * STAGING_ELEMS, act)
}

/// unsloth_zoo's GPU buffer the offloaded layer inputs come back into: at least 2^20
/// elements, grown to a layer input in the forward and kept.
pub(crate) fn checkpoint_buffer(tokens_x_hidden: u64, act: u64) -> Res<u64> {
    storage(tokens_x_hidden.max(GC_BUFFER_FLOOR), act)
}

/// Unsloth's buffers alive for the whole step: the RoPE cos/sin caches (per layer in
/// 2024.12, grown to the sequence; one per GPU in 2026, grown to the model's positions) and
/// the 2026 global dequantization buffer of the largest linear. `groups`: each distinct layer
/// with how many times it occurs.
pub(crate) fn buffers(
    groups: &[(&Layer, u64)],
    seq: u64,
    max_positions: u64,
    act: u64,
    quantized: bool,
    release: UnslothRelease,
) -> Res<u64> {
    let Some((first, _)) = groups.first() else {
        return Ok(0);
    };
    let d = first.attention.head_dim;
    let rows_to = |n: u64| -> Res<u64> { mul(n.div_ceil(ROPE_STEP_ROWS), ROPE_STEP_ROWS) };
    // cos and sin
    let cache = |rows: u64| -> Res<u64> { mul(storage(mul(rows, d)?, act)?, 2) };
    let loaded = ROPE_FIRST_ROWS.min(max_positions);
    if release.rope_per_layer {
        // the model's own cache at load, and one per layer grown to the sequence
        let per_layer = cache(loaded.max(rows_to(seq)?))?;
        let layers = groups.iter().map(|(_, n)| n).sum();
        add(cache(loaded)?, mul(per_layer, layers)?)
    } else {
        let largest = if quantized {
            groups
                .iter()
                .try_fold(0, |acc: u64, (l, _)| Ok(acc.max(dequantized(l, act)?)))?
        } else {
            0
        };
        add(cache(rows_to(seq.max(max_positions))?)?, largest)
    }
}
