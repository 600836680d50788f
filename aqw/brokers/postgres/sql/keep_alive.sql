UPDATE {schema}.aqw_jobs SET held_at = $3 WHERE id = $1 AND consumer = $2 RETURNING 1
