package substitute

import (
	"crypto/rand"
	"math/big"
	"strings"
	"testing"
)

// randFrom returns n characters drawn from alphabet.
// withDigit is randFrom for AWS-style key ids that hold a digit. A 16-letter
// body with no digit (about 1 draw in 28) has a 26-letter alphabet: 75 bits
// at the real length, so the placeholder grows past it to keep
// MinPlaceholderBits — right, but not what TestPlaceholderShape's "same
// length, same classes" checks; drawing it made that test fail now and then.
func withDigit(t testing.TB, alphabet string, n int) string {
	for {
		if s := randFrom(t, alphabet, n); strings.ContainsAny(s, digits) {
			return s
		}
	}
}

func randFrom(t testing.TB, alphabet string, n int) string {
	t.Helper()
	b := make([]byte, n)
	for i := range b {
		k, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			t.Fatal(err)
		}
		b[i] = alphabet[k.Int64()]
	}
	return string(b)
}

const alnum = digits + lower + upper

// realLike makes plausible real credentials of the common shapes.
func realLike(t testing.TB) map[string]string {
	b32 := "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	return map[string]string{
		"ghp":        "ghp_" + randFrom(t, alnum, 36),
		"gho":        "gho_" + randFrom(t, alnum, 36),
		"github_pat": "github_pat_" + randFrom(t, alnum, 22) + "_" + randFrom(t, alnum, 59),
		"sk-":        "sk-" + randFrom(t, alnum, 48),
		"sk-proj-":   "sk-proj-" + randFrom(t, alnum+"-_", 120),
		"sk_live_":   "sk_live_" + randFrom(t, alnum, 24),
		"sk_test_":   "sk_test_" + randFrom(t, alnum, 99),
		"pk_live_":   "pk_live_" + randFrom(t, alnum, 24),
		"xoxb-":      "xoxb-" + randFrom(t, digits, 12) + "-" + randFrom(t, digits, 13) + "-" + randFrom(t, alnum, 24),
		"xoxp-":      "xoxp-" + randFrom(t, digits, 12) + "-" + randFrom(t, digits, 12) + "-" + randFrom(t, digits, 13) + "-" + randFrom(t, hexLower, 32),
		"AKIA":       "AKIA" + withDigit(t, b32, 16),
		"ASIA":       "ASIA" + withDigit(t, b32, 16),
		"AIza":       "AIza" + randFrom(t, alnum+"-_", 35),
		"glpat-":     "glpat-" + randFrom(t, alnum+"-_", 20),
		"hf_":        "hf_" + randFrom(t, alnum, 34),
		"npm_":       "npm_" + randFrom(t, alnum, 36),
		"hex40":      randFrom(t, hexLower, 40),
		"uuid":       randFrom(t, hexLower, 8) + "-" + randFrom(t, hexLower, 4) + "-" + randFrom(t, hexLower, 4) + "-" + randFrom(t, hexLower, 4) + "-" + randFrom(t, hexLower, 12),
		"base64":     randFrom(t, alnum+"+/", 42) + "==",
		"unknown":    randFrom(t, lower+digits, 32),
	}
}

func TestPlaceholderShape(t *testing.T) {
	for name, real := range realLike(t) {
		t.Run(name, func(t *testing.T) {
			p, err := NewPlaceholder([]byte(real))
			if err != nil {
				t.Fatal(err)
			}
			if p == real {
				t.Fatal("placeholder equals the real value")
			}
			pre := prefixOf([]byte(real))
			if name != "hex40" && name != "uuid" && name != "base64" && name != "unknown" && pre == "" {
				t.Fatalf("no recognised prefix for %s", name)
			}
			if !strings.HasPrefix(p, pre) {
				t.Fatalf("prefix %q not kept: %q", pre, p[:len(pre)])
			}
			if len(p) != len(real) {
				t.Fatalf("length %d, want %d", len(p), len(real))
			}
			// Separators stay put; each run keeps to the classes its real
			// run uses.
			rb, pb := real[len(pre):], p[len(pre):]
			start := 0
			for i := 0; i <= len(rb); i++ {
				if i < len(rb) && !strings.ContainsRune(separators, rune(rb[i])) {
					continue
				}
				if i < len(rb) && pb[i] != rb[i] {
					t.Fatalf("separator %q at %d became %q", rb[i], i, pb[i])
				}
				want := alphabetOf([]byte(rb[start:i]))
				for _, c := range []byte(pb[start:i]) {
					if !strings.ContainsRune(want, rune(c)) {
						t.Fatalf("character %q outside the run's classes %q", c, want)
					}
				}
				start = i + 1
			}
			if shared := commonRun(real[len(pre):], p[len(pre):]); shared > 8 {
				t.Fatalf("placeholder shares a %d-character run with the real value", shared)
			}
		})
	}
}

