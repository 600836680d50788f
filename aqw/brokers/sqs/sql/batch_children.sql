SELECT member FROM {members} WHERE queue = $1 AND batch_id = $2 ORDER BY pos OFFSET $3 LIMIT $4
