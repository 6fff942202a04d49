#!/usr/bin/env python3
"""Does the plain-PyTorch model (plain_llama.py) allocate what transformers' model allocates?

Runs measure.py's fake-mode step (the harness's: FakeTensorMode, MemTracker, CUDA emulation: 512-byte
rounding, SDPA kernel choice, CUDA autocast lists) once with transformers' LlamaForCausalLM /
Qwen3ForCausalLM (measure.measure) and once with plain_llama.CausalLM built from the same config.json
(measure.measure with the model swapped, `adapt_model`), and compares the rows field by field.
A CPU check with the validation venv (transformers needed); not part of the GPU run.

  OMP_NUM_THREADS=1 validation/.venv/bin/python validation/gpu/check_fake.py [--seq 256] [--layers 2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import harness as H  # noqa: E402
import measure as M  # noqa: E402
import torch  # noqa: E402

FIELDS = ("n_params", "param_bytes", "buffer_bytes", "input_bytes", "grad_bytes", "opt_state_bytes", "peak_bytes",
          "peak_phase", "saved_act_bytes", "amp_weight_copy_bytes", "phase_peak_bytes", "start_bytes", "end_bytes",
          "after_bwd_bytes", "at_peak")


class AsTransformers(torch.nn.Module):
    """plain_llama.CausalLM behind what the harness's step calls of a transformers model:
    `config.use_cache`, `gradient_checkpointing_enable()` and `model(input_ids=, labels=).loss`."""

    def __init__(self, plain):
        super().__init__()
        self.plain = plain
        self.config = SimpleNamespace(use_cache=False)

    def gradient_checkpointing_enable(self):
        self.plain.gradient_checkpointing_enable()

    def forward(self, input_ids, labels):
        return H.LossOnly(self.plain(input_ids, labels))


def measure_plain(cfg_path, cfg_dict, name, batch, seq, precision, gc):
    """measure.measure's row with plain_llama.CausalLM (in the transformers model's dtype) in place of
    the transformers model."""
    return M.measure(cfg_path, name, batch, seq, precision, "adamw", "sdpa", gc,
                     adapt_model=lambda hf: AsTransformers(H.build_plain_model(cfg_dict, hf.dtype)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=["llama-1b", "qwen3-0.6b"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2, help="cut the model to this many layers (0: all)")
    ap.add_argument("--precisions", nargs="*", default=["bf16", "amp_bf16"])
    ap.add_argument("--gc", nargs="*", default=["off", "on"])
    a = ap.parse_args(argv)
    fails = 0
    for name in a.models:
        with open(os.path.join(HERE, "models", name + ".json")) as f:
            cfg = json.load(f)
        if a.layers:
            cfg["num_hidden_layers"] = a.layers
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as tf:
            json.dump(cfg, tf)
        for prec in a.precisions:
            for g in a.gc:
                gc = g == "on"
                t0 = time.time()
                hf = M.measure(tf.name, name, a.batch, a.seq, prec, "adamw", "sdpa", gc)
                pl = measure_plain(tf.name, cfg, name, a.batch, a.seq, prec, gc)
                diff = {k: (hf[k], pl[k]) for k in FIELDS if hf[k] != pl[k]}
                tag = f"{name} ({cfg['num_hidden_layers']} layers) b{a.batch} s{a.seq} {prec} gc={gc}"
                if diff:
                    fails += 1
                    print(f"[check_fake] DIFFERENT {tag}: " + "; ".join(f"{k}: hf {v[0]} plain {v[1]}"
                                                                        for k, v in diff.items()))
                else:
                    print(f"[check_fake] identical {tag}: peak {pl['peak_bytes']:,} B ({pl['peak_phase']}), "
                          f"saved {pl['saved_act_bytes']:,} B, every field equal ({time.time() - t0:.0f} s)")
        os.unlink(tf.name)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
