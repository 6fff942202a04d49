#!/usr/bin/env bash
# Benchmarks (figures, not pass/fail): bundle size, the core's recompute time, and the
# page's input-to-numbers and navigation-to-render times in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
export PATH="$PWD/node_modules/.bin:$HOME/.cargo/bin:$PATH"
echo "== bundle (release build) =="
trunk build --release >/dev/null 2>&1
bash scripts/size-budget.sh
echo; echo "== core (native, release) =="
cargo run --quiet --release -p estimator-core --example bench
echo; echo "== page (headless Chromium) =="
node scripts/bench-browser.mjs
