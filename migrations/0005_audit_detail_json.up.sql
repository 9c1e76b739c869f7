-- Audit details become `json`, like every other payload: the detail is
-- encoded once when the event is built and stored byte for byte. `jsonb`
-- refuses strings holding \u0000, and arguments may hold it (valid JSON that
-- a caller may send and that is stored and replayed as sent), so a call whose
-- arguments are audited failed on Postgres while the memory store took it.
-- Nothing queries inside details; the trail is filtered by its columns.
--
-- The column is rewritten: on a large audit_events table this holds an
-- exclusive lock while it runs.
ALTER TABLE audit_events ALTER COLUMN detail TYPE json USING detail::json;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_detail_object
    CHECK (detail IS NULL OR json_typeof(detail) = 'object');
