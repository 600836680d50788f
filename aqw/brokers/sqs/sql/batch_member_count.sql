UPDATE {members} SET counted = true
WHERE queue = $1 AND batch_id = $2 AND member = $3 AND NOT counted
RETURNING 1
