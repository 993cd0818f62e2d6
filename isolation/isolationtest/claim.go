package isolationtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/isolation"
)

// ClaimFor is the claim the host sends a Claimable sandbox started from
// spec (as the daemon's manager builds it): the spec's token, environment
// and guest files, its network with the sandbox's MAC when the guest
// configures its own (ci.GuestNet), 64 bytes of fresh entropy and the
// host's time.
func ClaimFor(spec *isolation.Spec, ci isolation.ClaimInfo) *agentproto.Claim {
	cl := &agentproto.Claim{
		Token: spec.AgentToken, Env: spec.Env, Hostname: spec.Hostname,
		Nameserver: spec.Nameserver, TrustedCAPEM: spec.TrustedCAPEM,
		Entropy: make([]byte, 64), Time: time.Now(),
	}
	_, _ = rand.Read(cl.Entropy)
	if ci.GuestNet && spec.GuestAddr.IsValid() {
		cl.Net = &agentproto.ClaimNet{
			Addr:    netip.PrefixFrom(spec.GuestAddr, spec.Prefix.Bits()),
			Gateway: spec.Gateway, MAC: ci.MAC,
		}
	}
	return cl
}

// ClaimSandbox claims sb (started from spec) if it is Claimable with a
// token to claim: it connects with the token the agent answers to now
// and sends ClaimFor(spec). Afterwards the agent answers to
// spec.AgentToken only. A sandbox with nothing to claim is left as is.
func ClaimSandbox(ctx context.Context, sb isolation.Sandbox, spec *isolation.Spec) error {
	c, ok := sb.(isolation.Claimable)
	if !ok {
		return nil
	}
	ci := c.ClaimInfo()
	if ci.Token == "" {
		return nil
	}
	var lastErr error
	for ctx.Err() == nil {
		conn, err := sb.DialAgent(ctx)
		if err == nil {
			var cl *agentproto.Client
			cl, err = agentproto.NewClient(ctx, conn, ci.Token)
			if err == nil {
				err = cl.Claim(ctx, ClaimFor(spec, ci))
				cl.Close()
				if err == nil {
					return nil
				}
				return fmt.Errorf("claim: %w", err)
			}
			conn.Close()
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("claim: the agent never answered: %w", lastErr)
}

// claim is ClaimSandbox for tests.
func claim(t testing.TB, ctx context.Context, sb isolation.Sandbox, spec *isolation.Spec) {
	t.Helper()
	if err := ClaimSandbox(ctx, sb, spec); err != nil {
		t.Fatal(err)
	}
}

// claimPooled claims a sandbox made from fill (AwaitClaim) as the sandbox
// spec describes, the way the manager claims a pooled one: with the token
// its agent answers to (a restored VM's template token, else the fill's).
func claimPooled(t testing.TB, ctx context.Context, sb isolation.Sandbox, fill, spec *isolation.Spec) {
	t.Helper()
	var ci isolation.ClaimInfo
	if c, ok := sb.(isolation.Claimable); ok {
		ci = c.ClaimInfo()
	}
	if ci.Token == "" {
		ci.Token = fill.AgentToken
	}
	c := Connect(t, ctx, sb, ci.Token)
	defer c.Close()
	if err := c.Claim(ctx, ClaimFor(spec, ci)); err != nil {
		t.Fatalf("claim a pooled sandbox: %v", err)
	}
}
