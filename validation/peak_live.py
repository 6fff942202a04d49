#!/usr/bin/env python3
"""What is alive at the peak of a no-grad forward (inference), tensor by tensor.

Runs the same emulated forward as `measure.py --optimizer none` (FakeTensorMode, the CUDA
emulation patches, autocast on CPU with CUDA's lists) on a copy of the config with `--layers`
layers (as `dump_saved.py` cuts it), tracks every storage an op creates (512-byte rounding) and
lists the storages alive at the moment the total is highest, parameters and the input ids left
out: the op and module that created each, its shape, dtype and bytes.

  OMP_NUM_THREADS=1 validation/.venv/bin/python validation/peak_live.py \
      --config validation/configs/gpt-oss-20b.json --layers 2 --batch 1 --seq 4096 \
      --precision bf16 --attn eager [--set sliding_window=128]
"""
from __future__ import annotations

import argparse
import os
import sys
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dump_saved as D  # noqa: E402
import harness as H  # noqa: E402

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


class Live(D.OpOutputs):
    """Every storage an op creates, alive until it is freed (parameters, buffers and the input in
    `skip` left out), and the set alive when their total is highest."""

    def __init__(self, stack, skip):
        super().__init__(stack)
        self.skip = skip
        self.alive = {}  # id -> info
        self.refs = {}
        self.total = 0
        self.peak = 0
        self.peak_set = []

    def _gone(self, key):
        info = self.alive.pop(key, None)
        if info is not None:
            self.total -= info[-1]
        self.refs.pop(key, None)

    def on_output(self, t, st, op, path):
        key = st._cdata
        if key in self.skip or key in self.alive or st.nbytes() == 0:
            return
        info = (op, path, tuple(t.shape), str(t.dtype).replace("torch.", ""), H.rnd(st.nbytes()))
        self.alive[key] = info
        self.refs[key] = weakref.ref(st, lambda _r, k=key: self._gone(k))
        self.total += info[-1]

    def after_op(self):
        if self.total > self.peak:
            self.peak = self.total
            self.peak_set = list(self.alive.values())


def run(config_path, batch, seq, precision, attn, n_layers, overrides):
    H.install_cuda_emulation()
    _, cfg, arch = D.load_small(config_path, n_layers, overrides, attn)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    amp = precision == "amp_bf16"
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = H.build_model(cfg, arch, attn, dtype)
        model.train(False)
        stack = D.module_stack(model)
        ids = torch.randint(0, H.text_vocab(cfg), (batch, seq), dtype=torch.long)
        skip = H.param_storages(model)
        skip |= {b.untyped_storage()._cdata for b in model.buffers()}
        skip.add(ids.untyped_storage()._cdata)

        def fwd():
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else H.nullctx()
            with ctx, torch.no_grad():
                return model(input_ids=ids)

        H.warm_up(fwd, None, False)  # untracked
        live = Live(stack, skip)
        with live:
            out = fwd()
            del out
    return live


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--precision", default="bf16", choices=["fp32", "amp_bf16", "bf16"])
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--set", action="append", default=[], help="key=json value override")
    a = ap.parse_args(argv)
    live = run(a.config, a.batch, a.seq, a.precision, a.attn, a.layers, D.overrides(a.set))
    print(f"peak of the no-grad forward beyond parameters, buffers and input: {live.peak} bytes")
    for op, path, shape, dt, n in sorted(live.peak_set, key=lambda x: -x[-1]):
        print(f"{n:>14} {dt:>9} {str(list(shape)):<28} {op:<40} {path}")


if __name__ == "__main__":
    main()
