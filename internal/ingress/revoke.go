package ingress

import (
	"context"
	"errors"
	"sync"
)

// ErrRevoked is the cause of a delivery's context once Revoke has cut it.
var ErrRevoked = errors.New("ingress: access to this port was revoked")

// revokedMsg is what a request cut before the guest answered gets.
const revokedMsg = "access to this port was revoked while the request was under way (unpublished, published again with a new token, expired, or its sandbox destroyed)"

// deliveries are the requests and upgraded connections (WebSocket, SSE,
// any stream) under way through the listener, by sandbox and port, so
// that revoking a port's access cuts them as well as refusing new ones.
// The zero value is ready to use.
type deliveries struct {
	// mu guards m.
	mu sync.Mutex
	m  map[string]map[uint16]map[*delivery]struct{} // sandbox → port → set
}

// delivery is one tracked request.
type delivery struct {
	cancel context.CancelCauseFunc
}

// track returns a context of parent that Revoke(id, port) or Revoke(id,
// 0) cancels (cause ErrRevoked), and done, which forgets it; call done
// when the request has ended. ServeHTTP tracks a request before it
// resolves the port.
func (d *deliveries) track(parent context.Context, id string, port uint16) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	dl := &delivery{cancel: cancel}
	d.mu.Lock()
	if d.m == nil {
		d.m = map[string]map[uint16]map[*delivery]struct{}{}
	}
	ports := d.m[id]
	if ports == nil {
		ports = map[uint16]map[*delivery]struct{}{}
		d.m[id] = ports
	}
	set := ports[port]
	if set == nil {
		set = map[*delivery]struct{}{}
		ports[port] = set
	}
	set[dl] = struct{}{}
	d.mu.Unlock()
	return ctx, func() {
		d.mu.Lock()
		if ports := d.m[id]; ports != nil {
			if set := ports[port]; set != nil {
				delete(set, dl)
				if len(set) == 0 {
					delete(ports, port)
				}
			}
			if len(ports) == 0 {
				delete(d.m, id)
			}
		}
		d.mu.Unlock()
		cancel(nil)
	}
}

// revoke cancels the deliveries to port of sandbox id (0: to every port
// of it) and reports how many it cancelled.
func (d *deliveries) revoke(id string, port uint16) int {
	var cut []*delivery
	d.mu.Lock()
	for p, set := range d.m[id] {
		if port != 0 && p != port {
			continue
		}
		for dl := range set {
			cut = append(cut, dl)
		}
	}
	d.mu.Unlock()
	for _, dl := range cut {
		dl.cancel(ErrRevoked)
	}
	return len(cut)
}

// Revoke cuts what is under way through the listener to port of sandbox
// id (0: to every port of it): requests waiting for the guest fail (404),
// streamed responses (SSE) are aborted and upgraded connections
// (WebSocket) are closed, to the client as well as to the guest. It then
// drops idle connections to guests. The sandbox manager calls it once a
// port is unpublished, published again (its token rotated), expired, or
// its sandbox destroyed, after the change is visible to Resolve: a
// request tracked later resolves the port afresh. Host-side deliveries
// (Send: webhooks, relays) are not cut.
func (s *Server) Revoke(id string, port uint16) {
	if n := s.live.revoke(id, port); n > 0 {
		s.log.Info("ingress: revoked open requests", "sandbox", id, "port", port, "requests", n)
	}
	s.CloseIdle()
}
