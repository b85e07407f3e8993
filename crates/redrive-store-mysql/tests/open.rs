//! Opening the MySQL / MariaDB store: migrations from an empty database (twice, and two
//! opens at once), a newer schema refused (at open, and by a running store once a newer node
//! migrated it), bad URLs refused naming the problem, an
//! unreachable server is `Unavailable`, sessions at READ COMMITTED, the durability check,
//! the database's clock when no time is given; and a deadlock-prone concurrent workload
//! that finishes with no error, counting the deadlocks it retried.

mod common;

use redrive_core::{NewMessage, State, Timestamp};
use redrive_storage::conformance::shared::refuses_every_call_once_a_newer_node_migrated;
use redrive_storage::conformance::{Setup, ORDERED, Q};
use redrive_storage::{Ack, LeaseRef, LeaseRequest, Store, StoreError};
use redrive_store_mysql::{MysqlOptions, MysqlStore, SCHEMA_VERSION};
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PREFIX: &str = "open";

fn one(sql: String) -> String {
    common::run_blocking(sql)
        .into_iter()
        .next()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_database_is_migrated_once_even_by_two_opens_at_once() {
    let guard = common::fresh_database(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    let (a, b) = tokio::join!(
        MysqlStore::open(opts.clone()),
        MysqlStore::open(opts.clone())
    );
    let (a, b) = (a.expect("first open"), b.expect("second open"));
    a.publish(
        vec![NewMessage::new(Q, json!(1))],
        Some(Timestamp::from_millis(1)),
    )
    .await
    .expect("publish");
    a.close().await;
    b.close().await;
    let c = MysqlStore::open(opts).await.expect("reopen");
    let stats = c.queue_stats().await.expect("stats");
    assert_eq!(
        stats[0].count(State::Ready),
        1,
        "the message survived the reopen"
    );
    c.close().await;
    let db = &guard.0;
    assert_eq!(
        one(format!(
            "SELECT CAST(COUNT(*) AS CHAR) FROM `{db}`.schema_migrations"
        )),
        SCHEMA_VERSION.to_string(),
        "each step recorded once"
    );
    for table in [
        "messages",
        "history",
        "ready",
        "idempotency",
        "key_heads",
        "meta",
        "tasks",
        "audit",
        "nodes",
        "leader",
        "endpoint_trips",
        "sessions",
    ] {
        assert_eq!(
            one(format!(
                "SELECT CAST(COUNT(*) AS CHAR) FROM information_schema.tables \
                 WHERE table_schema = '{db}' AND table_name = '{table}' AND engine = 'InnoDB'"
            )),
            "1",
            "table {table}"
        );
    }
}

/// A database of schema step 4 (the generated columns of `messages` VIRTUAL) is upgraded by
/// step 5 to STORED ones, and its messages are where they were: a ready one leased, a
/// scheduled one promoted when due (found through `ix_sched_due`), leases expired (through
/// `ix_leased`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_5_makes_the_generated_columns_stored_and_keeps_the_messages() {
    let guard = common::fresh_database(PREFIX);
    let db = guard.0.clone();
    let opts = common::options(&db, &Setup::default());
    let t0 = Timestamp::from_millis(1_000_000);
    let store = MysqlStore::open(opts.clone()).await.expect("open");
    let mut later = NewMessage::new(Q, json!("later"));
    later.deliver_at = Some(Timestamp::from_millis(t0.as_millis() + 60_000));
    store
        .publish(
            vec![
                NewMessage::new(Q, json!("leased")),
                NewMessage::new(Q, json!("ready")),
                later,
            ],
            Some(t0),
        )
        .await
        .expect("publish");
    let req = |max| LeaseRequest {
        queue: Q.to_owned(),
        max,
        lease_ms: 30_000,
        max_bytes: None,
    };
    assert_eq!(store.lease(req(1), Some(t0)).await.expect("lease").len(), 1);
    store.close().await;
    // Back to step 4, as a database written by the build before this step.
    common::run_blocking(format!(
        "ALTER TABLE `{db}`.messages
  DROP INDEX ix_scheduled, DROP INDEX ix_sched_due, DROP INDEX ix_leased, DROP INDEX ix_done,
  DROP COLUMN sched_queue, DROP COLUMN sched_due, DROP COLUMN lease_due, DROP COLUMN done_at,
  ADD COLUMN sched_queue VARBINARY(128) AS (CASE WHEN state = 0 THEN queue END) VIRTUAL,
  ADD COLUMN sched_due BIGINT AS (CASE WHEN state = 0 THEN due_at END) VIRTUAL,
  ADD COLUMN lease_due BIGINT AS (CASE WHEN state = 2 THEN lease_expires_at END) VIRTUAL,
  ADD COLUMN done_at BIGINT AS (CASE WHEN state = 3 THEN finished_at END) VIRTUAL,
  ADD KEY ix_scheduled (sched_queue, sched_due), ADD KEY ix_sched_due (sched_due),
  ADD KEY ix_leased (lease_due), ADD KEY ix_done (done_at)"
    ));
    common::run_blocking(format!(
        "DELETE FROM `{db}`.schema_migrations WHERE version >= 5"
    ));
    let generated = || {
        one(format!(
            "SELECT GROUP_CONCAT(CONCAT(column_name, ' ', extra) ORDER BY column_name)              FROM information_schema.columns WHERE table_schema = '{db}'              AND table_name = 'messages' AND extra LIKE '%GENERATED%'"
        ))
    };
    assert!(generated().contains("VIRTUAL"), "{}", generated());
    let store = MysqlStore::open(opts).await.expect("open at step 4");
    assert_eq!(
        generated(),
        "done_at STORED GENERATED,lease_due STORED GENERATED,sched_due STORED GENERATED,\
         sched_queue STORED GENERATED"
    );
    let ready = store.lease(req(10), Some(t0)).await.expect("lease");
    assert_eq!(ready.len(), 1, "the ready message");
    assert_eq!(ready[0].message.payload, json!("ready"));
    // Past the lease and the delay: the tick expires the lease (its retry is due 1 s later)
    // and promotes the scheduled one; the next tick promotes the retry.
    let t1 = Timestamp::from_millis(t0.as_millis() + 61_000);
    store.tick(Some(t1)).await.expect("tick");
    let t2 = Timestamp::from_millis(t1.as_millis() + 2_000);
    store.tick(Some(t2)).await.expect("tick");
    let mut back: Vec<String> = store
        .lease(req(10), Some(t2))
        .await
        .expect("lease after the tick")
        .into_iter()
        .map(|l| l.message.payload.to_string())
        .collect();
    back.sort();
    // Both leases (the one before the upgrade and the one after) expired, and the scheduled one.
    assert_eq!(back, ["\"later\"", "\"leased\"", "\"ready\""]);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_naming_both_versions() {
    let guard = common::fresh_database(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    MysqlStore::open(opts.clone())
        .await
        .expect("open")
        .close()
        .await;
    let newer = SCHEMA_VERSION + 41;
    common::run_blocking(format!(
        "INSERT INTO `{}`.schema_migrations (version) VALUES ({newer})",
        guard.0
    ));
    match MysqlStore::open(opts).await {
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains(&newer.to_string()) && text.contains(&SCHEMA_VERSION.to_string()),
                "names both versions: {text}"
            );
            assert!(text.contains("upgrade redrive"), "{text}");
        }
        Ok(_) => panic!("a schema newer than this build was accepted"),
    }
}

/// A newer redrive migrates the database while this store runs (a cluster upgraded node by
/// node, this one not yet): it refuses every call from then on
/// (`conformance::shared::refuses_every_call_once_a_newer_node_migrated`), and nothing it
/// refused was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_upgraded_by_a_newer_node_stops_this_one() {
    let guard = common::fresh_database(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    let store = MysqlStore::open(opts).await.expect("open");
    let newer = SCHEMA_VERSION + 1;
    refuses_every_call_once_a_newer_node_migrated(store, SCHEMA_VERSION, newer, || {
        common::run_blocking(format!(
            "INSERT INTO `{}`.schema_migrations (version) VALUES ({newer})",
            guard.0
        ));
    })
    .await;
    let rows = one(format!("SELECT COUNT(*) FROM `{}`.messages", guard.0));
    assert_eq!(rows, "1", "only the publish of before");
}

async fn refused(url: &str) -> StoreError {
    match MysqlStore::open(MysqlOptions::new(url)).await {
        Err(e) => e,
        Ok(s) => {
            s.close().await;
            panic!("{url} was accepted")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_are_refused_naming_the_problem() {
    let e = refused("postgres://root@127.0.0.1:3306/test").await;
    assert!(
        e.to_string().contains("invalid MySQL URL") && e.to_string().contains("mysql://"),
        "{e}"
    );
    let e = refused("not a url at all").await;
    assert!(e.to_string().contains("invalid MySQL URL"), "{e}");
    let e = refused("mysql://root@127.0.0.1:3306").await;
    assert!(e.to_string().contains("names no database"), "{e}");
    let e = refused("mysql://root@127.0.0.1:3306/test?require_ssl=true").await;
    assert!(e.to_string().contains("TLS"), "{e}");
    // Nothing listens on port 1: the database is unavailable, the store is not broken.
    let e = refused("mysql://root@127.0.0.1:1/test").await;
    assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
    assert!(e.to_string().contains("cannot connect to MySQL"), "{e}");
    // A database that does not exist is named.
    let e = refused(&common::url_of("redrive_t_no_such_database")).await;
    assert!(e.to_string().contains("redrive_t_no_such_database"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_read_committed_durability_and_the_database_clock() {
    let (store, _guard) = common::open(PREFIX, Setup::default()).await;
    assert_eq!(
        store.session_isolation().await.expect("isolation"),
        "READ-COMMITTED"
    );
    // The durability check agrees with the server's own settings.
    let flush = one("SELECT CAST(@@innodb_flush_log_at_trx_commit AS CHAR)".to_owned());
    let log_bin = one("SELECT CAST(@@log_bin AS CHAR)".to_owned());
    let sync_binlog = one("SELECT CAST(@@sync_binlog AS CHAR)".to_owned());
    let durable = flush == "1" && (log_bin != "1" || sync_binlog == "1");
    match store.durability_weakened() {
        None => assert!(
            durable,
            "flush {flush}, log_bin {log_bin}, sync_binlog {sync_binlog}"
        ),
        Some(why) => {
            assert!(!durable, "{why}");
            assert!(why.contains("innodb_flush_log_at_trx_commit") || why.contains("sync_binlog"));
        }
    }
    // No time given: the database's clock (this machine's, here), in ms.
    let before = Timestamp::now().as_millis();
    let p = store
        .publish(vec![NewMessage::new(Q, json!("now"))], None)
        .await
        .expect("publish");
    let after = Timestamp::now().as_millis();
    let created = p[0].message.created_at.as_millis();
    assert!(
        (before - 2_000..=after + 2_000).contains(&created),
        "created_at {created} is the database's clock, between {before} and {after}"
    );
    let leased = store
        .lease(
            LeaseRequest {
                queue: Q.into(),
                max: 1,
                lease_ms: 30_000,
                max_bytes: None,
            },
            None,
        )
        .await
        .expect("lease");
    let exp = leased[0].expires_at.as_millis();
    assert!((before + 28_000..=after + 32_000).contains(&exp), "{exp}");
    store.close().await;
}

/// 10 tasks publish 2,000 messages (batches with idempotency keys, half of them on an
/// ordered queue over a few hot keys) while leasing and acking what any task published and
/// ticking: the shape that deadlocks a queue on InnoDB. Every call succeeds (deadlocks
/// retried), every message is acked exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_prone_workload_finishes_without_errors() {
    const TASKS: usize = 10;
    const PER_TASK: usize = 200;
    const TOTAL: usize = TASKS * PER_TASK;
    let guard = common::fresh_database(PREFIX);
    let mut opts = common::options(&guard.0, &Setup::default());
    opts.pool_size = 12;
    let store = Arc::new(MysqlStore::open(opts).await.expect("open"));
    let acked = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let (store, acked, seen, errors) =
            (store.clone(), acked.clone(), seen.clone(), errors.clone());
        handles.push(tokio::spawn(async move {
            let mut published = 0;
            let mut round = 0usize;
            while acked.load(Ordering::SeqCst) < TOTAL {
                assert!(
                    started.elapsed() < Duration::from_secs(240),
                    "the workload did not finish in 4 minutes"
                );
                round += 1;
                if published < PER_TASK {
                    let batch: Vec<NewMessage> = (0..10)
                        .map(|i| {
                            let n = published + i;
                            let queue = if n % 2 == 0 { Q } else { ORDERED };
                            let mut m = NewMessage::new(queue, json!({ "task": task, "n": n }));
                            m.idempotency_key = Some(format!("t{task}-{n}"));
                            m.key = Some(format!("k{}", (n + task) % 7));
                            m
                        })
                        .collect();
                    match store.publish(batch, None).await {
                        Ok(_) => published += 10,
                        Err(e) => errors.lock().expect("errors").push(format!("publish: {e}")),
                    }
                }
                if round % 5 == task % 5 {
                    if let Err(e) = store.tick(None).await {
                        errors.lock().expect("errors").push(format!("tick: {e}"));
                    }
                }
                for queue in [Q, ORDERED] {
                    let req = LeaseRequest {
                        queue: queue.into(),
                        max: 8,
                        lease_ms: 120_000,
                        max_bytes: None,
                    };
                    let leased = match store.lease(req, None).await {
                        Ok(l) => l,
                        Err(e) => {
                            errors.lock().expect("errors").push(format!("lease: {e}"));
                            continue;
                        }
                    };
                    if leased.is_empty() {
                        continue;
                    }
                    let acks: Vec<Ack> = leased
                        .iter()
                        .map(|l| {
                            Ack::from(LeaseRef {
                                id: l.message.id,
                                token: l.token.clone(),
                            })
                        })
                        .collect();
                    match store.ack(acks, None).await {
                        Ok(results) => {
                            for r in results {
                                match r {
                                    Ok(a) => {
                                        assert!(!a.repeated);
                                        assert!(
                                            seen.lock().expect("seen").insert(a.message.id),
                                            "{} acked twice",
                                            a.message.id
                                        );
                                        acked.fetch_add(1, Ordering::SeqCst);
                                    }
                                    Err(e) => errors
                                        .lock()
                                        .expect("errors")
                                        .push(format!("ack item: {e}")),
                                }
                            }
                        }
                        Err(e) => errors.lock().expect("errors").push(format!("ack: {e}")),
                    }
                }
                if published >= PER_TASK {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }));
    }
    for h in handles {
        h.await.expect("worker");
    }
    let errors = errors.lock().expect("errors").clone();
    let conflicts = store.conflict_stats();
    eprintln!(
        "{TOTAL} messages, {TASKS} tasks, {:.1} s: {} deadlock (1213) retries, {} lock wait \
         (1205) retries, {} idempotency races retried, {} gave up",
        started.elapsed().as_secs_f64(),
        conflicts.deadlock_retries,
        conflicts.lock_wait_retries,
        conflicts.race_retries,
        conflicts.gave_up
    );
    assert!(errors.is_empty(), "{} errors: {errors:?}", errors.len());
    assert_eq!(conflicts.gave_up, 0);
    assert_eq!(acked.load(Ordering::SeqCst), TOTAL);
    let stats = store.queue_stats().await.expect("stats");
    let done: u64 = stats.iter().map(|s| s.count(State::Done)).sum();
    let total: u64 = stats.iter().map(|s| s.counts.iter().sum::<u64>()).sum();
    assert_eq!((done, total), (TOTAL as u64, TOTAL as u64), "{stats:?}");
    // The counters reach /metrics.
    let m = store.metrics();
    let deadlocks = m
        .iter()
        .find(|m| m.name == "redrive_mysql_deadlock_retries_total")
        .expect("the deadlock counter");
    assert_eq!(deadlocks.value, conflicts.deadlock_retries as f64);
    store.close().await;
}
