#!/usr/bin/env bash
# Sets up the tools (skipping what is there) and runs every test tier:
# formatting and lints, core unit/property/accuracy tests (with and without its `vision`
# feature), the CLI tests, browser tests of the components (wasm-bindgen-test in headless
# Chromium), the release build with its size budget, and the end-to-end tests of the built
# page.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/node_modules/.bin:$HOME/.cargo/bin:$PATH"
export CHROMEDRIVER=/usr/bin/chromedriver

step() { printf '\n\033[1m== %s ==\033[0m\n' "$*"; }

step "format and lints (native and wasm32)"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p batch-size-estimator --target wasm32-unknown-unknown --all-targets -- -D warnings

step "core: unit, property and accuracy tests"
cargo test -p estimator-core
# without the vision-language models (the `vision` feature), as a build that leaves them out
cargo test -p estimator-core --no-default-features

step "cli"
cargo test -p estimator-cli

step "browser tests of the components (headless Chromium)"
cargo test -p batch-size-estimator --target wasm32-unknown-unknown

step "release build and size budget"
trunk build --release
bash scripts/size-budget.sh

step "end-to-end tests of the built page"
node --test tests/e2e/
