#!/usr/bin/env python3
"""Per-rank peak memory of one distributed training step (FSDP2, tensor parallel, FSDP2 x TP),
measured on the CPU with FakeTensorMode and a fake process group.

Same conventions as measure.py (everything imported from it, its behaviour unchanged): the model is
built from a config.json with random weights inside FakeTensorMode, the CUDA emulation is installed
(512-byte rounding of every storage, CUDA SDPA kernel choice, native_dropout, CUDA autocast lists),
one untracked warm-up step, then one tracked step: forward (+loss), backward, AdamW(foreach).step(),
zero_grad(set_to_none=True); the peak of each phase, the phase of the overall peak and the
categories at the peak.

The distributed part:
  * dist.init_process_group("fake", rank=0, world_size=W, store=FakeStore()): a process group
    whose collectives do nothing but whose shapes are those of rank 0 (the busiest rank when the
    shards are uneven: torch.chunk gives rank 0 the ceiling). init_device_mesh("cpu", ...) over the
    dims needed (dp, tp).
  * FSDP2: fully_shard(layer) for every decoder layer, then fully_shard(model), with
    reshard_after_forward True/False and for "mixed-bf16" MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32) on fp32 weights; "bf16" = bf16 weights, no policy.
    Tracker: torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker (categories sharded /
    unsharded params and grads, all-gather and reduce-scatter buffers), with measure.py's rounding.
  * TP: torchtitan's (pre-0.3) Llama plan on the HF module names via parallelize_module (see
    apply_tp); optional sequence parallel (sp) and loss parallel (lp). Tracker: measure.PhaseTracker
    (a MemTracker: it lets DTensor desugar and counts only the local tensors).
  * FSDP2 x TP: TP on the "tp" dim of a 2-D (dp, tp) mesh first, then fully_shard on "dp".

Usage:
  python validation/distributed.py --config validation/configs/llama-1b.json --preset llama3.2-1b \
      --strategy tp --world 4 --tp 4 --batch 1 --seq 4096 --precision bf16 --gc [--sp] [--lp] [--out f.jsonl]
  python validation/distributed.py --config ... --strategy fsdp2 --world 8 --precision mixed-bf16 --raf 1
  python validation/distributed.py --grid validation/grid-distributed.json --out rows.jsonl
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

_HERE = os.path.dirname(os.path.abspath(__file__))
# validation/peft.py would shadow the peft library that transformers may import
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.append(_HERE)
import measure as M  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools import mem_tracker as _mt  # noqa: E402
import torch.distributed._tools.fake_collectives  # noqa: E402,F401  (fake kernels of c10d ops)
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402

R = M.ROUND_BYTES
DEBUG_C10D = os.environ.get("DIST_DEBUG_C10D") == "1"
DEBUG_BIG = int(os.environ.get("DIST_DEBUG_BIG", "0"))  # print outputs of at least this many bytes

# Row category name -> tracker reference types (MemTracker's and FSDPMemTracker's)
_FSDP_CATS = [
    ("parameter", _FSDPRefType.SHARDED_PARAM),
    ("unsharded_param", _FSDPRefType.UNSHARDED_PARAM),
    ("all_gather", _FSDPRefType.ALL_GATHER),
    ("buffer", _FSDPRefType.BUFFER),
    ("gradient", _FSDPRefType.SHARDED_GRAD),
    ("unsharded_grad", _FSDPRefType.UNSHARDED_GRAD),
    ("reduce_scatter", _FSDPRefType.REDUCE_SCATTER),
    ("activation", _FSDPRefType.ACT),
    ("temp", _FSDPRefType.TEMP),
    ("optstate", _FSDPRefType.OPT),
    ("other", _FSDPRefType.INP),
]


def _flat(snap, cats):
    out = {k: 0 for k, _ in cats}
    for dev_snap in snap.values():
        for k, ref in cats:
            out[k] += int(dev_snap.get(ref, 0))
    out["total"] = sum(out[k] for k, _ in cats)
    return out


class _TrackerMixin:
    """measure.PhaseTracker's additions: the fused attention kernels' philox seed/offset are CPU
    tensors on a GPU (cost nothing); only the tracker-wide peak is kept (fast)."""
    CATS = M.CATS

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types, args, kwargs)
        if DEBUG_C10D and res is not NotImplemented and ("c10d" in str(func)):
            print(f"[c10d] {func} {getattr(self, '_fsdp_state', None)} "
                  f"{[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}", file=sys.stderr)
        if DEBUG_BIG and res is not NotImplemented:
            for t in (res if isinstance(res, (tuple, list)) else [res]):
                if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) \
                        and t.untyped_storage().nbytes() >= DEBUG_BIG:
                    print(f"[big] {func} {tuple(t.shape)} {t.dtype} {t.untyped_storage().nbytes() / 2**20:.0f} MiB"
                          f" now {self._curr_mem_snap and sum(v[_mt._TOTAL_KEY] for v in self._curr_mem_snap.values()) / 2**30:.3f} GiB",
                          file=sys.stderr)
        if func in M._CPU_SIDE_OUTPUTS and isinstance(res, tuple):
            for i in M._CPU_SIDE_OUTPUTS[func]:
                t = res[i]
                if isinstance(t, torch.Tensor):
                    w = self._WINFO.get(t.untyped_storage(), (None, None))[0]
                    if w is not None and w.mem_consumed > 0:
                        self._update_snap(_mt._UpdateType.DEL, w)
                        w.mem_consumed = 0
                        w.size = t.untyped_storage().size()
                        w._calculate_mem_consumed = lambda: 0
        return res

    def _update_peak_stats(self, peak_state):
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_mt._TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_mt._TOTAL_KEY]
                self._peak_mem_snap[dev] = copy.deepcopy(dev_snap)

    def snap(self):
        return _flat(self.get_tracker_snapshot("current"), self.CATS)

    def reset_peak(self):
        s = self.get_tracker_snapshot("current")
        self._peak_mem = {d: v[_mt._TOTAL_KEY] for d, v in s.items()}
        self._peak_mem_snap = s

    def peak(self):
        return _flat(self.get_tracker_snapshot("peak"), self.CATS)


class TPTracker(_TrackerMixin, _mt.MemTracker):
    CATS = M.CATS


class FSDPTracker(_TrackerMixin, FSDPMemTracker):
    """FSDPMemTracker tags the all-gather output / reduce-scatter input only when the collective is
    issued, after the buffer was allocated (as Activation / Temp): the peak snapshot taken at the
    allocation would show them under act/temp. Tag them at allocation instead (FSDP2 allocates
    them through DefaultAllGather.allocate / DefaultReduceScatter.allocate; the reduce-scatter
    OUTPUT also comes from there and becomes the sharded gradient after post-backward)."""
    CATS = _FSDP_CATS
    force_ref = None

    def _track(self, reftype, t):
        return super()._track(FSDPTracker.force_ref or reftype, t)


def _install_mesh_outside_fake():
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


def _install_fsdp_alloc_tags():
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as C

    def wrap(cls, ref):
        orig = cls.allocate

        def allocate(self, *a, **k):
            prev = FSDPTracker.force_ref
            FSDPTracker.force_ref = ref
            try:
                return orig(self, *a, **k)
            finally:
                FSDPTracker.force_ref = prev
        cls.allocate = allocate
    wrap(C.DefaultAllGather, _FSDPRefType.ALL_GATHER)
    wrap(C.DefaultReduceScatter, _FSDPRefType.REDUCE_SCATTER)


# ----------------------------------------------------------------------------------------------
# Parallelism
# ----------------------------------------------------------------------------------------------
def decoder_layers(model):
    return list(model.model.layers)


def _no_parallel_style():
    from torch.distributed.tensor import distribute_module
    from torch.distributed.tensor.parallel import ParallelStyle

    class NoParallel(ParallelStyle):
        """torchtitan.distributed.NoParallel: replicate the module's parameters, wrap the input as a
        Replicate DTensor, return a local tensor."""

        def _apply(self, module, device_mesh):
            def part(name, mod, mesh):
                for n, p in list(mod.named_parameters(recurse=False)):
                    if not isinstance(p, DTensor):
                        mod.register_parameter(n, torch.nn.Parameter(
                            distribute_tensor(p.data, mesh, [Replicate()]), requires_grad=p.requires_grad))

            def inp(mod, inputs, mesh):
                x = inputs[0]
                if not isinstance(x, DTensor):
                    x = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                return (x, *inputs[1:])

            def out(mod, outputs, mesh):
                return outputs.to_local() if isinstance(outputs, DTensor) else outputs

            return distribute_module(module, device_mesh, part, inp, out)
    return NoParallel



def layer_tp_plan(sp):
    """torchtitan's plan for one decoder layer (HF names): q/k/v/gate/up column-parallel, o/down
    row-parallel; with sequence parallelism the norms on token slices and the inputs gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1) if sp else Replicate()),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1) if sp else Replicate()),
    }
    if sp:
        plan.update({
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        })
    return plan

