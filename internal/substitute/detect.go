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
	"time"

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

// Budget bounds the work of one scan. The scan is linear in the bytes it
// examines, and these bounds keep one request from holding the gateway: past
// either budget the scan stops and ScanResult says what it left out.
type Budget struct {
	// Bytes bounds the text examined: header lines, path, query and body,
	// each decoded form counted again (≤ 0: DefaultScanBytes).
	Bytes int64
	// Time bounds the scan's wall-clock time (≤ 0: DefaultScanTime). It is
	// checked between rules, so a scan overruns it by at most one rule's
	// pass over at most Bytes bytes.
	Time time.Duration
	// Body is how many body bytes are read ahead and scanned (≤ 0: the body
	// is not read).
	Body int64
}

// Default scan budgets. The slowest of gitleaks' default rules
// (generic-api-key) runs at about 1 MB/s over text that keeps its keyword
// prefilter busy, so the byte budget bounds a scan to about a second of CPU
// in the worst case and the time budget cuts that to a quarter.
const (
	DefaultScanBytes = 1 << 20
	DefaultScanTime  = 250 * time.Millisecond
	DefaultScanBody  = 64 << 10
)

// Limits that end a scan early (ScanResult.Limit).
const (
	LimitBytes = "bytes" // Budget.Bytes was spent
	LimitTime  = "time"  // Budget.Time ran out
	LimitBody  = "body"  // the body was longer than Budget.Body, or not read
)

// ScanResult is what a scan found and what it could not look at.
type ScanResult struct {
	Findings []Finding
	// Complete is true when every byte of the request was scanned.
	Complete bool
	// Limit names what stopped the scan ("" when Complete).
	Limit string
	// Gap says what was left unscanned and why, for events and refusals,
	// e.g. "body after the first 65536 bytes".
	Gap string
	// Scanned counts the bytes of text examined.
	Scanned int64

	work int64 // see scan.work
}

// ScanBudget looks for credential-shaped strings in r's headers, query, path
// and the first b.Body bytes of its body, leaving out our own placeholders
// (known). Call it on the request as the guest sent it, before Apply puts
// real values in.
//
// r.Body is restored: it still yields the whole body, and r.ContentLength and
// framing are unchanged. Scanning the body reads up to b.Body bytes ahead,
// so a streaming client that waits for a response before sending more would
// stall until b.Body bytes or the end: leave the body out (b.Body ≤ 0) for
// such traffic. An error (reading the body) comes with what was found so
// far; the result is then not Complete.
func (d *Detector) ScanBudget(r *http.Request, b Budget, known ...Known) (ScanResult, error) {
	if b.Bytes <= 0 {
		b.Bytes = DefaultScanBytes
	}
	if b.Time <= 0 {
		b.Time = DefaultScanTime
	}
	s := &scan{d: d, known: known, left: b.Bytes, deadline: time.Now().Add(b.Time), seen: map[string]bool{}}
	res := s.request(r, b.Body)
	res.Findings, res.Scanned, res.work = s.out, b.Bytes-s.left, s.work
	if s.limit != "" {
		res.Complete, res.Limit, res.Gap = false, s.limit, s.gap
	}
	return res, s.err
}

// scan is one request's scan: its budget and what it found so far.
type scan struct {
	d        *Detector
	known    []Known
	left     int64 // bytes of text the budget still allows
	deadline time.Time
	limit    string // set once the scan stopped early
	gap      string
	err      error
	out      []Finding
	seen     map[string]bool
	// work counts the bytes handed to regular expressions, which is where
	// a scan's time goes (tests check it grows linearly).
	work int64
}

// stop records why the scan ends early; a spent budget outranks a body
// that was only partly read, since it also cut the scan of what was read.
func (s *scan) stop(limit, gap string) {
	if s.limit == "" || (s.limit == LimitBody && limit != LimitBody) {
		s.limit, s.gap = limit, gap
	}
}

func (s *scan) request(r *http.Request, bodyLimit int64) ScanResult {
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range r.Header[k] {
			s.add("header:"+k, k+": "+v)
		}
	}
	if u := r.URL; u != nil {
		if u.RawQuery != "" {
			s.add("query", u.RawQuery)
			if q, err := url.QueryUnescape(u.RawQuery); err == nil && q != u.RawQuery {
				s.add("query", q)
			}
		}
		if p := u.EscapedPath(); p != "" {
			s.add("path", p)
			if u.Path != p {
				s.add("path", u.Path)
			}
		}
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return ScanResult{Complete: s.limit == ""}
	}
	if bodyLimit <= 0 {
		s.stop(LimitBody, "body (not read ahead)")
		return ScanResult{}
	}
	if s.limit != "" {
		return ScanResult{} // the budget is spent: do not read the body for nothing
	}
	head, err := io.ReadAll(io.LimitReader(r.Body, bodyLimit))
	complete := int64(len(head)) < bodyLimit || (r.ContentLength >= 0 && int64(len(head)) == r.ContentLength)
	restore(r, head, !complete || err != nil)
	if complete && err == nil {
		b := head
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	if err != nil {
		s.err = fmt.Errorf("substitute: reading request body: %w", err)
		s.stop(LimitBody, "body (reading it failed)")
		return ScanResult{}
	}
	if !complete {
		s.stop(LimitBody, fmt.Sprintf("body after the first %d bytes", bodyLimit))
	}
	body := string(head)
	s.add("body", body)
	if strings.IndexByte(body, '%') >= 0 {
		if d := pctDecode(body); d != body {
			s.add("body", d)
		}
	}
	if strings.IndexByte(body, '\\') >= 0 {
		if d := jsUnescape(body); d != body {
			s.add("body", d)
		}
	}
	return ScanResult{Complete: s.limit == ""}
}

