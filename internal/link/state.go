package link

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/cagebox/cagebox/internal/statedir"
)

const (
	stateFile    = "links.json"
	stateVersion = 1
)

type stateDoc struct {
	Version int     `json:"version"`
	Links   []*Link `json:"links"`
}

// loadState reads the allocation file; a missing file is an empty state.
func loadState(path string) ([]*Link, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("link: read state: %w", err)
	}
	var doc stateDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("link: parse state %s: %w", path, err)
	}
	if doc.Version != stateVersion {
		return nil, fmt.Errorf("link: state %s: unsupported version %d", path, doc.Version)
	}
	seen := map[string]bool{}
	for i, l := range doc.Links {
		if l == nil || l.ID == "" || l.HostIf == "" || l.NetNSPath == "" ||
			!l.Prefix.IsValid() || !l.HostAddr.IsValid() || !l.GuestAddr.IsValid() {
			return nil, fmt.Errorf("link: state %s: entry %d incomplete", path, i)
		}
		if seen[l.ID] {
			return nil, fmt.Errorf("link: state %s: duplicate sandbox %q", path, l.ID)
		}
		seen[l.ID] = true
	}
	return doc.Links, nil
}

// saveLocked writes the allocation file atomically. m.mu must be held.
func (m *Manager) saveLocked() error {
	if m.statePath == "" {
		return nil
	}
	doc := stateDoc{Version: stateVersion, Links: make([]*Link, 0, len(m.links))}
	for _, l := range m.links {
		doc.Links = append(doc.Links, l)
	}
	sort.Slice(doc.Links, func(i, j int) bool { return doc.Links[i].ID < doc.Links[j].ID })
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("link: encode state: %w", err)
	}
	dir := filepath.Dir(m.statePath)
	if err := statedir.Make(dir); err != nil {
		return fmt.Errorf("link: save state: %w", err)
	}
	f, err := os.CreateTemp(dir, stateFile+".tmp*")
	if err != nil {
		return fmt.Errorf("link: save state: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, m.statePath)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("link: save state: %w", err)
	}
	return nil
}
