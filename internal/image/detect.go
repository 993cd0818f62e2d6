package image

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// FallbackMirror is used when the host's apt sources name no Debian mirror
// for the suite.
const FallbackMirror = "http://deb.debian.org/debian"

// DetectSuite returns the host's Debian suite (VERSION_CODENAME from
// /etc/os-release).
func DetectSuite() (string, error) { return suiteFromOSRelease("/etc/os-release") }

// DetectMirror returns the host's configured apt mirror for suite: the first
// enabled "deb" source that lists exactly that suite, from
// /etc/apt/sources.list and /etc/apt/sources.list.d/*.list and *.sources
// (deb822). It falls back to FallbackMirror.
func DetectMirror(suite string) string { return mirrorFromApt("/etc/apt", suite) }

func suiteFromOSRelease(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("detect suite: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if ok && k == "VERSION_CODENAME" {
			v = strings.Trim(v, `"'`)
			if v != "" {
				return v, nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("detect suite: read %s: %w", path, err)
	}
	return "", fmt.Errorf("detect suite: no VERSION_CODENAME in %s (pass a suite explicitly)", path)
}

func mirrorFromApt(etcApt, suite string) string {
	files := []string{filepath.Join(etcApt, "sources.list")}
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", pat))
		sort.Strings(m)
		files = append(files, m...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var uri string
		if strings.HasSuffix(f, ".sources") {
			uri = mirrorDeb822(string(b), suite)
		} else {
			uri = mirrorOneLine(string(b), suite)
		}
		if uri != "" {
			return uri
		}
	}
	return FallbackMirror
}

// mirrorOneLine parses "deb [opts] URI SUITE COMPONENTS..." lines.
func mirrorOneLine(text, suite string) string {
	for line := range strings.Lines(text) {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // options, possibly spanning fields
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 && f[1] == suite && usableURI(f[0]) {
			return strings.TrimRight(f[0], "/")
		}
	}
	return ""
}

// mirrorDeb822 parses deb822 stanzas (Types:, URIs:, Suites:, Enabled:).
func mirrorDeb822(text, suite string) string {
	for _, stanza := range splitStanzas(text) {
		if strings.EqualFold(stanza["enabled"], "no") {
			continue
		}
		if !slices.Contains(strings.Fields(stanza["types"]), "deb") ||
			!slices.Contains(strings.Fields(stanza["suites"]), suite) {
			continue
		}
		for _, u := range strings.Fields(stanza["uris"]) {
			if usableURI(u) {
				return strings.TrimRight(u, "/")
			}
		}
	}
	return ""
}

func splitStanzas(text string) []map[string]string {
	var out []map[string]string
	cur := map[string]string{}
	last := ""
	flush := func() {
		if len(cur) > 0 {
			out = append(out, cur)
		}
		cur, last = map[string]string{}, ""
	}
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case strings.HasPrefix(line, "#"):
		case line[0] == ' ' || line[0] == '\t': // continuation
			if last != "" {
				cur[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			cur[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}

func usableURI(u string) bool {
	return strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "file:/")
}

var errNoRoot = errors.New("building a debootstrap image needs root (debootstrap chroots and creates device nodes)")
