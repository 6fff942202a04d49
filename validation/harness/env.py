"""The environment every measurement runs in: threads, the 512-byte rounding of the caching
allocator, and the CUDA emulation on fake CPU tensors (dropout's bool mask, SDPA's kernel
choice, CUDA autocast's fp32 lists, transformers' mask decisions as with real tensors).

Why emulate instead of fake CUDA tensors: without a GPU, `torch.autocast('cuda')` disables
itself, SDPA falls back to math and the autograd engine refuses CUDA devices (README, "How the
CUDA path is emulated"). Nothing here is installed on a real GPU run.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed._tools import mem_tracker as _mt  # noqa: E402
from torch.utils._pytree import tree_map  # noqa: E402

torch.set_num_threads(1)

# The caching allocator hands out blocks in multiples of 512 bytes.
ROUND_BYTES = 512


def rnd(n):
    """`n` bytes rounded up to the allocator's block."""
    return int(math.ceil(n / ROUND_BYTES) * ROUND_BYTES)


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



class _NoHandle:
    def remove(self):
        pass


def install_frozen_param_hook_guard():
    """MemTracker registers a grad hook on every parameter it meets (mem_tracker.py
    _track_module_params_and_buffers); a frozen parameter (requires_grad=False) raises there. It can
    never get a gradient, so a no-op handle is the same."""
    if getattr(torch.Tensor, "_frozen_hook_guard", False):
        return
    for name in ("register_hook", "register_post_accumulate_grad_hook"):
        orig = getattr(torch.Tensor, name)

        def make(orig):
            def f(self, hook):
                if not self.requires_grad:
                    return _NoHandle()
                return orig(self, hook)
            return f
        setattr(torch.Tensor, name, make(orig))
    torch.Tensor._frozen_hook_guard = True


@contextlib.contextmanager
def swap_via_set_data():
    """nn.Module._apply() swaps FakeTensor parameters with torch.utils.swap_tensors, which refuses
    tensors that have a weakref (FakeTensorMode keeps some). Inside this context it falls back to
    `param.data = new` (what _apply does for ordinary tensors): the same parameter object with the
    converted storage. For peft's get_peft_model under FakeTensorMode (it casts the adapters)."""
    import torch.utils as tu
    orig = tu.swap_tensors

    def swap(t1, t2):
        try:
            return orig(t1, t2)
        except RuntimeError:
            t1.data = t2.data
            t1.requires_grad_(t2.requires_grad)
    tu.swap_tensors = swap
    try:
        yield
    finally:
        tu.swap_tensors = orig


def quiet():
    """Library warnings off: rows go to stdout, one summary line to stderr."""
    warnings.filterwarnings("ignore")


def torchvision_version():
    try:
        import torchvision
        return torchvision.__version__
    except Exception:
        return None


def versions(*extra):
    """The row's `versions`: torch, transformers, torchvision, then each `extra` (name, module
    name) pair whose module imports."""
    import transformers
    v = {"torch": torch.__version__, "transformers": transformers.__version__,
         "torchvision": torchvision_version()}
    for name, mod in extra:
        try:
            v[name] = __import__(mod).__version__
        except Exception:
            v[name] = None
    return v


class nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
