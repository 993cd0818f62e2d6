package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/internal/rootfs"
)

// applyClaimFiles writes the guest files a claim describes into the
// agent's root: hostname, hosts, resolv.conf and the sandbox CA with the
// image's bundle. Nothing but the agent has run in the guest yet, so
// nothing raced to plant a link where a file goes; links are still
// replaced, never followed.
func applyClaimFiles(root string, cl *agentproto.Claim) error {
	g := rootfs.Guest{Hostname: cl.Hostname, Nameserver: cl.Nameserver, TrustedCAPEM: cl.TrustedCAPEM}
	var system []byte
	if len(cl.TrustedCAPEM) > 0 {
		if f, err := os.Open(filepath.Join(root, rootfs.SystemBundle)); err == nil {
			system, _ = io.ReadAll(io.LimitReader(f, rootfs.MaxSystemBundle))
			f.Close()
		}
	}
	for _, f := range g.FilesOver(system) {
		if err := replaceFile(filepath.Join(root, f.Path), f.Data, f.Mode); err != nil {
			return fmt.Errorf("write %s: %w", f.Path, err)
		}
	}
	return nil
}

// replaceFile puts data at p as a new file (what was there, a link
// included, is removed first), making its parent directories.
func replaceFile(p string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// O_CREATE|O_EXCL never follows a link at p.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
