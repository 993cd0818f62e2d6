package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/cagebox/cagebox/internal/store"
)

var _ store.PolicyStore = (*Store)(nil)

// AppendPolicyVersion implements store.PolicyStore.
func (s *Store) AppendPolicyVersion(ctx context.Context, v *store.PolicyVersion) error {
	if v.CreatedAt.IsZero() {
		v.CreatedAt = now()
	}
	v.CreatedAt = store.NormTime(v.CreatedAt)
	_, err := s.w.ExecContext(ctx, `INSERT INTO policy_versions (sandbox_id, tenant_id, generation, document, actor, reason, ref, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		v.SandboxID, v.TenantID, v.Generation, string(v.Document), v.Actor, v.Reason, v.Ref, toNanos(v.CreatedAt))
	if err != nil {
		return fmt.Errorf("policy generation %d of %q: %w", v.Generation, v.SandboxID, mapErr(err))
	}
	return nil
}

const versionCols = `sandbox_id, tenant_id, generation, document, actor, reason, ref, created_at`

func scanVersion(r scanner) (*store.PolicyVersion, error) {
	var v store.PolicyVersion
	var doc string
	var at int64
	if err := r.Scan(&v.SandboxID, &v.TenantID, &v.Generation, &doc, &v.Actor, &v.Reason, &v.Ref, &at); err != nil {
		return nil, err
	}
	v.Document, v.CreatedAt = json.RawMessage(doc), fromNanos(at)
	return &v, nil
}

// ListPolicyVersions implements store.PolicyStore.
func (s *Store) ListPolicyVersions(ctx context.Context, tenantID, sandboxID string) ([]*store.PolicyVersion, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+versionCols+` FROM policy_versions WHERE sandbox_id = ? AND (? = '' OR tenant_id = ?) ORDER BY generation`,
		sandboxID, tenantID, tenantID)
	if err != nil {
		return nil, fmt.Errorf("policy history of %q: %w", sandboxID, err)
	}
	return scanAll(rows, scanVersion)
}

// LatestPolicyVersion implements store.PolicyStore.
func (s *Store) LatestPolicyVersion(ctx context.Context, sandboxID string) (*store.PolicyVersion, error) {
	v, err := scanVersion(s.r.QueryRowContext(ctx, `SELECT `+versionCols+` FROM policy_versions WHERE sandbox_id = ? ORDER BY generation DESC LIMIT 1`, sandboxID))
	if err != nil {
		return nil, fmt.Errorf("policy of %q: %w", sandboxID, mapErr(err))
	}
	return v, nil
}

// PutNamedPolicy implements store.PolicyStore.
func (s *Store) PutNamedPolicy(ctx context.Context, p *store.NamedPolicy, ifGeneration int64) error {
	t := store.NormTime(now())
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var gen, created int64
	err = tx.QueryRowContext(ctx, `SELECT generation, created_at FROM named_policies WHERE tenant_id = ? AND name = ?`, p.TenantID, p.Name).Scan(&gen, &created)
	switch {
	case err == sql.ErrNoRows:
		if ifGeneration != 0 {
			return fmt.Errorf("policy %q: %w", p.Name, store.ErrNotFound)
		}
		p.Generation, p.CreatedAt, p.UpdatedAt = 1, t, t
		if _, err := tx.ExecContext(ctx, `INSERT INTO named_policies (tenant_id, name, generation, document, created_at, updated_at) VALUES (?, ?, 1, ?, ?, ?)`,
			p.TenantID, p.Name, string(p.Document), toNanos(t), toNanos(t)); err != nil {
			return fmt.Errorf("create policy %q: %w", p.Name, mapErr(err))
		}
	case err != nil:
		return fmt.Errorf("policy %q: %w", p.Name, err)
	default:
		if ifGeneration == 0 {
			return fmt.Errorf("policy %q: %w", p.Name, store.ErrConflict)
		}
		if ifGeneration > 0 && ifGeneration != gen {
			return fmt.Errorf("policy %q is at generation %d, not %d: %w", p.Name, gen, ifGeneration, store.ErrConflict)
		}
		p.Generation, p.CreatedAt, p.UpdatedAt = gen+1, fromNanos(created), t
		if _, err := tx.ExecContext(ctx, `UPDATE named_policies SET generation = ?, document = ?, updated_at = ? WHERE tenant_id = ? AND name = ?`,
			p.Generation, string(p.Document), toNanos(t), p.TenantID, p.Name); err != nil {
			return fmt.Errorf("update policy %q: %w", p.Name, mapErr(err))
		}
	}
	return tx.Commit()
}

const namedCols = `tenant_id, name, generation, document, created_at, updated_at`

func scanNamed(r scanner) (*store.NamedPolicy, error) {
	var p store.NamedPolicy
	var doc string
	var c, u int64
	if err := r.Scan(&p.TenantID, &p.Name, &p.Generation, &doc, &c, &u); err != nil {
		return nil, err
	}
	p.Document, p.CreatedAt, p.UpdatedAt = json.RawMessage(doc), fromNanos(c), fromNanos(u)
	return &p, nil
}

// GetNamedPolicy implements store.PolicyStore.
func (s *Store) GetNamedPolicy(ctx context.Context, tenantID, name string) (*store.NamedPolicy, error) {
	p, err := scanNamed(s.r.QueryRowContext(ctx, `SELECT `+namedCols+` FROM named_policies WHERE tenant_id = ? AND name = ?`, tenantID, name))
	if err != nil {
		return nil, fmt.Errorf("policy %q: %w", name, mapErr(err))
	}
	return p, nil
}

// ListNamedPolicies implements store.PolicyStore.
func (s *Store) ListNamedPolicies(ctx context.Context, tenantID string) ([]*store.NamedPolicy, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+namedCols+` FROM named_policies WHERE (? = '' OR tenant_id = ?) ORDER BY tenant_id, name`, tenantID, tenantID)
	if err != nil {
		return nil, fmt.Errorf("list policies: %w", err)
	}
	return scanAll(rows, scanNamed)
}

// DeleteNamedPolicy implements store.PolicyStore.
func (s *Store) DeleteNamedPolicy(ctx context.Context, tenantID, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM named_policies WHERE tenant_id = ? AND name = ?`, tenantID, name)
	if err != nil {
		return fmt.Errorf("delete policy %q: %w", name, err)
	}
	if err := wantOneRow(res); err != nil {
		return fmt.Errorf("delete policy %q: %w", name, err)
	}
	return nil
}

