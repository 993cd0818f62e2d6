package docs_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// binaryMagics are the first bytes of build outputs: executables and
// objects (ELF, PE, Mach-O in both byte orders and universal), static
// archives (.a) and Go's own object files.
var binaryMagics = [][]byte{
	[]byte("\x7fELF"),
	[]byte("MZ"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf},
	{0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
	[]byte("!<arch>\n"),
	[]byte("go object "),
}

// TestNoBuildOutputsTracked fails when git tracks a build output: a file
// whose first bytes are an executable's, object's or archive's, a compiled
// test binary (*.test), a coverage or CPU profile, or anything under a
// bin/ folder (make build's outputs). A source tree holds sources; a 31 MB
// test binary was once committed by accident. Skipped outside a git
// checkout (a source tarball has no index to check).
func TestNoBuildOutputsTracked(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	root := filepath.Join("..")
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Skipf("not a git checkout: %s", bytes.TrimSpace(ee.Stderr))
		}
		t.Skipf("git ls-files: %v", err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	if len(files) < 10 {
		t.Fatalf("git ls-files listed %d files; is %s the repository?", len(files), root)
	}
	var bad []string
	for _, f := range files {
		if f == "" {
			continue
		}
		if why := buildOutput(filepath.Join(root, f), f); why != "" {
			bad = append(bad, f+" ("+why+")")
		}
	}
	if len(bad) > 0 {
		t.Fatalf("build outputs are tracked (git rm --cached them; .gitignore should cover them):\n  %s", strings.Join(bad, "\n  "))
	}
}

// buildOutput says why the tracked file rel (at path) is a build output,
// or "" when it is not.
func buildOutput(path, rel string) string {
	name := filepath.Base(rel)
	switch {
	case strings.HasSuffix(name, ".test"):
		return "a compiled test binary"
	case strings.HasSuffix(name, ".prof") || name == "coverage.out" || strings.HasSuffix(name, ".cover.out"):
		return "a profile"
	case rel == "bin" || strings.HasPrefix(rel, "bin/") || strings.Contains(rel, "/bin/"):
		return "under a bin/ folder"
	}
	f, err := os.Open(path)
	if err != nil {
		return "" // deleted in the work tree but still in the index: git status shows it
	}
	defer f.Close()
	head := make([]byte, 16)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	for _, m := range binaryMagics {
		if bytes.HasPrefix(head, m) {
			if string(m) == "MZ" && !isPE(path) {
				continue // text that happens to start with "MZ"
			}
			return "binary: starts with " + strings.TrimSpace(strings.ToValidUTF8(string(m), "?"))
		}
	}
	return ""
}

// isPE reports whether path is a Windows executable: "MZ", and at the
// offset found at 0x3c, "PE\0\0".
func isPE(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 0x40 {
		return false
	}
	off := int(b[0x3c]) | int(b[0x3d])<<8 | int(b[0x3e])<<16 | int(b[0x3f])<<24
	return off >= 0 && off+4 <= len(b) && string(b[off:off+4]) == "PE\x00\x00"
}
