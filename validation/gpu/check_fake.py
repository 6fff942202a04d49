#!/usr/bin/env python3
"""Does the plain-PyTorch model (plain_llama.py) allocate what transformers' model allocates?

Runs measure.py's fake-mode step (FakeTensorMode, MemTracker, CUDA emulation: 512-byte rounding, SDPA kernel
choice, CUDA autocast lists) once with transformers' LlamaForCausalLM / Qwen3ForCausalLM (measure.measure)
and once with plain_llama.CausalLM built from the same config.json, and compares the rows field by field.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import measure as M  # noqa: E402
import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import plain_llama  # noqa: E402

FIELDS = ("n_params", "param_bytes", "buffer_bytes", "input_bytes", "grad_bytes", "opt_state_bytes", "peak_bytes",
          "peak_phase", "saved_act_bytes", "amp_weight_copy_bytes", "phase_peak_bytes", "start_bytes", "end_bytes",
          "after_bwd_bytes", "at_peak")


def measure_plain(cfg_dict, batch, seq, precision, gc, opt_impl="foreach"):
    """measure.measure's tracked step with plain_llama.CausalLM in place of the transformers model."""
    M.install_cuda_emulation()
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    amp = precision == "amp_bf16"
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = plain_llama.CausalLM(cfg_dict, dtype=dtype)
        if gc:
            model.gradient_checkpointing_enable()
        model.train(True)
        ids = torch.randint(0, model.dims["vocab"], (batch, seq), dtype=torch.long)
        params = [p for p in model.parameters() if p.requires_grad]
        kw = {"fused": True} if opt_impl == "fused" else {"foreach": True}
        opt = torch.optim.AdamW(params, lr=1e-4, **kw)

        def fwd():
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else M._nullctx()
            with ctx:
                return model(ids, ids)

        loss = fwd()
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

        mt = M.PhaseTracker({p.untyped_storage()._cdata for p in model.parameters()})
        mt.track_external(model, ids)
        mt.track_external(opt)
        pk = {}
        with mt:
            start = mt.snap()
            mt.reset_peak()
            mt.record_copies = amp
            loss = fwd()
            mt.record_copies = False
            end_fwd = mt.snap()
            amp_copy = mt.alive_copy_bytes() if amp else 0
            pk["fwd"] = mt.peak()
            mt.reset_peak()
            loss.backward()
            del loss
            pk["bwd"] = mt.peak()
            after_bwd = mt.snap()
            mt.reset_peak()
            opt.step()
            opt.zero_grad(set_to_none=True)
            pk["opt"] = mt.peak()
            end = mt.snap()
    peak_phase, p, _, at_peak = M.peak_summary(pk, start["optstate"])
    return {
        "n_params": sum(x.numel() for x in model.parameters()),
        "param_bytes": start["parameter"], "buffer_bytes": start["buffer"], "input_bytes": start["other"],
        "grad_bytes": after_bwd["gradient"], "opt_state_bytes": start["optstate"],
        "peak_bytes": p["total"], "peak_phase": peak_phase, "at_peak": at_peak,
        "saved_act_bytes": end_fwd["total"] - start["total"], "amp_weight_copy_bytes": amp_copy,
        "phase_peak_bytes": {k: pk[k]["total"] for k in ("fwd", "bwd", "opt")},
        "start_bytes": start["total"], "end_bytes": end["total"], "after_bwd_bytes": after_bwd["total"],
    }


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
                pl = measure_plain(cfg, a.batch, a.seq, prec, gc)
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
