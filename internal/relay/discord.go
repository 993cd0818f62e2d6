// Package relay holds long-lived connections on a sandbox's behalf: the
// host keeps a bot's Discord Gateway WebSocket (hello, heartbeat,
// identify, resume, rate limits) with the real token, which the vault
// opens only while a frame that carries it is being written, and hands
// every dispatch event to a Deliver function (the daemon queues it as a
// delivery to the guest's port, package hooks). The guest never holds the
// token; it sends through the egress gateway with a placeholder.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/cagebox/cagebox/internal/safedial"
)

// DefaultDiscordURL is Discord's gateway (GET /gateway answers it).
const DefaultDiscordURL = "wss://gateway.discord.gg/?v=10&encoding=json"

// Gateway opcodes (https://discord.com/developers/docs/topics/opcodes-and-status-codes).
const (
	opDispatch       = 0
	opHeartbeat      = 1
	opIdentify       = 2
	opResume         = 6
	opReconnect      = 7
	opInvalidSession = 9
	opHello          = 10
	opHeartbeatACK   = 11
)

// Limits Discord documents: 120 gateway sends per 60 s per connection,
// and identify concurrency 1 per 5 s for a bot whose max_concurrency is 1.
const (
	DefaultSendLimit        = 120
	DefaultSendWindow       = 60 * time.Second
	DefaultIdentifyInterval = 5 * time.Second
	maxMessage              = 16 << 20
)

// closeWait bounds the wait for the peer's answer to the close frame a
// stopped relay sends.
const closeWait = 2 * time.Second

// ErrAuth is a gateway refusing the token (close 4004) or the bot's
// settings (4010-4014): retrying cannot help.
var ErrAuth = errors.New("the relay cannot authenticate")

// Token opens the secret for a write toward dest (the URL of the
// connection it is about to be written on), for as long as wipe is not
// called. The daemon's checks the secret's binding against dest every
// time (credentials.OpenToward): a refusal stops the relay (ErrAuth).
type Token func(ctx context.Context, dest string) (value []byte, wipe func(), err error)

// DiscordConfig configures a Discord relay.
type DiscordConfig struct {
	// URL is the gateway URL (DefaultDiscordURL when empty).
	URL     string
	Token   Token
	Intents int
	// HTTPClient dials (the daemon's: package safedial, TLS verified);
	// nil: http.DefaultClient.
	HTTPClient *http.Client
	// Deliver hands one dispatch event ({"t","s","d"} JSON) on; key names
	// it (SESSION:SEQ), so a replay after a resume is recognised.
	Deliver func(ctx context.Context, key, eventType string, event []byte) error
	// State is called on every change of the relay's state.
	State func(State)
	// Event reports connected/disconnected/failed (for the event log).
	Event func(kind string, st State, detail string, code int)

	SendLimit        int
	SendWindow       time.Duration
	IdentifyInterval time.Duration
	// MinBackoff/MaxBackoff bound the wait between reconnects (1 s, 60 s).
	MinBackoff, MaxBackoff time.Duration
	Log                    *slog.Logger
}

// State is a relay's connection, as `relay ls` shows it.
type State struct {
	Connected  bool      `json:"connected"`
	SessionID  string    `json:"session_id,omitempty"`
	Seq        int64     `json:"seq"`
	Reconnects int       `json:"reconnects"`
	Resumes    int       `json:"resumes"`
	Received   int64     `json:"received"`
	Dropped    int64     `json:"dropped"`
	LastError  string    `json:"last_error,omitempty"`
	Failed     bool      `json:"failed,omitempty"`
	Since      time.Time `json:"since,omitzero"`
}

// Discord is one bot's gateway connection, kept until Run's ctx ends or
// the gateway refuses the bot.
type Discord struct {
	cfg DiscordConfig

	stateBox        // its mu also guards res
	res      string // resume_gateway_url

	lastIdentify time.Time
	sends        []time.Time
}

// NewDiscord returns a relay; call Run.
func NewDiscord(cfg DiscordConfig) *Discord {
	if cfg.URL == "" {
		cfg.URL = DefaultDiscordURL
	}
	if cfg.SendLimit <= 0 {
		cfg.SendLimit = DefaultSendLimit
	}
	if cfg.SendWindow <= 0 {
		cfg.SendWindow = DefaultSendWindow
	}
	if cfg.IdentifyInterval <= 0 {
		cfg.IdentifyInterval = DefaultIdentifyInterval
	}
	loopDefaults(&cfg.MinBackoff, &cfg.MaxBackoff, &cfg.Log, &cfg.State, &cfg.Event)
	return &Discord{cfg: cfg, stateBox: stateBox{report: cfg.State}}
}

