package substitute

import (
	"flag"
	"fmt"
	"math/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	gitleaks "github.com/zricethezav/gitleaks/v8/config"
)

var scanBefore = flag.Int("scan.before", 64<<10, "BenchmarkScanAdversarial: also time the quadratic scan it replaced for inputs up to this many bytes (it takes minutes at 256 KiB)")

// Adversarial inputs for the exfil scan: one header line with no newline,
// the shape of the 57 KiB header that once cost 6.7 s of daemon CPU.
var scanSizes = []int{1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}

const b64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// adversarial returns n bytes of the named kind, deterministically.
func adversarial(kind string, n int) string {
	rng := rand.New(rand.NewSource(int64(n)))
	rnd := func(k int, alpha string) string {
		b := make([]byte, k)
		for i := range b {
			b[i] = alpha[rng.Intn(len(alpha))]
		}
		return string(b)
	}
	var s strings.Builder
	for s.Len() < n {
		switch kind {
		case "kv-tokens": // many candidates for generic-api-key, each a finding
			s.WriteString("secret=" + rnd(32, b64Alphabet) + " ")
		case "near-miss": // keyword and value shape, too short or low entropy
			s.WriteString("api_key=abc123 token=aaaaaaaaaa ")
		case "base64-run": // one long run of base64 characters
			s.WriteString(rnd(4096, b64Alphabet))
		case "keywords": // every rule's keyword prefilter passes
			for _, k := range allKeywords() {
				s.WriteString(k + "=" + rnd(24, b64Alphabet) + " ")
			}
		default:
			panic(kind)
		}
	}
	return s.String()[:n]
}

// allKeywords lists the keywords of every rule in use.
func allKeywords() []string {
	d, err := NewDetector()
	if err != nil {
		panic(err)
	}
	var ks []string
	for _, r := range d.rules {
		ks = append(ks, r.keywords...)
	}
	return ks
}

var adversarialKinds = []string{"kv-tokens", "near-miss", "base64-run", "keywords"}

// BenchmarkScanAdversarial scans one request whose only header is an
// adversarial line of each size; MB/s is over the header's bytes. For inputs
// up to -scan.before bytes it also times, once, the scan this one replaced
// (legacyScanText) on the same line and reports before-ns/op and x-faster.
func BenchmarkScanAdversarial(b *testing.B) {
	d := testDetector(b)
	for _, kind := range adversarialKinds {
		for _, n := range scanSizes {
			b.Run(fmt.Sprintf("%s/%s", kind, sizeName(n)), func(b *testing.B) {
				v := adversarial(kind, n)
				r, _ := http.NewRequest("GET", "https://api.example/", nil)
				r.Header.Set("X-Data", v)
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					// Budgets large enough to measure the scan, not where
					// a budget stops it.
					res, err := d.ScanBudget(r, Budget{Bytes: 8 << 20, Time: time.Hour})
					if err != nil || !res.Complete {
						b.Fatal(err, res.Gap)
					}
				}
				after := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
				if n <= *scanBefore {
					start := time.Now()
					legacyScanText(d, "X-Data: "+v)
					before := float64(time.Since(start).Nanoseconds())
					b.ReportMetric(before, "before-ns/op")
					b.ReportMetric(before/after, "x-faster")
				}
			})
		}
	}
}

// legacyScanText is the scan as it was before it was made linear, kept to
// measure against: for each match it found the match's line by scanning
// back and forth from it, and ran the line-targeted allowlist regexes over
// the whole line again.
func legacyScanText(d *Detector, text string) int {
	lower := strings.ToLower(text)
	found := 0
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
			s := strings.LastIndexByte(text[:m[0]], '\n') + 1
			line := text[s:]
			if e := strings.IndexByte(text[m[1]:], '\n'); e >= 0 {
				line = text[s : m[1]+e]
			}
			if legacyAllowed(d.global, secret, match, line) || legacyAllowed(r.allow, secret, match, line) {
				continue
			}
			found++
		}
	}
	return found
}

func legacyAllowed(lists []*gitleaks.Allowlist, secret, match, line string) bool {
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

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
