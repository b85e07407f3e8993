//! Per-key ordering (`ordering = "key"`): one leased message per key, later messages
//! wait while an earlier one is leased or retrying; `on_dead` skip vs block.

use crate::harness::{id_of, lease_of, TestServer};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ORDERED: &str = r#"
[queues.ord]
ordering = "key"
[queues.ord.retry]
max_attempts = 3
backoff = "fixed"
initial_delay = "500ms"
jitter = "none"
[queues.ordblock]
ordering = "key"
on_dead = "block"
"#;

fn payloads(v: &[Value]) -> Vec<&str> {
    v.iter().map(|m| m["payload"].as_str().unwrap()).collect()
}

async fn publish_keyed(s: &TestServer, queue: &str, key: &str, name: &str) -> String {
    id_of(&s.publish(queue, json!({"payload": name, "key": key})).await)
}

#[tokio::test]
async fn second_of_a_key_waits_while_the_first_is_leased() {
    let s = TestServer::fast(ORDERED).await;
    let a = publish_keyed(&s, "ord", "k", "a").await;
    publish_keyed(&s, "ord", "k", "b").await;
    let got = s.lease("ord", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["a"], "{got:?}");
    assert!(
        s.lease("ord", json!({"max": 10, "wait": "200ms"}))
            .await
            .is_empty(),
        "b waits while a is leased"
    );
    let (st, r) = s.ack(&a, &lease_of(&got[0])).await;
    assert_eq!(st, 200, "{r}");
    let got = s.lease("ord", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["b"], "{got:?}");
    s.stop().await;
}

#[tokio::test]
async fn second_of_a_key_waits_while_the_first_retries() {
    let s = TestServer::fast(ORDERED).await;
    let a = publish_keyed(&s, "ord", "k", "a").await;
    publish_keyed(&s, "ord", "k", "b").await;
    let l = s.lease_one("ord", "0s").await;
    assert_eq!(l["payload"], "a");
    let (st, n) = s
        .nack(&a, &lease_of(&l), json!({"class": "transient"}))
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "scheduled", "{n}");
    // While a waits for its retry, b is not delivered; the next delivery of the key is a.
    let got = s.lease("ord", json!({"max": 10})).await;
    assert!(
        payloads(&got).iter().all(|p| *p == "a"),
        "b must not overtake a: {got:?}"
    );
    let l = match got.into_iter().next() {
        Some(l) => l,
        None => s.lease_one("ord", "5s").await,
    };
    assert_eq!(l["payload"], "a", "{l}");
    assert_eq!(l["attempt"], 2, "{l}");
    assert!(s.lease("ord", json!({"max": 10})).await.is_empty());
    let (st, body) = s.ack(&a, &lease_of(&l)).await;
    assert_eq!(st, 200, "{body}");
    let got = s.lease("ord", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["b"], "{got:?}");
    s.stop().await;
}

#[tokio::test]
async fn different_keys_and_unkeyed_messages_go_in_parallel() {
    let s = TestServer::fast(ORDERED).await;
    publish_keyed(&s, "ord", "k1", "a1").await;
    publish_keyed(&s, "ord", "k2", "b1").await;
    publish_keyed(&s, "ord", "k1", "a2").await;
    s.publish("ord", json!({"payload": "free"})).await;
    publish_keyed(&s, "ord", "k2", "b2").await;
    s.publish("ord", json!({"payload": "free2"})).await;
    let got = s.lease("ord", json!({"max": 10})).await;
    let mut names = payloads(&got);
    names.sort();
    assert_eq!(names, ["a1", "b1", "free", "free2"], "{got:?}");
    s.stop().await;
}

#[tokio::test]
async fn unordered_queue_leases_a_key_in_parallel() {
    let s = TestServer::fast(ORDERED).await;
    publish_keyed(&s, "plain", "k", "a").await;
    publish_keyed(&s, "plain", "k", "b").await;
    let got = s.lease("plain", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["a", "b"], "{got:?}");
    s.stop().await;
}

#[tokio::test]
async fn releasing_a_key_wakes_a_long_poll() {
    let s = std::sync::Arc::new(TestServer::fast(ORDERED).await);
    let a = publish_keyed(&s, "ord", "k", "a").await;
    publish_keyed(&s, "ord", "k", "b").await;
    let l = s.lease_one("ord", "0s").await;
    let mut signals = s.engine.signals().subscribe();
    let poller = {
        let s = s.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let got = s.lease("ord", json!({"wait": "20s"})).await;
            (got, t.elapsed())
        })
    };
    signals.parked("ord").await;
    let (st, body) = s.ack(&a, &lease_of(&l)).await;
    assert_eq!(st, 200, "{body}");
    let (got, took) = poller.await.unwrap();
    assert_eq!(payloads(&got), ["b"], "{got:?}");
    assert!(took < Duration::from_secs(10), "woken by the ack: {took:?}");
    match std::sync::Arc::try_unwrap(s) {
        Ok(s) => s.stop().await,
        Err(_) => panic!("server still shared"),
    }
}

