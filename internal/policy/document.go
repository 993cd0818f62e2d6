package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// Document is a sandbox's egress policy as written by an operator.
type Document struct {
	// Version is the policy language version: 1 or 2 (0 is treated as 1).
	// Version 2 adds hold rules, rule conditions (when), only, approval,
	// budgets, prices and triggers.
	Version int `json:"version" yaml:"version"`
	// Default decides requests no rule matches: "deny" (the default) or
	// "allow". "allow" applies to ordinary HTTP(S) requests only.
	Default string `json:"default,omitempty" yaml:"default,omitempty"`
	// Only narrows the policy (v2): a request to a host no pattern here
	// matches is denied (rule "only") before any rule is looked at, and
	// such names stop resolving. Empty: no narrowing. Triggers set it.
	Only []string `json:"only,omitempty" yaml:"only,omitempty"`
	// Rules are evaluated in order; the first that matches decides.
	Rules []Rule `json:"rules" yaml:"rules"`
	// Approval configures who decides held requests (v2).
	Approval *Approval `json:"approval,omitempty" yaml:"approval,omitempty"`
	// Budgets cap what the sandbox may send and spend (v2).
	Budgets []Budget `json:"budgets,omitempty" yaml:"budgets,omitempty"`
	// Prices are USD per million tokens by model, for spend budgets (v2).
	Prices map[string]Price `json:"prices,omitempty" yaml:"prices,omitempty"`
	// Triggers change the policy when a rule fires or a condition holds (v2).
	Triggers []Trigger `json:"triggers,omitempty" yaml:"triggers,omitempty"`
}

// Rule is one ordered rule of a Document. See the package documentation for
// how each field matches.
type Rule struct {
	// Name is shown in denials and audit events; default "rule[N]".
	Name string `json:"name,omitempty" yaml:"name,omitempty"`
	// Host is an exact name ("api.github.com") or a wildcard
	// ("*.github.com", sub-domains only). IP literals are rejected.
	Host string `json:"host" yaml:"host"`
	// Ports default to [443, 80].
	Ports []int `json:"ports,omitempty" yaml:"ports,omitempty"`
	// Methods default to any method.
	Methods []string `json:"methods,omitempty" yaml:"methods,omitempty"`
	// Paths are globs on the URL path; default any path.
	Paths []string `json:"paths,omitempty" yaml:"paths,omitempty"`
	// Action is "allow", "deny" or (v2) "hold": the request waits for an
	// approval (see Approval) and is denied when none comes in Timeout.
	Action string `json:"action" yaml:"action"`
	// Protocol is "http" (the default), "websocket" or "tcp".
	Protocol string `json:"protocol,omitempty" yaml:"protocol,omitempty"`
	// When is a CEL condition (v2) over the request and the session; the
	// rule matches only when it is true. See the package documentation.
	When string `json:"when,omitempty" yaml:"when,omitempty"`
	// Timeout is how long a hold rule waits for a decision (v2; a Go
	// duration, default 60s).
	Timeout string `json:"timeout,omitempty" yaml:"timeout,omitempty"`
}

// Values of Document.Default and Rule.Action.
const (
	ActionAllow = "allow"
	ActionDeny  = "deny"
	ActionHold  = "hold"
)

// Values of Rule.Protocol and Request.Protocol.
const (
	ProtocolHTTP      = "http"
	ProtocolWebSocket = "websocket"
	ProtocolTCP       = "tcp"
)

// Limits of a Document.
const (
	MaxDocumentSize = 1 << 20 // bytes accepted by Parse
	MaxRules        = 1000
	MaxNameLen      = 64
	MaxHostLen      = 253
	MaxPortsPerRule = 256
	MaxMethods      = 64
	MaxMethodLen    = 32
	MaxPaths        = 256
	MaxPathLen      = 1024
)

// ValidationError says which field of a Document is wrong and what to do.
type ValidationError struct {
	Field  string // e.g. "rules[2].host"; empty for the document as a whole
	Reason string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return "invalid policy: " + e.Reason
	}
	return "invalid policy: " + e.Field + ": " + e.Reason
}

