#!/usr/bin/env python3
"""Run a memest binary on every row of single-gpu.tsv (or multi-gpu.tsv) and compare with the published figures.

    python3 validation/published/rerun.py path/to/memest [--table multi-gpu] [--tsv FILE] [--out FILE.md]

Standard library only. Prints a Markdown table (id | source | counter | published | ours |
error | status), then the summary: median error, rows within 10%, OOM agreement. See
README.md next to this file for what each counter means and how "ours" is read from
`memest --json`. `--table multi-gpu` runs multi-gpu.tsv (per-GPU figures of runs on several
GPUs) and adds one summary line per counter; its `not-describable` rows (no memest flags) are
listed and skipped.
"""

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
from urllib.parse import urlparse

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2**20
UNIT_BYTES = {"MiB": 2**20, "GiB": 2**30, "GB": 10**9}
# memest's verdict counts this CUDA context when the row names no measured one
DEFAULT_CONTEXT_MIB = 500
SEQ_CEILING = 1 << 22  # 4M tokens: beyond any published context
NOT_DESCRIBABLE = "not-describable"  # status of a row memest's flags cannot describe at all

# what each table prints: its title, the label of its all-rows summary line, and whether a
# summary line per counter follows (single-gpu.tsv's output is kept as it always was)
TABLES = {
    "single-gpu": {
        "title": "# Published single-GPU figures against memest (`validation/published/rerun.py`)",
        "all_label": "all rows, the unverified LF-QL ones included",
        "by_counter": False,
    },
    "multi-gpu": {
        "title": "# Published multi-GPU figures (per GPU) against memest "
        "(`validation/published/rerun.py --table multi-gpu`)",
        "all_label": "all rows, unverified ones included",
        "by_counter": True,
    },
}


class MemestError(Exception):
    pass


