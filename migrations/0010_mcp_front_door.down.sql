DROP TABLE IF EXISTS used_tokens;
DROP TABLE IF EXISTS signing_keys;
DROP INDEX IF EXISTS calls_parked_idx;
