//! The Redis Streams bridge (SPEC §11): redrive behind a stream's consumer group whose
//! consumers leave unacked (`XACK` never sent) what they cannot process.
//!
//! - **Intake.** Every poll, the bridge lists the group's pending entries idle at least
//!   `min_idle` (`XPENDING … IDLE`), claims them (`XCLAIM`, same idle bound, so an entry a
//!   consumer is working on again is left alone), stores each in the redrive queue (its
//!   fields as the payload, see below; its stream, id and delivery count as headers; the
//!   failure is attempt 1, scheduled by the policy) under the idempotency key
//!   `redis:NAME:<entry id>`, and only then `XACK`s it. A crash between the two stores it
//!   once: the entry is claimed again and its key matches (an entry id names one entry).
//! - **Fields, byte-exact and in order.** The payload is an object of the fields, name →
//!   value, a value as a string when it is UTF-8 and as `{"base64": "…"}` when it is not;
//!   a JSON object keeps its keys sorted, so when the entry's order is another, header
//!   `redis-fields` lists the names in the entry's order. An entry whose field names are
//!   not all UTF-8, or repeat one another, is kept as an array of `[name, value]` pairs
//!   instead (each a string or `{"base64": …}`). An operator's edit of the object is
//!   republished in the stored order, new fields last.
//! - **Limits.** A stored entry obeys the publish limits ([`super::IntakeLimits`]); one
//!   over them is stored dead without what is over, and added to `<stream>:dead` as it
//!   came, before the `XACK`.
//! - **Retry.** When due, the bridge adds a copy to the stream (`XADD`) with the fields
//!   `redrive-retry-count`, `redrive-id` and `redrive-attempt`: the group's consumers read
//!   it as a new entry. The message is `done` (`republished` in its history) until the copy
//!   comes back. The republish is a [`Deliverer`] of the consume driver
//!   ([`crate::engine::consume`]): a store fault while leasing or settling is backed off
//!   there and never reconnects; a store fault while taking an entry in leaves it pending
//!   (not `XACK`ed), claimed again at the next poll.
//! - **Return.** A copy left unacked is claimed like any entry and matched by `redrive-id`
//!   and `redrive-attempt` to its message ([`Store::returned`]: one more failed attempt,
//!   applied once).
//! - **Exhausted.** Dead in redrive, and added to `<stream>:dead` with `redrive-id` and
//!   `redrive-dead-reason`.
//! - **`NOGROUP`** (the stream or the group does not exist, or was deleted) and lost
//!   connections are reported in the bridge's state and retried with backoff, never fatal.
//!
//! [`Store::returned`]: redrive_storage::Store::returned

use super::{base64_decode, base64_encode, err, Bridge, IntakeLimits, ReturnApplied, H_REFUSED};
use crate::engine::consume::{
    self, CutShort, Deliverer, DelivererFault, LeaseAsk, Settlement, Settler,
};
use crate::engine::{Engine, Event};
use redis::aio::MultiplexedConnection;
use redis::Value;
use redrive_core::{ErrorClass, Failure, Message, MessageId, NewMessage};
use redrive_storage::{Ack, LeaseRef, Leased, Release, Returned, StoreError};
use serde_json::{Map, Value as Json};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A lease of a republish lasts this long.
const REPUBLISH_LEASE_MS: u64 = 60_000;
/// Messages leased and republished together.
const REPUBLISH_BATCH: u32 = 16;
/// After a failed republish, the message is due again this much later.
const REPUBLISH_RETRY_MS: u64 = 1_000;
/// After a store fault while taking entries in, the next claim waits this long (the
/// entries stay pending meanwhile, and are claimed again).
const INTAKE_BACKOFF: Duration = Duration::from_secs(1);
/// Pending entries claimed per poll at most.
const CLAIM_BATCH: u32 = 100;
/// Stored headers of a bridged entry.
const H_STREAM: &str = "redis-stream";
const H_ENTRY: &str = "redis-entry-id";
const H_DELIVERIES: &str = "redis-delivery-count";
/// The field names in the entry's order, when it is not the payload object's (sorted).
const H_FIELDS: &str = "redis-fields";
/// Messages stored before values became `{"base64": …}`: the names of base64 values.
const H_BASE64: &str = "redis-base64-fields";
/// Fields the bridge adds to a copy.
const F_ID: &str = "redrive-id";
const F_ATTEMPT: &str = "redrive-attempt";
const F_RETRY_COUNT: &str = "redrive-retry-count";
/// The part of `max_header_bytes` the field order may take; an entry whose order needs
/// more is kept as pairs (which keep their order themselves).
const FIELD_ORDER_SHARE: usize = 4;

