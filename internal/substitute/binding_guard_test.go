package substitute

import (
	"net/http"
	"strings"
	"testing"
)

// A guard placeholder (a signing key's) is refused with an alert wherever it
// appears, the bound host of nothing included, and never fetched.
func TestGuardPlaceholderRefusedEverywhere(t *testing.T) {
	ph := "whsec_guardplaceholder0000000001"
	s, err := NewSet(&Binding{Name: "HOOK", Placeholder: ph, Guard: true, Hosts: []string{"api.example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"api.example.com", "evil.example.net"} {
		r, _ := http.NewRequest("GET", "https://"+host+"/x?k="+ph, nil)
		res, err := s.Apply(r, host, true)
		if err != nil {
			t.Fatal(err)
		}
		if res.Refusal == nil || !res.Alert || !strings.Contains(res.Refusal.Reason, "signing key") {
			t.Fatalf("%s: %+v", host, res.Refusal)
		}
		if strings.Contains(res.Refusal.Reason, ph) {
			t.Fatal("refusal names the placeholder")
		}
	}
	if !s.IsPlaceholder(ph) {
		t.Fatal("guard placeholder not known to the exfil scan")
	}
	r, _ := http.NewRequest("GET", "https://api.example.com/x", nil)
	if res, err := s.Apply(r, "api.example.com", true); err != nil || res.Refusal != nil {
		t.Fatalf("clean request: %v %+v", err, res)
	}
}
