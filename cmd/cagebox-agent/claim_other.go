//go:build !linux

package main

import (
	"errors"

	"github.com/cagebox/cagebox/agentproto"
)

func applyClaimFiles(string, *agentproto.Claim) error {
	return errors.New("claims are only applied on linux")
}
