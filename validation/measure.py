#!/usr/bin/env python3
"""Measure the peak memory of one training step of a Hugging Face config.json.

Method (see validation/README.md and shared/reference/README.md):
  * torch + transformers, model built from config with random weights (nothing downloaded);
  * everything runs under FakeTensorMode (no real memory, only shapes/dtypes), on fake CPU tensors;
  * one untracked warm-up step, then one step tracked by
    torch.distributed._tools.mem_tracker.MemTracker: forward (+loss), backward,
    optimizer.step(), zero_grad(set_to_none=True);
  * the CPU path is made to allocate what the CUDA path would (CUDA emulation):
      - every storage rounded up to 512 bytes (CUDA caching allocator block);
      - dropout goes through aten.native_dropout (1-byte bool mask, like the fused CUDA kernel);
      - F.scaled_dot_product_attention dispatches like CUDA: flash (fp16/bf16, no mask,
        head_dim <= 256, GQA ok) > mem-efficient (fp32 ok, masks ok, GQA ok since torch 2.14) > math;
        the CUDA kernels' own aten ops are called (their fake/meta implementations give the saved out +
        fp32 logsumexp); a bool mask is converted per call to an additive mask of the query dtype and
        padded/expanded as attention.cpp does (it is what the efficient kernel saves for backward);
      - under AMP, the ops that CUDA autocast runs in fp32 (layer_norm, softmax, log_softmax, pow,
        rsqrt, exp, ...) get AutocastCPU kernels that cast to fp32; the bf16 list (linear, matmul,
        addmm, bmm, ...) is the same on CPU and CUDA and keeps PyTorch's own cached-cast kernels.

Example:
  python validation/measure.py --config validation/configs/gpt2.json --model-name gpt2 \
      --batch 1 --seq 1024 --precision amp_bf16 --optimizer adamw --attn sdpa --out rows.jsonl
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
import weakref

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools import mem_tracker as _mt  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType  # noqa: E402
from torch.utils._pytree import tree_map  # noqa: E402

torch.set_num_threads(1)

ROUND_BYTES = 512
CATS = [
    ("parameter", _MemRefType.PARAM),
    ("buffer", _MemRefType.BUFFER),
    ("gradient", _MemRefType.GRAD),
    ("activation", _MemRefType.ACT),
    ("temp", _MemRefType.TEMP),
    ("optstate", _MemRefType.OPT),
    ("other", _MemRefType.OTH),
]

# ----------------------------------------------------------------------------------------------
# CUDA emulation
# ----------------------------------------------------------------------------------------------
_EMULATION_INSTALLED = False
_orig_dropout = F.dropout
_orig_sdpa = F.scaled_dot_product_attention
_lib = None


def _round_mem(self) -> int:  # replaces _WeakRefInfo._calculate_mem_consumed
    mem = self.size * self.element_size
    return math.ceil(mem / ROUND_BYTES) * ROUND_BYTES


def _cuda_dropout(input, p=0.5, training=True, inplace=False):
    # at::dropout on CUDA uses the fused kernel (native_dropout, bool mask) when
    # train and 0 < p < 1 and numel > 0; the in-place variant never does.
    if training and 0.0 < p < 1.0 and not inplace and input.numel() > 0:
        return torch.ops.aten.native_dropout.default(input, p, True)[0]
    return _orig_dropout(input, p, training, inplace)


def _sdpa_choice(q, k, v, attn_mask, dropout_p, enable_gqa):
    """Mirror of sdp_utils.cpp's choice on an sm80+ GPU: flash > mem-efficient > math."""
    dt = q.dtype
    d_qk, d_v = q.shape[-1], v.shape[-1]
    gqa = q.dim() == 4 and k.shape[-3] != q.shape[-3]
    if gqa:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        # check_batch_size_and_num_heads_dense: GQA needs enable_gqa=True, Hk == Hv and Hq % Hk == 0
        # (since PR #191085 an implicit MQA, Hk == Hv == 1, is also accepted without enable_gqa)
        if hk != hv or hk == 0 or hq % hk != 0 or not (enable_gqa or hk == 1):
            return "math"
    if (
        q.dim() == 4
        and dt in (torch.float16, torch.bfloat16)
        and attn_mask is None
        and d_qk == d_v
        and d_qk % 8 == 0
        and d_qk <= 256
    ):
        return "flash"
    # minimum_gemm_alignment on sm80+: 8 elements for fp16/bf16, 4 for fp32
    align = 8 if dt in (torch.float16, torch.bfloat16) else 4
    if (
        q.dim() == 4
        and dt in (torch.float16, torch.bfloat16, torch.float32)
        and d_qk == k.shape[-1]
        and d_qk % align == 0
        and d_v % align == 0
    ):
        # torch 2.14+: can_use_mem_efficient_attention has supports_gqa = supports_mqa = true for
        # dense CUDA inputs (sdp_utils.cpp; PR #191085: native GQA in the CUTLASS kernel, K/V are
        # NOT expanded; the backward reduces q-head-wide dK/dV partials in a follow-up kernel).
        # The op is called with K/V of Hkv heads; autograd saves q, k, v (Hkv heads), out, lse.
        return "efficient"
    return "math"


SDPA_LOG: dict = {}


