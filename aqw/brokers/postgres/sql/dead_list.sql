SELECT * FROM {schema}.aqw_dead WHERE queue = $1 AND id > $2 ORDER BY id LIMIT $3
