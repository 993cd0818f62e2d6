package runtimeapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// SplitCommand splits as Python's shlex.split (the legacy runtime's).
func TestSplitCommand(t *testing.T) {
	for in, want := range map[string][]string{
		`echo hello`:                    {"echo", "hello"},
		`  a   b  `:                     {"a", "b"},
		`sh -c 'echo oops >&2; exit 3'`: {"sh", "-c", "echo oops >&2; exit 3"},
		`printf "%s\n" "a \"b\" \$c"`:   {"printf", `%s\n`, `a "b" $c`},
		`a\ b c`:                        {"a b", "c"},
		`x''y ""`:                       {"xy", ""},
		`ls # a comment`:                {"ls"},
		``:                              nil,
	} {
		got, err := SplitCommand(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("SplitCommand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{`echo 'open`, `echo "open`, `trailing\`} {
		if _, err := SplitCommand(bad); err == nil {
			t.Errorf("SplitCommand(%q) accepted", bad)
		}
	}
}

func TestSafePath(t *testing.T) {
	s := New(Config{})
	for p, want := range map[string]string{".": "/app", "a/b.txt": "/app/a/b.txt", "a/../b": "/app/b"} {
		if got, err := s.safePath(p); err != nil || got != want {
			t.Errorf("safePath(%q) = %q, %v; want %q", p, got, err, want)
		}
	}
	for _, p := range []string{"../etc/passwd", "/etc/passwd", "a/../../x", ".."} {
		if got, err := s.safePath(p); err == nil {
			t.Errorf("safePath(%q) = %q, want refused", p, got)
		}
	}
}

// No request reaches a node without a token the Authorizer accepts.
func TestAuthorizeFirst(t *testing.T) {
	resolved := false
	s := New(Config{
		Resolve: func(ctx context.Context, ns, name string) (Node, string, error) {
			resolved = true
			return nil, "", ErrNoSandbox
		},
		Authorize: func(ctx context.Context, token, ns, name string) error {
			switch token {
			case "good":
				return nil
			case "bad":
				return ErrUnauthenticated
			}
			return errors.New("may not")
		},
	})
	for _, tc := range []struct {
		header, token string
		status        int
	}{
		{"sb", "", http.StatusUnauthorized},
		{"sb", "bad", http.StatusUnauthorized},
		{"sb", "other", http.StatusForbidden},
		{"", "good", http.StatusBadRequest},
		{"sb", "good", http.StatusNotFound},
	} {
		resolved = false
		r := httptest.NewRequest(http.MethodPost, "/execute", strings.NewReader(`{"command":"id"}`))
		if tc.header != "" {
			r.Header.Set(HeaderSandboxID, tc.header)
		}
		if tc.token != "" {
			r.Header.Set("Authorization", "Bearer "+tc.token)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != tc.status {
			t.Errorf("%+v: %d %s", tc, w.Code, w.Body)
		}
		if resolved != (tc.token == "good" && tc.header != "") {
			t.Errorf("%+v: resolved %v", tc, resolved)
		}
	}
}
