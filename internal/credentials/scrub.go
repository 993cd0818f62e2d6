package credentials

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"github.com/cagebox/cagebox/internal/hexdigit"
)

// The matcher is written by hand rather than built from regexp or an
// Aho-Corasick library: a real value may be written with a different escape
// at every character (literal, %XX in either case, %25XX, \uXXXX, \xHH, \/),
// which no fixed pattern set expresses, the replacement must copy the
// escapes it found, base64 forms need their boundary characters re-encoded
// bit by bit, and the scan must stop at the end of a read chunk and resume
// in the next one without buffering more than the longest form.

// Encoding names, as reported in a Reflection.
const (
	EncRaw     = "raw"
	EncPercent = "percent-encoded"
	EncJSON    = "JSON-escaped"
	EncHex     = "hex"
	EncBase64  = "base64"
	EncB64URL  = "base64url"
)

// minB64Core is the shortest base64 core searched for: shorter ones (real
// values under 6 bytes) would match ordinary text.
const minB64Core = 6

const (
	kindFlex = iota // raw, percent, JSON escapes, mixed per character
	kindLit         // a fixed pattern with a fixed replacement (hex)
	kindB64         // a base64 core at one alignment
)

// trigger is one form of one real value, tried where the text holds its
// first byte.
type trigger struct {
	kind int
	sw   int    // index into matcher.swaps
	lit  string // kindLit, kindB64: the pattern
	repl string // kindLit: the replacement
	enc  string // kindLit, kindB64: encoding name
	// kindB64
	align int  // bytes before the value in its 3-byte group
	url   bool // URL alphabet
}

type swapInfo struct {
	name      string
	real, ph  string
	mask      string // ph cut or padded to len(real), for base64 forms
	maskRunes []rune
}

// matcher is compiled once per set of swaps; it is read-only.
type matcher struct {
	swaps  []swapInfo
	trig   [256][]trigger
	hot    [256]bool // some trigger starts with this byte
	window int       // longest form in bytes: the most a scan holds back
	hasB64 bool      // some base64 core: the byte before a match may change
}

func newMatcher(swaps []Swap) *matcher {
	m := &matcher{}
	for _, s := range swaps {
		if s.Real == "" {
			continue
		}
		mask := s.Placeholder
		switch {
		case len(mask) > len(s.Real):
			mask = mask[:len(s.Real)]
		case len(mask) < len(s.Real):
			mask += strings.Repeat("x", len(s.Real)-len(mask))
		}
		i := len(m.swaps)
		m.swaps = append(m.swaps, swapInfo{name: s.Name, real: s.Real, ph: s.Placeholder, mask: mask})
		m.add(trigger{kind: kindFlex, sw: i}, s.Real[0])
		if s.Real[0] == ' ' {
			m.add(trigger{kind: kindFlex, sw: i}, '+')
		}
		m.add(trigger{kind: kindFlex, sw: i}, '%')
		m.add(trigger{kind: kindFlex, sw: i}, '\\')
		m.window = max(m.window, 6*len(s.Real))

		h := hex.EncodeToString([]byte(s.Real))
		hp := hex.EncodeToString([]byte(s.Placeholder))
		m.add(trigger{kind: kindLit, sw: i, lit: h, repl: hp, enc: EncHex}, h[0])
		m.add(trigger{kind: kindLit, sw: i, lit: strings.ToUpper(h), repl: strings.ToUpper(hp), enc: EncHex}, strings.ToUpper(h)[0])
		for k := range 3 {
			core := b64Core(s.Real, k, base64.StdEncoding)
			if len(core) < minB64Core {
				continue
			}
			m.hasB64 = true
			m.window = max(m.window, len(core)+2)
			m.add(trigger{kind: kindB64, sw: i, lit: core, enc: EncBase64, align: k}, core[0])
			if u := b64Core(s.Real, k, base64.URLEncoding); u != core {
				m.add(trigger{kind: kindB64, sw: i, lit: u, enc: EncB64URL, align: k, url: true}, u[0])
			}
		}
	}
	return m
}

func (m *matcher) add(t trigger, c byte) {
	for _, o := range m.trig[c] {
		if o.kind == t.kind && o.sw == t.sw && o.lit == t.lit && o.url == t.url {
			return
		}
	}
	m.trig[c] = append(m.trig[c], t)
	m.hot[c] = true
}

func (m *matcher) empty() bool { return len(m.swaps) == 0 }

