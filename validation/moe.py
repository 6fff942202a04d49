#!/usr/bin/env python3
"""Mixture-of-experts support for the measurement harness (measure.py / dump_saved.py).

What transformers 5.24 does with MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 /
Moonlight, gpt-oss), and what this module provides:

* Every experts class of those families is decorated with ``@use_experts_implementation``; the
  experts' forward is chosen at call time from ``config._experts_implementation``.
  ``PreTrainedModel.get_correct_experts_implementation`` makes **"grouped_mm" the default** (it
  falls back to "eager" only for classes without the decorator). Choices:
    - "grouped_mm": sort the (token, slot) pairs by expert, gather the tokens (tokens*k rows),
      ``torch.nn.functional.grouped_mm`` with cumulative offsets, weight by the routing scores,
      un-permute, sum over k. Static shapes, no ``nonzero``: runs under FakeTensorMode, and is
      what a CUDA run (sm80+, torch >= 2.10) uses by default.
    - "batched_mm": gathers a full copy of the expert weights per (token, slot)
      (``gate_up_proj[expert_ids]``: tokens*k x 2I x H) and uses bmm. Static shapes, but its
      memory is not that of a GPU training run; only for export / tracing.
    - "eager": the class's own loop over the experts that were hit
      (``one_hot(...).sum(...).nonzero()`` + ``torch.where``): data-dependent shapes; FakeTensorMode
      raises DynamicOutputShapeException, and its memory depends on the routing.
  ``grouped_mm`` is not on any autocast list (pytorch#174763): transformers casts the input to the
  weight dtype, so under AMP (fp32 master weights) the expert GEMMs run in **fp32**.
* gpt-oss has ``_supports_sdpa = False``: measure it with ``attn="eager"``.
* gpt-oss's ``quantization_config`` (MXFP4) is ignored by ``from_config`` (no quantizer is
  attached: dense experts in the model dtype). ``from_pretrained`` of the MXFP4 checkpoint is not
  trainable (``Mxfp4HfQuantizer.is_trainable`` is False) unless dequantized
  (``Mxfp4Config(dequantize=True)``), which gives the same dense bf16 tensors.

No patch of measure.py is needed for the default ("grouped_mm") path: ``measure.measure`` runs MoE
configs as they are. This module adds:

* ``measure_moe(...)``: ``measure.measure`` with a chosen experts implementation and a choice of
  fake (FakeTensorMode, the harness default) or real CPU tensors (to check that fake mode gives
  the same bytes; use attn="eager" in real mode: the emulated flash / mem-efficient SDPA kernels
  are CUDA-only ops with no CPU kernel);
* ``param_counts(cfg)``: total parameters and active parameters per token (routed experts counted
  k/E) of a model built on the meta device;
* ``small_config(d, ...)``: a scaled-down copy of a MoE config (layers, experts, widths) that keeps
  one dense and one MoE layer where the model has both, and one sliding + one full layer (gpt-oss).

Usage:
  python validation/moe.py --config validation/configs/qwen3-30b-a3b.json --layers 2 --experts 8 \
      --batch 1 --seq 64 --precision bf16 --attn sdpa [--experts-impl grouped_mm] [--real]
  python validation/moe.py --count validation/configs/deepseek-v3.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure as M  # noqa: E402

import torch  # noqa: E402

EXPERTS_IMPLS = ("grouped_mm", "batched_mm", "eager")

# config keys that name the number of routed experts, per family
_N_EXPERTS_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def n_experts(cfg) -> int | None:
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    for k in _N_EXPERTS_KEYS:
        v = get(k, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def is_moe_config(cfg) -> bool:
    return n_experts(cfg) is not None


def set_experts_implementation(model, impl: str | None):
    """Switch the experts forward of a built model (no-op for dense models or impl None)."""
    if impl is None or not getattr(model, "_can_set_experts_implementation", lambda: False)():
        return model
    model.set_experts_implementation(impl)
    return model


class _NoFake:
    """Stand-in for FakeTensorMode(allow_non_fake_inputs=True): real tensors."""

    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@contextlib.contextmanager
def _patched_measure(experts_impl: str | None, real: bool):
    orig_build, orig_fake = M.build_model, M.FakeTensorMode

    def build_model(cfg, arch, attn, dtype):
        return set_experts_implementation(orig_build(cfg, arch, attn, dtype), experts_impl)

    M.build_model = build_model
    if real:
        M.FakeTensorMode = _NoFake
    try:
        yield
    finally:
        M.build_model, M.FakeTensorMode = orig_build, orig_fake


def measure_moe(config, model_name="moe", batch=1, seq=64, precision="bf16", optimizer="adamw",
                attn="sdpa", gc=False, experts_impl: str | None = "grouped_mm", real=False):
    """measure.measure() on a config path or dict, with the experts implementation forced and
    optionally real CPU tensors instead of FakeTensorMode. Returns the row (same format)."""
    tmp = None
    if isinstance(config, dict):
        fd, tmp = tempfile.mkstemp(suffix=".json", prefix="moe_cfg_")
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        config = tmp
    try:
        with _patched_measure(experts_impl, real):
            row = M.measure(config, model_name, batch, seq, precision, optimizer, attn, gc)
    finally:
        if tmp:
            os.unlink(tmp)
    row["config"]["mode"] = "real" if real else "fake"
    row["config"]["experts_impl"] = experts_impl
    return row


def param_counts(config) -> dict:
    """PyTorch's parameter count of the model built from `config` (path or dict) on the meta
    device, and the active parameters per token: every parameter except the routed experts'
    stacked tensors, plus k/E of those (shared experts, routers, attention, embeddings and head
    count in full)."""
    if isinstance(config, str):
        with open(config) as f:
            config = json.load(f)
    d = dict(config)
    d.pop("quantization_config", None)
    fd, tmp = tempfile.mkstemp(suffix=".json", prefix="moe_cnt_")
    with os.fdopen(fd, "w") as f:
        json.dump(d, f)
    try:
        cfg, arch = M.load_config(tmp, "eager")
    finally:
        os.unlink(tmp)
    with torch.device("meta"):
        model = M.build_model(cfg, arch, "eager", None)
    E = n_experts(cfg)
    k = getattr(cfg, "num_experts_per_tok", None)
    total = routed = 0
    for n, p in model.named_parameters():
        total += p.numel()
        if E and ".experts." in n and "shared" not in n:
            routed += p.numel()
    active = total - routed + (routed * k // E if E else 0)
    emb = model.get_input_embeddings().weight.numel()
    return {"total": total, "active": active, "routed_expert_params": routed, "n_experts": E,
            "top_k": k, "embedding": emb}


def small_config(d: dict, n_layers=2, experts=None, top_k=None, hidden=None, inter=None,
                 moe_inter=None, vocab=None) -> dict:
    """Scaled-down copy of a published MoE config. Layers: keeps one dense + one MoE layer when
    the model starts with dense layers (DeepSeek first_k_dense_replace), one sliding + one full
    layer for gpt-oss (layer_types). Widths are only changed when given."""
    d = json.loads(json.dumps(d))
    old_layers = d.get("num_hidden_layers")
    d["num_hidden_layers"] = n_layers
    if "first_k_dense_replace" in d and d["first_k_dense_replace"] > 0:
        d["first_k_dense_replace"] = min(d["first_k_dense_replace"], max(1, n_layers - 1))
    if isinstance(d.get("layer_types"), list) and len(d["layer_types"]) == old_layers:
        lt, distinct = d["layer_types"], list(dict.fromkeys(d["layer_types"]))
        first = lt[:n_layers]
        # first n entries, unless that drops a layer type the model has
        d["layer_types"] = first if len(set(first)) >= min(len(distinct), n_layers) \
            else (distinct + lt)[:n_layers]
    if isinstance(d.get("max_window_layers"), int):
        d["max_window_layers"] = min(d["max_window_layers"], n_layers)
    if d.get("mlp_only_layers"):
        d["mlp_only_layers"] = [i for i in d["mlp_only_layers"] if i < n_layers]
    if experts is not None:
        for key in _N_EXPERTS_KEYS:
            if key in d:
                d[key] = experts
        if "n_group" in d and d.get("n_group", 1) > 1:
            # keep experts divisible by the groups, at most topk_group groups of >= 2 experts
            g = d["n_group"]
            while g > 1 and (experts % g or experts // g < 2):
                g //= 2
            d["n_group"] = g
            d["topk_group"] = min(d.get("topk_group", 1), g)
    if top_k is not None:
        d["num_experts_per_tok"] = top_k
        if "experts_per_token" in d:
            d["experts_per_token"] = top_k
    if hidden is not None:
        d["hidden_size"] = hidden
    if inter is not None:
        d["intermediate_size"] = inter
    if moe_inter is not None:
        for key in ("moe_intermediate_size",):
            if key in d:
                d[key] = moe_inter
        if "shared_expert_intermediate_size" in d and inter is not None:
            d["shared_expert_intermediate_size"] = inter
    if vocab is not None:
        d["vocab_size"] = vocab
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if isinstance(d.get(key), int) and d[key] >= vocab:
                d[key] = vocab - 1 if key == "pad_token_id" else 0
    return d


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--count", help="print total / active parameter counts of this config and exit")
    ap.add_argument("--layers", type=int, default=0, help="scale down to this many layers (0 = keep)")
    ap.add_argument("--experts", type=int, help="scale down the number of routed experts")
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--precision", choices=["fp32", "amp_bf16", "bf16"], default="bf16")
    ap.add_argument("--optimizer", choices=["adamw", "sgd", "none"], default="adamw")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--experts-impl", choices=EXPERTS_IMPLS, default="grouped_mm")
    ap.add_argument("--real", action="store_true", help="real CPU tensors instead of FakeTensorMode")
    a = ap.parse_args(argv)
    if a.count:
        print(json.dumps(param_counts(a.count)))
        return 0
    if not a.config:
        ap.error("--config or --count is required")
    with open(a.config) as f:
        d = json.load(f)
    if a.layers or a.experts or a.top_k:
        d = small_config(d, a.layers or d["num_hidden_layers"], a.experts, a.top_k)
    name = os.path.splitext(os.path.basename(a.config))[0]
    row = measure_moe(d, name, a.batch, a.seq, a.precision, a.optimizer, a.attn, a.gc,
                      a.experts_impl, a.real)
    kernels = row.pop("sdpa_kernels", {})
    print(json.dumps(row))
    print(f"[moe] {name} {row['config']['mode']} {a.experts_impl} b{a.batch} s{a.seq} {a.precision} "
          f"{a.attn}: saved_act {row['saved_act_bytes']} peak {row['peak_bytes']} ({row['peak_phase']}), "
          f"sdpa {kernels}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
