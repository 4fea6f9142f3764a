-- Every statement the SDK sends to mysql in the scenario of tests/it/golden_sql.rs,
-- normalised; transaction control as the driver logs it (SQLite's is not logged).
-- Regenerate: OUTBOX_BLESS=1 cargo test --all-features --test it -- golden_sql

-- enqueue + commit: one event
BEGIN
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE id = id
COMMIT

-- enqueue + commit: an event with a dedup key
BEGIN
SELECT (UNIX_TIMESTAMP() DIV r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
INSERT INTO outbox_key (slot, bucket, event_type, dedup_key, event_id) VALUES (…), … ON DUPLICATE KEY UPDATE event_id = IF(bucket < VALUES(bucket) - 1, VALUES(event_id), event_id), bucket = IF(bucket < VALUES(bucket) - 1, VALUES(bucket), bucket)
SELECT event_id FROM outbox_key WHERE slot = ? AND bucket = ? AND ((event_type = ? AND dedup_key = ?))
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE id = id
SELECT event_id FROM outbox_event WHERE event_id IN (…)
COMMIT

-- enqueue + commit: an event with an aggregate version
BEGIN
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE id = id
COMMIT

-- enqueue + commit: three events in one transaction
BEGIN
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6)), … ON DUPLICATE KEY UPDATE id = id
COMMIT

-- relay: claim, publish, settle SENT
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= UTC_TIMESTAMP(6) ORDER BY due_at, id LIMIT 10 FOR UPDATE SKIP LOCKED
COMMIT
SELECT id FROM ((SELECT id FROM outbox_event WHERE status = 'PENDING' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') ORDER BY id LIMIT 1024) UNION ALL (SELECT id FROM outbox_event WHERE status = 'RETRY' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') ORDER BY id LIMIT 1024)) w ORDER BY id LIMIT 1 OFFSET 1023
(SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'PENDING' AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'RETRY' AND o.next_attempt_at <= UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'PROCESSING' AND o.locked_until < UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) ORDER BY id LIMIT 10
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, payload, headers, status, attempts, locked_until, created_at FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') AND id > 1 AND ((aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?) OR (aggregate_type = ? AND aggregate_id = ?)) ORDER BY id LIMIT 10 FOR UPDATE
UPDATE outbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), claim_token = ? WHERE id IN (…)
INSERT INTO outbox_sent (slot, id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, sent_at) SELECT (SELECT (UNIX_TIMESTAMP() DIV r.slot_seconds) % r.slots FROM outbox_rotation r WHERE r.table_name = 'outbox_sent'), id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, UTC_TIMESTAMP(6) FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id IN (…)
DELETE FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id IN (…)

-- relay: a failed publish goes RETRY with its class, a permanent rejection DEAD
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= UTC_TIMESTAMP(6) ORDER BY due_at, id LIMIT 10 FOR UPDATE SKIP LOCKED
COMMIT
SELECT id FROM ((SELECT id FROM outbox_event WHERE status = 'PENDING' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') ORDER BY id LIMIT 1024) UNION ALL (SELECT id FROM outbox_event WHERE status = 'RETRY' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') ORDER BY id LIMIT 1024)) w ORDER BY id LIMIT 1 OFFSET 1023
(SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'PENDING' AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'RETRY' AND o.next_attempt_at <= UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'PROCESSING' AND o.locked_until < UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) ORDER BY id LIMIT 10
UPDATE outbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), claim_token = ? WHERE id IN (…)
UPDATE outbox_event SET status = 'RETRY', attempts = ?, next_attempt_at = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), failure_class = 'REJECTED', last_error = ?, locked_until = NULL WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id = ?
UPDATE outbox_event SET status = 'DEAD', attempts = ?, next_attempt_at = ?, failure_class = 'PERMANENT', last_error = ?, locked_until = NULL WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id = ?
INSERT INTO outbox_failure (queue, row_id, attempt, status, error, failed_at) SELECT 'outbox', id, attempts, status, last_error, UTC_TIMESTAMP(6) FROM outbox_event WHERE last_error IS NOT NULL AND status IN ('RETRY', 'DEAD') AND id IN (…)

-- relay: nothing due
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= UTC_TIMESTAMP(6) ORDER BY due_at, id LIMIT 10 FOR UPDATE SKIP LOCKED
COMMIT
SELECT id FROM ((SELECT id FROM outbox_event WHERE status = 'PENDING' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') ORDER BY id LIMIT 1024) UNION ALL (SELECT id FROM outbox_event WHERE status = 'RETRY' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') ORDER BY id LIMIT 1024)) w ORDER BY id LIMIT 1 OFFSET 1023
(SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'PENDING' AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'RETRY' AND o.next_attempt_at <= UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'PROCESSING' AND o.locked_until < UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) ORDER BY id LIMIT 10