// CreateApproval implements store.PolicyStore.
func (s *Store) CreateApproval(ctx context.Context, a *store.Approval) error {
	if a.CreatedAt.IsZero() {
		a.CreatedAt = now()
	}
	a.CreatedAt, a.Deadline = store.NormTime(a.CreatedAt), store.NormTime(a.Deadline)
	if a.State == "" {
		a.State = store.ApprovalPending
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO approvals (id, tenant_id, sandbox_id, rule, request, state, created_at, deadline) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		a.ID, a.TenantID, a.SandboxID, a.Rule, jsonArg(a.Request), a.State, toNanos(a.CreatedAt), toNanos(a.Deadline))
	if err != nil {
		return fmt.Errorf("create approval %q: %w", a.ID, mapErr(err))
	}
	return nil
}

const approvalCols = `id, tenant_id, sandbox_id, rule, request, state, decided_by, reason, remember, created_at, deadline, decided_at`

func scanApproval(r scanner) (*store.Approval, error) {
	var a store.Approval
	var req sql.NullString
	var c, d int64
	var decided sql.NullInt64
	if err := r.Scan(&a.ID, &a.TenantID, &a.SandboxID, &a.Rule, &req, &a.State, &a.DecidedBy, &a.Reason, &a.Remember, &c, &d, &decided); err != nil {
		return nil, err
	}
	if req.Valid {
		a.Request = json.RawMessage(req.String)
	}
	a.CreatedAt, a.Deadline, a.DecidedAt = fromNanos(c), fromNanos(d), fromNullNanos(decided)
	return &a, nil
}

// DecideApproval implements store.PolicyStore.
func (s *Store) DecideApproval(ctx context.Context, tenantID, id, state, by, reason string, remember bool) (*store.Approval, error) {
	t := store.NormTime(now())
	res, err := s.w.ExecContext(ctx, `UPDATE approvals SET state = ?, decided_by = ?, reason = ?, remember = ?, decided_at = ? WHERE id = ? AND (? = '' OR tenant_id = ?) AND state = 'pending'`,
		state, by, reason, remember, toNanos(t), id, tenantID, tenantID)
	if err != nil {
		return nil, fmt.Errorf("decide approval %q: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		a, err := s.GetApproval(ctx, tenantID, id)
		if err != nil {
			return nil, err
		}
		return a, fmt.Errorf("approval %q is already %s: %w", id, a.State, store.ErrConflict)
	}
	return s.GetApproval(ctx, tenantID, id)
}

// GetApproval implements store.PolicyStore.
func (s *Store) GetApproval(ctx context.Context, tenantID, id string) (*store.Approval, error) {
	a, err := scanApproval(s.r.QueryRowContext(ctx, `SELECT `+approvalCols+` FROM approvals WHERE id = ? AND (? = '' OR tenant_id = ?)`, id, tenantID, tenantID))
	if err != nil {
		return nil, fmt.Errorf("approval %q: %w", id, mapErr(err))
	}
	return a, nil
}

// ListApprovals implements store.PolicyStore.
func (s *Store) ListApprovals(ctx context.Context, tenantID, sandboxID, state string, limit int) ([]*store.Approval, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+approvalCols+` FROM approvals WHERE (? = '' OR tenant_id = ?) AND (? = '' OR sandbox_id = ?) AND (? = '' OR state = ?) ORDER BY created_at DESC, id LIMIT ?`,
		tenantID, tenantID, sandboxID, sandboxID, state, state, limit)
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", err)
	}
	return scanAll(rows, scanApproval)
}

