// Package runlog is the log file a runtime keeps of what its guest or VMM
// writes (a container's agent.log, a VM's console.log or vmm.log): opened
// for appending by the process that writes it, and its tail quoted in
// error messages.
package runlog

import (
	"io"
	"os"
	"strings"
)

// Open opens (creating) the log at path for appending, readable by root
// only.
func Open(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
}

// Tail is the last n bytes of the log at path, trimmed ("" when it cannot
// be read). Only those bytes are read, however long the log is.
func Tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		if _, err := f.Seek(fi.Size()-n, io.SeekStart); err != nil {
			return ""
		}
	}
	b := make([]byte, n)
	k, _ := io.ReadFull(f, b)
	return strings.TrimSpace(string(b[:k]))
}
