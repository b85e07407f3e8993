//! Push delivery (SPEC §10): the pieces that do not need a server.
//!
//! - [`signing`]: Standard Webhooks v1 signatures (`webhook-signature`), with several secrets
//!   at once for rotation, and their verification (for receivers and tests).
//! - [`ssrf`]: which addresses a push may connect to. Every address a host resolves to is
//!   checked at connect time against the private, loopback, link-local, metadata … ranges,
//!   unless the operator allowed it (`push.allow_cidrs`).
//!
//! - [`classify`]: what an answer means (done, a failure class with its `Retry-After`, gone),
//!   from a table of rules with the SPEC §10 defaults.
//!
//! The delivery workers and the per-endpoint protection
//! (breaker, pacing, retry budget) build on these (issue 7).

pub mod classify;
pub mod protect;
pub mod signing;
pub mod ssrf;
