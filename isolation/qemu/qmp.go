package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// qmpCall connects to the QMP socket at path, negotiates capabilities, runs
// one command and returns its result. One connection per call keeps the
// client stateless, so a recovered sandbox needs nothing but the path. QEMU
// serves one QMP client at a time; callers serialise.
func qmpCall(ctx context.Context, path, command string, args any) (json.RawMessage, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: connect: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	// Greeting: {"QMP": {...}}.
	var greet struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := readQMP(r, &greet); err != nil || greet.QMP == nil {
		return nil, fmt.Errorf("qmp: greeting: %w", errors.Join(err, ctxErr(ctx)))
	}
	if _, err := qmpExec(r, conn, "qmp_capabilities", nil); err != nil {
		return nil, errors.Join(err, ctxErr(ctx))
	}
	res, err := qmpExec(r, conn, command, args)
	return res, errors.Join(err, ctxErr(ctx))
}

func ctxErr(ctx context.Context) error { return ctx.Err() }

// qmpError is an error QEMU returned for a command.
type qmpError struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *qmpError) Error() string { return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc) }

func qmpExec(r *bufio.Reader, w net.Conn, command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := w.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	for {
		var msg struct {
			Return json.RawMessage `json:"return"`
			Error  *qmpError       `json:"error"`
			Event  string          `json:"event"`
		}
		if err := readQMP(r, &msg); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", command, err)
		}
		switch {
		case msg.Error != nil:
			msg.Error.Command = command
			return nil, msg.Error
		case msg.Return != nil:
			return msg.Return, nil
		}
		// An asynchronous event: skip.
	}
}

// readQMP reads one line (bounded: QMP replies we use are small) and
// decodes it.
func readQMP(r *bufio.Reader, v any) error {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, v)
}

// qmpStatus is query-status's answer.
type qmpStatus struct {
	Running bool   `json:"running"`
	Status  string `json:"status"`
}
