"""Stand-ins for what Unsloth 2024.12.4 runs outside PyTorch: its Triton kernels, the bitsandbytes C
functions `fast_dequantize` calls, flash-attn's `flash_attn_func` and the names of xformers its
signatures read. Everything else in this package is Unsloth's own Python, copied verbatim (see
`validation/unsloth/copies.py`).

The rule for a kernel's stand-in: it allocates nothing. The Triton wrappers (copied verbatim) make
every tensor the kernel writes (`torch.empty` in their Python) and the kernel writes into those, or
into its inputs in place; a stand-in writes into exactly the same tensors with in-place / `out=`
torch ops. Two bodies:

* on fake tensors (the measurement, `FakeTensorMode`): one allocation-free in-place op per tensor
  the kernel writes (there are no values to compute; what counts is that nothing is allocated);
* on real tensors (`measure_unsloth.py --check`): the kernel's arithmetic, with temporaries, the
  result copied into the same tensors, so that the step can be checked against transformers +
  peft (loss and every LoRA gradient).

Each stand-in names the Triton kernel it replaces and the wrapper lines that launch it
(unsloth 2024.12.4, `unsloth/kernels/...`).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor


def _fake(t):
    return isinstance(t, FakeTensor)


class _Kernel:
    """A `@triton.jit` function as its wrappers launch it: `kernel[grid](*args, **meta)` runs the
    stand-in body once (the grid only splits the work)."""

    def __init__(self, body):
        self.body = body
        self.__name__ = body.__name__

    def __getitem__(self, grid):
        return self.body


def _cdiv(a, b):
    return (a + b - 1) // b


def _next_power_of_2(n):
    # triton.next_power_of_2 (triton/runtime/... : the smallest power of 2 >= n)
    n -= 1
    n |= n >> 1
    n |= n >> 2
    n |= n >> 4
    n |= n >> 8
    n |= n >> 16
    n |= n >> 32
    n += 1
    return n


# The two attributes of the `triton` module that the copied Python reads (utils.py L17
# `next_power_of_2 = triton.next_power_of_2`; swiglu.py L45 / L96 `triton.cdiv`).
triton = SimpleNamespace(next_power_of_2=_next_power_of_2, cdiv=_cdiv)


# ----------------------------------------------------------------------------------------------
# swiglu.py
# ----------------------------------------------------------------------------------------------
@_Kernel
def _fg_kernel(e, g, h, n_elements, BLOCK_SIZE=1024):
    """swiglu.py L21-38 `_fg_kernel`, launched by `swiglu_fg_kernel` (L41-48) after
    `h = torch.empty((batch, seq_len, hd), dtype = e.dtype, device = "cuda:0")` (L44): stores
    h = (e * sigmoid(e)).to(g.dtype) * g into h; reads e, g."""
    with torch.no_grad():
        if _fake(h):
            torch.mul(e, g, out=h)
            return
        e32 = e.float()
        f = (e32 * torch.sigmoid(e32)).to(g.dtype)
        h.copy_(f * g)


@_Kernel
def _DWf_DW_dfg_kernel(DW, e, g, n_elements, BLOCK_SIZE=1024):
    """swiglu.py L51-90 `_DWf_DW_dfg_kernel`, launched by `swiglu_DWf_DW_dfg_kernel` (L93-99,
    which allocates nothing): in place, DW <- h = f * g, e <- df = DW * f, g <- de =
    (DW * g) * se * (1 + e * (1 - se)), se = sigmoid(e) in fp32 (L87-89)."""
    with torch.no_grad():
        if _fake(DW):
            DW.mul_(g)
            e.mul_(DW)
            g.mul_(e)
            return
        e32 = e.float()
        se = torch.sigmoid(e32)
        f = (se * e32).to(DW.dtype)
        h = f * g
        df = DW * f
        dg = DW * g
        de = (dg.float() * se * (1.0 + e32 * (1.0 - se))).to(DW.dtype)
        DW.copy_(h)
        e.copy_(df)
        g.copy_(de)


# ----------------------------------------------------------------------------------------------
# rms_layernorm.py
# ----------------------------------------------------------------------------------------------
@_Kernel
def _rms_layernorm_forward(Y, Y_row_stride, X, X_row_stride, W, W_row_stride, r, r_row_stride,
                           n_cols, eps, BLOCK_SIZE=None, num_warps=None):
    """rms_layernorm.py L21-53, launched by `Fast_RMS_Layernorm.forward` (L152-160) after
    `Y = torch.empty((n_rows, n_cols), dtype = X.dtype, ...)` and `r = torch.empty(n_rows,
    dtype = torch.float32, ...)` (L148-149): stores r = rsqrt(mean(X^2) + eps) (fp32) and
    Y = (X * r).to(W.dtype) * W."""
    with torch.no_grad():
        if _fake(Y):
            torch.mul(X, W, out=Y)
            r.fill_(1.0)
            return
        X32 = X.float()
        inv = torch.rsqrt((X32 * X32).sum(-1) / n_cols + eps)
        r.copy_(inv)
        Y.copy_((X32 * inv[:, None]).to(W.dtype) * W)


@_Kernel
def _gemma_rms_layernorm_forward(Y, Y_row_stride, X, X_row_stride, W, W_row_stride, r, r_row_stride,
                                 n_cols, eps, BLOCK_SIZE=None, num_warps=None):
    """rms_layernorm.py L102-132 (Gemma: everything in fp32, W + 1). Not used by the Llama path."""
    with torch.no_grad():
        if _fake(Y):
            torch.mul(X, W, out=Y)
            r.fill_(1.0)
            return
        X32 = X.float()
        inv = torch.rsqrt((X32 * X32).sum(-1) / n_cols + eps)
        r.copy_(inv)
        Y.copy_(X32 * inv[:, None] * (W.float() + 1.0))


@_Kernel
def _rms_layernorm_backward(dY, dY_row_stride, dX, dX_row_stride, X, X_row_stride, W, W_row_stride,
                            r, r_row_stride, n_cols, eps, GEMMA=False, BLOCK_SIZE=None, num_warps=None):
    """rms_layernorm.py L56-99, launched by `Fast_RMS_Layernorm.backward` (L181-192) with
    `dX = ... if ctx.GEMMA else dY` (L179): stores dX = r / n * (n * dY*W - normed *
    sum(dY*W * normed)) into dY itself (non-Gemma: `dX = dY`, L83)."""
    with torch.no_grad():
        if _fake(dX):
            torch.mul(dY, W, out=dX)
            return
        dY32, X32, W32 = dY.float(), X.float(), W.float()
        inv = r.float()[:, None]
        normed = X32 * inv
        dY_W = dY32 * ((W32 + 1.0) if GEMMA else W32)
        rowsum = (dY_W * normed).sum(-1, keepdim=True)
        dX.copy_(inv / n_cols * (n_cols * dY_W - normed * rowsum))


# ----------------------------------------------------------------------------------------------
# rope_embedding.py
# ----------------------------------------------------------------------------------------------
@_Kernel
def _rope_embedding(Q, Q_row_stride, cos, cos_row_stride, sin, sin_row_stride, seqlen, head_dim, n_heads,
                    BACKWARD_PASS=False, BLOCK_SIZE=None, num_warps=None):
    """rope_embedding.py L21-71, launched by `Fast_RoPE_Embedding.forward` (L99-108) on
    `Q.view(batch*seq_len, n_heads*head_dim)` and by its backward (L133-141) on `dY.reshape(...)`:
    rotates every row in place, Q1 <- Q1*cos - Q2*sin, Q2 <- Q2*cos + Q1*sin (sin negated in
    backward), in the cos/sin dtype, row r at position r % seqlen; allocates nothing."""
    with torch.no_grad():
        if _fake(Q):
            Q.mul_(1.0)
            return
        half = head_dim // 2
        n_rows = Q.shape[0]
        Qv = Q.view(n_rows // seqlen, seqlen, n_heads, head_dim)
        c = cos[:seqlen, :half][None, :, None, :]
        s = sin[:seqlen, :half][None, :, None, :]
        if BACKWARD_PASS:
            s = -s
        Q1 = Qv[..., :half].to(s.dtype)
        Q2 = Qv[..., half:].to(s.dtype)
        new1 = Q1 * c - Q2 * s
        new2 = Q2 * c + Q1 * s
        Qv[..., :half].copy_(new1)
        Qv[..., half:].copy_(new2)


# ----------------------------------------------------------------------------------------------
# bitsandbytes C functions that fast_dequantize calls (utils.py L62-73 bind them from
# bitsandbytes.functional.lib, the CUDA library)
# ----------------------------------------------------------------------------------------------
def get_ptr(t):
    """bitsandbytes.functional.get_ptr gives the C functions a tensor's data pointer; here the
    tensor itself, so that the stand-ins below can write into it."""
    return t


# The stream `fast_dequantize` passes to the C functions: utils.py L139-140 would fetch
# torch.cuda.current_stream("cuda:0") when the global is None; there is no CUDA device here.
STREAM = "cuda:0 current stream (stand-in)"


def cdequantize_blockwise_fp32(code2, absmax, absmax2, out_absmax, blocksize2, n, stream=None):
    """bitsandbytes' cdequantize_blockwise_fp32: the nested absmax (uint8 + fp32 absmax2 +
    code2) into `out_absmax` (fp32, preallocated by fast_dequantize L151); allocates nothing."""
    with torch.no_grad():
        out_absmax.fill_(1.0)


def _dequantize_nf4(_, W, absmax, out, blocksize, n, stream=None):
    """bitsandbytes' cdequantize_blockwise_{bf16,fp16}_nf4: the packed 4-bit weight into `out`
    (preallocated by fast_dequantize L144); allocates nothing. (The emulated 4-bit weights hold no
    values, so there is nothing to decode: the QLoRA rows are memory only.)"""
    with torch.no_grad():
        out.zero_()


cdequantize_blockwise_bf16_nf4 = _dequantize_nf4
cdequantize_blockwise_fp16_nf4 = _dequantize_nf4


# ----------------------------------------------------------------------------------------------
# flash-attn and xformers
# ----------------------------------------------------------------------------------------------
SDPA = {"fn": None}  # the scaled_dot_product_attention the stand-in calls (the recipe sets it)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, *args, **kwargs):
    """flash-attn 2.7.2 `flash_attn_func` (llama.py L419: `flash_attn_func(Q, K, V, causal =
    True)` on (batch, seq, heads, head_dim) tensors, K and V with the kv heads): PyTorch's SDPA on
    the same tensors transposed to (batch, heads, seq, head_dim), GQA without expanding K and V.
    On an sm80+ GPU that call runs PyTorch's own FlashAttention-2 kernel (the harness's kernel
    choice: bf16, no mask, head_dim <= 256), which saves what flash-attn's `FlashAttnFunc` saves
    (q, k, v, the output, the fp32 log-sum-exp) and returns the output laid out (batch, seq,
    heads, head_dim); its backward returns dq, dk, dv shaped as q, k, v (flash-attn: `torch.empty_like`
    each, flash_attn_interface.py)."""
    sdpa = SDPA["fn"] or F.scaled_dot_product_attention
    out = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p,
               is_causal=causal, scale=softmax_scale, enable_gqa=k.shape[2] != q.shape[2])
    return out.transpose(1, 2)


class _LowerTriangularMask:
    """xformers.ops.fmha.attn_bias.LowerTriangularMask: a marker object, no tensor
    (CausalLM_fast_forward L959 makes one per forward and passes it down as `causal_mask`)."""


class _BlockDiagonalCausalMask(_LowerTriangularMask):
    pass


# `xformers` as llama.py reads it: `Optional[xformers.attn_bias.BlockDiagonalCausalMask]` in the
# signatures (evaluated when the functions are defined) and `xformers.attn_bias.LowerTriangularMask()`.
xformers = SimpleNamespace(attn_bias=SimpleNamespace(LowerTriangularMask=_LowerTriangularMask,
                                                     BlockDiagonalCausalMask=_BlockDiagonalCausalMask))


def xformers_attention(*args, **kwargs):
    raise NotImplementedError("xformers' memory_efficient_attention is not emulated: the recipe runs "
                              "llama.py's flash-attn branch (HAS_FLASH_ATTENTION = True)")


def _not_in_training(name):
    def f(*args, **kwargs):
        raise NotImplementedError(f"{name} (inference / eval only) is not part of the measured step")
    f.__name__ = name
    return f


fast_rms_layernorm_inference = _not_in_training("fast_rms_layernorm_inference")
fast_rms_layernorm_inference_gemma = _not_in_training("fast_rms_layernorm_inference_gemma")
fast_swiglu_inference = _not_in_training("fast_swiglu_inference")
_prepare_4d_causal_attention_mask_for_sdpa = _not_in_training("_prepare_4d_causal_attention_mask_for_sdpa")
create_flex_attention_causal_mask = _not_in_training("create_flex_attention_causal_mask")
create_flex_attention_sliding_window_mask = _not_in_training("create_flex_attention_sliding_window_mask")

