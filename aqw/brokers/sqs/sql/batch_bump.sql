-- $3: the count's column (succeeded, failed, cancelled, expired); the batch's state and
-- whether every child is counted, after it.
UPDATE {batches} SET
    succeeded = succeeded + (($3 = 'succeeded')::int),
    failed = failed + (($3 = 'failed')::int),
    cancelled = cancelled + (($3 = 'cancelled')::int),
    expired = expired + (($3 = 'expired')::int)
WHERE queue = $1 AND id = $2
RETURNING state, succeeded + failed + cancelled + expired >= total AS done
