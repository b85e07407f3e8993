//! `redrive import` (issue 18) with the real binary, against a running server and the local
//! MariaDB / MySQL (`REDRIVE_TEST_MYSQL_URL`, default `mysql://root@127.0.0.1:3306`): a
//! `msg_retry` table made from the seed's DDL, a dry run that counts and publishes nothing,
//! an import (pending rows scheduled at their `next_retry_at` with their `fail_times`,
//! dead rows dead letters, done rows absent, a bad topic listed), a second run that imports
//! nothing twice (and a third that imports only a new row), the column flags on a table of
//! other names, and bad flags refused by name with nothing published. The source table is
//! the same after every run (`CHECKSUM TABLE`).
//!
//! Each test has a database `redrive_import_<random>` of its own, dropped after. Without a
//! reachable MySQL the test says so and passes, except under CI (`CI=true`): there it fails.

mod common;

use common::{free_port, start, wait_ready};
use mysql_async::prelude::Queryable;
use redrive_client::{Client, Filter};
use redrive_core::{Message, State, Timestamp};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::{Command, Output};

/// The server's policy: 5 attempts in all, on every queue.
const CONFIG: &str = r#"
[queues.default.retry]
max_attempts = 5
backoff = "fixed"
initial_delay = "1s"
jitter = "none"
"#;

/// The brief's DDL of the seeds' table.
const MSG_RETRY_DDL: &str = "CREATE TABLE msg_retry (
  id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
  topic VARCHAR(128) NOT NULL,
  payload JSON NOT NULL,
  fail_times INT NOT NULL DEFAULT 0,
  next_retry_at DATETIME NOT NULL,
  status ENUM('pending','done','dead') NOT NULL DEFAULT 'pending',
  created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
  KEY idx_status_next (status, next_retry_at)
)";

/// Shanghai time: the table's DATETIMEs are written at +08:00, as the seeds' teams do.
const SHANGHAI_MS: i64 = 8 * 3_600_000;

fn server_url() -> String {
    std::env::var("REDRIVE_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned())
}

/// `base` (any path or query dropped) with database `db`.
fn url_of(db: &str) -> String {
    let base = server_url();
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => &base[..],
    };
    format!("{host}/{db}")
}

/// A test's database, dropped when this is (on a thread of its own, so also from a
/// failing test inside a runtime).
struct Db {
    name: String,
    url: String,
}

impl Drop for Db {
    fn drop(&mut self) {
        let (url, name) = (url_of("mysql"), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                if let Ok(mut c) = mysql_async::Conn::from_url(url).await {
                    let _ = c
                        .query_drop(format!("DROP DATABASE IF EXISTS `{name}`"))
                        .await;
                    let _ = c.disconnect().await;
                }
            });
        })
        .join();
    }
}

/// A fresh database, or `None` (the test passes, saying why) when MySQL is not there
/// outside CI.
async fn fresh_db() -> Option<(Db, mysql_async::Conn)> {
    let admin = url_of("mysql");
    let mut c = match mysql_async::Conn::from_url(admin.clone()).await {
        Ok(c) => c,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("MySQL at {admin} is not reachable under CI: {e}")
        }
        Err(e) => {
            eprintln!(
                "skipped: MySQL at {admin} is not reachable ({e}); set REDRIVE_TEST_MYSQL_URL"
            );
            return None;
        }
    };
    let n = common::unique_number();
    let name = format!("redrive_import_{n:016x}");
    c.query_drop(format!("CREATE DATABASE `{name}`"))
        .await
        .expect("create the test database");
    c.disconnect().await.ok();
    let db = Db {
        url: url_of(&name),
        name,
    };
    let conn = mysql_async::Conn::from_url(db.url.clone())
        .await
        .expect("connect to the test database");
    Some((db, conn))
}

/// A UTC time as a DATETIME literal at +08:00.
fn shanghai(t: Timestamp) -> String {
    let local = Timestamp::from_millis(t.as_millis() + SHANGHAI_MS).to_rfc3339();
    local[..19].replace('T', " ")
}

