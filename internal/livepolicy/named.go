package livepolicy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cagebox/cagebox/internal/policy"
)

// Named policies are a tenant's stored documents (`cagebox policy create`)
// that sandboxes follow (`--policy-ref`): an edit of one reaches every
// running sandbox following it, and a trigger may swap a sandbox to one.

// ApplyNamed sets doc, generation gen of the tenant's policy name, on every
// running sandbox of the tenant that follows it (each gets a generation of
// its own), and returns their ids.
func (g *Registry) ApplyNamed(ctx context.Context, tenant, name string, doc *policy.Document, gen int64) ([]string, error) {
	var updated []string
	var errs []error
	for _, lp := range g.Following(tenant, name) {
		if _, err := lp.Set(ctx, doc.Clone(), 0, "policy:"+name, fmt.Sprintf("named policy %s generation %d", name, gen)); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", lp.ID, err))
			continue
		}
		updated = append(updated, lp.ID)
	}
	return updated, errors.Join(errs...)
}

// swapToNamed replaces the sandbox's policy by the tenant's named policy
// name, which it then follows (a trigger's `policy:` action).
func (s *Sandbox) swapToNamed(ctx context.Context, trigger, name string) error {
	np, err := s.g.cfg.Store.GetNamedPolicy(ctx, s.Tenant, name)
	if err != nil {
		return fmt.Errorf("policy %s: %w", name, err)
	}
	var doc policy.Document
	if err := json.Unmarshal(np.Document, &doc); err != nil {
		return fmt.Errorf("policy %s: %w", name, err)
	}
	_, err = s.Replace(ctx, &doc, 0, "trigger:"+trigger, "swap to named policy "+name, name)
	return err
}
