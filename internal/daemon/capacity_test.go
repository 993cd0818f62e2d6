package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store/sqlite"
	"github.com/cagebox/cagebox/isolation"
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

// TestNodeCapacity: the report read from a daemon's API over its unix
// socket: runtimes as `cagebox runtimes` has them, sandboxes, pools and
// the host's memory.
func TestNodeCapacity(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "cagebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mgr := sandbox.New(sandbox.Config{Store: st, StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(mgr.Close)
	if err := mgr.Pools().Start(); err != nil {
		t.Fatal(err)
	}
	srv := NewServer(st, mgr, nil, nil, slog.New(slog.DiscardHandler))
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ConnContext: func(ctx context.Context, _ net.Conn) context.Context { return ViaUnix(ctx) }}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })

	c, err := NodeCapacity(context.Background(), client.Unix(sock))
	if err != nil {
		t.Fatal(err)
	}
	want := RuntimeList(isolation.Namespaces, nil)
	if len(c.Runtimes) != len(want) {
		t.Errorf("runtimes %+v, want %d", c.Runtimes, len(want))
	}
	if c.Sandboxes != 0 || len(c.Pools) != 0 || c.MemoryTotal <= 0 || c.MemoryAvailable <= 0 || c.Version != Version || c.At.IsZero() {
		t.Errorf("capacity %+v", c)
	}
	// A daemon that does not answer: an error, and what could be read.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err = NodeCapacity(ctx, client.Unix(filepath.Join(dir, "none.sock")))
	if err == nil || c.MemoryTotal <= 0 {
		t.Errorf("no daemon: %+v, %v", c, err)
	}
	if got := clip("ab€cd", 3); got != "ab…" {
		t.Errorf("clip cut a rune: %q", got)
	}
}
