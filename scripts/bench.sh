#!/usr/bin/env bash
# Sets up (including Debian's mitmproxy, the egress baseline) and runs every
# benchmark, printing each figure beside its baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if ! command -v mitmdump >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mitmproxy >/dev/null
fi
export PATH=$PATH:/usr/local/go/bin
make -s build
go run ./bench "$@"
