#!/usr/bin/env python3
"""What torch.compile changes in one training step's memory (see validation/COMPILE.md).

A recipe of the harness (validation/harness/): its step (FakeTensorMode, MemTracker, 512-byte rounding, CUDA
SDPA kernel choice and autocast lists, one untracked warm-up step, then forward+loss, backward, AdamW foreach
step, zero_grad); what it varies is how the model is compiled by torch.compile:

  --compile model   : the whole HF model (`torch.compile(model)`, what HF Trainer's `torch_compile=True` does
                      through accelerate 1.16's `Accelerator.prepare_model`; the HF loss, computed inside the
                      model's forward, is compiled with it; fullgraph=False as accelerate's default);
  --compile layers  : every decoder block `block.compile(backend, fullgraph=True)` (torchtitan apply_compile,
                      torchtune compile_model) and the loss function compiled on its own (torchtune
                      compile_loss, torchtitan BaseLoss._maybe_compile); embeddings, final norm, LM head eager;
  --compile blocks  : every decoder block compiled as for `layers`, the loss eager (torchtitan before
                      2025-04; a torchtune recipe with a loss other than its chunked ones, whose
                      `training.compile_loss` result the full-finetune recipes drop);
  --compile off     : no compile (measure.py's row; with --real, the eager reference of the inductor check).

Backend: `aot_eager_decomp_partition` by default = AOTAutograd with inductor's decomposition table and
inductor's min-cut rematerialization partitioner, the fw/bw graphs then run op by op (fx codegen frees every
value after its last use). Inductor itself cannot run on fake tensors (it generates C++/Triton kernels); see
`--real` and COMPILE.md for the cross-check of the saved set with inductor on real CPU tensors.

The tracker declares `ignore_compile_internals()`: Dynamo refuses to compile (falls back to eager) while a
non-infra TorchDispatchMode is on the stack (torch/_dynamo/convert_frame.py, "non-infra torch dispatch mode
present"); with the flag it compiles with the mode switched off and runs the compiled artefact with it on,
so MemTracker sees exactly the runtime ops of the compiled graphs.

  python validation/compile.py --from-row '<a row of core/tests/fixtures/compile-measured.jsonl>'
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
import measure  # noqa: E402
from harness import env as _env  # noqa: E402

import torch  # noqa: E402
import torch._inductor.config  # noqa: E402,F401
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


# ----------------------------------------------------------------------------------------------
# Backend: AOTAutograd + inductor decompositions + min-cut partitioner, graphs recorded
# ----------------------------------------------------------------------------------------------
GRAPHS = []  # list of dicts {"fw": gm, "bw": gm, "name": ...} in compile order


def recording_backend(tag_fn=None):
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._functorch import config as functorch_config
    from functorch.compile import min_cut_rematerialization_partition

    def backend(gm, example_inputs, **kw):
        entry = {"fw": None, "bw": None, "dynamo_gm": gm, "n_inputs": len(example_inputs)}
        GRAPHS.append(entry)

        def fw(g, ex):
            entry["fw"] = g
            return boxed_nop(g, ex)

        def bw(g, ex):
            entry["bw"] = g
            return boxed_nop(g, ex)

        from torch._inductor.compile_fx import select_decomp_table
        with functorch_config.patch({"unlift_effect_tokens": True}):
            return aot_autograd(
                fw_compiler=fw, bw_compiler=bw, inference_compiler=fw,
                decompositions=select_decomp_table(),
                partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
            )(gm, example_inputs)
    return backend


def inductor_recording_backend():
    """inductor, with its inner compile wrapped to record the partitioned fw/bw graphs it compiles."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def backend(gm, example_inputs, **kw):
        entry = {"fw": None, "bw": None, "dynamo_gm": gm, "n_inputs": len(example_inputs), "code": []}
        GRAPHS.append(entry)

        def inner(g, ex, **kwargs):
            if kwargs.get("is_backward"):
                entry["bw"] = g
            else:
                entry["fw"] = g
            return compile_fx_inner(g, ex, **kwargs)
        return compile_fx(gm, example_inputs, inner_compile=inner)
    return backend


