#!/usr/bin/env python3
"""Holds `memest --serve vllm` against vLLM start-up logs from real GPUs.

The logs and their settings are `vllm-logs.tsv` (each row quoted with its source). `ROWS`
below says, for the rows whose model, GPU and settings are all known, how to name them to
memest: the model (a preset or a config in `configs/`), the GPU and anything the log's
settings imply beyond the TSV's columns. Everything else (tensor parallelism,
gpu_memory_utilization, max_model_len, max_num_seqs, max_num_batched_tokens, the KV dtype,
enforce_eager) is read from the TSV itself.

usage: vllm_rerun.py MEMEST [--out FILE]    (writes a markdown table; exit 0)
"""

import csv
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent

# the log says "Using FlashInfer for top-p & top-k sampling" (vLLM's default sampler, when
# FlashInfer is installed; a plain `pip install vllm` has PyTorch's)
FI = ["--sampler", "flashinfer"]

# id: (model flags, gpu key, extra flags, what the row tells)
ROWS = {
    # V0 logs: no chunked prefill below 32k, so the profile ran max_model_len tokens
    "v01": (["--preset", "llama3.1-8b"], "rtx3090", ["--max-num-batched-tokens", "20000"], "V0: profile of max_model_len tokens"),
    "v02": (["--preset", "llama3.1-8b"], "rtx3090", ["--max-num-batched-tokens", "29000"], "V0: profile of max_model_len tokens"),
    "v04": (["--config", "configs/deepseek-r1-distill-qwen-14b.json"], "rtx4090", [], "V0, chunked prefill (131k)"),
    "v10": (["--preset", "gpt-oss-120b"], "h100-80", [], "mxfp4 checkpoint"),
    "v33": (["--config", "configs/qwen2.5-7b-instruct.json"], "a100-80", FI, "Qwen2-7B's geometry; log: FlashInfer sampler"),
    "v34": (["--config", "configs/qwen2.5-7b-instruct.json"], "a100-80", FI, "Qwen2-7B's geometry; same box as v33"),
    "v35": (["--config", "configs/qwen2.5-7b-instruct.json"], "a100-80", FI, "Qwen2-7B's geometry; log: FlashInfer sampler"),
    "v36": (["--config", "configs/qwen2.5-7b-instruct.json"], "a100-40", ["--sampler", "torch"], "TP across two nodes; FlashInfer sampler unavailable"),
    "v37": (["--preset", "gpt-oss-120b"], "a100-80", FI, "hybrid, mxfp4 via Marlin; log: FlashInfer sampler"),
    "v38": (["--preset", "qwen3-30b-a3b"], "l40s", ["--weight-format", "fp8", "--enable-expert-parallel"], "TP2 + EP, fp8 checkpoint"),
    "v39": (["--preset", "qwen3-235b-a22b"], "l40s", ["--weight-format", "fp8", "--sampler", "torch", "--enable-expert-parallel"], "TP8 + EP, fp8 checkpoint; pip install (no FlashInfer)"),
    "v40": (["--preset", "qwen3-30b-a3b"], "l40s", ["--sampler", "torch"], "Qwen3-Coder-30B-A3B: qwen3-30b-a3b's geometry; VLLM_USE_FLASHINFER_SAMPLER=0"),
    "v48": (["--config", "configs/qwen2.5-7b-instruct.json"], "l40s", [], ""),
    "v49": (["--config", "configs/qwen2.5-7b-instruct.json"], "l40s", ["--weight-format", "fp8"], "fp8 checkpoint"),
    "v50": (["--config", "configs/qwen2.5-7b-instruct.json"], "l40s", ["--weight-format", "int4-g128"], "GPTQ int4"),
    "v51": (["--config", "configs/mistral-7b-v0.3.json"], "a10g", [], "Mistral 7B v0.3 (weights 13.50 GiB)"),
    "v52": (["--config", "configs/qwen2.5-7b-instruct.json"], "a10g", [], ""),
    "v53": (["--config", "configs/qwen2.5-7b-instruct.json"], "a10g", [], ""),
    "v54": (["--config", "configs/qwen2.5-7b-instruct.json"], "a10g", [], ""),
    "v55": (["--config", "configs/qwen2.5-14b-instruct.json"], "a10g", [], ""),
    "v57": (["--config", "configs/qwen2.5-14b-instruct.json"], "a10g", [], ""),
    "v58": (["--config", "configs/qwen2.5-7b-instruct.json"], "l4", [], ""),
    "v59": (["--config", "configs/qwen2.5-14b-instruct.json"], "l4", [], ""),
    "v61": (["--preset", "qwen3-14b"], "l40s", [], ""),
    "v62": (["--preset", "qwen3-14b"], "l40s", ["--weight-format", "int4-g128"], "AWQ int4"),
    "v63": (["--preset", "qwen3-14b"], "l40s", ["--weight-format", "int4-g128"], "AWQ int4"),
    "v66": (["--preset", "llama3.1-8b"], "l4", ["--weight-format", "int4-g128"] + FI, "AWQ int4, fp8 KV; log: FlashInfer sampler"),
    "v67": (["--preset", "llama3.1-8b"], "l4", ["--weight-format", "int4-g128"] + FI, "AWQ int4; log: FlashInfer sampler"),
    "v68": (["--preset", "qwen3-4b"], "l4", FI, "fp8 KV; log: FlashInfer sampler"),
    "v69": (["--preset", "qwen3-4b"], "l4", FI, "log: FlashInfer sampler"),
    "v71": (["--config", "configs/qwen3-next-80b-a3b-instruct.json"], "h200", ["--sampler", "torch"], "hybrid (Gated DeltaNet + attention), MoE; v0.10.2; log: FlashInfer sampler unavailable"),
    "v74": (["--preset", "llama3.3-70b"], "h100-80", [], "Llama 3.1 70B's geometry; U not stated: the default 0.9"),
    "v75": (["--preset", "qwen3-32b"], "h100-80", [], "U not stated: the default 0.9"),
}

