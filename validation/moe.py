#!/usr/bin/env python3
"""Mixture-of-experts models: the recipe of measure.py with what MoE runs vary (the experts
implementation, real CPU tensors to check the fake mode, scaled-down configs).

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

Nothing special is needed for the default ("grouped_mm") path: ``measure.measure`` runs MoE
configs as they are, and ``moe.py`` without its own options gives measure.py's row (the rows of
``core/tests/fixtures/moe-measured.jsonl``, from ``grid-moe.json``; ``reproduce.py`` sends them here).
This module adds:

* ``measure_moe(...)``: ``measure.measure`` with a chosen experts implementation (its
  ``adapt_model``; written to ``config.experts_impl`` when given) and a choice of fake
  (FakeTensorMode, the harness default) or real CPU tensors (``device="real-cpu"``, to check that
  fake mode gives the same bytes; use attn="eager" in real mode: the emulated flash /
  mem-efficient SDPA kernels are CUDA-only ops with no CPU kernel);
* ``param_counts(cfg)``: total parameters and active parameters per token (routed experts counted
  k/E) of a model built on the meta device;
* ``small_config(d, ...)``: a scaled-down copy of a MoE config (layers, experts, widths) that keeps
  one dense and one MoE layer where the model has both, and one sliding + one full layer (gpt-oss);
  ``--layers`` / ``--experts`` / ``--top-k`` are written to the row's config when given.

Usage:
  python validation/moe.py --config validation/configs/qwen3-30b-a3b.json --layers 2 --experts 8 \
      --batch 1 --seq 64 --precision bf16 --attn sdpa [--experts-impl grouped_mm] [--real]
  python validation/moe.py --count validation/configs/deepseek-v3.json
  python validation/moe.py --grid validation/grid-moe.json --out rows.jsonl
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
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


def measure_moe(config, model_name="moe", batch=1, seq=64, precision="bf16", optimizer="adamw",
                attn="sdpa", gc=False, experts_impl: str | None = None, real=False, **measure_kw):
    """measure.measure() on a config path or dict, the experts implementation set on the built model
    (None: the model's own, grouped_mm, and no config.experts_impl) and, with `real`, real CPU
    tensors instead of FakeTensorMode (config.mode "real-cpu"). `measure_kw`: measure.measure's
    other options (opt_impl, weight_decay, micro_batches). Returns the row (measure.py's format)."""
    adapt = None if experts_impl is None else (lambda model: set_experts_implementation(model, experts_impl))
    with H.config_file(config) if isinstance(config, dict) else contextlib.nullcontext(config) as path:
        row = M.measure(path, model_name, batch, seq, precision, optimizer, attn, gc,
                        device="real-cpu" if real else "fake", adapt_model=adapt, **measure_kw)
    if experts_impl is not None:
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
    with H.config_file(d) as path:
        cfg, arch = H.load_config(path, "eager")
    with torch.device("meta"):
        model = H.build_model(cfg, arch, "eager", None)
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


# measure.py's flags that a MoE row may hold (gc_policy aside), and this recipe's own
GRID_FLAGS = {**{k: v for k, v in M.GRID_FLAGS.items() if k not in ("gc_policy", "mode")},
              "experts_impl": "--experts-impl", "layers": "--layers", "experts": "--experts", "top_k": "--top-k"}


def argv_of(entry):
    """The command line (without --config) of a grid entry or a row's config (measure.py's rows of
    MoE models included)."""
    if entry.get("gc_policy") is not None:
        raise SystemExit("moe.py does not take --gc-policy: measure this row with measure.py")
    return H.flags(entry, GRID_FLAGS) + (["--real"] if entry.get("mode") == "real-cpu" else [])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_model_args(ap, seq=64, precision="bf16")
    ap.add_argument("--count", help="print total / active parameter counts of this config and exit")
    ap.add_argument("--layers", type=int, default=0, help="scale down to this many layers (0 = keep)")
    ap.add_argument("--experts", type=int, help="scale down the number of routed experts")
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--optimizer", choices=["adamw", "adam", "sgd", "none"], default="adamw")
    ap.add_argument("--optimizer-impl", choices=list(H.OPT_IMPLS), default="foreach")
    ap.add_argument("--weight-decay", type=float, default=None)
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--experts-impl", choices=EXPERTS_IMPLS, default=None,
                    help="set the experts implementation (default: the model's own, grouped_mm; written to "
                    "config.experts_impl when given)")
    ap.add_argument("--real", action="store_true", help="real CPU tensors instead of FakeTensorMode")
    H.add_run_args(ap)
    a = ap.parse_args(argv)
    if a.count:
        print(json.dumps(param_counts(a.count)))
        return 0
    done = H.dispatch(a, __file__, argv_of, main)
    if done is not None:
        return done
    if not a.config:
        ap.error("--config, --count, --grid or --from-row is required")
    with open(a.config) as f:
        d = json.load(f)
    scale = {k: v for k, v in (("layers", a.layers), ("experts", a.experts), ("top_k", a.top_k)) if v}
    if scale:
        d = small_config(d, a.layers or d["num_hidden_layers"], a.experts, a.top_k)
    name = a.model_name or os.path.splitext(os.path.basename(a.config))[0]
    row = measure_moe(d if scale else a.config, name, a.batch, a.seq, a.precision, a.optimizer, a.attn, a.gc,
                      a.experts_impl, a.real, opt_impl=a.optimizer_impl, weight_decay=a.weight_decay,
                      micro_batches=a.micro_batches)
    row["config"].update(scale)
    kernels = row.pop("sdpa_kernels", {})
    return H.emit(row, a.out, f"[moe] {name} {row['config']['mode']} {a.experts_impl or 'default'} b{a.batch} "
                  f"s{a.seq} {a.precision} {a.attn}: saved_act {row['saved_act_bytes']} peak {row['peak_bytes']} "
                  f"({row['peak_phase']}), sdpa {kernels}")


if __name__ == "__main__":
    sys.exit(main())