def get_backend(name):
    if name == "aot_eager_decomp_partition":
        return recording_backend()
    if name == "inductor":
        return inductor_recording_backend()
    return name


def install_compile_sdpa():
    """The harness's SDPA dispatcher without its kernel-log line: Dynamo guards on the log dict's contents
    (`SDPA_LOG['flash'] == 1`) and would recompile every block on every call. The function body is
    otherwise the harness's own (re-executed from its source with that one line removed)."""
    import inspect
    import torch.nn.functional as F
    src = inspect.getsource(_env._cuda_sdpa)
    line = "    SDPA_LOG[kind] = SDPA_LOG.get(kind, 0) + 1\n"
    if line not in src:
        raise RuntimeError("harness.env._cuda_sdpa changed: kernel-log line not found")
    ns = dict(_env.__dict__)
    exec(compile(src.replace(line, ""), _env.__file__, "exec"), ns)
    F.scaled_dot_product_attention = ns["_cuda_sdpa"]
    return ns["_cuda_sdpa"]


def install_real_cpu_sdpa():
    """Real CPU tensors (--real): the CUDA flash op has no CPU kernel; use the CPU flash op, which saves the
    same things (output + fp32 logsumexp); grouped K/V are passed as they are."""
    import torch.nn.functional as F

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if torch.is_autocast_enabled("cpu"):
            # SDPA is on CUDA autocast's lower-precision list (harness.env._cuda_sdpa casts the same way)
            adt = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(adt) if t.dtype != adt else t for t in (query, key, value))
            with torch.autocast("cpu", enabled=False):
                return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        # torch 2.15's CPU flash op takes grouped K/V (Hkv < Hq) directly, like the CUDA flash op
        # the harness dispatches to (checked: forward and backward, grads of K/V in Hkv heads)
        if attn_mask is not None:
            # a mask (a sliding window the sequence reaches): on the GPU the harness's dispatcher
            # picks the memory-efficient kernel, which converts HF's bool mask to an additive one
            # in the query's dtype (per call, i.e. per layer), pads/expands it (_preprocess_mask)
            # and saves it beside out + fp32 lse. The CPU flash op takes the same additive mask and
            # saves it, out and an fp32 lse (B, H, L) for backward: the same set (the efficient
            # kernel's lse is padded to a multiple of 32 rows: use seq % 32 == 0)
            if attn_mask.dtype == torch.bool:
                zero = torch.scalar_tensor(0.0, dtype=query.dtype, device=query.device)
                ninf = torch.scalar_tensor(-float("inf"), dtype=query.dtype, device=query.device)
                attn_mask = torch.where(attn_mask, zero, ninf)
                del zero, ninf
            attn_mask = _env._preprocess_mask(attn_mask, query, key)
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
                query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
            query, key, value, dropout_p, is_causal, scale=scale)[0]
    F.scaled_dot_product_attention = sdpa


def make_inductor_buffers_visible():
    """Inductor's CPU wrapper allocates its buffers with torch._C._dynamo.guards._empty_strided_cpu, which
    calls at::empty_strided without the dispatcher, so a TorchDispatchMode (MemTracker) never sees them. The
    generated module binds that name when it is loaded: route it through torch.empty_strided (dispatched)."""
    import torch._C._dynamo.guards as G

    def empty_strided_cpu(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device="cpu")
    G._empty_strided_cpu = empty_strided_cpu


def _quiet_mod_tracker_under_dynamo():
    """MemTracker's ModTracker installs global module forward (pre-)hooks; they return at once inside an
    OptimizedModule (`_is_in_optimized_module()`), but a checkpoint inside a compiled block (torchtitan's
    AC-then-compile nesting) makes Dynamo trace the inner modules' hooks in the checkpoint's higher-order-op
    body, where they fail ("Attempt to trace generator") on the first tracked call. Make them return at once
    whenever Dynamo is tracing too (`torch.compiler.is_compiling()` is a constant True while tracing, False
    when the hooks run eagerly, so eager modules are tracked as before)."""
    from torch.distributed._tools.mod_tracker import ModTracker
    if getattr(ModTracker, "_quiet_under_dynamo", False):
        return
    pre, post = ModTracker._fw_pre_hook, ModTracker._fw_post_hook

    def _fw_pre_hook(self, mod, input):
        if torch.compiler.is_compiling():
            return
        return pre(self, mod, input)

    def _fw_post_hook(self, mod, input, output):
        if torch.compiler.is_compiling():
            return
        return post(self, mod, input, output)
    ModTracker._fw_pre_hook, ModTracker._fw_post_hook = _fw_pre_hook, _fw_post_hook
    ModTracker._quiet_under_dynamo = True


