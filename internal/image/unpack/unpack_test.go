package unpack

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ent is one tar entry of a test layer.
type ent struct {
	name, body, link string
	typ              byte
	mode             int64
	size             int64 // header size without a body (limit tests); 0 = len(body)
}

func file(name, body string) ent { return ent{name: name, body: body, typ: tar.TypeReg, mode: 0o644} }
func dir(name string) ent        { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) ent {
	return ent{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}
func hardlink(name, target string) ent { return ent{name: name, link: target, typ: tar.TypeLink} }

var mtime = time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)

// layer makes a tar stream of ents. An entry with a size but no body is
// written as a header only (the stream then ends there).
func layer(t *testing.T, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, ModTime: mtime, Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if e.size > 0 {
			h.Size = e.size
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			return buf.Bytes() // header only: unpacking must refuse it at the header
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sandboxDirs makes base/root (the unpack root) and base/outside with a
// secret, and returns a function that fails the test if anything outside
// root changed.
func sandboxDirs(t *testing.T) (base, root string, unchanged func()) {
	t.Helper()
	base = t.TempDir()
	root = filepath.Join(base, "root")
	out := filepath.Join(base, "outside")
	for _, d := range []string{root, out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(out, "secret"), []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, base, root)
	hostPasswd, _ := os.Stat("/etc/passwd")
	return base, root, func() {
		t.Helper()
		if after := snapshot(t, base, root); after != before {
			t.Errorf("something outside the unpack root changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if p, _ := os.Stat("/etc/passwd"); hostPasswd != nil && (p == nil || !p.ModTime().Equal(hostPasswd.ModTime()) || p.Size() != hostPasswd.Size()) {
			t.Errorf("the host's /etc/passwd changed")
		}
	}
}

// snapshot describes every entry under base except inside root: name,
// type, link count, size and content.
func snapshot(t *testing.T, base, root string) string {
	t.Helper()
	var lines []string
	_ = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if p == root {
			lines = append(lines, "root/")
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := p + " " + fi.Mode().String() + " " + string(rune('0'+st.Nlink))
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			line += " " + string(b)
		}
		lines = append(lines, line)
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func apply(t *testing.T, root string, lim Limits, layers ...[]byte) (Stats, error) {
	t.Helper()
	u, err := New(root, lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	for _, l := range layers {
		if err := u.Apply(context.Background(), bytes.NewReader(l)); err != nil {
			return u.Stats(), err
		}
	}
	return u.Stats(), u.Finish()
}

// tree lists root: "path" for files (with content), "path/" for
// directories, "path -> target" for links.
func tree(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			lines = append(lines, rel+" -> "+target)
		case d.IsDir():
			lines = append(lines, rel+"/")
		default:
			b, _ := os.ReadFile(p)
			lines = append(lines, rel+"="+string(b))
		}
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, " ")
}

func TestMalicious(t *testing.T) {
	for _, tc := range []struct {
		name    string
		layers  func(base string) [][]ent
		lim     Limits
		wantErr error  // nil: accepted (neutralised)
		errSub  string // in the error
		want    string // the tree when accepted ("" = don't check)
	}{
		{name: "dotdot path", wantErr: ErrUnsafe, errSub: `".."`,
			layers: func(string) [][]ent { return [][]ent{{file("../escape", "x")}} }},
		{name: "dotdot deep", wantErr: ErrUnsafe,
			layers: func(string) [][]ent { return [][]ent{{dir("a/"), file("a/../../outside/secret", "pwned")}} }},
		{name: "absolute path is taken inside the root",
			layers: func(base string) [][]ent {
				return [][]ent{{file("/etc/passwd", "img"), file(base+"/outside/secret", "pwned")}}
			},
		},
		{name: "absolute symlink then a write through it", wantErr: ErrUnsafe, errSub: "symbolic link",
			layers: func(base string) [][]ent {
				return [][]ent{{symlink("etc", base+"/outside"), file("etc/secret", "pwned")}}
			}},
		{name: "absolute symlink then a write through it in a later layer", wantErr: ErrUnsafe, errSub: "symbolic link",
			layers: func(base string) [][]ent {
				return [][]ent{{symlink("etc", base+"/outside")}, {file("etc/secret", "pwned")}}
			}},
		{name: "a file over a symlink replaces the link",
			layers: func(base string) [][]ent {
				return [][]ent{{symlink("s", base+"/outside/secret")}, {file("s", "mine")}}
			},
			want: "s=mine"},
		{name: "symlinked dir then a file below it", wantErr: ErrUnsafe, errSub: "symbolic link",
			layers: func(string) [][]ent {
				return [][]ent{{symlink("d", "../outside"), file("d/x", "pwned")}}
			}},
		{name: "symlinked dir inside the root is not followed either", wantErr: ErrUnsafe,
			layers: func(string) [][]ent {
				return [][]ent{{dir("b/"), symlink("a", "b"), file("a/x", "x")}}
			}},
		{name: "directory entry through a symlink", wantErr: ErrUnsafe,
			layers: func(base string) [][]ent {
				return [][]ent{{symlink("d", base+"/outside"), dir("d/sub/")}}
			}},
		{name: "whiteout of /etc removes the image's etc only",
			layers: func(string) [][]ent {
				return [][]ent{{dir("etc/"), file("etc/passwd", "img"), file("keep", "k")}, {file(".wh.etc", "")}}
			},
			want: "keep=k"},
		{name: "absolute whiteout of /etc", layers: func(string) [][]ent {
			return [][]ent{{dir("etc/"), file("etc/passwd", "img")}, {file("/.wh.etc", "")}}
		}, want: ""},
		{name: "whiteout escaping with dotdot", wantErr: ErrUnsafe,
			layers: func(string) [][]ent { return [][]ent{{file("../.wh.outside", "")}} }},
		{name: "whiteout through a symlink", wantErr: ErrUnsafe,
			layers: func(base string) [][]ent {
				return [][]ent{{symlink("s", base+"/outside")}, {file("s/.wh.secret", "")}}
			}},
		{name: "opaque marker through a symlink", wantErr: ErrUnsafe,
			layers: func(base string) [][]ent {
				return [][]ent{{symlink("s", base+"/outside")}, {file("s/.wh..wh..opq", "")}}
			}},
		{name: "whiteout naming dotdot", wantErr: ErrUnsafe,
			layers: func(string) [][]ent { return [][]ent{{dir("a/"), file("a/.wh...", "")}} }},
		{name: "hard link to /etc/shadow", wantErr: ErrUnsafe, errSub: "not a file unpacked earlier",
			layers: func(string) [][]ent { return [][]ent{{hardlink("shadow", "/etc/shadow")}} }},
		{name: "hard link to a host file by absolute path", wantErr: ErrUnsafe,
			layers: func(base string) [][]ent { return [][]ent{{hardlink("s", base+"/outside/secret")}} }},
		{name: "hard link with dotdot", wantErr: ErrUnsafe,
			layers: func(string) [][]ent { return [][]ent{{hardlink("s", "../outside/secret")}} }},
		{name: "hard link through a symlink", wantErr: ErrUnsafe,
			layers: func(base string) [][]ent {
				return [][]ent{{symlink("o", base+"/outside"), hardlink("s", "o/secret")}}
			}},
		{name: "hard link to a directory", wantErr: ErrUnsafe,
			layers: func(string) [][]ent { return [][]ent{{dir("d/"), hardlink("s", "d")}} }},
		{name: "hard link to a file of the image",
			layers: func(string) [][]ent { return [][]ent{{file("a", "data"), hardlink("b", "/a")}} },
			want:   "a=data b=data"},
		{name: "10 GiB sparse file over the limit", wantErr: ErrLimit, errSub: "max-bytes",
			layers: func(string) [][]ent {
				return [][]ent{{ent{name: "big", typ: tar.TypeReg, mode: 0o644, size: 10 << 30}}}
			}},
		{name: "bytes over the limit across layers", lim: Limits{MaxBytes: 100}, wantErr: ErrLimit,
			layers: func(string) [][]ent {
				return [][]ent{{file("a", strings.Repeat("x", 60))}, {file("b", strings.Repeat("y", 60))}}
			}},
		{name: "device nodes are dropped",
			layers: func(string) [][]ent {
				return [][]ent{{dir("dev/"), {name: "dev/sda", typ: tar.TypeBlock, mode: 0o666}, {name: "dev/mem", typ: tar.TypeChar, mode: 0o666}, file("ok", "1")}}
			},
			want: "dev/ ok=1"},
		{name: "fifo is dropped",
			layers: func(string) [][]ent { return [][]ent{{{name: "p", typ: tar.TypeFifo, mode: 0o644}}} },
			want:   ""},
		{name: "too many files", lim: Limits{MaxFiles: 10}, wantErr: ErrLimit, errSub: "max-files",
			layers: func(string) [][]ent {
				var es []ent
				for i := 0; i < 20; i++ {
					es = append(es, file(strings.Repeat("f", i+1), ""))
				}
				return [][]ent{es}
			}},
		{name: "implied directories count too", lim: Limits{MaxFiles: 5}, wantErr: ErrLimit,
			layers: func(string) [][]ent { return [][]ent{{file("a/b/c/d/e/f/g", "")}} }},
		{name: "the root replaced by a file", wantErr: ErrUnsafe,
			layers: func(string) [][]ent { return [][]ent{{file(".", "")}} }},
		{name: "a file below a file", wantErr: ErrUnsafe, errSub: "not a directory",
			layers: func(string) [][]ent { return [][]ent{{file("a", ""), file("a/b", "")}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, root, unchanged := sandboxDirs(t)
			var layers [][]byte
			for _, es := range tc.layers(base) {
				layers = append(layers, layer(t, es...))
			}
			start := time.Now()
			_, err := apply(t, root, tc.lim, layers...)
			unchanged()
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errSub) {
					t.Fatalf("err = %v; want %v containing %q", err, tc.wantErr, tc.errSub)
				}
				if time.Since(start) > 5*time.Second {
					t.Errorf("refusing took %s", time.Since(start))
				}
				return
			}
			if err != nil {
				t.Fatalf("unpack: %v", err)
			}
			if tc.want != "" {
				if got := tree(t, root); got != tc.want {
					t.Fatalf("tree = %q; want %q", got, tc.want)
				}
			}
		})
	}
}

func TestAbsoluteNamesLandInsideTheRoot(t *testing.T) {
	base, root, unchanged := sandboxDirs(t)
	if _, err := apply(t, root, Limits{}, layer(t, file(base+"/outside/secret", "pwned"))); err != nil {
		t.Fatal(err)
	}
	unchanged()
	if b, err := os.ReadFile(filepath.Join(root, base, "outside", "secret")); err != nil || string(b) != "pwned" {
		t.Fatalf("the absolute name was not unpacked below the root: %q %v", b, err)
	}
}

func TestDroppedAreCounted(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	st, err := apply(t, root, Limits{}, layer(t,
		ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		ent{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660},
		ent{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
	))
	if err != nil {
		t.Fatal(err)
	}
	if st.Dropped["char device"] != 1 || st.Dropped["block device"] != 1 || st.Dropped["fifo"] != 1 {
		t.Fatalf("dropped = %v", st.Dropped)
	}
	for _, p := range []string{"dev/null", "dev/sda", "run/fifo"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s exists: %v", p, err)
		}
	}
}

func TestWhiteoutsAndOpaqueDirsAcrossLayers(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	l1 := layer(t, dir("a/"), file("a/1", "1"), file("a/2", "2"), dir("b/"), file("b/x", "x"), dir("b/sub/"), file("b/sub/deep", "d"),
		dir("c/"), file("c/z", "z"), dir("d/"), dir("d/sub/"), file("d/sub/old", "old"), file("f", "file"))
	l2 := layer(t, file("a/.wh.1", ""), dir("b/"), file("b/.wh..wh..opq", ""), file("b/y", "y"), file(".wh.c", ""),
		dir("d/"), file("d/.wh..wh..opq", ""), dir("d/sub/"), file("d/sub/new", "new"),
		dir("f/"), file("f/inside", "now a dir"))
	l3 := layer(t, file("c", "c is a file now"), file("a/.wh.nothing", ""), file("gone/.wh.x", ""))
	st, err := apply(t, root, Limits{}, l1, l2, l3)
	if err != nil {
		t.Fatal(err)
	}
	want := "a/ a/2=2 b/ b/y=y c=c is a file now d/ d/sub/ d/sub/new=new f/ f/inside=now a dir"
	if got := tree(t, root); got != want {
		t.Fatalf("tree:\n got %s\nwant %s", got, want)
	}
	if st.Whiteouts != 6 {
		t.Errorf("whiteouts = %d, want 6", st.Whiteouts)
	}
}

func TestWhiteoutSparesItsOwnLayer(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	l1 := layer(t, file("a", "old"), file("b", "old"))
	l2 := layer(t, file("a", "new"), file(".wh.a", ""), file(".wh.b", ""))
	if _, err := apply(t, root, Limits{}, l1, l2); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, root); got != "a=new" {
		t.Fatalf("tree = %q, want a=new (a whiteout hides lower layers only)", got)
	}
}

func TestOpaqueKeepsWhatItsLayerMadeBeforeIt(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	l1 := layer(t, dir("d/"), file("d/old", "o"))
	l2 := layer(t, dir("d/"), file("d/new", "n"), file("d/.wh..wh..opq", ""))
	if _, err := apply(t, root, Limits{}, l1, l2); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, root); got != "d/ d/new=n" {
		t.Fatalf("tree = %q", got)
	}
}

