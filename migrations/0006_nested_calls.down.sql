DROP INDEX IF EXISTS calls_awaiting_preview_idx;
DROP INDEX IF EXISTS calls_awaiting_approval_idx;
DROP INDEX IF EXISTS calls_parent_idx;
ALTER TABLE previews DROP COLUMN parent_call_id;
ALTER TABLE approvals DROP COLUMN parent_call_id;
ALTER TABLE calls DROP COLUMN progress_at;
ALTER TABLE calls DROP COLUMN progress_message;
ALTER TABLE calls DROP COLUMN parent_call_id;
