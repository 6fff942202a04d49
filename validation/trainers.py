#!/usr/bin/env python3
"""Measure one training step whose LOSS is computed the way a trainer computes it.

A recipe of the harness (validation/harness/: FakeTensorMode, MemTracker, the CUDA emulation, the
measured step, the row and its writer); what it varies is the loss path, the batch the trainer's
collator makes and the optimizer's place:

  --loss hf                 model(labels=...) -> transformers' ForCausalLMLoss (= measure.py's step).
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
  python validation/trainers.py --from-row '<a row of core/tests/fixtures/trainers-measured.jsonl>'
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

_HERE = os.path.dirname(os.path.abspath(__file__))
# validation/peft.py would shadow the peft library that transformers.trainer_utils imports
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.append(_HERE)
import harness as H  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402
from torch.distributed._tools import mem_tracker as _mt  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

H.quiet()
LOSSES = ["hf", "trl-nll", "trl-chunked", "torchtune-chunked"]
TRL_CHUNK = 256          # trl.trainer.sft_trainer._CHUNKED_LM_HEAD_CHUNK_SIZE
TT_CHUNKS = 8            # torchtune recipes' num_output_chunks
PAD_FRACTION = 0.10
# config.opt_impl of --optimizer-in-bwd rows
OPT_IN_BWD_IMPL = "foreach, one AdamW per parameter stepped in its post-accumulate-grad hook (torchtune 0.6.1)"


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
    """On top of the harness's CUDA emulation: let the packed-sequence detection and the
    all-ones-mask skip decide as they do on real tensors (the harness's own patches assume
    no packing and no mask)."""
    global _PATCHED
    H.install_cuda_emulation()
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
    prev_ignore = mu._ignore_causal_mask_sdpa  # the harness's version

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
    # harness.install_cuda_emulation() replaces it; read the function from the module's source object
    f = mu.find_packed_sequence_indices
    if getattr(f, "__name__", "") == "<lambda>":
        raise RuntimeError("trainers.py must be imported before harness.install_cuda_emulation() runs")
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
    (torch.autocast('cpu', bf16) + the harness's CUDA lists); convert_outputs_to_fp32 is accelerate's own."""
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
    """The harness's versions + `trainer_versions` (trl, accelerate, torchtune: installed distributions)."""
    from importlib.metadata import version
    v = H.versions()
    tv = {}
    for name in ("trl", "accelerate", "torchtune"):
        try:
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
        inp["labels"] = ids  # the harness's step: labels = input ids, the same tensor
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


class TrainerTracker(H.PhaseTracker):
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
                        "bytes": H.rnd(st.nbytes()), "phase": self.phase, "region": self.region}
            if (self.phase == "fwd" and self.region == "loss") or (self.phase == "bwd" and not self.loss_bwd_done):
                tot = sum(v[_mt._TOTAL_KEY] for v in self._curr_mem_snap.values())
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
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


# ----------------------------------------------------------------------------------------------
# The step
# ----------------------------------------------------------------------------------------------
def enable_checkpointing(model, reentrant):
    """--gc: what transformers' Trainer does with args.activation_checkpointing: model.
    activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None) (gradient_checkpointing_enable
    is its deprecated alias). kwargs None (--gc-reentrant default, = the harness's plain
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
    parameter, {p: AdamW([p]) for p in model.parameters()} (foreach=True, as the harness's AdamW), and
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
    """Returns (tracked input tensors, fwd) where fwd() -> object with .loss, as the harness's step wants."""
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
    amp_ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if (amp and not trainer_amp) else H.nullctx

    if o.loss == "hf":
        def fwd():
            with amp_ctx():
                return H.LossOnly(model(**inputs).loss)
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
            return H.LossOnly(loss)
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
            return H.LossOnly(loss)
        return list(inputs.values()) + extra, fwd
    raise SystemExit(f"unknown loss {o.loss}")