// TestMetadataKept: owners, permission bits and times are kept; setuid
// and setgid are not.
func TestMetadataKept(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	asRoot := os.Geteuid() == 0
	mode := int64(0o4755)
	if asRoot {
		mode = 0o6755
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirTime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, h := range []*tar.Header{
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o750, ModTime: dirTime, Uid: 1234, Gid: 5678},
		{Name: "d/suid", Typeflag: tar.TypeReg, Mode: mode, ModTime: mtime, Uid: 1234, Gid: 5678, Size: 2},
		{Name: "d/link", Typeflag: tar.TypeSymlink, Linkname: "/nowhere", ModTime: mtime, Uid: 1234, Gid: 5678},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("hi"))
		}
	}
	tw.Close()
	if _, err := apply(t, root, Limits{}, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "d/suid"))
	if err != nil {
		t.Fatal(err)
	}
	wantMode := fs.FileMode(0o755) // setuid and setgid dropped
	if fi.Mode() != wantMode || !fi.ModTime().Equal(mtime) {
		t.Errorf("file: mode %v mtime %v; want %v %v", fi.Mode(), fi.ModTime(), wantMode, mtime)
	}
	di, _ := os.Stat(filepath.Join(root, "d"))
	if di.Mode().Perm() != 0o750 || !di.ModTime().Equal(dirTime) {
		t.Errorf("dir: mode %v mtime %v; want 0750 %v (set after its children)", di.Mode(), di.ModTime(), dirTime)
	}
	li, _ := os.Lstat(filepath.Join(root, "d/link"))
	if li.Mode()&fs.ModeSymlink == 0 || !li.ModTime().Equal(mtime) {
		t.Errorf("link: %v %v", li.Mode(), li.ModTime())
	}
	if !asRoot {
		t.Log("owners not checked: not root (chown needs it)")
		return
	}
	for _, p := range []string{"d", "d/suid", "d/link"} {
		li, _ := os.Lstat(filepath.Join(root, p))
		st := li.Sys().(*syscall.Stat_t)
		if st.Uid != 1234 || st.Gid != 5678 {
			t.Errorf("%s owned by %d:%d, want 1234:5678", p, st.Uid, st.Gid)
		}
	}
}

