#!/usr/bin/env python3
"""Measure one training step whose LOSS is computed the way a trainer computes it.

Same method as measure.py (FakeTensorMode, MemTracker, the CUDA emulation: 512-byte rounding, CUDA
SDPA kernel choice, CUDA autocast lists, native_dropout; everything is imported from measure.py,
whose behaviour is not changed), with the loss path of:

  --loss hf                 model(labels=...) -> transformers' ForCausalLMLoss (= measure.py).
  --loss trl-nll            TRL 1.13 SFTTrainer.compute_loss, loss_type="nll": TRL's own method is called
                            on a stub trainer (SFTTrainer.__new__ + the attributes it reads); it runs
                            transformers' Trainer.compute_loss (model(**inputs) with num_items_in_batch)
                            and then SFTTrainer's no-grad entropy / token-accuracy metrics on the full logits.
  --loss trl-chunked        TRL 1.13 loss_type="chunked_nll": trl's own _patch_chunked_ce_lm_head(model,
                            chunk_size=256), then compute_loss as above.
  --loss torchtune-chunked  torchtune 0.6.1 CEWithChunkedOutputLoss(num_output_chunks=8) (loaded from the
                            installed wheel's file, see _load_torchtune_loss) on chunked logits
                            [lm_head(c) for c in h.chunk(8, dim=1)] (model dtype), labels shifted as the
                            full_finetune_single_device recipe does (hstack(labels[..., 1:], ignore)); the
                            torchtune decoder is emulated with the transformers model: model.model(...) gives
                            the (normed) last hidden state, model.lm_head is applied per chunk.

--optimizer-in-bwd on: torchtune 0.6.1's optimizer_in_bwd (one AdamW per parameter, stepped and its gradient freed in
the parameter's post-accumulate-grad hook; no optimizer.step() phase). --gc-reentrant on|off (with --gc): Trainer's
gradient_checkpointing_kwargs={"use_reentrant": ...}; unset = transformers' default (use_reentrant=False).

TRL runs (trl-*) also get what Trainer + accelerate do around compute_loss with SFTConfig's default
bf16=True (--trainer-amp on, the default for trl-*): accelerate's native AMP wraps model.forward in
autocast(bf16) and accelerate's own convert_outputs_to_fp32 (the model's bf16 outputs, i.e. the logits,
are returned as fp32 copies). --trainer-amp off drops that wrapper.

Inputs (made as real CPU tensors first, so that every data-dependent decision is taken on real values,
then converted to fake tensors):
  * default: input_ids; hf: labels = input_ids (same tensor, as measure.py); trl-*: labels a separate
    tensor and an all-ones attention_mask (TRL's DataCollatorForLanguageModeling); torchtune: tokens +
    labels (no mask).
  * --packing on: every row holds --docs (default 4) documents of seq/docs tokens, position_ids restart
    at 0 per document, no attention_mask, labels -100 at each document start (TRL's padding-free
    collator; with batch 1 this is exactly its output). transformers detects the packing from the
    position ids (find_packed_sequence_indices, run on the fake tensors since the real answer is "packed")
    and builds a block-causal (B, 1, S, S) bool mask for sdpa / eager.
  * --padding on: the last 10% of every row is padding: attention_mask 0 and labels -100 there
    (torchtune has no attention mask: only the labels are -100).
  * all-ones attention masks: transformers skips the mask on real tensors (fast_all); under fake
    tensors it cannot read the values, so the real answer, computed outside fake mode, is fed in.

Example:
  python validation/trainers.py --config validation/configs/qwen3-0.6b.json --model-name qwen3-0.6b \
      --batch 4 --seq 2048 --precision bf16 --gc --loss trl-chunked --out rows.jsonl
  python validation/trainers.py ... --dump /tmp/x.json   (tensor-level view of the loss path, see --help)
"""
from __future__ import annotations

import argparse
import builtins
import collections
import importlib.util
import inspect
import json
import math
import os
import sys
import time
import types
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

_HERE = os.path.dirname(os.path.abspath(__file__))
# validation/peft.py would shadow the peft library that transformers.trainer_utils imports
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.append(_HERE)
import measure as M  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

R = M.ROUND_BYTES
LOSSES = ["hf", "trl-nll", "trl-chunked", "torchtune-chunked"]
TRL_CHUNK = 256          # trl.trainer.sft_trainer._CHUNKED_LM_HEAD_CHUNK_SIZE
TT_CHUNKS = 8            # torchtune recipes' num_output_chunks
PAD_FRACTION = 0.10


