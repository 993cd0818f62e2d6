package daemon

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// sandboxGone: stopped and failed sandboxes take no deliveries and run no
// relays; running, asleep and unknown ones are not judged gone.
func TestSandboxGone(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := db.CreateTenant(ctx, &store.Tenant{ID: "t1", Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	gone := sandboxGone(db)
	for status, want := range map[string]string{
		sandbox.StatusCreating:   "",
		sandbox.StatusRunning:    "",
		sandbox.StatusPaused:     "",
		sandbox.StatusHibernated: "",
		sandbox.StatusStopped:    "stopped",
		sandbox.StatusFailed:     "failed",
	} {
		id := "sb-" + status
		if err := db.CreateSandbox(ctx, &store.Sandbox{ID: id, TenantID: "t1", Runtime: "container", Image: "debian", Status: status}); err != nil {
			t.Fatal(err)
		}
		if got, err := gone(ctx, id); err != nil || got != want {
			t.Errorf("a %s sandbox: %q %v, want %q", status, got, err, want)
		}
	}
	if got, err := gone(ctx, "sb-none"); err != nil || got != "" {
		t.Errorf("an unknown sandbox: %q %v, want not gone", got, err)
	}
}
