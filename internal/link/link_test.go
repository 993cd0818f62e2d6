package link

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Tests that need no privileges.

func TestConfigDefaults(t *testing.T) {
	cfg := Config{ProxyPort: 15001, DNSPort: 15053}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.Pool != DefaultPool || cfg.TableName != "cagebox" || cfg.IfPrefix != "cbx" || cfg.NetNSDir != "/run/netns" {
		t.Fatalf("defaults: %+v", cfg)
	}
	for _, bad := range []Config{
		{DNSPort: 1},
		{ProxyPort: 1},
		{ProxyPort: 1, DNSPort: 1},
		{ProxyPort: 1, DNSPort: 2, Pool: netip.MustParsePrefix("fd00::/64")},
		{ProxyPort: 1, DNSPort: 2, Pool: netip.MustParsePrefix("10.0.0.0/31")},
		{ProxyPort: 1, DNSPort: 2, IfPrefix: "cbxx"},
		{ProxyPort: 1, DNSPort: 2, IfPrefix: "C-"},
	} {
		if err := bad.setDefaults(); err == nil {
			t.Errorf("config %+v accepted", bad)
		}
	}
}

func TestNames(t *testing.T) {
	m, err := NewManager(Config{ProxyPort: 1, DNSPort: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h1, ns1 := m.names("sandbox-1")
	h2, _ := m.names("sandbox-2")
	if len(h1) != 15 || !strings.HasPrefix(h1, "cbx") || h1 == h2 {
		t.Fatalf("host names %q %q", h1, h2)
	}
	if !m.hostRE.MatchString(h1) {
		t.Fatalf("%q does not match the stray pattern", h1)
	}
	if filepath.Dir(ns1) != "/run/netns" || !m.nsRE.MatchString(filepath.Base(ns1)) || filepath.Base(ns1)[4:] != h1[3:] {
		t.Fatalf("netns path %q for %q", ns1, h1)
	}
}

func TestAllocation(t *testing.T) {
	m, err := NewManager(Config{ProxyPort: 1, DNSPort: 2, Pool: netip.MustParsePrefix("10.9.0.0/28")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := 0; i < 4; i++ {
		p, err := m.allocLocked()
		if err != nil {
			t.Fatal(err)
		}
		m.used[p] = "x"
		got = append(got, p.String())
	}
	want := "10.9.0.0/30 10.9.0.4/30 10.9.0.8/30 10.9.0.12/30"
	if strings.Join(got, " ") != want {
		t.Fatalf("got %v, want %s", got, want)
	}
	if _, err := m.allocLocked(); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("want ErrPoolExhausted, got %v", err)
	}
	delete(m.used, netip.MustParsePrefix("10.9.0.4/30"))
	if p, _ := m.allocLocked(); p.String() != "10.9.0.4/30" {
		t.Fatalf("reuse: got %s", p)
	}
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{ProxyPort: 1, DNSPort: 2, StateDir: dir}
	m, err := NewManager(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := &Link{
		ID: "a", NetNSPath: "/run/netns/cbx-0", HostIf: "cbx0", GuestIf: "eth0",
		HostAddr: netip.MustParseAddr("10.201.0.1"), GuestAddr: netip.MustParseAddr("10.201.0.2"),
		Prefix: netip.MustParsePrefix("10.201.0.0/30"),
	}
	m.commitLocked(l)
	if err := m.saveLocked(); err != nil {
		t.Fatal(err)
	}
	m2, err := NewManager(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := m2.Get("a")
	if !ok || !reflect.DeepEqual(got, l) {
		t.Fatalf("reloaded %+v, want %+v", got, l)
	}
	if got, ok := m2.LookupByAddr(netip.MustParseAddr("::ffff:10.201.0.2")); !ok || got.ID != "a" {
		t.Fatalf("LookupByAddr: %v %v", got, ok)
	}
	if p, _ := m2.allocLocked(); p.String() != "10.201.0.4/30" {
		t.Fatalf("allocation after reload: %s", p)
	}
	if err := os.WriteFile(filepath.Join(dir, stateFile), []byte(`{"version":1,"links":[{"id":"x"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewManager(cfg, nil); err == nil {
		t.Fatal("incomplete state accepted")
	}
}

func TestCreateNeedsInit(t *testing.T) {
	m, err := NewManager(Config{ProxyPort: 1, DNSPort: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(context.Background(), "x"); !errors.Is(err, ErrNotReady) {
		t.Fatalf("want ErrNotReady, got %v", err)
	}
}
