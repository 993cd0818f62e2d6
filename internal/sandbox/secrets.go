package sandbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

// ModeEnv is the binding mode that puts the real value in the guest.
const ModeEnv = credentials.ModeEnv

// boundSecret is a binding as stored in the sandbox record.
type boundSecret = credentials.Binding

// Secrets is the manager's service of the sandboxes' secret bindings
// (Manager.Secrets): resolved at create, unbound while a sandbox runs,
// dropped with it.
type Secrets struct{ m *Manager }

// Secrets is the service of the sandboxes' secret bindings.
func (m *Manager) Secrets() *Secrets { return m.secrets }

// bind resolves a create request's bindings (credentials.Bind): inline
// values are sealed in the vault, placeholders made, and the guest env
// returned. The undo func deletes the inline secrets.
func (sc *Secrets) bind(ctx context.Context, tenant, id string, reqs []api.SecretBinding) ([]boundSecret, []string, func(), error) {
	m := sc.m
	return credentials.Bind(ctx, m.cfg.Vault, tenant, id, reqs)
}

// bindings builds the gateway's credential bindings of a sandbox; the
// real values are read from the vault on every request, so a revoke or
// rotate applies to the very next one.
func (sc *Secrets) bindings(tenant string, bound []boundSecret) (*credentials.Bindings, error) {
	m := sc.m
	return credentials.Build(m.cfg.Vault, tenant, bound)
}

// dropInline deletes a removed sandbox's inline secrets from the vault.
func (sc *Secrets) dropInline(tenant string, bound []boundSecret) {
	m := sc.m
	credentials.DropInline(m.cfg.Vault, tenant, bound)
}

// Unbind removes a secret binding from a running sandbox: from the very
// next request its placeholder is refused (with an alert) everywhere, and
// an inline value is deleted from the vault. The guest's environment keeps
// the (now useless) placeholder.
func (sc *Secrets) Unbind(ctx context.Context, tenant, id, name string) (*api.Sandbox, error) {
	m := sc.m
	r, sr, err := m.secrets.boundRecord(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	var kept []boundSecret
	var gone *boundSecret
	for i := range sr.Secrets {
		if sr.Secrets[i].Name == name {
			gone = &sr.Secrets[i]
			continue
		}
		kept = append(kept, sr.Secrets[i])
	}
	if gone == nil {
		return nil, fmt.Errorf("%w: sandbox %s has no secret binding %q", errdefs.ErrNotFound, id, name)
	}
	if gw := m.cfg.Gateway; gw != nil {
		if a, ok := gw.Get(id); ok {
			a.Credentials.Unbind(name)
		}
	}
	m.secrets.dropInline(r.TenantID, []boundSecret{*gone})
	sr.Secrets = kept
	r.Spec, _ = json.Marshal(sr)
	r.UpdatedAt = m.cfg.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(ctx, r); err != nil {
		return nil, err
	}
	m.Emit(r.TenantID, id, api.SecretUnbound{Name: name})
	return m.view(r), nil
}

// Hosts returns the hosts the sandbox's bindings of the vault secret
// name allow (their union), or nil when the sandbox binds no such secret:
// a host-side write of that secret for this sandbox (a relay's token) must
// go to one of them as well as to one of the secret's own hosts
// (credentials.Toward.Bound).
func (sc *Secrets) Hosts(ctx context.Context, tenant, id, name string) ([]string, error) {
	m := sc.m
	_, sr, err := m.secrets.boundRecord(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	var hosts []string
	for _, b := range sr.Secrets {
		if b.Secret == name {
			hosts = append(hosts, b.Hosts...)
		}
	}
	return hosts, nil
}

// boundRecord reads a sandbox's row and its spec record (the bindings
// Unbind and Hosts look at).
func (sc *Secrets) boundRecord(ctx context.Context, tenant, id string) (*store.Sandbox, *specRecord, error) {
	m := sc.m
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return nil, nil, notFound(id, err)
	}
	var sr specRecord
	if err := json.Unmarshal(r.Spec, &sr); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return r, &sr, nil
}
