package vault

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
)

// aadVersion names the layout of the additional data; change it (and keep
// the old one readable) if the layout ever changes.
const aadVersion = "cagebox-vault-aad-v1"

// aad is the additional authenticated data of a record: the layout
// version, tenant, name, value version and key ID, each length-prefixed so
// that no two different tuples encode alike.
func aad(tenant, name string, version int64, keyID string) []byte {
	b := make([]byte, 0, len(aadVersion)+len(tenant)+len(name)+len(keyID)+4*4+8)
	for _, s := range []string{aadVersion, tenant, name} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(version))
	b = binary.BigEndian.AppendUint32(b, uint32(len(keyID)))
	return append(b, keyID...)
}

// seal encrypts value into r under k, with a fresh nonce, binding r's
// Tenant, Name and Version. It sets r.KeyID, r.Nonce and r.Ciphertext.
func seal(k *MasterKey, r *Record, value []byte) error {
	nonce := make([]byte, NonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return fmt.Errorf("seal secret %q: %w", r.Name, err)
	}
	r.KeyID = k.ID
	r.Nonce = nonce
	r.Ciphertext = k.gcm().Seal(nil, nonce, value, aad(r.Tenant, r.Name, r.Version, k.ID))
	return nil
}

// open decrypts r with k. A record sealed under another key is
// ErrWrongKey (naming both IDs); one that fails authentication is
// ErrTampered. Neither error carries any plaintext.
func open(k *MasterKey, r *Record) ([]byte, error) {
	if r.KeyID != k.ID {
		return nil, fmt.Errorf("secret %q of tenant %q is sealed with master key %s, but this vault holds master key %s: %w",
			r.Name, r.Tenant, r.KeyID, k.ID, ErrWrongKey)
	}
	if len(r.Nonce) != NonceSize {
		return nil, fmt.Errorf("secret %q of tenant %q: nonce is %d bytes: %w", r.Name, r.Tenant, len(r.Nonce), ErrTampered)
	}
	pt, err := k.gcm().Open(nil, r.Nonce, r.Ciphertext, aad(r.Tenant, r.Name, r.Version, r.KeyID))
	if err != nil {
		return nil, fmt.Errorf("secret %q of tenant %q (version %d, master key %s) does not authenticate: it was altered, or copied from another secret or version: %w",
			r.Name, r.Tenant, r.Version, k.ID, ErrTampered)
	}
	return pt, nil
}
