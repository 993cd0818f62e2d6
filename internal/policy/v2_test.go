package policy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func decide(t *testing.T, p *Policy, r *Request) Decision {
	t.Helper()
	if r.Port == 0 {
		r.Port = 443
	}
	d, err := p.Decide(context.Background(), r)
	if err != nil {
		t.Fatalf("decide: %v", err)
	}
	return d
}

func TestHoldRule(t *testing.T) {
	p := mustPolicy(t, `
version: 2
rules:
  - name: risky
    host: api.github.com
    methods: [DELETE]
    action: hold
    timeout: 5s
  - name: gh
    host: api.github.com
    action: allow
  - name: slow
    host: slow.example.com
    action: hold
`)
	d := decide(t, p, &Request{Host: "api.github.com", Method: "DELETE", Path: "/repos/x"})
	if d.Allow || !d.Hold || d.Rule != "risky" || d.HoldTimeout != 5*time.Second {
		t.Fatalf("DELETE: %+v, want a 5s hold by risky", d)
	}
	if d := decide(t, p, &Request{Host: "api.github.com", Method: "GET", Path: "/"}); !d.Allow || d.Hold {
		t.Fatalf("GET: %+v", d)
	}
	if d := decide(t, p, &Request{Host: "slow.example.com"}); !d.Hold || d.HoldTimeout != DefaultHoldTimeout {
		t.Fatalf("default hold timeout: %+v", d)
	}
	if !p.AllowsName("slow.example.com") || !p.NamesHost("slow.example.com") {
		t.Fatal("a held name must resolve and be intercepted")
	}
}

func TestV2FieldsNeedVersion2(t *testing.T) {
	for _, src := range []string{
		"version: 1\nrules: [{host: a.example.com, action: hold}]",
		"rules: [{host: a.example.com, action: allow, when: 'true'}]",
		"version: 1\nonly: [a.example.com]\nrules: []",
		"version: 1\nrules: []\nbudgets: [{name: b, requests: 1}]",
	} {
		_, err := Parse([]byte(src))
		var ve *ValidationError
		if !errors.As(err, &ve) || !strings.Contains(ve.Reason, "version: 2") {
			t.Errorf("%q: %v, want a pointer to version 2", src, err)
		}
	}
}

func TestConditions(t *testing.T) {
	p := mustPolicy(t, `
version: 2
rules:
  - name: no-big-posts
    host: api.example.com
    methods: [POST]
    when: request.size > 1024
    action: deny
  - name: tagged
    host: api.example.com
    when: >
      request.headers["x-team"] == "infra" && request.query["dry_run"] == "1"
      && session.fired["tagged"] < 2
    action: allow
  - name: broken
    host: broken.example.com
    when: request.headers["missing"] == "x"
    action: allow
`)
	r := func(m string, size int64, hdr map[string][]string, q map[string][]string, s *Session) *Request {
		return &Request{Host: "api.example.com", Method: m, Path: "/v1", BodySize: size, Header: hdr, Query: q, Session: s}
	}
	infra := map[string][]string{"X-Team": {"infra"}}
	dry := map[string][]string{"dry_run": {"1"}}
	if d := decide(t, p, r("POST", 4096, infra, dry, nil)); d.Allow || d.Rule != "no-big-posts" {
		t.Errorf("big post: %+v", d)
	}
	if d := decide(t, p, r("POST", 10, infra, dry, nil)); !d.Allow || d.Rule != "tagged" {
		t.Errorf("small tagged post: %+v", d)
	}
	if d := decide(t, p, r("GET", -1, map[string][]string{"X-Team": {"web"}}, dry, nil)); d.Allow || d.Rule != RuleDefault {
		t.Errorf("other team: %+v", d)
	}
	if d := decide(t, p, r("GET", -1, infra, dry, &Session{Fired: map[string]int64{"tagged": 2}})); d.Allow {
		t.Errorf("after two: %+v", d)
	}
	// A missing map key is an evaluation error: the allow rule denies
	// (never fails open), naming itself.
	if d := decide(t, p, &Request{Host: "broken.example.com"}); d.Allow || d.Rule != "broken" || !strings.Contains(d.Reason, "condition") {
		t.Errorf("broken condition: %+v", d)
	}
}

