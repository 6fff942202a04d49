//! Hybrid models whose linear-attention layers keep a recurrent state instead of keys and
//! values per token: Qwen3-Next (`qwen3_next`), three Gated DeltaNet layers to one of full
//! attention. They are read for serving with vLLM only: the training tape has no op kind for
//! the chunked delta rule yet, so a training estimate of them is refused
//! ([`Architecture::serving_only`]).
//!
//! The full-attention layers and every layer's mixture of experts are Qwen2-MoE's (routed
//! experts beside a gated shared expert) with Qwen3's per-head q/k norms, partial rotary and
//! a sigmoid gate on the attention output that doubles q's projection (`attn_output_gate`).

use super::config::{Architecture, Reader};
use super::model::{Attention, QkNorm};
use super::ops::RmsStyle;

/// One Gated DeltaNet layer's geometry (`Qwen3NextGatedDeltaNet`), from the config's
/// `linear_*` fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GatedDeltaNet {
    pub key_heads: u64,
    pub value_heads: u64,
    pub key_dim: u64,
    pub value_dim: u64,
    /// `linear_conv_kernel_dim`: the causal convolution's width.
    pub conv_kernel: u64,
}

impl GatedDeltaNet {
    /// Channels of the causal convolution: q and k of every key head, v of every value head.
    pub fn conv_channels(self) -> u64 {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Bytes of one request's state on one of `tp` ranks (`gated_delta_net_state_shape`):
    /// the convolution's last `kernel - 1` inputs of its channels and the
    /// `[value_heads, key_dim, value_dim]` temporal state, heads split by TP, both in the
    /// model's 16 bits (`mamba_cache_dtype` auto; vLLM 0.11 reads no `mamba_ssm_dtype` for
    /// Gated DeltaNet).
    pub fn state_bytes_per_rank(self, tp: u64) -> u64 {
        let tp = tp.max(1);
        let conv = self.conv_channels() / tp * (self.conv_kernel - 1);
        let temporal = self.value_heads / tp * self.key_dim * self.value_dim;
        2 * (conv + temporal)
    }

    /// Weights of one layer's mixer on one of `tp` ranks, as (16-bit, linear) elements:
    /// `in_proj_qkvz` and `out_proj` split by TP (the linears a checkpoint quantizes);
    /// `in_proj_ba`, the convolution and `dt_bias` split by TP and the gated norm whole, in
    /// 16 bits; `A_log` split, in fp32 (counted as two 16-bit elements each).
    pub fn weights_per_rank(self, hidden: u64, tp: u64) -> (u64, u64) {
        let tp = tp.max(1);
        let keys = self.key_heads * self.key_dim;
        let values = self.value_heads * self.value_dim;
        let qkvz = hidden * (2 * keys + 2 * values) / tp;
        let out = values * hidden / tp;
        let ba = hidden * 2 * self.value_heads / tp;
        let conv = self.conv_channels() / tp * self.conv_kernel;
        let heads = 3 * self.value_heads / tp;
        (ba + conv + heads + self.value_dim, qkvz + out)
    }

    /// Parameters of one layer's mixer on one device.
    pub fn parameters(self, hidden: u64) -> u64 {
        let (small, linear) = self.weights_per_rank(hidden, 1);
        // (`A_log` once, not as two 16-bit halves)
        small + linear - self.value_heads
    }
}

/// The linear-attention side of a hybrid model: which layers are Gated DeltaNet and their
/// geometry (the full-attention layers are the spec's layers at the other indices).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LinearAttention {
    /// Per layer, whether it is a Gated DeltaNet layer (else full attention).
    pub is_linear: Vec<bool>,
    pub mixer: GatedDeltaNet,
    /// The full-attention layers gate their output (`attn_output_gate`, vLLM's default).
    pub output_gate: bool,
}

impl LinearAttention {
    /// Gated DeltaNet layers.
    pub fn count(&self) -> u64 {
        self.is_linear.iter().filter(|l| **l).count() as u64
    }
}

/// Parameters of the sigmoid gate on a full-attention layer's output (`attn_output_gate`):
/// q_proj's second half, a gate per query dim.
pub(crate) fn output_gate(a: &Attention) -> u64 {
    a.hidden * a.heads * a.head_dim
}

/// Why a hybrid model is not estimated for training.
pub(crate) const SERVING_ONLY: &str = "Qwen3-Next's Gated DeltaNet layers are sized for serving with vLLM only (optimizer none, Serve with vLLM on; memest --serve vllm): training and a batch's inference do not model them yet.";

