package sandbox

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

// ReservedLabelPrefix starts the labels only the admin tenant may set:
// the fleet controller's (internal/kube/fleet), which it trusts to find
// the sandboxes it made. A tenant able to set them could pass its own
// sandbox off as another's Sandbox object.
const ReservedLabelPrefix = "cagebox.dev/"

// Label limits (api.CreateSandboxRequest.Labels).
const (
	MaxLabels        = 16
	MaxLabelKeyLen   = 253
	MaxLabelValueLen = 63
)

func labelKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/'
}

func labelValueChar(c byte) bool { return c != '/' && labelKeyChar(c) }

// checkLabel checks one label; the error names it.
func checkLabel(field, k, v string) error {
	if k == "" || len(k) > MaxLabelKeyLen {
		return invalid("%s: key %q must be 1-%d characters", field, k, MaxLabelKeyLen)
	}
	for i := 0; i < len(k); i++ {
		if !labelKeyChar(k[i]) {
			return invalid("%s: key %q may hold only letters, digits and . _ / -", field, k)
		}
	}
	if len(v) > MaxLabelValueLen {
		return invalid("%s: the value of %q is %d characters, at most %d are allowed", field, k, len(v), MaxLabelValueLen)
	}
	for i := 0; i < len(v); i++ {
		if !labelValueChar(v[i]) {
			return invalid("%s: the value %q of %q may hold only letters, digits and . _ -", field, v, k)
		}
	}
	return nil
}

// checkReserved refuses labels under ReservedLabelPrefix from any tenant
// but the admin.
func checkReserved(tenant string, labels map[string]string) error {
	if tenant == store.AdminTenantID {
		return nil
	}
	for k := range labels {
		if strings.HasPrefix(k, ReservedLabelPrefix) {
			return fmt.Errorf("%w: labels: %q: labels under %s are the fleet's (admin only); use another prefix", errdefs.ErrDenied, k, ReservedLabelPrefix)
		}
	}
	return nil
}

// ValidateLabels checks a create request's labels: at most MaxLabels, keys
// 1-253 characters of [A-Za-z0-9._/-], values up to 63 of [A-Za-z0-9._-].
func ValidateLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return invalid("labels: %d labels, at most %d are allowed", len(labels), MaxLabels)
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first bad one, always the same
	for _, k := range keys {
		if err := checkLabel("labels", k, labels[k]); err != nil {
			return err
		}
	}
	return nil
}

// ParseLabelSelector reads label=KEY=VALUE query values (all must match);
// a malformed one, or one key asked for with two values, is ErrInvalid.
func ParseLabelSelector(values []string) (map[string]string, error) {
	if len(values) == 0 {
		return nil, nil
	}
	if len(values) > MaxLabels {
		return nil, invalid("label: %d selectors, at most %d are allowed", len(values), MaxLabels)
	}
	out := make(map[string]string, len(values))
	for _, kv := range values {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, invalid("label: %q is not KEY=VALUE (e.g. label=cagebox.dev/uid=1234)", kv)
		}
		if err := checkLabel("label", k, v); err != nil {
			return nil, err
		}
		if old, dup := out[k]; dup && old != v {
			return nil, invalid("label: %q is asked for with two values (%q and %q): no sandbox matches both", k, old, v)
		}
		out[k] = v
	}
	return out, nil
}

// ListLabeled returns the sandboxes of tenant ("" = all) that carry every
// one of labels.
func (m *Manager) ListLabeled(ctx context.Context, tenant string, labels map[string]string) ([]*api.Sandbox, error) {
	rs, err := m.cfg.Store.ListSandboxesLabeled(ctx, tenant, labels)
	if err != nil {
		return nil, err
	}
	out := make([]*api.Sandbox, 0, len(rs))
	for _, r := range rs {
		out = append(out, m.view(r))
	}
	return out, nil
}