/// One Redis Streams bridge's settings, checked.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// The bridge's name (`[bridges.redis_streams.NAME]`).
    pub name: String,
    /// `redis://host:port[/db]`.
    pub url: String,
    /// The stream.
    pub stream: String,
    /// Its consumer group.
    pub group: String,
    /// A pending entry idle this long has failed, ms.
    pub min_idle_ms: u64,
    /// The redrive queue that holds the entries (its retry policy applies).
    pub queue: String,
    /// The size limits a stored entry obeys (those of a publish).
    pub limits: IntakeLimits,
}

impl RedisSettings {
    /// The consumer name the bridge claims as.
    fn consumer(&self) -> String {
        format!("redrive-bridge-{}", self.name)
    }

    /// Where exhausted entries go.
    fn dead_stream(&self) -> String {
        format!("{}:dead", self.stream)
    }
}

/// The fields of an entry: (name, value) pairs, bytes, in the entry's order.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// One connection's life: claim idle pending entries, republish what is due. `Ok` only
/// when stopped.
pub(super) async fn session(
    engine: &Arc<Engine>,
    bridge: &Arc<Bridge>,
    s: &RedisSettings,
    stop: &mut watch::Receiver<bool>,
    connected: &mut bool,
) -> Result<(), String> {
    let client = redis::Client::open(s.url.as_str()).map_err(err)?;
    let mut conn = client
        .get_multiplexed_tokio_connection()
        .await
        .map_err(err)?;
    // The group must exist: say so (and retry) rather than claim from nothing.
    pending(&mut conn, s).await?;
    *connected = true;
    bridge.counters.connects.fetch_add(1, Ordering::Relaxed);
    bridge.set_state("connected", None);
    tracing::info!(bridge = %s.name, stream = %s.stream, group = %s.group, queue = %s.queue, "bridge connected");
    let poll = Duration::from_millis((s.min_idle_ms / 2).clamp(20, 1_000));
    let republisher = Republisher {
        bridge,
        s,
        engine,
        conn: conn.clone(),
    };
    let consumer_name = format!("bridge {}", s.name);
    let republish_stop = stop.clone();
    let claim_loop = async {
        let mut conn = conn.clone();
        loop {
            let claimed = claim(engine, bridge, s, &mut conn).await?;
            if claimed == 0 {
                tokio::time::sleep(poll).await;
            }
        }
    };
    tokio::select! {
        r = claim_loop => r,
        r = consume::run(engine, &s.queue, &consumer_name, republisher, republish_stop) => {
            r.map_err(|f| f.error)
        }
        _ = stop.changed() => Ok(()),
    }
}

/// Text of a reply value.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Bytes of a reply value, exactly.
fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

/// The group's entries idle at least `min_idle`: (id, times delivered).
async fn pending(
    conn: &mut MultiplexedConnection,
    s: &RedisSettings,
) -> Result<Vec<(String, i64)>, String> {
    let reply: Value = redis::cmd("XPENDING")
        .arg(&s.stream)
        .arg(&s.group)
        .arg("IDLE")
        .arg(s.min_idle_ms)
        .arg("-")
        .arg("+")
        .arg(CLAIM_BATCH)
        .query_async(conn)
        .await
        .map_err(|e| {
            if e.code() == Some("NOGROUP") {
                format!(
                    "NOGROUP: stream {} has no consumer group {} (create it, or fix the bridge's \
                     stream / group)",
                    s.stream, s.group
                )
            } else {
                e.to_string()
            }
        })?;
    let Value::Array(entries) = reply else {
        return Ok(Vec::new());
    };
    Ok(entries
        .iter()
        .filter_map(|e| match e {
            Value::Array(f) if f.len() >= 4 => {
                Some((text(&f[0])?, text(&f[3])?.parse().unwrap_or(1)))
            }
            _ => None,
        })
        .collect())
}

