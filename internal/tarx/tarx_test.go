package tarx

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type ent struct {
	name, link string
	typ        byte
	body       string
	size       int64 // when set, the header's size (body may be shorter)
	mode       int64
}

func mkTar(t *testing.T, ents ...ent) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, ModTime: time.Unix(1700000000, 0)}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
			if e.size != 0 {
				h.Size = e.size
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A header that claims more than was written (a huge size) cannot be
	// flushed; what is in buf already is the crafted archive.
	if err := tw.Flush(); err != nil && !strings.Contains(err.Error(), "missed writing") {
		t.Fatal(err)
	}
	return &buf
}

// bothResolvers runs fn with openat2 and with the component walk.
func bothResolvers(t *testing.T, fn func(t *testing.T)) {
	for _, walk := range []bool{false, true} {
		name := "openat2"
		if walk {
			name = "walk"
		}
		t.Run(name, func(t *testing.T) {
			old := openat2Missing.Load()
			openat2Missing.Store(walk)
			defer openat2Missing.Store(old)
			fn(t)
		})
	}
}

func TestExtractRefusesEscapes(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			ents    []ent
			want    error
			outside string // a file outside dest that must not appear
		}{
			{"dotdot", []ent{{name: "../evil", typ: tar.TypeReg, body: "x"}}, ErrUnsafe, "evil"},
			{"dotdot inside", []ent{{name: "a/../../evil", typ: tar.TypeReg, body: "x"}}, ErrUnsafe, "evil"},
			{"absolute", []ent{{name: "/evil", typ: tar.TypeReg, body: "x"}}, ErrUnsafe, ""},
			{"symlink out then write through it", []ent{
				{name: "ln", typ: tar.TypeSymlink, link: ".."},
				{name: "ln/evil", typ: tar.TypeReg, body: "x"},
			}, ErrUnsafe, "evil"},
			{"absolute symlink then write through it", []ent{
				{name: "ln", typ: tar.TypeSymlink, link: "OUTSIDE"},
				{name: "ln/evil", typ: tar.TypeReg, body: "x"},
			}, ErrUnsafe, "evil"},
			{"symlink then mkdir through it", []ent{
				{name: "ln", typ: tar.TypeSymlink, link: "../"},
				{name: "ln/d/", typ: tar.TypeDir, mode: 0o755},
			}, ErrUnsafe, "d"},
			{"hard link out", []ent{{name: "hl", typ: tar.TypeLink, link: "../secret"}}, ErrUnsafe, ""},
			{"hard link absolute", []ent{{name: "hl", typ: tar.TypeLink, link: "/etc/passwd"}}, ErrUnsafe, ""},
			{"char device", []ent{{name: "null", typ: tar.TypeChar}}, ErrUnsafe, ""},
			{"block device", []ent{{name: "sda", typ: tar.TypeBlock}}, ErrUnsafe, ""},
			{"fifo", []ent{{name: "fifo", typ: tar.TypeFifo}}, ErrUnsafe, ""},
			{"huge size", []ent{{name: "big", typ: tar.TypeReg, body: "", size: 1 << 40}}, ErrLimit, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				base := t.TempDir()
				dest := filepath.Join(base, "dest")
				outside := filepath.Join(base, "outside")
				os.Mkdir(outside, 0o755)
				os.WriteFile(filepath.Join(base, "secret"), []byte("s"), 0o600)
				for i := range tc.ents {
					tc.ents[i].link = strings.ReplaceAll(tc.ents[i].link, "OUTSIDE", outside)
				}
				_, err := Extract(mkTar(t, tc.ents...), dest, Limits{MaxBytes: 1 << 20})
				if !errors.Is(err, tc.want) {
					t.Fatalf("err %v, want %v", err, tc.want)
				}
				if tc.outside != "" {
					for _, p := range []string{filepath.Join(base, tc.outside), filepath.Join(outside, tc.outside)} {
						if _, err := os.Lstat(p); err == nil {
							t.Fatalf("%s was written outside the destination", p)
						}
					}
				}
				if _, err := os.Lstat(filepath.Join(dest, "hl")); err == nil {
					t.Fatal("a hard link to a file outside was made")
				}
				if b, _ := os.ReadFile(filepath.Join(base, "secret")); string(b) != "s" {
					t.Fatal("the file outside changed")
				}
			})
		}
	})
}

