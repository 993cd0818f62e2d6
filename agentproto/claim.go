package agentproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Claim is what the host gives an agent that was started before its
// sandbox's identity was known — a pooled sandbox, or a microVM restored
// from a template — to make it that sandbox. Until it is claimed, such an
// agent (Server.AwaitClaim) answers health checks and the claim, nothing
// else; it is claimed at most once.
//
// Everything here is per sandbox: after the claim nothing of the pool's or
// the template's identity is left that a guest process could use.
type Claim struct {
	// Token replaces the token the agent was started with: connections
	// made after the claim must present it; the old one stops working.
	Token string `json:"token"`
	// Env is the base environment of guest processes (KEY=VALUE), merged
	// over DefaultEnv.
	Env []string `json:"env,omitempty"`
	// Hostname, Nameserver and TrustedCAPEM are the guest's files
	// (rootfs.Guest): /etc/hostname, /etc/hosts, /etc/resolv.conf and the
	// sandbox CA in the paths and bundles TLS clients read.
	Hostname     string `json:"hostname,omitempty"`
	Nameserver   string `json:"nameserver,omitempty"`
	TrustedCAPEM []byte `json:"trusted_ca_pem,omitempty"`
	// Net, when set, is the guest's network on eth0 (a VM guest, which
	// configures its own interface; a container's is made by the host).
	Net *ClaimNet `json:"net,omitempty"`
	// Entropy is host randomness the guest kernel mixes into its pool and
	// reseeds from before anything else runs (a VM guest: two VMs
	// restored from one template start with one RNG state). At least
	// MinClaimEntropy bytes.
	Entropy []byte `json:"entropy,omitempty"`
	// Time is the host's clock when it sent the claim (a restored VM's
	// clock stands where the template's stopped).
	Time time.Time `json:"time"`
}

// MinClaimEntropy is the least entropy a claim carries.
const MinClaimEntropy = 32

// ClaimNet is a VM guest's network.
type ClaimNet struct {
	Addr    netip.Prefix `json:"addr"`          // eth0's address with prefix length
	Gateway netip.Addr   `json:"gateway"`       // the default route's gateway
	MAC     string       `json:"mac,omitempty"` // eth0's hardware address, if it changes
}

// String never shows the token or the entropy.
func (c *Claim) String() string {
	return fmt.Sprintf("Claim{hostname %q, %d env, ca %t, net %v, %d bytes entropy}", c.Hostname, len(c.Env), len(c.TrustedCAPEM) > 0, c.Net, len(c.Entropy))
}

func (c *Claim) validate() error {
	switch {
	case c.Token == "":
		return errors.New("claim without a token")
	case len(c.Entropy) < MinClaimEntropy:
		return fmt.Errorf("claim with %d bytes of entropy (want at least %d)", len(c.Entropy), MinClaimEntropy)
	case c.Time.IsZero():
		return errors.New("claim without the host's time")
	}
	if c.Net != nil && (!c.Net.Addr.IsValid() || !c.Net.Gateway.IsValid()) {
		return errors.New("claim with an incomplete network")
	}
	for _, kv := range c.Env {
		if k, _, ok := cutEnv(kv); !ok || k == "" {
			return fmt.Errorf("claim env entry %q: want KEY=VALUE", truncate(kv, 40))
		}
	}
	return nil
}

func cutEnv(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return "", "", false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// claim handles the claim operation.
func (c *serverConn) claim(fw *frameWriter, p json.RawMessage) {
	var cl Claim
	if err := json.Unmarshal(p, &cl); err != nil {
		sendError(fw, fmt.Errorf("malformed claim: %v: %w", err, ErrInvalid))
		return
	}
	if err := cl.validate(); err != nil {
		sendError(fw, fmt.Errorf("%v: %w", err, ErrInvalid))
		return
	}
	if err := c.s.applyClaim(&cl); err != nil {
		sendError(fw, err)
		return
	}
	sendReply(fw, struct{}{})
}

// applyClaim runs the agent's OnClaim and then switches the token and base
// environment, once.
func (s *Server) applyClaim(cl *Claim) error {
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	s.mu.Lock()
	await, claimed := s.AwaitClaim, s.claimed
	s.mu.Unlock()
	switch {
	case !await:
		return fmt.Errorf("this agent was not started to be claimed: %w", ErrInvalid)
	case claimed:
		return fmt.Errorf("this agent is claimed already: %w", ErrInvalid)
	case s.OnClaim == nil:
		return fmt.Errorf("this agent cannot apply a claim: %w", ErrInvalid)
	}
	if err := s.OnClaim(cl); err != nil {
		return fmt.Errorf("apply claim: %w", err)
	}
	s.mu.Lock()
	s.Token = cl.Token
	s.BaseEnv = MergeEnv(DefaultEnv, cl.Env)
	s.claimed = true
	s.mu.Unlock()
	return nil
}

// Claimed reports whether an agent started with AwaitClaim has been
// claimed.
func (s *Server) Claimed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claimed
}

// Claim makes the agent (started with Server.AwaitClaim) the sandbox cl
// describes. The connection stays usable; new connections must present
// cl.Token.
func (c *Client) Claim(ctx context.Context, cl *Claim) error {
	p, err := json.Marshal(cl)
	if err != nil {
		return err
	}
	s, err := c.open(ctx, &request{Op: opClaim, Claim: p})
	if err != nil {
		return err
	}
	defer s.close()
	var ok struct{}
	if err := s.reply(&ok); err != nil {
		return s.err(ctx, err)
	}
	return nil
}
