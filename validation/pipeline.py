#!/usr/bin/env python3
"""Pipeline parallelism measured: the peak memory of each stage's rank for one optimizer step.

A recipe of the harness (validation/harness/): torch.distributed.pipelining (PipelineStage +
ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B) runs on the harness's fake process group
(harness/ranks.py: `FakeStore`, backend "fake") under FakeTensorMode with the harness's environment
(CUDA emulation, 512-byte rounding, MemTracker, one untracked warm-up step). Each stage is measured
in its own process as rank `stage` of a world of `pp` ranks: the sends and receives of the schedule
go through the fake group (they complete at once and move nothing), so every receive buffer, every
activation kept for backward and every gradient is allocated exactly as on the real rank, while the
values are meaningless (FakeTensorMode carries only shapes).

Static stage metadata (input_args / output_args with requires_grad) is given, so no shape inference
has to travel over the fake group. The split: stage 0 = embedding + its layers; the last stage = its
layers + final norm + lm_head, and the loss (transformers' ForCausalLMLoss, logits upcast to fp32)
is the schedule's loss_fn; with tied embeddings the last stage gets its own lm_head weight (the
stage 0 embedding is not on that rank), as Megatron and torchtitan do. `step(..., return_outputs=
False)`, as torchtitan calls it, so the last stage does not keep every micro-batch's logits.
The harness's measured step with the schedule in place of forward and backward (one phase, `pipe`),
then AdamW(foreach) step on the stage's parameters and zero_grad(set_to_none=True) (`opt`).

Data parallelism inside every stage (--dp N), as torchtitan composes PP with FSDP2: a 2-D mesh
(pp, dp) of a fake world of pp*dp ranks (global rank = stage * dp + dp rank; this process is dp rank
0 of its stage; the schedule's sends/receives go over the "pp" group), then on each stage module
fully_shard(layer, mesh=dp_mesh, reshard_after_forward=--raf, mp_policy=...) for every decoder layer
and fully_shard(stage_module, ...) for the stage root. --precision mixed-bf16: fp32 parameters with
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (as distributed.py); bf16: bf16 parameters,
no policy. The stages' input/output metadata is bf16 (the compute dtype) either way. torch's
pipelining then runs every micro-batch's backward with set_requires_gradient_sync(False) and
set_reshard_after_backward(False) and reduces once after the last (PipelineStage.perform_reduce_grad).
The tracker is distributed.py's FSDPTracker (FSDPMemTracker categories: sharded / unsharded params
and grads, all-gather and reduce-scatter buffers), with the stage root allowed to run once per
micro-batch and the unsharded gradients re-tagged after each post-backward (under no-sync FSDP2
replaces them by their reduce_dtype copy there, which FSDPMemTracker would leave as Temp).

  validation/.venv/bin/python validation/pipeline.py --config validation/configs/llama-1b.json \
      --model-name llama3.2-1b --pp 4 --mb 8 --schedule 1f1b [--gc] [--stage K] [--out rows.jsonl]
  validation/.venv/bin/python validation/pipeline.py --pp 2 --dp 2 --mb 4 --schedule 1f1b --gc \
      --raf 0 --precision mixed-bf16
  validation/.venv/bin/python validation/pipeline.py --grid validation/grid-pipeline-fsdp2.json \
      --out core/tests/fixtures/pipeline-fsdp2-measured.jsonl
  validation/.venv/bin/python validation/pipeline.py --grid validation/grid-pipeline.json \
      --out core/tests/fixtures/pipeline-measured.jsonl
  validation/.venv/bin/python validation/pipeline.py --from-row "$(sed -n 1p core/tests/fixtures/pipeline-measured.jsonl)"

Without --stage every stage is measured (one process each) and one row per stage is written, each
also carrying `stage_peaks` (the peak of every stage) and `busiest_stage`; `--emit-stage K` writes
only stage K's row of those (what --from-row does with a stage's row). `--stage K` measures stage K
alone and prints its row without them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved1f1b": "ScheduleInterleaved1F1B"}
# The model of the pipeline rows: Llama-3.2-1B, whose config.json is configs/llama-1b.json; its rows
# carry the estimator's preset name, which has no config file of its own.
DEFAULT_CONFIG = os.path.join(HERE, "configs", "llama-1b.json")
DEFAULT_MODEL = "llama3.2-1b"


def split_layers(n_layers, n_stages):
    base, extra = divmod(n_layers, n_stages)
    out, lo = [], 0
    for s in range(n_stages):
        hi = lo + base + (1 if s < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


class PipeTracker(H.PhaseTracker):
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


class Stage(nn.Module):
    """Stage `idx` of `n_stages` of a transformers causal LM: its layers [lo, hi), the embedding on
    the first stage, the final norm and lm_head on the last."""

    def __init__(self, model, cfg, idx, n_stages, lo, hi, seq):
        super().__init__()
        self.first, self.last = idx == 0, idx == n_stages - 1
        self.seq = seq
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
        pos = torch.arange(self.seq).unsqueeze(0)
        pe = self.rotary_emb(h, pos)
        for layer in self.layers:
            h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
        if self.last:
            return self.lm_head(self.norm(h))
        return h


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
    D.replicate_the_rest(stage, tp_mesh)


def apply_stage_fsdp(stage, dp_mesh, raf, mixed):
    """torchtitan's FSDP2 on one stage's module: every decoder layer, then the stage root (the
    embedding, final norm and lm_head are the root's), all with the same reshard_after_forward."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = {"mesh": dp_mesh, "reshard_after_forward": bool(raf)}
    if mixed:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in stage.layers:
        fully_shard(layer, **kw)
    fully_shard(stage, **kw)


def pipe_fsdp_tracker(roots, opt):
    """distributed.py's FSDPTracker for a pipeline stage: (1) the stage root runs once per
    micro-batch (FSDPMemTracker takes a root's second forward for the next iteration: mark an outer
    parent while its pre-forward runs, as PipeTracker does); (2) the unsharded gradients are tagged
    Unsharded Grad after every AccumulateGrad and again after each FSDP post-backward:
    FSDPMemTracker tags them only before a group's post-backward, but under no-sync
    (requires_gradient_sync False) FSDP2's post-backward keeps them unsharded and may replace each
    by its reduce_dtype copy (_set_unsharded_grad_dtypes), and the first stage's root group
    (the embedding: its input, the token ids, needs no gradient) has its post-backward only at the
    final reduction; either would leave a kept gradient under Temp."""
    import distributed as D
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

    class PipeFSDPTracker(D.FSDPTracker):
        def _fsdp_state_pre_forward(self, fsdp_mod, orig):
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)
            if not any(fsdp_mod is r for r in roots):
                return inner

            def wrapped(*a, **k):
                mark = fsdp_mod in self.memory_tracking and not self._mod_tracker.is_bw
                if mark:
                    self._mod_tracker.parents.add("_pp_step")
                try:
                    return inner(*a, **k)
                finally:
                    if mark:
                        self._mod_tracker.parents.discard("_pp_step")
            return wrapped

        def _register_module_and_optimizer_hooks(self):
            super()._register_module_and_optimizer_hooks()
            # the stage root's group (embedding on stage 0) has its post-backward only at the
            # final reduction when its inputs need no gradient (token ids): tag every unsharded
            # gradient as soon as AccumulateGrad has written it
            self._acc_hooks = []

            def tag(q):
                self._update_and_maybe_create_winfos(q.grad, _FSDPRefType.UNSHARDED_GRAD, update_existing=True)
            for m in roots[0].modules():
                group = m._get_fsdp_state()._fsdp_param_group if hasattr(m, "_get_fsdp_state") else None
                for fp in (group.fsdp_params if group else ()):
                    u = getattr(fp, "_unsharded_param", None)
                    if u is not None and u.requires_grad:
                        self._acc_hooks.append(u.register_post_accumulate_grad_hook(tag))

        def _deregister_module_and_optimizer_hooks(self):
            super()._deregister_module_and_optimizer_hooks()
            for h in self._acc_hooks:
                h.remove()

        def _fsdp_param_group_post_backward(self, fsdp_mod, orig):
            inner = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

            def wrapped(*a, **k):
                inner(*a, **k)
                group = fsdp_mod._get_fsdp_state()._fsdp_param_group
                for fp in (group.fsdp_params if group else ()):
                    u = getattr(fp, "_unsharded_param", None)
                    if u is not None and u.grad is not None:
                        self._update_and_maybe_create_winfos(u.grad, _FSDPRefType.UNSHARDED_GRAD,
                                                             update_existing=True)
            return wrapped

    return PipeFSDPTracker(roots[0], opt)


