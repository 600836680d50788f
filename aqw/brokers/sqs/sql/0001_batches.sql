-- Batches of SQS queues counted in a records=postgresql:// store (aqw.brokers.sqs._batches_pg):
-- a batch's row, its members (a child counts once: its row's counted flips once), its
-- callbacks' jobs, and the outbox of jobs decided by a count and not yet sent to SQS.
-- {batches}, {members}, {callbacks}, {outbox} are the table names (beside the keys' table).
CREATE TABLE IF NOT EXISTS {batches} (
    queue text NOT NULL,
    id text NOT NULL,
    state text NOT NULL,                      -- open, sealed, complete
    total integer NOT NULL DEFAULT 0,
    succeeded integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    cancelled integer NOT NULL DEFAULT 0,
    expired integer NOT NULL DEFAULT 0,
    fail_fast boolean NOT NULL,
    keep_s double precision NOT NULL,         -- the batch lives this long once complete
    key_ttl_s double precision NOT NULL,      -- its callbacks' idempotency keys live this long
    parent text,
    data text NOT NULL DEFAULT '',
    created_at double precision NOT NULL,
    completed_at double precision,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue, id)
);
CREATE TABLE IF NOT EXISTS {members} (
    queue text NOT NULL,
    batch_id text NOT NULL,
    member text NOT NULL,                     -- a job id, or batch:<id> for a child batch
    pos bigserial NOT NULL,                   -- the order added
    counted boolean NOT NULL DEFAULT false,
    PRIMARY KEY (queue, batch_id, member)
);
CREATE INDEX IF NOT EXISTS {members_pos} ON {members} (queue, batch_id, pos);
CREATE TABLE IF NOT EXISTS {callbacks} (
    queue text NOT NULL,
    batch_id text NOT NULL,
    kind text NOT NULL,                       -- complete, success, failure
    job text NOT NULL,                        -- the job's wire JSON, with the info slot
    job_id text NOT NULL,
    fired boolean NOT NULL DEFAULT false,
    PRIMARY KEY (queue, batch_id, kind)
);
CREATE TABLE IF NOT EXISTS {outbox} (
    seq bigserial PRIMARY KEY,
    queue text NOT NULL,
    job text NOT NULL
);
CREATE INDEX IF NOT EXISTS {outbox_queue} ON {outbox} (queue, seq);
