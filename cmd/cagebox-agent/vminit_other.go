//go:build !linux

package main

import (
	"context"
	"errors"
	"log/slog"
	"os"

	"github.com/cagebox/cagebox/agentproto"
)

const vmAgentArg = "--vm-agent-stage"

func isVMInit() bool { return false }

func vmInit() int { return 1 }

func vmAgentStage(args []string) int { return run(args, os.Stderr) }

type vsockListener uint64

func (v vsockListener) serve(ctx context.Context, srv *agentproto.Server, log *slog.Logger) error {
	return errors.New("vsock needs linux")
}
