SELECT state, succeeded + failed + cancelled + expired >= total AS done
FROM {batches} WHERE queue = $1 AND id = $2 FOR UPDATE