def rnd(n):
    return int(math.ceil(n / R) * R)


# ----------------------------------------------------------------------------------------------
# Real (value-dependent) facts, computed outside fake mode and fed to the patched decisions
# ----------------------------------------------------------------------------------------------
class Facts:
    all_ones_mask = False   # the 2-D attention mask has no zero
    packed = False          # position ids restart inside a row
    n_valid = 0             # labels[..., 1:] != -100
    n_padded = 0            # TRL chunked: ceil(n_valid / 256) (>= 1) * 256


FACTS = Facts()
_PATCHED = False


def install_trainer_patches():
    """On top of measure.install_cuda_emulation(): let the packed-sequence detection and the
    all-ones-mask skip decide as they do on real tensors (measure.py's own patches assume
    no packing and no mask)."""
    global _PATCHED
    M.install_cuda_emulation()
    if _PATCHED:
        return
    import transformers.masking_utils as mu
    orig_find = _ORIG_FIND_PACKED  # the unpatched transformers function

    def find_packed_sequence_indices(position_ids):
        # real tensors: returns None unless some row restarts its positions. Under fake tensors
        # transformers skips that check and always returns the indices; so run the original (its
        # diff / cumsum temporaries are allocated as on the GPU) only when the real answer is "packed".
        if FACTS.packed:
            return orig_find(position_ids)
        return None

    mu.find_packed_sequence_indices = find_packed_sequence_indices
    prev_ignore = mu._ignore_causal_mask_sdpa  # measure.py's version

    def _ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, q_offset, kv_offset,
                                 local_attention_size=None):
        if padding_mask is not None and FACTS.all_ones_mask:
            # real tensors: fast_all(padding_mask) (sum == numel) is True -> the same decision as
            # without a mask. Allocate its two scalars as the real check does.
            _ = padding_mask.sum() == padding_mask.numel()
            del _
            return prev_ignore(None, q_length, kv_length, q_offset, kv_offset, local_attention_size)
        return prev_ignore(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size)

    mu._ignore_causal_mask_sdpa = _ignore_causal_mask_sdpa
    _PATCHED = True


def _grab_orig_find():
    import transformers.masking_utils as mu
    # measure.install_cuda_emulation() replaces it; read the function from the module's source object
    f = mu.find_packed_sequence_indices
    if getattr(f, "__name__", "") == "<lambda>":
        raise RuntimeError("trainers.py must be imported before measure.install_cuda_emulation() runs")
    return f


_ORIG_FIND_PACKED = _grab_orig_find()


class FakeScalars:
    """Under FakeTensorMode a tensor has no value: TRL's metrics call .item() and bool() on
    0-d tensors (num_valid > 0, (entropy_sum / n).item()). Answer 0.0 / True for fake tensors
    (on a GPU these only synchronise; they allocate nothing)."""

    def __enter__(self):
        self._item, self._bool = torch.Tensor.item, torch.Tensor.__bool__
        oi, ob = self._item, self._bool

        def item(t):
            return 0.0 if isinstance(t, FakeTensor) else oi(t)

        def to_bool(t):
            return True if isinstance(t, FakeTensor) else ob(t)
        torch.Tensor.item = item
        torch.Tensor.__bool__ = to_bool
        return self

    def __exit__(self, *a):
        torch.Tensor.item, torch.Tensor.__bool__ = self._item, self._bool
        return False


class TrlChunkCount:
    """trl's _chunked_cross_entropy_loss loops `for start in range(0, n_padded, chunk_size)` with
    n_padded a device tensor (read on the host). Under fake tensors it has no value: shadow the
    module's `range` so that a tensor bound is replaced by the real count (FACTS.n_padded)."""

    def __enter__(self):
        import trl.trainer.sft_trainer as st
        self.mod = st

        def _range(*args):
            args = tuple(FACTS.n_padded if isinstance(a, torch.Tensor) else a for a in args)
            return builtins.range(*args)
        st.range = _range
        return self

    def __exit__(self, *a):
        if hasattr(self.mod, "range"):
            del self.mod.range
        return False


# ----------------------------------------------------------------------------------------------
# Trainer pieces
# ----------------------------------------------------------------------------------------------
class StubAccelerator:
    """What SFTTrainer.compute_loss / Trainer.compute_loss read from the accelerator (1 process)."""
    num_processes = 1
    parallelism_config = None

    @staticmethod
    def gather_for_metrics(x):
        return x

    @staticmethod
    def unwrap_model(m):
        return m


