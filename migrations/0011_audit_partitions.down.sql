-- Back to one unpartitioned audit_events with the indexes of migration
-- 0001 (and the detail check of 0005, the trigger of 0009); every row is
-- copied, keeping its seq. Two events of the same id (different times)
-- cannot both go back: the down migration fails on them.
ALTER TABLE audit_events RENAME TO audit_events_parted;
DROP TRIGGER audit_events_notify ON audit_events_parted;
ALTER TABLE audit_events_parted DROP CONSTRAINT audit_events_pkey;
ALTER TABLE audit_events_parted DROP CONSTRAINT audit_events_id_time_key;
DROP INDEX audit_events_call_idx, audit_events_trace_idx, audit_events_task_idx, audit_events_principal_idx,
    audit_events_time_brin;

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
    detail    json CONSTRAINT audit_events_detail_object CHECK (detail IS NULL OR json_typeof(detail) = 'object')
);

INSERT INTO audit_events (seq, id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action,
                          risk, decision, outcome, detail)
OVERRIDING SYSTEM VALUE
SELECT seq, id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action,
       risk, decision, outcome, detail
FROM audit_events_parted ORDER BY seq;

SELECT setval(pg_get_serial_sequence('audit_events', 'seq'),
              COALESCE((SELECT max(seq) FROM audit_events_parted), 0) + 1, false);

DROP TABLE audit_events_parted;

-- calls: back to text and integer columns with their checks of 0001.
ALTER TABLE calls ALTER COLUMN state TYPE text, ALTER COLUMN risk TYPE text,
    ALTER COLUMN decision TYPE text, ALTER COLUMN attempt_count TYPE integer;
ALTER TABLE calls
    ADD CONSTRAINT calls_state_check CHECK (state IN ('AWAITING_APPROVAL', 'AWAITING_PREVIEW', 'IN_PROGRESS',
                                                      'SUCCEEDED', 'FAILED', 'UNKNOWN', 'DENIED', 'RELEASED')),
    ADD CONSTRAINT calls_risk_check CHECK (risk IN ('', 'LOW', 'MEDIUM', 'HIGH', 'CRITICAL')),
    ADD CONSTRAINT calls_decision_check CHECK (decision IN ('', 'ALLOW', 'PREVIEW', 'CONFIRM', 'DENY')),
    ADD CONSTRAINT calls_attempt_count_check CHECK (attempt_count >= 0);
DROP DOMAIN toolsvc_risk, toolsvc_decision, toolsvc_outcome, toolsvc_audit_detail, toolsvc_call_state, toolsvc_count;

CREATE INDEX audit_events_call_idx      ON audit_events (call_id, seq) WHERE call_id <> '';
CREATE INDEX audit_events_trace_idx     ON audit_events (trace_id, seq) WHERE trace_id <> '';
CREATE INDEX audit_events_task_idx      ON audit_events (task_id, seq) WHERE task_id <> '';
CREATE INDEX audit_events_principal_idx ON audit_events (principal, seq);
CREATE INDEX audit_events_tool_idx      ON audit_events (tool, seq) WHERE tool <> '';
CREATE INDEX audit_events_type_idx      ON audit_events (type, seq);
CREATE INDEX audit_events_time_idx      ON audit_events (time);

CREATE TRIGGER audit_events_notify AFTER INSERT ON audit_events
    FOR EACH ROW WHEN (NEW.type IN ('gate.required', 'approval.resolved', 'approval.expired'))
    EXECUTE FUNCTION toolsvc_queue_notification();
