//go:build !linux

package agentproto

import (
	"encoding/json"
	"errors"

	"github.com/hashicorp/yamux"
)

// Reaper is only implemented on Linux.
type Reaper struct{}

func (c *serverConn) exec(st *yamux.Stream, fr *frameReader, fw *frameWriter, req *request) {
	res := &ExecResult{ExitCode: 126, Error: errors.New("exec is only supported on linux").Error()}
	p, _ := json.Marshal(res)
	fw.write(frameExit, p)
}
