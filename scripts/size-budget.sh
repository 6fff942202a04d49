#!/usr/bin/env bash
# Prints the release bundle's size (raw and gzip -9) and fails beyond the budget.
# Run after `trunk build --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET_GZIP_BYTES=${BUDGET_GZIP_BYTES:-262144}
total_raw=0
total_gzip=0
printf '%-8s %10s %10s  %s\n' kind raw gzip file
for pattern in '*.wasm' '*.js' '*.css'; do
  # (wasm-bindgen's snippets, such as the advisor's worker, sit in a folder of their own)
  for f in dist/$pattern $(find dist/snippets -name "$pattern" 2>/dev/null | sort); do
    [ -e "$f" ] || { echo "missing $pattern in dist/: run trunk build --release first" >&2; exit 1; }
    raw=$(stat -c %s "$f")
    gz=$(gzip -9 -c "$f" | wc -c)
    total_raw=$((total_raw + raw))
    total_gzip=$((total_gzip + gz))
    printf '%-8s %10d %10d  %s\n' "${pattern#*.}" "$raw" "$gz" "$(basename "$f")"
  done
done
printf '%-8s %10d %10d  (budget %d gzip)\n' total "$total_raw" "$total_gzip" "$BUDGET_GZIP_BYTES"
# The explanations are a static page of their own, loaded only when a person opens them:
# listed, outside the app's budget.
for f in $(find dist/about -type f 2>/dev/null | sort); do
  printf '%-8s %10d %10d  %s (not loaded by the app)\n' about "$(stat -c %s "$f")" "$(gzip -9 -c "$f" | wc -c)" "${f#dist/}"
done
if [ "$total_gzip" -gt "$BUDGET_GZIP_BYTES" ]; then
  echo "size budget exceeded: $total_gzip > $BUDGET_GZIP_BYTES bytes gzipped" >&2
  exit 1
fi
echo "size budget ok"
