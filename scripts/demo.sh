#!/usr/bin/env bash
# The main job: set up, then run real sandboxes on the embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cb=bin/cagebox
echo
echo '$ cagebox runtimes'
$cb runtimes
echo
echo '$ cagebox run -- sh -c "…"   # a fresh sandbox: own kernel namespaces, no capabilities, no network'
$cb run --memory 256M --timeout 5m -- sh -c 'echo "hello from $(hostname) as $(id -un)"; python3 -c "import platform; print(\"python\", platform.python_version())"; grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status; ls /sys/class/net'
echo
echo '$ cagebox run -- python3 -c "bytearray(400<<20)"  --memory 128M   # limits are enforced'
$cb run --memory 128M -- python3 -c 'bytearray(400<<20)' || echo "(exit code $?)"
