package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/resign"
	"github.com/cagebox/cagebox/internal/substitute"
	"github.com/cagebox/cagebox/internal/vault"
)

// Binding modes.
const (
	ModeProxy = "proxy"
	ModeEnv   = "env"
	ModeSigV4 = "sigv4"
	ModeHMAC  = "hmac"
)

// boundSecret is a binding as stored in the sandbox record: everything
// needed to rebuild it after a restart, never a value.
type boundSecret struct {
	Name        string   `json:"name"`
	Secret      string   `json:"secret"` // vault name
	Inline      bool     `json:"inline,omitempty"`
	Hosts       []string `json:"hosts"`
	Body        bool     `json:"body,omitempty"`
	Mode        string   `json:"mode"`
	Placeholder string   `json:"placeholder,omitempty"` // what the guest holds (not a secret)
	// PlaceholderSecret is the sigv4 mode's placeholder secret access key.
	PlaceholderSecret string `json:"placeholder_secret,omitempty"`
	Inject            string `json:"inject,omitempty"`
	// Headers and Query are the extra places the placeholder is swapped.
	Headers []string `json:"headers,omitempty"`
	Query   []string `json:"query,omitempty"`
	// HMAC is the hmac mode's signing configuration.
	HMAC *api.HMACSigning `json:"hmac,omitempty"`
}

// inlineName is the vault name of a sandbox's inline secret.
func inlineName(sandboxID, name string) string {
	return "SBX_" + strings.ReplaceAll(strings.TrimPrefix(sandboxID, "sb-"), "-", "_") + "_" + name
}

