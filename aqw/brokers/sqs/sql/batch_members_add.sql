WITH added AS (
    INSERT INTO {members} (queue, batch_id, member)
    SELECT $1, $2, m FROM unnest($3::text[]) WITH ORDINALITY AS u(m, n) ORDER BY n
    ON CONFLICT (queue, batch_id, member) DO NOTHING
    RETURNING 1
)
UPDATE {batches} SET total = total + (SELECT count(*) FROM added)
WHERE queue = $1 AND id = $2
RETURNING total
