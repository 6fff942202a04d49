#!/usr/bin/env python3
"""Measure one LoRA / QLoRA training step of a Llama model run by Unsloth 2024.12.4's own PyTorch code,
the way measure.py measures a plain step (a recipe of validation/harness/: FakeTensorMode, MemTracker,
the CUDA emulation, the step, the row format).

What runs is Unsloth's code, copied verbatim from the wheels into `copied/` (`copies.py` lists the lines
and checks them against the wheels): `LlamaModel_fast_forward`, `LlamaDecoderLayer_fast_forward`,
`LlamaAttention_fast_forward` (models/llama.py), `LoRA_QKV`, `LoRA_W`, `LoRA_MLP`, `matmul_lora`,
`fast_dequantize`, `apply_lora_qkv`, `apply_lora_o`, `apply_lora_mlp_swiglu` (kernels/fast_lora.py,
kernels/utils.py), the Python wrappers of its Triton kernels (`Fast_RMS_Layernorm`, `Fast_RoPE_Embedding`,
`swiglu_fg_kernel`, `swiglu_DWf_DW_dfg_kernel`), its RoPE caches (`LlamaRotaryEmbedding`,
`LlamaExtendedRotaryEmbedding`) and unsloth_zoo 2024.12.1's `Unsloth_Offloaded_Gradient_Checkpointer`.
Only the Triton kernels, bitsandbytes' CUDA dequantization functions and flash-attn's `flash_attn_func`
are stand-ins (`copied/_standins.py`: they allocate nothing, as the kernels write into the tensors the
wrappers allocate; flash_attn_func is PyTorch's SDPA, whose flash kernel saves what flash-attn saves).

What this file does (what `FastLlamaModel.from_pretrained` / `get_peft_model` / `patch_peft_model` /
`prepare_model_for_kbit_training` do to a transformers 4.47 model, on transformers 5.24's Llama modules,
whose forwards Unsloth replaces): the model in bf16 (QLoRA: every linear but the head an emulated
bitsandbytes NF4 + double-quant `Linear4bit`, validation/peft.py's), peft's LoRA (r, alpha, dropout 0, the 7
linears, fp32 adapters), every other weight frozen, the embedding output made to require grad
(`enable_input_require_grads`), one Unsloth RoPE cache per attention module and one for the model (transformers
4.47's per-layer `rotary_emb`, rewritten by `patch_llama_rope_scaling`), the fast forwards bound to the modules,
and "unsloth" checkpointing (`_offloaded_gradient_checkpointing`: every layer through the offloading
checkpointer; its `.to("cpu")` copies are host memory, outside the GPU's figures) or none.

Attention: 2024.12.4 has no SDPA path in training. LlamaAttention_fast_forward (llama.py L392-436) runs
flash-attn's `flash_attn_func` when flash-attn imports (HAS_FLASH_ATTENTION), else xformers'
`memory_efficient_attention` (L393-413; llama.py cannot even be imported without xformers: its signatures
read `xformers.attn_bias`), and its SDPA branch (L420-436) only when an attention mask is passed, which
LlamaModel_fast_forward drops in training (L666-671). The recipe sets HAS_FLASH_ATTENTION and runs the
flash-attn branch, with `flash_attn_func` replaced by PyTorch's SDPA on the same tensors (the harness
emulates its kernel choice: FlashAttention-2, K and V not expanded).

The loss: Unsloth 2024.12.4 computes it with Cut Cross-Entropy (or, without it, its Triton cross-entropy),
neither of which runs here; this step computes transformers' `ForCausalLMLoss` on `lm_head(hidden)` (what
measure.py's step and the estimator's `--loss hf` do). Everything before the head is Unsloth's.

Examples:
  python validation/unsloth/measure_unsloth.py --config validation/configs/llama-1b.json --layers 2 \\
      --batch 1 --seq 2048 --method lora --gc offload
  python validation/unsloth/measure_unsloth.py --grid validation/grid-unsloth.json --out rows.jsonl
  python validation/unsloth/measure_unsloth.py --check          # real tensors: Unsloth's step vs transformers + peft
  python validation/unsloth/measure_unsloth.py ... --dump-peak /tmp/peak.json   # what is alive at each phase's peak
  python3 validation/unsloth/compare_unsloth.py                  # the fixture rows against the estimator CLI
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
# validation/ goes last (it holds a peft.py, which must not hide the library); this folder first (copied/)
sys.path[:] = [HERE] + [q for q in sys.path if os.path.abspath(q or ".") not in (HERE, VALIDATION)] + [VALIDATION]
import harness as H  # noqa: E402  (first: it sets the threads before torch is loaded)

H.quiet()
import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools import mem_tracker as _mt  # noqa: E402

KERNELS = "unsloth-2024.12"
VERSIONS = {"unsloth": "2024.12.4", "unsloth_zoo": "2024.12.1"}
LORA_NAMES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_recipe():
    """validation/peft.py (its emulated bitsandbytes 4-bit linear and its tracker), loaded under another
    name: the file is called peft.py, as is the library it imports."""
    spec = importlib.util.spec_from_file_location("peft_recipe", os.path.join(VALIDATION, "peft.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


P = _peft_recipe()


# ----------------------------------------------------------------------------------------------
# Devices: Unsloth's code names "cuda:0" for the GPU and "cpu" for host memory; here the GPU is
# emulated on fake CPU tensors (the harness) and host memory is the meta device (not tracked as GPU)
# ----------------------------------------------------------------------------------------------
def _gpu(d):
    if isinstance(d, str) and d.startswith("cuda") or isinstance(d, torch.device) and d.type == "cuda":
        return torch.device("cpu")
    return d


def _host_or_gpu(d, host):
    if isinstance(d, str) and d == "cpu":
        return torch.device(host)
    return _gpu(d)


@contextlib.contextmanager
def unsloth_devices(host="meta"):
    """The device names of Unsloth's code, for the whole step (forward and backward, every thread):
    `Tensor.to("cpu")` (the checkpointer's offload, gradient_checkpointing.py L154) goes to host memory,
    the meta device (shape only, outside the GPU's figures; `host="cpu"` with real tensors, --check);
    `"cuda"` / `"cuda:0"` (the `device=` of `torch.empty` / `torch.empty_like` in the kernel wrappers,
    `Tensor.to("cuda:0")` in the checkpointer's backward, L167) is the emulated GPU, the CPU.
    (`torch.Tensor.to`, `torch.empty` and `torch.empty_like` are wrapped while it is open: a torch
    function mode would not stay active inside `backward()`.)"""
    orig_to, orig_empty, orig_empty_like = torch.Tensor.to, torch.empty, torch.empty_like

    def to(self, *args, **kwargs):
        if args and isinstance(args[0], (str, torch.device)):
            args = (_host_or_gpu(args[0], host),) + tuple(args[1:])
        if "device" in kwargs:
            kwargs["device"] = _host_or_gpu(kwargs["device"], host)
        return orig_to(self, *args, **kwargs)

    def empty(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _gpu(kwargs["device"])
        return orig_empty(*args, **kwargs)

    def empty_like(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _gpu(kwargs["device"])
        return orig_empty_like(*args, **kwargs)

    torch.Tensor.to, torch.empty, torch.empty_like = to, empty, empty_like
    try:
        yield
    finally:
        torch.Tensor.to, torch.empty, torch.empty_like = orig_to, orig_empty, orig_empty_like


# ----------------------------------------------------------------------------------------------
# Tracker: the emulated GPU ("cpu") alone; host memory ("meta") read at each new peak
# ----------------------------------------------------------------------------------------------
H.install_frozen_param_hook_guard()  # the base weights are frozen


class UnslothTracker(P.PeftTracker):
    """peft.py's tracker of the emulated GPU, remembering at each new peak the bytes offloaded to
    host memory (the meta device here)."""

    def __init__(self, param_storages):
        super().__init__(param_storages)
        self.host_at_peak = 0

    def host_now(self):
        return sum(int(v[_mt._TOTAL_KEY]) for d, v in self._curr_mem_snap.items() if str(d).startswith("meta"))

    def at_new_peak(self):
        self.host_at_peak = self.host_now()


_WHEEL_LINES = {}


def _wheel_line(filename, lineno):
    """A line of a file in copied/ as `wheel path:line` (read from the copy's `# >>>` markers), else None."""
    if filename not in _WHEEL_LINES:
        import re
        blocks = []
        with open(filename) as f:
            for i, line in enumerate(f, 1):
                m = re.match(r"# >>> \S+ \S+ (\S+) L(\d+)-L(\d+)", line)
                if m:
                    blocks.append((i + 1, m.group(1), int(m.group(2)), int(m.group(3))))
        _WHEEL_LINES[filename] = blocks
    for start, path, a, b in _WHEEL_LINES[filename]:
        if start <= lineno <= start + (b - a):
            return f"{path.split('/')[-1]}:{a + lineno - start}"
    return None


def _where():
    """The innermost frames of Unsloth's copies (named by the wheel's file and line), this recipe,
    transformers and peft in the current stack."""
    import traceback
    keep = []
    for fr in traceback.extract_stack()[:-3]:
        f = fr.filename
        if "/copied/" in f:
            keep.append(f"{_wheel_line(f, fr.lineno) or os.path.basename(f) + ':' + str(fr.lineno)} {fr.name}")
        elif "measure_unsloth" in f or "/transformers/" in f or "/peft/" in f:
            keep.append(f"{os.path.basename(f)}:{fr.lineno} {fr.name}")
    return " < ".join(reversed(keep[-3:]))


class PeakDumpTracker(UnslothTracker):
    """UnslothTracker that remembers which op and line made each storage, and the storages alive at
    each phase's peak (--dump-peak): (bytes, category, shape, dtype, op, where). A storage the tracker
    sees first as an op's input (the autograd engine's gradient buffers) is named by that first use."""

    def __init__(self, param_storages):
        super().__init__(param_storages)
        self.at_peak = []
        self.peak_where = None
        self._new_peak = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._new_peak = False
        res = super().__torch_dispatch__(func, types, args, kwargs)
        for t in H.tensors_in(res):
            w = self._WINFO.get(t.untyped_storage(), (None, None))[0]
            if w is not None and not hasattr(w, "made"):
                w.made = (tuple(t.shape), str(t.dtype).replace("torch.", ""), str(func), _where())
        for t in H.tensors_in(list(args) + list((kwargs or {}).values())):
            w = self._WINFO.get(t.untyped_storage(), (None, None))[0]
            if w is not None and not hasattr(w, "made"):
                w.made = (tuple(t.shape), str(t.dtype).replace("torch.", ""), f"(first read by {func})", _where())
        if self._new_peak:
            self.peak_where = f"{func} at {_where()}"
            self.at_peak = [(w.mem_consumed, w.reftype.name, w) for st, (w, _) in list(self._WINFO.items())
                            if str(w.device).startswith("cpu") and w.mem_consumed > 0]
        return res

    def _update_peak_stats(self, peak_state):
        before = dict(self._peak_mem)
        super()._update_peak_stats(peak_state)
        if self._peak_mem != before:
            self._new_peak = True

    def reset_peak(self):
        super().reset_peak()
        self.at_peak = []

    def peak_list(self):
        return sorted(((b, cat, *getattr(w, "made", ((), "?", "?", "?"))) for b, cat, w in self.at_peak),
                      key=lambda x: -x[0])


# ----------------------------------------------------------------------------------------------
# The model as FastLlamaModel makes it
# ----------------------------------------------------------------------------------------------
def _rope_theta(cfg):
    rp = getattr(cfg, "rope_parameters", None) or {}
    return rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))


def _rope_scaling(cfg):
    """transformers 4.47's `config.rope_scaling` (None for a default RoPE)."""
    rp = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    kind = rp.get("rope_type", rp.get("type"))
    return None if kind in (None, "default") else rp


def build_rotary(U, cfg, head_dim, dtype, max_positions, fake_mode):
    """The per-layer `self.rotary_emb` of transformers 4.47's LlamaAttention.__init__ as Unsloth's
    `patch_llama_rope_scaling` rewrites it (models/_utils.py L892-930): `LlamaRotaryEmbedding(dim =
    self.head_dim, max_position_embeddings = ..., base = self.rope_theta)` without rope scaling,
    `LlamaExtendedRotaryEmbedding(...)` for "llama3". Built with the default dtype set to the model's
    (transformers sets it while from_pretrained builds the model): cos/sin caches of
    min(4 * 8192, max_position_embeddings) rows in bf16. The Llama 3 frequencies are scaled in a Python
    loop over values, so that module is made on real tensors and its caches rebuilt as fake tensors
    (its inv_freq becomes a fake buffer too)."""
    sc = _rope_scaling(cfg)
    base = _rope_theta(cfg)
    kind = None if sc is None else sc.get("rope_type", sc.get("type"))
    if kind is None:
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            return U.llama.LlamaRotaryEmbedding(dim=head_dim, max_position_embeddings=max_positions, base=base)
        finally:
            torch.set_default_dtype(old)
    if kind != "llama3":
        raise SystemExit(f"RoPE scaling {kind!r} is not set up here (Unsloth 2024.12.4: linear, llama3, longrope)")
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        rot = U.llama.LlamaExtendedRotaryEmbedding(dim=head_dim, max_position_embeddings=max_positions, base=base)
    rot.register_buffer("inv_freq", fake_mode.from_tensor(rot.inv_freq), persistent=False)
    rot._set_cos_sin_cache(seq_len=rot.current_rope_size, device="cuda:0", dtype=dtype)
    return rot


def unsloth_model(cfg, arch, o, fake_mode, dtype=torch.bfloat16):
    """transformers' LlamaForCausalLM (QLoRA: 4-bit linears) with peft's LoRA, set up as Unsloth 2024.12.4
    sets it up; returns (peft model, LlamaForCausalLM, the copied package)."""
    import copied as U  # noqa: F401  (the verbatim copies)
    import copied.fast_lora  # noqa: F401
    import copied.llama  # noqa: F401
    from peft import LoraConfig, get_peft_model
    model = H.build_model(cfg, arch, "sdpa", dtype)
    if o.method == "qlora":
        # from_pretrained(load_in_4bit=True): bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        # compute dtype = dtype, lm_head skipped; quant_state.dtype = dtype (UNSLOTH.md section 1)
        P.quantize_model_4bit(model, "nf4", True, dtype, dtype)
    lm = model
    # transformers 4.47 builds under the model dtype: config.torch_dtype is what LlamaModel_fast_forward
    # casts the embeddings to (llama.py L611-613) and what CausalLM_fast_forward casts the logits to
    lm.config.torch_dtype = dtype
    with H.swap_via_set_data():
        # FastLlamaModel.get_peft_model: LoraConfig(r, lora_alpha, lora_dropout = 0, bias = "none",
        # target_modules = the 7 linears) and peft's get_peft_model (adapters in fp32: autocast_adapter_dtype)
        model = get_peft_model(lm, LoraConfig(r=o.lora_r, lora_alpha=o.lora_alpha, lora_dropout=0.0,
                                              target_modules=LORA_NAMES, bias="none", task_type="CAUSAL_LM"))
    # prepare_model_for_kbit_training (models/_utils.py L516-532): only the adapters train, in fp32
    for name, p in model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            p.requires_grad_(True)
            assert p.dtype == torch.float32, name
        else:
            p.requires_grad_(False)
    # ... L551-558 (use_reentrant=True, as patch_peft_model calls it): the embedding output requires grad
    lm.enable_input_require_grads()
    inner = lm.model
    L = U.llama
    # FastLlamaModel.pre_patch (llama.py L1524-1528) replaces the classes' forwards; here each module's
    inner.forward = types.MethodType(L.LlamaModel_fast_forward, inner)
    # transformers 4.47's LlamaModel.rotary_emb, Unsloth's class since pre_patch L1539 (config branch:
    # device "cuda", min(32768, max_position_embeddings) rows in the default dtype)
    shim = types.SimpleNamespace(rope_theta=_rope_theta(cfg), hidden_size=cfg.hidden_size,
                                 num_attention_heads=cfg.num_attention_heads,
                                 max_position_embeddings=cfg.max_position_embeddings)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        inner.rotary_emb = L.LlamaRotaryEmbedding(config=shim)
    finally:
        torch.set_default_dtype(old)
    _patch_layers(inner, cfg, U,
                  lambda attn: build_rotary(U, cfg, attn.head_dim, dtype, cfg.max_position_embeddings, fake_mode))
    _set_for_training(model, inner, o)
    return model, lm, U


def _patch_layers(inner, cfg, U, rotary):
    """FastLlamaModel's patches of each decoder layer: its fast forwards, the transformers 4.47
    LlamaAttention attributes they read (L356-359), `rotary(attn)` as the attention's RoPE module, and
    patch_peft_model's LoRA kernels (llama.py L2329-2400: lora_dropout == 0, bias "none", no DoRA)."""
    L, fl = U.llama, U.fast_lora
    for layer in inner.layers:
        layer.forward = types.MethodType(L.LlamaDecoderLayer_fast_forward, layer)
        attn = layer.self_attn
        attn.forward = types.MethodType(L.LlamaAttention_fast_forward, attn)
        attn.num_heads = cfg.num_attention_heads
        attn.num_key_value_heads = cfg.num_key_value_heads
        attn.rotary_emb = rotary(attn)
        attn.apply_qkv = fl.apply_lora_qkv
        attn.apply_o = fl.apply_lora_o
        layer.mlp.forward = types.MethodType(fl.apply_lora_mlp_swiglu, layer.mlp)


def _set_for_training(model, inner, o):
    """What the fast forward reads beside the layers: FastLlamaModel.from_pretrained's max_seq_length
    (inputs longer than it are cut), CausalLM_fast_forward's `_has_no_labels` (L968), and "unsloth"
    checkpointing (prepare_model_for_kbit_training L535-545; gradient_checkpointing_enable sets
    LlamaModel.gradient_checkpointing = True in transformers 4.47)."""
    inner.max_seq_length = o.seq
    inner._has_no_labels = False
    inner.gradient_checkpointing = o.gc == "offload"
    if o.gc == "offload":
        obj = model
        while hasattr(obj, "model"):
            obj._offloaded_gradient_checkpointing = True
            obj = obj.model
        obj._offloaded_gradient_checkpointing = True


class _Out:
    def __init__(self, loss):
        self.loss = loss


def make_fwd(lm, U, ids, cfg, amp=False):
    """CausalLM_fast_forward (llama.py L932-1087) up to the loss: the model (LlamaModel_fast_forward) with
    xformers' LowerTriangularMask as causal_mask (L959), `lm_head(hidden_states.to(lm_head.dtype))` (L1018),
    `.to(torch_dtype)` (L1023); then transformers' ForCausalLMLoss in place of fast_cross_entropy_loss.
    `amp`: under bf16 autocast, as the Trainer runs the model with `bf16=True` (accelerate wraps the
    forward in autocast; the autograd functions' custom_fwd / custom_bwd carry it into their backward,
    where fast_lora multiplies the fp32 adapters with bf16 tensors, e.g. fast_lora.py L117)."""
    xformers = U._standins.xformers

    def fwd():
        with torch.autocast("cpu", dtype=torch.bfloat16) if amp else H.nullctx():
            return _fwd()

    def _fwd():
        causal_mask = xformers.attn_bias.LowerTriangularMask()
        outputs = lm.model(input_ids=ids, causal_mask=causal_mask, attention_mask=None, position_ids=None,
                           past_key_values=None, inputs_embeds=None, use_cache=False, output_attentions=False,
                           output_hidden_states=False, return_dict=True)
        hidden_states = outputs[0]
        lm_head = lm.lm_head.weight
        logits = lm.lm_head(hidden_states.to(lm_head.dtype))
        logits = logits.to(lm.config.torch_dtype)
        loss = lm.loss_function(logits=logits, labels=ids, vocab_size=cfg.vocab_size)
        return _Out(loss)

    return fwd


def logical_params(model):
    n = 0
    for p in model.parameters():
        n += int(p.quant_state.shape.numel()) if p.dtype == torch.uint8 and hasattr(p, "quant_state") else p.numel()
    return n


def measure(o):
    H.install_cuda_emulation()
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = H.load_config(o.config, "sdpa", {"num_hidden_layers": o.layers} if o.layers else None)
    if cfg.model_type != "llama":
        raise SystemExit(f"model_type {cfg.model_type!r}: this recipe runs Unsloth 2024.12.4's Llama path only")
    host = {}

    def on_phase(name, meter, step):
        host[name] = meter.host_at_peak
        if name == "fwd":
            host["end_fwd"] = meter.host_now()

    with FakeTensorMode(allow_non_fake_inputs=True) as fm, unsloth_devices():
        model, lm, U = unsloth_model(cfg, arch, o, fm)
        U._standins.SDPA["fn"] = None  # the harness's emulated SDPA (its CUDA kernel choice)
        U.llama.HAS_FLASH_ATTENTION = True
        model.train(True)
        ids = torch.randint(0, H.text_vocab(cfg), (o.batch, o.seq), dtype=torch.long)
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
        fwd = make_fwd(lm, U, ids, cfg, amp=True)
        H.warm_up(fwd, opt, True)
        meter = (PeakDumpTracker if o.dump_peak else UnslothTracker)(H.param_storages(model))
        meter.track_external(model, ids)
        meter.track_external(opt)
        dumps = {}

        def phase(name, m, st):
            on_phase(name, m, st)
            if o.dump_peak:
                dumps[name] = {"where": m.peak_where, "alive": m.peak_list()}

        with meter:
            step = H.measured_step(meter, fwd, opt, True, False, on_phase=phase)
        if o.dump_peak:
            write_dump(o.dump_peak, dumps)

    qlora = o.method == "qlora"
    gc = {"none": False, "offload": "offload"}[o.gc]
    config = H.base_config(
        o.model_name, o.batch, o.seq, "bf16", "adamw", "sdpa", gc, "foreach",
        kernels=KERNELS, layers=cfg.num_hidden_layers, method=o.method, lora_r=o.lora_r,
        lora_alpha=o.lora_alpha, lora_dropout=0.0, lora_targets="all-linear", lora_dtype="fp32",
        quant="nf4" if qlora else None, double_quant=qlora, kbit_prepare=False,
        compute_dtype="bf16" if qlora else None, loss="hf", attn_kernel="flash", trainer_amp=True)
    config["gc"] = gc
    row = H.step_row(
        config, H.versions(("peft", "peft"), ("bitsandbytes", "bitsandbytes")) | VERSIONS,
        logical_params(model), step, t0,
        after_params={"trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad)},
        after={"amp_weight_copy_bytes": {"offloaded_bytes": None,
                                         "offloaded_end_fwd_bytes": int(host.get("end_fwd", 0))}})
    row["offloaded_bytes"] = int(host.get(row["peak_phase"], 0))
    row["sdpa_kernels"] = dict(H.SDPA_LOG)
    H.SDPA_LOG.clear()
    return row


def write_dump(path, dumps):
    """The storages alive at each phase's peak (parameters and optimizer state summed by category):
    JSON at `path`, a table of the backward's peak on stderr."""
    with open(path, "w") as f:
        json.dump(dumps, f, indent=0)
    rows = dumps.get("bwd", {}).get("alive", [])
    total = sum(r[0] for r in rows)
    print(f"[dump] backward peak: {total} bytes in {len(rows)} storages, reached at "
          f"{dumps.get('bwd', {}).get('where')}", file=sys.stderr)
    summed = {}
    for b, cat, shape, dtype, op, where in rows:
        if cat in ("PARAM", "OPT", "BUFFER", "GRAD", "OTH"):
            summed[cat] = summed.get(cat, 0) + b
            continue
        print(f"  {b:>14,} {cat:5s} {str(list(shape)):22s} {dtype:9s} {op:40s} {where}", file=sys.stderr)
    for cat, b in summed.items():
        print(f"  {b:>14,} {cat:5s} (all)", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# --check: the same code on real tensors against transformers + peft
# ----------------------------------------------------------------------------------------------
def check(o):
    """A small Llama (2 layers, GQA, fp32, real CPU tensors), LoRA B initialised non-zero: Unsloth's step
    (the copies + the stand-ins' arithmetic, with and without the offloading checkpointer) against
    transformers 5.24 + peft on the same weights (eager attention): the loss and every LoRA gradient."""
    import transformers
    from peft import LoraConfig, get_peft_model
    H.install_cuda_emulation()
    import copied as U
    import copied.fast_lora  # noqa: F401
    import copied.llama  # noqa: F401
    U._standins.SDPA["fn"] = H.env._orig_sdpa  # PyTorch's own SDPA (math on the CPU)
    d = dict(model_type="llama", hidden_size=64, intermediate_size=160, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, num_hidden_layers=2, vocab_size=96,
             max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
             rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    mt = d.pop("model_type")
    cfg = transformers.AutoConfig.for_model(mt, **d)
    cfg.use_cache = False
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, 48))
    ok = True
    results = {}
    for variant in ("reference", "none", "offload"):
        torch.manual_seed(1)
        base = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
        lc = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_NAMES, bias="none",
                        task_type="CAUSAL_LM")
        torch.manual_seed(2)
        if variant == "reference":
            model = get_peft_model(base, lc)
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    torch.nn.init.normal_(p, std=0.02)
                p.requires_grad_("lora_" in n)
            out = model(input_ids=ids, labels=ids)
            loss = out.loss
        else:
            opts = argparse.Namespace(method="lora", lora_r=4, lora_alpha=8, gc=variant, seq=ids.shape[1])
            with unsloth_devices("cpu"):
                model, lm, _ = _unsloth_real(base, cfg, lc, opts, U)
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        torch.nn.init.normal_(p, std=0.02)
                loss = make_fwd(lm, U, ids, cfg)().loss
        with unsloth_devices("cpu"):
            loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results[variant] = (loss.detach(), grads)
    ref_loss, ref_grads = results["reference"]
    print(f"reference loss {ref_loss.item():.6f}, {len(ref_grads)} LoRA tensors")
    for variant in ("none", "offload"):
        loss, grads = results[variant]
        worst = max((g - ref_grads[n]).abs().max().item() / max(ref_grads[n].abs().max().item(), 1e-12)
                    for n, g in grads.items())
        same = set(grads) == set(ref_grads)
        good = same and abs(loss.item() - ref_loss.item()) < 1e-5 and worst < 1e-4
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} unsloth gc={variant}: loss {loss.item():.6f} "
              f"(diff {abs(loss.item() - ref_loss.item()):.2e}), largest LoRA gradient difference "
              f"{worst:.2e} of the tensor's largest value, same tensors: {same}")
    return 0 if ok else 1


