//go:build !lite

package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestEventFlags(t *testing.T) {
	for _, tt := range []struct {
		retention string
		rate      float64
		burst     int
		keep      time.Duration
		wantRate  float64
		err       string
	}{
		{"7d", 200, 1000, 7 * 24 * time.Hour, 200, ""},
		{"36h", 50, 10, 36 * time.Hour, 50, ""},
		{"0", 200, 1000, 0, 200, ""},
		{"0d", 0, 1, 0, -1, ""}, // rate 0: no limit
		{"-1h", 200, 1000, 0, 0, "--event-retention"},
		{"7days", 200, 1000, 0, 0, "--event-retention"},
		{"-3d", 200, 1000, 0, 0, "--event-retention"},
		{"7d", -1, 1000, 0, 0, "--event-rate"},
		{"7d", math.NaN(), 1000, 0, 0, "--event-rate"},
		{"7d", 200, 0, 0, 0, "--event-burst"},
	} {
		c, err := eventConfig(tt.retention, tt.rate, tt.burst)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("eventConfig(%q, %v, %d) = %v, want an error naming %s", tt.retention, tt.rate, tt.burst, err, tt.err)
			}
			continue
		}
		if err != nil || c.Retention != tt.keep || c.Rate != tt.wantRate || c.Burst != tt.burst {
			t.Errorf("eventConfig(%q, %v, %d) = %+v, %v", tt.retention, tt.rate, tt.burst, c, err)
		}
	}
}
