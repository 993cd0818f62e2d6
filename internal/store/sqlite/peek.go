package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
)

// SandboxStatus reads sandbox (or snapshot) id's status from the store at path without
// changing anything (read-only, no migrations, no seeding): another home's
// store, whose daemon is not running. found is false when the store has
// no such sandbox.
func SandboxStatus(ctx context.Context, path, id string) (status string, found bool, err error) {
	if _, err := os.Stat(path); err != nil {
		return "", false, fmt.Errorf("store %s: %w", path, err)
	}
	q := url.Values{}
	q.Set("mode", "ro")
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "query_only(1)")
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?"+q.Encode())
	if err != nil {
		return "", false, fmt.Errorf("store %s: %w", path, err)
	}
	defer db.Close()
	err = db.QueryRowContext(ctx, `SELECT status FROM sandboxes WHERE id = ?`, id).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		// A snapshot holds image references too (a store older than
		// snapshots has no such table: no such snapshot).
		err = db.QueryRowContext(ctx, `SELECT status FROM snapshots WHERE id = ?`, id).Scan(&status)
		if err != nil {
			return "", false, nil
		}
		return status, true, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("store %s: %w", path, err)
	}
	return status, true, nil
}