def measure_stage(config_path, model_name, pp, mb, schedule, gc, stage_rank, seq=2048, micro_batch=1,
                  virtual=1, preset=None, tp=1, sp=1, dp=1, raf=0, precision="bf16"):
    import torch.distributed.pipelining as pl
    from transformers.loss.loss_utils import ForCausalLMLoss

    H.install_cuda_emulation()
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = H.load_config(config_path, "sdpa")
    n_stages = pp * virtual
    if dp > 1 and (tp > 1 or virtual > 1):
        raise SystemExit("--dp is measured with one stage per rank and no --tp")
    if precision == "mixed-bf16" and dp < 2:
        raise SystemExit("mixed-bf16 needs --dp (FSDP2's MixedPrecisionPolicy)")
    mixed = precision == "mixed-bf16"
    my_stages = [stage_rank + k * pp for k in range(virtual)]  # interleaved: rank r holds r, r+pp, ...
    if tp > 1:
        # a (pp, tp) mesh: global rank = stage * tp + tp_rank; this process is tp rank 0 of its stage
        # (TP shards are even here). The schedule's sends/receives go over the "pp" group.
        H.isolate_sharding_propagation()  # DTensor's global-shape propagation is not counted
        world = H.fake_world(pp * tp, rank=stage_rank * tp)
    elif dp > 1:
        # a (pp, dp) mesh: global rank = stage * dp + dp_rank; this process is dp rank 0 of its stage
        import distributed as D
        H.isolate_sharding_propagation()
        D._install_fsdp_alloc_tags()
        H.mesh_outside_fake()
        world = H.fake_world(pp * dp, rank=stage_rank * dp)
    else:
        world = H.fake_world(pp, rank=stage_rank)
    with world:
        pp_group = tp_mesh = dp_mesh = None
        if tp > 1:
            mesh = H.device_mesh({"pp": pp, "tp": tp})
            pp_group, tp_mesh = mesh["pp"].get_group(), mesh["tp"]
        elif dp > 1:
            mesh = H.device_mesh({"pp": pp, "dp": dp})
            pp_group, dp_mesh = mesh["pp"].get_group(), mesh["dp"]
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = H.build_model(cfg, arch, "sdpa", torch.float32 if mixed else torch.bfloat16)
            if gc:
                model.gradient_checkpointing_enable()
            model.train(True)
            model.config.use_cache = False
            bounds = split_layers(cfg.num_hidden_layers, n_stages)
            mods = [Stage(model, cfg, i, n_stages, *bounds[i], seq) for i in my_stages]
            del model
            if tp_mesh is not None:
                for m in mods:
                    apply_stage_tp(m, tp_mesh, sp)
            if dp_mesh is not None:
                for m in mods:
                    apply_stage_fsdp(m, dp_mesh, raf, mixed)
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
            opt = H.make_optimizer("adamw", params)
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

            H.warm_up(None, opt, True, schedule=run_pipe)  # untracked

            if dp_mesh is not None:
                mt = pipe_fsdp_tracker(mods, opt)
                mt.track_inputs((ids, labels))

                def local_grads(name, meter, step):
                    if name == "pipe":
                        step.extra["grad_bytes"] = H.local_bytes(p.grad for p in params)
                with mt:
                    step = H.measured_step(mt, None, opt, schedule=run_pipe, on_phase=local_grads)
            else:
                param_cdata = {getattr(p, "_local_tensor", p).untyped_storage()._cdata for p in params}
                mt = PipeTracker(param_cdata)
                for m in mods:
                    mt.track_external(m)
                mt.track_external(ids, labels)
                mt.track_external(opt)
                with mt:
                    step = H.measured_step(mt, None, opt, schedule=run_pipe)

    n_params = sum(p.numel() for p in params)  # global (unsharded) count with TP / FSDP
    query = (f"m=arch&model={preset or model_name}&b={micro_batch}&s={seq}&r={precision}&o=adamw"
             f"&gc={'full' if gc else 'none'}&attn=sdpa&n={pp * tp * dp}"
             + (f"&shard=fsdp2&raf={int(bool(raf))}" if dp > 1 else "&shard=ddp")
             + (f"&tp={tp}&sp={int(bool(sp))}&lp=0" if tp > 1 else "")
             + f"&pp={pp}&pps={schedule}&mb={mb}" + (f"&ppv={virtual}" if virtual > 1 else ""))
    if dp > 1:
        config = H.base_config(
            model_name, micro_batch, seq, precision, "adamw", "sdpa", gc, tracker="fsdp2memtracker",
            loss="hf", pp=pp, pp_schedule=schedule, microbatches=mb, virtual_stages=virtual,
            stage_layers=[list(bounds[i]) for i in my_stages], pg="fake", return_outputs=False,
            lm_head="own weight on the last stage" if cfg.tie_word_embeddings else "untied",
            dp=dp, raf=bool(raf), mp_policy="param_dtype=bf16,reduce_dtype=fp32" if mixed else None,
            fsdp_units="decoder layers + stage root", rank=stage_rank * dp, world_size=pp * dp)
        state = {"param_bytes": H.local_bytes(params), "grad_bytes": step.extra["grad_bytes"],
                 "opt_state_bytes": H.local_bytes(v for s in opt.state.values() for v in s.values())}
        place = {"query": query, "stage": stage_rank, "rank": stage_rank * dp, "world_size": pp * dp,
                 "mesh": {"pp": pp, "dp": dp}}
        return fsdp_stage_row(config, place, n_params, step, t0, mt.CATS, state)
    config = H.base_config(
        model_name, micro_batch, seq, "bf16", "adamw", "sdpa", gc,
        loss="hf", pp=pp, pp_schedule=schedule, microbatches=mb, virtual_stages=virtual,
        stage_layers=[list(bounds[i]) for i in my_stages], pg="fake", return_outputs=False,
        lm_head="own weight on the last stage" if cfg.tie_word_embeddings else "untied",
        **({"tp": tp, "sp": bool(sp), "lp": False, "tp_plan": "torchtitan-llama (HF names), per stage",
            "rank": stage_rank * tp, "world_size": pp * tp} if tp > 1 else {}))
    return H.step_row(config, H.versions(), n_params, step, t0, phases=("pipe", "opt"),
                      after={"versions": {"query": query, "stage": stage_rank}})


