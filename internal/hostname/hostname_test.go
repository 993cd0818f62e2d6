package hostname_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/hostname/hostnametest"
)

func TestParsePattern(t *testing.T) {
	for _, tc := range hostnametest.Patterns {
		got, err := hostname.ParsePattern(tc.In)
		if tc.Canonical == "" {
			var he *hostname.Error
			if err == nil {
				t.Errorf("ParsePattern(%q) = %q, want refused (%s)", tc.In, got, tc.Why)
			} else if !errors.As(err, &he) || !strings.Contains(err.Error(), tc.Why) {
				t.Errorf("ParsePattern(%q): %v, want a *Error saying %q", tc.In, err, tc.Why)
			}
			continue
		}
		if err != nil || got != tc.Canonical {
			t.Errorf("ParsePattern(%q) = %q, %v; want %q", tc.In, got, err, tc.Canonical)
			continue
		}
		// The canonical form is a fixed point.
		if again, err := hostname.ParsePattern(got); err != nil || again != got {
			t.Errorf("ParsePattern(%q) = %q, %v; not a fixed point", got, again, err)
		}
	}
}

// TestCredentialPatterns: a policy may name a wildcard over the public
// suffix list's private section; a credential may not; both agree on the
// rest of the table.
func TestCredentialPatterns(t *testing.T) {
	for _, tc := range hostnametest.PrivateSuffixWildcards {
		if got, err := hostname.ParsePattern(tc.In); err != nil || got != tc.Canonical {
			t.Errorf("ParsePattern(%q) = %q, %v; want %q", tc.In, got, err, tc.Canonical)
		}
		if got, err := hostname.ParseCredentialPattern(tc.In); err == nil || !strings.Contains(err.Error(), tc.Why) {
			t.Errorf("ParseCredentialPattern(%q) = %q, %v; want refused saying %q", tc.In, got, err, tc.Why)
		}
	}
	for _, tc := range hostnametest.Patterns {
		a, errA := hostname.ParsePattern(tc.In)
		b, errB := hostname.ParseCredentialPattern(tc.In)
		if a != b || (errA == nil) != (errB == nil) {
			t.Errorf("%q: policy %q %v, credential %q %v", tc.In, a, errA, b, errB)
		}
	}
}

