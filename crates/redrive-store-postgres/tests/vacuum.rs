//! The store vacuums its hot table itself once enough dead rows pile up, whether or not
//! autovacuum runs (`vacuum.rs`): here autovacuum is off for the test's table, so only the
//! store can have vacuumed it.

mod common;

use redrive_core::NewMessage;
use redrive_storage::conformance::{at, Setup, Q};
use redrive_storage::{LeaseRequest, Store};
use serde_json::json;
use std::time::{Duration, Instant};

const PREFIX: &str = "redrive_t_vacuum";

/// 12,000 messages leased and acked leave 24,000 dead versions of `messages` rows, past
/// the store's floor of 10,000: within half a minute (statistics reach the view within
/// about ten seconds of a backend going idle) a `VACUUM` of the table is counted and
/// fewer than 10,000 dead rows are left (one may have run while the acks went on, and
/// another then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_vacuums_messages_when_dead_rows_pile_up() {
    let (s, guard) = common::open(PREFIX, Setup::default()).await;
    let client = common::connect().await;
    client
        .batch_execute(&format!(
            "ALTER TABLE {}.messages SET (autovacuum_enabled = false)",
            guard.0
        ))
        .await
        .expect("autovacuum off for the table");
    let stats = || async {
        let r = client
            .query_one(
                "SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables \
                 WHERE schemaname = $1 AND relname = 'messages'",
                &[&guard.0],
            )
            .await
            .expect("table statistics");
        (r.get::<_, i64>(0), r.get::<_, i64>(1))
    };
    assert_eq!(stats().await.0, 0, "not vacuumed before the test");
    const N: usize = 12_000;
    for b in 0..N / 1_000 {
        let items = (0..1_000)
            .map(|i| NewMessage::new(Q, json!({ "n": b * 1_000 + i })))
            .collect();
        s.publish(items, Some(at(0))).await.expect("publish");
    }
    let mut acked = 0;
    loop {
        let req = LeaseRequest {
            queue: Q.into(),
            max: 1_000,
            lease_ms: 600_000,
            max_bytes: None,
        };
        let got = s.lease(req, Some(at(1))).await.expect("lease");
        if got.is_empty() {
            break;
        }
        let acks = common::acks(got);
        for r in s.ack(acks, Some(at(2))).await.expect("ack") {
            r.expect("ack");
            acked += 1;
        }
    }
    assert_eq!(acked, N);
    let started = Instant::now();
    let (vacuums, dead) = loop {
        let (vacuums, dead) = stats().await;
        if (vacuums > 0 && dead < 10_000) || started.elapsed() > Duration::from_secs(40) {
            break (vacuums, dead);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        vacuums > 0 && dead < 10_000,
        "within 40 s: {vacuums} VACUUMs of messages, {dead} dead rows left"
    );
    s.close().await;
}
