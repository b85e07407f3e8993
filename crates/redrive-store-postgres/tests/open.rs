//! Opening the PostgreSQL store: migrations (twice, at once, a newer schema refused, from
//! version 5), a running store stopped by a newer node's upgrade, TLS
//! refused, an unreachable server is `Unavailable`, `synchronous_commit` read, and the
//! database's clock when no time is given.

mod common;

use redrive_core::{NewMessage, State, Timestamp};
use redrive_storage::conformance::shared::refuses_every_call_once_a_newer_node_migrated;
use redrive_storage::conformance::{Setup, Q};
use redrive_storage::{Health, LeaseRequest, Store, StoreError};
use redrive_store_postgres::{PostgresOptions, PostgresStore, SCHEMA_VERSION};
use serde_json::json;

const PREFIX: &str = "redrive_t_open";

/// What schema step 10 did, undone: a schema of before it has no `message_ids`, and
/// `messages` has its own index by queue and its `id` unique.
const UNDO_V10: &str = "DROP TABLE message_ids; CREATE INDEX ix_queue ON messages (queue, seq); \
     ALTER TABLE messages ADD CONSTRAINT messages_id_key UNIQUE (id);";

/// A version 9 schema with messages in it: step 10 copies their ids and queues into
/// `message_ids`, so each is found again by id and by its queue, leased and acked, and
/// both publish paths (the store's and the SQL function's) add to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_9_schema_keeps_its_messages_findable() {
    let guard = common::fresh_schema(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    let store = PostgresStore::open(opts.clone()).await.expect("open");
    let before = store
        .publish(
            (0..3).map(|i| NewMessage::new(Q, json!(i))).collect(),
            Some(Timestamp::from_millis(1)),
        )
        .await
        .expect("publish");
    store.close().await;
    common::run_blocking(format!(
        "SET search_path TO {s}; {UNDO_V10} DELETE FROM schema_migrations WHERE version >= 10;",
        s = guard.0
    ));
    let store = PostgresStore::open(opts).await.expect("a v9 schema opens");
    for p in &before {
        let m = store
            .get(p.message.id)
            .await
            .expect("get")
            .expect("found by id");
        assert_eq!(m.payload, p.message.payload);
    }
    let by_queue = || redrive_storage::MessageFilter {
        queue: Some(Q.into()),
        ..Default::default()
    };
    let found = store.search(by_queue(), 10, None).await.expect("search");
    assert_eq!(found.messages.len(), 3, "the queue's messages, by queue");
    let leased = store
        .lease(
            LeaseRequest {
                queue: Q.into(),
                max: 1,
                lease_ms: 60_000,
                max_bytes: None,
            },
            Some(Timestamp::from_millis(2)),
        )
        .await
        .expect("lease");
    assert_eq!(leased[0].message.id, before[0].message.id);
    let acks = vec![redrive_storage::LeaseRef {
        id: leased[0].message.id,
        token: leased[0].token.clone(),
    }
    .into()];
    for r in store
        .ack(acks, Some(Timestamp::from_millis(3)))
        .await
        .expect("ack")
    {
        r.expect("an ack of a message from before the migration");
    }
    store
        .publish(
            vec![NewMessage::new(Q, json!(3))],
            Some(Timestamp::from_millis(4)),
        )
        .await
        .expect("publish after");
    let client = common::connect().await;
    let id: String = client
        .query_one(
            &format!("SELECT {}.publish($1, '{{\"n\": 4}}'::jsonb)", guard.0),
            &[&Q],
        )
        .await
        .expect("the SQL function after the migration")
        .get(0);
    let id: redrive_core::MessageId = id.parse().expect("an id");
    assert!(store.get(id).await.expect("get").is_some(), "found by id");
    let found = store.search(by_queue(), 10, None).await.expect("search");
    assert_eq!(found.messages.len(), 5);
    assert_eq!(store.count(by_queue()).await.expect("count"), 5);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_twice_and_at_once_migrates_once() {
    let guard = common::fresh_schema(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    // Two opens racing on a schema that does not exist yet.
    let (a, b) = tokio::join!(
        PostgresStore::open(opts.clone()),
        PostgresStore::open(opts.clone())
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
    // Open again: nothing to migrate, the message is there.
    let c = PostgresStore::open(opts).await.expect("reopen");
    let stats = c.queue_stats().await.expect("stats");
    assert_eq!(stats[0].count(State::Ready), 1);
    c.close().await;
    let versions = query_one_i64(&format!(
        "SELECT count(*) FROM {}.schema_migrations",
        guard.0
    ))
    .await;
    assert_eq!(
        versions,
        i64::from(SCHEMA_VERSION),
        "each step recorded once"
    );
}

async fn query_one_i64(sql: &str) -> i64 {
    let client = common::connect().await;
    client
        .query_one(sql, &[])
        .await
        .expect("query")
        .get::<_, i64>(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_naming_both_versions() {
    let guard = common::fresh_schema(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    PostgresStore::open(opts.clone())
        .await
        .expect("open")
        .close()
        .await;
    let newer = SCHEMA_VERSION + 41;
    common::run_blocking(format!(
        "INSERT INTO {}.schema_migrations (version) VALUES ({newer})",
        guard.0
    ));
    match PostgresStore::open(opts).await {
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains(&format!("version {newer}"))
                    && text.contains(&format!("up to {SCHEMA_VERSION}")),
                "the refusal names both versions: {text}"
            );
        }
        Ok(_) => panic!("a schema of version {newer} was opened"),
    }
}

/// A newer redrive migrates the schema while this store runs (a cluster upgraded node by
/// node, this one not yet): it refuses every call from then on
/// (`conformance::shared::refuses_every_call_once_a_newer_node_migrated`), and nothing it
/// refused was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_upgraded_by_a_newer_node_stops_this_one() {
    let guard = common::fresh_schema(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    let store = PostgresStore::open(opts).await.expect("open");
    let newer = SCHEMA_VERSION + 1;
    refuses_every_call_once_a_newer_node_migrated(
        store,
        i64::from(SCHEMA_VERSION),
        i64::from(newer),
        || {
            common::run_blocking(format!(
                "INSERT INTO {}.schema_migrations (version) VALUES ({newer})",
                guard.0
            ))
        },
    )
    .await;
    let rows = query_one_i64(&format!("SELECT count(*) FROM {}.messages", guard.0)).await;
    assert_eq!(rows, 1, "only the publish of before");
}

/// A schema at version 5 (before the console's sessions and the audit log's node) is
/// migrated: its audit entries read back with no node, new ones keep theirs, sessions work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_5_schema_is_migrated_audit_entries_keep_no_node() {
    let guard = common::fresh_schema(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    PostgresStore::open(opts.clone())
        .await
        .expect("open")
        .close()
        .await;
    // Back to version 5: without what versions 6 and 7 added, one audit entry written then.
    common::run_blocking(format!(
        "SET search_path TO {s}; {UNDO_V10} DROP TABLE sessions; ALTER TABLE audit DROP COLUMN node; \
         DROP TABLE endpoint_trips; DELETE FROM schema_migrations WHERE version >= 6; \
         INSERT INTO audit (at, actor, action, target, filter, count, detail) \
         VALUES (1, 'ops', 'message.kill', 'm1', NULL, 1, NULL);",
        s = guard.0
    ));
    let store = PostgresStore::open(opts).await.expect("a v5 schema opens");
    store
        .audit(
            redrive_storage::NewAudit {
                actor: "ops".into(),
                action: "message.redrive".into(),
                target: Some("m2".into()),
                filter: None,
                count: 1,
                detail: None,
                node: Some("node-a".into()),
            },
            None,
        )
        .await
        .expect("audit");
    let log = store.audit_list(None, 10).await.expect("audit list");
    let nodes: Vec<_> = log
        .iter()
        .map(|a| (a.entry.target.as_deref(), a.entry.node.as_deref()))
        .collect();
    assert_eq!(nodes, [(Some("m2"), Some("node-a")), (Some("m1"), None)]);
    let made = store
        .session_create(
            redrive_storage::conformance::sessions::new_session("s1", "ops", 4),
            None,
        )
        .await
        .expect("session");
    let found = store
        .session_get(redrive_storage::conformance::sessions::lookup("s1"), None)
        .await
        .expect("get");
    assert_eq!(found.map(|s| s.csrf), Some(made.csrf));
    store.close().await;
    let version = query_one_i64(&format!(
        "SELECT max(version)::bigint FROM {}.schema_migrations",
        guard.0
    ))
    .await;
    assert_eq!(version, i64::from(SCHEMA_VERSION));
}

/// A schema at version 6 (before the push endpoints' shared breakers) is migrated: what it
/// held stays, and a trip is recorded and read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_6_schema_is_migrated_and_records_endpoint_trips() {
    let guard = common::fresh_schema(PREFIX);
    let opts = common::options(&guard.0, &Setup::default());
    let store = PostgresStore::open(opts.clone()).await.expect("open");
    store
        .heartbeat(redrive_storage::conformance::cluster::beat("a", true), None)
        .await
        .expect("beat");
    store.close().await;
    common::run_blocking(format!(
        "SET search_path TO {s}; {UNDO_V10} DROP TABLE endpoint_trips; \
         DELETE FROM schema_migrations WHERE version >= 7;",
        s = guard.0
    ));
    let store = PostgresStore::open(opts).await.expect("a v6 schema opens");
    let view = store.cluster(None).await.expect("cluster");
    assert_eq!(view.nodes.len(), 1, "the node stayed: {view:?}");
    store
        .endpoint_trip("http://a.example:80".into(), "i-1".into(), 5_000, None)
        .await
        .expect("trip");
    let trips = store.endpoint_trips(None).await.expect("trips");
    assert_eq!(trips.open.len(), 1, "{trips:?}");
    assert_eq!(trips.open[0].endpoint, "http://a.example:80");
    store.close().await;
    let version = query_one_i64(&format!(
        "SELECT max(version)::bigint FROM {}.schema_migrations",
        guard.0
    ))
    .await;
    assert_eq!(version, i64::from(SCHEMA_VERSION));
}

#[tokio::test]
async fn tls_is_refused_at_open() {
    for mode in ["require", "verify-ca", "verify-full"] {
        let mut opts = PostgresOptions::new(format!("{}?sslmode={mode}", common::url()));
        opts.schema = "redrive_t_never_made".into();
        match PostgresStore::open(opts).await {
            Err(e) => assert!(
                e.to_string().contains("TLS is not supported yet"),
                "sslmode={mode}: {e}"
            ),
            Ok(_) => panic!("sslmode={mode} was accepted"),
        }
    }
}

#[tokio::test]
async fn no_tls_modes_open() {
    for mode in ["disable", "prefer"] {
        let guard = common::fresh_schema(PREFIX);
        let mut opts = common::options(&guard.0, &Setup::default());
        opts.url = format!("{}?sslmode={mode}", common::url());
        let s = PostgresStore::open(opts)
            .await
            .unwrap_or_else(|e| panic!("sslmode={mode}: {e}"));
        s.close().await;
    }
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    // Port 1 on the loopback: refused at once.
    let mut opts = PostgresOptions::new("postgres://root@127.0.0.1:1/test");
    opts.schema = "redrive_t_never_made".into();
    match PostgresStore::open(opts).await {
        Err(StoreError::Unavailable(why)) => assert!(!why.is_empty()),
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(_) => panic!("opened a store on port 1"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_commit_is_read_and_the_database_clock_is_used_without_a_time() {
    let (s, _guard) = common::open(PREFIX, Setup::default()).await;
    let expected = {
        let client = common::connect().await;
        let v: String = client
            .query_one("SHOW synchronous_commit", &[])
            .await
            .expect("show")
            .get(0);
        v == "off"
    };
    assert_eq!(s.synchronous_commit_off(), expected);
    let before = Timestamp::now().as_millis();
    let p = s
        .publish_at(vec![NewMessage::new(Q, json!("now"))], None)
        .await
        .expect("publish at the database's time");
    let after = Timestamp::now().as_millis();
    let created = p[0].message.created_at.as_millis();
    // The database runs on this machine: its clock is this one's, within a second.
    assert!(
        created >= before - 1_000 && created <= after + 1_000,
        "created at {created}, not between {before} and {after}"
    );
    let leased = s
        .lease_at(
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
    assert_eq!(leased.len(), 1);
    assert_eq!(
        leased[0].expires_at.as_millis() - leased[0].message.updated_at.as_millis(),
        30_000
    );
    let t = s.tick_at(None).await.expect("tick");
    assert_eq!(t.next_wake, Some(leased[0].expires_at));
    s.close().await;
    assert!(
        matches!(s.health(), Health::Failed(_)),
        "a closed store says so"
    );
    assert!(matches!(
        s.publish(
            vec![NewMessage::new(Q, json!(1))],
            Some(Timestamp::from_millis(1))
        )
        .await,
        Err(StoreError::Closed)
    ));
}

/// The store's connections are killed by the server (a restart, an operator's
/// `pg_terminate_backend`): calls on them fail `Unavailable`, never `Poisoned`, the store
/// is not poisoned, and the next calls succeed on new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connections_are_unavailable_then_recovered() {
    let guard = common::fresh_schema(PREFIX);
    let app = format!("{}_app", guard.0);
    let mut opts = common::options(&guard.0, &Setup::default());
    opts.url = format!("{}?application_name={app}", common::url());
    opts.pool_size = 2;
    let s = PostgresStore::open(opts).await.expect("open");
    s.publish(
        vec![NewMessage::new(Q, json!(1))],
        Some(Timestamp::from_millis(1)),
    )
    .await
    .expect("publish");
    // Two calls at once, so that both pooled connections exist.
    let (x, y) = tokio::join!(s.queue_stats(), s.get(redrive_core::MessageId::new()));
    x.expect("stats");
    y.expect("get");
    common::run_blocking(format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{app}'"
    ));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut failures = 0;
    let mut ok = false;
    for _ in 0..6 {
        match s
            .publish(
                vec![NewMessage::new(Q, json!(2))],
                Some(Timestamp::from_millis(2)),
            )
            .await
        {
            Ok(_) => {
                ok = true;
                break;
            }
            Err(StoreError::Unavailable(_)) => failures += 1,
            Err(other) => panic!("a lost connection answered {other:?}, not Unavailable"),
        }
        assert_eq!(
            s.health(),
            Health::Ok,
            "a lost connection poisoned the store"
        );
    }
    eprintln!("calls failed Unavailable before the store recovered: {failures}");
    assert!(ok, "the store did not recover after {failures} failures");
    let stats = s.queue_stats().await.expect("stats after recovery");
    assert_eq!(stats[0].count(State::Ready), 2);

    // A connection lost in the middle of a call, before its commit: the kill waits for a
    // row lock another session holds, and its backend is terminated meanwhile. Nothing of
    // it committed, so it runs again on a new connection and succeeds once the lock goes.
    let id = stats_first_id(&s).await;
    let client = common::connect().await;
    client
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM {}.messages FOR UPDATE",
            guard.0
        ))
        .await
        .expect("lock the rows");
    let s = std::sync::Arc::new(s);
    let killing = {
        let s = s.clone();
        tokio::spawn(async move { s.kill(id, None, Some(Timestamp::from_millis(3))).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    common::run_blocking(format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{app}'"
    ));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !killing.is_finished(),
        "the kill should wait for the lock again"
    );
    assert_eq!(
        s.health(),
        Health::Ok,
        "a lost connection poisoned the store"
    );
    client.batch_execute("ROLLBACK").await.expect("unlock");
    let killed = killing
        .await
        .expect("kill task")
        .expect("the kill, run again on a new connection");
    assert_eq!(killed.state, State::Dead);
    // Every statement now on a live connection.
    s.queue_stats().await.expect("stats");
    s.close().await;
}

async fn stats_first_id(s: &PostgresStore) -> redrive_core::MessageId {
    s.search(Default::default(), 1, None)
        .await
        .expect("search")
        .messages[0]
        .id
}

/// A queue's ordering changed between opens: its rows are rewritten at the next open, so
/// a queue made ordered leases only its keys' heads, and one made unordered frees the
/// messages that waited behind their keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_ordering_is_reconciled_at_open() {
    use redrive_core::{Ordering, QueueCatalog, QueueSettings};
    let guard = common::fresh_schema(PREFIX);
    let unordered = Setup::default();
    let ordered = Setup {
        catalog: std::sync::Arc::new(QueueCatalog::new(
            QueueSettings {
                ordering: Ordering::Key,
                ..unordered.catalog.get(Q).clone()
            },
            Default::default(),
        )),
        ..Setup::default()
    };
    let s = PostgresStore::open(common::options(&guard.0, &unordered))
        .await
        .expect("open unordered");
    let items = ["k1", "k1", "k1", "k2"]
        .iter()
        .enumerate()
        .map(|(i, k)| NewMessage {
            key: Some((*k).to_owned()),
            ..NewMessage::new(Q, json!(i))
        })
        .collect();
    s.publish(items, Some(Timestamp::from_millis(1)))
        .await
        .expect("publish");
    s.close().await;

    let s = PostgresStore::open(common::options(&guard.0, &ordered))
        .await
        .expect("open ordered");
    let heads: Vec<i64> = lease_all(&s)
        .await
        .expect("lease")
        .iter()
        .map(|l| l.message.payload.as_i64().expect("i"))
        .collect();
    assert_eq!(heads, vec![0, 3], "only the heads of k1 and k2");
    s.close().await;

    let s = PostgresStore::open(common::options(&guard.0, &unordered))
        .await
        .expect("open unordered again");
    let rest: Vec<i64> = lease_all(&s)
        .await
        .expect("lease")
        .iter()
        .map(|l| l.message.payload.as_i64().expect("i"))
        .collect();
    assert_eq!(rest, vec![1, 2], "the messages that waited behind k1");
    s.close().await;
}

async fn lease_all(s: &PostgresStore) -> Result<Vec<redrive_storage::Leased>, StoreError> {
    s.lease(
        LeaseRequest {
            queue: Q.into(),
            max: 10,
            lease_ms: 600_000,
            max_bytes: None,
        },
        Some(Timestamp::from_millis(10)),
    )
    .await
}

/// A TCP relay to the local PostgreSQL that the test can cut (every connection through it
/// dropped, new ones refused) and mend on the same port: a real network failure between the
/// store and a real database.
struct Relay {
    addr: std::net::SocketAddr,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Relay {
    async fn start() -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cut, cuts) = tokio::sync::watch::channel(0u64);
        let flag = up.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if !flag.load(std::sync::atomic::Ordering::SeqCst) {
                    continue; // refused: dropped at once
                }
                let mut cuts = cuts.clone();
                cuts.borrow_and_update(); // only a cut from now on ends this connection
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect("127.0.0.1:5432").await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Relay { addr, up, cut }
    }

    fn set(&self, up: bool) {
        self.up.store(up, std::sync::atomic::Ordering::SeqCst);
        if !up {
            self.cut.send_modify(|n| *n += 1);
        }
    }
}

/// While the database cannot be reached the store says `Unavailable` (never `Failed`), its
/// calls fail `Unavailable`, and once it is reachable again the store is `Ok` and serves
/// by itself, having lost nothing it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_unavailable_while_the_database_is_cut_off_and_ok_after() {
    let guard = common::fresh_schema(PREFIX);
    let relay = Relay::start().await;
    let mut opts = common::options(&guard.0, &Setup::default());
    opts.url = format!("postgres://root@{}/test", relay.addr);
    let s = PostgresStore::open(opts)
        .await
        .expect("open through the relay");
    let before = s
        .publish(vec![NewMessage::new(Q, json!("kept"))], None)
        .await
        .expect("publish");
    assert_eq!(s.health(), Health::Ok);
    relay.set(false);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !matches!(s.health(), Health::Unavailable(_)) {
        assert!(
            std::time::Instant::now() < deadline,
            "still {:?}",
            s.health()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    match s.get(before[0].message.id).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("a read while cut off: {other:?}"),
    }
    relay.set(true);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.health() != Health::Ok {
        assert!(
            std::time::Instant::now() < deadline,
            "still {:?}",
            s.health()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let got = s
        .get(before[0].message.id)
        .await
        .expect("a read after")
        .expect("the published message is there");
    assert_eq!(got.state, State::Ready);
    s.close().await;
}
