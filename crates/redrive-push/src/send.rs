//! One push attempt over HTTP: the request of SPEC §10, sent through a client that never
//! follows redirects, never uses a proxy, checks every address it connects to with the SSRF
//! [`Guard`] (at connect time, so a DNS answer that changes between check and connect cannot
//! slip through), and reads at most a bounded number of bytes of the answer.
//!
//! One [`Sender`] per endpoint (`scheme://host:port`): its connection pool is the
//! endpoint's own, so a slow endpoint cannot hold the connections of another.

use crate::classify::Attempt;
use crate::ssrf::{Guard, Refused};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of an answer's body kept in the attempt's history (SPEC §10: the first 1 KiB).
pub const EXCERPT_BYTES: usize = 1024;

/// Transport and hop-by-hop headers (RFC 9110 §7.6.1, and the legacy `keep-alive`,
/// `proxy-connection`): the HTTP client sets them from the request itself. A [`Sender`]
/// never sends one of these from [`Request::headers`], whoever built the request: a `host`
/// would reach another virtual host behind a shared ingress, a `content-length` would cut
/// the body, a `transfer-encoding` would make the framing a lie.
pub const TRANSPORT_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "trailers",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
];

/// Whether the header `name` (any case) is one of [`TRANSPORT_HEADERS`].
pub fn is_transport_header(name: &str) -> bool {
    TRANSPORT_HEADERS
        .iter()
        .any(|t| t.eq_ignore_ascii_case(name.trim()))
}

/// Whether a message may not set the header `name` (any case) on its push request (SPEC §10):
/// the transport and hop-by-hop headers, `content-type` (the body is the payload's JSON), and
/// every `webhook-*` and `redrive-*` header (the signature, the id, the timestamp, the
/// attempt: a message carrying its own `webhook-signature` to a queue without a secret would
/// otherwise look signed by redrive). Publish refuses them on a push queue; a message that
/// has one anyway (published before its queue was a push queue) goes without it.
pub fn is_server_owned_header(name: &str) -> bool {
    let n = name.trim().to_ascii_lowercase();
    is_transport_header(&n)
        || n == "content-type"
        || n.starts_with("webhook-")
        || n.starts_with("redrive-")
}

/// A message's headers split into what its push request carries and the names left out
/// because the server owns them ([`is_server_owned_header`]), both in the given order.
pub fn message_headers<'a>(
    headers: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for (name, value) in headers {
        if is_server_owned_header(name) {
            dropped.push(name.clone());
        } else {
            kept.push((name.clone(), value.clone()));
        }
    }
    (kept, dropped)
}

/// How a [`Sender`] talks to its endpoint.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Longest wait for the TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// Longest time for the whole attempt: connect, send, answer, body.
    pub timeout: Duration,
    /// Most bytes of an answer's body read; the rest is not read (the connection is then
    /// not reused).
    pub max_response_bytes: usize,
    /// Idle connections kept for reuse.
    pub pool_idle: usize,
    /// Which addresses may be connected to.
    pub guard: Arc<Guard>,
}

/// A request to send.
#[derive(Debug, Clone)]
pub struct Request {
    /// `POST`, `PUT` or `PATCH`.
    pub method: reqwest::Method,
    /// Where.
    pub url: reqwest::Url,
    /// Headers, in order; a later one with the same name replaces an earlier one. Transport
    /// and hop-by-hop ones ([`TRANSPORT_HEADERS`]) are never sent: the client sets those.
    pub headers: Vec<(String, String)>,
    /// The body (the message's payload as JSON).
    pub body: Vec<u8>,
}

/// What one attempt got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The answer, or why there was none.
    pub outcome: Outcome,
    /// From the start of the attempt to the end of its body (or its failure), ms.
    pub latency_ms: u64,
    /// The first [`EXCERPT_BYTES`] of the body (lossy UTF-8, cut at a character boundary),
    /// or what went wrong when there was no answer.
    pub excerpt: Option<String>,
}

/// An attempt's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An HTTP answer.
    Answered {
        /// Its status.
        status: u16,
        /// Its `Retry-After` header, if any.
        retry_after: Option<String>,
    },
    /// No answer within the timeout.
    TimedOut,
    /// No connection, or the connection broke before a whole answer.
    ConnectFailed(String),
    /// The SSRF guard refused the destination: nothing was sent.
    Refused(Refused),
}

