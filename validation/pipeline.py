#!/usr/bin/env python3
"""Pipeline parallelism measured: the peak memory of each stage's rank for one optimizer step.

torch.distributed.pipelining (PipelineStage + ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B)
runs on a fake process group (`FakeStore`, backend "fake") under FakeTensorMode with the conventions
of measure.py (CUDA emulation, 512-byte rounding, MemTracker, one untracked warm-up step). Each stage
is measured in its own process as rank `stage` of a world of `pp` ranks: the sends and receives of
the schedule go through the fake group (they complete at once and move nothing), so every receive
buffer, every activation kept for backward and every gradient is allocated exactly as on the real
rank, while the values are meaningless (FakeTensorMode carries only shapes).

Static stage metadata (input_args / output_args with requires_grad) is given, so no shape inference
has to travel over the fake group. The split: stage 0 = embedding + its layers; the last stage = its
layers + final norm + lm_head, and the loss (transformers' ForCausalLMLoss, logits upcast to fp32)
is the schedule's loss_fn; with tied embeddings the last stage gets its own lm_head weight (the
stage 0 embedding is not on that rank), as Megatron and torchtitan do. `step(..., return_outputs=
False)`, as torchtitan calls it, so the last stage does not keep every micro-batch's logits.
After the schedule: AdamW(foreach) step on the stage's parameters and zero_grad(set_to_none=True).

  validation/.venv/bin/python validation/pipeline.py --config validation/configs/llama-1b.json \
      --model-name llama3.2-1b --pp 4 --mb 8 --schedule 1f1b [--gc] [--stage K] [--out rows.jsonl]
  validation/.venv/bin/python validation/pipeline.py --grid --out core/tests/fixtures/pipeline-measured.jsonl

Without --stage every stage is measured (one process each) and one row per stage is written, each
also carrying `stage_peaks` (the peak of every stage) and `busiest_stage`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved1f1b": "ScheduleInterleaved1F1B"}


def split_layers(n_layers, n_stages):
    base, extra = divmod(n_layers, n_stages)
    out, lo = [], 0
    for s in range(n_stages):
        hi = lo + base + (1 if s < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _pipe_tracker_cls():
    import measure as M

    class _PipeTracker(M.PhaseTracker):
        """MemTracker refuses a second forward of a root module (it takes it for the next iteration).
        A pipeline stage runs its module once per micro-batch within the one step: let each call be
        tracked as a re-used module (MemTracker's own case 3), by marking an outer parent while the
        pre-forward hook runs."""

        def _pre_fw_hook(self, module, inputs):
            mark = module in self.memory_tracking and not self._mod_tracker.is_bw
            if mark:
                self._mod_tracker.parents.add("_pp_step")
            try:
                super()._pre_fw_hook(module, inputs)
            finally:
                if mark:
                    self._mod_tracker.parents.discard("_pp_step")

    return _PipeTracker


def apply_stage_tp(stage, tp_mesh, sp):
    """torchtitan's Llama TP plan (validation/distributed.py apply_tp, lp off) on one pipeline
    stage's modules, as torchtitan parallelizes each stage's model part: the embedding on the
    first stage, the final norm and lm_head on the last, the decoder layers everywhere."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, \
        parallelize_module
    import distributed as D
    root_plan = {}
    if stage.embed_tokens is not None:
        root_plan["embed_tokens"] = RowwiseParallel(input_layouts=Replicate(),
                                                    output_layouts=Shard(1) if sp else Replicate())
    if stage.lm_head is not None:
        root_plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(),
                                               output_layouts=Replicate(), use_local_output=True)
        if sp:
            root_plan["norm"] = SequenceParallel()
    if root_plan:
        parallelize_module(stage, tp_mesh, root_plan)
    # the decoder layers: distributed.apply_tp's per-layer plan (on a wrapper whose .model.layers
    # are this stage's layers; the root plan above replaces its embed/lm_head part)
    for layer in stage.layers:
        parallelize_module(layer, tp_mesh, D.layer_tp_plan(sp))
    from torch.distributed.tensor import DTensor
    NoParallel = D._no_parallel_style()
    for mod in stage.modules():
        if any(not isinstance(p, DTensor) for p in mod.parameters(recurse=False)):
            NoParallel()._apply(mod, tp_mesh)


