package e2b

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/ingress"
)

// Guest ports (Sandbox.getHost(port) is PORT-ID.DOMAIN) are served on the
// front's listener, under --e2b-domain, and go on through cagebox's
// ingress: the front checks E2B's access rule, publishes the port on first
// use (an ingress port with a token only the front holds: the link admits
// it, `cagebox port ls` shows it) and hands the request to the ingress
// handler, which proxies it into the guest as for any published port
// (limits, wake, audit, revocation).
//
// Access: a sandbox created with network.allowPublicTraffic true is
// public; otherwise (absent or false — the SDK sends it only when set,
// so absence is not a choice of E2B's public default) every request needs
// the sandbox's trafficAccessToken in the e2b-traffic-access-token header.
// The token is an HMAC of the sandbox id under the front's key (like the
// envd token): stored nowhere, useless for any other sandbox.

// TrafficHeader carries a sandbox's trafficAccessToken (E2B's name).
const TrafficHeader = "E2b-Traffic-Access-Token"

// labelPublic marks a sandbox created with allowPublicTraffic true.
const labelPublic = "e2b.public-traffic"

// TrafficToken is the trafficAccessToken of sandbox id.
func (s *Server) TrafficToken(id string) string {
	return s.sandboxToken("ta_", "e2b-traffic-access", id)
}

func (s *Server) trafficOK(id, token string) bool { return tokenIs(token, s.TrafficToken(id)) }

// portTokens are the ingress tokens of the ports the front published,
// by cagebox id and port. A token lost (a restart) or replaced (the port
// published again through cagebox's API) is replaced on the next request.
type portTokens struct {
	// mu guards byID and serialises publishing (one token per port).
	mu   sync.Mutex
	byID map[string]map[uint16]string
}

func (p *portTokens) drop(id string) {
	p.mu.Lock()
	delete(p.byID, id)
	p.mu.Unlock()
}

// publish returns the ingress token of sandbox id's port, publishing the
// port (again) when the front holds no token the ingress accepts.
func (s *Server) publish(ctx context.Context, id string, port uint16) (string, error) {
	p := &s.ports
	p.mu.Lock()
	defer p.mu.Unlock()
	tok := p.byID[id][port]
	if tok != "" {
		if t, err := s.cfg.Manager.Ports().Resolve(ctx, id, port); err == nil && ingress.CheckToken(tok, t.TokenHash) {
			return tok, nil
		}
	}
	pv, err := s.cfg.Manager.Ports().AddPort(ctx, "", id, api.PortSpec{Port: int(port)})
	if err != nil {
		return "", err
	}
	if p.byID == nil {
		p.byID = map[string]map[uint16]string{}
	}
	if p.byID[id] == nil {
		p.byID[id] = map[uint16]string{}
	}
	p.byID[id][port] = pv.Token
	return pv.Token, nil
}

// serveGuestPort serves PORT-ID.DOMAIN for a port other than envd's.
func (s *Server) serveGuestPort(w http.ResponseWriter, r *http.Request, e2bid, portStr string) {
	notFound := func() {
		writeJSON(w, http.StatusNotFound, apiError{Code: http.StatusNotFound, Message: fmt.Sprintf("no port %s of sandbox %s here", portStr, e2bid)})
	}
	port, err := hostname.ParsePort(portStr)
	id := FromE2BID(e2bid)
	if err != nil || id == "" {
		notFound()
		return
	}
	if s.cfg.Ingress == nil {
		writeJSON(w, http.StatusNotFound, apiError{Code: http.StatusNotFound,
			Message: "guest ports are served through cagebox's ingress: start the daemon with --ingress and --ingress-domain (docs/e2b.md)"})
		return
	}
	sb, err := s.cfg.Manager.Get(r.Context(), "", id)
	// Only the front's own sandboxes: others keep the ingress's rules.
	if err != nil || sb.Labels[labelTemplate] == "" || state(sb.Status) == "" {
		s.ports.drop(id) // gone: its tokens with it
		notFound()
		return
	}
	if sb.Labels[labelPublic] != "true" && !s.trafficOK(id, r.Header.Get(TrafficHeader)) {
		// 403, as E2B's edge answers (its docs: "Request without token
		// will fail with 403").
		writeJSON(w, http.StatusForbidden, apiError{Code: http.StatusForbidden,
			Message: "this sandbox's ports need its trafficAccessToken in the " + TrafficHeader + " header (or create it with network.allowPublicTraffic true)"})
		return
	}
	tok, err := s.publish(r.Context(), id, port)
	if err != nil {
		s.fail(w, r, fmt.Errorf("publish port %d of %s: %w", port, e2bid, err))
		return
	}
	out := r.Clone(r.Context())
	out.Host = ingress.HostFor(id, port, s.cfg.IngressDomain)
	out.Header.Del(TrafficHeader)
	out.Header.Set(ingress.AccessHeader, tok)
	s.cfg.Ingress.ServeHTTP(w, out)
}