// b64Core is the part of the base64 encoding of s, put k bytes into a
// 3-byte group, that depends on s's bits alone.
func b64Core(s string, k int, enc *base64.Encoding) string {
	buf := make([]byte, k+len(s))
	copy(buf[k:], s)
	e := enc.EncodeToString(buf)
	start, end := (8*k+5)/6, 8*(k+len(s))/6
	return e[start:end]
}

// Match outcomes.
const (
	noMatch = iota
	matched
	needMore
)

// unit is how one character of a real value was written.
type unit struct {
	form uint8
	cas  uint8 // case of its hex digits: caseNone (digits only), caseLower, caseUpper
}

const (
	caseNone uint8 = iota
	caseLower
	caseUpper
)

// hexCase is the case of hex digits (caseNone when all are digits).
func hexCase(ds ...byte) uint8 {
	for _, d := range ds {
		switch {
		case d >= 'A' && d <= 'F':
			return caseUpper
		case d >= 'a' && d <= 'f':
			return caseLower
		}
	}
	return caseNone
}

const (
	uLit   uint8 = iota
	uPlus        // ' ' written '+'
	uPct         // %XX
	uPct25       // %25XX (encoded twice)
	uJSONu       // \uXXXX
	uJSx         // \xHH
	uShort       // \/ \\ \" \'
)

// flexMatch matches real at t[i:], each character written as itself or any
// escape. It appends how each was written to units.
func flexMatch(t []byte, i int, real string, eof bool, units []unit) (end int, us []unit, st int) {
	j, p := i, 0
	more := func() (int, []unit, int) {
		if eof {
			return 0, units, noMatch
		}
		return 0, units, needMore
	}
	for p < len(real) {
		if j >= len(t) {
			return more()
		}
		c, b := t[j], real[p]
		switch {
		case c == b:
			units = append(units, unit{form: uLit})
			j++
			p++
		case c == '+' && b == ' ':
			units = append(units, unit{form: uPlus})
			j++
			p++
		case c == '%':
			if j+3 > len(t) {
				return more()
			}
			if hexdigit.Is(t[j+1]) && hexdigit.Is(t[j+2]) {
				if hexdigit.Val(t[j+1])<<4|hexdigit.Val(t[j+2]) == b {
					units = append(units, unit{form: uPct, cas: hexCase(t[j+1], t[j+2])})
					j += 3
					p++
					continue
				}
				if t[j+1] == '2' && t[j+2] == '5' {
					if j+5 > len(t) {
						return more()
					}
					if hexdigit.Is(t[j+3]) && hexdigit.Is(t[j+4]) && hexdigit.Val(t[j+3])<<4|hexdigit.Val(t[j+4]) == b {
						units = append(units, unit{form: uPct25, cas: hexCase(t[j+3], t[j+4])})
						j += 5
						p++
						continue
					}
				}
			}
			return 0, units, noMatch
		case c == '\\':
			if j+2 > len(t) {
				return more()
			}
			switch n := t[j+1]; {
			case n == 'u':
				if j+6 > len(t) {
					return more()
				}
				if !hexdigit.Is(t[j+2]) || !hexdigit.Is(t[j+3]) || !hexdigit.Is(t[j+4]) || !hexdigit.Is(t[j+5]) {
					return 0, units, noMatch
				}
				r := rune(hexdigit.Val(t[j+2]))<<12 | rune(hexdigit.Val(t[j+3]))<<8 | rune(hexdigit.Val(t[j+4]))<<4 | rune(hexdigit.Val(t[j+5]))
				want, size := rune(b), 1
				if b >= utf8.RuneSelf {
					want, size = utf8.DecodeRuneInString(real[p:])
				}
				if r != want {
					return 0, units, noMatch
				}
				units = append(units, unit{form: uJSONu, cas: hexCase(t[j+2], t[j+3], t[j+4], t[j+5])})
				j += 6
				p += size
			case n == 'x':
				if j+4 > len(t) {
					return more()
				}
				if !hexdigit.Is(t[j+2]) || !hexdigit.Is(t[j+3]) || hexdigit.Val(t[j+2])<<4|hexdigit.Val(t[j+3]) != b {
					return 0, units, noMatch
				}
				units = append(units, unit{form: uJSx, cas: hexCase(t[j+2], t[j+3])})
				j += 4
				p++
			case n == b && (b == '/' || b == '\\' || b == '"' || b == '\''):
				units = append(units, unit{form: uShort})
				j += 2
				p++
			default:
				return 0, units, noMatch
			}
		default:
			return 0, units, noMatch
		}
	}
	return j, units, matched
}