class CompileTracker(H.PhaseTracker):
    """PhaseTracker that Dynamo lets compile / run compiled code under (see module docstring)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


def decoder_layers(model):
    base = getattr(model, model.base_model_prefix, None) or model
    for attr in ("layers", "h", "layer", "blocks"):
        if hasattr(base, attr) and isinstance(getattr(base, attr), torch.nn.ModuleList):
            return getattr(base, attr)
    if hasattr(base, "decoder") and hasattr(base.decoder, "layers"):
        return base.decoder.layers
    raise RuntimeError("no decoder layer list found")


def apply_titan_ac(model):
    """torchtitan full activation checkpointing (torchtitan/distributed/activation_checkpoint.py
    `_apply_full_ac`): every decoder block is replaced by `ptd_checkpoint_wrapper(block,
    preserve_rng_state=False)` (torch.distributed.algorithms._checkpoint.checkpoint_wrapper, non-reentrant
    torch.utils.checkpoint). parallelize_llama applies AC *before* apply_compile, so `block.compile()` then
    compiles the CheckpointWrapper: the checkpoint is inside the compiled region (Dynamo traces it as the
    tag_activation_checkpoint higher-order op and the partitioner recomputes the block in the backward graph)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    layers = decoder_layers(model)
    for i in range(len(layers)):
        layers[i] = checkpoint_wrapper(layers[i], preserve_rng_state=False)