def _unsloth_real(base, cfg, lc, o, U):
    """unsloth_model's setup on an already built fp32 model (real tensors)."""
    from peft import get_peft_model
    lm = base
    lm.config.torch_dtype = torch.float32
    model = get_peft_model(lm, lc)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_A." in name or ".lora_B." in name)
    lm.enable_input_require_grads()
    inner, L = lm.model, U.llama
    inner.forward = types.MethodType(L.LlamaModel_fast_forward, inner)
    _patch_layers(inner, cfg, U, lambda attn: L.LlamaRotaryEmbedding(
        dim=attn.head_dim, max_position_embeddings=cfg.max_position_embeddings, base=_rope_theta(cfg)))
    _set_for_training(model, inner, o)
    model.train(True)
    return model, lm, U


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="path to a Llama config.json")
    ap.add_argument("--model-name", help="name written to the row (default: the config's file stem)")
    ap.add_argument("--layers", type=int, default=None, help="num_hidden_layers of the copy measured (default: the config's)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--method", choices=["lora", "qlora"], default="lora",
                    help="lora: a bf16 base (fast_dequantize returns W); qlora: NF4 + double quantization")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-alpha", type=int, default=16)
    ap.add_argument("--gc", choices=["offload", "none"], default="offload",
                    help='offload: use_gradient_checkpointing="unsloth" (Unsloth_Offloaded_Gradient_Checkpointer); '
                    "none: use_gradient_checkpointing=False")
    ap.add_argument("--check", action="store_true", help="real tensors: Unsloth's step vs transformers + peft")
    ap.add_argument("--dump-peak", metavar="PATH", help="write the storages alive at each phase's peak (JSON) and "
                    "list the backward's on stderr")
    H.add_run_args(ap)
    ap.add_argument("--keep-kernel-log", action="store_true")
    return ap


