"""A grid: a JSON list of entries, each measured by a recipe's command line in its own process
(a fresh interpreter: no state of one measurement leaks into the next)."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def resolve_config(path, here):
    """A grid's config path: as given if it exists (or is absolute), else relative to the grid."""
    if not os.path.isabs(path) and not os.path.exists(path) and os.path.exists(os.path.join(here, path)):
        return os.path.join(here, path)
    return path


def flags(entry, names, on_off=()):
    """Command-line flags for the keys of `entry` in `names` ({key: flag}, or a list of keys
    spelled as `--key-with-dashes`): booleans as a bare flag when true (or `on`/`off` for keys in
    `on_off`), other values as `flag value`; missing or None keys give nothing."""
    if not isinstance(names, dict):
        names = {k: "--" + k.replace("_", "-") for k in names}
    argv = []
    for k, flag in names.items():
        v = entry.get(k)
        if v is None:
            continue
        if k in on_off:
            argv += [flag, "on" if v else "off"]
        elif isinstance(v, bool):
            if v:
                argv.append(flag)
        else:
            argv += [flag, str(v)]
    return argv


def run_grid(script, grid_path, argv_of, out=None, extra=(), to_out=None):
    """Run `script` once per entry of the grid at `grid_path` with `--config PATH` +
    `argv_of(entry)` (+ `--out out` + `extra`), stdout discarded (the rows go to `out`; with
    `to_out`, only the rows of the entries for which `to_out(entry)` is true: a grid's diagnostic
    runs, say). Returns 1 if any entry failed."""
    with open(grid_path) as f:
        grid = json.load(f)
    here = os.path.dirname(os.path.abspath(grid_path))
    fails = 0
    for g in grid:
        cmd = [sys.executable, os.path.abspath(script), "--config", resolve_config(g["config"], here),
               *argv_of(g), *extra]
        if out and (to_out is None or to_out(g)):
            cmd += ["--out", out]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            fails += 1
            print(f"[grid] FAILED: {g}", file=sys.stderr)
    return 1 if fails else 0


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIRS = (os.path.join(HERE, "configs"),
               os.path.join(HERE, "..", "core", "tests", "fixtures", "configs"))


def config_path(model, grid=None):
    """The config.json of a row's `model`: validation/configs/, then the fixtures' configs/; then,
    given `grid` (the path of a grid file), the config of that grid's first entry named `model`
    (a row named otherwise than its config file: "llama-3.2-1b" from configs/llama-1b.json)."""
    for d in CONFIG_DIRS:
        p = os.path.join(d, model + ".json")
        if os.path.exists(p):
            return os.path.normpath(p)
    if grid:
        with open(grid) as f:
            entry = next((g for g in json.load(f) if g.get("model") == model), None)
        if entry is not None:
            return os.path.normpath(resolve_config(entry["config"], os.path.dirname(os.path.abspath(grid))))
    raise SystemExit(f"no config for model {model!r} in {', '.join(map(os.path.normpath, CONFIG_DIRS))}"
                     + (f" or {grid}" if grid else ""))


def row_config(text):
    """The `config` of a row given as JSON text (a whole row, or its config alone)."""
    d = json.loads(text)
    return d.get("config", d)


def add_model_args(ap, seq=1024, precision="fp32", precisions=("fp32", "amp_bf16", "bf16")):
    """The flags of what a recipe measures: --config, --model-name, --batch, --seq (left out with
    seq=None), --precision (one of `precisions`, default `precision`), --attn."""
    ap.add_argument("--config", help="path to a Hugging Face config.json")
    ap.add_argument("--model-name", help="name written to the row (default: the config's file stem)")
    ap.add_argument("--batch", type=int, default=1)
    if seq is not None:
        ap.add_argument("--seq", type=int, default=seq)
    ap.add_argument("--precision", choices=list(precisions), default=precision)
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")


def model_name(a):
    """The row's model name: --model-name, else the config file's stem."""
    return a.model_name or os.path.splitext(os.path.basename(a.config))[0]


def add_run_args(ap):
    """The flags every recipe shares: --out, --grid, --from-row."""
    ap.add_argument("--out", help="append the row(s) to this .jsonl file")
    ap.add_argument("--grid", help="a JSON list of entries (the keys of a row's config; `config` is the "
                    "path of the config.json, relative to the grid file); each is measured in its own process")
    ap.add_argument("--from-row", metavar="JSON",
                    help="measure again the row given as JSON (a whole row or its config): the model's "
                    "config.json and every option are read from it (reproduce.py uses this)")


def dispatch(a, script, argv_of, main, extra=(), model_grid=None, to_out=None, entry_of=None):
    """What --grid and --from-row do for a recipe whose `argv_of(entry)` turns a grid entry or a
    row's config into its command line (without --config); None when neither was given.

    `model_grid`: the grid file that names the config.json of row models without a config file of
    their own name (see config_path); `to_out`: see run_grid. `entry_of(row)`, for rows that keep
    some of their options beside `config` (a rank's world size and mesh, a pipeline stage's index):
    the entry that measures `row` (given whole, or its config alone) again; it may name the
    config.json as `config` (else it is found by the model's name)."""
    if a.grid:
        return run_grid(script, a.grid, argv_of, a.out, extra, to_out)
    if a.from_row:
        if entry_of is None:
            c = row_config(a.from_row)
            path = config_path(c["model"], model_grid)
        else:
            c = entry_of(json.loads(a.from_row))
            path = c.get("config") or config_path(c["model"], model_grid)
        return main(["--config", path, *argv_of(c), *extra,
                     *(["--out", a.out] if a.out else [])])
    return None