def apply_tp(model, tp_mesh, sp, lp):
    """torchtitan's (<= 0.2) Llama TP plan (parallelize_llama.apply_tp) on HF module names."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    NoParallel = _no_parallel_style()
    tied = model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    root_plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(),
                                              output_layouts=Shard(1) if sp else Replicate()),
        "lm_head": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(),
                                   output_layouts=Shard(-1) if lp else Replicate(),
                                   use_local_output=not lp),
    }
    if sp:
        root_plan["model.norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, root_plan)
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, layer_tp_plan(sp))
        # HF attention reads the local head count from the projections (view(..., -1, head_dim))
    if tied:
        # parallelize_module replaced embed_tokens.weight by a new DTensor Parameter; both are
        # Shard(0) over the vocab: re-tie so that the model keeps one (sharded) embedding matrix.
        model.lm_head.weight = model.model.embed_tokens.weight
    # Modules the plan leaves alone (norms without SP, Qwen3's q_norm/k_norm): torchtitan's NoParallel
    # (parameters replicated DTensors, input wrapped as a Replicate DTensor (a view), output back to a
    # local tensor), so that foreach AdamW / FSDP2 see no plain-Tensor/DTensor mix. Same bytes.
    for mod in model.modules():
        if any(not isinstance(p, DTensor) for p in mod.parameters(recurse=False)):
            NoParallel()._apply(mod, tp_mesh)
    return tied


def apply_fsdp(model, dp_mesh, raf, mp):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = {"mesh": dp_mesh}
    if mp:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, reshard_after_forward=raf, **kw)
    # torchtitan: the root's reshard_after_forward=False would keep embed/lm_head/norm unsharded;
    # it uses the same setting (the last layers are not resharded anyway: backward starts there).
    fully_shard(model, reshard_after_forward=raf, **kw)


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------
def local_bytes(tensors):
    """Sum of per-rank storage bytes (512-rounded), local shards of DTensors, deduplicated."""
    seen, tot = set(), 0
    for t in tensors:
        if t is None:
            continue
        if isinstance(t, DTensor):
            t = t._local_tensor
        st = t.untyped_storage()
        if st._cdata in seen:
            continue
        seen.add(st._cdata)
        tot += int(math.ceil(st.nbytes() / R) * R)
    return tot


def build_query(o, world):
    q = {"m": "arch"}
    if o.preset:
        q["model"] = o.preset
    q.update({"b": o.batch, "s": o.seq, "r": o.precision.replace("_", "-"), "o": "adamw",
              "gc": "full" if o.gc else "none", "attn": o.attn, "n": world})
    shard = "fsdp2" if o.strategy in ("fsdp2", "fsdp2-tp", "fsdp2-cp") else "ddp"
    q["shard"] = shard
    q["tp"] = o.tp if o.strategy in ("tp", "fsdp2-tp") else 1
    q["sp"] = int(bool(o.sp))
    q["lp"] = int(bool(o.lp))
    if shard == "fsdp2":
        q["raf"] = int(bool(o.raf))
    q["cp"] = o.cp if o.strategy in ("cp", "fsdp2-cp") else 1
    q["ep"] = 1
    q["off"] = "none"
    s = "&".join(f"{k}={v}" for k, v in q.items())
    return s


_PROP_MODE = None


def install_propagation_mode():
    """DTensor derives an op's global output shape by running the op on fake tensors of the GLOBAL
    shape (ShardingPropagator._propagate_tensor_meta_non_cached: `detect_fake_mode() or
    FakeTensorMode()`). On a GPU that costs nothing (fake tensors). Under our FakeTensorMode,
    detect_fake_mode() returns OUR mode, which is also the tracker's entry mode, so MemTracker
    counts those global-shape phantoms (e.g. loss_parallel's log_softmax / nll_loss_backward
    handlers: a full (B*S, vocab) fp32 tensor each time the cache misses). Give the propagation a
    mode of its own: MemTracker skips ops whose active fake mode is not its entry mode."""
    global _PROP_MODE
    import torch.distributed.tensor._sharding_prop as sp
    if _PROP_MODE is None:
        _PROP_MODE = FakeTensorMode(allow_non_fake_inputs=True)
        sp.detect_fake_mode = lambda *a, **k: _PROP_MODE


def cp_context(cp_mesh, buffers, o):
    """torchtitan's train context for context parallelism: torch's context_parallel(cp_mesh,
    buffers=[inputs, labels, position ids], buffer_seq_dims=[1, 1, 1]) around forward and backward.
    It shards the buffers in place along the sequence (after the head-tail "round-robin" reorder
    when load balancing is on) and monkey-patches F.scaled_dot_product_attention (here measure.py's
    CUDA emulation, so the kernel choice stays) to wrap q/k/v as Shard(2) DTensors; the flash /
    efficient SDPA ops then dispatch to _templated_ring_attention[_backward]."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method
    set_rotate_method(o.cp_rotate)
    buffers = [b for b in buffers if b is not None]
    # _distribute_function patches `setattr(F, fn.__name__, wrapper)`: measure.py's emulation is
    # named _cuda_sdpa, so without this the patch lands on F._cuda_sdpa and HF's call to
    # F.scaled_dot_product_attention never reaches ring attention (plain local SDPA, silently).
    F.scaled_dot_product_attention.__name__ = "scaled_dot_product_attention"

    @contextlib.contextmanager
    def ctx():
        _cp_options.enable_load_balance = bool(o.cp_lb)  # context_parallel reads it at entry
        with context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=[1] * len(buffers)):
            yield
    return ctx


