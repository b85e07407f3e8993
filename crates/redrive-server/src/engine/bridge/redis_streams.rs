//! The Redis Streams bridge (SPEC §11): redrive behind a stream's consumer group whose
//! consumers leave unacked (`XACK` never sent) what they cannot process.
//!
//! - **Intake.** Every poll, the bridge lists the group's pending entries idle at least
//!   `min_idle` (`XPENDING … IDLE`), claims them (`XCLAIM`, same idle bound, so an entry a
//!   consumer is working on again is left alone), stores each in the redrive queue (its
//!   fields as the payload object, its stream, id and delivery count as headers; the
//!   failure is attempt 1, scheduled by the policy) under the idempotency key
//!   `redis:NAME:<entry id>`, and only then `XACK`s it. A crash between the two stores it
//!   once: the entry is claimed again and its key matches.
//! - **Retry.** When due, the bridge adds a copy to the stream (`XADD`) with the fields
//!   `redrive-retry-count`, `redrive-id` and `redrive-attempt`: the group's consumers read
//!   it as a new entry. The message is `done` until the copy comes back.
//! - **Return.** A copy left unacked is claimed like any entry and matched by `redrive-id`
//!   and `redrive-attempt` to its message ([`Store::returned`]: one more failed attempt,
//!   applied once).
//! - **Exhausted.** Dead in redrive, and added to `<stream>:dead` with `redrive-id` and
//!   `redrive-dead-reason`.
//! - **`NOGROUP`** (the stream or the group does not exist, or was deleted) and lost
//!   connections are reported in the bridge's state and retried with backoff, never fatal.
//!
//! [`Store::returned`]: redrive_storage::Store::returned

use super::{base64_decode, base64_encode, err, Bridge, ReturnApplied};
use crate::engine::Engine;
use redis::aio::MultiplexedConnection;
use redis::Value;
use redrive_core::{ErrorClass, Failure, Message, MessageId, NewMessage};
use redrive_storage::{Ack, LeaseRef, Release, Returned};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A lease of a republish lasts this long.
const REPUBLISH_LEASE_MS: u64 = 60_000;
/// Pending entries claimed per poll at most.
const CLAIM_BATCH: u32 = 100;
/// Stored headers of a bridged entry.
const H_STREAM: &str = "redis-stream";
const H_ENTRY: &str = "redis-entry-id";
const H_DELIVERIES: &str = "redis-delivery-count";
const H_BASE64: &str = "redis-base64-fields";
/// Fields the bridge adds to a copy.
const F_ID: &str = "redrive-id";
const F_ATTEMPT: &str = "redrive-attempt";
const F_RETRY_COUNT: &str = "redrive-retry-count";

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
        r = republish_loop(engine, bridge, s, conn.clone()) => r,
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
        let mut fields = Vec::new();
        for pair in kv.chunks(2) {
            if let [Value::BulkString(k), Value::BulkString(v)] = pair {
                fields.push((String::from_utf8_lossy(k).into_owned(), v.clone()));
            }
        }
        let count = deliveries.get(&id).copied().unwrap_or(1);
        take_in(engine, bridge, s, conn, &id, fields, count).await?;
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
    fields: Vec<(String, Vec<u8>)>,
    deliveries: i64,
) -> Result<(), String> {
    let field = |k: &str| {
        fields
            .iter()
            .find(|(f, _)| f == k)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
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
    let mut payload = serde_json::Map::new();
    let mut binary = Vec::new();
    for (k, v) in &fields {
        if [F_ID, F_ATTEMPT, F_RETRY_COUNT].contains(&k.as_str()) {
            continue;
        }
        let value = match String::from_utf8(v.clone()) {
            Ok(t) => t,
            Err(_) => {
                binary.push(k.clone());
                base64_encode(v)
            }
        };
        payload.insert(k.clone(), serde_json::Value::String(value));
    }
    let mut message = NewMessage::new(s.queue.clone(), serde_json::Value::Object(payload));
    message.headers = BTreeMap::from([
        (H_STREAM.to_owned(), s.stream.clone()),
        (H_ENTRY.to_owned(), entry.to_owned()),
        (H_DELIVERIES.to_owned(), deliveries.to_string()),
    ]);
    if !binary.is_empty() {
        message
            .headers
            .insert(H_BASE64.to_owned(), binary.join(","));
    }
    message.idempotency_key = Some(format!("redis:{}:{entry}", s.name));
    message.failed = Some(failure);
    for m in bridge.store(engine, vec![message]).await? {
        bury(bridge, s, conn, &m).await;
    }
    Ok(())
}

/// The fields a stored message was taken in with, in payload order.
fn fields_of(m: &Message) -> Result<Vec<(String, Vec<u8>)>, String> {
    let binary: Vec<&str> = m
        .headers
        .get(H_BASE64)
        .map(|b| b.split(',').collect())
        .unwrap_or_default();
    let object = m
        .payload
        .as_object()
        .ok_or("the payload is not the field object this bridge stored")?;
    let mut out = Vec::new();
    for (k, v) in object {
        let text = v.as_str().ok_or("a field is not a string")?;
        let bytes = if binary.contains(&k.as_str()) {
            base64_decode(text).ok_or("a binary field is not base64")?
        } else {
            text.as_bytes().to_vec()
        };
        out.push((k.clone(), bytes));
    }
    Ok(out)
}

/// `XADD stream * fields…`.
async fn add(
    conn: &mut MultiplexedConnection,
    stream: &str,
    fields: &[(String, Vec<u8>)],
) -> Result<(), String> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in fields {
        cmd.arg(k).arg(v.as_slice());
    }
    cmd.query_async::<String>(conn).await.map_err(err)?;
    Ok(())
}

