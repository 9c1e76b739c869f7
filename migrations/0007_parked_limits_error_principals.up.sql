-- Parking within a principal's limits counts the calls it has parked
-- (awaiting an approval or a preview token) and the bytes they hold: only
-- those rows, by principal.
CREATE INDEX calls_parked_principal_idx ON calls (principal_id)
    WHERE state IN ('AWAITING_APPROVAL', 'AWAITING_PREVIEW');

-- The principals whose calls make up a tool's current run of consecutive
-- errors ('' for failures seen without a caller): one principal's failures
-- alone do not open the circuit that every caller shares.
ALTER TABLE tool_health ADD COLUMN error_principals text[] NOT NULL DEFAULT '{}';