def memest_json(binary, args):
    proc = subprocess.run([binary, *args, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise MemestError((proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["failed"])
    return json.loads(proc.stdout)


def with_seq(args, seq):
    """`args` with `--seq` set to `seq` (replaced if present, appended if not)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--seq":
            skip = True
            continue
        out.append(a)
    return out + ["--seq", str(seq)]


def fits_verdict(d):
    return bool(d["verdict"]["fits"])


def fits_no_margin(d):
    v = d["verdict"]
    return v["needed_bytes"] <= v["capacity_bytes"]


def largest_seq(binary, args, fits):
    """The largest --seq for which `fits(json)` holds: 0 when even 1 token does not fit."""
    cache = {}

    def ok(seq):
        if seq not in cache:
            cache[seq] = fits(memest_json(binary, with_seq(args, seq)))
        return cache[seq]

    if not ok(1):
        return 0
    lo, hi = 1, 1024
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > SEQ_CEILING:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def context_bytes(row, d):
    if row["context_mib"].strip():
        return float(row["context_mib"]) * MIB
    v = d.get("verdict")
    if v:
        return v["needed_bytes"] - d["reserved_bytes"] - v.get("communication_bytes", 0)
    return DEFAULT_CONTEXT_MIB * MIB


def memory_bytes(row, d):
    """The figure the row's counter reads, in bytes."""
    paged = d.get("paged_bytes", 0) or 0
    counter = row["counter"]
    if counter == "allocated":  # torch.cuda.max_memory_allocated(): managed memory is outside it
        return d["peak_bytes"] - paged
    if counter == "reserved":  # torch.cuda.max_memory_reserved()
        return d["reserved_bytes"] - paged
    if counter == "nvidia-smi":  # the process's memory: the allocator's segments + CUDA context
        return d["reserved_bytes"] + context_bytes(row, d)
    raise ValueError(f"{row['id']}: unknown counter {counter!r}")


def short_source(url):
    url = url.split(" ")[0]
    p = urlparse(url)
    parts = [x for x in p.path.split("/") if x]
    if p.netloc == "github.com" and len(parts) >= 2:
        if len(parts) >= 3 and parts[2] == "wiki":
            return f"{parts[0]}/{parts[1]} wiki {parts[-1]}"
        return f"{parts[0]}/{parts[1]} {parts[-1]}"
    return p.netloc + ("/" + parts[-1] if parts else "")


def fmt_num(x, unit):
    if unit == "tok":
        return f"{int(x):,}"
    if unit == "MiB":
        return f"{x:,.0f}"
    return f"{x:,.2f}"


def evaluate(binary, row, args, with_margin):
    """(ours text, error % or None, oom agreement True/False/None, extra text).

    `with_margin`: read memest's verdict as it is (its safety margin, 15% of the device by
    default, held back); without it, a step fits when the verdict's `needed_bytes` (what
    the allocator reserves + the CUDA context) is at most `capacity_bytes`."""
    published = row["published"].strip()
    unit = row["unit"]
    if row["counter"] == "max_seq":
        probe = memest_json(binary, args)
        if isinstance(probe.get("max_seq"), int):  # the CLI's own search, once it has one
            verdict_seq, source = probe["max_seq"], "--json max_seq"
        else:
            verdict_seq, source = largest_seq(binary, args, fits_verdict), "bisection"
        no_margin = largest_seq(binary, args, fits_no_margin)
        if with_margin:
            ours = verdict_seq
            extra = f"verdict ({source}); no margin: {no_margin:,} tok"
        else:
            ours = no_margin
            extra = f"no margin (bisection); verdict's fits: {verdict_seq:,} tok ({source})"
        if published == "OOM":
            return f"{ours:,} tok", None, ours == 0, extra
        pub = float(published)
        return f"{ours:,} tok", (ours - pub) / pub * 100, None, extra
    d = memest_json(binary, args)
    value = memory_bytes(row, d) / UNIT_BYTES[unit]
    if published == "OOM":
        v = d["verdict"]
        fits = fits_verdict(d) if with_margin else fits_no_margin(d)
        other = fits_no_margin(d) if with_margin else fits_verdict(d)
        extra = (f"needs {v['needed_bytes'] / UNIT_BYTES[unit]:,.2f} {unit} of "
                 f"{v['capacity_bytes'] / UNIT_BYTES[unit]:,.2f}; "
                 f"{'no margin' if with_margin else 'verdict'}: {'fits' if other else 'OOM'}")
        return ("fits" if fits else "OOM"), None, not fits, extra
    pub = float(published)
    return f"{fmt_num(value, unit)} {unit}", (value - pub) / pub * 100, None, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("memest", help="path to the memest binary")
    ap.add_argument(
        "--table",
        default="single-gpu",
        help="which table of this folder: single-gpu (default) or multi-gpu (per-GPU figures "
        "of multi-GPU runs); a NAME.tsv of this folder is read as NAME",
    )
    ap.add_argument("--tsv", help="read this file instead (default: the --table's file)")
    ap.add_argument("--out", help="also write the Markdown to this file")
    ap.add_argument(
        "--with-margin",
        action="store_true",
        help="fit as memest's verdict does, its safety margin held back (default: no margin)",
    )
    opts = ap.parse_args()
    binary = os.path.abspath(opts.memest)
    configs = os.path.join(HERE, "configs")
    table = opts.table[:-4] if opts.table.endswith(".tsv") else opts.table
    tsv = opts.tsv or os.path.join(HERE, table + ".tsv")
    if opts.tsv:  # a file named like one of the tables prints as that table
        base = os.path.basename(opts.tsv)
        table = base[:-4] if base[:-4] in TABLES else table
    profile = TABLES.get(table, TABLES["multi-gpu"])

    with open(tsv, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))

    lines = [
        profile["title"],
        "",
        f"memest: `{opts.memest}`; fit read {'with' if opts.with_margin else 'without'} the verdict's safety margin",
        "",
        "| id | source | counter | published | ours | error | status | detail |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    errors, errors_all, oom, oom_all, failed, skipped = [], [], [], [], [], []
    by_counter = {}
    for row in rows:
        args = shlex.split(row["memest_args"].replace("{configs}", configs))
        published = row["published"].strip()
        unit = row["unit"]
        pub_text = published if published == "OOM" else f"{fmt_num(float(published), unit)} {unit}"
        if row["status"] == NOT_DESCRIBABLE or not args:
            skipped.append(row["id"])
            lines.append(
                f"| {row['id']} | {short_source(row['source'])} | {row['counter']} | {pub_text} | "
                f"- | - | {row['status']} | skipped: memest's flags cannot describe it (see the row's notes) |"
            )
            continue
        try:
            ours, err, agree, extra = evaluate(binary, row, args, opts.with_margin)
        except MemestError as e:
            ours, err, agree, extra = "error", None, None, " ".join(e.args[0])
            failed.append(row["id"])
        counted = row["status"] != "unverified"
        if err is not None:
            errors_all.append(err)
            if counted:
                errors.append(err)
            by_counter.setdefault(row["counter"], []).append(err)
        if agree is not None:
            oom_all.append(agree)
            if counted:
                oom.append(agree)
        if agree is not None:
            err_text = "agrees" if agree else "disagrees"
        elif err is not None:
            err_text = f"{err:+.1f}%"
        else:
            err_text = "-"
        lines.append(
            f"| {row['id']} | {short_source(row['source'])} | {row['counter']} | {pub_text} | "
            f"{ours} | {err_text} | {row['status']} | {extra} |"
        )

    def summary(errs, ooms, label):
        if not errs:
            return f"- {label}: no numeric rows"
        within = sum(1 for e in errs if abs(e) <= 10)
        text = (
            f"- {label}: median error {statistics.median(errs):+.1f}% "
            f"(median |error| {statistics.median(abs(e) for e in errs):.1f}%), "
            f"{within} of {len(errs)} numeric rows within 10%"
        )
        return text if ooms is None else f"{text}; OOM agreement {sum(ooms)}/{len(ooms)}"

    lines += [
        "",
        summary(errors, oom, "rows with a re-found source (status approx)"),
        summary(errors_all, oom_all, profile["all_label"]),
    ]
    if profile["by_counter"]:
        for counter in sorted(by_counter):
            lines.append(summary(by_counter[counter], None, f"counter {counter}, all rows"))
    if skipped:
        lines.append(f"- not describable by memest's flags, skipped: {', '.join(skipped)}")
    if failed:
        lines.append(f"- memest refused: {', '.join(failed)}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
