ALTER TABLE calls DROP COLUMN claim_token;
