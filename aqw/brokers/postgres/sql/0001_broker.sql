-- aqw PostgreSQL broker, version 1. Every queue's rows share these tables (column queue).
CREATE TABLE {schema}.aqw_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    job bytea NOT NULL,                    -- the job's wire form
    priority smallint NOT NULL DEFAULT 0,  -- 0-9, higher first
    run_at double precision NOT NULL,      -- epoch seconds: due from then on
    consumer text,                         -- NULL: waiting or delayed; else its holder
    held_at double precision,              -- the holder's last fetch or keep-alive
    deliveries integer NOT NULL DEFAULT 0
);
-- The fetch: waiting rows of a queue, highest priority first, then oldest.
CREATE INDEX aqw_jobs_waiting ON {schema}.aqw_jobs (queue, priority DESC, run_at, id)
    WHERE consumer IS NULL;
-- The reclaim: held rows of a queue by idleness.
CREATE INDEX aqw_jobs_held ON {schema}.aqw_jobs (queue, held_at) WHERE consumer IS NOT NULL;

-- Leases (job leases, resource locks, the scheduler's and the relay's): the holder's token
-- and the expiry on the server's clock. Fencing tokens come from the sequence aqw_fence.
CREATE TABLE {schema}.aqw_leases (
    key text PRIMARY KEY,
    token text NOT NULL,
    expires_at double precision NOT NULL
);
CREATE SEQUENCE {schema}.aqw_fence;

CREATE TABLE {schema}.aqw_dead (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    data bytea NOT NULL,
    task text NOT NULL,
    job_id text NOT NULL,
    error_type text NOT NULL,
    error text NOT NULL,
    traceback text NOT NULL,
    attempts integer NOT NULL,
    first_failed_at double precision NOT NULL,
    last_failed_at double precision NOT NULL,
    worker text NOT NULL
);
CREATE INDEX aqw_dead_queue ON {schema}.aqw_dead (queue, id);

-- Idempotency keys (kind 'key': enqueued; kind 'done': finished) until expires_at.
CREATE TABLE {schema}.aqw_keys (
    queue text NOT NULL,
    kind text NOT NULL,
    key text NOT NULL,
    job_id text NOT NULL,
    expires_at double precision NOT NULL,
    PRIMARY KEY (queue, kind, key)
);

-- Lifetime counters, spread over shards so that concurrent settles do not queue on one row.
CREATE TABLE {schema}.aqw_stats (
    queue text NOT NULL,
    name text NOT NULL,
    shard smallint NOT NULL DEFAULT 0,
    value bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, name, shard)
);