/// Claim the idle pending entries, store them, ack them. Answers how many it took.
async fn claim(
    engine: &Arc<Engine>,
    bridge: &Arc<Bridge>,
    s: &RedisSettings,
    conn: &mut MultiplexedConnection,
) -> Result<usize, String> {
    let idle = pending(conn, s).await?;
    if idle.is_empty() {
        return Ok(0);
    }
    let deliveries: BTreeMap<String, i64> = idle.iter().cloned().collect();
    let mut cmd = redis::cmd("XCLAIM");
    cmd.arg(&s.stream)
        .arg(&s.group)
        .arg(s.consumer())
        .arg(s.min_idle_ms);
    for (id, _) in &idle {
        cmd.arg(id);
    }
    let reply: Value = cmd.query_async(conn).await.map_err(err)?;
    let Value::Array(entries) = reply else {
        return Ok(0);
    };
    let mut taken = 0;
    for e in entries {
        let Value::Array(parts) = e else { continue };
        let (Some(id), Some(Value::Array(kv))) = (parts.first().and_then(text), parts.get(1))
        else {
            continue;
        };
        let fields: Fields = kv
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((bytes(k)?, bytes(v)?)),
                _ => None,
            })
            .collect();
        let count = deliveries.get(&id).copied().unwrap_or(1);
        if let Err(e) = take_in(engine, bridge, s, conn, &id, fields, count).await {
            // A store fault, not the broker's: the entry is not acked, so it stays pending
            // and is claimed again; the connection is kept.
            tracing::error!(bridge = %s.name, queue = %s.queue, entry = %id, error = %e,
                "could not store a claimed entry (a store fault); it stays pending and is claimed again");
            engine.observe(Event::ConsumeStoreFault {
                queue: &s.queue,
                operation: "intake",
            });
            tokio::time::sleep(INTAKE_BACKOFF).await;
            return Ok(taken);
        }
        redis::cmd("XACK")
            .arg(&s.stream)
            .arg(&s.group)
            .arg(&id)
            .query_async::<i64>(conn)
            .await
            .map_err(err)?;
        taken += 1;
    }
    Ok(taken)
}

/// Store one claimed entry (or match it to the message it is a copy of).
async fn take_in(
    engine: &Arc<Engine>,
    bridge: &Arc<Bridge>,
    s: &RedisSettings,
    conn: &mut MultiplexedConnection,
    entry: &str,
    fields: Fields,
    deliveries: i64,
) -> Result<(), StoreError> {
    let field = |k: &str| {
        fields
            .iter()
            .find(|(f, _)| f.as_slice() == k.as_bytes())
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    };
    let failure = Failure {
        class: ErrorClass::Transient,
        message: Some(format!(
            "not acked by group {} within {} ms (delivered {deliveries} times)",
            s.group, s.min_idle_ms
        )),
        retry_after_ms: None,
        code: Some("redis_idle".to_owned()),
    };
    if let (Some(id), Some(attempt)) = (
        field(F_ID).and_then(|i| i.parse::<MessageId>().ok()),
        field(F_ATTEMPT).and_then(|a| a.parse::<u32>().ok()),
    ) {
        let returned = Returned {
            id,
            attempt,
            failure: failure.clone(),
        };
        if let ReturnApplied::Done(dead) = bridge.apply_return(engine, returned).await? {
            if let Some(m) = dead {
                bury(bridge, s, conn, &m).await;
            }
            return Ok(());
        }
    }
    let own: Fields = fields
        .iter()
        .filter(|(k, _)| {
            ![F_ID, F_ATTEMPT, F_RETRY_COUNT]
                .iter()
                .any(|f| f.as_bytes() == k.as_slice())
        })
        .cloned()
        .collect();
    let (payload, order) = payload_of(&own, s.limits.max_header_bytes / FIELD_ORDER_SHARE);
    let mut message = NewMessage::new(s.queue.clone(), payload);
    message.headers = BTreeMap::from([
        (H_STREAM.to_owned(), s.stream.clone()),
        (H_ENTRY.to_owned(), entry.to_owned()),
        (H_DELIVERIES.to_owned(), deliveries.to_string()),
    ]);
    if let Some(order) = order {
        message.headers.insert(H_FIELDS.to_owned(), order);
    }
    message.idempotency_key = Some(format!("redis:{}:{entry}", s.name));
    message.failed = Some(failure);
    let refused = s.limits.refuse_oversize(&mut message, &[H_FIELDS]);
    for m in bridge
        .store(engine, vec![message])
        .await?
        .into_iter()
        .flatten()
    {
        if refused {
            bury_fields(bridge, s, conn, &m, own.clone()).await;
        } else {
            bury(bridge, s, conn, &m).await;
        }
    }
    Ok(())
}