def _preprocess_mask(mask, query, key):
    """attention.cpp preprocess_mask (mem-efficient path): if any stride but the last is not a
    multiple of 8 (i.e. S % 8 != 0 for a contiguous mask), pad the last dim to a multiple of 8
    (constant_pad_nd materialises B x 1 x L x S8) and slice back; then expand to (B, Hq, L, S) as a
    view (no per-head copy). The efficient kernel saves this view (storage = the padded or the
    converted mask) as attn_bias for backward; no grad_attn_bias is computed (the mask does not
    require grad)."""
    aligned = mask.stride(-1) == 1 and all(mask.stride(i) % 8 == 0 for i in range(mask.dim() - 1))
    if not aligned:
        S = mask.shape[-1]
        mask = F.pad(mask, (0, 8 - S % 8))[..., :S]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    if torch.is_autocast_enabled("cpu"):
        # scaled_dot_product_attention is on CUDA autocast's lower-precision list.
        adt = torch.get_autocast_dtype("cpu")

        def cast(t):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in (adt, torch.float64):
                return t.to(adt)
            return t

        query, key, value, attn_mask = cast(query), cast(key), cast(value), cast(attn_mask)
        with torch.autocast("cpu", enabled=False):
            return _cuda_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    kind = _sdpa_choice(query, key, value, attn_mask, dropout_p, enable_gqa)
    SDPA_LOG[kind] = SDPA_LOG.get(kind, 0) + 1
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # convert_boolean_attn_mask (attention.cpp, done inside every SDPA call, i.e. once per layer):
        # where(mask, scalar_tensor(0), scalar_tensor(-inf)) in the query dtype. The output has the
        # mask's broadcast shape, contiguous: HF's (1,1,L,S) mask expanded to (B,1,L,S) becomes a
        # B x L x S tensor of the query dtype (the batch is materialised, the heads are not).
        zero = torch.scalar_tensor(0.0, dtype=query.dtype, device=query.device)
        ninf = torch.scalar_tensor(-math.inf, dtype=query.dtype, device=query.device)
        attn_mask = torch.where(attn_mask, zero, ninf)
        del zero, ninf
    if kind == "flash":
        out = torch.ops.aten._scaled_dot_product_flash_attention.default(
            query, key, value, dropout_p, is_causal, False, scale=scale)
        return out[0]
    if kind == "efficient":
        need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if attn_mask is not None:
            attn_mask = _preprocess_mask(attn_mask, query, key)
        out = torch.ops.aten._scaled_dot_product_efficient_attention.default(
            query, key, value, attn_mask, need_lse, dropout_p, is_causal, scale=scale)
        return out[0]
    # math: the explicit composite (keeps the seq x seq probabilities)
    return torch.ops.aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]


# Ops that CUDA autocast runs in fp32 but CPU autocast leaves alone (autocast_mode.cpp, CUDA
# "fp32" policy). The lower-precision lists agree for the ops these models use.
CUDA_FP32_OPS = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
    "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
]
# CUDA "fp32_set_opt_dtype" policy: if the op's optional dtype is not given, run it with
# dtype=float32 (no fp32 copy of the input is made); if it is given, run it as is.
CUDA_FP32_SET_OPT_DTYPE_OPS = [
    "softmax.int", "softmax.Dimname", "log_softmax.int", "log_softmax.Dimname",
    "prod", "prod.dim_int", "cumprod", "cumsum", "sum", "sum.dim_IntList",
]
# On CPU's fp32 list but on none of CUDA's: CUDA runs them as composites with autocast still on
# (cross_entropy_loss -> log_softmax(dtype=input dtype) -> nll_loss in fp32).
CUDA_FALLTHROUGH_OPS = ["cross_entropy_loss"]


def _install_autocast_fp32_kernels():
    global _lib
    _lib = torch.library.Library("aten", "IMPL")
    excl = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    for name in CUDA_FP32_OPS:
        base, _, ov = name.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        if packet is None:
            continue
        op = getattr(packet, ov or "default", None)
        if op is None:
            continue

        def make(op):
            def cast(t):
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype in (
                        torch.float16, torch.bfloat16):
                    return t.to(torch.float32)
                return t

            def kernel(*args, **kwargs):
                args = tree_map(cast, args)
                kwargs = tree_map(cast, kwargs)
                with torch._C._ExcludeDispatchKeyGuard(excl):
                    return op(*args, **kwargs)
            return kernel

        try:
            _lib.impl(name, make(op), "AutocastCPU")
        except Exception as e:  # pragma: no cover - op missing in this torch
            print(f"[measure] could not register fp32 autocast for {name}: {e}", file=sys.stderr)

    for name in CUDA_FP32_SET_OPT_DTYPE_OPS:
        base, _, ov = name.partition(".")
        try:
            op = getattr(getattr(torch.ops.aten, base), ov or "default")
        except AttributeError:  # Dimname overloads are not exposed in Python
            continue
        names = [a.name for a in op._schema.arguments]
        kw_only = [a.kwarg_only for a in op._schema.arguments]
        di = names.index("dtype")

        def make_sod(op, di, kwo):
            def kernel(*args, **kwargs):
                given = kwargs.get("dtype") is not None or (len(args) > di and args[di] is not None)
                first = args[0]
                if not given and isinstance(first, torch.Tensor) and first.is_floating_point() \
                        and first.dtype != torch.float64:
                    if len(args) > di:
                        args = args[:di] + (torch.float32,) + args[di + 1:]
                    else:
                        kwargs["dtype"] = torch.float32
                with torch._C._ExcludeDispatchKeyGuard(excl):
                    return op(*args, **kwargs)
            return kernel

        _lib.impl(name, make_sod(op, di, kw_only[di]), "AutocastCPU")

    for name in CUDA_FALLTHROUGH_OPS:
        _lib.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")


