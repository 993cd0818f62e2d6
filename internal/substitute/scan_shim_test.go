package substitute

import (
	"net/http"
	"testing"
	"time"
)

// benchScan scans r with budgets large enough that the benchmark measures
// the scan itself, not where a budget stops it.
func benchScan(b *testing.B, d *Detector, r *http.Request) {
	res, err := d.ScanBudget(r, Budget{Bytes: 8 << 20, Time: time.Hour})
	if err != nil || !res.Complete {
		b.Fatal(err, res.Gap)
	}
}