// stateBox holds a relay's State (Snapshot) and reports every change
// (update) to the relay's State callback; both relays embed it.
type stateBox struct {
	mu     sync.Mutex
	st     State
	report func(State)
}

// Snapshot returns the relay's state.
func (b *stateBox) Snapshot() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st
}

func (b *stateBox) update(f func(*State)) {
	b.mu.Lock()
	f(&b.st)
	st := b.st
	b.mu.Unlock()
	b.report(st)
}

// loopDefaults fills the settings both relays' reconnect loops share:
// backoff 1 s to 1 min, the default logger, no-op callbacks.
func loopDefaults(minBackoff, maxBackoff *time.Duration, log **slog.Logger, state *func(State), event *func(string, State, string, int)) {
	if *minBackoff <= 0 {
		*minBackoff = time.Second
	}
	if *maxBackoff <= 0 {
		*maxBackoff = time.Minute
	}
	if *log == nil {
		*log = slog.Default()
	}
	if *state == nil {
		*state = func(State) {}
	}
	if *event == nil {
		*event = func(string, State, string, int) {}
	}
}

// gatewayURL adds v=10&encoding=json to a resume_gateway_url (Discord
// gives it bare).
func gatewayURL(u string) (string, error) {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "wss" && p.Scheme != "ws") || p.Host == "" {
		return "", fmt.Errorf("gateway url %q: want wss://HOST", u)
	}
	q := p.Query()
	if q.Get("v") == "" {
		q.Set("v", "10")
	}
	if q.Get("encoding") == "" {
		q.Set("encoding", "json")
	}
	p.RawQuery = q.Encode()
	return p.String(), nil
}

// ValidateURL checks a gateway URL.
func ValidateURL(u string) error {
	_, err := gatewayURL(u)
	return err
}

// Run keeps the connection until ctx ends (nil) or the gateway refuses
// the bot (ErrAuth).
func (d *Discord) Run(ctx context.Context) error {
	fails := 0
	for {
		resumed, err := d.session(ctx)
		if ctx.Err() != nil {
			d.update(func(s *State) { s.Connected = false })
			return nil
		}
		if errors.Is(err, ErrAuth) {
			msg := err.Error()
			d.update(func(s *State) { s.Connected, s.Failed, s.LastError = false, true, clipErr(msg) })
			d.cfg.Event("failed", d.Snapshot(), msg, 0)
			return err
		}
		msg := ""
		if err != nil {
			msg = clipErr(err.Error())
		}
		code := int(websocket.CloseStatus(err))
		d.update(func(s *State) { s.Connected, s.LastError = false, msg; s.Reconnects++ })
		d.cfg.Event("disconnected", d.Snapshot(), msg, code)
		if resumed {
			fails = 0 // the connection worked: reconnect at once
		} else {
			fails++
		}
		wait := time.Duration(0)
		if fails > 0 {
			wait = backoff(fails, d.cfg.MinBackoff, d.cfg.MaxBackoff)
		}
		select {
		case <-ctx.Done():
			d.update(func(s *State) { s.Connected = false })
			return nil
		case <-time.After(wait):
		}
	}
}

// closeOnStop ties a connection to its relay's life, ctx: when ctx ends
// (relay rm, its sandbox stopped, the daemon shutting down) the relay
// says goodbye with a close frame, 1000 — Discord then ends the session
// and shows the bot offline at once; a connection merely dropped leaves
// it online, its session resumable, until its heartbeats time out — and
// only then ends cctx. The connection's reads and writes must run under
// cctx, which ctx's end does not cancel: the WebSocket library drops the
// connection without a close frame when the context of a read or write
// in progress ends. stop drops the connection without one (and is to be
// called when the connection is done with).
func closeOnStop(ctx context.Context, c *websocket.Conn) (cctx context.Context, stop func()) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	bye := context.AfterFunc(ctx, func() {
		// A peer that does not answer the close frame soon is not
		// waited for (the library would wait 5 s): ending cctx ends the
		// read that would take its answer, and so the connection.
		t := time.AfterFunc(closeWait, cancel)
		defer t.Stop()
		_ = c.Close(websocket.StatusNormalClosure, "relay stopped")
		cancel()
	})
	return cctx, func() {
		bye()
		cancel()
	}
}