def measure(o):
    M.install_cuda_emulation()
    if not o.naive_prop:
        install_propagation_mode()
    _install_fsdp_alloc_tags()
    _install_mesh_outside_fake()
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    t0 = time.time()
    torch.manual_seed(0)
    tp = o.tp if o.strategy in ("tp", "fsdp2-tp") else 1
    cp = o.cp if o.strategy in ("cp", "fsdp2-cp") else 1
    world = o.world
    if world % (tp * cp):
        raise SystemExit("world must be a multiple of tp x cp")
    dp = world // (tp * cp)
    cp_mesh = None
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    if o.strategy == "fsdp2":
        mesh = init_device_mesh("cpu", (dp,), mesh_dim_names=("dp",))
        dp_mesh, tp_mesh = mesh, None
    elif o.strategy == "tp":
        if dp != 1:
            raise SystemExit("--strategy tp: world must equal tp")
        mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
        dp_mesh, tp_mesh = None, mesh
    elif o.strategy == "fsdp2-tp":
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    elif o.strategy == "cp":
        if dp != 1:
            raise SystemExit("--strategy cp: world must equal cp (no DDP on the fake group)")
        mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
        dp_mesh, tp_mesh, cp_mesh = None, None, mesh
    elif o.strategy == "fsdp2-cp":
        # torchtitan: FSDP2 shards over the flattened (dp, cp) mesh; ring attention runs on "cp"
        mesh = init_device_mesh("cpu", (dp, cp), mesh_dim_names=("dp", "cp"))
        dp_mesh, tp_mesh, cp_mesh = mesh["dp", "cp"]._flatten("dp_cp"), None, mesh["cp"]
    else:
        raise SystemExit(f"unknown strategy {o.strategy}")

    cfg, arch = M.load_config(o.config, o.attn)
    mixed = o.precision == "mixed-bf16"
    amp = o.precision == "amp_bf16"
    dtype = torch.bfloat16 if o.precision == "bf16" else torch.float32
    if (mixed or o.strategy == "tp") and o.precision == "mixed-bf16" and dp_mesh is None:
        raise SystemExit("mixed-bf16 needs FSDP2 (MixedPrecisionPolicy)")
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    tied = None
    with fake:
        model = M.build_model(cfg, arch, o.attn, dtype)
        if o.gc:
            model.gradient_checkpointing_enable()
        model.train(True)
        model.config.use_cache = False
        n_params = sum(p.numel() for p in model.parameters())
        if tp_mesh is not None:
            tied = apply_tp(model, tp_mesh, o.sp, o.lp)
        if dp_mesh is not None:
            apply_fsdp(model, dp_mesh, bool(o.raf), mixed)
        ids = torch.randint(0, M.text_vocab(cfg), (o.batch, o.seq), dtype=torch.long)
        labels = ids
        # with SP the embedding output is (B, S/tp, H): HF would derive the positions from it
        pos = torch.arange(o.seq, dtype=torch.long).unsqueeze(0) if (o.sp or cp_mesh is not None) else None
        if cp_mesh is not None:
            labels = ids.clone()  # context_parallel shards its buffers in place, one by one
        shift_labels = None
        if o.lp:
            # what HF's ForCausalLMLoss does (pad with -100, shift by one), done by the data loader
            shift_labels = F.pad(ids, (0, 1), value=-100)[..., 1:].contiguous()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        from torch.distributed.tensor.parallel import loss_parallel
        if o.lp:
            # torchtitan: the model returns the vocab-sharded logits, the loss is computed outside.
            # Replace the instance's forward (not a call to model.model): FSDP2's root hooks must run.
            def lp_forward(input_ids=None, position_ids=None):
                h = model.model(input_ids=input_ids, position_ids=position_ids).last_hidden_state
                return model.lm_head(h)
            model.forward = lp_forward

        def fwd():
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
            with ctx:
                if not o.lp:
                    kw = {"position_ids": pos} if pos is not None else {}
                    return model(input_ids=ids, labels=labels, **kw).loss
                logits = model(input_ids=ids, position_ids=pos)  # lp_forward: DTensor, Shard(-1)
                with loss_parallel():
                    return F.cross_entropy(logits.flatten(0, 1).float(), shift_labels.flatten(0, 1))

        bwd_ctx = loss_parallel if o.lp else contextlib.nullcontext
        train_ctx = contextlib.nullcontext
        if cp_mesh is not None:
            train_ctx = cp_context(cp_mesh, [ids, labels, pos], o)


        # warm-up (untracked): optimizer states, FSDP lazy init
        with train_ctx():
            loss = fwd()
            with bwd_ctx():
                loss.backward()
            del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

        if dp_mesh is not None:
            mt = FSDPTracker(model, opt)
            mt.track_inputs((ids, shift_labels, pos) + ((labels,) if labels is not ids else ()))
        else:
            mt = TPTracker()
            mt.track_external(model, ids)
            if shift_labels is not None:
                mt.track_external(shift_labels)
            if pos is not None:
                mt.track_external(pos)
            if labels is not ids:
                mt.track_external(labels)
            mt.track_external(opt)
        phase_peaks = {}
        with mt:
            start = mt.snap()
            mt.reset_peak()
            with train_ctx():
                loss = fwd()
                end_fwd = mt.snap()
                phase_peaks["fwd"] = mt.peak()
                mt.reset_peak()
                with bwd_ctx():
                    loss.backward()
                del loss
            phase_peaks["bwd"] = mt.peak()
            after_bwd = mt.snap()
            grad_bytes_local = local_bytes([p.grad for p in model.parameters()])
            mt.reset_peak()
            opt.step()
            opt.zero_grad(set_to_none=True)
            phase_peaks["opt"] = mt.peak()
            end = mt.snap()

    param_bytes = local_bytes(list(model.parameters()))
    opt_state_bytes = local_bytes([v for s in opt.state.values() for v in s.values()
                                   if isinstance(v, torch.Tensor)])
    peak_phase = max(phase_peaks, key=lambda k: phase_peaks[k]["total"])
    pk = phase_peaks[peak_phase]
    opt_step_temp = max(0, pk["optstate"] - start["optstate"])
    at_peak = dict(pk)
    at_peak["optstate"] = pk["optstate"] - opt_step_temp
    at_peak["opt_step_temp"] = opt_step_temp
    cats = [k for k, _ in mt.CATS]
    row = {
        "config": {
            "model": o.model_name, "batch": o.batch, "seq": o.seq, "image": 224,
            "precision": o.precision, "optimizer": "adamw", "attn": o.attn, "gc": bool(o.gc),
            "mode": "fake", "tracker": "fsdp2memtracker" if dp_mesh is not None else "memtracker",
            "emulate_cuda": True, "round_bytes": R, "opt_impl": "foreach", "warmup_steps": 1,
            "strategy": o.strategy, "sp": bool(o.sp), "lp": bool(o.lp),
            "reshard_after_forward": bool(o.raf) if dp_mesh is not None else None,
            "mp_policy": "param_dtype=bf16,reduce_dtype=fp32" if mixed else None,
            "tp_plan": "torchtitan-llama (HF names)" if tp_mesh is not None else None,
            "tied_embeddings": tied, "process_group": "fake",
            "dtensor_prop_isolated": not o.naive_prop,
            **({"cp_load_balance": "head-tail (round robin)" if o.cp_lb else None,
                "cp_rotate_method": o.cp_rotate,
                "cp_buffers": "input_ids, labels, position_ids (seq dim 1)",
                "loss": "hf (labels = the local slice, shifted by HF within it)"}
               if cp_mesh is not None else {}),
        },
        "query": build_query(o, world),
        "rank": 0,
        "world_size": world,
        "mesh": {"dp": dp, "tp": tp, "cp": cp},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "torchvision": None},
        "n_params": n_params,
        "param_bytes": param_bytes,
        "buffer_bytes": start["buffer"],
        "input_bytes": start["other"],
        "grad_bytes": grad_bytes_local,
        "opt_state_bytes": opt_state_bytes,
        "model_state_bytes": param_bytes + start["buffer"] + grad_bytes_local + opt_state_bytes,
        "peak_bytes": pk["total"],
        "peak_phase": peak_phase,
        "at_peak": at_peak,
        "act_temp_at_peak": pk["total"] - (at_peak["parameter"] + at_peak["buffer"] + at_peak["gradient"]
                                           + at_peak["optstate"] + at_peak["other"]),
        "saved_act_bytes": end_fwd["total"] - start["total"],
        "phase_peak_bytes": {k: phase_peaks[k]["total"] for k in ("fwd", "bwd", "opt")},
        "phase_peaks": phase_peaks,
        "start_bytes": start["total"],
        "start": start,
        "end_bytes": end["total"],
        "after_bwd_bytes": after_bwd["total"],
        "after_bwd": after_bwd,
        "categories": cats,
        "time_s": round(time.time() - t0, 2),
        "sdpa_kernels": dict(M.SDPA_LOG),
    }
    dist.destroy_process_group()
    return row


