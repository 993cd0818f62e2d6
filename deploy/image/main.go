// Command image builds cagebox's container images from the repository's
// binaries (make build), without docker: OCI image tarballs (or docker
// archives) that `docker load`, `podman load`, `ctr images import`,
// `kind load image-archive` and `skopeo copy oci-archive:…` take.
//
//	go run ./deploy/image -kind controller -out cagebox-controller.tar
//	go run ./deploy/image -kind node -base-rootfs /srv/node-rootfs -out cagebox-node.tar
//	go run ./deploy/image -kind node -base-image debian-node.tar -out cagebox-node.tar
//
// The controller image is bin/cagebox-server (the full build of cmd/cagebox,
// installed as cagebox) alone (static) on an empty base:
// no shell, no package manager, user 65532, entrypoint `cagebox
// controller`. The node image is the same binary and bin/cagebox-agent on a
// base that brings the runtimes and tools the daemon drives (runc, crun,
// runsc, qemu-system-x86, nftables, iproute2, e2fsprogs, debootstrap,
// busybox-static, xz-utils, ca-certificates, openssl: docs/kubernetes.md;
// deploy/image/Dockerfile builds the same with docker), entrypoint
// `cagebox`, command `node`. Layers and config carry fixed timestamps
// (SOURCE_DATE_EPOCH, default 0), so the same inputs give the same digest.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"
)

func main() {
	var o options
	flag.StringVar(&o.kind, "kind", "", "controller or node")
	flag.StringVar(&o.binDir, "bin", "bin", "directory with cagebox-server (and, for node, cagebox-agent), built static (make build)")
	flag.StringVar(&o.baseRootfs, "base-rootfs", "", "node: a root file system directory to build on (one layer)")
	flag.StringVar(&o.baseImage, "base-image", "", "node: a base image tarball to build on (docker archive or OCI archive)")
	flag.StringVar(&o.out, "out", "", "output file (default cagebox-KIND.tar)")
	flag.StringVar(&o.tag, "tag", "", "image name recorded in the tarball (default cagebox-KIND:dev)")
	flag.StringVar(&o.format, "format", "oci", "oci (an OCI image layout, tarred) or docker (docker save's format)")
	flag.Parse()
	if o.out == "" {
		o.out = "cagebox-" + o.kind + ".tar"
	}
	if o.tag == "" {
		o.tag = "cagebox-" + o.kind + ":dev"
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "image: SOURCE_DATE_EPOCH=%q: want seconds since 1970\n", s)
			os.Exit(2)
		}
		o.created = time.Unix(n, 0).UTC()
	} else {
		o.created = time.Unix(0, 0).UTC()
	}
	digest, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("image: %s %s → %s (%s)\n", o.tag, digest, o.out, o.format)
}
