//! The engine's seams seen over HTTP: readiness follows the store's writer, the injected
//! clock drives the scheduler, and the WAL size is a metric.

use crate::harness::*;
use redrive_core::Timestamp;
use redrive_server::engine::{ManualClock, Signal};
use serde_json::json;
use std::sync::Arc;

/// Regression (issue 5, defect 7): `/readyz` answered 200 after the writer thread had
/// stopped, while every write answered 503.
#[tokio::test]
async fn readyz_is_503_once_the_stores_writer_has_stopped() {
    let s = TestServer::fast("").await;
    assert_eq!(s.get("/readyz").await.0, 200);
    s.engine.store().close().await;
    let (status, body) = s.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["code"].is_string(), "{body}");
    let (status, body) = s.post("/v1/queues/q/messages", json!({"payload": 1})).await;
    assert_eq!(status, 503, "writes are refused too: {body}");
    s.stop().await;
}

/// The scheduler sleeps on the engine's clock: with a manual clock, a message delayed by an
/// hour becomes ready when the test moves the clock by an hour, not an hour later.
#[tokio::test]
async fn a_delayed_message_is_ready_when_the_injected_clock_reaches_its_due_time() {
    let clock = Arc::new(ManualClock::new(Timestamp::now()));
    let s = TestServer::start_with_clock(FAST, clock.clone()).await;
    let mut signals = s.engine.signals().subscribe();
    let id = id_of(
        &s.publish("later", json!({"payload": 1, "delay": "1h"}))
            .await,
    );
    assert_eq!(s.lease("later", json!({})).await.len(), 0, "not due yet");
    clock.advance(3_600_000);
    signals
        .wait_for(|sig| matches!(sig, Signal::Ticked { ready_queues, .. } if ready_queues.iter().any(|q| q == "later")))
        .await;
    let got = s.lease("later", json!({})).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(id_of(&got[0]), id);
    s.stop().await;
}

/// Issue 5, defect 1: the WAL's size is a metric.
#[tokio::test]
async fn metrics_report_the_wal_size() {
    if crate::harness::on_shared_store() {
        eprintln!("not run on PostgreSQL: redrive_wal_* are the embedded store's figures");
        return;
    }
    let s = TestServer::fast("").await;
    s.publish_payload("q", json!("x")).await;
    let (status, text) = s.get_text("/metrics").await;
    assert_eq!(status, 200);
    let line = text
        .lines()
        .find(|l| l.starts_with("redrive_wal_bytes "))
        .unwrap_or_else(|| panic!("no redrive_wal_bytes in:\n{text}"));
    let bytes: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(bytes > 0.0, "a commit just wrote to the WAL: {line}");
    s.stop().await;
}
