package audit

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Bounds on event data, in bytes of UTF-8. Most fields of an event are
// chosen by the code in the sandbox (a path, a host name, an upstream's
// error text), so none of them is stored as given.
const (
	MaxHost   = 255  // host and DNS names (the longest valid DNS name)
	MaxPath   = 1024 // paths, URLs, commands
	MaxText   = 1024 // reasons, errors, warnings
	MaxString = 256  // any other string
	MaxKey    = 64   // object keys
	MaxItems  = 64   // elements of a list, entries of an object
	MaxDepth  = 8    // nesting of lists and objects
	// MaxData bounds the encoded data of one event. Data that is still
	// larger after every field has been cut is cut harder; failing that it
	// is replaced by {"truncated":true,"bytes":N}.
	MaxData = 8 << 10
)

// Ellipsis ends every string that was cut; data with anything cut carries
// "truncated": true at its top level.
const Ellipsis = "…"

// fieldBound is the bound of a string by the key it is under (for a list,
// the list's key). Other keys get MaxString.
var fieldBound = map[string]int{
	"host": MaxHost, "hosts": MaxHost, "name": MaxHost, "answer": MaxHost,
	"path": MaxPath, "url": MaxPath, "location": MaxPath, "command": MaxPath,
	"reason": MaxText, "error": MaxText, "warning": MaxText, "message": MaxText,
}

// limits are one pass's bounds; scale > 1 divides them (the harder passes).
type limits struct {
	scale int
	items int
}

var passes = []limits{{scale: 1, items: MaxItems}, {scale: 8, items: 16}}

// Bound encodes data as JSON with every string, list and object bounded
// (see the constants) and the whole at most MaxData bytes. nil is nil.
// Invalid UTF-8 becomes U+FFFD. A map, a slice, a string, a number or any
// value encoding/json takes may be given; the value is never modified.
func Bound(data any) (json.RawMessage, error) {
	if data == nil {
		return nil, nil
	}
	v, err := generic(data)
	if err != nil {
		return nil, err
	}
	if v == nil { // a value that encodes as null
		return nil, nil
	}
	for _, lim := range passes {
		b := bounder{lim: lim}
		out := b.value("", v, 0)
		if b.cut {
			if m, ok := out.(map[string]any); ok {
				m["truncated"] = true
			} else {
				out = map[string]any{"value": out, "truncated": true}
			}
		}
		raw, err := marshal(out)
		if err != nil {
			return nil, err
		}
		if len(raw) <= MaxData {
			return raw, nil
		}
	}
	raw, err := marshal(v)
	if err != nil {
		return nil, err
	}
	return marshal(map[string]any{"truncated": true, "bytes": len(raw)})
}

// marshal is json.Marshal without HTML escaping (an event's "<" stays "<").
func marshal(v any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode event data: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// generic returns data as a tree of map[string]any, []any, []string,
// string, bool, numbers and nil. A plain struct (an api event payload) is
// taken apart field by field, as encoding/json would name them; anything
// else goes through encoding/json once.
func generic(data any) (any, error) {
	switch data.(type) {
	case map[string]any, []any, []string, string, bool, int, int64, float64:
		return data, nil
	}
	if m, ok := structMap(reflect.ValueOf(data)); ok {
		return m, nil
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("encode event data: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("decode event data: %w", err)
	}
	return v, nil
}

type bounder struct {
	lim limits
	cut bool // something was cut
}

func (b *bounder) bound(key string) int {
	n, ok := fieldBound[key]
	if !ok {
		n = MaxString
	}
	return max(n/b.lim.scale, 16)
}

// value returns a bounded copy of v, found under key.
func (b *bounder) value(key string, v any, depth int) any {
	switch x := v.(type) {
	case nil, bool, json.Number, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
		return x
	case string:
		return b.str(x, b.bound(key))
	case []string:
		n := min(len(x), b.lim.items)
		out := make([]string, n, n+1)
		for i := range n {
			out[i] = b.str(x[i], b.bound(key))
		}
		if n < len(x) {
			b.cut = true
			out = append(out, Ellipsis)
		}
		return out
	}
	if depth >= MaxDepth {
		b.cut = true
		return Ellipsis
	}
	switch x := v.(type) {
	case []any:
		n := min(len(x), b.lim.items)
		out := make([]any, n, n+1)
		for i := range n {
			out[i] = b.value(key, x[i], depth+1)
		}
		if n < len(x) {
			b.cut = true
			out = append(out, Ellipsis)
		}
		return out
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys) // which entries survive a cut does not depend on map order
		if len(keys) > b.lim.items {
			keys = keys[:b.lim.items]
			b.cut = true
		}
		out := make(map[string]any, len(keys)+1)
		for _, k := range keys {
			out[b.str(k, MaxKey)] = b.value(k, x[k], depth+1)
		}
		return out
	}
	// Any other type (a struct, a typed map or slice nested in a map given
	// as is) goes through encoding/json, which yields only the types above.
	g, err := generic(v)
	if err != nil {
		b.cut = true
		return Ellipsis
	}
	return b.value(key, g, depth)
}

// str returns s as valid UTF-8 of at most n bytes: cut on a rune boundary
// and ended with Ellipsis when longer.
func (b *bounder) str(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	b.cut = true
	return Truncate(s, n)
}

// Truncate returns valid UTF-8 s cut to at most n bytes (n ≥ 3), on a rune
// boundary, ending with Ellipsis; s itself when it fits.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - len(Ellipsis)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + Ellipsis
}

