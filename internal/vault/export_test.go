package vault

// NewSecret returns a Secret holding a copy of b (for the tests of package
// vault_test; the vault makes Secrets only from what it opens).
func NewSecret(b []byte) Secret { return newSecret(append([]byte(nil), b...)) }
