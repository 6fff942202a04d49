#!/usr/bin/env python3
"""The prepared GPU run: allocated AND reserved peak memory of one training step, per configuration.

Three roles (see validation/README.md, "validation/gpu: the prepared GPU run"):

  --grid grid.json --out-dir D   the runner: every grid entry in its own subprocess (fresh CUDA caching
                                 allocator; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True set per entry),
                                 a per-entry timeout, an overall budget (no entry is started after
                                 --budget-s seconds) and a hard deadline (no entry runs past
                                 --deadline-s); rows are appended to D/rows.jsonl as they come, failures
                                 (timeout / oom / error / skipped) to D/failures.jsonl, the children's
                                 stderr to D/children.log, a table to D/summary.txt;
  --one '<entry json>'           one entry (what the runner starts): prints the row as "@@ROW <json>";
  --self-test                    the CPU check of all of it: every grid entry shrunk to a tiny model and
                                 run through the runner on the CPU (compile with the aot_eager backend),
                                 rows validated, timeout / error / budget paths exercised, the plain model
                                 checked against transformers (same weights, same loss) where transformers
                                 is importable, ingest.py run twice on the rows (dedupe).

The step is the harness's (validation/harness/, the one of measure.py and every CPU recipe): the
model built on the GPU with random weights (harness.build_plain_model / build_model), one warm-up step
(forward + HF causal-LM loss, backward, AdamW step, zero_grad(set_to_none=True)), then the measured step
(harness.measured_step on harness.CudaMeter: torch.cuda.reset_peak_memory_stats() at each phase boundary,
fwd = forward + loss, bwd = backward, opt = step + zero_grad): max_memory_allocated() and
max_memory_reserved() per phase, memory_allocated() at the boundaries. The row is the harness's GPU row
(harness.cuda_row, measure.py --device cuda's) plus the allocator's figures. The model is plain PyTorch
(plain_llama.py, mirrors transformers' Llama / Qwen3), or transformers' own class for entries with
"impl": "hf" (skipped where transformers is not importable).

Nothing here needs transformers. The runner imports torch only with the harness, to write the config of
an entry that failed or was skipped; validate_row (ingest.py) needs neither.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ROW_PREFIX = "@@ROW "
FAIL_PREFIX = "@@FAIL "

ENTRY_DEFAULTS = {
    "impl": "plain", "precision": "bf16", "optimizer": "adamw", "opt_impl": "foreach",
    "allocator": "default", "compile": "off", "backend": "inductor", "gc": False, "gc_policy": "full",
    "attn": "sdpa",
}
ENTRY_CHOICES = {
    "impl": ("plain", "hf"), "precision": ("bf16", "amp_bf16", "fp32"), "optimizer": ("adamw",),
    "opt_impl": ("foreach", "fused", "forloop"), "allocator": ("default", "expandable"),
    "compile": ("off", "layers", "model"), "attn": ("sdpa",),
}
DEFAULT_TIMEOUT_S = {"off": 90, "layers": 240, "model": 300}

# the tiny model of the self-test (every grid entry keeps its knobs, the dims shrink)
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}
TINY_SEQ_DIV = 64  # the self-test runs batch b, seq s as batch b, seq s // 64 (distinct entries stay distinct)


# ==============================================================================================
# One entry (child process)
# ==============================================================================================
def load_entry(e: dict, grid_dir: str | None = None) -> dict:
    """Entry with defaults applied and its config path made absolute; raises ValueError if invalid."""
    out = dict(ENTRY_DEFAULTS)
    out.update(e)
    for k in ("model", "config", "batch", "seq"):
        if k not in out:
            raise ValueError(f"grid entry {e} lacks {k!r}")
    for k, choices in ENTRY_CHOICES.items():
        if out[k] not in choices:
            raise ValueError(f"grid entry {e}: {k}={out[k]!r} not in {choices}")
    gp = out["gc_policy"]
    if not (gp == "full" or (isinstance(gp, str) and gp.startswith("every:") and gp[6:].isdigit()
                             and int(gp[6:]) >= 1)):
        raise ValueError(f"grid entry {e}: gc_policy {gp!r} (full or every:N)")
    p = out["config"]
    if not os.path.isabs(p):
        for base in (grid_dir or HERE, REPO, os.getcwd()):
            if os.path.exists(os.path.join(base, p)):
                p = os.path.join(base, p)
                break
    out["config"] = os.path.abspath(p)
    return out


def entry_name(e: dict) -> str:
    if e.get("name"):
        return e["name"]
    parts = [e["model"], f"b{e['batch']}", f"s{e['seq']}", e["precision"], e["opt_impl"], e["allocator"]]
    if e.get("gc"):
        parts.append("gc" if e["gc_policy"] == "full" else "gc-" + e["gc_policy"].replace(":", ""))
    if e["compile"] != "off":
        parts.append("compile-" + e["compile"])
    if e["impl"] != "plain":
        parts.append(e["impl"])
    return "_".join(str(x) for x in parts)


def _harness():
    """The measuring harness (validation/harness/, which imports torch: the runner loads it only to
    write a row's config)."""
    validation = os.path.dirname(HERE)
    if validation not in sys.path:
        sys.path.append(validation)
    import harness
    return harness


def row_config(e: dict, mode: str) -> dict:
    """config of the row: the harness's keys of a GPU row (measure.py --device cuda's, same order),
    then this run's knobs."""
    H = _harness()
    knobs = {"gc_policy": e["gc_policy"]} if e["gc"] else {}
    knobs.update(compile=e["compile"], backend=e["backend"] if e["compile"] != "off" else None,
                 allocator=e["allocator"], impl=e["impl"])
    c = H.base_config(e["model"], e["batch"], e["seq"], e["precision"], e["optimizer"], e["attn"], e["gc"],
                      e["opt_impl"], mode=mode, **knobs)
    c.update(tracker=H.CUDA_TRACKER, emulate_cuda=False)
    return c


class _Allocator:
    """What the GPU run reads of the caching allocator beyond the harness's CudaMeter (allocated
    bytes): reserved bytes, their peak since the last reset, per-phase and whole-run statistics."""

    def __init__(self, torch):
        self.c = torch.cuda

    def sync(self):
        self.c.synchronize()

    def reserved(self):
        self.c.synchronize()
        return self.c.memory_reserved()

    def max_reserved(self):
        self.c.synchronize()
        return self.c.max_memory_reserved()

    def phase_stats(self):
        s = self.c.memory_stats()
        return {"segments_peak": s.get("segment.all.peak"),
                "inactive_split_bytes_peak": s.get("inactive_split_bytes.all.peak"),
                "requested_bytes_peak": s.get("requested_bytes.all.peak")}

    def totals(self):
        s = self.c.memory_stats()
        keys = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams")
        return {k: s.get(k) for k in keys}


class _NullMem:
    """CPU self-test: no allocator statistics; every figure reads 0."""

    def sync(self):
        pass

    reserved = max_reserved = lambda self: 0

    def phase_stats(self):
        return {"segments_peak": 0, "inactive_split_bytes_peak": 0, "requested_bytes_peak": 0}

    def totals(self):
        return {}


def _meters(H, torch, cuda):
    """(meter of the harness's step, allocator): H.CudaMeter and the GPU's caching allocator; on the
    CPU (the self-test) both read 0."""
    if cuda:
        return H.CudaMeter(), _Allocator(torch)

    class ZeroMeter(H.CudaMeter):
        def snap(self):
            return {"total": 0}

        peak = snap

        def reset_peak(self):
            pass

    return ZeroMeter(), _NullMem()


def _set_dynamo_limits(torch):
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 64)
    for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 4096)
    if hasattr(cfg, "capture_scalar_outputs"):
        cfg.capture_scalar_outputs = True  # torchtitan apply_compile sets it (as compile.py does)


