-- Many starts under limits in one statement and one commit: $1 queue, $2 job ids, $3 lease
-- keys, $4 tokens, $5 ttls in ms, $6 what a missing record starts with (JSON), $7 the
-- running fields (JSON), $8 the records' expiry, $9 rate buckets ('' none), $10 intervals
-- and $11 tolerances in microseconds, $12 the caps' keys and $13 their most holders (JSON
-- lists, sorted). aqw_start_limited runs for each in the order given (the order of their
-- locks), each seeing what the ones before it took; n: the start's position (from 1).
SELECT r.n, s.status, s.fence, s.wait
FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[],
            $9::text[], $10::bigint[], $11::bigint[], $12::text[], $13::text[])
     WITH ORDINALITY AS r(job, key, token, ms, b, f, bucket, iv, tol, caps, most, n)
CROSS JOIN LATERAL {schema}.aqw_start_limited(
    $1, r.job, r.key, r.token, r.ms, r.b, r.f, $8, r.bucket, r.iv, r.tol,
    ARRAY(SELECT jsonb_array_elements_text(r.caps::jsonb)),
    ARRAY(SELECT jsonb_array_elements_text(r.most::jsonb)::integer)
) AS s
ORDER BY r.n