/// A field value as JSON: a string when it is UTF-8, else `{"base64": "…"}`.
fn value_json(v: &[u8]) -> Json {
    match std::str::from_utf8(v) {
        Ok(t) => Json::String(t.to_owned()),
        Err(_) => {
            let mut m = Map::new();
            m.insert("base64".to_owned(), Json::String(base64_encode(v)));
            Json::Object(m)
        }
    }
}

/// A field value back to bytes: a string, `{"base64": "…"}`, or (an operator's edit) a
/// number or boolean as its JSON text.
fn value_bytes(v: &Json) -> Result<Vec<u8>, String> {
    match v {
        Json::String(t) => Ok(t.as_bytes().to_vec()),
        Json::Object(m) if m.len() == 1 => match m.get("base64") {
            Some(Json::String(b)) => base64_decode(b).ok_or_else(|| format!("{b:?} is not base64")),
            _ => Err(format!(
                "{v} is not a field value (a string or {{\"base64\": …}})"
            )),
        },
        Json::Number(_) | Json::Bool(_) => Ok(v.to_string().into_bytes()),
        _ => Err(format!(
            "{v} is not a field value (a string or {{\"base64\": …}})"
        )),
    }
}

/// An entry's fields as the payload, and the field order header when the payload object
/// does not keep the order (`order_max`: the most bytes that header may take).
fn payload_of(fields: &[(Vec<u8>, Vec<u8>)], order_max: usize) -> (Json, Option<String>) {
    let names: Option<Vec<&str>> = fields
        .iter()
        .map(|(k, _)| std::str::from_utf8(k).ok())
        .collect();
    let pairs = || {
        Json::Array(
            fields
                .iter()
                .map(|(k, v)| Json::Array(vec![value_json(k), value_json(v)]))
                .collect(),
        )
    };
    let Some(names) = names else {
        return (pairs(), None);
    };
    if names.iter().collect::<HashSet<_>>().len() != names.len() {
        return (pairs(), None);
    }
    let mut object = Map::new();
    for ((_, v), name) in fields.iter().zip(&names) {
        object.insert((*name).to_owned(), value_json(v));
    }
    if names.windows(2).all(|w| w[0] < w[1]) {
        return (Json::Object(object), None);
    }
    let order = Json::from(names).to_string();
    if order.len() > order_max {
        return (pairs(), None);
    }
    (Json::Object(object), Some(order))
}

/// The fields a stored message was taken in with (its payload as an operator may have
/// edited it), in the entry's order.
fn fields_of(m: &Message) -> Result<Fields, String> {
    super::republishable(m)?;
    match &m.payload {
        Json::Array(pairs) => pairs
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([k, v]) => Ok((value_bytes(k)?, value_bytes(v)?)),
                _ => Err(format!("{p} is not a [name, value] pair")),
            })
            .collect(),
        Json::Object(object) => {
            let legacy: Vec<&str> = m
                .headers
                .get(H_BASE64)
                .map(|b| b.split(',').collect())
                .unwrap_or_default();
            let order: Vec<String> = match m.headers.get(H_FIELDS) {
                Some(o) => serde_json::from_str(o)
                    .map_err(|e| format!("header {H_FIELDS} is not a JSON array of names: {e}"))?,
                None => Vec::new(),
            };
            // The stored order first (the names still there), then any name an edit added.
            let mut names: Vec<&str> = order
                .iter()
                .map(String::as_str)
                .filter(|n| object.contains_key(*n))
                .collect();
            for k in object.keys() {
                if !names.contains(&k.as_str()) {
                    names.push(k);
                }
            }
            names
                .into_iter()
                .map(|k| {
                    let v = &object[k];
                    let value = match v.as_str() {
                        Some(text) if legacy.contains(&k) => {
                            base64_decode(text).ok_or("a binary field is not base64")?
                        }
                        _ => value_bytes(v).map_err(|e| format!("field {k}: {e}"))?,
                    };
                    Ok((k.as_bytes().to_vec(), value))
                })
                .collect()
        }
        _ => Err("the payload is not the fields this bridge stored".to_owned()),
    }
}

