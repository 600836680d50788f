DELETE FROM {schema}.aqw_outbox WHERE id = ANY($1::bigint[])
