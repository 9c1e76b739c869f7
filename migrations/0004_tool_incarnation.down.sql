DROP INDEX IF EXISTS previews_tool_pending_idx;
ALTER TABLE previews DROP COLUMN IF EXISTS tool_incarnation;
ALTER TABLE approvals DROP COLUMN IF EXISTS tool_incarnation;
ALTER TABLE tools DROP COLUMN IF EXISTS incarnation;
