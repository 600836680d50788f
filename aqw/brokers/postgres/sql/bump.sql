INSERT INTO {schema}.aqw_stats AS s (queue, name, value) VALUES ($1, $2, 1)
ON CONFLICT (queue, name) DO UPDATE SET value = s.value + 1
