"""The trackers: torch's MemTracker (and FSDPMemTracker) with per-phase peaks, the fused
attention kernels' CPU-side outputs costing nothing, and autocast's weight copies recorded.

Every tracker answers `snap()`, `reset_peak()` and `peak()` with a flat dict of the row's
categories plus "total"; `step.CudaMeter` answers the same on a real GPU.
"""
from __future__ import annotations

import copy
import weakref

import torch
from torch.distributed._tools import mem_tracker as _mt
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

# Row category name -> MemTracker reference type
CATS = [
    ("parameter", _MemRefType.PARAM),
    ("buffer", _MemRefType.BUFFER),
    ("gradient", _MemRefType.GRAD),
    ("activation", _MemRefType.ACT),
    ("temp", _MemRefType.TEMP),
    ("optstate", _MemRefType.OPT),
    ("other", _MemRefType.OTH),
]

# On CUDA the philox seed/offset of the fused attention kernels are CPU tensors: they are not in
# the GPU's memory, so they cost nothing here.
CPU_SIDE_OUTPUTS = {
    torch.ops.aten._scaled_dot_product_flash_attention.default: (6, 7),
    torch.ops.aten._scaled_dot_product_efficient_attention.default: (2, 3),
}


def flat(snap, cats=CATS):
    """A tracker snapshot ({device: {reftype: bytes}}) as {category: bytes, "total": bytes}."""
    out = {k: 0 for k, _ in cats}
    for dev_snap in snap.values():
        for k, ref in cats:
            out[k] += int(dev_snap.get(ref, 0))
    out["total"] = sum(out[k] for k, _ in cats)
    return out


class PhaseTrackerMixin:
    """What the harness adds to a MemTracker class: the phase API (snap / reset_peak / peak), the
    CPU-side outputs above at 0 bytes, only the tracker-wide peak kept, and (with
    `record_copies` on) the `_to_copy` results of parameters remembered so that
    `alive_copy_bytes()` gives autocast's weight copies still alive."""
    CATS = CATS
    record_copies = False

    def __init__(self, *a, param_storages=frozenset(), **k):
        super().__init__(*a, **k)
        self._param_cdata = param_storages  # set of StorageImpl pointers of parameters
        self.copy_refs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types, args, kwargs)
        if func in CPU_SIDE_OUTPUTS and isinstance(res, tuple):
            for i in CPU_SIDE_OUTPUTS[func]:
                t = res[i]
                if isinstance(t, torch.Tensor):
                    w = self._WINFO.get(t.untyped_storage(), (None, None))[0]
                    if w is not None and w.mem_consumed > 0:
                        self._update_snap(_mt._UpdateType.DEL, w)
                        w.mem_consumed = 0
                        w.size = t.untyped_storage().size()
                        w._calculate_mem_consumed = lambda: 0
        if self.record_copies and func is torch.ops.aten._to_copy.default:
            src = args[0]
            if isinstance(src, torch.Tensor) and src.untyped_storage()._cdata in self._param_cdata \
                    and isinstance(res, torch.Tensor):
                self.copy_refs.append(weakref.ref(res.untyped_storage()))
        return res

    def _update_peak_stats(self, peak_state):
        # Only the tracker-wide peak is used here. MemTracker also updates a per-module peak for
        # every tracked module on every op (O(modules) per op, ~half the run time); skipping it
        # leaves the global peak, and so every figure of the row, unchanged.
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_mt._TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_mt._TOTAL_KEY]
                self._peak_mem_snap[dev] = copy.deepcopy(dev_snap)

    def snap(self):
        return flat(self.get_tracker_snapshot("current"), self.CATS)

    def reset_peak(self):
        s = self.get_tracker_snapshot("current")
        self._peak_mem = {d: v[_mt._TOTAL_KEY] for d, v in s.items()}
        self._peak_mem_snap = s

    def peak(self):
        return flat(self.get_tracker_snapshot("peak"), self.CATS)

    def alive_copy_bytes(self):
        seen, tot = set(), 0
        for r in self.copy_refs:
            st = r()
            if st is None or st._cdata in seen:
                continue
            seen.add(st._cdata)
            w = self._WINFO.get(st, (None, None))[0]
            if w is not None:
                tot += w.mem_consumed
        return tot


class PhaseTracker(PhaseTrackerMixin, MemTracker):
    """MemTracker with the harness's phase API (the single-device tracker)."""

    def __init__(self, param_storages=frozenset()):
        super().__init__(param_storages=param_storages)


def tensors_in(x):
    """The tensors of an op's result: a tensor, or those in nested tuples / lists."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from tensors_in(y)


def param_storages(*models):
    """The storages of the parameters of `models` (None skipped), as PhaseTracker's `param_storages`."""
    return {p.untyped_storage()._cdata for m in models if m is not None for p in m.parameters()}
