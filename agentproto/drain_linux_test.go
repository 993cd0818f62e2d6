package agentproto

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"
)

// TestPumpKeepsOutputWrittenBeforeExit: a process wrote its output and
// exited while a background child still holds the pipe, and the pump runs
// only after the drain grace is over (a loaded guest schedules it late).
// The output already in the pipe is sent all the same; before, the read
// deadline made the pump drop it and `exec` printed nothing.
func TestPumpKeepsOutputWrittenBeforeExit(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()                                     // the "background child" keeps it open throughout
	want := bytes.Repeat([]byte("198.18.0.2\n"), 10000) // more than one chunk
	go func() { w.Write(want) }()
	time.Sleep(50 * time.Millisecond) // the pipe holds what fits (64 KiB)
	if err := r.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	fw := newFrameWriter(&out)
	var wg sync.WaitGroup
	wg.Add(1)
	done := make(chan struct{})
	go func() { pump(&wg, r, fw, frameStdout); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pump waited for more output after the drain grace")
	}
	fr := newFrameReader(&out)
	var got []byte
	for {
		ty, b, err := fr.next()
		if err != nil {
			break
		}
		if ty != frameStdout {
			t.Fatalf("frame %v", ty)
		}
		got = append(got, b...)
	}
	if len(got) == 0 || !bytes.HasPrefix(want, got) {
		t.Fatalf("the pump sent %d bytes of what was in the pipe; want a prefix of the %d written", len(got), len(want))
	}
	if len(got) < 4096 {
		t.Fatalf("the pump sent only %d bytes of what the pipe held", len(got))
	}
}
