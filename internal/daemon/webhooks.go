package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/hooks"
	"github.com/cagebox/cagebox/internal/ingress"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
)

// newHooks makes the webhook service: URLs on the ingress listener
// (https://hooks.D/w/TOKEN), secrets opened from the vault per delivery,
// deliveries sent through the ingress path to the guest (srv.Send, which
// wakes a sleeping sandbox), and the webhook ports admitted on each link.
// srv is set once the ingress listener exists.
func newHooks(cfg Config, st store.Store, v *vault.Vault, mgr *sandbox.Manager, emit func(string, string, api.EventPayload), srv **ingress.Server) *hooks.Service {
	if cfg.Ingress.Addr == "" {
		return nil
	}
	svc := hooks.New(hooks.Config{
		Store: st,
		// BaseURL: set by startIngress, which knows the listener's port.
		// The secret only checks a delivery's signature on the host: it is
		// written nowhere (credentials.OpenToVerify).
		Secret: func(ctx context.Context, tenant, name string) ([]byte, func(), error) {
			sec, err := credentials.OpenToVerify(ctx, v, tenant, name)
			if err != nil {
				return nil, nil, err
			}
			return sec.Bytes(), sec.Wipe, nil
		},
		Deliver: func(ctx context.Context, id string, port int, req *http.Request) (int, error) {
			if *srv == nil {
				return 0, fmt.Errorf("no ingress listener")
			}
			return (*srv).Send(ctx, id, port, req)
		},
		Emit: emit,
		SandboxExists: func(ctx context.Context, tenant, id string) error {
			_, err := mgr.Get(ctx, tenant, id)
			return err
		},
		Gone: sandboxGone(st),
	})
	// A webhook's port is admitted on its sandbox's link like a published
	// one (only the ingress listener's marked connections reach it).
	mgr.Ports().SetExtraPorts(func(ctx context.Context, id string) []uint16 {
		ws, err := st.ListWebhooks(ctx, "", id)
		if err != nil {
			return nil
		}
		var out []uint16
		for _, w := range ws {
			out = append(out, uint16(w.Port))
		}
		return out
	})
	return svc
}

// sandboxGone reports a sandbox that takes no more deliveries and holds
// no relays, ever, by its status: stopped or failed — neither runs again;
// its record stays until `cagebox rm`. "" for any other (running or
// asleep, being created), and for one with no record (a removed
// sandbox's webhooks and relays are deleted with it).
func sandboxGone(st store.Store) func(ctx context.Context, id string) (string, error) {
	return func(ctx context.Context, id string) (string, error) {
		r, err := st.GetSandbox(ctx, "", id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return "", nil
		case err != nil:
			return "", fmt.Errorf("read sandbox %s: %w", id, err)
		}
		switch r.Status {
		case sandbox.StatusStopped, sandbox.StatusFailed:
			return r.Status, nil
		}
		return "", nil
	}
}

// The webhook routes: a sandbox's tenant owns its webhooks, and their
// secrets are that tenant's.

func (s *Server) webhookSandbox(r *http.Request, t *store.Tenant) (*api.Sandbox, error) {
	if s.hooks == nil {
		return nil, fmt.Errorf("%w: this daemon serves no webhooks: start it with --ingress ADDR --ingress-domain DOMAIN", errdefs.ErrUnavailable)
	}
	return s.mgr.Get(r.Context(), scope(t), r.PathValue("id"))
}

func (s *Server) addWebhook(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.webhookSandbox(r, t)
	if err != nil {
		return err
	}
	var req api.WebhookRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	wh, err := s.hooks.Add(r.Context(), sb.Tenant, sb.ID, &req)
	if err != nil {
		return err
	}
	if err := s.mgr.Ports().SyncPublished(r.Context(), sb.ID); err != nil {
		_ = s.hooks.Remove(context.WithoutCancel(r.Context()), sb.Tenant, sb.ID, req.Name)
		return fmt.Errorf("admit port %d: %w", req.Port, err)
	}
	writeJSON(w, http.StatusCreated, wh)
	return nil
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.webhookSandbox(r, t)
	if err != nil {
		return err
	}
	l, err := s.hooks.List(r.Context(), sb.Tenant, sb.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

func (s *Server) removeWebhook(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sb, err := s.webhookSandbox(r, t)
	if err != nil {
		return err
	}
	if err := s.hooks.Remove(r.Context(), sb.Tenant, sb.ID, r.PathValue("name")); err != nil {
		return err
	}
	if err := s.mgr.Ports().SyncPublished(r.Context(), sb.ID); err != nil {
		s.log.Warn("unadmit webhook port", "sandbox", sb.ID, "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