// bindSecrets resolves a create request's bindings: inline values are
// sealed in the vault, placeholders made, and the guest env returned. The
// undo func deletes the inline secrets.
func (m *Manager) bindSecrets(ctx context.Context, tenant, id string, reqs []api.SecretBinding) ([]boundSecret, []string, func(), error) {
	var out []boundSecret
	var env []string
	var inline []string
	undo := func() {
		for _, n := range inline {
			_ = m.cfg.Vault.Delete(context.Background(), tenant, n)
		}
	}
	if len(reqs) > 0 && m.cfg.Vault == nil {
		return nil, nil, undo, fmt.Errorf("%w: secrets: this daemon has no vault", errdefs.ErrInvalid)
	}
	seen := map[string]bool{}
	for i, b := range reqs {
		field := fmt.Sprintf("secrets[%d]", i)
		if err := vault.CheckName(b.Name); err != nil || !envKey.MatchString(b.Name) {
			return nil, nil, undo, fmt.Errorf("%w: %s.name: %q is not a valid environment variable name", errdefs.ErrInvalid, field, b.Name)
		}
		if seen[b.Name] {
			return nil, nil, undo, fmt.Errorf("%w: %s.name: %s is bound twice", errdefs.ErrInvalid, field, b.Name)
		}
		seen[b.Name] = true
		mode := b.Mode
		if mode == "" {
			mode = ModeProxy
		}
		if mode != ModeProxy && mode != ModeEnv && mode != ModeSigV4 && mode != ModeHMAC {
			return nil, nil, undo, fmt.Errorf("%w: %s.mode: %q is not proxy, env, sigv4 or hmac", errdefs.ErrInvalid, field, b.Mode)
		}
		if (mode == ModeHMAC) != (b.HMAC != nil) {
			return nil, nil, undo, fmt.Errorf("%w: %s.hmac: give the signing configuration with mode hmac, and only then", errdefs.ErrInvalid, field)
		}
		if b.HMAC != nil {
			if err := hmacSigner(b.HMAC, nil, nil).Validate(); err != nil {
				return nil, nil, undo, fmt.Errorf("%w: %s.hmac: %v", errdefs.ErrInvalid, field, err)
			}
		}
		if (len(b.Headers) > 0 || len(b.Query) > 0) && mode != ModeProxy {
			return nil, nil, undo, fmt.Errorf("%w: %s: headers and query name places to swap a placeholder, which only mode proxy does", errdefs.ErrInvalid, field)
		}
		// Checked now, so a bad name is refused before anything is made.
		if _, err := substitute.NewSet(&substitute.Binding{Name: b.Name, Placeholder: "cbx_check_placeholder", Real: func() ([]byte, error) { return nil, nil }, Headers: b.Headers, Query: b.Query}); err != nil {
			return nil, nil, undo, fmt.Errorf("%w: %s: %v", errdefs.ErrInvalid, field, err)
		}
		bs := boundSecret{Name: b.Name, Body: b.Body, Mode: mode, HMAC: b.HMAC, Headers: b.Headers, Query: b.Query}
		if b.Value != "" {
			if b.Secret != "" {
				return nil, nil, undo, fmt.Errorf("%w: %s: give a value or a stored secret, not both", errdefs.ErrInvalid, field)
			}
			if len(b.Hosts) == 0 {
				return nil, nil, undo, fmt.Errorf("%w: %s.hosts: an inline secret needs the hosts it may be sent to (NAME@HOST)", errdefs.ErrInvalid, field)
			}
			bs.Secret, bs.Inline = inlineName(id, b.Name), true
			in, err := m.cfg.Vault.Put(ctx, tenant, bs.Secret, []byte(b.Value), b.Hosts, "")
			if err != nil {
				return nil, nil, undo, fmt.Errorf("%w: %s: %v", errdefs.ErrInvalid, field, err)
			}
			inline = append(inline, bs.Secret)
			bs.Hosts = in.Hosts
		} else {
			bs.Secret = b.Secret
			if bs.Secret == "" {
				bs.Secret = b.Name
			}
			in, err := m.cfg.Vault.Info(ctx, tenant, bs.Secret)
			if err != nil {
				if errors.Is(err, vault.ErrNotFound) {
					return nil, nil, undo, fmt.Errorf("%w: %s: no stored secret %q (cagebox secret add %s --host …)", errdefs.ErrNotFound, field, bs.Secret, bs.Secret)
				}
				return nil, nil, undo, err
			}
			if in.Revoked {
				return nil, nil, undo, fmt.Errorf("%w: %s: secret %q is revoked", errdefs.ErrConflict, field, bs.Secret)
			}
			bs.Hosts, bs.Inject = in.Hosts, in.Inject
			if len(b.Hosts) > 0 {
				narrow, err := vault.NormalizeHosts(b.Hosts)
				if err != nil {
					return nil, nil, undo, fmt.Errorf("%w: %s.hosts: %v", errdefs.ErrInvalid, field, err)
				}
				for _, h := range narrow {
					if !hostname.CoversAny(in.Hosts, h) {
						return nil, nil, undo, fmt.Errorf("%w: %s.hosts: %s is not one of the secret's hosts (%s)", errdefs.ErrInvalid, field, h, strings.Join(in.Hosts, ", "))
					}
				}
				bs.Hosts = narrow
			}
		}
		val, vin, err := m.cfg.Vault.Value(ctx, tenant, bs.Secret)
		if err != nil {
			return nil, nil, undo, fmt.Errorf("%s: %w", field, err)
		}
		// The real value enters the guest in env mode: only where whoever
		// stored it allowed that (an inline value is the caller's own). The
		// flag is read with the value, so a secret replaced meanwhile is
		// judged by the value actually delivered.
		if mode == ModeEnv && !bs.Inline && !vin.AllowEnv {
			val.Wipe()
			return nil, nil, undo, fmt.Errorf("%w: %s: secret %q may not be delivered into a guest (mode env): store it with `cagebox secret add %s --allow-env …` (or `cagebox secret rotate %s --allow-env`), or bind it in proxy mode",
				errdefs.ErrDenied, field, bs.Secret, bs.Secret, bs.Secret)
		}
		switch mode {
		case ModeEnv:
			env = append(env, b.Name+"="+string(val.Bytes()))
		case ModeSigV4:
			akid, secret, ok := strings.Cut(string(val.Bytes()), ":")
			if !ok || akid == "" || secret == "" {
				val.Wipe()
				return nil, nil, undo, fmt.Errorf("%w: %s: a sigv4 secret's value is ACCESS_KEY_ID:SECRET_ACCESS_KEY", errdefs.ErrInvalid, field)
			}
			if bs.Placeholder, err = substitute.NewPlaceholder([]byte(akid)); err == nil {
				bs.PlaceholderSecret, err = substitute.NewPlaceholder([]byte(secret))
			}
			if err != nil {
				val.Wipe()
				return nil, nil, undo, fmt.Errorf("%s: placeholder: %w", field, err)
			}
			env = append(env, "AWS_ACCESS_KEY_ID="+bs.Placeholder, "AWS_SECRET_ACCESS_KEY="+bs.PlaceholderSecret)
		default:
			ph, err := substitute.NewPlaceholder(val.Bytes())
			if err != nil {
				return nil, nil, undo, fmt.Errorf("%s: placeholder: %w", field, err)
			}
			bs.Placeholder = ph
			env = append(env, b.Name+"="+ph)
		}
		val.Wipe()
		out = append(out, bs)
	}
	return out, env, undo, nil
}

