package policy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func mustPolicy(t testing.TB, src string) *Policy {
	t.Helper()
	d, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	p, err := Compile(d)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return p
}

type decideCase struct {
	name string
	req  Request
	want bool
	rule string // expected Decision.Rule ("" = don't care)
}

func runDecide(t *testing.T, e Engine, cases []decideCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.req
			if r.Port == 0 {
				r.Port = 443
			}
			d, err := e.Decide(context.Background(), &r)
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if d.Allow != tc.want || (tc.rule != "" && d.Rule != tc.rule) {
				t.Fatalf("Decide(%+v) = %+v; want allow=%v rule %q", r, d, tc.want, tc.rule)
			}
			if d.Reason == "" {
				t.Fatal("empty reason")
			}
		})
	}
}

func TestHostMatching(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: exact, host: api.github.com, action: allow}
  - {name: wild, host: "*.usercontent.example.net", action: allow}
`)
	runDecide(t, p, []decideCase{
		{"exact", Request{Host: "api.github.com"}, true, "exact"},
		{"exact upper", Request{Host: "API.GitHub.COM"}, true, "exact"},
		{"exact trailing dot", Request{Host: "api.github.com."}, true, "exact"},
		{"exact other", Request{Host: "github.com"}, false, "default"},
		{"exact suffix trick", Request{Host: "evilapi.github.com"}, false, "default"},
		{"exact prefix trick", Request{Host: "api.github.com.evil.net"}, false, "default"},
		{"wildcard sub", Request{Host: "raw.usercontent.example.net"}, true, "wild"},
		{"wildcard deep", Request{Host: "a.b.usercontent.example.net"}, true, "wild"},
		{"wildcard apex", Request{Host: "usercontent.example.net"}, false, "default"},
		{"wildcard suffix trick", Request{Host: "evilusercontent.example.net"}, false, "default"},
		{"ip literal", Request{Host: "140.82.112.6"}, false, RuleInvalidHost},
		{"ipv6 literal", Request{Host: "::1"}, false, RuleInvalidHost},
		{"empty host", Request{Host: ""}, false, RuleInvalidHost},
		{"host with port", Request{Host: "api.github.com:443"}, false, RuleInvalidHost},
		{"kelvin sign", Request{Host: "api.github.\u212Aom"}, false, RuleInvalidHost},
	})
}

func TestPortsAndMethods(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: default-ports, host: a.example.com, action: allow}
  - {name: custom, host: b.example.com, ports: [8443], action: allow}
  - {name: reads, host: c.example.com, methods: [GET, head], action: allow}
`)
	runDecide(t, p, []decideCase{
		{"443", Request{Host: "a.example.com", Port: 443}, true, "default-ports"},
		{"80", Request{Host: "a.example.com", Port: 80}, true, "default-ports"},
		{"8080", Request{Host: "a.example.com", Port: 8080}, false, "default"},
		{"custom", Request{Host: "b.example.com", Port: 8443}, true, "custom"},
		{"custom not default", Request{Host: "b.example.com", Port: 443}, false, "default"},
		{"get", Request{Host: "c.example.com", Method: "GET"}, true, "reads"},
		{"empty method is get", Request{Host: "c.example.com"}, true, "reads"},
		{"head lower", Request{Host: "c.example.com", Method: "head"}, true, "reads"},
		{"post", Request{Host: "c.example.com", Method: "POST"}, false, "default"},
	})
}

