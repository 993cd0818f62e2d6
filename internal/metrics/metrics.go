// Package metrics exposes the daemon's Prometheus metrics (client_golang):
// sandboxes by runtime and status, create latency by runtime and path,
// warm-pool claims, misses and fills, egress decisions and bytes,
// credential swaps and alerts, DNS answers, approvals, budget use and the
// event path's drops. Counts of what happened come from one tap on the
// event path (every event emitted, before any rate limit); gauges are read
// when scraped. No label carries a tenant, sandbox id or host name: their
// number is unbounded.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/store"
)

// Sources are read at each scrape; any may be nil.
type Sources struct {
	// Sandboxes counts sandbox records by runtime and status.
	Sandboxes func() map[[2]string]int
	// PendingApprovals counts approvals waiting for a decision.
	PendingApprovals func() int
	// EventsDropped is how many events the event path dropped.
	EventsDropped func() int64
	// Pools reports each warm pool's ready sandboxes by class.
	Pools func() map[string]int
}

// Metrics holds the daemon's collectors.
type Metrics struct {
	reg *prometheus.Registry

	events       *prometheus.CounterVec
	egress       *prometheus.CounterVec
	egressBytes  *prometheus.CounterVec
	secretSwaps  prometheus.Counter
	secretAlerts *prometheus.CounterVec
	dns          *prometheus.CounterVec
	approvals    *prometheus.CounterVec
	budgetSpend  prometheus.Counter
	budgetReqs   prometheus.Counter
	exhausted    prometheus.Counter
	pool         *prometheus.CounterVec
	creates      *prometheus.HistogramVec
}

// New returns the daemon's metrics reading src at each scrape.
func New(src Sources) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cagebox_events_total",
			Help: "Events emitted, by kind (before the event path's rate limits)."}, []string{"kind"}),
		egress: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cagebox_egress_requests_total",
			Help: "Egress requests and connections decided by the gateway, by verdict (allow, deny, error)."}, []string{"verdict"}),
		egressBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cagebox_egress_bytes_total",
			Help: "Bytes of allowed egress traffic, by direction (up: to upstreams, down: to guests)."}, []string{"direction"}),
		secretSwaps: prometheus.NewCounter(prometheus.CounterOpts{Name: "cagebox_secret_swaps_total",
			Help: "Requests in which the gateway swapped placeholders for real credentials (or re-signed)."}),
		secretAlerts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cagebox_secret_alerts_total",
			Help: "Credential security events, by kind (alert, refused, exfil_suspect, reflected, error)."}, []string{"kind"}),
		dns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cagebox_dns_queries_total",
			Help: "Guest DNS queries answered by the synthetic resolver, by rcode."}, []string{"rcode"}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cagebox_approvals_total",
			Help: "Approvals (held requests, access requests): pending when made, then allowed, denied or expired."}, []string{"state"}),
		budgetSpend: prometheus.NewCounter(prometheus.CounterOpts{Name: "cagebox_budget_spend_usd_total",
			Help: "LLM spend metered against sandboxes' budgets, in USD."}),
		budgetReqs: prometheus.NewCounter(prometheus.CounterOpts{Name: "cagebox_budget_requests_total",
			Help: "Requests counted against sandboxes' budgets."}),
		exhausted: prometheus.NewCounter(prometheus.CounterOpts{Name: "cagebox_budget_exhausted_total",
			Help: "Requests refused because a budget was used up."}),
		pool: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cagebox_pool_events_total",
			Help: "Warm pool events by class (runtime:image[:memory], from the daemon's --pool) and result (hit, miss, fill, fill_failed)."}, []string{"class", "result"}),
		creates: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cagebox_sandbox_create_seconds",
			Help:    "Sandbox create latency (request to running), by runtime and path (pool or cold).",
			Buckets: []float64{.005, .01, .02, .04, .08, .16, .32, .64, 1.25, 2.5, 5, 10, 20, 40}}, []string{"runtime", "path"}),
	}
	reg.MustRegister(m.events, m.egress, m.egressBytes, m.secretSwaps, m.secretAlerts, m.dns, m.approvals,
		m.budgetSpend, m.budgetReqs, m.exhausted, m.pool, m.creates,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&scraped{src: src})
	return m
}

