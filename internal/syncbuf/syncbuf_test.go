package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrent writes from several goroutines while another reads; run
// with -race, an unguarded buffer fails it.
func TestConcurrent(t *testing.T) {
	var b Buffer
	const writers, writes = 4, 200
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range writes {
				_, _ = b.Write([]byte("x"))
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(b.String()) < writers*writes {
		}
	}()
	wg.Wait()
	<-done
	if got := b.String(); got != strings.Repeat("x", writers*writes) {
		t.Fatalf("got %d bytes, want %d", len(got), writers*writes)
	}
}
