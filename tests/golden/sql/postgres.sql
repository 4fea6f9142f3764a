-- Every statement the SDK sends to postgres in the scenario of tests/it/golden_sql.rs,
-- normalised; transaction control as the driver logs it (SQLite's is not logged).
-- Regenerate: OUTBOX_BLESS=1 cargo test --all-features --test it -- golden_sql

-- enqueue + commit: one event
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS jsonb), CAST(? AS jsonb), statement_timestamp())
COMMIT

-- enqueue + commit: an event with a dedup key
SELECT (CAST(floor(extract(epoch FROM statement_timestamp())) AS BIGINT) / r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
INSERT INTO outbox_key (slot, bucket, event_type, dedup_key, event_id) VALUES (…), … ON CONFLICT (slot, event_type, dedup_key) DO UPDATE SET bucket = excluded.bucket, event_id = excluded.event_id WHERE outbox_key.bucket < excluded.bucket - 1 RETURNING event_id, bucket
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS jsonb), CAST(? AS jsonb), statement_timestamp()) ON CONFLICT (event_type, dedup_key) DO NOTHING RETURNING id, event_id, status, created_at
COMMIT

-- enqueue + commit: an event with an aggregate version
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS jsonb), CAST(? AS jsonb), statement_timestamp())
COMMIT

-- enqueue + commit: three events in one transaction
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS jsonb), CAST(? AS jsonb), statement_timestamp()), …
COMMIT

-- relay: claim, publish, settle SENT
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= statement_timestamp() ORDER BY due_at, id LIMIT 10 FOR UPDATE SKIP LOCKED
COMMIT
SELECT COALESCE((SELECT MIN(x.id) FROM outbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY') AND x.id >= ?), (SELECT MAX(m.id) + 1 FROM outbox_event m), 0) AS low, pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS snap_xmin, pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS snap_xmax, (SELECT generation FROM outbox_rescan WHERE id = 1) AS generation
SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off
WITH w AS (SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, statement_timestamp() AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status <> 'SENT') THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM outbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM outbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY')) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= statement_timestamp()) OR (o.status = 'PROCESSING' AND o.locked_until < statement_timestamp())) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status <> 'SENT') ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, payload, headers, status, attempts, locked_until, created_at FROM outbox_event WHERE status <> 'SENT' AND id > 1 AND ((aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?)) ORDER BY id LIMIT 10 FOR UPDATE
UPDATE outbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = (statement_timestamp() + ? * INTERVAL '1 microsecond'), claim_token = ? WHERE id IN (…)
SET LOCAL synchronous_commit = off; WITH moved AS (DELETE FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = '<uuid>') IS TRUE AND id IN (…) RETURNING id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at) INSERT INTO outbox_sent (slot, id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, sent_at) SELECT (SELECT (CAST(floor(extract(epoch FROM statement_timestamp())) AS BIGINT) / r.slot_seconds) % r.slots FROM outbox_rotation r WHERE r.table_name = 'outbox_sent'), id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, statement_timestamp() FROM moved

-- relay: a failed publish goes RETRY with its class, a permanent rejection DEAD
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= statement_timestamp() ORDER BY due_at, id LIMIT 10 FOR UPDATE SKIP LOCKED
COMMIT
SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off
WITH w AS (SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, statement_timestamp() AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status <> 'SENT') THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM outbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM outbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY')) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= statement_timestamp()) OR (o.status = 'PROCESSING' AND o.locked_until < statement_timestamp())) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status <> 'SENT') ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED
UPDATE outbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = (statement_timestamp() + ? * INTERVAL '1 microsecond'), claim_token = ? WHERE id IN (…)
UPDATE outbox_event SET status = 'RETRY', attempts = ?, next_attempt_at = (statement_timestamp() + ? * INTERVAL '1 microsecond'), failure_class = 'REJECTED', last_error = ?, locked_until = NULL WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id = ?
UPDATE outbox_event SET status = 'DEAD', attempts = ?, next_attempt_at = ?, failure_class = 'PERMANENT', last_error = ?, locked_until = NULL WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id = ?
INSERT INTO outbox_failure (queue, row_id, attempt, status, error, failed_at) SELECT 'outbox', id, attempts, status, last_error, statement_timestamp() FROM outbox_event WHERE last_error IS NOT NULL AND status IN ('RETRY', 'DEAD') AND id IN (…)

-- relay: nothing due
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= statement_timestamp() ORDER BY due_at, id LIMIT 10 FOR UPDATE SKIP LOCKED
COMMIT
SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off
WITH w AS (SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, statement_timestamp() AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status <> 'SENT') THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM outbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM outbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY')) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= statement_timestamp()) OR (o.status = 'PROCESSING' AND o.locked_until < statement_timestamp())) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status <> 'SENT') ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED
SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023

-- delayed: enqueue_after + commit
INSERT INTO outbox_scheduled (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, due_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS jsonb), CAST(? AS jsonb), (statement_timestamp() + ? * INTERVAL '1 microsecond'), statement_timestamp())
COMMIT

