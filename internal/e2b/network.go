package e2b

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/store"
)

// network is E2B's SandboxNetworkConfig (in a create) and, with
// AllowInternetAccess, its SandboxNetworkUpdateConfig (PUT
// /sandboxes/{id}/network).
//
// It maps onto the sandbox's cagebox policy, which stays deny-by-default:
//   - allowOut names hosts ("api.example.com", "*.example.com"), each an
//     allow rule as `cagebox run --allow` makes (ports 443 and 80). An IP
//     or CIDR entry cannot be said in a policy that speaks names only: a
//     400, nothing made.
//   - denyOut is CIDRs and IPs only (E2B refuses names there). E2B lets
//     allowOut win over denyOut, and nothing but allowOut is open here, so
//     every denyOut entry ("0.0.0.0/0" above all: "deny the rest") is
//     already what the sandbox has; each is checked and kept nowhere.
//   - without allowOut nothing is open (E2B would open everything).
//   - allow_internet_access never opens anything: SDK lines before 2.51
//     send true by default, so it cannot be told from a choice; false is
//     E2B's denyOut 0.0.0.0/0, which the sandbox has anyway.
type network struct {
	AllowOut           []string        `json:"allowOut"`
	DenyOut            []string        `json:"denyOut"`
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	MaskRequestHost    *string         `json:"maskRequestHost"`
	HTTPSPorts         json.RawMessage `json:"httpsPorts"`
	Rules              json.RawMessage `json:"rules"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
	// AllowInternetAccess is the update's allow_internet_access (a
	// create carries it beside network).
	AllowInternetAccess *bool `json:"allow_internet_access"`
}

// decodeNetwork reads a create's network section ("" when absent).
func decodeNetwork(raw json.RawMessage) (*network, error) {
	if !isSet(raw) {
		return &network{}, nil
	}
	var n network
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, invalid("network: want E2B's SandboxNetworkConfig object: %v", err)
	}
	return &n, nil
}

// allowHosts checks n and returns the hosts it opens (allowOut).
func (n *network) allowHosts() ([]string, error) {
	switch {
	case isSet(n.Rules):
		return nil, invalid("network.rules: cagebox does not inject headers from a create; bind a secret instead (envVars K=vault:NAME: the gateway swaps it in toward the secret's hosts only)")
	case isSet(n.EgressProxy):
		return nil, invalid("network.egressProxy: not supported; every connection leaves through cagebox's egress gateway")
	case n.MaskRequestHost != nil:
		return nil, invalid("network.maskRequestHost: not supported; guests see the Host the client sent")
	case isSet(n.HTTPSPorts):
		return nil, invalid("network.httpsPorts: not supported; cagebox's ingress speaks plain HTTP to the guest's port")
	}
	for _, d := range n.DenyOut {
		if !isAddress(d) {
			return nil, invalid("network.denyOut[%q]: give a CIDR or an IP (E2B takes no names there); nothing but allowOut is open in cagebox, so deny entries change nothing", d)
		}
	}
	var hosts []string
	for _, h := range n.AllowOut {
		if isAddress(h) {
			return nil, invalid("network.allowOut[%q]: cagebox's egress policy speaks host names only (an IP or CIDR cannot be opened); name the hosts, e.g. \"api.example.com\" or \"*.example.com\"", h)
		}
		hosts = append(hosts, strings.TrimSpace(h))
	}
	if len(hosts) > 0 {
		if _, err := policy.AllowHosts(hosts...); err != nil {
			return nil, invalid("network.allowOut: %v", err)
		}
	}
	return hosts, nil
}

// isAddress reports whether s is an IP or a CIDR.
func isAddress(s string) bool {
	s = strings.TrimSpace(s)
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	_, err := netip.ParsePrefix(s)
	return err == nil
}

// updateNetwork: PUT /sandboxes/{id}/network replaces the sandbox's egress
// rules (E2B: "omitting a field clears it"): one live replace of its
// policy by the allow rules of allowOut (none: nothing open).
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var n network
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	if err := dec.Decode(&n); err != nil {
		return invalid("body: want E2B's SandboxNetworkUpdateConfig object: %v", err)
	}
	hosts, err := n.allowHosts()
	if err != nil {
		return err
	}
	sb, err := s.lookup(r, t)
	if err != nil {
		return err
	}
	reg := s.cfg.Manager.Live()
	if reg == nil {
		return fmt.Errorf("%w: this daemon runs sandboxes without a network; there is no policy to change", errdefs.ErrUnavailable)
	}
	lp, ok := reg.Get(sb.ID)
	if !ok {
		return fmt.Errorf("%w: sandbox %s is not running; its network can change only while it runs", errdefs.ErrConflict, ToE2BID(sb.ID))
	}
	doc := &policy.Document{Version: 1, Default: policy.ActionDeny}
	if len(hosts) > 0 {
		if doc, err = policy.AllowHosts(hosts...); err != nil {
			return invalid("allowOut: %v", err)
		}
	}
	if _, err := lp.Replace(r.Context(), doc, 0, "e2b:"+t.ID, "e2b updateNetwork", ""); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// networkInfo is the network section of E2B's SandboxDetail (getInfo),
// read from the sandbox's live policy: allowOut the hosts its allow rules
// name, denyOut "all traffic" unless the policy's default allows.
type networkInfo struct {
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
}

// networkOf is sandbox id's networkInfo (nil when it has no live policy:
// not running, or a daemon without a network).
func (s *Server) networkOf(sb *api.Sandbox) *networkInfo {
	reg := s.cfg.Manager.Live()
	if reg == nil {
		return nil
	}
	lp, ok := reg.Get(sb.ID)
	if !ok {
		return nil
	}
	doc, _, _ := lp.Policy()
	n := &networkInfo{AllowOut: []string{}, DenyOut: []string{}, AllowPublicTraffic: sb.Labels[labelPublic] == "true"}
	for _, r := range doc.Rules {
		if r.Action == policy.ActionAllow {
			n.AllowOut = append(n.AllowOut, r.Host)
		}
	}
	if doc.Default != policy.ActionAllow {
		n.DenyOut = append(n.DenyOut, "0.0.0.0/0")
	}
	return n
}
