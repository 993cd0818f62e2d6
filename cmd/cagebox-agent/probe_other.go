//go:build !linux

package main

import "errors"

func readConfinement() (*confinement, error) {
	return nil, errors.New("confinement can only be probed on linux")
}