def make_trl_stub(model, loss_type):
    from collections import defaultdict
    from trl.trainer.sft_trainer import SFTTrainer
    stub = SFTTrainer.__new__(SFTTrainer)  # no __init__: only the attributes compute_loss reads
    unwrapped = model
    if hasattr(unwrapped, "accepts_loss_kwargs"):
        accepts = unwrapped.accepts_loss_kwargs
    else:  # transformers.Trainer.__init__
        accepts = any(p.kind == inspect.Parameter.VAR_KEYWORD
                      for p in inspect.signature(unwrapped.forward).parameters.values())
    stub.__dict__.update(
        model=model,
        args=types.SimpleNamespace(loss_type=loss_type, use_liger_kernel=False,
                                   average_tokens_across_devices=True, n_gpu=1,
                                   prediction_loss_only=False),
        accelerator=StubAccelerator(), aux_loss_enabled=False, label_smoother=None,
        compute_loss_func=None, compute_metrics=None, preprocess_logits_for_metrics=None,
        model_accepts_loss_kwargs=accepts, num_virtual_tokens=0, _tp_size=1, _total_train_tokens=0,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        get_tp_size=lambda: 1,
    )
    return stub


def wrap_accelerate_amp(model):
    """accelerate.Accelerator.prepare_model with native AMP (Trainer with bf16=True, SFTConfig's default):
    model.forward = convert_outputs_to_fp32(autocast(forward)). The autocast is the emulated CUDA one
    (torch.autocast('cpu', bf16) + measure.py's CUDA lists); convert_outputs_to_fp32 is accelerate's own."""
    from accelerate.utils.operations import convert_outputs_to_fp32
    model._original_forward = model.forward
    fn = model.forward.__func__ if hasattr(model.forward, "__func__") else model.forward
    new_forward = torch.autocast("cpu", dtype=torch.bfloat16)(fn)
    if hasattr(model.forward, "__func__"):
        model.forward = types.MethodType(new_forward, model)
        model.forward = types.MethodType(convert_outputs_to_fp32(model.forward.__func__), model)
    else:
        model.forward = convert_outputs_to_fp32(new_forward)


def _load_torchtune_loss():
    """torchtune 0.6.1's CEWithChunkedOutputLoss. `import torchtune` needs torchao (torchtune/__init__.py
    and torchtune.modules import torchao.dtypes.nf4tensor, which torchao 0.18 no longer has, and older
    torchao wheels are built for older torch), so the module file of the installed wheel is loaded on its
    own (it imports only torch). Without the wheel, a verbatim copy of that class is used."""
    spec = importlib.util.find_spec("torchtune")
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "modules", "loss",
                            "ce_chunked_output_loss.py")
        if os.path.exists(path):
            s = importlib.util.spec_from_file_location("_tt_ce_chunked_output_loss", path)
            mod = importlib.util.module_from_spec(s)
            s.loader.exec_module(mod)
            return mod.CEWithChunkedOutputLoss, "torchtune 0.6.1 wheel file"
    class CEWithChunkedOutputLoss(torch.nn.Module):  # copy of torchtune 0.6.1
        def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100):
            super().__init__()
            self.num_output_chunks = num_output_chunks
            self.ignore_index = ignore_index

        def compute_cross_entropy(self, logits, labels, normalize=True):
            return F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction="sum")

        def forward(self, logits, labels):
            total_elements = (labels != self.ignore_index).sum()
            labels = [target_chunk.reshape(-1) for target_chunk in labels.chunk(self.num_output_chunks, dim=1)]
            logits = [logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits]
            total_loss = 0.0
            for logits_chunk, labels_chunk in zip(logits, labels):
                total_loss += self.compute_cross_entropy(logits_chunk, labels_chunk)
            return total_loss / total_elements
    return CEWithChunkedOutputLoss, "copy of torchtune 0.6.1 (wheel not installed)"


