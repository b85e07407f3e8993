//! The consumer side of the API as the bench uses it: lease a batch, then
//! batch-ack / batch-nack, with per-item results.
//!
//! With a lease of at most one message (`--batch 1`), the bench settles as a
//! one-at-a-time worker (a PHP worker, say) does: one `POST /v1/messages/{id}/ack`
//! or `/nack` per message, not the batch endpoints.

use super::{Ctx, BENCH_LEASE_MS};
use redrive_client::ErrorDetail;
use redrive_core::State;
use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One leased message: the fields the bench reads of the client's
/// [`redrive_client::LeasedMessage`] (decoding only these keeps the consumer cheap).
#[derive(Debug, Deserialize)]
pub struct Leased {
    /// Message id.
    pub id: String,
    /// Lease token.
    pub lease: String,
    /// Delivery number, 1 for the first.
    #[serde(default)]
    pub attempt: u32,
    /// The payload (`{"run", "n", "t", …}` for this bench's messages).
    #[serde(default)]
    pub payload: Value,
    /// When the lease expires (RFC 3339, ms): the server's lease time is this minus the
    /// bench's lease length ([`Leased::leased_at_ms`]).
    #[serde(default)]
    pub lease_expires_at: Option<String>,
}

impl Leased {
    /// Whether this message was published by the run `run_id`.
    pub fn is_from(&self, run_id: &str) -> bool {
        self.payload.get("run").and_then(Value::as_str) == Some(run_id)
    }

    /// When the server leased it, ms since the epoch (its lease's expiry minus the bench's
    /// lease length, [`BENCH_LEASE_MS`]).
    pub fn leased_at_ms(&self) -> Option<i64> {
        let expires = redrive_core::Timestamp::parse(self.lease_expires_at.as_deref()?).ok()?;
        Some(expires.as_millis() - BENCH_LEASE_MS)
    }

    /// An integer field of the payload.
    pub fn payload_i64(&self, key: &str) -> Option<i64> {
        self.payload.get(key).and_then(Value::as_i64)
    }
}

#[derive(Debug, Deserialize)]
struct LeaseAnswer {
    #[serde(default)]
    messages: Vec<Leased>,
}

/// One item of a batch ack or nack.
#[derive(Debug, Serialize)]
pub struct Item<'a> {
    /// Message id.
    pub id: &'a str,
    /// Lease token.
    pub lease: &'a str,
    /// The failure, for a nack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<NackError>,
}

/// The failure a bench nack reports.
#[derive(Debug, Clone, Serialize)]
pub struct NackError {
    /// Error class.
    pub class: &'static str,
    /// Message.
    pub message: &'static str,
}

/// The transient failure of the retry-cycle workload.
pub const TRANSIENT: NackError = NackError {
    class: "transient",
    message: "bench",
};

#[derive(Debug, Serialize)]
struct Batch<'a> {
    items: &'a [Item<'a>],
}

/// The body of a single-message ack (`{"lease"}`) or nack (`{"lease", "error"}`).
#[derive(Debug, Serialize)]
struct Single<'a> {
    lease: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a NackError>,
}

impl<'a> Single<'a> {
    fn of(item: &'a Item<'a>) -> Self {
        Self {
            lease: item.lease,
            error: item.error.as_ref(),
        }
    }
}

/// The answer to a single ack / nack: the message (the bench reads its state).
#[derive(Debug, Deserialize)]
struct SingleAnswer {
    state: State,
}

/// The result of one item of a batch ack/nack: the fields the bench reads of the
/// client's [`redrive_client::BatchResult`].
#[derive(Debug, Deserialize)]
pub struct ItemResult {
    /// HTTP status of this item.
    #[serde(default)]
    pub status: u16,
    /// The message after the transition (nack: its new state).
    #[serde(default)]
    pub message: Option<MessageState>,
    /// The item's error.
    #[serde(default)]
    pub error: Option<ErrorDetail>,
}

/// The state of a message after a transition (the only field of it the bench reads).
#[derive(Debug, Deserialize)]
pub struct MessageState {
    /// The new state.
    pub state: State,
}

impl ItemResult {
    /// The message's state after the transition, if given.
    pub fn new_state(&self) -> Option<State> {
        self.message.as_ref().map(|m| m.state)
    }
}

#[derive(Debug, Deserialize)]
struct BatchAnswer {
    #[serde(default)]
    items: Vec<ItemResult>,
}

