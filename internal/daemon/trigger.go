package daemon

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/vault"
)

// triggerAct carries out what a policy trigger asks of the vault and the
// sandbox manager (livepolicy.Config.Act): revoke or unbind secrets,
// pause. (The document's edits and a swap to a named policy are
// livepolicy's own.)
func triggerAct(ctx context.Context, st store.Store, v *vault.Vault, mgr *sandbox.Manager, id, trigger string, a policy.TriggerAction) error {
	if mgr == nil {
		return errors.New("the daemon is still starting")
	}
	rec, err := st.GetSandbox(ctx, "", id)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range a.Revoke {
		if v == nil {
			errs = append(errs, fmt.Errorf("revoke %s: no vault", name))
			continue
		}
		if err := v.Revoke(ctx, rec.TenantID, name); err != nil {
			errs = append(errs, fmt.Errorf("revoke %s: %w", name, err))
			continue
		}
		mgr.Emit(rec.TenantID, "", api.SecretRevoked{Name: name, By: "trigger:" + trigger})
	}
	for _, name := range a.Unbind {
		if _, err := mgr.Secrets().Unbind(ctx, "", id, name); err != nil {
			errs = append(errs, fmt.Errorf("unbind %s: %w", name, err))
		}
	}
	if a.Pause {
		// The policy is the tenant's, and so is the pause it makes.
		if _, err := mgr.Pause(ctx, rec.TenantID, id); err != nil {
			errs = append(errs, fmt.Errorf("pause: %w", err))
		}
	}
	return errors.Join(errs...)
}

// webhookKey returns the daemon's approval-webhook key, made on first use
// (32 random bytes, 0600 in the daemon's home). Nobody is given it: each
// tenant's requests are signed with a key derived from it
// (livepolicy.WebhookKey), which GET /v1/approvals/webhook-key shows.
func webhookKey(home string) ([]byte, error) {
	p := filepath.Join(home, "approval-webhook.key")
	b, err := os.ReadFile(p)
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("approval webhook key: %w", err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	enc := []byte(fmt.Sprintf("%x", key))
	if err := os.WriteFile(p, enc, 0o600); err != nil {
		return nil, fmt.Errorf("approval webhook key: %w", err)
	}
	return enc, nil
}
