#!/usr/bin/env python3
"""Measure the peak memory of one training step of a Hugging Face config.json.

The plain recipe of the harness (validation/harness/): a model built from the config with random
weights (nothing downloaded), the harness's step (one untracked warm-up step, then forward + loss,
backward, optimizer.step(), zero_grad(set_to_none=True)) under FakeTensorMode with CUDA emulated
(`--device fake`, the default) or on a real GPU (`--device cuda`). What it varies: the model, batch,
sequence, precision, optimizer and its kernel, attention, checkpointing, weight decay and
gradient accumulation (`--micro-batches`).

Example:
  python validation/measure.py --config validation/configs/gpt2.json --model-name gpt2 \
      --batch 1 --seq 1024 --precision amp_bf16 --optimizer adamw --attn sdpa --out rows.jsonl
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import harness as H
from harness.model import GC_LAYERS

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


def _variant_config(gc, gc_policy, weight_decay, micro_batches):
    """Config keys of the options: only those given (so that rows measured without them stay
    byte-identical to the rows measured before they existed)."""
    extra = {}
    if gc_policy is not None and gc:
        extra["gc_policy"] = gc_policy
        if gc_policy != "full":
            extra["gc_layers"] = list(GC_LAYERS.get("checkpointed", []))
            extra["gc_early_stop"] = GC_LAYERS.get("early_stop", False)
    if weight_decay is not None:
        extra["weight_decay"] = weight_decay
    if micro_batches > 1:
        extra["micro_batches"] = micro_batches
    return extra


def measure(config_path, model_name, batch, seq, precision, optimizer, attn, gc=False,
            opt_impl="foreach", gc_policy=None, weight_decay=None, micro_batches=1, device="fake",
            adapt_model=None):
    """One row: the step of `config_path` measured on `device`: "fake" (FakeTensorMode, CUDA
    emulated), "real-cpu" (real CPU tensors, CUDA emulated: to check that the fake mode gives the
    same bytes) or "cuda" (a real GPU). `adapt_model(model)` returns the model to measure (an
    experts implementation set, say)."""
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("measure.py --device cuda: no CUDA device is available "
                         "(torch.cuda.is_available() is False); use the default --device fake")
    if not cuda:
        H.install_cuda_emulation()
    GC_LAYERS.clear()
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = H.load_config(config_path, attn)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    amp = precision == "amp_bf16"
    train = optimizer != "none"
    place = {"cuda": lambda: torch.device("cuda"), "real-cpu": H.nullctx,
             "fake": lambda: FakeTensorMode(allow_non_fake_inputs=True)}[device]()
    with place:
        model = H.build_model(cfg, arch, attn, dtype)
        if adapt_model is not None:
            model = adapt_model(model)
        ids, labels, opt, fwd = H.prepare_step(
            cfg, arch, model, batch, seq, optimizer, amp, gc, "cuda" if cuda else "cpu",
            torch.device("cuda") if cuda else None, opt_impl=opt_impl, gc_policy=gc_policy,
            weight_decay=weight_decay)
        H.warm_up(fwd, opt, train)  # untracked
        if cuda:
            meter = H.CudaMeter()
        else:
            meter = H.PhaseTracker(H.param_storages(model))
            meter.track_external(model, ids)
            if opt is not None:
                meter.track_external(opt)
        with meter:
            step = H.measured_step(meter, fwd, opt, train, amp, micro_batches=micro_batches,
                                   on_phase=_grad_bytes(model) if cuda else None)
    config = H.base_config(model_name, batch, seq, precision, optimizer, attn, gc, opt_impl,
                           mode="real-cpu" if device == "real-cpu" else "fake",
                           **_variant_config(gc, gc_policy, weight_decay, micro_batches))
    n_params = sum(p.numel() for p in model.parameters())
    if cuda:
        config["mode"] = "cuda"
        versions = H.versions()
        versions.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                        device=torch.cuda.get_device_name(),
                        capability=".".join(map(str, torch.cuda.get_device_capability())))
        row = H.cuda_row(config, versions, n_params, step, t0, model, [ids, labels], opt, device="cuda")
        row["sdpa_kernels"] = {}
        return row
    row = H.step_row(config, H.versions(), n_params, step, t0)
    row["sdpa_kernels"] = dict(H.SDPA_LOG)
    H.SDPA_LOG.clear()
    return row


def _grad_bytes(model):
    """An `on_phase` that sums the gradients' storages after backward (zero_grad frees them)."""
    def on_phase(name, meter, step):
        if name == "bwd":
            step.extra["grad_bytes"] = H.storage_bytes(p.grad for p in model.parameters())
    return on_phase