def versions():
    import transformers
    v = {"torch": torch.__version__, "transformers": transformers.__version__,
         "torchvision": M._torchvision_version()}
    tv = {}
    for name in ("trl", "accelerate", "torchtune"):
        try:
            from importlib.metadata import version
            tv[name] = version(name)
        except Exception:
            tv[name] = None
    v["trainer_versions"] = tv
    return v


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------
def real_inputs(vocab, batch, seq, loss, packing, padding, docs):
    """The batch as the trainer's collator gives it, as real CPU tensors."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), dtype=torch.long, generator=g)
    inp = {"input_ids": ids}
    labels = ids.clone()
    pos = None
    mask = None
    if packing:
        if seq % docs:
            raise SystemExit(f"--packing: seq {seq} is not a multiple of --docs {docs}")
        pos = torch.arange(seq // docs).repeat(docs).unsqueeze(0).repeat(batch, 1)
        labels[pos == 0] = -100  # TRL padding-free collator: labels[position_ids == 0] = -100
    if padding:
        n_pad = max(1, int(round(seq * PAD_FRACTION)))
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[:, seq - n_pad:] = 0
        labels[:, seq - n_pad:] = -100
    elif loss.startswith("trl") and not packing:
        mask = torch.ones(batch, seq, dtype=torch.long)  # TRL's collator always returns the mask
    if loss == "torchtune-chunked":
        mask = None  # torchtune's collate_fn has no attention mask (causal only; pads are -100 labels)
    if mask is not None:
        inp["attention_mask"] = mask
    if pos is not None:
        inp["position_ids"] = pos
    if loss == "hf" and not packing and not padding:
        inp["labels"] = ids  # measure.py: labels = input ids, the same tensor
    else:
        inp["labels"] = labels
    FACTS.all_ones_mask = bool(mask is not None and bool(mask.all()))
    FACTS.packed = bool(pos is not None and _ORIG_FIND_PACKED(pos) is not None)
    FACTS.n_valid = int((labels[..., 1:] != -100).sum())
    FACTS.n_padded = max(1, math.ceil(FACTS.n_valid / TRL_CHUNK)) * TRL_CHUNK
    return inp


# ----------------------------------------------------------------------------------------------
# Tracker with an optional tensor-level record of the loss path (--dump)
# ----------------------------------------------------------------------------------------------
DUMP_MIN = 1 << 20  # storages >= 1 MiB


class TrainerTracker(M.PhaseTracker):
    def __init__(self, param_storages, dump=False):
        super().__init__(param_storages)
        self.dump = dump
        self.created = WeakIdKeyDictionary()
        self.region = "model"
        self.phase = "fwd"
        self.peak_list = None
        self.peak_dirty = False
        self.timeline = []
        self._tl_last = 0
        self.loss_bwd_done = False

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types_, args, kwargs)
        if self.dump:
            for t in _tensors(res):
                try:
                    st = t.untyped_storage()
                except Exception:
                    continue
                if st.nbytes() >= DUMP_MIN and st not in self.created and st._cdata not in self._param_cdata:
                    self.created[st] = {
                        "op": f"{func.overloadpacket.__name__}.{func._overloadname}",
                        "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                        "bytes": rnd(st.nbytes()), "phase": self.phase, "region": self.region}
            if (self.phase == "fwd" and self.region == "loss") or (self.phase == "bwd" and not self.loss_bwd_done):
                tot = sum(v[M._mt._TOTAL_KEY] for v in self._curr_mem_snap.values())
                if abs(tot - self._tl_last) >= DUMP_MIN and len(self.timeline) < 3000:
                    self._tl_last = tot
                    outs = [f"{list(t.shape)}:{str(t.dtype).replace('torch.', '')}" for t in _tensors(res)][:2]
                    self.timeline.append((self.phase, f"{func.overloadpacket.__name__}", outs,
                                          round(tot / 2**20, 1)))
            if self.peak_dirty:  # the peak was raised by this op: list what is alive, its outputs included
                self.peak_dirty = False
                self.peak_list = self.alive()
        return res

    def _update_peak_stats(self, peak_state):
        before = dict(self._peak_mem)
        super()._update_peak_stats(peak_state)
        if self.dump and self._peak_mem != before:
            self.peak_dirty = True

    def alive(self):
        out = []
        for st, info in list(self.created.items()):
            w = self._WINFO.get(st, (None, None))[0]
            cat = w.reftype.name if w is not None else "?"
            out.append(dict(info, category=cat))
        return out

    def reset_peak(self):
        super().reset_peak()
        self.peak_list = self.alive() if self.dump else None


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from _tensors(y)


# ----------------------------------------------------------------------------------------------
# The step
# ----------------------------------------------------------------------------------------------
def enable_checkpointing(model, reentrant):
    """--gc: what transformers' Trainer does with args.activation_checkpointing: model.
    activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None) (gradient_checkpointing_enable
    is its deprecated alias). kwargs None (--gc-reentrant default, = measure.py's plain
    gradient_checkpointing_enable()) means {"use_reentrant": False} in transformers 5.24; either way transformers
    calls enable_input_require_grads() (input_ids models), so the embedding output requires grad, as
    reentrant checkpointing needs."""
    kw = None if reentrant is None else {"use_reentrant": bool(reentrant)}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def make_optim_in_bwd(model):
    """torchtune 0.6.1 optimizer_in_bwd (full_finetune_single_device._setup_optimizer): one optimizer per
    parameter, {p: AdamW([p]) for p in model.parameters()} (foreach=True, as measure.py's AdamW), and
    training.register_optim_in_bwd_hooks: a post-accumulate-grad hook on every trainable parameter that
    steps its optimizer and zero_grad()s it (set_to_none) as soon as the gradient is accumulated."""
    optim_dict = {p: torch.optim.AdamW([p], lr=1e-4, foreach=True) for p in model.parameters()}

    def register():
        def optim_step(param) -> None:  # torchtune.training.memory.register_optim_in_bwd_hooks
            optim_dict[param].step()
            optim_dict[param].zero_grad()
        return [p.register_post_accumulate_grad_hook(optim_step) for p in model.parameters() if p.requires_grad]
    return optim_dict, register


def build_step(o, cfg, model, fake, inputs_real, amp):
    """Returns (tracked input tensors, fwd) where fwd() -> object with .loss, as measure.py's."""
    if o.gc:
        enable_checkpointing(model, o.gc_reentrant)
    model.train(True)
    model.config.use_cache = False
    # real -> fake (values are lost, shapes/dtypes kept); labels that are the ids stay one tensor
    conv = {}
    inputs = {}
    for k, v in inputs_real.items():
        if id(v) not in conv:
            conv[id(v)] = fake.from_tensor(v)
        inputs[k] = conv[id(v)]
    extra = []
    trainer_amp = o.loss.startswith("trl") and o.trainer_amp
    amp_ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if (amp and not trainer_amp) else M._nullctx

    if o.loss == "hf":
        def fwd():
            with amp_ctx():
                return M._LossOnly(model(**inputs).loss)
        return list(inputs.values()), fwd

    if o.loss.startswith("trl"):
        from trl.trainer.sft_trainer import SFTTrainer, _patch_chunked_ce_lm_head
        loss_type = "nll" if o.loss == "trl-nll" else "chunked_nll"
        if loss_type == "chunked_nll":
            _patch_chunked_ce_lm_head(model, chunk_size=TRL_CHUNK)  # SFTTrainer.__init__ does this
        if trainer_amp:
            wrap_accelerate_amp(model)  # then Trainer's accelerator.prepare(model)
        stub = make_trl_stub(model, loss_type)
        # Trainer._get_num_items_in_batch: valid targets of labels[..., 1:], a device tensor
        num_items = torch.full((), FACTS.n_valid, dtype=torch.long)
        extra.append(num_items)

        def fwd():
            batch = dict(inputs)  # compute_loss adds/pops keys
            with amp_ctx(), FakeScalars(), TrlChunkCount():
                loss = SFTTrainer.compute_loss(stub, model, batch, num_items_in_batch=num_items)
            del batch
            return M._LossOnly(loss)
        return list(inputs.values()) + extra, fwd

    if o.loss == "torchtune-chunked":
        Loss, _src = _load_torchtune_loss()
        loss_fn = Loss(num_output_chunks=TT_CHUNKS)
        B = inputs["input_ids"].shape[0]
        ignore_cache = torch.full((B, 1), loss_fn.ignore_index, dtype=torch.long)  # recipe setup
        extra.append(ignore_cache)
        backbone = model.model
        head = model.get_output_embeddings()
        kw = {k: v for k, v in inputs.items() if k in ("input_ids", "position_ids")}

        def fwd():
            labels = inputs["labels"]
            current_num_tokens = (labels != loss_fn.ignore_index).sum()  # recipe's train loop
            with amp_ctx():
                h = backbone(**kw, use_cache=False).last_hidden_state  # decoder incl. final norm
                # chunked_output; F.linear with the weight as torchtune's TiedLinear does (and MemTracker
                # refuses a module called 8 times in one step)
                logits = [F.linear(chunk, head.weight, head.bias) for chunk in h.chunk(TT_CHUNKS, dim=1)]
                del h
            labels = torch.hstack((labels[..., 1:], ignore_cache[:B]))
            loss = loss_fn(logits, labels)
            del logits, labels
            loss = loss * current_num_tokens
            return M._LossOnly(loss)
        return list(inputs.values()) + extra, fwd
    raise SystemExit(f"unknown loss {o.loss}")


def measure(o):
    install_trainer_patches()
    import transformers  # noqa: F401
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = M.load_config(o.config, o.attn)
    dtype = torch.bfloat16 if o.precision == "bf16" else torch.float32
    amp = o.precision == "amp_bf16"
    if o.packing and o.padding:
        raise SystemExit("--packing on and --padding on together are not supported (padding-free packing)")
    inputs_real = real_inputs(M.text_vocab(cfg), o.batch, o.seq, o.loss, o.packing, o.padding, o.docs)
    if o.real:
        # cross-check: the same step on real CPU tensors (same tracker and emulation patches)
        fake = types.SimpleNamespace(from_tensor=lambda t: t)
        fake_ctx = M._nullctx()
    else:
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        fake_ctx = fake
    saved = []
    with fake_ctx:
        model = M.build_model(cfg, arch, o.attn, dtype)
        tracked_inputs, fwd = build_step(o, cfg, model, fake, inputs_real, amp)
        params = [p for p in model.parameters() if p.requires_grad]
        if o.optimizer_in_bwd:
            optim_dict, register_opt_hooks = make_optim_in_bwd(model)
            opt_hooks = register_opt_hooks()
            out = fwd()  # warm-up (untracked): the per-parameter steps in backward create the states
            out.loss.backward()
            del out
            opts = list(optim_dict.values())
        else:
            opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
            M.warm_up(fwd, opt, True)  # untracked
            opts = [opt]

        mt = TrainerTracker({p.untyped_storage()._cdata for p in model.parameters()}, dump=bool(o.dump))
        mt.track_external(model, *tracked_inputs)
        mt.track_external(*opts)
        hooks = []
        if o.dump:
            backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
            hooks.append(backbone.register_forward_pre_hook(lambda m, a: setattr(mt, "region", "model")))
            def after_backbone(m, a, r):
                mt.region = "loss"
                h = r[0] if isinstance(r, (tuple, list)) else getattr(r, "last_hidden_state", None)
                if isinstance(h, torch.Tensor) and h.requires_grad and mt.phase == "fwd":
                    def on_grad(g):
                        # the gradient w.r.t. the backbone output is complete: the loss path's backward
                        # is done; keep its peak and what was alive then
                        if mt.phase == "bwd" and "loss_bwd" not in peak_lists:
                            mt.loss_bwd_done = True
                            peak_lists["loss_bwd"] = mt.peak_list
                            loss_bwd_peak.update(mt.peak())
                            peak_lists["loss_bwd_end_alive"] = mt.alive()
                    h.register_hook(on_grad)
            hooks.append(backbone.register_forward_hook(after_backbone))
        phase_peaks = {}
        peak_lists = {}
        loss_bwd_peak = {}

        def pack(t):
            if mt.region == "loss":
                try:
                    st = t.untyped_storage()
                    info = mt.created.get(st)
                    saved.append({"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                                  "storage_bytes": rnd(st.nbytes()),
                                  "grad_fn": type(t.grad_fn).__name__ if t.grad_fn is not None else None,
                                  "param": st._cdata in mt._param_cdata,
                                  "created_by": info["op"] if info else None})
                except Exception:
                    pass
            return t

        with mt:
            if o.optimizer_in_bwd:
                # MemTracker tags p.grad as a gradient in its own post-accumulate-grad hook, installed on entry
                # to the first forward: install it now and register the stepping hooks after it (hooks run
                # in registration order; stepping first would leave it p.grad = None). Memory is the same.
                for h in opt_hooks:
                    h.remove()
                mt._track_module_params_and_buffers(model, install_grad_hooks=True)
                opt_hooks = register_opt_hooks()
            start = mt.snap()
            mt.reset_peak()
            mt.record_copies = amp or (o.loss.startswith("trl") and o.trainer_amp)
            if o.dump:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = fwd()
            else:
                out = fwd()
            mt.record_copies = False
            end_fwd = mt.snap()
            amp_copy = mt.alive_copy_bytes() if mt.copy_refs else 0
            phase_peaks["fwd"] = mt.peak()
            peak_lists["fwd"] = mt.peak_list
            alive_end_fwd = mt.alive() if o.dump else None
            mt.region = "model"
            loss = out.loss
            mt.phase = "bwd"
            mt.reset_peak()
            loss.backward()
            del loss, out
            phase_peaks["bwd"] = mt.peak()
            peak_lists["bwd"] = mt.peak_list
            after_bwd = mt.snap()
            mt.phase = "opt"
            mt.reset_peak()
            if o.optimizer_in_bwd:
                # no optimizer.step() phase: every parameter was stepped in backward
                phase_peaks["opt"] = {k: 0 for k in phase_peaks["bwd"]}
                peak_lists["opt"] = None
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
                phase_peaks["opt"] = mt.peak()
                peak_lists["opt"] = mt.peak_list
            end = mt.snap()
        for h in hooks:
            h.remove()

    n_params = sum(p.numel() for p in model.parameters())
    param_bytes, buffer_bytes, input_bytes = start["parameter"], start["buffer"], start["other"]
    opt_state_bytes = start["optstate"]
    grad_bytes = after_bwd["gradient"]
    peak_phase, pk, opt_step_temp, at_peak = M.peak_summary(phase_peaks, opt_state_bytes)
    order = ["fwd", "bwd", "opt"]
    trainer_amp = o.loss.startswith("trl") and o.trainer_amp
    row = {
        "config": {
            "model": o.model_name, "batch": o.batch, "seq": o.seq, "image": 224,
            "precision": o.precision, "optimizer": "adamw", "attn": o.attn, "gc": bool(o.gc),
            "mode": "fake", "tracker": "memtracker", "emulate_cuda": True,
            "round_bytes": R, "opt_impl": "foreach", "warmup_steps": 1,
            "loss": o.loss, "packing": bool(o.packing), "padding": bool(o.padding),
        },
        "versions": versions(),
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
        "phase_peak_bytes": {k: phase_peaks[k]["total"] for k in order},
        "phase_peaks": {k: phase_peaks[k] for k in order},
        "start_bytes": start["total"],
        "end_bytes": end["total"],
        "after_bwd_bytes": after_bwd["total"],
        "time_s": round(time.time() - t0, 2),
    }
    c = row["config"]
    if o.real:
        c["mode"] = "real-cpu"
    if o.packing:
        c["docs_per_row"] = o.docs
    if o.padding:
        c["pad_fraction"] = PAD_FRACTION
    if o.loss == "trl-chunked":
        c["chunk_size"] = TRL_CHUNK
        c["chunks"] = FACTS.n_padded // TRL_CHUNK
    if o.loss == "torchtune-chunked":
        c["num_output_chunks"] = TT_CHUNKS
        c["torchtune_loss_source"] = _load_torchtune_loss()[1]
        c["torchtune_decoder"] = "emulated: transformers model.model + lm_head per h.chunk(8, dim=1)"
    if o.loss.startswith("trl"):
        c["trainer_amp"] = bool(o.trainer_amp)
    if o.optimizer_in_bwd:
        c["optimizer_in_bwd"] = True
        c["opt_impl"] = "foreach, one AdamW per parameter stepped in its post-accumulate-grad hook (torchtune 0.6.1)"
    if o.gc and o.gc_reentrant is not None:
        c["gc_reentrant"] = bool(o.gc_reentrant)
    c["n_valid_tokens"] = FACTS.n_valid
    c["attn_mask"] = _mask_kind(o, cfg)
    row["sdpa_kernels"] = dict(M.SDPA_LOG)
    M.SDPA_LOG.clear()
    if o.dump:
        dump = {"row_config": c, "saved_in_loss_region": _dedup_saved(saved),
                "alive_end_fwd": alive_end_fwd, "at_peak": peak_lists,
                "phase_peaks": row["phase_peaks"], "loss_bwd_peak": loss_bwd_peak,
                "timeline_loss_path": mt.timeline,
                "start": start, "end_fwd": end_fwd,
                "after_bwd": after_bwd}
        with open(o.dump, "w") as f:
            json.dump(dump, f, indent=1)
    return row


def _dedup_saved(saved):
    cnt = collections.Counter(json.dumps(s, sort_keys=True) for s in saved)
    return [dict(json.loads(k), count=v) for k, v in cnt.items()]


def _mask_kind(o, cfg=None):
    """What transformers passes to the attention of the full-attention layers (+ sliding layers)."""
    if o.packing and FACTS.packed:
        k = "block-causal (B,1,S,S) bool from position_ids"
    elif o.padding and o.loss != "torchtune-chunked":
        k = "causal & padding (B,1,S,S) bool"
    elif o.attn == "eager":
        k = "causal (materialised, eager)"
    else:
        k = "none (is_causal)" if not FACTS.all_ones_mask else "none (all-ones mask skipped)"
    sw = getattr(cfg, "sliding_window", None) if cfg is not None else None
    lt = getattr(cfg, "layer_types", None) or []
    if sw and "sliding_attention" in lt and o.seq >= sw:
        k += f"; sliding layers: sliding-window {sw} (B,1,S,S) bool"
    return k


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--model-name")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", choices=["amp_bf16", "bf16", "fp32"], default="bf16")
    ap.add_argument("--optimizer", choices=["adamw"], default="adamw")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--loss", choices=LOSSES, default="hf")
    ap.add_argument("--packing", choices=["on", "off"], default="off")
    ap.add_argument("--docs", type=int, default=4, help="documents per row with --packing on")
    ap.add_argument("--padding", choices=["on", "off"], default="off")
    ap.add_argument("--trainer-amp", choices=["on", "off"], default="on",
                    help="trl-*: accelerate's native AMP wrapper of model.forward (SFTConfig bf16=True)")
    ap.add_argument("--optimizer-in-bwd", choices=["on", "off"], default="off",
                    help="torchtune's optimizer_in_bwd: one AdamW per parameter, stepped (and its gradient freed) "
                    "in the parameter's post-accumulate-grad hook during backward; no optimizer.step() phase")
    ap.add_argument("--gc-reentrant", choices=["on", "off"], default=None,
                    help="with --gc: activation_checkpointing_kwargs={'use_reentrant': True/False} (as Trainer's "
                    "gradient_checkpointing_kwargs); unset = transformers' default (use_reentrant=False)")
    ap.add_argument("--real", action="store_true",
                    help="cross-check: real CPU tensors instead of FakeTensorMode (use --attn eager: the "
                    "emulated flash/efficient SDPA ops have no CPU kernels)")
    ap.add_argument("--out")
    ap.add_argument("--grid")
    ap.add_argument("--dump", help="write a JSON with the loss path's saved tensors, what is alive at the "
                    "end of the forward and at each phase's peak (storages >= 1 MiB)")
    return ap


