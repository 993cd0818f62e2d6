//go:build !lite

package main

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeRefusals: `cagebox node` without what a fleet node needs exits
// with an error saying what to give, before anything is started.
func TestNodeRefusals(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "admin.key")
	if err := os.WriteFile(good, []byte(strings.Repeat("k", 40)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "missing.kubeconfig")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--admin-key-file", good}, "needs --listen"},
		{[]string{"--listen", "127.0.0.1:0"}, "needs --admin-key-file"},
		{[]string{"--listen", "127.0.0.1:0", "--admin-key-file", short}, "at least 32"},
		{[]string{"--listen", "127.0.0.1:0", "--admin-key-file", filepath.Join(dir, "nope")}, "--admin-key-file"},
		{[]string{"--listen", "127.0.0.1:0", "--admin-key-file", good, "--lease-duration", "1500ms", "--kubeconfig", kc}, "--lease-duration"},
		{[]string{"--listen", "127.0.0.1:0", "--admin-key-file", good, "--advertise-url", "10.0.0.1:7443", "--kubeconfig", kc}, "--advertise-url"},
		{[]string{"--listen", "127.0.0.1:0", "--admin-key-file", good, "--kubeconfig", kc}, "--kubeconfig"},
		{[]string{"--listen", "127.0.0.1:0", "--admin-key-file", good}, "give --kubeconfig"},
	} {
		root := newRoot()
		root.SetArgs(append([]string{"--home", filepath.Join(dir, "home"), "node"}, tc.args...))
		root.SetOut(&strings.Builder{})
		root.SetErr(&strings.Builder{})
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("node %v: %v, want an error saying %q", tc.args, err, tc.want)
		}
		if _, serr := os.Stat(filepath.Join(dir, "home")); serr == nil {
			t.Fatalf("node %v made its home before refusing", tc.args)
		}
	}
}

func TestAdvertised(t *testing.T) {
	route := func() (netip.Addr, error) { return netip.MustParseAddr("192.0.2.7"), nil }
	noRoute := func() (netip.Addr, error) { return netip.Addr{}, errors.New("no default route") }
	for _, tc := range []struct{ listen, want string }{
		{"0.0.0.0:7443", "192.0.2.7:7443"},
		{":7443", "192.0.2.7:7443"},
		{"[::]:7443", "192.0.2.7:7443"},
		{"10.1.2.3:7443", "10.1.2.3:7443"},
		{"127.0.0.1:7070", "127.0.0.1:7070"},
		{"node1.example:7443", "node1.example:7443"},
	} {
		got, err := advertised(tc.listen, route)
		if err != nil || got != tc.want {
			t.Errorf("advertised(%q) = %q, %v; want %q", tc.listen, got, err, tc.want)
		}
	}
	if _, err := advertised("0.0.0.0:7443", noRoute); err == nil {
		t.Error("no default route: accepted")
	}
	if _, err := advertised("7443", route); err == nil {
		t.Error("no host:port: accepted")
	}
	if a, err := defaultRouteAddr(); err != nil || !a.Is4() {
		t.Logf("this host's default route address: %v, %v", a, err)
	}
}
