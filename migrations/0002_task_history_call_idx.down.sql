DROP INDEX IF EXISTS task_history_call_idx;
