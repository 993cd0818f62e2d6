package vault_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/internal/vault"
)

func TestSecretNeverPrinted(t *testing.T) {
	s := vault.NewSecret([]byte(canary))
	type inner struct{ s vault.Secret }
	holders := []any{
		s, &s,
		struct{ S vault.Secret }{s},
		struct{ s vault.Secret }{s},
		struct{ s *vault.Secret }{&s},
		struct{ i inner }{inner{s}},
		[]vault.Secret{s},
		map[string]vault.Secret{"k": s},
	}
	forbidden := []string{canary, canary[6:14], hex.EncodeToString([]byte(canary))[:16], strings.ToUpper(hex.EncodeToString([]byte(canary))[:16]),
		fmt.Sprint([]byte(canary)[:4])[1:12]}
	check := func(what, out string) {
		t.Helper()
		for _, f := range forbidden {
			if strings.Contains(out, f) {
				t.Errorf("%s prints the value: %s", what, out)
				return
			}
		}
	}
	for _, h := range holders {
		for _, f := range printVerbs {
			check(fmt.Sprintf("%s of %T", f, h), fmt.Sprintf(f, h))
		}
		b, err := json.Marshal(h)
		if err != nil {
			t.Errorf("json of %T: %v", h, err)
		}
		check(fmt.Sprintf("json of %T", h), string(b))
	}
	for _, f := range []string{"%v", "%s", "%+v", "%#v"} {
		if got := fmt.Sprintf(f, s); got != "REDACTED" {
			t.Errorf("%s = %q, want REDACTED", f, got)
		}
	}
	if b, _ := json.Marshal(s); string(b) != `"REDACTED"` {
		t.Errorf("json = %s", b)
	}

	var buf bytes.Buffer
	for _, h := range []slog.Handler{slog.NewTextHandler(&buf, nil), slog.NewJSONHandler(&buf, nil)} {
		l := slog.New(h)
		l.Info("msg", "secret", s, "ptr", &s, "holder", struct{ S, s vault.Secret }{s, s}, slog.Any("any", s))
		l.With("secret", s).Info("with")
		l.Info("group", slog.Group("g", "secret", s))
	}
	check("slog", buf.String())
	if !strings.Contains(buf.String(), "REDACTED") {
		t.Errorf("slog output lacks REDACTED: %s", buf.String())
	}

	if string(s.Bytes()) != canary || s.Len() != len(canary) {
		t.Error("Bytes does not return the value")
	}
	b := s.Bytes()
	cp := s // copies share the value
	s.Wipe()
	if cp.Bytes() != nil || s.Bytes() != nil || !bytes.Equal(b, make([]byte, len(canary))) {
		t.Error("Wipe did not zero the value for every copy")
	}
	s.Wipe()
	var zero vault.Secret
	zero.Wipe()
	if zero.Bytes() != nil || zero.String() != "REDACTED" {
		t.Error("zero Secret")
	}
}
