-- aqw PostgreSQL broker, version 5: rate limits and per-key caps changed at run time
-- (`aqw limits set|reset`, `app.limits`): the map of aqw.brokers.parts.RunLimits, a row per
-- name (`rate:<task>`, `rate:<task>:<key>`, `cap:<task>`), read by every worker.
CREATE TABLE {schema}.aqw_limits (
    queue text NOT NULL,
    name text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (queue, name)
);
