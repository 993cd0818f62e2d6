package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/policy"
)

// realPolicy has the proxy ask a compiled policy document, as the gateway
// does (the document sees what the proxy passes, nothing more).
func realPolicy(t *testing.T, doc string) PolicyFunc {
	t.Helper()
	d, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Compile(d)
	if err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, r *Request) (Decision, error) {
		if r.Protocol == "http" && r.Method == "" && r.Path == "" {
			return Decision{Allow: p.AllowsName(r.Host), Rule: "connection"}, nil
		}
		d, err := p.Decide(ctx, &policy.Request{Host: r.Host, Port: r.Port, Protocol: r.Protocol, Method: r.Method, Path: r.Path,
			WebSocket: r.WebSocket, ContentType: r.ContentType, Accept: r.Accept})
		return Decision{Allow: d.Allow, Rule: d.Rule, Reason: d.Reason}, err
	}
}

// rawHTTPS sends one request line and headers, byte for byte, over TLS
// through the proxy and returns the response.
func rawHTTPS(t *testing.T, h *harness, method, target, headers string) (*http.Response, string) {
	t.Helper()
	c, err := h.tlsDial("api.example.test", "http/1.1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: api.example.test\r\n%sConnection: close\r\n\r\n", method, target, headers)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

const (
	// pathDenyDoc: nothing but GET under /public, never /admin.
	pathDenyDoc = `
rules:
  - {name: no-admin, host: api.example.test, paths: ["/admin/**"], action: deny}
  - {name: public, host: api.example.test, paths: ["/public/**"], methods: [GET], action: allow}
`
	// pathAllowDoc: anything but /admin.
	pathAllowDoc = `
default: allow
rules:
  - {name: no-admin, host: api.example.test, paths: ["/admin/**"], action: deny}
`
)

// TestPathDecidedOnceAndSentAsDecided attacks path rules through the real
// proxy and a real policy: every spelling is decided on the path as sent,
// decoded exactly once, and an allowed request reaches the upstream with
// exactly the path that was decided on. Before, the proxy handed the policy
// an already-decoded path that the policy decoded again, so
// "/admin/%252e%252e/public" was decided as "/public" and sent as the
// /admin path it is.
func TestPathDecidedOnceAndSentAsDecided(t *testing.T) {
	cases := []struct {
		name, doc, method, target, headers string
		rule                               string // deciding rule; "" for a builtin:path refusal
		allow                              bool
		upMethod, upURI                    string // what the upstream must receive
	}{
		// Double and mixed encoding: a segment that is a dot segment in
		// any decoding is refused by the proxy; any other escape left
		// after one decoding is ambiguous, which no path rule allows and
		// every path deny rule matches.
		{"double-encoded dots into allowed", pathDenyDoc, "GET", "/admin/%252e%252e/public/x", "", "", false, "", ""},
		{"double-encoded dots, upper", pathDenyDoc, "GET", "/admin/%252E%252E/public/x", "", "", false, "", ""},
		{"mixed encoding", pathDenyDoc, "GET", "/admin/%252e%2e/public/x", "", "", false, "", ""},
		{"double-encoded under default allow", pathAllowDoc, "GET", "/admin/%252e%252e/x", "", "", false, "", ""},
		{"triple-encoded", pathAllowDoc, "GET", "/admin/%25252e%25252e/x", "", "", false, "", ""},
		{"double-encoded slash and dots", pathDenyDoc, "GET", "/admin%252F..%252Fpublic/x", "", "no-admin", false, "", ""},
		{"double-encoded letter", pathAllowDoc, "GET", "/%2561dmin/x", "", "no-admin", false, "", ""},
		{"double-encoded inside allowed", pathDenyDoc, "GET", "/public/%2541", "", "no-admin", false, "", ""},
		// %2e dot segments are dot segments.
		{"encoded dot segment", pathDenyDoc, "GET", "/public/%2e%2e/admin/x", "", "", false, "", ""},
		{"encoded dot segment upper", pathDenyDoc, "GET", "/public/%2E%2E/admin/x", "", "", false, "", ""},
		{"encoded single dot", pathDenyDoc, "GET", "/public/%2e/x", "", "", false, "", ""},
		{"half-encoded dots", pathDenyDoc, "GET", "/public/.%2e/admin", "", "", false, "", ""},
		// Encoded slashes: a rule must hold whether or not the server
		// splits on them; a deny rule applies if it splits.
		{"encoded slash into denied", pathAllowDoc, "GET", "/admin%2Fsecret", "", "no-admin", false, "", ""},
		{"encoded slash lower into denied", pathAllowDoc, "GET", "/admin%2fsecret", "", "no-admin", false, "", ""},
		{"encoded slash out of allowed", pathDenyDoc, "GET", "/public%2F..%2Fadmin", "", "", false, "", ""},
		{"encoded slash makes one segment", pathDenyDoc, "GET", "/public%2Fx", "", "default", false, "", ""},
		{"encoded slash inside allowed", pathDenyDoc, "GET", "/public/a%2fb", "", "public", true, "GET", "/public/a%2Fb"},
		// ";" path parameters: servlet containers route "/admin;x/y" as
		// "/admin/y".
		{"path parameter hides denied", pathAllowDoc, "GET", "/admin;jsessionid=1/secret", "", "no-admin", false, "", ""},
		{"path parameter, encoded", pathAllowDoc, "GET", "/admin%3bx/secret", "", "no-admin", false, "", ""},
		{"dot-dot parameter", pathDenyDoc, "GET", "/public/..;/admin", "", "no-admin", false, "", ""},
		{"harmless parameter", pathDenyDoc, "GET", "/public/x;v=1", "", "public", true, "GET", "/public/x;v=1"},
		// Case: escapes are normalised; deny rules match any letter case
		// (some servers route case-insensitively); allow rules only their own.
		{"escaped letters", pathDenyDoc, "GET", "/%61dmin/x", "", "no-admin", false, "", ""},
		{"escaped upper letters", pathAllowDoc, "GET", "/%41DMIN/x", "", "no-admin", false, "", ""},
		{"upper-case path", pathAllowDoc, "GET", "/ADMIN/x", "", "no-admin", false, "", ""},
		{"mixed-case path", pathAllowDoc, "GET", "/aDmIn/x", "", "no-admin", false, "", ""},
		{"long s", pathAllowDoc, "GET", "/admin%C5%BF/x", "", "default", true, "GET", "/admin%C5%BF/x"},
		{"allow rule keeps its case", pathDenyDoc, "GET", "/PUBLIC/x", "", "default", false, "", ""},
		{"unreserved escape decoded", pathDenyDoc, "GET", "/public/%7euser/%41", "", "public", true, "GET", "/public/~user/A"},
		{"reserved escape kept, upper-cased", pathDenyDoc, "GET", "/public/a%3fb%2cc", "", "public", true, "GET", "/public/a%3Fb%2Cc"},
		{"bare bytes escaped", pathDenyDoc, "GET", "/public/a\"b{c}", "", "public", true, "GET", "/public/a%22b%7Bc%7D"},
		{"backslash", pathDenyDoc, "GET", `/public/x\..\admin`, "", "", false, "", ""},
		{"query untouched", pathDenyDoc, "GET", "/public/x?a=%2e%2e&b=%7e", "", "public", true, "GET", "/public/x?a=%2e%2e&b=%7e"},
		// The method the policy matched is the method sent.
		{"lower-case method", pathDenyDoc, "get", "/public/x", "", "public", true, "GET", "/public/x"},
		{"mixed-case method", pathDenyDoc, "gEt", "/public/x", "", "public", true, "GET", "/public/x"},
		{"method not allowed", pathDenyDoc, "delete", "/public/x", "", "default", false, "", ""},
		{"method override header", pathDenyDoc, "GET", "/public/x", "X-HTTP-Method-Override: DELETE\r\n", "default", false, "", ""},
		{"method override header, lower", pathDenyDoc, "GET", "/public/x", "X-Http-Method: delete\r\n", "default", false, "", ""},
		{"method override query", pathDenyDoc, "GET", "/public/x?_method=PUT", "", "default", false, "", ""},
		{"method override to itself", pathDenyDoc, "GET", "/public/x", "X-HTTP-Method-Override: GET\r\n", "public", true, "GET", "/public/x"},
		{"method override not a method", pathDenyDoc, "GET", "/public/x", "X-Method-Override: DE LETE\r\n", "builtin:method-override", false, "", ""},
	}
	h := newHarness(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h.setPolicy(realPolicy(t, tc.doc))
			before := len(h.api.seen())
			resp, body := rawHTTPS(t, h, tc.method, tc.target, tc.headers)
			got := h.api.seen()[before:]
			if !tc.allow {
				rule := tc.rule
				if rule == "" {
					rule = rulePath
				}
				wantDenied(t, resp, body, rule)
				if len(got) != 0 {
					t.Fatalf("denied, yet the upstream received %+v", got)
				}
				return
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, body %q", resp.StatusCode, body)
			}
			if len(got) != 1 || got[0].Method != tc.upMethod || got[0].URI != tc.upURI {
				t.Fatalf("upstream received %+v, want %s %s", got, tc.upMethod, tc.upURI)
			}
		})
	}
}

