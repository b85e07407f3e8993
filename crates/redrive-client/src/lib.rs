//! A typed async client of the redrive HTTP API v1 (SPEC §5, docs/API.md).
//!
//! One [`Client`] per server, cheap to clone (it shares one keep-alive pool). Each method
//! is one API call: it sends the body as `application/json`, decodes a 2xx answer into
//! the types of [`types`] (the server's own `redrive-core` types where it has them), and
//! turns anything else into an [`Error`] that keeps the server's
//! `{"error": {"code", "message"}}` ([`Error::Api`]) apart from an unreachable server
//! ([`Error::Unreachable`], [`Error::Timeout`]) and a broken exchange.
//!
//! It is what the `redrive` CLI, the load generator `redrive-bench` and the integration
//! tests use, so that no caller walks untyped JSON. It does not depend on the server crate:
//! the types are mirrored here, and the binary's tests check the mirror against a live
//! server. With the feature `cli`, the module `cli` holds what the two command-line front ends
//! share (exit codes, error reporting, `--server`, JSON on stdout).
//!
//! Non-goals: retries (a failed call is reported once; the caller knows whether the call
//! is idempotent), TLS (this build of reqwest has none: put a TLS proxy in front, or use
//! loopback), and consumer loops (see the example).
//!
//! Limits: a call other than [`Client::export`] gives up after the request timeout
//! ([`DEFAULT_REQUEST_TIMEOUT`] unless set), so a long poll must `wait` less than that.
//!
//! ```no_run
//! use redrive_client::{BatchItem, Client, LeaseRequest, Publish};
//!
//! # async fn demo() -> Result<(), redrive_client::Error> {
//! let client = Client::builder("http://127.0.0.1:7070")?.token("s3cret").build()?;
//!
//! // Publish once, whatever retries the caller makes: the key makes a replay answer
//! // the original message.
//! let mut order = Publish::new(serde_json::json!({"order": 42}));
//! order.idempotency_key = Some("order-42".into());
//! let published = client.publish("orders", &order).await?;
//! println!("{} (replayed: {})", published.message.id, published.replayed);
//!
//! // Consume: lease up to 10, long-polling 5 s, then ack them in one call.
//! let lease = LeaseRequest { max: Some(10), lease: Some("30s".into()), wait: Some("5s".into()) };
//! let leased = client.lease("orders", &lease).await?;
//! let items: Vec<BatchItem> =
//!     leased.iter().map(|m| BatchItem::new(m.id.to_string(), m.lease.clone())).collect();
//! if !items.is_empty() {
//!     for item in client.ack_batch(&items).await? {
//!         if let Some(e) = item.error {
//!             eprintln!("{}: {} {}", item.id, e.code, e.message);
//!         }
//!     }
//! }
//!
//! // Errors carry the server's code.
//! match client.get("0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f").await {
//!     Err(redrive_client::Error::Api { status: 404, .. }) => println!("gone"),
//!     other => println!("{other:?}"),
//! }
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "cli")]
pub mod cli;
pub mod error;
pub mod export;
pub mod types;

pub use error::Error;
pub use export::Export;
pub use types::{
    AuditEntry, AuditPage, BatchItem, BatchResponse, BatchResult, Deleted, DryRun, ErrorDetail,
    ExportFormat, Extended, FailedReport, FailureGroup, FailureGroups, Filter, LeaseRequest,
    LeaseResponse, LeasedMessage, NackError, Publish, Published, PublishedBatch, QueueList,
    QueueView, SearchPage, Task, TaskCreated, TaskList, TaskRequest,
};

