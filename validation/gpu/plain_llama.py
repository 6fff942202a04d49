"""A Llama / Qwen3-style causal LM in plain PyTorch, built from a Hugging Face config.json dict.

It mirrors transformers 5.24's LlamaForCausalLM / Qwen3ForCausalLM op for op where memory is concerned
(same tensors created, same dtypes, same ones saved for backward), so that a GPU without transformers
measures what the HF model would allocate:

  * embeddings `model.embed_tokens`; LM head `lm_head` (tied to the embeddings when
    `tie_word_embeddings`, as one Parameter);
  * RMSNorm as LlamaRMSNorm: x.to(fp32), pow(2).mean(-1), rsqrt, multiply, .to(input dtype), weight *;
  * rotary as LlamaRotaryEmbedding (default rope): fp32 `inv_freq` (+ `original_inv_freq`) buffers,
    cos/sin of shape (1, S, head_dim) computed once per forward in fp32 and cast to the hidden dtype,
    `q * cos + rotate_half(q) * sin` on the (B, H, S, D) transposed views;
  * attention as sdpa_attention_forward: q/k/v projections, Qwen3's q_norm / k_norm (RMSNorm over
    head_dim, on the (B, S, H, D) view before the transpose), F.scaled_dot_product_attention with
    is_causal=True, no mask, enable_gqa=True for grouped-query attention (K/V not repeated), then
    transpose(1, 2).contiguous() and o_proj;
  * SwiGLU MLP: down(silu(gate(x)) * up(x));
  * loss as transformers' ForCausalLMLoss: logits.float(), labels padded by one -100 and shifted
    (contiguous), cross_entropy(mean, ignore_index=-100). The forward returns only the loss (the
    logits die when it returns, as in a training loop that keeps `out.loss`).

Parameter names are HF's (model.layers.0.self_attn.q_proj.weight, ...), so an HF state dict loads
into it (the self-test compares the losses). llama3-style rope scaling only changes inv_freq's
values, not any shape, so it is ignored here.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def dims(cfg: dict) -> dict:
    """The dimensions used from a config.json dict (text configs of the Llama / Qwen2 / Qwen3 kind)."""
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"plain_llama: hidden_act {act!r} not supported (silu only)")
    return {
        "vocab": cfg["vocab_size"],
        "hidden": hidden,
        "inter": cfg["intermediate_size"],
        "layers": cfg["num_hidden_layers"],
        "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or hidden // heads,
        "eps": cfg.get("rms_norm_eps", 1e-6),
        "theta": float(theta),
        "tied": bool(cfg.get("tie_word_embeddings", False)),
        "attn_bias": bool(cfg.get("attention_bias", False)),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
        "qk_norm": cfg.get("model_type") == "qwen3",
        "pad": cfg.get("pad_token_id"),
    }


class RMSNorm(nn.Module):
    def __init__(self, n, eps, **fk):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n, **fk))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Rotary(nn.Module):
    def __init__(self, head_dim, theta, device=None):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * 1.0
        sin = emb.sin() * 1.0
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class Attention(nn.Module):
    def __init__(self, d, **fk):
        super().__init__()
        h, hd = d["hidden"], d["head_dim"]
        self.head_dim = hd
        self.num_key_value_groups = d["heads"] // d["kv_heads"]
        self.scaling = hd ** -0.5
        self.q_proj = nn.Linear(h, d["heads"] * hd, bias=d["attn_bias"], **fk)
        self.k_proj = nn.Linear(h, d["kv_heads"] * hd, bias=d["attn_bias"], **fk)
        self.v_proj = nn.Linear(h, d["kv_heads"] * hd, bias=d["attn_bias"], **fk)
        self.o_proj = nn.Linear(d["heads"] * hd, h, bias=d["attn_bias"], **fk)
        if d["qk_norm"]:
            self.q_norm = RMSNorm(hd, d["eps"], **fk)
            self.k_norm = RMSNorm(hd, d["eps"], **fk)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, hidden_states, cos, sin):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = q.transpose(1, 2)
        k = self.k_proj(hidden_states).view(hidden_shape)
        if self.k_norm is not None:
            k = self.k_norm(k)
        k = k.transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        kw = {"enable_gqa": True} if self.num_key_value_groups > 1 else {}
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=self.scaling,
                                             is_causal=q.shape[2] > 1, **kw)
        out = out.transpose(1, 2).contiguous()
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, d, **fk):
        super().__init__()
        self.gate_proj = nn.Linear(d["hidden"], d["inter"], bias=d["mlp_bias"], **fk)
        self.up_proj = nn.Linear(d["hidden"], d["inter"], bias=d["mlp_bias"], **fk)
        self.down_proj = nn.Linear(d["inter"], d["hidden"], bias=d["mlp_bias"], **fk)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, d, **fk):
        super().__init__()
        self.self_attn = Attention(d, **fk)
        self.mlp = MLP(d, **fk)
        self.input_layernorm = RMSNorm(d["hidden"], d["eps"], **fk)
        self.post_attention_layernorm = RMSNorm(d["hidden"], d["eps"], **fk)

    # transformers 5.24 GradientCheckpointingLayer: `forward` (not __call__) is checkpointed, with
    # {"use_reentrant": False}; so a compiled block (block.compile()) has the checkpoint inside its graph
    gradient_checkpointing = False

    def forward(self, hidden_states, cos, sin, position_ids=None):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # HF: checkpoint(partial(forward, self, **kwargs), hidden_states): cos / sin / position_ids are
            # held by the checkpoint until backward, as here
            return checkpoint(functools.partial(self._forward, cos=cos, sin=sin, position_ids=position_ids),
                              hidden_states, use_reentrant=False)
        return self._forward(hidden_states, cos, sin, position_ids)

    def _forward(self, hidden_states, cos, sin, position_ids=None):
        # position_ids is unused, as in HF's decoder layer (it is passed down as a keyword and ignored)
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, cos, sin)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


class Backbone(nn.Module):
    def __init__(self, d, **fk):
        super().__init__()
        self.embed_tokens = nn.Embedding(d["vocab"], d["hidden"], padding_idx=d["pad"], **fk)
        self.layers = nn.ModuleList([DecoderLayer(d, **fk) for _ in range(d["layers"])])
        self.norm = RMSNorm(d["hidden"], d["eps"], **fk)
        self.rotary_emb = Rotary(d["head_dim"], d["theta"], device=fk.get("device"))

    def forward(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        position_ids = (torch.arange(hidden_states.shape[1], device=hidden_states.device) + 0).unsqueeze(0)
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, cos, sin, position_ids)
        return self.norm(hidden_states)


def causal_lm_loss(logits, labels, vocab_size, ignore_index=-100):
    """transformers' ForCausalLMLoss (num_items_in_batch None: reduction mean)."""
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1).to(logits.device)
    return F.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="mean")


class CausalLM(nn.Module):
    def __init__(self, cfg: dict, dtype=torch.float32, device=None, init_std=0.02):
        super().__init__()
        d = dims(cfg)
        self.dims = d
        fk = {"dtype": dtype, "device": device}
        self.model = Backbone(d, **fk)
        self.lm_head = nn.Linear(d["hidden"], d["vocab"], bias=False, **fk)
        if d["tied"]:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.loss_function = functools.partial(causal_lm_loss, vocab_size=d["vocab"])
        with torch.no_grad():  # HF _init_weights: normal(0, 0.02) for linear / embedding, ones for norms
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    m.weight.normal_(0.0, init_std)
                    if getattr(m, "bias", None) is not None:
                        m.bias.zero_()

    def gradient_checkpointing_enable(self, every: int = 1):
        """Checkpoint block k (1-based) iff k % every == 0 (every=1: all, HF's gradient checkpointing)."""
        for i, layer in enumerate(self.model.layers):
            layer.gradient_checkpointing = (i + 1) % every == 0

    def forward(self, input_ids, labels):
        hidden_states = self.model(input_ids)
        logits = self.lm_head(hidden_states)
        return self.loss_function(logits, labels)