// TestPathSentAsDecidedHTTP2: the same over HTTP/2, where the path is the
// :path pseudo-header.
func TestPathSentAsDecidedHTTP2(t *testing.T) {
	h := newHarness(t)
	h.setPolicy(realPolicy(t, pathDenyDoc))
	c := h.client(true)
	for _, tc := range []struct{ opaque, status, uri string }{
		{"/public/a%2fb%7e", "200", "/public/a%2Fb~"},
		{"/admin/%252e%252e/public/x", "403", ""},
		{"/public/%2e%2e/admin", "403", ""},
	} {
		req := newReq(t, "GET", "https://api.example.test/", nil)
		req.URL.Opaque = tc.opaque
		before := len(h.api.seen())
		resp, body := get(t, c, req)
		if fmt.Sprint(resp.StatusCode) != tc.status || resp.ProtoMajor != 2 {
			t.Fatalf("%s: %s %d %q", tc.opaque, resp.Proto, resp.StatusCode, body)
		}
		got := h.api.seen()[before:]
		if tc.uri == "" && len(got) != 0 || tc.uri != "" && (len(got) != 1 || got[0].URI != tc.uri) {
			t.Fatalf("%s: upstream received %+v, want %q", tc.opaque, got, tc.uri)
		}
	}
}

func TestCanonicalPath(t *testing.T) {
	for _, tc := range []struct{ wire, canon, problem string }{
		{"", "/", ""},
		{"/", "/", ""},
		{"/a/b", "/a/b", ""},
		{"/%61%2D%2e%5F%7E%30", "/a-._~0", ""},
		{"/a%2fb%2Fc%3b%3A%40", "/a%2Fb%2Fc%3B%3A%40", ""},
		{"/%25%2525", "/%25%2525", ""},
		{"/a b\\c\x7f\xff", "/a%20b%5Cc%7F%FF", ""},
		{"/!$&'()*+,;=:@", "/!$&'()*+,;=:@", ""},
		{"/[x]|^`<>", "/%5Bx%5D%7C%5E%60%3C%3E", ""},
		{"/%", "", "the request path has a malformed percent-escape"},
		{"/%2", "", "the request path has a malformed percent-escape"},
		{"/%g0", "", "the request path has a malformed percent-escape"},
		{"*", "", "the request path does not start with \"/\""},
		{"a/b", "", "the request path does not start with \"/\""},
	} {
		canon, problem := canonicalPath(tc.wire)
		if canon != tc.canon || problem != tc.problem {
			t.Errorf("canonicalPath(%q) = %q, %q; want %q, %q", tc.wire, canon, problem, tc.canon, tc.problem)
		}
	}
}

