-- aqw PostgreSQL broker, version 4: rate limits and per-key caps, enforced in the start step
-- of a job that has them (aqw_start_limited), shared by every worker of the queue.
-- A rate bucket is GCRA: tat is the theoretical arrival time (server microseconds); a start
-- at now >= tat - tolerance is admitted and sets tat = max(tat, now) + interval. A refused
-- start is told to come back at its turn: promised is the turn last promised, each refusal
-- promises the next one (max(tat - tolerance, promised), then promised moves on by
-- interval), so starts refused together come back spread out, not all at once.
CREATE TABLE {schema}.aqw_rates (
    queue text NOT NULL,
    bucket text NOT NULL,
    tat bigint NOT NULL DEFAULT 0,
    promised bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, bucket)
);
-- The holders of a per-key cap: a holder counts while its lease row still has its token and
-- has not expired, so a settle's release (or a crashed holder's expiry) frees its slot with
-- no write here; the dead holders' rows are dropped by the next start counting the cap.
CREATE TABLE {schema}.aqw_slots (
    queue text NOT NULL,
    cap text NOT NULL,
    lease_key text NOT NULL,
    token text NOT NULL,
    PRIMARY KEY (queue, cap, lease_key)
);

-- The start of one job under limits, in one transaction: $1 queue, the job id, its lease
-- key, token, ttl in ms, what a missing record starts with (JSON), the running record's
-- fields but the fencing token (JSON), the record's expiry, then the rate bucket ('' for
-- none), its interval and tolerance in microseconds, the caps' keys (sorted: locks are taken
-- in one order) and their most holders. The locks, advisory locks of the transaction, are
-- taken in one order: the bucket's ('aqw-rate:<queue>:<bucket>'), then the caps' in their
-- order ('aqw-cap:<queue>:<key>'); a batch of starts takes all of its locks in that order
-- first (every bucket sorted, then every cap sorted), so two batches never wait on each
-- other. In order, each refusal taking nothing (a refused
-- rate only moves its bucket's promised turn): the job's live record is locked; a cancelled
-- job is 'cancelled', an ended one 'ended'; a lease another token holds is 'held'; the rate
-- bucket's row is locked, a start before its turn is 'rate_limit' (wait: microseconds to its
-- turn); each cap is locked (an advisory lock of the transaction) and counted over its live
-- holders but this lease, a full one is 'concurrency' (wait: the holders' shortest remaining
-- lease in ms, 0 when unknown). Else 'go': the lease is taken, the fencing token drawn, the
-- bucket moved on, a slot of each cap taken and the record marked running with the token.
CREATE FUNCTION {schema}.aqw_start_limited(
    p_queue text, p_job text, p_key text, p_token text, p_ms bigint, p_new text,
    p_fields text, p_until double precision, p_bucket text, p_interval bigint,
    p_tolerance bigint, p_caps text[], p_most integer[],
    OUT status text, OUT fence bigint, OUT wait bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_now double precision := extract(epoch FROM clock_timestamp());
    v_now_us bigint := (v_now * 1000000)::bigint;
    v_state text;
    v_cancel text;
    v_holder text;
    v_tat bigint := 0;
    v_promised bigint := 0;
    v_turn bigint;
    v_live integer;
    v_soonest bigint;
    i integer;
BEGIN
    wait := 0;
    SELECT r.fields->>'state', r.fields->>'cancel' INTO v_state, v_cancel
    FROM {schema}.aqw_records AS r
    WHERE r.queue = p_queue AND r.job_id = p_job AND r.until > v_now
    FOR UPDATE;
    IF v_state = 'cancelled' OR v_cancel = '1' THEN
        status := 'cancelled';
        RETURN;
    END IF;
    IF v_state IN ('succeeded', 'failed', 'dead', 'expired') THEN
        status := 'ended';
        RETURN;
    END IF;
    SELECT l.token INTO v_holder FROM {schema}.aqw_leases AS l
    WHERE l.key = p_key AND l.expires_at > v_now FOR UPDATE;
    IF v_holder IS NOT NULL AND v_holder <> p_token THEN
        status := 'held';
        RETURN;
    END IF;
    IF p_bucket <> '' THEN
        PERFORM pg_advisory_xact_lock(hashtext('aqw-rate:' || p_queue || ':' || p_bucket));
        INSERT INTO {schema}.aqw_rates (queue, bucket) VALUES (p_queue, p_bucket)
        ON CONFLICT DO NOTHING;
        SELECT b.tat, b.promised INTO v_tat, v_promised FROM {schema}.aqw_rates AS b
        WHERE b.queue = p_queue AND b.bucket = p_bucket FOR UPDATE;
        -- The time once the row is ours: a start that waited for the lock behind others
        -- must not compare their turns with the time it came in.
        v_now := extract(epoch FROM clock_timestamp());
        v_now_us := (v_now * 1000000)::bigint;
        IF v_tat - p_tolerance > v_now_us AND v_holder IS NULL THEN
            v_turn := greatest(v_tat - p_tolerance, v_promised);
            UPDATE {schema}.aqw_rates SET promised = v_turn + p_interval
            WHERE queue = p_queue AND bucket = p_bucket;
            status := 'rate_limit';
            wait := v_turn - v_now_us;
            RETURN;
        END IF;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_caps, 1), 0) LOOP
        PERFORM pg_advisory_xact_lock(hashtext('aqw-cap:' || p_queue || ':' || p_caps[i]));
        v_now := extract(epoch FROM clock_timestamp());  -- the holders' leases as of now
        DELETE FROM {schema}.aqw_slots AS s
        WHERE s.queue = p_queue AND s.cap = p_caps[i] AND s.lease_key <> p_key
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.aqw_leases AS l
              WHERE l.key = s.lease_key AND l.token = s.token AND l.expires_at > v_now);
        SELECT count(*), min(((l.expires_at - v_now) * 1000)::bigint) INTO v_live, v_soonest
        FROM {schema}.aqw_slots AS s JOIN {schema}.aqw_leases AS l
            ON l.key = s.lease_key AND l.token = s.token
        WHERE s.queue = p_queue AND s.cap = p_caps[i] AND s.lease_key <> p_key;
        IF v_live >= p_most[i] THEN
            status := 'concurrency';
            wait := coalesce(v_soonest, 0);
            RETURN;
        END IF;
    END LOOP;
    INSERT INTO {schema}.aqw_leases AS l (key, token, expires_at)
    VALUES (p_key, p_token, v_now + p_ms / 1000.0)
    ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
    WHERE l.expires_at <= v_now OR l.token = EXCLUDED.token;
    IF NOT FOUND THEN  -- another start of this job took it meanwhile: nothing written yet
        status := 'held';
        RETURN;
    END IF;
    fence := nextval('{schema}.aqw_fence');
    IF p_bucket <> '' AND v_holder IS NULL THEN
        UPDATE {schema}.aqw_rates SET tat = greatest(v_tat, v_now_us) + p_interval
        WHERE queue = p_queue AND bucket = p_bucket;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_caps, 1), 0) LOOP
        INSERT INTO {schema}.aqw_slots AS s (queue, cap, lease_key, token)
        VALUES (p_queue, p_caps[i], p_key, p_token)
        ON CONFLICT (queue, cap, lease_key) DO UPDATE SET token = EXCLUDED.token;
    END LOOP;
    INSERT INTO {schema}.aqw_records AS r (queue, job_id, fields, until)
    VALUES (p_queue, p_job,
            p_new::jsonb || p_fields::jsonb || jsonb_build_object('fencing_token', fence::text),
            p_until)
    ON CONFLICT (queue, job_id) DO UPDATE
    SET fields = r.fields || (EXCLUDED.fields - ARRAY['task', 'enqueued_at']),
        until = EXCLUDED.until;
    status := 'go';
END;
$$;
-- Idle rate buckets (both times passed) are dropped by the records' sweep.
CREATE INDEX aqw_rates_idle ON {schema}.aqw_rates (greatest(tat, promised));