func TestExtractTooManyEntries(t *testing.T) {
	var ents []ent
	for i := 0; i < 20; i++ {
		ents = append(ents, ent{name: strings.Repeat("f", i+1), typ: tar.TypeReg, body: "x"})
	}
	st, err := Extract(mkTar(t, ents...), t.TempDir(), Limits{MaxEntries: 10})
	if !errors.Is(err, ErrLimit) || st.Entries != 11 {
		t.Fatalf("err %v after %d entries, want ErrLimit at the 11th", err, st.Entries)
	}
}

func TestExtractReplacesSymlinkNotTarget(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		base := t.TempDir()
		target := filepath.Join(base, "target")
		os.WriteFile(target, []byte("keep"), 0o644)
		dest := filepath.Join(base, "dest")
		os.Mkdir(dest, 0o755)
		// A symlink already in the destination: a file entry of that name
		// replaces the link, it does not write through it.
		os.Symlink(target, filepath.Join(dest, "f"))
		if _, err := Extract(mkTar(t, ent{name: "f", typ: tar.TypeReg, body: "new"}), dest, Limits{}); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(target); string(b) != "keep" {
			t.Fatalf("wrote through a symlink: target now %q", b)
		}
		if b, _ := os.ReadFile(filepath.Join(dest, "f")); string(b) != "new" {
			t.Fatalf("f = %q", b)
		}
	})
}