// add scans one text within what is left of the budget.
func (s *scan) add(where, text string) {
	if s.limit == LimitBytes || s.limit == LimitTime || text == "" {
		return
	}
	if int64(len(text)) > s.left {
		text = text[:s.left]
		s.stop(LimitBytes, fmt.Sprintf("%s after the scan's byte budget", where))
	}
	s.left -= int64(len(text))
	for _, f := range s.text(text) {
		key := f.rule + "\x00" + where + "\x00" + f.secret
		if s.seen[key] {
			continue
		}
		s.seen[key] = true
		s.out = append(s.out, Finding{Rule: "credential:" + f.rule, Where: where, Preview: preview(f.secret)})
	}
	if s.limit == LimitTime {
		s.gap = where + " and what follows, after the scan's time budget"
	}
}

type detFinding struct {
	rule, secret string
}

// text applies every rule to text the way gitleaks' detectRule does for a
// fragment's content, in time linear in len(text): each rule's regex passes
// over the text once, its matches do not overlap, and the line around a
// match (for allowlists that look at the line) is found by binary search
// and judged once per line, not once per match.
func (s *scan) text(text string) []detFinding {
	lower := strings.ToLower(text)
	ln := lines{text: text, work: &s.work}
	var out []detFinding
	for i := range s.d.rules {
		r := &s.d.rules[i]
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
		if time.Now().After(s.deadline) {
			s.stop(LimitTime, "")
			return out
		}
		s.work += int64(len(text))
		for _, m := range r.re.FindAllStringIndex(text, -1) {
			match := strings.Trim(text[m[0]:m[1]], "\n")
			secret := match
			s.work += int64(len(match))
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
			if ln.allowed(s.d.global, secret, match, m[0], m[1]) || ln.allowed(r.allow, secret, match, m[0], m[1]) {
				continue
			}
			ours := false
			for _, k := range s.known {
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

// lines finds the line around a match and remembers, per allowlist and
// line, whether a line-targeted allowlist allows it. Without that, a long
// line with many matches costs one regex pass over the line per match:
// quadratic (a 57 KiB header once cost 6.7 s).
type lines struct {
	text string
	nl   []int // offsets of '\n', computed on first use
	done bool
	memo map[lineKey]bool
	work *int64
}

type lineKey struct {
	list       *gitleaks.Allowlist
	start, end int
}

// span returns the bounds of the line(s) holding text[start:end], as
// gitleaks takes a finding's line: from after the last newline before start
// to the first newline at or after end.
func (l *lines) span(start, end int) (int, int) {
	if !l.done {
		l.done = true
		for i := strings.IndexByte(l.text, '\n'); i >= 0; {
			l.nl = append(l.nl, i)
			j := strings.IndexByte(l.text[i+1:], '\n')
			if j < 0 {
				break
			}
			i += 1 + j
		}
	}
	s, e := 0, len(l.text)
	if i := sort.SearchInts(l.nl, start); i > 0 {
		s = l.nl[i-1] + 1
	}
	if j := sort.SearchInts(l.nl, end); j < len(l.nl) {
		e = l.nl[j]
	}
	return s, e
}

// allowed mirrors gitleaks' checkFindingAllowed for a finding that has no
// commit and no file path.
func (l *lines) allowed(lists []*gitleaks.Allowlist, secret, match string, start, end int) bool {
	for _, a := range lists {
		var regexOK bool
		switch a.RegexTarget {
		case "match":
			*l.work += int64(len(match))
			regexOK = a.RegexAllowed(match)
		case "line":
			s, e := l.span(start, end)
			k := lineKey{a, s, e}
			ok, seen := l.memo[k]
			if !seen {
				*l.work += int64(e - s)
				ok = a.RegexAllowed(l.text[s:e])
				if l.memo == nil {
					l.memo = map[lineKey]bool{}
				}
				l.memo[k] = ok
			}
			regexOK = ok
		default:
			*l.work += int64(len(secret))
			regexOK = a.RegexAllowed(secret)
		}
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