func TestPathGlobs(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - name: no-admin
    host: api.example.com
    paths: ["/admin/**"]
    action: deny
  - name: repos
    host: api.example.com
    paths: ["/repos/*", "/v1/**", "/files/*.json", "/a/**/z", "/exact/"]
    action: allow
`)
	runDecide(t, p, []decideCase{
		{"one segment", Request{Host: "api.example.com", Path: "/repos/x"}, true, "repos"},
		{"one segment trailing slash", Request{Host: "api.example.com", Path: "/repos/x/"}, true, "repos"},
		{"star is one segment", Request{Host: "api.example.com", Path: "/repos/x/y"}, false, "default"},
		{"star needs a segment", Request{Host: "api.example.com", Path: "/repos/"}, false, "default"},
		{"star needs a segment bare", Request{Host: "api.example.com", Path: "/repos"}, false, "default"},
		{"doublestar zero", Request{Host: "api.example.com", Path: "/v1"}, true, "repos"},
		{"doublestar deep", Request{Host: "api.example.com", Path: "/v1/a/b/c"}, true, "repos"},
		{"doublestar not prefix", Request{Host: "api.example.com", Path: "/v10"}, false, "default"},
		{"segment glob", Request{Host: "api.example.com", Path: "/files/a.json"}, true, "repos"},
		{"segment glob miss", Request{Host: "api.example.com", Path: "/files/a.jsonx"}, false, "default"},
		{"middle doublestar", Request{Host: "api.example.com", Path: "/a/b/c/z"}, true, "repos"},
		{"middle doublestar zero", Request{Host: "api.example.com", Path: "/a/z"}, true, "repos"},
		{"middle doublestar miss", Request{Host: "api.example.com", Path: "/a/z/y"}, false, "default"},
		{"trailing slash pattern", Request{Host: "api.example.com", Path: "/exact"}, true, "repos"},
		{"case sensitive", Request{Host: "api.example.com", Path: "/REPOS/x"}, false, "default"},
		{"empty path is root", Request{Host: "api.example.com", Path: ""}, false, "default"},

		// Traversal and encoding tricks are decided on the canonical path.
		{"dotdot out of allowed", Request{Host: "api.example.com", Path: "/repos/x/../../admin/users"}, false, "no-admin"},
		{"dotdot into allowed", Request{Host: "api.example.com", Path: "/admin/../repos/x"}, true, "repos"},
		{"dotdot above root", Request{Host: "api.example.com", Path: "/../../repos/x"}, true, "repos"},
		{"double slash", Request{Host: "api.example.com", Path: "//admin//x"}, false, "no-admin"},
		{"dot segment", Request{Host: "api.example.com", Path: "/./admin/./x"}, false, "no-admin"},
		{"encoded slash", Request{Host: "api.example.com", Path: "/repos/x%2F..%2F..%2Fadmin%2Fx"}, false, "no-admin"},
		{"encoded slash lower", Request{Host: "api.example.com", Path: "/repos/x%2f..%2f..%2fadmin"}, false, "no-admin"},
		{"encoded slash stays in segment count", Request{Host: "api.example.com", Path: "/repos/a%2Fb"}, false, "default"},
		{"encoded dots", Request{Host: "api.example.com", Path: "/repos/%2e%2e/%2E%2E/admin/x"}, false, "no-admin"},
		{"encoded letters", Request{Host: "api.example.com", Path: "/%61dmin/x"}, false, "no-admin"},
		{"double encoded is ambiguous: deny rule wins", Request{Host: "api.example.com", Path: "/repos/%252e%252e/admin"}, false, "no-admin"},
		{"double encoded hits the deny path rule", Request{Host: "api.example.com", Path: "/v1/%2561"}, false, "no-admin"},
		{"backslash ambiguous", Request{Host: "api.example.com", Path: `/repos/x\..\..\admin`}, false, "no-admin"},
		{"semicolon dot segment", Request{Host: "api.example.com", Path: "/repos/..;/admin"}, false, "no-admin"},
		{"semicolon harmless", Request{Host: "api.example.com", Path: "/repos/x;v=1"}, true, "repos"},
		{"nul", Request{Host: "api.example.com", Path: "/repos/x%00"}, false, RuleInvalidPath},
		{"raw nul", Request{Host: "api.example.com", Path: "/repos/x\x00"}, false, RuleInvalidPath},
		{"bad escape", Request{Host: "api.example.com", Path: "/repos/%zz"}, false, RuleInvalidPath},
		{"relative", Request{Host: "api.example.com", Path: "repos/x"}, false, RuleInvalidPath},
		{"absolute form", Request{Host: "api.example.com", Path: "http://api.example.com/repos/x"}, false, RuleInvalidPath},
	})
}

func TestPathsOnlyMatterWhenRestricted(t *testing.T) {
	// A rule without paths allows even ambiguous paths; only path rules care.
	p := mustPolicy(t, `rules: [{host: a.example.com, action: allow}]`)
	runDecide(t, p, []decideCase{
		{"backslash", Request{Host: "a.example.com", Path: `/x\y`}, true, "rule[0]"},
		{"double encoded", Request{Host: "a.example.com", Path: "/x%252F"}, true, "rule[0]"},
		{"nul still refused", Request{Host: "a.example.com", Path: "/x%00"}, false, RuleInvalidPath},
	})
	// A rule with paths never allows an ambiguous path, even one its glob would match.
	p = mustPolicy(t, `rules: [{name: v1, host: a.example.com, paths: ["/v1/**"], action: allow}]`)
	runDecide(t, p, []decideCase{
		{"plain", Request{Host: "a.example.com", Path: "/v1/x"}, true, "v1"},
		{"double encoded", Request{Host: "a.example.com", Path: "/v1/%252e%252e/admin"}, false, "default"},
		{"backslash", Request{Host: "a.example.com", Path: `/v1/x\y`}, false, "default"},
		{"semicolon dots", Request{Host: "a.example.com", Path: "/v1/.;/x"}, false, "default"},
	})
}

func TestFirstMatchWins(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: deny-delete, host: api.example.com, methods: [DELETE], action: deny}
  - {name: allow-all, host: api.example.com, action: allow}
  - {name: never, host: api.example.com, action: deny}
  - {name: wild-deny, host: "*.example.com", action: deny}
  - {name: too-late, host: x.example.com, action: allow}
`)
	runDecide(t, p, []decideCase{
		{"delete denied first", Request{Host: "api.example.com", Method: "DELETE"}, false, "deny-delete"},
		{"delete lower-case denied", Request{Host: "api.example.com", Method: "delete"}, false, "deny-delete"},
		{"get allowed second", Request{Host: "api.example.com", Method: "GET"}, true, "allow-all"},
		{"wildcard deny shadows", Request{Host: "x.example.com"}, false, "wild-deny"},
	})
}