use bytes::Bytes;
use redrive_core::Message;
use reqwest::{header, Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// How long a call other than an export may take in all, by default. A minute covers
/// the longest long poll a server allows by default (`max_wait` 30 s) with room to spare.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting may take, by default, before the server counts as unreachable.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle keep-alive connections kept per server, by default: one client, one connection.
pub const DEFAULT_POOL_IDLE_PER_HOST: usize = 1;

/// A client of one redrive server.
#[derive(Debug, Clone)]
pub struct Client {
    /// The server's root (may carry a path prefix, e.g. behind a proxy).
    base: Url,
    /// Shared keep-alive pool; carries the bearer token as a default header.
    http: reqwest::Client,
    /// Per-call timeout (not for exports); `None` leaves the HTTP client's own.
    request_timeout: Option<Duration>,
}

/// Builds a [`Client`]: token, timeouts, pool size, user agent.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base: Url,
    token: Option<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    pool_idle_per_host: usize,
    user_agent: String,
}

impl ClientBuilder {
    /// Send `Authorization: Bearer <token>` with every request.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// How long connecting may take ([`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// How long a call other than an export may take ([`DEFAULT_REQUEST_TIMEOUT`]).
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// Idle keep-alive connections kept ([`DEFAULT_POOL_IDLE_PER_HOST`]); set it to the
    /// number of concurrent callers.
    pub fn pool_idle_per_host(mut self, n: usize) -> Self {
        self.pool_idle_per_host = n;
        self
    }

    /// The `User-Agent` (default `redrive-client/<version>`).
    pub fn user_agent(mut self, ua: impl Into<String>) -> Self {
        self.user_agent = ua.into();
        self
    }

    /// The client. Fails on a token that cannot be a header value.
    pub fn build(self) -> Result<Client, Error> {
        let mut headers = header::HeaderMap::new();
        if let Some(t) = &self.token {
            let mut v = header::HeaderValue::from_str(&format!("Bearer {}", t.trim()))
                .map_err(|_| Error::InvalidToken)?;
            v.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, v);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(self.connect_timeout)
            .pool_max_idle_per_host(self.pool_idle_per_host)
            .tcp_nodelay(true)
            .user_agent(self.user_agent)
            .build()
            .map_err(Error::Build)?;
        Ok(Client {
            base: self.base,
            http,
            request_timeout: Some(self.request_timeout),
        })
    }
}

/// A server URL that can carry API paths.
fn parse_base(base: &str) -> Result<Url, Error> {
    let url = Url::parse(base).map_err(|e| Error::InvalidUrl(format!("{base:?}: {e}")))?;
    check_base(url)
}

