package mounts

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParse(t *testing.T) {
	good := []struct {
		in   string
		want Spec
	}{
		{"type=bind,src=/srv/code,dst=/code", Spec{Type: Bind, Source: "/srv/code", Target: "/code"}},
		{"type=bind,src=/srv/code,dst=/code,ro", Spec{Type: Bind, Source: "/srv/code", Target: "/code"}},
		{"type=bind,source=/srv/code,target=/code,rw,exec", Spec{Type: Bind, Source: "/srv/code", Target: "/code", RW: true, Exec: true}},
		{"type=volume,src=cache,dst=/data", Spec{Type: Volume, Source: "cache", Target: "/data"}},
		{"type=volume,src=cache,destination=/data,rw,noexec", Spec{Type: Volume, Source: "cache", Target: "/data", RW: true}},
		{"dst=/x/y,type=volume,src=a.b_c-1", Spec{Type: Volume, Source: "a.b_c-1", Target: "/x/y"}},
	}
	for _, c := range good {
		got, err := Parse(c.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if got != c.want {
			t.Errorf("Parse(%q) = %+v, want %+v", c.in, got, c.want)
		}
		// String round-trips.
		if again, err := Parse(got.String()); err != nil || again != got {
			t.Errorf("Parse(String(%q)) = %+v, %v", c.in, again, err)
		}
	}
	bad := []struct{ in, want string }{
		{"", "empty --mount"},
		{"src=/a,dst=/b", "type is missing"},
		{"type=tmpfs,src=x,dst=/x", "use bind or volume"},
		{"type=bind,dst=/code", "src is empty"},
		{"type=bind,src=srv/code,dst=/code", "not absolute"},
		{"type=bind,src=/srv/code/../../etc,dst=/code", `contains ".."`},
		{"type=bind,src=/srv/code,dst=code", "not absolute"},
		{"type=bind,src=/srv/code", "dst is empty"},
		{"type=bind,src=/srv/code,dst=/", "replace the guest's root"},
		{"type=bind,src=/srv/code,dst=/proc", "kernel or agent"},
		{"type=bind,src=/srv/code,dst=/proc/self", "kernel or agent"},
		{"type=bind,src=/srv/code,dst=/sys/fs", "kernel or agent"},
		{"type=bind,src=/srv/code,dst=/dev", "kernel or agent"},
		{"type=bind,src=/srv/code,dst=/.cagebox/run", "kernel or agent"},
		{"type=bind,src=/srv/code,dst=/etc/cagebox", "kernel or agent"},
		{"type=bind,src=/srv/code,dst=/code/../proc", `contains ".."`},
		{"type=bind,src=/srv/code,dst=/code,ro,rw", "give one"},
		{"type=bind,src=/srv/code,dst=/code,exec,noexec", "give one"},
		{"type=bind,src=/srv/code,dst=/code,suid", "unknown option"},
		{"type=bind,src=/srv/code,dst=/code,ro=1", "takes no value"},
		{"type=bind,src=/a,src=/b,dst=/code", "given twice"},
		{"type=volume,src=../x,dst=/data", "volume name"},
		{"type=volume,src=Cache,dst=/data", "volume name"},
		{"type=volume,src=,dst=/data", "volume name"},
	}
	for _, c := range bad {
		_, err := Parse(c.in)
		if err == nil {
			t.Errorf("Parse(%q) accepted", c.in)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want ErrInvalid saying %q", c.in, err, c.want)
		}
	}
}

func TestCheckAll(t *testing.T) {
	v := func(src, dst string) Spec { return Spec{Type: Volume, Source: src, Target: dst} }
	if _, err := CheckAll([]Spec{v("a", "/data/"), v("b", "/data")}); err == nil || !strings.Contains(err.Error(), "two mounts at /data") {
		t.Errorf("duplicate dst: %v", err)
	}
	if _, err := CheckAll([]Spec{v("a", "/data"), v("b", "/data/sub")}); err == nil || !strings.Contains(err.Error(), "inside the mount") {
		t.Errorf("nested dst: %v", err)
	}
	if _, err := CheckAll([]Spec{v("a", "/x"), v("a", "/y")}); err == nil || !strings.Contains(err.Error(), "mounted twice") {
		t.Errorf("volume twice: %v", err)
	}
	got, err := CheckAll([]Spec{v("b", "/datab"), v("a", "/data")})
	if err != nil || got[0].Target != "/data" || got[1].Target != "/datab" {
		t.Errorf("siblings: %+v %v", got, err)
	}
	many := make([]Spec, MaxMounts+1)
	for i := range many {
		many[i] = v("v"+string(rune('a'+i)), "/m"+string(rune('a'+i)))
	}
	if _, err := CheckAll(many); err == nil {
		t.Error("too many mounts accepted")
	}
}

func TestVolumeName(t *testing.T) {
	for _, n := range []string{"a", "cache", "pip-cache", "x.y_z", "0abc", strings.Repeat("a", 63)} {
		if err := ValidVolumeName(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	for _, n := range []string{"", ".", "..", "a..b", "-a", ".a", "A", "a/b", "a b", strings.Repeat("a", 64), "a\x00"} {
		if err := ValidVolumeName(n); err == nil {
			t.Errorf("%q accepted", n)
		}
	}
	if _, err := CheckVolumeSize(1); err == nil {
		t.Error("1-byte volume accepted")
	}
	if n, err := CheckVolumeSize(0); err != nil || n != DefaultVolumeBytes {
		t.Errorf("default size: %d %v", n, err)
	}
}

// tree makes a mount root with things to escape to next to it.
func tree(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root + "/code/sub", outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(root+"/code/main.py", []byte("print(1)"), 0o644))
	must(os.WriteFile(outside+"/secret", []byte("s"), 0o600))
	must(os.Symlink(outside, root+"/abs-out"))                 // absolute, out
	must(os.Symlink("../outside", root+"/rel-out"))            // relative, out
	must(os.Symlink("code/sub", root+"/rel-in"))               // relative, stays in
	must(os.Symlink(root+"/code", root+"/abs-in"))             // absolute, even to inside
	must(os.Symlink("loop2", root+"/loop1"))                   // loop
	must(os.Symlink("loop1", root+"/loop2"))                   //
	must(os.Symlink("../../outside/secret", root+"/code/esc")) // out from a subdirectory
	must(unix.Mkfifo(root+"/fifo", 0o600))
	ln, err := net.Listen("unix", root+"/sock")
	must(err)
	t.Cleanup(func() { ln.Close() })
	return root, outside
}

func TestResolve(t *testing.T) {
	root, outside := tree(t)
	r, err := NewRoots([]string{root})
	if err != nil {
		t.Fatal(err)
	}
	good := map[string]bool{root: true, root + "/code": true, root + "/code/main.py": false, root + "/rel-in": true, root + "/code/": true}
	for p, dir := range good {
		s, err := r.Resolve(p)
		if err != nil {
			t.Errorf("Resolve(%s): %v", p, err)
			continue
		}
		if s.Dir != dir {
			t.Errorf("Resolve(%s).Dir = %v", p, s.Dir)
		}
		s.Close()
	}
	bad := map[string]string{
		outside:                  "not below a mount root",
		outside + "/secret":      "not below a mount root",
		root + "x":               "not below a mount root", // a sibling sharing the prefix
		root + "/abs-out":        "leads out of the mount root",
		root + "/abs-out/secret": "leads out of the mount root",
		root + "/rel-out/secret": "leads out of the mount root",
		root + "/abs-in":         "leads out of the mount root", // absolute symlinks are refused, even inward
		root + "/code/esc":       "leads out of the mount root",
		root + "/loop1":          "symlinks",
		root + "/missing":        "no such file",
		root + "/code/main.py/x": "no such file",
		root + "/fifo":           "a fifo",
		root + "/sock":           "a socket",
		"/proc/self/root" + root: "not below a mount root",
		"/etc/passwd":            "not below a mount root",
	}
	for p, want := range bad {
		s, err := r.Resolve(p)
		if err == nil {
			s.Close()
			t.Errorf("Resolve(%s) accepted", p)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Resolve(%s) = %v, want ErrInvalid saying %q", p, err, want)
		}
	}
	// No roots: bind mounts are off, and the message says how to allow them.
	_, err = (&Roots{}).Resolve(root)
	if err == nil || !strings.Contains(err.Error(), "--mount-root") {
		t.Errorf("no roots: %v", err)
	}
}

func TestResolveDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	root, _ := tree(t)
	if err := unix.Mknod(root+"/null", unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("mknod here: %v", err)
	}
	r, _ := NewRoots([]string{root})
	if _, err := r.Resolve(root + "/null"); err == nil || !strings.Contains(err.Error(), "character device") {
		t.Errorf("device: %v", err)
	}
}

func TestNewRoots(t *testing.T) {
	base := t.TempDir()
	home := filepath.Join(base, "home")
	os.MkdirAll(home+"/state", 0o700)
	os.WriteFile(base+"/file", nil, 0o600)
	os.Symlink(home, base+"/link-to-home")
	for _, c := range []struct {
		dir, want string
	}{
		{"relative", "absolute"},
		{"/", "host's root"},
		{base + "/missing", "no such file"},
		{base + "/file", "not a directory"},
		{base, "overlaps the daemon's home"},
		{home + "/state", "overlaps the daemon's home"},
		{base + "/link-to-home", "overlaps the daemon's home"},
	} {
		_, err := NewRoots([]string{c.dir}, home)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRoots(%s) = %v, want %q", c.dir, err, c.want)
		}
	}
}