// secretSet builds the gateway's substitution set for a sandbox's
// proxy-mode bindings; the real value is fetched from the vault on every
// request, so a revoke or rotate applies to the very next one. The
// placeholders of signing keys (hmac, the sigv4 secret) are guards: refused
// wherever a request carries them.
func (m *Manager) secretSet(tenant string, bound []boundSecret) (*substitute.Set, error) {
	var bs []*substitute.Binding
	for _, b := range bound {
		switch b.Mode {
		case ModeHMAC:
			bs = append(bs, &substitute.Binding{Name: b.Name, Placeholder: b.Placeholder, Guard: true})
			continue
		case ModeSigV4:
			bs = append(bs, &substitute.Binding{Name: b.Name, Placeholder: b.PlaceholderSecret, Guard: true})
			continue
		case ModeProxy:
		default:
			continue
		}
		name := b.Secret
		bs = append(bs, &substitute.Binding{
			Name: b.Name, Placeholder: b.Placeholder, Hosts: b.Hosts, Body: b.Body, Inject: b.Inject,
			Headers: b.Headers, Query: b.Query,
			Real: func() ([]byte, error) {
				v, _, err := m.cfg.Vault.Value(context.Background(), tenant, name)
				if err != nil {
					return nil, err
				}
				return v.Bytes(), nil
			},
		})
	}
	return substitute.NewSet(bs...)
}

// dropInline deletes a removed sandbox's inline secrets from the vault.
func (m *Manager) dropInline(tenant string, bound []boundSecret) {
	for _, b := range bound {
		if b.Inline && m.cfg.Vault != nil {
			_ = m.cfg.Vault.Delete(context.Background(), tenant, b.Secret)
		}
	}
}

// sigV4Bindings builds the gateway's re-signing bindings; the real key is
// read from the vault on every request (revocation applies at once).
func (m *Manager) sigV4Bindings(tenant string, bound []boundSecret) []*gateway.SigV4Binding {
	var out []*gateway.SigV4Binding
	for _, b := range bound {
		if b.Mode != ModeSigV4 {
			continue
		}
		name := b.Secret
		out = append(out, &gateway.SigV4Binding{
			Name: b.Name, Hosts: b.Hosts,
			Placeholder: resign.AWSCreds{AccessKeyID: b.Placeholder, SecretAccessKey: b.PlaceholderSecret},
			Real: func() (resign.AWSCreds, error) {
				v, _, err := m.cfg.Vault.Value(context.Background(), tenant, name)
				if err != nil {
					return resign.AWSCreds{}, err
				}
				defer v.Wipe()
				akid, secret, _ := strings.Cut(string(v.Bytes()), ":")
				return resign.AWSCreds{AccessKeyID: akid, SecretAccessKey: secret}, nil
			},
		})
	}
	return out
}

// hmacSigner is the resign configuration of an hmac binding.
func hmacSigner(c *api.HMACSigning, placeholder, real []byte) *resign.HMAC {
	return &resign.HMAC{
		Algorithm: c.Algorithm, Header: c.Header, Prefix: c.Prefix, Encoding: c.Encoding,
		Canonical: c.Sign, MaxBody: c.MaxBody, Placeholder: placeholder, Real: real,
	}
}

// hmacBindings builds the gateway's HMAC re-signing bindings; the real key
// is read from the vault on every request.
func (m *Manager) hmacBindings(tenant string, bound []boundSecret) []*gateway.HMACBinding {
	var out []*gateway.HMACBinding
	for _, b := range bound {
		if b.Mode != ModeHMAC || b.HMAC == nil {
			continue
		}
		name := b.Secret
		out = append(out, &gateway.HMACBinding{
			Name: b.Name, Hosts: b.Hosts,
			Signer: hmacSigner(b.HMAC, []byte(b.Placeholder), nil),
			Real: func() ([]byte, error) {
				v, _, err := m.cfg.Vault.Value(context.Background(), tenant, name)
				if err != nil {
					return nil, err
				}
				return v.Bytes(), nil
			},
		})
	}
	return out
}

// Unbind removes a secret binding from a running sandbox: from the very
// next request its placeholder is refused (with an alert) everywhere, and
// an inline value is deleted from the vault. The guest's environment keeps
// the (now useless) placeholder.
func (m *Manager) Unbind(ctx context.Context, tenant, id, name string) (*api.Sandbox, error) {
	r, err := m.cfg.Store.GetSandbox(ctx, tenant, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	var sr specRecord
	if err := json.Unmarshal(r.Spec, &sr); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
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
			if set := a.Secrets(); set != nil {
				set.Remove(name)
			}
			a.SetSigV4(m.sigV4Bindings(r.TenantID, kept))
			a.SetHMAC(m.hmacBindings(r.TenantID, kept))
		}
	}
	m.dropInline(r.TenantID, []boundSecret{*gone})
	sr.Secrets = kept
	r.Spec, _ = json.Marshal(sr)
	r.UpdatedAt = m.cfg.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(ctx, r); err != nil {
		return nil, err
	}
	m.emit(r.TenantID, id, "secret.unbound", map[string]any{"name": name})
	return m.view(r), nil
}
