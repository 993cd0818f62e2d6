package substitute

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
)

// MinPlaceholderBits is the least randomness a placeholder carries. It is
// what makes a placeholder unique (per sandbox and binding) and what makes a
// match in traffic unambiguous.
const MinPlaceholderBits = 80

// prefixes are the well-known leading markers of credentials; a placeholder
// keeps the one its real value starts with, so that tools and SDKs that check
// the shape of a key accept it. Longest first (sorted in init).
var prefixes = []string{
	// GitHub
	"github_pat_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_",
	// OpenAI, Anthropic
	"sk-proj-", "sk-svcacct-", "sk-admin-", "sk-ant-api03-", "sk-ant-admin01-", "sk-ant-", "sk-",
	// Stripe
	"sk_live_", "sk_test_", "pk_live_", "pk_test_", "rk_live_", "rk_test_", "whsec_",
	// Slack
	"xoxb-", "xoxp-", "xoxa-", "xoxr-", "xoxs-", "xoxe-", "xapp-",
	// AWS, Google
	"AKIA", "ASIA", "AIza", "ya29.", "GOCSPX-",
	// GitLab
	"glpat-", "gldt-", "glrt-", "glptt-", "gloas-",
	// Hugging Face, npm, PyPI, RubyGems
	"hf_", "api_org_", "npm_", "pypi-", "rubygems_",
	// DigitalOcean, SendGrid, Shopify, Linear, Figma, Databricks, Doppler,
	// Twilio, Mailgun, Postman, Atlassian, Grafana, Sentry, Notion, Pulumi,
	// Vercel, Cloudflare, Supabase, Replicate, Groq, Tavily, JWT
	"dop_v1_", "doo_v1_", "dor_v1_", "SG.", "shpat_", "shpss_", "shpca_", "shppa_",
	"lin_api_", "figd_", "dapi", "dp.st.", "dp.pt.", "SK", "key-", "PMAK-", "ATATT",
	"glc_", "glsa_", "sntrys_", "sntryu_", "secret_", "ntn_", "pul-", "vcp_",
	"sbp_", "r8_", "gsk_", "tvly-", "eyJ",
}

func init() {
	sort.SliceStable(prefixes, func(i, j int) bool { return len(prefixes[i]) > len(prefixes[j]) })
}

// prefixOf returns the recognised prefix real starts with, or "". A prefix
// must leave at least 8 characters after it to count.
func prefixOf(real []byte) string {
	for _, p := range prefixes {
		if len(real) >= len(p)+8 && bytes.HasPrefix(real, []byte(p)) {
			return p
		}
	}
	return ""
}

// Alphabets a placeholder draws from.
const (
	digits   = "0123456789"
	lower    = "abcdefghijklmnopqrstuvwxyz"
	upper    = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	hexLower = "0123456789abcdef"
	hexUpper = "0123456789ABCDEF"
)

// separators keep their position in a token-like value: they are structure
// (xoxb-…-…, SG.….…, base64 padding), not secret material.
const separators = "-_./+=:~"

// NewPlaceholder makes a random placeholder of the same shape as real: the
// recognised prefix (ghp_, sk_live_, AKIA, …) is kept; the rest has the same
// length and character classes, drawn from crypto/rand.
//
// Shape rules:
//   - A token-like value (16 or more letters/digits after the prefix) keeps
//     its separators (- _ . / + = : ~) in place; every run between them is
//     drawn from the classes that run uses (digits, lower, upper; a run that is
//     all hex stays hex in its own case). Classes are chosen per run, not per
//     position: the per-position pattern of a real value (which characters
//     are digits) is information about the secret and must not reach the
//     guest.
//   - A short, password-like value is replaced by random characters from the
//     classes it uses, without keeping its punctuation.
//   - When that shape cannot carry MinPlaceholderBits of randomness, the
//     classes widen to those of the whole value and then random characters
//     are appended: such a placeholder is longer than the real value.
//
// The result never equals real, never contains it and is never contained in
// it.
func NewPlaceholder(real []byte) (string, error) {
	if len(real) == 0 {
		return "", errors.New("substitute: empty credential: nothing to make a placeholder for")
	}
	prefix := prefixOf(real)
	body := real[len(prefix):]
	for range 8 {
		p, err := shape(prefix, body, rand.Reader)
		if err != nil {
			return "", fmt.Errorf("substitute: placeholder: %w", err)
		}
		if p != string(real) && !strings.Contains(string(real), p) && !strings.Contains(p, string(real)) {
			return p, nil
		}
	}
	return "", errors.New("substitute: placeholder: could not make one distinct from the credential")
}

