"""The measuring harness: one environment, one step, one row format.

A recipe (measure.py, peft.py, trainers.py, ...) builds what it varies (a loss, adapters, an
engine, a compiled graph, images) and hands the rest to this package:

- `env`: threads, the allocator's 512-byte rounding, the CUDA emulation on fake CPU tensors;
- `tracker`: MemTracker with per-phase peaks (`PhaseTracker`, `PhaseTrackerMixin` for
  FSDPMemTracker and the like);
- `model`: a model from a config.json, its optimizer, activation checkpointing;
- `step`: the warm-up step and the measured step (gradient accumulation included), on a tracker
  or on a real GPU (`CudaMeter`);
- `rows`: the row format and its writer; `grid`: a grid of runs, one process each;
- `ranks`: rank by rank on a fake process group.

See validation/README.md, "The harness", for how to add a measurement in one file.
"""
from .env import (ROUND_BYTES, SDPA_LOG, install_cuda_emulation, install_frozen_param_hook_guard,
                  nullctx, quiet, rnd, swap_via_set_data, versions)
from .grid import (add_model_args, add_run_args, config_path, dispatch, flags, model_name, resolve_config,
                   row_config, run_grid)
from .model import (GC_LAYERS, OPT_IMPLS, apply_gc_policy, build_model, config_file, load_config,
                    make_optimizer, text_vocab)
from .rows import PHASES, base_config, emit, gib, place_after, step_row
from .step import (CudaMeter, LossOnly, StepMemory, measured_step, peak_summary, prepare_step,
                   storage_bytes, warm_up)
from .tracker import (CATS, CPU_SIDE_OUTPUTS, PhaseTracker, PhaseTrackerMixin, flat, param_storages,
                      tensors_in)
from .model import build_plain_model
from .rows import CUDA_TRACKER, cuda_row
from .ranks import (device_mesh, fake_world, isolate_sharding_propagation, local_bytes, mesh_outside_fake,
                    rank_row, run_ranks, split_by_tracker)

__all__ = [
    "ROUND_BYTES", "SDPA_LOG", "install_cuda_emulation", "install_frozen_param_hook_guard", "nullctx",
    "quiet", "rnd", "swap_via_set_data", "versions",
    "add_model_args", "add_run_args", "config_path", "dispatch", "flags", "model_name", "resolve_config",
    "row_config", "run_grid",
    "GC_LAYERS", "OPT_IMPLS", "apply_gc_policy", "build_model", "config_file", "load_config",
    "make_optimizer", "text_vocab",
    "PHASES", "base_config", "emit", "gib", "place_after", "step_row",
    "CudaMeter", "LossOnly", "StepMemory", "measured_step", "peak_summary", "prepare_step",
    "storage_bytes", "warm_up",
    "CATS", "CPU_SIDE_OUTPUTS", "PhaseTracker", "PhaseTrackerMixin", "flat", "param_storages",
    "tensors_in",
    "CUDA_TRACKER", "cuda_row", "build_plain_model",
    "device_mesh", "fake_world", "isolate_sharding_propagation", "local_bytes", "mesh_outside_fake",
    "rank_row", "run_ranks", "split_by_tracker",
]