/// The URLs a consumer uses.
#[derive(Debug, Clone)]
pub struct Urls {
    lease: Url,
    ack: Url,
    nack: Url,
    lease_body: String,
    /// Settle with the single-message endpoints (leases of at most one message).
    single: bool,
}

impl Urls {
    /// For the run's queue, leasing up to `max` messages, long-polling `wait`.
    pub fn new(ctx: &Ctx, max: u32, wait: &str) -> Self {
        Self {
            lease: ctx.url(&["v1", "queues", &ctx.queue, "leases"]),
            ack: ctx.url(&["v1", "messages", "ack"]),
            nack: ctx.url(&["v1", "messages", "nack"]),
            lease_body: format!(r#"{{"max":{max},"lease":"{BENCH_LEASE_MS}ms","wait":"{wait}"}}"#),
            single: max == 1,
        }
    }

    /// These URLs on the node task `task` is given ([`super::on_node`]).
    pub fn on_node(&self, nodes: &[Url], task: usize) -> Self {
        Self {
            lease: super::on_node(&self.lease, nodes, task),
            ack: super::on_node(&self.ack, nodes, task),
            nack: super::on_node(&self.nack, nodes, task),
            ..self.clone()
        }
    }

    /// Whether acks and nacks go one message per request to `/v1/messages/{id}/ack|nack`.
    pub fn single(&self) -> bool {
        self.single
    }
}

/// Lease a batch; `None` when the request failed (counted in the tally).
pub async fn lease(ctx: &Ctx, urls: &Urls) -> Option<Vec<Leased>> {
    let bytes = ctx.post(&urls.lease, urls.lease_body.clone()).await?;
    match serde_json::from_slice::<LeaseAnswer>(&bytes) {
        Ok(a) => Some(a.messages),
        Err(e) => {
            ctx.errors.record("unexpected lease answer", e.to_string());
            None
        }
    }
}

/// Batch-ack (`nack = false`) or batch-nack `items`; one result per item in order,
/// or `None` if the request failed as a whole. Failed items are counted in the tally.
pub async fn settle(
    ctx: &Ctx,
    urls: &Urls,
    items: &[Item<'_>],
    nack: bool,
) -> Option<Vec<ItemResult>> {
    if items.is_empty() {
        return Some(Vec::new());
    }
    if urls.single {
        return Some(settle_one_by_one(ctx, &urls.ack, items, nack).await);
    }
    let body = serde_json::to_string(&Batch { items }).ok()?;
    let url = if nack { &urls.nack } else { &urls.ack };
    let bytes = ctx.post(url, body).await?;
    let answer: BatchAnswer = match serde_json::from_slice(&bytes) {
        Ok(a) => a,
        Err(e) => {
            ctx.errors.record("unexpected batch answer", e.to_string());
            return None;
        }
    };
    let verb = if nack { "nack" } else { "ack" };
    for r in answer.items.iter().filter(|r| r.status != 200) {
        let code = r.error.as_ref().map_or("?", |e| e.code.as_str());
        let message = r.error.as_ref().map_or("", |e| e.message.as_str());
        ctx.errors.record(
            format!("{verb} item {} {code}", r.status),
            message.to_owned(),
        );
    }
    Some(answer.items)
}

/// Ack or nack `items` one request each (`POST /v1/messages/{id}/ack|nack`, on the node
/// of `node`, a URL of it), in order; an item whose request failed gets status 0 (the
/// failure is in the tally).
async fn settle_one_by_one(
    ctx: &Ctx,
    node: &Url,
    items: &[Item<'_>],
    nack: bool,
) -> Vec<ItemResult> {
    let verb = if nack { "nack" } else { "ack" };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let mut url = ctx.url(&["v1", "messages", item.id, verb]);
        // Both are http URLs with a host: these cannot fail.
        let _ = url.set_host(node.host_str());
        let _ = url.set_port(node.port());
        let failed = ItemResult {
            status: 0,
            message: None,
            error: None,
        };
        let Ok(body) = serde_json::to_string(&Single::of(item)) else {
            out.push(failed);
            continue;
        };
        let Some(bytes) = ctx.post(&url, body).await else {
            out.push(failed);
            continue;
        };
        match serde_json::from_slice::<SingleAnswer>(&bytes) {
            Ok(a) => out.push(ItemResult {
                status: 200,
                message: Some(MessageState { state: a.state }),
                error: None,
            }),
            Err(e) => {
                ctx.errors
                    .record(format!("unexpected {verb} answer"), e.to_string());
                out.push(failed);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_bodies() {
        let items = [
            Item {
                id: "a",
                lease: "l1",
                error: None,
            },
            Item {
                id: "b",
                lease: "l2",
                error: Some(TRANSIENT),
            },
        ];
        assert_eq!(
            serde_json::to_string(&Batch { items: &items }).unwrap(),
            r#"{"items":[{"id":"a","lease":"l1"},{"id":"b","lease":"l2","error":{"class":"transient","message":"bench"}}]}"#
        );
    }

    #[test]
    fn a_lease_of_one_settles_one_by_one() {
        let ctx = Ctx {
            api: redrive_client::Client::new("http://127.0.0.1:1").unwrap(),
            queue: "q".into(),
            run_id: "r".into(),
            pad: String::new(),
            errors: Default::default(),
            progress: Default::default(),
        };
        let one = Urls::new(&ctx, 1, "1s");
        assert!(one.single());
        assert!(one.lease_body.contains(r#""max":1"#));
        // The lease asked for is the one `Leased::leased_at_ms` takes off the expiry.
        let body: serde_json::Value = serde_json::from_str(&one.lease_body).unwrap();
        assert_eq!(
            redrive_core::parse_duration_ms(body["lease"].as_str().unwrap()).ok(),
            u64::try_from(BENCH_LEASE_MS).ok()
        );
        assert!(!Urls::new(&ctx, 2, "1s").single());
        assert!(!Urls::new(&ctx, 100, "1s").single());
        assert_eq!(
            ctx.url(&["v1", "messages", "01J/x", "ack"]).path(),
            "/v1/messages/01J%2Fx/ack"
        );
    }

    #[test]
    fn single_bodies() {
        let ack = Item {
            id: "a",
            lease: "l1",
            error: None,
        };
        let nack = Item {
            id: "b",
            lease: "l2",
            error: Some(TRANSIENT),
        };
        assert_eq!(
            serde_json::to_string(&Single::of(&ack)).unwrap(),
            r#"{"lease":"l1"}"#
        );
        assert_eq!(
            serde_json::to_string(&Single::of(&nack)).unwrap(),
            r#"{"lease":"l2","error":{"class":"transient","message":"bench"}}"#
        );
        let a: SingleAnswer =
            serde_json::from_str(r#"{"id":"b","state":"ready","attempts":1,"queue":"q"}"#).unwrap();
        assert_eq!(a.state, State::Ready);
    }

    #[test]
    fn item_results_find_the_state() {
        let r: BatchAnswer = serde_json::from_str(
            r#"{"items":[{"id":"a","status":200,"message":{"state":"ready"}},{"id":"b","status":200,"message":{"state":"dead","attempts":3}},
                {"id":"c","status":409,"error":{"code":"lease_expired","message":"x"}}]}"#,
        )
        .unwrap();
        assert_eq!(r.items[0].new_state(), Some(State::Ready));
        assert_eq!(r.items[1].new_state(), Some(State::Dead));
        assert_eq!(r.items[2].new_state(), None);
        assert_eq!(r.items[2].status, 409);
        assert_eq!(r.items[2].error.as_ref().unwrap().code, "lease_expired");
    }

    #[test]
    fn leased_messages_know_their_run() {
        let a: LeaseAnswer = serde_json::from_str(
            r#"{"messages":[{"id":"1","lease":"t","attempt":2,"payload":{"run":"r1","t":5},"queue":"q"},
                {"id":"2","lease":"t","attempt":1,"payload":"foreign"}]}"#,
        )
        .unwrap();
        assert!(a.messages[0].is_from("r1"));
        assert_eq!(a.messages[0].payload_i64("t"), Some(5));
        assert!(!a.messages[1].is_from("r1"));
        assert_eq!(
            a.messages[0].leased_at_ms(),
            None,
            "no expiry, no lease time"
        );
    }

    #[test]
    fn the_lease_time_is_the_expiry_less_the_bench_lease() {
        let a: LeaseAnswer = serde_json::from_str(
            r#"{"messages":[{"id":"1","lease":"t","lease_expires_at":"2026-12-07T10:00:30.250Z"},
                {"id":"2","lease":"t","lease_expires_at":"not a time"}]}"#,
        )
        .unwrap();
        let expires = redrive_core::Timestamp::parse("2026-12-07T10:00:30.250Z").unwrap();
        assert_eq!(
            a.messages[0].leased_at_ms(),
            Some(expires.as_millis() - 30_000)
        );
        assert_eq!(a.messages[1].leased_at_ms(), None);
    }
}
