-- Every statement the SDK sends to sqlite in the scenario of tests/it/golden_sql.rs,
-- normalised; transaction control as the driver logs it (SQLite's is not logged).
-- Regenerate: OUTBOX_BLESS=1 cargo test --all-features --test it -- golden_sql

-- enqueue + commit: one event
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))

-- enqueue + commit: an event with a dedup key
SELECT (CAST(strftime('%s', 'now') AS INTEGER) / r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
INSERT INTO outbox_key (slot, bucket, event_type, dedup_key, event_id) VALUES (…), … ON CONFLICT (slot, event_type, dedup_key) DO UPDATE SET bucket = excluded.bucket, event_id = excluded.event_id WHERE outbox_key.bucket < excluded.bucket - 1 RETURNING event_id, bucket
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')) ON CONFLICT (event_type, dedup_key) DO NOTHING RETURNING id, event_id, status, created_at

-- enqueue + commit: an event with an aggregate version
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))

-- enqueue + commit: three events in one transaction
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')), …

-- relay: claim, publish, settle SENT
SELECT kind, name, paused_at, paused_by, reason FROM outbox_pause ORDER BY kind, name
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') ORDER BY due_at, id LIMIT 10
WITH w AS (SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status <> 'SENT') THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM outbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM outbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY')) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')) OR (o.status = 'PROCESSING' AND o.locked_until < strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status <> 'SENT') ORDER BY o.id LIMIT 10
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, payload, headers, status, attempts, locked_until, created_at FROM outbox_event WHERE status <> 'SENT' AND id > 1 AND ((aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?)) ORDER BY id LIMIT 10
UPDATE outbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), claim_token = ? WHERE id IN (…)
INSERT INTO outbox_sent (slot, id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, sent_at) SELECT (SELECT (CAST(strftime('%s', 'now') AS INTEGER) / r.slot_seconds) % r.slots FROM outbox_rotation r WHERE r.table_name = 'outbox_sent'), id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id IN (…)
DELETE FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id IN (…)

-- relay: a failed publish goes RETRY with its class, a permanent rejection DEAD
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') ORDER BY due_at, id LIMIT 10
WITH w AS (SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status <> 'SENT') THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM outbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM outbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY')) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')) OR (o.status = 'PROCESSING' AND o.locked_until < strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status <> 'SENT') ORDER BY o.id LIMIT 10
UPDATE outbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), claim_token = ? WHERE id IN (…)
UPDATE outbox_event SET status = 'RETRY', attempts = ?, next_attempt_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), failure_class = 'REJECTED', last_error = ?, locked_until = NULL WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id = ?
UPDATE outbox_event SET status = 'DEAD', attempts = ?, next_attempt_at = ?, failure_class = 'PERMANENT', last_error = ?, locked_until = NULL WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id = ?
INSERT INTO outbox_failure (queue, row_id, attempt, status, error, failed_at) SELECT 'outbox', id, attempts, status, last_error, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') FROM outbox_event WHERE last_error IS NOT NULL AND status IN ('RETRY', 'DEAD') AND id IN (…)

-- relay: nothing due
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') ORDER BY due_at, id LIMIT 10
WITH w AS (SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status <> 'SENT') THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM outbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM outbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY')) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')) OR (o.status = 'PROCESSING' AND o.locked_until < strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status <> 'SENT') ORDER BY o.id LIMIT 10
SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023

-- delayed: enqueue_after + commit
INSERT INTO outbox_scheduled (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, due_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))

-- delayed: the relay promotes the due event and publishes it
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') ORDER BY due_at, id LIMIT 10
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))
DELETE FROM outbox_scheduled WHERE id IN (…)
WITH w AS (SELECT id FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status <> 'SENT') THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM outbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM outbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY')) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')) OR (o.status = 'PROCESSING' AND o.locked_until < strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status <> 'SENT') ORDER BY o.id LIMIT 10
UPDATE outbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), claim_token = ? WHERE id IN (…)
INSERT INTO outbox_sent (slot, id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, sent_at) SELECT (SELECT (CAST(strftime('%s', 'now') AS INTEGER) / r.slot_seconds) % r.slots FROM outbox_rotation r WHERE r.table_name = 'outbox_sent'), id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id IN (…)
DELETE FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id IN (…)

