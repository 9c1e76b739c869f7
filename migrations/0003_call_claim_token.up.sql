-- The token of the reservation that moved a call to IN_PROGRESS, so that a
-- reservation whose maker never learned its outcome (the commit's answer was
-- lost with the connection) can be given back by that maker, and only by it.
ALTER TABLE calls ADD COLUMN claim_token text NOT NULL DEFAULT '';
