#!/usr/bin/env python3
"""What torch.compile changes in one training step's memory (see validation/COMPILE.md).

The same step as measure.py (FakeTensorMode, MemTracker, 512-byte rounding, CUDA SDPA kernel choice and
autocast lists, one untracked warm-up step, then forward+loss, backward, AdamW foreach step, zero_grad), with
the model compiled by torch.compile:

  --compile model   : the whole HF model (`torch.compile(model)`, what HF Trainer's `torch_compile=True` does
                      through accelerate 1.16's `Accelerator.prepare_model`; the HF loss, computed inside the
                      model's forward, is compiled with it; fullgraph=False as accelerate's default);
  --compile layers  : every decoder block `block.compile(backend, fullgraph=True)` (torchtitan apply_compile,
                      torchtune compile_model) and the loss function compiled on its own (torchtune
                      compile_loss, torchtitan BaseLoss._maybe_compile); embeddings, final norm, LM head eager;
  --compile off     : plain measure.py.

Backend: `aot_eager_decomp_partition` by default = AOTAutograd with inductor's decomposition table and
inductor's min-cut rematerialization partitioner, the fw/bw graphs then run op by op (fx codegen frees every
value after its last use). Inductor itself cannot run on fake tensors (it generates C++/Triton kernels); see
`--real` and COMPILE.md for the cross-check of the saved set with inductor on real CPU tensors.

The tracker declares `ignore_compile_internals()`: Dynamo refuses to compile (falls back to eager) while a
non-infra TorchDispatchMode is on the stack (torch/_dynamo/convert_frame.py, "non-infra torch dispatch mode
present"); with the flag it compiles with the mode switched off and runs the compiled artefact with it on,
so MemTracker sees exactly the runtime ops of the compiled graphs.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_NUM_THREADS", "1")
import measure as M  # noqa: E402

import torch  # noqa: E402
import torch._inductor.config  # noqa: E402,F401
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

R = M.ROUND_BYTES


def rnd(n):
    return int(math.ceil(n / R) * R)


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
    """measure.py's SDPA dispatcher without its kernel-log line: Dynamo guards on the log dict's contents
    (`SDPA_LOG['flash'] == 1`) and would recompile every block on every call. The function body is
    otherwise measure.py's own (re-executed from its source with that one line removed)."""
    import inspect
    import torch.nn.functional as F
    src = inspect.getsource(M._cuda_sdpa)
    line = "    SDPA_LOG[kind] = SDPA_LOG.get(kind, 0) + 1\n"
    if line not in src:
        raise RuntimeError("measure._cuda_sdpa changed: kernel-log line not found")
    ns = dict(M.__dict__)
    exec(compile(src.replace(line, ""), M.__file__, "exec"), ns)
    F.scaled_dot_product_attention = ns["_cuda_sdpa"]
    return ns["_cuda_sdpa"]


def install_real_cpu_sdpa():
    """Real CPU tensors (--real): the CUDA flash op has no CPU kernel; use the CPU flash op, which saves the
    same things (output + fp32 logsumexp); grouped K/V are passed as they are."""
    import torch.nn.functional as F

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if torch.is_autocast_enabled("cpu"):
            # SDPA is on CUDA autocast's lower-precision list (measure._cuda_sdpa casts the same way)
            adt = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(adt) if t.dtype != adt else t for t in (query, key, value))
            with torch.autocast("cpu", enabled=False):
                return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        # torch 2.15's CPU flash op takes grouped K/V (Hkv < Hq) directly, like the CUDA flash op
        # measure.py dispatches to (checked: forward and backward, grads of K/V in Hkv heads)
        if attn_mask is not None:
            raise RuntimeError("real-tensor check supports only SDPA without a mask")
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


class CompileTracker(M.PhaseTracker):
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
    if mode == "layers":
        for blk in decoder_layers(model):
            blk.compile(backend=be, fullgraph=True)  # torchtitan: fullgraph=True; torchtune: default
        orig = model.loss_function
        model.loss_function = torch.compile(orig, backend=be)
        return model
    raise ValueError(mode)


