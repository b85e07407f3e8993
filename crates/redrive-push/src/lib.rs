//! Push delivery (SPEC §10): the pieces that do not need a server.
//!
//! - [`signing`]: Standard Webhooks v1 signatures (`webhook-signature`), with several secrets
//!   at once for rotation, and their verification (for receivers and tests).
//! - [`ssrf`]: which addresses a push may connect to. Every address a host resolves to is
//!   checked at connect time against the private, loopback, link-local, metadata … ranges,
//!   unless the operator allowed it (`push.allow_cidrs`).
//! - [`classify`]: what an answer means (done, a failure class with its `Retry-After`, gone),
//!   from a table of rules with the SPEC §10 defaults.
//! - [`send`]: one attempt over HTTP, through a per-endpoint client that never follows
//!   redirects and checks every address at connect time.
//! - [`protect`]: the protection of one endpoint: circuit breaker with a half-open probe and
//!   a recovering trickle, AIMD pace, rate limit, concurrency limit and retry budget; pure
//!   logic over a clock the caller passes in.
//! - [`share`]: one node's share of an endpoint's cluster-wide `concurrency` and
//!   `rate_limit` (SPEC §13), by the number of live nodes and its rank among them.
//! - [`retry`]: the same policy engine in-process (S6): `retry(policy, classify, op)`, a
//!   [`retry::Retrier`] with a shared breaker, and [`retry::http_failure`] to judge an HTTP
//!   answer with the [`classify`] table.
//!
//! The server's delivery workers (`redrive-server`, `engine/push.rs`) build on these.

pub mod classify;
pub mod protect;
pub mod retry;
pub mod send;
pub mod share;
pub mod signing;
pub mod ssrf;

pub use reqwest::{Method, Url};