def install_cuda_emulation():
    global _EMULATION_INSTALLED
    if _EMULATION_INSTALLED:
        return
    _mt._WeakRefInfo._calculate_mem_consumed = _round_mem
    F.dropout = _cuda_dropout
    F.scaled_dot_product_attention = _cuda_sdpa
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _install_autocast_fp32_kernels()
    # transformers treats FakeTensors as "tracing" and then always materialises the causal mask
    # (a seq x seq bool tensor, which also rules out the flash kernel). Real CUDA runs, with real
    # tensors and no padding, skip it and call sdpa with is_causal=True: do the same.
    import transformers.masking_utils as mu
    _orig_ignore = mu._ignore_causal_mask_sdpa

    def _ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, q_offset, kv_offset,
                                 local_attention_size=None):
        if padding_mask is None and (q_length == 1 or kv_length == q_length) and (
                local_attention_size is None or kv_length < local_attention_size):
            return True
        return _orig_ignore(padding_mask, q_length, kv_length, q_offset, kv_offset,
                            local_attention_size)

    mu._ignore_causal_mask_sdpa = _ignore_causal_mask_sdpa
    # our position ids are 0..seq-1 in every row: no packed sequences (the check reads values)
    mu.find_packed_sequence_indices = lambda position_ids: None
    _EMULATION_INSTALLED = True


# ----------------------------------------------------------------------------------------------
# Tracker with per-phase peaks and AMP weight copy accounting
# ----------------------------------------------------------------------------------------------
_CPU_SIDE_OUTPUTS = {
    torch.ops.aten._scaled_dot_product_flash_attention.default: (6, 7),
    torch.ops.aten._scaled_dot_product_efficient_attention.default: (2, 3),
}


class PhaseTracker(MemTracker):
    def __init__(self, param_storages):
        super().__init__()
        self._param_cdata = param_storages  # set of StorageImpl pointers of parameters
        self.copy_refs = []
        self.record_copies = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types, args, kwargs)
        if func in _CPU_SIDE_OUTPUTS and isinstance(res, tuple):
            # on CUDA the philox seed/offset of the fused attention kernels are CPU tensors:
            # they are not in the GPU's memory, so they cost nothing here
            for i in _CPU_SIDE_OUTPUTS[func]:
                t = res[i]
                if isinstance(t, torch.Tensor):
                    w = self._WINFO.get(t.untyped_storage(), (None, None))[0]
                    if w is not None and w.mem_consumed > 0:
                        self._update_snap(_mt._UpdateType.DEL, w)
                        w.mem_consumed = 0
                        w.size = t.untyped_storage().size()
                        w._calculate_mem_consumed = lambda: 0
        if self.record_copies and func is torch.ops.aten._to_copy.default:
            src = args[0]
            if isinstance(src, torch.Tensor) and src.untyped_storage()._cdata in self._param_cdata \
                    and isinstance(res, torch.Tensor):
                self.copy_refs.append(weakref.ref(res.untyped_storage()))
        return res

    def _update_peak_stats(self, peak_state):
        # Only the tracker-wide peak is used here. MemTracker also updates a per-module peak for
        # every tracked module on every op (O(modules) per op, ~half the run time); skipping it
        # leaves the global peak, and so every figure of the row, unchanged.
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_mt._TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_mt._TOTAL_KEY]
                self._peak_mem_snap[dev] = copy.deepcopy(dev_snap)

    def snap(self):
        s = self.get_tracker_snapshot("current")
        return _flat(s)

    def reset_peak(self):
        s = self.get_tracker_snapshot("current")
        self._peak_mem = {d: v[_mt._TOTAL_KEY] for d, v in s.items()}
        self._peak_mem_snap = s

    def peak(self):
        return _flat(self.get_tracker_snapshot("peak"))

    def alive_copy_bytes(self):
        seen, tot = set(), 0
        for r in self.copy_refs:
            st = r()
            if st is None or st._cdata in seen:
                continue
            seen.add(st._cdata)
            w = self._WINFO.get(st, (None, None))[0]
            if w is not None:
                tot += w.mem_consumed
        return tot


def _flat(snap):
    out = {k: 0 for k, _ in CATS}
    for dev_snap in snap.values():
        for k, ref in CATS:
            out[k] += int(dev_snap.get(ref, 0))
    out["total"] = sum(out[k] for k, _ in CATS)
    return out