// backoff is the wait before reconnecting after fails failed attempts
// (fails ≥ 1): lo doubling per failure up to hi, plus up to a quarter of
// jitter so that relays dropped together do not come back together.
func backoff(fails int, lo, hi time.Duration) time.Duration {
	wait := min(lo<<min(fails-1, 10), hi)
	return wait + time.Duration(rand.Int64N(int64(wait)/4+1))
}

// frame is a gateway payload.
type frame struct {
	Op int             `json:"op"`
	D  json.RawMessage `json:"d"`
	S  *int64          `json:"s,omitempty"`
	T  *string         `json:"t,omitempty"`
}

// closeErr is a close we decided on, with what to do next.
type closeErr struct {
	why    string
	resume bool // keep the session (else identify afresh)
}

func (e *closeErr) Error() string { return e.why }

// session runs one connection; it reports whether it got as far as
// READY/RESUMED (so the next reconnect is immediate).
func (d *Discord) session(ctx context.Context) (ok bool, err error) {
	d.mu.Lock()
	sid, seq, target := d.st.SessionID, d.st.Seq, d.res
	d.mu.Unlock()
	resuming := sid != "" && target != ""
	if !resuming {
		target = d.cfg.URL
	}
	u, err := gatewayURL(target)
	if err != nil {
		return false, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, _, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPClient: d.cfg.HTTPClient})
	cancel()
	if err != nil {
		return false, dialFailed(d.cfg.Log, "the gateway", err)
	}
	c.SetReadLimit(maxMessage)
	defer c.CloseNow()
	// The connection's reads and writes run under sctx; the relay's end
	// (ctx) closes it with a close frame first. stop drops it (a zombied
	// connection).
	sctx, stop := closeOnStop(ctx, c)
	defer stop()

	// HELLO first.
	f, err := read(sctx, c, 30*time.Second)
	if err != nil {
		return false, fmt.Errorf("waiting for hello: %w", err)
	}
	if f.Op != opHello {
		return false, fmt.Errorf("gateway sent op %d before hello", f.Op)
	}
	var hello struct {
		Interval int64 `json:"heartbeat_interval"`
	}
	if err := json.Unmarshal(f.D, &hello); err != nil || hello.Interval <= 0 {
		return false, fmt.Errorf("hello: no heartbeat_interval")
	}
	interval := time.Duration(hello.Interval) * time.Millisecond

	// Writes go through one goroutine's lock and the send limiter.
	var wmu sync.Mutex
	send := func(p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		if err := d.waitSend(sctx); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(sctx, 10*time.Second)
		defer cancel()
		return c.Write(wctx, websocket.MessageText, p)
	}
	acked := make(chan struct{}, 1)
	beatNow := make(chan struct{}, 1)
	hbErr := make(chan error, 1)
	go func() {
		if err := d.heartbeat(sctx, interval, send, acked, beatNow); err != nil {
			hbErr <- err
			stop() // the reader ends; classify sees hbErr
		}
	}()

	if resuming {
		err = d.sendToken(sctx, u, send, func(tok []byte) []byte { return resumePayload(tok, sid, seq) })
	} else {
		err = d.identify(sctx, u, send)
	}
	if err != nil {
		return false, err
	}

	for {
		f, err := read(sctx, c, 0)
		if err != nil {
			select {
			case herr := <-hbErr:
				if herr != nil {
					err = herr
				}
			default:
			}
			return ok, d.classify(c, err)
		}
		switch f.Op {
		case opHeartbeatACK:
			select {
			case acked <- struct{}{}:
			default:
			}
		case opHeartbeat:
			select {
			case beatNow <- struct{}{}:
			default:
			}
		case opReconnect:
			c.Close(4900, "reconnect requested")
			return ok, &closeErr{why: "gateway asked to reconnect (op 7)", resume: true}
		case opInvalidSession:
			var resumable bool
			_ = json.Unmarshal(f.D, &resumable)
			c.Close(4900, "invalid session")
			if !resumable {
				d.forget()
				// Discord: wait 1-5 s before identifying again.
				select {
				case <-ctx.Done():
				case <-time.After(time.Second + time.Duration(rand.Int64N(int64(4*time.Second)))):
				}
			}
			return ok, &closeErr{why: "invalid session (op 9, resumable " + strconv.FormatBool(resumable) + ")", resume: resumable}
		case opDispatch:
			if f.S == nil || f.T == nil {
				continue
			}
			t, s := *f.T, *f.S
			switch t {
			case "READY":
				var r struct {
					SessionID string `json:"session_id"`
					ResumeURL string `json:"resume_gateway_url"`
				}
				_ = json.Unmarshal(f.D, &r)
				d.mu.Lock()
				d.res = r.ResumeURL
				d.mu.Unlock()
				ok = true
				d.update(func(st *State) {
					st.Connected, st.SessionID, st.Seq, st.Failed, st.LastError, st.Since = true, r.SessionID, s, false, "", time.Now()
				})
				d.cfg.Event("connected", d.Snapshot(), "identified", 0)
			case "RESUMED":
				ok = true
				d.update(func(st *State) { st.Connected, st.Since = true, time.Now(); st.Resumes++; st.LastError = "" })
				d.cfg.Event("connected", d.Snapshot(), "resumed", 0)
			}
			d.mu.Lock()
			cur := d.st.SessionID
			fresh := s > d.st.Seq || t == "READY"
			if fresh {
				d.st.Seq = s
			}
			d.mu.Unlock()
			if !fresh {
				continue // a replay we have
			}
			if ctx.Err() != nil {
				continue // the relay is stopping: nothing more is queued
			}
			ev, _ := json.Marshal(struct {
				T string          `json:"t"`
				S int64           `json:"s"`
				D json.RawMessage `json:"d"`
			}{t, s, f.D})
			if err := d.cfg.Deliver(ctx, cur+":"+strconv.FormatInt(s, 10), t, ev); err != nil {
				d.cfg.Log.Warn("relay: event not queued", "type", t, "seq", s, "err", err)
				d.update(func(st *State) { st.Dropped++; st.Seq = s })
			} else {
				d.update(func(st *State) { st.Received++; st.Seq = s })
			}
		}
	}
}