func commonRun(a, b string) int {
	n := 0
	for l := 1; l <= len(a); l++ {
		found := false
		for i := 0; i+l <= len(a); i++ {
			if strings.ContainsAny(a[i:i+l], separators) {
				continue
			}
			if strings.Contains(b, a[i:i+l]) {
				found = true
				break
			}
		}
		if !found {
			break
		}
		n = l
	}
	return n
}

func TestPlaceholderUnique(t *testing.T) {
	for name, real := range realLike(t) {
		seen := map[string]bool{}
		for range 1000 {
			p, err := NewPlaceholder([]byte(real))
			if err != nil {
				t.Fatal(err)
			}
			if seen[p] {
				t.Fatalf("%s: duplicate placeholder after %d", name, len(seen))
			}
			seen[p] = true
		}
	}
}

func TestPlaceholderEntropy(t *testing.T) {
	cases := []string{"hunter2", "Password1!", "1234", "sk_live_ab", "AKIAABCDEFGHIJKLMNOP", "x"}
	for _, real := range cases {
		p, err := NewPlaceholder([]byte(real))
		if err != nil {
			t.Fatal(err)
		}
		pre := prefixOf([]byte(real))
		body := p[len(pre):]
		// The classes the placeholder draws from: the real value's,
		// widened (digits, then both letter cases) while short of the floor.
		alpha := alphabetOf([]byte(real[len(pre):]))
		for _, extra := range []string{digits, lower + upper} {
			if bitsOf([]run{{n: len(real) - len(pre), alphabet: alpha}}) < MinPlaceholderBits {
				alpha = union(alpha, extra)
			}
		}
		for _, c := range []byte(body) {
			if !strings.ContainsRune(alpha, rune(c)) {
				t.Errorf("%q → %q: %q is outside the classes %q", real, p, c, alpha)
			}
		}
		bits := bitsOf([]run{{n: len(body), alphabet: alpha}})
		if bits < MinPlaceholderBits {
			t.Errorf("%q → %q: %.0f bits, want ≥ %d", real, p, bits, MinPlaceholderBits)
		}
		if strings.ContainsAny(p, "!") {
			t.Errorf("%q → %q: punctuation of a short secret copied", real, p)
		}
	}
	if _, err := NewPlaceholder(nil); err == nil {
		t.Fatal("empty credential accepted")
	}
}

func TestPrefixTable(t *testing.T) {
	for _, p := range []string{"ghp_", "gho_", "github_pat_", "sk-", "sk_live_", "sk_test_", "pk_live_", "xoxb-", "xoxp-", "AKIA", "ASIA", "AIza", "glpat-", "hf_", "npm_"} {
		real := p + randFrom(t, alnum, 30)
		if got := prefixOf([]byte(real)); got != p {
			t.Errorf("prefixOf(%s…) = %q", p, got)
		}
	}
	if got := prefixOf([]byte("sk_live_" + randFrom(t, alnum, 24))); got != "sk_live_" {
		t.Errorf("longest prefix not preferred: %q", got)
	}
}

// TestPlaceholderKeepsLength: a credential whose random part happened to
// use one character class only (an AWS key id of letters without digits)
// still gets a placeholder of its own length — wider classes, not more
// characters — with the entropy floor met.
func TestPlaceholderKeepsLength(t *testing.T) {
	for _, real := range []string{"AKIASPKUPGTELUEXCLMV", "AKIAQWERTYUIOPASDFGH", "ghp_abcdefghijklmnopqrstuvwxyzabcdefghij"} {
		for range 50 {
			p, err := NewPlaceholder([]byte(real))
			if err != nil {
				t.Fatal(err)
			}
			if len(p) != len(real) || p[:4] != real[:4] {
				t.Fatalf("%s: placeholder %q", real, p)
			}
		}
	}
}
