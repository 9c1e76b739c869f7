-- The MCP front door.

-- A retry without its idempotency key finds the caller's parked call by what
-- it calls (FindParkedCall). Only parked calls are indexed: a call that never
-- parked is never found this way.
CREATE INDEX calls_parked_idx ON calls (principal_id, tool, action, fingerprint, id)
    WHERE state IN ('AWAITING_APPROVAL', 'AWAITING_PREVIEW');

-- Signing keys shared by every replica (the first replica to need one
-- stores it). They are secrets: nothing else reads this table.
CREATE TABLE signing_keys (
    name text COLLATE "C" PRIMARY KEY,
    key  bytea NOT NULL CHECK (octet_length(key) >= 32)
);

-- Single-use tokens already spent, until they expire (UseToken).
CREATE TABLE used_tokens (
    id         text COLLATE "C" PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX used_tokens_expiry_idx ON used_tokens (expires_at);
