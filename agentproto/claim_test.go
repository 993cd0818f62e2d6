//go:build linux

package agentproto

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// servePipe serves srv on one end of a pipe and returns the other.
func servePipe(t *testing.T, srv *Server) net.Conn {
	t.Helper()
	a, b := net.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); srv.ServeConn(b) }()
	t.Cleanup(func() { a.Close(); wg.Wait() })
	return a
}

func validClaim() *Claim {
	return &Claim{
		Token:   "new-token",
		Env:     []string{"FOO=bar"},
		Entropy: bytes.Repeat([]byte{7}, MinClaimEntropy),
		Time:    time.Now(),
		Net:     &ClaimNet{Addr: netip.MustParsePrefix("10.9.0.2/30"), Gateway: netip.MustParseAddr("10.9.0.1")},
	}
}

func TestClaim(t *testing.T) {
	var applied []*Claim
	srv := &Server{Token: testToken, Logger: testLogger(t), AwaitClaim: true,
		OnClaim: func(c *Claim) error { applied = append(applied, c); return nil }}
	c, err := NewClient(ctxT(t), servePipe(t, srv), testToken)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Before the claim: health answers, nothing else runs.
	if _, err := c.Health(ctxT(t)); err != nil {
		t.Fatalf("health before claim: %v", err)
	}
	if _, err := c.Exec(ctxT(t), &ExecRequest{Argv: []string{"/bin/true"}}, nil, nil, nil); !errors.Is(err, ErrRefused) {
		t.Fatalf("exec before claim: got %v, want ErrRefused", err)
	}
	if _, err := c.ListDir(ctxT(t), "/"); !errors.Is(err, ErrRefused) {
		t.Fatalf("list before claim: got %v, want ErrRefused", err)
	}

	// Malformed claims are refused and change nothing.
	for name, mut := range map[string]func(*Claim){
		"no token":      func(c *Claim) { c.Token = "" },
		"short entropy": func(c *Claim) { c.Entropy = c.Entropy[:8] },
		"no time":       func(c *Claim) { c.Time = time.Time{} },
		"bad env":       func(c *Claim) { c.Env = []string{"=x"} },
		"half a net":    func(c *Claim) { c.Net.Gateway = netip.Addr{} },
	} {
		cl := validClaim()
		mut(cl)
		if err := c.Claim(ctxT(t), cl); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
	if len(applied) != 0 || srv.Claimed() {
		t.Fatalf("a refused claim was applied")
	}

	if err := c.Claim(ctxT(t), validClaim()); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if len(applied) != 1 || !srv.Claimed() {
		t.Fatalf("claim applied %d times, claimed %v", len(applied), srv.Claimed())
	}
	// The connection that claimed keeps working, with the new environment.
	var out bytes.Buffer
	res, err := c.Exec(ctxT(t), &ExecRequest{Argv: []string{"/bin/sh", "-c", "echo $FOO"}}, nil, &out, nil)
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(out.String()) != "bar" {
		t.Fatalf("exec after claim: %v %+v %q", err, res, out.String())
	}
	// A second claim is refused.
	if err := c.Claim(ctxT(t), validClaim()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("second claim: got %v, want ErrInvalid", err)
	}
	// The old token no longer opens a connection; the new one does.
	if _, err := NewClient(ctxT(t), servePipe(t, srv), testToken); !errors.Is(err, ErrHandshake) {
		t.Fatalf("old token after claim: got %v, want ErrHandshake", err)
	}
	c2, err := NewClient(ctxT(t), servePipe(t, srv), "new-token")
	if err != nil {
		t.Fatalf("new token: %v", err)
	}
	c2.Close()
}

func TestClaimRefused(t *testing.T) {
	// An agent not started to be claimed refuses a claim, and one whose
	// OnClaim fails stays unclaimed.
	plain := &Server{Token: testToken, Logger: testLogger(t), OnClaim: func(*Claim) error { return nil }}
	c, err := NewClient(ctxT(t), servePipe(t, plain), testToken)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Claim(ctxT(t), validClaim()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("claim of a plain agent: got %v, want ErrInvalid", err)
	}
	c.Close()
	failing := &Server{Token: testToken, Logger: testLogger(t), AwaitClaim: true, OnClaim: func(*Claim) error { return errors.New("no entropy device") }}
	c, err = NewClient(ctxT(t), servePipe(t, failing), testToken)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Claim(ctxT(t), validClaim()); err == nil || !strings.Contains(err.Error(), "no entropy device") {
		t.Fatalf("failing claim: got %v", err)
	}
	if failing.Claimed() {
		t.Fatal("a failed claim marked the agent claimed")
	}
	if _, err := c.Exec(ctxT(t), &ExecRequest{Argv: []string{"/bin/true"}}, nil, nil, nil); !errors.Is(err, ErrRefused) {
		t.Fatalf("exec after failed claim: got %v, want ErrRefused", err)
	}
}

func TestClaimString(t *testing.T) {
	s := validClaim().String()
	if strings.Contains(s, "new-token") || strings.Contains(s, "\x07") {
		t.Fatalf("Claim.String leaks: %s", s)
	}
}
