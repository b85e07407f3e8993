//! Leases and promotions held in memory (`src/hot.rs`): what is on disk, what readers
//! see, and the window of leasable rows across its refills and its bound.

use redrive_core::MessageId;
use redrive_core::{ErrorClass, Failure, NewMessage, State};
use redrive_storage::conformance::{self, at, Q};
use redrive_storage::{Leased, MessageFilter, Nack, Store};
use redrive_store_sqlite::{SqliteOptions, SqliteStore};
use rusqlite::{Connection, OpenFlags};
use serde_json::json;
use std::collections::HashSet;
use std::path::Path;

mod common;
use common::{lease, lref};

fn open(dir: &Path) -> SqliteStore {
    let mut opts = SqliteOptions::new(dir);
    opts.store.catalog = std::sync::Arc::new(conformance::catalog());
    opts.store.seed = Some(5);
    SqliteStore::open(opts).expect("open store")
}

/// `(state, attempts, lease_token)` of a message's row in the file.
fn on_disk(dir: &Path, id: &str) -> (u8, u32, Option<String>) {
    let conn =
        Connection::open_with_flags(dir.join("redrive.db"), OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open read-only");
    conn.query_row(
        "SELECT state, attempts, lease_token FROM messages WHERE id = ?1",
        [id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .expect("row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_writes_no_row_and_every_read_sees_it_leased() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path());
    let published = s
        .publish(vec![NewMessage::new(Q, json!({"n": 1}))], Some(at(0)))
        .await
        .expect("publish");
    let id = published[0].message.id;
    let l = lease(&s, 1, 60_000, 10).await.remove(0);
    assert_eq!(l.attempt, 1);
    // The file: still ready, no attempt, no token.
    assert_eq!(on_disk(dir.path(), &id.to_string()), (1, 0, None));
    // Every read: leased, attempt 1, the lease's expiry.
    let m = s.get(id).await.expect("get").expect("found");
    assert_eq!((m.state, m.attempts), (State::Leased, 1));
    assert_eq!(m.lease_expires_at, Some(at(60_010)));
    let leased = MessageFilter {
        state: Some(State::Leased),
        ..MessageFilter::default()
    };
    let ready = MessageFilter {
        state: Some(State::Ready),
        ..MessageFilter::default()
    };
    let page = s.search(leased.clone(), 10, None).await.expect("search");
    assert_eq!(page.messages.len(), 1, "found as leased");
    assert_eq!(page.messages[0].state, State::Leased);
    assert!(s
        .search(ready.clone(), 10, None)
        .await
        .expect("search")
        .messages
        .is_empty());
    assert_eq!(s.count(leased.clone()).await.expect("count"), 1);
    assert_eq!(s.count(ready.clone()).await.expect("count"), 0);
    let stats = s.queue_stats().await.expect("stats");
    assert_eq!(stats[0].counts[State::Leased.code() as usize], 1);
    assert_eq!(
        stats[0].oldest_ready_due, None,
        "the only ready row is leased"
    );
    // An extend moves the expiry in memory only.
    let new = s
        .extend(lref(&l), 120_000, Some(at(20)))
        .await
        .expect("extend");
    assert_eq!(new, at(120_020));
    assert_eq!(on_disk(dir.path(), &id.to_string()), (1, 0, None));
    // The ack writes the lease and done together.
    s.ack(vec![lref(&l).into()], Some(at(30)))
        .await
        .expect("ack")[0]
        .as_ref()
        .expect("acked");
    assert_eq!(
        on_disk(dir.path(), &id.to_string()),
        (3, 1, Some(l.token.clone()))
    );
    let m = s.get(id).await.expect("get").expect("found");
    assert_eq!((m.state, m.attempts, m.history.len()), (State::Done, 1, 1));
    assert_eq!(m.history[0].leased_at, Some(at(10)));
    assert_eq!(s.count(leased).await.expect("count"), 0);
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_writes_the_lease_with_its_failure_and_a_close_keeps_live_leases() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path());
    let items = (0..2)
        .map(|i| NewMessage::new(Q, json!({ "i": i })))
        .collect();
    s.publish(items, Some(at(0))).await.expect("publish");
    let ls = lease(&s, 2, 60_000, 10).await;
    assert_eq!(ls.len(), 2);
    let nack = Nack {
        response: None,
        waited: Vec::new(),
        lease: lref(&ls[0]),
        failure: Failure::new(ErrorClass::Transient, "down"),
    };
    let out = s.nack(vec![nack], Some(at(20))).await.expect("nack");
    let failed = out.into_iter().next().expect("one").expect("nacked");
    assert_eq!(failed.message.attempts, 1);
    let (state, attempts, token) = on_disk(dir.path(), &ls[0].message.id.to_string());
    assert_eq!(
        (attempts, token.as_deref()),
        (1, Some(ls[0].token.as_str()))
    );
    assert_ne!(state, 2, "failed, not leased");
    // The other lease is live at the close: written into its row, kept by the reopen.
    s.close().await;
    let id = ls[1].message.id.to_string();
    assert_eq!(on_disk(dir.path(), &id), (2, 1, Some(ls[1].token.clone())));
    let s = open(dir.path());
    s.ack(vec![lref(&ls[1]).into()], Some(at(40)))
        .await
        .expect("ack")[0]
        .as_ref()
        .expect("the lease outlived the restart");
    s.close().await;
}

/// Past the window's refill size and its bound, with priorities mixed in: every message is
/// leased once, in claim order (priority first, then publish order here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_hands_out_every_message_once_in_claim_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path());
    const N: usize = 20_000;
    // One message leased first: the window is loaded whole (its bound past the end), so
    // the publishes that follow go into it until it overflows its bound and is cut.
    s.publish(vec![NewMessage::new(Q, json!({ "n": -1 }))], Some(at(0)))
        .await
        .expect("publish");
    assert_eq!(lease(&s, 1, 60_000, 10).await.len(), 1);
    for chunk in 0..(N / 1_000) {
        let items = (0..1_000)
            .map(|i| {
                let n = chunk * 1_000 + i;
                NewMessage {
                    priority: if n % 7 == 0 { 5 } else { 0 },
                    ..NewMessage::new(Q, json!({ "n": n }))
                }
            })
            .collect();
        s.publish(items, Some(at(0))).await.expect("publish");
    }
    let mut seen = HashSet::new();
    let mut order = Vec::new();
    loop {
        let got = lease(&s, 500, 60_000, 10).await;
        if got.is_empty() {
            break;
        }
        for l in got {
            let n = l.message.payload["n"]
                .as_u64()
                .expect("n: the first is not leased again");
            assert!(seen.insert(n), "message {n} leased twice");
            order.push((l.message.priority, n));
        }
        // Publish more while leasing: they join behind (or, with priority 9, in front).
        if order.len() == 10_000 {
            let late = NewMessage {
                priority: 9,
                ..NewMessage::new(Q, json!({ "n": N }))
            };
            s.publish(vec![late], Some(at(0))).await.expect("publish");
        }
    }
    assert_eq!(seen.len(), N + 1, "every message leased");
    let mut sorted = order.clone();
    sorted[..10_000].sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    assert_eq!(order[..10_000], sorted[..10_000], "claim order");
    assert_eq!(
        order[10_000],
        (9, N as u64),
        "the late high priority goes first"
    );
    s.close().await;
}

fn in_state(state: State) -> MessageFilter {
    MessageFilter {
        state: Some(state),
        ..MessageFilter::default()
    }
}

/// Publish one message of [`Q`] at `now`, due at `due` (ms).
async fn publish_due(s: &SqliteStore, n: i64, now: i64, due: i64) -> MessageId {
    let item = NewMessage {
        deliver_at: Some(at(due)),
        ..NewMessage::new(Q, json!({ "n": n }))
    };
    s.publish(vec![item], Some(at(now))).await.expect("publish")[0]
        .message
        .id
}

/// The queues a tick at `t` names ready.
async fn ticked_ready(s: &SqliteStore, t: i64) -> Vec<String> {
    s.tick(Some(at(t))).await.expect("tick").ready_queues
}

/// Two messages of [`Q`] published at 0, due at `due_a` and `due_b`, promoted by a tick at
/// `due_b`, and the first leased at `lease_at`: (the first, the second, its lease).
async fn promote_two_lease_one(
    s: &SqliteStore,
    due_a: i64,
    due_b: i64,
    lease_at: i64,
) -> (MessageId, MessageId, Leased) {
    let a = publish_due(s, 1, 0, due_a).await;
    let b = publish_due(s, 2, 0, due_b).await;
    s.tick(Some(at(due_b))).await.expect("tick");
    let l = lease(s, 1, 60_000, lease_at).await.remove(0);
    assert_eq!(l.message.id, a);
    (a, b, l)
}

/// The tick's promotion on a queue whose leases are held in memory writes nothing: the row
/// stays `scheduled` in the file, every read sees it `ready`, and the ack writes it once,
/// from `scheduled` to `done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_message_is_promoted_in_memory_and_every_read_sees_it_ready() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path());
    let id = publish_due(&s, 1, 0, 1_000).await;
    let key = id.to_string();
    assert_eq!(
        s.tick(Some(at(999)))
            .await
            .expect("tick")
            .ready_queues
            .len(),
        0
    );
    let tick = s.tick(Some(at(1_000))).await.expect("tick");
    assert_eq!(tick.ready_queues, vec![Q.to_owned()]);
    assert_eq!(
        tick.next_wake, None,
        "nothing more is due: no wake for what is held"
    );
    assert_eq!(
        on_disk(dir.path(), &key),
        (0, 0, None),
        "scheduled in the file"
    );
    let m = s.get(id).await.expect("get").expect("found");
    assert_eq!(m.state, State::Ready);
    assert_eq!(m.updated_at, at(1_000));
    for (state, n) in [(State::Ready, 1), (State::Scheduled, 0), (State::Leased, 0)] {
        assert_eq!(
            s.count(in_state(state)).await.expect("count"),
            n,
            "{state:?}"
        );
        let page = s.search(in_state(state), 10, None).await.expect("search");
        assert_eq!(page.messages.len() as u64, n, "{state:?}");
    }
    let stats = s.queue_stats().await.expect("stats");
    assert_eq!(stats[0].counts[State::Ready.code() as usize], 1);
    assert_eq!(stats[0].counts[State::Scheduled.code() as usize], 0);
    assert_eq!(stats[0].oldest_ready_due, Some(at(1_000)));
    // A second tick promotes nothing again.
    let again = s.tick(Some(at(1_500))).await.expect("tick");
    assert!(again.ready_queues.is_empty());
    // Leased: still `scheduled` in the file, `leased` to every read.
    let l = lease(&s, 10, 60_000, 1_500).await;
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].message.id, id);
    assert_eq!(on_disk(dir.path(), &key), (0, 0, None));
    assert_eq!(s.count(in_state(State::Leased)).await.expect("count"), 1);
    assert_eq!(s.count(in_state(State::Ready)).await.expect("count"), 0);
    assert_eq!(s.count(in_state(State::Scheduled)).await.expect("count"), 0);
    assert!(lease(&s, 10, 60_000, 1_500).await.is_empty(), "leased once");
    s.ack(vec![lref(&l[0]).into()], Some(at(1_600)))
        .await
        .expect("ack")[0]
        .as_ref()
        .expect("acked");
    assert_eq!(on_disk(dir.path(), &key), (3, 1, Some(l[0].token.clone())));
    let m = s.get(id).await.expect("get").expect("found");
    assert_eq!((m.state, m.attempts, m.history.len()), (State::Done, 1, 1));
    assert_eq!(m.history[0].leased_at, Some(at(1_500)));
    s.close().await;
}

