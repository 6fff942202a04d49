"""DeepSpeed ZeRO per-rank model-state bytes: DeepSpeed's own estimate vs. the derivation in DEEPSPEED.md.

    validation/.venv/bin/python validation/deepspeed_check.py [--ds-src DIR] [--json out.json]

DeepSpeed's numbers come from `estimate_zero2_model_states_mem_needs` (runtime/zero/stage_1_and_2.py)
and `estimate_zero3_model_states_mem_needs` (runtime/zero/stage3.py) of deepspeed 0.19.8, taken, in
this order of preference, from
  1. an importable `deepspeed` (rarely the case here: it needs an accelerator to import cleanly),
  2. the source tree given by --ds-src (e.g. the unpacked sdist: `pip download --no-deps
     deepspeed==0.19.8` then `tar xzf`; the two functions are extracted with `ast` and executed as is),
  3. a transcription of those two pure-arithmetic functions below (`_ds_zero2`, `_ds_zero3`), which
     the script checks against 2. whenever 2. is available.
The derived numbers follow DEEPSPEED.md (defaults of deepspeed 0.19.8: reduce_bucket_size 5e8,
overlap_comm False for ZeRO-1/2 and True for ZeRO-3, contiguous_gradients True, prefetch 5e7,
param_persistence_threshold 1e5, sub_group_size 1e9; bf16 params, fp32 master, Adam(W), FusedAdam on
GPU / DeepSpeedCPUAdam on CPU, both without step temporaries). Shapes are read from the HF configs in
validation/configs; nothing is downloaded and no model is built.
"""
import argparse
import ast
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = 2 ** 30

MODELS = [  # (name, config, expected total params given in the brief)
    ("llama3.2-1b", "llama-1b.json", 1_235_814_400),
    ("llama3-8b", "llama3-8b.json", 8_030_261_248),
    ("llama3.3-70b", "llama3.3-70b.json", 70_553_706_496),
]
GPUS = [1, 8, 64]
RBS = 500_000_000          # reduce_bucket_size default (zero/config.py:113)
PREFETCH = 50_000_000      # stage3_prefetch_bucket_size (zero/config.py:222)
PERSIST = 100_000          # stage3_param_persistence_threshold (zero/config.py:228)
SUB_GROUP = 1_000_000_000  # sub_group_size (zero/config.py:182)


# ---------------------------------------------------------------- DeepSpeed's estimate functions
def _ds_zero2(total_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=True, additional_buffer_factor=1.5):
    # transcription of stage_1_and_2.py:4017 estimate_zero2_model_states_mem_needs (0.19.8)
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def _ds_zero3(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=True,
              cpu_offload_params=True, zero_init=True, additional_buffer_factor=1.5):
    # transcription of stage3.py:4016 estimate_zero3_model_states_mem_needs (0.19.8)
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = (4 * largest_layer_params)
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def _extract(path, name):
    src = open(path).read()
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            ns = {}
            exec(compile(ast.Module([node], []), path, "exec"), ns)
            return ns[name], node.lineno
    raise SystemExit(f"{name} not found in {path}")


def load_ds_functions(ds_src):
    try:
        os.environ.setdefault("DS_BUILD_OPS", "0")
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
        import deepspeed
        return z2, z3, f"imported deepspeed {deepspeed.__version__}"
    except Exception as e:  # noqa: BLE001 - any import failure means: use the other sources
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
    if ds_src:
        zdir = os.path.join(ds_src, "deepspeed", "runtime", "zero")
        z2, l2 = _extract(os.path.join(zdir, "stage_1_and_2.py"), "estimate_zero2_model_states_mem_needs")
        z3, l3 = _extract(os.path.join(zdir, "stage3.py"), "estimate_zero3_model_states_mem_needs")
        # check the transcription against the real source
        for args in [(1e9, 8, 2, True), (1e9, 8, 2, False), (7e9, 1, 1, False)]:
            assert z2(args[0], args[1], args[2], args[3]) == _ds_zero2(*args), "zero2 transcription differs"
        for off in [True, False]:
            for offp in [True, False]:
                for zi in [True, False]:
                    a = (7e9, 2e8, 8, 2, off, offp, zi)
                    assert z3(*a) == _ds_zero3(*a), "zero3 transcription differs"
        return z2, z3, (f"extracted from {ds_src} (stage_1_and_2.py:{l2}, stage3.py:{l3}); "
                        f"import failed: {why}; transcription checked equal")
    return _ds_zero2, _ds_zero3, f"transcription in this file (import failed: {why})"


# ---------------------------------------------------------------- model tensors from an HF Llama config
def llama_tensors(cfg):
    """[(name, numel, decay)] in module order (the order ZeRO flattens them in)."""
    h, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    I = cfg["intermediate_size"]
    nh, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    t = [("embed_tokens", V * h, True)]
    for i in range(L):
        t += [(f"l{i}.q", nh * hd * h, True), (f"l{i}.k", kv * hd * h, True), (f"l{i}.v", kv * hd * h, True),
              (f"l{i}.o", h * nh * hd, True), (f"l{i}.gate", I * h, True), (f"l{i}.up", I * h, True),
              (f"l{i}.down", h * I, True), (f"l{i}.in_norm", h, False), (f"l{i}.post_norm", h, False)]
    t.append(("norm", h, False))
    if not cfg.get("tie_word_embeddings", False):
        t.append(("lm_head", V * h, True))
    return t