// forget drops the session (the next connection identifies).
func (d *Discord) forget() {
	d.mu.Lock()
	d.res = ""
	d.mu.Unlock()
	d.update(func(s *State) { s.SessionID, s.Seq = "", 0 })
}

// classify turns a connection's end into what to do next.
func (d *Discord) classify(c *websocket.Conn, err error) error {
	var ce *closeErr
	if errors.As(err, &ce) {
		if !ce.resume {
			d.forget()
		}
		return ce
	}
	code := websocket.CloseStatus(err)
	switch code {
	case 4004:
		return fmt.Errorf("%w: authentication failed (close 4004): check the token in the vault", ErrAuth)
	case 4010, 4011, 4012, 4013, 4014:
		return fmt.Errorf("%w: close %d (%s): fix the bot's settings (shards, API version, intents)", ErrAuth, code, closeText(code))
	case 4007, 4009:
		d.forget() // invalid seq / session timed out: identify afresh
	}
	if code == -1 {
		return fmt.Errorf("connection lost: %w", err)
	}
	return fmt.Errorf("gateway closed %d (%s)", code, closeText(code))
}

func closeText(code websocket.StatusCode) string {
	switch code {
	case 4000:
		return "unknown error"
	case 4001:
		return "unknown opcode"
	case 4002:
		return "decode error"
	case 4003:
		return "not authenticated"
	case 4004:
		return "authentication failed"
	case 4005:
		return "already authenticated"
	case 4007:
		return "invalid seq"
	case 4008:
		return "rate limited"
	case 4009:
		return "session timed out"
	case 4010:
		return "invalid shard"
	case 4011:
		return "sharding required"
	case 4012:
		return "invalid API version"
	case 4013:
		return "invalid intents"
	case 4014:
		return "disallowed intents"
	}
	return "closed"
}

// heartbeat sends op 1 every interval (the first after interval·jitter,
// as Discord asks); a heartbeat not ACKed by the next one closes the
// connection to resume.
func (d *Discord) heartbeat(ctx context.Context, interval time.Duration, send func([]byte) error, acked, now <-chan struct{}) error {
	next := time.Now().Add(time.Duration(rand.Float64() * float64(interval)))
	pending := false
	for {
		t := time.NewTimer(time.Until(next))
		forced := false
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-acked:
			t.Stop()
			pending = false
			continue
		case <-now:
			t.Stop()
			forced = true
		case <-t.C:
		}
		if pending && !forced {
			return &closeErr{why: "no heartbeat ACK: zombied connection", resume: true}
		}
		d.mu.Lock()
		seq := d.st.Seq
		d.mu.Unlock()
		p := []byte(`{"op":1,"d":null}`)
		if seq > 0 {
			p = []byte(`{"op":1,"d":` + strconv.FormatInt(seq, 10) + `}`)
		}
		if err := send(p); err != nil {
			return nil // the reader sees the connection's end
		}
		pending = true
		if !forced {
			next = time.Now().Add(interval)
		}
	}
}