def _unique_graphs(torch):
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return None


def build_model(e, dtype, dev, H):
    """(model, vocab, transformers version or None) of the entry, built by the harness on `dev`:
    plain_llama (no transformers needed) or transformers' own class ("impl": "hf")."""
    if e["impl"] == "plain":
        with open(e["config"]) as f:
            cfg = json.load(f)
        cfg.update(e.get("overrides") or {})
        model = H.build_plain_model(cfg, dtype, dev)
        return model, model.dims["vocab"], None
    import torch
    import transformers
    hcfg, arch = H.load_config(e["config"], "sdpa", overrides=e.get("overrides"))
    with torch.device(dev):
        model = H.build_model(hcfg, arch, "sdpa", dtype)
    model.to(dev)
    return model, H.text_vocab(hcfg), transformers.__version__


def enable_gc(model, e):
    every = 1 if e["gc_policy"] == "full" else int(e["gc_policy"][6:])
    if e["impl"] == "plain":
        model.gradient_checkpointing_enable(every)
        return
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if every > 1:
        from transformers.modeling_layers import GradientCheckpointingLayer
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        for i, layer in enumerate(layers):
            layer.gradient_checkpointing = (i + 1) % every == 0


def apply_compile(model, e, torch):
    """compile.py's modes: layers = every decoder block .compile(fullgraph=True) + the loss function
    compiled on its own (torchtitan / torchtune); model = torch.compile(model) (HF Trainer through
    accelerate). Returns the callable that runs the forward."""
    mode = e["compile"]
    if mode == "off":
        return model
    _set_dynamo_limits(torch)
    be = e["backend"]
    if mode == "model":
        return torch.compile(model, backend=be)
    layers = model.model.layers
    for blk in layers:
        blk.compile(backend=be, fullgraph=True)
    if e["impl"] == "plain":
        sys.path.insert(0, HERE)
        import plain_llama
        model.loss_function = functools.partial(torch.compile(plain_llama.causal_lm_loss, backend=be),
                                                vocab_size=model.dims["vocab"])
    else:
        model.loss_function = torch.compile(model.loss_function, backend=be)
    return model


