// Package hostnametest holds the tables of host patterns and matches that
// every user of package hostname runs through its own entry points
// (policy validation, vault bindings, substitution bindings, the gateway),
// so that a test fails wherever one of them parses or matches a host
// differently from the others.
package hostnametest

import "strings"

// Pattern is one host pattern as an operator writes it and its canonical
// form; Canonical "" means it must be refused, and Why is a word the
// refusal must contain.
type Pattern struct {
	In, Canonical, Why string
}

// PrivateSuffixWildcards are wildcards over the public suffix list's
// private section (hosting platforms where anyone can own a name): a
// policy rule may name them (reachability is the operator's choice), a
// credential binding may not (Why is the word its refusal contains).
var PrivateSuffixWildcards = []Pattern{
	{"*.github.io", "*.github.io", "public suffix"},
	{"*.githubusercontent.com", "*.githubusercontent.com", "public suffix"},
	{"*.s3.amazonaws.com", "*.s3.amazonaws.com", "public suffix"},
	{"*.herokuapp.com", "*.herokuapp.com", "public suffix"},
}

// Patterns are the patterns every caller must accept or refuse alike.
var Patterns = []Pattern{
	{"api.github.com", "api.github.com", ""},
	{"API.GitHub.com", "api.github.com", ""},
	{"api.github.com.", "api.github.com", ""},
	{"*.github.com", "*.github.com", ""},
	{"*.GitHub.COM.", "*.github.com", ""},
	{"*.a.b.example.co.uk", "*.a.b.example.co.uk", ""},
	{"*.example.co.uk", "*.example.co.uk", ""},
	{"*.amazonaws.com", "*.amazonaws.com", ""},
	{"*.example.test", "*.example.test", ""},
	{"localhost", "localhost", ""},
	{"_acme.example.com", "_acme.example.com", ""},
	{"xn--bcher-kva.de", "xn--bcher-kva.de", ""},
	{"a-b.example.com", "a-b.example.com", ""},
	{"r3---sn-abc.googlevideo.com", "r3---sn-abc.googlevideo.com", ""},
	{"1password.com", "1password.com", ""},
	{"a.123b", "a.123b", ""},
	{strings.Repeat("a", 63) + ".com", strings.Repeat("a", 63) + ".com", ""},
	{strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 126) + "a", ""},                   // 253
	{"*." + strings.Repeat("a.", 124) + "com", "*." + strings.Repeat("a.", 124) + "com", ""}, // 253

	{"", "", "required"},
	{" ", "", "required"},
	{"*", "", `"*"`},
	{"*.", "", `"*"`},
	{"*.com", "", "top-level domain"},
	{"*.COM.", "", "top-level domain"},
	{"*.google", "", "top-level domain"},
	{"*.test", "", "top-level domain"},
	{"*.co.uk", "", "public suffix"},
	{"*.foo.ck", "", "public suffix"},
	{"10.0.0.1", "", "IP address"},
	{"[::1]", "", "IP address"},
	{"fd00:ec2::254", "", "IP address"},
	{"10.0.0.0/8", "", "IP address"},
	{"2130706433", "", "numeric"},
	{"127.1", "", "numeric"},
	{"0x7f.0x1", "", "numeric"},
	{"a.0x", "", "numeric"},
	{"example.com:443", "", "port"},
	{"https://example.com", "", "scheme"},
	{"example.com/x", "", "path"},
	{"user@example.com", "", "user"},
	{"a.*.com", "", "first label"},
	{"*a.example.com", "", "first label"},
	{"*.*.example.com", "", "first label"},
	{"**.example.com", "", "first label"},
	{"a..example.com", "", "empty label"},
	{".example.com", "", "empty label"},
	{"example.com..", "", "empty label"},
	{"*..example.com", "", "empty label"},
	{"a b.example.com", "", "character"},
	{" example.com", "", "character"},
	{"a\x00.example.com", "", "character"},
	{"-a.example.com", "", "'-'"},
	{"a-.example.com", "", "'-'"},
	{"bücher.de", "", "xn--bcher-kva.de"},
	{"\u212Aey.example.com", "", "punycode"}, // Kelvin sign, not "k"
	{"ＡＰＩ.example.com", "", "punycode"},      // fullwidth
	{strings.Repeat("a", 64) + ".com", "", "63"},
	{strings.Repeat("a.", 127) + "a", "", "253"},
	{"*." + strings.Repeat("a.", 125) + "aa", "", "253"},
}

// Match is one request host and whether a pattern matches it.
type Match struct {
	Pattern, Host string
	Want          bool
}

// Matches are the matches every caller must decide alike. Patterns are
// written as an operator would (callers parse them first); hosts as a
// request carries them, without a port.
var Matches = []Match{
	{"api.github.com", "api.github.com", true},
	{"api.github.com", "API.GITHUB.COM", true},
	{"api.github.com", "api.github.com.", true},
	{"API.GitHub.com.", "api.github.com", true},
	{"api.github.com", "github.com", false},
	{"api.github.com", "x.api.github.com", false},
	{"api.github.com", "xapi.github.com", false},
	{"api.github.com", "api.github.com.evil.example", false},
	{"api.github.com", "api.github.com..", false},
	{"api.github.com", "", false},
	{"api.github.com", "\u212Api.github.com", false},
	{"*.github.com", "a.github.com", true},
	{"*.github.com", "A.GitHub.com.", true},
	{"*.github.com", "a.b.c.github.com", true},
	{"*.github.com", "github.com", false},
	{"*.github.com", "github.com.", false},
	{"*.github.com", ".github.com", false},
	{"*.github.com", "xgithub.com", false},
	{"*.github.com", "a.github.com.evil.example", false},
	{"*.github.com", "a..github.com", false},
	{"*.github.com", "a b.github.com", false},
	{"*.github.com", "127.0.0.1.github.com", true},
	{"*.github.com", "\u212A.github.com", false},
	{"*.example.co.uk", "www.example.co.uk", true},
	{"*.example.co.uk", "example.co.uk", false},
	{"*.example.co.uk", "other.co.uk", false},
}
