package agentproto

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cagebox/cagebox/internal/tarx"
)

func TestArchiveRoundTrip(t *testing.T) {
	c, _ := startPair(t, "unix")
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o750)
	os.Mkdir(filepath.Join(src, "empty"), 0o755)
	os.WriteFile(filepath.Join(src, "a", "b", "big"), bytes.Repeat([]byte("0123456789"), 50000), 0o600)
	os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.Symlink("a/b/big", filepath.Join(src, "link"))

	var up bytes.Buffer
	if err := tarx.Create(&up, src); err != nil {
		t.Fatal(err)
	}
	guest := filepath.Join(t.TempDir(), "guest", "dir")
	if err := c.ArchivePut(ctxT(t), guest, &up, ArchiveLimits{}); err != nil {
		t.Fatal(err)
	}
	var down bytes.Buffer
	if err := c.ArchiveGet(ctxT(t), guest, &down); err != nil {
		t.Fatal(err)
	}
	back := t.TempDir()
	if _, err := tarx.Extract(&down, back, tarx.Limits{}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"a/b": os.ModeDir | 0o750, "a/b/big": 0o600, "run.sh": 0o755, "empty": os.ModeDir | 0o755, "link": os.ModeSymlink | 0o777} {
		fi, err := os.Lstat(filepath.Join(back, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(back, "link")); len(b) != 500000 {
		t.Errorf("big file through the link: %d bytes", len(b))
	}
}

func TestArchivePutRefusals(t *testing.T) {
	c, _ := startPair(t, "unix")
	base := t.TempDir()
	mk := func(hdrs ...*tar.Header) *bytes.Buffer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			tw.WriteHeader(h)
			if h.Size > 0 {
				tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		tw.Close()
		return &buf
	}
	for _, tc := range []struct {
		name string
		tar  *bytes.Buffer
		lim  ArchiveLimits
		want error
	}{
		{"escape", mk(&tar.Header{Name: "../escaped", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}), ArchiveLimits{}, ErrInvalid},
		{"through symlink", mk(&tar.Header{Name: "ln", Typeflag: tar.TypeSymlink, Linkname: base}, &tar.Header{Name: "ln/escaped", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}), ArchiveLimits{}, ErrInvalid},
		{"device", mk(&tar.Header{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}), ArchiveLimits{}, ErrInvalid},
		{"too big", mk(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 2000, Mode: 0o644}), ArchiveLimits{MaxBytes: 1000}, ErrTooLarge},
		{"too many", mk(&tar.Header{Name: "f1", Typeflag: tar.TypeReg, Mode: 0o644}, &tar.Header{Name: "f2", Typeflag: tar.TypeReg, Mode: 0o644}), ArchiveLimits{MaxEntries: 1}, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.ArchivePut(ctxT(t), filepath.Join(base, "dest"), tc.tar, tc.lim)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if _, err := os.Lstat(filepath.Join(base, "escaped")); err == nil {
				t.Fatal("an entry landed outside the destination")
			}
		})
	}
	// The session still works after refusals.
	if _, err := c.Health(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := c.ArchiveGet(ctxT(t), filepath.Join(base, "missing"), &out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("archive of a missing path: %v", err)
	}
}