func TestDefaults(t *testing.T) {
	deny := mustPolicy(t, `rules: []`)
	allow := mustPolicy(t, `
default: allow
rules:
  - {name: block, host: blocked.example.com, action: deny}
`)
	runDecide(t, deny, []decideCase{
		{"deny default", Request{Host: "a.example.com", Method: "POST", Path: "/x"}, false, "default"},
	})
	runDecide(t, allow, []decideCase{
		{"allow default", Request{Host: "a.example.com"}, true, "default"},
		{"allow default still has rules", Request{Host: "blocked.example.com"}, false, "block"},
		{"allow default not for websocket", Request{Host: "a.example.com", WebSocket: true}, false, "default"},
		{"allow default not for tcp", Request{Host: "a.example.com", Protocol: "tcp", Port: 22}, false, "default"},
		{"allow default not for doh", Request{Host: "a.example.com", Accept: "application/dns-message"}, false, RuleDoH},
		{"allow default not for ip", Request{Host: "1.1.1.1"}, false, RuleInvalidHost},
	})
	d, _ := deny.Decide(context.Background(), &Request{Host: "api.example.com", Port: 443, Method: "POST", Path: "/x"})
	if want := "no rule allows POST api.example.com:443/x (default deny)"; d.Reason != want {
		t.Fatalf("reason %q, want %q", d.Reason, want)
	}
}

func TestBuiltinsBeatUserRules(t *testing.T) {
	p := mustPolicy(t, `
default: allow
rules:
  - {name: everything, host: "*.dns.google", ports: [443, 80, 8853], action: allow}
  - {name: mail, host: mail.google, action: allow}
  - {name: notdns, host: notdns.google, action: allow}
  - {name: cf, host: "*.cloudflare-dns.com", action: allow}
  - {name: dns-google, host: dns.google, action: allow}
  - {name: tcp-all, host: "*.example.com", ports: [443, 5353], protocol: tcp, action: allow}
  - {name: api, host: api.example.com, action: allow}
`)
	runDecide(t, p, []decideCase{
		{"dot", Request{Host: "api.example.com", Port: 853}, false, RuleDoT},
		{"dot tcp", Request{Host: "x.example.com", Port: 853, Protocol: "tcp"}, false, RuleDoT},
		{"doh content-type", Request{Host: "api.example.com", Method: "POST", ContentType: "application/dns-message"}, false, RuleDoH},
		{"doh content-type params case", Request{Host: "api.example.com", Method: "POST", ContentType: "Application/DNS-Message; charset=x"}, false, RuleDoH},
		{"doh accept list", Request{Host: "api.example.com", Accept: "text/html, application/dns-json;q=0.9"}, false, RuleDoH},
		{"not doh", Request{Host: "api.example.com", Accept: "application/json", ContentType: "application/dns-messages"}, true, "api"},
		{"resolver", Request{Host: "dns.google"}, false, RuleDoHResolver},
		{"resolver upper", Request{Host: "DNS.Google."}, false, RuleDoHResolver},
		{"resolver sub-domain", Request{Host: "security.cloudflare-dns.com"}, false, RuleDoHResolver},
		{"resolver other port", Request{Host: "dns.google", Port: 8853}, false, RuleDoHResolver},
		{"resolver sub-domain under a user wildcard", Request{Host: "x.dns.google", Port: 8853}, false, RuleDoHResolver},
		{"resolver tcp", Request{Host: "one.one.one.one", Protocol: "tcp", Port: 443}, false, RuleDoHResolver},
		{"not a resolver", Request{Host: "mail.google"}, true, "mail"},
		{"resolver name suffix only", Request{Host: "notdns.google"}, true, "notdns"},
	})
}

