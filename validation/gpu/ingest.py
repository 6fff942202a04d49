#!/usr/bin/env python3
"""Add the prepared GPU run's rows to core/tests/fixtures/gpu-measured.jsonl.

  python3 validation/gpu/ingest.py <files_at or $OUT folder | rows.jsonl> ... [--fixture F] [--dry-run]

Each argument is a rows.jsonl or a folder holding one (what `bash validation/gpu/run.sh` wrote under $OUT;
also searched one level down). Every row is validated (measure_gpu.validate_row: measure.py's cuda-mode
row format plus reserved_bytes, phase_reserved_bytes, config.allocator / opt_impl / compile / impl, gpu);
rows of another mode than `cuda` are refused (the self-test's `cpu-selftest` rows need --allow-mode).
Rows are keyed by (config, gpu): a row whose key is already in the fixture replaces that line in place
(a rerun on the same GPU model supersedes it), new keys are appended. Then a table: each new row next to
the fake-mode row of the same configuration in the other fixtures (measure.py / compile.py rows), where
one exists. Needs no torch.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "core", "tests", "fixtures")
DEFAULT_FIXTURE = os.path.join(FIXTURES, "gpu-measured.jsonl")
sys.path.insert(0, HERE)
from measure_gpu import validate_row  # noqa: E402  (stdlib only at import)

# a fake row is "the same configuration" only if its config has no other knob than these
PLAIN_FAKE_KEYS = {"model", "batch", "seq", "image", "precision", "optimizer", "attn", "gc", "mode", "tracker",
                   "emulate_cuda", "round_bytes", "opt_impl", "warmup_steps", "gc_policy", "compile", "backend"}


def key(row):
    return json.dumps(row["config"], sort_keys=True) + "|" + str(row.get("gpu"))


def read_rows(paths):
    rows = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "rows.jsonl")) + glob.glob(os.path.join(p, "*", "rows.jsonl")))
            if not found:
                raise SystemExit(f"ingest: no rows.jsonl in {p}")
        elif os.path.exists(p):
            found = [p]
        else:
            raise SystemExit(f"ingest: {p}: no such file or folder")
        for f in found:
            with open(f) as fh:
                for n, line in enumerate(fh, 1):
                    if line.strip():
                        try:
                            rows.append((f"{f}:{n}", json.loads(line)))
                        except json.JSONDecodeError as ex:
                            raise SystemExit(f"ingest: {f}:{n}: not JSON ({ex})")
    return rows


def fake_index():
    idx = {}
    for f in sorted(glob.glob(os.path.join(FIXTURES, "*.jsonl"))):
        if os.path.basename(f) == "gpu-measured.jsonl":
            continue
        with open(f) as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                c = r.get("config", {})
                if c.get("mode") != "fake" or not set(c) <= PLAIN_FAKE_KEYS:
                    continue
                k = (c["model"], c["batch"], c["seq"], c["precision"], c["optimizer"], c.get("attn"),
                     bool(c.get("gc")), c.get("gc_policy", "full") if c.get("gc") else None,
                     c.get("opt_impl", "foreach"), c.get("compile", "off"))
                idx.setdefault(k, (os.path.basename(f), r))
    return idx


def compare(rows):
    idx = fake_index()
    g = 2 ** 30
    print(f"{'configuration':66} {'cuda GiB':>9} {'resv GiB':>9} {'fake GiB':>9} {'diff':>7}  fake row")
    for r in rows:
        c = r["config"]
        k = (c["model"], c["batch"], c["seq"], c["precision"], c["optimizer"], c.get("attn"), bool(c.get("gc")),
             c.get("gc_policy", "full") if c.get("gc") else None, c.get("opt_impl"), c.get("compile", "off"))
        name = (f"{c['model']} b{c['batch']} s{c['seq']} {c['precision']} {c['opt_impl']} {c['allocator']}"
                f"{' gc' if c['gc'] else ''}{' compile=' + c['compile'] if c['compile'] != 'off' else ''}"
                f"{' ' + c['impl'] if c['impl'] != 'plain' else ''}")
        fk = idx.get(k)
        if fk:
            fp = fk[1]["peak_bytes"]
            print(f"{name:66} {r['peak_bytes'] / g:9.3f} {r['reserved_bytes'] / g:9.3f} {fp / g:9.3f} "
                  f"{(r['peak_bytes'] - fp) / fp * 100:+6.2f}%  {fk[0]}")
        else:
            print(f"{name:66} {r['peak_bytes'] / g:9.3f} {r['reserved_bytes'] / g:9.3f} {'-':>9} {'-':>7}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="rows.jsonl files or folders holding one")
    ap.add_argument("--fixture", default=DEFAULT_FIXTURE)
    ap.add_argument("--allow-mode", default="cuda", help="config.mode accepted (default cuda)")
    ap.add_argument("--dry-run", action="store_true", help="validate and compare, write nothing")
    ap.add_argument("--no-compare", action="store_true")
    a = ap.parse_args(argv)

    new = read_rows(a.inputs)
    bad = 0
    for where, r in new:
        problems = validate_row(r, mode=a.allow_mode)
        if not r.get("gpu"):
            problems.append("no gpu name")
        if problems:
            bad += 1
            print(f"ingest: {where}: {'; '.join(problems)}", file=sys.stderr)
    if bad:
        raise SystemExit(f"ingest: {bad} invalid row(s), nothing written")
    if not new:
        raise SystemExit("ingest: no rows")

    old = []
    if os.path.exists(a.fixture):
        with open(a.fixture) as fh:
            old = [json.loads(line) for line in fh if line.strip()]
    pos = {key(r): i for i, r in enumerate(old)}
    replaced = added = 0
    merged = list(old)
    seen = set()
    for _, r in new:
        k = key(r)
        if k in seen:  # the same configuration twice in this input: the later one wins
            merged[pos[k]] = r
            continue
        seen.add(k)
        if k in pos:
            merged[pos[k]] = r
            replaced += 1
        else:
            pos[k] = len(merged)
            merged.append(r)
            added += 1
    gpus = sorted({r["gpu"] for _, r in new})
    print(f"ingest: {len(new)} row(s) from {', '.join(gpus)}: {added} added, {replaced} replaced; "
          f"{a.fixture}: {len(old)} -> {len(merged)} rows{' (dry run)' if a.dry_run else ''}")
    if not a.dry_run:
        os.makedirs(os.path.dirname(os.path.abspath(a.fixture)), exist_ok=True)
        tmp = a.fixture + ".tmp"
        with open(tmp, "w") as fh:
            for r in merged:
                fh.write(json.dumps(r) + "\n")
        os.replace(tmp, a.fixture)
    if not a.no_compare:
        compare([r for _, r in new])
    return 0


if __name__ == "__main__":
    sys.exit(main())