/// A restart loses the promotions held in memory and nothing else: the rows are
/// `scheduled` and due, and the first tick promotes them again. A live lease of a promoted
/// row is written into its row at the close, as any lease held in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_promotes_again_and_keeps_a_promoted_rows_lease() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path());
    let (a, b, l) = promote_two_lease_one(&s, 1_000, 1_001, 1_002).await;
    s.close().await;
    assert_eq!(
        on_disk(dir.path(), &a.to_string()),
        (2, 1, Some(l.token.clone()))
    );
    assert_eq!(on_disk(dir.path(), &b.to_string()), (0, 0, None));
    let s = open(dir.path());
    let m = s.get(b).await.expect("get").expect("found");
    assert_eq!(m.state, State::Scheduled, "due, not promoted yet");
    let tick = s.tick(Some(at(1_100))).await.expect("tick");
    assert_eq!(tick.ready_queues, vec![Q.to_owned()]);
    let lb = lease(&s, 5, 60_000, 1_100).await;
    assert_eq!(lb.len(), 1);
    assert_eq!((lb[0].message.id, lb[0].attempt), (b, 1));
    s.ack(vec![lref(&l).into(), lref(&lb[0]).into()], Some(at(1_200)))
        .await
        .expect("ack")
        .into_iter()
        .for_each(|r| {
            r.expect("acked");
        });
    s.close().await;
}