GIB = 1 << 30


def number(text):
    text = (text or "").strip().split(" ")[0].replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def kv_dtype(text):
    return "fp8" if (text or "").startswith("fp8") else "model"


def flags_of(row, spec):
    model, gpu, extra, _ = spec
    flags = model + ["--serve", "vllm", "--gpu", gpu]
    tp = (row["tp"] or "1").split(" ")[0]
    flags += ["--tp", tp]
    u = number(row["gpu_memory_utilization"])
    if u:
        flags += ["--gpu-memory-utilization", str(u)]
    for column, flag in [
        ("max_model_len", "--max-model-len"),
        ("max_num_seqs", "--max-num-seqs"),
        ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ]:
        value = number(row[column])
        if value and flag not in extra:
            flags += [flag, str(int(value))]
    if kv_dtype(row["kv_cache_dtype"]) == "fp8":
        flags += ["--kv-dtype", "fp8"]
    if row["enforce_eager"].strip() == "True":
        flags += ["--enforce-eager"]
    return flags + extra


def error(ours, theirs):
    if theirs in (None, 0) or ours is None:
        return None
    return (ours - theirs) / theirs * 100


def cell(value, digits=2):
    return "" if value is None else f"{value:+.{digits}f}%"


def main():
    memest = sys.argv[1]
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    rows = {r["id"]: r for r in csv.DictReader(open(HERE / "vllm-logs.tsv"), delimiter="\t")}
    lines = [
        "| id | vLLM | model | GPU | TP | U | len | KV tokens (log / ours) | err | concurrency (log / ours) | err | weights GiB (log / ours) | available GiB (log / ours) | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    within = total = 0
    for rid, spec in ROWS.items():
        row = rows[rid]
        flags = flags_of(row, spec)
        run = subprocess.run([memest, *flags, "--json"], capture_output=True, text=True, cwd=HERE)
        if run.returncode != 0:
            lines.append(f"| {rid} | | | | | | | memest refused: {run.stderr.strip()} | | | | | | |")
            continue
        s = json.loads(run.stdout)["serving"]
        tokens, conc = number(row["kv_tokens"]), number(row["max_concurrency"])
        e_tokens, e_conc = error(s["kv_cache_tokens"], tokens), error(s["max_concurrency"], conc)
        scored = [e for e in (e_tokens, e_conc) if e is not None]
        if scored:
            total += 1
            within += all(abs(e) <= 5 for e in scored)
        weights = number(row["weights_gib"])
        avail = number(row["available_kv_gib"])
        lines.append(
            "| {} | {} | {} | {} | {} | {} | {} | {} / {:,} | {} | {} / {:.2f} | {} | {} / {:.2f} | {} / {:.2f} | {} |".format(
                rid,
                row["vllm_version"].split(" ")[0][:12],
                row["model"].split(" (")[0].split("/")[-1][:34],
                row["gpu"][:22],
                row["tp"],
                row["gpu_memory_utilization"],
                row["max_model_len"],
                f"{int(tokens):,}" if tokens else "-",
                s["kv_cache_tokens"],
                cell(e_tokens),
                conc if conc else "-",
                s["max_concurrency"],
                cell(e_conc),
                weights if weights else "-",
                s["weights_bytes"] / GIB,
                avail if avail is not None else "-",
                s["available_kv_bytes"] / GIB,
                spec[3],
            )
        )
    lines.append("")
    lines.append(f"Rows with a printed KV size or concurrency: {total}; both within 5%: {within}.")
    text = "\n".join(lines) + "\n"
    if out:
        pathlib.Path(out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