func TestParse(t *testing.T) {
	for _, tc := range hostnametest.Patterns {
		got, err := hostname.Parse(tc.In)
		wild := strings.HasPrefix(tc.Canonical, "*.")
		switch {
		case tc.Canonical == "" || wild:
			if err == nil {
				t.Errorf("Parse(%q) = %q, want refused", tc.In, got)
			}
		case err != nil || got != tc.Canonical:
			t.Errorf("Parse(%q) = %q, %v; want %q", tc.In, got, err, tc.Canonical)
		case !hostname.Valid(got):
			t.Errorf("Valid(%q) = false after Parse", got)
		}
	}
	if _, err := hostname.Parse("*.example.com"); err == nil || !strings.Contains(err.Error(), "wildcard") {
		t.Errorf("Parse of a wildcard: %v", err)
	}
}

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"":                "",
		".":               "",
		"Example.COM.":    "example.com",
		"example.com..":   "example.com.",
		"\u212Aey.com":    "\u212Aey.com", // never Unicode-folded
		"ÄPI.example.com": "Äpi.example.com",
		"*.A.com":         "*.a.com",
	} {
		if got := hostname.Canonical(in); got != want {
			t.Errorf("Canonical(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestNormalize: a host as a request carries it, folded exactly as
// Canonical folds it and valid exactly when Valid says so.
func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"Example.COM.":    "example.com",
		"example.com":     "example.com",
		"example.com..":   "",
		"\u212Aey.com":    "",
		"1.2.3.4":         "",
		"*.example.com":   "",
		"":                "",
		"ÄPI.example.com": "",
	} {
		got, ok := hostname.Normalize(in)
		if ok != (want != "") || ok && got != want || got != hostname.Canonical(in) {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for in, want := range map[string]string{"API.Example.com.": "api.example.com.", "\u212A": "\u212A", "ÄB": "Äb"} {
		if got := hostname.Lower(in); got != want {
			t.Errorf("Lower(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		"example.com":  true,
		"localhost":    true,
		"Example.com":  false, // not canonical
		"example.com.": false,
		"":             false,
		"1.2.3.4":      false,
		"*.example.co": false,
		"a_b.c":        true,
	} {
		if got := hostname.Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range hostnametest.Matches {
		p, err := hostname.ParsePattern(tc.Pattern)
		if err != nil {
			t.Fatalf("pattern %q: %v", tc.Pattern, err)
		}
		if got := hostname.MatchAny([]string{p}, tc.Host); got != tc.Want {
			t.Errorf("MatchAny(%q, %q) = %v, want %v", p, tc.Host, got, tc.Want)
		}
		if h, err := hostname.Parse(tc.Host); err == nil {
			if got := hostname.Match(p, h); got != tc.Want {
				t.Errorf("Match(%q, %q) = %v, want %v", p, h, got, tc.Want)
			}
		} else if tc.Want {
			t.Errorf("host %q: %v", tc.Host, err)
		}
	}
	if hostname.MatchAny(nil, "example.com") {
		t.Error("no patterns matched")
	}
}

func TestCovers(t *testing.T) {
	for _, tc := range []struct {
		p, q string
		want bool
	}{
		{"api.github.com", "api.github.com", true},
		{"api.github.com", "x.api.github.com", false},
		{"api.github.com", "*.api.github.com", false},
		{"*.github.com", "api.github.com", true},
		{"*.github.com", "a.b.github.com", true},
		{"*.github.com", "*.github.com", true},
		{"*.github.com", "*.api.github.com", true},
		{"*.github.com", "github.com", false},
		{"*.api.github.com", "*.github.com", false},
		{"*.github.com", "*.xgithub.com", false},
		{"github.com", "*.github.com", false},
	} {
		if got := hostname.Covers(tc.p, tc.q); got != tc.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", tc.p, tc.q, got, tc.want)
		}
	}
	if !hostname.CoversAny([]string{"a.example.com", "*.example.org"}, "*.x.example.org") || hostname.CoversAny(nil, "a.b") {
		t.Error("CoversAny")
	}
}

func TestErrorQuotesInputBounded(t *testing.T) {
	long := strings.Repeat("x", 10000)
	_, err := hostname.ParsePattern(long)
	if err == nil || len(err.Error()) > 1000 {
		t.Fatalf("error %d bytes: %.80v", len(err.Error()), err)
	}
}

// FuzzParsePattern: whatever ParsePattern accepts is canonical, re-parses
// to itself, and matches a name below it (wildcards) or itself (names).
func FuzzParsePattern(f *testing.F) {
	for _, tc := range hostnametest.Patterns {
		f.Add(tc.In)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := hostname.ParsePattern(s)
		if err != nil {
			return
		}
		if hostname.Canonical(p) != p {
			t.Fatalf("%q → %q not canonical", s, p)
		}
		if again, err := hostname.ParsePattern(p); err != nil || again != p {
			t.Fatalf("%q → %q → %q, %v", s, p, again, err)
		}
		if base, ok := strings.CutPrefix(p, "*."); ok {
			if hostname.MatchAny([]string{p}, base) {
				t.Fatalf("%q matches its apex", p)
			}
			if len(base) < hostname.MaxLen-2 && !hostname.MatchAny([]string{p}, "a."+base) {
				t.Fatalf("%q does not match a name below it", p)
			}
			return
		}
		if !hostname.MatchAny([]string{p}, strings.ToUpper(p)+".") {
			t.Fatalf("%q does not match itself", p)
		}
	})
}

func BenchmarkMatchAny(b *testing.B) {
	ps := []string{"api.github.com", "*.githubassets.com", "uploads.github.com", "*.github.com"}
	for _, host := range []string{"API.GitHub.com", "objects.githubassets.com.", "nowhere.example.org"} {
		b.Run(host, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				hostname.MatchAny(ps, host)
			}
		})
	}
}

func BenchmarkParsePattern(b *testing.B) {
	for _, s := range []string{"*.example.co.uk", "api.github.com"} {
		b.Run(s, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := hostname.ParsePattern(s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
