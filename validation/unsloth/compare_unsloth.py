#!/usr/bin/env python3
"""Each row of `core/tests/fixtures/unsloth-measured.jsonl` (measure_unsloth.py) against the estimator
CLI run with the same settings: `--kernels unsloth-2024.12`, LoRA or QLoRA (NF4, double quantization,
Unsloth's own preparation: `--kbit-prepare off`) r 16 on the 7 linears with fp32 adapters, bf16, AdamW
(foreach), transformers' loss (`--loss hf`: the loss the measured step computes), SDPA (its flash
kernel), "unsloth" offloaded checkpointing or none, on a copy of the config with the row's layers.
Needs no torch.

    cargo build --release -p estimator-cli
    python3 validation/unsloth/compare_unsloth.py [--rows FILE] [--cli target/release/memest] [--tolerance 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
ROOT = os.path.dirname(VALIDATION)
GRID = os.path.join(VALIDATION, "grid-unsloth.json")


def config_of(model):
    """The config.json of a row's model: the grid's entry of that name, else validation/configs/."""
    with open(GRID) as f:
        for g in json.load(f):
            if g["model"] == model:
                return os.path.join(VALIDATION, g["config"])
    return os.path.join(VALIDATION, "configs", model + ".json")


def cli_args(c):
    gc = {"offload": "offload", False: "none"}[c["gc"]]
    args = ["--kernels", "unsloth-2024.12", "--method", c["method"], "--lora-r", str(c["lora_r"]),
            "--lora-alpha", str(c["lora_alpha"]), "--lora-dropout", "0", "--lora-targets", "all-linear",
            "--lora-dtype", "fp32", "--checkpointing", gc, "--attention", "sdpa", "--precision", "bf16",
            "--optimizer", "adamw", "--optimizer-impl", "foreach", "--loss", "hf",
            "--batch", str(c["batch"]), "--seq", str(c["seq"]), "--json"]
    if c["method"] == "qlora":
        args += ["--quant", "nf4", "--double-quant", "on", "--kbit-prepare", "off"]
    return args


def estimate(cli, c):
    with open(config_of(c["model"])) as f:
        d = json.load(f)
    d["num_hidden_layers"] = c["layers"]
    fd, path = tempfile.mkstemp(suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(d, f)
        out = subprocess.run([cli, "--config", path, *cli_args(c)], capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    return json.loads(out.stdout)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=os.path.join(ROOT, "core", "tests", "fixtures", "unsloth-measured.jsonl"))
    ap.add_argument("--cli", default=os.path.join(ROOT, "target", "release", "memest"))
    ap.add_argument("--tolerance", type=float, default=3.0, help="percent; exit 1 if a row is further off")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    a = ap.parse_args(argv)
    rows = [json.loads(l) for l in open(a.rows) if l.strip()]
    worst = 0.0
    lines = []
    for r in rows:
        c = r["config"]
        e = estimate(a.cli, c)
        err = 100.0 * (e["peak_bytes"] - r["peak_bytes"]) / r["peak_bytes"]
        worst = max(worst, abs(err))
        gc = "offload" if c["gc"] else "none"
        lines.append((c["model"], c["layers"], c["batch"], c["seq"], c["method"], gc, r["peak_bytes"],
                      r["peak_phase"], e["peak_bytes"], e["peak_phase"], err, r.get("offloaded_end_fwd_bytes", 0),
                      e.get("host_bytes", 0)))
    if a.markdown:
        print("| model | layers | batch | seq | method | checkpointing | measured (B) | estimated (B) | error |")
        print("|---|---|---|---|---|---|---|---|---|")
        for m, L, b, s, meth, gc, mp, mph, ep, eph, err, _, _ in lines:
            print(f"| {m} | {L} | {b} | {s} | {meth} | {gc} | {mp:,} ({mph}) | {ep:,} ({eph}) | {err:+.2f}% |")
    else:
        print(f"{'model':18s} {'L':>2s} {'b':>2s} {'seq':>5s} {'method':6s} {'gc':7s} {'measured':>15s} {'ph':3s} "
              f"{'estimated':>15s} {'ph':3s} {'error':>7s} {'host meas/est':>22s}")
        for m, L, b, s, meth, gc, mp, mph, ep, eph, err, hm, he in lines:
            print(f"{m:18s} {L:>2d} {b:>2d} {s:>5d} {meth:6s} {gc:7s} {mp:>15,} {mph:3s} {ep:>15,} {eph:3s} "
                  f"{err:>+6.2f}% {hm:>11,}/{he:<11,}")
    print(f"{len(lines)} rows, largest error {worst:.2f}% (tolerance {a.tolerance}%)", file=sys.stderr)
    return 0 if worst <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
