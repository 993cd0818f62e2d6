// Package discordtest is a stand-in Discord Gateway for tests: a
// WebSocket server speaking the documented opcodes (HELLO, HEARTBEAT/ACK,
// IDENTIFY → READY, RESUME → replay + RESUMED, RECONNECT, INVALID_SESSION,
// dispatches with sequence numbers) that records what clients send and
// can drop or close the connection on demand.
package discordtest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Identify is one op 2 a client sent.
type Identify struct {
	Token   string
	Intents int
}

// Resume is one op 6 a client sent.
type Resume struct {
	Token     string
	SessionID string
	Seq       int64
}

type event struct {
	t string
	s int64
	d json.RawMessage
}

// End is how a client's connection ended, as the gateway read it.
type End struct {
	// Code is the close frame's code; -1 when the connection ended
	// without one (the client dropped it, or the gateway did: Drop).
	// After CloseWith it is the client's answer to the gateway's close.
	Code   int
	Reason string
}

// Gateway is the stand-in.
type Gateway struct {
	// URL is ws://ADDR/ (the resume_gateway_url too).
	URL string
	// HeartbeatInterval (ms) is sent in HELLO.
	HeartbeatInterval int
	// NoACK: heartbeats are not acknowledged.
	NoACK  bool
	refuse bool

	srv *http.Server
	ln  net.Listener

	mu         sync.Mutex
	conn       *websocket.Conn
	connCancel context.CancelFunc
	session    string
	seq        int64
	log        []event
	sessions   int
	identifies []Identify
	resumes    []Resume
	heartbeats int
	sendTimes  []time.Time
	conns      int
	ends       []End
	changed    chan struct{}
}

// Start listens on loopback.
func Start() (*Gateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &Gateway{HeartbeatInterval: 41250, ln: ln, URL: "ws://" + ln.Addr().String() + "/", changed: make(chan struct{})}
	g.srv = &http.Server{Handler: http.HandlerFunc(g.serve), ReadHeaderTimeout: 5 * time.Second}
	go g.srv.Serve(ln)
	return g, nil
}

// StartTLS listens on loopback and serves TLS with cert; its URL (and
// resume_gateway_url) is wss://HOST:PORT/, HOST a name the client maps to
// the listener (the daemon's --resolve HOST:PORT=ADDR:PORT) and cert's.
func StartTLS(cert tls.Certificate, host string) (*Gateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	tl := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	g := &Gateway{HeartbeatInterval: 41250, ln: tl, URL: "wss://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/", changed: make(chan struct{})}
	g.srv = &http.Server{Handler: http.HandlerFunc(g.serve), ReadHeaderTimeout: 5 * time.Second}
	go g.srv.Serve(tl)
	return g, nil
}

// Addr is the listener's address (ADDR:PORT).
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// Close stops the server.
func (g *Gateway) Close() {
	g.Drop()
	_ = g.srv.Close()
}

