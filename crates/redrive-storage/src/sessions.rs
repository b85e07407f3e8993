//! The console's sessions, kept in the store so that every node of a cluster knows them
//! (SPEC §13: "the console works behind a load balancer"): a session opened on one node is
//! valid on every other, and a sign-out on any node ends it everywhere.
//!
//! The store keeps what the server gives it and applies the two bounds it is told:
//! a session not seen for [`NewSession::idle_ms`] / [`SessionLookup::idle_ms`] has expired
//! (at the store's clock: the database's on a shared store), and a token keeps at most
//! [`NewSession::max_per_token`] sessions. It never sees a cookie: the server stores a
//! digest of the cookie's secret as the session's `id`, so that someone who can read the
//! database cannot sign in with what they read.
//!
//! Expired sessions are deleted when a session is created ([`Store::session_create`]); a
//! lookup never answers one. So the table holds at most `max_per_token` live sessions per
//! token, plus the expired ones since the last sign-in.
//!
//! [`Store::session_create`]: crate::Store::session_create

use redrive_core::Timestamp;

/// A session to open ([`Store::session_create`](crate::Store::session_create)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSession {
    /// Its key in the store: a digest of the cookie's secret (the server's choice; never
    /// the secret itself).
    pub id: String,
    /// The name of the token it was opened with.
    pub token: String,
    /// The CSRF token of its forms.
    pub csrf: String,
    /// After this session is stored, `token` keeps at most this many sessions (at least
    /// 1: this one): the least recently used of its others are deleted. Another token's
    /// sessions are never touched.
    pub max_per_token: u32,
    /// Every session (of any token) not seen for this long is expired, and deleted now.
    pub idle_ms: u64,
}

/// A session to find, and keep alive ([`Store::session_get`](crate::Store::session_get)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLookup {
    /// The session's key ([`NewSession::id`]).
    pub id: String,
    /// A session not seen for this long has expired: not answered.
    pub idle_ms: u64,
    /// The session's `last_seen` is moved to now only when it is older than this, so that
    /// every request is not a write (the least recently used order, and the expiry, are
    /// then this coarse).
    pub touch_after_ms: u64,
}

/// A stored session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// Its key ([`NewSession::id`]).
    pub id: String,
    /// The token it was opened with.
    pub token: String,
    /// The CSRF token of its forms.
    pub csrf: String,
    /// When it was opened (the store's clock).
    pub created_at: Timestamp,
    /// When it was last seen, as last touched (the store's clock).
    pub last_seen: Timestamp,
}

impl SessionRecord {
    /// Whether it has expired at `now` under `idle_ms`.
    pub fn expired(&self, now: Timestamp, idle_ms: u64) -> bool {
        now.as_millis().saturating_sub(self.last_seen.as_millis()) >= clamp_ms(idle_ms)
    }

    /// Whether a lookup at `now` moves its `last_seen` ([`SessionLookup::touch_after_ms`]).
    pub fn due_for_touch(&self, now: Timestamp, touch_after_ms: u64) -> bool {
        now.as_millis().saturating_sub(self.last_seen.as_millis()) >= clamp_ms(touch_after_ms)
    }
}

/// A duration in ms as the `i64` the stores compute with.
pub fn clamp_ms(ms: u64) -> i64 {
    ms.min(i64::MAX as u64 / 4) as i64
}

/// The oldest `last_seen` a live session may have at `now` under `idle_ms`: sessions last
/// seen at or before the answer have expired.
pub fn expired_at_or_before(now: Timestamp, idle_ms: u64) -> i64 {
    now.as_millis().saturating_sub(clamp_ms(idle_ms))
}