impl Sent {
    /// The attempt as the classification sees it; `None` when nothing was sent (refused).
    pub fn attempt(&self) -> Option<Attempt<'_>> {
        match &self.outcome {
            Outcome::Answered {
                status,
                retry_after,
            } => Some(Attempt::Answered {
                status: *status,
                retry_after: retry_after.as_deref(),
            }),
            Outcome::TimedOut => Some(Attempt::TimedOut),
            Outcome::ConnectFailed(_) => Some(Attempt::ConnectFailed),
            Outcome::Refused(_) => None,
        }
    }

    /// A one-line description for the history's error message.
    pub fn describe(&self, timeout: Duration) -> String {
        match &self.outcome {
            Outcome::Answered { status, .. } => {
                let reason = reqwest::StatusCode::from_u16(*status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("");
                format!("HTTP {status} {reason}").trim_end().to_owned()
            }
            Outcome::TimedOut => format!(
                "no answer within {}",
                redrive_core::format_duration_ms(timeout.as_millis() as u64)
            ),
            Outcome::ConnectFailed(why) => format!("connection failed: {why}"),
            Outcome::Refused(r) => r.to_string(),
        }
    }
}

/// Why a [`Sender`] could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client: {0}")]
pub struct BuildError(String);

/// The HTTP client of one endpoint.
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
    guard: Arc<Guard>,
    max_response_bytes: usize,
}

impl Sender {
    /// A client for one endpoint.
    pub fn new(config: &SenderConfig) -> Result<Self, BuildError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .pool_max_idle_per_host(config.pool_idle)
            .user_agent(concat!("redrive/", env!("CARGO_PKG_VERSION")))
            .dns_resolver(Arc::new(GuardedResolver {
                guard: config.guard.clone(),
            }))
            .build()
            .map_err(|e| BuildError(e.to_string()))?;
        Ok(Self {
            client,
            guard: config.guard.clone(),
            max_response_bytes: config.max_response_bytes,
        })
    }

    /// Send one request and read (a bounded part of) its answer. Never fails: every way it
    /// can go wrong is an [`Outcome`].
    pub async fn send(&self, request: Request) -> Sent {
        let start = Instant::now();
        let elapsed = |start: Instant| start.elapsed().as_millis() as u64;
        // An address literal is connected to without a lookup, so the resolver never sees
        // it: check it here (it cannot change between this check and the connect).
        if let Some(ip) = literal_ip(&request.url) {
            if let Err(refused) = self.guard.check(ip) {
                return Sent {
                    excerpt: Some(refused.to_string()),
                    outcome: Outcome::Refused(refused),
                    latency_ms: 0,
                };
            }
        }
        let mut builder = self.client.request(request.method, request.url);
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in &request.headers {
            // The client frames the request and names the host itself, whatever the caller
            // put in the list (the last line of defence: push delivery leaves them out of a
            // message's headers before, and says so in the attempt's history).
            if is_transport_header(name) {
                continue;
            }
            // A header name or value HTTP cannot carry is left out rather than failing the
            // attempt for ever.
            if let (Ok(n), Ok(v)) = (
                reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                reqwest::header::HeaderValue::from_str(value),
            ) {
                headers.insert(n, v);
            }
        }
        builder = builder.headers(headers).body(request.body);
        let mut response = match builder.send().await {
            Ok(r) => r,
            Err(e) => return failed(e, elapsed(start)),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut body = Vec::new();
        loop {
            if body.len() >= self.max_response_bytes {
                break;
            }
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = self.max_response_bytes - body.len();
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                Ok(None) => break,
                // The status arrived: that is the answer, whatever happens to the body.
                Err(_) => break,
            }
        }
        Sent {
            outcome: Outcome::Answered {
                status,
                retry_after,
            },
            latency_ms: elapsed(start),
            excerpt: excerpt(&body),
        }
    }
}

/// The failure of a request that got no answer.
fn failed(e: reqwest::Error, latency_ms: u64) -> Sent {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = source {
        if let Some(refused) = err.downcast_ref::<Refused>() {
            return Sent {
                excerpt: Some(refused.to_string()),
                outcome: Outcome::Refused(refused.clone()),
                latency_ms,
            };
        }
        source = err.source();
    }
    if e.is_timeout() {
        return Sent {
            outcome: Outcome::TimedOut,
            latency_ms,
            excerpt: None,
        };
    }
    let why = error_chain(&e);
    Sent {
        excerpt: Some(why.clone()),
        outcome: Outcome::ConnectFailed(why),
        latency_ms,
    }
}

/// An error and its causes on one line ("error sending request: … : Connection refused").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// The first [`EXCERPT_BYTES`] of a body as text, cut at a character boundary.
fn excerpt(body: &[u8]) -> Option<String> {
    if body.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_BYTES + 3)]);
    let mut end = text.len().min(EXCERPT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some(text[..end].to_owned())
}

/// The host of `url` when it is an IP address literal.
fn literal_ip(url: &reqwest::Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    }
}