// flexEncoding names the escapes a flex match used.
func flexEncoding(units []unit) string {
	var pct, js bool
	for _, u := range units {
		switch u.form {
		case uPct, uPct25:
			pct = true
		case uJSONu, uJSx, uShort:
			js = true
		}
	}
	switch {
	case pct && js:
		return EncPercent + "+" + EncJSON
	case pct:
		return EncPercent
	case js:
		return EncJSON
	}
	return EncRaw
}

// appendFlex writes ph with the escapes units recorded, character by
// character (the last one's for characters past the real value's length),
// hex digits in the case the match used.
func appendFlex(out []byte, ph string, units []unit) []byte {
	upper := false
	for _, u := range units {
		if u.cas != caseNone {
			upper = u.cas == caseUpper
			break
		}
	}
	k := 0
	for _, r := range ph {
		u := unit{form: uLit}
		if len(units) > 0 {
			u = units[min(k, len(units)-1)]
		}
		k++
		var buf [utf8.UTFMax]byte
		n := utf8.EncodeRune(buf[:], r)
		raw := buf[:n]
		hexf := lowerHex
		if u.cas == caseUpper || u.cas == caseNone && upper {
			hexf = upperHex
		}
		switch u.form {
		case uPlus:
			if r == ' ' {
				out = append(out, '+')
				continue
			}
		case uPct, uPct25:
			for _, b := range raw {
				out = append(out, '%')
				if u.form == uPct25 {
					out = append(out, '2', '5')
				}
				out = append(out, hexf[b>>4], hexf[b&15])
			}
			continue
		case uJSONu:
			if r <= 0xffff {
				out = append(out, '\\', 'u', hexf[r>>12&15], hexf[r>>8&15], hexf[r>>4&15], hexf[r&15])
				continue
			}
		case uJSx:
			if r < utf8.RuneSelf {
				out = append(out, '\\', 'x', hexf[r>>4], hexf[r&15])
				continue
			}
		case uShort:
			if r == '/' || r == '\\' || r == '"' || r == '\'' {
				out = append(out, '\\', byte(r))
				continue
			}
		}
		out = append(out, raw...)
	}
	return out
}

const (
	lowerHex = "0123456789abcdef"
	upperHex = "0123456789ABCDEF"
	stdAlpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	urlAlpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
)

var b64Val [2][256]int8

func init() {
	for a, alpha := range []string{stdAlpha, urlAlpha} {
		for i := range b64Val[a] {
			b64Val[a][i] = -1
		}
		for i := 0; i < len(alpha); i++ {
			b64Val[a][alpha[i]] = int8(i)
		}
	}
}

func isB64Char(c byte) bool { return b64Val[0][c] >= 0 || b64Val[1][c] >= 0 }

// b64Replace rewrites a base64 core match: the real value's bits, put
// `align` bytes into a 3-byte group, are replaced by the mask's, in the
// core, in the partial character before it (head, the last byte of out,
// when it is a character of the alphabet) and in the partial character
// after it (tail, when present). It appends the new core and tail to out.
func b64Replace(out []byte, core []byte, tail int, align int, url bool, mask string) []byte {
	a := 0
	alpha := stdAlpha
	if url {
		a, alpha = 1, urlAlpha
	}
	L := len(mask)
	j0 := 8 * align / 6       // first character touching the value
	cs := (8*align + 5) / 6   // first core character
	ce := 8 * (align + L) / 6 // end of the core
	hasHead := cs > j0 && len(out) > 0 && b64Val[a][out[len(out)-1]] >= 0
	hasTail := tail >= 0 && 8*(align+L)%6 != 0 && b64Val[a][byte(tail)] >= 0
	nch := ce - j0 + 1
	vals := make([]byte, nch)
	if hasHead {
		vals[0] = byte(b64Val[a][out[len(out)-1]])
	}
	for j := cs; j < ce; j++ {
		vals[j-j0] = byte(b64Val[a][core[j-cs]])
	}
	if hasTail {
		vals[ce-j0] = byte(b64Val[a][byte(tail)])
	}
	// Overwrite bit positions [8*align-6*j0, +8L) with the mask.
	off := 8*align - 6*j0
	for i := 0; i < 8*L; i++ {
		bit := mask[i/8] >> (7 - i%8) & 1
		pos := off + i
		ch, sh := pos/6, 5-pos%6
		vals[ch] = vals[ch]&^(1<<sh) | bit<<sh
	}
	if hasHead {
		out[len(out)-1] = alpha[vals[0]]
	}
	for j := cs; j < ce; j++ {
		out = append(out, alpha[vals[j-j0]])
	}
	if hasTail {
		out = append(out, alpha[vals[ce-j0]])
	}
	return out
}