# ----------------------------------------------------------------------------------------------
# Model / step
# ----------------------------------------------------------------------------------------------
def load_config(path, attn):
    import transformers
    with open(path) as f:
        d = json.load(f)
    d = dict(d)
    if d.get("model_type") == "gemma3" and isinstance(d.get("text_config"), dict):
        # multimodal Gemma 3 (4b/12b/27b): train the language model, Gemma3ForCausalLM on text_config
        td = dict(d["text_config"])
        td.setdefault("model_type", "gemma3_text")
        td["architectures"] = ["Gemma3ForCausalLM"]
        if "vocab_size" not in td and "vocab_size" in d:
            td["vocab_size"] = d["vocab_size"]
        d = td
    mt = d.pop("model_type")
    for k in ("transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        d.pop(k, None)
    cfg = transformers.AutoConfig.for_model(mt, **d)
    cfg.use_cache = False
    arch = (d.get("architectures") or [None])[0]
    return cfg, arch


def text_vocab(cfg):
    v = getattr(cfg, "vocab_size", None)
    if v is None:
        v = cfg.get_text_config().vocab_size
    return v


def mlm_or_clm_labels(cfg, arch, ids):
    """Labels = input ids: the causal-LM loss of decoders, and for masked LMs (BERT, RoBERTa,
    XLM-R) a masked-LM loss with every token labelled."""
    return ids


OPT_IMPLS = ("fused", "foreach", "forloop")


def make_optimizer(optimizer, params, opt_impl="foreach", weight_decay=None):
    """torch.optim AdamW / Adam / SGD (momentum 0.9) with the chosen implementation:
    fused -> fused=True (torch._fused_adamw_ / _fused_adam_ / _fused_sgd_), foreach -> foreach=True
    (the harness's default), forloop -> foreach=False, fused=False (the single-tensor path).
    weight_decay None keeps torch's default (AdamW 1e-2, Adam 0, SGD 0)."""
    if opt_impl not in OPT_IMPLS:
        raise ValueError(f"opt_impl must be one of {OPT_IMPLS}, not {opt_impl!r}")
    kw = {"fused": True} if opt_impl == "fused" else {"foreach": opt_impl == "foreach"}
    if weight_decay is not None:
        kw["weight_decay"] = weight_decay
    if optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **kw)
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4, **kw)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kw)
    raise ValueError(f"unknown optimizer {optimizer!r}")


# torchtitan v0.2.2 (tag, commit 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce),
# torchtitan/models/llama3/infra/parallelize.py lines 36-51, `_op_sac_save_list`, verbatim; the two
# entries that exist only once a module is imported / a backend is present are resolved by name
# (torch.ops.torch_attn._varlen_attn is registered by torch.nn.attention.varlen).
def _titan_op_sac_save_list():
    import torch.nn.attention.varlen  # noqa: F401  registers torch_attn::_varlen_attn
    ops = {
        torch.ops.aten.mm.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._scaled_dot_product_attention_math.default,
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        # for low precision training, it's useful to always save
        # the result of max, since the absolute maximum is
        # used to compute the scaling factor for quantization.
        torch.ops.aten.max.default,
        torch._higher_order_ops.flex_attention,
    }
    for get in (lambda: torch.ops.torch_attn._varlen_attn.default,
                lambda: torch._higher_order_ops.inductor_compiled_code):
        try:
            ops.add(get())
        except (AttributeError, RuntimeError):
            pass
    return ops


def _titan_op_sac_context_fn(mm_recompute_shapes=frozenset()):
    """torchtitan v0.2.2 torchtitan/distributed/activation_checkpoint.py `_apply_op_sac` (lines
    98-128): a fresh policy (and mm counters) per checkpointed call; every compute op of the save
    list is saved (MUST_SAVE) except every second aten.mm (counted separately in the forward and
    in the recompute), the rest is recomputed. `mm_recompute_shapes` comes from
    per_op_sac_force_recompute_mm_shapes_by_fqns (default ["moe.router.gate"]: no such module in
    a dense Hugging Face model, so empty)."""
    from collections import defaultdict
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    op_sac_save_list = _titan_op_sac_save_list()

    def _get_custom_policy(meta):
        def _custom_policy(ctx, func, *args, **kwargs):
            if (
                func == torch.ops.aten._to_copy.default
                and "cuda" in str(args[0].device)
                and "device" in kwargs
                and str(kwargs["device"]) == "cpu"
            ):
                return CheckpointPolicy.MUST_SAVE

            mode = "recompute" if ctx.is_recompute else "forward"
            mm_count_key = f"{mode}_mm_count"
            if func == torch.ops.aten.mm.default:
                if args[1].shape in mm_recompute_shapes:
                    return CheckpointPolicy.PREFER_RECOMPUTE
                meta[mm_count_key] += 1
            # Saves output of all compute ops, except every second mm
            to_save = func in op_sac_save_list and not (
                func == torch.ops.aten.mm.default and meta[mm_count_key] % 2 == 0
            )
            return (
                CheckpointPolicy.MUST_SAVE
                if to_save
                else CheckpointPolicy.PREFER_RECOMPUTE
            )

        return _custom_policy

    def selective_checkpointing_context_fn():
        meta = defaultdict(int)
        return create_selective_checkpoint_contexts(_get_custom_policy(meta))

    return selective_checkpointing_context_fn


GC_LAYERS: dict = {}


