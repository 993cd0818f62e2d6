package main

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"512M": 512 << 20, "2G": 2 << 30, "1.5GiB": 3 << 29, "65536": 65536, "64k": 64 << 10, "256mb": 256 << 20} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d %v, want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "lots", "-5M", "0", "M"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
		}
	}
}
