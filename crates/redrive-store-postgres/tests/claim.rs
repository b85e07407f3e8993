//! The claim's byte bound (`LeaseRequest::max_bytes`, which the suite does not cover), and
//! a rough throughput measure (ignored: run with `--ignored --nocapture`).

mod common;

use redrive_core::NewMessage;
use redrive_storage::conformance::{at, Setup, Q};
use redrive_storage::{LeaseRef, LeaseRequest, Store};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

const PREFIX: &str = "redrive_t_claim";

fn req(max: u32, max_bytes: Option<u64>) -> LeaseRequest {
    LeaseRequest {
        queue: Q.into(),
        max,
        lease_ms: 600_000,
        max_bytes,
    }
}

/// Each message stores 102 bytes of JSON (a 100-character string): a claim stops before
/// the bound, takes at least one, and `max_bytes` with `max = 1` is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_stops_before_its_byte_bound() {
    let (s, _guard) = common::open(PREFIX, Setup::default()).await;
    let items = (0..6)
        .map(|i| NewMessage::new(Q, json!(format!("{i}").repeat(100))))
        .collect();
    s.publish(items, Some(at(0))).await.expect("publish");
    let sizes = |l: &[redrive_storage::Leased]| {
        l.iter()
            .map(|l| l.message.payload.to_string().len())
            .collect::<Vec<_>>()
    };
    let a = s
        .lease(req(5, Some(204)), Some(at(1)))
        .await
        .expect("lease");
    assert_eq!(sizes(&a), vec![102, 102], "two fit in 204 bytes");
    let b = s
        .lease(req(5, Some(203)), Some(at(1)))
        .await
        .expect("lease");
    assert_eq!(b.len(), 1, "one fits in 203");
    let c = s.lease(req(5, Some(10)), Some(at(1))).await.expect("lease");
    assert_eq!(c.len(), 1, "at least one, whatever its size");
    let d = s.lease(req(1, Some(10)), Some(at(1))).await.expect("lease");
    assert_eq!(d.len(), 1);
    let e = s.lease(req(5, None), Some(at(1))).await.expect("lease");
    assert_eq!(e.len(), 1, "the last one");
    let order: Vec<String> = a
        .iter()
        .chain(&b)
        .chain(&c)
        .chain(&d)
        .chain(&e)
        .map(|l| l.message.payload.as_str().expect("text")[..1].to_owned())
        .collect();
    assert_eq!(order, ["0", "1", "2", "3", "4", "5"], "claim order kept");
}

/// Publish, lease and ack `N` messages with 32 concurrent callers; prints the rates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, not a check: run with --ignored --nocapture"]
async fn throughput() {
    const N: usize = 8_000;
    const CALLERS: usize = 32;
    let guard = common::fresh_schema(PREFIX);
    let mut opts = common::options(&guard.0, &Setup::default());
    opts.pool_size = 8;
    let s = Arc::new(
        redrive_store_postgres::PostgresStore::open(opts)
            .await
            .expect("open"),
    );
    let client = common::connect().await;
    let lsn = || async {
        client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .expect("lsn")
            .get::<_, String>(0)
    };
    let wal_start = lsn().await;
    let started = Instant::now();
    let mut hs = Vec::new();
    for c in 0..CALLERS {
        let s = s.clone();
        hs.push(tokio::spawn(async move {
            for i in 0..N / CALLERS {
                s.publish(
                    vec![NewMessage::new(Q, json!({"c": c, "i": i}))],
                    Some(at(0)),
                )
                .await
                .expect("publish");
            }
        }));
    }
    for h in hs {
        h.await.expect("publisher");
    }
    let publish = started.elapsed();
    let c0 = s.commit_stats().commits;
    let started = Instant::now();
    let mut hs = Vec::new();
    for _ in 0..CALLERS {
        let s = s.clone();
        hs.push(tokio::spawn(async move {
            let mut n = 0;
            loop {
                let got = s.lease(req(10, None), Some(at(1))).await.expect("lease");
                if got.is_empty() {
                    return n;
                }
                n += got.len();
                let acks = common::acks(got);
                for r in s.ack(acks, Some(at(2))).await.expect("ack") {
                    r.expect("ack");
                }
            }
        }));
    }
    let mut total = 0;
    for h in hs {
        total += h.await.expect("consumer");
    }
    let consume = started.elapsed();
    assert_eq!(total, N);
    let wal_end = lsn().await;
    let wal: i64 = client
        .query_one(
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::bigint",
            &[&wal_end, &wal_start],
        )
        .await
        .expect("diff")
        .get(0);
    eprintln!(
        "WAL written while publishing, leasing and acking: {:.0} bytes per message \
         (the whole server's WAL: other sessions count too)",
        wal as f64 / N as f64
    );
    eprintln!(
        "{N} messages, {CALLERS} callers: publish (1 per call) {:.0}/s ({} commits in all), \
         lease 10 + ack {:.0}/s ({} commits)",
        N as f64 / publish.as_secs_f64(),
        c0,
        N as f64 / consume.as_secs_f64(),
        s.commit_stats().commits - c0
    );
    s.close().await;
}

