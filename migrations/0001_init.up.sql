-- toolsvc schema, version 1.
--
-- Conventions:
--   * Keys that are ordered or compared by range (tool names, approval ids)
--     use COLLATE "C" so that the database sorts exactly as Go compares
--     strings, whatever the database's default collation.
--   * A zero Go time is stored as NULL; strings the domain treats as "unset"
--     are stored as ''.
--   * Opaque payloads that callers hand in and expect back byte for byte
--     (tool definitions with their JSON Schemas, arguments, results, preview
--     values) are `json`, which keeps the text verbatim; `jsonb` would
--     reorder keys and change the bytes the argument fingerprints are
--     computed over. Audit details are `jsonb`: they are a map by contract
--     and are worth querying.
--   * Every enumerated state has a CHECK constraint.

CREATE TABLE tools (
    name        text COLLATE "C" PRIMARY KEY,
    version     bigint      NOT NULL CHECK (version > 0),
    source      text        NOT NULL CHECK (source IN ('', 'api', 'file', 'builtin')),
    definition  json        NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- ListTools filtered by source, in name order.
CREATE INDEX tools_source_name_idx ON tools (source, name);

CREATE TABLE tool_health (
    tool                 text COLLATE "C" PRIMARY KEY REFERENCES tools (name) ON DELETE CASCADE,
    status               text        NOT NULL CHECK (status IN ('HEALTHY', 'DEGRADED', 'UNAVAILABLE')),
    consecutive_errors   integer     NOT NULL DEFAULT 0 CHECK (consecutive_errors >= 0),
    last_success_at      timestamptz,
    last_error           text        NOT NULL DEFAULT '',
    last_error_at        timestamptz,
    rate_limit_resets_at timestamptz,
    cooldown_until       timestamptz,
    trips                integer     NOT NULL DEFAULT 0 CHECK (trips >= 0),
    probe_until          timestamptz,
    drained              boolean     NOT NULL DEFAULT false,
    override_by          text        NOT NULL DEFAULT '',
    override_reason      text        NOT NULL DEFAULT '',
    updated_at           timestamptz NOT NULL
);

-- ListToolHealth filtered by status, in tool order.
CREATE INDEX tool_health_status_tool_idx ON tool_health (status, tool);

-- Calls outlive their tool (the record and its outcome stay replayable after
-- a tool is deregistered), so there is no foreign key to tools.
CREATE TABLE calls (
    id                 text COLLATE "C" PRIMARY KEY,
    principal_id       text        NOT NULL,
    idempotency_key    text        NOT NULL,
    fingerprint        text        NOT NULL,
    tool               text        NOT NULL,
    action             text        NOT NULL,
    tool_version       bigint      NOT NULL DEFAULT 0,
    state              text        NOT NULL CHECK (state IN ('AWAITING_APPROVAL', 'AWAITING_PREVIEW', 'IN_PROGRESS',
                                                              'SUCCEEDED', 'FAILED', 'UNKNOWN', 'DENIED', 'RELEASED')),
    trace_id           text        NOT NULL DEFAULT '',
    task_id            text        NOT NULL DEFAULT '',
    step_id            text        NOT NULL DEFAULT '',
    risk               text        NOT NULL DEFAULT '' CHECK (risk IN ('', 'LOW', 'MEDIUM', 'HIGH', 'CRITICAL')),
    decision           text        NOT NULL DEFAULT '' CHECK (decision IN ('', 'ALLOW', 'PREVIEW', 'CONFIRM', 'DENY')),
    approval_id        text        NOT NULL DEFAULT '',
    preview_token      text        NOT NULL DEFAULT '',
    result             json,
    lease_expires_at   timestamptz,
    attempt_count      integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    resolved_by        text        NOT NULL DEFAULT '',
    resolution_comment text        NOT NULL DEFAULT '',
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    expires_at         timestamptz,
    -- The idempotency key: ClaimCall's INSERT ... ON CONFLICT arbiter.
    CONSTRAINT calls_principal_key_uniq UNIQUE (principal_id, idempotency_key)
);

-- The lease reaper: only IN_PROGRESS rows, by lease expiry.
CREATE INDEX calls_lease_idx ON calls (lease_expires_at) WHERE state = 'IN_PROGRESS';

-- Retention: only rows that may be deleted (neither running nor parked).
CREATE INDEX calls_retention_idx ON calls (expires_at)
    WHERE state NOT IN ('IN_PROGRESS', 'AWAITING_APPROVAL', 'AWAITING_PREVIEW');

-- Approval ids are UUIDv7 strings, which sort by creation time: listing
-- newest first is a backwards scan of the primary key.
CREATE TABLE approvals (
    id              text COLLATE "C" PRIMARY KEY,
    call_id         text COLLATE "C" NOT NULL REFERENCES calls (id) ON DELETE CASCADE,
    requester       text        NOT NULL,
    tool            text        NOT NULL,
    action          text        NOT NULL,
    tool_version    bigint      NOT NULL DEFAULT 0,
    arguments       json,
    fingerprint     text        NOT NULL,
    idempotency_key text        NOT NULL,
    risk            text        NOT NULL DEFAULT '' CHECK (risk IN ('', 'LOW', 'MEDIUM', 'HIGH', 'CRITICAL')),
    trace_id        text        NOT NULL DEFAULT '',
    task_id         text        NOT NULL DEFAULT '',
    step_id         text        NOT NULL DEFAULT '',
    state           text        NOT NULL CHECK (state IN ('PENDING', 'APPROVED', 'DENIED', 'EXPIRED', 'CONSUMED', 'INVALIDATED')),
    created_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    resolver        text        NOT NULL DEFAULT '',
    comment         text        NOT NULL DEFAULT '',
    resolved_at     timestamptz
);

CREATE INDEX approvals_call_idx ON approvals (call_id);
-- ListApprovals by state (the approval queue: PENDING, newest first).
CREATE INDEX approvals_state_id_idx ON approvals (state, id);
-- ListApprovals by tool.
CREATE INDEX approvals_tool_id_idx ON approvals (tool, id);
-- ExpireApprovals: only approvals that can still expire.
CREATE INDEX approvals_expiry_idx ON approvals (expires_at) WHERE state IN ('PENDING', 'APPROVED');

CREATE TABLE previews (
    token           text COLLATE "C" PRIMARY KEY,
    call_id         text COLLATE "C" NOT NULL REFERENCES calls (id) ON DELETE CASCADE,
    principal_id    text        NOT NULL,
    idempotency_key text        NOT NULL,
    fingerprint     text        NOT NULL,
    tool            text        NOT NULL,
    action          text        NOT NULL,
    tool_version    bigint      NOT NULL DEFAULT 0,
    message         text        NOT NULL DEFAULT '',
    value           json,
    state           text        NOT NULL CHECK (state IN ('PENDING', 'CONSUMED', 'EXPIRED')),
    created_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL
);

CREATE INDEX previews_call_idx ON previews (call_id);
-- ExpireApprovals' preview sweep: only pending previews.
CREATE INDEX previews_expiry_idx ON previews (expires_at) WHERE state = 'PENDING';

-- Append-only. seq is the order of the trail (and the pagination cursor);
-- id is the event's own identifier.
CREATE TABLE audit_events (
    seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id        text COLLATE "C" NOT NULL UNIQUE,
    time      timestamptz NOT NULL,
    type      text        NOT NULL,
    call_id   text        NOT NULL DEFAULT '',
    trace_id  text        NOT NULL DEFAULT '',
    task_id   text        NOT NULL DEFAULT '',
    step_id   text        NOT NULL DEFAULT '',
    principal text        NOT NULL DEFAULT '',
    tool      text        NOT NULL DEFAULT '',
    action    text        NOT NULL DEFAULT '',
    risk      text        NOT NULL DEFAULT '' CHECK (risk IN ('', 'LOW', 'MEDIUM', 'HIGH', 'CRITICAL')),
    decision  text        NOT NULL DEFAULT '' CHECK (decision IN ('', 'ALLOW', 'PREVIEW', 'CONFIRM', 'DENY')),
    outcome   text        NOT NULL DEFAULT '' CHECK (outcome IN ('', 'SUCCEEDED', 'FAILED', 'UNKNOWN',
                                                                  'APPROVAL_REQUIRED', 'PREVIEW_REQUIRED', 'DENIED')),
    detail    jsonb
);

-- ListAuditEvents: every filter is an equality (or a time range) and the
-- answer is in seq order, so each index ends in seq and serves "filter, then
-- page by AfterSeq" without a sort. Ids that are often empty get partial
-- indexes.
CREATE INDEX audit_events_call_idx      ON audit_events (call_id, seq) WHERE call_id <> '';
CREATE INDEX audit_events_trace_idx     ON audit_events (trace_id, seq) WHERE trace_id <> '';
CREATE INDEX audit_events_task_idx      ON audit_events (task_id, seq) WHERE task_id <> '';
CREATE INDEX audit_events_principal_idx ON audit_events (principal, seq);
CREATE INDEX audit_events_tool_idx      ON audit_events (tool, seq) WHERE tool <> '';
CREATE INDEX audit_events_type_idx      ON audit_events (type, seq);
CREATE INDEX audit_events_time_idx      ON audit_events (time);

-- The successful calls of each (principal, task), read by policies in
-- insertion (seq) order.
CREATE TABLE task_history (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    principal_id text        NOT NULL,
    task_id      text        NOT NULL,
    call_id      text        NOT NULL,
    tool         text        NOT NULL,
    action       text        NOT NULL,
    resource     text        NOT NULL DEFAULT '',
    at           timestamptz NOT NULL
);

CREATE INDEX task_history_task_idx ON task_history (principal_id, task_id, seq);
