package rootfs

import (
	"fmt"
	"os"
	"strings"
)

// Paths cagebox writes in every guest, whatever runs it: the container
// runtimes write them from the host into the guest's writable root, the
// VM init (cagebox-agent as /init) from inside the VM.
const (
	// RunDir holds the agent's token (which the agent unlinks once read)
	// and the guest's base environment.
	RunDir    = "/.cagebox/run"
	TokenFile = RunDir + "/token"
	EnvFile   = RunDir + "/env"
	// CAPath and CABundlePath are the trusted CA (the egress gateway's
	// per-sandbox interception CA) and the image's bundle with it added;
	// SystemBundle (Debian's system bundle path) gets the same bundle.
	CAPath       = "/etc/cagebox/ca.crt"
	CABundlePath = "/etc/cagebox/ca-bundle.crt"
	SystemBundle = "/etc/ssl/certs/ca-certificates.crt"
	// DefaultHostname is a guest's hostname when its sandbox names none.
	DefaultHostname = "sandbox"
)

// MaxSystemBundle bounds what is read of the image's CA bundle.
const MaxSystemBundle = 8 << 20

// Guest is what a guest's files say about it.
type Guest struct {
	Hostname string
	// Nameserver is the guest's DNS server; empty leaves the image's
	// resolv.conf.
	Nameserver string
	// TrustedCAPEM is a CA certificate the guest must trust; empty adds
	// none.
	TrustedCAPEM []byte
}

// File is one file to write in a guest root.
type File struct {
	Path string // in the guest
	Data []byte
	Mode os.FileMode
}

// Hostname is h, or DefaultHostname when h is empty.
func Hostname(h string) string {
	if h == "" {
		return DefaultHostname
	}
	return h
}

// Files are the files every guest expects to find about itself: hostname,
// hosts, resolv.conf (when g has a nameserver) and the trusted CA files
// (when g has a CA: the CA, and the image's bundle read from root with the
// CA added, as cagebox's bundle and as the system bundle, which the
// writable layer takes; the image is untouched).
func (g Guest) Files(root string) []File {
	var system []byte
	if len(g.TrustedCAPEM) > 0 {
		system, _ = ReadFile(root, SystemBundle, MaxSystemBundle)
	}
	return g.FilesOver(system)
}

// FilesOver is Files with the image's system bundle given (read by the
// caller: the agent reads its own root).
func (g Guest) FilesOver(system []byte) []File {
	host := Hostname(g.Hostname)
	files := []File{
		{"/etc/hostname", []byte(host + "\n"), 0o644},
		{"/etc/hosts", []byte("127.0.0.1\tlocalhost " + host + "\n::1\tlocalhost ip6-localhost ip6-loopback\n"), 0o644},
	}
	if g.Nameserver != "" {
		files = append(files, File{"/etc/resolv.conf", []byte("nameserver " + g.Nameserver + "\noptions ndots:0 attempts:2 timeout:2\n"), 0o644})
	}
	if len(g.TrustedCAPEM) > 0 {
		bundle := string(system)
		if bundle != "" && !strings.HasSuffix(bundle, "\n") {
			bundle += "\n"
		}
		bundle += string(g.TrustedCAPEM)
		files = append(files,
			File{CAPath, g.TrustedCAPEM, 0o644},
			File{CABundlePath, []byte(bundle), 0o644},
			File{SystemBundle, []byte(bundle), 0o644})
	}
	return files
}

// EnvData is the content of EnvFile for env: one VAR=value a line.
func EnvData(env []string) []byte {
	var b []byte
	for _, kv := range env {
		b = append(b, kv...)
		b = append(b, '\n')
	}
	return b
}

// WriteGuest writes g's files, then extra, into root. Paths resolve inside
// root, so links in the image cannot point the writes elsewhere.
func WriteGuest(root string, g Guest, extra ...File) error {
	for _, f := range append(g.Files(root), extra...) {
		if err := WriteFile(root, f.Path, f.Data, f.Mode); err != nil {
			return fmt.Errorf("write guest file %s: %w", f.Path, err)
		}
	}
	return nil
}
