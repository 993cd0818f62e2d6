//go:build !linux

package main

import (
	"context"
	"log/slog"

	"github.com/cagebox/cagebox/agentproto"
)

// startAuditReader: syscall audit needs Linux's audit netlink socket.
func startAuditReader(int, *slog.Logger) func(context.Context, func(*agentproto.AuditRecord) error) error {
	return nil
}