def largest_module_params(cfg, tensors):
    """DeepSpeed's model_to_params (stage3.py:4055): max over modules of their own (recurse=False) params:
    for HF Llama that is the embedding (or lm_head), not a decoder layer."""
    return max(n for name, n, _ in tensors if name.startswith(("embed", "lm_head", "l0.")))


def decoder_layer_params(tensors):
    return sum(n for name, n, _ in tensors if name.startswith("l0."))


# ---------------------------------------------------------------- derivation (DEEPSPEED.md)
def groups_of(tensors):
    """HF Trainer's two AdamW groups: weight decay (2-D weights) and no decay (norms, biases)."""
    return [[n for _, n, d in tensors if d], [n for _, n, d in tensors if not d]]


def zero12_partition(tensors, N):
    """Per group: flat bf16 buffer padded to a multiple of 2*N (stage_1_and_2.py:441, utils.py:994), split
    into N equal partitions (stage_1_and_2.py:586). Returns (flat_numel, partition_numel, G_in) where G_in
    = max over ranks of the summed numel of the parameters that intersect the rank's partition (the size
    of grads_in_partition, stage_1_and_2.py:2186-2194)."""
    flat = part = 0
    g_in_per_rank = [0] * N
    for g in groups_of(tensors):
        if not g:
            continue
        P = sum(g)
        Pf = math.ceil(P / (2 * N)) * 2 * N
        ps = Pf // N
        flat += Pf
        part += ps
        off = 0
        for n in g:  # parameters intersecting [r*ps, (r+1)*ps)
            r0, r1 = off // ps, min((off + n - 1) // ps, N - 1)
            for r in range(r0, r1 + 1):
                g_in_per_rank[r] += n
            off += n
    return flat, part, max(g_in_per_rank)


def zero3_partition(tensors, N):
    """Each parameter padded to a multiple of N and split (partition_parameters.py:1690-1699, 1816-1817)."""
    part = sum(math.ceil(n / N) for _, n, _ in tensors)
    persist_full = sum(n for _, n, _ in tensors if n <= PERSIST)   # ds_persist params stay whole
    # largest sub-group's partition (stage3.py:1209-1235): groups cut once >= sub_group_size elements
    S = 0
    for g in groups_of(tensors):
        acc = 0
        for n in g:
            acc += math.ceil(n / N)
            if acc >= SUB_GROUP:
                S, acc = max(S, acc), 0
        S = max(S, acc)
    return part, persist_full, S


def derive(tensors, N, largest_param, largest_module):
    P = sum(n for _, n, _ in tensors)
    flat, part, g_in = zero12_partition(tensors, N)
    bucket = min(RBS, P)           # elements actually placed in one reduce bucket
    out = {}
    # ---------------- ZeRO-2, no offload (overlap_comm False: one ipg buffer)
    persist = 2 * flat + 4 * part + 8 * part                 # bf16 flat params + fp32 master + Adam m, v
    z2_bwd = persist + 2 * RBS + 2 * g_in + 2 * bucket + 2 * largest_param  # ipg + grads_in_partition + flatten tmp + 1 autograd grad
    z2_step = persist + 2 * g_in + 2 * part + 4 * part       # bf16 grads + flat bf16 copy + fp32 grad (stage_1_and_2.py:3117-3118)
    out["zero2"] = dict(gpu_persistent=persist, gpu_peak=max(z2_bwd, z2_step), gpu_bwd=z2_bwd, gpu_step=z2_step, cpu=0)
    # ---------------- ZeRO-1, no offload: full bf16 grads live until the boundary reduction
    z1_bwd = persist + 2 * P + 2 * RBS + 2 * bucket
    out["zero1"] = dict(gpu_persistent=persist, gpu_peak=max(z1_bwd, z2_step), gpu_bwd=z1_bwd, gpu_step=z2_step, cpu=0)
    # ---------------- ZeRO-1/2 + offload_optimizer=cpu
    gpu_off = 2 * flat + 2 * RBS + 2 * largest_param          # params, ipg, temp_grad_buffer_for_gpu_offload
    cpu_off = 4 * part + 2 * part + 4 * part + 8 * part + 2 * largest_param  # master, bf16 stage, fp32 grad, m, v, temp
    out["zero2_offload"] = dict(gpu_persistent=gpu_off, gpu_peak=gpu_off + 2 * bucket + 2 * largest_param, cpu=cpu_off)
    out["zero1_offload"] = dict(gpu_persistent=gpu_off, gpu_peak=gpu_off + 2 * P + 2 * bucket, cpu=cpu_off)
    # ---------------- ZeRO-3
    p3, pfull, S = zero3_partition(tensors, N)
    live = 2 * (largest_module + PREFETCH)   # gathered bf16 params: current module + prefetch bucket
    bwd_tmp = 2 * largest_module + 2 * bucket  # full bf16 grad of the module + reduce-scatter cat
    z3_perm = 2 * p3 + 2 * pfull + 4 * p3 + 8 * p3 + 2 * p3 + 2 * RBS  # lp params, persistent, master, m, v, grad part, ipg
    z3_step = z3_perm + 2 * S + 4 * S
    out["zero3"] = dict(gpu_persistent=z3_perm, gpu_peak=max(z3_perm + live + bwd_tmp, z3_step), cpu=0)
    g3 = 2 * p3 + 2 * pfull + 2 * RBS
    out["zero3_offload_opt"] = dict(gpu_persistent=g3, gpu_peak=g3 + live + bwd_tmp + 2 * S,
                                    cpu=4 * p3 + 8 * p3 + 4 * p3 + 2 * p3)  # master, m, v, fp32 grads, bf16 grad part
    g3p = 2 * pfull + 2 * RBS
    out["zero3_offload_opt_param"] = dict(gpu_persistent=g3p, gpu_peak=g3p + live + bwd_tmp + 2 * S,
                                          cpu=4 * p3 + 8 * p3 + 4 * p3 + 2 * p3 + 2 * p3)
    out["_sizes"] = dict(P=P, flat=flat, part=part, g_in=g_in, p3=p3, persist_full=pfull, S=S)
    return out


