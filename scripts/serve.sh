#!/usr/bin/env bash
# Sets up the tools (skipping what is there), builds the release bundle and serves it on
# http://127.0.0.1:8080, rebuilding on change.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/node_modules/.bin:$HOME/.cargo/bin:$PATH"
exec trunk serve --release --address 127.0.0.1 --port 8080
