-- Job $2's live record on queue $1 ($3 now), locked until the transaction ends.
SELECT fields, until FROM {schema}.aqw_records
WHERE queue = $1 AND job_id = $2 AND until > $3 FOR UPDATE
