"""The measured step, one for every recipe and both devices: an untracked warm-up step, then
forward (+ loss, keeping only the loss), backward, `optimizer.step()`, `zero_grad` under a meter
whose peak is reset at each phase boundary; with `micro_batches` > 1, forward and backward run
that many times before the optimizer step, the gradients accumulating.

A meter is a harness tracker (fake mode, per category) or `CudaMeter` (a real GPU, totals only):
both answer `snap()`, `reset_peak()` and `peak()`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .env import ROUND_BYTES, nullctx
from .model import apply_gc_policy, make_optimizer, mlm_or_clm_labels, text_vocab


class LossOnly:
    """What a training loop keeps of the model's output: the loss (the logits die with it)."""

    def __init__(self, loss):
        self.loss = loss


def prepare_step(cfg, arch, model, batch, seq, optimizer, amp, gc, autocast_device, device=None,
                 opt_impl="foreach", gc_policy=None, weight_decay=None, runner=None):
    """The step's setup shared by the fake (CPU-emulated) and the real CUDA paths: checkpointing,
    train/eval mode, the input ids, the optimizer and the forward (with loss when training).
    `opt_impl` (fused / foreach / forloop), `gc_policy` (None or "full" = every layer, as before;
    "every:N", "ops": see apply_gc_policy) and `weight_decay` (None = torch's default) are the
    options of OPTIMIZERS.md; their defaults give the step measured before they existed.
    `runner` is what the forward calls (default: `model` itself; `torch.compile(model)`, say)."""
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
    call = model if runner is None else runner

    def fwd():
        ctx = torch.autocast(autocast_device, dtype=torch.bfloat16) if amp else nullctx()
        with ctx:
            if train:
                return call(input_ids=ids, labels=labels)
            return call(input_ids=ids)

    return ids, labels, opt, fwd


def warm_up(fwd, opt, train, step_ctx=None, train_ctx=None, bwd_ctx=None, schedule=None):
    """One untracked step, so that lazily created state (optimizer moments, autocast's
    caches, CUDA kernels) exists before measuring. `step_ctx` wraps `opt.step()`;
    `train_ctx`, `bwd_ctx` and `schedule` are `measured_step`'s."""
    if schedule is not None:
        schedule()
    if train:
        if schedule is None:
            with (train_ctx() if train_ctx else nullctx()):
                out = fwd()
                with (bwd_ctx() if bwd_ctx else nullctx()):
                    out.loss.backward()
                del out
        with step_ctx or nullctx():
            opt.step()
        opt.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            out = fwd()
            del out


@dataclass
class StepMemory:
    """The meter's readings of one measured step. `fwd_start` is the reading before the last
    micro-batch's forward (== `start` without accumulation), so that the activations saved by
    one forward are `end_fwd - fwd_start` whatever the gradients alive."""
    start: dict
    fwd_start: dict
    end_fwd: dict
    amp_copy: int | None
    phase_peaks: dict
    after_bwd: dict | None
    end: dict
    extra: dict = field(default_factory=dict)

    @property
    def saved_act_bytes(self):
        return self.end_fwd["total"] - self.fwd_start["total"]


def _higher(a, b):
    return b if a is None or b["total"] > a["total"] else a


