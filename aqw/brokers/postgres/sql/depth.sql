SELECT count(*) FILTER (WHERE consumer IS NULL AND run_at <= $2) AS waiting,
       count(*) FILTER (WHERE consumer IS NOT NULL) AS in_flight,
       count(*) FILTER (WHERE consumer IS NULL AND run_at > $2) AS delayed,
       (SELECT count(*) FROM {schema}.aqw_dead WHERE queue = $1) AS dead,
       (SELECT min(run_at) FROM {schema}.aqw_jobs
        WHERE queue = $1 AND consumer IS NULL AND run_at > $2) AS next_due
FROM {schema}.aqw_jobs WHERE queue = $1
