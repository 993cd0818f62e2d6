package qemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestSweepRunDirs: a template build's run directory left by a process
// that is gone (killed mid-build) is removed; this process's, a live
// process's and a recent one of the old naming are kept; an old one of
// the old naming goes.
func TestSweepRunDirs(t *testing.T) {
	dir := t.TempDir()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, age time.Duration) string {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "console.log"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		when := time.Now().Add(-age)
		if err := os.Chtimes(p, when, when); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dead := mk(runDirPrefix+strconv.Itoa(gone.Process.Pid)+"-123", 0)
	own := mk(runDirPrefix+strconv.Itoa(os.Getpid())+"-456", 0)
	live := mk(runDirPrefix+"1-789", 0) // init is alive
	oldLegacy := mk("cbxtpl1400976422", 2*time.Hour)
	newLegacy := mk("cbxtpl219543112", time.Minute)
	other := mk("unrelated", 2*time.Hour)
	sweepRunDirs(dir, time.Now())
	for p, want := range map[string]bool{dead: false, own: true, live: true, oldLegacy: false, newLegacy: true, other: true} {
		_, err := os.Stat(p)
		if got := err == nil; got != want {
			t.Errorf("%s: kept %v, want %v", filepath.Base(p), got, want)
		}
	}
}