/// A promoted row's lease that fails is written with its failure from `scheduled`; the
/// retry is scheduled past the rows held, so the next tick promotes it again. Operator
/// actions on a promoted row first write its promotion, then act as on any ready row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_row_fails_retries_and_takes_operator_actions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path());
    let (a, b, l) = promote_two_lease_one(&s, 1_000, 1_000, 1_000).await;
    let nack = Nack {
        response: None,
        waited: Vec::new(),
        lease: lref(&l),
        failure: Failure::new(ErrorClass::Transient, "down"),
    };
    let failed = s.nack(vec![nack], Some(at(1_010))).await.expect("nack");
    let failed = failed.into_iter().next().expect("one").expect("nacked");
    assert_eq!(failed.message.state, State::Scheduled);
    assert_eq!(failed.message.due_at, Some(at(2_010)));
    assert_eq!(on_disk(dir.path(), &a.to_string()).0, 0);
    // b is killed while promoted: its promotion is written, then the kill.
    let killed = s
        .kill(b, Some("by hand".into()), Some(at(1_020)))
        .await
        .expect("kill");
    assert_eq!(killed.state, State::Dead);
    assert_eq!(on_disk(dir.path(), &b.to_string()).0, 4);
    assert!(lease(&s, 5, 60_000, 1_030).await.is_empty());
    let tick = s.tick(Some(at(2_010))).await.expect("tick");
    assert_eq!(tick.ready_queues, vec![Q.to_owned()]);
    let again = lease(&s, 5, 60_000, 2_010).await;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].message.id, again[0].attempt), (a, 2));
    // Its lease expires: the tick fails it from `scheduled` on disk.
    let expired = s.tick(Some(at(70_000))).await.expect("tick");
    assert_eq!(expired.expired.len(), 1);
    assert_eq!(expired.expired[0].message.id, a);
    let m = s.get(a).await.expect("get").expect("found");
    assert_eq!(m.attempts, 2);
    assert_ne!(m.state, State::Leased);
    s.close().await;
}