func TestSparseFileStaysSparse(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	body := make([]byte, 16<<20)
	copy(body[len(body)-3:], "end")
	if _, err := apply(t, root, Limits{}, layer(t, file("sparse", string(body)))); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Size() != int64(len(body)) || st.Blocks*512 > 1<<20 {
		t.Fatalf("size %d, %d bytes allocated; want %d, under 1 MiB", fi.Size(), st.Blocks*512, len(body))
	}
	b, _ := os.ReadFile(filepath.Join(root, "sparse"))
	if !bytes.Equal(b, body) {
		t.Fatal("content differs")
	}
}

func TestTrailingDataIsBounded(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	l := append(layer(t, file("a", "x")), make([]byte, 2<<20)...)
	if _, err := apply(t, root, Limits{MaxBytes: 10, MaxFiles: 10}, l); !errors.Is(err, ErrLimit) {
		t.Fatalf("err = %v, want ErrLimit", err)
	}
	// Within the bound trailing zeros are fine (tar writers pad).
	_, root2, _ := sandboxDirs(t)
	l = append(layer(t, file("a", "x")), make([]byte, 10<<10)...)
	if _, err := apply(t, root2, Limits{}, l); err != nil {
		t.Fatal(err)
	}
}

func TestCancel(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	u, err := New(root, Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := u.Apply(ctx, bytes.NewReader(layer(t, file("a", "x")))); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func TestGarbageIsAnError(t *testing.T) {
	_, root, _ := sandboxDirs(t)
	if _, err := apply(t, root, Limits{}, bytes.Repeat([]byte("not a tar "), 100)); err == nil {
		t.Fatal("garbage unpacked without an error")
	}
}

// FuzzApply: any byte stream as a layer (applied twice) unpacks or fails,
// never panics, hangs or writes outside the root.
func FuzzApply(f *testing.F) {
	t := &testing.T{}
	for _, l := range [][]byte{
		layer(t, dir("etc/"), file("etc/passwd", "x"), symlink("l", "/etc"), hardlink("h", "etc/passwd")),
		layer(t, symlink("d", "../outside"), file("d/x", "x")),
		layer(t, file(".wh.etc", ""), file("a/.wh..wh..opq", ""), file("../x", "")),
		layer(t, ent{name: "dev/null", typ: tar.TypeChar}, ent{name: "p", typ: tar.TypeFifo}),
	} {
		f.Add(l)
	}
	base, err := os.MkdirTemp("", "fuzzunpack")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(base) })
	f.Fuzz(func(t *testing.T, b []byte) {
		root := filepath.Join(base, "root")
		os.RemoveAll(root)
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		u, err := New(root, Limits{MaxBytes: 1 << 20, MaxFiles: 1000}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if u.Apply(ctx, bytes.NewReader(b)) == nil {
			_ = u.Apply(ctx, bytes.NewReader(b))
			_ = u.Finish()
		}
		ents, _ := os.ReadDir(base)
		if len(ents) != 1 || ents[0].Name() != "root" {
			t.Fatalf("something was written beside the root: %v", ents)
		}
	})
}
