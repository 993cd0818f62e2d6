package hexdigit

import (
	"strconv"
	"testing"
)

func TestDigits(t *testing.T) {
	for c := 0; c < 256; c++ {
		v, err := strconv.ParseUint(string(rune(c)), 16, 8)
		if got := Is(byte(c)); got != (err == nil && c < 128) {
			t.Fatalf("Is(%#x) = %v", c, got)
		}
		if err == nil && c < 128 && Val(byte(c)) != byte(v) {
			t.Fatalf("Val(%#x) = %d, want %d", c, Val(byte(c)), v)
		}
	}
}
