WITH dropped AS (
    DELETE FROM {members}
    WHERE queue = $1 AND batch_id = $2 AND member = ANY($3::text[]) AND NOT counted
    RETURNING 1
)
UPDATE {batches} SET total = total - (SELECT count(*) FROM dropped)
WHERE queue = $1 AND id = $2