def apply_compile(model, mode, backend):
    """Returns the callable to run the forward with (the model itself, or the compiled model)."""
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.capture_scalar_outputs = True  # torchtitan apply_compile sets it
    if hasattr(torch._dynamo.config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True  # torchtitan sets it too
    if mode == "off":
        return model
    be = get_backend(backend)
    if mode == "model":
        # accelerate 1.16 Accelerator.prepare_model: torch.compile(model, **dynamo_plugin.to_kwargs())
        return torch.compile(model, backend=be)
    if mode in ("layers", "blocks"):
        for blk in decoder_layers(model):
            blk.compile(backend=be, fullgraph=True)  # torchtitan: fullgraph=True; torchtune: default
        if mode == "blocks":
            return model
        orig = model.loss_function
        model.loss_function = torch.compile(orig, backend=be)
        return model
    raise ValueError(mode)


# ----------------------------------------------------------------------------------------------
# The measured step (the harness's, with the model compiled)
# ----------------------------------------------------------------------------------------------
def measure_compiled(config_path, model_name, batch, seq, precision, optimizer, attn, gc, mode,
                     backend="aot_eager_decomp_partition", real=False, cfg_dict=None, gc_nesting="titan"):
    """gc_nesting (with gc and compile != off): "titan" = torchtitan's order, checkpoint_wrapper around each
    block, then the wrapper compiled (checkpoint inside the compiled region; layers mode only); "hf" = HF
    `gradient_checkpointing_enable()` and the block compiled inside it (the checkpoint runs eagerly around
    the compiled block)."""
    titan_ac = bool(gc) and mode != "off" and gc_nesting == "titan"
    if titan_ac and mode not in ("layers", "blocks"):
        raise SystemExit("gc_nesting=titan needs --compile layers (torchtitan compiles per block)")
    if mode == "off" and not real and cfg_dict is None:
        # the eager reference row: measure.py itself
        row = measure.measure(config_path, model_name, batch, seq, precision, optimizer, attn, gc)
        row["config"]["compile"] = "off"
        row["config"]["backend"] = None
        return row, None
    H.install_cuda_emulation()
    if mode != "off":
        install_compile_sdpa()
    if real:
        install_real_cpu_sdpa()
        make_inductor_buffers_visible()
        torch._inductor.config.fx_graph_cache = False
        torch._functorch.config.enable_autograd_cache = False
    t0 = time.time()
    torch.manual_seed(0)
    torch._dynamo.reset()
    GRAPHS.clear()
    if cfg_dict is not None:
        tmp = f"/tmp/compile_cfg_{os.getpid()}.json"
        with open(tmp, "w") as f:
            json.dump(cfg_dict, f)
        config_path = tmp
    cfg, arch = H.load_config(config_path, attn)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    amp = precision == "amp_bf16"
    train = optimizer != "none"
    with H.nullctx() if real else FakeTensorMode(allow_non_fake_inputs=True):
        model = H.build_model(cfg, arch, attn, dtype)
        if titan_ac:
            apply_titan_ac(model)
            _quiet_mod_tracker_under_dynamo()
        ids, labels, opt, fwd = H.prepare_step(cfg, arch, model, batch, seq, optimizer, amp, gc and not titan_ac,
                                               "cpu", runner=apply_compile(model, mode, backend))
        H.warm_up(fwd, opt, train)  # untracked; compiles
        n_graphs_warm = len(GRAPHS)
        mt = CompileTracker(H.param_storages(model))
        mt.track_external(model, ids, opt)  # (None is skipped)
        with mt:
            step = H.measured_step(mt, fwd, opt, train, amp)
    recompiles = len(GRAPHS) - n_graphs_warm
    config = H.base_config(model_name, batch, seq, precision, optimizer, attn, gc,
                           mode="real-cpu" if real else "fake", compile=mode,
                           backend=backend if mode != "off" else None,
                           **({"gc_nesting": gc_nesting} if gc and mode != "off" else {}))
    row = H.step_row(config, H.versions(), sum(p.numel() for p in model.parameters()), step, t0)
    row["compiled_graphs"] = n_graphs_warm
    row["recompiles_in_measured_step"] = recompiles
    row["sdpa_kernels"] = dict(H.SDPA_LOG)
    H.SDPA_LOG.clear()
    return row, model


# ----------------------------------------------------------------------------------------------
# What the partitioner saves: the backward graphs' inputs other than tangents
# ----------------------------------------------------------------------------------------------
def _val(n):
    v = n.meta.get("val")
    if v is None:
        v = n.meta.get("tensor_meta")
    return v


def saved_of(entry, tokens):
    """The saved values of one compiled region: placeholders of its backward graph that are not
    tangents. For each: name, shape, dtype, bytes, bytes per token, and whether it is a forward input
    (primals_*: parameter or the region's input) and the fw op that produced it."""
    bw, fw = entry["bw"], entry["fw"]
    if bw is None:
        return []
    fw_nodes = {n.name: n for n in fw.graph.nodes} if fw is not None else {}
    # the fw graph's outputs in order, name -> index; saved values are bw placeholders in the same order
    fw_out = []
    if fw is not None:
        for n in fw.graph.nodes:
            if n.op == "output":
                fw_out = list(n.args[0])
    saved_fw = [o for o in fw_out][-len([p for p in bw.graph.nodes if p.op == "placeholder"
                                          and not p.name.startswith("tangents")]):] if fw_out else []
    rows = []
    bw_ph = [p for p in bw.graph.nodes if p.op == "placeholder" and not p.name.startswith("tangents")]
    for i, p in enumerate(bw_ph):
        v = _val(p)
        src = saved_fw[i] if i < len(saved_fw) else None
        src_name = getattr(src, "name", str(src))
        fwn = fw_nodes.get(src_name)
        op = "input" if (fwn is not None and fwn.op == "placeholder") else (
            str(fwn.target) if fwn is not None else "?")
        if isinstance(v, torch.Tensor):
            nb = v.numel() * v.element_size()
            rows.append({"name": p.name, "fw_value": src_name, "op": op, "shape": list(v.shape),
                         "dtype": str(v.dtype).replace("torch.", ""), "bytes": nb,
                         "bytes_per_token": nb / tokens})
        else:
            rows.append({"name": p.name, "fw_value": src_name, "op": op, "shape": None, "dtype": type(v).__name__,
                         "bytes": 0, "bytes_per_token": 0})
    return rows


def dump_graphs(path_prefix):
    for i, e in enumerate(GRAPHS):
        for k in ("fw", "bw"):
            g = e.get(k)
            if g is not None:
                with open(f"{path_prefix}.{i}.{k}.txt", "w") as f:
                    f.write(g.print_readable(print_output=False, include_stride=False, include_device=False))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_model_args(ap, precision="bf16")
    ap.add_argument("--optimizer", choices=["adamw", "sgd", "none"], default="adamw")
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--compile", choices=["off", "blocks", "layers", "model"], default="layers")
    ap.add_argument("--gc-nesting", choices=["titan", "hf"], default="titan",
                    help="with --gc: checkpoint inside the compiled block (torchtitan) or around it (HF)")
    ap.add_argument("--backend", default="aot_eager_decomp_partition")
    ap.add_argument("--layers", type=int, default=0, help="cut the config to N layers (dump_saved.small_config; "
                    "in a --grid such an entry's row is not appended to --out)")
    ap.add_argument("--saved", help="write the per-region saved list (JSON) here")
    ap.add_argument("--graphs", help="write the fw/bw graphs as text with this path prefix")
    ap.add_argument("--real", action="store_true", help="real CPU tensors (inductor cross-check)")
    ap.add_argument("--set", action="append", default=[], help="key=json config override (with --layers)")
    ap.add_argument("--source", help="where the row's figures also come from (written to config.source)")
    H.add_run_args(ap)
    a = ap.parse_args(argv)
    done = H.dispatch(a, __file__, argv_of, main, to_out=lambda entry: not entry.get("layers"))
    if done is not None:
        return done
    if not a.config:
        ap.error("--config, --grid or --from-row is required")
    name = H.model_name(a)
    cfg_dict = None
    if a.layers:
        import dump_saved
        with open(a.config) as f:
            ov = {k: json.loads(v) for k, _, v in (x.partition("=") for x in a.set)}
            cfg_dict = dump_saved.small_config(json.load(f), a.layers, ov)
    row, _ = measure_compiled(a.config, name, a.batch, a.seq, a.precision, a.optimizer, a.attn, a.gc,
                              a.compile, a.backend, real=a.real, cfg_dict=cfg_dict, gc_nesting=a.gc_nesting)
    kernels = row.pop("sdpa_kernels")
    if a.source is not None:
        row["config"]["source"] = a.source
    if a.saved:
        tokens = a.batch * a.seq
        regions = []
        for i, e in enumerate(GRAPHS):
            s = saved_of(e, tokens)
            regions.append({"region": i, "n_saved": len(s), "saved_bytes": sum(r["bytes"] for r in s),
                            "saved": s})
        with open(a.saved, "w") as f:
            json.dump(regions, f, indent=1)
    if a.graphs:
        dump_graphs(a.graphs)
    return H.emit(row, a.out, f"[compile] {name} b{a.batch} s{a.seq} {a.precision} gc={a.gc} compile={a.compile}: "
                  f"peak {H.gib(row['peak_bytes'])} in {row['peak_phase']}, saved_act {H.gib(row['saved_act_bytes'])}, "
                  f"graphs {row.get('compiled_graphs')} (+{row.get('recompiles_in_measured_step')}), sdpa {kernels}, "
                  f"{row['time_s']} s")


GRID_FLAGS = {"model": "--model-name", "batch": "--batch", "seq": "--seq", "precision": "--precision",
              "optimizer": "--optimizer", "attn": "--attn", "gc": "--gc", "compile": "--compile",
              "backend": "--backend", "gc_nesting": "--gc-nesting", "real": "--real", "layers": "--layers",
              "saved": "--saved", "graphs": "--graphs", "source": "--source"}


def argv_of(entry):
    """The command line (without --config) of a grid entry or a row's config (`mode` real-cpu: --real;
    a grid's `set` list: one --set each)."""
    real = bool(entry.get("real")) or entry.get("mode") == "real-cpu"
    argv = H.flags({**entry, "real": real}, GRID_FLAGS)
    for kv in entry.get("set", []):
        argv += ["--set", kv]
    return argv


if __name__ == "__main__":
    sys.exit(main())