def measured_step(meter, fwd, opt, train=True, amp=False, micro_batches=1, record_copies=None,
                  on_phase=None, optimizer_step=None, fwd_ctx=None, bwd_ctx=None, train_ctx=None,
                  schedule=None):
    """One step of `fwd` under `meter` (already tracking the model, inputs and optimizer):
    forward (+ loss), backward, `opt.step()`, `zero_grad(set_to_none=True)`, the peak reset at
    each phase boundary.

    - `micro_batches`: forward + backward that many times, then one optimizer step; a phase's
      peak is the highest of its micro-batches (from the second on, the accumulated gradients
      are alive through forward and backward). The loss is not divided: transformers' causal
      LMs normalise by `num_items_in_batch` inside the loss when a trainer accumulates.
    - `record_copies`: remember parameters' `_to_copy` results during the forward (default:
      `amp`); `amp_copy` is their bytes still alive at its end.
    - `on_phase(name, meter, step)`: called after each phase's peak is read (for a recipe's own
      per-phase figures, into `step.extra`); names are "fwd", "bwd", "opt" ("pipe" with `schedule`).
    - `optimizer_step()`: replaces `opt.step(); opt.zero_grad(set_to_none=True)`; return False
      for "no optimizer phase" (torchtune's optimizer in backward), whose peaks are then 0.
    - `fwd_ctx()`: a context manager around each forward (saved-tensor hooks of a dump).
    - `bwd_ctx()`: a context manager around each backward (tensor parallelism's `loss_parallel`).
    - `train_ctx()`: a context manager around each micro-batch's forward and backward together
      (context parallelism: the inputs sharded along the sequence, ring attention); the
      backward's peak and `after_bwd` are read once it has closed.
    - `schedule()`: runs the forward and backward of every micro-batch itself (a pipeline
      schedule's `step`; `fwd` is not called): one phase, "pipe", in place of "fwd" and "bwd";
      `fwd_start`, `end_fwd` and `amp_copy` stay None."""
    record = amp if record_copies is None else record_copies
    phase_peaks = {}
    step = StepMemory(None, None, None, None, phase_peaks, None, None)
    step.start = meter.snap()
    fwd_peak = bwd_peak = None
    out = None
    rounds = micro_batches if train else 1
    if schedule is not None:
        meter.reset_peak()
        schedule()
        phase_peaks["pipe"] = meter.peak()
        step.after_bwd = meter.snap()
        if on_phase:
            on_phase("pipe", meter, step)
        rounds = 0  # the schedule ran every micro-batch's forward and backward
    for i in range(rounds):
        if i:
            # MemTracker refuses a root module's second forward unless its per-module
            # statistics (which no row uses) are cleared; the global figures are unaffected.
            getattr(meter, "reset_mod_stats", lambda: None)()
        step.fwd_start = meter.snap() if i else step.start
        meter.reset_peak()
        with (train_ctx() if train_ctx else nullctx()):
            meter.record_copies = record
            with (fwd_ctx() if fwd_ctx else nullctx()):
                if train:
                    out = LossOnly(fwd().loss)
                else:
                    with torch.no_grad():
                        out = fwd()
            meter.record_copies = False
            step.end_fwd = meter.snap()
            step.amp_copy = meter.alive_copy_bytes() if record else 0
            fwd_peak = _higher(fwd_peak, meter.peak())
            phase_peaks["fwd"] = fwd_peak
            if on_phase:
                on_phase("fwd", meter, step)
            if not train:
                break
            loss = out.loss
            meter.reset_peak()
            with (bwd_ctx() if bwd_ctx else nullctx()):
                loss.backward()
            del loss, out
        bwd_peak = _higher(bwd_peak, meter.peak())
        phase_peaks["bwd"] = bwd_peak
        step.after_bwd = meter.snap()
        if on_phase:
            on_phase("bwd", meter, step)
    if train:
        meter.reset_peak()
        if optimizer_step is None:
            opt.step()
            opt.zero_grad(set_to_none=True)
            phase_peaks["opt"] = meter.peak()
        elif optimizer_step() is False:
            phase_peaks["opt"] = {k: 0 for k in phase_peaks["bwd"]}
        else:
            phase_peaks["opt"] = meter.peak()
        if on_phase:
            on_phase("opt", meter, step)
    else:
        del out
    step.end = meter.snap()
    return step


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


class CudaMeter:
    """The meter of a real GPU: `torch.cuda.memory_allocated()` as the snapshot and
    `max_memory_allocated()` since the last reset as the peak. The allocator cannot split them
    by category, so readings hold "total" alone and autocast's copies are not counted (None)."""
    record_copies = False

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def snap(self):
        torch.cuda.synchronize()
        return {"total": torch.cuda.memory_allocated()}

    def reset_peak(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def peak(self):
        torch.cuda.synchronize()
        return {"total": torch.cuda.max_memory_allocated()}

    def alive_copy_bytes(self):
        return None


def storage_bytes(tensors, device=None):
    """Bytes of the distinct storages of `tensors` (None and non-tensors skipped), each rounded
    up to the allocator's block: what a real GPU holds for them. With `device` (a device type,
    "cuda"), only the tensors there (AdamW's foreach `step` counters stay on the CPU)."""
    seen, tot = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        if device is not None and t.device.type != device:
            continue
        st = t.untyped_storage()
        key = st.data_ptr() if t.is_cuda else st._cdata
        if key in seen:
            continue
        seen.add(key)
        tot += int(math.ceil(st.nbytes() / ROUND_BYTES) * ROUND_BYTES)
    return tot
