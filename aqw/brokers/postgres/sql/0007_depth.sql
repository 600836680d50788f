-- aqw PostgreSQL broker, version 7: the depth history the dashboard and the monitor read,
-- one sample per DEPTH_BUCKET seconds (bucket: its start, epoch seconds), written with the
-- workers' heartbeats (the first sample of a bucket wins), kept DEPTH_KEEP seconds.
CREATE TABLE {schema}.aqw_depth (
    queue text NOT NULL,
    bucket bigint NOT NULL,
    waiting bigint NOT NULL,
    in_flight bigint NOT NULL,
    delayed bigint NOT NULL,
    dead bigint NOT NULL,
    PRIMARY KEY (queue, bucket)
);
