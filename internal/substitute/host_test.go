package substitute

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/hostname/hostnametest"
)

// TestBindingHostsAgree runs the shared host tables (package hostnametest)
// through binding validation and Apply: a binding accepts, canonicalises,
// refuses and matches hosts exactly as the policy and the vault do.
func TestBindingHostsAgree(t *testing.T) {
	gh := ghSecret(t)
	for _, tc := range hostnametest.Patterns {
		s, err := NewSet(gh.binding(tc.In))
		if tc.Canonical == "" {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.Why) {
				t.Errorf("%q: %v, want ErrInvalid saying %q", tc.In, err, tc.Why)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.In, err)
			continue
		}
		if got := s.snapshot()[0].hosts; !slices.Equal(got, []string{tc.Canonical}) {
			t.Errorf("%q: hosts %q, want %q", tc.In, got, tc.Canonical)
		}
	}
	for _, tc := range hostnametest.Matches {
		set := mustSet(t, gh.binding(tc.Pattern))
		r, _ := http.NewRequest("GET", "https://example.com/", nil)
		r.Header.Set("Authorization", "Bearer "+gh.ph)
		res, err := set.Apply(r, tc.Host, true)
		if err != nil {
			t.Fatal(err)
		}
		swapped := res.Refusal == nil && r.Header.Get("Authorization") == "Bearer "+gh.real
		if swapped != tc.Want {
			t.Errorf("%q ~ %q: swapped %v (refusal %+v), want %v", tc.Pattern, tc.Host, swapped, res.Refusal, tc.Want)
		}
		// With a port, as a Host header carries it: the same answer.
		if tc.Host != "" && !strings.HasSuffix(tc.Host, ".") {
			r.Header.Set("Authorization", "Bearer "+gh.ph)
			res, _ := set.Apply(r, tc.Host+":443", true)
			if swapped := res.Refusal == nil && r.Header.Get("Authorization") == "Bearer "+gh.real; swapped != tc.Want {
				t.Errorf("%q ~ %q:443: swapped %v, want %v", tc.Pattern, tc.Host, swapped, tc.Want)
			}
		}
	}
}

// TestBindingRefusesPrivateSuffixWildcards: a credential bound to every
// name of a hosting platform could be sent to anyone's app.
func TestBindingRefusesPrivateSuffixWildcards(t *testing.T) {
	gh := ghSecret(t)
	for _, tc := range hostnametest.PrivateSuffixWildcards {
		if _, err := NewSet(gh.binding(tc.In)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.Why) {
			t.Errorf("%q: %v, want ErrInvalid saying %q", tc.In, err, tc.Why)
		}
	}
}