#[tokio::test]
async fn on_dead_skip_releases_the_key() {
    let s = TestServer::fast(ORDERED).await;
    let a = publish_keyed(&s, "ord", "k", "a").await;
    publish_keyed(&s, "ord", "k", "b").await;
    let l = s.lease_one("ord", "0s").await;
    let (st, n) = s
        .nack(&a, &lease_of(&l), json!({"class": "permanent"}))
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "dead", "{n}");
    let got = s.lease("ord", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["b"], "{got:?}");
    s.stop().await;
}

#[tokio::test]
async fn on_dead_block_holds_the_key_until_an_operator_acts() {
    let s = TestServer::fast(ORDERED).await;
    // Redrive releases by delivering the dead message again, first.
    let a = publish_keyed(&s, "ordblock", "k", "a").await;
    publish_keyed(&s, "ordblock", "k", "b").await;
    let l = s.lease_one("ordblock", "0s").await;
    let (st, n) = s
        .nack(&a, &lease_of(&l), json!({"class": "permanent"}))
        .await;
    assert_eq!(st, 200, "{n}");
    assert_eq!(n["state"], "dead", "{n}");
    assert!(
        s.lease("ordblock", json!({"max": 10, "wait": "200ms"}))
            .await
            .is_empty(),
        "b blocked by dead a"
    );
    let (st, r) = s
        .post(&format!("/v1/messages/{a}/redrive"), json!({}))
        .await;
    assert_eq!(st, 200, "{r}");
    let got = s.lease("ordblock", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["a"], "{got:?}");
    let (st, body) = s.ack(&a, &lease_of(&got[0])).await;
    assert_eq!(st, 200, "{body}");
    let got = s.lease("ordblock", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["b"], "{got:?}");

    // Delete releases too; other keys are never blocked.
    let c = publish_keyed(&s, "ordblock", "k2", "c").await;
    publish_keyed(&s, "ordblock", "k2", "d").await;
    publish_keyed(&s, "ordblock", "k3", "e").await;
    let l = s.lease("ordblock", json!({"max": 10})).await;
    let mut names = payloads(&l);
    names.sort();
    assert_eq!(names, ["c", "e"], "{l:?}");
    let lc = l.iter().find(|m| m["payload"] == "c").unwrap();
    let (st, body) = s
        .nack(&c, &lease_of(lc), json!({"class": "permanent"}))
        .await;
    assert_eq!(st, 200, "{body}");
    assert!(s.lease("ordblock", json!({"max": 10})).await.is_empty());
    let (st, d) = s.delete(&format!("/v1/messages/{c}")).await;
    assert_eq!(st, 200, "{d}");
    let got = s.lease("ordblock", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["d"], "{got:?}");
    s.stop().await;
}

#[tokio::test]
async fn killed_message_releases_the_key_under_skip() {
    let s = TestServer::fast(ORDERED).await;
    let a = publish_keyed(&s, "ord", "k", "a").await;
    publish_keyed(&s, "ord", "k", "b").await;
    let (st, k) = s.post(&format!("/v1/messages/{a}/kill"), json!({})).await;
    assert_eq!(st, 200, "{k}");
    let got = s.lease("ord", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["b"], "{got:?}");
    s.stop().await;
}

#[tokio::test]
async fn redriven_older_message_waits_while_a_later_one_of_its_key_is_leased() {
    let s = TestServer::fast(ORDERED).await;
    let a = publish_keyed(&s, "ord", "k", "a").await;
    let b = publish_keyed(&s, "ord", "k", "b").await;
    let l = s.lease_one("ord", "0s").await;
    let (st, n) = s
        .nack(&a, &lease_of(&l), json!({"class": "permanent"}))
        .await;
    assert_eq!(st, 200, "{n}");
    let lb = s.lease_one("ord", "0s").await; // skip: b goes on
    assert_eq!(lb["payload"], "b", "{lb}");
    let (st, r) = s
        .post(&format!("/v1/messages/{a}/redrive"), json!({}))
        .await;
    assert_eq!(st, 200, "{r}");
    let got = s.lease("ord", json!({"max": 10})).await;
    assert!(
        got.is_empty(),
        "at most one leased message per key: a must wait for b: {got:?}"
    );
    let (st, body) = s.ack(&b, &lease_of(&lb)).await;
    assert_eq!(st, 200, "{body}");
    let got = s.lease("ord", json!({"max": 10})).await;
    assert_eq!(payloads(&got), ["a"], "{got:?}");
    s.stop().await;
}
