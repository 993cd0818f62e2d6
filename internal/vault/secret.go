package vault

import (
	"fmt"
	"io"
	"log/slog"
)

// redacted is what every printed form of a Secret shows.
const redacted = "REDACTED"

// Secret holds a secret value. Every way of printing it — String, Format
// (all verbs, %#v included), GoString, LogValue, MarshalJSON, MarshalText —
// shows "REDACTED". The value sits two pointers deep, so even fmt's
// reflection over a struct holding a Secret in an unexported field (where
// it cannot call these methods, and dumps one level of a pointer it cannot
// format with the verb at hand) prints addresses, not the bytes. Copies of
// a Secret share the value.
type Secret struct {
	p *secretValue
}

type secretValue struct {
	b *[]byte
}

// newSecret returns a Secret holding b itself.
func newSecret(b []byte) Secret { return Secret{p: &secretValue{b: &b}} }

// Bytes returns the value itself, not a copy: do not modify it, and do not
// keep it after Wipe. It is nil for a zero or wiped Secret.
func (s Secret) Bytes() []byte {
	if s.p == nil || s.p.b == nil {
		return nil
	}
	return *s.p.b
}

// Len returns the length of the value.
func (s Secret) Len() int { return len(s.Bytes()) }

// Wipe overwrites the value with zeros and forgets it, for every copy of s.
func (s Secret) Wipe() {
	if s.p == nil || s.p.b == nil {
		return
	}
	clear(*s.p.b)
	*s.p.b = nil
}

// String implements fmt.Stringer.
func (Secret) String() string { return redacted }

// GoString implements fmt.GoStringer.
func (Secret) GoString() string { return redacted }

// Format implements fmt.Formatter for every verb.
func (Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redacted) }

// LogValue implements slog.LogValuer.
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON implements json.Marshaler.
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// MarshalText implements encoding.TextMarshaler.
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }
