//! Transactional enqueue on MySQL / MariaDB: the stored procedures `redrive_publish(…)` and
//! `redrive_publish_out(…)`, which an application calls inside its own transaction, so that
//! its business row and its message commit together or not at all.
//!
//! ```sql
//! START TRANSACTION;
//! INSERT INTO orders (id, total) VALUES (42, 99.50);
//! CALL redrive_publish('order-paid', '{"order": 42}', 'customer-7', 'order-42-paid',
//!                      30000, NULL, NULL);  -- queue, payload, key, idempotency_key,
//!                                           -- delay_ms, priority, headers: one row, its id
//! COMMIT;
//! ```
//!
//! `redrive_publish` answers the message id as a one-row result set (column `message_id`):
//! what PHP PDO reads with `fetchColumn()`. `redrive_publish_out` takes an eighth, `OUT`,
//! argument instead (`CALL redrive_publish_out(…, @id); SELECT @id;`), for a caller that
//! wants the id in a variable (another stored routine). MySQL routines have no defaults
//! and no named arguments: every argument is given, `NULL` for "not given" (no key, no
//! idempotency key, no delay, priority 0, no headers).
//!
//! It writes what the store's own publish writes for a new message
//! (`transitions::publish`, `key_order::settle`): the `messages` row (no history: a new
//! message has none), its `ready` row when it is leasable now (with `node` 0, no store's, so
//! that every store's poller, `poll.rs`, tells its long polls within a poll), its place in
//! its key's order (`key_heads`: the key's lock point is locked first, as every writer
//! does; with nothing older taking part it is the key's head) and its idempotency record.
//! A delayed message is a `scheduled` row; the stores' schedulers promote it, every node
//! ticking at least once a second (`poll.rs` keeps the wake-up at most 1 s ahead). Its id is
//! a UUIDv7 of the database's clock, as the store's are of the server's (random bits from
//! `MD5(UUID(), RAND())`: two ids of one millisecond are not in the order they were made).
//! Times are the database's, in ms.
//!
//! Checked before anything is written, with the limits of the server that opened the
//! database last (`meta.sql_publish`, [`record`]): the queue name, the payload present
//! (`'null'` is a payload, SQL `NULL` is not) and readable by the server (`JSON_VALID`, and
//! stricter: the numbers and string escapes `serde_json` reads, numbers below 1e308), the
//! priority 0–9, keys of 1 to 512 characters, the delay not negative and at most
//! `max_schedule_ahead`, the headers an object of strings (`'{}'`, `'[]'` and `'null'` are
//! none), the payload and header sizes. A refusal is `SIGNAL` (SQLSTATE 22023, 54000 for a
//! size, 23000 for an idempotency key used with another payload; error 1644, the message
//! naming the argument): the caller's statement fails like any other.
//!
//! Outside a transaction (autocommit on, none open) the procedure runs in a transaction of
//! its own, at `READ COMMITTED`, so that a lone `CALL` is atomic too (MariaDB; MySQL has no
//! `@@in_transaction` to tell, so there call it inside one).
//!
//! Idempotency is one record for both paths: the payload's fingerprint is computed by the
//! database in both ([`Canon`]), so a key used over HTTP and then from SQL (or the reverse)
//! with the same payload answers the first message's id.

use crate::error::E;
use crate::sql::{col, execute, query, query_opt, Db};
use mysql_async::{Params, Value};
use redrive_core::fnv1a;
use redrive_storage::{SqlPublishLimits, StoreError};

/// How the database makes a payload's JSON text canonical for its idempotency fingerprint,
/// chosen once per database (the best the server has when schema v4 is applied) and
/// recorded in `meta.payload_fingerprint`, so that every node and both paths agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canon {
    /// MariaDB 10.7+: `JSON_NORMALIZE` (keys sorted, spacing gone, numbers by value:
    /// `1`, `1.0` and `1e0` are one number). Strings are compared as written: `"a/b"` and
    /// `"a\/b"` are two payloads.
    Normalize,
    /// MariaDB 10.6: `JSON_COMPACT` (spacing gone; key order and number spelling kept).
    Compact,
    /// MySQL 8: `CAST(… AS JSON)` (MySQL's own normal form).
    CastJson,
}

impl Canon {
    /// The `meta` row recording it.
    pub const META_KEY: &'static str = "payload_fingerprint";

