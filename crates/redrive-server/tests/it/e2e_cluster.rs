//! SPEC §13: this node in its cluster — `GET /v1/cluster`, one leader, a stopped leader
//! replaced at once; a node whose schema a newer node migrated stops serving.

use crate::harness::{ok, psql, TestServer};
use redrive_server::engine::Signal;
use serde_json::Value;
use std::time::{Duration, Instant};

/// A heartbeat every 100 ms and a 1 s leadership lease, so that handovers are quick.
const QUICK: &str = "[cluster]\nheartbeat_interval = \"100ms\"\nleader_lease = \"1s\"\n";

/// `/v1/cluster` once it satisfies `done` (polled for at most 10 s).
async fn cluster_when(s: &TestServer, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = s.get("/v1/cluster").await;
        if answer.0 != 200 {
            panic!(
                "{what}: {answer:?}; the store says {:?}",
                s.engine.store().cluster(None).await
            );
        }
        let got = ok(answer);
        if done(&got) {
            return got;
        }
        assert!(Instant::now() < deadline, "{what}: not within 10 s: {got}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_single_node_leads_its_own_cluster() {
    let s = TestServer::start("").await;
    let port = s.addr.port();
    let got = cluster_when(&s, "a leader", |c| !c["leader"].is_null()).await;
    let nodes = got["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 1, "{got}");
    let me = &nodes[0];
    let name = got["node"].as_str().expect("node");
    assert!(
        name.ends_with(&format!(":{port}")),
        "named host:port: {got}"
    );
    assert_eq!(me["node"], name);
    assert_eq!(me["address"], format!("http://127.0.0.1:{port}"));
    assert_eq!(me["live"], true);
    assert_eq!(me["leader"], true);
    assert_eq!(me["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(got["leader"]["incarnation"], me["incarnation"]);
    assert!(got["leader"]["epoch"].as_u64().unwrap() >= 1, "{got}");
    assert!(s.engine.membership().leads());
    // /metrics says which node answered, and that it leads.
    let (status, text) = s.get_text("/metrics").await;
    assert_eq!(status, 200);
    let line = format!(
        "redrive_node{{node=\"{name}\",incarnation=\"{}\"}} 1",
        me["incarnation"].as_str().unwrap()
    );
    assert!(text.contains(&line), "no {line} in /metrics");
    s.stop().await;
}

/// Two nodes on one PostgreSQL schema: both list both, exactly one leads, and when it
/// stops (it leaves) the other leads at its next heartbeat, with the next epoch.
#[tokio::test]
async fn two_nodes_elect_one_leader_and_a_stopped_leader_is_replaced_at_once() {
    let a = TestServer::start_shared(QUICK).await;
    let b = a.start_beside(QUICK).await;
    let both = |c: &Value| {
        c["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 2 && n.iter().all(|n| n["live"] == true))
            && !c["leader"].is_null()
    };
    let seen_a = cluster_when(&a, "two live nodes and a leader", both).await;
    let seen_b = cluster_when(&b, "two live nodes and a leader", both).await;
    assert_eq!(
        seen_a["leader"]["incarnation"],
        seen_b["leader"]["incarnation"]
    );
    let leaders = [&a, &b]
        .iter()
        .filter(|s| s.engine.membership().leads())
        .count();
    assert_eq!(leaders, 1, "exactly one node leads: {seen_a}");
    let epoch = seen_a["leader"]["epoch"].as_u64().unwrap();
    let (leader, other) = if a.engine.membership().leads() {
        (a, b)
    } else {
        (b, a)
    };

    let mut signals = other.engine.signals().subscribe();
    let stopped = Instant::now();
    let _schema = leader.stop_keeping_schema().await;
    eprintln!(
        "cluster test: the leader stopped in {:?}",
        stopped.elapsed()
    );
    tokio::time::timeout(
        Duration::from_secs(3),
        signals.wait_for(|s| matches!(s, Signal::Leadership { leads: true, .. })),
    )
    .await
    .expect("the other node leads within 3 s of the leader's stop");
    let took = stopped.elapsed();
    eprintln!("cluster test: a stopped leader was replaced {took:?} after its stop began (lease 1 s, heartbeat 100 ms)");
    assert!(other.engine.membership().leads());
    assert_eq!(other.engine.membership().epoch(), Some(epoch + 1));
    let got = cluster_when(&other, "the leaver gone", |c| {
        c["nodes"].as_array().is_some_and(|n| n.len() == 1)
    })
    .await;
    assert_eq!(got["nodes"][0]["leader"], true, "{got}");
    assert_eq!(got["leader"]["epoch"], epoch + 1);
    other.stop().await;
}

/// `storage_notify = false` (PgBouncer in transaction mode): no LISTEN, no NOTIFY, and a
/// publish on one node still reaches a long poll on the other, within the 1 s recheck of a
/// shared store (with notices it is milliseconds; the store-level case is
/// `shared::a_publish_on_one_handle_wakes_the_other`).
#[tokio::test]
async fn without_notices_a_long_poll_on_another_node_sees_a_publish_within_a_second() {
    let quiet = format!("storage_notify = false\n{QUICK}");
    let a = TestServer::start_on_postgres(&quiet).await;
    let b = a.start_beside(&quiet).await;
    let took = publish_reaches_a_long_poll_beside(&a, &b).await;
    eprintln!("cluster test: without notices, a publish on one node answered a long poll on the other {took:?} later");
    assert!(
        took < Duration::from_millis(2_500),
        "the long poll answered {took:?} after the publish: more than the 1 s recheck allows"
    );
    // Nobody listens on the schema's channel (with notices on, each node holds a LISTEN).
    let pg = a.pg.as_ref().expect("on PostgreSQL");
    let listening = psql(
        &pg.url,
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"redrive_{}\"'",
            pg.schema
        ),
    );
    assert_eq!(listening, "0", "a node listens");
    let _schema = a.stop_keeping_schema().await;
    b.stop().await;
}

/// How long after a publish on `a` a long poll parked on `b` answers it (asserted to be that
/// message).
async fn publish_reaches_a_long_poll_beside(a: &TestServer, b: &TestServer) -> Duration {
    let mut signals = b.engine.signals().subscribe();
    let poll = {
        let client = b.client.clone();
        let url = b.url("/v1/queues/nq/leases");
        tokio::spawn(async move {
            let r = client
                .post(url)
                .json(&serde_json::json!({"wait": "10s"}))
                .send()
                .await
                .unwrap();
            let body: Value = r.json().await.unwrap();
            (Instant::now(), body)
        })
    };
    signals.parked("nq").await;
    let published = Instant::now();
    let id = crate::harness::id_of(&a.publish("nq", serde_json::json!({"payload": 1})).await);
    let (answered, body) = poll.await.unwrap();
    let took = answered - published;
    assert_eq!(body["messages"][0]["id"], id, "{body}");
    took
}

/// MySQL has no LISTEN: each node's store polls for what other nodes made ready (every
/// 250 ms), so a publish on one node reaches a long poll on another within that, not the
/// 1 s recheck.
#[tokio::test]
async fn on_mysql_a_long_poll_on_another_node_sees_a_publish_within_the_store_poll() {
    if !crate::harness::on_mysql() {
        eprintln!("skipped: a MySQL case (set REDRIVE_TEST_STORAGE_URL=mysql://…)");
        return;
    }
    let a = TestServer::start_shared(QUICK).await;
    let b = a.start_beside(QUICK).await;
    let mut worst = Duration::ZERO;
    for _ in 0..3 {
        worst = worst.max(publish_reaches_a_long_poll_beside(&a, &b).await);
    }
    eprintln!("cluster test: on MySQL, a publish on one node answered a long poll on the other within {worst:?}");
    assert!(
        worst < Duration::from_millis(900),
        "the long poll answered {worst:?} after the publish: the store's 250 ms poll did not wake it"
    );
    let _schema = a.stop_keeping_schema().await;
    b.stop().await;
}

/// A node of an older version still running when a newer one migrated the shared schema
/// (an upgrade done node by node): within a few seconds its `/readyz` and its API answer
/// 503 `store_superseded`, naming both schema versions, and it writes nothing more.
#[tokio::test]
async fn a_node_whose_schema_a_newer_node_upgraded_stops_serving() {
    let s = TestServer::start_on_postgres(QUICK).await;
    let (st, _) = s
        .post(
            "/v1/queues/upgrade/messages",
            serde_json::json!({"payload": 1}),
        )
        .await;
    assert_eq!(st, 201);
    let pg = s.pg.as_ref().expect("on PostgreSQL");
    let newer = redrive_store_postgres::SCHEMA_VERSION + 1;
    psql(
        &pg.url,
        &format!(
            "INSERT INTO {}.schema_migrations (version) VALUES ({newer})",
            pg.schema
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let ready = loop {
        let (st, body) = s.get("/readyz").await;
        if st == 503 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {st} 10 s after the upgrade"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(ready["error"]["code"], "store_superseded", "{ready}");
    let why = ready["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains(&format!("version {newer}")), "{ready}");
    let (st, body) = s
        .post(
            "/v1/queues/upgrade/messages",
            serde_json::json!({"payload": 2}),
        )
        .await;
    assert_eq!(st, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_superseded", "{body}");
    s.stop().await;
}