# ----------------------------------------------------------------------------------------------
# The measured step (measure.measure with compile)
# ----------------------------------------------------------------------------------------------
def measure_compiled(config_path, model_name, batch, seq, precision, optimizer, attn, gc, mode,
                     backend="aot_eager_decomp_partition", real=False, cfg_dict=None, gc_nesting="titan"):
    """gc_nesting (with gc and compile != off): "titan" = torchtitan's order, checkpoint_wrapper around each
    block, then the wrapper compiled (checkpoint inside the compiled region; layers mode only); "hf" = HF
    `gradient_checkpointing_enable()` and the block compiled inside it (the checkpoint runs eagerly around
    the compiled block)."""
    titan_ac = bool(gc) and mode != "off" and gc_nesting == "titan"
    if titan_ac and mode != "layers":
        raise SystemExit("gc_nesting=titan needs --compile layers (torchtitan compiles per block)")
    if mode == "off" and not real and cfg_dict is None:
        # the eager reference row: measure.py itself
        row = M.measure(config_path, model_name, batch, seq, precision, optimizer, attn, gc)
        row["config"]["compile"] = "off"
        row["config"]["backend"] = None
        return row, None
    M.install_cuda_emulation()
    if mode != "off":
        install_compile_sdpa()
    if real:
        install_real_cpu_sdpa()
        make_inductor_buffers_visible()
        torch._inductor.config.fx_graph_cache = False
        torch._functorch.config.enable_autograd_cache = False
    import transformers
    t0 = time.time()
    torch.manual_seed(0)
    torch._dynamo.reset()
    GRAPHS.clear()
    if cfg_dict is not None:
        tmp = f"/tmp/compile_cfg_{os.getpid()}.json"
        with open(tmp, "w") as f:
            json.dump(cfg_dict, f)
        config_path = tmp
    cfg, arch = M.load_config(config_path, attn)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    amp = precision == "amp_bf16"
    train = optimizer != "none"
    fake = M._nullctx() if real else FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = M.build_model(cfg, arch, attn, dtype)
        ids, labels, opt, _fwd = M.prepare_step(cfg, arch, model, batch, seq, optimizer, amp,
                                                gc and not titan_ac, "cpu")
        if titan_ac:
            apply_titan_ac(model)
            _quiet_mod_tracker_under_dynamo()
        runner = apply_compile(model, mode, backend)

        def fwd():
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else M._nullctx()
            with ctx:
                if train:
                    return runner(input_ids=ids, labels=labels)
                return runner(input_ids=ids)

        M.warm_up(fwd, opt, train)  # untracked; compiles
        n_graphs_warm = len(GRAPHS)

        param_cdata = {p.untyped_storage()._cdata for p in model.parameters()}
        mt = CompileTracker(param_cdata)
        mt.track_external(model, ids)
        if opt is not None:
            mt.track_external(opt)
        phase_peaks = {}
        with mt:
            start = mt.snap()
            mt.reset_peak()
            mt.record_copies = amp
            if train:
                out = M._LossOnly(fwd().loss)
            else:
                with torch.no_grad():
                    out = fwd()
            mt.record_copies = False
            end_fwd = mt.snap()
            amp_copy = mt.alive_copy_bytes() if amp else 0
            phase_peaks["fwd"] = mt.peak()
            after_bwd = None
            if train:
                loss = out.loss
                mt.reset_peak()
                loss.backward()
                del loss, out
                phase_peaks["bwd"] = mt.peak()
                after_bwd = mt.snap()
                mt.reset_peak()
                opt.step()
                opt.zero_grad(set_to_none=True)
                phase_peaks["opt"] = mt.peak()
            else:
                del out
            end = mt.snap()
    recompiles = len(GRAPHS) - n_graphs_warm
    n_params = sum(p.numel() for p in model.parameters())
    param_bytes, buffer_bytes, input_bytes = start["parameter"], start["buffer"], start["other"]
    opt_state_bytes = start["optstate"]
    grad_bytes = after_bwd["gradient"] if after_bwd else 0
    peak_phase, pk, opt_step_temp, at_peak = M.peak_summary(phase_peaks, opt_state_bytes)
    phase_order = ["fwd", "bwd", "opt"]
    row = {
        "config": {
            "model": model_name, "batch": batch, "seq": seq, "image": 224,
            "precision": precision, "optimizer": optimizer, "attn": attn, "gc": bool(gc),
            "mode": "real-cpu" if real else "fake", "tracker": "memtracker", "emulate_cuda": True,
            "round_bytes": R, "opt_impl": "foreach", "warmup_steps": 1,
            "compile": mode, "backend": backend if mode != "off" else None,
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "torchvision": M._torchvision_version()},
        "n_params": n_params,
        "param_bytes": param_bytes,
        "buffer_bytes": buffer_bytes,
        "input_bytes": input_bytes,
        "grad_bytes": grad_bytes,
        "opt_state_bytes": opt_state_bytes,
        "model_state_bytes": param_bytes + buffer_bytes + grad_bytes + opt_state_bytes,
        "peak_bytes": pk["total"],
        "peak_phase": peak_phase,
        "at_peak": at_peak,
        "act_temp_at_peak": pk["activation"] + pk["temp"] + opt_step_temp,
        "saved_act_bytes": end_fwd["total"] - start["total"],
        "amp_weight_copy_bytes": amp_copy,
        "phase_peak_bytes": {k: phase_peaks[k]["total"] for k in phase_order if k in phase_peaks},
        "phase_peaks": {k: phase_peaks[k] for k in phase_order if k in phase_peaks},
        "start_bytes": start["total"],
        "end_bytes": end["total"],
        "after_bwd_bytes": after_bwd["total"] if after_bwd else None,
        "time_s": round(time.time() - t0, 2),
        "compiled_graphs": n_graphs_warm,
        "recompiles_in_measured_step": recompiles,
        "sdpa_kernels": dict(M.SDPA_LOG),
    }
    if gc and mode != "off":
        row["config"]["gc_nesting"] = gc_nesting
    M.SDPA_LOG.clear()
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
    ap.add_argument("--config")
    ap.add_argument("--model-name")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", choices=["fp32", "amp_bf16", "bf16"], default="bf16")
    ap.add_argument("--optimizer", choices=["adamw", "sgd", "none"], default="adamw")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--compile", choices=["off", "layers", "model"], default="layers")
    ap.add_argument("--gc-nesting", choices=["titan", "hf"], default="titan",
                    help="with --gc: checkpoint inside the compiled block (torchtitan) or around it (HF)")
    ap.add_argument("--backend", default="aot_eager_decomp_partition")
    ap.add_argument("--layers", type=int, default=0, help="cut the config to N layers (dump_saved.small_config)")
    ap.add_argument("--saved", help="write the per-region saved list (JSON) here")
    ap.add_argument("--graphs", help="write the fw/bw graphs as text with this path prefix")
    ap.add_argument("--real", action="store_true", help="real CPU tensors (inductor cross-check)")
    ap.add_argument("--set", action="append", default=[], help="key=json config override (with --layers)")
    ap.add_argument("--out")
    ap.add_argument("--grid")
    a = ap.parse_args(argv)
    if a.grid:
        return run_grid(a.grid, a.out)
    name = a.model_name or os.path.splitext(os.path.basename(a.config))[0]
    cfg_dict = None
    if a.layers:
        import dump_saved
        with open(a.config) as f:
            ov = {k: json.loads(v) for k, _, v in (x.partition("=") for x in a.set)}
            cfg_dict = dump_saved.small_config(json.load(f), a.layers, ov)
    row, _ = measure_compiled(a.config, name, a.batch, a.seq, a.precision, a.optimizer, a.attn, a.gc,
                              a.compile, a.backend, real=a.real, cfg_dict=cfg_dict, gc_nesting=a.gc_nesting)
    kernels = row.pop("sdpa_kernels")
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
    line = json.dumps(row)
    print(line)
    print(f"[compile] {name} b{a.batch} s{a.seq} {a.precision} gc={a.gc} compile={a.compile}: peak "
          f"{row['peak_bytes'] / 2**30:.3f} GiB in {row['peak_phase']}, saved_act {row['saved_act_bytes'] / 2**30:.3f} GiB, "
          f"graphs {row.get('compiled_graphs')} (+{row.get('recompiles_in_measured_step')}), sdpa {kernels}, {row['time_s']} s",
          file=sys.stderr)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    return 0


