package vault

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// KeySize is the length of a master key: AES-256.
const KeySize = 32

// MasterKey is the key every record is sealed under. It prints (String,
// Format, LogValue) as its ID only. The key material sits two pointers
// deep, so that even fmt's reflection over a struct holding a MasterKey
// (where it cannot call these methods, and dumps a pointer it cannot
// format with the verb at hand) prints addresses, not bytes.
type MasterKey struct {
	// ID is the first 16 hex digits of sha256(key). It names the key in
	// records and errors; it is not the key.
	ID string
	m  *keyMaterial
}

type keyMaterial struct {
	aead cipher.AEAD // holds the expanded key
}

// gcm returns the key's AEAD, or nil for a MasterKey not made by this
// package.
func (k *MasterKey) gcm() cipher.AEAD {
	if k == nil || k.m == nil {
		return nil
	}
	return k.m.aead
}

// NewKey returns the master key with these 32 bytes.
func NewKey(raw []byte) (*MasterKey, error) {
	if len(raw) != KeySize {
		return nil, fmt.Errorf("master key is %d bytes, want %d: %w", len(raw), KeySize, ErrInvalid)
	}
	sum := sha256.Sum256(raw)
	k := &MasterKey{ID: hex.EncodeToString(sum[:8]), m: &keyMaterial{}}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, fmt.Errorf("master key %s: %w", k.ID, err)
	}
	if k.m.aead, err = cipher.NewGCM(block); err != nil {
		return nil, fmt.Errorf("master key %s: %w", k.ID, err)
	}
	return k, nil
}

// GenerateKey returns a new random master key.
func GenerateKey() (*MasterKey, error) {
	var raw [KeySize]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("generate master key: %w", err)
	}
	defer clear(raw[:])
	return NewKey(raw[:])
}

// String implements fmt.Stringer: the key's ID, never its bytes.
func (k MasterKey) String() string { return "master key " + k.ID }

// GoString implements fmt.GoStringer.
func (k MasterKey) GoString() string { return k.String() }

// Format implements fmt.Formatter for every verb, so that not even %#v
// reaches the key bytes.
func (k MasterKey) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, k.String()) }

// LogValue implements slog.LogValuer.
func (k MasterKey) LogValue() slog.Value { return slog.StringValue(k.String()) }

// LoadOrCreateKeyFile returns the master key in the file at path, creating
// the file (and its parent directory, mode 0700) with a new random key if
// it does not exist.
//
// Format: the file holds the 32-byte key as 64 hex digits followed by a
// newline (written so), or — also accepted when reading — exactly 32 raw
// bytes. A file that is not a regular file, is readable or writable by
// group or others, is owned by another user, or has any other size is
// refused, and the error says what to do. A new file is written to a
// temporary name, synced and then linked into place, so a crash never
// leaves a truncated key, and two processes starting at once agree on one
// key.
func LoadOrCreateKeyFile(path string) (*MasterKey, error) {
	if path == "" {
		return nil, fmt.Errorf("master key file: empty path: %w", ErrInvalid)
	}
	k, err := readKeyFile(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if err := createKeyFile(path); err != nil {
		return nil, err
	}
	return readKeyFile(path)
}

func readKeyFile(path string) (*MasterKey, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("master key file %s is a symbolic link; give the path of the file itself", path)
		}
		return nil, fmt.Errorf("master key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("master key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("master key file %s is not a regular file (mode %v)", path, fi.Mode())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("master key file %s has mode %04o, readable or writable by others; run chmod 600 %s (and consider the key exposed)", path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("master key file %s is owned by uid %d, not by this process (uid %d); chown it", path, st.Uid, os.Geteuid())
	}
	size := fi.Size()
	if size != KeySize && size != 2*KeySize && size != 2*KeySize+1 {
		return nil, fmt.Errorf("master key file %s is %d bytes; want %d hex digits (and a newline) or %d raw bytes", path, size, 2*KeySize, KeySize)
	}
	buf := make([]byte, size)
	defer clear(buf)
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, fmt.Errorf("master key file %s: %w", path, err)
	}
	raw := buf
	if size != KeySize {
		hexPart := buf[:2*KeySize]
		if size == 2*KeySize+1 && buf[size-1] != '\n' {
			return nil, fmt.Errorf("master key file %s: %d bytes but not %d hex digits and a newline", path, size, 2*KeySize)
		}
		dec := make([]byte, KeySize)
		defer clear(dec)
		if _, err := hex.Decode(dec, hexPart); err != nil {
			return nil, fmt.Errorf("master key file %s: %d bytes but not hex digits", path, size)
		}
		raw = dec
	}
	k, err := NewKey(raw)
	if err != nil {
		return nil, fmt.Errorf("master key file %s: %w", path, err)
	}
	return k, nil
}

func createKeyFile(path string) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create master key file: %w", err)
	}
	var raw [KeySize]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return fmt.Errorf("create master key file: %w", err)
	}
	text := make([]byte, 2*KeySize+1)
	hex.Encode(text, raw[:])
	text[2*KeySize] = '\n'
	defer clear(raw[:])
	defer clear(text)

	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create master key file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("create master key file: %w", err)
	}
	if _, err := tmp.Write(text); err != nil {
		tmp.Close()
		return fmt.Errorf("create master key file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("create master key file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("create master key file: %w", err)
	}
	// Link fails if another process created the file meanwhile; then its
	// key is the key.
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create master key file: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// KeyFromEnv returns the master key held in the environment variable name,
// as 64 hex digits or as base64 (standard or URL alphabet, padded or not)
// of 32 bytes. Errors never include the variable's contents. It leaves the
// variable set: a daemon should os.Unsetenv it once it has the key, so
// that the processes it starts do not inherit it.
func KeyFromEnv(name string) (*MasterKey, error) {
	s, ok := os.LookupEnv(name)
	if !ok || s == "" {
		return nil, fmt.Errorf("master key: environment variable %s is not set: %w", name, ErrInvalid)
	}
	s = strings.TrimSpace(s)
	var raw []byte
	if len(s) == 2*KeySize {
		if b, err := hex.DecodeString(s); err == nil {
			raw = b
		}
	}
	if raw == nil {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if b, err := enc.DecodeString(s); err == nil && len(b) == KeySize {
				raw = b
				break
			}
		}
	}
	if raw == nil {
		return nil, fmt.Errorf("master key: environment variable %s holds %d characters, not %d hex digits or the base64 of %d bytes: %w",
			name, len(s), 2*KeySize, KeySize, ErrInvalid)
	}
	defer clear(raw)
	return NewKey(raw)
}
