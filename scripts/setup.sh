#!/usr/bin/env bash
# Installs what cagebox needs on a Debian 12 host (as root), builds the
# binaries and the guest images. Safe to run again: it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (sandboxes need namespaces, mounts and cgroups)" >&2
  exit 1
fi

pkgs=(runc crun runsc debootstrap e2fsprogs busybox-static iproute2 nftables ca-certificates curl qemu-system-x86 xz-utils)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# Node.js and npm run the official MCP TypeScript SDK client in the tests
# (test/mcp). Machines of this kind ship Node 20; elsewhere Debian's works.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
# Debian's Chromium runs the web console's browser test (test/console,
# playwright-core driving /usr/bin/chromium headless).
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# KVM for the VMMs (QEMU, Firecracker), which run as uids of their own: an
# empty system group "kvm" they join as their only supplementary group. The
# daemon gives /dev/kvm to that group (0660) when the device is root-only
# and the group has no members, so no user gains access; it then proves
# KVM by booting the guest kernel and falls back to TCG when it cannot.
if [ -e /dev/kvm ] && ! getent group kvm >/dev/null; then
  echo "setup: creating the empty system group kvm (for the VMMs' use of /dev/kvm)"
  groupadd --system kvm
fi

export PATH=$PATH:/usr/local/go/bin
echo "setup: building bin/cagebox, bin/cagebox-server and bin/cagebox-agent"
make -s build

home=${CAGEBOX_HOME:-/var/lib/cagebox}
mkdir -p "$home"
bin/cagebox --home "$home" image build busybox
bin/cagebox --home "$home" image build default

# microVM artifacts for the qemu runtime (and Firecracker): the guest kernel
# pinned in internal/vmimage/kernel.go (apt-get download + dpkg-deb -x, its
# sha256 recorded), the initramfs around bin/cagebox-agent, and each image's
# ext4 disk. `image build` already made them if QEMU was installed; this
# makes sure, and fails loudly if the pinned kernel is gone from the mirror.
bin/cagebox --home "$home" image build --vm yes busybox
bin/cagebox --home "$home" image build --vm yes default
