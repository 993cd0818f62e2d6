//go:build !linux

package agentproto

import "errors"

var errArchiveLinux = errors.New("archives are only supported on linux")

func archiveGet(fw *frameWriter, req *request) error { return errArchiveLinux }

func archivePut(fr *frameReader, req *request) error { return errArchiveLinux }

func syncFS() {}
