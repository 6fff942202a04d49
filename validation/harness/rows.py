"""One row format, one writer. A row is one JSON line: `config` (what was measured and how),
`versions`, the model's state, the peak with its phase and what is alive then, per-phase peaks
and the boundaries' readings; a recipe adds its own keys after these (README, "Rows")."""
from __future__ import annotations

import json
import sys
import time

from .env import ROUND_BYTES
from .step import peak_summary

PHASES = ("fwd", "bwd", "opt")


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
    ({row key: dict of recipe keys}) places recipe keys after any other key of the row."""
    start, after_bwd = step.start, step.after_bwd
    param_bytes, buffer_bytes, input_bytes = start["parameter"], start["buffer"], start["other"]
    opt_state_bytes = start["optstate"]
    grad_bytes = after_bwd["gradient"] if after_bwd else 0
    peak_phase, pk, opt_step_temp, at_peak = peak_summary(step.phase_peaks, opt_state_bytes)
    pp = step.phase_peaks
    row = {
        "config": config,
        "versions": versions,
        "n_params": n_params,
        **(after_params or {}),
        "param_bytes": param_bytes,
        "buffer_bytes": buffer_bytes,
        "input_bytes": input_bytes,
        "grad_bytes": grad_bytes,
        "opt_state_bytes": opt_state_bytes,
        **(after_opt_state or {}),
        "model_state_bytes": param_bytes + buffer_bytes + grad_bytes + opt_state_bytes,
        "peak_bytes": pk["total"],
        "peak_phase": peak_phase,
        "at_peak": at_peak,
        "act_temp_at_peak": pk["activation"] + pk["temp"] + opt_step_temp,
        "saved_act_bytes": step.saved_act_bytes,
        "amp_weight_copy_bytes": step.amp_copy,
        "phase_peak_bytes": {k: pp[k]["total"] for k in phases if k in pp},
        "phase_peaks": {k: pp[k] for k in phases if k in pp},
        "start_bytes": start["total"],
        "end_bytes": step.end["total"],
        "after_bwd_bytes": after_bwd["total"] if after_bwd else None,
        "time_s": round(time.time() - t0, 2),
    }
    if after:
        placed = {}
        for k, v in row.items():
            placed[k] = v
            placed.update(after.get(k, {}))
        row = placed
    return row


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
