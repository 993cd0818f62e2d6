#!/usr/bin/env bash
# Sets up the host (packages, binaries, images) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export CAGEBOX_TEST_IMAGES=${CAGEBOX_HOME:-/var/lib/cagebox}/images
export PATH=$PATH:/usr/local/go/bin
make test
