package agentproto

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

const testToken = "s3cret-token"

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