-- delayed: the relay promotes the due event and publishes it
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= statement_timestamp() ORDER BY due_at, id LIMIT 10 FOR UPDATE SKIP LOCKED
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS jsonb), CAST(? AS jsonb), statement_timestamp())
DELETE FROM outbox_scheduled WHERE id IN (…)
COMMIT
SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off
WITH w AS (SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, statement_timestamp() AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status <> 'SENT') THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM outbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM outbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY')) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= statement_timestamp()) OR (o.status = 'PROCESSING' AND o.locked_until < statement_timestamp())) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status <> 'SENT') ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED
UPDATE outbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = (statement_timestamp() + ? * INTERVAL '1 microsecond'), claim_token = ? WHERE id IN (…)
SET LOCAL synchronous_commit = off; WITH moved AS (DELETE FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = '<uuid>') IS TRUE AND id IN (…) RETURNING id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at) INSERT INTO outbox_sent (slot, id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, sent_at) SELECT (SELECT (CAST(floor(extract(epoch FROM statement_timestamp())) AS BIGINT) / r.slot_seconds) % r.slots FROM outbox_rotation r WHERE r.table_name = 'outbox_sent'), id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, statement_timestamp() FROM moved

-- inbox: receive external messages
INSERT INTO inbox_event (consumer, message_id, origin, biz_key, headers, event_type, source, aggregate_type, aggregate_id, aggregate_version, schema_version, payload, status, attempts, next_attempt_at, last_error, received_at, processed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, statement_timestamp(), ?) ON CONFLICT DO NOTHING
SELECT status, payload FROM inbox_event WHERE consumer = ? AND origin = ? AND message_id = ?

-- inbox worker: claim
SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off
WITH w AS (SELECT id FROM inbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' AND consumer = ? ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.consumer, o.message_id, o.origin, o.event_type, o.source, o.biz_key, o.headers, o.aggregate_type, o.aggregate_id, o.payload, o.status, o.attempts, o.locked_until, statement_timestamp() AS db_now, CASE WHEN EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM inbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.consumer = ? AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM inbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY') AND x.consumer = ?) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= statement_timestamp()) OR (o.status = 'PROCESSING' AND o.locked_until < statement_timestamp())) AND NOT EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED
UPDATE inbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = (statement_timestamp() + ? * INTERVAL '1 microsecond'), claim_token = ? WHERE id IN (…)
COMMIT

-- inbox worker: a handler commits, DONE
UPDATE inbox_event SET status = 'DONE', processed_at = statement_timestamp(), attempts = attempts + 1, locked_until = NULL, last_error = NULL WHERE id = ? AND status = 'PROCESSING' AND claim_token = ?
COMMIT

-- inbox worker: a handler fails, RETRY
SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off
UPDATE inbox_event SET status = 'RETRY', attempts = ?, next_attempt_at = (statement_timestamp() + ? * INTERVAL '1 microsecond'), last_error = ?, locked_until = NULL WHERE id = ? AND status = 'PROCESSING' AND claim_token = ?
INSERT INTO outbox_failure (queue, row_id, attempt, status, error, failed_at) SELECT 'inbox', id, attempts, status, last_error, statement_timestamp() FROM inbox_event WHERE last_error IS NOT NULL AND status IN ('RETRY', 'DEAD') AND id IN (…)
COMMIT

