// Package vault keeps the secrets that the egress gateway substitutes for
// placeholders: each value is sealed with AES-256-GCM under a master key
// that lives outside the database (a 0600 key file, or an environment
// variable), so a copy of the database alone reveals nothing but the
// metadata and a 4-character preview of each value.
//
// Sealing. Every seal draws a fresh random 96-bit nonce. The additional
// authenticated data binds the tenant, the secret's name, its version and
// the master key's ID, so a ciphertext copied to another tenant or name, or
// rolled back to another version's row, fails to open (ErrTampered), and a
// vault holding the wrong master key fails closed with ErrWrongKey naming
// both key IDs — never the key bytes.
//
// Values never leave the package except through Vault.Value, as a Secret,
// whose String, Format, GoString, LogValue, MarshalJSON and MarshalText all
// print "REDACTED". No error, log line or panic of this package contains a
// value: validation errors describe the value by its length only.
//
// Persistence is behind the small Backend interface, so the daemon adapts
// its store to it; MemBackend keeps records in memory and package
// vault/sqlitebackend keeps them in SQLite. Package vault/vaulttest is the
// conformance suite every Backend must pass.
//
// Concurrency. A Vault serialises its read-modify-write operations (Put,
// Rotate, Revoke, Delete) per secret, so that for example a Revoke racing
// a Rotate cannot be undone by it, and takes an exclusive lock for
// Vault.RotateMasterKey. Those guarantees hold for one Vault per backend;
// the package-level RotateMasterKey must run while nothing else writes to
// the backend (the daemon stopped), or through Vault.RotateMasterKey.
package vault
