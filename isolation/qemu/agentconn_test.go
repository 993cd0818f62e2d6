package qemu

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestAgentConnAnswerTimeout: while the guest boots, a connection waits as
// long as its caller says; once the agent serves its port, a connection's
// unanswered first write fails after answerTimeout.
func TestAgentConnAnswerTimeout(t *testing.T) {
	old := answerTimeout
	answerTimeout = 100 * time.Millisecond
	t.Cleanup(func() { answerTimeout = old })
	var link agentLink

	// A connection made while the guest boots: no limit; the agent
	// answers late.
	a, b := net.Pipe()
	c := newAgentConn(a, &link, false)
	go func() {
		buf := make([]byte, 5)
		io.ReadFull(b, buf)
		time.Sleep(300 * time.Millisecond)
		b.Write([]byte("ok"))
	}()
	c.Write([]byte("hello"))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("first connection: %q %v", buf, err)
	}
	c.Close()
	b.Close()
	if d := link.waitGap(); d <= 0 || d > reconnectGap {
		t.Fatalf("gap after close: %v", d)
	}

	// The agent serves its port; the hello goes unanswered.
	a, b = net.Pipe()
	defer b.Close()
	c = newAgentConn(a, &link, true)
	defer c.Close()
	go io.Copy(io.Discard, b)
	c.SetDeadline(time.Now().Add(time.Minute)) // the caller's, longer
	c.Write([]byte("hello"))
	start := time.Now()
	_, err := c.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("unanswered hello: %v after %v", err, time.Since(start))
	}

	// Answered in time, then no limit on later reads.
	a, b = net.Pipe()
	defer b.Close()
	c = newAgentConn(a, &link, true)
	defer c.Close()
	go func() {
		buf := make([]byte, 5)
		io.ReadFull(b, buf)
		b.Write([]byte("o"))
		time.Sleep(300 * time.Millisecond)
		b.Write([]byte("k"))
	}()
	c.Write([]byte("hello"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("answered connection: %q %v", buf, err)
	}
}
