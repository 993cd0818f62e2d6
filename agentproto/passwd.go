package agentproto

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// etcDir is where the guest's passwd and group files are; tests change it.
var etcDir = "/etc"

type passwdEntry struct {
	Name     string
	UID, GID uint32
	Home     string
	Shell    string
}

type groupEntry struct {
	Name    string
	GID     uint32
	Members []string
}

// userInfo is who a process runs as.
type userInfo struct {
	Name     string // empty when the user has no passwd entry
	UID, GID uint32
	Groups   []uint32 // supplementary groups
	Home     string   // empty when unknown
	Shell    string   // login shell; empty when unknown
}

// parsePasswd parses passwd(5) lines; malformed lines are skipped.
func parsePasswd(r io.Reader) ([]passwdEntry, error) {
	var out []passwdEntry
	err := eachLine(r, func(line string) {
		f := strings.Split(line, ":")
		if len(f) < 7 || f[0] == "" {
			return
		}
		uid, err1 := parseID(f[2])
		gid, err2 := parseID(f[3])
		if err1 != nil || err2 != nil {
			return
		}
		out = append(out, passwdEntry{Name: f[0], UID: uid, GID: gid, Home: f[5], Shell: f[6]})
	})
	return out, err
}

// parseGroup parses group(5) lines; malformed lines are skipped.
func parseGroup(r io.Reader) ([]groupEntry, error) {
	var out []groupEntry
	err := eachLine(r, func(line string) {
		f := strings.Split(line, ":")
		if len(f) < 4 || f[0] == "" {
			return
		}
		gid, err := parseID(f[2])
		if err != nil {
			return
		}
		g := groupEntry{Name: f[0], GID: gid}
		for _, m := range strings.Split(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				g.Members = append(g.Members, m)
			}
		}
		out = append(out, g)
	})
	return out, err
}

func eachLine(r io.Reader, fn func(string)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		fn(line)
	}
	return sc.Err()
}

// parseID parses a uid or gid; -1 (4294967295) is not a valid id.
func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, fmt.Errorf("bad id %q", s)
	}
	return uint32(n), nil
}

func isNumeric(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// resolveUser resolves "user" or "user:group", where each part is a name or
// a number. A numeric user without a passwd entry gets the group with its
// own number (not root's group) and no supplementary groups.
func resolveUser(spec string, users []passwdEntry, groups []groupEntry) (*userInfo, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return nil, fmt.Errorf("bad user %q: %w", spec, ErrInvalid)
	}
	var u userInfo
	var pw *passwdEntry
	if isNumeric(userPart) {
		uid, err := parseID(userPart)
		if err != nil {
			return nil, fmt.Errorf("bad user %q: %w", spec, ErrInvalid)
		}
		for i := range users {
			if users[i].UID == uid {
				pw = &users[i]
				break
			}
		}
		u.UID, u.GID = uid, uid
	} else {
		for i := range users {
			if users[i].Name == userPart {
				pw = &users[i]
				break
			}
		}
		if pw == nil {
			return nil, fmt.Errorf("unknown user %q: no matching entry in passwd", userPart)
		}
		u.UID = pw.UID
	}
	if pw != nil {
		u.Name, u.GID, u.Home, u.Shell = pw.Name, pw.GID, pw.Home, pw.Shell
		for _, g := range groups {
			for _, m := range g.Members {
				if m == pw.Name && g.GID != u.GID {
					u.Groups = append(u.Groups, g.GID)
					break
				}
			}
		}
	}
	if hasGroup {
		if isNumeric(groupPart) {
			gid, err := parseID(groupPart)
			if err != nil {
				return nil, fmt.Errorf("bad group in %q: %w", spec, ErrInvalid)
			}
			u.GID = gid
		} else {
			found := false
			for _, g := range groups {
				if g.Name == groupPart {
					u.GID, found = g.GID, true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("unknown group %q: no matching entry in group", groupPart)
			}
		}
	}
	return &u, nil
}

// lookupUser resolves spec against the guest's passwd and group files. A
// missing file counts as empty.
func lookupUser(spec string) (*userInfo, error) {
	users, err := readDB(filepath.Join(etcDir, "passwd"), parsePasswd)
	if err != nil {
		return nil, err
	}
	groups, err := readDB(filepath.Join(etcDir, "group"), parseGroup)
	if err != nil {
		return nil, err
	}
	return resolveUser(spec, users, groups)
}

func readDB[T any](path string, parse func(io.Reader) ([]T, error)) ([]T, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out, err := parse(f)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return out, nil
}
