package audit

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cagebox/cagebox/api"
)

func decode(t testing.TB, raw json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("bound data %q is not a JSON object: %v", raw, err)
	}
	return m
}

func TestBoundFields(t *testing.T) {
	long := func(s string, n int) string { return strings.Repeat(s, n) }
	tests := []struct {
		name  string
		key   string
		value string
		want  int // byte length of the bounded string
	}{
		{"path", "path", long("a", 5000), MaxPath},
		{"url", "url", long("/x", 3000), MaxPath},
		{"host", "host", long("h", 1000), MaxHost},
		{"dns name", "name", long("label.", 200), MaxHost},
		{"reason", "reason", long("r", 3000), MaxText},
		{"error", "error", long("e", 3000), MaxText},
		{"other", "rule", long("o", 1000), MaxString},
		// Multi-byte runes: the cut lands on a rune boundary, so the
		// result may be a byte or three short of the bound.
		{"two-byte runes", "path", long("é", 1000), MaxPath - 1},
		{"four-byte runes", "host", long("😀", 100), MaxHost}, // 252 = 63 runes exactly
		{"three-byte runes", "reason", long("€", 1000), MaxText - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := map[string]any{tt.key: tt.value, "port": 443}
			raw, err := Bound(in)
			if err != nil {
				t.Fatal(err)
			}
			m := decode(t, raw)
			got, _ := m[tt.key].(string)
			if len(got) != tt.want {
				t.Errorf("%s: %d bytes, want %d", tt.key, len(got), tt.want)
			}
			if !utf8.ValidString(got) || !strings.HasSuffix(got, Ellipsis) {
				t.Errorf("%s = %q…: want valid UTF-8 ending with %q", tt.key, got[:min(len(got), 20)], Ellipsis)
			}
			if !strings.HasPrefix(tt.value, strings.TrimSuffix(got, Ellipsis)) {
				t.Errorf("%s is not a prefix of the value", tt.key)
			}
			if m["truncated"] != true {
				t.Errorf("no \"truncated\": true in %s", raw)
			}
			if m["port"] != float64(443) {
				t.Errorf("port = %v: other fields must stay", m["port"])
			}
			if in[tt.key] != tt.value {
				t.Error("the caller's map was modified")
			}
		})
	}
}

