#!/usr/bin/env bash
# The prepared GPU run (validation/README.md, "validation/gpu: the prepared GPU run").
#
#   bash validation/gpu/run.sh              on the GPU machine, from the repo root; results under $OUT
#                                           (default validation/gpu/out): rows.jsonl, failures.jsonl,
#                                           summary.txt, env.json, log.txt, children.log, streams.jsonl
#   bash validation/gpu/run.sh --dry-run    the CPU self-test (tiny models, no CUDA needed)
#
# Uses the machine's own python3 with torch (no network there: nothing is installed). Without torch in
# python3 it tries validation/.venv/bin/python (this repo's CPU venv), else stops with a message.
# Environment: OUT, PYTHON (interpreter to use), BUDGET_S (480: no configuration started after it),
# DEADLINE_S (540: none runs past it), ONLY (space-separated substrings of entry names to run).
set -u
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-validation/gpu/out}"
mkdir -p "$OUT"
T0=$(date +%s)

pick_python() {
    local c
    for c in ${PYTHON:-} python3 validation/.venv/bin/python python; do
        if [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' >/dev/null 2>&1; then
            echo "$c"; return 0
        fi
    done
    return 1
}
PY=$(pick_python) || {
    echo "run.sh: no Python with torch found (tried \$PYTHON='${PYTHON:-}', python3, validation/.venv/bin/python, python)." >&2
    echo "run.sh: this run needs an interpreter where 'import torch' works; it installs nothing (the GPU machine has no network)." >&2
    command -v python3 >/dev/null 2>&1 && python3 -c 'import torch' 2>&1 | tail -1 >&2
    exit 2
}

if [ "${1:-}" = "--dry-run" ] || [ "${1:-}" = "--self-test" ]; then
    shift
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
    echo "run.sh --dry-run: $($PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)') ($PY)"
    for engine in "--engine fsdp2" "--engine fsdp1 --wrap layers"; do
        # shellcheck disable=SC2086
        "$PY" validation/gpu/streams.py --device cpu $engine --gc >/dev/null || { echo "run.sh --dry-run: streams.py $engine failed" >&2; exit 1; }
    done
    echo "run.sh --dry-run: streams.py (FSDP2, FSDP1) ran on the CPU"
    exec "$PY" validation/gpu/measure_gpu.py --self-test "$@"
fi

export PYTHONUNBUFFERED=1
echo "run.sh: python $PY"
# versions and the device, also written to $OUT/env.json (driver version added to every row)
"$PY" - "$OUT/env.json" <<'EOF' || { echo "run.sh: stopping: no usable CUDA device (see above)" >&2; exit 3; }
import json, os, platform, subprocess, sys
import torch
info = {"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
        "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
        "platform": platform.platform(), "cpus": os.cpu_count(),
        "env_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")}
try:
    import importlib.util
    info["transformers"] = None
    if importlib.util.find_spec("transformers"):
        import transformers
        info["transformers"] = transformers.__version__
except Exception as ex:
    info["transformers"] = f"import failed: {type(ex).__name__}"
for mod in ("triton",):
    try:
        info[mod] = __import__(mod).__version__
    except Exception:
        info[mod] = None
try:
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                        "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    if q.returncode == 0 and q.stdout.strip():
        info["driver"] = q.stdout.strip().splitlines()[0].split(",")[1].strip()
except Exception as ex:
    info["nvidia_smi"] = f"failed: {ex}"
if torch.cuda.is_available():
    info["device"] = torch.cuda.get_device_name()
    info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    info["cudnn"] = torch.backends.cudnn.version()
    info["device_total_bytes"] = torch.cuda.mem_get_info()[1]
for k, v in info.items():
    print(f"  {k}: {v}")
with open(sys.argv[1], "w") as f:
    json.dump(info, f, indent=1)
if not info["cuda_available"]:
    print("run.sh: torch.cuda.is_available() is False", file=sys.stderr)
    sys.exit(1)
EOF

# The engines' streams first (issue 34, validation/gpu/streams.py): one rank of FSDP2 / FSDP1 of a world
# of 8 over the fake process group, each in its own process (a fresh allocator), within STREAMS_S seconds
STREAMS_S="${STREAMS_S:-100}"
for engine in "--engine fsdp2 --allocator expandable" "--engine fsdp2" "--engine fsdp1 --wrap layers"; do
    [ $(( $(date +%s) - T0 )) -lt "$STREAMS_S" ] || break
    # shellcheck disable=SC2086
    timeout 60 "$PY" validation/gpu/streams.py $engine --gc --out "$OUT/streams.jsonl" >> "$OUT/log.txt" 2>&1 \
        || echo "run.sh: streams.py $engine failed (see log.txt)" | tee -a "$OUT/log.txt"
done

SPENT=$(( $(date +%s) - T0 ))
BUDGET_S="${BUDGET_S:-480}"
DEADLINE_S="${DEADLINE_S:-540}"
ARGS=(--out-dir "$OUT" --env-json "$OUT/env.json" --budget-s $(( BUDGET_S - SPENT )) --deadline-s $(( DEADLINE_S - SPENT )))
if [ -n "${ONLY:-}" ]; then
    # shellcheck disable=SC2206
    ARGS+=(--only ${ONLY})
fi
set -o pipefail
"$PY" -u validation/gpu/measure_gpu.py "${ARGS[@]}" "$@" 2>&1 | tee -a "$OUT/log.txt"
rc=$?
echo "run.sh: done in $(( $(date +%s) - T0 )) s (rc=$rc); files in $OUT:"; ls -la "$OUT"
cat "$OUT/summary.txt" 2>/dev/null
exit $rc