// Parse reads a policy document in JSON (if its first non-space byte is '{')
// or YAML, rejects unknown and duplicate fields, and validates it. The
// document is returned as written; [Policy.Document] shows it with defaults
// filled in.
func Parse(data []byte) (*Document, error) {
	if len(data) > MaxDocumentSize {
		return nil, fmt.Errorf("parse policy: document is %d bytes; the limit is %d", len(data), MaxDocumentSize)
	}
	trimmed := bytes.TrimLeft(data, " \t\r\n\ufeff")
	if len(trimmed) == 0 {
		return nil, errors.New("parse policy: document is empty")
	}
	var (
		d   *Document
		err error
	)
	if trimmed[0] == '{' {
		d, err = parseJSON(trimmed)
	} else {
		d, err = parseYAML(data)
	}
	if err != nil {
		return nil, err
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

func parseJSON(data []byte) (*Document, error) {
	// encoding/json matches keys case-insensitively and silently keeps the
	// last of duplicates; a policy must not be ambiguous, so look first.
	if err := checkJSONDuplicates(data); err != nil {
		return nil, fmt.Errorf("parse policy (json): %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var d Document
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("parse policy (json): %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("parse policy (json): unexpected data after the document")
	}
	return &d, nil
}

// checkJSONDuplicates walks data and fails on an object with two keys that
// encoding/json would map to the same field: keys must be lower-case ASCII
// (as every field name is) and unique.
func checkJSONDuplicates(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		object bool
		keys   map[string]bool
		key    bool // next token in an object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.key {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].key = true
				}
				continue
			}
			k, _ := tok.(string)
			if !isLowerASCII(k) {
				// encoding/json would match it to a field case-insensitively.
				return fmt.Errorf("unknown field %q (field names are lower-case)", k)
			}
			if top.keys[k] {
				return fmt.Errorf("duplicate key %q", k)
			}
			top.keys[k] = true
			top.key = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, keys: map[string]bool{}, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the enclosing object expects a key next.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].key = true
		}
	}
}

// unquotedWildcard finds "host: *.example.com", which YAML reads as an alias.
var unquotedWildcard = regexp.MustCompile(`(?m)host\s*:\s*\*`)

func parseYAML(data []byte) (d *Document, err error) {
	defer func() {
		// yaml.v3 has panicked on hostile input before; never let a policy
		// file take the daemon down.
		if r := recover(); r != nil {
			d, err = nil, fmt.Errorf("parse policy (yaml): malformed document (%v)", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var doc Document
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, errors.New("parse policy: document is empty")
		}
		if unquotedWildcard.Match(data) {
			return nil, fmt.Errorf("parse policy (yaml): %w (quote hosts that start with '*': host: \"*.example.com\")", err)
		}
		return nil, fmt.Errorf("parse policy (yaml): %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, errors.New("parse policy (yaml): more than one document; a policy is a single YAML document")
	}
	return &doc, nil
}

// Validate checks the document; the error, if any, is a *ValidationError
// naming the first bad field and what to do about it.
func (d *Document) Validate() error {
	_, err := compile(d)
	return err
}

// AllowHosts builds the document `cagebox run --allow HOST ...` stands for:
// default deny and, per host, one rule allowing HTTP(S) on ports 443 and 80
// with any method and path. With no hosts it denies everything.
func AllowHosts(hosts ...string) (*Document, error) {
	d := &Document{Version: 1, Default: ActionDeny, Rules: make([]Rule, 0, len(hosts))}
	for _, h := range hosts {
		d.Rules = append(d.Rules, Rule{Host: h, Action: ActionAllow})
	}
	if err := d.Validate(); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) && strings.HasPrefix(ve.Field, "rules[") {
			// Name the host, not a rule index the user never wrote.
			var i int
			if _, serr := fmt.Sscanf(ve.Field, "rules[%d]", &i); serr == nil && i >= 0 && i < len(hosts) {
				return nil, fmt.Errorf("allow host %q: %w", hosts[i], err)
			}
		}
		return nil, err
	}
	return d, nil
}

// clone returns a deep copy of d. Documents are small and cloned only when
// handed out or edited, so a JSON round trip is simple and cannot miss a
// field added later.
func (d *Document) clone() *Document {
	b, err := json.Marshal(d)
	if err != nil {
		panic("policy: clone: " + err.Error()) // every field marshals
	}
	var c Document
	if err := json.Unmarshal(b, &c); err != nil {
		panic("policy: clone: " + err.Error())
	}
	return &c
}

// Clone returns a deep copy of d (nil for nil).
func (d *Document) Clone() *Document {
	if d == nil {
		return nil
	}
	return d.clone()
}

func isLowerASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x80 || ('A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}