def fsdp_stage_row(config, place, n_params, step, t0, cats, state):
    """A stage's row with FSDP2: the pipeline's row (phases pipe and opt; the query, stage and the
    rank's place after `versions`) with the peak split by FSDPMemTracker's categories (as
    harness.rank_row: the optimizer step's temporaries last, everything but the model state and
    the inputs as act_temp_at_peak), the model state read from the local shards, and the readings
    at the start and after the schedule whole."""
    row = H.step_row(config, H.versions(), n_params, step, t0, phases=("pipe", "opt"),
                     after={"versions": place})
    return H.split_by_tracker(row, step, cats, state)


def measure_all_stages(a):
    """Every stage in its own process (harness.run_ranks); each row also gets `stage_peaks` and
    `busiest_stage`."""
    rows = H.run_ranks(__file__, ["--config", a.config, *argv_of(entry_of_args(a))], range(a.pp), "--stage")
    peaks = [r["peak_bytes"] for r in rows]
    busiest = max(range(len(peaks)), key=lambda i: peaks[i])
    for r in rows:
        r["stage_peaks"] = peaks
        r["busiest_stage"] = busiest
    return rows


# a grid entry's keys (a row's config's) -> the command line's flags
FLAGS = {"model": "--model-name", "preset": "--preset", "pp": "--pp", "microbatches": "--mb",
         "pp_schedule": "--schedule", "virtual_stages": "--virtual", "batch": "--batch", "seq": "--seq",
         "gc": "--gc", "tp": "--tp", "sp": "--sp", "dp": "--dp", "raf": "--raf", "precision": "--precision",
         "emit_stage": "--emit-stage"}


