package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// qmpCall connects to the QMP socket at path, negotiates capabilities, runs
// one command and returns its result. One connection per call keeps the
// client stateless, so a recovered sandbox needs nothing but the path. QEMU
// serves one QMP client at a time; callers serialise.
func qmpCall(ctx context.Context, path, command string, args any) (json.RawMessage, error) {
	var res json.RawMessage
	err := qmpSession(ctx, path, func(r *bufio.Reader, conn *net.UnixConn) (err error) {
		res, err = qmpExec(r, conn, command, args)
		return err
	})
	return res, err
}

// qmpCallFD is qmpCall after passing f to QEMU as fdname (getfd, the
// descriptor in SCM_RIGHTS), in the same session: QEMU 7.2's outgoing
// migration takes a descriptor only by such a name (migrate fd:NAME).
func qmpCallFD(ctx context.Context, path, fdname string, f *os.File, command string, args any) (json.RawMessage, error) {
	var res json.RawMessage
	err := qmpSession(ctx, path, func(r *bufio.Reader, conn *net.UnixConn) (err error) {
		b, _ := json.Marshal(map[string]any{"execute": "getfd", "arguments": map[string]string{"fdname": fdname}})
		if _, _, err := conn.WriteMsgUnix(append(b, '\n'), unix.UnixRights(int(f.Fd())), nil); err != nil {
			return fmt.Errorf("qmp getfd: %w", err)
		}
		if _, err := qmpRead(r, "getfd"); err != nil {
			return err
		}
		res, err = qmpExec(r, conn, command, args)
		return err
	})
	return res, err
}

// qmpSession connects to the QMP socket at path, negotiates capabilities
// and runs fn.
func qmpSession(ctx context.Context, path string, fn func(*bufio.Reader, *net.UnixConn) error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("qmp: connect: %w", err)
	}
	defer c.Close()
	conn := c.(*net.UnixConn)
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
		return fmt.Errorf("qmp: greeting: %w", errors.Join(err, ctxErr(ctx)))
	}
	if _, err := qmpExec(r, conn, "qmp_capabilities", nil); err != nil {
		return errors.Join(err, ctxErr(ctx))
	}
	return errors.Join(fn(r, conn), ctxErr(ctx))
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
	return qmpRead(r, command)
}

// qmpRead reads the answer to command, skipping events.
func qmpRead(r *bufio.Reader, command string) (json.RawMessage, error) {
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
