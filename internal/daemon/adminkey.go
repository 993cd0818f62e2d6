package daemon

import (
	"crypto/subtle"
	"fmt"
	"io"
	"os"
	"strings"
)

// MinAdminKeyLen is the shortest fleet admin key accepted (after trimming
// whitespace): a key that short is guessable over the network.
const MinAdminKeyLen = 32

// maxAdminKeyFile bounds what is read of --admin-key-file.
const maxAdminKeyFile = 64 << 10

// LoadAdminKey reads the fleet admin key from path (--admin-key-file; in
// Kubernetes a Secret mounted as a file) and returns its SHA-256 digest,
// the only form the daemon keeps. The key itself never appears in an
// error or a log line.
func LoadAdminKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--admin-key-file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxAdminKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("--admin-key-file: %w", err)
	}
	if len(b) > maxAdminKeyFile {
		return nil, fmt.Errorf("--admin-key-file %s: longer than %d bytes: it should hold one key", path, maxAdminKeyFile)
	}
	key := strings.TrimSpace(string(b))
	if len(key) < MinAdminKeyLen {
		return nil, fmt.Errorf("--admin-key-file %s: the key is %d characters after trimming whitespace; it must be at least %d (make one with `head -c 32 /dev/urandom | base64`)", path, len(key), MinAdminKeyLen)
	}
	if strings.ContainsAny(key, "\r\n\t ") {
		return nil, fmt.Errorf("--admin-key-file %s: the key contains whitespace or several lines: the file should hold one key", path)
	}
	return HashKey(key), nil
}

// isAdminKey reports whether key is the fleet admin key (a constant-time
// comparison of SHA-256 digests).
func (s *Server) isAdminKey(key string) bool {
	if len(s.adminKey) == 0 {
		return false
	}
	return subtle.ConstantTimeCompare(HashKey(key), s.adminKey) == 1
}

// SetAdminKey makes the key whose SHA-256 digest is digest (LoadAdminKey)
// the admin's over TCP, as the unix socket is.
func (s *Server) SetAdminKey(digest []byte) { s.adminKey = digest }
