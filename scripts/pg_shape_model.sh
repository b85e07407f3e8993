#!/usr/bin/env bash
# What one retry cycle costs PostgreSQL in four table shapes, on the same server: the shape
# redrive's PostgreSQL store had until schema step 10 (one `messages` row per message with every
# index, rewritten at each transition), the shape of step 10 (the same row without its two full
# indexes, which a narrow `message_ids` row written once holds), the same columns split into a cold row written once (id, queue, payload:
# the full indexes) and a narrow hot row (the lifecycle: the partial indexes), and the one
# table kept whole but its state indexes moved to a narrow side table (so that its own updates
# are HOT). A server-side procedure per shape runs BATCHES × 100 messages through publish,
# claim, nack (lock, update, history row), claim and ack (lock, update, history row), committing
# after each step as the store does; no client, no network, no planning per statement, so the
# figures are the rows' and indexes' own cost. Each shape runs ROUNDS times, interleaved, with
# a VACUUM between rounds; the first round of each is a warm-up. Prints ms per 100,000 cycles
# and WAL bytes per cycle. Schemas shape_whole, shape_ids, shape_split, shape_side are dropped after.
#
#   scripts/pg_shape_model.sh                 # 200 batches (20,000 cycles) x 4 rounds
#   BATCHES=500 ROUNDS=3 scripts/pg_shape_model.sh
#
# PG_URL default postgres://root@127.0.0.1:5432/test.
set -euo pipefail
PG_URL=${PG_URL:-postgres://root@127.0.0.1:5432/test}
BATCHES=${BATCHES:-200}
ROUNDS=${ROUNDS:-4}
pg() { psql "$PG_URL" -XAtq -v ON_ERROR_STOP=1 "$@"; }
SHAPES="shape_whole shape_ids shape_split shape_side"
cleanup() { for s in $SHAPES; do pg -c "DROP SCHEMA IF EXISTS $s CASCADE" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
cleanup

# The store's shape until schema step 10 (schema.rs, V1): every index on the one row.
pg -c "CREATE SCHEMA shape_whole" >/dev/null
pg -c "SET search_path = shape_whole" -f - >/dev/null <<'SQL'
CREATE TABLE messages (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text COLLATE "C" NOT NULL UNIQUE,
  queue text COLLATE "C" NOT NULL, state smallint NOT NULL, priority smallint NOT NULL, due_at bigint,
  msg_key text COLLATE "C", idempotency_key text COLLATE "C", payload text NOT NULL, headers text, target_url text,
  attempts integer NOT NULL DEFAULT 0, budget_base integer NOT NULL DEFAULT 0, uncounted integer NOT NULL DEFAULT 0,
  released integer NOT NULL DEFAULT 0, prev_delay_ms bigint, created_at bigint NOT NULL, updated_at bigint NOT NULL,
  window_start bigint, lease_token text, leased_at bigint, lease_expires_at bigint, lease_end text, finished_at bigint,
  dead_reason text, error_class text, last_error text, key_blocked boolean) WITH (fillfactor=85);
CREATE INDEX ix_ready ON messages (queue, priority DESC, due_at, seq) WHERE state = 1 AND key_blocked IS NOT TRUE;
CREATE INDEX ix_ready_blocked ON messages (queue, due_at) WHERE state = 1 AND key_blocked;
CREATE INDEX ix_scheduled ON messages (queue, due_at) WHERE state = 0;
CREATE INDEX ix_leased ON messages (lease_expires_at) WHERE state = 2;
CREATE INDEX ix_done ON messages (finished_at) WHERE state = 3;
CREATE INDEX ix_dead ON messages (queue, seq) WHERE state = 4;
CREATE INDEX ix_queue ON messages (queue, seq);
CREATE INDEX ix_key ON messages (queue, msg_key, seq) WHERE msg_key IS NOT NULL;
CREATE INDEX ix_key_order ON messages (queue, msg_key, seq) WHERE key_blocked IS NOT NULL;
CREATE INDEX ix_key_leased ON messages (queue, msg_key) WHERE state = 2 AND msg_key IS NOT NULL;
CREATE TABLE history (message_seq bigint NOT NULL, n integer NOT NULL, entry jsonb NOT NULL, PRIMARY KEY (message_seq, n));
CREATE OR REPLACE PROCEDURE cyc(batches int) LANGUAGE plpgsql AS $$
DECLARE i int; ids bigint[];
BEGIN
 FOR i IN 1..batches LOOP
  INSERT INTO messages (id, queue, state, priority, due_at, payload, created_at, updated_at)
   SELECT gen_random_uuid()::text, 'q', 1, 0, 1000, '{"n":12345,"t":1733333333333,"pad":"xxxxxxxxxxxxxxxxxxxx"}', 1, 1 FROM generate_series(1,100);
  COMMIT;
  WITH l AS (UPDATE messages SET state=2, attempts=attempts+1, lease_token='1-abc', leased_at=2, lease_expires_at=30002, updated_at=2
   WHERE seq = ANY(ARRAY(SELECT seq FROM messages WHERE queue='q' AND state=1 AND key_blocked IS NOT TRUE ORDER BY priority DESC, due_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED)) RETURNING seq, payload)
   SELECT array_agg(seq) INTO ids FROM l;
  COMMIT;
  PERFORM 1 FROM messages WHERE seq = ANY(ids) FOR UPDATE;
  UPDATE messages SET state=1, due_at=3, lease_end='nack', updated_at=3, last_error='boom' WHERE seq = ANY(ids);
  INSERT INTO history SELECT s, 0, '{"at":3,"event":"attempt","attempt":1,"error":"boom","class":"x"}' FROM unnest(ids) s;
  COMMIT;
  UPDATE messages SET state=2, attempts=attempts+1, lease_token='2-abc', leased_at=4, lease_expires_at=30004, updated_at=4
   WHERE seq = ANY(ARRAY(SELECT seq FROM messages WHERE queue='q' AND state=1 AND key_blocked IS NOT TRUE ORDER BY priority DESC, due_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED));
  COMMIT;
  PERFORM 1 FROM messages WHERE seq = ANY(ids) FOR UPDATE;
  UPDATE messages SET state=3, finished_at=5, lease_end='ack', updated_at=5 WHERE seq = ANY(ids);
  INSERT INTO history SELECT s, 1, '{"at":5,"event":"acked","attempt":2}' FROM unnest(ids) s;
  COMMIT;
 END LOOP;
END $$;
SQL

# Split: the cold row (id, queue, key, payload) with the full indexes, written once; the hot
# row (lifecycle) with the primary key and the partial indexes, rewritten at each transition.
pg -c "CREATE SCHEMA shape_split" >/dev/null
pg -c "SET search_path = shape_split" -f - >/dev/null <<'SQL'
CREATE TABLE messages (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text COLLATE "C" NOT NULL UNIQUE,
  queue text COLLATE "C" NOT NULL, msg_key text COLLATE "C", idempotency_key text COLLATE "C", payload text NOT NULL, headers text, target_url text,
  created_at bigint NOT NULL);
CREATE INDEX ix_queue ON messages (queue, seq);
CREATE INDEX ix_key ON messages (queue, msg_key, seq) WHERE msg_key IS NOT NULL;
CREATE TABLE lives (seq bigint PRIMARY KEY, queue text COLLATE "C" NOT NULL, state smallint NOT NULL, priority smallint NOT NULL, due_at bigint,
  msg_key text COLLATE "C",
  attempts integer NOT NULL DEFAULT 0, budget_base integer NOT NULL DEFAULT 0, uncounted integer NOT NULL DEFAULT 0,
  released integer NOT NULL DEFAULT 0, prev_delay_ms bigint, updated_at bigint NOT NULL,
  window_start bigint, lease_token text, leased_at bigint, lease_expires_at bigint, lease_end text, finished_at bigint,
  dead_reason text, error_class text, last_error text, key_blocked boolean) WITH (fillfactor=85);
CREATE INDEX ix_ready ON lives (queue, priority DESC, due_at, seq) WHERE state = 1 AND key_blocked IS NOT TRUE;
CREATE INDEX ix_ready_blocked ON lives (queue, due_at) WHERE state = 1 AND key_blocked;
CREATE INDEX ix_scheduled ON lives (queue, due_at) WHERE state = 0;
CREATE INDEX ix_leased ON lives (lease_expires_at) WHERE state = 2;
CREATE INDEX ix_done ON lives (finished_at) WHERE state = 3;
CREATE INDEX ix_dead ON lives (queue, seq) WHERE state = 4;
CREATE INDEX ix_key_order ON lives (queue, msg_key, seq) WHERE key_blocked IS NOT NULL;
CREATE INDEX ix_key_leased ON lives (queue, msg_key) WHERE state = 2 AND msg_key IS NOT NULL;
CREATE TABLE history (message_seq bigint NOT NULL, n integer NOT NULL, entry jsonb NOT NULL, PRIMARY KEY (message_seq, n));
CREATE OR REPLACE PROCEDURE cyc(batches int) LANGUAGE plpgsql AS $$
DECLARE i int; ids bigint[];
BEGIN
 FOR i IN 1..batches LOOP
  WITH m AS (INSERT INTO messages (id, queue, payload, created_at)
   SELECT gen_random_uuid()::text, 'q', '{"n":12345,"t":1733333333333,"pad":"xxxxxxxxxxxxxxxxxxxx"}', 1 FROM generate_series(1,100) RETURNING seq, queue)
  INSERT INTO lives (seq, queue, state, priority, due_at, updated_at) SELECT seq, queue, 1, 0, 1000, 1 FROM m;
  COMMIT;
  WITH l AS (UPDATE lives SET state=2, attempts=attempts+1, lease_token='1-abc', leased_at=2, lease_expires_at=30002, updated_at=2
   WHERE seq = ANY(ARRAY(SELECT seq FROM lives WHERE queue='q' AND state=1 AND key_blocked IS NOT TRUE ORDER BY priority DESC, due_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED)) RETURNING seq)
   SELECT array_agg(seq) INTO ids FROM (SELECT l.seq, m.payload FROM l JOIN messages m USING (seq)) z;
  COMMIT;
  PERFORM 1 FROM lives WHERE seq = ANY(ids) FOR UPDATE;
  UPDATE lives SET state=1, due_at=3, lease_end='nack', updated_at=3, last_error='boom' WHERE seq = ANY(ids);
  INSERT INTO history SELECT s, 0, '{"at":3,"event":"attempt","attempt":1,"error":"boom","class":"x"}' FROM unnest(ids) s;
  COMMIT;
  WITH l AS (UPDATE lives SET state=2, attempts=attempts+1, lease_token='2-abc', leased_at=4, lease_expires_at=30004, updated_at=4
   WHERE seq = ANY(ARRAY(SELECT seq FROM lives WHERE queue='q' AND state=1 AND key_blocked IS NOT TRUE ORDER BY priority DESC, due_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED)) RETURNING seq)
   SELECT count(m.payload) INTO i FROM l JOIN messages m USING (seq);
  COMMIT;
  PERFORM 1 FROM lives WHERE seq = ANY(ids) FOR UPDATE;
  UPDATE lives SET state=3, finished_at=5, lease_end='ack', updated_at=5 WHERE seq = ANY(ids);
  INSERT INTO history SELECT s, 1, '{"at":5,"event":"acked","attempt":2}' FROM unnest(ids) s;
  COMMIT;
 END LOOP;
END $$;
SQL

# Side table: the whole row as today but only its full indexes; the state indexes on a narrow
# `slots` row written beside it (the row's own updates are HOT).
pg -c "CREATE SCHEMA shape_side" >/dev/null
pg -c "SET search_path = shape_side" -f - >/dev/null <<'SQL'
CREATE TABLE messages (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text COLLATE "C" NOT NULL UNIQUE,
  queue text COLLATE "C" NOT NULL, state smallint NOT NULL, priority smallint NOT NULL, due_at bigint,
  msg_key text COLLATE "C", idempotency_key text COLLATE "C", payload text NOT NULL, headers text, target_url text,
  attempts integer NOT NULL DEFAULT 0, budget_base integer NOT NULL DEFAULT 0, uncounted integer NOT NULL DEFAULT 0,
  released integer NOT NULL DEFAULT 0, prev_delay_ms bigint, created_at bigint NOT NULL, updated_at bigint NOT NULL,
  window_start bigint, lease_token text, leased_at bigint, lease_expires_at bigint, lease_end text, finished_at bigint,
  dead_reason text, error_class text, last_error text, key_blocked boolean) WITH (fillfactor=70);
CREATE INDEX ix_queue ON messages (queue, seq);
CREATE INDEX ix_key ON messages (queue, msg_key, seq) WHERE msg_key IS NOT NULL;
CREATE TABLE slots (seq bigint PRIMARY KEY, queue text COLLATE "C" NOT NULL, state smallint NOT NULL, priority smallint NOT NULL, due_at bigint, lease_expires_at bigint, finished_at bigint, msg_key text COLLATE "C", key_blocked boolean) WITH (fillfactor=85);
CREATE INDEX ix_ready ON slots (queue, priority DESC, due_at, seq) WHERE state = 1 AND key_blocked IS NOT TRUE;
CREATE INDEX ix_scheduled ON slots (queue, due_at) WHERE state = 0;
CREATE INDEX ix_leased ON slots (lease_expires_at) WHERE state = 2;
CREATE INDEX ix_done ON slots (finished_at) WHERE state = 3;
CREATE INDEX ix_dead ON slots (queue, seq) WHERE state = 4;
CREATE TABLE history (message_seq bigint NOT NULL, n integer NOT NULL, entry jsonb NOT NULL, PRIMARY KEY (message_seq, n));
CREATE OR REPLACE PROCEDURE cyc(batches int) LANGUAGE plpgsql AS $$
DECLARE i int; ids bigint[];
BEGIN
 FOR i IN 1..batches LOOP
  WITH m AS (INSERT INTO messages (id, queue, state, priority, due_at, payload, created_at, updated_at)
   SELECT gen_random_uuid()::text, 'q', 1, 0, 1000, '{"n":12345,"t":1733333333333,"pad":"xxxxxxxxxxxxxxxxxxxx"}', 1, 1 FROM generate_series(1,100) RETURNING seq, queue, priority, due_at)
  INSERT INTO slots (seq, queue, state, priority, due_at) SELECT seq, queue, 1, priority, due_at FROM m;
  COMMIT;
  WITH s AS (UPDATE slots SET state=2, lease_expires_at=30002 WHERE seq = ANY(ARRAY(SELECT seq FROM slots WHERE queue='q' AND state=1 AND key_blocked IS NOT TRUE ORDER BY priority DESC, due_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED)) RETURNING seq),
   l AS (UPDATE messages m SET state=2, attempts=attempts+1, lease_token='1-abc', leased_at=2, lease_expires_at=30002, updated_at=2 FROM s WHERE m.seq = s.seq RETURNING m.seq, m.payload)
   SELECT array_agg(seq) INTO ids FROM l;
  COMMIT;
  PERFORM 1 FROM messages WHERE seq = ANY(ids) FOR UPDATE;
  UPDATE messages SET state=1, due_at=3, lease_end='nack', updated_at=3, last_error='boom' WHERE seq = ANY(ids);
  UPDATE slots SET state=1, due_at=3, lease_expires_at=NULL WHERE seq = ANY(ids);
  INSERT INTO history SELECT s, 0, '{"at":3,"event":"attempt","attempt":1,"error":"boom","class":"x"}' FROM unnest(ids) s;
  COMMIT;
  WITH s AS (UPDATE slots SET state=2, lease_expires_at=30004 WHERE seq = ANY(ARRAY(SELECT seq FROM slots WHERE queue='q' AND state=1 AND key_blocked IS NOT TRUE ORDER BY priority DESC, due_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED)) RETURNING seq),
   l AS (UPDATE messages m SET state=2, attempts=attempts+1, lease_token='2-abc', leased_at=4, lease_expires_at=30004, updated_at=4 FROM s WHERE m.seq = s.seq RETURNING m.seq, m.payload)
   SELECT count(*) INTO i FROM l;
  COMMIT;
  PERFORM 1 FROM messages WHERE seq = ANY(ids) FOR UPDATE;
  UPDATE messages SET state=3, finished_at=5, lease_end='ack', updated_at=5 WHERE seq = ANY(ids);
  UPDATE slots SET state=3, finished_at=5, lease_expires_at=NULL WHERE seq = ANY(ids);
  INSERT INTO history SELECT s, 1, '{"at":5,"event":"acked","attempt":2}' FROM unnest(ids) s;
  COMMIT;
 END LOOP;
END $$;
SQL

# Ids apart (schema step 10, `message_ids`): the whole row, its two full indexes (id's
# uniqueness, the queue's) on a narrow row written once beside it.
pg -c "CREATE SCHEMA shape_ids" >/dev/null
pg -c "SET search_path = shape_ids" -f - >/dev/null <<'SQL'
CREATE TABLE messages (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text COLLATE "C" NOT NULL,
  queue text COLLATE "C" NOT NULL, state smallint NOT NULL, priority smallint NOT NULL, due_at bigint,
  msg_key text COLLATE "C", idempotency_key text COLLATE "C", payload text NOT NULL, headers text, target_url text,
  attempts integer NOT NULL DEFAULT 0, budget_base integer NOT NULL DEFAULT 0, uncounted integer NOT NULL DEFAULT 0,
  released integer NOT NULL DEFAULT 0, prev_delay_ms bigint, created_at bigint NOT NULL, updated_at bigint NOT NULL,
  window_start bigint, lease_token text, leased_at bigint, lease_expires_at bigint, lease_end text, finished_at bigint,
  dead_reason text, error_class text, last_error text, key_blocked boolean) WITH (fillfactor=85);
CREATE INDEX ix_ready ON messages (queue, priority DESC, due_at, seq) WHERE state = 1 AND key_blocked IS NOT TRUE;
CREATE INDEX ix_ready_blocked ON messages (queue, due_at) WHERE state = 1 AND key_blocked;
CREATE INDEX ix_scheduled ON messages (queue, due_at) WHERE state = 0;
CREATE INDEX ix_leased ON messages (lease_expires_at) WHERE state = 2;
CREATE INDEX ix_done ON messages (finished_at) WHERE state = 3;
CREATE INDEX ix_dead ON messages (queue, seq) WHERE state = 4;
CREATE TABLE ids (seq bigint PRIMARY KEY, id text COLLATE "C" NOT NULL UNIQUE, queue text COLLATE "C" NOT NULL);
CREATE INDEX ix_queue ON ids (queue, seq);
CREATE INDEX ix_key ON messages (queue, msg_key, seq) WHERE msg_key IS NOT NULL;
CREATE INDEX ix_key_order ON messages (queue, msg_key, seq) WHERE key_blocked IS NOT NULL;
CREATE INDEX ix_key_leased ON messages (queue, msg_key) WHERE state = 2 AND msg_key IS NOT NULL;
CREATE TABLE history (message_seq bigint NOT NULL, n integer NOT NULL, entry jsonb NOT NULL, PRIMARY KEY (message_seq, n));
CREATE OR REPLACE PROCEDURE cyc(batches int) LANGUAGE plpgsql AS $$
DECLARE i int; ids bigint[];
BEGIN
 FOR i IN 1..batches LOOP
  WITH m AS (INSERT INTO messages (id, queue, state, priority, due_at, payload, created_at, updated_at)
   SELECT gen_random_uuid()::text, 'q', 1, 0, 1000, '{"n":12345,"t":1733333333333,"pad":"xxxxxxxxxxxxxxxxxxxx"}', 1, 1 FROM generate_series(1,100) RETURNING seq, id, queue)
  INSERT INTO ids SELECT seq, id, queue FROM m;
  COMMIT;
  WITH l AS (UPDATE messages SET state=2, attempts=attempts+1, lease_token='1-abc', leased_at=2, lease_expires_at=30002, updated_at=2
   WHERE seq = ANY(ARRAY(SELECT seq FROM messages WHERE queue='q' AND state=1 AND key_blocked IS NOT TRUE ORDER BY priority DESC, due_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED)) RETURNING seq, payload)
   SELECT array_agg(seq) INTO ids FROM l;
  COMMIT;
  PERFORM 1 FROM messages WHERE seq = ANY(ids) FOR UPDATE;
  UPDATE messages SET state=1, due_at=3, lease_end='nack', updated_at=3, last_error='boom' WHERE seq = ANY(ids);
  INSERT INTO history SELECT s, 0, '{"at":3,"event":"attempt","attempt":1,"error":"boom","class":"x"}' FROM unnest(ids) s;
  COMMIT;
  UPDATE messages SET state=2, attempts=attempts+1, lease_token='2-abc', leased_at=4, lease_expires_at=30004, updated_at=4
   WHERE seq = ANY(ARRAY(SELECT seq FROM messages WHERE queue='q' AND state=1 AND key_blocked IS NOT TRUE ORDER BY priority DESC, due_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED));
  COMMIT;
  PERFORM 1 FROM messages WHERE seq = ANY(ids) FOR UPDATE;
  UPDATE messages SET state=3, finished_at=5, lease_end='ack', updated_at=5 WHERE seq = ANY(ids);
  INSERT INTO history SELECT s, 1, '{"at":5,"event":"acked","attempt":2}' FROM unnest(ids) s;
  COMMIT;
 END LOOP;
END $$;
SQL

echo "PostgreSQL: $(pg -c 'SELECT version()')"
echo "$BATCHES batches of 100 messages per round, $ROUNDS rounds (the first a warm-up)"
for round in $(seq 1 "$ROUNDS"); do
  for s in $SHAPES; do
    l0=$(pg -c "SELECT pg_current_wal_lsn()")
    t0=$(date +%s%N)
    pg -c "SET search_path = $s" -c "CALL cyc($BATCHES)"
    t1=$(date +%s%N)
    l1=$(pg -c "SELECT pg_current_wal_lsn()")
    cycles=$((BATCHES * 100))
    printf 'round %d  %-12s %7.0f ms per 100,000 cycles  WAL %5s B per cycle\n' "$round" "$s" \
      "$(awk -v ns=$((t1 - t0)) -v c=$cycles 'BEGIN { print ns / 1e6 * 100000 / c }')" \
      "$(pg -c "SELECT round(pg_wal_lsn_diff('$l1', '$l0') / $cycles)")"
    pg -c "VACUUM $s.messages" >/dev/null 2>&1
    [ "$s" != shape_whole ] && pg -c "VACUUM $s.lives" >/dev/null 2>&1 || true
    [ "$s" = shape_side ] && pg -c "VACUUM $s.slots" >/dev/null 2>&1 || true
  done
done