/// Resolves a host name and refuses it if any address it resolves to is refused by the
/// guard: a name that answers with a private address among public ones is not used.
#[derive(Debug)]
struct GuardedResolver {
    guard: Arc<Guard>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.guard.clone();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            for a in &addrs {
                guard.check(a.ip())?;
            }
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_is_bounded_and_cut_at_a_character_boundary() {
        assert_eq!(excerpt(b""), None);
        assert_eq!(excerpt(b"ok").as_deref(), Some("ok"));
        let long = "é".repeat(EXCERPT_BYTES); // 2 bytes each
        let e = excerpt(long.as_bytes()).expect("excerpt");
        assert!(e.len() <= EXCERPT_BYTES, "{}", e.len());
        assert!(e.chars().all(|c| c == 'é'));
    }

    #[test]
    fn server_owned_headers_are_named_in_any_case() {
        for n in [
            "host",
            "Host",
            "CONTENT-LENGTH",
            "transfer-encoding",
            "Connection",
            "keep-alive",
            "proxy-connection",
            "TE",
            "trailer",
            "upgrade",
            "proxy-authorization",
            "proxy-authenticate",
            "content-type",
            "Content-Type",
            "webhook-signature",
            "Webhook-Id",
            "webhook-timestamp",
            "webhook-anything",
            "redrive-attempt",
            "Redrive-Whatever",
        ] {
            assert!(is_server_owned_header(n), "{n}");
        }
        for n in [
            "x-merchant",
            "authorization",
            "x-host",
            "hostname",
            "webhook",
            "x-webhook-id",
            "content-types",
            "accept",
        ] {
            assert!(!is_server_owned_header(n), "{n}");
        }
        assert!(is_transport_header("Host") && !is_transport_header("content-type"));
        let h: std::collections::BTreeMap<String, String> = [
            ("Host", "internal-admin.example"),
            ("x-merchant", "m-1"),
            ("webhook-signature", "v1,forged"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect();
        let (kept, dropped) = message_headers(&h);
        assert_eq!(kept, [("x-merchant".to_owned(), "m-1".to_owned())]);
        assert_eq!(dropped, ["Host", "webhook-signature"]);
    }

    /// The request as it reaches a raw TCP endpoint on loopback: whatever the request's
    /// header list says, the host, the framing and the connection are the client's.
    #[tokio::test]
    async fn transport_headers_of_a_request_never_reach_the_wire() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.expect("accept");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // Headers, then the 11-byte body.
            while !got.ends_with(b"{\"n\":12345}") {
                let n = sock.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await
                .expect("write");
            String::from_utf8_lossy(&got).into_owned()
        });
        let guard = Arc::new(Guard::new(vec!["127.0.0.1/32".parse().expect("cidr")]));
        let sender = Sender::new(&SenderConfig {
            connect_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            max_response_bytes: 1024,
            pool_idle: 1,
            guard,
        })
        .expect("sender");
        let url = reqwest::Url::parse(&format!("http://{addr}/hook")).expect("url");
        let headers = [
            ("Host", "internal-admin.example"),
            ("content-length", "3"),
            ("Transfer-Encoding", "chunked"),
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("te", "trailers"),
            ("x-kept", "yes"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect();
        let sent = sender
            .send(Request {
                method: reqwest::Method::POST,
                url,
                headers,
                body: b"{\"n\":12345}".to_vec(),
            })
            .await;
        assert!(
            matches!(sent.outcome, Outcome::Answered { status: 200, .. }),
            "{sent:?}"
        );
        let raw = server.await.expect("server").to_ascii_lowercase();
        let head = format!("{}\r\n", raw.split("\r\n\r\n").next().unwrap_or(""));
        assert!(head.contains(&format!("\r\nhost: {addr}\r\n")), "{head}");
        assert!(head.contains("\r\ncontent-length: 11\r\n"), "{head}");
        assert!(head.contains("\r\nx-kept: yes\r\n"), "{head}");
        for bad in [
            "internal-admin",
            "transfer-encoding",
            "chunked",
            "upgrade",
            "websocket",
            "\r\nte:",
            "content-length: 3",
        ] {
            assert!(!head.contains(bad), "{bad:?} reached the wire:\n{head}");
        }
        assert!(raw.ends_with("{\"n\":12345}"), "the whole body: {raw}");
    }

    #[test]
    fn literal_hosts_are_found() {
        let u = |s: &str| reqwest::Url::parse(s).expect("url");
        assert_eq!(
            literal_ip(&u("http://127.0.0.1:8080/x")),
            Some("127.0.0.1".parse().expect("ip"))
        );
        assert_eq!(
            literal_ip(&u("http://[::1]/x")),
            Some("::1".parse().expect("ip"))
        );
        assert_eq!(literal_ip(&u("http://localhost/x")), None);
    }
}
