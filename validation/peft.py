#!/usr/bin/env python3
"""Measure one parameter-efficient fine-tuning step (LoRA, QLoRA, 8-bit / paged optimizers, Adafactor,
offloaded activation checkpointing) the way measure.py measures a full training step.

A recipe of the harness (validation/harness/: FakeTensorMode, MemTracker, CUDA emulation: 512-byte
rounding, CUDA SDPA kernel choice, CUDA autocast lists, native_dropout; the step and the row
format); what it varies:

  * LoRA: peft's real ``get_peft_model`` / ``LoraConfig`` on the real transformers model (built under
    FakeTensorMode as measure.py does); adapters fp32 (peft's ``autocast_adapter_dtype=True``) or in
    the model dtype (``--lora-dtype model``).
  * QLoRA: every ``nn.Linear`` but the output layer is replaced (as transformers' bitsandbytes
    quantizer does) by ``EmuLinear4bit``, a subclass of ``bitsandbytes.nn.Linear4bit`` (so peft
    dispatches its real ``lora.bnb.Linear4bit`` wrapper) holding the packed uint8 weight and the
    quant-state tensors of bitsandbytes 0.50 (absmax, nested absmax, code, offset) with their exact
    shapes/dtypes, and whose forward mirrors ``Linear4bit.forward`` + ``MatMul4Bit`` (cast to the
    compute dtype, dequantize to a transient 16-bit weight + F.linear, save only the packed weight;
    backward dequantizes again). The quant-state tensors are registered as non-persistent buffers
    so that MemTracker counts them (under ``buffer``).
  * ``--kbit-prepare``: peft's real ``prepare_model_for_kbit_training`` (fp32 cast of the non-4-bit
    parameters; its own gradient checkpointing is switched off and ``--gc`` decides).
  * 8-bit AdamW (``adamw8bit``, ``paged-adamw8bit``): ``EmuAdamW8bit`` allocates bitsandbytes'
    state (uint8 state1/state2, fp32 absmax per 256 elements, the two shared 256-entry qmaps, fp32
    states below min_8bit_size = 4096 elements) and updates in place (the fused kernel allocates
    nothing). Paged state (numel >= 1e5) is allocated on the ``meta`` device: it is outside the
    caching allocator; its bytes go to ``paged_bytes``, not to ``peak_bytes``.
  * ``adafactor`` = torch.optim.Adafactor (default single-tensor path, as on CUDA: foreach=None),
    ``adafactor-hf`` = transformers.optimization.Adafactor with the Trainer's optim="adafactor"
    arguments (scale_parameter=False, relative_step=False, warmup_init=False, lr=1e-4). ``.item()``
    is answered with 1.0 in fake mode (it allocates nothing on a GPU).
  * ``--gc offload``: transformers 5.24's own ``gradient_checkpointing_enable(offload=True)`` path,
    with ``transformers.modeling_utils.save_on_cpu`` replaced by an emulation that keeps only
    shape/dtype of what it would copy to pinned host memory (``offloaded_bytes``) and allocates a
    fresh device tensor on unpack.

See validation/PEFT.md for the byte rules and how each emulation matches the libraries.

Example:
  python validation/peft.py --config validation/configs/llama-1b.json --method lora --lora-r 16 \
      --lora-targets all-linear --batch 4 --seq 2048 --precision bf16 --optimizer adamw --gc none
  python validation/peft.py --dump /tmp/peft-dumps/x.json --layers 2 --seq 64 ... (saved tensors)
  python validation/peft.py --grid validation/grid-peft.json --out rows.jsonl
  python validation/peft.py --from-row "$(sed -n 1p core/tests/fixtures/peft-measured.jsonl)"  # one row again
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
# this file is called peft.py: make sure "import peft" finds the library, not this file (validation/
# goes last on the path, where the harness is still found)
sys.path[:] = [q for q in sys.path if os.path.abspath(q or ".") != _HERE] + [_HERE]
import harness as H  # noqa: E402  (first: it sets the threads before torch is loaded)

H.quiet()
import peft as _peft_lib  # noqa: E402,F401

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools import mem_tracker as _mt  # noqa: E402

# ----------------------------------------------------------------------------------------------
# bitsandbytes 4-bit emulation
# ----------------------------------------------------------------------------------------------
_SHARED = {}  # device-wide shared tables (bnb's module-level name2qmap)


class _QS:
    """Mirror of bitsandbytes.functional.QuantState (the fields the forward/backward read)."""

    def __init__(self, shape, dtype, blocksize, quant_type, absmax, code, nested, offset=None,
                 state2=None):
        self.shape, self.dtype, self.blocksize, self.quant_type = shape, dtype, blocksize, quant_type
        self.absmax, self.code, self.nested, self.offset, self.state2 = absmax, code, nested, offset, state2


def _dequant_absmax(qs):
    """functional.dequantize_4bit, nested part: dequantize_blockwise(absmax uint8) -> new fp32
    [n_blocks], then += offset (in place)."""
    a = torch.empty(qs.absmax.shape, dtype=torch.float32, device=qs.absmax.device)
    a += qs.offset
    return a


def _dequantize_4bit(B, qs):
    """functional.dequantize_4bit: (nested: fp32 absmax) + a new [N, K] tensor of quant_state.dtype."""
    if qs.nested:
        absmax = _dequant_absmax(qs)  # noqa: F841  (alive while the weight is dequantized)
    out = torch.empty(qs.shape, dtype=qs.dtype, device=B.device)
    return out


def _gemm_4bit(A, B, qs, bias=None):
    """bitsandbytes::gemm_4bit on CUDA, the dequant + F.linear fallback (_dequant_linear_fallback,
    taken for M = A.numel()/K > 1536): absmax_dq = empty fp32 [n_blocks] (dequantize_blockwise,
    nested only), absmax = absmax_dq + offset (a second fp32 [n_blocks]), B_dq = empty(shapeB, A.dtype),
    F.linear(A, B_dq, bias). The output has A's dtype."""
    absmax = None
    if qs.nested:
        absmax_dq = torch.empty(qs.absmax.shape, dtype=torch.float32, device=A.device)
        absmax = absmax_dq + qs.offset
        del absmax_dq
    B_dq = torch.empty(qs.shape, dtype=A.dtype, device=A.device)
    out = F.linear(A, B_dq, bias)
    del B_dq, absmax
    return out


