-- End the sessions of aqw's pools ($1: their application_name, this role's only) stopped for
-- over $2 seconds halfway through a statement's messages: the server counts such a session
-- active while it waits for the rest (its process frozen between a statement's parse and its
-- execution), so idle_in_transaction_session_timeout never ends it, and the row locks of its
-- transaction (a held job's row and lease, mid-settle) would keep that job from every other
-- worker for as long as the process stays frozen. A query that runs, waits on a lock or sends
-- its rows is not waiting to read from its client, and is left alone.
SELECT pid, pg_terminate_backend(pid) AS ended FROM pg_stat_activity
WHERE application_name = $1 AND usename = current_user AND pid <> pg_backend_pid()
  AND state = 'active' AND wait_event_type = 'Client' AND wait_event = 'ClientRead'
  AND xact_start IS NOT NULL
  AND state_change < clock_timestamp() - make_interval(secs => $2)
