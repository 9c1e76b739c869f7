-- The audit trail partitioned by time, with fewer indexes; see
-- BENCHMARKS.md ("The database's work per call").
--
-- audit_events becomes a table partitioned by range of time: one partition
-- per UTC day (audit_events_pYYYYMMDD), created ahead of time by the server
-- (postgres.Store, under the migration lock), and a default partition for
-- every event no day partition takes (events from before this migration,
-- times far from today). Retention drops whole day partitions instead of
-- deleting their rows, and each partition's indexes stay the size of a day.
--
-- Indexes: an event costs one entry in each index it is in, and the hot
-- path appends two to three events per call. ListAuditEvents pages in seq
-- order by any of its filters; what it is asked for in practice:
--   - by principal (every agent and approver: the server restricts them to
--     their own principal) → (principal, seq);
--   - by call (a call's events: console, notifications, releases)
--     → (call_id, seq), partial;
--   - by trace and by task (correlation ids, empty for most events)
--     → (trace_id, seq) and (task_id, seq), partial: an event without one
--     costs nothing there;
--   - by time range → BRIN on time (rows arrive in time order, so block
--     ranges summarize well), and partition pruning first of all;
--   - the whole trail by seq → the primary key (seq, time).
-- Dropped: (type, seq), (tool, seq) and the btree on time. A filter by type
-- or tool alone (operators only) walks the trail in seq order and filters,
-- within the partitions its time range selects; with a call, principal,
-- trace or task it is served by that index.
--
-- Event ids are unique per (id, time) only: a unique index of a
-- partitioned table must hold its partition key. A retried append (the
-- same event, so the same time) is still refused as a conflict; an event
-- that repeats a stored id with another time is not. The server's ids are
-- UUIDv7, made afresh for each event.
--
-- Existing rows are copied into the partitions of their days, keeping their
-- seq; the identity continues after the highest. On a large trail the copy
-- runs inside the migration's transaction, holding its locks while it runs.

ALTER TABLE audit_events RENAME TO audit_events_old;
DROP TRIGGER audit_events_notify ON audit_events_old;
-- Its indexes and constraints go first: the new table's take their names,
-- and the copy need not maintain them.
ALTER TABLE audit_events_old DROP CONSTRAINT audit_events_pkey;
ALTER TABLE audit_events_old DROP CONSTRAINT audit_events_risk_check, DROP CONSTRAINT audit_events_decision_check,
    DROP CONSTRAINT audit_events_outcome_check;
ALTER TABLE audit_events_old DROP CONSTRAINT audit_events_id_key;
DROP INDEX audit_events_call_idx, audit_events_trace_idx, audit_events_task_idx, audit_events_principal_idx,
    audit_events_tool_idx, audit_events_type_idx, audit_events_time_idx;

-- The checks on the event's risk, decision, outcome and detail become
-- domains: Postgres 15 parses a table's CHECK constraints again for every
-- statement that writes it (≈ 9 µs for these four on this machine), while
-- a domain's checks are cached by each connection (≈ 1 µs). They refuse
-- the same values.
CREATE DOMAIN toolsvc_risk AS text CHECK (VALUE IN ('', 'LOW', 'MEDIUM', 'HIGH', 'CRITICAL'));
CREATE DOMAIN toolsvc_decision AS text CHECK (VALUE IN ('', 'ALLOW', 'PREVIEW', 'CONFIRM', 'DENY'));
CREATE DOMAIN toolsvc_outcome AS text CHECK (VALUE IN ('', 'SUCCEEDED', 'FAILED', 'UNKNOWN',
                                                       'APPROVAL_REQUIRED', 'PREVIEW_REQUIRED', 'DENIED'));
CREATE DOMAIN toolsvc_audit_detail AS json CHECK (VALUE IS NULL OR json_typeof(VALUE) = 'object');

CREATE TABLE audit_events (
    seq       bigint GENERATED ALWAYS AS IDENTITY,
    id        text COLLATE "C" NOT NULL,
    time      timestamptz NOT NULL,
    type      text        NOT NULL,
    call_id   text        NOT NULL DEFAULT '',
    trace_id  text        NOT NULL DEFAULT '',
    task_id   text        NOT NULL DEFAULT '',
    step_id   text        NOT NULL DEFAULT '',
    principal text        NOT NULL DEFAULT '',
    tool      text        NOT NULL DEFAULT '',
    action    text        NOT NULL DEFAULT '',
    risk      toolsvc_risk     NOT NULL DEFAULT '',
    decision  toolsvc_decision NOT NULL DEFAULT '',
    outcome   toolsvc_outcome  NOT NULL DEFAULT '',
    detail    toolsvc_audit_detail,
    PRIMARY KEY (seq, time),
    CONSTRAINT audit_events_id_time_key UNIQUE (id, time)
) PARTITION BY RANGE (time);

CREATE TABLE audit_events_default PARTITION OF audit_events DEFAULT;

-- A partition for each day that has events, and for today and the next two
-- days (the server keeps creating them ahead), so that the copy below and
-- the first events after it land in day partitions, and the default
-- partition starts empty (a day partition created later checks it).
DO $$
DECLARE
    d date;
BEGIN
    FOR d IN
        SELECT DISTINCT (time AT TIME ZONE 'UTC')::date FROM audit_events_old
        UNION
        SELECT (now() AT TIME ZONE 'UTC')::date + i FROM generate_series(0, 2) i
    LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF audit_events FOR VALUES FROM (%L) TO (%L)',
                       'audit_events_p' || to_char(d, 'YYYYMMDD'),
                       d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC');
    END LOOP;
END
$$;

CREATE INDEX audit_events_call_idx      ON audit_events (call_id, seq) WHERE call_id <> '';
CREATE INDEX audit_events_trace_idx     ON audit_events (trace_id, seq) WHERE trace_id <> '';
CREATE INDEX audit_events_task_idx      ON audit_events (task_id, seq) WHERE task_id <> '';
CREATE INDEX audit_events_principal_idx ON audit_events (principal, seq);
CREATE INDEX audit_events_time_brin     ON audit_events USING brin (time);

INSERT INTO audit_events (seq, id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action,
                          risk, decision, outcome, detail)
OVERRIDING SYSTEM VALUE
SELECT seq, id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action,
       risk, decision, outcome, detail
FROM audit_events_old;

SELECT setval(pg_get_serial_sequence('audit_events', 'seq'),
              COALESCE((SELECT max(seq) FROM audit_events_old), 0) + 1, false);

DROP TABLE audit_events_old;

-- The notification trigger of migration 0009, on the partitioned table (it
-- is cloned to every partition, present and future).
CREATE TRIGGER audit_events_notify AFTER INSERT ON audit_events
    FOR EACH ROW WHEN (NEW.type IN ('gate.required', 'approval.resolved', 'approval.expired'))
    EXECUTE FUNCTION toolsvc_queue_notification();

-- The same for calls, which the claim inserts and the outcome updates on
-- every call: its checks on state, risk, decision and attempt_count become
-- domains. Changing a column's type to a domain over it rewrites nothing
-- but checks every row and rebuilds the indexes whose predicates name
-- state.
CREATE DOMAIN toolsvc_call_state AS text CHECK (VALUE IN ('AWAITING_APPROVAL', 'AWAITING_PREVIEW', 'IN_PROGRESS',
                                                          'SUCCEEDED', 'FAILED', 'UNKNOWN', 'DENIED', 'RELEASED'));
CREATE DOMAIN toolsvc_count AS integer CHECK (VALUE >= 0);
ALTER TABLE calls DROP CONSTRAINT calls_state_check, DROP CONSTRAINT calls_risk_check,
    DROP CONSTRAINT calls_decision_check, DROP CONSTRAINT calls_attempt_count_check;
ALTER TABLE calls ALTER COLUMN state TYPE toolsvc_call_state, ALTER COLUMN risk TYPE toolsvc_risk,
    ALTER COLUMN decision TYPE toolsvc_decision, ALTER COLUMN attempt_count TYPE toolsvc_count;
