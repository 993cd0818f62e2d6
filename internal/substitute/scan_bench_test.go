package substitute

import (
	"fmt"
	"math/rand"
	"net/http"
	"strings"
	"testing"
)

// Adversarial inputs for the exfil scan: one header line with no newline,
// the shape of the 57 KiB header that once cost 6.7 s of daemon CPU.
var scanSizes = []int{1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}

const b64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// adversarial returns n bytes of the named kind, deterministically.
func adversarial(kind string, n int) string {
	rng := rand.New(rand.NewSource(int64(n)))
	rnd := func(k int, alpha string) string {
		b := make([]byte, k)
		for i := range b {
			b[i] = alpha[rng.Intn(len(alpha))]
		}
		return string(b)
	}
	var s strings.Builder
	for s.Len() < n {
		switch kind {
		case "kv-tokens": // many candidates for generic-api-key, each a finding
			s.WriteString("secret=" + rnd(32, b64Alphabet) + " ")
		case "near-miss": // keyword and value shape, too short or low entropy
			s.WriteString("api_key=abc123 token=aaaaaaaaaa ")
		case "base64-run": // one long run of base64 characters
			s.WriteString(rnd(4096, b64Alphabet))
		case "keywords": // every rule's keyword prefilter passes
			for _, k := range allKeywords() {
				s.WriteString(k + "=" + rnd(24, b64Alphabet) + " ")
			}
		default:
			panic(kind)
		}
	}
	return s.String()[:n]
}

// allKeywords lists the keywords of every rule in use.
func allKeywords() []string {
	d, err := NewDetector()
	if err != nil {
		panic(err)
	}
	var ks []string
	for _, r := range d.rules {
		ks = append(ks, r.keywords...)
	}
	return ks
}

var adversarialKinds = []string{"kv-tokens", "near-miss", "base64-run", "keywords"}

// BenchmarkScanAdversarial scans one request whose only header is an
// adversarial line of each size; MB/s is over the header's bytes.
func BenchmarkScanAdversarial(b *testing.B) {
	d := testDetector(b)
	for _, kind := range adversarialKinds {
		for _, n := range scanSizes {
			b.Run(fmt.Sprintf("%s/%s", kind, sizeName(n)), func(b *testing.B) {
				r, _ := http.NewRequest("GET", "https://api.example/", nil)
				r.Header.Set("X-Data", adversarial(kind, n))
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					benchScan(b, d, r)
				}
			})
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