/// The most heads, and the widest head, a Gated DeltaNet config may give: 64 and 8 times the
/// released model's, and small enough that no size of one overflows 64 bits.
const MAX_LINEAR: u64 = 1 << 10;

/// What a `qwen3_next` config adds to Qwen2-MoE's fields, read before them (so that the
/// reader's first error is reported in the order of the fields).
#[derive(Clone, Debug)]
pub(crate) struct Qwen3NextFields {
    mixer: GatedDeltaNet,
    /// Every `full_attention_interval`-th layer is full attention, the others Gated DeltaNet.
    full_attention_interval: u64,
    /// `partial_rotary_factor`: the share of each head's dims that rotate.
    rotary_factor: f64,
    /// `layer_types` when the config lists them (newer saves do): whether each layer is
    /// `linear_attention`.
    layer_types: Option<Vec<bool>>,
    /// `attn_output_gate` (vLLM's `getattr(config, "attn_output_gate", True)`).
    output_gate: bool,
}

/// Reads the fields of a `qwen3_next` config that Qwen2-MoE's reader does not.
pub(crate) fn qwen3_next_fields(r: &mut Reader) -> Qwen3NextFields {
    Qwen3NextFields {
        mixer: GatedDeltaNet {
            key_heads: r.req(&["linear_num_key_heads"], 1, MAX_LINEAR),
            value_heads: r.req(&["linear_num_value_heads"], 1, MAX_LINEAR),
            key_dim: r.req(&["linear_key_head_dim"], 1, MAX_LINEAR),
            value_dim: r.req(&["linear_value_head_dim"], 1, MAX_LINEAR),
            conv_kernel: r.opt(&["linear_conv_kernel_dim"], 4, 2, 64),
        },
        full_attention_interval: r.opt(&["full_attention_interval"], 4, 1, 1 << 10),
        rotary_factor: r.positive("partial_rotary_factor").unwrap_or(1.0).min(1.0),
        layer_types: r.array("layer_types").map(|types| {
            types
                .iter()
                .map(|t| t.as_str() == Some("linear_attention"))
                .collect()
        }),
        output_gate: r.bool("attn_output_gate", true),
    }
}

/// Qwen3-Next from `arch`, its config read as Qwen2-MoE's, and `fields`: the Gated DeltaNet
/// layers marked ([`LinearAttention`]; their attention stays in the spec so that the layer
/// list keeps its indices, and serving skips it), the full-attention layers with Qwen3's q/k
/// norms, partial rotary and no biases, and the parameters counted as the model has them.
pub(crate) fn qwen3_next(mut arch: Architecture, fields: Qwen3NextFields) -> Architecture {
    let Qwen3NextFields {
        mixer,
        full_attention_interval,
        rotary_factor,
        layer_types,
        output_gate: gated,
    } = fields;
    // (the reader has checked that `layer_types`, when given, has an entry per layer)
    let is_linear: Vec<bool> = layer_types.unwrap_or_else(|| {
        (0..arch.num_layers())
            .map(|i| !(i + 1).is_multiple_of(full_attention_interval))
            .collect()
    });
    let mut replaced = 0u64;
    for (layer, linear) in arch.spec.layers.iter_mut().zip(&is_linear) {
        let a = &mut layer.attention;
        a.qkv_bias = false;
        a.o_bias = false;
        // (a Gated DeltaNet layer's own norm is its mixer's)
        a.qk_norm = (!linear).then_some(QkNorm {
            style: RmsStyle::Llama,
            per_head: true,
        });
        // transformers: int(head_dim * partial_rotary_factor)
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rotary = (a.head_dim as f64 * rotary_factor) as u64;
        a.rotary_dim = Some(rotary.clamp(2, a.head_dim));
        if *linear {
            let mut params = Vec::new();
            a.params(&mut params);
            replaced += params.iter().sum::<u64>();
        }
    }
    let linear = LinearAttention {
        is_linear,
        mixer,
        output_gate: gated,
    };
    let mixers = linear.count() * mixer.parameters(arch.hidden_size());
    let gates: u64 = arch
        .spec
        .layers
        .iter()
        .zip(&linear.is_linear)
        .filter(|(_, l)| gated && !**l)
        .map(|(layer, _)| output_gate(&layer.attention))
        .sum();
    let spec: u64 = arch.spec.parameter_tensors().iter().sum();
    arch.n_params = (spec - replaced) + gates + mixers;
    arch.linear = Some(Box::new(linear));
    arch
}