    /// Its name in `meta`.
    pub fn as_str(self) -> &'static str {
        match self {
            Canon::Normalize => "json_normalize",
            Canon::Compact => "json_compact",
            Canon::CastJson => "cast_json",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Canon::Normalize, Canon::Compact, Canon::CastJson]
            .into_iter()
            .find(|c| c.as_str() == s)
    }

    /// The best this server has.
    pub async fn probe(c: &mut mysql_async::Conn, mariadb: bool) -> Result<Self, E> {
        use mysql_async::prelude::Queryable;
        if !mariadb {
            return Ok(Canon::CastJson);
        }
        match c.query_drop("SELECT JSON_NORMALIZE('{}')").await {
            Ok(()) => Ok(Canon::Normalize),
            // "FUNCTION JSON_NORMALIZE does not exist" (ER_SP_DOES_NOT_EXIST): before 10.7.
            Err(mysql_async::Error::Server(e)) if e.code == 1305 => Ok(Canon::Compact),
            Err(e) => Err(e.into()),
        }
    }

    /// The fingerprint of the JSON text `x` (an SQL expression): a tag of the kind, `:`,
    /// the MD5 of the canonical text. NULL when the server cannot read `x` as JSON (over
    /// HTTP, a payload nested more deeply than MariaDB reads: see [`fingerprints`]).
    pub fn fingerprint(self, x: &str) -> String {
        match self {
            Canon::Normalize => format!("CONCAT('n:', MD5(JSON_NORMALIZE({x})))"),
            Canon::Compact => format!("CONCAT('c:', MD5(JSON_COMPACT({x})))"),
            Canon::CastJson => {
                format!(
                    "CONCAT('j:', MD5(IF(JSON_VALID({x}), CAST(CAST({x} AS JSON) AS CHAR), NULL)))"
                )
            }
        }
    }
}

/// The database's fingerprint kind, recorded when schema v4 was applied.
pub async fn canon_of<C: Db>(c: &mut C) -> Result<Option<Canon>, E> {
    let r = query_opt(
        c,
        "SELECT v FROM meta WHERE k = ?",
        crate::sql::args![Canon::META_KEY],
    )
    .await?;
    match r {
        None => Ok(None),
        Some(r) => {
            let v: String = col(&r, 0)?;
            Canon::parse(&v).map(Some).ok_or_else(|| {
                E::Db(StoreError::Backend(format!(
                    "meta.{} is {v:?}, which this redrive does not know",
                    Canon::META_KEY
                )))
            })
        }
    }
}

/// The idempotency fingerprints of the payloads `texts` (their JSON text as the store
/// writes it), computed by the database in one statement, as `redrive_publish` computes
/// its own. A payload the server cannot canonicalize (nested 32 deep or more, past what
/// MariaDB reads, which only the HTTP path can publish) gets `d:` and the FNV-1a of its text.
pub async fn fingerprints<C: Db>(
    canon: Canon,
    tx: &mut C,
    texts: &[&str],
) -> Result<Vec<String>, E> {
    let mut out = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(100) {
        let sql = (0..chunk.len())
            .map(|i| format!("SELECT {i}, {}", canon.fingerprint("?")))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let rows = query(
            tx,
            &format!("{sql} ORDER BY 1"),
            Params::Positional(chunk.iter().map(|t| Value::from(*t)).collect()),
        )
        .await?;
        if rows.len() != chunk.len() {
            return Err(E::Db(StoreError::Backend(format!(
                "MySQL answered {} fingerprints for {} payloads",
                rows.len(),
                chunk.len()
            ))));
        }
        for (r, text) in rows.iter().zip(chunk) {
            let fp: Option<String> = col(r, 1)?;
            out.push(fp.unwrap_or_else(|| format!("d:{:016x}", fnv1a(text.as_bytes()))));
        }
    }
    Ok(out)
}

/// Whether an idempotency record's fingerprint `recorded` is the one of the payload
/// `text`, whose fingerprint by the database is `fp`. Records written before schema v4
/// hold the FNV-1a of the payload's text (16 hex digits, no `:`), compared as then; they
/// are gone within one idempotency window of the upgrade.
pub fn fingerprint_matches(recorded: &str, fp: &str, text: &str) -> bool {
    if recorded.contains(':') {
        recorded == fp
    } else {
        recorded == format!("{:016x}", fnv1a(text.as_bytes()))
    }
}

