package substitute

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"

	"sort"
	"strings"

	"github.com/spf13/viper"
	gitleaks "github.com/zricethezav/gitleaks/v8/config"
	glregexp "github.com/zricethezav/gitleaks/v8/regexp"
)

// Rule set. The credential shapes come from gitleaks' maintained default
// rules (config.DefaultConfig of github.com/zricethezav/gitleaks/v8, pinned
// in go.mod), parsed and compiled by gitleaks' own config package; updating
// the rules is a version bump.
//
// Only gitleaks' config package is imported, not its detect package. detect
// pulls in about 60 more modules — archive decoders (7z, rar, xz, zstd,
// brotli, lz4), a terminal UI stack, git-diff parsing, template functions —
// none of which a request scanner needs, into the trusted daemon; its
// NewDetectorDefaultConfig reads through viper's process-global instance, and
// it logs each candidate secret at trace level through a global logger. The
// config package costs viper and its parsers (about 15 modules, pure Go).
// The matching loop below follows gitleaks' detectRule for content rules:
// keyword prefilter, regex, secret group, entropy threshold, global and
// per-rule allowlists (regexes with their target, stop words). Path-scoped
// rules and composite rules (none in the default set today) are left out:
// a request has no file path.

// Finding is a credential-shaped string seen in a request.
type Finding struct {
	Rule    string // "credential:" + gitleaks rule id, e.g. credential:github-pat
	Where   string // "header:Authorization", "query", "path" or "body"
	Preview string // "…" and the last 4 characters, never more
}

// Known tells the detector which strings are this sandbox's own
// placeholders, which look like credentials on purpose. *Set implements it.
type Known interface {
	IsPlaceholder(s string) bool
}

// Detector scans requests for credential-shaped strings. It is safe for
// concurrent use.
type Detector struct {
	rules  []detRule
	global []*gitleaks.Allowlist
}

type detRule struct {
	id       string
	re       *glregexp.Regexp
	keywords []string
	group    int
	entropy  float64
	allow    []*gitleaks.Allowlist
}

// NewDetector compiles gitleaks' default rules (about 80 ms).
func NewDetector() (*Detector, error) {
	v := viper.New() // a private instance: never viper's global one
	v.SetConfigType("toml")
	if err := v.ReadConfig(strings.NewReader(gitleaks.DefaultConfig)); err != nil {
		return nil, fmt.Errorf("substitute: reading gitleaks default rules: %w", err)
	}
	var vc gitleaks.ViperConfig
	if err := v.Unmarshal(&vc); err != nil {
		return nil, fmt.Errorf("substitute: reading gitleaks default rules: %w", err)
	}
	cfg, err := vc.Translate()
	if err != nil {
		return nil, fmt.Errorf("substitute: compiling gitleaks default rules: %w", err)
	}
	d := &Detector{global: cfg.Allowlists}
	ids := cfg.OrderedRules
	sort.Strings(ids)
	for _, id := range ids {
		r := cfg.Rules[id]
		if r.Regex == nil || r.Path != nil || r.SkipReport || len(r.RequiredRules) > 0 {
			continue
		}
		d.rules = append(d.rules, detRule{id: id, re: r.Regex, keywords: r.Keywords, group: r.SecretGroup, entropy: r.Entropy, allow: r.Allowlists})
	}
	if len(d.rules) == 0 {
		return nil, fmt.Errorf("substitute: gitleaks default config has no content rules")
	}
	return d, nil
}

// Rules returns the number of rules in use.
func (d *Detector) Rules() int { return len(d.rules) }