def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--model-name")
    ap.add_argument("--preset", help="the estimator's preset key for the query (else config_file)")
    ap.add_argument("--strategy", choices=["fsdp2", "tp", "fsdp2-tp", "cp", "fsdp2-cp"], default="fsdp2")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--cp", type=int, default=1, help="context-parallel degree (--strategy cp / fsdp2-cp)")
    ap.add_argument("--cp-lb", type=int, default=1,
                    help="ring attention load balancing (head-tail round robin, torchtitan's default) 1/0")
    ap.add_argument("--cp-rotate", choices=["allgather", "alltoall"], default="allgather",
                    help="set_rotate_method (torchtitan's default: allgather)")
    ap.add_argument("--sp", type=int, default=0)
    ap.add_argument("--lp", type=int, default=0)
    ap.add_argument("--raf", type=int, default=1, help="FSDP2 reshard_after_forward (1/0)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", choices=["bf16", "mixed-bf16", "fp32", "amp_bf16"], default="bf16")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--naive-prop", action="store_true",
                    help="do not isolate DTensor's global-shape propagation (shows its phantom tensors)")
    ap.add_argument("--out")
    ap.add_argument("--grid")
    return ap


def main(argv=None):
    o = parser().parse_args(argv)
    if o.grid:
        return run_grid(o.grid, o.out)
    if not o.config:
        parser().error("--config or --grid")
    o.model_name = o.model_name or os.path.splitext(os.path.basename(o.config))[0]
    row = measure(o)
    if not o.preset:
        row["config_file"] = os.path.basename(o.config)
    kernels = row.pop("sdpa_kernels")
    line = json.dumps(row)
    print(line)
    pk = row["at_peak"]
    print(f"[distributed] {o.model_name} {row['query']}: peak {row['peak_bytes']} B = "
          f"{row['peak_bytes'] / 2**30:.3f} GiB in {row['peak_phase']} "
          f"(phases {', '.join(f'{k} {v / 2**30:.3f}' for k, v in row['phase_peak_bytes'].items())}); "
          f"at peak {', '.join(f'{k}={v / 2**30:.3f}' for k, v in pk.items() if v and k != 'total')}; "
          f"sdpa {kernels}; {row['time_s']} s", file=sys.stderr)
    if o.out:
        with open(o.out, "a") as f:
            f.write(line + "\n")
    return 0


