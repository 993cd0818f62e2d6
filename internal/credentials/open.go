package credentials

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/substitute"
	"github.com/cagebox/cagebox/internal/vault"
)

// The host opens a secret's real value in few places, each through one of
// the functions of this file (docs/security.md lists them, and
// TestRealValueOpeners keeps that list and the code in step):
//
//   - OpenToward: the value is written toward a host on a connection the
//     host makes itself (relay tokens: a WebSocket relay's handshake
//     header, a Discord relay's identify and resume). The host must be one
//     the secret's hosts cover, and the sandbox's binding's when it binds
//     the secret; the connection must be TLS. Checked against the vault's
//     current record at every open, so a secret re-bound or revoked later
//     stops the next write.
//   - OpenToVerify: the value is a key the host checks an inbound
//     signature with (webhook verification); it is written nowhere.
//   - openForRequest (Build): the gateway swap and re-signing, where the
//     request path requires intercepted TLS and a host of the binding
//     before it asks for the value, and the opener checks that host again
//     against the binding and the secret's hosts in the vault's current
//     record, read with the value at every request: a secret narrowed or
//     revoked since the sandbox bound it stops the next swap.
//   - openToBind (Bind): a placeholder of the value's shape is made, and in
//     mode env the value goes into the guest's environment — only for a
//     secret stored with AllowEnv.

// Toward is where a real value is about to be written.
type Toward struct {
	// URL is the connection's URL (wss://HOST/…, https://HOST/…).
	URL string
	// Bound are the hosts the sandbox's binding of this secret allows;
	// nil when the sandbox binds no such secret (the secret's own hosts
	// decide).
	Bound []string
}

// ErrNotBound is a write a secret's binding does not allow. It is
// substitute's, so that the request path's swap refuses such a value as it
// refuses a host the binding does not name.
var ErrNotBound = substitute.ErrNotBound

// CheckToward reports whether the tenant's secret may be written toward
// t, without opening it. Its errors wrap errdefs kinds and say what to do;
// they name hosts, never a value.
func CheckToward(ctx context.Context, v *vault.Vault, tenant, name string, t Toward) error {
	if v == nil {
		return fmt.Errorf("%w: this daemon has no vault", errdefs.ErrUnavailable)
	}
	in, err := v.Info(ctx, tenant, name)
	if err != nil {
		if errors.Is(err, vault.ErrNotFound) {
			return fmt.Errorf("%w: no stored secret %q (cagebox secret add %s --host HOST …)", errdefs.ErrNotFound, name, name)
		}
		return fmt.Errorf("secret %s: %w", name, err)
	}
	if in.Revoked {
		return fmt.Errorf("%w: secret %q is revoked", errdefs.ErrConflict, name)
	}
	return towardAllowed(name, in.Hosts, t)
}

// towardAllowed is the rule: TLS only, a host the secret's hosts (and the
// sandbox's binding, if any) cover.
func towardAllowed(name string, hosts []string, t Toward) error {
	u, err := url.Parse(t.URL)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%w: %w: secret %s: the destination is not a URL with a host", errdefs.ErrInvalid, ErrNotBound, name)
	}
	if u.Scheme != "wss" && u.Scheme != "https" {
		return fmt.Errorf("%w: %w: secret %s is sent only over TLS: use wss:// or https://, not %s://", errdefs.ErrInvalid, ErrNotBound, name, u.Scheme)
	}
	if err := hostAllowed(name, hosts, t.Bound, u.Hostname()); err != nil {
		return fmt.Errorf("%w: %w: %w", errdefs.ErrDenied, ErrNotBound, err)
	}
	return nil
}

// hostAllowed is the rule's host half, which every opener that writes a
// value toward a host applies to the record it opened: host is covered by
// the secret's hosts and, when bound is not nil, by the sandbox's binding
// of it. Its error is ErrNotBound (errors.Is) and names hosts, never a
// value.
func hostAllowed(name string, hosts, bound []string, host string) error {
	host = hostname.Canonical(host)
	if !hostname.MatchAny(hosts, host) {
		return notBound(fmt.Sprintf("secret %s is bound to hosts %s; the destination's host %s is not one of them: add it with `cagebox secret add %s --host %s …` (its hosts are replaced: name them all)",
			name, strings.Join(hosts, ", "), host, name, host))
	}
	if bound != nil && !hostname.MatchAny(bound, host) {
		return notBound(fmt.Sprintf("the sandbox binds secret %s to hosts %s; the destination's host %s is not one of them",
			name, strings.Join(bound, ", "), host))
	}
	return nil
}

// notBound is hostAllowed's error: its text says why, and it is
// ErrNotBound.
type notBound string

func (e notBound) Error() string { return string(e) }

func (notBound) Is(target error) bool { return target == ErrNotBound }

// OpenToward opens the tenant's secret for writing toward t (see
// CheckToward, whose rule it applies to the record it opens). The caller
// wipes the Secret when the write is done.
func OpenToward(ctx context.Context, v *vault.Vault, tenant, name string, t Toward) (vault.Secret, error) {
	if v == nil {
		return vault.Secret{}, fmt.Errorf("%w: this daemon has no vault", errdefs.ErrUnavailable)
	}
	val, in, err := v.Value(ctx, tenant, name)
	if err != nil {
		return vault.Secret{}, fmt.Errorf("secret %s: %w", name, err)
	}
	if err := towardAllowed(name, in.Hosts, t); err != nil {
		val.Wipe()
		return vault.Secret{}, err
	}
	return val, nil
}

// OpenToVerify opens the tenant's secret as the key of an inbound
// signature check (webhook verification): the value is compared or MACed
// on the host and written nowhere. The caller wipes it.
func OpenToVerify(ctx context.Context, v *vault.Vault, tenant, name string) (vault.Secret, error) {
	if v == nil {
		return vault.Secret{}, fmt.Errorf("%w: this daemon has no vault", errdefs.ErrUnavailable)
	}
	val, _, err := v.Value(ctx, tenant, name)
	if err != nil {
		return vault.Secret{}, fmt.Errorf("secret %s: %w", name, err)
	}
	return val, nil
}

// openForRequest opens a bound secret for the request path (Build): the
// swap and the re-signers ask for it only for a request to a host of the
// binding (bound) over intercepted TLS, and it opens only if host is also
// one of the secret's hosts in the record read with the value (the read
// that refuses a revoked secret), so a secret narrowed since the sandbox
// bound it stops going to the hosts taken from it at the next request.
// Refused so, its error is ErrNotBound (errors.Is), which the swap and the
// re-signers treat as a host the binding does not name.
func openForRequest(ctx context.Context, v *vault.Vault, tenant, name string, bound []string, host string) (vault.Secret, error) {
	if bound == nil {
		bound = []string{} // a binding without hosts allows none
	}
	val, in, err := v.Value(ctx, tenant, name)
	if err != nil {
		return vault.Secret{}, err
	}
	if err := hostAllowed(name, in.Hosts, bound, host); err != nil {
		val.Wipe()
		return vault.Secret{}, err
	}
	return val, nil
}

// openToBind opens a secret while a sandbox is bound (Bind): the
// placeholder takes the value's shape; in mode env the value enters the
// guest, which Bind allows only for a secret stored with AllowEnv (read
// here with the value, so a secret replaced meanwhile is judged by the
// value delivered).
func openToBind(ctx context.Context, v *vault.Vault, tenant, name string) (vault.Secret, *vault.Info, error) {
	return v.Value(ctx, tenant, name)
}