-- inbox worker: a handler fails permanently, DEAD
SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off
UPDATE inbox_event SET status = 'DEAD', attempts = ?, next_attempt_at = ?, last_error = ?, locked_until = NULL WHERE id = ? AND status = 'PROCESSING' AND claim_token = ?
INSERT INTO outbox_failure (queue, row_id, attempt, status, error, failed_at) SELECT 'inbox', id, attempts, status, last_error, statement_timestamp() FROM inbox_event WHERE last_error IS NOT NULL AND status IN ('RETRY', 'DEAD') AND id IN (…)
COMMIT

-- admin: status
SELECT statement_timestamp() AS now
SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM outbox_event GROUP BY status
SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM outbox_sent
SELECT COUNT(*) AS n, MIN(due_at) AS next_due FROM outbox_scheduled
SELECT COUNT(*) AS n, MIN(locked_until) AS since FROM outbox_event WHERE status = 'PROCESSING' AND locked_until < statement_timestamp()
SELECT consumer, status, COUNT(*) AS n, MIN(received_at) AS oldest FROM inbox_event GROUP BY consumer, status ORDER BY consumer
SELECT consumer, COUNT(*) AS n, MIN(locked_until) AS since FROM inbox_event WHERE status = 'PROCESSING' AND locked_until < statement_timestamp() GROUP BY consumer
SELECT relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, expires_at FROM outbox_relay ORDER BY relay_id
SELECT slot_name, active, wal_status::text AS wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained_bytes, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS lag_bytes, confirmed_flush_lsn::text AS confirmed_lsn FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database() AND slot_name LIKE ? ORDER BY slot_name
SELECT c.relname::text AS table_name, SUM(s.n_live_tup)::bigint AS live_rows, SUM(s.n_dead_tup)::bigint AS dead_rows, SUM(pg_table_size(l.oid))::bigint AS table_bytes, SUM(pg_indexes_size(l.oid))::bigint AS index_bytes, NULL::bigint AS free_bytes, EXTRACT(EPOCH FROM now() - MAX(GREATEST(s.last_vacuum, s.last_autovacuum)))::float8 AS vacuumed_s, EXTRACT(EPOCH FROM now() - MAX(GREATEST(s.last_analyze, s.last_autoanalyze)))::float8 AS analyzed_s, bool_and(NOT EXISTS (SELECT 1 FROM unnest(l.reloptions) AS o(option) WHERE lower(o.option) IN ('autovacuum_enabled=false', 'autovacuum_enabled=off', 'autovacuum_enabled=0', 'autovacuum_enabled=no', 'autovacuum_enabled=f', 'autovacuum_enabled=n'))) AS autovacuum_enabled FROM pg_class c LEFT JOIN LATERAL pg_partition_tree(c.oid) t ON true JOIN pg_class l ON l.oid = COALESCE(t.relid, c.oid) JOIN pg_stat_user_tables s ON s.relid = l.oid WHERE COALESCE(t.isleaf, true) AND NOT c.relispartition AND c.relnamespace = to_regnamespace(current_schema()) AND c.relname IN (…) GROUP BY c.relname
SELECT current_setting('autovacuum') = 'on' AS autovacuum
SELECT kind, pid, name, state, age_s, xid_age FROM ( SELECT 'session' AS kind, pid::bigint AS pid, COALESCE(application_name, '') AS name, state::text AS state, EXTRACT(EPOCH FROM now() - COALESCE(xact_start, query_start, backend_start))::float8 AS age_s, age(backend_xmin)::bigint AS xid_age FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() AND (datname IS NULL OR datname = current_database()) UNION ALL SELECT 'prepared', NULL::bigint, gid, NULL::text, EXTRACT(EPOCH FROM now() - prepared)::float8, age(transaction)::bigint FROM pg_prepared_xacts WHERE database = current_database() UNION ALL SELECT 'slot', NULL::bigint, slot_name::text, CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL::float8, GREATEST(age(xmin), age(catalog_xmin))::bigint FROM pg_replication_slots WHERE (xmin IS NOT NULL OR catalog_xmin IS NOT NULL) AND (database IS NULL OR database = current_database()) ) AS holders ORDER BY xid_age DESC NULLS LAST LIMIT 5