def apply_gc_policy(model, policy):
    """Selective activation checkpointing as torchtitan v0.2.2 applies it (ptd checkpoint_wrapper:
    torch.utils.checkpoint.checkpoint with use_reentrant=False, preserve_rng_state=True,
    determinism_check="default", early_stop=False, debug=False), through transformers' own
    per-layer checkpointing (GradientCheckpointingLayer checkpoints `forward`, hooks stay outside):
      every:N - layer-level SAC (`_apply_layer_sac`): a counter over the transformer blocks starting
                at 1; block k (1-based) is checkpointed iff k % N == 0, i.e. 0-based layers N-1,
                2N-1, ...; the others keep all their activations;
      ops     - per-op SAC (`_apply_op_sac`) on every block: _titan_op_sac_context_fn.
    And transformers' own layer selection, for comparison:
      hf-every:N - `activation_checkpointing_enable(every_n_layers=N)` (Trainer:
                gradient_checkpointing_kwargs={"every_n_layers": N}) with its default
                {"use_reentrant": False} (early_stop=True): 0-based layers i with i % N == 0."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    if policy.startswith("hf-every:"):
        n = int(policy.split(":", 1)[1])
        if n < 1:
            raise ValueError("hf-every:N needs N >= 1")
        model.activation_checkpointing_enable(every_n_layers=n)
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        GC_LAYERS["checkpointed"] = [i for i, m in enumerate(layers) if m.gradient_checkpointing]
        GC_LAYERS["n_layers"] = len(layers)
        GC_LAYERS["early_stop"] = True
        return
    kw = {"use_reentrant": False, "preserve_rng_state": True, "early_stop": False}
    if policy == "ops":
        kw["context_fn"] = _titan_op_sac_context_fn()
        freq = 1
    elif policy.startswith("every:"):
        freq = int(policy.split(":", 1)[1])
        if freq < 1:
            raise ValueError("every:N needs N >= 1")
    else:
        raise ValueError(f"unknown gc policy {policy!r} (full, every:N, ops)")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    chosen = []
    for i, layer in enumerate(layers):
        on = (i + 1) % freq == 0
        layer.gradient_checkpointing = on
        if on:
            chosen.append(i)
    GC_LAYERS["checkpointed"] = chosen
    GC_LAYERS["n_layers"] = len(layers)


def prepare_step(cfg, arch, model, batch, seq, optimizer, amp, gc, autocast_device, device=None,
                 opt_impl="foreach", gc_policy=None, weight_decay=None):
    """The step's setup shared by the fake (CPU-emulated) and the real CUDA paths: checkpointing,
    train/eval mode, the input ids, the optimizer and the forward (with loss when training).
    `opt_impl` (fused / foreach / forloop), `gc_policy` (None or "full" = every layer, as before;
    "every:N", "ops": see apply_gc_policy) and `weight_decay` (None = torch's default) are the
    options of OPTIMIZERS.md; their defaults give the step measured before they existed."""
    train = optimizer != "none"
    if gc:
        if gc_policy in (None, "full"):
            model.gradient_checkpointing_enable()
        else:
            apply_gc_policy(model, gc_policy)
    model.train(train)
    if train:
        model.config.use_cache = False
    ids = torch.randint(0, text_vocab(cfg), (batch, seq), dtype=torch.long, device=device)
    labels = mlm_or_clm_labels(cfg, arch, ids)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, params, opt_impl, weight_decay) if train else None

    def fwd():
        ctx = torch.autocast(autocast_device, dtype=torch.bfloat16) if amp else _nullctx()
        with ctx:
            if train:
                return model(input_ids=ids, labels=labels)
            return model(input_ids=ids)

    return ids, labels, opt, fwd


def build_model(cfg, arch, attn, dtype):
    import transformers
    if attn == "sdpa" and cfg.model_type == "gemma2":
        raise SystemExit("Gemma 2 cannot run with attn=sdpa in transformers 5.24 (Gemma2ForCausalLM refuses "
                         "SDPA: attention logit soft-capping); measure it with --attn eager")
    if arch and hasattr(transformers, arch):
        cls = getattr(transformers, arch)
    elif cfg.model_type == "bert":
        cls = transformers.BertForMaskedLM
    else:
        cls = transformers.AutoModelForCausalLM
    if cls is transformers.AutoModelForCausalLM:
        model = cls.from_config(cfg, attn_implementation=attn, dtype=dtype)
    else:
        model = cls._from_config(cfg, attn_implementation=attn, dtype=dtype)
    return model


def measured_step(model, inputs, fwd, opt, train, amp):
    """One step of `fwd` (forward + loss, backward, `opt.step()`, `zero_grad`) under a
    PhaseTracker that counts `model`'s parameters, `inputs` and `opt`'s state as theirs, the
    peak reset at each phase boundary. Returns the tracker's snapshots and peaks:
    (start, end of forward, AMP weight-copy bytes alive, {phase: peak}, after backward or
    None, end)."""
    param_cdata = {p.untyped_storage()._cdata for p in model.parameters()}
    mt = PhaseTracker(param_cdata)
    mt.track_external(model, *inputs)
    if opt is not None:
        mt.track_external(opt)
    phase_peaks = {}
    with mt:
        start = mt.snap()
        mt.reset_peak()
        mt.record_copies = amp
        if train:
            # keep only the loss, as a training loop does (the logits die here)
            out = _LossOnly(fwd().loss)
        else:
            with torch.no_grad():
                out = fwd()
        mt.record_copies = False
        end_fwd = mt.snap()
        amp_copy = mt.alive_copy_bytes() if amp else 0
        phase_peaks["fwd"] = mt.peak()
        after_bwd = None
        if train:
            loss = out.loss
            mt.reset_peak()
            loss.backward()
            del loss, out
            phase_peaks["bwd"] = mt.peak()
            after_bwd = mt.snap()
            mt.reset_peak()
            opt.step()
            opt.zero_grad(set_to_none=True)
            phase_peaks["opt"] = mt.peak()
        else:
            del out
        end = mt.snap()
    return start, end_fwd, amp_copy, phase_peaks, after_bwd, end


def warm_up(fwd, opt, train, step_ctx=None):
    """One untracked step, so that lazily created state (optimizer moments, autocast's
    caches, CUDA kernels) exists before measuring. `step_ctx` wraps `opt.step()`."""
    if train:
        out = fwd()
        out.loss.backward()
        del out
        with step_ctx or _nullctx():
            opt.step()
        opt.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            out = fwd()
            del out


def peak_summary(phase_peaks, opt_state_bytes):
    """The peak phase, its snapshot, the optimizer step's temporary (optimizer-state bytes
    beyond the persistent state) and the row's `at_peak` split."""
    peak_phase = max(phase_peaks, key=lambda k: phase_peaks[k]["total"])
    pk = phase_peaks[peak_phase]
    opt_step_temp = max(0, pk["optstate"] - opt_state_bytes)
    at_peak = {
        "parameter": pk["parameter"], "buffer": pk["buffer"], "gradient": pk["gradient"],
        "optstate": pk["optstate"] - opt_step_temp, "opt_step_temp": opt_step_temp,
        "activation": pk["activation"], "temp": pk["temp"], "other": pk["other"],
        "total": pk["total"],
    }
    return peak_phase, pk, opt_step_temp, at_peak


