#!/usr/bin/env python3
"""Per-rank peak memory of one distributed training step (FSDP2, tensor parallel, FSDP2 x TP,
context parallel), measured on the CPU with FakeTensorMode and a fake process group.

A recipe of the harness (validation/harness/): the model is built from a config.json with random
weights inside FakeTensorMode, the CUDA emulation is installed (512-byte rounding of every storage,
CUDA SDPA kernel choice, native_dropout, CUDA autocast lists), the harness's step: one untracked
warm-up step, then one tracked step: forward (+loss), backward, AdamW(foreach).step(),
zero_grad(set_to_none=True); the peak of each phase, the phase of the overall peak and the
categories at the peak. What it varies: the parallelism.

The distributed part:
  * the harness's fake world (harness/ranks.py): dist.init_process_group("fake", rank=0,
    world_size=W, store=FakeStore()), a process group whose collectives do nothing but whose
    shapes are those of rank 0 (the busiest rank when the shards are uneven: torch.chunk gives
    rank 0 the ceiling). init_device_mesh("cpu", ...) over the dims needed (dp, tp, cp).
  * FSDP2: fully_shard(layer) for every decoder layer, then fully_shard(model), with
    reshard_after_forward True/False and for "mixed-bf16" MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32) on fp32 weights; "bf16" = bf16 weights, no policy.
    Tracker: torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker with the harness's phase API
    (harness.PhaseTrackerMixin; categories sharded / unsharded params and grads, all-gather and
    reduce-scatter buffers) and rounding.
  * FSDP1 (--strategy fsdp1): FullyShardedDataParallel as accelerate 1.x wraps it (fsdp1_kwargs; sharding
    strategy, decoder-layer or no wrap, use_orig_params, backward prefetch, MixedPrecision(bf16, bf16, bf16),
    CPUOffload), tracker FSDP1Tracker; see validation/FSDP1.md.
  * TP: torchtitan's (pre-0.3) Llama plan on the HF module names via parallelize_module (see
    apply_tp); optional sequence parallel (sp) and loss parallel (lp, around the loss and the
    backward). Tracker: harness.PhaseTracker (a MemTracker: it lets DTensor desugar and counts only
    the local tensors).
  * FSDP2 x TP: TP on the "tp" dim of a 2-D (dp, tp) mesh first, then fully_shard on "dp".
  * CP: torch's context_parallel around every forward and backward (cp_context), FSDP2 over the
    flattened (dp, cp) mesh with fsdp2-cp.

Usage:
  python validation/distributed.py --config validation/configs/llama-1b.json --preset llama3.2-1b \
      --strategy tp --world 4 --tp 4 --batch 1 --seq 4096 --precision bf16 --gc [--sp] [--lp] [--out f.jsonl]
  python validation/distributed.py --config ... --strategy fsdp2 --world 8 --precision mixed-bf16 --raf 1
  python validation/distributed.py --grid validation/grid-distributed.json --out rows.jsonl
  python validation/distributed.py --from-row "$(sed -n 1p core/tests/fixtures/distributed-measured.jsonl)"
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
# validation/peft.py would shadow the peft library that transformers may import
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.append(_HERE)
import harness as H  # noqa: E402
import float8 as F8  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools import mem_tracker as _mt  # noqa: E402
import torch.distributed._tools.fake_collectives  # noqa: E402,F401  (fake kernels of c10d ops)
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402

DEBUG_C10D = os.environ.get("DIST_DEBUG_C10D") == "1"
# Cross-check only (FSDP1.md): real tensors on a real gloo group, launched by torchrun (RANK, WORLD_SIZE,
# MASTER_ADDR/PORT from the environment); the row is this rank's. Use --attn eager (the CUDA SDPA
# emulation needs fake tensors).
REAL_GLOO = os.environ.get("DIST_REAL_GLOO") == "1"
DEBUG_BIG = int(os.environ.get("DIST_DEBUG_BIG", "0"))  # print outputs of at least this many bytes

# Row category name -> FSDPMemTracker reference types
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


class _DebugDispatch:
    """With DIST_DEBUG_C10D=1, every c10d op; with DIST_DEBUG_BIG=N, every output of N bytes or more."""

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
        return res


class TPTracker(_DebugDispatch, H.PhaseTracker):
    pass


class FSDPTracker(_DebugDispatch, H.PhaseTrackerMixin, FSDPMemTracker):
    """FSDPMemTracker tags the all-gather output / reduce-scatter input only when the collective is
    issued, after the buffer was allocated (as Activation / Temp): the peak snapshot taken at the
    allocation would show them under act/temp. Tag them at allocation instead (FSDP2 allocates
    them through DefaultAllGather.allocate / DefaultReduceScatter.allocate; the reduce-scatter
    OUTPUT also comes from there and becomes the sharded gradient after post-backward)."""
    CATS = _FSDP_CATS
    force_ref = None

    def _track(self, reftype, t):
        return super()._track(FSDPTracker.force_ref or reftype, t)


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
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(base.model.layers)


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
    replicate_the_rest(model, tp_mesh)
    return tied


def replicate_the_rest(root, tp_mesh):
    """Modules the plan leaves alone (norms without SP, Qwen3's q_norm/k_norm): torchtitan's NoParallel
    (parameters replicated DTensors, input wrapped as a Replicate DTensor (a view), output back to a
    local tensor), so that foreach AdamW / FSDP2 see no plain-Tensor/DTensor mix. Same bytes."""
    NoParallel = _no_parallel_style()
    for mod in root.modules():
        if any(not isinstance(p, DTensor) for p in mod.parameters(recurse=False)):
            NoParallel()._apply(mod, tp_mesh)


def apply_fsdp(model, dp_mesh, raf, mp, shard_embeddings=False):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = {"mesh": dp_mesh}
    if mp:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if shard_embeddings:
        # torchtune's custom_sharded_layers ['tok_embeddings', 'output'], sharded like the layers
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        fully_shard(base.model.embed_tokens, reshard_after_forward=raf, **kw)
        fully_shard(base.lm_head, reshard_after_forward=raf, **kw)
    for layer in decoder_layers(model):
        fully_shard(layer, reshard_after_forward=raf, **kw)
    # torchtitan: the root's reshard_after_forward=False would keep embed/lm_head/norm unsharded;
    # it uses the same setting (the last layers are not resharded anyway: backward starts there).
    fully_shard(model, reshard_after_forward=raf, **kw)

F1_SHARDING = {"full": "FULL_SHARD", "grad-op": "SHARD_GRAD_OP", "hybrid": "HYBRID_SHARD", "no-shard": "NO_SHARD"}
F1_PREFETCH = {"pre": "BACKWARD_PRE", "post": "BACKWARD_POST", "none": None}


def fsdp1_kwargs(model, o, mixed, world):
    """FullyShardedDataParallel(model, **kwargs) as accelerate 1.x builds them for fsdp_version=1
    (accelerator.py prepare_model, FullyShardedDataParallelPlugin.__post_init__ /
    set_auto_wrap_policy / set_mixed_precision): sharding_strategy, cpu_offload, auto_wrap_policy
    (transformer_auto_wrap_policy on the model's _no_split_modules classes, or None = NO_WRAP),
    mixed_precision (mixed_precision="bf16": MixedPrecision(param_dtype=bf16, reduce_dtype=bf16,
    buffer_dtype=bf16)), sync_module_states, backward_prefetch, forward_prefetch=False,
    use_orig_params, limit_all_gathers=True, device_id (here the CPU: the fake world's device)."""
    import functools
    from torch.distributed.fsdp import (BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy)
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    wrap = None
    if o.fsdp1_wrap == "layers":
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        names = list(getattr(base, "_no_split_modules", None) or [])
        classes = {type(m) for m in model.modules() if type(m).__name__ in names}
        wrap = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
    bp = F1_PREFETCH[o.backward_prefetch]
    kw = {"sharding_strategy": ShardingStrategy[F1_SHARDING[o.fsdp1_sharding]],
          "cpu_offload": CPUOffload(offload_params=bool(o.offload)),
          "auto_wrap_policy": wrap,
          "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                            buffer_dtype=torch.bfloat16) if mixed else None,
          "sync_module_states": False,
          "backward_prefetch": BackwardPrefetch[bp] if bp else None,
          "forward_prefetch": False,
          "use_orig_params": bool(o.use_orig_params),
          "limit_all_gathers": True,
          "device_id": torch.device("cpu")}
    if o.fsdp1_sharding == "hybrid":
        gpn = o.gpus_per_node
        if world % gpn:
            raise SystemExit("--gpus-per-node must divide the world")
        # FSDP1's HYBRID_SHARD with a 2-D mesh: dim 0 replicates (across nodes), dim 1 shards (in a node)
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        with unset_fake_temporarily():  # the mesh's rank tensor must be real
            kw["device_mesh"] = H.device_mesh({"replicate": world // gpn, "shard": gpn})
    return kw


class F1Ref(_mt._RefType):
    """FSDP1's own buffers (tagged at tracker entry or at allocation; see FSDP1Tracker)."""
    UNSHARDED_PARAM = "Unsharded Param"   # _full_param_padded (the all-gather destination)
    LOWP_SHARD = "Low-precision Shard"    # _mp_shard (mixed precision: the bf16 copy of the local shard)
    REDUCE_SCATTER = "Reduce-scatter"     # padded unsharded grad / new sharded grad in _reduce_grad
    HOST = "Host"                         # CPUOffload: host-resident tensors (not device memory)


_F1_CATS = [
    ("parameter", _mt._MemRefType.PARAM),
    ("unsharded_param", F1Ref.UNSHARDED_PARAM),
    ("lowp_shard", F1Ref.LOWP_SHARD),
    ("buffer", _mt._MemRefType.BUFFER),
    ("gradient", _mt._MemRefType.GRAD),
    ("reduce_scatter", F1Ref.REDUCE_SCATTER),
    ("activation", _mt._MemRefType.ACT),
    ("temp", _mt._MemRefType.TEMP),
    ("optstate", _mt._MemRefType.OPT),
    ("other", _mt._MemRefType.OTH),
]


class FSDP1Tracker(_DebugDispatch, H.PhaseTrackerMixin, _mt.MemTracker):
    """MemTracker for FSDP1 with its buffers in their own categories. FSDP1 allocates its
    unsharded flat parameter (`_full_param_padded`) and low-precision shard (`_mp_shard`) once, at
    lazy init (the warm-up step), and afterwards only resizes their storages
    (`_alloc_storage` / `_free_storage`: `UntypedStorage.resize_`, which MemTracker patches): so
    they are registered at entry (`track_fsdp1`), at their current (usually 0) size. The
    reduce-scatter tensors of `_reduce_grad` are tagged at allocation. With CPUOffload the
    host-resident tensors (the fp32 local shard, `_cpu_grad`, AdamW's states and the optimizer
    step, which runs on the CPU) are under F1Ref.HOST, outside the totals and the peak."""
    CATS = _F1_CATS
    force_ref = None
    offload = False
    current = None

    def __init__(self):
        super().__init__()
        self._ref_class = list(_mt._MemRefType) + list(F1Ref)
        FSDP1Tracker.current = self

    def _track(self, reftype, t):
        ref = FSDP1Tracker.force_ref or reftype
        if self.offload and self._in_opt:
            ref = F1Ref.HOST
        return super()._track(ref, t)

    def _update_peak_stats(self, peak_state):
        for dev, dev_snap in self._curr_mem_snap.items():
            dev_total = dev_snap[_mt._TOTAL_KEY] - dev_snap.get(F1Ref.HOST, 0)
            if self._peak_mem.get(dev, 0) < dev_total:
                self._peak_mem[dev] = dev_total
                self._peak_mem_snap[dev] = dict(dev_snap)

    def reset_peak(self):
        s = self.get_tracker_snapshot("current")
        self._peak_mem = {d: v[_mt._TOTAL_KEY] - v.get(F1Ref.HOST, 0) for d, v in s.items()}
        self._peak_mem_snap = s

    _STICKY = (F1Ref.UNSHARDED_PARAM, F1Ref.LOWP_SHARD, F1Ref.HOST)

    def _update_and_maybe_create_winfos(self, t, reftype, update_existing=False):
        # MemTracker re-tags a module's parameters (PARAM) at each pre-forward and gradients (GRAD)
        # in its hooks: FSDP1's original parameters are views into _full_param_padded / _mp_shard /
        # the host shard, whose tags stay.
        if reftype not in F1Ref:
            for st in _mt.get_untyped_storages(t):
                w = self._WINFO.get(st, (None, None))[0]
                if w is not None and w.reftype in self._STICKY:
                    return {w}
        return super()._update_and_maybe_create_winfos(t, reftype, update_existing)

    def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
        # FSDP1 with use_orig_params swaps the original parameters for plain (non-leaf) views of the
        # unsharded flat parameter during forward: no gradient hooks on those (FSDP1's own flat
        # parameters are leaves and keep theirs).
        pm = 0
        for p in module.parameters():
            w = self._update_and_maybe_create_winfos(p, _mt._MemRefType.PARAM)
            pm += sum(x.mem_consumed for x in w)
            if p.is_leaf and p.grad is not None:
                self._update_and_maybe_create_winfos(p.grad, _mt._MemRefType.GRAD)
            if p.is_leaf and p.requires_grad and install_grad_hooks \
                    and self._param_to_grad_hook_handles.get(p, None) is None:
                def hook(g):
                    self._update_and_maybe_create_winfos(g, _mt._MemRefType.GRAD)
                self._param_to_grad_hook_handles[p] = (
                    p.register_hook(hook),
                    p.register_post_accumulate_grad_hook(lambda q: hook(q.grad)))
        bm = 0
        for b in module.buffers():
            bm += sum(x.mem_consumed for x in self._update_and_maybe_create_winfos(b, _mt._MemRefType.BUFFER))
        return pm, bm

    def tag(self, t, ref):
        if t is not None and isinstance(t, torch.Tensor):
            self._update_and_maybe_create_winfos(t, ref)

    def track_fsdp1(self, model, opt, inputs):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        self.track_external(model, opt, *[t for t in inputs if t is not None])
        for m in FSDP.fsdp_modules(model):
            for h in ([m._handle] if m._handle is not None else []):
                fp = h.flat_param
                self.tag(getattr(fp, "_full_param_padded", None), F1Ref.UNSHARDED_PARAM)
                self.tag(getattr(fp, "_full_prec_full_param_padded", None), F1Ref.UNSHARDED_PARAM)
                self.tag(getattr(fp, "_mp_shard", None), F1Ref.LOWP_SHARD)
                if h._offload_params:
                    self.tag(fp._local_shard, F1Ref.HOST)
                    self.tag(getattr(fp, "_cpu_grad", None), F1Ref.HOST)
                else:
                    self.tag(fp._local_shard, _mt._MemRefType.PARAM)
        if self.offload:
            for s in opt.state.values():
                for v in s.values():
                    self.tag(v, F1Ref.HOST)


def _install_fsdp1_alloc_tags():
    import torch.distributed.fsdp._flat_param as FP
    import torch.distributed.fsdp._runtime_utils as R

    # FSDP1 tells storages apart by data_ptr(), which is 0 for every fake tensor: the same storage
    # is its StorageImpl (_cdata), an allocated one has a non-zero size.
    def _same_storage(a, b):
        a, b = getattr(a, "_local_tensor", a), getattr(b, "_local_tensor", b)
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    FP._same_storage = _same_storage
    FP._data_ptr_allocated = lambda t: t.untyped_storage().size() > 0

    def _catch_all_reshard(state):
        # _runtime_utils._catch_all_reshard with its "already resharded" test (flat_param.data_ptr()
        # == _local_shard.data_ptr(), always true on fake tensors) done on the storages: a unit
        # whose post-backward hook never ran (a root whose parameters are all frozen: LoRA) is
        # resharded at the end of backward as on a GPU.
        h = state._handle
        if not h:
            return
        fp = h.flat_param
        if fp.untyped_storage()._cdata == fp._local_shard.untyped_storage()._cdata \
                and fp.storage_offset() == fp._local_shard.storage_offset() and not h._skipped_use_sharded_views:
            return
        R._reshard(state, h, R._should_free_in_backward(state, h))
    R._catch_all_reshard = _catch_all_reshard
    orig = R._get_reduce_scatter_tensors

    def _get_reduce_scatter_tensors(state, unsharded_grad):
        prev = FSDP1Tracker.force_ref
        FSDP1Tracker.force_ref = F1Ref.REDUCE_SCATTER
        try:
            return orig(state, unsharded_grad)
        finally:
            FSDP1Tracker.force_ref = prev
    R._get_reduce_scatter_tensors = _get_reduce_scatter_tensors

    def after(fn):
        def wrapped(state, handle):
            fn(state, handle)
            # the new sharded gradient (or NO_SHARD's all-reduced one) is now flat_param.grad
            t = FSDP1Tracker.current
            fp = handle.flat_param
            # sharded strategies: _saved_grad_shard (flat_param.grad from _finalize_params on)
            g = getattr(fp, "_saved_grad_shard", None)
            g = fp.grad if g is None else g
            if t is not None and g is not None:
                t._update_and_maybe_create_winfos(g, _mt._MemRefType.GRAD)
        return wrapped
    # CPUOffload + use_orig_params: _writeback_orig_params (pre_unshard) writes the original
    # parameters' gradients back into a new flat gradient, torch.zeros_like(flat_param), and the
    # sharded flat_param lives on the host then: host memory.
    orig_wb = FP.FlatParamHandle._writeback_orig_params

    def _writeback_orig_params(self):
        if not self._offload_params:
            return orig_wb(self)
        prev = FSDP1Tracker.force_ref
        FSDP1Tracker.force_ref = F1Ref.HOST
        try:
            return orig_wb(self)
        finally:
            FSDP1Tracker.force_ref = prev
    FP.FlatParamHandle._writeback_orig_params = _writeback_orig_params
    R._reduce_grad = after(R._reduce_grad)
    R._reduce_grad_no_shard = after(R._reduce_grad_no_shard)


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------
def build_query(o, world):
    q = {"m": "arch"}
    if o.preset:
        q["model"] = o.preset
    q.update({"b": o.batch, "s": o.seq, "r": o.precision.replace("_", "-"), "o": "adamw",
              "gc": "full" if o.gc else "none", "attn": o.attn, "n": world})
    shard = "fsdp2" if o.strategy in ("fsdp2", "fsdp2-tp", "fsdp2-cp") else (
        "fsdp1" if o.strategy == "fsdp1" else "ddp")
    q["shard"] = shard
    q["tp"] = o.tp if o.strategy in ("tp", "fsdp2-tp") else 1
    q["sp"] = int(bool(o.sp))
    q["lp"] = int(bool(o.lp))
    if shard == "fsdp2":
        q["raf"] = int(bool(o.raf))
    if shard == "fsdp1":
        q["f1s"] = o.fsdp1_sharding
        q["f1w"] = o.fsdp1_wrap
        q["uop"] = int(bool(o.use_orig_params))
        q["bp"] = o.backward_prefetch
        if o.fsdp1_sharding == "hybrid":
            q["gpn"] = o.gpus_per_node
    q["cp"] = o.cp if o.strategy in ("cp", "fsdp2-cp") else 1
    q["ep"] = 1
    q["off"] = "optimizer+params" if o.strategy == "fsdp1" and o.offload else "none"
    if o.shard_embeddings:
        q["fse"] = "on"
    if o.lora:
        # peft's defaults: adapters in fp32 (autocast_adapter_dtype), no dropout here
        q.update({"method": "lora", "lr": o.lora, "lt": "all-linear", "ld": 0, "ldt": "fp32"})
    if o.float8 != "none":
        q["f8"] = o.float8
        if o.float8_all_gather:
            q["f8ag"] = 1
    s = "&".join(f"{k}={v}" for k, v in q.items())
    return s


def cp_context(cp_mesh, buffers, o):
    """torchtitan's train context for context parallelism: torch's context_parallel(cp_mesh,
    buffers=[inputs, labels, position ids], buffer_seq_dims=[1, 1, 1]) around forward and backward.
    It shards the buffers in place along the sequence (after the head-tail "round-robin" reorder
    when load balancing is on) and monkey-patches F.scaled_dot_product_attention (here the harness's
    CUDA emulation, so the kernel choice stays) to wrap q/k/v as Shard(2) DTensors; the flash /
    efficient SDPA ops then dispatch to _templated_ring_attention[_backward]."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method
    set_rotate_method(o.cp_rotate)
    buffers = [b for b in buffers if b is not None]
    # _distribute_function patches `setattr(F, fn.__name__, wrapper)`: the harness's emulation is
    # named _cuda_sdpa, so without this the patch lands on F._cuda_sdpa and HF's call to
    # F.scaled_dot_product_attention never reaches ring attention (plain local SDPA, silently).
    F.scaled_dot_product_attention.__name__ = "scaled_dot_product_attention"

    @contextlib.contextmanager
    def ctx():
        _cp_options.enable_load_balance = bool(o.cp_lb)  # context_parallel reads it at entry
        with context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=[1] * len(buffers)):
            yield
    return ctx


def meshes(strategy, dp, tp, cp):
    """(dp_mesh, tp_mesh, cp_mesh) of `strategy` over the fake world (None where unused)."""
    if strategy == "fsdp2":
        return H.device_mesh({"dp": dp}), None, None
    if strategy == "fsdp1":
        return None, None, None  # FullyShardedDataParallel on the default group (or its own mesh: hybrid)
    if strategy == "tp":
        if dp != 1:
            raise SystemExit("--strategy tp: world must equal tp")
        return None, H.device_mesh({"tp": tp}), None
    if strategy == "fsdp2-tp":
        mesh = H.device_mesh({"dp": dp, "tp": tp})
        return mesh["dp"], mesh["tp"], None
    if strategy == "cp":
        if dp != 1:
            raise SystemExit("--strategy cp: world must equal cp (no DDP on the fake group)")
        return None, None, H.device_mesh({"cp": cp})
    if strategy == "fsdp2-cp":
        # torchtitan: FSDP2 shards over the flattened (dp, cp) mesh; ring attention runs on "cp"
        mesh = H.device_mesh({"dp": dp, "cp": cp})
        return mesh["dp", "cp"]._flatten("dp_cp"), None, mesh["cp"]
    raise SystemExit(f"unknown strategy {strategy}")


def measure(o):
    H.install_cuda_emulation()
    if not o.naive_prop:
        H.isolate_sharding_propagation()
    _install_fsdp_alloc_tags()
    _install_fsdp1_alloc_tags()
    H.mesh_outside_fake()

    t0 = time.time()
    torch.manual_seed(0)
    tp = o.tp if o.strategy in ("tp", "fsdp2-tp") else 1
    cp = o.cp if o.strategy in ("cp", "fsdp2-cp") else 1
    world = o.world
    if world % (tp * cp):
        raise SystemExit("world must be a multiple of tp x cp")
    dp = world // (tp * cp)
    place = {"query": build_query(o, world), "rank": 0, "world_size": world,
             "mesh": {"dp": dp, "tp": tp, "cp": cp}}
    if REAL_GLOO:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        place.update(rank=dist.get_rank(), process_group="gloo (real tensors)")
        try:
            return measure_rank(o, t0, place, *meshes(o.strategy, dp, tp, cp))
        finally:
            dist.destroy_process_group()
    with H.fake_world(world):
        return measure_rank(o, t0, place, *meshes(o.strategy, dp, tp, cp))


def measure_rank(o, t0, place, dp_mesh, tp_mesh, cp_mesh):
    """The row of rank 0 (`place`) on the meshes of its fake world."""
    cfg, arch = H.load_config(o.config, o.attn)
    mixed = o.precision == "mixed-bf16"
    amp = o.precision == "amp_bf16"
    dtype = torch.bfloat16 if o.precision == "bf16" else torch.float32
    fsdp1 = o.strategy == "fsdp1"
    if (mixed or o.strategy == "tp") and o.precision == "mixed-bf16" and dp_mesh is None and not fsdp1:
        raise SystemExit("mixed-bf16 needs FSDP2 (MixedPrecisionPolicy)")
    fake = contextlib.nullcontext() if REAL_GLOO else FakeTensorMode(allow_non_fake_inputs=True)
    tied = None
    with fake:
        model = H.build_model(cfg, arch, o.attn, dtype)
        if o.gc:
            model.gradient_checkpointing_enable()
        if o.lora:
            # peft's LoRA on every linear but the head, before sharding (as accelerate and
            # torchtune wrap it): FSDP2 shards the frozen base and the adapters alike
            from peft import LoraConfig, get_peft_model
            if o.gc:
                model.enable_input_require_grads()
            with H.swap_via_set_data():  # (as validation/peft.py: _apply under the fake mode)
                model = get_peft_model(model, LoraConfig(r=o.lora, lora_alpha=32, lora_dropout=0.0,
                                                         target_modules="all-linear"))
        model.train(True)
        model.config.use_cache = False
        n_params = sum(p.numel() for p in model.parameters())
        if o.float8 != "none":
            # torchtitan: the float8 converter runs before parallelisation (every linear but the head)
            F8.install_inner_tracking()
            F8.convert(model, o.float8, bool(o.float8_all_gather))
        if tp_mesh is not None:
            tied = apply_tp(model, tp_mesh, o.sp, o.lp)
        if dp_mesh is not None:
            apply_fsdp(model, dp_mesh, bool(o.raf), mixed, bool(o.shard_embeddings))
        if fsdp1:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            if o.lora and not o.use_orig_params:
                raise SystemExit("FSDP1 + LoRA needs --use-orig-params 1 (frozen and trainable params in one flat param)")
            if o.offload:
                # CPUOffload pins the host shard and _cpu_grad (pin_memory: no fake kernel); the copy is
                # host memory either way: keep the tensor itself
                torch.Tensor.pin_memory = lambda self, *a, **k: self
                # _post_backward_final_callback synchronizes the current stream (torch.cpu.Stream has no
                # synchronize: CPU work is synchronous)
                if not hasattr(torch.cpu.Stream, "synchronize"):
                    torch.cpu.Stream.synchronize = lambda self: None
            model = FSDP(model, **fsdp1_kwargs(model, o, mixed, o.world))
        ids = torch.randint(0, H.text_vocab(cfg), (o.batch, o.seq), dtype=torch.long)
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
        opt = H.make_optimizer("adamw", params)
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
                    return H.LossOnly(model(input_ids=ids, labels=labels, **kw).loss)
                logits = model(input_ids=ids, position_ids=pos)  # lp_forward: DTensor, Shard(-1)
                with loss_parallel():
                    return H.LossOnly(F.cross_entropy(logits.flatten(0, 1).float(), shift_labels.flatten(0, 1)))

        ctxs = {"bwd_ctx": loss_parallel if o.lp else None,
                "train_ctx": cp_context(cp_mesh, [ids, labels, pos], o) if cp_mesh is not None else None}
        H.warm_up(fwd, opt, True, **ctxs)  # untracked: optimizer states, FSDP lazy init
        precompute = o.float8 != "none" and o.float8_all_gather and dp_mesh is not None
        optimizer_step = None
        if precompute:
            # torchtitan (train.py, after optimizers.step()): one all-reduce of every float8 weight's amax,
            # the scales kept on the weights for the next all-gather
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
            precompute_float8_dynamic_scale_for_fsdp(model)

            def optimizer_step():
                opt.step()
                precompute_float8_dynamic_scale_for_fsdp(model)
                opt.zero_grad(set_to_none=True)

        if fsdp1:
            mt = FSDP1Tracker()
            mt.offload = bool(o.offload)
            mt.track_fsdp1(model, opt, (ids, shift_labels, pos) + ((labels,) if labels is not ids else ()))
        elif dp_mesh is not None:
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

        def local_grads(name, meter, step):
            if name == "bwd":
                step.extra["grad_bytes"] = H.local_bytes(p.grad for p in model.parameters())
        if o.float8 != "none":
            F8.INNER.append(mt)  # float8_ops' inner ops (contiguous copies, _scaled_mm) tracked too
        if o.layer_peaks:
            F8.attach_layer_peaks(mt, model)  # the decoder layers' own peaks (float8.py)
        with mt:
            step = H.measured_step(mt, fwd, opt, record_copies=False, on_phase=local_grads,
                                   optimizer_step=optimizer_step, **ctxs)
        F8.INNER.clear()

    state = {"param_bytes": H.local_bytes(model.parameters()),
             "grad_bytes": step.extra["grad_bytes"],
             "opt_state_bytes": H.local_bytes(v for s in opt.state.values() for v in s.values())}
    # `tracker` replaces base_config's value in place (the key keeps its position)
    config = H.base_config(
        o.model_name, o.batch, o.seq, o.precision, "adamw", o.attn, o.gc,
        tracker="fsdp2memtracker" if dp_mesh is not None else ("memtracker-fsdp1" if fsdp1 else "memtracker"),
        strategy=o.strategy, sp=bool(o.sp), lp=bool(o.lp),
        reshard_after_forward=bool(o.raf) if dp_mesh is not None else None,
        mp_policy=("param_dtype=bf16,reduce_dtype=bf16,buffer_dtype=bf16" if fsdp1 else
                   "param_dtype=bf16,reduce_dtype=fp32") if mixed else None,
        tp_plan="torchtitan-llama (HF names)" if tp_mesh is not None else None,
        tied_embeddings=tied, process_group="gloo (real tensors)" if REAL_GLOO else "fake",
        lora_rank=o.lora or None,
        shard_embeddings=bool(o.shard_embeddings) or None,
        dtensor_prop_isolated=not o.naive_prop,
        **({"layer_peaks": True} if o.layer_peaks else {}),
        **({"float8": o.float8, "float8_all_gather": bool(o.float8_all_gather),
            "float8_filter": "all nn.Linear but lm_head",
            "float8_precompute_scale": bool(precompute)} if o.float8 != "none" else {}),
        **({"cp_load_balance": "head-tail (round robin)" if o.cp_lb else None,
            "cp_rotate_method": o.cp_rotate,
            "cp_buffers": "input_ids, labels, position_ids (seq dim 1)",
            "loss": "hf (labels = the local slice, shifted by HF within it)"}
           if cp_mesh is not None else {}),
        **({"fsdp1_sharding": o.fsdp1_sharding, "fsdp1_wrap": o.fsdp1_wrap,
            "use_orig_params": bool(o.use_orig_params), "backward_prefetch": o.backward_prefetch,
            "gpus_per_node": o.gpus_per_node if o.fsdp1_sharding == "hybrid" else None,
            "offload": bool(o.offload), "limit_all_gathers": True, "forward_prefetch": False,
            "sync_module_states": False, "gc_impl": "hf gradient_checkpointing_enable before wrapping"}
           if fsdp1 else {}))
    if REAL_GLOO:
        config["mode"] = "real-cpu"
    row = H.rank_row(config, place, H.versions(), n_params, step, t0, mt.CATS, state)
    if fsdp1 and o.offload:
        # device-resident model state only: the fp32 shards, their grads and AdamW's states are on the host
        row["host_bytes_end"] = int(sum(v.get(F1Ref.HOST, 0) for v in mt.get_tracker_snapshot("current").values()))
    row["sdpa_kernels"] = dict(H.SDPA_LOG)
    if o.float8 != "none":
        row["versions"]["torchao"] = F8.torchao_version()
    if o.layer_peaks:
        row["float8_linears"] = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
        row["layer_peak_bytes"] = dict(mt.layer_peaks)
    return row


def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--model-name")
    ap.add_argument("--preset", help="the estimator's preset key for the query (else config_file)")
    ap.add_argument("--strategy", choices=["fsdp2", "fsdp1", "tp", "fsdp2-tp", "cp", "fsdp2-cp"], default="fsdp2")
    ap.add_argument("--fsdp1-sharding", choices=list(F1_SHARDING), default="full",
                    help="FSDP1 ShardingStrategy: FULL_SHARD / SHARD_GRAD_OP / HYBRID_SHARD / NO_SHARD")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="FSDP1 hybrid: ranks per shard group")
    ap.add_argument("--fsdp1-wrap", choices=["layers", "none"], default="layers",
                    help="accelerate's TRANSFORMER_BASED_WRAP (decoder layers) or NO_WRAP (one unit)")
    ap.add_argument("--use-orig-params", type=int, default=1, help="FSDP1 use_orig_params (1/0)")
    ap.add_argument("--backward-prefetch", choices=list(F1_PREFETCH), default="pre",
                    help="FSDP1 backward_prefetch (accelerate's and the HF Trainer's default: none)")
    ap.add_argument("--offload", type=int, default=0, help="FSDP1 CPUOffload(offload_params=True) (1/0)")
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
    ap.add_argument("--lora", type=int, default=0, help="peft LoRA of this rank on all linears (0: full)")
    ap.add_argument("--shard-embeddings", type=int, default=0,
                    help="FSDP2 units for the embeddings and the head (torchtune's custom_sharded_layers; 1/0)")
    ap.add_argument("--float8", choices=["none", "tensorwise", "rowwise"], default="none",
                    help="torchao float8 training of every linear but the head (validation/float8.py, FLOAT8.md)")
    ap.add_argument("--float8-all-gather", type=int, default=0,
                    help="with --float8 tensorwise: FSDP2 all-gathers the weights in float8 "
                    "(enable_fsdp_float8_all_gather) and the scales are precomputed after each step (1/0)")
    ap.add_argument("--layer-peaks", action="store_true",
                    help="also write layer_peak_bytes: the highest totals inside the decoder layers' forward and "
                    "backward (float8.py attach_layer_peaks) and float8_linears")
    ap.add_argument("--naive-prop", action="store_true",
                    help="do not isolate DTensor's global-shape propagation (shows its phantom tensors)")
    H.add_run_args(ap)
    return ap


def main(argv=None):
    o = parser().parse_args(argv)
    done = H.dispatch(o, __file__, argv_of, main, entry_of=entry_of,
                      model_grid=os.path.join(_HERE, "grid-fsdp1.json"))  # llama3.2-1b -> configs/llama-1b.json
    if done is not None:
        return done
    if not o.config:
        parser().error("--config, --grid or --from-row")
    o.model_name = o.model_name or os.path.splitext(os.path.basename(o.config))[0]
    row = measure(o)
    if not o.preset:
        row["config_file"] = os.path.basename(o.config)
    kernels = row.pop("sdpa_kernels")
    pk = row["at_peak"]
    return H.emit(row, o.out, f"[distributed] {o.model_name} {row['query']}: peak {row['peak_bytes']} B = "
                  f"{row['peak_bytes'] / 2**30:.3f} GiB in {row['peak_phase']} "
                  f"(phases {', '.join(f'{k} {v / 2**30:.3f}' for k, v in row['phase_peak_bytes'].items())}); "
                  f"at peak {', '.join(f'{k}={v / 2**30:.3f}' for k, v in pk.items() if v and k != 'total')}; "
                  f"sdpa {kernels}; {row['time_s']} s")


# a grid entry's keys (and a row's, once entry_of has renamed them) -> the command line's flags
FLAGS = {"model": "--model-name", "preset": "--preset", "strategy": "--strategy", "world": "--world",
         "tp": "--tp", "cp": "--cp", "cp_lb": "--cp-lb", "cp_rotate": "--cp-rotate", "sp": "--sp", "lp": "--lp",
         "raf": "--raf", "batch": "--batch", "seq": "--seq", "precision": "--precision", "attn": "--attn",
         "gc": "--gc", "naive_prop": "--naive-prop", "lora": "--lora",
         "shard_embeddings": "--shard-embeddings", "fsdp1_sharding": "--fsdp1-sharding",
         "gpus_per_node": "--gpus-per-node", "fsdp1_wrap": "--fsdp1-wrap", "use_orig_params": "--use-orig-params",
         "backward_prefetch": "--backward-prefetch", "offload": "--offload",
         "float8": "--float8", "float8_all_gather": "--float8-all-gather", "layer_peaks": "--layer-peaks"}
INT_SWITCHES = ("cp_lb", "sp", "lp", "raf", "shard_embeddings", "use_orig_params", "offload",
                "float8_all_gather")  # flags taking 1/0


def argv_of(entry):
    """The command line (without --config) of a grid entry or of a row's entry (entry_of)."""
    e = {k: int(v) if k in INT_SWITCHES and isinstance(v, bool) else v for k, v in entry.items()}
    return H.flags(e, FLAGS)


def entry_of(row):
    """A row as a grid entry. Its config holds the options but not the world: the world size and
    the mesh's tp and cp are the row's own keys, the preset is the query's `model`; the config keys
    that differ from the grid's are renamed (reshard_after_forward -> raf, cp_rotate_method ->
    cp_rotate, cp_load_balance -> cp_lb, dtensor_prop_isolated -> naive_prop)."""
    c = row.get("config", row)
    e = dict(c)
    if "world_size" in row:
        query = dict(kv.split("=", 1) for kv in row["query"].split("&"))
        e.update(world=row["world_size"], tp=row["mesh"]["tp"], cp=row["mesh"]["cp"], preset=query.get("model"))
    e["raf"] = c.get("reshard_after_forward")
    e["cp_rotate"] = c.get("cp_rotate_method")
    if "cp_load_balance" in c:
        e["cp_lb"] = c["cp_load_balance"] is not None
    e["naive_prop"] = c.get("dtensor_prop_isolated") is False
    e["lora"] = c.get("lora_rank") or 0
    e["shard_embeddings"] = int(bool(c.get("shard_embeddings")))
    return e


if __name__ == "__main__":
    sys.exit(main())
