-- Nested calls: a call made by a native tool's own call through the pipeline
-- records its parent (every approval and preview of such a call too, for
-- the audit events written about them), and a call whose tool reports
-- progress while it runs shows the last report.
ALTER TABLE calls ADD COLUMN parent_call_id text NOT NULL DEFAULT '';
ALTER TABLE calls ADD COLUMN progress_message text NOT NULL DEFAULT '';
ALTER TABLE calls ADD COLUMN progress_at timestamptz;
ALTER TABLE approvals ADD COLUMN parent_call_id text NOT NULL DEFAULT '';
ALTER TABLE previews ADD COLUMN parent_call_id text NOT NULL DEFAULT '';

-- GetCall lists a call's children.
CREATE INDEX calls_parent_idx ON calls (parent_call_id, id) WHERE parent_call_id <> '';

-- A decided approval (or preview) releases every call parked behind it:
-- its own and its nested call's parents (ParkCall).
CREATE INDEX calls_awaiting_approval_idx ON calls (approval_id) WHERE state = 'AWAITING_APPROVAL';
CREATE INDEX calls_awaiting_preview_idx ON calls (preview_token) WHERE state = 'AWAITING_PREVIEW';
