//! Transactional enqueue: `<schema>.publish(…)`, a SQL function an application calls inside
//! its own transaction, so that its business row and its message commit together or not at
//! all (the seeds' "双写" — a MySQL row and a Redis entry written apart — split in a crash;
//! this cannot).
//!
//! ```sql
//! BEGIN;
//! INSERT INTO orders (id, total) VALUES (42, 99.50);
//! SELECT redrive.publish('order-paid', '{"order": 42}', key => 'customer-7',
//!                        idempotency_key => 'order-42-paid', delay => interval '30 seconds');
//! COMMIT;
//! ```
//!
//! It writes what the store's own publish writes (`transitions::publish`): the message row
//! (`messages`), its place in its key's order (`key_heads`, as `key_order::settle` does for
//! a new message), its idempotency record (`idempotency`), and a notice to the nodes
//! (`pg_notify` on the schema's channel, `notify.rs`): a ready message wakes the long polls
//! of its queue on every node, a delayed one moves their schedulers' next wake-up earlier.
//! Notices are sent at commit, so a rolled-back publish wakes nobody and leaves nothing.
//!
//! What it checks is what `POST /v1/queues/{queue}/messages` checks of the same fields, with
//! the limits of the server that opened the schema last (`meta.sql_publish`, written at
//! open): the queue name, `payload` present (JSON `null` is a payload, SQL `NULL` is not),
//! `priority` 0–9, keys of 1 to 512 characters, `delay` not negative and at most
//! `max_schedule_ahead`, `headers` an object of strings, and the payload and header sizes;
//! and that the server can read the payload back (numbers below 1e308, at most 127 arrays or
//! objects deep: what serde_json reads, and jsonb would take more).
//! A refusal is an exception (SQLSTATE 22023, or 54000 for a size, or 23505 for an
//! idempotency key already used with another payload) that the caller's transaction sees
//! like any other failed statement. Not checked from SQL: a push queue's reserved headers
//! and `target_url` (the function takes none), and `failed` (publish a failure over HTTP).
//!
//! Idempotency is one record for both paths: the payload's fingerprint is computed by the
//! database in both (`fingerprint`), so a key used over HTTP and then from SQL (or the
//! reverse) with the same payload answers the first message's id.

use crate::error::E;
use deadpool_postgres::GenericClient;

/// What a message's idempotency fingerprint is, in SQL over `$n` (the payload's JSON text):
/// the MD5 of its `jsonb` rendering, so the HTTP path (payload text from serde) and the SQL
/// path (a `jsonb` argument) agree whatever spacing or key order the JSON was written with.
pub fn fingerprint(param: &str) -> String {
    format!("md5({param}::text::jsonb::text)")
}

/// The limits `publish(…)` checks, the server's own (`max_payload_bytes`,
/// `max_header_bytes`, `max_schedule_ahead`), recorded in `meta` at open. Defined in
/// `redrive_storage` (the MySQL store's `redrive_publish(…)` checks the same), re-exported
/// here for this crate's users.
pub use redrive_storage::SqlPublishLimits;

/// Record what `publish(…)` checks and the idempotency window it keeps keys for.
pub async fn record(
    client: &impl GenericClient,
    limits: SqlPublishLimits,
    idempotency_window_ms: u64,
) -> Result<(), E> {
    let mut v = serde_json::to_value(limits)?;
    v["idempotency_window_ms"] = idempotency_window_ms.into();
    client
        .execute(
            "INSERT INTO meta (k, v) VALUES ('sql_publish', $1) \
             ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            &[&v.to_string()],
        )
        .await?;
    Ok(())
}

