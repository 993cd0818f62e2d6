package policy

import (
	"context"
	"encoding/json"
	"net/url"
	"path"
	"strings"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		sampleYAML, sampleJSON, "", "{}", "rules: []", "default: allow",
		`{"rules":[{"host":"*.a.com","paths":["/a/**/b"],"action":"allow"}]}`,
		"rules:\n  - host: &a x.com\n    action: *a\n",
		"rules: [{host: a.com, action: deny, ports: [0x1bb]}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse(data)
		if err != nil {
			return
		}
		p, err := Compile(d)
		if err != nil {
			t.Fatalf("parsed but does not compile: %v", err)
		}
		// The normalized document survives a JSON round trip unchanged.
		js, err := json.Marshal(p.Document())
		if err != nil {
			t.Fatal(err)
		}
		d2, err := Parse(js)
		if err != nil {
			t.Fatalf("normalized document does not parse: %v\n%s", err, js)
		}
		p2, err := Compile(d2)
		if err != nil {
			t.Fatal(err)
		}
		js2, _ := json.Marshal(p2.Document())
		if string(js) != string(js2) {
			t.Fatalf("normalizing is not idempotent:\n%s\n%s", js, js2)
		}
		for _, h := range []string{"a.com", "x.a.com", "dns.google"} {
			_, _ = p.Decide(context.Background(), &Request{Host: h, Port: 443, Method: "GET", Path: "/a/b"})
			_ = p.AllowsName(h)
		}
	})
}

// referenceCanonical is an independent statement of the canonical path: decode
// once, then resolve segments by hand.
func referenceCanonical(raw string) (string, bool) {
	dec, err := url.PathUnescape(raw)
	if err != nil || !strings.HasPrefix(raw, "/") || strings.ContainsRune(dec, 0) {
		return "", false
	}
	var out []string
	for seg := range strings.SplitSeq(dec, "/") {
		switch seg {
		case "", ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, seg)
		}
	}
	return "/" + strings.Join(out, "/"), true
}

// FuzzDecidePath checks that no spelling of a path gets past the path rules:
// whatever is allowed by a path rule canonicalizes into the allowed tree, and
// nothing that canonicalizes into the denied tree is allowed.
func FuzzDecidePath(f *testing.F) {
	p, err := Compile(&Document{Rules: []Rule{
		{Name: "deny-admin", Host: "a.com", Paths: []string{"/public/admin/**"}, Action: "deny"},
		{Name: "public", Host: "a.com", Paths: []string{"/public/**", "/files/*.txt"}, Action: "allow"},
	}})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"/public/x", "/public/../secret", "/public/%2e%2e/secret", "/public%2F..%2Fsecret",
		"//public//admin", "/public/./admin/x", "/public/admin%2Fx", `/public\..\secret`,
		"/public/%252e%252e/secret", "/public/..;/secret", "/files/a.txt", "/files/a.txt/../../x",
		"/public/x%00", "", "public", "/%zz", "/public/adm%69n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		d, err := p.Decide(context.Background(), &Request{Host: "a.com", Port: 443, Method: "GET", Path: raw})
		if err != nil {
			t.Fatal(err)
		}
		canon, ok := referenceCanonical(raw)
		if raw == "" {
			canon, ok = "/", true
		}
		if !ok {
			if d.Allow {
				t.Fatalf("%q is malformed but allowed: %+v", raw, d)
			}
			return
		}
		if pc := path.Clean(canon); pc != canon {
			t.Fatalf("reference %q is not clean (%q)", canon, pc)
		}
		if !d.Allow {
			return
		}
		if isAmbiguousPath(mustUnescape(raw)) {
			t.Fatalf("ambiguous %q allowed: %+v", raw, d)
		}
		inPublic := canon == "/public" || strings.HasPrefix(canon, "/public/")
		inAdmin := canon == "/public/admin" || strings.HasPrefix(canon, "/public/admin/")
		segs := strings.Split(canon, "/")
		isFile := len(segs) == 3 && segs[1] == "files" && strings.HasSuffix(segs[2], ".txt")
		if inAdmin || !(inPublic || isFile) {
			t.Fatalf("%q (canonical %q) allowed by %q", raw, canon, d.Rule)
		}
	})
}

func mustUnescape(s string) string {
	d, err := url.PathUnescape(s)
	if err != nil {
		panic(err)
	}
	return d
}

// FuzzGlob compares the segment matcher with a naive recursive one.
func FuzzGlob(f *testing.F) {
	f.Add("/a/**/b/*.c", "/a/x/y/b/z.c")
	f.Add("/**/**/x", "/x")
	f.Add("/*a*b*", "/aab")
	f.Fuzz(func(t *testing.T, pat, p string) {
		pp, reason := parsePathPattern(pat)
		if reason != "" {
			return
		}
		rp, problem := canonicalPath(p)
		if problem != "" {
			return
		}
		segs := rp.segmentReadings(false)[0]
		if got, want := pp.match(segs), naiveMatch(pp.segs, segs); got != want {
			t.Fatalf("match(%q, %q) = %v, naive %v", pat, rp.clean, got, want)
		}
	})
}

func naiveMatch(pat, segs []string) bool {
	if len(pat) == 0 {
		return len(segs) == 0
	}
	if pat[0] == "**" {
		for i := 0; i <= len(segs); i++ {
			if naiveMatch(pat[1:], segs[i:]) {
				return true
			}
		}
		return false
	}
	if len(segs) == 0 {
		return false
	}
	ok, _ := path.Match(strings.NewReplacer(`\`, `\\`, "[", `\[`, "?", `\?`).Replace(pat[0]), segs[0])
	return ok && segs[0] != "" && naiveMatch(pat[1:], segs[1:])
}
