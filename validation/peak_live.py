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
import json
import os
import sys
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dump_saved as D  # noqa: E402
import measure as M  # noqa: E402

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


class Live(TorchDispatchMode):
    def __init__(self, stack, skip):
        super().__init__()
        self.stack, self.skip = stack, skip
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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = func(*args, **(kwargs or {}))
        path = self.stack[-1] if self.stack else ""
        for t in D._tensors(res):
            try:
                st = t.untyped_storage()
            except Exception:
                continue
            key = st._cdata
            if key in self.skip or key in self.alive or st.nbytes() == 0:
                continue
            info = (func.overloadpacket.__name__ + "." + func._overloadname, path, tuple(t.shape),
                    str(t.dtype).replace("torch.", ""), D.rnd(st.nbytes()))
            self.alive[key] = info
            self.refs[key] = weakref.ref(st, lambda _r, k=key: self._gone(k))
            self.total += info[-1]
        if self.total > self.peak:
            self.peak = self.total
            self.peak_set = list(self.alive.values())
        return res


def run(config_path, batch, seq, precision, attn, n_layers, overrides):
    M.install_cuda_emulation()
    with open(config_path) as f:
        raw = json.load(f)
    d = D.small_config(raw, n_layers, overrides)
    tmp = os.path.join("/tmp", f"peak_live_cfg_{os.getpid()}.json")
    with open(tmp, "w") as f:
        json.dump(d, f)
    cfg, arch = M.load_config(tmp, attn)
    os.unlink(tmp)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    amp = precision == "amp_bf16"
    stack = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = M.build_model(cfg, arch, attn, dtype)
        model.train(False)
        for name, mod in model.named_modules():
            def pre(mod, args, name=name):
                stack.append(name)

            def post(mod, args, out):
                stack.pop()
            mod.register_forward_pre_hook(pre)
            mod.register_forward_hook(post)
        ids = torch.randint(0, M.text_vocab(cfg), (batch, seq), dtype=torch.long)
        skip = {p.untyped_storage()._cdata for p in model.parameters()}
        skip |= {b.untyped_storage()._cdata for b in model.buffers()}
        skip.add(ids.untyped_storage()._cdata)

        def fwd():
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else M._nullctx()
            with ctx, torch.no_grad():
                return model(input_ids=ids)

        fwd()  # warm-up, untracked
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
    overrides = {}
    for kv in a.set:
        k, v = kv.split("=", 1)
        overrides[k] = json.loads(v)
    live = run(a.config, a.batch, a.seq, a.precision, a.attn, a.layers, overrides)
    print(f"peak of the no-grad forward beyond parameters, buffers and input: {live.peak} bytes")
    for op, path, shape, dt, n in sorted(live.peak_set, key=lambda x: -x[-1]):
        print(f"{n:>14} {dt:>9} {str(list(shape)):<28} {op:<40} {path}")


if __name__ == "__main__":
    main()
