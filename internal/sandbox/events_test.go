package sandbox

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/resolver"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// stuckStore is a real store whose AppendEvents waits until released (or
// its context ends): a store that is slow, locked or on a stalled disk.
type stuckStore struct {
	store.Store
	release chan struct{}
}

func (s *stuckStore) AppendEvents(ctx context.Context, es []*store.Event) error {
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.AppendEvents(ctx, es)
}

// TestResolverEmitDoesNotWaitForStore: the real resolver, wired to the
// manager's Emit as the gateway wires it, answers query after query while
// the store accepts nothing — its emit returns at once (the emit used to
// block once 4096 events were pending, and the resolver with it). Once the
// store works again nothing is unaccounted for: every query is a stored
// dns.query event or counted in an events.dropped event.
func TestResolverEmitDoesNotWaitForStore(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st := &stuckStore{Store: db, release: make(chan struct{})}
	m := New(Config{Store: st, StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})

	pool, err := resolver.NewPool(resolver.DefaultV4Prefix, netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := resolver.Start(resolver.Config{
		Addr: "127.0.0.1:0", Pool: pool, RateLimit: -1,
		Allow: func(name string) bool { return name == "api.example.test" },
		OnQuery: func(q resolver.QueryEvent) {
			m.Emit("t1", "sb-dns", api.DNSQuery{Name: q.Name, Type: q.Type, Rcode: q.Rcode, Answer: q.Answer, Reason: q.Reason})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	c := &dns.Client{Net: "udp", Timeout: 10 * time.Second}
	conn, err := c.Dial(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const queries = 10000
	q := new(dns.Msg)
	for i := range queries {
		q.SetQuestion("api.example.test.", dns.TypeA)
		r, _, err := c.ExchangeWithConn(q, conn)
		if err != nil {
			t.Fatalf("query %d of %d unanswered while the store is stuck (%v): the resolver waits for the event store", i+1, queries, err)
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("query %d: %v", i+1, r)
		}
	}

	close(st.release)
	m.Close() // stores what is queued and reports what was dropped
	evs, err := db.ListEvents(context.Background(), "", "sb-dns", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var stored, dropped int64
	for _, e := range evs {
		switch e.Kind {
		case "dns.query":
			stored++
		case "events.dropped":
			var d struct {
				Count int64            `json:"count"`
				Kinds map[string]int64 `json:"kinds"`
			}
			if err := json.Unmarshal(e.Data, &d); err != nil {
				t.Fatal(err)
			}
			if d.Count != d.Kinds["dns.query"] {
				t.Errorf("report %s: counts of other kinds", e.Data)
			}
			dropped += d.Count
		default:
			t.Errorf("unexpected event %s", e.Kind)
		}
	}
	if stored+dropped != queries || dropped == 0 {
		t.Errorf("%d stored + %d reported dropped, want %d queries with some dropped", stored, dropped, queries)
	}
}
