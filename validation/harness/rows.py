"""One row format, one writer. A row is one JSON line: `config` (what was measured and how),
`versions`, the model's state, the peak with its phase and what is alive then, per-phase peaks
and the boundaries' readings; a recipe adds its own keys after these (README, "Rows")."""
from __future__ import annotations

import json
import sys
import time

from .env import ROUND_BYTES
from .step import peak_summary, storage_bytes

PHASES = ("fwd", "bwd", "opt")
CUDA_TRACKER = "torch.cuda.max_memory_allocated"  # config.tracker of a row measured on a real GPU


def base_config(model, batch, seq, precision, optimizer, attn, gc, opt_impl="foreach", mode="fake",
                **extra):
    """The `config` keys every row starts with, in the fixtures' order; `extra` follows them."""
    return {
        "model": model, "batch": batch, "seq": seq, "image": 224,
        "precision": precision, "optimizer": optimizer, "attn": attn, "gc": bool(gc),
        "mode": mode, "tracker": "memtracker", "emulate_cuda": True,
        "round_bytes": ROUND_BYTES, "opt_impl": opt_impl, "warmup_steps": 1,
        **extra,
    }


def step_row(config, versions, n_params, step, t0, after_params=None, after_opt_state=None,
             phases=PHASES, after=None):
    """The row of a step measured under a harness tracker: `config`, `versions`, then the
    figures of `step` (a `step.StepMemory`). `after_params` / `after_opt_state` are dicts of
    recipe keys placed after `n_params` / `opt_state_bytes` (the fixtures' key order); `after`
    places more of them anywhere: {row key: dict of recipe keys placed right after it}. A step
    without a forward phase of its own (a pipeline schedule's) has no `saved_act_bytes` and
    `amp_weight_copy_bytes`."""
    start, after_bwd = step.start, step.after_bwd
    state = (start["parameter"], start["buffer"], start["other"],
             after_bwd["gradient"] if after_bwd else 0, start["optstate"])
    peak_phase, pk, opt_step_temp, at_peak = peak_summary(step.phase_peaks, start["optstate"])
    pp = step.phase_peaks
    peak = {
        "peak_bytes": pk["total"],
        "peak_phase": peak_phase,
        "at_peak": at_peak,
        "act_temp_at_peak": pk["activation"] + pk["temp"] + opt_step_temp,
        **({"saved_act_bytes": step.saved_act_bytes, "amp_weight_copy_bytes": step.amp_copy}
           if step.end_fwd is not None else {}),
        "phase_peak_bytes": {k: pp[k]["total"] for k in phases if k in pp},
        "phase_peaks": {k: pp[k] for k in phases if k in pp},
    }
    return _row(config, versions, n_params, state, peak, step, t0,
                {**(after or {}), "n_params": after_params or {}, "opt_state_bytes": after_opt_state or {}})


def cuda_row(config, versions, n_params, step, t0, model, inputs, opt, device=None, after=None):
    """The row of a step measured on a real GPU (`step.CudaMeter`): the allocator's totals per
    phase and at the boundaries; parameter, buffer, gradient (`step.extra["grad_bytes"]`, which
    an `on_phase` sums after backward) and optimizer-state bytes summed from the tensors (those
    on `device` alone when given: see `storage_bytes`), `inputs` the step's input tensors; no
    split by category (null). `config` gets the GPU's tracker; its `mode` is the caller's.
    `after`: as step_row's."""
    config.update(tracker=CUDA_TRACKER, emulate_cuda=False)
    opt_state = [v for s in (opt.state.values() if opt else []) for v in s.values()]
    state = (storage_bytes(model.parameters(), device), storage_bytes(model.buffers(), device),
             storage_bytes(inputs, device), step.extra.get("grad_bytes", 0), storage_bytes(opt_state, device))
    pp = {k: v["total"] for k, v in step.phase_peaks.items()}
    peak_phase = max(pp, key=pp.get)
    peak = {
        "peak_bytes": pp[peak_phase],
        "peak_phase": peak_phase,
        "at_peak": None,
        "act_temp_at_peak": None,
        "saved_act_bytes": step.saved_act_bytes,
        "amp_weight_copy_bytes": None,
        "phase_peak_bytes": {k: pp[k] for k in PHASES if k in pp},
        "phase_peaks": None,
    }
    return _row(config, versions, n_params, state, peak, step, t0, after or {})


def _row(config, versions, n_params, state, peak, step, t0, after):
    """The frame of every row: `config`, `versions`, the model `state` (parameter, buffer, input,
    gradient and optimizer-state bytes), the `peak` keys, the totals at the step's boundaries;
    `after`: {row key: recipe keys placed right after it}."""
    param_bytes, buffer_bytes, input_bytes, grad_bytes, opt_state_bytes = state
    row = {
        "config": config,
        "versions": versions,
        "n_params": n_params,
        "param_bytes": param_bytes,
        "buffer_bytes": buffer_bytes,
        "input_bytes": input_bytes,
        "grad_bytes": grad_bytes,
        "opt_state_bytes": opt_state_bytes,
        "model_state_bytes": param_bytes + buffer_bytes + grad_bytes + opt_state_bytes,
        **peak,
        "start_bytes": step.start["total"],
        "end_bytes": step.end["total"],
        "after_bwd_bytes": step.after_bwd["total"] if step.after_bwd else None,
        "time_s": round(time.time() - t0, 2),
    }
    return place_after(row, after) if any(after.values()) else row


def place_after(row, after):
    """`row` with, right after each key of `after`, the keys of `after[key]`."""
    out = {}
    for k, v in row.items():
        out[k] = v
        out.update(after.get(k) or {})
    return out


def gib(n):
    return f"{n / 2**30:.3f} GiB"


def emit(row, out=None, summary=None):
    """The writer: the row as one JSON line on stdout (and appended to `out`), `summary` on
    stderr."""
    line = json.dumps(row)
    print(line)
    if summary:
        print(summary, file=sys.stderr)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
    return 0
