-- aqw outbox, version 1: the rows enqueue(..., conn=) writes in the caller's transaction,
-- and the relay's singleton row (this outbox's id, the highest fencing token seen).
CREATE TABLE {schema}.aqw_outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    job bytea NOT NULL,              -- the job's wire form (its JSON envelope)
    run_at double precision,         -- epoch seconds; NULL: at once
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE {schema}.aqw_outbox_relay (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Part of every relayed job's idempotency key: a re-created outbox, whose row ids
    -- start again at 1, never collides with the keys of the one before.
    instance text NOT NULL DEFAULT md5(random()::text || clock_timestamp()::text),
    fence bigint NOT NULL DEFAULT 0  -- the relay leader's fencing token, only forward
);
INSERT INTO {schema}.aqw_outbox_relay DEFAULT VALUES;

-- One notification per inserting statement, delivered at commit (none on rollback).
CREATE FUNCTION {schema}.aqw_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('aqw_outbox:' || TG_TABLE_SCHEMA, '');
    RETURN NULL;
END $$;

CREATE TRIGGER aqw_outbox_notify AFTER INSERT ON {schema}.aqw_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.aqw_outbox_notify();