func TestExtractInsideSymlinkAllowedWithOpenat2(t *testing.T) {
	openat2Missing.Store(false)
	dest := t.TempDir()
	_, err := Extract(mkTar(t,
		ent{name: "d/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "ln", typ: tar.TypeSymlink, link: "d"},
		ent{name: "ln/f", typ: tar.TypeReg, body: "x"},
	), dest, Limits{})
	if openat2Missing.Load() {
		t.Skip("no openat2 here: the walk refuses every symlink, which TestExtractRefusesEscapes covers")
	}
	if err != nil {
		t.Fatalf("a symlink that stays inside should resolve: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "d", "f")); string(b) != "x" {
		t.Fatalf("d/f = %q", b)
	}
}

func TestRoundTrip(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		src := t.TempDir()
		os.MkdirAll(filepath.Join(src, "sub", "deeper"), 0o755)
		os.Mkdir(filepath.Join(src, "empty"), 0o700)
		os.Mkdir(filepath.Join(src, "ro"), 0o755)
		os.WriteFile(filepath.Join(src, "ro", "inside"), []byte("i"), 0o644)
		os.Chmod(filepath.Join(src, "ro"), 0o555)
		defer os.Chmod(filepath.Join(src, "ro"), 0o755)
		os.WriteFile(filepath.Join(src, "exec.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
		os.WriteFile(filepath.Join(src, "sub", "deeper", "data"), bytes.Repeat([]byte("abc"), 100000), 0o640)
		os.Symlink("sub/deeper/data", filepath.Join(src, "link"))
		os.Symlink("/etc/passwd", filepath.Join(src, "abslink"))

		var buf bytes.Buffer
		if err := Create(&buf, src); err != nil {
			t.Fatal(err)
		}
		dest := filepath.Join(t.TempDir(), "out")
		st, err := Extract(&buf, dest, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(filepath.Join(dest, "ro"), 0o755)
		if st.Bytes != 300000+18+1 {
			t.Errorf("bytes %d", st.Bytes)
		}
		checkMode := func(p string, want fs.FileMode) {
			t.Helper()
			fi, err := os.Lstat(filepath.Join(dest, p))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != want {
				t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
			}
		}
		checkMode("exec.sh", 0o755)
		checkMode("sub/deeper/data", 0o640)
		checkMode("empty", fs.ModeDir|0o700)
		checkMode("ro", fs.ModeDir|0o555)
		if l, _ := os.Readlink(filepath.Join(dest, "link")); l != "sub/deeper/data" {
			t.Errorf("link -> %q", l)
		}
		if l, _ := os.Readlink(filepath.Join(dest, "abslink")); l != "/etc/passwd" {
			t.Errorf("abslink -> %q", l)
		}
		if b, _ := os.ReadFile(filepath.Join(dest, "ro", "inside")); string(b) != "i" {
			t.Errorf("ro/inside = %q", b)
		}
		fi, _ := os.Stat(filepath.Join(dest, "exec.sh"))
		si, _ := os.Stat(filepath.Join(src, "exec.sh"))
		if !fi.ModTime().Equal(si.ModTime().Truncate(time.Second)) && !fi.ModTime().Equal(si.ModTime()) {
			t.Errorf("mtime %v, want %v", fi.ModTime(), si.ModTime())
		}
	})
}

func TestCreateSkipsDevicesAndFile(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
	var buf bytes.Buffer
	if err := Create(&buf, "/dev/null"); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	if h, err := tr.Next(); err == nil {
		t.Fatalf("a device became entry %q", h.Name)
	}
	buf.Reset()
	if err := Create(&buf, filepath.Join(src, "f")); err != nil {
		t.Fatal(err)
	}
	tr = tar.NewReader(&buf)
	h, err := tr.Next()
	if err != nil || h.Name != "f" || h.Size != 1 {
		t.Fatalf("single file: %+v %v", h, err)
	}
}

// TestExtractDoesNotTrustModes: an archive cannot chmod the destination or
// directories that were there before, cannot make setuid, setgid or sticky
// files (not even under a zero umask), does not get past the umask, and
// does not choose owners.
func TestExtractDoesNotTrustModes(t *testing.T) {
	for _, umask := range []int{0, 0o027} {
		t.Run(fmt.Sprintf("umask %03o", umask), func(t *testing.T) {
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			dest := filepath.Join(t.TempDir(), "out")
			if err := os.MkdirAll(filepath.Join(dest, "keep"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dest, 0o750); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range []*tar.Header{
				{Name: "./", Typeflag: tar.TypeDir, Mode: 0o7777},
				{Name: "keep/", Typeflag: tar.TypeDir, Mode: 0o4777},
				{Name: "keep/suid", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 0, Gid: 0, Size: 1},
				{Name: "sgid", Typeflag: tar.TypeReg, Mode: 0o2777, Uid: 1234, Gid: 1234, Size: 1},
				{Name: "new/", Typeflag: tar.TypeDir, Mode: 0o1777},
				{Name: "new/ro/", Typeflag: tar.TypeDir, Mode: 0o6555},
				{Name: "new/ro/f", Typeflag: tar.TypeReg, Mode: 0o444, Size: 1},
			} {
				h.ModTime = time.Unix(1700000000, 0)
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				if h.Size > 0 {
					tw.Write([]byte("x"))
				}
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := Extract(&buf, dest, Limits{}); err != nil {
				t.Fatal(err)
			}
			defer os.Chmod(filepath.Join(dest, "new", "ro"), 0o755)
			m := fs.FileMode(umask)
			for p, want := range map[string]fs.FileMode{
				"":          fs.ModeDir | 0o750,
				"keep":      fs.ModeDir | 0o700,
				"keep/suid": 0o755 &^ m,
				"sgid":      0o777 &^ m,
				"new":       fs.ModeDir | 0o777&^m,
				"new/ro":    fs.ModeDir | 0o555&^m,
				"new/ro/f":  0o444 &^ m,
			} {
				fi, err := os.Lstat(filepath.Join(dest, p))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != want {
					t.Errorf("%q: mode %v, want %v", p, fi.Mode(), want)
				}
				if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() || int(st.Gid) != os.Getgid() {
					t.Errorf("%q: owner %d:%d, want the process's", p, st.Uid, st.Gid)
				}
			}
			if fi, _ := os.Stat(filepath.Join(dest, "new")); !fi.ModTime().Equal(time.Unix(1700000000, 0)) {
				t.Errorf("a directory made by the extraction has time %v, want the archive's", fi.ModTime())
			}
		})
	}
}