-- delayed: enqueue_after + commit
BEGIN
INSERT INTO outbox_scheduled (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, due_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE id = id
COMMIT

-- delayed: the relay promotes the due event and publishes it
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers FROM outbox_scheduled WHERE due_at <= UTC_TIMESTAMP(6) ORDER BY due_at, id LIMIT 10 FOR UPDATE SKIP LOCKED
INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE id = id
DELETE FROM outbox_scheduled WHERE id IN (…)
COMMIT
SELECT id FROM ((SELECT id FROM outbox_event WHERE status = 'PENDING' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') ORDER BY id LIMIT 1024) UNION ALL (SELECT id FROM outbox_event WHERE status = 'RETRY' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') ORDER BY id LIMIT 1024)) w ORDER BY id LIMIT 1 OFFSET 1023
(SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'PENDING' AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'RETRY' AND o.next_attempt_at <= UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.event_id, o.source, o.event_type, o.schema_version, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.payload, o.headers, o.status, o.attempts, o.locked_until, o.created_at, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM outbox_event o WHERE o.status = 'PROCESSING' AND o.locked_until < UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) ORDER BY id LIMIT 10
UPDATE outbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), claim_token = ? WHERE id IN (…)
INSERT INTO outbox_sent (slot, id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, sent_at) SELECT (SELECT (UNIX_TIMESTAMP() DIV r.slot_seconds) % r.slots FROM outbox_rotation r WHERE r.table_name = 'outbox_sent'), id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, locked_by, claim_token, created_at, UTC_TIMESTAMP(6) FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id IN (…)
DELETE FROM outbox_event WHERE (status = 'PROCESSING' AND claim_token = ?) IS TRUE AND id IN (…)

-- inbox: receive external messages
INSERT IGNORE INTO inbox_event (consumer, message_id, origin, biz_key, headers, event_type, source, aggregate_type, aggregate_id, aggregate_version, schema_version, payload, status, attempts, next_attempt_at, last_error, received_at, processed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), ?)
SELECT status, payload FROM inbox_event WHERE consumer = ? AND origin = ? AND message_id = ?

-- inbox worker: claim
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
SELECT id FROM ((SELECT id FROM inbox_event WHERE status = 'PENDING' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') AND consumer = ? ORDER BY id LIMIT 1024) UNION ALL (SELECT id FROM inbox_event WHERE status = 'RETRY' AND status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD') AND consumer = ? ORDER BY id LIMIT 1024)) w ORDER BY id LIMIT 1 OFFSET 1023
(SELECT o.id, o.consumer, o.message_id, o.origin, o.event_type, o.source, o.biz_key, o.headers, o.aggregate_type, o.aggregate_id, o.payload, o.status, o.attempts, o.locked_until, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM inbox_event o WHERE o.status = 'PENDING' AND o.consumer = ? AND NOT EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.consumer, o.message_id, o.origin, o.event_type, o.source, o.biz_key, o.headers, o.aggregate_type, o.aggregate_id, o.payload, o.status, o.attempts, o.locked_until, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM inbox_event o WHERE o.status = 'RETRY' AND o.consumer = ? AND o.next_attempt_at <= UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT o.id, o.consumer, o.message_id, o.origin, o.event_type, o.source, o.biz_key, o.headers, o.aggregate_type, o.aggregate_id, o.payload, o.status, o.attempts, o.locked_until, UTC_TIMESTAMP(6) AS db_now, CASE WHEN EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id > o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) THEN 1 ELSE 0 END AS has_next FROM inbox_event o WHERE o.status = 'PROCESSING' AND o.consumer = ? AND o.locked_until < UTC_TIMESTAMP(6) AND NOT EXISTS (SELECT 1 FROM inbox_event e WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.consumer = o.consumer AND e.id < o.id AND e.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY o.id LIMIT 10 FOR UPDATE SKIP LOCKED) ORDER BY id LIMIT 10
UPDATE inbox_event SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, status = 'PROCESSING', locked_by = ?, locked_until = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), claim_token = ? WHERE id IN (…)
COMMIT

-- inbox worker: a handler commits, DONE
BEGIN
UPDATE inbox_event SET status = 'DONE', processed_at = UTC_TIMESTAMP(6), attempts = attempts + 1, locked_until = NULL, last_error = NULL WHERE id = ? AND status = 'PROCESSING' AND claim_token = ?
COMMIT

