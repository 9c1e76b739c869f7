-- The notification outbox, its deliveries, and the console's sessions.

-- Audit events that notifications are sent for (store.NotifiedEventTypes)
-- are copied here by a trigger, in the transaction that appends them: every
-- write path — including the single-statement claims and outcomes that
-- insert their events from a CTE — queues its notifications with no code of
-- its own, and nothing is queued for a change that rolls back. A dispatcher
-- turns each into deliveries (one per endpoint) and removes it.
CREATE TABLE notification_outbox (
    seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_seq bigint      NOT NULL,
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
    risk      text        NOT NULL DEFAULT '',
    decision  text        NOT NULL DEFAULT '',
    outcome   text        NOT NULL DEFAULT '',
    detail    json
);

CREATE FUNCTION toolsvc_queue_notification() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notification_outbox (event_seq, id, time, type, call_id, trace_id, task_id, step_id,
                                     principal, tool, action, risk, decision, outcome, detail)
    VALUES (NEW.seq, NEW.id, NEW.time, NEW.type, NEW.call_id, NEW.trace_id, NEW.task_id, NEW.step_id,
            NEW.principal, NEW.tool, NEW.action, NEW.risk, NEW.decision, NEW.outcome, NEW.detail);
    RETURN NULL;
END
$$;

-- The WHEN clause is evaluated without calling the function, so the events
-- of the hot path (attempts, outcomes) cost next to nothing here.
CREATE TRIGGER audit_events_notify AFTER INSERT ON audit_events
    FOR EACH ROW WHEN (NEW.type IN ('gate.required', 'approval.resolved', 'approval.expired'))
    EXECUTE FUNCTION toolsvc_queue_notification();

-- One notification to one endpoint. id is the message id (webhook-id), the
-- same on every attempt; an attempt holds the row by a lease (claim_token,
-- lease_expires_at) so that one replica at a time sends it.
CREATE TABLE notification_deliveries (
    id               text COLLATE "C" PRIMARY KEY,
    event_id         text COLLATE "C" NOT NULL,
    event_type       text        NOT NULL,
    approval_id      text        NOT NULL DEFAULT '',
    endpoint         text COLLATE "C" NOT NULL,
    payload          json        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('PENDING', 'DELIVERED', 'DEAD')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL,
    lease_expires_at timestamptz,
    claim_token      text        NOT NULL DEFAULT '',
    last_error       text        NOT NULL DEFAULT '',
    last_status      integer     NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    delivered_at     timestamptz,
    UNIQUE (event_id, endpoint)
);

-- The dispatcher's claim: pending deliveries by due time.
CREATE INDEX notification_deliveries_due_idx ON notification_deliveries (next_attempt_at) WHERE state = 'PENDING';
-- Lists by state (dead letters) and by approval, newest first; retention.
CREATE INDEX notification_deliveries_state_idx ON notification_deliveries (state, id);
CREATE INDEX notification_deliveries_approval_idx ON notification_deliveries (approval_id, id) WHERE approval_id <> '';
CREATE INDEX notification_deliveries_finished_idx ON notification_deliveries (updated_at) WHERE state <> 'PENDING';

-- Console sessions: id is the SHA-256 of the cookie's secret.
CREATE TABLE console_sessions (
    id           text COLLATE "C" PRIMARY KEY,
    principal_id text        NOT NULL,
    credential   text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);
