#!/usr/bin/env bash
# Sets up (including the egress peers: Debian's squid-openssl, run with
# ssl_bump, and mitmproxy; podman for the CLI comparison) and runs every benchmark, printing each figure
# beside its baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

need=()
command -v mitmdump >/dev/null || need+=(mitmproxy)
# The warm-pool benchmark times `cagebox run` against podman (runc).
command -v podman >/dev/null || need+=(podman)
if ! command -v squid >/dev/null; then
  need+=(squid-openssl)
elif [ ! -x /usr/lib/squid/security_file_certgen ]; then
  echo "bench: the installed squid has no ssl_bump (it is not squid-openssl): the squid peer is skipped" >&2
fi
if [ ${#need[@]} -gt 0 ]; then
  # The benchmark runs its own squid from a config in a temp dir. Keep the
  # package from starting the system service meanwhile (policy-rc.d,
  # Debian's switch for that), and disable a service it installed.
  policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    trap 'rm -f "$policy"' EXIT
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
  fi
  echo "bench: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  if [[ " ${need[*]} " == *" squid-openssl "* ]] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now squid >/dev/null 2>&1 || true
  fi
  if [ -n "$policy" ]; then
    rm -f "$policy"
    trap - EXIT
  fi
fi
export PATH=$PATH:/usr/local/go/bin
make -s build
# The fleet benchmarks (claims through the Kubernetes controller on three
# node agents) are Go benchmarks in test/kube: `scripts/bench.sh -only kube`.
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "kube" ]; then
  KUBEBUILDER_ASSETS=$(./scripts/kube-testbin.sh)
  export KUBEBUILDER_ASSETS CAGEBOX_REQUIRE_KUBE=1
  export CAGEBOX_TEST_IMAGES=${CAGEBOX_HOME:-/var/lib/cagebox}/images
  exec go test -count=1 -run '^$' -bench Fleet -benchtime "${KUBE_BENCHTIME:-5x}" -timeout 30m ./test/kube/
fi
go run ./bench "$@"