// Scan looks for credential-shaped strings in r's headers, query, path and
// the first limit bytes of its body (limit ≤ 0: no body), leaving out our
// own placeholders (known). Call it on the request as the guest sent it,
// before Apply puts real values in.
//
// r.Body is restored: it still yields the whole body, and r.ContentLength and
// framing are unchanged. Scanning the body reads up to limit bytes ahead,
// so a streaming client that waits for a response before sending more would
// stall until limit bytes or the end: leave the body out (limit ≤ 0) for
// such traffic.
func (d *Detector) Scan(r *http.Request, limit int64, known ...Known) ([]Finding, error) {
	var out []Finding
	seen := map[string]bool{}
	add := func(where, text string) {
		for _, f := range d.scanText(text, known) {
			key := f.rule + "\x00" + where + "\x00" + f.secret
			if seen[key] {
				continue
			}
			seen[key] = true
			out = append(out, Finding{Rule: "credential:" + f.rule, Where: where, Preview: preview(f.secret)})
		}
	}
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range r.Header[k] {
			add("header:"+k, k+": "+v)
		}
	}
	if u := r.URL; u != nil {
		if u.RawQuery != "" {
			add("query", u.RawQuery)
			if q, err := url.QueryUnescape(u.RawQuery); err == nil && q != u.RawQuery {
				add("query", q)
			}
		}
		if p := u.EscapedPath(); p != "" {
			add("path", p)
			if u.Path != p {
				add("path", u.Path)
			}
		}
	}
	if limit > 0 && r.Body != nil && r.Body != http.NoBody {
		head, err := io.ReadAll(io.LimitReader(r.Body, limit))
		complete := int64(len(head)) < limit || (r.ContentLength >= 0 && int64(len(head)) == r.ContentLength)
		restore(r, head, !complete || err != nil)
		if complete && err == nil {
			b := head
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		}
		if err != nil {
			return out, fmt.Errorf("substitute: reading request body: %w", err)
		}
		body := string(head)
		add("body", body)
		if strings.IndexByte(body, '%') >= 0 {
			if d := pctDecode(body); d != body {
				add("body", d)
			}
		}
		if strings.IndexByte(body, '\\') >= 0 {
			if d := jsUnescape(body); d != body {
				add("body", d)
			}
		}
	}
	return out, nil
}

type detFinding struct {
	rule, secret string
}

// scanText applies every rule to text the way gitleaks' detectRule does for
// a fragment's content.
func (d *Detector) scanText(text string, known []Known) []detFinding {
	if text == "" {
		return nil
	}
	lower := strings.ToLower(text)
	var out []detFinding
	for i := range d.rules {
		r := &d.rules[i]
		if len(r.keywords) > 0 {
			hit := false
			for _, k := range r.keywords {
				if strings.Contains(lower, k) {
					hit = true
					break
				}
			}
			if !hit {
				continue
			}
		}
		for _, m := range r.re.FindAllStringIndex(text, -1) {
			match := strings.Trim(text[m[0]:m[1]], "\n")
			secret := match
			if groups := r.re.FindStringSubmatch(match); len(groups) >= 2 {
				if r.group > 0 {
					if len(groups) <= r.group {
						continue
					}
					secret = groups[r.group]
				} else {
					for _, g := range groups[1:] {
						if g != "" {
							secret = g
							break
						}
					}
				}
			}
			if r.entropy != 0 && shannon(secret) <= r.entropy {
				continue
			}
			line := lineAt(text, m[0], m[1])
			if allowed(d.global, secret, match, line) || allowed(r.allow, secret, match, line) {
				continue
			}
			ours := false
			for _, k := range known {
				if k != nil && k.IsPlaceholder(secret) {
					ours = true
					break
				}
			}
			if !ours {
				out = append(out, detFinding{rule: r.id, secret: secret})
			}
		}
	}
	return out
}

// allowed mirrors gitleaks' checkFindingAllowed for a finding that has no
// commit and no file path.
func allowed(lists []*gitleaks.Allowlist, secret, match, line string) bool {
	for _, a := range lists {
		target := secret
		switch a.RegexTarget {
		case "match":
			target = match
		case "line":
			target = line
		}
		regexOK := a.RegexAllowed(target)
		stopOK, _ := a.ContainsStopWord(secret)
		if a.MatchCondition == gitleaks.AllowlistMatchAnd {
			ok := len(a.Commits) == 0 && len(a.Paths) == 0
			if len(a.Regexes) > 0 {
				ok = ok && regexOK
			}
			if len(a.StopWords) > 0 {
				ok = ok && stopOK
			}
			if ok {
				return true
			}
		} else if regexOK || stopOK {
			return true
		}
	}
	return false
}

func lineAt(text string, start, end int) string {
	s := strings.LastIndexByte(text[:start], '\n') + 1
	e := strings.IndexByte(text[end:], '\n')
	if e < 0 {
		return text[s:]
	}
	return text[s : end+e]
}

// shannon is the Shannon entropy of s in bits per character.
func shannon(s string) float64 {
	if s == "" {
		return 0
	}
	counts := map[rune]int{}
	for _, c := range s {
		counts[c]++
	}
	var h float64
	inv := 1 / float64(len(s))
	for _, n := range counts {
		f := float64(n) * inv
		h -= f * math.Log2(f)
	}
	return h
}

// preview shows the last 4 characters of a secret, or nothing when that
// would be too much of it.
func preview(secret string) string {
	if len(secret) < 12 {
		return "…"
	}
	return "…" + secret[len(secret)-4:]
}