// engine scrubs one stream of text with a matcher.
type engine struct {
	m     *matcher
	carry []byte // input held back: a form may begin there
	out   []byte // output not yet taken
	units []unit
	onHit func(sw int, enc string)
}

// feed scrubs p (the next bytes of the stream; eof: the last) into e.out.
func (e *engine) feed(p []byte, eof bool) {
	data := p
	if len(e.carry) > 0 {
		data = append(e.carry, p...)
		e.carry = nil
	}
	m := e.m
	start := 0
	for i := 0; i < len(data); {
		for i < len(data) && !m.hot[data[i]] {
			i++
		}
		if i == len(data) {
			break
		}
		ts := m.trig[data[i]]
		advanced := false
		for k := range ts {
			end, st := e.try(data, i, start, &ts[k], eof)
			if st == needMore {
				e.out = append(e.out, data[start:i]...)
				e.carry = append([]byte(nil), data[i:]...)
				return
			}
			if st == matched {
				i, start, advanced = end, end, true
				break
			}
		}
		if !advanced {
			i++
		}
	}
	e.out = append(e.out, data[start:]...)
}

// try attempts trigger t at data[i]; on a match it writes data[start:i]
// and the replacement to e.out and returns the end of the match.
func (e *engine) try(data []byte, i, start int, t *trigger, eof bool) (int, int) {
	sw := &e.m.swaps[t.sw]
	switch t.kind {
	case kindFlex:
		end, units, st := flexMatch(data, i, sw.real, eof, e.units[:0])
		e.units = units
		if st != matched {
			return 0, st
		}
		e.out = append(e.out, data[start:i]...)
		e.out = appendFlex(e.out, sw.ph, units)
		e.hit(t.sw, flexEncoding(units))
		return end, matched
	case kindLit:
		if st := prefixMatch(data[i:], t.lit, eof); st != matched {
			return 0, st
		}
		e.out = append(e.out, data[start:i]...)
		e.out = append(e.out, t.repl...)
		e.hit(t.sw, t.enc)
		return i + len(t.lit), matched
	default: // kindB64
		if st := prefixMatch(data[i:], t.lit, eof); st != matched {
			return 0, st
		}
		end := i + len(t.lit)
		tail := -1
		if 8*(t.align+len(sw.real))%6 != 0 {
			if end >= len(data) {
				if !eof {
					return 0, needMore
				}
			} else {
				tail = int(data[end])
			}
		}
		e.out = append(e.out, data[start:i]...)
		a := 0
		if t.url {
			a = 1
		}
		e.out = b64Replace(e.out, data[i:end], tail, t.align, t.url, sw.mask)
		if tail >= 0 && 8*(t.align+len(sw.real))%6 != 0 && b64Val[a][byte(tail)] >= 0 {
			end++
		}
		e.hit(t.sw, t.enc)
		return end, matched
	}
}

func (e *engine) hit(sw int, enc string) {
	if e.onHit != nil {
		e.onHit(sw, enc)
	}
}

// prefixMatch reports whether d begins with pat (needMore: d is a proper
// prefix of it and more may come).
func prefixMatch(d []byte, pat string, eof bool) int {
	if len(d) > 1 && d[1] != pat[1] { // patterns are ≥ 2 bytes; most tries end here
		return noMatch
	}
	if len(d) >= len(pat) {
		if string(d[:len(pat)]) == pat {
			return matched
		}
		return noMatch
	}
	if !eof && string(d) == pat[:len(d)] {
		return needMore
	}
	return noMatch
}

// take returns the output that is final: all of it at the end of the
// stream, else all but a last byte that a base64 match starting next could
// still rewrite.
func (e *engine) take(eof bool) []byte {
	n := len(e.out)
	if !eof && n > 0 && e.m.hasB64 && isB64Char(e.out[n-1]) {
		n--
	}
	b := e.out[:n]
	return b
}

// consume drops the first n bytes of e.out.
func (e *engine) consume(n int) {
	rest := len(e.out) - n
	copy(e.out, e.out[n:])
	e.out = e.out[:rest]
}

// scrubString scrubs one whole string with m.
func scrubString(m *matcher, s string, onHit func(sw int, enc string)) string {
	if m.empty() || s == "" {
		return s
	}
	e := &engine{m: m, onHit: onHit}
	e.feed([]byte(s), true)
	return string(e.out)
}