fn check_base(url: Url) -> Result<Url, Error> {
    if url.cannot_be_a_base() || !matches!(url.scheme(), "http" | "https") {
        return Err(Error::InvalidUrl(format!("{url}: not an http URL")));
    }
    Ok(url)
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:7070`) with the defaults.
    pub fn new(base: &str) -> Result<Self, Error> {
        Self::builder(base)?.build()
    }

    /// A builder for a client of the server at `base`.
    pub fn builder(base: &str) -> Result<ClientBuilder, Error> {
        Self::builder_for(parse_base(base)?)
    }

    /// A builder for a client of the server at an already parsed `base`.
    pub fn builder_for(base: Url) -> Result<ClientBuilder, Error> {
        Ok(ClientBuilder {
            base: check_base(base)?,
            token: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pool_idle_per_host: DEFAULT_POOL_IDLE_PER_HOST,
            user_agent: concat!("redrive-client/", env!("CARGO_PKG_VERSION")).to_owned(),
        })
    }

    /// A client over an HTTP client configured elsewhere (its timeouts and default
    /// headers apply; no per-call timeout is added).
    pub fn with_http(base: &str, http: reqwest::Client) -> Result<Self, Error> {
        Ok(Self {
            base: parse_base(base)?,
            http,
            request_timeout: None,
        })
    }

    /// The server's root URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// `base` + path segments (each percent-encoded) + query pairs.
    pub fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        if query.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut()
                .clear()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        url
    }

    /// A request, with the body (if any) as `application/json`.
    fn request(&self, method: Method, url: &Url, body: Option<Vec<u8>>) -> reqwest::RequestBuilder {
        let mut req = self.http.request(method, url.clone());
        if let Some(t) = self.request_timeout {
            req = req.timeout(t);
        }
        if let Some(b) = body {
            req = req.header(header::CONTENT_TYPE, "application/json").body(b);
        }
        req
    }

    /// Send; a 2xx answer is returned, anything else is an error.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        url: &Url,
    ) -> Result<reqwest::Response, Error> {
        let resp = req
            .send()
            .await
            .map_err(|e| Error::from_transport(url, e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp.bytes().await.unwrap_or_default();
        Err(Error::from_answer(status, &body))
    }

    /// One call: send `body` as JSON, answer the status and the decoded 2xx body.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<&impl Serialize>,
    ) -> Result<(StatusCode, T), Error> {
        let body = match body {
            // Serializing these plain types cannot fail (string keys, no custom impls
            // that error); a failure would still be reported, as a decode error.
            Some(b) => Some(serde_json::to_vec(b).map_err(|source| Error::Decode {
                url: url.to_string(),
                source,
            })?),
            None => None,
        };
        let resp = self.send(self.request(method, &url, body), &url).await?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|source| Error::Interrupted {
            url: url.to_string(),
            source,
        })?;
        let value = serde_json::from_slice(&bytes).map_err(|source| Error::Decode {
            url: url.to_string(),
            source,
        })?;
        Ok((status, value))
    }

    /// POST a body serialized beforehand (the bench's hot path: one body built once,
    /// sent many times); answers the 2xx body's bytes, undecoded.
    pub async fn post_raw(
        &self,
        url: &Url,
        body: impl Into<reqwest::Body>,
    ) -> Result<Bytes, Error> {
        let req = self
            .http
            .post(url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(body);
        self.raw(req, url).await
    }

    /// Send `req` (with the request timeout) and answer the 2xx body's bytes.
    async fn raw(&self, req: reqwest::RequestBuilder, url: &Url) -> Result<Bytes, Error> {
        let req = match self.request_timeout {
            Some(t) => req.timeout(t),
            None => req,
        };
        let resp = self.send(req, url).await?;
        resp.bytes().await.map_err(|source| Error::Interrupted {
            url: url.to_string(),
            source,
        })
    }

    /// GET a URL under the server; answers the 2xx body's bytes, undecoded (for tools that
    /// read a few fields of an answer this client has no type for).
    pub async fn get_raw(&self, url: &Url) -> Result<Bytes, Error> {
        self.raw(self.http.get(url.clone()), url).await
    }

    /// Publish one message to `queue`.
    pub async fn publish(
        &self,
        queue: &str,
        message: &Publish,
    ) -> Result<Published<Message>, Error> {
        let url = self.url(&["v1", "queues", queue, "messages"], &[]);
        let (status, m) = self.call(Method::POST, url, Some(message)).await?;
        Ok(Published {
            message: m,
            replayed: status == StatusCode::OK,
        })
    }

    /// Publish several messages to `queue`, all or nothing.
    pub async fn publish_batch(
        &self,
        queue: &str,
        messages: &[Publish],
    ) -> Result<Published<Vec<Message>>, Error> {
        let url = self.url(&["v1", "queues", queue, "messages"], &[]);
        let body = types::PublishBatchBody { messages };
        let (status, b): (_, PublishedBatch) = self.call(Method::POST, url, Some(&body)).await?;
        Ok(Published {
            message: b.messages,
            replayed: status == StatusCode::OK,
        })
    }

    /// Publish several messages to `queue`, all or nothing, and answer each item on its
    /// own: its message and whether it was an idempotent replay (from the answer's
    /// `replayed`; a server that does not say has only the batch's status: all replays on a
    /// 200, none on a 201).
    pub async fn publish_batch_each(
        &self,
        queue: &str,
        messages: &[Publish],
    ) -> Result<Vec<Published<Message>>, Error> {
        let url = self.url(&["v1", "queues", queue, "messages"], &[]);
        let body = types::PublishBatchBody { messages };
        let (status, b): (_, PublishedBatch) = self.call(Method::POST, url, Some(&body)).await?;
        let all = status == StatusCode::OK;
        Ok(b.messages
            .into_iter()
            .enumerate()
            .map(|(i, message)| Published {
                message,
                replayed: b.replayed.get(i).copied().unwrap_or(all),
            })
            .collect())
    }

    /// Lease ready messages of `queue` (possibly none).
    pub async fn lease(
        &self,
        queue: &str,
        request: &LeaseRequest,
    ) -> Result<Vec<LeasedMessage>, Error> {
        let url = self.url(&["v1", "queues", queue, "leases"], &[]);
        let (_, r): (_, LeaseResponse) = self.call(Method::POST, url, Some(request)).await?;
        Ok(r.messages)
    }

    /// Ack the message `id` leased under `lease`: it is done. Answers the message.
    pub async fn ack(&self, id: &str, lease: &str) -> Result<Message, Error> {
        let url = self.url(&["v1", "messages", id, "ack"], &[]);
        let body = types::AckBody { lease };
        Ok(self.call(Method::POST, url, Some(&body)).await?.1)
    }

    /// Nack the message `id` leased under `lease` (`None`: a transient failure with no
    /// message). Answers the message with its new state.
    pub async fn nack(
        &self,
        id: &str,
        lease: &str,
        error: Option<&NackError>,
    ) -> Result<Message, Error> {
        let url = self.url(&["v1", "messages", id, "nack"], &[]);
        let body = types::NackBody { lease, error };
        Ok(self.call(Method::POST, url, Some(&body)).await?.1)
    }

    /// Hand the lease back unattempted (shutting down, a deploy): the message is ready
    /// again (or scheduled after `delay`, e.g. `"10s"`), the attempt not charged, within
    /// the queue's bound of uncharged releases (`max_rate_limited`; past it, a release
    /// counts as a failed attempt). Answers the message.
    pub async fn release(
        &self,
        id: &str,
        lease: &str,
        delay: Option<&str>,
    ) -> Result<Message, Error> {
        let url = self.url(&["v1", "messages", id, "release"], &[]);
        let body = types::ReleaseBody { lease, delay };
        Ok(self.call(Method::POST, url, Some(&body)).await?.1)
    }

    /// Extend the lease: it then expires `by` (e.g. `"30s"`) from now.
    pub async fn extend(&self, id: &str, lease: &str, by: &str) -> Result<Extended, Error> {
        let url = self.url(&["v1", "messages", id, "extend"], &[]);
        let body = types::ExtendBody { lease, by };
        Ok(self.call(Method::POST, url, Some(&body)).await?.1)
    }

    /// Ack many leases; one result per item, in order (a failed item is not an `Err`).
    pub async fn ack_batch(&self, items: &[BatchItem]) -> Result<Vec<BatchResult>, Error> {
        self.batch("ack", items).await
    }

    /// Nack many leases; one result per item, in order (a failed item is not an `Err`).
    pub async fn nack_batch(&self, items: &[BatchItem]) -> Result<Vec<BatchResult>, Error> {
        self.batch("nack", items).await
    }

    async fn batch(&self, verb: &str, items: &[BatchItem]) -> Result<Vec<BatchResult>, Error> {
        let url = self.url(&["v1", "messages", verb], &[]);
        let body = types::BatchBody { items };
        let (_, r): (_, BatchResponse) = self.call(Method::POST, url, Some(&body)).await?;
        Ok(r.items)
    }

    /// The message `id`, with its history.
    pub async fn get(&self, id: &str) -> Result<Message, Error> {
        let url = self.url(&["v1", "messages", id], &[]);
        Ok(self.call(Method::GET, url, None::<&()>).await?.1)
    }

    /// One page of the messages matching `filter`: at most `limit` (server default 100),
    /// after `cursor` (a previous page's `next_cursor`).
    pub async fn search(
        &self,
        filter: &Filter,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<SearchPage, Error> {
        let mut query = filter.query();
        if let Some(l) = limit {
            query.push(("limit", l.to_string()));
        }
        if let Some(c) = cursor {
            query.push(("cursor", c.to_owned()));
        }
        let url = self.url(&["v1", "messages"], &query);
        Ok(self.call(Method::GET, url, None::<&()>).await?.1)
    }

    /// Every message matching `filter`, streamed (no request timeout: an export of a
    /// large queue takes as long as it takes).
    pub async fn export(&self, filter: &Filter, format: ExportFormat) -> Result<Export, Error> {
        let mut query = filter.query();
        query.push(("format", format.as_str().to_owned()));
        let url = self.url(&["v1", "messages", "export"], &query);
        let req = self.http.get(url.clone());
        let resp = self.send(req, &url).await?;
        Ok(Export::new(resp, url))
    }

    /// Redrive the dead (or scheduled) message `id`: ready now, with a fresh budget.
    pub async fn redrive(&self, id: &str) -> Result<Message, Error> {
        let url = self.url(&["v1", "messages", id, "redrive"], &[]);
        Ok(self.call(Method::POST, url, None::<&()>).await?.1)
    }

    /// Kill the message `id` (make it dead), with an optional reason.
    pub async fn kill(&self, id: &str, reason: Option<&str>) -> Result<Message, Error> {
        let url = self.url(&["v1", "messages", id, "kill"], &[]);
        let body = types::KillBody { reason };
        Ok(self.call(Method::POST, url, Some(&body)).await?.1)
    }

    /// Delete the message `id`; answers it as it was.
    pub async fn delete(&self, id: &str) -> Result<Deleted, Error> {
        let url = self.url(&["v1", "messages", id], &[]);
        Ok(self.call(Method::DELETE, url, None::<&()>).await?.1)
    }

    /// The failure groups of the dead letters (of `queue`, when given), largest first, at
    /// most `limit` (server default 50).
    pub async fn failure_groups(
        &self,
        queue: Option<&str>,
        limit: Option<u32>,
    ) -> Result<FailureGroups, Error> {
        let mut query = Vec::new();
        if let Some(q) = queue {
            query.push(("queue", q.to_owned()));
        }
        if let Some(l) = limit {
            query.push(("limit", l.to_string()));
        }
        let url = self.url(&["v1", "failure-groups"], &query);
        Ok(self.call(Method::GET, url, None::<&()>).await?.1)
    }

    /// Create a bulk task, or count what it would select (`dry_run`).
    pub async fn create_task(&self, req: &TaskRequest) -> Result<TaskCreated, Error> {
        let url = self.url(&["v1", "tasks"], &[]);
        let (status, v): (_, serde_json::Value) =
            self.call(Method::POST, url.clone(), Some(req)).await?;
        let decode = |source| Error::Decode {
            url: url.to_string(),
            source,
        };
        Ok(if status == StatusCode::CREATED {
            TaskCreated::Task(serde_json::from_value(v).map_err(decode)?)
        } else {
            TaskCreated::DryRun(serde_json::from_value(v).map_err(decode)?)
        })
    }

    /// The tasks, newest first.
    pub async fn tasks(&self) -> Result<TaskList, Error> {
        let url = self.url(&["v1", "tasks"], &[]);
        Ok(self.call(Method::GET, url, None::<&()>).await?.1)
    }

    /// One task.
    pub async fn task(&self, id: &str) -> Result<Task, Error> {
        let url = self.url(&["v1", "tasks", id], &[]);
        Ok(self.call(Method::GET, url, None::<&()>).await?.1)
    }

    /// `pause`, `resume` or `cancel` a task.
    pub async fn task_action(&self, id: &str, verb: &str) -> Result<Task, Error> {
        let url = self.url(&["v1", "tasks", id, verb], &[]);
        Ok(self.call(Method::POST, url, None::<&()>).await?.1)
    }

    /// A page of the audit log, newest first.
    pub async fn audit(&self, limit: u32, cursor: Option<&str>) -> Result<AuditPage, Error> {
        let mut q = vec![("limit", limit.to_string())];
        if let Some(c) = cursor {
            q.push(("cursor", c.to_owned()));
        }
        let url = self.url(&["v1", "audit"], &q);
        Ok(self.call(Method::GET, url, None::<&()>).await?.1)
    }

    /// Every queue that has messages or a config section.
    pub async fn queues(&self) -> Result<QueueList, Error> {
        let url = self.url(&["v1", "queues"], &[]);
        Ok(self.call(Method::GET, url, None::<&()>).await?.1)
    }

    /// One queue (a queue never used answers zero counts).
    pub async fn queue(&self, name: &str) -> Result<QueueView, Error> {
        let url = self.url(&["v1", "queues", name], &[]);
        Ok(self.call(Method::GET, url, None::<&()>).await?.1)
    }

    /// `Ok` when the server is ready for writes; an [`Error::Api`] (503 `store_poisoned`,
    /// `store_unavailable`, `store_superseded` or `shutting_down`) when it is not.
    pub async fn readyz(&self) -> Result<(), Error> {
        let url = self.url(&["readyz"], &[]);
        self.send(self.request(Method::GET, &url, None), &url)
            .await
            .map(drop)
    }

    /// `Ok` when the process answers at all.
    pub async fn healthz(&self) -> Result<(), Error> {
        let url = self.url(&["healthz"], &[]);
        self.send(self.request(Method::GET, &url, None), &url)
            .await
            .map(drop)
    }

    /// The Prometheus / OpenMetrics text of `/metrics`.
    pub async fn metrics_text(&self) -> Result<String, Error> {
        let url = self.url(&["metrics"], &[]);
        let resp = self
            .send(self.request(Method::GET, &url, None), &url)
            .await?;
        resp.text().await.map_err(|source| Error::Interrupted {
            url: url.to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> Client {
        Client::new("http://127.0.0.1:7070").unwrap()
    }

    #[test]
    fn urls_encode_segments_and_keep_a_prefix() {
        let c = client();
        assert_eq!(
            c.url(&["v1", "queues", "a b/c", "messages"], &[]).as_str(),
            "http://127.0.0.1:7070/v1/queues/a%20b%2Fc/messages"
        );
        assert_eq!(
            c.url(
                &["v1", "messages"],
                &[("queue", "orders".into()), ("q", "a&b".into())]
            )
            .as_str(),
            "http://127.0.0.1:7070/v1/messages?queue=orders&q=a%26b"
        );
        let prefixed = Client::new("http://h:1/redrive/").unwrap();
        assert_eq!(
            prefixed.url(&["v1", "queues"], &[]).as_str(),
            "http://h:1/redrive/v1/queues"
        );
    }

    #[test]
    fn every_request_with_a_body_says_application_json() {
        let c = client();
        let url = c.url(&["v1", "queues", "q", "leases"], &[]);
        let req = c
            .request(Method::POST, &url, Some(b"{}".to_vec()))
            .build()
            .unwrap();
        assert_eq!(
            req.headers().get(header::CONTENT_TYPE).unwrap(),
            "application/json"
        );
        assert!(
            req.headers().get(header::HOST).is_none(),
            "reqwest sets Host from the URL"
        );
        let get = c.request(Method::GET, &url, None).build().unwrap();
        assert!(get.headers().get(header::CONTENT_TYPE).is_none());
    }

    #[test]
    fn a_bad_token_or_url_is_refused_at_build() {
        assert!(matches!(
            Client::builder("http://127.0.0.1:1")
                .unwrap()
                .token("a\nb")
                .build(),
            Err(Error::InvalidToken)
        ));
        assert!(matches!(
            Client::new("mailto:x@y"),
            Err(Error::InvalidUrl(_))
        ));
        assert!(matches!(
            Client::new("not a url"),
            Err(Error::InvalidUrl(_))
        ));
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_not_an_api_error() {
        // Bind then drop: the port is free and nothing listens on it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = Client::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let e = c.queues().await.unwrap_err();
        assert!(e.is_unreachable(), "{e:?}");
        assert_eq!(e.status(), None);
        assert!(e.to_string().starts_with(&format!(
            "cannot reach the redrive server at http://127.0.0.1:{port}/"
        )));
    }
}