/// The function's SQL, after `CREATE` (step 3) or `CREATE OR REPLACE` (step 8). `SET
/// search_path FROM CURRENT` binds it to the schema it is created in (the migration runs with
/// `search_path` set to it), whatever the caller's.
macro_rules! publish_function {
    ($create:literal) => {
        concat!(
            $create,
            r#" FUNCTION publish(
  queue text,
  payload jsonb,
  key text DEFAULT NULL,
  idempotency_key text DEFAULT NULL,
  delay interval DEFAULT NULL,
  headers jsonb DEFAULT NULL,
  priority integer DEFAULT 0
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
DECLARE
  now_ms    bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  lim       jsonb;
  modes     jsonb;
  mode      text;
  body      text;
  hdrs      text;
  delay_ms  bigint := 0;
  due       bigint;
  st        smallint;
  new_id    text;
  new_seq   bigint;
  fp        text;
  found_id  text;
  found_fp  text;
  head      bigint;
  blocked   boolean;
BEGIN
  IF publish.queue IS NULL OR publish.queue !~ '^[A-Za-z0-9._:-]{1,128}$' THEN
    RAISE EXCEPTION 'redrive.publish: queue %: must be 1 to 128 of A-Z a-z 0-9 . _ : -',
      coalesce(quote_literal(publish.queue), 'NULL') USING ERRCODE = '22023';
  END IF;
  IF publish.payload IS NULL THEN
    RAISE EXCEPTION 'redrive.publish: payload: missing (any JSON value; JSON null is ''null''::jsonb, SQL NULL is no payload)'
      USING ERRCODE = '22023';
  END IF;
  -- What the server's JSON reader (serde_json) reads, which is stricter than jsonb: every
  -- number below 1e308 in magnitude (a 64-bit float), at most 127 arrays or objects deep.
  IF jsonb_path_exists(publish.payload,
       'strict $.** ? (@.type() == "number" && (@ >= 1e308 || @ <= -1e308))') THEN
    RAISE EXCEPTION 'redrive.publish: payload: a number redrive cannot read (numbers must be below 1e308)'
      USING ERRCODE = '22023';
  END IF;
  IF jsonb_path_exists(publish.payload,
       'strict $.**{127} ? (@.type() == "array" || @.type() == "object")') THEN
    RAISE EXCEPTION 'redrive.publish: payload: nested more than 127 arrays or objects deep (redrive reads 127)'
      USING ERRCODE = '22023';
  END IF;
  IF publish.priority IS NULL OR publish.priority NOT BETWEEN 0 AND 9 THEN
    RAISE EXCEPTION 'redrive.publish: priority: % is not in 0..=9', coalesce(publish.priority::text, 'NULL')
      USING ERRCODE = '22023';
  END IF;
  IF publish.key IS NOT NULL AND char_length(publish.key) NOT BETWEEN 1 AND 512 THEN
    RAISE EXCEPTION 'redrive.publish: key: must have 1 to 512 characters' USING ERRCODE = '22023';
  END IF;
  IF publish.idempotency_key IS NOT NULL AND char_length(publish.idempotency_key) NOT BETWEEN 1 AND 512 THEN
    RAISE EXCEPTION 'redrive.publish: idempotency_key: must have 1 to 512 characters' USING ERRCODE = '22023';
  END IF;

  SELECT v::jsonb INTO lim FROM meta WHERE k = 'sql_publish';
  IF lim IS NULL THEN
    RAISE EXCEPTION 'redrive.publish: this schema was never opened by a redrive server that records its limits'
      USING ERRCODE = '55000';
  END IF;
  body := publish.payload::text;
  IF octet_length(body) > (lim->>'max_payload_bytes')::bigint THEN
    RAISE EXCEPTION 'redrive.publish: payload: % bytes, the limit is % (max_payload_bytes)',
      octet_length(body), lim->>'max_payload_bytes' USING ERRCODE = '54000';
  END IF;
  IF publish.delay IS NOT NULL THEN
    delay_ms := (extract(epoch FROM publish.delay) * 1000)::bigint;
    IF delay_ms < 0 THEN
      RAISE EXCEPTION 'redrive.publish: delay: % is negative', publish.delay USING ERRCODE = '22023';
    END IF;
    IF delay_ms > (lim->>'max_schedule_ahead_ms')::bigint THEN
      RAISE EXCEPTION 'redrive.publish: delay: % is more than % ms ahead (max_schedule_ahead)',
        publish.delay, lim->>'max_schedule_ahead_ms' USING ERRCODE = '22023';
    END IF;
  END IF;
  IF publish.headers IS NOT NULL AND publish.headers <> '{}'::jsonb THEN
    IF jsonb_typeof(publish.headers) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_each(publish.headers) AS h WHERE jsonb_typeof(h.value) <> 'string') THEN
      RAISE EXCEPTION 'redrive.publish: headers: must be an object of strings, e.g. {"trace-id": "abc"}'
        USING ERRCODE = '22023';
    END IF;
    hdrs := publish.headers::text;
    IF octet_length(hdrs) > (lim->>'max_header_bytes')::bigint THEN
      RAISE EXCEPTION 'redrive.publish: headers: % bytes of JSON, the limit is % (max_header_bytes)',
        octet_length(hdrs), lim->>'max_header_bytes' USING ERRCODE = '54000';
    END IF;
  END IF;

  -- A time-ordered id (UUIDv7), as the server's own.
  new_id := encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
              PLACING substring(int8send(now_ms) FROM 3) FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid::text;

  IF publish.idempotency_key IS NOT NULL THEN
    fp := md5(body);
    -- Claim the key first: a concurrent publish of it (either path) waits here for the
    -- other's commit, then replays it.
    INSERT INTO idempotency AS i (queue, ikey, message_id, fingerprint, expires_at)
      VALUES (publish.queue, publish.idempotency_key, new_id, fp,
              now_ms + (lim->>'idempotency_window_ms')::bigint)
      ON CONFLICT (queue, ikey) DO UPDATE SET message_id = EXCLUDED.message_id,
        fingerprint = EXCLUDED.fingerprint, expires_at = EXCLUDED.expires_at, tombstone = NULL
        WHERE i.expires_at <= now_ms
      RETURNING i.message_id INTO found_id;
    IF found_id IS NULL THEN
      SELECT i.message_id, i.fingerprint INTO found_id, found_fp FROM idempotency AS i
        WHERE i.queue = publish.queue AND i.ikey = publish.idempotency_key;
      IF found_fp IS DISTINCT FROM fp THEN
        RAISE EXCEPTION 'redrive.publish: idempotency_key %: already used in queue % with another payload',
          quote_literal(publish.idempotency_key), publish.queue USING ERRCODE = '23505';
      END IF;
      RETURN found_id;
    END IF;
  END IF;

  due := now_ms + delay_ms;
  st := CASE WHEN due > now_ms THEN 0 ELSE 1 END;
  SELECT v::jsonb INTO modes FROM meta WHERE k = 'key_order_modes';
  mode := coalesce(modes->'queues'->>publish.queue, modes->>'default', 'unordered');
  -- A new message takes part in its key's order under either ordered mode.
  blocked := CASE WHEN publish.key IS NOT NULL AND mode <> 'unordered' THEN true END;
  INSERT INTO messages (id, queue, state, priority, due_at, msg_key, idempotency_key, payload,
                        headers, created_at, updated_at, key_blocked)
    VALUES (new_id, publish.queue, st, publish.priority, due, publish.key, publish.idempotency_key,
            body, hdrs, now_ms, now_ms, blocked)
    RETURNING seq INTO new_seq;
  INSERT INTO message_ids (mi_seq, mi_id, mi_queue) VALUES (new_seq, new_id, publish.queue);

  IF blocked THEN
    -- key_order::settle for a new message: lock the key, wait for a claim of its head in
    -- flight, and make the new message the head if no older one takes part.
    LOOP
      SELECT k.head_seq INTO head FROM key_heads AS k
        WHERE k.queue = publish.queue AND k.msg_key = publish.key FOR UPDATE;
      EXIT WHEN FOUND;
      INSERT INTO key_heads (queue, msg_key) VALUES (publish.queue, publish.key) ON CONFLICT DO NOTHING;
    END LOOP;
    IF head IS NOT NULL AND head <> new_seq THEN
      PERFORM 1 FROM messages AS m WHERE m.seq = head FOR UPDATE;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM messages AS m WHERE m.queue = publish.queue AND m.msg_key = publish.key
                   AND m.key_blocked IS NOT NULL AND m.seq < new_seq) THEN
      UPDATE key_heads AS k SET head_seq = new_seq WHERE k.queue = publish.queue AND k.msg_key = publish.key;
      IF NOT EXISTS (SELECT 1 FROM messages AS m WHERE m.queue = publish.queue AND m.msg_key = publish.key
                     AND m.state = 2) THEN
        UPDATE messages AS m SET key_blocked = false WHERE m.seq = new_seq;
      END IF;
    END IF;
  END IF;

  -- Told to every node at commit (notify.rs: sender 0 is this function).
  IF st = 1 THEN
    PERFORM pg_notify('redrive_' || current_schema(), '0000000000000000 1 ' || publish.queue);
  ELSE
    PERFORM pg_notify('redrive_' || current_schema(), '0000000000000000 due ' || due);
  END IF;
  RETURN new_id;
END
$fn$;
"#
        )
    };
}

/// Schema step 3: the function.
pub const V3: &str = publish_function!("CREATE");

/// Schema step 8: the function again, reading the queue's key-order mode as `meta` spells it
/// (`unordered`, snake case: `redrive_storage::rules::KeyMode`). Step 3 compared it with
/// `Unordered`, so on a schema where any queue kept per-key order a keyed publish from SQL
/// to an unordered queue was made to wait behind its key, and only the first was leasable.
pub const V8: &str = publish_function!("CREATE OR REPLACE");

/// Schema step 9: the function again, refusing what the server's JSON reader cannot read
/// back and jsonb accepts (a number of 1e308 or more, as `[1e400]`; more than 127 nested
/// arrays or objects). Step 8 stored them, and every lease that met such a message failed.
pub const V9: &str = publish_function!("CREATE OR REPLACE");

/// Schema step 11: the function again, writing the new message's `message_ids` row (step
/// 10 moved `id`'s uniqueness and the queue's index there).
pub const V11: &str = publish_function!("CREATE OR REPLACE");
