package policy

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const sampleYAML = `
version: 1
default: deny
rules:
  - name: github-read
    host: "*.github.com"
    methods: [get, HEAD]
    paths: ["/repos/*", "/v1/**"]
    action: allow
  - host: API.Example.com.
    ports: [8443]
    action: deny
  - name: db
    host: db.example.com
    ports: [5432]
    protocol: tcp
    action: allow
  - name: chat
    host: chat.example.com
    protocol: websocket
    paths: [/ws]
    action: allow
`

const sampleJSON = `{
  "version": 1,
  "default": "deny",
  "rules": [
    {"name": "github-read", "host": "*.github.com", "methods": ["get", "HEAD"], "paths": ["/repos/*", "/v1/**"], "action": "allow"},
    {"host": "API.Example.com.", "ports": [8443], "action": "deny"},
    {"name": "db", "host": "db.example.com", "ports": [5432], "protocol": "tcp", "action": "allow"},
    {"name": "chat", "host": "chat.example.com", "protocol": "websocket", "paths": ["/ws"], "action": "allow"}
  ]
}`

func TestParseJSONAndYAMLAgree(t *testing.T) {
	y, err := Parse([]byte(sampleYAML))
	if err != nil {
		t.Fatalf("yaml: %v", err)
	}
	j, err := Parse([]byte(" \n" + sampleJSON))
	if err != nil {
		t.Fatalf("json: %v", err)
	}
	if !reflect.DeepEqual(y, j) {
		t.Fatalf("yaml and json differ:\n%+v\n%+v", y, j)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, src := range []string{sampleYAML, sampleJSON} {
		d, err := Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		p, err := Compile(d)
		if err != nil {
			t.Fatal(err)
		}
		norm := p.Document()
		if norm.Rules[1].Name != "rule[1]" || norm.Rules[1].Host != "api.example.com" ||
			norm.Rules[0].Protocol != "http" || !reflect.DeepEqual(norm.Rules[0].Ports, []int{443, 80}) ||
			!reflect.DeepEqual(norm.Rules[0].Methods, []string{"GET", "HEAD"}) {
			t.Fatalf("normalized document: %+v", norm)
		}
		// Both encodings of the document, and of its normalized form, parse back to the same thing.
		for _, doc := range []*Document{d, norm} {
			js, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			fromJSON, err := Parse(js)
			if err != nil {
				t.Fatalf("parse %s: %v", js, err)
			}
			ys, err := yaml.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			fromYAML, err := Parse(ys)
			if err != nil {
				t.Fatalf("parse %s: %v", ys, err)
			}
			if !reflect.DeepEqual(fromJSON, doc) || !reflect.DeepEqual(fromYAML, doc) {
				t.Fatalf("round trip changed the document:\n%+v\n%+v\n%+v", doc, fromJSON, fromYAML)
			}
		}
		// Normalizing is idempotent.
		p2, err := Compile(norm)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(p2.Document(), norm) {
			t.Fatalf("normalizing twice changed the document")
		}
		// Document returns a copy.
		norm.Rules[0].Host = "evil.example"
		norm.Rules[0].Ports[0] = 1
		if p.Document().Rules[0].Host != "*.github.com" || p.Document().Rules[0].Ports[0] != 443 {
			t.Fatal("Document shares memory with the policy")
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"empty", "  \n", "empty"},
		{"yaml unknown field", "rules:\n  - host: a.com\n    action: allow\n    hots: x\n", "hots"},
		{"yaml top unknown field", "version: 1\nrule: []\n", "rule"},
		{"json unknown field", `{"rules":[{"host":"a.com","action":"allow","hots":"x"}]}`, "hots"},
		{"json upper-case key", `{"rules":[{"HOST":"a.com","action":"allow"}]}`, "HOST"},
		{"json duplicate key", `{"rules":[{"host":"a.com","action":"deny","action":"allow"}]}`, "duplicate"},
		{"yaml duplicate key", "rules:\n  - host: a.com\n    action: deny\n    action: allow\n", "already defined"},
		{"json trailing data", `{"rules":[]} {"rules":[]}`, "after the document"},
		{"yaml two documents", "rules: []\n---\nrules: []\n", "more than one document"},
		{"yaml unquoted wildcard", "rules:\n  - host: *.github.com\n    action: allow\n", "quote hosts"},
		{"json syntax", `{"rules": [}`, "json"},
		{"yaml wrong type", "rules:\n  - host: a.com\n    ports: 443\n    action: allow\n", "yaml"},
		{"json wrong type", `{"rules":[{"host":"a.com","ports":"443","action":"allow"}]}`, "json"},
		{"too big", "#" + strings.Repeat(" ", MaxDocumentSize), "limit"},
		{"validation", "rules:\n  - host: a.com\n", "rules[0].action"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestValidationErrors(t *testing.T) {
	rule := func(mod func(*Rule)) *Document {
		r := Rule{Host: "a.example.com", Action: "allow"}
		mod(&r)
		return &Document{Rules: []Rule{{Host: "ok.example.com", Action: "deny"}, r}}
	}
	many := &Document{}
	for range MaxRules + 1 {
		many.Rules = append(many.Rules, Rule{Host: "a.com", Action: "deny"})
	}
	for _, tc := range []struct {
		name  string
		doc   *Document
		field string
		want  string // in the reason
	}{
		{"version", &Document{Version: 3}, "version", "versions 1 and 2"},
		{"default", &Document{Default: "Deny"}, "default", `"allow"`},
		{"too many rules", many, "rules", "limit is 1000"},
		{"no action", rule(func(r *Rule) { r.Action = "" }), "rules[1].action", "required"},
		{"bad action", rule(func(r *Rule) { r.Action = "permit" }), "rules[1].action", `"allow", "deny" or "hold"`},
		{"bad protocol", rule(func(r *Rule) { r.Protocol = "udp" }), "rules[1].protocol", `"tcp"`},
		{"no host", rule(func(r *Rule) { r.Host = "" }), "rules[1].host", "required"},
		{"ipv4 host", rule(func(r *Rule) { r.Host = "10.0.0.1" }), "rules[1].host", "IP address"},
		{"ipv6 host", rule(func(r *Rule) { r.Host = "[::1]" }), "rules[1].host", "IP address"},
		{"ipv6 bare", rule(func(r *Rule) { r.Host = "fd00:ec2::254" }), "rules[1].host", "IP address"},
		{"decimal ip", rule(func(r *Rule) { r.Host = "2130706433" }), "rules[1].host", "numeric"},
		{"short ip", rule(func(r *Rule) { r.Host = "127.1" }), "rules[1].host", "numeric"},
		{"hex ip", rule(func(r *Rule) { r.Host = "0x7f.0x1" }), "rules[1].host", "numeric"},
		{"port in host", rule(func(r *Rule) { r.Host = "a.com:443" }), "rules[1].host", "ports"},
		{"scheme", rule(func(r *Rule) { r.Host = "https://a.com" }), "rules[1].host", "scheme"},
		{"path in host", rule(func(r *Rule) { r.Host = "a.com/x" }), "rules[1].host", "path"},
		{"lone star", rule(func(r *Rule) { r.Host = "*" }), "rules[1].host", "default: allow"},
		{"star inside", rule(func(r *Rule) { r.Host = "a.*.com" }), "rules[1].host", "first label"},
		{"star prefix", rule(func(r *Rule) { r.Host = "*a.com" }), "rules[1].host", "first label"},
		{"double star", rule(func(r *Rule) { r.Host = "*.*.com" }), "rules[1].host", "first label"},
		{"empty label", rule(func(r *Rule) { r.Host = "a..com" }), "rules[1].host", "empty label"},
		{"bad char", rule(func(r *Rule) { r.Host = "a b.com" }), "rules[1].host", "character"},
		{"hyphen", rule(func(r *Rule) { r.Host = "-a.com" }), "rules[1].host", "'-'"},
		{"unicode", rule(func(r *Rule) { r.Host = "bücher.de" }), "rules[1].host", "punycode"},
		{"kelvin sign", rule(func(r *Rule) { r.Host = "\u212Aey.com" }), "rules[1].host", "punycode"},
		{"wildcard over a TLD", rule(func(r *Rule) { r.Host = "*.com" }), "rules[1].host", "top-level domain"},
		{"wildcard over a public suffix", rule(func(r *Rule) { r.Host = "*.co.uk" }), "rules[1].host", "public suffix"},
		{"wildcard over an ICANN public suffix", rule(func(r *Rule) { r.Host = "*.co.uk" }), "rules[1].host", "public suffix"},
		{"long label", rule(func(r *Rule) { r.Host = strings.Repeat("a", 64) + ".com" }), "rules[1].host", "63"},
		{"long host", rule(func(r *Rule) { r.Host = strings.Repeat("a.", 127) + "com" }), "rules[1].host", "253"},
		{"port zero", rule(func(r *Rule) { r.Ports = []int{443, 0} }), "rules[1].ports[1]", "1-65535"},
		{"port big", rule(func(r *Rule) { r.Ports = []int{65536} }), "rules[1].ports[0]", "1-65535"},
		{"allow dot", rule(func(r *Rule) { r.Ports = []int{853} }), "rules[1].ports[0]", "builtin:dot"},
		{"long name", rule(func(r *Rule) { r.Name = strings.Repeat("n", 65) }), "rules[1].name", "limit is 64"},
		{"builtin name", rule(func(r *Rule) { r.Name = "builtin:doh" }), "rules[1].name", "reserved"},
		{"default name", rule(func(r *Rule) { r.Name = "default" }), "rules[1].name", "reserved"},
		{"control name", rule(func(r *Rule) { r.Name = "a\nb" }), "rules[1].name", "unprintable"},
		{"dup name", &Document{Rules: []Rule{{Name: "x", Host: "a.com", Action: "deny"}, {Name: "x", Host: "b.com", Action: "deny"}}}, "rules[1].name", "already used by rules[0]"},
		{"dup default name", &Document{Rules: []Rule{{Name: "rule[1]", Host: "a.com", Action: "deny"}, {Host: "b.com", Action: "deny"}}}, "rules[1].name", "already used"},
		{"star method", rule(func(r *Rule) { r.Methods = []string{"*"} }), "rules[1].methods[0]", "omit methods"},
		{"bad method", rule(func(r *Rule) { r.Methods = []string{"GET", "GE T"} }), "rules[1].methods[1]", "not an HTTP method"},
		{"empty method", rule(func(r *Rule) { r.Methods = []string{""} }), "rules[1].methods[0]", "empty"},
		{"connect", rule(func(r *Rule) { r.Methods = []string{"connect"} }), "rules[1].methods[0]", "CONNECT"},
		{"tcp methods", rule(func(r *Rule) { r.Protocol = "tcp"; r.Methods = []string{"GET"} }), "rules[1].methods", "tcp rule"},
		{"tcp paths", rule(func(r *Rule) { r.Protocol = "tcp"; r.Paths = []string{"/"} }), "rules[1].paths", "tcp rule"},
		{"empty path", rule(func(r *Rule) { r.Paths = []string{""} }), "rules[1].paths[0]", "empty"},
		{"relative path", rule(func(r *Rule) { r.Paths = []string{"/ok", "repos/*"} }), "rules[1].paths[1]", `start with "/"`},
		{"query in path", rule(func(r *Rule) { r.Paths = []string{"/a?b=1"} }), "rules[1].paths[0]", "query"},
		{"dotdot path", rule(func(r *Rule) { r.Paths = []string{"/a/../b"} }), "rules[1].paths[0]", `write "/b"`},
		{"double slash", rule(func(r *Rule) { r.Paths = []string{"/a//b"} }), "rules[1].paths[0]", "not clean"},
		{"bad escape", rule(func(r *Rule) { r.Paths = []string{"/a%zz"} }), "rules[1].paths[0]", "percent-escape"},
		{"nul path", rule(func(r *Rule) { r.Paths = []string{"/a%00"} }), "rules[1].paths[0]", "NUL"},
		{"backslash path", rule(func(r *Rule) { r.Paths = []string{`/a\b`} }), "rules[1].paths[0]", "backslash"},
		{"partial doublestar", rule(func(r *Rule) { r.Paths = []string{"/a/b**"} }), "rules[1].paths[0]", "whole segment"},
		{"long path", rule(func(r *Rule) { r.Paths = []string{"/" + strings.Repeat("a", MaxPathLen)} }), "rules[1].paths[0]", "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.doc.Validate()
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate: %v, want a *ValidationError", err)
			}
			if ve.Field != tc.field || !strings.Contains(ve.Reason, tc.want) {
				t.Fatalf("Validate: field %q reason %q; want field %q, reason containing %q", ve.Field, ve.Reason, tc.field, tc.want)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name the field", err)
			}
			if _, cerr := Compile(tc.doc); cerr == nil || cerr.Error() != err.Error() {
				t.Fatalf("Compile and Validate disagree: %v / %v", cerr, err)
			}
			// The same document as YAML fails the same way through Parse.
			ys, merr := yaml.Marshal(tc.doc)
			if merr != nil {
				t.Fatal(merr)
			}
			if _, perr := Parse(ys); perr == nil || perr.Error() != err.Error() {
				t.Fatalf("Parse: %v, want %v", perr, err)
			}
		})
	}
}

func TestValidDocuments(t *testing.T) {
	for _, d := range []*Document{
		{},
		{Version: 1, Default: "allow"},
		{Rules: []Rule{{Host: "localhost", Action: "allow"}}},
		{Rules: []Rule{{Host: "*.example.co.uk", Action: "deny"}}},
		{Rules: []Rule{{Host: "_acme.example.com", Action: "allow"}}},
		{Rules: []Rule{{Host: "xn--bcher-kva.de", Action: "allow"}}},
		{Rules: []Rule{{Host: "a.com", Action: "deny", Ports: []int{853}}}},
		{Rules: []Rule{{Host: "a.com", Action: "allow", Paths: []string{"/", "/a/", "/*.json", "/**", "/a/**/b", "/%7Euser"}}}},
		{Rules: []Rule{{Host: "a.com", Action: "allow", Methods: []string{"get", "PROPFIND", "M-SEARCH"}}}},
		{Rules: []Rule{{Name: "Allow GitHub (read) ✓", Host: "a.com", Action: "allow"}}},
	} {
		if err := d.Validate(); err != nil {
			t.Errorf("%+v: %v", d, err)
		}
	}
}

func TestAllowHosts(t *testing.T) {
	d, err := AllowHosts("api.github.com", "*.pypi.org")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(d)
	if err != nil {
		t.Fatal(err)
	}
	got := p.Document()
	want := &Document{Version: 1, Default: "deny", Rules: []Rule{
		{Name: "rule[0]", Host: "api.github.com", Ports: []int{443, 80}, Action: "allow", Protocol: "http"},
		{Name: "rule[1]", Host: "*.pypi.org", Ports: []int{443, 80}, Action: "allow", Protocol: "http"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	_, err = AllowHosts("ok.com", "10.0.0.1")
	var ve *ValidationError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), `"10.0.0.1"`) {
		t.Fatalf("AllowHosts(ip): %v", err)
	}
	d, err = AllowHosts()
	if err != nil || len(d.Rules) != 0 {
		t.Fatalf("AllowHosts(): %+v %v", d, err)
	}
}
