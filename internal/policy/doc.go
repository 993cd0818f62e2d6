// Package policy is cagebox's egress policy, version 1, for one sandbox.
//
// A [Document] is what an operator writes (YAML or JSON, see [Parse]) or what
// `cagebox run --allow HOST` builds ([AllowHosts]). [Compile] turns a valid
// document into a [*Policy], which implements [Engine]: given a [Request]
// the proxy has seen (a name, a port, and for HTTP a method and a path) it
// returns a [Decision]. [Live] holds the current policy of a running sandbox
// and lets it be replaced atomically.
//
// # Evaluation
//
// Requests are evaluated in this order; the first step that decides wins:
//
//  1. The built-in rules below, which v1 documents cannot override.
//  2. The document's rules, in order; the first rule that matches decides.
//  3. The document's default: "deny" (the default) or "allow".
//
// The built-in rules, in order:
//
//   - "builtin:dot": any request or connection to port 853 (DNS over TLS);
//   - "builtin:invalid-host": a host that is not a valid DNS name (including
//     every IP literal — the policy speaks names only);
//   - "builtin:doh-resolver": a host on the built-in list of public
//     DNS-over-HTTPS resolvers (knownDoHResolvers in engine.go) or a
//     sub-domain of one, whatever the protocol or port;
//   - "builtin:doh": an HTTP request whose Content-Type or Accept names
//     application/dns-message or application/dns-json;
//   - "builtin:invalid-path": an HTTP path that does not start with "/",
//     cannot be percent-decoded, or decodes to contain NUL.
//
// # Matching
//
// Host: an exact name ("api.github.com") or a wildcard ("*.github.com"),
// which matches sub-domains at any depth ("a.github.com", "a.b.github.com")
// but not the apex ("github.com"). Names compare case-insensitively and a
// trailing dot is ignored. Hosts are parsed and matched by package hostname,
// as the vault's secret bindings and the proxy do.
//
// Port: one of the rule's ports (default 443 and 80).
//
// Protocol: an allow rule allows only the kinds of request its protocol
// names. "http" (the default) allows ordinary HTTP(S) requests;
// "websocket" allows those and, in addition, requests that upgrade to a
// WebSocket; "tcp" allows raw TCP connections (Request.Protocol "tcp") and
// nothing else — HTTP rules never allow raw TCP, and TCP rules never allow an
// intercepted HTTP request. A deny rule denies every request to its host and
// ports that satisfies its method and path conditions, whatever the
// request's protocol; a raw TCP connection cannot be inspected, so a deny
// rule matching its host and port denies it even if the rule names methods
// or paths.
//
// The default "allow" applies to ordinary HTTP(S) requests only: WebSocket
// upgrades and raw TCP always need an explicit rule.
//
// Method: compared case-insensitively; a rule without methods matches any.
// An empty Request.Method is treated as GET. The proxy upper-cases a
// request's method before asking and sends it upper-cased, so the method a
// rule matched is the method the upstream receives; a request carrying a
// method override (X-HTTP-Method-Override, X-HTTP-Method,
// X-Method-Override, ?_method=) is decided for each method it names too.
//
// Path: a rule's paths are globs over "/"-separated segments: "*" within a
// segment matches any run of characters other than "/" (so "*" alone is
// exactly one non-empty segment and "*.json" is a segment ending in .json),
// and a segment "**" matches zero or more segments ("/v1/**" matches "/v1",
// "/v1/" and "/v1/a/b"). Paths are case-sensitive. A rule without paths
// matches any path.
//
// Request.Path is the path as sent on the wire, still percent-encoded (the
// proxy passes the canonical escaped form it also sends upstream, see
// package egress). It is decided on in canonical form: percent-decoded
// exactly once (so "%2F" is a "/" and "%2e%2e" is ".."), then cleaned with
// [path.Clean] semantics ("//", "/./" and "/../" are resolved; ".." cannot
// climb above "/"), and a trailing slash is dropped ("/repos/" is "/repos").
// Patterns are decoded and cleaned the same way when the policy is compiled.
//
// Servers read some paths in more than one way, and a path rule holds for
// all of them: an encoded slash may or may not separate segments
// ("/a%2Fb" is "/a/b" to some, one segment "a/b" to others), and ";"
// path parameters are cut from each segment by servlet containers
// ("/admin;x/y" is "/admin/y" there). An allow rule's paths must match
// every such reading; a deny rule's paths match if any reading does, and
// in any letter case (servers that route case-insensitively serve
// "/ADMIN" as "/admin"; the folding also equates "ſ" with "s" and the
// Kelvin sign with "k"). An allow rule's paths stay case-sensitive.
//
// A path that is still ambiguous after one decoding — it contains a
// backslash, a percent-escape that survived decoding (double encoding), or
// a dot segment followed by ";" ("..;/") — is never allowed by a rule that
// restricts paths and is always denied by a deny rule that restricts paths,
// since upstream servers disagree about what such paths mean. Rules without
// paths are not affected.
//
// # Validation
//
// [Parse] rejects unknown and duplicate fields (JSON keys must be spelled in
// lower case, as documented), and [Document.Validate] rejects anything that
// could not do what it says: IP literals and numeric names as hosts, a
// wildcard other than a leading "*." label, a wildcard over a public suffix
// ("*.com", "*.co.uk": the names below it belong to unrelated
// owners), non-ASCII names (write the punycode form the error gives), allow rules for port 853 or the
// CONNECT method (both always refused), methods or paths on tcp rules,
// unclean path patterns, and duplicate rule names or names reserved for
// built-ins ("default", "builtin:...").
//
// Limits: at most 1000 rules, hosts of at most 253 characters, names of at
// most 64 characters, ports 1–65535, and documents of at most 1 MiB (see
// the Max* constants for the rest).
package policy