// Handler serves the metrics in Prometheus's text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Observe counts an emitted event (the event path's tap).
func (m *Metrics) Observe(_, _ string, ev api.EventPayload) {
	m.events.WithLabelValues(string(ev.EventKind())).Inc()
	switch e := ev.(type) {
	case api.EgressAllow:
		m.egress.WithLabelValues("allow").Inc()
		m.egressBytes.WithLabelValues("up").Add(float64(e.BytesUp))
		m.egressBytes.WithLabelValues("down").Add(float64(e.BytesDown))
	case api.EgressDeny:
		m.egress.WithLabelValues("deny").Inc()
	case api.EgressError:
		m.egress.WithLabelValues("error").Inc()
	case api.SecretUsed:
		m.secretSwaps.Inc()
	case api.SecretAlert:
		m.secretAlerts.WithLabelValues("alert").Inc()
	case api.SecretRefused:
		m.secretAlerts.WithLabelValues("refused").Inc()
	case api.SecretExfilSuspect:
		m.secretAlerts.WithLabelValues("exfil_suspect").Inc()
	case api.SecretReflected:
		m.secretAlerts.WithLabelValues("reflected").Inc()
	case api.SecretError:
		m.secretAlerts.WithLabelValues("error").Inc()
	case api.DNSQuery:
		m.dns.WithLabelValues(e.Rcode).Inc()
	case api.ApprovalPending:
		m.approvals.WithLabelValues("pending").Inc()
	case api.ApprovalDecided:
		m.approvals.WithLabelValues(e.State).Inc()
	case api.PolicyBudgetExhausted:
		m.exhausted.Inc()
	case api.PoolClaimed:
		m.pool.WithLabelValues(e.Class, "hit").Inc()
	case api.PoolMissed:
		m.pool.WithLabelValues(e.Class, "miss").Inc()
	case api.PoolFilled:
		m.pool.WithLabelValues(e.Class, "fill").Inc()
	case api.PoolFillFailed:
		m.pool.WithLabelValues(e.Class, "fill_failed").Inc()
	}
}

// ObserveCreate records a create's latency.
func (m *Metrics) ObserveCreate(runtime string, pooled bool, d time.Duration) {
	path := "cold"
	if pooled {
		path = "pool"
	}
	m.creates.WithLabelValues(runtime, path).Observe(d.Seconds())
}

// AddBudget counts what a request added to a sandbox's budget use.
func (m *Metrics) AddBudget(delta store.BudgetUsage) {
	m.budgetReqs.Add(float64(delta.Requests))
	m.budgetSpend.Add(float64(delta.SpendMicros) / 1e6)
}

// scraped collects the gauges read at scrape time.
type scraped struct{ src Sources }

var (
	sandboxesDesc = prometheus.NewDesc("cagebox_sandboxes", "Sandbox records by runtime and status.", []string{"runtime", "status"}, nil)
	pendingDesc   = prometheus.NewDesc("cagebox_approvals_pending", "Approvals waiting for a decision.", nil, nil)
	droppedDesc   = prometheus.NewDesc("cagebox_events_dropped_total", "Events the event path dropped (rate limits, full queue, store failures).", nil, nil)
	poolReadyDesc = prometheus.NewDesc("cagebox_pool_ready", "Warm sandboxes ready, by class.", []string{"class"}, nil)
)

func (c *scraped) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- pendingDesc
	ch <- droppedDesc
	ch <- poolReadyDesc
}

func (c *scraped) Collect(ch chan<- prometheus.Metric) {
	if f := c.src.Sandboxes; f != nil {
		for k, n := range f() {
			ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
		}
	}
	if f := c.src.PendingApprovals; f != nil {
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(f()))
	}
	if f := c.src.EventsDropped; f != nil {
		ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(f()))
	}
	if f := c.src.Pools; f != nil {
		for class, n := range f() {
			ch <- prometheus.MustNewConstMetric(poolReadyDesc, prometheus.GaugeValue, float64(n), class)
		}
	}
}