fn redrive(server: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redrive"))
        .arg("--server")
        .arg(server)
        .args(args)
        .env_remove("REDRIVE_TOKEN")
        .env_remove("REDRIVE_IMPORT_FROM")
        .output()
        .expect("run redrive")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("not JSON: {}", text(o)))
}

/// Every message of the server, by idempotency key.
async fn messages(api: &Client) -> BTreeMap<String, Message> {
    let mut out = BTreeMap::new();
    let mut cursor = None;
    loop {
        let page = api
            .search(&Filter::default(), Some(1000), cursor.as_deref())
            .await
            .expect("search");
        for m in page.messages {
            let key = m
                .idempotency_key
                .clone()
                .expect("an imported message has its key");
            assert!(out.insert(key, m).is_none(), "two messages with one key");
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

/// `CHECKSUM TABLE t`: the same before and after means the import wrote nothing.
async fn checksum(c: &mut mysql_async::Conn, table: &str) -> Option<u64> {
    let row: Option<(String, Option<u64>)> = c
        .query_first(format!("CHECKSUM TABLE `{table}`"))
        .await
        .expect("checksum");
    row.and_then(|r| r.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_a_msg_retry_table_once() {
    let Some((db, mut sql)) = fresh_db().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), free_port(), CONFIG);
    assert!(wait_ready(&reqwest::Client::new(), &mut node).await);
    let s = node.base.clone();
    let api = Client::new(&s).unwrap();

    sql.query_drop(MSG_RETRY_DDL).await.expect("the seed's DDL");
    let now = Timestamp::from_millis(Timestamp::now().as_millis() / 1000 * 1000);
    let later = |secs: i64| Timestamp::from_millis(now.as_millis() + secs * 1000);
    // (id, topic, payload, fail_times, next_retry_at, status)
    let rows: Vec<(u64, &str, Value, i64, Timestamp, &str)> = vec![
        (
            1,
            "order.paid",
            json!({"order": 1, "amount": 9.5}),
            2,
            later(3600),
            "pending",
        ),
        (
            2,
            "order.paid",
            json!({"order": 2}),
            0,
            later(-3600),
            "pending",
        ),
        (
            3,
            "sms.send",
            json!({"to": "13800000000", "text": "重试"}),
            1,
            later(7200),
            "pending",
        ),
        (
            4,
            "sms.send",
            json!([1, "two", null]),
            4,
            later(-600),
            "pending",
        ),
        (
            5,
            "order.paid",
            json!({"order": 5}),
            5,
            later(600),
            "pending",
        ),
        (
            6,
            "order.paid",
            json!({"order": 6}),
            6,
            later(-86_400),
            "dead",
        ),
        (7, "sms.send", json!("just a string"), 3, later(-60), "dead"),
        (8, "order.paid", json!({"order": 8}), 1, later(-60), "done"),
        (9, "sms.send", json!({"n": 9}), 0, later(-60), "done"),
        (10, "bad topic", json!({"n": 10}), 1, later(60), "pending"),
    ];
    for (id, topic, payload, fail_times, at, status) in &rows {
        sql.exec_drop(
            "INSERT INTO msg_retry (id, topic, payload, fail_times, next_retry_at, status) VALUES (?, ?, ?, ?, ?, ?)",
            (id, topic, payload.to_string(), fail_times, shanghai(*at), status),
        )
        .await
        .expect("insert");
    }
    let before = checksum(&mut sql, "msg_retry").await;
    let from = db.url.clone();
    let import = |extra: &[&str]| {
        let mut args = vec!["import", "--from", &from, "--timezone-offset", "+08:00"];
        args.extend_from_slice(extra);
        redrive(&s, &args)
    };

    // A dry run counts, per queue, with what the policy (5 attempts) makes of each row,
    // and publishes nothing; the bad topic fails its row, so it exits 1.
    let o = import(&["--dry-run", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let d = json_of(&o);
    assert_eq!(d["dry_run"], true, "{d}");
    assert_eq!(d["rows"], 10, "{d}");
    assert_eq!(d["done_skipped"], 2, "{d}");
    assert_eq!(d["invalid"], 1, "{d}");
    assert_eq!(d["published"], 7, "what would be published: {d}");
    let counts = |v: &Value, q: &str| {
        let c = &v["queues"][q];
        [
            &c["scheduled"],
            &c["ready"],
            &c["pending_dead"],
            &c["dead"],
            &c["already_imported"],
            &c["failed"],
        ]
        .map(|n| n.as_u64().unwrap_or_else(|| panic!("{q}: {v}")))
    };
    assert_eq!(counts(&d, "order.paid"), [1, 1, 1, 1, 0, 0], "{d}");
    assert_eq!(counts(&d, "sms.send"), [1, 1, 0, 1, 0, 0], "{d}");
    assert_eq!(d["errors"][0]["id"], "10", "{d}");
    assert!(
        d["errors"][0]["error"]
            .as_str()
            .unwrap()
            .contains("\"bad topic\" is not a queue name"),
        "{d}"
    );
    let o = import(&["--dry-run"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("dry run: nothing published. 10 rows of `msg_retry`"),
        "{}",
        text(&o)
    );
    assert!(
        out.contains(
            "pending but out of attempts by the queue's policy: 1, they would be dead letters"
        ),
        "{}",
        text(&o)
    );
    assert!(out.contains("done rows skipped: 2\n"), "{}", text(&o));
    assert!(
        out.contains("  row 10: topic \"bad topic\""),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("1 row would not be imported"),
        "{}",
        text(&o)
    );
    assert!(messages(&api).await.is_empty(), "a dry run published");

    // The import: what the dry run said.
    let o = import(&["--json"]);
    assert_eq!(o.status.code(), Some(1), "the bad topic: {}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["dry_run"], false, "{r}");
    assert_eq!(r["published"], 7, "{r}");
    assert_eq!(r["already_imported"], 0, "{r}");
    assert_eq!(counts(&r, "order.paid"), [1, 1, 1, 1, 0, 0], "{r}");
    assert_eq!(counts(&r, "sms.send"), [1, 1, 0, 1, 0, 0], "{r}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("1 row was not imported (1 invalid, 0 refused"),
        "{}",
        text(&o)
    );
    let got = messages(&api).await;
    assert_eq!(
        got.len(),
        7,
        "done rows and the bad topic are absent: {got:?}"
    );
    let by_row = |id: u64| {
        got.get(&format!("import:msg_retry:{id}"))
            .unwrap_or_else(|| panic!("row {id} is missing: {got:?}"))
    };
    for (id, topic, payload, fail_times, at, status) in &rows {
        if *status == "done" || *id == 10 {
            continue;
        }
        let m = by_row(*id);
        assert_eq!(&m.queue, topic, "row {id}");
        assert_eq!(&m.payload, payload, "row {id}: the payload as is");
        let attempts = if *status == "dead" {
            (*fail_times).max(1)
        } else {
            *fail_times
        };
        assert_eq!(i64::from(m.attempts), attempts, "row {id}: {m:?}");
        match (*status, *id) {
            ("pending", 5) => {
                assert_eq!(m.state, State::Dead, "out of attempts: {m:?}");
                assert_eq!(m.dead_reason.map(|r| r.as_str()), Some("max_attempts"));
            }
            ("pending", _) if *at > now => {
                assert_eq!(m.state, State::Scheduled, "row {id}: {m:?}");
                assert_eq!(
                    m.due_at,
                    Some(*at),
                    "row {id}: due at next_retry_at (+08:00 read right)"
                );
            }
            ("pending", _) => {
                assert_eq!(
                    m.state,
                    State::Ready,
                    "row {id}: due in the past is due now: {m:?}"
                );
                assert!(m.due_at.is_some_and(|d| d >= now), "row {id}: {m:?}");
            }
            _ => {
                assert_eq!(m.state, State::Dead, "row {id}: {m:?}");
                assert_eq!(m.dead_reason.map(|r| r.as_str()), Some("permanent_error"));
                let e = m.last_error.as_ref().and_then(|e| e.message.clone());
                assert_eq!(
                    e.as_deref(),
                    Some(
                        format!("imported from msg_retry row {id}: dead after {fail_times} tries")
                            .as_str()
                    ),
                    "{m:?}"
                );
            }
        }
        if *status == "pending" && *fail_times >= 1 {
            let e = m.last_error.as_ref().and_then(|e| e.message.clone());
            assert_eq!(
                e.as_deref(),
                Some(
                    format!("imported from msg_retry row {id} (fail_times {fail_times})").as_str()
                ),
                "{m:?}"
            );
        }
        if *fail_times == 0 && *status == "pending" {
            assert!(m.last_error.is_none(), "never failed: {m:?}");
        }
    }
    // Row 4 (4 of 5 attempts made) is leased as its last try.
    let leased = api
        .lease(
            "sms.send",
            &redrive_client::LeaseRequest {
                max: Some(10),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "{leased:?}");
    assert_eq!(leased[0].id, by_row(4).id);
    assert_eq!(leased[0].attempt, 5);
    assert_eq!(leased[0].max_attempts, 5);

    // Again: nothing new, every row already imported.
    let o = import(&["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let again = json_of(&o);
    assert_eq!(again["published"], 0, "{again}");
    assert_eq!(again["already_imported"], 7, "{again}");
    assert_eq!(counts(&again, "order.paid"), [0, 0, 0, 0, 4, 0], "{again}");
    assert_eq!(messages(&api).await.len(), 7);
    let o = import(&[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("0 messages published, 7 already imported"),
        "{}",
        text(&o)
    );

    // A row added since: only it is new (a batch of replays and one new message).
    sql.exec_drop(
        "INSERT INTO msg_retry (id, topic, payload, fail_times, next_retry_at, status) VALUES (11, 'order.paid', '{\"order\": 11}', 1, ?, 'pending')",
        (shanghai(later(1800)),),
    )
    .await
    .unwrap();
    let with_new = checksum(&mut sql, "msg_retry").await;
    let o = import(&["--json"]);
    let third = json_of(&o);
    assert_eq!(third["published"], 1, "{third}");
    assert_eq!(third["already_imported"], 7, "{third}");
    assert_eq!(counts(&third, "order.paid"), [1, 0, 0, 0, 4, 0], "{third}");
    let got = messages(&api).await;
    assert_eq!(got.len(), 8);
    assert_eq!(got["import:msg_retry:11"].due_at, Some(later(1800)));

    // Bad flags: refused by name, exit 2, nothing published.
    for (args, flag) in [
        (
            &["--topic-column", "topic; DROP TABLE msg_retry"][..],
            "--topic-column",
        ),
        (
            &["--fail-times-column", "retries"][..],
            "--fail-times-column",
        ),
        (&["--table", "msg_retry_nope"][..], "--table"),
        (&["--id-column", "topic"][..], "--id-column"),
        (&["--queue", "no spaces please"][..], "--queue"),
        (&["--timezone-offset", "+25:00"][..], "--timezone-offset"),
        (&["--batch", "0"][..], "--batch"),
        (&["--dead-value", "pending"][..], "--dead-value"),
    ] {
        let o = import(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(flag),
            "{args:?}: {}",
            text(&o)
        );
    }
    let o = redrive(&s, &["import", "--from", "postgres://root@127.0.0.1/x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--from"),
        "{}",
        text(&o)
    );
    assert_eq!(messages(&api).await.len(), 8, "a refused run published");
    assert_eq!(
        checksum(&mut sql, "msg_retry").await,
        with_new,
        "the import wrote to its source"
    );
    assert_ne!(before, with_new, "the checksum sees a change");
    drop(sql);
    drop(db);
}

/// The column flags: a table of other names (an INT Unix-seconds time, a TINYINT status,
/// a TEXT payload), everything into one queue with --queue, in batches of 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_flags_map_a_table_of_other_names() {
    let Some((db, mut sql)) = fresh_db().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), free_port(), CONFIG);
    assert!(wait_ready(&reqwest::Client::new(), &mut node).await);
    let s = node.base.clone();
    let api = Client::new(&s).unwrap();
    sql.query_drop(
        "CREATE TABLE legacy_jobs (
           job_id INT NOT NULL PRIMARY KEY,
           channel VARCHAR(64) NOT NULL DEFAULT '',
           body TEXT NOT NULL,
           retries TINYINT UNSIGNED NOT NULL DEFAULT 0,
           retry_at INT UNSIGNED NOT NULL,
           state TINYINT NOT NULL DEFAULT 0
         )",
    )
    .await
    .unwrap();
    let now = Timestamp::now().as_millis() / 1000;
    // state: 0 pending, 1 done, 2 dead; channel '' would be no queue, but --queue is given.
    for (id, body, retries, at, state) in [
        (100, r#"{"job": 100}"#, 1, now + 900, 0),
        (101, r#"{"job": 101}"#, 0, now + 60, 0),
        (102, r#"{"job": 102}"#, 2, now - 60, 0),
        (103, r#"{"job": 103}"#, 7, now, 2),
        (104, r#"{"job": 104}"#, 1, now, 1),
    ] {
        sql.exec_drop(
            "INSERT INTO legacy_jobs (job_id, body, retries, retry_at, state) VALUES (?, ?, ?, ?, ?)",
            (id, body, retries, at, state),
        )
        .await
        .unwrap();
    }
    let args = [
        "import",
        "--from",
        &db.url,
        "--table",
        "legacy_jobs",
        "--queue",
        "legacy",
        "--id-column",
        "job_id",
        "--topic-column",
        "channel",
        "--payload-column",
        "body",
        "--fail-times-column",
        "retries",
        "--next-retry-column",
        "retry_at",
        "--status-column",
        "state",
        "--pending-value",
        "0",
        "--done-value",
        "1",
        "--dead-value",
        "2",
        "--batch",
        "2",
        "--json",
    ];
    let o = redrive(&s, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json_of(&o);
    assert_eq!(r["published"], 4, "{r}");
    assert_eq!(r["done_skipped"], 1, "{r}");
    assert_eq!(
        r["queues"]["legacy"],
        json!({"scheduled": 2, "ready": 1, "pending_dead": 0, "dead": 1, "already_imported": 0, "failed": 0}),
        "{r}"
    );
    let got = messages(&api).await;
    assert_eq!(got.len(), 4, "{got:?}");
    let m = &got["import:legacy_jobs:100"];
    assert_eq!(m.queue, "legacy");
    assert_eq!(m.payload, json!({"job": 100}));
    assert_eq!(m.attempts, 1);
    assert_eq!(m.state, State::Scheduled);
    assert_eq!(
        m.due_at,
        Some(Timestamp::from_millis((now + 900) * 1000)),
        "Unix seconds"
    );
    assert_eq!(got["import:legacy_jobs:101"].attempts, 0);
    assert_eq!(got["import:legacy_jobs:102"].state, State::Ready);
    let dead = &got["import:legacy_jobs:103"];
    assert_eq!((dead.state, dead.attempts), (State::Dead, 7));
    // Again, in batches of 2: all replays.
    let o = redrive(&s, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let again = json_of(&o);
    assert_eq!(
        (
            again["published"].as_u64(),
            again["already_imported"].as_u64()
        ),
        (Some(0), Some(4)),
        "{again}"
    );
    assert_eq!(messages(&api).await.len(), 4);
    drop(sql);
    drop(db);
}