def measure(o):
    install_trainer_patches()
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = H.load_config(o.config, o.attn)
    dtype = torch.bfloat16 if o.precision == "bf16" else torch.float32
    amp = o.precision == "amp_bf16"
    trainer_amp = o.loss.startswith("trl") and o.trainer_amp
    if o.packing and o.padding:
        raise SystemExit("--packing on and --padding on together are not supported (padding-free packing)")
    inputs_real = real_inputs(H.text_vocab(cfg), o.batch, o.seq, o.loss, o.packing, o.padding, o.docs)
    if o.real:
        # cross-check: the same step on real CPU tensors (same tracker and emulation patches)
        fake = types.SimpleNamespace(from_tensor=lambda t: t)
        fake_ctx = H.nullctx()
    else:
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        fake_ctx = fake
    with fake_ctx:
        model = H.build_model(cfg, arch, o.attn, dtype)
        tracked_inputs, fwd = build_step(o, cfg, model, fake, inputs_real, amp)
        if o.optimizer_in_bwd:
            optim_dict, register_opt_hooks = make_optim_in_bwd(model)
            opt_hooks = register_opt_hooks()
            out = fwd()  # warm-up (untracked): the per-parameter steps in backward create the states
            out.loss.backward()
            del out
            opt, opts = None, list(optim_dict.values())
        else:
            opt = H.make_optimizer("adamw", [p for p in model.parameters() if p.requires_grad])
            H.warm_up(fwd, opt, True)  # untracked
            opts = [opt]

        mt = TrainerTracker(H.param_storages(model), dump=bool(o.dump))
        mt.track_external(model, *tracked_inputs)
        mt.track_external(*opts)
        dump = Dump(mt, model, o.optimizer_in_bwd) if o.dump else None
        with mt:
            if o.optimizer_in_bwd:
                # MemTracker tags p.grad as a gradient in its own post-accumulate-grad hook, installed on entry
                # to the first forward: install it now and register the stepping hooks after it (hooks run
                # in registration order; stepping first would leave it p.grad = None). Memory is the same.
                for h in opt_hooks:
                    h.remove()
                mt._track_module_params_and_buffers(model, install_grad_hooks=True)
                opt_hooks = register_opt_hooks()
            step = H.measured_step(
                mt, fwd, opt, True, amp, record_copies=amp or trainer_amp,
                on_phase=dump.on_phase if dump else _next_phase,
                # optimizer in backward: no optimizer.step() phase, every parameter was stepped in backward
                optimizer_step=(lambda: False) if o.optimizer_in_bwd else None,
                fwd_ctx=dump.saved_hooks if dump else None)
        if dump:
            dump.remove_hooks()

    extra = {"loss": o.loss, "packing": bool(o.packing), "padding": bool(o.padding)}
    if o.packing:
        extra["docs_per_row"] = o.docs
    if o.padding:
        extra["pad_fraction"] = PAD_FRACTION
    if o.loss == "trl-chunked":
        extra["chunk_size"] = TRL_CHUNK
        extra["chunks"] = FACTS.n_padded // TRL_CHUNK
    if o.loss == "torchtune-chunked":
        extra["num_output_chunks"] = TT_CHUNKS
        extra["torchtune_loss_source"] = _load_torchtune_loss()[1]
        extra["torchtune_decoder"] = "emulated: transformers model.model + lm_head per h.chunk(8, dim=1)"
    if o.loss.startswith("trl"):
        extra["trainer_amp"] = bool(o.trainer_amp)
    if o.optimizer_in_bwd:
        extra["optimizer_in_bwd"] = True
    if o.gc and o.gc_reentrant is not None:
        extra["gc_reentrant"] = bool(o.gc_reentrant)
    extra["n_valid_tokens"] = FACTS.n_valid
    extra["attn_mask"] = _mask_kind(o, cfg)
    config = H.base_config(o.model_name, o.batch, o.seq, o.precision, "adamw", o.attn, o.gc,
                           OPT_IN_BWD_IMPL if o.optimizer_in_bwd else "foreach",
                           mode="real-cpu" if o.real else "fake", **extra)
    row = H.step_row(config, versions(), sum(p.numel() for p in model.parameters()), step, t0)
    row["sdpa_kernels"] = dict(H.SDPA_LOG)
    H.SDPA_LOG.clear()
    if dump:
        dump.write(o.dump, row, step)
    return row


def _next_phase(name, meter, step):
    """The tracker's phase label (what --dump records each tensor with) after phase `name`."""
    meter.region = "model"
    meter.phase = {"fwd": "bwd", "bwd": "opt"}.get(name, meter.phase)