GRID_FLAGS = {"model": "--model-name", **{k: "--" + k.replace("_", "-") for k in (
    "layers", "batch", "seq", "method", "lora_r", "lora_alpha", "gc")}}


def argv_of(entry):
    """The command line (without --config) of a grid entry or a row's config (gc false / "offload")."""
    e = dict(entry)
    e["gc"] = {False: "none", "offload": "offload"}.get(e.get("gc", "offload"), e.get("gc"))
    return H.flags(e, GRID_FLAGS)


def main(argv=None):
    ap = parser()
    a = ap.parse_args(argv)
    if a.check:
        return check(a)
    done = H.dispatch(a, __file__, argv_of, main, ["--keep-kernel-log"] if a.keep_kernel_log else [],
                      model_grid=os.path.join(VALIDATION, "grid-unsloth.json"))
    if done is not None:
        return done
    if not a.config:
        ap.error("--config, --grid, --from-row or --check is required")
    a.model_name = a.model_name or os.path.splitext(os.path.basename(a.config))[0]
    row = measure(a)
    kernels = row.pop("sdpa_kernels")
    if a.keep_kernel_log:
        row["sdpa_kernels"] = kernels
    c = row["config"]
    return H.emit(row, a.out, f"[unsloth] {a.model_name} L{c['layers']} b{a.batch} s{a.seq} {a.method} r={a.lora_r} "
                  f"gc={a.gc}: peak {H.gib(row['peak_bytes'])} ({row['peak_bytes']}) in {row['peak_phase']}, "
                  f"offloaded {row['offloaded_bytes']}, sdpa {kernels}, {row['time_s']} s")


if __name__ == "__main__":
    sys.exit(main())