def _variant_config(opt_impl, gc, gc_policy, weight_decay):
    """Config keys of the OPTIMIZERS.md options: only those given (so that rows measured without
    them stay byte-identical to the rows measured before they existed)."""
    extra = {}
    if gc_policy is not None and gc:
        extra["gc_policy"] = gc_policy
        if gc_policy != "full":
            extra["gc_layers"] = list(GC_LAYERS.get("checkpointed", []))
            extra["gc_early_stop"] = GC_LAYERS.get("early_stop", False)
    if weight_decay is not None:
        extra["weight_decay"] = weight_decay
    return extra


def measure(config_path, model_name, batch, seq, precision, optimizer, attn, gc=False,
            opt_impl="foreach", gc_policy=None, weight_decay=None):
    install_cuda_emulation()
    GC_LAYERS.clear()
    import transformers
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = load_config(config_path, attn)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    amp = precision == "amp_bf16"
    train = optimizer != "none"
    is_mlm = cfg.model_type == "bert" or (arch or "").endswith("ForMaskedLM")

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = build_model(cfg, arch, attn, dtype)
        ids, labels, opt, fwd = prepare_step(cfg, arch, model, batch, seq, optimizer, amp, gc, "cpu",
                                             opt_impl=opt_impl, gc_policy=gc_policy,
                                             weight_decay=weight_decay)

        warm_up(fwd, opt, train)  # untracked

        start, end_fwd, amp_copy, phase_peaks, after_bwd, end = measured_step(
            model, (ids,), fwd, opt, train, amp)

    n_params = sum(p.numel() for p in model.parameters())
    param_bytes, buffer_bytes, input_bytes = start["parameter"], start["buffer"], start["other"]
    opt_state_bytes = start["optstate"]
    grad_bytes = after_bwd["gradient"] if after_bwd else 0
    peak_phase, pk, opt_step_temp, at_peak = peak_summary(phase_peaks, opt_state_bytes)
    phase_order = ["fwd", "bwd", "opt"]
    row = {
        "config": {
            "model": model_name, "batch": batch, "seq": seq, "image": 224,
            "precision": precision, "optimizer": optimizer, "attn": attn, "gc": bool(gc),
            "mode": "fake", "tracker": "memtracker", "emulate_cuda": True,
            "round_bytes": ROUND_BYTES, "opt_impl": opt_impl, "warmup_steps": 1,
            **_variant_config(opt_impl, gc, gc_policy, weight_decay),
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "torchvision": _torchvision_version()},
        "n_params": n_params,
        "param_bytes": param_bytes,
        "buffer_bytes": buffer_bytes,
        "input_bytes": input_bytes,
        "grad_bytes": grad_bytes,
        "opt_state_bytes": opt_state_bytes,
        "model_state_bytes": param_bytes + buffer_bytes + grad_bytes + opt_state_bytes,
        "peak_bytes": pk["total"],
        "peak_phase": peak_phase,
        "at_peak": at_peak,
        "act_temp_at_peak": pk["activation"] + pk["temp"] + opt_step_temp,
        "saved_act_bytes": end_fwd["total"] - start["total"],
        "amp_weight_copy_bytes": amp_copy,
        "phase_peak_bytes": {k: phase_peaks[k]["total"] for k in phase_order if k in phase_peaks},
        "phase_peaks": {k: phase_peaks[k] for k in phase_order if k in phase_peaks},
        "start_bytes": start["total"],
        "end_bytes": end["total"],
        "after_bwd_bytes": after_bwd["total"] if after_bwd else None,
        "time_s": round(time.time() - t0, 2),
        "sdpa_kernels": dict(SDPA_LOG),
    }
    SDPA_LOG.clear()
    return row