/// Record what `redrive_publish` checks and the idempotency window it keeps keys for.
pub async fn record<C: Db>(
    c: &mut C,
    limits: SqlPublishLimits,
    idempotency_window_ms: u64,
) -> Result<(), E> {
    let mut v = serde_json::to_value(limits)?;
    v["idempotency_window_ms"] = idempotency_window_ms.into();
    execute(
        c,
        "INSERT INTO meta (k, v) VALUES ('sql_publish', ?) ON DUPLICATE KEY UPDATE v = VALUES(v)",
        crate::sql::args![v.to_string()],
    )
    .await?;
    Ok(())
}

/// Schema step 4's procedures, for this server (`mariadb`) and the database's fingerprint
/// kind: each dropped if there and created again, so that the step can run twice.
pub fn procedures(canon: Canon, mariadb: bool) -> Vec<String> {
    let compact = |x: &str| {
        if mariadb {
            format!("JSON_COMPACT({x})")
        } else {
            x.to_owned()
        }
    };
    let big_numbers = match canon {
        // Normal form: one digit before the point, the magnitude in the exponent.
        Canon::Normalize => format!(
            "REGEXP_REPLACE(JSON_NORMALIZE(v_body), v_string, '\"\"') REGEXP '{BIG_EXPONENT}'"
        ),
        // As written: an exponent of 308 or more, or 309 digits in a row.
        Canon::Compact | Canon::CastJson => {
            format!("v_bare REGEXP '{BIG_EXPONENT}|[0-9]{{309}}'")
        }
    };
    let own = if mariadb {
        "(@@autocommit = 1 AND @@in_transaction = 0)"
    } else {
        "FALSE"
    };
    let out = PUBLISH_OUT
        .replace("%OWN_TRANSACTION%", own)
        .replace("%COMPACT_PAYLOAD%", &compact("p_payload"))
        .replace("%COMPACT_HEADERS%", &compact("p_headers"))
        .replace("%BIG_NUMBERS%", &big_numbers)
        .replace("%FINGERPRINT%", &canon.fingerprint("v_body"));
    vec![
        "DROP PROCEDURE IF EXISTS redrive_publish".to_owned(),
        "DROP PROCEDURE IF EXISTS redrive_publish_out".to_owned(),
        out,
        PUBLISH.to_owned(),
    ]
}

/// An exponent of 308 or more.
const BIG_EXPONENT: &str = "(?-i)[eE][+]?0*(30[89]|3[1-9][0-9]|[4-9][0-9]{2}|[1-9][0-9]{3,})";