-- inbox: receive external messages
INSERT INTO inbox_event (consumer, message_id, origin, biz_key, headers, event_type, source, aggregate_type, aggregate_id, aggregate_version, schema_version, payload, status, attempts, next_attempt_at, last_error, received_at, processed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'), ?) ON CONFLICT DO NOTHING
SELECT status, payload FROM inbox_event WHERE consumer = ? AND origin = ? AND message_id = ?

-- inbox worker: claim
WITH w AS (SELECT id FROM inbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY') AND status <> 'PROCESSING' AND consumer = ? ORDER BY id LIMIT 1 OFFSET 1023) SELECT o.id, o.consumer, o.message_id, o.origin, o.event_type, o.source, o.biz_key, o.headers, o.aggregate_type, o.aggregate_id, o.payload, o.status, o.attempts, o.locked_until, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') AS db_now, CASE WHEN EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next, (SELECT id FROM w) AS window_bound FROM inbox_event o WHERE o.status IN ('PENDING', 'PROCESSING', 'RETRY') AND o.consumer = ? AND o.id <= COALESCE((SELECT id FROM w), 9223372036854775807) AND o.id >= (SELECT MIN(x.id) FROM inbox_event x WHERE x.status IN ('PENDING', 'PROCESSING', 'RETRY') AND x.consumer = ?) AND ((o.status = 'PENDING') OR (o.status = 'RETRY' AND o.next_attempt_at <= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')) OR (o.status = 'PROCESSING' AND o.locked_until < strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))) AND NOT EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10
UPDATE inbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), claim_token = ? WHERE id IN (…)

-- inbox worker: a handler commits, DONE
UPDATE inbox_event SET status = 'DONE', processed_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'), attempts = attempts + 1, locked_until = NULL, last_error = NULL WHERE id = ? AND status = 'PROCESSING' AND claim_token = ?

-- inbox worker: a handler fails, RETRY
UPDATE inbox_event SET status = 'RETRY', attempts = ?, next_attempt_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), last_error = ?, locked_until = NULL WHERE id = ? AND status = 'PROCESSING' AND claim_token = ?
INSERT INTO outbox_failure (queue, row_id, attempt, status, error, failed_at) SELECT 'inbox', id, attempts, status, last_error, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') FROM inbox_event WHERE last_error IS NOT NULL AND status IN ('RETRY', 'DEAD') AND id IN (…)

-- inbox worker: a handler fails permanently, DEAD
UPDATE inbox_event SET status = 'DEAD', attempts = ?, next_attempt_at = ?, last_error = ?, locked_until = NULL WHERE id = ? AND status = 'PROCESSING' AND claim_token = ?
INSERT INTO outbox_failure (queue, row_id, attempt, status, error, failed_at) SELECT 'inbox', id, attempts, status, last_error, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') FROM inbox_event WHERE last_error IS NOT NULL AND status IN ('RETRY', 'DEAD') AND id IN (…)

-- admin: status
SELECT strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') AS now
SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM outbox_event GROUP BY status
SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM outbox_sent
SELECT COUNT(*) AS n, MIN(due_at) AS next_due FROM outbox_scheduled
SELECT COUNT(*) AS n, MIN(locked_until) AS since FROM outbox_event WHERE status = 'PROCESSING' AND locked_until < strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')
SELECT consumer, status, COUNT(*) AS n, MIN(received_at) AS oldest FROM inbox_event GROUP BY consumer, status ORDER BY consumer
SELECT consumer, COUNT(*) AS n, MIN(locked_until) AS since FROM inbox_event WHERE status = 'PROCESSING' AND locked_until < strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') GROUP BY consumer
SELECT relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, expires_at FROM outbox_relay ORDER BY relay_id
SELECT kind, name, paused_at, paused_by, reason FROM outbox_pause ORDER BY kind, name

-- admin: list dead letters
SELECT id, event_id, event_type, aggregate_type, aggregate_id, attempts, last_error, created_at AS arrived_at FROM outbox_event WHERE status = 'DEAD' ORDER BY arrived_at DESC, id DESC LIMIT 50
SELECT id, consumer, message_id, event_type, aggregate_type, aggregate_id, attempts, last_error, received_at AS arrived_at FROM inbox_event WHERE status = 'DEAD' ORDER BY arrived_at DESC, id DESC LIMIT 50

-- admin: show a dead letter
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, status, attempts, next_attempt_at, locked_by, locked_until, created_at, sent_at, last_error FROM outbox_event WHERE id = ?
SELECT id, attempt, status, error, failed_at FROM outbox_failure WHERE queue = 'outbox' AND row_id = ? ORDER BY id DESC LIMIT 100

-- admin: replay a dead event
SELECT id, status FROM outbox_event WHERE id IN (…)
UPDATE outbox_event SET status = 'PENDING', attempts = 0, next_attempt_at = NULL, locked_by = NULL, locked_until = NULL, claim_token = NULL WHERE status = 'DEAD' AND id IN (…)
UPDATE outbox_rescan SET generation = generation + 1 WHERE id = 1
INSERT INTO outbox_admin_action (action, target, rows_affected, actor, reason, at) VALUES (?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')) RETURNING id

-- admin: ignore a dead message
SELECT id, status FROM inbox_event WHERE id IN (…)
UPDATE inbox_event SET status = 'IGNORED', processed_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'), locked_until = NULL, claim_token = NULL WHERE status = 'DEAD' AND id IN (…)
INSERT INTO outbox_admin_action (action, target, rows_affected, actor, reason, at) VALUES (?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')) RETURNING id

-- admin: resend a sent event
SELECT id, event_id, status FROM outbox_event WHERE event_id IN (…)
SELECT id, event_id FROM outbox_sent WHERE event_id IN (…)
UPDATE outbox_event SET status = 'PENDING', sent_at = NULL, attempts = 0, next_attempt_at = NULL, locked_by = NULL, locked_until = NULL, claim_token = NULL, failure_class = NULL, last_error = NULL WHERE status = 'SENT' AND id IN (…)
INSERT INTO outbox_event (id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, status, attempts, created_at) SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, 'PENDING', 0, created_at FROM outbox_sent WHERE 1 = 1 AND id IN (…) ON CONFLICT (event_type, dedup_key) DO NOTHING
DELETE FROM outbox_sent WHERE 1 = 1 AND id IN (…) AND id IN (SELECT e.id FROM outbox_event e WHERE e.status = 'PENDING')
UPDATE outbox_rescan SET generation = generation + 1 WHERE id = 1
INSERT INTO outbox_admin_action (action, target, rows_affected, actor, reason, at) VALUES (?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')) RETURNING id

-- admin: audit log
SELECT id, action, target, rows_affected, actor, reason, at FROM outbox_admin_action ORDER BY id DESC LIMIT 10

-- retention: purge
SELECT strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') AS now
DELETE FROM outbox_event WHERE id IN (SELECT id FROM outbox_event WHERE status = 'SENT' AND sent_at < ? LIMIT 5000)
DELETE FROM inbox_event WHERE id IN (SELECT id FROM inbox_event WHERE status IN ('DONE', 'IGNORED') AND processed_at < ? LIMIT 5000)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'outbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM outbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'inbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM inbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
SELECT (CAST(strftime('%s', 'now') AS INTEGER) / r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
SELECT DISTINCT slot FROM outbox_sent WHERE slot IN (…)
SELECT DISTINCT slot FROM outbox_key WHERE slot IN (…)

-- retention: lease acquired, purge as leader
UPDATE outbox_lease SET acquired_at = CASE WHEN holder = ? THEN acquired_at ELSE strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') END, holder = ?, locked_until = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)) WHERE name = ? AND (holder = ? OR locked_until < strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))
INSERT INTO outbox_lease (name, holder, acquired_at, locked_until) VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'), strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0))) ON CONFLICT (name) DO NOTHING
SELECT strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') AS now
DELETE FROM outbox_event WHERE id IN (SELECT id FROM outbox_event WHERE status = 'SENT' AND sent_at < ? LIMIT 5000)
DELETE FROM inbox_event WHERE id IN (SELECT id FROM inbox_event WHERE status IN ('DONE', 'IGNORED') AND processed_at < ? LIMIT 5000)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'outbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM outbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'inbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM inbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
SELECT (CAST(strftime('%s', 'now') AS INTEGER) / r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
SELECT DISTINCT slot FROM outbox_sent WHERE slot IN (…)
SELECT DISTINCT slot FROM outbox_key WHERE slot IN (…)

-- retention: lease renewed, purge as leader
UPDATE outbox_lease SET acquired_at = CASE WHEN holder = ? THEN acquired_at ELSE strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') END, holder = ?, locked_until = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)) WHERE name = ? AND (holder = ? OR locked_until < strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))
SELECT strftime('%Y-%m-%dT%H:%M:%f000Z', 'now') AS now
DELETE FROM outbox_event WHERE id IN (SELECT id FROM outbox_event WHERE status = 'SENT' AND sent_at < ? LIMIT 5000)
DELETE FROM inbox_event WHERE id IN (SELECT id FROM inbox_event WHERE status IN ('DONE', 'IGNORED') AND processed_at < ? LIMIT 5000)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'outbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM outbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'inbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM inbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
SELECT (CAST(strftime('%s', 'now') AS INTEGER) / r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
SELECT DISTINCT slot FROM outbox_sent WHERE slot IN (…)
SELECT DISTINCT slot FROM outbox_key WHERE slot IN (…)

-- retention: lease released
UPDATE outbox_lease SET locked_until = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)) WHERE name = ? AND holder = ?

-- relay heartbeat: first report
UPDATE outbox_relay SET transport = ?, broker_state = ?, broker_seen_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), unavailable_since = ?, outages = ?, held_back = ?, last_error = ?, heartbeat_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'), expires_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)) WHERE relay_id = ?
INSERT INTO outbox_relay (relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, expires_at) VALUES (?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'), strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'), strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0))) ON CONFLICT (relay_id) DO NOTHING

-- relay heartbeat: next report
UPDATE outbox_relay SET transport = ?, broker_state = ?, broker_seen_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)), unavailable_since = ?, outages = ?, held_back = ?, last_error = ?, heartbeat_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'), expires_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', printf('%+.6f seconds', ? / 1000000.0)) WHERE relay_id = ?

-- relay heartbeat: the relays' rows
SELECT relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, expires_at FROM outbox_relay ORDER BY relay_id