// jsonField is a struct field as encoding/json encodes it.
type jsonField struct {
	index     int
	name      string
	omitEmpty bool
}

// plainFields caches fieldsOf: reflect.Type → plainStruct.
var plainFields sync.Map

type plainStruct struct {
	fields []jsonField
	ok     bool // false: encoding/json must encode the type itself
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// fieldsOf returns struct type t's fields, or false when encoding/json
// must encode t itself: t has its own encoding, an unexported or embedded
// field, or a tag option other than omitempty.
func fieldsOf(t reflect.Type) ([]jsonField, bool) {
	if p, ok := plainFields.Load(t); ok {
		return p.(plainStruct).fields, p.(plainStruct).ok
	}
	p := plainStruct{ok: true}
	for _, m := range []reflect.Type{t, reflect.PointerTo(t)} {
		if m.Implements(jsonMarshaler) || m.Implements(textMarshaler) {
			p.ok = false
		}
	}
	for i := 0; p.ok && i < t.NumField(); i++ {
		sf := t.Field(i)
		name, opts, _ := strings.Cut(sf.Tag.Get("json"), ",")
		switch {
		case name == "-" && opts == "":
			continue
		case !sf.IsExported() || sf.Anonymous || (opts != "" && opts != "omitempty"):
			p.ok = false
		case name == "":
			name = sf.Name
		}
		p.fields = append(p.fields, jsonField{index: i, name: name, omitEmpty: opts == "omitempty"})
	}
	if !p.ok {
		p.fields = nil
	}
	plainFields.Store(t, p)
	return p.fields, p.ok
}

// structMap returns v, a plain struct, as a map of its fields by JSON name
// (what encoding/json would give, without encoding it), with the values
// of basic kinds as generic takes them and any other left to the bounder.
// It is the fast path of event payloads.
func structMap(v reflect.Value) (map[string]any, bool) {
	if v.Kind() != reflect.Struct {
		return nil, false
	}
	fs, ok := fieldsOf(v.Type())
	if !ok {
		return nil, false
	}
	m := make(map[string]any, len(fs))
	for _, f := range fs {
		fv := v.Field(f.index)
		if f.omitEmpty && emptyValue(fv) {
			continue
		}
		switch fv.Kind() {
		case reflect.String:
			m[f.name] = fv.String()
		case reflect.Bool:
			m[f.name] = fv.Bool()
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			m[f.name] = fv.Int()
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			m[f.name] = fv.Uint()
		case reflect.Float64:
			m[f.name] = fv.Float()
		default:
			m[f.name] = fv.Interface()
		}
	}
	return m, true
}

// emptyValue is encoding/json's test for omitempty.
func emptyValue(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool:
		return !v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() == 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint() == 0
	case reflect.Float32, reflect.Float64:
		return v.Float() == 0
	case reflect.Interface, reflect.Pointer:
		return v.IsNil()
	}
	return false
}