class Dump:
    """--dump: the loss path's saved tensors (saved-tensor hooks on the forward), what is alive at the end of
    the forward, at each phase's peak and at the peak of the loss path's backward (until the gradient of the
    backbone output is complete), and the tracker's timeline of the loss path."""

    def __init__(self, mt, model, opt_in_bwd):
        self.mt = mt
        self.opt_in_bwd = opt_in_bwd
        self.saved = []
        self.peak_lists = {}
        self.loss_bwd_peak = {}
        self.alive_end_fwd = None
        backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.hooks = [backbone.register_forward_pre_hook(lambda m, a: setattr(mt, "region", "model")),
                      backbone.register_forward_hook(self.after_backbone)]

    def after_backbone(self, m, a, r):
        mt = self.mt
        mt.region = "loss"
        h = r[0] if isinstance(r, (tuple, list)) else getattr(r, "last_hidden_state", None)
        if isinstance(h, torch.Tensor) and h.requires_grad and mt.phase == "fwd":
            def on_grad(g):
                # the gradient w.r.t. the backbone output is complete: the loss path's backward
                # is done; keep its peak and what was alive then
                if mt.phase == "bwd" and "loss_bwd" not in self.peak_lists:
                    mt.loss_bwd_done = True
                    self.peak_lists["loss_bwd"] = mt.peak_list
                    self.loss_bwd_peak.update(mt.peak())
                    self.peak_lists["loss_bwd_end_alive"] = mt.alive()
            h.register_hook(on_grad)

    def pack(self, t):
        mt = self.mt
        if mt.region == "loss":
            try:
                st = t.untyped_storage()
                info = mt.created.get(st)
                self.saved.append({"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                                   "storage_bytes": H.rnd(st.nbytes()),
                                   "grad_fn": type(t.grad_fn).__name__ if t.grad_fn is not None else None,
                                   "param": st._cdata in mt._param_cdata,
                                   "created_by": info["op"] if info else None})
            except Exception:
                pass
        return t

    def saved_hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def on_phase(self, name, meter, step):
        # no optimizer.step() phase with the optimizer in backward
        self.peak_lists[name] = None if name == "opt" and self.opt_in_bwd else meter.peak_list
        if name == "fwd":
            self.alive_end_fwd = meter.alive()
        _next_phase(name, meter, step)

    def remove_hooks(self):
        for h in self.hooks:
            h.remove()

    def write(self, path, row, step):
        dump = {"row_config": row["config"], "saved_in_loss_region": _dedup_saved(self.saved),
                "alive_end_fwd": self.alive_end_fwd, "at_peak": self.peak_lists,
                "phase_peaks": row["phase_peaks"], "loss_bwd_peak": self.loss_bwd_peak,
                "timeline_loss_path": self.mt.timeline,
                "start": step.start, "end_fwd": step.end_fwd,
                "after_bwd": step.after_bwd}
        with open(path, "w") as f:
            json.dump(dump, f, indent=1)


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
    H.add_model_args(ap, precision="bf16")
    ap.add_argument("--optimizer", choices=["adamw"], default="adamw")
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
    H.add_run_args(ap)
    ap.add_argument("--dump", help="write a JSON with the loss path's saved tensors, what is alive at the "
                    "end of the forward and at each phase's peak (storages >= 1 MiB)")
    return ap


GRID_FLAGS = {"model": "--model-name", "batch": "--batch", "seq": "--seq", "precision": "--precision",
              "attn": "--attn", "gc": "--gc", "loss": "--loss", "docs_per_row": "--docs",
              "packing": "--packing", "padding": "--padding", "trainer_amp": "--trainer-amp",
              "optimizer_in_bwd": "--optimizer-in-bwd", "gc_reentrant": "--gc-reentrant"}


def argv_of(entry):
    """The command line (without --config) of a grid entry or a row's config (`mode` real-cpu: --real)."""
    return H.flags(entry, GRID_FLAGS, on_off=("packing", "padding", "trainer_amp", "optimizer_in_bwd",
                                              "gc_reentrant")) + \
        (["--real"] if entry.get("real") or entry.get("mode") == "real-cpu" else [])


def main(argv=None):
    ap = parser()
    a = ap.parse_args(argv)
    done = H.dispatch(a, __file__, argv_of, main)
    if done is not None:
        return done
    if not a.config:
        ap.error("--config, --grid or --from-row is required")
    a.packing = a.packing == "on"
    a.padding = a.padding == "on"
    a.trainer_amp = a.trainer_amp == "on"
    a.optimizer_in_bwd = a.optimizer_in_bwd == "on"
    a.gc_reentrant = None if a.gc_reentrant is None else a.gc_reentrant == "on"
    if a.gc_reentrant is not None and not a.gc:
        ap.error("--gc-reentrant needs --gc")
    a.model_name = H.model_name(a)
    row = measure(a)
    kernels = row.pop("sdpa_kernels")
    return H.emit(row, a.out, f"[trainers] {a.model_name} b{a.batch} s{a.seq} {a.precision} gc={a.gc} {a.attn} "
                  f"loss={a.loss} packing={a.packing} padding={a.padding} opt_in_bwd={a.optimizer_in_bwd} "
                  f"gc_reentrant={a.gc_reentrant}: peak {H.gib(row['peak_bytes'])} in {row['peak_phase']}, "
                  f"sdpa {kernels}, mask {row['config']['attn_mask']}, {row['time_s']} s")


if __name__ == "__main__":
    sys.exit(main())