/// A message scheduled where its queue's rows are already held (its due time at or before
/// theirs: the request's clock was behind the tick's) is promoted at once, and the next
/// tick names its queue ready: it is never left behind the scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_scheduled_behind_the_promoted_ones_is_promoted_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path());
    publish_due(&s, 1, 0, 1_000).await;
    s.tick(Some(at(1_000))).await.expect("tick");
    let late = publish_due(&s, 2, 400, 900).await;
    let m = s.get(late).await.expect("get").expect("found");
    assert_eq!(
        m.state,
        State::Ready,
        "due before the rows held: ready at once"
    );
    let tick = s.tick(Some(at(1_001))).await.expect("tick");
    assert_eq!(tick.ready_queues, vec![Q.to_owned()]);
    let got = lease(&s, 5, 60_000, 1_001).await;
    let ids: Vec<MessageId> = got.iter().map(|l| l.message.id).collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], late, "claim order: the earlier due time first");
    s.close().await;
}

/// The clock set back: a message scheduled where its queue's rows are held, but due more
/// than a second after the clock of its request, is not made ready early. The rows held are written (the
/// promoted one `ready`, the leased one `leased`), and the tick promotes the new one at its
/// due time, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_set_back_never_delivers_early() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path());
    let (a, b, l) = promote_two_lease_one(&s, 10_000, 10_000, 10_000).await;
    // The clock goes back to 5,000: due at 7,000, behind the rows held (10,000), and 2 s
    // after its request's clock.
    let late = publish_due(&s, 3, 5_000, 7_000).await;
    assert_eq!(
        s.get(late).await.expect("get").expect("found").state,
        State::Scheduled
    );
    assert_eq!(
        on_disk(dir.path(), &a.to_string()).0,
        2,
        "the lease written"
    );
    assert_eq!(
        on_disk(dir.path(), &b.to_string()).0,
        1,
        "the promotion written"
    );
    assert!(ticked_ready(&s, 6_900).await.is_empty());
    let got = lease(&s, 5, 60_000, 6_900).await;
    assert_eq!(got.len(), 1, "only b: the new one is not due");
    assert_eq!(got[0].message.id, b);
    assert_eq!(ticked_ready(&s, 7_000).await, vec![Q.to_owned()]);
    let got = lease(&s, 5, 60_000, 7_000).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.id, late);
    assert!(ticked_ready(&s, 7_500).await.is_empty());
    s.ack(vec![lref(&l).into()], Some(at(7_600)))
        .await
        .expect("ack")[0]
        .as_ref()
        .expect("the lease of before still acks");
    s.close().await;
}
