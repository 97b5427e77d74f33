-- Claims and leases: a run is `queued` until a process claims it; the claim holds a lease until
-- `lease_until` (milliseconds since the epoch, the database's clock) and a fencing token, bumped
-- by every claim, that each of the holder's writes must still match.
ALTER TABLE runs ADD COLUMN lease_owner TEXT;
ALTER TABLE runs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lease_until INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_claimable ON runs (status, lease_until);

