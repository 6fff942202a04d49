#!/usr/bin/env bash
# Installs every tool the build and the tests need. Each step is skipped when the tool is
# already there at the pinned version, so running it again costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

TRUNK_VERSION=0.21.14
WASM_BINDGEN_VERSION=0.2.129

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

export PATH="$HOME/.cargo/bin:$PATH"

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  log "adding the wasm32-unknown-unknown target"
  rustup target add wasm32-unknown-unknown
fi

if [ "$(trunk --version 2>/dev/null || true)" != "trunk $TRUNK_VERSION" ]; then
  log "installing trunk $TRUNK_VERSION (about 6 minutes)"
  cargo install --locked trunk --version "$TRUNK_VERSION"
fi

if [ "$(wasm-bindgen --version 2>/dev/null || true)" != "wasm-bindgen $WASM_BINDGEN_VERSION" ] ||
  ! command -v wasm-bindgen-test-runner >/dev/null; then
  log "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION"
  cargo install --locked wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
fi

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  log "installing Debian's chromium and chromium-driver"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# playwright-core (driver only, never a browser download), axe-core, binaryen's wasm-opt and
# terser (the release build minifies wasm-bindgen's glue with it).
if [ ! -x node_modules/.bin/wasm-opt ] || [ ! -d node_modules/playwright-core ] ||
  [ ! -d node_modules/axe-core ] || [ ! -d node_modules/terser ] ||
  [ package-lock.json -nt node_modules/.package-lock.json ]; then
  log "installing npm packages"
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
fi

log "tools ready"
