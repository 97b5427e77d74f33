-- Flow control across a fleet (used on PostgreSQL; on SQLite the limits hold per process and
-- these tables stay empty, kept so both stores have one schema): each replica's share of a model's limits (`demand`: its calls
-- waiting and in flight; `granted`: the units it may use, never below its calls in flight, so
-- the grants of live rows never add up past the limit), kept alive by its heartbeat
-- (`expires_ms`, on the database's clock); and the pauses a 429 put on a model, for every
-- replica of the fleet.
CREATE TABLE llm_shares (
    fleet TEXT NOT NULL,
    model_key TEXT NOT NULL,
    replica TEXT NOT NULL,
    demand BIGINT NOT NULL,
    granted BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    PRIMARY KEY (fleet, model_key, replica)
);
CREATE TABLE llm_pauses (
    fleet TEXT NOT NULL,
    model_key TEXT NOT NULL,
    until_ms BIGINT NOT NULL,
    PRIMARY KEY (fleet, model_key)
);