/// `XADD stream * fields…`.
async fn add(
    conn: &mut MultiplexedConnection,
    stream: &str,
    fields: &[(Vec<u8>, Vec<u8>)],
) -> Result<(), String> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in fields {
        cmd.arg(k.as_slice()).arg(v.as_slice());
    }
    cmd.query_async::<String>(conn).await.map_err(err)?;
    Ok(())
}

/// The republish, as a [`Deliverer`] of the consume driver: leases due messages and adds
/// their copies to the stream. Its fault is the connection's: a store fault is the
/// driver's to survive, never a reason to reconnect.
struct Republisher<'a> {
    bridge: &'a Arc<Bridge>,
    s: &'a RedisSettings,
    engine: &'a Arc<Engine>,
    conn: MultiplexedConnection,
}

impl Deliverer for Republisher<'_> {
    async fn admit(&mut self) -> LeaseAsk {
        LeaseAsk {
            max: REPUBLISH_BATCH,
            lease_ms: REPUBLISH_LEASE_MS,
        }
    }

    /// `XADD` a copy of each: added, the message is `republished`. A failed `XADD` hands
    /// it and the rest of the batch back (due again in [`REPUBLISH_RETRY_MS`]) and ends the
    /// session.
    async fn deliver(
        &mut self,
        leased: Vec<Leased>,
        _settler: &Settler,
    ) -> Result<Vec<Settlement>, CutShort> {
        let engine = self.engine;
        let retry_at = || engine.clock().now().plus_ms(REPUBLISH_RETRY_MS);
        let counters = &self.bridge.counters;
        let mut settle = Vec::with_capacity(leased.len());
        let mut fault = None;
        for l in leased {
            let lease = LeaseRef {
                id: l.message.id,
                token: l.token.clone(),
            };
            if fault.is_some() {
                settle.push(Settlement::Release(Release::by_redrive(lease, retry_at())));
                continue;
            }
            let mut fields = match fields_of(&l.message) {
                Ok(f) => f,
                Err(why) => {
                    // It cannot be sent as it came: a permanent failure, findable.
                    settle.push(Settlement::reject(lease, why));
                    continue;
                }
            };
            fields.push((
                F_RETRY_COUNT.as_bytes().to_vec(),
                l.attempt.saturating_sub(1).to_string().into_bytes(),
            ));
            fields.push((
                F_ID.as_bytes().to_vec(),
                l.message.id.to_string().into_bytes(),
            ));
            fields.push((
                F_ATTEMPT.as_bytes().to_vec(),
                l.attempt.to_string().into_bytes(),
            ));
            match add(&mut self.conn, &self.s.stream, &fields).await {
                Ok(()) => {
                    counters.republished.fetch_add(1, Ordering::Relaxed);
                    // A copy read and left unacked comes back as a return; this ack may
                    // then be refused, as it should be.
                    settle.push(Settlement::Ack(Ack::republished(lease)));
                }
                Err(e) => {
                    counters.republish_refused.fetch_add(1, Ordering::Relaxed);
                    settle.push(Settlement::Release(Release::by_redrive(lease, retry_at())));
                    fault = Some(e);
                }
            }
        }
        match fault {
            None => Ok(settle),
            Some(e) => Err(CutShort {
                fault: DelivererFault::new(e),
                settle,
            }),
        }
    }
}

/// An exhausted entry: count it, and add it to `<stream>:dead`.
async fn bury(
    bridge: &Arc<Bridge>,
    s: &RedisSettings,
    conn: &mut MultiplexedConnection,
    m: &Message,
) {
    let Ok(fields) = fields_of(m) else {
        bridge.counters.dead.fetch_add(1, Ordering::Relaxed);
        return;
    };
    bury_fields(bridge, s, conn, m, fields).await;
}

