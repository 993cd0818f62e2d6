package credentials

import (
	"log/slog"
	"strings"
	"sync"

	"github.com/cagebox/cagebox/internal/substitute"
)

// Swap is one real value the gateway put into a request, with what the
// guest knows it by: the binding's placeholder, or for a re-signed request
// the guest's own signature or key id.
type Swap struct {
	Name        string // binding name
	Real        string
	Placeholder string
}

// String and LogValue keep the values out of logs and %v.
func (s Swap) String() string { return "Swap{" + s.Name + " REDACTED}" }

// LogValue implements slog.LogValuer.
func (s Swap) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Reals collects the swaps of one request. Pipeline.Request adds to it; a
// streamed request body may add more while the response is already being
// read, so it is safe for concurrent use and the response scrub picks up
// what is added later.
type Reals struct {
	// mu guards swaps, gen and pending.
	mu      sync.Mutex
	swaps   []Swap
	gen     uint64
	pending bool
}

// Add records s. An empty real value is ignored, a repeated one kept once.
// A swap without a placeholder gets a fresh one of the real value's shape.
func (r *Reals) Add(s Swap) {
	if s.Real == "" {
		return
	}
	if s.Placeholder == "" || s.Placeholder == s.Real || strings.Contains(s.Placeholder, s.Real) {
		ph, err := substitute.NewPlaceholder([]byte(s.Real))
		if err != nil {
			ph = strings.Repeat("x", len(s.Real))
		}
		s.Placeholder = ph
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.swaps {
		if o.Real == s.Real {
			return
		}
	}
	r.swaps = append(r.swaps, s)
	r.gen++
}

// AddFunc adapts Add to the report callbacks of substitute and resign.
func (r *Reals) AddFunc(name string) func(real, placeholder string) {
	return func(real, placeholder string) { r.Add(Swap{Name: name, Real: real, Placeholder: placeholder}) }
}

// SetPending marks a request whose body is still being substituted as it
// streams: its response is scrubbed even if nothing was swapped yet.
func (r *Reals) SetPending() {
	r.mu.Lock()
	r.pending = true
	r.mu.Unlock()
}

// Len is the number of real values recorded.
func (r *Reals) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.swaps)
}

func (r *Reals) snapshot() (swaps []Swap, gen uint64, pending bool) {
	if r == nil {
		return nil, 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.swaps, r.gen, r.pending
}

func (r *Reals) generation() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen
}