def measure_cuda(config_path, model_name, batch, seq, precision, optimizer, attn, gc=False,
                 opt_impl="foreach", gc_policy=None, weight_decay=None):
    """The same step on a real GPU: real CUDA tensors, real SDPA kernel choice and CUDA autocast, no
    FakeTensorMode and none of the emulation patches. Memory is torch.cuda.max_memory_allocated()
    per phase (reset_peak_memory_stats at each phase boundary) and memory_allocated() at the
    boundaries. Per-category figures (at_peak, phase_peaks) are not available from the allocator:
    only the totals are filled, plus param/grad/optimizer-state bytes computed from the tensors
    (each storage rounded up to 512 bytes, as the caching allocator does)."""
    import transformers
    if not torch.cuda.is_available():
        raise SystemExit("measure.py --device cuda: no CUDA device is available "
                         "(torch.cuda.is_available() is False); use the default --device fake")
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = load_config(config_path, attn)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    amp = precision == "amp_bf16"
    train = optimizer != "none"
    dev = torch.device("cuda")
    with torch.device(dev):
        model = build_model(cfg, arch, attn, dtype)
    model.to(dev)
    GC_LAYERS.clear()
    ids, labels, opt, fwd = prepare_step(cfg, arch, model, batch, seq, optimizer, amp, gc, "cuda", dev,
                                         opt_impl=opt_impl, gc_policy=gc_policy, weight_decay=weight_decay)

    warm_up(fwd, opt, train)
    cuda = torch.cuda

    def rnd(n):
        return math.ceil(n / ROUND_BYTES) * ROUND_BYTES

    def st_bytes(ts):
        seen, tot = set(), 0
        for t in ts:
            if t is None or not isinstance(t, torch.Tensor) or not t.is_cuda:
                continue
            st = t.untyped_storage()
            if st.data_ptr() in seen:
                continue
            seen.add(st.data_ptr())
            tot += rnd(st.nbytes())
        return tot

    cuda.synchronize()
    param_bytes = st_bytes(list(model.parameters()))
    buffer_bytes = st_bytes(list(model.buffers()))
    opt_state_bytes = st_bytes([v for s in (opt.state.values() if opt else []) for v in s.values()])
    phase_peak = {}
    cuda.reset_peak_memory_stats()
    start = cuda.memory_allocated()
    if train:
        out = _LossOnly(fwd().loss)
    else:
        with torch.no_grad():
            out = fwd()
    cuda.synchronize()
    end_fwd = cuda.memory_allocated()
    phase_peak["fwd"] = cuda.max_memory_allocated()
    after_bwd = None
    grad_bytes = 0
    if train:
        loss = out.loss
        cuda.reset_peak_memory_stats()
        loss.backward()
        del loss, out
        cuda.synchronize()
        phase_peak["bwd"] = cuda.max_memory_allocated()
        after_bwd = cuda.memory_allocated()
        grad_bytes = st_bytes([p.grad for p in model.parameters()])
        cuda.reset_peak_memory_stats()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cuda.synchronize()
        phase_peak["opt"] = cuda.max_memory_allocated()
    else:
        del out
    end = cuda.memory_allocated()
    peak_phase = max(phase_peak, key=lambda k: phase_peak[k])
    n_params = sum(p.numel() for p in model.parameters())
    row = {
        "config": {
            "model": model_name, "batch": batch, "seq": seq, "image": 224,
            "precision": precision, "optimizer": optimizer, "attn": attn, "gc": bool(gc),
            "mode": "cuda", "tracker": "torch.cuda.max_memory_allocated", "emulate_cuda": False,
            "round_bytes": ROUND_BYTES, "opt_impl": opt_impl, "warmup_steps": 1,
            **_variant_config(opt_impl, gc, gc_policy, weight_decay),
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "torchvision": _torchvision_version(), "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version(), "device": cuda.get_device_name(),
                     "capability": ".".join(map(str, cuda.get_device_capability()))},
        "n_params": n_params,
        "param_bytes": param_bytes,
        "buffer_bytes": buffer_bytes,
        "input_bytes": st_bytes([ids, labels]),
        "grad_bytes": grad_bytes,
        "opt_state_bytes": opt_state_bytes,
        "model_state_bytes": param_bytes + buffer_bytes + grad_bytes + opt_state_bytes,
        "peak_bytes": phase_peak[peak_phase],
        "peak_phase": peak_phase,
        "at_peak": None,
        "act_temp_at_peak": None,
        "saved_act_bytes": end_fwd - start,
        "amp_weight_copy_bytes": None,
        "phase_peak_bytes": {k: phase_peak[k] for k in ("fwd", "bwd", "opt") if k in phase_peak},
        "phase_peaks": None,
        "start_bytes": start,
        "end_bytes": end,
        "after_bwd_bytes": after_bwd,
        "time_s": round(time.time() - t0, 2),
        "sdpa_kernels": {},
    }
    return row