func TestProtocols(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: http-only, host: web.example.com, action: allow}
  - {name: ws, host: chat.example.com, protocol: websocket, paths: ["/ws/**"], action: allow}
  - {name: db, host: db.example.com, ports: [5432], protocol: tcp, action: allow}
  - {name: deny-ws-path, host: mixed.example.com, paths: ["/private/**"], protocol: websocket, action: deny}
  - {name: deny-tcp, host: mixed.example.com, ports: [2222], protocol: tcp, action: deny}
  - {name: mixed-tcp, host: mixed.example.com, ports: [443, 2222], protocol: tcp, action: allow}
  - {name: mixed-http, host: mixed.example.com, ports: [443, 2222], action: allow}
`)
	runDecide(t, p, []decideCase{
		{"http allowed", Request{Host: "web.example.com"}, true, "http-only"},
		{"http rule no websocket", Request{Host: "web.example.com", WebSocket: true}, false, "default"},
		{"http rule no tcp", Request{Host: "web.example.com", Protocol: "tcp"}, false, "default"},
		{"websocket allowed", Request{Host: "chat.example.com", Path: "/ws/room", WebSocket: true}, true, "ws"},
		{"websocket rule allows plain http", Request{Host: "chat.example.com", Path: "/ws/room"}, true, "ws"},
		{"websocket rule path", Request{Host: "chat.example.com", Path: "/other", WebSocket: true}, false, "default"},
		{"websocket rule no tcp", Request{Host: "chat.example.com", Protocol: "tcp"}, false, "default"},
		{"tcp allowed", Request{Host: "db.example.com", Port: 5432, Protocol: "tcp"}, true, "db"},
		{"tcp other port", Request{Host: "db.example.com", Port: 5433, Protocol: "tcp"}, false, "default"},
		{"tcp rule no http", Request{Host: "db.example.com", Port: 5432}, false, "default"},
		// Deny rules deny whatever the protocol; raw TCP cannot show its path.
		{"deny ws rule denies http", Request{Host: "mixed.example.com", Path: "/private/x"}, false, "deny-ws-path"},
		{"deny ws rule path miss", Request{Host: "mixed.example.com", Path: "/public"}, true, "mixed-http"},
		{"deny path rule denies tcp", Request{Host: "mixed.example.com", Protocol: "tcp"}, false, "deny-ws-path"},
		{"deny tcp rule denies http", Request{Host: "mixed.example.com", Port: 2222}, false, "deny-tcp"},
	})
	d, _ := p.Decide(context.Background(), &Request{Host: "web.example.com", Port: 443, WebSocket: true, Method: "GET", Path: "/s"})
	if !strings.Contains(d.Reason, `protocol "websocket"`) {
		t.Fatalf("reason lacks the hint: %q", d.Reason)
	}
}

func TestDecideErrors(t *testing.T) {
	p := mustPolicy(t, `rules: [{host: a.com, action: allow}]`)
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for name, f := range map[string]func() (Decision, error){
		"nil policy":   func() (Decision, error) { return (*Policy)(nil).Decide(ctx, &Request{Host: "a.com", Port: 443}) },
		"nil request":  func() (Decision, error) { return p.Decide(ctx, nil) },
		"cancelled":    func() (Decision, error) { return p.Decide(cancelled, &Request{Host: "a.com", Port: 443}) },
		"port 0":       func() (Decision, error) { return p.Decide(ctx, &Request{Host: "a.com"}) },
		"port too big": func() (Decision, error) { return p.Decide(ctx, &Request{Host: "a.com", Port: 70000}) },
		"protocol":     func() (Decision, error) { return p.Decide(ctx, &Request{Host: "a.com", Port: 443, Protocol: "udp"}) },
		"tcp websocket": func() (Decision, error) {
			return p.Decide(ctx, &Request{Host: "a.com", Port: 443, Protocol: "tcp", WebSocket: true})
		},
		"empty live": func() (Decision, error) { return (&Live{}).Decide(ctx, &Request{Host: "a.com", Port: 443}) },
	} {
		d, err := f()
		if err == nil || d.Allow {
			t.Errorf("%s: %+v %v, want an error and no allow", name, d, err)
		}
	}
}

func TestReasonsAreSafe(t *testing.T) {
	p := mustPolicy(t, `rules: []`)
	d, err := p.Decide(context.Background(), &Request{Host: "a.com", Port: 443, Method: "GET", Path: "/\x1b[31m" + strings.Repeat("x", 5000)})
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(d.Reason, 0x1b) || len(d.Reason) > 600 {
		t.Fatalf("reason not sanitized: %q", d.Reason)
	}
}

func TestAllowsName(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {host: api.example.com, action: allow}
  - {host: "*.cdn.example.com", protocol: tcp, ports: [9000], action: allow}
  - {host: denied.example.com, action: deny}
  - {host: "*.quad9.net", action: allow}
`)
	for name, want := range map[string]bool{
		"api.example.com":    true,
		"API.EXAMPLE.COM.":   true,
		"x.cdn.example.com":  true,
		"cdn.example.com":    false,
		"denied.example.com": false,
		"other.example.com":  false,
		"www.quad9.net":      true,
		"dns.quad9.net":      false,
		"":                   false,
		"127.0.0.1":          false,
	} {
		if got := p.AllowsName(name); got != want {
			t.Errorf("AllowsName(%q) = %v, want %v", name, got, want)
		}
	}
	all := mustPolicy(t, `default: allow`)
	for name, want := range map[string]bool{"anything.example": true, "cloudflare-dns.com": false, "10.0.0.1": false} {
		if got := all.AllowsName(name); got != want {
			t.Errorf("default allow: AllowsName(%q) = %v, want %v", name, got, want)
		}
	}
	if (*Policy)(nil).AllowsName("a.com") || (&Live{}).AllowsName("a.com") {
		t.Error("no policy allows a name")
	}
}

