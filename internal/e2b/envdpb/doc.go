// Package envdpb holds the Go code generated from E2B's envd protocol
// (process/process.proto, filesystem/filesystem.proto): the messages and
// the Connect handlers of the process and filesystem services that the
// E2B SDK calls inside a sandbox. The .proto files are E2B's specification,
// vendored unchanged from github.com/e2b-dev/E2B (spec/envd, commit
// b8029973aa7da5f741f7bb1a9f833b38a0885438; Apache License 2.0, see
// LICENSE.e2b); package e2b implements the services onto cagebox's agent.
package envdpb

// Regenerate with `go generate ./internal/e2b/envdpb` (buf.gen.yaml; buf
// and the pinned plugins are built by the Go toolchain).
//go:generate go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate
