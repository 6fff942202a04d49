"""Rank by rank on a fake process group: what distributed.py (one rank of FSDP2, tensor, sequence
and context parallelism) and pipeline.py (every stage of a schedule) share.

- `fake_world`: torch's fake process group (backend "fake", `FakeStore`): its collectives complete
  at once and move nothing, while every shape is the one of the rank it is opened as;
- `device_mesh`: a named CPU DeviceMesh over that world;
- `isolate_sharding_propagation`, `mesh_outside_fake`: DTensor under the harness's FakeTensorMode;
- `local_bytes`: the bytes of the local shards of (D)Tensors;
- `rank_row`: the row of one rank (the harness's step row, the rank's place after `config`);
- `run_ranks`: a measurement once per rank (or stage), each in its own process, the rows collected.

Nothing here imports transformers.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from .rows import step_row
from .step import storage_bytes


@contextlib.contextmanager
def fake_world(world_size, rank=0):
    """`dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())`
    for the body, destroyed after it."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def device_mesh(dims):
    """`init_device_mesh("cpu", ...)` over `dims` ({name: size}, outermost first)."""
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", tuple(dims.values()), mesh_dim_names=tuple(dims))


_PROP_MODE = None


def isolate_sharding_propagation():
    """DTensor derives an op's global output shape by running the op on fake tensors of the GLOBAL
    shape (ShardingPropagator._propagate_tensor_meta_non_cached: `detect_fake_mode() or
    FakeTensorMode()`). On a GPU that costs nothing (fake tensors). Under our FakeTensorMode,
    detect_fake_mode() returns OUR mode, which is also the tracker's entry mode, so MemTracker
    counts those global-shape phantoms (e.g. loss_parallel's log_softmax / nll_loss_backward
    handlers: a full (B*S, vocab) fp32 tensor each time the cache misses). Give the propagation a
    mode of its own: MemTracker skips ops whose active fake mode is not its entry mode."""
    global _PROP_MODE
    import torch.distributed.tensor._sharding_prop as sp
    from torch._subclasses.fake_tensor import FakeTensorMode
    if _PROP_MODE is None:
        _PROP_MODE = FakeTensorMode(allow_non_fake_inputs=True)
        sp.detect_fake_mode = lambda *a, **k: _PROP_MODE


def mesh_outside_fake():
    """FSDP2 on a TP-sharded parameter builds a (dp, tp) DeviceMesh while our FakeTensorMode is
    active (DeviceMesh._concatenate): the mesh's rank tensor must be real (it calls nonzero())."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh
    orig = DeviceMesh._concatenate
    if getattr(orig, "_outside_fake", False):
        return

    def _concatenate(device_mesh_list):
        with unset_fake_temporarily():
            return orig(device_mesh_list)
    _concatenate._outside_fake = True
    DeviceMesh._concatenate = staticmethod(_concatenate)


def local_bytes(tensors):
    """Per-rank storage bytes (512-rounded, deduplicated) of `tensors`: the local shard of a
    DTensor, a plain tensor as it is."""
    return storage_bytes(getattr(t, "_local_tensor", t) for t in tensors)


def rank_row(config, place, versions, n_params, step, t0, cats, state):
    """The row of one rank: the harness's step row with the rank's `place` (its query, rank,
    world size, mesh) after `config`, the model state read from the local shards (`state`:
    param_bytes, grad_bytes, opt_state_bytes), the peak split by the tracker's own categories
    `cats` (FSDPMemTracker's: unsharded parameters and gradients, all-gather and reduce-scatter
    buffers) with the optimizer step's temporaries last, everything but the model state and the
    inputs as `act_temp_at_peak`, and the readings at the start and after backward whole."""
    row = step_row(config, versions, n_params, step, t0, after={"config": place})
    return split_by_tracker(row, step, cats, state)


def split_by_tracker(row, step, cats, state):
    """A step `row` of one rank with its model state read from the local shards (`state`), the
    peak split by the tracker's own categories `cats` with the optimizer step's temporaries last,
    everything but the model state and the inputs as `act_temp_at_peak`, and the readings at the
    start and after backward whole (`rank_row`'s and pipeline.py's FSDP2 stage rows)."""
    row.update(state)
    row["model_state_bytes"] = sum(row[k] for k in ("param_bytes", "buffer_bytes", "grad_bytes",
                                                    "opt_state_bytes"))
    pk = step.phase_peaks[row["peak_phase"]]
    temp = row["at_peak"]["opt_step_temp"]
    at_peak = {**pk, "optstate": pk["optstate"] - temp, "opt_step_temp": temp}
    row["at_peak"] = at_peak
    row["act_temp_at_peak"] = pk["total"] - sum(at_peak[k] for k in ("parameter", "buffer", "gradient",
                                                                      "optstate", "other"))
    row.pop("amp_weight_copy_bytes", None)
    out = {}
    for k, v in row.items():
        if k == "time_s":
            out["categories"] = [name for name, _ in cats]
        out[k] = v
        if k == "start_bytes":
            out["start"] = step.start
        elif k == "after_bwd_bytes":
            out["after_bwd"] = step.after_bwd
    return out


def run_ranks(script, argv, ranks, flag):
    """`script argv flag r` for every r of `ranks`, each in its own process (a fresh fake world,
    no state shared); the rows they print (the last line of stdout), in order. A rank that fails
    stops the run with its stderr."""
    rows = []
    for r in ranks:
        p = subprocess.run([sys.executable, os.path.abspath(script), *argv, flag, str(r)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            raise SystemExit(f"{os.path.basename(script)} {flag} {r} failed")
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return rows