def main(argv=None):
    a = parser().parse_args(argv)
    if a.grid:
        return run_grid(a.grid, a.out)
    if not a.config:
        parser().error("--config or --grid is required")
    a.packing = a.packing == "on"
    a.padding = a.padding == "on"
    a.trainer_amp = a.trainer_amp == "on"
    a.optimizer_in_bwd = a.optimizer_in_bwd == "on"
    a.gc_reentrant = None if a.gc_reentrant is None else a.gc_reentrant == "on"
    if a.gc_reentrant is not None and not a.gc:
        parser().error("--gc-reentrant needs --gc")
    a.model_name = a.model_name or os.path.splitext(os.path.basename(a.config))[0]
    row = measure(a)
    kernels = row.pop("sdpa_kernels")
    line = json.dumps(row)
    print(line)
    print(f"[trainers] {a.model_name} b{a.batch} s{a.seq} {a.precision} gc={a.gc} {a.attn} loss={a.loss} "
          f"packing={a.packing} padding={a.padding} opt_in_bwd={a.optimizer_in_bwd} "
          f"gc_reentrant={a.gc_reentrant}: peak {row['peak_bytes'] / 2**30:.3f} GiB in "
          f"{row['peak_phase']}, sdpa {kernels}, mask {row['config']['attn_mask']}, {row['time_s']} s",
          file=sys.stderr)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    return 0


