SELECT count(*) AS pending,
       coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8 AS oldest_age
FROM {schema}.aqw_outbox