def run_grid(grid_path, out):
    import subprocess
    with open(grid_path) as f:
        grid = json.load(f)
    here = os.path.dirname(os.path.abspath(grid_path))
    fails = 0
    for g in grid:
        cfgp = g["config"]
        if not os.path.isabs(cfgp) and not os.path.exists(cfgp) and os.path.exists(os.path.join(here, cfgp)):
            cfgp = os.path.join(here, cfgp)
        cmd = [sys.executable, os.path.abspath(__file__), "--config", cfgp, "--model-name", g["model"],
               "--batch", str(g["batch"]), "--seq", str(g["seq"]), "--precision", g["precision"],
               "--optimizer", g.get("optimizer", "adamw"), "--attn", g.get("attn", "sdpa"),
               "--compile", g.get("compile", "layers"), "--backend", g.get("backend", "aot_eager_decomp_partition")]
        if g.get("gc"):
            cmd.append("--gc")
            if g.get("gc_nesting"):
                cmd += ["--gc-nesting", g["gc_nesting"]]
        if g.get("real"):
            cmd.append("--real")
        for k in ("layers", "saved", "graphs"):
            if g.get(k):
                cmd += ["--" + k, str(g[k])]
        for kv in g.get("set", []):
            cmd += ["--set", kv]
        if out and not g.get("layers"):
            cmd += ["--out", out]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            fails += 1
            print(f"[grid] FAILED: {g}", file=sys.stderr)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
