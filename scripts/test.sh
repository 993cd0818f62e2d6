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
# The Kubernetes tests (test/kube, internal/kube/...) run a real control
# plane: kube-apiserver and etcd built from the module proxy once per
# version into $CAGEBOX_HOME/kube (about 6 minutes the first time).
KUBEBUILDER_ASSETS=$(./scripts/kube-testbin.sh)
export KUBEBUILDER_ASSETS CAGEBOX_REQUIRE_KUBE=1
export PATH=$PATH:/usr/local/go/bin
make test