def _torchvision_version():
    try:
        import torchvision
        return torchvision.__version__
    except Exception:
        return None


class _LossOnly:
    def __init__(self, loss):
        self.loss = loss


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="path to a Hugging Face config.json")
    ap.add_argument("--model-name", help="name written to the row (default: file stem)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", choices=["fp32", "amp_bf16", "bf16"], default="fp32")
    ap.add_argument("--optimizer", choices=["adamw", "adam", "sgd", "none"], default="adamw")
    ap.add_argument("--optimizer-impl", choices=list(OPT_IMPLS), default="foreach",
                    help="torch.optim implementation: fused=True, foreach=True (default), or the "
                    "single-tensor for-loop (foreach=False); see OPTIMIZERS.md")
    ap.add_argument("--weight-decay", type=float, default=None,
                    help="optimizer weight decay (default: torch's, AdamW 0.01, Adam/SGD 0; written to "
                    "config.weight_decay only when given)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing of every layer")
    ap.add_argument("--gc-policy", default=None,
                    help="with --gc: full (default: every layer, transformers' own), every:N "
                    "(torchtitan's layer SAC: 1-based layers k with k %% N == 0), hf-every:N (transformers' "
                    "every_n_layers: 0-based layers i with i %% N == 0) or ops (torchtitan's "
                    "per-op SAC); written to config.gc_policy when given; see OPTIMIZERS.md")
    ap.add_argument("--out", help="append the row(s) to this .jsonl file")
    ap.add_argument("--grid", help="a JSON file: list of {config, model, batch, seq, precision, "
                    "optimizer, attn, gc[, opt_impl, gc_policy, weight_decay]}; each is measured in "
                    "its own subprocess")
    ap.add_argument("--device", choices=["fake", "cuda"], default="fake",
                    help="fake (default): FakeTensorMode on the CPU with CUDA emulated; cuda: the same "
                    "step on a real GPU, torch.cuda.max_memory_allocated() per phase (mode 'cuda')")
    ap.add_argument("--keep-kernel-log", action="store_true",
                    help="keep the sdpa_kernels diagnostic key in the row")
    a = ap.parse_args(argv)
    if a.grid:
        return run_grid(a.grid, a.out, a.keep_kernel_log, a.device)
    if not a.config:
        ap.error("--config or --grid is required")
    name = a.model_name or os.path.splitext(os.path.basename(a.config))[0]
    fn = measure_cuda if a.device == "cuda" else measure
    if a.gc_policy is not None:
        if not a.gc:
            ap.error("--gc-policy needs --gc")
        n = a.gc_policy.split(":", 1)[-1]
        if not (a.gc_policy in ("full", "ops") or (a.gc_policy.split(":")[0] in ("every", "hf-every")
                                                     and n.isdigit() and int(n) >= 1)):
            ap.error("--gc-policy must be full, every:N, hf-every:N (N >= 1) or ops")
    row = fn(a.config, name, a.batch, a.seq, a.precision, a.optimizer, a.attn, a.gc,
             opt_impl=a.optimizer_impl, gc_policy=a.gc_policy, weight_decay=a.weight_decay)
    kernels = row.pop("sdpa_kernels")
    if a.keep_kernel_log:
        row["sdpa_kernels"] = kernels
    line = json.dumps(row)
    print(line)
    variant = ""
    if a.optimizer_impl != "foreach" or a.gc_policy is not None or a.weight_decay is not None:
        variant = f" impl={a.optimizer_impl} gc_policy={a.gc_policy} wd={a.weight_decay}"
    print(f"[measure] {name} b{a.batch} s{a.seq} {a.precision} {a.optimizer} {a.attn} gc={a.gc}{variant}: "
          f"peak {row['peak_bytes'] / 2**30:.3f} GiB in {row['peak_phase']}, sdpa kernels {kernels}, "
          f"{row['time_s']} s", file=sys.stderr)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    return 0


def run_grid(grid_path, out, keep_log, device="fake"):
    import subprocess
    with open(grid_path) as f:
        grid = json.load(f)
    here = os.path.dirname(os.path.abspath(grid_path))
    fails = 0
    for g in grid:
        cfgp = g["config"]
        if not os.path.isabs(cfgp) and not os.path.exists(cfgp):
            cfgp = os.path.join(here, cfgp)
        cmd = [sys.executable, os.path.abspath(__file__), "--config", cfgp,
               "--model-name", g["model"], "--batch", str(g["batch"]), "--seq", str(g["seq"]),
               "--precision", g["precision"], "--optimizer", g["optimizer"], "--attn", g.get("attn", "sdpa")]
        if g.get("gc"):
            cmd.append("--gc")
        if g.get("opt_impl"):
            cmd += ["--optimizer-impl", g["opt_impl"]]
        if g.get("gc_policy"):
            cmd += ["--gc-policy", g["gc_policy"]]
        if g.get("weight_decay") is not None:
            cmd += ["--weight-decay", str(g["weight_decay"])]
        if out:
            cmd += ["--out", out]
        if keep_log:
            cmd.append("--keep-kernel-log")
        if device != "fake":
            cmd += ["--device", device]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            fails += 1
            print(f"[grid] FAILED: {g}", file=sys.stderr)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
