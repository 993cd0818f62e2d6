//go:build !linux

package main

import (
	"errors"
	"log/slog"

	"github.com/cagebox/cagebox/agentproto"
)

func dropCapabilities() error { return errors.New("capabilities are only managed on linux") }

func predropCapabilities() error { return errors.New("capabilities are only managed on linux") }

const capSetPCap = 1 << 8

func confineThread(extra uint64) error { return errors.New("capabilities are only managed on linux") }

func startReaper(log *slog.Logger) (*agentproto.Reaper, error) {
	return nil, errors.New("reaping is only supported on linux")
}
