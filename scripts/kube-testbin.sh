#!/usr/bin/env bash
# Builds the Kubernetes control plane the tests start with envtest
# (kube-apiserver and etcd, from scripts/kubetestbin) into
# $CAGEBOX_HOME/kube/$KUBE_VERSION, once per version: about 6 minutes and
# 2.5 GB of memory the first time on a 2-core machine, nothing after.
# Prints the directory (KUBEBUILDER_ASSETS) on stdout.
set -euo pipefail
cd "$(dirname "$0")/kubetestbin"
export PATH=$PATH:/usr/local/go/bin
kube_version=v1.37.2 # k8s.io/kubernetes in scripts/kubetestbin/go.mod
etcd_version=v3.7.0  # go.etcd.io/etcd/server/v3 there
home=${CAGEBOX_HOME:-/var/lib/cagebox}
dir=$home/kube/$kube_version-etcd$etcd_version
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "kube-testbin: building kube-apiserver $kube_version and etcd $etcd_version into $dir (once per version, ~6 min)" >&2
start=$(date +%s)
minor=${kube_version#v1.}; minor=${minor%%.*}
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w \
  -X k8s.io/component-base/version.gitVersion=$kube_version \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$minor" \
  -o "$tmp/kube-apiserver" ./kube-apiserver
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" ./etcd
mv "$tmp/kube-apiserver" "$tmp/etcd" "$dir/"
echo "kube-testbin: built in $(( $(date +%s) - start ))s" >&2
echo "$dir"
