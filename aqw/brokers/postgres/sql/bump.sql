-- $1 queue, $2 counter, $3 shard.
INSERT INTO {schema}.aqw_stats AS s (queue, name, shard, value) VALUES ($1, $2, $3, 1)
ON CONFLICT (queue, name, shard) DO UPDATE SET value = s.value + 1