/// The procedure with the id as an `OUT` argument (placeholders `%…%` filled by
/// [`procedures`]).
const PUBLISH_OUT: &str = r#"CREATE PROCEDURE redrive_publish_out(
  IN p_queue TEXT CHARACTER SET utf8mb4,
  IN p_payload LONGTEXT CHARACTER SET utf8mb4,
  IN p_key TEXT CHARACTER SET utf8mb4,
  IN p_idempotency_key TEXT CHARACTER SET utf8mb4,
  IN p_delay_ms BIGINT,
  IN p_priority INT,
  IN p_headers LONGTEXT CHARACTER SET utf8mb4,
  OUT p_message_id CHAR(36) CHARACTER SET ascii
)
MODIFIES SQL DATA
SQL SECURITY DEFINER
COMMENT 'redrive: publish a message in the caller''s transaction (schema v4)'
BEGIN
  DECLARE v_own BOOLEAN DEFAULT %OWN_TRANSACTION%;
  DECLARE v_bs CHAR(1) CHARACTER SET utf8mb4 DEFAULT CHAR(92 USING utf8mb4);
  DECLARE v_string TEXT CHARACTER SET utf8mb4;
  DECLARE v_lim LONGTEXT CHARACTER SET utf8mb4;
  DECLARE v_max_payload, v_max_headers, v_max_ahead, v_window BIGINT;
  DECLARE v_body, v_bare, v_headers, v_values, v_tokens LONGTEXT CHARACTER SET utf8mb4 DEFAULT NULL;
  DECLARE v_delay BIGINT DEFAULT IFNULL(p_delay_ms, 0);
  DECLARE v_priority INT DEFAULT IFNULL(p_priority, 0);
  DECLARE v_now, v_due, v_seq, v_head, v_saved_id BIGINT;
  DECLARE v_heads INT;
  DECLARE v_state TINYINT;
  DECLARE v_mode VARCHAR(32) CHARACTER SET utf8mb4;
  DECLARE v_blocked BOOLEAN DEFAULT NULL;
  DECLARE v_replay BOOLEAN DEFAULT FALSE;
  DECLARE v_rand, v_ts VARCHAR(32) CHARACTER SET ascii;
  DECLARE v_id CHAR(36) CHARACTER SET ascii;
  DECLARE v_fp, v_found_fp, v_found_id VARCHAR(64) CHARACTER SET ascii;
  DECLARE v_msg VARCHAR(512) CHARACTER SET utf8mb4;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    IF v_own THEN
      ROLLBACK;
    END IF;
    RESIGNAL;
  END;

  -- A JSON string with only the escapes serde_json reads ((?-i): case matters whatever
  -- the collation).
  SET v_string = CONCAT('(?-i)"([^"', v_bs, v_bs, ']++|', v_bs, v_bs, '["', v_bs, v_bs,
                        '/bfnrt]|', v_bs, v_bs, 'u[0-9a-fA-F]{4})*+"');

  IF p_queue IS NULL OR OCTET_LENGTH(p_queue) NOT BETWEEN 1 AND 128
     OR CHAR_LENGTH(p_queue) <> OCTET_LENGTH(p_queue) OR LOCATE(CHAR(10), p_queue) > 0
     OR p_queue NOT REGEXP '^[A-Za-z0-9._:-]+$' THEN
    SET v_msg = CONCAT('redrive_publish: queue ', IFNULL(QUOTE(LEFT(p_queue, 40)), 'NULL'),
                       ': must be 1 to 128 of A-Z a-z 0-9 . _ : -');
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_msg;
  END IF;
  IF p_payload IS NULL THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
      'redrive_publish: payload: missing (any JSON text; ''null'' is a payload, SQL NULL is not)';
  END IF;
  IF v_priority NOT BETWEEN 0 AND 9 THEN
    SET v_msg = CONCAT('redrive_publish: priority: ', v_priority, ' is not in 0..=9');
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_msg;
  END IF;
  IF p_key IS NOT NULL AND CHAR_LENGTH(p_key) NOT BETWEEN 1 AND 512 THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'redrive_publish: key: must have 1 to 512 characters';
  END IF;
  IF p_idempotency_key IS NOT NULL AND CHAR_LENGTH(p_idempotency_key) NOT BETWEEN 1 AND 512 THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
      'redrive_publish: idempotency_key: must have 1 to 512 characters';
  END IF;

  SET v_lim = (SELECT v FROM meta WHERE k = 'sql_publish');
  IF v_lim IS NULL THEN
    SIGNAL SQLSTATE '55000' SET MESSAGE_TEXT =
      'redrive_publish: no redrive server has opened this database since schema v4 (no limits recorded)';
  END IF;
  SET v_max_payload = CAST(JSON_EXTRACT(v_lim, '$.max_payload_bytes') AS SIGNED);
  SET v_max_headers = CAST(JSON_EXTRACT(v_lim, '$.max_header_bytes') AS SIGNED);
  SET v_max_ahead = CAST(JSON_EXTRACT(v_lim, '$.max_schedule_ahead_ms') AS SIGNED);
  SET v_window = CAST(JSON_EXTRACT(v_lim, '$.idempotency_window_ms') AS SIGNED);

  IF NOT JSON_VALID(p_payload) THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
      'redrive_publish: payload: not valid JSON (or nested more deeply than the server reads)';
  END IF;
  SET v_body = %COMPACT_PAYLOAD%;
  IF OCTET_LENGTH(v_body) > v_max_payload THEN
    SET v_msg = CONCAT('redrive_publish: payload: ', OCTET_LENGTH(v_body), ' bytes, the limit is ',
                       v_max_payload, ' (max_payload_bytes)');
    SIGNAL SQLSTATE '54000' SET MESSAGE_TEXT = v_msg;
  END IF;
  -- What the server's JSON reader (serde_json) reads, which is stricter than JSON_VALID:
  -- with the strings taken out, every number is -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?
  -- and below 1e308; what is left is punctuation.
  SET v_bare = REGEXP_REPLACE(v_body, v_string, '""');
  SET v_tokens = REGEXP_REPLACE(REGEXP_REPLACE(v_bare,
                   '(?-i)-?(0|[1-9][0-9]*)([.][0-9]+)?([eE][-+]?[0-9]+)?', '0'),
                   '(?-i)true|false|null', '0');
  IF v_tokens REGEXP CONCAT('[^', v_bs, '[', v_bs, ']{}:,"0[:space:]]|0[[:space:]]*0')
     OR %BIG_NUMBERS% THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
      'redrive_publish: payload: a number or a string escape redrive cannot read (numbers must be below 1e308)';
  END IF;

  IF v_delay < 0 THEN
    SET v_msg = CONCAT('redrive_publish: delay_ms: ', v_delay, ' is negative');
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_msg;
  END IF;
  IF v_delay > v_max_ahead THEN
    SET v_msg = CONCAT('redrive_publish: delay_ms: ', v_delay, ' is more than ', v_max_ahead,
                       ' ms ahead (max_schedule_ahead)');
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_msg;
  END IF;

  IF p_headers IS NOT NULL THEN
    IF NOT JSON_VALID(p_headers) OR NOT (
         JSON_TYPE(p_headers) IN ('OBJECT', 'NULL')
         OR (JSON_TYPE(p_headers) = 'ARRAY' AND JSON_LENGTH(p_headers) = 0)) THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'redrive_publish: headers: must be an object of strings, e.g. {"trace-id": "abc"}';
    END IF;
    IF JSON_TYPE(p_headers) = 'OBJECT' AND JSON_LENGTH(p_headers) > 0 THEN
      SET v_values = REGEXP_REPLACE(JSON_EXTRACT(p_headers, '$.*'), v_string, '""');
      SET v_headers = %COMPACT_HEADERS%;
      IF v_values NOT REGEXP CONCAT('^', v_bs, '[[[:space:]]*""[[:space:]]*(,[[:space:]]*""[[:space:]]*)*', v_bs, ']$')
         OR REGEXP_REPLACE(v_headers, v_string, '""')
              REGEXP CONCAT('[^', v_bs, '[', v_bs, ']{}:,"[:space:]]') THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
          'redrive_publish: headers: must be an object of strings, e.g. {"trace-id": "abc"}';
      END IF;
      IF OCTET_LENGTH(v_headers) > v_max_headers THEN
        SET v_msg = CONCAT('redrive_publish: headers: ', OCTET_LENGTH(v_headers),
                           ' bytes of JSON, the limit is ', v_max_headers, ' (max_header_bytes)');
        SIGNAL SQLSTATE '54000' SET MESSAGE_TEXT = v_msg;
      END IF;
    END IF;
  END IF;

  -- Everything is checked: from here on, the writes.
  IF v_own THEN
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
  END IF;
  SET v_saved_id = LAST_INSERT_ID();
  SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;
  -- A UUIDv7 of the database's clock, as the server's ids (its random bits from MD5 of a
  -- UUID(), unique on this server, and RAND()).
  SET v_rand = MD5(CONCAT(UUID(), RAND(), CONNECTION_ID()));
  SET v_ts = LPAD(LOWER(HEX(v_now)), 12, '0');
  SET v_id = CONCAT(SUBSTR(v_ts, 1, 8), '-', SUBSTR(v_ts, 9, 4), '-7', SUBSTR(v_rand, 1, 3), '-',
                    LOWER(HEX(8 + (CONV(SUBSTR(v_rand, 4, 1), 16, 10) & 3))),
                    SUBSTR(v_rand, 5, 3), '-', SUBSTR(v_rand, 8, 12));

  -- The queue's ordering, as the server that opened the database last recorded it.
  SET v_mode = COALESCE(
    (SELECT JSON_UNQUOTE(JSON_EXTRACT(v, CONCAT('$.queues."', p_queue, '"')))
       FROM meta WHERE k = 'key_order_modes'),
    (SELECT JSON_UNQUOTE(JSON_EXTRACT(v, '$.default')) FROM meta WHERE k = 'key_order_modes'),
    'unordered');
  IF p_key IS NOT NULL AND v_mode <> 'unordered' THEN
    -- The key's lock point first (the order every writer locks in: key_order.rs), and its
    -- recorded head: the oldest message taking part in the key's order, if any.
    SET v_blocked = TRUE;
    SELECT COUNT(*), MAX(head_seq) INTO v_heads, v_head FROM key_heads
      WHERE queue = p_queue AND msg_key = p_key FOR UPDATE;
    IF v_heads = 0 THEN
      INSERT INTO key_heads (queue, msg_key) VALUES (p_queue, p_key)
        ON DUPLICATE KEY UPDATE head_seq = head_seq;
      SELECT COUNT(*), MAX(head_seq) INTO v_heads, v_head FROM key_heads
        WHERE queue = p_queue AND msg_key = p_key FOR UPDATE;
    END IF;
  END IF;

  IF p_idempotency_key IS NOT NULL THEN
    -- Claim the key (a concurrent publish of it, either path, waits here for the other's
    -- commit), then read who holds it.
    SET v_fp = %FINGERPRINT%;
    INSERT INTO idempotency (queue, ikey, message_id, fingerprint, expires_at)
      VALUES (p_queue, p_idempotency_key, v_id, v_fp, v_now + v_window)
      ON DUPLICATE KEY UPDATE
        message_id = IF(expires_at <= v_now, VALUES(message_id), message_id),
        fingerprint = IF(expires_at <= v_now, VALUES(fingerprint), fingerprint),
        tombstone = IF(expires_at <= v_now, NULL, tombstone),
        expires_at = IF(expires_at <= v_now, VALUES(expires_at), expires_at);
    SELECT message_id, fingerprint INTO v_found_id, v_found_fp FROM idempotency
      WHERE queue = p_queue AND ikey = p_idempotency_key FOR UPDATE;
    IF v_found_id <> v_id THEN
      IF LOCATE(':', v_found_fp) = 0 THEN
        SET v_msg = CONCAT('redrive_publish: idempotency_key ', QUOTE(LEFT(p_idempotency_key, 40)),
                           ': recorded by a redrive before schema v4; publish it over HTTP');
        SIGNAL SQLSTATE '55000' SET MESSAGE_TEXT = v_msg;
      END IF;
      IF v_found_fp <> v_fp THEN
        SET v_msg = CONCAT('redrive_publish: idempotency_key ', QUOTE(LEFT(p_idempotency_key, 40)),
                           ': already used in queue ', LEFT(p_queue, 40), ' with another payload');
        SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = v_msg;
      END IF;
      SET v_replay = TRUE;
      SET p_message_id = v_found_id;
    END IF;
  END IF;

  IF NOT v_replay THEN
    SET v_due = v_now + v_delay;
    SET v_state = IF(v_delay > 0, 0, 1);
    IF v_blocked AND v_head IS NULL THEN
      -- Nothing older takes part in the key's order, and so none of it is leased: this
      -- message is the key's head.
      SET v_blocked = FALSE;
    END IF;
    INSERT INTO messages (id, queue, state, priority, due_at, msg_key, idempotency_key, payload,
                          headers, attempts, uncounted, created_at, updated_at, key_blocked)
      VALUES (v_id, p_queue, v_state, v_priority, v_due, p_key, p_idempotency_key, v_body,
              v_headers, 0, 0, v_now, v_now, v_blocked);
    SET v_seq = LAST_INSERT_ID();
    IF v_state = 1 AND v_blocked IS NOT TRUE THEN
      -- Leasable now; node 0 is no store's, so every store's poller tells its long polls.
      INSERT INTO ready (seq, queue, rnk, due_at, size, node)
        VALUES (v_seq, p_queue, 255 - v_priority, v_due,
                OCTET_LENGTH(v_body) + IFNULL(OCTET_LENGTH(v_headers), 0)
                  + IFNULL(OCTET_LENGTH(p_key), 0), 0);
    END IF;
    IF v_blocked IS FALSE THEN
      UPDATE key_heads SET head_seq = v_seq WHERE queue = p_queue AND msg_key = p_key;
    END IF;
    -- The caller's LAST_INSERT_ID() is its own again.
    DO LAST_INSERT_ID(v_saved_id);
    SET p_message_id = v_id;
  END IF;
  IF v_own THEN
    COMMIT;
  END IF;
END"#;

/// The procedure answering the id as a one-row result set.
const PUBLISH: &str = r#"CREATE PROCEDURE redrive_publish(
  IN p_queue TEXT CHARACTER SET utf8mb4,
  IN p_payload LONGTEXT CHARACTER SET utf8mb4,
  IN p_key TEXT CHARACTER SET utf8mb4,
  IN p_idempotency_key TEXT CHARACTER SET utf8mb4,
  IN p_delay_ms BIGINT,
  IN p_priority INT,
  IN p_headers LONGTEXT CHARACTER SET utf8mb4
)
MODIFIES SQL DATA
SQL SECURITY DEFINER
COMMENT 'redrive: publish a message in the caller''s transaction; answers its id as a row'
BEGIN
  DECLARE v_id CHAR(36) CHARACTER SET ascii;
  CALL redrive_publish_out(p_queue, p_payload, p_key, p_idempotency_key, p_delay_ms, p_priority,
                           p_headers, v_id);
  SELECT v_id AS message_id;
END"#;