-- inbox worker: a handler fails, RETRY
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
UPDATE inbox_event SET status = 'RETRY', attempts = ?, next_attempt_at = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), last_error = ?, locked_until = NULL WHERE id = ? AND status = 'PROCESSING' AND claim_token = ?
INSERT INTO outbox_failure (queue, row_id, attempt, status, error, failed_at) SELECT 'inbox', id, attempts, status, last_error, UTC_TIMESTAMP(6) FROM inbox_event WHERE last_error IS NOT NULL AND status IN ('RETRY', 'DEAD') AND id IN (…)
COMMIT

-- inbox worker: a handler fails permanently, DEAD
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
UPDATE inbox_event SET status = 'DEAD', attempts = ?, next_attempt_at = ?, last_error = ?, locked_until = NULL WHERE id = ? AND status = 'PROCESSING' AND claim_token = ?
INSERT INTO outbox_failure (queue, row_id, attempt, status, error, failed_at) SELECT 'inbox', id, attempts, status, last_error, UTC_TIMESTAMP(6) FROM inbox_event WHERE last_error IS NOT NULL AND status IN ('RETRY', 'DEAD') AND id IN (…)
COMMIT

-- admin: status
SELECT UTC_TIMESTAMP(6) AS now
SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM outbox_event GROUP BY status
SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM outbox_sent
SELECT COUNT(*) AS n, MIN(due_at) AS next_due FROM outbox_scheduled
SELECT COUNT(*) AS n, MIN(locked_until) AS since FROM outbox_event WHERE status = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6)
SELECT consumer, status, COUNT(*) AS n, MIN(received_at) AS oldest FROM inbox_event GROUP BY consumer, status ORDER BY consumer
SELECT consumer, COUNT(*) AS n, MIN(locked_until) AS since FROM inbox_event WHERE status = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6) GROUP BY consumer
SELECT relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, expires_at FROM outbox_relay ORDER BY relay_id
SELECT TABLE_NAME AS table_name, CAST(TABLE_ROWS AS SIGNED) AS live_rows, CAST(NULL AS SIGNED) AS dead_rows, CAST(DATA_LENGTH AS SIGNED) AS table_bytes, CAST(INDEX_LENGTH AS SIGNED) AS index_bytes, CAST(DATA_FREE AS SIGNED) AS free_bytes, CAST(NULL AS DOUBLE) AS vacuumed_s, CAST(NULL AS DOUBLE) AS analyzed_s, TRUE AS autovacuum_enabled FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (…)
SELECT 'session' AS kind, CAST(t.trx_mysql_thread_id AS SIGNED) AS pid, COALESCE(CONCAT(p.USER, '@', p.HOST), '') AS name, t.trx_state AS state, CAST(TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1000000 AS DOUBLE) AS age_s, CAST(NULL AS SIGNED) AS xid_age FROM information_schema.INNODB_TRX t LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id WHERE t.trx_mysql_thread_id <> CONNECTION_ID() ORDER BY t.trx_started LIMIT 5

-- admin: list dead letters
SELECT id, event_id, event_type, aggregate_type, aggregate_id, attempts, last_error, created_at AS arrived_at FROM outbox_event WHERE status = 'DEAD' ORDER BY arrived_at DESC, id DESC LIMIT 50
SELECT id, consumer, message_id, event_type, aggregate_type, aggregate_id, attempts, last_error, received_at AS arrived_at FROM inbox_event WHERE status = 'DEAD' ORDER BY arrived_at DESC, id DESC LIMIT 50

-- admin: show a dead letter
SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, status, attempts, next_attempt_at, locked_by, locked_until, created_at, sent_at, last_error FROM outbox_event WHERE id = ?
SELECT id, attempt, status, error, failed_at FROM outbox_failure WHERE queue = 'outbox' AND row_id = ? ORDER BY id DESC LIMIT 100

-- admin: replay a dead event
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
SELECT id, status FROM outbox_event WHERE id IN (…) FOR UPDATE
UPDATE outbox_event SET status = 'PENDING', attempts = 0, next_attempt_at = NULL, locked_by = NULL, locked_until = NULL, claim_token = NULL WHERE status = 'DEAD' AND id IN (…)
UPDATE outbox_rescan SET generation = generation + 1 WHERE id = 1
INSERT INTO outbox_admin_action (action, target, rows_affected, actor, reason, at) VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))
COMMIT

-- admin: ignore a dead message
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
SELECT id, status FROM inbox_event WHERE id IN (…) FOR UPDATE
UPDATE inbox_event SET status = 'IGNORED', processed_at = UTC_TIMESTAMP(6), locked_until = NULL, claim_token = NULL WHERE status = 'DEAD' AND id IN (…)
INSERT INTO outbox_admin_action (action, target, rows_affected, actor, reason, at) VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))
COMMIT

