#!/usr/bin/env python3
"""Measure fixture rows again from their own `config` and say, field by field, whether the harness
still gives the same bytes.

  validation/.venv/bin/python validation/reproduce.py core/tests/fixtures/peft-measured.jsonl [--pick 0,3,7]
  validation/.venv/bin/python validation/reproduce.py --sample 2            # two rows of every fixture file
  validation/.venv/bin/python validation/reproduce.py --ref ../shared/reference/pytorch-measured.jsonl --all

Each row goes to the recipe that measured it (RECIPES: the first whose test holds for its config),
run as `recipe.py --from-row ROW` in its own process; the row it prints is compared with the
fixture in every field but `time_s` and `versions`. Exit status 1 if any row differs or fails.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "core", "tests", "fixtures")
IGNORED = {"time_s", "versions"}


def has_config(model):
    sys.path.insert(0, HERE)
    from harness.grid import CONFIG_DIRS
    return any(os.path.exists(os.path.join(d, model + ".json")) for d in CONFIG_DIRS)


def _is_moe(c):
    if not has_config(c["model"]):
        return False
    sys.path.insert(0, HERE)
    from harness.grid import config_path
    with open(config_path(c["model"])) as f:
        d = json.load(f)
    d = d.get("text_config", d)
    return any(k in d for k in ("num_local_experts", "num_experts", "n_routed_experts"))


# (recipe, test on a row's config), first match wins
RECIPES = [
    ("unsloth/measure_unsloth.py", lambda c: "kernels" in c),
    ("distributed.py", lambda c: "strategy" in c),
    ("float8.py", lambda c: "float8" in c),
    ("pipeline.py", lambda c: "pp" in c),
    ("rl.py", lambda c: "objective" in c),
    ("compile.py", lambda c: "compile" in c),
    ("vlm.py", lambda c: "images" in c),
    ("peft.py", lambda c: "method" in c),
    ("trainers.py", lambda c: "loss" in c),
    ("moe.py", _is_moe),
    ("measure.py", lambda c: True),
]


def recipe_of(config):
    return next(name for name, test in RECIPES if test(config))


def diff(measured, fixture):
    """The fields of `fixture` that `measured` does not hold to the byte."""
    return [k for k in fixture if k not in IGNORED and measured.get(k) != fixture[k]]


def measure_again(row, python):
    script = os.path.join(HERE, recipe_of(row["config"]))
    r = subprocess.run([python, script, "--from-row", json.dumps(row)], capture_output=True, text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return None, (r.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(lines[-1]), None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="fixture .jsonl files (default: every core/tests/fixtures/*.jsonl)")
    ap.add_argument("--ref", help="a reference .jsonl (e.g. ../shared/reference/pytorch-measured.jsonl)")
    ap.add_argument("--pick", help="comma-separated row indices (0-based) of each file")
    ap.add_argument("--sample", type=int, help="N rows of each file, spread evenly")
    ap.add_argument("--only", help="substring of the model name")
    ap.add_argument("--all", action="store_true", help="every row (default: --sample 1)")
    ap.add_argument("--skip", default="", help="comma-separated model names to leave out")
    ap.add_argument("--out", help="append the measured rows to this .jsonl file")
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the recipes")
    a = ap.parse_args(argv)
    files = a.files or ([a.ref] if a.ref else sorted(glob.glob(os.path.join(FIXTURES, "*-measured.jsonl"))))
    skip = set(filter(None, a.skip.split(",")))
    n = same = 0
    for path in files:
        rows = [json.loads(ln) for ln in open(path) if ln.strip()]
        idx = range(len(rows))
        if a.pick:
            idx = [int(i) for i in a.pick.split(",")]
        elif not a.all:
            k = a.sample or 1
            idx = sorted({round(i * (len(rows) - 1) / max(1, k - 1)) for i in range(k)}) if k > 1 else [0]
        print(f"== {os.path.relpath(path)}", flush=True)
        for i in idx:
            row = rows[i]
            c = row["config"]
            if (a.only and a.only not in c["model"]) or c["model"] in skip:
                continue
            if recipe_of(c) == "measure.py" and not has_config(c["model"]):
                print(f"  [{i}] {c['model']}: skipped (no config.json: a torchvision model, not this harness's)")
                continue
            t0 = time.time()
            m, err = measure_again(row, a.python)
            n += 1
            label = f"  [{i}] {recipe_of(c):26} {c['model']} b{c['batch']} s{c['seq']} {c['precision']}"
            if m is None:
                print(f"{label}: FAILED ({err})", flush=True)
                continue
            d = diff(m, row)
            same += not d
            verdict = "same bytes in every field" if not d else "DIFFERS in " + ", ".join(d)
            print(f"{label}: peak {m['peak_bytes']} vs {row['peak_bytes']}: {verdict} ({time.time() - t0:.0f} s)",
                  flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(m) + "\n")
    print(f"{same} of {n} rows measured again hold the same bytes in every field (time_s and versions aside)")
    return 0 if same == n else 1


if __name__ == "__main__":
    sys.exit(main())
