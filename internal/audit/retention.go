package audit

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cagebox/cagebox/internal/store"
)

// Retention defaults.
const (
	// DefaultRetention is how long events are kept (cagebox daemon
	// --event-retention).
	DefaultRetention = 7 * 24 * time.Hour
	// PruneBatch is the most events one delete transaction removes: the
	// store's write lock is held for a few milliseconds, and the event
	// writer gets its turn between batches.
	PruneBatch = 1000
	// PruneEvery is how often Retain looks for old events.
	PruneEvery = 10 * time.Minute
)

// RetainConfig configures Retain.
type RetainConfig struct {
	Store store.Store
	// Keep is how long events are kept; 0 keeps them forever.
	Keep time.Duration
	// Every is the pause between prunes; 0 = PruneEvery (at most Keep/10).
	Every time.Duration
	// Batch is the most events per transaction; 0 = PruneBatch.
	Batch  int
	Logger *slog.Logger
	// Now is the clock (tests); nil = time.Now.
	Now func() time.Time
}

// Retain prunes events older than cfg.Keep, once at once and then every
// cfg.Every, until ctx ends. With Keep 0 it returns at once.
func Retain(ctx context.Context, cfg RetainConfig) {
	if cfg.Keep <= 0 {
		return
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Every <= 0 {
		cfg.Every = min(PruneEvery, max(cfg.Keep/10, time.Second))
	}
	t := time.NewTicker(cfg.Every)
	defer t.Stop()
	for {
		cut := cfg.Now().Add(-cfg.Keep)
		n, err := Prune(ctx, cfg.Store, cut, cfg.Batch)
		switch {
		case err != nil && ctx.Err() == nil:
			cfg.Logger.Error("prune events", "before", cut, "deleted", n, "err", err)
		case n > 0:
			cfg.Logger.Info("pruned events", "before", cut, "deleted", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Prune deletes every event older than before in transactions of at most
// batch events (0 = PruneBatch), and returns how many it deleted.
func Prune(ctx context.Context, st store.Store, before time.Time, batch int) (int64, error) {
	if batch <= 0 {
		batch = PruneBatch
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("prune events: %w", err)
		}
		n, err := st.DeleteEventsBefore(ctx, before, batch)
		total += n
		if err != nil {
			return total, fmt.Errorf("prune events: %w", err)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}