func TestConditionValidation(t *testing.T) {
	for src, want := range map[string]string{
		"version: 2\nrules: [{host: a.example.com, action: allow, when: '1 + 2'}]":              "must be a bool",
		"version: 2\nrules: [{host: a.example.com, action: allow, when: 'request.method ==='}]": "does not compile",
		"version: 2\nrules: [{host: a.example.com, action: allow, when: 'nosuchvar == 1'}]":     "does not compile",
		"version: 2\nrules: [{host: a.example.com, action: allow, timeout: 5s}]":                "goes with action",
		"version: 2\nrules: [{host: a.example.com, action: hold, timeout: 5}]":                  "not a duration",
		"version: 2\nrules: [{host: a.example.com, action: hold, timeout: 48h}]":                "out of range",
	} {
		_, err := Parse([]byte(src))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
}

func TestOnlyNarrows(t *testing.T) {
	p := mustPolicy(t, `
version: 2
only: [api.stripe.com]
rules:
  - {name: stripe, host: api.stripe.com, action: allow}
  - {name: gh, host: api.github.com, action: allow}
`)
	if d := decide(t, p, &Request{Host: "api.github.com"}); d.Allow || d.Rule != RuleOnly {
		t.Fatalf("github: %+v", d)
	}
	if d := decide(t, p, &Request{Host: "api.stripe.com"}); !d.Allow {
		t.Fatalf("stripe: %+v", d)
	}
	if p.AllowsName("api.github.com") || p.NamesHost("api.github.com") || !p.AllowsName("api.stripe.com") {
		t.Fatal("names outside only must stop resolving")
	}
}

// The example shipped in docs/policy.md: after the first charge,
// everything but api.stripe.com is denied.
func TestStripeTriggerExample(t *testing.T) {
	p := mustPolicy(t, `
version: 2
rules:
  - name: charge
    host: api.stripe.com
    methods: [POST]
    paths: [/v1/charges]
    action: allow
  - {name: stripe, host: api.stripe.com, action: allow}
  - {name: github, host: api.github.com, action: allow}
triggers:
  - name: lock-after-charge
    after: charge
    do: {only: [api.stripe.com]}
`)
	ts := p.Triggers()
	if len(ts) != 1 {
		t.Fatalf("triggers: %d", len(ts))
	}
	get := &Request{Host: "api.github.com", Method: "GET", Path: "/"}
	if d := decide(t, p, get); ts[0].Fires(get, d) {
		t.Fatal("fired on a github GET")
	}
	charge := &Request{Host: "api.stripe.com", Method: "POST", Path: "/v1/charges"}
	d := decide(t, p, charge)
	if !d.Allow || !ts[0].Fires(charge, d) {
		t.Fatalf("charge: %+v, trigger must fire", d)
	}
	// What the live policy then applies: only [api.stripe.com].
	doc := p.Document()
	doc.Only = ts[0].Do.Only
	p2, err := Compile(doc)
	if err != nil {
		t.Fatal(err)
	}
	if d := decide(t, p2, get); d.Allow || d.Rule != RuleOnly {
		t.Fatalf("after the trigger github: %+v", d)
	}
	if d := decide(t, p2, &Request{Host: "api.stripe.com", Method: "GET", Path: "/v1/balance"}); !d.Allow {
		t.Fatalf("after the trigger stripe: %+v", d)
	}
}

func TestBudgetsAndTriggersValidation(t *testing.T) {
	base := "version: 2\nrules: [{name: r, host: a.example.com, action: allow}]\n"
	for src, want := range map[string]string{
		base + "budgets: [{requests: 1}]":                                 "needs a name",
		base + "budgets: [{name: b}]":                                     "caps nothing",
		base + "budgets: [{name: b, spend: 5}]":                           "needs prices",
		base + "budgets: [{name: b, rules: [nope], requests: 1}]":         "no rule is named",
		base + "budgets: [{name: b, requests: -1}]":                       "zero",
		base + "budgets: [{name: b, requests: 1, action: allow}]":         "not a budget action",
		base + "budgets: [{name: b, hosts: ['*.com'], requests: 1}]":      "top-level domain",
		base + "triggers: [{name: t, do: {pause: true}}]":                 "after",
		base + "triggers: [{name: t, after: nope, do: {pause: true}}]":    "no rule is named",
		base + "triggers: [{name: t, after: r, do: {}}]":                  "does nothing",
		base + "triggers: [{name: t, after: r, do: {only: ['1.2.3.4']}}]": "only[0]",
		base + "approval: {webhook: 'http://example.com/hook'}":           "loopback",
		base + "approval: {webhook: 'ftp://x'}":                           "https://",
		base + "approval: {webhook: 'https://h.example/x', timeout: 1h}":  "out of range",
		base + "prices: {gpt: {input: -1, output: 1}}":                    "zero or more",
		base + "budgets: [{name: b, burst: 3, requests: 1}]":              "burst goes with rate",
		base + "triggers: [{name: t, when: '\"x\"', do: {pause: true}}]":  "bool",
	} {
		_, err := Parse([]byte(src))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
	p := mustPolicy(t, base+`
prices: {gpt-4o: {input: 2.5, output: 10}}
approval: {webhook: 'http://127.0.0.1:9/hook', timeout: 2s}
budgets:
  - {name: llm, hosts: ['*.openai.com'], spend: 5, requests: 100}
  - {name: rps, rate: 2.5}
`)
	bs := p.Budgets()
	if len(bs) != 2 || bs[1].Burst != 3 || bs[0].Action != ActionDeny {
		t.Fatalf("budgets: %+v", bs)
	}
	if !bs[0].Covers("API.openai.com", "x") || bs[0].Covers("a.example.com", "r") || !bs[1].Covers("anything.example", "") {
		t.Fatal("budget scope")
	}
	if a, to := p.Approval(); a == nil || to != 2*time.Second {
		t.Fatalf("approval: %+v %v", a, to)
	}
	// The normalized document round-trips through Parse.
	doc := p.Document()
	if doc.Version != 2 || len(doc.Budgets) != 2 || doc.Prices["gpt-4o"].Output != 10 {
		t.Fatalf("document: %+v", doc)
	}
	if _, err := Compile(doc.Clone()); err != nil {
		t.Fatal(err)
	}
}

func TestConditionCostAcceptsSinglePasses(t *testing.T) {
	for _, when := range []string{
		`request.headers.exists(k, k.startsWith("x-") && request.headers[k].contains("secret"))`,
		`request.query.all(k, size(request.query[k]) < 100) && request.path.matches("^/v1/")`,
		`session.fired.exists(r, session.fired[r] > 10)`,
	} {
		src := "version: 2\nrules: [{host: a.example.com, action: allow, when: '" + when + "'}]"
		if _, err := Parse([]byte(src)); err != nil {
			t.Errorf("%s: %v", when, err)
		}
	}
}

func TestBudgetAndTriggerNamesUnique(t *testing.T) {
	base := "version: 2\nrules: [{name: r, host: a.example.com, action: allow}]\n"
	for src, want := range map[string]string{
		base + "budgets: [{name: b, requests: 1}, {name: b, requests: 2}]":                                  `budget "b" is defined twice`,
		base + "triggers: [{name: t, after: r, do: {pause: true}}, {name: t, after: r, do: {pause: true}}]": `trigger "t" is defined twice`,
		base + "budgets: [{name: default, requests: 1}]":                                                    "reserved",
	} {
		if _, err := Parse([]byte(src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
}

// TestConditionReadsRawQuery: the proxy passes the raw query; a condition
// reading request.query sees it parsed.
func TestConditionReadsRawQuery(t *testing.T) {
	p := mustPolicy(t, "version: 2\nrules: [{name: dry, host: a.example.com, when: 'request.query[\"dry_run\"] == \"1\"', action: allow}]")
	if d := decide(t, p, &Request{Host: "a.example.com", RawQuery: "x=2&dry_run=1"}); !d.Allow {
		t.Fatalf("dry run: %+v", d)
	}
	if d := decide(t, p, &Request{Host: "a.example.com", RawQuery: "dry_run=0"}); d.Allow {
		t.Fatalf("not a dry run: %+v", d)
	}
}