/// A dead entry with these fields (as stored, or as it came when it was over a size
/// limit): count it, and add it to `<stream>:dead` with `redrive-id`,
/// `redrive-dead-reason` (and `redrive-refused`).
async fn bury_fields(
    bridge: &Arc<Bridge>,
    s: &RedisSettings,
    conn: &mut MultiplexedConnection,
    m: &Message,
    mut fields: Fields,
) {
    bridge.counters.dead.fetch_add(1, Ordering::Relaxed);
    fields.push((F_ID.as_bytes().to_vec(), m.id.to_string().into_bytes()));
    if let Some(reason) = m.dead_reason {
        fields.push((
            b"redrive-dead-reason".to_vec(),
            reason.as_str().as_bytes().to_vec(),
        ));
    }
    if let Some(code) = m.headers.get(H_REFUSED) {
        tracing::warn!(bridge = %s.name, message = %m.id, code = %code,
            "an entry is over the size limits: stored dead without what is over, added to the dead stream as it came");
        fields.push((b"redrive-refused".to_vec(), code.as_bytes().to_vec()));
    }
    if let Err(e) = add(conn, &s.dead_stream(), &fields).await {
        tracing::warn!(bridge = %s.name, message = %m.id, error = %e,
            "could not add a dead entry to the dead stream; it stays dead in redrive");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(payload: Json, headers: BTreeMap<String, String>) -> Message {
        super::super::stored_for_test(payload, headers)
    }

    /// Through the store's JSON text and back, as a republish sees it.
    fn round_trip(fields: &Fields) -> (Json, Fields) {
        let (payload, order) = payload_of(fields, 4096);
        let text = serde_json::to_string(&payload).unwrap();
        let mut headers = BTreeMap::new();
        if let Some(o) = order {
            headers.insert(H_FIELDS.to_owned(), o);
        }
        let back = stored(serde_json::from_str(&text).unwrap(), headers);
        (payload, fields_of(&back).unwrap())
    }

    fn f(k: &[u8], v: &[u8]) -> (Vec<u8>, Vec<u8>) {
        (k.to_vec(), v.to_vec())
    }

    #[test]
    fn utf8_fields_are_an_object_in_the_entry_order() {
        let fields = vec![
            f(b"zeta", b"1"),
            f(b"alpha", b"two"),
            f(b"mid", b"\xff\x00"),
        ];
        let (payload, back) = round_trip(&fields);
        assert_eq!(
            payload,
            json!({"zeta": "1", "alpha": "two", "mid": {"base64": "/wA="}})
        );
        assert_eq!(back, fields, "order or bytes changed");
        // Already sorted: no order header.
        let sorted = vec![f(b"a", b"1"), f(b"b", b"2")];
        assert_eq!(payload_of(&sorted, 4096).1, None);
    }

    #[test]
    fn non_utf8_or_repeated_names_are_pairs_kept_exactly() {
        let fields = vec![f(b"k\xffey", b"v\xfe"), f(b"a", b"1"), f(b"a", b"2")];
        let (payload, back) = round_trip(&fields);
        assert_eq!(
            payload,
            json!([[{"base64": "a/9leQ=="}, {"base64": "dv4="}], ["a", "1"], ["a", "2"]])
        );
        assert_eq!(back, fields);
    }

    #[test]
    fn an_order_too_long_for_the_headers_is_kept_as_pairs() {
        let fields: Fields = (0..50u8)
            .rev()
            .map(|i| f(format!("field-{i:02}").as_bytes(), b"x"))
            .collect();
        let (payload, order) = payload_of(&fields, 64);
        assert!(payload.is_array(), "{payload}");
        assert_eq!(order, None);
    }

    #[test]
    fn an_edited_object_keeps_the_stored_order_and_adds_new_fields_last() {
        let headers = BTreeMap::from([(H_FIELDS.to_owned(), r#"["z","gone","a"]"#.to_owned())]);
        let m = stored(json!({"a": "1", "z": 26, "new": "n"}), headers);
        assert_eq!(
            fields_of(&m).unwrap(),
            vec![f(b"z", b"26"), f(b"a", b"1"), f(b"new", b"n")]
        );
        let bad = stored(json!({"a": [1]}), BTreeMap::new());
        assert!(fields_of(&bad).is_err());
    }

    #[test]
    fn messages_stored_before_keep_their_base64_fields() {
        let headers = BTreeMap::from([(H_BASE64.to_owned(), "bin".to_owned())]);
        let m = stored(json!({"bin": "/wA=", "t": "x"}), headers);
        assert_eq!(
            fields_of(&m).unwrap(),
            vec![f(b"bin", b"\xff\x00"), f(b"t", b"x")]
        );
    }
}
