#!/usr/bin/env python3
"""torchao float8 training (`torchao.float8.convert_to_float8_training`) measured with the harness:
what the float8 linears allocate, tensor by tensor, and a training step's peak with them.

Two modes:
  --linear: one nn.Linear(in, out) on T tokens (bf16 input and weight), forward + backward (with a
      preallocated grad_output) under a tracker that lists every tensor allocated (op, shape,
      dtype, bytes, phase born, phase freed, saved for backward or not), for bf16 and for the
      float8 recipes; the peak of each phase from the harness's PhaseTracker.
  (default) a model step: measure.py's step (harness: FakeTensorMode, CUDA emulation, AdamW foreach,
      one warm-up step) with every nn.Linear of the decoder layers converted (torchtitan's
      float8 converter: the head `lm_head` excluded); one row in measure.py's format + `query`.
FSDP2 with float8 (and its float8 all-gather): distributed.py --float8 ... --float8-all-gather 1.

`_scaled_mm` does run under FakeTensorMode on fake CPU tensors (its meta kernel only checks shapes /
dtypes / scale shapes); the ops Float8TrainingTensor's __torch_dispatch__ runs internally
(torchao/float8/float8_ops.py: preprocess_addmm's contiguous copies, the scales' reciprocals, the
rowwise post-scale) are not seen by a dispatch mode (a mode is popped while it handles an op), so
`install_inner_tracking` pushes the tracker again around that __torch_dispatch__.

Usage:
  python validation/float8.py --linear --in 4096 --out 14336 --tokens 8192 --recipe tensorwise
  python validation/float8.py --config validation/configs/llama-1b.json --model-name llama-1b \
      --preset llama3.2-1b --batch 2 --seq 2048 --float8 tensorwise [--gc] [--out rows.jsonl]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import weakref

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.append(_HERE)
import harness as H  # noqa: E402

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode, _push_mode  # noqa: E402

RECIPES = ("tensorwise", "rowwise")


# ----------------------------------------------------------------------------------------------
# torchao
# ----------------------------------------------------------------------------------------------
def float8_config(recipe, all_gather=False):
    from torchao.float8 import Float8LinearConfig
    if recipe == "tensorwise":
        return Float8LinearConfig(enable_fsdp_float8_all_gather=bool(all_gather))
    if all_gather:
        raise SystemExit("float8 all-gather needs tensorwise scaling (torchao: Float8LinearConfig "
                         "asserts it for rowwise)")
    return Float8LinearConfig.from_recipe_name(recipe)


def convert(model, recipe, all_gather=False, exclude=("lm_head", "output")):
    """torchtitan's Float8LinearConverter: every nn.Linear but the head (filter_fqns=["output"];
    HF's head is `lm_head`)."""
    from torchao.float8 import convert_to_float8_training

    def fn(mod, fqn):
        return isinstance(mod, torch.nn.Linear) and not any(fqn == e or fqn.endswith("." + e) for e in exclude)
    patch_flatten_for_fake()
    convert_to_float8_training(model, config=float8_config(recipe, all_gather), module_filter_fn=fn)
    return model


INNER = []  # the tracker to push again inside Float8TrainingTensor.__torch_dispatch__


def install_inner_tracking():
    """Float8TrainingTensor.__torch_dispatch__ runs its ops (float8_ops.py: preprocess_addmm's
    `.contiguous()` copies, `addmm_float8_unwrapped`'s reciprocals and `_scaled_mm`) after the
    tracker (a TorchDispatchMode) has been popped for the op it is handling: push it again there so
    that those allocations are counted (their results are tracked once: by storage)."""
    from torchao.float8.float8_training_tensor import Float8TrainingTensor
    if getattr(Float8TrainingTensor, "_inner_tracking", False):
        return
    orig = Float8TrainingTensor.__dict__["__torch_dispatch__"].__func__

    def disp(cls, func, types, args=(), kwargs=None):
        m = INNER[-1] if INNER else None
        if m is not None and m not in _get_current_dispatch_mode_stack():
            _push_mode(m)
            try:
                return orig(cls, func, types, args, kwargs)
            finally:
                _pop_mode()
        return orig(cls, func, types, args, kwargs)
    Float8TrainingTensor.__torch_dispatch__ = classmethod(disp)
    Float8TrainingTensor._inner_tracking = True