-- admin: list dead letters
SELECT id, event_id, event_type, aggregate_type, aggregate_id, attempts, last_error, created_at AS arrived_at FROM outbox_event WHERE status = 'DEAD' ORDER BY arrived_at DESC, id DESC LIMIT 50
SELECT id, consumer, message_id, event_type, aggregate_type, aggregate_id, attempts, last_error, received_at AS arrived_at FROM inbox_event WHERE status = 'DEAD' ORDER BY arrived_at DESC, id DESC LIMIT 50

-- admin: show a dead letter
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, status, attempts, next_attempt_at, locked_by, locked_until, created_at, sent_at, last_error FROM outbox_event WHERE id = ?
SELECT id, attempt, status, error, failed_at FROM outbox_failure WHERE queue = 'outbox' AND row_id = ? ORDER BY id DESC LIMIT 100

-- admin: replay a dead event
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
SELECT id, status FROM outbox_event WHERE id IN (…) FOR UPDATE
UPDATE outbox_event SET status = 'PENDING', attempts = 0, next_attempt_at = NULL, locked_by = NULL, locked_until = NULL, claim_token = NULL WHERE status = 'DEAD' AND id IN (…)
UPDATE outbox_rescan SET generation = generation + 1 WHERE id = 1
INSERT INTO outbox_admin_action (action, target, rows_affected, actor, reason, at) VALUES (?, ?, ?, ?, ?, statement_timestamp()) RETURNING id
COMMIT

-- admin: ignore a dead message
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
SELECT id, status FROM inbox_event WHERE id IN (…) FOR UPDATE
UPDATE inbox_event SET status = 'IGNORED', processed_at = statement_timestamp(), locked_until = NULL, claim_token = NULL WHERE status = 'DEAD' AND id IN (…)
INSERT INTO outbox_admin_action (action, target, rows_affected, actor, reason, at) VALUES (?, ?, ?, ?, ?, statement_timestamp()) RETURNING id
COMMIT

-- admin: resend a sent event
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
SELECT id, event_id, status FROM outbox_event WHERE event_id IN (…) FOR UPDATE
SELECT id, event_id FROM outbox_sent WHERE event_id IN (…)
UPDATE outbox_event SET status = 'PENDING', sent_at = NULL, attempts = 0, next_attempt_at = NULL, locked_by = NULL, locked_until = NULL, claim_token = NULL, failure_class = NULL, last_error = NULL WHERE status = 'SENT' AND id IN (…)
INSERT INTO outbox_event (id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, status, attempts, created_at) SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, 'PENDING', 0, created_at FROM outbox_sent WHERE 1 = 1 AND id IN (…) ON CONFLICT (event_type, dedup_key) DO NOTHING
DELETE FROM outbox_sent WHERE 1 = 1 AND id IN (…) AND id IN (SELECT e.id FROM outbox_event e WHERE e.status = 'PENDING')
UPDATE outbox_rescan SET generation = generation + 1 WHERE id = 1
INSERT INTO outbox_admin_action (action, target, rows_affected, actor, reason, at) VALUES (?, ?, ?, ?, ?, statement_timestamp()) RETURNING id
COMMIT

-- admin: audit log
SELECT id, action, target, rows_affected, actor, reason, at FROM outbox_admin_action ORDER BY id DESC LIMIT 10