/// `history` has no foreign key (schema v4): the purge and `delete` remove a message's
/// history rows themselves, and leave every other message's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_and_delete_take_the_history_rows_with_them() {
    let (s, guard) = common::open(PREFIX, Setup::default()).await;
    let published = s
        .publish(
            (0..3).map(|i| NewMessage::new(Q, json!(i))).collect(),
            Some(at(0)),
        )
        .await
        .unwrap();
    let leased = s.lease(req(3, None), Some(at(1))).await.unwrap();
    assert_eq!(leased.len(), 3);
    // Each acked: one history row each.
    let acks = leased
        .iter()
        .map(|l| {
            redrive_storage::Ack::from(LeaseRef {
                id: l.message.id,
                token: l.token.clone(),
            })
        })
        .collect();
    for r in s.ack(acks, Some(at(2))).await.unwrap() {
        r.unwrap();
    }
    let rows = |schema: String| async move {
        let c = common::connect().await;
        let n: i64 = c
            .query_one(&format!("SELECT count(*) FROM {schema}.history"), &[])
            .await
            .unwrap()
            .get(0);
        n
    };
    assert_eq!(rows(guard.0.clone()).await, 3);
    s.delete(published[0].message.id).await.unwrap();
    assert_eq!(rows(guard.0.clone()).await, 2, "delete left its history");
    let purged = s.purge(Some(at(10_000)), 1_000).await.unwrap();
    assert_eq!(purged.done_deleted.iter().map(|(_, n)| n).sum::<u64>(), 2);
    assert_eq!(rows(guard.0.clone()).await, 0, "the purge left history");
}

/// A claim runs inside its own transaction, the one that set `synchronous_commit = off`
/// (a lease is not promised durability): a statement-level trigger on `messages` records
/// the setting each claim's `UPDATE` ran under. (The claim was once sent as text, prepared
/// in a round trip of its own, and its execution went out after the pipelined `COMMIT`: it
/// ran alone, committed synchronously, and every claim waited for a flush.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_runs_in_its_asynchronous_transaction() {
    let (s, guard) = common::open(PREFIX, Setup::default()).await;
    let schema = guard.0.clone();
    common::run_blocking(format!(
        "CREATE TABLE {schema}.seen (setting text NOT NULL); \
         CREATE FUNCTION {schema}.note_setting() RETURNS trigger LANGUAGE plpgsql AS $$ \
           BEGIN INSERT INTO {schema}.seen VALUES (current_setting('synchronous_commit')); \
           RETURN NULL; END $$; \
         CREATE TRIGGER note_setting AFTER UPDATE ON {schema}.messages \
           FOR EACH STATEMENT EXECUTE FUNCTION {schema}.note_setting();"
    ));
    s.publish(
        (0..4).map(|i| NewMessage::new(Q, json!(i))).collect(),
        Some(at(0)),
    )
    .await
    .unwrap();
    // The database's clock and a given one; several on one connection (the statement is
    // prepared once per connection, then reused).
    for now in [None, Some(at(1)), None, Some(at(2))] {
        assert_eq!(s.lease(req(1, None), now).await.unwrap().len(), 1);
    }
    let c = common::connect().await;
    let seen: Vec<String> = c
        .query(&format!("SELECT setting FROM {schema}.seen"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        seen,
        vec!["off"; 4],
        "each claim under its transaction's setting"
    );
    drop(c);
    s.close().await;
}