func TestLiveSwapConcurrent(t *testing.T) {
	a := mustPolicy(t, `rules: [{name: a, host: a.example.com, action: allow}]`)
	b := mustPolicy(t, `rules: [{name: b, host: b.example.com, action: allow}]`)
	l := &Live{}
	l.Set(a)
	if l.Current() != a {
		t.Fatal("Current")
	}
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Exactly one of the two hosts is allowed at any instant a
				// decision is made with one policy.
				da, err := l.Decide(ctx, &Request{Host: "a.example.com", Port: 443})
				if err != nil {
					t.Error(err)
					return
				}
				if da.Allow && da.Rule != "a" || !da.Allow && da.Rule != "default" {
					t.Errorf("inconsistent decision %+v", da)
					return
				}
				_ = l.AllowsName("b.example.com")
			}
		}()
	}
	for i := range 2000 {
		if i%2 == 0 {
			l.Set(b)
		} else {
			l.Set(a)
		}
	}
	// A change applies to the very next request.
	l.Set(b)
	if d, _ := l.Decide(ctx, &Request{Host: "b.example.com", Port: 443}); !d.Allow {
		t.Error("new policy not applied")
	}
	if d, _ := l.Decide(ctx, &Request{Host: "a.example.com", Port: 443}); d.Allow {
		t.Error("old policy still applied")
	}
	close(stop)
	wg.Wait()
}

