UPDATE {batches} SET state = 'sealed'
WHERE queue = $1 AND id = $2 AND state = 'open' AND expires_at > clock_timestamp()