-- retention: purge
SELECT statement_timestamp() AS now
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
DELETE FROM outbox_event WHERE id IN (SELECT id FROM outbox_event WHERE status = 'SENT' AND sent_at < ? LIMIT 5000 FOR UPDATE SKIP LOCKED)
COMMIT
DELETE FROM inbox_event WHERE id IN (SELECT id FROM inbox_event WHERE status IN ('DONE', 'IGNORED') AND processed_at < ? LIMIT 5000 FOR UPDATE SKIP LOCKED)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'outbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM outbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'inbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM inbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
SELECT (CAST(floor(extract(epoch FROM statement_timestamp())) AS BIGINT) / r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
SELECT 0 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s0) UNION ALL SELECT 1 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s1) UNION ALL SELECT 2 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s2) UNION ALL SELECT 3 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s3) UNION ALL SELECT 4 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s4) UNION ALL SELECT 5 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s5) UNION ALL SELECT 6 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s6) UNION ALL SELECT 7 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s7) UNION ALL SELECT 8 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s8) UNION ALL SELECT 9 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s9) UNION ALL SELECT 10 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s10) UNION ALL SELECT 11 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s11) UNION ALL SELECT 12 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s12) UNION ALL SELECT 13 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s13) UNION ALL SELECT 14 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s14) UNION ALL SELECT 15 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s15) UNION ALL SELECT 16 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s16) UNION ALL SELECT 17 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s17) UNION ALL SELECT 18 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s18) UNION ALL SELECT 19 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s19) UNION ALL SELECT 20 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s20) UNION ALL SELECT 21 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s21) UNION ALL SELECT 22 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s22) UNION ALL SELECT 23 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s23) UNION ALL SELECT 24 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s24) UNION ALL SELECT 25 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s25) UNION ALL SELECT 26 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s26) UNION ALL SELECT 27 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s27) UNION ALL SELECT 28 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s28) UNION ALL SELECT 29 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s29) UNION ALL SELECT 30 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s30) UNION ALL SELECT 31 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s31) UNION ALL SELECT 32 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s32) UNION ALL SELECT 33 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s33) UNION ALL SELECT 34 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s34)
SELECT 0 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s0) UNION ALL SELECT 1 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s1) UNION ALL SELECT 2 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s2) UNION ALL SELECT 3 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s3)

-- retention: lease acquired, purge as leader
UPDATE outbox_lease SET acquired_at = CASE WHEN holder = ? THEN acquired_at ELSE statement_timestamp() END, holder = ?, locked_until = (statement_timestamp() + ? * INTERVAL '1 microsecond') WHERE name = ? AND (holder = ? OR locked_until < statement_timestamp())
INSERT INTO outbox_lease (name, holder, acquired_at, locked_until) VALUES (?, ?, statement_timestamp(), (statement_timestamp() + ? * INTERVAL '1 microsecond')) ON CONFLICT (name) DO NOTHING
SELECT statement_timestamp() AS now
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
DELETE FROM outbox_event WHERE id IN (SELECT id FROM outbox_event WHERE status = 'SENT' AND sent_at < ? LIMIT 5000 FOR UPDATE SKIP LOCKED)
COMMIT
DELETE FROM inbox_event WHERE id IN (SELECT id FROM inbox_event WHERE status IN ('DONE', 'IGNORED') AND processed_at < ? LIMIT 5000 FOR UPDATE SKIP LOCKED)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'outbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM outbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'inbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM inbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
SELECT (CAST(floor(extract(epoch FROM statement_timestamp())) AS BIGINT) / r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
SELECT 0 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s0) UNION ALL SELECT 1 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s1) UNION ALL SELECT 2 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s2) UNION ALL SELECT 3 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s3) UNION ALL SELECT 4 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s4) UNION ALL SELECT 5 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s5) UNION ALL SELECT 6 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s6) UNION ALL SELECT 7 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s7) UNION ALL SELECT 8 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s8) UNION ALL SELECT 9 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s9) UNION ALL SELECT 10 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s10) UNION ALL SELECT 11 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s11) UNION ALL SELECT 12 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s12) UNION ALL SELECT 13 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s13) UNION ALL SELECT 14 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s14) UNION ALL SELECT 15 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s15) UNION ALL SELECT 16 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s16) UNION ALL SELECT 17 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s17) UNION ALL SELECT 18 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s18) UNION ALL SELECT 19 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s19) UNION ALL SELECT 20 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s20) UNION ALL SELECT 21 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s21) UNION ALL SELECT 22 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s22) UNION ALL SELECT 23 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s23) UNION ALL SELECT 24 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s24) UNION ALL SELECT 25 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s25) UNION ALL SELECT 26 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s26) UNION ALL SELECT 27 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s27) UNION ALL SELECT 28 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s28) UNION ALL SELECT 29 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s29) UNION ALL SELECT 30 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s30) UNION ALL SELECT 31 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s31) UNION ALL SELECT 32 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s32) UNION ALL SELECT 33 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s33) UNION ALL SELECT 34 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s34)
SELECT 0 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s0) UNION ALL SELECT 1 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s1) UNION ALL SELECT 2 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s2) UNION ALL SELECT 3 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s3)

