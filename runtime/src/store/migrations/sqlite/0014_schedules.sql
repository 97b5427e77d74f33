-- Scheduled runs (issue 50). A schedule is its definition (`body`: route, goal, profile, cron,
-- time zone, policies, as JSON), whether it is paused and why, and its cursor: `next_fire_ms`,
-- the first fire time not decided yet (milliseconds since the epoch; NULL when it fires no more).
-- A replica decides the due fires of a schedule by moving the cursor on with a compare-and-set
-- and inserting one row per fire time in the same transaction, so each fire time is decided once
-- across the fleet; a fire to start is `starting` under a short claim (`claim_until`) until
-- its run is recorded (started through the idempotency key `schedule:{id}:{fire_time}`, so a
-- replica that takes over a dead one's claim starts the same run at most once).
CREATE TABLE schedules (
    id TEXT PRIMARY KEY,
    route_id TEXT NOT NULL,
    body TEXT NOT NULL,
    origin TEXT NOT NULL,
    paused INTEGER NOT NULL DEFAULT 0,
    paused_reason TEXT,
    next_fire_ms INTEGER,
    last_run_id TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_fire_ms) WHERE paused = 0;
CREATE TABLE schedule_fires (
    schedule_id TEXT NOT NULL,
    fire_ms INTEGER NOT NULL,
    fire_time TEXT NOT NULL,
    outcome TEXT NOT NULL,
    why TEXT,
    run_id TEXT,
    manual INTEGER NOT NULL DEFAULT 0,
    claim_until INTEGER NOT NULL DEFAULT 0,
    decided_at TEXT NOT NULL,
    decided_ms INTEGER NOT NULL,
    lag_ms INTEGER,
    PRIMARY KEY (schedule_id, fire_ms)
);
CREATE INDEX schedule_fires_open ON schedule_fires (claim_until) WHERE outcome IN ('starting', 'buffered');
CREATE INDEX schedule_fires_age ON schedule_fires (decided_ms);