// FuzzCanonicalPath: the canonical form means what the path sent means
// (one decoding of each gives the same bytes), is its own canonical form,
// and is what a transport sends for the URL setPath makes.
func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{"/", "/a%2fb", "/%2e%2e/x", "/%252e", "/a b", "/\xff%7E", "/[x]", "/a;b=c/%3B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, wire string) {
		canon, problem := canonicalPath(wire)
		if problem != "" || wire == "" {
			return
		}
		dw, err1 := url.PathUnescape(wire)
		dc, err2 := url.PathUnescape(canon)
		if err1 != nil || err2 != nil || dw != dc {
			t.Fatalf("%q → %q: decodes to %q (%v), not %q (%v)", wire, canon, dc, err2, dw, err1)
		}
		if again, _ := canonicalPath(canon); again != canon {
			t.Fatalf("%q → %q → %q", wire, canon, again)
		}
		u := &url.URL{Scheme: "https", Host: "h"}
		setPath(u, canon, dc)
		if u.Opaque != "" || u.RequestURI() != canon {
			t.Fatalf("%q: sent as %q (opaque %q)", canon, u.RequestURI(), u.Opaque)
		}
	})
}

// TestPeekerKeepsTheBody: a held request's preview reads ahead, and the
// upstream still receives the whole body.
func TestPeekerKeepsTheBody(t *testing.T) {
	body := strings.Repeat("0123456789", 300)
	r := httptest.NewRequest("POST", "https://api.example.test/x", strings.NewReader(body))
	peek := peeker(r)
	if got := string(peek(1024)); got != body[:1024] {
		t.Fatalf("preview %q", got)
	}
	if got := string(peek(1024)); got != body[:1024] {
		t.Fatal("a second peek differs")
	}
	rest, err := io.ReadAll(r.Body)
	if err != nil || string(rest) != body {
		t.Fatalf("body after peeking: %d bytes, %v", len(rest), err)
	}
	short := httptest.NewRequest("POST", "https://api.example.test/x", strings.NewReader("tiny"))
	if got := string(peeker(short)(1024)); got != "tiny" {
		t.Fatalf("short body preview %q", got)
	}
	if b, _ := io.ReadAll(short.Body); string(b) != "tiny" {
		t.Fatalf("short body after peeking %q", b)
	}
}
