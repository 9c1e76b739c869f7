-- Fails if a stored detail holds \u0000, which jsonb cannot hold.
ALTER TABLE audit_events DROP CONSTRAINT audit_events_detail_object;
ALTER TABLE audit_events ALTER COLUMN detail TYPE jsonb USING detail::jsonb;
