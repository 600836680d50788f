-- The relay's fencing token moves forward only: no row back means a newer leader has been
-- here, and this relay's transaction must not commit. The row stays locked to the end.
UPDATE {schema}.aqw_outbox_relay SET fence = $1 WHERE fence <= $1 RETURNING instance
