-- The held row $1 (its holder and body), locked until the settle's transaction ends.
SELECT consumer, job, deliveries FROM {schema}.aqw_jobs
WHERE id = $1 AND consumer IS NOT NULL FOR UPDATE