def run_grid(grid_path, out):
    import subprocess
    with open(grid_path) as f:
        grid = json.load(f)
    here = os.path.dirname(os.path.abspath(grid_path))
    fails = 0
    for g in grid:
        cfgp = g["config"]
        if not os.path.isabs(cfgp) and not os.path.exists(cfgp):
            cfgp = os.path.join(here, cfgp)
        cmd = [sys.executable, os.path.abspath(__file__), "--config", cfgp, "--model-name", g["model"],
               "--batch", str(g["batch"]), "--seq", str(g["seq"]), "--precision", g["precision"],
               "--attn", g.get("attn", "sdpa"), "--loss", g.get("loss", "hf"),
               "--packing", "on" if g.get("packing") else "off",
               "--padding", "on" if g.get("padding") else "off",
               "--trainer-amp", "off" if g.get("trainer_amp") is False else "on"]
        if g.get("gc"):
            cmd.append("--gc")
        if g.get("optimizer_in_bwd"):
            cmd += ["--optimizer-in-bwd", "on"]
        if g.get("gc_reentrant") is not None:
            cmd += ["--gc-reentrant", "on" if g["gc_reentrant"] else "off"]
        if out:
            cmd += ["--out", out]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            fails += 1
            print(f"[grid] FAILED: {g}", file=sys.stderr)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
