SELECT min(run_at) FROM {schema}.aqw_jobs WHERE queue = $1 AND consumer IS NULL AND run_at > $2
