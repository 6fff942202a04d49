#!/usr/bin/env python3
"""Measure one configuration with PyTorch (measure.py) and ask the estimator's CLI for the same
configuration, then print both and the error.

  python validation/compare.py --config cfg.json --batch 4 --seq 2048 --precision amp_bf16 \
      --optimizer adamw --attn sdpa [--gc] [--cli "cargo run --release -q -p estimator-cli --"]

Measured-file mode (no PyTorch needed): compare every row of a .jsonl against the CLI:
  python validation/compare.py --rows core/tests/fixtures/validation-measured.jsonl --configs validation/configs
"""
import argparse, json, os, shlex, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PREC = {"fp32": "fp32", "amp_bf16": "amp-bf16", "bf16": "bf16"}
OPT = {"adamw": "adamw", "sgd": "sgd-momentum", "none": "none"}
GC_ON = "full"  # the CLI's --checkpointing value for "every layer"; see --gc-value


def estimate(cli, cfg, batch, seq, precision, optimizer, attn, gc):
    cmd = shlex.split(cli) + ["--config", cfg, "--batch", str(batch), "--seq", str(seq),
                              "--precision", PREC[precision], "--optimizer", OPT[optimizer],
                              "--attention", attn, "--checkpointing", GC_ON if gc else "none", "--json"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"estimator failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def report(name, m, e):
    pe, pm = e["peak_bytes"], m["peak_bytes"]
    err = 100.0 * (pe - pm) / pm
    print(f"{name}: measured {pm / 2**30:.3f} GiB ({m['peak_phase']}), estimated {pe / 2**30:.3f} GiB "
          f"({e.get('peak_phase', '?')}), error {err:+.2f}%; n_params measured {m['n_params']} "
          f"estimated {e.get('n_params')}")
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    ap.add_argument("--model-name")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", default="fp32", choices=list(PREC))
    ap.add_argument("--optimizer", default="adamw", choices=list(OPT))
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--rows", help="compare these measured rows instead of measuring")
    ap.add_argument("--configs", default=os.path.join(HERE, "configs"))
    ap.add_argument("--cli", default="cargo run --release -q -p estimator-cli --")
    ap.add_argument("--gc-value", default=GC_ON, help="CLI --checkpointing value used for gc rows")
    ap.add_argument("--device", choices=["fake", "cuda"], default="fake",
                    help="measure with the emulated fake step (default) or on a real GPU")
    a = ap.parse_args()
    globals()["GC_ON"] = a.gc_value
    if a.rows:
        errs = []
        for line in open(a.rows):
            m = json.loads(line)
            c = m["config"]
            cfg = os.path.join(a.configs, c["model"] + ".json")
            if not os.path.exists(cfg):
                print(f"skip {c['model']}: no {cfg}")
                continue
            e = estimate(a.cli, cfg, c["batch"], c["seq"], c["precision"], c["optimizer"], c["attn"], c["gc"])
            name = f"{c['model']} b{c['batch']} s{c['seq']} {c['precision']} {c['optimizer']} {c['attn']} gc={c['gc']}"
            errs.append(abs(report(name, m, e)))
        if errs:
            print(f"{len(errs)} rows: mean |error| {sum(errs) / len(errs):.2f}%, max {max(errs):.2f}%")
        return 0
    if not a.config:
        ap.error("--config or --rows is required")
    sys.path.insert(0, HERE)
    import measure as M
    name = a.model_name or os.path.splitext(os.path.basename(a.config))[0]
    fn = M.measure_cuda if a.device == "cuda" else M.measure
    m = fn(a.config, name, a.batch, a.seq, a.precision, a.optimizer, a.attn, a.gc)
    e = estimate(a.cli, os.path.abspath(a.config), a.batch, a.seq, a.precision, a.optimizer, a.attn, a.gc)
    report(name, m, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