def argv_of(entry):
    """The command line (without --config) of a grid entry or a row's config."""
    return H.flags({"attn": "sdpa", **entry}, GRID_FLAGS)


GRID_FLAGS = {"model": "--model-name", "batch": "--batch", "seq": "--seq", "precision": "--precision",
              "optimizer": "--optimizer", "attn": "--attn", "gc": "--gc", "opt_impl": "--optimizer-impl",
              "gc_policy": "--gc-policy", "weight_decay": "--weight-decay", "micro_batches": "--micro-batches",
              "mode": "--device"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="path to a Hugging Face config.json")
    ap.add_argument("--model-name", help="name written to the row (default: file stem)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", choices=["fp32", "amp_bf16", "bf16"], default="fp32")
    ap.add_argument("--optimizer", choices=["adamw", "adam", "sgd", "none"], default="adamw")
    ap.add_argument("--optimizer-impl", choices=list(H.OPT_IMPLS), default="foreach",
                    help="torch.optim implementation: fused=True, foreach=True (default), or the "
                    "single-tensor for-loop (foreach=False); see OPTIMIZERS.md")
    ap.add_argument("--weight-decay", type=float, default=None,
                    help="optimizer weight decay (default: torch's, AdamW 0.01, Adam/SGD 0; written to "
                    "config.weight_decay only when given)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing of every layer")
    ap.add_argument("--gc-policy", default=None,
                    help="with --gc: full (default: every layer, transformers' own), every:N "
                    "(torchtitan's layer SAC: 1-based layers k with k %% N == 0), hf-every:N (transformers' "
                    "every_n_layers: 0-based layers i with i %% N == 0) or ops (torchtitan's "
                    "per-op SAC); written to config.gc_policy when given; see OPTIMIZERS.md")
    ap.add_argument("--micro-batches", type=int, default=1,
                    help="gradient accumulation: forward + backward this many times, then one optimizer "
                    "step (written to config.micro_batches when > 1)")
    H.add_run_args(ap)
    ap.add_argument("--device", choices=["fake", "real-cpu", "cuda"], default="fake",
                    help="fake (default): FakeTensorMode on the CPU with CUDA emulated; cuda: the same "
                    "step on a real GPU, torch.cuda.max_memory_allocated() per phase (mode 'cuda'); real-cpu: real CPU "
                    "tensors with CUDA emulated (attn eager: the fused kernels have no CPU kernel)")
    ap.add_argument("--keep-kernel-log", action="store_true",
                    help="keep the sdpa_kernels diagnostic key in the row")
    a = ap.parse_args(argv)
    extra = (["--keep-kernel-log"] if a.keep_kernel_log else []) + \
        (["--device", a.device] if a.device != "fake" else [])
    done = H.dispatch(a, __file__, argv_of, main, extra)
    if done is not None:
        return done
    if not a.config:
        ap.error("--config or --grid is required")
    if a.micro_batches < 1:
        ap.error("--micro-batches must be at least 1")
    name = a.model_name or os.path.splitext(os.path.basename(a.config))[0]
    if a.gc_policy is not None:
        if not a.gc:
            ap.error("--gc-policy needs --gc")
        n = a.gc_policy.split(":", 1)[-1]
        if not (a.gc_policy in ("full", "ops") or (a.gc_policy.split(":")[0] in ("every", "hf-every")
                                                     and n.isdigit() and int(n) >= 1)):
            ap.error("--gc-policy must be full, every:N, hf-every:N (N >= 1) or ops")
    row = measure(a.config, name, a.batch, a.seq, a.precision, a.optimizer, a.attn, a.gc,
                  opt_impl=a.optimizer_impl, gc_policy=a.gc_policy, weight_decay=a.weight_decay,
                  micro_batches=a.micro_batches, device=a.device)
    kernels = row.pop("sdpa_kernels")
    if a.keep_kernel_log:
        row["sdpa_kernels"] = kernels
    variant = ""
    if a.optimizer_impl != "foreach" or a.gc_policy is not None or a.weight_decay is not None \
            or a.micro_batches > 1:
        variant = (f" impl={a.optimizer_impl} gc_policy={a.gc_policy} wd={a.weight_decay}"
                   f" micro_batches={a.micro_batches}")
    return H.emit(row, a.out, f"[measure] {name} b{a.batch} s{a.seq} {a.precision} {a.optimizer} {a.attn} "
                  f"gc={a.gc}{variant}: peak {H.gib(row['peak_bytes'])} in {row['peak_phase']}, "
                  f"sdpa kernels {kernels}, {row['time_s']} s")


def measure_cuda(*args, **kwargs):
    """`measure(..., device="cuda")`."""
    return measure(*args, device="cuda", **kwargs)


if __name__ == "__main__":
    sys.exit(main())
