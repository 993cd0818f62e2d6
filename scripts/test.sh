#!/usr/bin/env bash
# Sets up the host (packages, binaries, images) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export CAGEBOX_TEST_IMAGES=${CAGEBOX_HOME:-/var/lib/cagebox}/images
# The VM kernel, initramfs and image disks setup made (qemu runtime tests).
export CAGEBOX_TEST_VM=${CAGEBOX_HOME:-/var/lib/cagebox}/vm
# This machine kind always has runc, runsc and qemu: their conformance
# suites fail, not skip, if one cannot run (firecracker needs real KVM).
export CAGEBOX_REQUIRE_RUNTIMES=container,gvisor,qemu
export PATH=$PATH:/usr/local/go/bin
make test