func BenchmarkDecide(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("rules:\n")
	for i := range 49 {
		fmt.Fprintf(&sb, "  - {host: \"svc%d.example.com\", methods: [GET, POST], paths: [\"/api/v1/**\", \"/repos/*/issues\"], action: allow}\n", i)
	}
	sb.WriteString("  - {name: last, host: \"*.github.com\", paths: [\"/repos/*/pulls/**\"], action: allow}\n")
	p := mustPolicy(b, sb.String())
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		req  Request
		want bool
	}{
		{"last-rule-allow", Request{Host: "api.github.com", Port: 443, Method: "GET", Path: "/repos/x/pulls/1/files", Accept: "application/json"}, true},
		{"default-deny", Request{Host: "nowhere.example.org", Port: 443, Method: "GET", Path: "/x", Accept: "*/*"}, false},
		{"first-rule-encoded", Request{Host: "svc0.example.com", Port: 443, Method: "POST", Path: "/api/v1/a%2Fb/../c"}, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d, err := p.Decide(ctx, &bc.req)
				if err != nil || d.Allow != bc.want {
					b.Fatalf("%+v %v", d, err)
				}
			}
		})
	}
}

func TestNamesHost(t *testing.T) {
	d, err := Parse([]byte(`{"version":1,"rules":[{"name":"no-other","host":"other.example.test","action":"deny"},{"host":"*.api.test","action":"allow"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(d)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"other.example.test": true, "x.api.test": true, "api.test": false, "unrelated.test": false, "dns.google": false} {
		if got := p.NamesHost(name); got != want {
			t.Errorf("NamesHost(%q) = %v, want %v", name, got, want)
		}
	}
	if p.AllowsName("other.example.test") {
		t.Error("AllowsName true for a denied name")
	}
}

// TestPathReadings: a path rule holds for every way servers read a path.
// Allow rules must match every reading (with and without splitting on an
// encoded slash, with and without ";" path parameters); deny rules match
// any reading, in any letter case.
func TestPathReadings(t *testing.T) {
	deny := mustPolicy(t, `
default: allow
rules: [{name: no-admin, host: a.example.com, paths: ["/admin/**", "/Files/*.KEY"], action: deny}]
`)
	runDecide(t, deny, []decideCase{
		{"plain", Request{Host: "a.example.com", Path: "/admin/x"}, false, "no-admin"},
		{"upper", Request{Host: "a.example.com", Path: "/ADMIN/x"}, false, "no-admin"},
		{"mixed", Request{Host: "a.example.com", Path: "/aDmIn"}, false, "no-admin"},
		{"escaped upper", Request{Host: "a.example.com", Path: "/%41DMIN/x"}, false, "no-admin"},
		{"long s folds to s", Request{Host: "a.example.com", Path: "/File%C5%BF/a.KEY"}, false, "no-admin"},
		{"kelvin sign folds to k", Request{Host: "a.example.com", Path: "/files/a.%E2%84%AAey"}, false, "no-admin"},
		{"glob in any case", Request{Host: "a.example.com", Path: "/files/secret.key"}, false, "no-admin"},
		{"path parameter", Request{Host: "a.example.com", Path: "/admin;jsessionid=1/x"}, false, "no-admin"},
		{"encoded path parameter", Request{Host: "a.example.com", Path: "/admin%3Bx/y"}, false, "no-admin"},
		{"encoded slash splits", Request{Host: "a.example.com", Path: "/admin%2Fx"}, false, "no-admin"},
		{"elsewhere", Request{Host: "a.example.com", Path: "/administrator"}, true, RuleDefault},
		{"elsewhere with params", Request{Host: "a.example.com", Path: "/public;admin/x"}, true, RuleDefault},
	})
	allow := mustPolicy(t, `
rules: [{name: repos, host: a.example.com, paths: ["/repos/*/issues", "/v1/**"], action: allow}]
`)
	runDecide(t, allow, []decideCase{
		{"plain", Request{Host: "a.example.com", Path: "/repos/x/issues"}, true, "repos"},
		{"case-sensitive", Request{Host: "a.example.com", Path: "/REPOS/x/issues"}, false, RuleDefault},
		{"encoded slash: two readings, one fails", Request{Host: "a.example.com", Path: "/repos/a%2Fb/issues"}, false, RuleDefault},
		{"encoded slash under **: both readings match", Request{Host: "a.example.com", Path: "/v1/a%2Fb"}, true, "repos"},
		{"path parameter on the last segment", Request{Host: "a.example.com", Path: "/repos/x/issues;v=1"}, false, RuleDefault},
		{"path parameter under **", Request{Host: "a.example.com", Path: "/v1/x;v=1"}, true, "repos"},
		{"path parameter hiding a segment", Request{Host: "a.example.com", Path: "/repos/x;/issues"}, true, "repos"},
	})
}