def _sdpa_backend(torch, model, e, dtype, dev):
    """Which fused SDPA kernel torch picks for the model's attention shapes (torch._fused_sdp_choice)."""
    try:
        from torch.nn.attention import SDPBackend
        if e["impl"] == "plain":
            d = model.dims
            h, kv, hd = d["heads"], d["kv_heads"], d["head_dim"]
        else:
            c = model.config
            h = c.num_attention_heads
            kv = c.num_key_value_heads or h
            hd = getattr(c, "head_dim", None) or c.hidden_size // h
        qd = torch.bfloat16 if e["precision"] in ("bf16", "amp_bf16") else torch.float32
        s = min(e["seq"], 256)
        q = torch.empty(1, h, s, hd, device=dev, dtype=qd, requires_grad=True)
        k = torch.empty(1, kv, s, hd, device=dev, dtype=qd, requires_grad=True)
        v = torch.empty(1, kv, s, hd, device=dev, dtype=qd, requires_grad=True)
        kw = {"enable_gqa": True} if kv != h else {}
        i = torch._fused_sdp_choice(q, k, v, None, 0.0, True, **kw)
        return SDPBackend(i).name
    except Exception as ex:  # private API: informative only
        return f"unknown ({type(ex).__name__})"


def measure_one(e: dict, device: str) -> dict:
    """The entry's row: the harness's step (H.warm_up, then H.measured_step under H.CudaMeter) and
    GPU row (H.cuda_row), plus the caching allocator's reserved bytes and statistics per phase."""
    t0 = time.time()
    if e.get("selftest_sleep"):
        time.sleep(float(e["selftest_sleep"]))
    H = _harness()
    import torch
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("measure_gpu.py: no CUDA device is available (torch.cuda.is_available() is False)")
    dev = torch.device("cuda" if cuda else "cpu")
    meter, mem = _meters(H, torch, cuda)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if e["precision"] == "bf16" else torch.float32
    amp = e["precision"] == "amp_bf16"

    model, vocab, tf_version = build_model(e, dtype, dev, H)
    if e["gc"]:
        enable_gc(model, e)
    model.train(True)
    reserved_after_build = mem.reserved()
    ids = torch.randint(0, vocab, (e["batch"], e["seq"]), dtype=torch.long, device=dev)
    labels = ids
    params = [p for p in model.parameters() if p.requires_grad]
    opt = H.make_optimizer(e["optimizer"], params, e["opt_impl"])
    runner = apply_compile(model, e, torch)
    last_loss = [None]  # a weak reference to the last forward's loss, read after the measured forward

    def fwd():
        with torch.autocast(dev.type, dtype=torch.bfloat16) if amp else H.nullctx():
            loss = runner(input_ids=ids, labels=labels).loss if e["impl"] == "hf" else runner(ids, labels)
        last_loss[0] = weakref.ref(loss)
        return H.LossOnly(loss)

    # warm-up step (untracked; compiles)
    tw = time.time()
    H.warm_up(fwd, opt, True)
    mem.sync()
    warmup_s = time.time() - tw
    warmup_peak, warmup_reserved = meter.peak()["total"], mem.max_reserved()
    graphs_warm = _unique_graphs(torch)

    # the measured step
    resv, stats, loss_value = {}, {}, []

    def on_phase(name, meter, step):
        resv[name], stats[name] = mem.max_reserved(), mem.phase_stats()
        if name == "fwd":
            loss_value.append(float(last_loss[0]().detach().float().item()))
        elif name == "bwd":
            step.extra["grad_bytes"] = H.storage_bytes((p.grad for p in model.parameters()), dev.type)

    ts = time.time()
    reserved_start = mem.reserved()
    with meter:
        step = H.measured_step(meter, fwd, opt, amp=amp, record_copies=False, on_phase=on_phase)
    step_s = time.time() - ts
    reserved_end = mem.reserved()
    graphs_end = _unique_graphs(torch)

    extra = {}
    if cuda:
        free, total = torch.cuda.mem_get_info()
        extra["device_total_bytes"], extra["device_used_bytes"] = total, total - free
        try:
            segs = torch.cuda.memory_snapshot()
            extra["segments_end"] = len(segs)
            extra["expandable_segments_seen"] = any(s.get("is_expandable", False) for s in segs) \
                if segs and "is_expandable" in segs[0] else None
        except Exception:
            extra["segments_end"] = extra["expandable_segments_seen"] = None
    else:
        extra.update(device_total_bytes=0, device_used_bytes=0, segments_end=0, expandable_segments_seen=None)
    sdpa = _sdpa_backend(torch, model, e, dtype, dev) if cuda else "cpu"
    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    versions = {
        "torch": torch.__version__, "transformers": tf_version, "torchvision": None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": gpu,
        "capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
        "python": sys.version.split()[0],
    }
    n_params = sum(p.numel() for p in model.parameters())
    row = H.cuda_row(row_config(e, "cuda" if cuda else "cpu-selftest"), versions, n_params, step, t0, model,
                     [ids, labels], opt, device=dev.type, after={"versions": {"gpu": gpu}})
    row.update({  # beyond measure.py's cuda rows
        "reserved_bytes": max(resv.values()),
        "reserved_phase": max(resv, key=lambda k: resv[k]),
        "phase_reserved_bytes": dict(resv),
        "reserved_start_bytes": reserved_start,
        "reserved_end_bytes": reserved_end,
        "reserved_after_build_bytes": reserved_after_build,
        "warmup_peak_bytes": warmup_peak,
        "warmup_reserved_bytes": warmup_reserved,
        "phase_alloc_stats": stats,
        "alloc_totals": mem.totals(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"),
        **extra,
        "sdpa_backend": sdpa,
        "compiled_graphs": graphs_warm if e["compile"] != "off" else None,
        "recompiles_in_measured_step": (graphs_end - graphs_warm)
        if e["compile"] != "off" and graphs_end is not None and graphs_warm is not None else None,
        "loss": round(loss_value[0], 4),
        "warmup_s": round(warmup_s, 2),
        "step_s": round(step_s, 3),
    })
    return row


def child_main(entry_json: str, device: str) -> int:
    e = json.loads(entry_json)
    try:
        row = measure_one(e, device)
    except BaseException as ex:  # noqa: BLE001  reported to the runner, then re-raised for the traceback
        status = "oom" if type(ex).__name__ == "OutOfMemoryError" else "error"
        info = {"status": status, "error": f"{type(ex).__name__}: {str(ex).strip().splitlines()[0][:500]}"
                if str(ex).strip() else type(ex).__name__}
        try:
            import torch
            if device == "cuda" and torch.cuda.is_available():
                info["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
                info["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        except Exception:
            pass
        print(FAIL_PREFIX + json.dumps(info), flush=True)
        if isinstance(ex, SystemExit):
            print(str(ex), file=sys.stderr)
            return 2
        import traceback
        traceback.print_exc()
        return 3 if status == "oom" else 1
    print(ROW_PREFIX + json.dumps(row), flush=True)
    return 0


# ==============================================================================================
# Runner (parent process; does not import torch)
# ==============================================================================================
def _transformers_available(python: str) -> bool:
    if python == sys.executable:
        import importlib.util
        return importlib.util.find_spec("transformers") is not None
    r = subprocess.run([python, "-c", "import importlib.util,sys; sys.exit(importlib.util.find_spec('transformers') is None)"])
    return r.returncode == 0


def _child_env(e: dict) -> dict:
    env = os.environ.copy()
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if e["allocator"] == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env


def _parse_child(stdout: str):
    row = fail = None
    for line in stdout.splitlines():
        if line.startswith(ROW_PREFIX):
            row = json.loads(line[len(ROW_PREFIX):])
        elif line.startswith(FAIL_PREFIX):
            fail = json.loads(line[len(FAIL_PREFIX):])
    return row, fail


def _kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the child's own session: it and its compile workers only
    except ProcessLookupError:
        pass


def run_grid(entries, out_dir, device="cuda", budget_s=480.0, deadline_s=540.0, python=None,
             min_start_s=15.0, grid_dir=None, env_info=None, transform=None, log=print):
    """Runs the entries in order; returns a list of result dicts (status ok/timeout/oom/error/skipped)."""
    python = python or sys.executable
    os.makedirs(out_dir, exist_ok=True)
    rows_path = os.path.join(out_dir, "rows.jsonl")
    fail_path = os.path.join(out_dir, "failures.jsonl")
    clog_path = os.path.join(out_dir, "children.log")
    t0 = time.monotonic()
    have_tf = None
    results = []
    driver = (env_info or {}).get("driver")
    for i, raw in enumerate(entries):
        e = load_entry(raw, grid_dir)
        name = entry_name(e)
        if transform:
            e = transform(e)
        elapsed = time.monotonic() - t0
        res = {"i": i, "name": name, "entry": e, "status": None, "s": 0.0}
        skip = None
        if elapsed >= budget_s:
            skip = f"budget: {elapsed:.0f} s elapsed >= --budget-s {budget_s:.0f}"
        elif deadline_s - elapsed < min_start_s:
            skip = f"deadline: {deadline_s - elapsed:.0f} s left < {min_start_s:.0f}"
        elif e["impl"] == "hf":
            if have_tf is None:
                have_tf = _transformers_available(python)
            if not have_tf:
                skip = "transformers not importable"
        if skip:
            res.update(status="skipped", reason=skip)
            _append(fail_path, {"name": name, "status": "skipped", "reason": skip, "config": row_config(e, device)})
            log(f"[gpu] {i + 1:2d}/{len(entries)} {name}: skipped ({skip})")
            results.append(res)
            continue
        timeout = min(float(e.get("timeout_s") or DEFAULT_TIMEOUT_S[e["compile"]]), deadline_s - elapsed)
        cmd = [python, os.path.abspath(__file__), "--one", json.dumps(e), "--device", device]
        ts = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=_child_env(e), start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(p)
            out, err = p.communicate()
            timed_out = True
        dt = time.monotonic() - ts
        res["s"] = round(dt, 1)
        row, fail = _parse_child(out)
        with open(clog_path, "a") as f:
            f.write(f"===== {name} rc={p.returncode} {dt:.1f}s alloc_conf="
                    f"{_child_env(e).get('PYTORCH_CUDA_ALLOC_CONF')}\n{err}\n")
        if row is not None and p.returncode == 0 and not timed_out:
            if driver:
                row["versions"]["driver"] = driver
            row["wall_s"] = round(dt, 2)
            _append(rows_path, row)
            res.update(status="ok", row=row)
            log(f"[gpu] {i + 1:2d}/{len(entries)} {name}: peak {row['peak_bytes'] / 2**30:.3f} GiB "
                f"({row['peak_phase']}), reserved {row['reserved_bytes'] / 2**30:.3f} GiB, "
                f"sdpa {row.get('sdpa_backend')}, {dt:.1f} s")
        else:
            status = "timeout" if timed_out else (fail or {}).get("status", "error")
            info = {"name": name, "status": status, "rc": p.returncode, "s": round(dt, 1),
                    "timeout_s": round(timeout, 1), "config": row_config(e, device)}
            if fail:
                info.update({k: v for k, v in fail.items() if k != "status"})
            info["stderr_tail"] = err[-2000:]
            _append(fail_path, info)
            res.update(status=status, reason=info.get("error", f"rc={p.returncode}"))
            log(f"[gpu] {i + 1:2d}/{len(entries)} {name}: {status.upper()} after {dt:.1f} s "
                f"({info.get('error', 'rc=%s' % p.returncode)})")
        results.append(res)
    total = time.monotonic() - t0
    _write_summary(os.path.join(out_dir, "summary.txt"), results, total)
    n_ok = sum(r["status"] == "ok" for r in results)
    log(f"[gpu] {n_ok}/{len(results)} configurations measured in {total:.0f} s; rows in {rows_path}")
    return results


def _append(path, obj):
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")


def _write_summary(path, results, total):
    g = 2 ** 30
    lines = [f"{'#':>2} {'configuration':60} {'status':8} {'peak GiB':>9} {'phase':5} {'resv GiB':>9} "
             f"{'fwd/bwd/opt alloc GiB':>23} {'sdpa':>16} {'s':>6}"]
    for r in results:
        row = r.get("row")
        if row:
            ph = "/".join(f"{row['phase_peak_bytes'][k] / g:.2f}" for k in ("fwd", "bwd", "opt"))
            lines.append(f"{r['i'] + 1:2d} {r['name']:60} {'ok':8} {row['peak_bytes'] / g:9.3f} "
                         f"{row['peak_phase']:5} {row['reserved_bytes'] / g:9.3f} {ph:>23} "
                         f"{str(row.get('sdpa_backend'))[:16]:>16} {r['s']:6.1f}")
        else:
            lines.append(f"{r['i'] + 1:2d} {r['name']:60} {r['status']:8} {r.get('reason', '')[:80]}")
    lines.append(f"total {total:.0f} s")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# ==============================================================================================
# Self-test (CPU)
# ==============================================================================================
ROW_KEYS = {
    "config": dict, "versions": dict, "gpu": str, "n_params": int, "param_bytes": int, "buffer_bytes": int,
    "input_bytes": int, "grad_bytes": int, "opt_state_bytes": int, "model_state_bytes": int,
    "peak_bytes": int, "peak_phase": str, "saved_act_bytes": int, "phase_peak_bytes": dict,
    "start_bytes": int, "end_bytes": int, "after_bwd_bytes": int, "time_s": float,
    "reserved_bytes": int, "phase_reserved_bytes": dict, "reserved_start_bytes": int,
    "warmup_peak_bytes": int, "warmup_reserved_bytes": int,
}
NULL_KEYS = ("at_peak", "act_temp_at_peak", "amp_weight_copy_bytes", "phase_peaks")
CONFIG_KEYS = ("model", "batch", "seq", "image", "precision", "optimizer", "attn", "gc", "mode", "tracker",
               "emulate_cuda", "round_bytes", "opt_impl", "warmup_steps", "compile", "backend", "allocator",
               "impl")


def validate_row(row: dict, mode: str = "cuda") -> list:
    """Problems with a row (empty list = valid)."""
    bad = []
    for k, t in ROW_KEYS.items():
        if k not in row:
            bad.append(f"missing {k}")
        elif t is float:
            if not isinstance(row[k], (int, float)):
                bad.append(f"{k} not a number")
        elif not isinstance(row[k], t) or (t is int and isinstance(row[k], bool)):
            bad.append(f"{k} is {type(row[k]).__name__}, not {t.__name__}")
    for k in NULL_KEYS:
        if k not in row or row[k] is not None:
            bad.append(f"{k} must be present and null")
    c = row.get("config", {})
    for k in CONFIG_KEYS:
        if k not in c:
            bad.append(f"config.{k} missing")
    if c.get("mode") != mode:
        bad.append(f"config.mode {c.get('mode')!r} != {mode!r}")
    if c.get("gc") and "gc_policy" not in c:
        bad.append("config.gc_policy missing with gc")
    for k in ("phase_peak_bytes", "phase_reserved_bytes"):
        if set(row.get(k) or {}) != {"fwd", "bwd", "opt"}:
            bad.append(f"{k} phases {sorted(row.get(k) or {})}")
    if row.get("peak_phase") not in ("fwd", "bwd", "opt"):
        bad.append("peak_phase")
    elif row.get("phase_peak_bytes") and row["peak_bytes"] != row["phase_peak_bytes"][row["peak_phase"]]:
        bad.append("peak_bytes != phase_peak_bytes[peak_phase]")
    if row.get("phase_reserved_bytes") and row.get("reserved_bytes") != max(row["phase_reserved_bytes"].values()):
        bad.append("reserved_bytes != max(phase_reserved_bytes)")
    if mode == "cuda":
        if row.get("reserved_bytes", 0) < row.get("peak_bytes", 1):
            bad.append("reserved_bytes < peak_bytes")
        if row.get("peak_bytes", 0) <= row.get("param_bytes", 0):
            bad.append("peak_bytes <= param_bytes")
    if row.get("model_state_bytes") != sum(row.get(k, 0) for k in
                                           ("param_bytes", "buffer_bytes", "grad_bytes", "opt_state_bytes")):
        bad.append("model_state_bytes != sum")
    return bad


def _expected_param_bytes(cfg, dtype_bytes):
    """n_params and the 512-rounded parameter bytes of a plain / HF Llama-Qwen3 model."""
    sys.path.insert(0, HERE)
    import plain_llama
    d = plain_llama.dims(cfg)
    rnd = _harness().rnd
    h, hd = d["hidden"], d["head_dim"]
    per_layer = [d["heads"] * hd * h, d["kv_heads"] * hd * h, d["kv_heads"] * hd * h, h * d["heads"] * hd,
                 d["inter"] * h, d["inter"] * h, h * d["inter"], h, h] + ([hd, hd] if d["qk_norm"] else [])
    tensors = [d["vocab"] * h] + per_layer * d["layers"] + [h] + ([] if d["tied"] else [d["vocab"] * h])
    return sum(tensors), sum(rnd(n * dtype_bytes) for n in tensors), len(tensors)


def _tiny(e):
    e = dict(e)
    e["overrides"] = dict(TINY)
    e["seq"] = max(8, e["seq"] // TINY_SEQ_DIV)
    if e["compile"] != "off":
        e["backend"] = SELFTEST_BACKEND
    e["timeout_s"] = e.get("selftest_timeout_s") or (300 if e["compile"] != "off" else 120)
    return e


SELFTEST_BACKEND = "aot_eager"


def check_plain_vs_hf(log=print):
    """Same weights, same loss and gradients: plain_llama against transformers' own class (fp32, CPU)."""
    import importlib.util
    if importlib.util.find_spec("transformers") is None:
        log("[self-test] transformers not importable: plain-vs-HF check skipped")
        return None
    import torch
    H = _harness()
    results = {}
    for name in ("llama-1b", "qwen3-0.6b"):
        e = load_entry({"model": name, "config": os.path.join("models", name + ".json"), "batch": 2,
                        "seq": 16, "impl": "hf", "precision": "fp32", "overrides": TINY})
        torch.manual_seed(0)
        hf, vocab, _ = build_model(e, torch.float32, torch.device("cpu"), H)
        plain, _, _ = build_model(dict(e, impl="plain"), torch.float32, torch.device("cpu"), H)
        sd = {k: v for k, v in hf.state_dict().items()}
        missing, unexpected = plain.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.endswith("inv_freq")]
        assert not missing and not unexpected, (missing, unexpected)
        ids = torch.randint(0, vocab, (2, 16))
        l_hf = hf(input_ids=ids, labels=ids).loss
        l_pl = plain(ids, ids)
        lh, lp = float(l_hf.detach()), float(l_pl.detach())
        l_hf.backward()
        l_pl.backward()
        gh = dict(hf.named_parameters())
        gp = dict(plain.named_parameters())
        assert set(gh) == set(gp), set(gh) ^ set(gp)
        n_hf = sum(p.numel() for p in hf.parameters())
        n_pl = sum(p.numel() for p in plain.parameters())
        assert n_hf == n_pl, (n_hf, n_pl)
        gdiff = max(float((gh[k].grad - gp[k].grad).abs().max()) for k in gh)
        dl = abs(lh - lp)
        assert dl < 1e-5 and gdiff < 1e-5, (name, dl, gdiff)
        results[name] = (lh, dl, gdiff, n_pl)
        log(f"[self-test] plain == transformers for {name} (tiny): loss {lh:.6f} "
            f"(|diff| {dl:.1e}), max |grad diff| {gdiff:.1e}, {n_pl} parameters, same names")
    return results


def self_test(grid_path, python=None, keep=None, only=None, log=print) -> int:
    python = python or sys.executable
    failures = []
    t_start = time.time()

    def check(ok, msg):
        if not ok:
            failures.append(msg)
            log(f"[self-test] FAIL: {msg}")

    # 1. the shipped model configs are the fixtures' (no drift)
    for name in ("llama-1b", "qwen3-0.6b"):
        mine = os.path.join(HERE, "models", name + ".json")
        fixture = os.path.join(REPO, "core", "tests", "fixtures", "configs", name + ".json")
        if os.path.exists(fixture):
            with open(mine) as a, open(fixture) as b:
                check(json.load(a) == json.load(b), f"models/{name}.json differs from {fixture}")
    # 2. the grid parses, every entry valid, names unique
    with open(grid_path) as f:
        grid = json.load(f)
    gdir = os.path.dirname(os.path.abspath(grid_path))
    entries = [load_entry(g, gdir) for g in grid]
    names = [entry_name(e) for e in entries]
    check(len(set(names)) == len(names), "grid entry names not unique")
    keys = [json.dumps(row_config(e, "cuda"), sort_keys=True) for e in entries]
    check(len(set(keys)) == len(keys), "two grid entries give the same row config (ingest would dedupe them)")
    for e in entries:
        check(os.path.exists(e["config"]), f"config {e['config']} missing")
    log(f"[self-test] grid {grid_path}: {len(entries)} entries, valid, names unique")

    # 3. plain model == transformers (where importable)
    try:
        check_plain_vs_hf(log)
    except AssertionError as ex:
        check(False, f"plain vs transformers: {ex}")

    # 4. every grid entry, shrunk, through the runner on the CPU
    tmp = keep or tempfile.mkdtemp(prefix="gpu-selftest-")
    os.makedirs(tmp, exist_ok=True)
    sel = grid if only is None else [g for g, n in zip(grid, names) if any(o in n for o in only)]
    res = run_grid(sel, tmp, device="cpu", budget_s=1e9, deadline_s=1e9, python=python, grid_dir=gdir,
                   transform=_tiny, log=log)
    have_tf = _transformers_available(python)
    for r in res:
        if r["entry"]["impl"] == "hf" and not have_tf:
            check(r["status"] == "skipped", f"{r['name']}: expected skipped without transformers")
            continue
        check(r["status"] == "ok", f"{r['name']}: {r['status']} {r.get('reason', '')}")
        if r["status"] != "ok":
            continue
        row = r["row"]
        bad = validate_row(row, mode="cpu-selftest")
        check(not bad, f"{r['name']}: row invalid: {bad}")
        with open(r["entry"]["config"]) as f:
            cfg = json.load(f)
        cfg.update(TINY)
        n, pb, nt = _expected_param_bytes(cfg, 2 if r["entry"]["precision"] == "bf16" else 4)
        check(row["n_params"] == n, f"{r['name']}: n_params {row['n_params']} != {n}")
        check(row["param_bytes"] == pb, f"{r['name']}: param_bytes {row['param_bytes']} != {pb}")
        # exp_avg + exp_avg_sq in the parameters' dtype, plus one 0-d `step` per parameter (on the CPU both
        # for foreach and fused; on a GPU only fused keeps it on the device)
        want_opt = 2 * pb + nt * _harness().ROUND_BYTES
        check(row["opt_state_bytes"] == want_opt,
              f"{r['name']}: opt_state_bytes {row['opt_state_bytes']} != {want_opt}")
        check(row["grad_bytes"] == pb, f"{r['name']}: grad_bytes {row['grad_bytes']} != param_bytes {pb}")
        check(math.isfinite(row["loss"]) and abs(row["loss"] - math.log(TINY["vocab_size"])) < 1.0,
              f"{r['name']}: loss {row['loss']} far from log(vocab)")
        if r["entry"]["compile"] != "off":
            check(row["compiled_graphs"] not in (None, 0), f"{r['name']}: no graph compiled")
            check(row["recompiles_in_measured_step"] == 0,
                  f"{r['name']}: {row['recompiles_in_measured_step']} recompiles in the measured step")
    with open(os.path.join(tmp, "rows.jsonl")) as f:
        n_rows = sum(1 for _ in f)
    check(n_rows == sum(r["status"] == "ok" for r in res), "rows.jsonl lines != ok results")

    # 5. the runner's failure paths: timeout, error, budget, deadline
    tdir = os.path.join(tmp, "paths")
    base = {"model": "llama-1b", "config": "models/llama-1b.json", "batch": 1, "seq": 8}
    # sleeper: killed at its 3 s timeout; broken: sleeps 6 s, then fails on its config file, by when the
    # 8 s budget is spent, so after-budget is not started
    fr = run_grid([dict(base, name="sleeper", selftest_sleep=60, selftest_timeout_s=3),
                   dict(base, name="broken", config="models/does-not-exist.json", selftest_sleep=6),
                   dict(base, name="after-budget")],
                  tdir, device="cpu", budget_s=8, deadline_s=1e9, python=python, grid_dir=gdir,
                  transform=_tiny, log=log)
    st = {r["name"]: r for r in fr}
    check(st["sleeper"]["status"] == "timeout" and st["sleeper"]["s"] < 10,
          f"timeout path: {st['sleeper']['status']} after {st['sleeper']['s']} s")
    check(st["broken"]["status"] == "error" and "FileNotFoundError" in st["broken"].get("reason", ""),
          f"error path: {st['broken']}")
    check(st["after-budget"]["status"] == "skipped" and "budget" in st["after-budget"].get("reason", ""),
          f"budget path: {st['after-budget']}")
    dr = run_grid([dict(base, name="late")], os.path.join(tmp, "deadline"), device="cpu", budget_s=1e9,
                  deadline_s=5, python=python, grid_dir=gdir, transform=_tiny, log=log)
    check(dr[0]["status"] == "skipped" and "deadline" in dr[0]["reason"], f"deadline path: {dr[0]}")
    with open(os.path.join(tdir, "failures.jsonl")) as f:
        fl = [json.loads(x) for x in f]
    check([x["status"] for x in fl] == ["timeout", "error", "skipped"], f"failures.jsonl: {fl}")
    check(not os.path.exists(os.path.join(tdir, "rows.jsonl")), "rows.jsonl written for failed entries")

    # 6. ingest: twice into a scratch fixture, the second time adds nothing
    fx = os.path.join(tmp, "gpu-measured.jsonl")
    ing = [python, os.path.join(HERE, "ingest.py"), tmp, "--fixture", fx, "--allow-mode", "cpu-selftest",
           "--no-compare"]
    r1 = subprocess.run(ing, capture_output=True, text=True)
    r2 = subprocess.run(ing, capture_output=True, text=True)
    check(r1.returncode == 0 and r2.returncode == 0, f"ingest failed: {r1.stderr[-500:]} {r2.stderr[-500:]}")
    if os.path.exists(fx):
        with open(fx) as f:
            n_fx = sum(1 for _ in f)
        check(n_fx == n_rows, f"ingest twice: {n_fx} fixture rows, {n_rows} measured (dedupe)")
    r3 = subprocess.run([python, os.path.join(HERE, "ingest.py"), tmp, "--fixture", fx + ".x", "--no-compare"],
                        capture_output=True, text=True)
    check(r3.returncode != 0 and not os.path.exists(fx + ".x"), "ingest accepted cpu-selftest rows by default")

    n_ok = sum(r["status"] == "ok" for r in res)
    log(f"[self-test] {n_ok}/{len(res)} grid entries ran (tiny, CPU, compile backend {SELFTEST_BACKEND}); "
        f"failure paths checked; ingest checked; {time.time() - t_start:.0f} s; scratch {tmp}")
    if failures:
        log(f"[self-test] {len(failures)} FAILED")
        return 1
    log("[self-test] OK")
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", default=os.path.join(HERE, "grid.json"))
    ap.add_argument("--out-dir", default=os.environ.get("OUT") or os.path.join(HERE, "out"))
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="start no entry after this many seconds (default 480)")
    ap.add_argument("--deadline-s", type=float, default=540.0,
                    help="no entry runs past this many seconds: timeouts are cut to fit (default 540)")
    ap.add_argument("--only", nargs="*", help="run only entries whose name contains one of these strings")
    ap.add_argument("--env-json", help="env.json written by run.sh (driver version added to each row)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--self-test", action="store_true", help="the CPU check (tiny models, no CUDA)")
    ap.add_argument("--keep", help="self-test: keep the scratch output in this folder")
    ap.add_argument("--self-test-backend", default="aot_eager",
                    help="self-test: torch.compile backend for compile entries (aot_eager; inductor builds C++)")
    a = ap.parse_args(argv)
    if a.one:
        return child_main(a.one, a.device)
    if a.self_test:
        global SELFTEST_BACKEND
        SELFTEST_BACKEND = a.self_test_backend
        return self_test(a.grid, keep=a.keep, only=a.only)
    with open(a.grid) as f:
        grid = json.load(f)
    gdir = os.path.dirname(os.path.abspath(a.grid))
    if a.only:
        grid = [g for g in grid if any(o in entry_name(load_entry(g, gdir)) for o in a.only)]
    env_info = None
    if a.env_json and os.path.exists(a.env_json):
        with open(a.env_json) as f:
            env_info = json.load(f)
    res = run_grid(grid, a.out_dir, device=a.device, budget_s=a.budget_s, deadline_s=a.deadline_s,
                   grid_dir=gdir, env_info=env_info)
    return 0 if any(r["status"] == "ok" for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())