-- admin: resend a sent event
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
SELECT id, event_id, status FROM outbox_event WHERE event_id IN (…) FOR UPDATE
SELECT id, event_id FROM outbox_sent WHERE event_id IN (…)
UPDATE outbox_event SET status = 'PENDING', sent_at = NULL, attempts = 0, next_attempt_at = NULL, locked_by = NULL, locked_until = NULL, claim_token = NULL, failure_class = NULL, last_error = NULL WHERE status = 'SENT' AND id IN (…)
INSERT INTO outbox_event (id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, status, attempts, created_at) SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, 'PENDING', 0, created_at FROM outbox_sent WHERE 1 = 1 AND id IN (…) ON DUPLICATE KEY UPDATE outbox_event.id = outbox_event.id
DELETE FROM outbox_sent WHERE 1 = 1 AND id IN (…) AND id IN (SELECT e.id FROM outbox_event e WHERE e.status = 'PENDING')
UPDATE outbox_rescan SET generation = generation + 1 WHERE id = 1
INSERT INTO outbox_admin_action (action, target, rows_affected, actor, reason, at) VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))
COMMIT

-- admin: audit log
SELECT id, action, target, rows_affected, actor, reason, at FROM outbox_admin_action ORDER BY id DESC LIMIT 10

-- retention: purge
SELECT UTC_TIMESTAMP(6) AS now
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
DELETE FROM outbox_event WHERE status = 'SENT' AND sent_at < ? ORDER BY sent_at, id LIMIT 5000
COMMIT
DELETE FROM inbox_event WHERE status = 'DONE' AND processed_at < ? ORDER BY processed_at, id LIMIT 5000
DELETE FROM inbox_event WHERE status = 'IGNORED' AND processed_at < ? ORDER BY processed_at, id LIMIT 5000
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'outbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM outbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'inbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM inbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
SELECT (UNIX_TIMESTAMP() DIV r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
SELECT 3 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s3)) UNION ALL SELECT 4 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s4)) UNION ALL SELECT 5 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s5)) UNION ALL SELECT 6 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s6)) UNION ALL SELECT 7 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s7)) UNION ALL SELECT 8 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s8)) UNION ALL SELECT 9 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s9)) UNION ALL SELECT 10 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s10)) UNION ALL SELECT 11 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s11)) UNION ALL SELECT 12 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s12)) UNION ALL SELECT 13 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s13)) UNION ALL SELECT 14 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s14)) UNION ALL SELECT 15 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s15)) UNION ALL SELECT 16 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s16)) UNION ALL SELECT 17 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s17)) UNION ALL SELECT 18 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s18)) UNION ALL SELECT 19 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s19)) UNION ALL SELECT 20 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s20)) UNION ALL SELECT 21 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s21)) UNION ALL SELECT 22 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s22)) UNION ALL SELECT 23 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s23)) UNION ALL SELECT 24 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s24)) UNION ALL SELECT 25 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s25)) UNION ALL SELECT 26 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s26)) UNION ALL SELECT 27 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s27)) UNION ALL SELECT 28 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s28))
SELECT 0 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_key PARTITION (s0))

-- retention: lease acquired, purge as leader
UPDATE outbox_lease SET acquired_at = CASE WHEN holder = ? THEN acquired_at ELSE UTC_TIMESTAMP(6) END, holder = ?, locked_until = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) WHERE name = ? AND (holder = ? OR locked_until < UTC_TIMESTAMP(6))
INSERT IGNORE INTO outbox_lease (name, holder, acquired_at, locked_until) VALUES (?, ?, UTC_TIMESTAMP(6), (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND))
SELECT UTC_TIMESTAMP(6) AS now
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
DELETE FROM outbox_event WHERE status = 'SENT' AND sent_at < ? ORDER BY sent_at, id LIMIT 5000
COMMIT
DELETE FROM inbox_event WHERE status = 'DONE' AND processed_at < ? ORDER BY processed_at, id LIMIT 5000
DELETE FROM inbox_event WHERE status = 'IGNORED' AND processed_at < ? ORDER BY processed_at, id LIMIT 5000
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'outbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM outbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'inbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM inbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
SELECT (UNIX_TIMESTAMP() DIV r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
SELECT 3 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s3)) UNION ALL SELECT 4 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s4)) UNION ALL SELECT 5 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s5)) UNION ALL SELECT 6 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s6)) UNION ALL SELECT 7 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s7)) UNION ALL SELECT 8 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s8)) UNION ALL SELECT 9 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s9)) UNION ALL SELECT 10 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s10)) UNION ALL SELECT 11 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s11)) UNION ALL SELECT 12 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s12)) UNION ALL SELECT 13 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s13)) UNION ALL SELECT 14 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s14)) UNION ALL SELECT 15 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s15)) UNION ALL SELECT 16 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s16)) UNION ALL SELECT 17 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s17)) UNION ALL SELECT 18 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s18)) UNION ALL SELECT 19 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s19)) UNION ALL SELECT 20 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s20)) UNION ALL SELECT 21 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s21)) UNION ALL SELECT 22 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s22)) UNION ALL SELECT 23 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s23)) UNION ALL SELECT 24 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s24)) UNION ALL SELECT 25 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s25)) UNION ALL SELECT 26 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s26)) UNION ALL SELECT 27 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s27)) UNION ALL SELECT 28 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s28))
SELECT 0 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_key PARTITION (s0))

