SELECT state FROM {batches} WHERE queue = $1 AND id = $2 AND expires_at > clock_timestamp()
FOR UPDATE
