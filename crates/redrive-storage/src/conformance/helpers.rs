//! Helpers of the cases: terse publish / lease / ack / nack that check the store's
//! answers on the way, and predicates on errors.

use super::*;

/// `T0 + ms`.
pub fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

pub(crate) fn msg(queue: &str, payload: serde_json::Value) -> NewMessage {
    NewMessage::new(queue, payload)
}

pub(crate) fn keyed(queue: &str, key: &str, n: u32) -> NewMessage {
    NewMessage {
        key: Some(key.to_owned()),
        ..msg(queue, json!({ "key": key, "n": n }))
    }
}

pub(crate) fn failure(class: ErrorClass, text: &str) -> Failure {
    Failure::new(class, text)
}

pub(crate) async fn publish<S: Store>(s: &S, m: NewMessage, now: Timestamp) -> Message {
    let mut out = s
        .publish(vec![m], Some(now))
        .await
        .expect("publish of one item failed");
    assert_eq!(
        out.len(),
        1,
        "publish of one item answered {} items",
        out.len()
    );
    let p = out.remove(0);
    assert!(!p.replayed, "a fresh publish came back as a replay");
    p.message
}

pub(crate) async fn lease<S: Store>(
    s: &S,
    queue: &str,
    max: u32,
    lease_ms: u64,
    now: Timestamp,
) -> Vec<Leased> {
    let got = s
        .lease(
            LeaseRequest {
                queue: queue.to_owned(),
                max,
                lease_ms,
                max_bytes: None,
            },
            Some(now),
        )
        .await
        .expect("lease failed");
    assert!(
        got.len() <= max as usize,
        "lease max {max} returned {}",
        got.len()
    );
    for l in &got {
        assert_eq!(
            l.message.queue, queue,
            "lease of {queue} returned a message of {}",
            l.message.queue
        );
        assert_eq!(
            l.message.state,
            State::Leased,
            "a leased message is not in state leased"
        );
        assert_eq!(
            l.expires_at,
            now.plus_ms(lease_ms),
            "lease expiry is not now + lease"
        );
        assert_eq!(
            l.attempt, l.message.attempts,
            "Leased.attempt differs from message.attempts"
        );
    }
    got
}

/// Lease exactly one message and check it is `id`.
pub(crate) async fn lease_one<S: Store>(
    s: &S,
    queue: &str,
    id: MessageId,
    lease_ms: u64,
    now: Timestamp,
) -> Leased {
    let mut got = lease(s, queue, 1, lease_ms, now).await;
    assert_eq!(ids(&got), vec![id], "expected to lease {id}");
    got.remove(0)
}

pub(crate) fn lref(id: MessageId, token: &str) -> LeaseRef {
    LeaseRef {
        id,
        token: token.to_owned(),
    }
}

pub(crate) async fn ack<S: Store>(
    s: &S,
    id: MessageId,
    token: &str,
    now: Timestamp,
) -> Result<Acked, StoreError> {
    let mut r = s
        .ack(vec![lref(id, token).into()], Some(now))
        .await
        .expect("ack request failed as a whole");
    assert_eq!(r.len(), 1, "ack of one item answered {} items", r.len());
    r.remove(0)
}

pub(crate) async fn nack<S: Store>(
    s: &S,
    id: MessageId,
    token: &str,
    f: Failure,
    now: Timestamp,
) -> Result<FailureOutcome, StoreError> {
    let mut r = s
        .nack(
            vec![Nack {
                lease: lref(id, token),
                failure: f,
                response: None,
                waited: Vec::new(),
            }],
            Some(now),
        )
        .await
        .expect("nack request failed as a whole");
    assert_eq!(r.len(), 1, "nack of one item answered {} items", r.len());
    r.remove(0)
}

pub(crate) async fn get<S: Store>(s: &S, id: MessageId) -> Message {
    s.get(id)
        .await
        .expect("get failed")
        .unwrap_or_else(|| panic!("message {id} is missing"))
}

pub(crate) async fn stats<S: Store>(s: &S, queue: &str) -> Option<QueueStats> {
    s.queue_stats()
        .await
        .expect("queue_stats failed")
        .into_iter()
        .find(|q| q.queue == queue)
}

pub(crate) async fn count<S: Store>(s: &S, queue: &str, state: State) -> u64 {
    stats(s, queue).await.map_or(0, |q| q.count(state))
}

pub(crate) async fn tick<S: Store>(s: &S, now: Timestamp) -> crate::TickOutcome {
    s.tick(Some(now)).await.expect("tick failed")
}

pub(crate) fn ids(leased: &[Leased]) -> Vec<MessageId> {
    leased.iter().map(|l| l.message.id).collect()
}

pub(crate) fn msg_ids(messages: &[Message]) -> Vec<MessageId> {
    messages.iter().map(|m| m.id).collect()
}

/// The `Failed` entries of a history, as (attempt, dead reason).
pub(crate) fn failures(m: &Message) -> Vec<(u32, Option<DeadReason>)> {
    m.history
        .iter()
        .filter_map(|h| match &h.event {
            HistoryEvent::Failed { dead_reason, .. } => Some((h.attempt, *dead_reason)),
            _ => None,
        })
        .collect()
}

pub(crate) fn expect_err<T: std::fmt::Debug>(
    r: Result<T, StoreError>,
    what: &str,
    ok: fn(&StoreError) -> bool,
) {
    match r {
        Err(e) if ok(&e) => {}
        other => panic!("{what}: unexpected answer {other:?}"),
    }
}

pub(crate) fn is_mismatch(e: &StoreError) -> bool {
    matches!(e, StoreError::LeaseMismatch)
}

pub(crate) fn is_expired(e: &StoreError) -> bool {
    matches!(e, StoreError::LeaseExpired)
}

pub(crate) fn is_not_found(e: &StoreError) -> bool {
    matches!(e, StoreError::NotFound(_))
}

/// Lease `id` (the only ready message of `queue`) and nack it; return the outcome.
pub(crate) async fn lease_and_nack<S: Store>(
    s: &S,
    queue: &str,
    id: MessageId,
    f: Failure,
    now: Timestamp,
) -> FailureOutcome {
    let l = lease_one(s, queue, id, 30_000, now).await;
    nack(s, id, &l.token, f, now)
        .await
        .expect("nack of a live lease failed")
}

/// A message with an idempotency key.
pub(crate) fn with_ikey(queue: &str, ikey: &str, payload: serde_json::Value) -> NewMessage {
    NewMessage {
        idempotency_key: Some(ikey.to_owned()),
        ..msg(queue, payload)
    }
}