// run is one stretch of a placeholder: either a literal separator or n
// characters drawn from alphabet.
type run struct {
	lit      byte
	n        int
	alphabet string
}

func shape(prefix string, body []byte, rnd io.Reader) (string, error) {
	alnum := 0
	for _, c := range body {
		if isAlnum(c) {
			alnum++
		}
	}
	var runs []run
	if alnum >= 16 {
		start := 0
		for i := 0; i <= len(body); i++ {
			if i < len(body) && strings.IndexByte(separators, body[i]) < 0 {
				continue
			}
			if i > start {
				runs = append(runs, run{n: i - start, alphabet: alphabetOf(body[start:i])})
			}
			if i < len(body) {
				runs = append(runs, run{lit: body[i]})
			}
			start = i + 1
		}
	} else {
		runs = []run{{n: len(body), alphabet: alphabetOf(body)}}
	}
	if bitsOf(runs) < MinPlaceholderBits {
		whole := alphabetOf(body)
		for i := range runs {
			if runs[i].n > 0 && len(whole) > len(runs[i].alphabet) {
				runs[i].alphabet = whole
			}
		}
	}
	// Still short: a body that happened to draw from one class only (an
	// AWS key id of letters without digits, about one in 28) gets digits,
	// then the other letter case, before the placeholder grows — a
	// placeholder of another length breaks length-preserving swaps in
	// encodings (base64 in place) and looks unlike the credential.
	for _, extra := range []string{digits, lower + upper} {
		if bitsOf(runs) >= MinPlaceholderBits {
			break
		}
		for i := range runs {
			if runs[i].n > 0 {
				runs[i].alphabet = union(runs[i].alphabet, extra)
			}
		}
	}
	if b := bitsOf(runs); b < MinPlaceholderBits {
		last := &runs[len(runs)-1]
		if last.n == 0 { // ends on a separator (padding): add a run after it
			runs = append(runs, run{alphabet: alphabetOf(body)})
			last = &runs[len(runs)-1]
		}
		per := math.Log2(float64(len(last.alphabet)))
		last.n += int(math.Ceil((MinPlaceholderBits - b) / per))
	}
	var sb strings.Builder
	sb.Grow(len(prefix) + len(body) + 16)
	sb.WriteString(prefix)
	s := sampler{r: rnd}
	for _, r := range runs {
		if r.n == 0 {
			sb.WriteByte(r.lit)
			continue
		}
		for range r.n {
			c, err := s.pick(r.alphabet)
			if err != nil {
				return "", err
			}
			sb.WriteByte(c)
		}
	}
	return sb.String(), nil
}

func bitsOf(runs []run) float64 {
	var b float64
	for _, r := range runs {
		if r.n > 0 {
			b += float64(r.n) * math.Log2(float64(len(r.alphabet)))
		}
	}
	return b
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// alphabetOf is the union of the character classes s uses; hex stays hex.
// Anything that is not a letter or digit counts as a letter or digit, so a
// placeholder never copies a real value's punctuation.
func alphabetOf(s []byte) string {
	var hasD, hasL, hasU, lowHex, upHex = false, false, false, true, true
	for _, c := range s {
		switch {
		case c >= '0' && c <= '9':
			hasD = true
		case c >= 'a' && c <= 'z':
			hasL = true
			lowHex = lowHex && c <= 'f'
		case c >= 'A' && c <= 'Z':
			hasU = true
			upHex = upHex && c <= 'F'
		default:
			hasD, hasL = true, true
			lowHex = false
		}
	}
	switch {
	case hasL && !hasU && lowHex && hasD:
		return hexLower
	case hasU && !hasL && upHex && hasD:
		return hexUpper
	}
	var a string
	if hasD {
		a += digits
	}
	if hasL {
		a += lower
	}
	if hasU {
		a += upper
	}
	if a == "" {
		a = digits + lower
	}
	return a
}

// union is a's characters followed by those of b it lacks.
func union(a, b string) string {
	for i := 0; i < len(b); i++ {
		if strings.IndexByte(a, b[i]) < 0 {
			a += b[i : i+1]
		}
	}
	return a
}

// sampler draws uniformly from an alphabet by rejection sampling of random
// bytes.
type sampler struct {
	r   io.Reader
	buf [64]byte
	n   int
	i   int
}

func (s *sampler) pick(alphabet string) (byte, error) {
	n := len(alphabet)
	limit := 256 - 256%n
	for {
		if s.i == s.n {
			if _, err := io.ReadFull(s.r, s.buf[:]); err != nil {
				return 0, err
			}
			s.i, s.n = 0, len(s.buf)
		}
		b := int(s.buf[s.i])
		s.i++
		if b < limit {
			return alphabet[b%n], nil
		}
	}
}
