package credentials

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/resign"
	"github.com/cagebox/cagebox/internal/substitute"
	"github.com/cagebox/cagebox/internal/vault"
)

// Binding modes.
const (
	ModeProxy = "proxy" // the placeholder is swapped for the real value
	ModeEnv   = "env"   // the real value is in the guest's environment
	ModeSigV4 = "sigv4" // AWS SigV4 requests are re-signed
	ModeHMAC  = "hmac"  // a webhook-style HMAC signature is re-signed
)

// Binding is one of a sandbox's credential bindings as the sandbox record
// stores it: everything needed to rebuild the request path after a
// restart (Build), never a value.
type Binding struct {
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

// SigV4Binding: the guest signs with Placeholder; on requests to Hosts over
// intercepted TLS the pipeline verifies that signature and re-signs with
// the real key (Real, read per request for the request's host; an error
// that is ErrNotBound refuses the request as one to a host Hosts do not
// name).
type SigV4Binding struct {
	Name        string
	Hosts       []string
	Placeholder resign.AWSCreds
	Real        func(host string) (resign.AWSCreds, error)
}

// HMACBinding: the guest signs with a placeholder key as Signer describes;
// on requests to Hosts over intercepted TLS the pipeline verifies that
// signature and re-signs with the real key (Real, read per request for the
// request's host; an error that is ErrNotBound treats the request as one
// to a host Hosts do not name).
type HMACBinding struct {
	Name  string
	Hosts []string
	// Signer holds the configuration and the placeholder key; Real is
	// filled in per request on a copy.
	Signer *resign.HMAC
	Real   func(host string) ([]byte, error)
}

// Bindings are a sandbox's bindings as the request path uses them.
type Bindings struct {
	// Swap swaps proxy-mode placeholders and refuses guard placeholders
	// (nil: none).
	Swap  *substitute.Set
	SigV4 []*SigV4Binding
	HMAC  []*HMACBinding
}

// InlineName is the vault name of a sandbox's inline secret.
func InlineName(sandboxID, name string) string {
	return "SBX_" + strings.ReplaceAll(strings.TrimPrefix(sandboxID, "sb-"), "-", "_") + "_" + name
}

// Bind resolves a create request's bindings against the vault: inline
// values are sealed in it (under InlineName), placeholders made, and the
// guest's environment returned. undo deletes the inline secrets; it is
// never nil. Errors wrap errdefs kinds and name the field at fault.
func Bind(ctx context.Context, v *vault.Vault, tenant, sandboxID string, reqs []api.SecretBinding) (_ []Binding, env []string, undo func(), _ error) {
	var out []Binding
	var inline []string
	undo = func() {
		for _, n := range inline {
			_ = v.Delete(context.Background(), tenant, n)
		}
	}
	if len(reqs) > 0 && v == nil {
		return nil, nil, undo, fmt.Errorf("%w: secrets: this daemon has no vault", errdefs.ErrInvalid)
	}
	seen := map[string]bool{}
	for i, b := range reqs {
		field := fmt.Sprintf("secrets[%d]", i)
		// A secret name is an environment variable's name.
		if err := vault.CheckName(b.Name); err != nil {
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
			if err := hmacSigner(b.HMAC, nil).Validate(); err != nil {
				return nil, nil, undo, fmt.Errorf("%w: %s.hmac: %v", errdefs.ErrInvalid, field, err)
			}
		}
		if (len(b.Headers) > 0 || len(b.Query) > 0) && mode != ModeProxy {
			return nil, nil, undo, fmt.Errorf("%w: %s: headers and query name places to swap a placeholder, which only mode proxy does", errdefs.ErrInvalid, field)
		}
		// Checked now, so a bad name is refused before anything is made.
		if _, err := substitute.NewSet(&substitute.Binding{Name: b.Name, Placeholder: "cbx_check_placeholder", Real: func(string) ([]byte, error) { return nil, nil }, Headers: b.Headers, Query: b.Query}); err != nil {
			return nil, nil, undo, fmt.Errorf("%w: %s: %v", errdefs.ErrInvalid, field, err)
		}
		bs := Binding{Name: b.Name, Body: b.Body, Mode: mode, HMAC: b.HMAC, Headers: b.Headers, Query: b.Query}
		if b.Value != "" {
			if b.Secret != "" {
				return nil, nil, undo, fmt.Errorf("%w: %s: give a value or a stored secret, not both", errdefs.ErrInvalid, field)
			}
			if len(b.Hosts) == 0 {
				return nil, nil, undo, fmt.Errorf("%w: %s.hosts: an inline secret needs the hosts it may be sent to (NAME@HOST)", errdefs.ErrInvalid, field)
			}
			bs.Secret, bs.Inline = InlineName(sandboxID, b.Name), true
			in, err := v.Put(ctx, tenant, bs.Secret, []byte(b.Value), b.Hosts, "")
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
			in, err := v.Info(ctx, tenant, bs.Secret)
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
		val, vin, err := openToBind(ctx, v, tenant, bs.Secret)
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
			creds, ok := parseAWS(val.Bytes())
			if !ok {
				val.Wipe()
				return nil, nil, undo, fmt.Errorf("%w: %s: a sigv4 secret's value is ACCESS_KEY_ID:SECRET_ACCESS_KEY", errdefs.ErrInvalid, field)
			}
			if bs.Placeholder, err = substitute.NewPlaceholder([]byte(creds.AccessKeyID)); err == nil {
				bs.PlaceholderSecret, err = substitute.NewPlaceholder([]byte(creds.SecretAccessKey))
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

// parseAWS splits a sigv4 secret's value, ACCESS_KEY_ID:SECRET_ACCESS_KEY.
func parseAWS(v []byte) (resign.AWSCreds, bool) {
	akid, secret, ok := strings.Cut(string(v), ":")
	if !ok || akid == "" || secret == "" {
		return resign.AWSCreds{}, false
	}
	return resign.AWSCreds{AccessKeyID: akid, SecretAccessKey: secret}, true
}

// Build makes the request path's bindings of a sandbox's stored bindings.
// Every real value is read from the vault on every request that needs it,
// with the secret's current record: a revoke or rotate applies to the very
// next request, and so does a narrowing of the secret's hosts (a request
// to a host of the binding that the secret's hosts no longer cover is
// refused as one to a host the binding does not name). The placeholders
// of signing keys (hmac, the sigv4 secret) are guards: refused wherever a
// request carries them. Env-mode bindings have no part in it.
func Build(v *vault.Vault, tenant string, bound []Binding) (*Bindings, error) {
	real := func(b Binding) func(host string) ([]byte, error) {
		name, hosts := b.Secret, b.Hosts
		return func(host string) ([]byte, error) {
			val, err := openForRequest(context.Background(), v, tenant, name, hosts, host)
			if err != nil {
				return nil, err
			}
			return val.Bytes(), nil
		}
	}
	out := &Bindings{}
	var swaps []*substitute.Binding
	for _, b := range bound {
		switch b.Mode {
		case ModeProxy:
			swaps = append(swaps, &substitute.Binding{
				Name: b.Name, Placeholder: b.Placeholder, Hosts: b.Hosts, Body: b.Body, Inject: b.Inject,
				Headers: b.Headers, Query: b.Query, Real: real(b),
			})
		case ModeSigV4:
			swaps = append(swaps, &substitute.Binding{Name: b.Name, Placeholder: b.PlaceholderSecret, Guard: true})
			name, hosts := b.Secret, b.Hosts
			out.SigV4 = append(out.SigV4, &SigV4Binding{
				Name: b.Name, Hosts: b.Hosts,
				Placeholder: resign.AWSCreds{AccessKeyID: b.Placeholder, SecretAccessKey: b.PlaceholderSecret},
				Real: func(host string) (resign.AWSCreds, error) {
					val, err := openForRequest(context.Background(), v, tenant, name, hosts, host)
					if err != nil {
						return resign.AWSCreds{}, err
					}
					defer val.Wipe()
					creds, _ := parseAWS(val.Bytes())
					return creds, nil
				},
			})
		case ModeHMAC:
			swaps = append(swaps, &substitute.Binding{Name: b.Name, Placeholder: b.Placeholder, Guard: true})
			if b.HMAC == nil {
				continue
			}
			out.HMAC = append(out.HMAC, &HMACBinding{
				Name: b.Name, Hosts: b.Hosts,
				Signer: hmacSigner(b.HMAC, []byte(b.Placeholder)),
				Real:   real(b),
			})
		}
	}
	set, err := substitute.NewSet(swaps...)
	if err != nil {
		return nil, err
	}
	out.Swap = set
	return out, nil
}

// DropInline deletes the inline secrets of bound from the vault (a
// removed sandbox's, or an unbound one).
func DropInline(v *vault.Vault, tenant string, bound []Binding) {
	for _, b := range bound {
		if b.Inline && v != nil {
			_ = v.Delete(context.Background(), tenant, b.Secret)
		}
	}
}

// hmacSigner is the resign configuration of an hmac binding.
func hmacSigner(c *api.HMACSigning, placeholder []byte) *resign.HMAC {
	return &resign.HMAC{
		Algorithm: c.Algorithm, Header: c.Header, Prefix: c.Prefix, Encoding: c.Encoding,
		Canonical: c.Sign, MaxBody: c.MaxBody, Placeholder: placeholder,
	}
}

// known tells the exfil scan which strings are this sandbox's own
// placeholders.
type known struct{ b *Bindings }

func (k known) IsPlaceholder(s string) bool {
	if k.b.Swap != nil && k.b.Swap.IsPlaceholder(s) {
		return true
	}
	for _, b := range k.b.SigV4 {
		if s == b.Placeholder.AccessKeyID || s == b.Placeholder.SecretAccessKey {
			return true
		}
	}
	return false
}

// bound reports whether any of the bindings is bound to host.
func (bs *Bindings) bound(host string) bool {
	if bs.Swap != nil && bs.Swap.Bound(host) {
		return true
	}
	for _, b := range bs.SigV4 {
		if hostname.MatchAny(b.Hosts, host) {
			return true
		}
	}
	for _, b := range bs.HMAC {
		if hostname.MatchAny(b.Hosts, host) {
			return true
		}
	}
	return false
}

// placeholderIn reports the binding whose placeholder text carries, in any
// form (the AWS key id placeholder literally).
func (bs *Bindings) placeholderIn(text string) (string, bool) {
	if bs.Swap != nil {
		if name, ok := bs.Swap.Contains(text); ok {
			return name, true
		}
	}
	for _, b := range bs.SigV4 {
		if strings.Contains(text, b.Placeholder.AccessKeyID) {
			return b.Name, true
		}
	}
	return "", false
}

func (bs *Bindings) placeholderWindow() int {
	w := 0
	if bs.Swap != nil {
		w = bs.Swap.Window()
	}
	for _, b := range bs.SigV4 {
		w = max(w, len(b.Placeholder.AccessKeyID))
	}
	return w
}