// ExpirePendingApprovals implements store.PolicyStore.
func (s *Store) ExpirePendingApprovals(ctx context.Context, reason string) (int64, error) {
	res, err := s.w.ExecContext(ctx, `UPDATE approvals SET state = 'expired', reason = ?, decided_at = ? WHERE state = 'pending'`, reason, toNanos(store.NormTime(now())))
	if err != nil {
		return 0, fmt.Errorf("expire approvals: %w", err)
	}
	return res.RowsAffected()
}

// AddBudgetUsage implements store.PolicyStore.
func (s *Store) AddBudgetUsage(ctx context.Context, d store.BudgetUsage) (*store.BudgetUsage, error) {
	u := store.BudgetUsage{SandboxID: d.SandboxID, Budget: d.Budget}
	err := s.w.QueryRowContext(ctx, `INSERT INTO budget_usage (sandbox_id, budget, requests, bytes_up, bytes_down, spend_micros) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (sandbox_id, budget) DO UPDATE SET requests = requests + excluded.requests, bytes_up = bytes_up + excluded.bytes_up,
	bytes_down = bytes_down + excluded.bytes_down, spend_micros = spend_micros + excluded.spend_micros
RETURNING requests, bytes_up, bytes_down, spend_micros`,
		d.SandboxID, d.Budget, d.Requests, d.BytesUp, d.BytesDown, d.SpendMicros).Scan(&u.Requests, &u.BytesUp, &u.BytesDown, &u.SpendMicros)
	if err != nil {
		return nil, fmt.Errorf("budget %q of %q: %w", d.Budget, d.SandboxID, err)
	}
	return &u, nil
}

// ListBudgetUsage implements store.PolicyStore.
func (s *Store) ListBudgetUsage(ctx context.Context, sandboxID string) ([]*store.BudgetUsage, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT sandbox_id, budget, requests, bytes_up, bytes_down, spend_micros FROM budget_usage WHERE sandbox_id = ? ORDER BY budget`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("budget usage of %q: %w", sandboxID, err)
	}
	return scanAll(rows, func(r scanner) (*store.BudgetUsage, error) {
		var u store.BudgetUsage
		return &u, r.Scan(&u.SandboxID, &u.Budget, &u.Requests, &u.BytesUp, &u.BytesDown, &u.SpendMicros)
	})
}

// DeletePolicyState implements store.PolicyStore.
func (s *Store) DeletePolicyState(ctx context.Context, sandboxID string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM budget_usage WHERE sandbox_id = ?`, sandboxID); err != nil {
		return fmt.Errorf("delete budget usage of %q: %w", sandboxID, err)
	}
	if _, err := s.w.ExecContext(ctx, `UPDATE approvals SET state = 'expired', reason = 'sandbox removed', decided_at = ? WHERE sandbox_id = ? AND state = 'pending'`,
		toNanos(store.NormTime(now())), sandboxID); err != nil {
		return fmt.Errorf("expire approvals of %q: %w", sandboxID, err)
	}
	if _, err := s.w.ExecContext(ctx, `DELETE FROM freezes WHERE scope = ? AND target = ?`, store.FreezeSandbox, sandboxID); err != nil {
		return fmt.Errorf("delete freeze of %q: %w", sandboxID, err)
	}
	return nil
}

// PutFreeze implements store.PolicyStore.
func (s *Store) PutFreeze(ctx context.Context, f *store.Freeze) error {
	if f.CreatedAt.IsZero() {
		f.CreatedAt = now()
	}
	f.CreatedAt = store.NormTime(f.CreatedAt)
	_, err := s.w.ExecContext(ctx, `INSERT INTO freezes (scope, target, tenant_id, owner, created_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (scope, target) DO UPDATE SET tenant_id = excluded.tenant_id, owner = excluded.owner, created_at = excluded.created_at`,
		f.Scope, f.Target, f.TenantID, f.Owner, toNanos(f.CreatedAt))
	if err != nil {
		return fmt.Errorf("record freeze of %s %q: %w", f.Scope, f.Target, err)
	}
	return nil
}

// DeleteFreezes implements store.PolicyStore.
func (s *Store) DeleteFreezes(ctx context.Context, fs []*store.Freeze) error {
	if len(fs) == 0 {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delete freezes: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, f := range fs {
		if _, err := tx.ExecContext(ctx, `DELETE FROM freezes WHERE scope = ? AND target = ?`, f.Scope, f.Target); err != nil {
			return fmt.Errorf("delete freeze of %s %q: %w", f.Scope, f.Target, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("delete freezes: %w", err)
	}
	return nil
}

// ListFreezes implements store.PolicyStore.
func (s *Store) ListFreezes(ctx context.Context) ([]*store.Freeze, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT scope, target, tenant_id, owner, created_at FROM freezes ORDER BY scope, target`)
	if err != nil {
		return nil, fmt.Errorf("list freezes: %w", err)
	}
	return scanAll(rows, func(r scanner) (*store.Freeze, error) {
		var f store.Freeze
		var at int64
		if err := r.Scan(&f.Scope, &f.Target, &f.TenantID, &f.Owner, &at); err != nil {
			return nil, err
		}
		f.CreatedAt = fromNanos(at)
		return &f, nil
	})
}
