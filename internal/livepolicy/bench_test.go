package livepolicy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/policy"
)

// BenchmarkDecide: one decision of the live policy, with a one-rule policy
// and with 50 rules of which 25 run a CEL condition for the request (the
// proxy's throughput figure is in bench/, `go run ./bench -only policy`).
func BenchmarkDecide(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("version: 2\nrules:\n")
	for i := 0; i < 25; i++ {
		fmt.Fprintf(&sb, "  - {name: other-%d, host: h%d.example.org, action: allow, when: 'request.method == \"GET\"'}\n", i, i)
	}
	for i := 0; i < 24; i++ {
		fmt.Fprintf(&sb, "  - {name: team-%d, host: api.example.com, action: deny, when: '\"x-team\" in request.headers && request.headers[\"x-team\"] == \"team-%d\"'}\n", i, i)
	}
	sb.WriteString("  - {name: api, host: api.example.com, methods: [GET], paths: [\"/**\"], action: allow, when: 'request.size <= 1048576 && session.fired[\"team-0\"] == 0'}\n")
	for name, src := range map[string]string{
		"1rule": "version: 1\nrules: [{name: api, host: api.example.com, action: allow}]",
		"50cel": sb.String(),
	} {
		b.Run(name, func(b *testing.B) {
			_, s, _, _ := newSandbox(b, src)
			hdr := map[string][]string{"User-Agent": {"curl/7.88"}, "Accept": {"*/*"}}
			b.ReportAllocs()
			for b.Loop() {
				d, err := s.Decide(context.Background(), &policy.Request{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/x", Header: hdr, BodySize: -1})
				if err != nil || !d.Allow {
					b.Fatal(d, err)
				}
			}
		})
	}
}