func TestBoundKeepsSmallDataAsIs(t *testing.T) {
	in := map[string]any{"host": "api.example.test", "path": "/v1/x?a=<b>", "port": 443, "names": []string{"GH", "AWS"},
		"duration_ms": 1.5, "ok": true, "none": nil}
	raw, err := Bound(in)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"duration_ms":1.5,"host":"api.example.test","names":["GH","AWS"],"none":null,"ok":true,"path":"/v1/x?a=<b>","port":443}`
	if string(raw) != want {
		t.Errorf("Bound = %s\nwant    %s", raw, want)
	}
	if raw, err := Bound(nil); raw != nil || err != nil {
		t.Errorf("Bound(nil) = %s, %v; want nil", raw, err)
	}
}

func TestBoundShapes(t *testing.T) {
	deep := map[string]any{"leaf": "x"}
	for range 20 {
		deep = map[string]any{"in": deep}
	}
	many := map[string]any{}
	for i := range 1000 {
		many[fmt.Sprintf("k%04d", i)] = i
	}
	list := make([]string, 100)
	for i := range list {
		list[i] = "name"
	}
	list[0] = strings.Repeat("n", 300)
	type req struct {
		Path string `json:"path"`
		Code int    `json:"code"`
	}
	tests := []struct {
		name  string
		in    any
		check func(t *testing.T, m map[string]any)
	}{
		{"list of strings", map[string]any{"names": list}, func(t *testing.T, m map[string]any) {
			l := m["names"].([]any)
			if len(l) != MaxItems+1 || l[MaxItems] != Ellipsis {
				t.Errorf("%d items, last %v: want %d and an ellipsis", len(l), l[len(l)-1], MaxItems)
			}
			if s := l[0].(string); len(s) != MaxString {
				t.Errorf("item of %d bytes, want %d", len(s), MaxString)
			}
		}},
		{"deep nesting", map[string]any{"d": deep}, func(t *testing.T, m map[string]any) {
			raw, _ := json.Marshal(m)
			if strings.Count(string(raw), `"in"`) > MaxDepth {
				t.Errorf("nesting kept beyond %d: %s", MaxDepth, raw)
			}
		}},
		{"many keys", many, func(t *testing.T, m map[string]any) {
			if len(m) != MaxItems+1 { // + "truncated"
				t.Errorf("%d keys, want %d + truncated", len(m), MaxItems)
			}
			if _, ok := m["k0000"]; !ok {
				t.Error("the first keys in order must survive")
			}
		}},
		{"long key", map[string]any{strings.Repeat("k", 500): 1}, func(t *testing.T, m map[string]any) {
			for k := range m {
				if len(k) > MaxKey {
					t.Errorf("key of %d bytes", len(k))
				}
			}
		}},
		{"struct", req{Path: strings.Repeat("p", 4000), Code: 7}, func(t *testing.T, m map[string]any) {
			if len(m["path"].(string)) != MaxPath || m["code"] != float64(7) {
				t.Errorf("struct bounded to %v", m)
			}
		}},
		{"typed map nested", map[string]any{"headers": map[string]string{"x": strings.Repeat("v", 900)}}, func(t *testing.T, m map[string]any) {
			if v := m["headers"].(map[string]any)["x"].(string); len(v) != MaxString {
				t.Errorf("nested typed map value of %d bytes", len(v))
			}
		}},
		{"bare string", strings.Repeat("s", 900), func(t *testing.T, m map[string]any) {
			if v, _ := m["value"].(string); len(v) != MaxString {
				t.Errorf("bare string wrapped as %v", m)
			}
		}},
		{"invalid UTF-8", map[string]any{"path": "/a\xff\xfe/b"}, func(t *testing.T, m map[string]any) {
			if m["path"] != "/a\uFFFD/b" {
				t.Errorf("path = %q, want invalid bytes replaced", m["path"])
			}
			if _, cut := m["truncated"]; cut {
				t.Error("a replaced byte is not a cut")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := Bound(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if len(raw) > MaxData {
				t.Fatalf("%d bytes, bound %d", len(raw), MaxData)
			}
			m := decode(t, raw)
			if tt.name != "invalid UTF-8" && m["truncated"] != true {
				t.Errorf("no \"truncated\": true in %.200s", raw)
			}
			tt.check(t, m)
		})
	}
}

// TestBoundTotal: data whose every field is within its bound but whose sum
// is not is cut harder, and failing that replaced, never stored whole.
func TestBoundTotal(t *testing.T) {
	wide := map[string]any{}
	for i := range MaxItems {
		wide[fmt.Sprintf("reason%02d", i)] = strings.Repeat("r", MaxString)
	}
	escaped := map[string]any{}
	for i := range MaxItems {
		// Control characters: 6 bytes each once JSON-escaped.
		escaped[fmt.Sprintf("k%02d", i)] = strings.Repeat("\x01", MaxString)
	}
	huge := map[string]any{}
	level := huge
	for range MaxDepth - 1 {
		next := map[string]any{}
		for i := range MaxItems {
			level[fmt.Sprintf("k%02d", i)] = strings.Repeat("x", MaxString)
		}
		level["z"] = next
		level = next
	}
	for name, in := range map[string]map[string]any{"wide": wide, "escaped": escaped, "huge": huge} {
		t.Run(name, func(t *testing.T) {
			raw, err := Bound(in)
			if err != nil {
				t.Fatal(err)
			}
			if len(raw) > MaxData {
				t.Fatalf("%d bytes, bound %d", len(raw), MaxData)
			}
			if m := decode(t, raw); m["truncated"] != true {
				t.Errorf("no \"truncated\": true")
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	for _, tt := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"abcdefghijk", 10, "abcdefg" + Ellipsis},
		{"ééééé", 6, "é" + Ellipsis}, // é is 2 bytes: 6-3 = 3 → one é
		{"😀😀", 7, "😀" + Ellipsis},    // 7-3 = 4 bytes: one 😀 exactly
		{"😀😀", 6, "" + Ellipsis},     // 3 bytes: not even one
		{"a😀bc", 6, "a" + Ellipsis},  // the cut inside 😀 backs off to its start
	} {
		got := Truncate(tt.in, tt.n)
		if got != tt.want || len(got) > max(tt.n, len(tt.in)) || !utf8.ValidString(got) {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

// FuzzBound: whatever the strings, the result is a valid JSON object of
// valid UTF-8 within MaxData.
func FuzzBound(f *testing.F) {
	f.Add("api.example.test", "/path", "reason", 3)
	f.Add(strings.Repeat("\xff", 600), strings.Repeat("😀", 500), strings.Repeat("\x00", 2000), 70)
	f.Fuzz(func(t *testing.T, host, path, other string, n int) {
		names := make([]string, max(0, min(n, 200)))
		for i := range names {
			names[i] = other
		}
		raw, err := Bound(map[string]any{"host": host, "path": path, other: other, "names": names})
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) > MaxData || !utf8.Valid(raw) || !json.Valid(raw) {
			t.Fatalf("bad result (%d bytes): %.200q", len(raw), raw)
		}
		decode(t, raw)
	})
}

// BenchmarkBound is the cost Emit adds to an egress event of ordinary size.
func BenchmarkBound(b *testing.B) {
	ev := map[string]any{
		"host": "api.example.test", "port": 443, "protocol": "https", "method": "GET",
		"path": "/repos/cagebox/cagebox/pulls?state=open", "rule": "github", "verdict": "allow", "reason": "",
		"status": 200, "bytes_up": 512, "bytes_down": 20480, "duration_ms": 12.5,
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Bound(ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBoundLong: the same event with a 64 KiB path to cut.
func BenchmarkBoundLong(b *testing.B) {
	ev := map[string]any{"host": "api.example.test", "port": 443, "method": "GET", "path": "/" + strings.Repeat("a", 64<<10)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Bound(ev); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBoundPayloadAsMap: a payload struct is stored byte for byte as the
// map of the same fields (what emitters passed before the catalog): keys
// sorted, "<" unescaped, a nil list as [], long strings cut.
func TestBoundPayloadAsMap(t *testing.T) {
	long := "/" + strings.Repeat("p", 3000)
	for _, c := range []struct {
		asMap   map[string]any
		payload api.EventPayload
	}{
		{map[string]any{"name": "GH", "hosts": []string(nil), "version": int64(3), "preview": "…abcd", "allow_env": false},
			api.SecretPut{Name: "GH", Version: 3, Preview: "…abcd"}},
		{map[string]any{"host": "h", "method": "GET", "path": "/<p>&", "names": []string{"A"}, "resigned": "hmac"},
			api.SecretUsed{Host: "h", Method: "GET", Path: "/<p>&", Names: []string{"A"}, Resigned: "hmac"}},
		{map[string]any{"error": "boom"}, api.SandboxFailed{Error: "boom"}},
		{map[string]any{"host": "h", "port": 443, "protocol": "https", "method": "GET", "path": long, "rule": "r", "verdict": "allow",
			"reason": "", "status": 200, "bytes_up": int64(1), "bytes_down": int64(2), "duration_ms": 1.234567},
			api.EgressAllow{Host: "h", Port: 443, Protocol: "https", Method: "GET", Path: long, Rule: "r", Verdict: "allow",
				Status: 200, BytesUp: 1, BytesDown: 2, DurationMS: 1.234567}},
	} {
		want, err := Bound(c.asMap)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Bound(c.payload)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%T stored as\n%s\nwant\n%s", c.payload, got, want)
		}
	}
}
