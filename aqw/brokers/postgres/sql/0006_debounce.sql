-- aqw PostgreSQL broker, version 6: debounced enqueue (`enqueue(..., key=k, debounce=s)`).
-- A key's state: the row of its waiting job, that job's id (as written in its wire form),
-- the burst's first enqueue and the time the state lives to (a slack past the job's due
-- time: a job still waiting that long after it was due is no longer replaced).
CREATE TABLE {schema}.aqw_debounce (
    queue text NOT NULL,
    key text NOT NULL,
    job_row bigint NOT NULL,
    job_id text NOT NULL,
    wire_id text NOT NULL,
    first double precision NOT NULL,
    until double precision NOT NULL,
    PRIMARY KEY (queue, key)
);
CREATE INDEX aqw_debounce_until ON {schema}.aqw_debounce (until);

-- One debounced enqueue, in one transaction under the key's advisory lock: while the key's
-- job still waits (its row never fetched: no consumer, no delivery yet; its record not
-- final), replace its wire form (same id) and priority and push its start back; else insert
-- the new job. Due at min(now + debounce, first + debounce_max) (0: no bound), first being
-- the burst's first enqueue. The job's record is written as publish.sql writes it (delayed,
-- or queued once the bound has passed) and the fetchers are woken. Times are the client's
-- epoch seconds, as the fetch's are. Returns the waiting job's id and whether it replaced one.
CREATE FUNCTION {schema}.aqw_debounce_publish(
    p_queue text, p_key text, p_now double precision, p_debounce double precision,
    p_most double precision, p_slack double precision, p_keep double precision,
    p_job text, p_wire_id text, p_before bytea, p_after bytea, p_priority smallint,
    p_fields jsonb, p_channel text,
    OUT job_id text, OUT replaced boolean
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row bigint;
    v_id text := p_job;
    v_wire_id text := p_wire_id;
    v_first double precision := p_now;
    v_due double precision;
    v_held {schema}.aqw_debounce%ROWTYPE;
BEGIN
    replaced := false;
    PERFORM pg_advisory_xact_lock(hashtext('aqw-debounce:' || p_queue || ':' || p_key));
    SELECT * INTO v_held FROM {schema}.aqw_debounce AS d
    WHERE d.queue = p_queue AND d.key = p_key AND d.until > p_now;
    IF FOUND THEN
        -- Locked, then checked again (a fetch that took it meanwhile moved its consumer).
        SELECT j.id INTO v_row FROM {schema}.aqw_jobs AS j
        WHERE j.id = v_held.job_row AND j.queue = p_queue AND j.consumer IS NULL
          AND j.deliveries = 0
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.aqw_records AS r
              WHERE r.queue = p_queue AND r.job_id = v_held.job_id
                AND (r.fields->>'state' IN ('succeeded', 'failed', 'dead', 'cancelled',
                                            'expired') OR r.fields->>'cancel' = '1'))
        FOR UPDATE OF j;
        IF FOUND THEN
            v_id := v_held.job_id;
            v_wire_id := v_held.wire_id;
            v_first := v_held.first;
            replaced := true;
        END IF;
    END IF;
    v_due := p_now + p_debounce;
    IF p_most > 0 AND v_first + p_most < v_due THEN
        v_due := v_first + p_most;
    END IF;
    IF replaced THEN
        UPDATE {schema}.aqw_jobs
        SET job = p_before || convert_to(v_wire_id, 'UTF8') || p_after,
            priority = p_priority, run_at = v_due
        WHERE id = v_row;
    ELSE
        INSERT INTO {schema}.aqw_jobs (queue, job, priority, run_at)
        VALUES (p_queue, p_before || convert_to(v_wire_id, 'UTF8') || p_after, p_priority, v_due)
        RETURNING id INTO v_row;
    END IF;
    INSERT INTO {schema}.aqw_debounce AS d (queue, key, job_row, job_id, wire_id, first, until)
    VALUES (p_queue, p_key, v_row, v_id, v_wire_id, v_first, v_due + p_slack)
    ON CONFLICT (queue, key) DO UPDATE
    SET job_row = EXCLUDED.job_row, job_id = EXCLUDED.job_id, wire_id = EXCLUDED.wire_id,
        first = EXCLUDED.first, until = EXCLUDED.until;
    INSERT INTO {schema}.aqw_records AS r (queue, job_id, fields, until)
    VALUES (p_queue, v_id,
            p_fields || CASE WHEN v_due > p_now
                THEN jsonb_build_object('state', 'delayed', 'run_at', v_due::text)
                ELSE jsonb_build_object('state', 'queued', 'run_at', '') END,
            v_due + p_keep)
    ON CONFLICT (queue, job_id) DO UPDATE SET fields = EXCLUDED.fields, until = EXCLUDED.until;
    PERFORM pg_notify(p_channel, '');
    job_id := v_id;
END;
$$;