-- retention: lease renewed, purge as leader
UPDATE outbox_lease SET acquired_at = CASE WHEN holder = ? THEN acquired_at ELSE UTC_TIMESTAMP(6) END, holder = ?, locked_until = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) WHERE name = ? AND (holder = ? OR locked_until < UTC_TIMESTAMP(6))
SELECT UTC_TIMESTAMP(6) AS now
SET TRANSACTION ISOLATION LEVEL READ COMMITTED
BEGIN
DELETE FROM outbox_event WHERE status = 'SENT' AND sent_at < ? ORDER BY sent_at, id LIMIT 5000
COMMIT
DELETE FROM inbox_event WHERE status = 'DONE' AND processed_at < ? ORDER BY processed_at, id LIMIT 5000
DELETE FROM inbox_event WHERE status = 'IGNORED' AND processed_at < ? ORDER BY processed_at, id LIMIT 5000
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'outbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM outbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
DELETE FROM outbox_failure WHERE id IN (SELECT id FROM (SELECT f.id FROM outbox_failure f WHERE f.queue = 'inbox' AND f.failed_at < ? AND NOT EXISTS (SELECT 1 FROM inbox_event t WHERE t.id = f.row_id AND t.status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')) ORDER BY f.id LIMIT 5000) doomed)
SELECT (UNIX_TIMESTAMP() DIV r.slot_seconds) AS bucket, r.slot_seconds, r.slots FROM outbox_rotation r WHERE r.table_name = ?
SELECT 3 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s3)) UNION ALL SELECT 4 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s4)) UNION ALL SELECT 5 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s5)) UNION ALL SELECT 6 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s6)) UNION ALL SELECT 7 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s7)) UNION ALL SELECT 8 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s8)) UNION ALL SELECT 9 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s9)) UNION ALL SELECT 10 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s10)) UNION ALL SELECT 11 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s11)) UNION ALL SELECT 12 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s12)) UNION ALL SELECT 13 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s13)) UNION ALL SELECT 14 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s14)) UNION ALL SELECT 15 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s15)) UNION ALL SELECT 16 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s16)) UNION ALL SELECT 17 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s17)) UNION ALL SELECT 18 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s18)) UNION ALL SELECT 19 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s19)) UNION ALL SELECT 20 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s20)) UNION ALL SELECT 21 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s21)) UNION ALL SELECT 22 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s22)) UNION ALL SELECT 23 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s23)) UNION ALL SELECT 24 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s24)) UNION ALL SELECT 25 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s25)) UNION ALL SELECT 26 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s26)) UNION ALL SELECT 27 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s27)) UNION ALL SELECT 28 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_sent PARTITION (s28))
SELECT 0 AS slot FROM DUAL WHERE EXISTS (SELECT 1 FROM outbox_key PARTITION (s0))

-- retention: lease released
UPDATE outbox_lease SET locked_until = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) WHERE name = ? AND holder = ?

-- relay heartbeat: first report
UPDATE outbox_relay SET transport = ?, broker_state = ?, broker_seen_at = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), unavailable_since = ?, outages = ?, held_back = ?, last_error = ?, heartbeat_at = UTC_TIMESTAMP(6), expires_at = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) WHERE relay_id = ?
INSERT IGNORE INTO outbox_relay (relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, expires_at) VALUES (?, ?, ?, (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND))

-- relay heartbeat: next report
UPDATE outbox_relay SET transport = ?, broker_state = ?, broker_seen_at = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), unavailable_since = ?, outages = ?, held_back = ?, last_error = ?, heartbeat_at = UTC_TIMESTAMP(6), expires_at = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) WHERE relay_id = ?

-- relay heartbeat: the relays' rows
SELECT relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, expires_at FROM outbox_relay ORDER BY relay_id