// waitSend blocks until a send fits Discord's limit (SendLimit per
// SendWindow).
func (d *Discord) waitSend(ctx context.Context) error {
	for {
		d.mu.Lock()
		now := time.Now()
		cut := now.Add(-d.cfg.SendWindow)
		i := 0
		for i < len(d.sends) && !d.sends[i].After(cut) {
			i++
		}
		d.sends = d.sends[i:]
		if len(d.sends) < d.cfg.SendLimit {
			d.sends = append(d.sends, now)
			d.mu.Unlock()
			return nil
		}
		wait := d.sends[0].Sub(cut)
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// identify sends op 2, no sooner than IdentifyInterval after the last.
func (d *Discord) identify(ctx context.Context, dest string, send func([]byte) error) error {
	d.mu.Lock()
	wait := time.Until(d.lastIdentify.Add(d.cfg.IdentifyInterval))
	d.mu.Unlock()
	if wait > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	d.mu.Lock()
	d.lastIdentify = time.Now()
	d.mu.Unlock()
	return d.sendToken(ctx, dest, send, func(tok []byte) []byte { return identifyPayload(tok, d.cfg.Intents) })
}

// sendToken opens the token for dest (the connection's URL), builds and
// sends the frame, and wipes both the token and the frame.
func (d *Discord) sendToken(ctx context.Context, dest string, send func([]byte) error, build func(tok []byte) []byte) error {
	tok, wipe, err := d.cfg.Token(ctx, dest)
	if err != nil {
		return fmt.Errorf("%w: the bot token cannot be opened: %v", ErrAuth, err)
	}
	defer wipe()
	if len(tok) == 0 || !tokenSafe(tok) {
		return fmt.Errorf("%w: the bot token holds characters a Discord token cannot (a newline?)", ErrAuth)
	}
	p := build(tok)
	defer clear(p)
	return send(p)
}

// tokenSafe: printable ASCII that needs no JSON escaping (the frame is
// built by hand so that its bytes can be wiped, no string copy made).
func tokenSafe(tok []byte) bool {
	for _, b := range tok {
		if b < 0x21 || b > 0x7e || b == '"' || b == '\\' {
			return false
		}
	}
	return true
}

// The frames below carry the token: the caller's send writes them and
// they are wiped after (sendWiped).
func identifyPayload(tok []byte, intents int) []byte {
	p := make([]byte, 0, len(tok)+160)
	p = append(p, `{"op":2,"d":{"token":"`...)
	p = append(p, tok...)
	p = append(p, `","intents":`...)
	p = strconv.AppendInt(p, int64(intents), 10)
	p = append(p, `,"properties":{"os":"linux","browser":"cagebox","device":"cagebox"}}}`...)
	return p
}

func resumePayload(tok []byte, sid string, seq int64) []byte {
	s, _ := json.Marshal(sid)
	p := make([]byte, 0, len(tok)+len(s)+64)
	p = append(p, `{"op":6,"d":{"token":"`...)
	p = append(p, tok...)
	p = append(p, `","session_id":`...)
	p = append(p, s...)
	p = append(p, `,"seq":`...)
	p = strconv.AppendInt(p, seq, 10)
	p = append(p, `}}`...)
	return p
}

func read(ctx context.Context, c *websocket.Conn, timeout time.Duration) (*frame, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	typ, b, err := c.Read(ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		return nil, fmt.Errorf("gateway sent a binary frame (ask for encoding=json without compress)")
	}
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("gateway frame: %w", err)
	}
	return &f, nil
}

// dialFailed is what a relay shows of a failed dial (its events and
// `relay ls`): the guarded dialer's refusal names the class of address;
// anything else — transport errors, status codes, answer bytes — goes to
// the operator's log only, so a relay URL is no probe of what answers
// where.
func dialFailed(log *slog.Logger, what string, err error) error {
	var re *safedial.RefusedError
	if errors.As(err, &re) && re.Rule != "" {
		return fmt.Errorf("dial %s: refused: %s (%s)", what, re.Reason, re.Rule)
	}
	log.Warn("relay dial failed", "to", what, "err", err)
	return fmt.Errorf("dial %s: unreachable, or it refused the WebSocket handshake", what)
}

// clipErr keeps error text short for events.
func clipErr(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return strings.TrimSpace(s)
}