def measure_stage(config_path, model_name, pp, mb, schedule, gc, stage_rank, seq=2048, micro_batch=1,
                  virtual=1, preset=None, tp=1, sp=1):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import torch.distributed.pipelining as pl
    import transformers
    from transformers.loss.loss_utils import ForCausalLMLoss
    import measure as M

    M.install_cuda_emulation()
    _PipeTracker = _pipe_tracker_cls()
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = M.load_config(config_path, "sdpa")
    n_stages = pp * virtual
    my_stages = [stage_rank + k * pp for k in range(virtual)]  # interleaved: rank r holds r, r+pp, ...
    pp_group = None
    tp_mesh = None
    if tp > 1:
        # a (pp, tp) mesh: global rank = stage * tp + tp_rank; this process is tp rank 0 of its stage
        # (TP shards are even here). The schedule's sends/receives go over the "pp" group.
        import distributed as D
        from torch.distributed.device_mesh import init_device_mesh
        D.install_propagation_mode()  # DTensor's global-shape propagation is not counted
        dist.init_process_group("fake", store=FakeStore(), rank=stage_rank * tp, world_size=pp * tp)
        mesh = init_device_mesh("cpu", (pp, tp), mesh_dim_names=("pp", "tp"))
        pp_group, tp_mesh = mesh["pp"].get_group(), mesh["tp"]
    else:
        dist.init_process_group("fake", store=FakeStore(), rank=stage_rank, world_size=pp)

    class Stage(nn.Module):
        def __init__(self, model, idx, lo, hi):
            super().__init__()
            self.first, self.last = idx == 0, idx == n_stages - 1
            inner = model.model
            self.embed_tokens = inner.embed_tokens if self.first else None
            self.layers = nn.ModuleList(inner.layers[lo:hi])
            self.rotary_emb = inner.rotary_emb
            self.norm = inner.norm if self.last else None
            if self.last:
                if cfg.tie_word_embeddings and not self.first:
                    self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False,
                                             dtype=model.lm_head.weight.dtype)
                else:
                    self.lm_head = model.lm_head
            else:
                self.lm_head = None

        def forward(self, x):
            h = self.embed_tokens(x) if self.first else x
            # the full sequence's positions (with sequence parallelism h holds seq / tp of them)
            pos = torch.arange(seq).unsqueeze(0)
            pe = self.rotary_emb(h, pos)
            for layer in self.layers:
                h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
            if self.last:
                return self.lm_head(self.norm(h))
            return h

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = M.build_model(cfg, arch, "sdpa", torch.bfloat16)
        if gc:
            model.gradient_checkpointing_enable()
        model.train(True)
        model.config.use_cache = False
        bounds = split_layers(cfg.num_hidden_layers, n_stages)
        mods = [Stage(model, i, *bounds[i]) for i in my_stages]
        del model
        if tp_mesh is not None:
            for m in mods:
                apply_stage_tp(m, tp_mesh, sp)
        batch = mb * micro_batch
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), dtype=torch.long)
        labels = ids.clone()
        h = cfg.hidden_size
        stages = []
        for i, m in zip(my_stages, mods):
            # with sequence parallelism the stages pass the local (seq / tp) slice of the residual
            # stream (the last layer's RowwiseParallel output, a local tensor); lm_head's output is
            # replicated (lp off): the full logits
            hs = seq // tp if (tp > 1 and sp) else seq
            inp = (torch.empty(micro_batch, seq, dtype=torch.long) if i == 0
                   else torch.empty(micro_batch, hs, h, dtype=torch.bfloat16, requires_grad=True))
            outp = (torch.empty(micro_batch, seq, cfg.vocab_size, dtype=torch.bfloat16, requires_grad=True)
                    if i == n_stages - 1 else torch.empty(micro_batch, hs, h, dtype=torch.bfloat16,
                                                          requires_grad=True))
            stages.append(pl.PipelineStage(m, i, n_stages, torch.device("cpu"), input_args=(inp,),
                                           output_args=(outp,), group=pp_group))
            del inp, outp

        def loss_fn(logits, target):
            return ForCausalLMLoss(logits, target, vocab_size=cfg.vocab_size)

        cls = getattr(pl, SCHEDULES[schedule])
        sched = cls(stages if virtual > 1 or schedule == "interleaved1f1b" else stages[0], mb, loss_fn=loss_fn)
        params = [p for m in mods for p in m.parameters()]
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        first = 0 in my_stages
        last = (n_stages - 1) in my_stages

        def run_pipe():
            kw = dict(return_outputs=False)
            if last:
                losses = []
                kw.update(target=labels, losses=losses)
            if first:
                sched.step(ids, **kw)
            else:
                sched.step(**kw)

        # untracked warm-up step
        run_pipe()
        opt.step()
        opt.zero_grad(set_to_none=True)

        param_cdata = {getattr(p, "_local_tensor", p).untyped_storage()._cdata for p in params}
        mt = _PipeTracker(param_cdata)
        for m in mods:
            mt.track_external(m)
        mt.track_external(ids, labels)
        mt.track_external(opt)
        phase_peaks = {}
        with mt:
            start = mt.snap()
            mt.reset_peak()
            run_pipe()
            phase_peaks["pipe"] = mt.peak()
            after_bwd = mt.snap()
            mt.reset_peak()
            opt.step()
            opt.zero_grad(set_to_none=True)
            phase_peaks["opt"] = mt.peak()
            end = mt.snap()
    dist.destroy_process_group()

    n_params = sum(p.numel() for p in params)  # global (unsharded) count with TP
    opt_state_bytes = start["optstate"]
    peak_phase, pk, opt_step_temp, at_peak = M.peak_summary(phase_peaks, opt_state_bytes)
    query = (f"m=arch&model={preset or model_name}&b={micro_batch}&s={seq}&r=bf16&o=adamw&gc={'full' if gc else 'none'}"
             f"&attn=sdpa&n={pp * tp}&shard=ddp" + (f"&tp={tp}&sp={int(bool(sp))}&lp=0" if tp > 1 else "")
             + f"&pp={pp}&pps={schedule}&mb={mb}" + (f"&ppv={virtual}" if virtual > 1 else ""))
    row = {
        "config": {
            "model": model_name, "batch": micro_batch, "seq": seq, "image": 224, "precision": "bf16",
            "optimizer": "adamw", "attn": "sdpa", "gc": bool(gc), "mode": "fake", "tracker": "memtracker",
            "emulate_cuda": True, "round_bytes": M.ROUND_BYTES, "opt_impl": "foreach", "warmup_steps": 1,
            "loss": "hf", "pp": pp, "pp_schedule": schedule, "microbatches": mb, "virtual_stages": virtual,
            "stage_layers": [list(split_layers(cfg.num_hidden_layers, n_stages)[i]) for i in my_stages],
            "pg": "fake", "return_outputs": False,
            "lm_head": "own weight on the last stage" if cfg.tie_word_embeddings else "untied",
            **({"tp": tp, "sp": bool(sp), "lp": False, "tp_plan": "torchtitan-llama (HF names), per stage",
                "rank": stage_rank * tp, "world_size": pp * tp} if tp > 1 else {}),
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "query": query,
        "stage": stage_rank,
        "n_params": n_params,
        "param_bytes": start["parameter"],
        "buffer_bytes": start["buffer"],
        "input_bytes": start["other"],
        "grad_bytes": after_bwd["gradient"],
        "opt_state_bytes": opt_state_bytes,
        "model_state_bytes": start["parameter"] + start["buffer"] + after_bwd["gradient"] + opt_state_bytes,
        "peak_bytes": pk["total"],
        "peak_phase": peak_phase,
        "at_peak": at_peak,
        "act_temp_at_peak": pk["activation"] + pk["temp"] + opt_step_temp,
        "phase_peak_bytes": {k: v["total"] for k, v in phase_peaks.items()},
        "phase_peaks": phase_peaks,
        "start_bytes": start["total"],
        "end_bytes": end["total"],
        "after_bwd_bytes": after_bwd["total"],
        "time_s": round(time.time() - t0, 2),
    }
    return row


def run_all_stages(a):
    rows = []
    for s in range(a.pp):
        cmd = [sys.executable, os.path.abspath(__file__), "--config", a.config, "--model-name", a.model_name,
               "--pp", str(a.pp), "--mb", str(a.mb), "--schedule", a.schedule, "--stage", str(s),
               "--seq", str(a.seq), "--virtual", str(a.virtual), "--tp", str(a.tp), "--sp", str(a.sp)] + \
              (["--gc"] if a.gc else []) + \
              (["--preset", a.preset] if a.preset else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stderr[-4000:])
            raise SystemExit(f"stage {s} failed")
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    peaks = [r["peak_bytes"] for r in rows]
    busiest = max(range(len(peaks)), key=lambda i: peaks[i])
    for r in rows:
        r["stage_peaks"] = peaks
        r["busiest_stage"] = busiest
    return rows


GRID = [dict(pp=pp, mb=mb, schedule=sc, gc=gc) for pp in (2, 4) for mb in (4, 8) for sc in ("gpipe", "1f1b")
        for gc in (True, False)]
# TP x PP: each stage tensor-parallel over tp=2 (sp on, lp off)
GRID_TP = [dict(pp=2, mb=4, schedule=sc, gc=gc, tp=2, sp=1) for sc in ("gpipe", "1f1b") for gc in (True, False)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(HERE, "configs", "llama-1b.json"))
    ap.add_argument("--model-name", default="llama3.2-1b")
    ap.add_argument("--preset", default=None, help="estimator preset name for the query (default: model name)")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--mb", type=int, default=4, help="number of micro-batches")
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    ap.add_argument("--virtual", type=int, default=1, help="stages per rank (interleaved1f1b)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of every stage (torchtitan plan)")
    ap.add_argument("--sp", type=int, default=1, help="sequence parallelism with --tp (1/0)")
    ap.add_argument("--grid-tp", action="store_true", help="the TP x PP grid (pp 2 x tp 2, mb 4)")
    ap.add_argument("--stage", type=int, default=None)
    ap.add_argument("--grid", action="store_true", help="the pp/mb/schedule/gc grid on Llama-3.2-1B")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.schedule == "interleaved1f1b" and a.virtual < 2:
        a.virtual = 2
    if a.stage is not None:
        row = measure_stage(a.config, a.model_name, a.pp, a.mb, a.schedule, a.gc, a.stage, seq=a.seq,
                            virtual=a.virtual, preset=a.preset, tp=a.tp, sp=a.sp)
        print(json.dumps(row))
        return
    configs = GRID if a.grid else GRID_TP if a.grid_tp else \
        [dict(pp=a.pp, mb=a.mb, schedule=a.schedule, gc=a.gc, tp=a.tp, sp=a.sp)]
    for c in configs:
        b = argparse.Namespace(**{**vars(a), **c})
        rows = run_all_stages(b)
        for r in rows:
            line = json.dumps(r)
            print(line, flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(line + "\n")
        sys.stderr.write(f"pp={b.pp} tp={b.tp} mb={b.mb} {b.schedule} gc={b.gc}: stage peaks GiB "
                         f"{[round(r['peak_bytes'] / 2**30, 2) for r in rows]}\n")


if __name__ == "__main__":
    main()
