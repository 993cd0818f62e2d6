package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// SecretPlaceholder in a generic relay's header value stands for the
// vault secret's value.
const SecretPlaceholder = "{secret}"

// WebSocketConfig configures a generic WebSocket relay: every message the
// server sends becomes one delivery.
type WebSocketConfig struct {
	URL string
	// Headers are "Name: value" lines sent with the handshake; {secret} in
	// a value is replaced by the Secret's value at each dial.
	Headers []string
	// Secret opens the secret (nil: no header uses one).
	Secret Token
	// Deliver hands one message on; typ is "text" or "binary".
	Deliver func(ctx context.Context, key, typ string, msg []byte) error
	State   func(State)
	Event   func(kind string, st State, detail string, code int)
	// HTTPClient dials (the daemon's refuses private addresses).
	HTTPClient             *http.Client
	MinBackoff, MaxBackoff time.Duration
	Log                    *slog.Logger
}

// reserved headers a relay may not set (the handshake's own).
var reservedHeaders = map[string]bool{"Host": true, "Upgrade": true, "Connection": true, "Content-Length": true, "Transfer-Encoding": true}

// ParseHeaders checks "Name: value" lines.
func ParseHeaders(lines []string) error {
	for _, l := range lines {
		name, _, ok := strings.Cut(l, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") || strings.ContainsAny(l, "\r\n") {
			return fmt.Errorf("header %q: want 'Name: value'", l)
		}
		c := http.CanonicalHeaderKey(name)
		if reservedHeaders[c] || strings.HasPrefix(c, "Sec-Websocket-") {
			return fmt.Errorf("header %s: set by the WebSocket handshake itself", c)
		}
	}
	return nil
}

// ValidateWebSocketURL checks a generic relay's URL: wss:// only (a relay
// may carry a secret, which is never sent in clear), no user info.
func ValidateWebSocketURL(u string) error {
	p, err := url.Parse(u)
	if err != nil || p.Scheme != "wss" || p.Host == "" || p.User != nil {
		return fmt.Errorf("url %q: want wss://HOST[:PORT]/PATH (TLS only, no user info)", u)
	}
	return nil
}

// WebSocket is a generic relay.
type WebSocket struct {
	cfg WebSocketConfig
	stateBox
}

// NewWebSocket returns a relay; call Run.
func NewWebSocket(cfg WebSocketConfig) *WebSocket {
	loopDefaults(&cfg.MinBackoff, &cfg.MaxBackoff, &cfg.Log, &cfg.State, &cfg.Event)
	return &WebSocket{cfg: cfg, stateBox: stateBox{report: cfg.State}}
}

// Run keeps the connection, reconnecting with backoff, until ctx ends.
// A handshake the server refuses with 401 or 403 stops it (ErrAuth).
func (w *WebSocket) Run(ctx context.Context) error {
	fails := 0
	for {
		worked, err := w.conn(ctx)
		if ctx.Err() != nil {
			w.update(func(s *State) { s.Connected = false })
			return nil
		}
		msg := ""
		if err != nil {
			msg = clipErr(err.Error())
		}
		if errors.Is(err, ErrAuth) {
			w.update(func(s *State) { s.Connected, s.Failed, s.LastError = false, true, msg })
			w.cfg.Event("failed", w.Snapshot(), msg, 0)
			return err
		}
		w.update(func(s *State) { s.Connected, s.LastError = false, msg; s.Reconnects++ })
		w.cfg.Event("disconnected", w.Snapshot(), msg, int(websocket.CloseStatus(err)))
		if worked {
			fails = 0
		}
		fails++
		wait := backoff(fails, w.cfg.MinBackoff, w.cfg.MaxBackoff)
		select {
		case <-ctx.Done():
			w.update(func(s *State) { s.Connected = false })
			return nil
		case <-time.After(wait):
		}
	}
}

func (w *WebSocket) header(ctx context.Context) (http.Header, error) {
	h := http.Header{}
	var sec []byte
	for _, l := range w.cfg.Headers {
		name, val, _ := strings.Cut(l, ":")
		val = strings.TrimSpace(val)
		if strings.Contains(val, SecretPlaceholder) {
			if sec == nil {
				if w.cfg.Secret == nil {
					return nil, fmt.Errorf("%w: header %s uses {secret} but the relay names no secret", ErrAuth, strings.TrimSpace(name))
				}
				v, wipe, err := w.cfg.Secret(ctx, w.cfg.URL)
				if err != nil {
					return nil, fmt.Errorf("%w: the secret cannot be sent: %v", ErrAuth, err)
				}
				defer wipe()
				if bytes.ContainsAny(v, "\r\n\x00") {
					return nil, fmt.Errorf("%w: the secret holds a line break or NUL and cannot go in a header", ErrAuth)
				}
				sec = v
			}
			// A header value is a Go string: this copy is not wiped (the
			// WebSocket library takes an http.Header); it lives until the
			// handshake's request is collected.
			val = strings.ReplaceAll(val, SecretPlaceholder, string(sec))
		}
		h.Add(strings.TrimSpace(name), val)
	}
	return h, nil
}

func (w *WebSocket) conn(ctx context.Context) (worked bool, err error) {
	h, err := w.header(ctx)
	if err != nil {
		return false, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, resp, err := websocket.Dial(dctx, w.cfg.URL, &websocket.DialOptions{HTTPHeader: h, HTTPClient: w.cfg.HTTPClient})
	cancel()
	if err != nil {
		if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			return false, fmt.Errorf("%w: the server refused the handshake's credentials (401 or 403): check the secret and headers", ErrAuth)
		}
		return false, dialFailed(w.cfg.Log, "the relay URL", err)
	}
	defer c.CloseNow()
	c.SetReadLimit(maxMessage)
	cctx, stop := closeOnStop(ctx, c)
	defer stop()
	idb := make([]byte, 6)
	_, _ = rand.Read(idb)
	id := hex.EncodeToString(idb)
	w.update(func(s *State) { s.Connected, s.LastError, s.Since = true, "", time.Now() })
	w.cfg.Event("connected", w.Snapshot(), "connected", 0)
	var n int64
	for {
		typ, msg, err := c.Read(cctx)
		if err != nil {
			return true, err
		}
		if ctx.Err() != nil {
			continue // the relay is stopping: nothing more is queued
		}
		n++
		t := "text"
		if typ == websocket.MessageBinary {
			t = "binary"
		}
		if err := w.cfg.Deliver(ctx, id+":"+strconv.FormatInt(n, 10), t, msg); err != nil {
			w.cfg.Log.Warn("relay: message not queued", "err", err)
			w.update(func(s *State) { s.Dropped++; s.Seq = n })
		} else {
			w.update(func(s *State) { s.Received++; s.Seq = n })
		}
	}
}