func (g *Gateway) notify() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// Wait waits until cond (called under the gateway's lock) holds.
func (g *Gateway) Wait(ctx context.Context, what string, cond func(*Gateway) bool) error {
	for {
		g.mu.Lock()
		ok := cond(g)
		ch := g.changed
		g.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-ch:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Accessors (copy under the lock; inside Wait's cond use the fields' getters too).

func (g *Gateway) Identifies() []Identify {
	g.lock()
	defer g.mu.Unlock()
	return append([]Identify(nil), g.identifies...)
}
func (g *Gateway) Resumes() []Resume {
	g.lock()
	defer g.mu.Unlock()
	return append([]Resume(nil), g.resumes...)
}
func (g *Gateway) Heartbeats() int { g.lock(); defer g.mu.Unlock(); return g.heartbeats }
func (g *Gateway) Conns() int      { g.lock(); defer g.mu.Unlock(); return g.conns }
func (g *Gateway) SendTimes() []time.Time {
	g.lock()
	defer g.mu.Unlock()
	return append([]time.Time(nil), g.sendTimes...)
}
func (g *Gateway) Ends() []End {
	g.lock()
	defer g.mu.Unlock()
	return append([]End(nil), g.ends...)
}
func (g *Gateway) Session() string { g.lock(); defer g.mu.Unlock(); return g.session }
func (g *Gateway) Seq() int64      { g.lock(); defer g.mu.Unlock(); return g.seq }

// Connected reports whether a client is on and identified or resumed.
func (g *Gateway) Connected() bool { g.lock(); defer g.mu.Unlock(); return g.conn != nil }

// Under the lock (for Wait's cond).
func (g *Gateway) NEnds() int { return len(g.ends) }

func (g *Gateway) lock() { g.mu.Lock() }

// Dispatch sends an event (op 0, next sequence number) to the client, or
// keeps it for its resume when none is connected.
func (g *Gateway) Dispatch(t string, d any) (int64, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return 0, err
	}
	g.mu.Lock()
	g.seq++
	ev := event{t: t, s: g.seq, d: b}
	g.log = append(g.log, ev)
	c := g.conn
	g.mu.Unlock()
	if c != nil {
		_ = write(c, 0, ev.d, &ev)
	}
	return ev.s, nil
}

// Drop cuts the client's connection without a close frame (a network
// drop).
func (g *Gateway) Drop() {
	g.mu.Lock()
	c, cancel := g.conn, g.connCancel
	g.conn = nil
	g.notify()
	g.mu.Unlock()
	if c != nil {
		cancel()
		_ = c.CloseNow()
	}
}

// CloseWith closes the client's connection with a close code.
func (g *Gateway) CloseWith(code int, reason string) {
	g.mu.Lock()
	c := g.conn
	g.conn = nil
	g.notify()
	g.mu.Unlock()
	if c != nil {
		_ = c.Close(websocket.StatusCode(code), reason)
	}
}

// Op sends a bare opcode (7 RECONNECT, 9 INVALID_SESSION, 1 HEARTBEAT).
func (g *Gateway) Op(op int, d any) error {
	g.mu.Lock()
	c := g.conn
	g.mu.Unlock()
	if c == nil {
		return fmt.Errorf("no client")
	}
	b, _ := json.Marshal(d)
	return write(c, op, b, nil)
}

func write(c *websocket.Conn, op int, d json.RawMessage, ev *event) error {
	m := map[string]any{"op": op, "d": d}
	if ev != nil {
		m["s"], m["t"] = ev.s, ev.t
	}
	b, _ := json.Marshal(m)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Write(ctx, websocket.MessageText, b)
}

// Refuse makes new connections fail (503) while on: an outage.
func (g *Gateway) Refuse(on bool) { g.lock(); g.refuse = on; g.mu.Unlock() }

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	refuse := g.refuse
	g.mu.Unlock()
	if refuse {
		http.Error(w, "outage", http.StatusServiceUnavailable)
		return
	}
	if r.URL.Query().Get("v") != "10" || r.URL.Query().Get("encoding") != "json" {
		http.Error(w, "want ?v=10&encoding=json", http.StatusBadRequest)
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer c.CloseNow()
	g.mu.Lock()
	g.conns++
	g.notify()
	g.mu.Unlock()
	hello, _ := json.Marshal(map[string]int{"heartbeat_interval": g.HeartbeatInterval})
	if write(c, 10, hello, nil) != nil {
		return
	}
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			end := End{Code: int(websocket.CloseStatus(err))}
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				end.Reason = ce.Reason
			}
			g.mu.Lock()
			g.ends = append(g.ends, end)
			g.notify()
			if g.conn == c {
				g.conn = nil
				g.notify()
			}
			g.mu.Unlock()
			return
		}
		var f struct {
			Op int             `json:"op"`
			D  json.RawMessage `json:"d"`
		}
		if json.Unmarshal(b, &f) != nil {
			_ = c.Close(4002, "decode error")
			return
		}
		g.mu.Lock()
		g.sendTimes = append(g.sendTimes, time.Now())
		g.mu.Unlock()
		switch f.Op {
		case 1:
			g.mu.Lock()
			g.heartbeats++
			g.notify()
			noack := g.NoACK
			g.mu.Unlock()
			if !noack {
				_ = write(c, 11, json.RawMessage("null"), nil)
			}
		case 2:
			var id struct {
				Token   string `json:"token"`
				Intents int    `json:"intents"`
			}
			_ = json.Unmarshal(f.D, &id)
			g.mu.Lock()
			g.identifies = append(g.identifies, Identify{Token: id.Token, Intents: id.Intents})
			if strings.HasPrefix(id.Token, "bad") {
				g.notify()
				g.mu.Unlock()
				_ = c.Close(4004, "Authentication failed.")
				return
			}
			g.sessions++
			g.session = fmt.Sprintf("sess-%d", g.sessions)
			g.seq = 1
			ev := event{t: "READY", s: 1}
			ev.d, _ = json.Marshal(map[string]any{"v": 10, "session_id": g.session, "resume_gateway_url": g.URL, "user": map[string]any{"id": "1", "username": "bot"}})
			g.log = []event{ev}
			g.conn, g.connCancel = c, cancel
			g.notify()
			g.mu.Unlock()
			_ = write(c, 0, ev.d, &ev)
		case 6:
			var rs struct {
				Token     string `json:"token"`
				SessionID string `json:"session_id"`
				Seq       int64  `json:"seq"`
			}
			_ = json.Unmarshal(f.D, &rs)
			g.mu.Lock()
			g.resumes = append(g.resumes, Resume{Token: rs.Token, SessionID: rs.SessionID, Seq: rs.Seq})
			if rs.SessionID != g.session {
				g.notify()
				g.mu.Unlock()
				_ = write(c, 9, json.RawMessage("false"), nil)
				continue
			}
			var replay []event
			for _, ev := range g.log {
				if ev.s > rs.Seq {
					replay = append(replay, ev)
				}
			}
			g.seq++
			done := event{t: "RESUMED", s: g.seq, d: json.RawMessage("{}")}
			g.log = append(g.log, done)
			g.conn, g.connCancel = c, cancel
			g.notify()
			g.mu.Unlock()
			for _, ev := range replay {
				_ = write(c, 0, ev.d, &ev)
			}
			_ = write(c, 0, done.d, &done)
		default:
			_ = c.Close(4001, "unknown opcode")
			return
		}
	}
}
