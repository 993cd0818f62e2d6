package sqlite

import "github.com/cagebox/cagebox/internal/sqlitedb"

// migration is one step of the schema, recorded in schema_migrations.
type migration = sqlitedb.Step

// migrations is the schema, oldest first. Times are INTEGER unix
// nanoseconds in UTC; JSON is TEXT.
var migrations = []migration{
	{Version: 1, Name: "initial schema", SQL: `
CREATE TABLE tenants (
	id            TEXT PRIMARY KEY,
	name          TEXT NOT NULL,
	min_isolation TEXT NOT NULL DEFAULT '',
	created_at    INTEGER NOT NULL
);

CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	tenant_id  TEXT NOT NULL REFERENCES tenants(id),
	hash       BLOB NOT NULL UNIQUE,
	prefix     TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	revoked_at INTEGER
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE sandboxes (
	id           TEXT PRIMARY KEY,
	tenant_id    TEXT NOT NULL REFERENCES tenants(id),
	runtime      TEXT NOT NULL,
	image        TEXT NOT NULL,
	status       TEXT NOT NULL,
	spec         TEXT,
	state        TEXT,
	error        TEXT NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL,
	updated_at   INTEGER NOT NULL,
	expires_at   INTEGER,
	idle_timeout INTEGER NOT NULL DEFAULT 0,
	last_active  INTEGER NOT NULL
);
CREATE INDEX sandboxes_tenant ON sandboxes (tenant_id, created_at);

-- Events outlive their sandbox (it is an audit log), so no foreign keys.
CREATE TABLE events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	time       INTEGER NOT NULL,
	tenant_id  TEXT NOT NULL DEFAULT '',
	sandbox_id TEXT NOT NULL DEFAULT '',
	kind       TEXT NOT NULL,
	data       TEXT
);
CREATE INDEX events_tenant ON events (tenant_id, seq);
CREATE INDEX events_sandbox ON events (sandbox_id, seq);
`},
	{Version: 2, Name: "untrusted tenants", SQL: `
ALTER TABLE tenants ADD COLUMN untrusted INTEGER NOT NULL DEFAULT 0;
`},
	{Version: 3, Name: "event retention", SQL: `
CREATE INDEX events_time ON events (time);
`},
	{Version: 4, Name: "live policy", SQL: `
CREATE TABLE policy_versions (
	sandbox_id TEXT NOT NULL,
	tenant_id  TEXT NOT NULL,
	generation INTEGER NOT NULL,
	document   TEXT NOT NULL,
	actor      TEXT NOT NULL DEFAULT '',
	reason     TEXT NOT NULL DEFAULT '',
	ref        TEXT NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, generation)
);
CREATE TABLE named_policies (
	tenant_id  TEXT NOT NULL REFERENCES tenants(id),
	name       TEXT NOT NULL,
	generation INTEGER NOT NULL,
	document   TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (tenant_id, name)
);
CREATE TABLE approvals (
	id         TEXT PRIMARY KEY,
	tenant_id  TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	rule       TEXT NOT NULL,
	request    TEXT,
	state      TEXT NOT NULL,
	decided_by TEXT NOT NULL DEFAULT '',
	reason     TEXT NOT NULL DEFAULT '',
	remember   INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL,
	deadline   INTEGER NOT NULL,
	decided_at INTEGER
);
CREATE INDEX approvals_tenant ON approvals (tenant_id, created_at);
CREATE INDEX approvals_state ON approvals (state);
CREATE TABLE budget_usage (
	sandbox_id   TEXT NOT NULL,
	budget       TEXT NOT NULL,
	requests     INTEGER NOT NULL DEFAULT 0,
	bytes_up     INTEGER NOT NULL DEFAULT 0,
	bytes_down   INTEGER NOT NULL DEFAULT 0,
	spend_micros INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (sandbox_id, budget)
);
`},
	{Version: 5, Name: "tools", SQL: `
CREATE TABLE tools (
	tenant_id  TEXT NOT NULL REFERENCES tenants(id),
	name       TEXT NOT NULL,
	spec       TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (tenant_id, name)
);
`},
	{Version: 6, Name: "webhooks", SQL: `
CREATE TABLE webhooks (
	id         TEXT PRIMARY KEY,
	tenant_id  TEXT NOT NULL REFERENCES tenants(id),
	sandbox_id TEXT NOT NULL,
	name       TEXT NOT NULL,
	port       INTEGER NOT NULL,
	path       TEXT NOT NULL,
	verify     TEXT NOT NULL,
	secret     TEXT NOT NULL,
	token_hash BLOB NOT NULL UNIQUE,
	created_at INTEGER NOT NULL,
	UNIQUE (sandbox_id, name)
);
CREATE INDEX webhooks_tenant ON webhooks (tenant_id, sandbox_id);
CREATE TABLE webhook_deliveries (
	id          INTEGER PRIMARY KEY AUTOINCREMENT,
	webhook_id  TEXT NOT NULL REFERENCES webhooks(id) ON DELETE CASCADE,
	sandbox_id  TEXT NOT NULL,
	key         TEXT NOT NULL,
	method      TEXT NOT NULL,
	header      TEXT NOT NULL,
	body        BLOB NOT NULL,
	received_at INTEGER NOT NULL,
	next_at     INTEGER NOT NULL,
	attempts    INTEGER NOT NULL DEFAULT 0,
	state       TEXT NOT NULL,
	result      TEXT NOT NULL DEFAULT '',
	finished_at INTEGER,
	UNIQUE (webhook_id, key)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_at);
`},
	{Version: 7, Name: "volumes", SQL: `
CREATE TABLE volumes (
	tenant_id  TEXT NOT NULL REFERENCES tenants(id),
	name       TEXT NOT NULL,
	size_bytes INTEGER NOT NULL,
	vm_written INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (tenant_id, name)
);
`},
	// Published ports (package ingress).
	{Version: 8, Name: "published ports", SQL: `
CREATE TABLE ports (
	sandbox_id TEXT NOT NULL,
	tenant_id  TEXT NOT NULL REFERENCES tenants(id),
	port       INTEGER NOT NULL,
	public     INTEGER NOT NULL DEFAULT 0,
	token_hash BLOB,
	expires_at INTEGER,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, port)
);
`},
	// Relays (package relay): each owns a webhook row, whose delivery
	// queue carries its events; deleting the webhook deletes the relay.
	{Version: 9, Name: "relays", SQL: `
CREATE TABLE relays (
	webhook_id TEXT PRIMARY KEY REFERENCES webhooks(id) ON DELETE CASCADE,
	kind       TEXT NOT NULL,
	config     TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
`},
	// Sandbox labels (KEY=VALUE tags set at create, never changed): a
	// JSON object, matched with json_each by ListSandboxesLabeled.
	{Version: 10, Name: "sandbox labels", SQL: `
ALTER TABLE sandboxes ADD COLUMN labels TEXT;
`},
	// A sandbox made ahead of its tenant (a pooled one) is a row of no
	// tenant: tenant_id becomes nullable (NULL: no tenant; the foreign
	// key holds for the others). SQLite changes a column's constraints
	// only by rebuilding the table; no table references sandboxes.
	{Version: 11, Name: "sandboxes of no tenant", SQL: `
CREATE TABLE sandboxes_new (
	id           TEXT PRIMARY KEY,
	tenant_id    TEXT REFERENCES tenants(id),
	runtime      TEXT NOT NULL,
	image        TEXT NOT NULL,
	status       TEXT NOT NULL,
	spec         TEXT,
	state        TEXT,
	error        TEXT NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL,
	updated_at   INTEGER NOT NULL,
	expires_at   INTEGER,
	idle_timeout INTEGER NOT NULL DEFAULT 0,
	last_active  INTEGER NOT NULL,
	labels       TEXT
);
INSERT INTO sandboxes_new (id, tenant_id, runtime, image, status, spec, state, error,
	created_at, updated_at, expires_at, idle_timeout, last_active, labels)
SELECT id, tenant_id, runtime, image, status, spec, state, error,
	created_at, updated_at, expires_at, idle_timeout, last_active, labels FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandboxes_new RENAME TO sandboxes;
CREATE INDEX sandboxes_tenant ON sandboxes (tenant_id, created_at);
`},
	// Freezes (package livepolicy) with their owners, so a restart lifts
	// none: scope "all" (target ""), "tenant" or "sandbox" (target its
	// id; tenant_id the sandbox's tenant).
	{Version: 12, Name: "freezes", SQL: `
CREATE TABLE freezes (
	scope      TEXT NOT NULL,
	target     TEXT NOT NULL,
	tenant_id  TEXT NOT NULL DEFAULT '',
	owner      TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (scope, target)
);
`},
	// Snapshots (package sandbox): a tenant's saved sandbox states.
	{Version: 13, Name: "snapshots", SQL: `
CREATE TABLE snapshots (
	id         TEXT PRIMARY KEY,
	tenant_id  TEXT NOT NULL REFERENCES tenants(id),
	name       TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	runtime    TEXT NOT NULL,
	image      TEXT NOT NULL,
	status     TEXT NOT NULL,
	kind       TEXT NOT NULL DEFAULT '',
	size_bytes INTEGER NOT NULL DEFAULT 0,
	digest     TEXT NOT NULL DEFAULT '',
	fork       INTEGER NOT NULL DEFAULT 0,
	spec       TEXT,
	created_at INTEGER NOT NULL,
	UNIQUE (tenant_id, name)
);
`},
}
