ALTER TABLE tool_health DROP COLUMN IF EXISTS error_principals;
DROP INDEX IF EXISTS calls_parked_principal_idx;