class EmuMatMul4Bit(torch.autograd.Function):
    """bitsandbytes.autograd._functions.MatMul4Bit: saves ctx.tensors = (None, B) (the packed weight,
    a ctx attribute, not save_for_backward); backward: grad_A = grad_output @ dequantize_4bit(B).to(
    grad_output.dtype); no weight grad."""

    @staticmethod
    def forward(ctx, A, B, bias, qs):
        out = _gemm_4bit(A, B, qs, bias)
        ctx.state = qs
        ctx.tensors = (None, B) if any(ctx.needs_input_grad[:2]) else (None, None)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        _, B = ctx.tensors
        grad_A = None
        if ctx.needs_input_grad[0]:
            W = _dequantize_4bit(B, ctx.state).to(grad_output.dtype)
            grad_A = torch.matmul(grad_output, W)
            del W
        return grad_A, None, None, None


def _make_emu_linear4bit_class():
    import bitsandbytes as bnb

    class EmuLinear4bit(bnb.nn.Linear4bit):
        """A bitsandbytes.nn.Linear4bit (isinstance holds, so peft's dispatch_bnb_4bit wraps it in
        its real lora.bnb.Linear4bit) with the tensors of a quantized Params4bit, built without
        running a quantization kernel."""

        def __init__(self, in_features, out_features, bias, compute_dtype, quant_type, double_quant,
                     weight_dtype, device, bias_dtype=None):
            nn.Module.__init__(self)
            self.in_features, self.out_features = in_features, out_features
            self.compute_dtype = compute_dtype
            self.compute_type_is_set = True
            self.quant_storage = torch.uint8
            self.support_avx512bf16_for_cpu = False
            n = in_features * out_features
            nb = (n + 63) // 64
            w = nn.Parameter(torch.empty(((n + 1) // 2, 1), dtype=torch.uint8, device=device),
                             requires_grad=False)
            # Params4bit attributes peft / prepare_model_for_kbit_training read
            w.blocksize, w.compress_statistics, w.quant_type = 64, double_quant, quant_type
            w.quant_storage, w.bnb_quantized, w.module = torch.uint8, True, None
            self.weight = w
            code = torch.empty(16, dtype=torch.float32, device=device)  # get_4bit_type: per layer
            self.register_buffer("qs_code", code, persistent=False)
            if double_quant:
                absmax = torch.empty(nb, dtype=torch.uint8, device=device)
                offset = torch.empty((), dtype=torch.float32, device=device)
                a2 = torch.empty((nb + 255) // 256, dtype=torch.float32, device=device)
                key = ("code256", str(device))
                first = key not in _SHARED
                if first:
                    _SHARED[key] = torch.empty(256, dtype=torch.float32, device=device)
                    self.register_buffer("qs_state2_code_shared", _SHARED[key], persistent=False)
                state2 = _QS(None, torch.float32, 256, None, a2, _SHARED[key], False)
                self.register_buffer("qs_absmax", absmax, persistent=False)
                self.register_buffer("qs_offset", offset, persistent=False)
                self.register_buffer("qs_state2_absmax", a2, persistent=False)
                qs = _QS(torch.Size([out_features, in_features]), weight_dtype, 64, quant_type, absmax,
                         code, True, offset, state2)
            else:
                absmax = torch.empty(nb, dtype=torch.float32, device=device)
                self.register_buffer("qs_absmax", absmax, persistent=False)
                qs = _QS(torch.Size([out_features, in_features]), weight_dtype, 64, quant_type, absmax,
                         code, False)
            w.quant_state = qs
            self.bias = None
            if bias:
                self.bias = nn.Parameter(torch.empty(out_features, dtype=bias_dtype or weight_dtype,
                                                     device=device), requires_grad=False)

        def _refresh_qs(self):
            # buffers may have been replaced by .to()/casts: keep the quant state pointing at them
            qs = self.weight.quant_state
            qs.absmax = self.qs_absmax
            qs.code = self.qs_code
            if qs.nested:
                qs.offset = self.qs_offset
                qs.state2.absmax = self.qs_state2_absmax
            return qs

        def forward(self, x):
            qs = self._refresh_qs()
            inp_dtype = x.dtype
            if self.compute_dtype is not None:
                x = x.to(self.compute_dtype)
            bias = self.bias
            if bias is not None:
                if bias.dtype != x.dtype:
                    bias.data = bias.data.to(x.dtype)
                bias = bias.to(self.compute_dtype)
            # bnb.matmul_4bit: without grad -> gemm_4bit directly, else MatMul4Bit.apply
            needs_grad = torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad))
            if not needs_grad:
                out = _gemm_4bit(x, self.weight, qs, bias)
            else:
                out = EmuMatMul4Bit.apply(x, self.weight, bias, qs)
            return out.to(inp_dtype)

        def extra_repr(self):
            return f"in={self.in_features}, out={self.out_features}, {self.weight.quant_type}, " \
                   f"double_quant={self.weight.compress_statistics}, compute={self.compute_dtype}"

    return EmuLinear4bit


def quantize_model_4bit(model, quant_type, double_quant, compute_dtype, weight_dtype):
    """What transformers' Bnb4BitHfQuantizer does: every nn.Linear except modules_to_not_convert
    (the output embeddings) becomes a bnb Linear4bit; the model is marked is_loaded_in_4bit."""
    Emu = _make_emu_linear4bit_class()
    out_emb = model.get_output_embeddings()
    todo = []
    for name, mod in model.named_modules():
        for cname, child in mod.named_children():
            if type(child) is nn.Linear and child is not out_emb:
                todo.append((mod, cname, child))
    for parent, cname, child in todo:
        new = Emu(child.in_features, child.out_features, child.bias is not None, compute_dtype,
                  quant_type, double_quant, weight_dtype, child.weight.device,
                  child.bias.dtype if child.bias is not None else None)
        new.train(child.training)
        setattr(parent, cname, new)
    del todo
    model.is_loaded_in_4bit = True
    model.is_quantized = True
    model.quantization_method = "bitsandbytes"
    return model


# ----------------------------------------------------------------------------------------------
# Optimizers
# ----------------------------------------------------------------------------------------------
class EmuAdamW8bit(torch.optim.Optimizer):
    """bitsandbytes.optim.AdamW8bit / PagedAdamW8bit (Optimizer2State, optim_bits=8): state as
    init_state allocates it; the update is bnb's fused in-place kernel (no allocation), emulated by
    an in-place add on the parameter."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 min_8bit_size=4096, is_paged=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.min_8bit_size, self.is_paged = min_8bit_size, is_paged
        self.qmaps = None
        self.paged_bytes = 0

    def _buf(self, p, dtype):
        # get_state_buffer: paged (cudaMallocManaged, outside the caching allocator) when n >= 1e5
        if self.is_paged and p.numel() >= 1e5:
            b = torch.zeros(p.shape, dtype=dtype, device="meta")
            self.paged_bytes += b.numel() * b.element_size()
            return b
        return torch.zeros_like(p, dtype=dtype)

    def _init_state(self, p):
        st = self.state[p]
        st["step"] = 0
        n = p.numel()
        if n < self.min_8bit_size:
            st["state1"] = self._buf(p, torch.float32)
            st["state2"] = self._buf(p, torch.float32)
        else:
            if self.qmaps is None:  # name2qmap["dynamic"], ["udynamic"]: shared, 256 fp32 each
                self.qmaps = (torch.zeros(256, dtype=torch.float32, device=p.device),
                              torch.zeros(256, dtype=torch.float32, device=p.device))
            st["state1"] = self._buf(p, torch.uint8)
            st["qmap1"] = self.qmaps[0]
            st["state2"] = self._buf(p, torch.uint8)
            st["qmap2"] = self.qmaps[1]
            blocks = (n // 256) + bool(n % 256)
            st["absmax1"] = torch.zeros((blocks,), dtype=torch.float32, device=p.device)
            st["absmax2"] = torch.zeros((blocks,), dtype=torch.float32, device=p.device)

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if len(self.state[p]) == 0:
                    self._init_state(p)
                self.state[p]["step"] += 1
                p.add_(p.grad, alpha=-g["lr"])  # stands for the fused in-place 8-bit kernel
        return None


class _FakeItem:
    """Tensor.item() on a FakeTensor has no value: answer 1.0 (on a GPU .item() only syncs)."""

    def __enter__(self):
        self._orig = torch.Tensor.item
        orig = self._orig

        def item(t):
            from torch._subclasses.fake_tensor import FakeTensor
            if isinstance(t, FakeTensor):
                return 1.0
            return orig(t)
        torch.Tensor.item = item
        return self

    def __exit__(self, *a):
        torch.Tensor.item = self._orig
        return False


def make_optimizer(name, params):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True), "foreach"
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True), "foreach"
    if name == "adamw8bit":
        return EmuAdamW8bit(params, lr=1e-4), "bnb-8bit-blockwise(emulated)"
    if name == "paged-adamw8bit":
        return EmuAdamW8bit(params, lr=1e-4, is_paged=True), "bnb-8bit-blockwise-paged(emulated)"
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-2), "single_tensor"
    if name == "adafactor-hf":
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=1e-4, scale_parameter=False, relative_step=False,
                         warmup_init=False), "transformers"
    if name == "none":
        return None, None
    raise SystemExit(f"unknown optimizer {name}")


# ----------------------------------------------------------------------------------------------
# Offloaded checkpointing: save_on_cpu emulation
# ----------------------------------------------------------------------------------------------
OFFLOAD = {"cur": 0, "max": 0, "count": 0}


class _HostCopy:
    __slots__ = ("shape", "dtype", "device", "nbytes")

    def __init__(self, t):
        self.shape, self.dtype, self.device = t.size(), t.dtype, t.device
        self.nbytes = t.numel() * t.element_size()
        OFFLOAD["cur"] += self.nbytes
        OFFLOAD["count"] += 1
        OFFLOAD["max"] = max(OFFLOAD["max"], OFFLOAD["cur"])

    def __del__(self):
        OFFLOAD["cur"] -= self.nbytes


class EmuSaveOnCpu(torch.autograd.graph.saved_tensors_hooks):
    """torch.autograd.graph.save_on_cpu(pin_memory=True): pack = torch.empty(t.size(), pinned host)
    + copy_ (a dense copy of the view), unpack = packed.to(device, non_blocking=True) (a new device
    tensor). Here: pack keeps shape/dtype only (counted in OFFLOAD), unpack allocates the device tensor."""

    def __init__(self, pin_memory=False, device_type="cuda"):
        def pack(t):
            return _HostCopy(t)

        def unpack(h):
            return torch.empty(h.shape, dtype=h.dtype, device=h.device)

        super().__init__(pack, unpack)


# ----------------------------------------------------------------------------------------------
# Tracker: device = "cpu" (the emulated GPU); "meta" holds paged optimizer state
# ----------------------------------------------------------------------------------------------
H.install_frozen_param_hook_guard()  # LoRA and QLoRA freeze the base weights


def _dev_only(snap):
    return {d: v for d, v in snap.items() if str(d).startswith("cpu")}


class PeftTracker(H.PhaseTracker):
    """The harness's tracker on the emulated GPU ("cpu") alone, the offloaded bytes remembered at
    each new peak (`at_new_peak`: a recipe that offloads elsewhere remembers its own)."""

    def __init__(self, param_storages):
        super().__init__(param_storages)
        self.offload_at_peak = 0

    def at_new_peak(self):
        self.offload_at_peak = OFFLOAD["cur"]

    def _update_peak_stats(self, peak_state):
        import copy
        for dev, dev_snap in self._curr_mem_snap.items():
            if not str(dev).startswith("cpu"):
                continue
            if self._peak_mem.get(dev, 0) < dev_snap[_mt._TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_mt._TOTAL_KEY]
                self._peak_mem_snap[dev] = copy.deepcopy(dev_snap)
                self.at_new_peak()

    def snap(self):
        return H.flat(_dev_only(self.get_tracker_snapshot("current")))

    def reset_peak(self):
        super().reset_peak()
        self.at_new_peak()

    def peak(self):
        return H.flat(_dev_only(self.get_tracker_snapshot("peak")))


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------
TARGETS = {
    "llama": {"attention": ["q_proj", "k_proj", "v_proj", "o_proj"],
              "mlp": ["gate_proj", "up_proj", "down_proj"]},
    "gpt2": {"attention": ["c_attn", "attn.c_proj"], "mlp": ["c_fc", "mlp.c_proj"]},
}


def resolve_targets(cfg, spec):
    if spec == "all-linear":
        return "all-linear"
    fam = "gpt2" if cfg.model_type == "gpt2" else "llama"
    if spec in ("attention", "mlp"):
        names = TARGETS[fam][spec]
    else:
        names = [s.strip() for s in spec.split(",") if s.strip()]
    if any("." in n for n in names):
        # a dotted name ("attn.c_proj") must match the end of the module path: use peft's regex form
        return r".*\.(" + "|".join(n.replace(".", r"\.") for n in names) + r")$"
    return names




def build_peft_model(cfg, arch, attn, o):
    """o: namespace of options. Returns the model to train (a PeftModel for lora/qlora)."""
    with H.swap_via_set_data():
        return _build_peft_model(cfg, arch, attn, o)


def _build_peft_model(cfg, arch, attn, o):
    import transformers
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    # from_pretrained(..., dtype=bf16) for --precision bf16, else (and for --base-dtype fp32, as
    # peft's FSDP LoRA example loads it: torch_dtype=float32) fp32. QLoRA (quantization_config=
    # BitsAndBytesConfig(load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant,
    # bnb_4bit_compute_dtype=bf16)): the non-quantized tensors (embeddings, norms, lm_head) and each
    # 4-bit weight's quant_state.dtype (its dequantized copies) in that dtype
    base_dtype = torch.bfloat16 if o.precision == "bf16" and o.base_dtype != "fp32" else torch.float32
    model = H.build_model(cfg, arch, attn, base_dtype)
    if o.method == "qlora":
        quantize_model_4bit(model, o.quant, o.double_quant, torch.bfloat16, base_dtype)
    if o.kbit_prepare:
        # peft's real function; its gradient checkpointing is left to --gc
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if o.gc == "full":
        model.gradient_checkpointing_enable()
    elif o.gc == "offload":
        import transformers.modeling_utils as mu
        mu.save_on_cpu = EmuSaveOnCpu
        model.gradient_checkpointing_enable(offload=True)
    if o.method in ("lora", "qlora"):
        tm = resolve_targets(cfg, o.lora_targets)
        lc = LoraConfig(r=o.lora_r, lora_alpha=o.lora_alpha, lora_dropout=o.lora_dropout,
                        target_modules=tm, bias="none", task_type="CAUSAL_LM",
                        fan_in_fan_out=(cfg.model_type == "gpt2"))
        model = get_peft_model(model, lc, autocast_adapter_dtype=(o.lora_dtype == "fp32"))
    return model


def logical_params(model):
    n = 0
    for p in model.parameters():
        if p.dtype == torch.uint8 and hasattr(p, "quant_state"):
            n += int(p.quant_state.shape.numel())
        else:
            n += p.numel()
    return n


# ----------------------------------------------------------------------------------------------
# Measure
# ----------------------------------------------------------------------------------------------
def measure(o):
    """The harness's step of the model `build_peft_model` makes, with the optimizers above; the
    row adds trainable_params, paged_bytes and the offloaded bytes."""
    H.install_cuda_emulation()
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = H.load_config(o.config, o.attn)
    amp = o.precision == "amp_bf16"
    OFFLOAD.update(cur=0, max=0, count=0)
    offloaded = {}  # phase -> offloaded bytes at its peak; "end_fwd"

    def on_phase(name, meter, step):
        offloaded[name] = meter.offload_at_peak
        if name == "fwd":
            offloaded["end_fwd"] = OFFLOAD["cur"]

    def optimizer_step():
        with _FakeItem():
            opt.step()
        opt.zero_grad(set_to_none=True)

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build_peft_model(cfg, arch, o.attn, o)
        model.train(True)
        model.config.use_cache = False
        ids = torch.randint(0, H.text_vocab(cfg), (o.batch, o.seq), dtype=torch.long)
        opt, opt_impl = make_optimizer(o.optimizer, [p for p in model.parameters() if p.requires_grad])

        def fwd():
            with torch.autocast("cpu", dtype=torch.bfloat16) if amp else H.nullctx():
                return model(input_ids=ids, labels=ids)

        H.warm_up(fwd, opt, True, _FakeItem())
        meter = PeftTracker(H.param_storages(model))
        meter.track_external(model, ids)
        meter.track_external(opt)
        with meter:
            step = H.measured_step(meter, fwd, opt, True, amp, micro_batches=o.micro_batches,
                                   on_phase=on_phase, optimizer_step=optimizer_step)

    lora, qlora = o.method != "full", o.method == "qlora"
    gc = {"none": False, "full": True, "offload": "offload"}[o.gc]
    config = H.base_config(
        o.model_name, o.batch, o.seq, o.precision, o.optimizer, o.attn, gc, opt_impl,
        method=o.method, **{k: getattr(o, k) if lora else None for k in LORA_KEYS},
        quant=o.quant if qlora else None, double_quant=bool(o.double_quant) if qlora else False,
        kbit_prepare=bool(o.kbit_prepare), compute_dtype="bf16" if qlora else None,
        **({"micro_batches": o.micro_batches} if o.micro_batches > 1 else {}),
        **({"base_dtype": o.base_dtype} if o.base_dtype else {}))
    config["gc"] = gc  # "offload" too
    row = H.step_row(
        config, H.versions(("peft", "peft"), ("bitsandbytes", "bitsandbytes")), logical_params(model), step,
        t0, after_params={"trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad)},
        after_opt_state={"paged_bytes": int(getattr(opt, "paged_bytes", 0))},
        after={"amp_weight_copy_bytes": {"offloaded_bytes": None,
                                         "offloaded_end_fwd_bytes": int(offloaded["end_fwd"])}})
    row["offloaded_bytes"] = int(offloaded[row["peak_phase"]])
    row["sdpa_kernels"] = dict(H.SDPA_LOG)
    H.SDPA_LOG.clear()
    return row


LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "lora_targets", "lora_dtype")


# ----------------------------------------------------------------------------------------------
# Saved-tensor dump (dump_saved.run with the PEFT model builder)
# ----------------------------------------------------------------------------------------------
def dump(o):
    import dump_saved as D
    o2 = argparse.Namespace(**vars(o))
    o2.gc = "none"  # dump_saved enables gc itself when asked

    def build(cfg, arch, attn, dtype):
        return build_peft_model(cfg, arch, attn, o2)

    info, rows, alive = D.run(o.config, o.batch, o.seq, o.precision, o.attn, o.layers, {}, o.gc == "full",
                              build=build)
    info["peft"] = {k: getattr(o, k) for k in ("method", *LORA_KEYS, "quant", "double_quant", "kbit_prepare")}
    text = D.fmt_report(info, rows, alive)
    os.makedirs(os.path.dirname(os.path.abspath(o.dump)), exist_ok=True)
    with open(o.dump, "w") as f:
        json.dump({"info": info, "saved": rows, "alive_not_saved": alive}, f, indent=1)
    with open(os.path.splitext(o.dump)[0] + ".txt", "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_model_args(ap, seq=1024, precision="bf16")
    ap.add_argument("--method", choices=["full", "lora", "qlora"], default="lora")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-alpha", type=int, default=None, help="default 2*r")
    ap.add_argument("--lora-dropout", type=float, default=0.0)
    ap.add_argument("--lora-targets", default="all-linear",
                    help="all-linear | attention | mlp | comma list of module names")
    ap.add_argument("--lora-dtype", choices=["fp32", "model"], default="fp32")
    ap.add_argument("--base-dtype", choices=["fp32"], default=None,
                    help="load the (frozen) base in fp32 whatever --precision says (torch_dtype=float32; "
                    "written to config.base_dtype only when given)")
    ap.add_argument("--quant", choices=["nf4", "fp4"], default="nf4")
    ap.add_argument("--double-quant", action="store_true")
    ap.add_argument("--kbit-prepare", action="store_true")
    ap.add_argument("--optimizer", default="adamw",
                    choices=["adamw", "sgd", "adamw8bit", "paged-adamw8bit", "adafactor", "adafactor-hf"])
    ap.add_argument("--gc", choices=["none", "full", "offload"], default="none")
    ap.add_argument("--micro-batches", type=int, default=1,
                    help="gradient accumulation: forward + backward this many times, then one optimizer "
                    "step (written to config.micro_batches when > 1)")
    H.add_run_args(ap)
    ap.add_argument("--keep-kernel-log", action="store_true")
    ap.add_argument("--dump", help="write the saved-tensor dump (JSON, + .txt) here instead of a row")
    ap.add_argument("--layers", type=int, default=2, help="layers of the dump's config copy")
    return ap


GRID_FLAGS = {"model": "--model-name", **{k: "--" + k.replace("_", "-") for k in (
    "batch", "seq", "precision", "attn", "method", "optimizer", "gc", *LORA_KEYS, "quant", "double_quant",
    "kbit_prepare", "micro_batches", "base_dtype")}}
GC_FLAG = {False: "none", True: "full", "offload": "offload"}


def argv_of(entry):
    """The command line (without --config) of a grid entry or a row's config (gc false / true /
    "offload"; the lora keys are null in a row of --method full)."""
    return H.flags({**entry, "gc": GC_FLAG[entry.get("gc", False)]}, GRID_FLAGS)


def main(argv=None):
    ap = parser()
    a = ap.parse_args(argv)
    done = H.dispatch(a, __file__, argv_of, main, ["--keep-kernel-log"] if a.keep_kernel_log else [])
    if done is not None:
        return done
    if not a.config:
        ap.error("--config, --grid or --from-row is required")
    if a.lora_alpha is None:
        a.lora_alpha = 2 * a.lora_r
    a.model_name = a.model_name or os.path.splitext(os.path.basename(a.config))[0]
    if a.dump:
        return dump(a)
    row = measure(a)
    kernels = row.pop("sdpa_kernels")
    if a.keep_kernel_log:
        row["sdpa_kernels"] = kernels
    c = row["config"]
    return H.emit(row, a.out, f"[peft] {a.model_name} b{a.batch} s{a.seq} {a.precision} {a.method} r={c['lora_r']} "
                  f"{c['lora_targets']} q={c['quant']} dq={c['double_quant']} kbit={c['kbit_prepare']} "
                  f"{a.optimizer} gc={a.gc}: peak {H.gib(row['peak_bytes'])} in {row['peak_phase']}, "
                  f"trainable {row['trainable_params']}, paged {row['paged_bytes']}, "
                  f"offloaded {row['offloaded_bytes']}, sdpa {kernels}, {row['time_s']} s")


if __name__ == "__main__":
    sys.exit(main())
