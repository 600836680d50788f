-- Records past their time, deleted in batches: $1 now, $2 most rows.
DELETE FROM {schema}.aqw_records WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.aqw_records WHERE until <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED
))
