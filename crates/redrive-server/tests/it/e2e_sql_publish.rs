//! Transactional enqueue through a live server on PostgreSQL (issue 16 §3), with the PHP PDO
//! example of the consumer guide (`examples/pdo_publish.php`, php-cli + php-pgsql): a
//! publish committed with the application's own row is delivered, and wakes a long poll
//! that was waiting on its queue before the commit; a rolled-back one leaves neither the
//! row nor the message; the idempotency key it used answers the same message over HTTP.
//!
//! Always on PostgreSQL (the local one, or `REDRIVE_TEST_STORAGE_URL`). Skipped, saying
//! why, without php-pgsql; a failure under `CI=true`.

use crate::harness::{psql, TestServer};
use serde_json::json;
use std::time::{Duration, Instant};

/// Whether php-cli with pdo_pgsql is here; under CI it must be.
fn php_pgsql_ready() -> bool {
    crate::harness::php_has(
        "echo extension_loaded('pdo_pgsql') ? 'ok' : 'missing';",
        "php-cli with pdo_pgsql (Debian: php-cli php-pgsql)",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdo_transaction_publishes_on_commit_and_nothing_on_rollback() {
    if !php_pgsql_ready() {
        return;
    }
    let s = TestServer::start_on_postgres("").await;
    let pg = s.pg.as_ref().expect("on PostgreSQL");
    let (url, schema) = (pg.url.clone(), pg.schema.clone());

    // A long poll waiting on the queue before anything is published.
    let waiter = {
        let (client, base) = (s.client.clone(), s.url("/v1/queues/order-paid/leases"));
        tokio::spawn(async move {
            let r = client
                .post(base)
                .json(&json!({"max": 10, "wait": "20s"}))
                .send()
                .await
                .unwrap();
            let answered = Instant::now();
            (r.json::<serde_json::Value>().await.unwrap(), answered)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/pdo_publish.php"
    );
    let php_started = Instant::now();
    let out = tokio::process::Command::new("php")
        .arg(script)
        .env(
            "PG_DSN",
            "pgsql:host=127.0.0.1;port=5432;dbname=test;user=root",
        )
        .env("REDRIVE_SCHEMA", &schema)
        .env("APP_SCHEMA", &schema)
        .env("ORDER", "42")
        .output()
        .await
        .expect("run php examples/pdo_publish.php");
    let php_done = Instant::now();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("committed order 42: message "))
        .unwrap_or_else(|| panic!("no committed line in {text}"))
        .to_owned();
    assert!(
        text.contains("refused: 22023 ERROR:  redrive.publish: priority: 12 is not in 0..=9"),
        "{text}"
    );

    // The long poll (20 s) woke with the committed message by the commit's notice: it has
    // no timer of its own that would answer it sooner.
    let (answer, answered) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the long poll did not wake")
        .unwrap();
    let woke_after = answered.saturating_duration_since(php_done);
    assert!(
        woke_after < Duration::from_secs(1),
        "the long poll answered {woke_after:?} after php exited"
    );
    let got = answer["messages"].as_array().expect("messages").clone();
    assert_eq!(got.len(), 1, "{answer}");
    assert_eq!(got[0]["id"], id.as_str());
    assert_eq!(got[0]["payload"], json!({"order": 42, "total": "99.50"}));
    assert_eq!(got[0]["key"], "customer-42");
    println!(
        "sql publish: php ran {:?} (connect, 2 transactions, a refusal); the long poll answered \
         {:?} after php started",
        php_done - php_started,
        answered.saturating_duration_since(php_started)
    );

    // The rolled-back order left nothing: no row, no message, its key is free.
    assert_eq!(
        psql(
            &url,
            &format!("SELECT string_agg(id::text, ',') FROM {schema}.shop_orders")
        ),
        "42"
    );
    let (st, found) = s.get("/v1/messages?queue=order-paid").await;
    assert_eq!(st, 200, "{found}");
    assert_eq!(
        found["messages"].as_array().map(Vec::len),
        Some(1),
        "{found}"
    );

    // The key the function used is the HTTP publish's too: the same payload replays the
    // message, another is a conflict.
    let (st, replay) = s
        .post(
            "/v1/queues/order-paid/messages",
            json!({"payload": {"total": "99.50", "order": 42}, "idempotency_key": "order-42-paid"}),
        )
        .await;
    assert_eq!(st, 200, "{replay}");
    assert_eq!(replay["id"], id.as_str());
    let (st, conflict) = s
        .post(
            "/v1/queues/order-paid/messages",
            json!({"payload": {"order": 43}, "idempotency_key": "order-42-paid"}),
        )
        .await;
    assert_eq!(st, 409, "{conflict}");
    let (st, fresh) = s
        .post(
            "/v1/queues/order-paid/messages",
            json!({"payload": {"order": 43}, "idempotency_key": "order-43-paid"}),
        )
        .await;
    assert_eq!(st, 201, "the rolled-back publish kept its key: {fresh}");
}
