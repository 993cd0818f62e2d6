package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/store"
)

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestMetrics(t *testing.T) {
	m := New(Sources{
		Sandboxes:        func() map[[2]string]int { return map[[2]string]int{{"container", "running"}: 3, {"qemu", "paused"}: 1} },
		PendingApprovals: func() int { return 2 },
		EventsDropped:    func() int64 { return 7 },
		Pools:            func() map[string]int { return map[string]int{"container:busybox": 4} },
	})
	for _, ev := range []api.EventPayload{
		api.EgressAllow{Host: "api.example.com", BytesUp: 100, BytesDown: 2000},
		api.EgressAllow{Host: "api.example.com", BytesUp: 1},
		api.EgressDeny{Host: "evil.example.com"},
		api.SecretUsed{Host: "api.example.com"},
		api.SecretAlert{},
		api.DNSQuery{Rcode: "NXDOMAIN"},
		api.ApprovalPending{},
		api.ApprovalDecided{State: "allowed"},
		api.PoolClaimed{Class: "container:busybox"},
		api.PoolMissed{Class: "container:busybox"},
		api.PolicyBudgetExhausted{},
	} {
		m.Observe("t1", "sb-1", ev)
	}
	m.ObserveCreate("container", true, 8*time.Millisecond)
	m.ObserveCreate("container", false, 60*time.Millisecond)
	m.AddBudget(store.BudgetUsage{Requests: 1, SpendMicros: 1500})
	out := scrape(t, m)
	for _, want := range []string{
		`cagebox_egress_requests_total{verdict="allow"} 2`,
		`cagebox_egress_requests_total{verdict="deny"} 1`,
		`cagebox_egress_bytes_total{direction="up"} 101`,
		`cagebox_egress_bytes_total{direction="down"} 2000`,
		`cagebox_secret_swaps_total 1`,
		`cagebox_secret_alerts_total{kind="alert"} 1`,
		`cagebox_dns_queries_total{rcode="NXDOMAIN"} 1`,
		`cagebox_approvals_total{state="pending"} 1`,
		`cagebox_approvals_total{state="allowed"} 1`,
		`cagebox_pool_events_total{class="container:busybox",result="hit"} 1`,
		`cagebox_pool_events_total{class="container:busybox",result="miss"} 1`,
		`cagebox_budget_exhausted_total 1`,
		`cagebox_budget_spend_usd_total 0.0015`,
		`cagebox_sandbox_create_seconds_bucket{path="pool",runtime="container",le="0.01"} 1`,
		`cagebox_sandbox_create_seconds_count{path="cold",runtime="container"} 1`,
		`cagebox_sandboxes{runtime="container",status="running"} 3`,
		`cagebox_approvals_pending 2`,
		`cagebox_events_dropped_total 7`,
		`cagebox_pool_ready{class="container:busybox"} 4`,
		`cagebox_events_total{kind="egress.allow"} 2`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %s", want)
		}
	}
	// No tenant, sandbox or host in any label.
	for _, leak := range []string{"t1", "sb-1", "api.example.com", "evil.example.com"} {
		if strings.Contains(out, leak) {
			t.Errorf("%q appears in the metrics", leak)
		}
	}
}
