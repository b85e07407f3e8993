//! Push delivery (SPEC §10): the pieces that do not need a server.
//!
//! - [`signing`]: Standard Webhooks v1 signatures (`webhook-signature`), with several secrets
//!   at once for rotation, and their verification (for receivers and tests).
//! - [`ssrf`]: which addresses a push may connect to. Every address a host resolves to is
//!   checked at connect time against the private, loopback, link-local, metadata … ranges,
//!   unless the operator allowed it (`push.allow_cidrs`).
//!
//! The delivery workers, the classification of answers and the per-endpoint protection
//! (breaker, pacing, retry budget) build on these (issue 7).

pub mod signing;
pub mod ssrf;