def argv_of(entry):
    """The command line (without --config) of a grid entry, a row's config or entry_of(row)."""
    e = {k: int(v) if k in ("sp", "raf") and isinstance(v, bool) else v for k, v in entry.items()}
    return H.flags(e, FLAGS)


def entry_of_args(a):
    """The options of a command line as an entry (what every stage's process is given)."""
    return {"model": a.model_name, "preset": a.preset, "pp": a.pp, "microbatches": a.mb, "pp_schedule": a.schedule,
            "virtual_stages": a.virtual, "batch": a.batch, "seq": a.seq, "gc": a.gc, "tp": a.tp, "sp": a.sp,
            "dp": a.dp, "raf": a.raf, "precision": a.precision}


def entry_of(row):
    """A stage's row (or its config) as an entry: the pipeline's options are its config's; the stage
    to write is the row's `stage` (for a config alone: its `rank` // (tp x dp) with TP or FSDP2, else the stage
    whose layers are its first `stage_layers`). Rows named DEFAULT_MODEL were measured on
    DEFAULT_CONFIG (there is no config.json of that name)."""
    c = row.get("config", row)
    e = dict(c)
    if c["model"] == DEFAULT_MODEL:
        e["config"] = DEFAULT_CONFIG
    if "stage" in row:
        e["emit_stage"] = row["stage"]
    elif "rank" in c:
        e["emit_stage"] = c["rank"] // (c.get("tp", 1) * c.get("dp", 1))
    else:
        with open(e.get("config") or H.config_path(c["model"])) as f:
            n_layers = json.load(f)["num_hidden_layers"]
        bounds = split_layers(n_layers, c["pp"] * c["virtual_stages"])
        e["emit_stage"] = bounds.index(tuple(c["stage_layers"][0]))
    return e


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--model-name", default=DEFAULT_MODEL)
    ap.add_argument("--preset", default=None, help="estimator preset name for the query (default: model name)")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--mb", type=int, default=4, help="number of micro-batches")
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    ap.add_argument("--virtual", type=int, default=1, help="stages per rank (interleaved1f1b)")
    ap.add_argument("--batch", type=int, default=1, help="sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of every stage (torchtitan plan)")
    ap.add_argument("--sp", type=int, default=1, help="sequence parallelism with --tp (1/0)")
    ap.add_argument("--dp", type=int, default=1,
                    help="data-parallel degree of every stage: FSDP2 on a (pp, dp) mesh (torchtitan)")
    ap.add_argument("--raf", type=int, default=0,
                    help="with --dp: FSDP2 reshard_after_forward (1/0; torchtitan turns it off under PP)")
    ap.add_argument("--precision", choices=["bf16", "mixed-bf16"], default="bf16",
                    help="bf16 parameters, or with --dp fp32 parameters under MixedPrecisionPolicy(bf16, fp32)")
    ap.add_argument("--stage", type=int, default=None, help="measure this stage alone (no stage_peaks)")
    ap.add_argument("--emit-stage", type=int, default=None,
                    help="measure every stage, write only this stage's row (with stage_peaks)")
    H.add_run_args(ap)
    a = ap.parse_args(argv)
    done = H.dispatch(a, __file__, argv_of, main, entry_of=entry_of)
    if done is not None:
        return done
    if a.schedule == "interleaved1f1b" and a.virtual < 2:
        a.virtual = 2
    if a.stage is not None:
        return H.emit(measure_stage(a.config, a.model_name, a.pp, a.mb, a.schedule, a.gc, a.stage, seq=a.seq,
                                    micro_batch=a.batch, virtual=a.virtual, preset=a.preset, tp=a.tp, sp=a.sp,
                                    dp=a.dp, raf=a.raf, precision=a.precision))
    rows = measure_all_stages(a)
    for r in rows:
        if a.emit_stage is None or r["stage"] == a.emit_stage:
            H.emit(r, a.out)
    sys.stderr.write(f"pp={a.pp} tp={a.tp} dp={a.dp} raf={a.raf} {a.precision} mb={a.mb} {a.schedule} gc={a.gc}: stage peaks GiB "
                     f"{[round(r['peak_bytes'] / 2**30, 2) for r in rows]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
