package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadMeminfo(t *testing.T) {
	total, avail, err := ReadMeminfo("/proc/meminfo")
	if err != nil || total <= 0 || avail <= 0 || avail > total {
		t.Fatalf("this host: total %d avail %d: %v", total, avail, err)
	}
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "meminfo")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	total, avail, err = ReadMeminfo(write("MemTotal:       16384 kB\nMemFree:  10 kB\nMemAvailable:    8192 kB\n"))
	if err != nil || total != 16384<<10 || avail != 8192<<10 {
		t.Fatalf("got %d %d %v", total, avail, err)
	}
	for _, bad := range []string{"MemTotal: 1 kB\n", "MemTotal: x kB\nMemAvailable: 1 kB\n", "MemTotal: 1 MB\nMemAvailable: 1 kB\n", ""} {
		if _, _, err := ReadMeminfo(write(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}
