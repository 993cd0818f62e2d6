package statedir

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestMakeAndRepairHome(t *testing.T) {
	base := t.TempDir()
	home := filepath.Join(base, "home")
	// Make: missing parents are 0700 too, and an existing wide directory
	// is narrowed.
	if err := Make(filepath.Join(home, "images")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{home, filepath.Join(home, "images")} {
		if fi, _ := os.Stat(d); fi.Mode() != fs.ModeDir|Mode {
			t.Errorf("%s: %v, want %v", d, fi.Mode(), fs.ModeDir|Mode)
		}
	}
	wide := filepath.Join(home, "vm")
	if err := os.Mkdir(wide, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(wide, 0o1777)
	if err := Make(wide); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(wide); fi.Mode() != fs.ModeDir|Mode {
		t.Errorf("Make left %s %v", wide, fi.Mode())
	}

	// RepairHome: narrows what exists, says what it changed, makes a
	// missing home.
	os.Chmod(home, 0o755)
	os.Chmod(filepath.Join(home, "images"), 0o750)
	os.Mkdir(filepath.Join(home, "volumes"), 0o700)
	got, err := RepairHome(home)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]fs.FileMode{home: fs.ModeDir | 0o755, filepath.Join(home, "images"): fs.ModeDir | 0o750}
	if len(got) != len(want) {
		t.Fatalf("repairs %+v, want %v", got, want)
	}
	for _, r := range got {
		if want[r.Dir] != r.Was {
			t.Errorf("repair %+v, want was=%v", r, want[r.Dir])
		}
	}
	if got, err := RepairHome(home); err != nil || len(got) != 0 {
		t.Errorf("second repair: %+v %v", got, err)
	}
	fresh := filepath.Join(base, "fresh")
	if _, err := RepairHome(fresh); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode() != fs.ModeDir|Mode {
		t.Errorf("fresh home: %v %v", fi, err)
	}
}