def patch_flatten_for_fake():
    """torchao 0.18 fsdp_utils.py WeightWithDynamicFloat8CastTensor.__tensor_flatten__ tests
    `if self._precomputed_scale:` (a tensor's truth value: its data). On a real GPU the scale is
    positive, so it means "is not None"; under FakeTensorMode it raises DataDependentOutputException
    (aten._local_scalar_dense). Same meaning, spelled `is not None`."""
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor as W
    if getattr(W, "_flatten_patched", False):
        return

    def __tensor_flatten__(self):
        tensors = ["_tensor"]
        if self._precomputed_scale is not None:
            tensors.append("_precomputed_scale")
        return tensors, {"mm_config": self._linear_mm_config, "dtype": self._dtype}
    W.__tensor_flatten__ = __tensor_flatten__
    W._flatten_patched = True


def torchao_version():
    try:
        import torchao
        return torchao.__version__
    except Exception:
        return None


# ----------------------------------------------------------------------------------------------
# One linear, tensor by tensor
# ----------------------------------------------------------------------------------------------
class ListTracker(H.PhaseTracker):
    """PhaseTracker that also lists every new storage: op, shape, dtype, bytes (rounded), phase
    born and phase freed."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.phase = "setup"
        self.events = []
        self._seen = weakref.WeakKeyDictionary()
        self.n_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types, args, kwargs)
        self.n_ops += 1
        from torch.distributed._tools.mem_tracker import get_untyped_storages
        for t in H.tensors_in(res):
            for st in get_untyped_storages(t):
                if st in self._seen:
                    continue
                ev = {"i": len(self.events), "op": str(func).replace("aten.", ""), "shape": list(t.shape),
                      "dtype": str(t.dtype).replace("torch.", ""), "storage_dtype": None,
                      "bytes": H.rnd(st.nbytes()), "born": self.phase, "freed": None, "saved": False}
                self._seen[st] = ev["i"]
                self.events.append(ev)

                def gone(i=ev["i"]):
                    self.events[i]["freed"] = self.phase
                weakref.finalize(st, gone)
        return res


def linear_run(din, dout, tokens, recipe, dtype=torch.bfloat16):
    H.install_cuda_emulation()
    install_inner_tracking()
    from torch.distributed._tools.mem_tracker import get_untyped_storages
    with FakeTensorMode(allow_non_fake_inputs=True):
        lin = torch.nn.Sequential(torch.nn.Linear(din, dout, bias=False, dtype=dtype))
        if recipe != "bf16":
            convert(lin, recipe)
        x = torch.randn(tokens, din, dtype=dtype, requires_grad=True)
        gy = torch.randn(tokens, dout, dtype=dtype)
        mt = ListTracker(H.param_storages(lin))
        mt.track_external(lin, x, gy)
        saved = []

        def pack(t):
            saved.append(t)
            return t
        INNER.append(mt)
        with mt:
            start = mt.snap()
            mt.phase = "fwd"
            mt.reset_peak()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = lin(x)
            saved_st = {s for t in saved for s in get_untyped_storages(t)}
            for st in saved_st:
                i = mt._seen.get(st)
                if i is not None:
                    mt.events[i]["saved"] = True
            saved_desc = [(list(t.shape), str(t.dtype).replace("torch.", ""),
                           "param" if any(t.untyped_storage()._cdata == p.untyped_storage()._cdata
                                          for p in lin.parameters())
                           else "input x" if t.untyped_storage()._cdata == x.untyped_storage()._cdata
                           else "new") for t in saved]
            saved.clear()
            end_fwd = mt.snap()
            fwd_peak = mt.peak()
            mt.phase = "bwd"
            mt.reset_peak()
            y.backward(gy)
            del y
            bwd_peak = mt.peak()
            after_bwd = mt.snap()
            mt.phase = "end"
        INNER.pop()
    return {"recipe": recipe, "in": din, "out": dout, "tokens": tokens, "start": start, "end_fwd": end_fwd,
            "fwd_peak": fwd_peak, "bwd_peak": bwd_peak, "after_bwd": after_bwd, "saved_for_backward": saved_desc,
            "events": mt.events}


def print_linear(r, f=sys.stdout):
    print(f"## {r['recipe']}: Linear({r['in']}, {r['out']}) on {r['tokens']} tokens", file=f)
    print(f"saved for backward (autograd): {r['saved_for_backward']}", file=f)
    print(f"start {r['start']['total']}  end of fwd {r['end_fwd']['total']} (+{r['end_fwd']['total'] - r['start']['total']})"
          f"  fwd peak {r['fwd_peak']['total']} (+{r['fwd_peak']['total'] - r['start']['total']})"
          f"  bwd peak {r['bwd_peak']['total']} (+{r['bwd_peak']['total'] - r['start']['total']})"
          f"  after bwd {r['after_bwd']['total']}", file=f)
    print("| # | op | shape | dtype | bytes | born | freed | saved |", file=f)
    print("|---|---|---|---|---|---|---|---|", file=f)
    for e in r["events"]:
        if e["born"] == "setup":
            continue
        print(f"| {e['i']} | {e['op']} | {tuple(e['shape'])} | {e['dtype']} | {e['bytes']} | {e['born']} | "
              f"{e['freed'] or 'alive'} | {'yes' if e['saved'] else ''} |", file=f)
    print(file=f)


# ----------------------------------------------------------------------------------------------
# A model step (measure.py's)
# ----------------------------------------------------------------------------------------------
def build_query(o):
    q = {"m": "arch"}
    if o.preset:
        q["model"] = o.preset
    q.update({"b": o.batch, "s": o.seq, "r": o.precision.replace("_", "-"), "o": "adamw",
              "gc": "full" if o.gc else "none", "attn": o.attn})
    if o.float8 != "none":
        q["f8"] = o.float8
    return "&".join(f"{k}={v}" for k, v in q.items())


def attach_layer_peaks(tracker, model):
    """Make `tracker` (a harness tracker, PhaseTracker or FSDPTracker) also keep
    `tracker.layer_peaks` = {"fwd": bytes, "bwd": bytes}: the highest total of the forward before
    the head (`lm_head`) starts, and of the backward from the gradient of the final norm's input
    (the head's and the loss's temporaries are gone by then) to that of the embedding's output
    (before the embedding's dense fp32 gradient): the decoder layers. The row's overall peak is
    the head's and the loss's here; these show what float8 adds inside the layers. The phase is
    the one `measured_step` opened with its last `reset_peak()`."""
    from torch.distributed._tools import mem_tracker as _mt
    tracker.layer_peaks = {}
    state = {"phase": None, "on": False}
    phases = iter(["fwd", "bwd", "opt"])
    orig_upd, orig_reset = tracker._update_peak_stats, tracker.reset_peak

    def upd(peak_state):
        orig_upd(peak_state)
        ph = state["phase"]
        if ph and state["on"]:
            tot = sum(v[_mt._TOTAL_KEY] for v in tracker._curr_mem_snap.values())
            if tot > tracker.layer_peaks.get(ph, 0):
                tracker.layer_peaks[ph] = tot

    def reset_peak():
        orig_reset()
        state["phase"] = next(phases, None)
        state["on"] = state["phase"] == "fwd"
    tracker._update_peak_stats = upd
    tracker.reset_peak = reset_peak

    def flag(v):
        state["on"] = v
    base = model.get_base_model() if hasattr(model, "get_base_model") else model

    def norm(mod, args):
        x = args[0]
        if x.requires_grad:
            x.register_hook(lambda g: flag(True))

    def embed(mod, args, out):
        if out.requires_grad:
            out.register_hook(lambda g: flag(False))
    return [base.lm_head.register_forward_pre_hook(lambda mod, args: flag(False)),
            base.model.norm.register_forward_pre_hook(norm),
            base.model.embed_tokens.register_forward_hook(embed)]


def measure_model(o):
    import measure as M
    install_inner_tracking()
    trackers = []
    orig_init = H.PhaseTracker.__init__

    # measure.measure builds its PhaseTracker itself (after the warm-up): register it for the inner
    # pushes and the layer peaks
    def init(self, *a, **k):
        orig_init(self, *a, **k)
        trackers.append(self)
        INNER.append(self)
        attach_layer_peaks(self, models[0])
    H.PhaseTracker.__init__ = init
    models, n_f8 = [], []

    def adapt(m):
        if o.float8 != "none":
            convert(m, o.float8)
        from torchao.float8.float8_linear import Float8Linear
        n_f8.append(sum(isinstance(x, Float8Linear) for x in m.modules()))
        models.append(m)
        return m
    try:
        row = M.measure(o.config, o.model_name, o.batch, o.seq, o.precision, "adamw", o.attn, o.gc,
                        adapt_model=adapt)
    finally:
        H.PhaseTracker.__init__ = orig_init
        INNER.clear()
    row["config"].update(float8=o.float8 if o.float8 != "none" else None,
                         float8_filter="all nn.Linear but lm_head" if o.float8 != "none" else None)
    row = {"config": row.pop("config"), "query": build_query(o), **row}
    row["versions"]["torchao"] = torchao_version()
    # diagnostics: how many linears were converted; the highest totals inside the decoder layers
    row["float8_linears"] = n_f8[0] if n_f8 else 0
    row["layer_peak_bytes"] = dict(trackers[-1].layer_peaks) if trackers else None
    return row


FLAGS = {"model": "--model-name", "preset": "--preset", "batch": "--batch", "seq": "--seq",
         "precision": "--precision", "attn": "--attn", "gc": "--gc", "float8": "--float8"}


def argv_of(entry):
    return H.flags(entry, FLAGS)


def entry_of(row):
    """A row (or its config) as the entry that measures it again: the preset is the query's
    `model`, float8 None is --float8 none."""
    c = dict(row.get("config", row))
    if "query" in row:
        c["preset"] = dict(kv.split("=", 1) for kv in row["query"].split("&")).get("model")
    c["float8"] = c.get("float8") or "none"
    return c


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--linear", action="store_true", help="one linear, tensor by tensor")
    ap.add_argument("--in", dest="din", type=int, default=4096)
    ap.add_argument("--out-features", dest="dout", type=int, default=14336)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--recipe", choices=("bf16",) + RECIPES, default="tensorwise")
    ap.add_argument("--json", help="--linear: write the listing as JSON here")
    ap.add_argument("--config")
    ap.add_argument("--model-name")
    ap.add_argument("--preset")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--precision", choices=["bf16"], default="bf16")
    ap.add_argument("--attn", choices=["sdpa"], default="sdpa")
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--float8", choices=("none",) + RECIPES, default="tensorwise")
    H.add_run_args(ap)
    o = ap.parse_args(argv)
    H.quiet()
    done = H.dispatch(o, __file__, argv_of, main, entry_of=entry_of)
    if done is not None:
        return done
    if o.linear:
        r = linear_run(o.din, o.dout, o.tokens, o.recipe)
        print_linear(r)
        if o.json:
            with open(o.json, "w") as f:
                json.dump(r, f)
        return 0
    if not o.config:
        ap.error("--config or --linear")
    o.model_name = o.model_name or os.path.splitext(os.path.basename(o.config))[0]
    row = measure_model(o)
    pk = row["at_peak"]
    return H.emit(row, o.out, f"[float8] {o.model_name} {row['query']}: peak {row['peak_bytes']} B = "
                  f"{H.gib(row['peak_bytes'])} in {row['peak_phase']} "
                  f"(phases {', '.join(f'{k} {v / 2**30:.3f}' for k, v in row['phase_peak_bytes'].items())}); "
                  f"at peak {', '.join(f'{k}={v / 2**30:.3f}' for k, v in pk.items() if v and k != 'total')}; "
                  f"{row['time_s']} s")


if __name__ == "__main__":
    sys.exit(main())