// TestHostMounts stages a read-only bind and a volume image on the host
// and checks the flags hold (root only).
func TestHostMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	root, _ := tree(t)
	r, _ := NewRoots([]string{root})
	stage := t.TempDir()
	t.Cleanup(func() { UnmountBelow(stage) })
	src, err := r.Resolve(root + "/code")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := StageBind(src, stage+"/b", false, false); err != nil {
		t.Fatal(err)
	}
	err = os.WriteFile(stage+"/b/main.py", []byte("poison"), 0o644)
	if !errors.Is(err, unix.EROFS) {
		t.Errorf("write to ro bind: %v, want EROFS", err)
	}
	if b, _ := os.ReadFile(root + "/code/main.py"); string(b) != "print(1)" {
		t.Errorf("host file changed: %q", b)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(stage+"/b", &st); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		flag int64
		name string
	}{{unix.ST_RDONLY, "ro"}, {unix.ST_NOSUID, "nosuid"}, {unix.ST_NODEV, "nodev"}, {unix.ST_NOEXEC, "noexec"}} {
		if st.Flags&f.flag == 0 {
			t.Errorf("staged bind is not %s", f.name)
		}
	}

	img := filepath.Join(t.TempDir(), "v.ext4")
	if err := CreateImage(context.Background(), img, 32<<20, "v"); err != nil {
		t.Fatal(err)
	}
	if err := MountImage(img, stage+"/v", true, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stage+"/v/hello", []byte("hi"), 0o644); err != nil {
		t.Fatalf("write to rw volume: %v", err)
	}
	if l := LoopsOf(img); len(l) != 1 {
		t.Errorf("loops of the image while mounted: %v", l)
	}
	// While a read-write loop holds the image, no second instance.
	if err := MountImage(img, stage+"/v2", false, false); err == nil || !strings.Contains(err.Error(), "still attached") {
		t.Errorf("second mount while read-write: %v", err)
	}
	UnmountBelow(stage)
	if l := LoopsOf(img); len(l) != 0 {
		t.Errorf("loop devices left after unmount: %v", l)
	}
	if p := MountPointsBelow(stage); len(p) != 0 {
		t.Errorf("mounts left: %v", p)
	}
	// Read-only: the data is there, writes fail.
	if err := MountImage(img, stage+"/v", false, false); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(stage + "/v/hello"); err != nil || string(b) != "hi" {
		t.Errorf("read back: %q %v", b, err)
	}
	if err := os.WriteFile(stage+"/v/x", nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write to ro volume: %v", err)
	}
	// Readers share it; a writer does not join them.
	if err := MountImage(img, stage+"/v3", false, false); err != nil {
		t.Errorf("second reader: %v", err)
	}
	if err := MountImage(img, stage+"/v4", true, false); err == nil {
		t.Error("a writer mounted the image while readers hold it")
	}
}
