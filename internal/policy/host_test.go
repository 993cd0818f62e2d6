package policy

import (
	"context"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/hostname/hostnametest"
)

// TestHostPatternsAgree runs the shared host table (package hostnametest)
// through policy validation, as allow and as deny rules: the policy accepts,
// canonicalises and refuses rule hosts exactly as the vault and the
// substitution do.
func TestHostPatternsAgree(t *testing.T) {
	for _, action := range []string{ActionAllow, ActionDeny} {
		for _, tc := range hostnametest.Patterns {
			p, err := Compile(&Document{Rules: []Rule{{Host: tc.In, Action: action}}})
			if tc.Canonical == "" {
				if err == nil || !strings.Contains(err.Error(), tc.Why) || !strings.Contains(err.Error(), "rules[0].host") {
					t.Errorf("%s %q: %v, want refused saying %q", action, tc.In, err, tc.Why)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s %q: %v", action, tc.In, err)
				continue
			}
			if got := p.Document().Rules[0].Host; got != tc.Canonical {
				t.Errorf("%s %q: host %q, want %q", action, tc.In, got, tc.Canonical)
			}
		}
	}
}

// TestPolicyMayNamePrivateSuffixWildcards: reachability of every name on a
// hosting platform ("*.githubusercontent.com") is an operator's choice; the
// vault and the substitution refuse such a wildcard for a credential.
func TestPolicyMayNamePrivateSuffixWildcards(t *testing.T) {
	for _, tc := range hostnametest.PrivateSuffixWildcards {
		p, err := Compile(&Document{Rules: []Rule{{Host: tc.In, Action: ActionAllow}}})
		if err != nil || p.Document().Rules[0].Host != tc.Canonical {
			t.Errorf("%q: %v", tc.In, err)
		}
	}
}

// TestHostMatchesAgree runs the shared match table through Decide,
// AllowsName and NamesHost.
func TestHostMatchesAgree(t *testing.T) {
	for _, tc := range hostnametest.Matches {
		p, err := Compile(&Document{Rules: []Rule{{Name: "r", Host: tc.Pattern, Action: ActionAllow}}})
		if err != nil {
			t.Fatalf("%q: %v", tc.Pattern, err)
		}
		d, err := p.Decide(context.Background(), &Request{Host: tc.Host, Port: 443, Method: "GET", Path: "/"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allow != tc.Want || p.AllowsName(tc.Host) != tc.Want || p.NamesHost(tc.Host) != tc.Want {
			t.Errorf("pattern %q host %q: decide %+v, AllowsName %v, NamesHost %v; want %v",
				tc.Pattern, tc.Host, d, p.AllowsName(tc.Host), p.NamesHost(tc.Host), tc.Want)
		}
	}
}