-- retention: lease renewed, purge as leader
UPDATE outbox_lease SET acquired_at = CASE WHEN holder = ? THEN acquired_at ELSE statement_timestamp() END, holder = ?, locked_until = (statement_timestamp() + ? * INTERVAL '1 microsecond') WHERE name = ? AND (holder = ? OR locked_until < statement_timestamp())
SELECT statement_timestamp() AS now
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
DELETE FROM outbox_event WHERE id IN (SELECT id FROM outbox_event WHERE status = 'SENT' AND sent_at < ? LIMIT 5000 FOR UPDATE SKIP LOCKED)
COMMIT
DELETE FROM inbox_event WHERE id IN (SELECT id FROM inbox_event WHERE status IN ('DONE', 'IGNORED') AND processed_at < ? LIMIT 5000 FOR UPDATE SKIP LOCKED)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'outbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM outbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'inbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM inbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
SELECT (CAST(floor(extract(epoch FROM statement_timestamp())) AS BIGINT) / r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
SELECT 0 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s0) UNION ALL SELECT 1 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s1) UNION ALL SELECT 2 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s2) UNION ALL SELECT 3 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s3) UNION ALL SELECT 4 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s4) UNION ALL SELECT 5 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s5) UNION ALL SELECT 6 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s6) UNION ALL SELECT 7 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s7) UNION ALL SELECT 8 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s8) UNION ALL SELECT 9 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s9) UNION ALL SELECT 10 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s10) UNION ALL SELECT 11 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s11) UNION ALL SELECT 12 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s12) UNION ALL SELECT 13 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s13) UNION ALL SELECT 14 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s14) UNION ALL SELECT 15 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s15) UNION ALL SELECT 16 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s16) UNION ALL SELECT 17 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s17) UNION ALL SELECT 18 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s18) UNION ALL SELECT 19 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s19) UNION ALL SELECT 20 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s20) UNION ALL SELECT 21 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s21) UNION ALL SELECT 22 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s22) UNION ALL SELECT 23 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s23) UNION ALL SELECT 24 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s24) UNION ALL SELECT 25 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s25) UNION ALL SELECT 26 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s26) UNION ALL SELECT 27 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s27) UNION ALL SELECT 28 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s28) UNION ALL SELECT 29 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s29) UNION ALL SELECT 30 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s30) UNION ALL SELECT 31 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s31) UNION ALL SELECT 32 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s32) UNION ALL SELECT 33 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s33) UNION ALL SELECT 34 AS slot WHERE EXISTS (SELECT 1 FROM outbox_sent_s34)
SELECT 0 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s0) UNION ALL SELECT 1 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s1) UNION ALL SELECT 2 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s2) UNION ALL SELECT 3 AS slot WHERE EXISTS (SELECT 1 FROM outbox_key_s3)

-- retention: lease released
UPDATE outbox_lease SET locked_until = (statement_timestamp() + ? * INTERVAL '1 microsecond') WHERE name = ? AND holder = ?

-- relay heartbeat: first report
UPDATE outbox_relay SET transport = ?, broker_state = ?, broker_seen_at = (statement_timestamp() + ? * INTERVAL '1 microsecond'), unavailable_since = ?, outages = ?, held_back = ?, last_error = ?, heartbeat_at = statement_timestamp(), expires_at = (statement_timestamp() + ? * INTERVAL '1 microsecond') WHERE relay_id = ?
INSERT INTO outbox_relay (relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, expires_at) VALUES (?, ?, ?, (statement_timestamp() + ? * INTERVAL '1 microsecond'), ?, ?, ?, ?, statement_timestamp(), statement_timestamp(), (statement_timestamp() + ? * INTERVAL '1 microsecond')) ON CONFLICT (relay_id) DO NOTHING

-- relay heartbeat: next report
UPDATE outbox_relay SET transport = ?, broker_state = ?, broker_seen_at = (statement_timestamp() + ? * INTERVAL '1 microsecond'), unavailable_since = ?, outages = ?, held_back = ?, last_error = ?, heartbeat_at = statement_timestamp(), expires_at = (statement_timestamp() + ? * INTERVAL '1 microsecond') WHERE relay_id = ?

-- relay heartbeat: the relays' rows
SELECT relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, expires_at FROM outbox_relay ORDER BY relay_id
