package relay

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/relay/discordtest"
)

const testToken = "MTIzNDU2Nzg5.secret-bot-token.xyz"

type sink struct {
	mu      sync.Mutex
	keys    map[string]bool
	events  []map[string]any
	events2 []string
}

func (s *sink) deliver(_ context.Context, key, t string, ev []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[string]bool{}
	}
	if s.keys[key] {
		return errors.New("duplicate key " + key)
	}
	s.keys[key] = true
	var m map[string]any
	_ = json.Unmarshal(ev, &m)
	s.events = append(s.events, m)
	s.events2 = append(s.events2, string(ev))
	return nil
}

func (s *sink) types() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.events {
		out = append(out, e["t"].(string))
	}
	return out
}

func (s *sink) count(t string) int {
	n := 0
	for _, x := range s.types() {
		if x == t {
			n++
		}
	}
	return n
}

func start(t *testing.T, g *discordtest.Gateway, tok string, mod func(*DiscordConfig)) (*Discord, *sink, chan error) {
	t.Helper()
	s := &sink{}
	cfg := DiscordConfig{
		URL: g.URL,
		Token: func(context.Context, string) ([]byte, func(), error) {
			b := []byte(tok)
			return b, func() { clear(b) }, nil
		},
		Intents:          513,
		Deliver:          s.deliver,
		IdentifyInterval: 10 * time.Millisecond,
		MinBackoff:       20 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	d := NewDiscord(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("relay did not stop")
		}
	})
	return d, s, done
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func gateway(t *testing.T) *discordtest.Gateway {
	g, err := discordtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

func TestDiscordIdentifyDispatchDropResume(t *testing.T) {
	g := gateway(t)
	g.HeartbeatInterval = 200
	d, s, _ := start(t, g, testToken, nil)
	waitFor(t, "identify", func() bool { return g.Connected() })
	ids := g.Identifies()
	if len(ids) != 1 || ids[0].Token != testToken || ids[0].Intents != 513 {
		t.Fatalf("identify = %+v, want the token and intents 513", ids)
	}
	for i := range 3 {
		if _, err := g.Dispatch("MESSAGE_CREATE", map[string]any{"content": i}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "4 events (READY + 3)", func() bool { return len(s.types()) == 4 })
	// Heartbeats are sent and ACKed: the connection stays up over several
	// intervals.
	waitFor(t, "3 heartbeats", func() bool { return g.Heartbeats() >= 3 })
	if g.Conns() != 1 {
		t.Fatalf("connections = %d: ACKed heartbeats must keep the connection", g.Conns())
	}
	sess := g.Session()
	if st := d.Snapshot(); !st.Connected || st.SessionID != sess || st.Seq != 4 {
		t.Fatalf("state %+v, want connected, session %s, seq 4", st, sess)
	}

	// Drop; while away, two more events happen; the relay resumes with
	// the session and its last seq, gets them replayed once.
	g.Refuse(true)
	g.Drop()
	g.Dispatch("MESSAGE_CREATE", map[string]any{"content": "while away 1"})
	g.Dispatch("MESSAGE_CREATE", map[string]any{"content": "while away 2"})
	time.Sleep(100 * time.Millisecond)
	g.Refuse(false)
	waitFor(t, "resume", func() bool { return len(g.Resumes()) == 1 && g.Connected() })
	rs := g.Resumes()[0]
	if rs.SessionID != sess || rs.Seq != 4 || rs.Token != testToken {
		t.Fatalf("resume = session %s seq %d (token ok %v), want session %s seq 4", rs.SessionID, rs.Seq, rs.Token == testToken, sess)
	}
	waitFor(t, "the replayed events and RESUMED", func() bool { return s.count("RESUMED") == 1 })
	if n := s.count("MESSAGE_CREATE"); n != 5 {
		t.Fatalf("MESSAGE_CREATE delivered %d times, want 5: %v", n, s.events2)
	}
	if len(g.Identifies()) != 1 {
		t.Fatalf("identified again after a drop instead of resuming")
	}
	// Sequence order is kept.
	s.mu.Lock()
	last := 0.0
	for _, e := range s.events {
		if e["s"].(float64) <= last {
			t.Errorf("event out of order: %v", s.events2)
		}
		last = e["s"].(float64)
	}
	s.mu.Unlock()
}

func TestDiscordReconnectOpResumes(t *testing.T) {
	g := gateway(t)
	_, s, _ := start(t, g, testToken, nil)
	waitFor(t, "ready", func() bool { return s.count("READY") == 1 })
	g.Dispatch("X", 1)
	waitFor(t, "X", func() bool { return s.count("X") == 1 })
	if err := g.Op(7, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "resume after op 7", func() bool { return s.count("RESUMED") == 1 })
	if rs := g.Resumes(); len(rs) != 1 || rs[0].Seq != 2 {
		t.Fatalf("resumes = %+v, want one at seq 2", rs)
	}
}

func TestDiscordInvalidSessionIdentifiesAfresh(t *testing.T) {
	g := gateway(t)
	_, s, _ := start(t, g, testToken, nil)
	waitFor(t, "ready", func() bool { return s.count("READY") == 1 })
	start := time.Now()
	if err := g.Op(9, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a second identify", func() bool { return len(g.Identifies()) == 2 && s.count("READY") == 2 })
	if took := time.Since(start); took < time.Second {
		t.Fatalf("identified again %v after INVALID_SESSION; Discord asks for 1-5 s", took)
	}
	if len(g.Resumes()) != 0 {
		t.Fatalf("resumed a session the gateway invalidated")
	}
}

func TestDiscordMissedACKReconnects(t *testing.T) {
	g := gateway(t)
	g.HeartbeatInterval = 100
	g.NoACK = true
	_, s, _ := start(t, g, testToken, nil)
	waitFor(t, "ready", func() bool { return s.count("READY") == 1 })
	waitFor(t, "a resume after a missed ACK", func() bool { return len(g.Resumes()) >= 1 })
}

func TestDiscordAuthFailedStops(t *testing.T) {
	g := gateway(t)
	d, _, done := start(t, g, "bad-token", nil)
	select {
	case err := <-done:
		if !errors.Is(err, ErrAuth) {
			t.Fatalf("Run = %v, want ErrAuth", err)
		}
		done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("the relay kept running after close 4004")
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(g.Identifies()); n != 1 {
		t.Fatalf("identified %d times after 4004; want no retry loop", n)
	}
	st := d.Snapshot()
	if !st.Failed || st.Connected {
		t.Fatalf("state %+v, want failed", st)
	}
	if contains(st.LastError, "bad-token") {
		t.Fatalf("the token leaked into the state: %q", st.LastError)
	}
}

func contains(s, sub string) bool {
	return len(sub) > 0 && len(s) >= len(sub) && (s == sub || index(s, sub) >= 0)
}

func index(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

func TestDiscordSendRateLimit(t *testing.T) {
	g := gateway(t)
	g.HeartbeatInterval = 5 // a heartbeat every 5 ms would be 200 sends a second
	window := 500 * time.Millisecond
	start(t, g, testToken, func(c *DiscordConfig) { c.SendLimit, c.SendWindow = 5, window })
	time.Sleep(1600 * time.Millisecond)
	ts := g.SendTimes()
	if len(ts) < 5 {
		t.Fatalf("only %d sends", len(ts))
	}
	for i := range ts {
		n := 0
		for j := i; j < len(ts) && ts[j].Sub(ts[i]) < window-20*time.Millisecond; j++ {
			n++
		}
		if n > 5 {
			t.Fatalf("%d sends within one %v window (limit 5)", n, window)
		}
	}
}

func TestIdentifyIntervalRespected(t *testing.T) {
	g := gateway(t)
	_, s, _ := start(t, g, testToken, func(c *DiscordConfig) { c.IdentifyInterval = 700 * time.Millisecond })
	waitFor(t, "ready", func() bool { return s.count("READY") == 1 })
	t0 := time.Now()
	g.CloseWith(4009, "Session timed out") // identify afresh
	waitFor(t, "second identify", func() bool { return len(g.Identifies()) == 2 })
	if time.Since(t0) < 500*time.Millisecond {
		t.Fatalf("re-identified after %v, want ≥ the identify interval", time.Since(t0))
	}
}
