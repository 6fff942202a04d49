#!/usr/bin/env python3
"""Re-measure rows of the reference data and print measured vs reference peak.

  python validation/reproduce.py [--ref ../shared/reference/pytorch-measured.jsonl] [--out rows.jsonl]
"""
import argparse, json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure as M  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# (model, batch, seq, precision, optimizer, attn, gc)
ROWS = [
    ("gpt2", 1, 1024, "fp32", "adamw", "sdpa", False),
    ("gpt2", 1, 1024, "amp_bf16", "adamw", "sdpa", False),
    ("gpt2", 1, 1024, "bf16", "none", "sdpa", False),
    ("gpt2", 1, 1024, "fp32", "adamw", "eager", False),
    ("gpt2", 1, 1024, "amp_bf16", "adamw", "sdpa", True),
    ("bert-base", 8, 512, "fp32", "adamw", "sdpa", False),
    ("llama-1b", 1, 2048, "bf16", "adamw", "sdpa", False),
    # extra rows
    ("gpt2", 1, 1024, "amp_bf16", "none", "sdpa", False),
    ("gpt2", 4, 1024, "amp_bf16", "adamw", "eager", False),
    ("bert-base", 8, 512, "amp_bf16", "adamw", "eager", False),
    ("bert-base", 8, 512, "bf16", "sgd", "sdpa", False),
    ("llama-1b", 1, 2048, "amp_bf16", "adamw", "sdpa", False),
    ("llama-1b", 1, 2048, "amp_bf16", "adamw", "sdpa", True),
    # fp32 + grouped-query attention: the efficient kernel with un-expanded K/V (torch >= 2.14)
    ("llama3-8b", 1, 2048, "fp32", "adamw", "sdpa", False),
]


def key(c):
    return (c["model"], c["batch"], c["seq"], c["precision"], c["optimizer"], c["attn"], c["gc"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default=os.path.join(HERE, "..", "..", "shared", "reference", "pytorch-measured.jsonl"))
    ap.add_argument("--out")
    ap.add_argument("--only", help="substring filter on the model name")
    ap.add_argument("--first", type=int, help="only the first N rows")
    ap.add_argument("--all", action="store_true",
                    help="every reference row whose model has a config in configs/ (not the vision models)")
    ap.add_argument("--skip", default="", help="comma-separated model names to leave out with --all")
    a = ap.parse_args()
    if not os.path.exists(a.ref):
        a.ref = "/work/shared/reference/pytorch-measured.jsonl"
    ref = {key(r["config"]): r for r in map(json.loads, open(a.ref))}
    print(f"{'model':10} {'b':>2} {'seq':>5} {'prec':8} {'opt':5} {'attn':5} {'gc':5} "
          f"{'measured':>14} {'reference':>14} {'diff %':>8} phase(m/r)")
    rows = ROWS
    if a.all:
        skip = set(filter(None, a.skip.split(",")))
        rows = [k for k in ref if os.path.exists(os.path.join(HERE, "configs", k[0] + ".json"))
                and k[0] not in skip]
    n = same_peak = same_all = 0
    worst = 0.0
    for row in rows[: a.first or len(rows)]:
        if a.only and a.only not in row[0]:
            continue
        m, b, s, p, o, at, gc = row
        r = M.measure(os.path.join(HERE, "configs", m + ".json"), m, b, s, p, o, at, gc)
        r.pop("sdpa_kernels", None)
        rf = ref.get(row)
        rp = rf["peak_bytes"] if rf else None
        d = f"{100.0 * (r['peak_bytes'] - rp) / rp:+.3f}" if rp else "n/a"
        print(f"{m:10} {b:>2} {s:>5} {p:8} {o:5} {at:5} {str(gc):5} {r['peak_bytes']:>14} "
              f"{rp if rp else '-':>14} {d:>8} {r['peak_phase']}/{rf['peak_phase'] if rf else '-'}"
              f"{'' if not rf else (' all fields equal' if _same(r, rf) else ' fields differ: ' + ','.join(_diff(r, rf)))}",
              flush=True)
        if rf:
            n += 1
            same_peak += r["peak_bytes"] == rp and r["peak_phase"] == rf["peak_phase"]
            same_all += _same(r, rf)
            worst = max(worst, abs(r["peak_bytes"] - rp) / rp * 100)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")


    print(f"{n} reference rows: {same_peak} with identical peak_bytes and peak_phase, {same_all} identical "
          f"in every field (time_s and versions aside); largest |peak diff| {worst:.3f}%")


IGNORED = {"time_s", "versions"}


def _diff(r, rf):
    return [k for k in rf if k not in IGNORED and r.get(k) != rf[k]]


def _same(r, rf):
    return not _diff(r, rf)


if __name__ == "__main__":
    main()