GRID_KEYS = ["config", "model", "preset", "strategy", "world", "tp", "cp", "cp_lb", "cp_rotate", "sp", "lp",
             "raf", "batch", "seq", "precision", "attn", "gc"]


def run_grid(grid_path, out):
    import subprocess
    with open(grid_path) as f:
        grid = json.load(f)
    here = os.path.dirname(os.path.abspath(grid_path))
    fails = 0
    for g in grid:
        cfgp = g["config"]
        if not os.path.isabs(cfgp) and not os.path.exists(cfgp):
            cfgp = os.path.join(here, cfgp)
        cmd = [sys.executable, os.path.abspath(__file__), "--config", cfgp, "--model-name", g["model"]]
        if g.get("preset"):
            cmd += ["--preset", g["preset"]]
        for k in ["strategy", "world", "tp", "cp", "cp_lb", "cp_rotate", "sp", "lp", "raf", "batch", "seq",
                  "precision", "attn"]:
            if k in g:
                cmd += [f"--{k.replace('_', '-')}", str(int(g[k]) if isinstance(g[k], bool) else g[k])]
        if g.get("gc"):
            cmd.append("--gc")
        if out:
            cmd += ["--out", out]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            fails += 1
            print(f"[grid] FAILED: {g}", file=sys.stderr)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
