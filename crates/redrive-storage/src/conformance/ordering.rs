//! Per-key ordering (`ordering = "key"`): one message of a key at a time, and what a dead letter does to its key (`on_dead`).

use super::helpers::*;
use super::*;

pub async fn key_ordering_holds_later_message<S: Store>(s: Arc<S>) {
    let k1 = publish(&*s, keyed(ORDERED, "k", 1), at(0)).await;
    let k2 = publish(&*s, keyed(ORDERED, "k", 2), at(0)).await;
    let free = publish(&*s, msg(ORDERED, json!("no key")), at(0)).await;
    let other = publish(&*s, keyed(ORDERED, "other", 1), at(0)).await;
    let first = lease(&*s, ORDERED, 10, 30_000, at(0)).await;
    assert_eq!(
        ids(&first),
        vec![k1.id, free.id, other.id],
        "only the head of key k is leasable"
    );
    assert!(
        lease(&*s, ORDERED, 10, 30_000, at(0)).await.is_empty(),
        "k2 leased while k1 is leased"
    );
    let out = nack(
        &*s,
        k1.id,
        &first[0].token,
        failure(ErrorClass::Transient, "x"),
        at(10),
    )
    .await
    .expect("nack");
    assert_eq!(out.message.state, State::Scheduled);
    assert!(
        lease(&*s, ORDERED, 10, 30_000, at(10)).await.is_empty(),
        "k2 leased while k1 waits to retry"
    );
    tick(&*s, at(1_010)).await;
    let again = lease(&*s, ORDERED, 10, 30_000, at(1_010)).await;
    assert_eq!(
        ids(&again),
        vec![k1.id],
        "the retried head comes first, k2 still waits"
    );
    assert!(lease(&*s, ORDERED, 10, 30_000, at(1_010)).await.is_empty());
    ack(&*s, k1.id, &again[0].token, at(1_020))
        .await
        .expect("ack");
    let next = lease(&*s, ORDERED, 10, 30_000, at(1_020)).await;
    assert_eq!(ids(&next), vec![k2.id], "k2 is leasable once k1 is done");
    // New messages wait behind the leased head of their own key only.
    let k3 = publish(&*s, keyed(ORDERED, "k", 3), at(1_030)).await;
    let o2 = publish(&*s, keyed(ORDERED, "other", 2), at(1_030)).await;
    let l = lease(&*s, ORDERED, 10, 30_000, at(1_030)).await;
    assert!(!ids(&l).contains(&k3.id), "k3 leased while k2 is leased");
    assert!(
        !ids(&l).contains(&o2.id),
        "other/2 leased while other/1 is leased"
    );
    ack(&*s, other.id, &first[2].token, at(1_040))
        .await
        .expect("ack");
    assert_eq!(
        ids(&lease(&*s, ORDERED, 10, 30_000, at(1_040)).await),
        vec![o2.id]
    );
}

pub async fn key_ordering_on_dead_skip_releases_key<S: Store>(s: Arc<S>) {
    let k1 = publish(&*s, keyed(ORDERED, "k", 1), at(0)).await;
    let k2 = publish(&*s, keyed(ORDERED, "k", 2), at(0)).await;
    let out = lease_and_nack(
        &*s,
        ORDERED,
        k1.id,
        failure(ErrorClass::Permanent, "bad"),
        at(0),
    )
    .await;
    assert_eq!(out.message.state, State::Dead);
    let next = lease(&*s, ORDERED, 10, 30_000, at(1)).await;
    assert_eq!(
        ids(&next),
        vec![k2.id],
        "on_dead = skip: a dead message releases its key"
    );
}

pub async fn key_ordering_on_dead_block_holds_key<S: Store>(s: Arc<S>) {
    let q = ORDERED_BLOCK;
    let k1 = publish(&*s, keyed(q, "k", 1), at(0)).await;
    let k2 = publish(&*s, keyed(q, "k", 2), at(0)).await;
    let x = publish(&*s, keyed(q, "x", 1), at(0)).await;
    let free = publish(&*s, msg(q, json!("no key")), at(0)).await;
    let first = lease(&*s, q, 10, 30_000, at(0)).await;
    assert_eq!(ids(&first), vec![k1.id, x.id, free.id]);
    nack(
        &*s,
        k1.id,
        &first[0].token,
        failure(ErrorClass::Permanent, "bad"),
        at(1),
    )
    .await
    .expect("nack");
    assert!(
        lease(&*s, q, 10, 30_000, at(2)).await.is_empty(),
        "on_dead = block: k2 leased behind dead k1"
    );
    let x2 = publish(&*s, keyed(q, "x", 2), at(2)).await;
    ack(&*s, x.id, &first[1].token, at(3)).await.expect("ack");
    assert_eq!(
        ids(&lease(&*s, q, 10, 30_000, at(3)).await),
        vec![x2.id],
        "another key is not blocked"
    );
    // Redrive releases the block: k1 first, then k2.
    s.redrive(k1.id, Some(at(4))).await.expect("redrive");
    let l1 = lease(&*s, q, 10, 30_000, at(4)).await;
    assert_eq!(
        ids(&l1),
        vec![k1.id],
        "the redriven head first, k2 still waits"
    );
    ack(&*s, k1.id, &l1[0].token, at(5)).await.expect("ack");
    let l2 = lease(&*s, q, 10, 30_000, at(5)).await;
    assert_eq!(ids(&l2), vec![k2.id]);
    ack(&*s, k2.id, &l2[0].token, at(6)).await.expect("ack");
    // Delete releases it too; so does nothing else (a kill blocks like any death).
    let k3 = publish(&*s, keyed(q, "k", 3), at(7)).await;
    let k4 = publish(&*s, keyed(q, "k", 4), at(7)).await;
    lease_one(&*s, q, k3.id, 30_000, at(7)).await;
    s.kill(k3.id, None, Some(at(8))).await.expect("kill");
    assert!(
        lease(&*s, q, 10, 30_000, at(8)).await.is_empty(),
        "k4 leased behind killed k3"
    );
    s.delete(k3.id).await.expect("delete");
    assert_eq!(
        ids(&lease(&*s, q, 10, 30_000, at(9)).await),
        vec![k4.id],
        "delete releases the key"
    );
}

pub async fn key_ordering_one_lease_per_key_after_redrive<S: Store>(s: Arc<S>) {
    // on_dead = skip: k1 dies, k2 is leased, then an operator redrives k1. At most one
    // message of a key is leased at a time, so k1 waits until k2 is finished.
    let k1 = publish(&*s, keyed(ORDERED, "k", 1), at(0)).await;
    let k2 = publish(&*s, keyed(ORDERED, "k", 2), at(0)).await;
    lease_and_nack(
        &*s,
        ORDERED,
        k1.id,
        failure(ErrorClass::Permanent, "bad"),
        at(0),
    )
    .await;
    let l2 = lease_one(&*s, ORDERED, k2.id, 30_000, at(1)).await;
    s.redrive(k1.id, Some(at(2))).await.expect("redrive");
    let l = lease(&*s, ORDERED, 10, 30_000, at(3)).await;
    assert!(
        l.is_empty(),
        "two messages of key k leased at once: {:?}",
        ids(&l)
    );
    ack(&*s, k2.id, &l2.token, at(4)).await.expect("ack");
    assert_eq!(
        ids(&lease(&*s, ORDERED, 10, 30_000, at(5)).await),
        vec![k1.id]
    );
}