/// Lease due messages and add their copies to the stream, until the connection fails.
async fn republish_loop(
    engine: &Arc<Engine>,
    bridge: &Arc<Bridge>,
    s: &RedisSettings,
    mut conn: MultiplexedConnection,
) -> Result<(), String> {
    loop {
        let leased = engine
            .lease(&s.queue, 16, None, Some(REPUBLISH_LEASE_MS), 1_000)
            .await
            .map_err(err)?;
        for l in leased {
            let lease = LeaseRef {
                id: l.message.id,
                token: l.token.clone(),
            };
            let mut fields = match fields_of(&l.message) {
                Ok(f) => f,
                Err(why) => {
                    // It cannot be sent as it came: a permanent failure, findable.
                    engine.reject(lease, why).await.map_err(err)?;
                    continue;
                }
            };
            fields.push((
                F_RETRY_COUNT.to_owned(),
                l.attempt.saturating_sub(1).to_string().into_bytes(),
            ));
            fields.push((F_ID.to_owned(), l.message.id.to_string().into_bytes()));
            fields.push((F_ATTEMPT.to_owned(), l.attempt.to_string().into_bytes()));
            match add(&mut conn, &s.stream, &fields).await {
                Ok(()) => {
                    bridge.counters.republished.fetch_add(1, Ordering::Relaxed);
                    // A copy read and left unacked comes back as a return; this ack may
                    // then be refused, as it should be.
                    let _ = engine.ack(vec![Ack::from(lease)]).await;
                }
                Err(e) => {
                    bridge
                        .counters
                        .republish_refused
                        .fetch_add(1, Ordering::Relaxed);
                    let until = engine.clock().now().plus_ms(1_000);
                    let _ = engine
                        .release(vec![Release {
                            lease,
                            until,
                            waited: Vec::new(),
                        }])
                        .await;
                    return Err(e);
                }
            }
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
    bridge.counters.dead.fetch_add(1, Ordering::Relaxed);
    let Ok(mut fields) = fields_of(m) else { return };
    fields.push((F_ID.to_owned(), m.id.to_string().into_bytes()));
    if let Some(reason) = m.dead_reason {
        fields.push((
            "redrive-dead-reason".to_owned(),
            reason.as_str().as_bytes().to_vec(),
        ));
    }
    if let Err(e) = add(conn, &s.dead_stream(), &fields).await {
        tracing::warn!(bridge = %s.name, message = %m.id, error = %e,
            "could not add a dead entry to the dead stream; it stays dead in redrive");
    }
}
