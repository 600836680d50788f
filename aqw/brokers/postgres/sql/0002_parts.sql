-- aqw PostgreSQL broker, version 2: the parts shared across processes.
-- The periodic tasks' last ticks (only forward) and the workers' heartbeats (expiring).
CREATE TABLE {schema}.aqw_marks (
    queue text NOT NULL,
    task text NOT NULL,
    tick double precision NOT NULL,
    job_id text NOT NULL DEFAULT '',
    PRIMARY KEY (queue, task)
);
CREATE TABLE {schema}.aqw_heartbeats (
    queue text NOT NULL,
    worker text NOT NULL,
    data text NOT NULL,                    -- the summary as JSON
    expires_at double precision NOT NULL,  -- on the server's clock
    PRIMARY KEY (queue, worker)
);