def topology(n):
    return (min(n, 8), max(1, math.ceil(n / 8)))  # (gpus per node, nodes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ds-src", default=None, help="unpacked deepspeed-0.19.8 sdist (optional)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    z2f, z3f, how = load_ds_functions(a.ds_src)
    print(f"DeepSpeed estimate functions: {how}")
    rows = []
    for name, cfgfile, expect in MODELS:
        cfg = json.load(open(os.path.join(HERE, "configs", cfgfile)))
        ts = llama_tensors(cfg)
        P = sum(n for _, n, _ in ts)
        assert P == expect, (name, P, expect)
        lp = max(n for _, n, _ in ts)
        lm = largest_module_params(cfg, ts)
        dl = decoder_layer_params(ts)
        print(f"\n== {name}: P={P:,}  largest tensor={lp:,}  decoder layer={dl:,}  "
              f"largest module (DeepSpeed model_to_params)={lm:,}")
        hdr = f"{'N':>3} {'setting':<34} {'DS GPU':>9} {'DS CPU/node':>12} | {'derived GPU persist':>19} {'GPU peak':>9} {'CPU/rank':>9} {'CPU/node':>9}"
        print(hdr)
        for N in GPUS:
            gpn, nodes = topology(N)
            d = derive(ts, N, lp, lm)
            cases = []
            for off in (False, True):
                cpu, gpu = z2f(P, gpn, nodes, off)
                key = "zero2_offload" if off else "zero2"
                cases.append((f"Z2 offload_opt={'cpu' if off else 'none'}", gpu, cpu, key))
                if True:
                    cases.append((f"Z1 offload_opt={'cpu' if off else 'none'} (DS: =Z2)", gpu, cpu,
                                  "zero1_offload" if off else "zero1"))
            for llp_name, llp in (("brief", 60_821_504 if name == "llama3.2-1b" else dl), ("ds", lm)):
                for off, offp in ((False, False), (True, False), (True, True)):
                    cpu, gpu, _ = z3f(P, llp, gpn, nodes, off, offp, True)
                    key = "zero3" if not off else ("zero3_offload_opt_param" if offp else "zero3_offload_opt")
                    cases.append((f"Z3 opt={'cpu' if off else 'none'} param={'cpu' if offp else 'none'} LL={llp_name}",
                                  gpu, cpu, key))
            for label, gpu, cpu, key in cases:
                dd = d[key]
                print(f"{N:>3} {label:<34} {gpu / GiB:9.2f} {cpu / GiB:12.2f} | {dd['gpu_persistent'] / GiB:19.2f} "
                      f"{dd['gpu_peak'] / GiB:9.2f} {dd['cpu'] / GiB:9.2f} {dd['cpu'] * gpn / GiB:9.2f}")
                rows.append(dict(model=name, n_gpus=N, gpus_per_node=gpn, nodes=nodes, setting=label,
                                 ds_gpu_bytes=gpu, ds_cpu_bytes_per_node=cpu, derived=key,
                                 derived_gpu_persistent_bytes=dd["gpu_persistent"], derived_gpu_peak_bytes=dd["gpu_peak"],
                                 derived_cpu_bytes_per_rank=dd["cpu"], derived_cpu_bytes_per_node=dd["cpu"] * gpn))
            s = d["_sizes"]
            print(f"    sizes N={N}: flat={s['flat']:,} part={s['part']:,} G_in={s['g_in']:,} "
                  f"z3 part={s['p3']:,} persistent-whole={s['persist_full']:,} subgroup S={s['S']:,}")
    if a.json:
        json.dump(dict(source=how, rows=rows), open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
