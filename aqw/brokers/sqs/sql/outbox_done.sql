DELETE FROM {outbox} WHERE seq = ANY($1::bigint[])
