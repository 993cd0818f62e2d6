package vault_test

import (
	"testing"

	"github.com/cagebox/cagebox/internal/vault"
	"github.com/cagebox/cagebox/internal/vault/vaulttest"
)

func TestMemBackend(t *testing.T) {
	vaulttest.TestBackend(t, func(t *testing.T) vault.Backend { return vault.NewMemBackend() })
}
