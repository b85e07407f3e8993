//! The message state machine's rules, written once for every backend.
//!
//! Pure: no SQL, no I/O, no clock (time is passed in), no OS randomness (the retry
//! jitter's generator is passed in). A backend reads the columns a transition needs into
//! a [`Lifecycle`], lets a rule here check and change it, and writes the changed fields
//! back, in its own transaction. What the rules decide, and so what every backend must
//! agree on:
//!
//! - whether a lease token is a message's live lease, and if not why ([`check_lease`]);
//! - what a failed attempt leads to: the queue's [`RetryPolicy`] decides, under a
//!   release's not-before ([`fail`]); a failure reported at publish, with the attempts
//!   made elsewhere and, when given, the caller's time for the next try
//!   ([`publish_failed`]);
//! - a release's attempt take-back and its bound of uncharged consumer releases
//!   ([`release`]);
//! - a redrive's fresh budget and `max_age` window ([`redrive`]), a kill ([`kill`]), a
//!   lease's last attempt ([`Lifecycle::max_attempts`]) and its extension ([`extend`]);
//! - whether a bridge's return still applies ([`returned_applies`]);
//! - which message of a key may be leased ([`KeyMode`], [`key_head`]).
//!
//! `tests/rules_props.rs` checks them with generated inputs; the SQLite backend
//! (`redrive-store-sqlite`'s `transitions.rs`) and any other backend call them instead of restating them.

use crate::{Release, ReleaseBy, Settled, StoreError};
use redrive_core::{
    DeadReason, Decision, ErrorClass, Failure, FailureContext, HistoryEntry, HistoryEvent,
    LastError, OnDead, Ordering, QueueSettings, RetryPolicy, SplitMix64, State, Timestamp,
};

/// How a lease ended, as a backend stores it beside the message (SQLite: `lease_end`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseEnd {
    /// Settled before it could expire.
    Settled(Settled),
    /// Expired (the reaper failed the attempt).
    Expired,
}

impl LeaseEnd {
    /// The stored name: `acked`, `nacked`, `released`, `killed` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseEnd::Settled(s) => s.as_str(),
            LeaseEnd::Expired => "expired",
        }
    }

    /// Parse the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "expired" => Some(LeaseEnd::Expired),
            other => Settled::parse(other).map(LeaseEnd::Settled),
        }
    }

    /// The error for a call with the token of a lease that ended this way.
    pub fn error(self) -> StoreError {
        match self {
            LeaseEnd::Settled(s) => StoreError::LeaseSettled(s),
            LeaseEnd::Expired => StoreError::LeaseExpired,
        }
    }
}

/// The fields of a stored message that its transitions read and change: everything but
/// its identity, content (payload, headers, key) and history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle {
    /// Its state.
    pub state: State,
    /// When it is due (scheduled, ready; kept as it was in other states).
    pub due_at: Option<Timestamp>,
    /// Deliveries so far (the leased one included).
    pub attempts: u32,
    /// `attempts` at the last redrive: what came before is not counted any more.
    pub budget_base: u32,
    /// Attempts since the last redrive that did not count (uncharged rate limits).
    pub uncounted: u32,
    /// Consumer releases left uncharged since the publish or the last redrive.
    pub released: u32,
    /// The delay chosen before the previous attempt (decorrelated jitter).
    pub prev_delay_ms: Option<u64>,
    /// When it was published.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// Start of the `max_age` window when a redrive set it; `None`: `created_at`.
    pub window_start: Option<Timestamp>,
    /// When its last lease was taken.
    pub leased_at: Option<Timestamp>,
    /// When its lease expires (leased only; a backend may keep it afterwards).
    pub lease_expires_at: Option<Timestamp>,
    /// How its last lease ended; `None` while it is live, before any lease, and (SQLite)
    /// on rows whose lease ended before schema v7.
    pub lease_end: Option<LeaseEnd>,
    /// When it became done or dead.
    pub finished_at: Option<Timestamp>,
    /// Why it is dead.
    pub dead_reason: Option<DeadReason>,
}

impl Lifecycle {
    /// A message published at `now`, due at `deliver_at` (not before `now`): `scheduled`
    /// when that is later, else `ready`; no attempts yet.
    pub fn published(deliver_at: Option<Timestamp>, now: Timestamp) -> Self {
        let due = deliver_at.unwrap_or(now).max(now);
        Self {
            state: if due > now {
                State::Scheduled
            } else {
                State::Ready
            },
            due_at: Some(due),
            attempts: 0,
            budget_base: 0,
            uncounted: 0,
            released: 0,
            prev_delay_ms: None,
            created_at: now,
            updated_at: now,
            window_start: None,
            leased_at: None,
            lease_expires_at: None,
            lease_end: None,
            finished_at: None,
            dead_reason: None,
        }
    }

    /// Attempts counted against `max_attempts` since the last redrive.
    pub fn counted_attempts(&self) -> u32 {
        self.attempts
            .saturating_sub(self.budget_base)
            .saturating_sub(self.uncounted)
    }

    /// Start of the `max_age` window: the last redrive, or the publish.
    pub fn window_start(&self) -> Timestamp {
        self.window_start.unwrap_or(self.created_at)
    }

    /// The attempt number of the message's last try ([`crate::Leased::max_attempts`]):
    /// this attempt plus what is left of the budget (a redrive's fresh budget and
    /// uncharged attempts move it past the policy's `max_attempts`).
    pub fn max_attempts(&self, policy: &RetryPolicy) -> u32 {
        self.attempts
            .saturating_add(policy.max_attempts.saturating_sub(self.counted_attempts()))
    }
}

/// Is `token` the live lease of a message at `now`, given its stored `lease_token`? If
/// not, why: another token ([`StoreError::LeaseMismatch`]), or how this token's lease ended
/// ([`StoreError::LeaseSettled`], [`StoreError::LeaseExpired`]). `history` is asked only
/// for a lease that ended without a stored [`LeaseEnd`] (see [`legacy_lease_end`]).
pub fn check_lease(
    life: &Lifecycle,
    lease_token: Option<&str>,
    token: &str,
    now: Timestamp,
    history: impl FnOnce() -> Result<Vec<HistoryEntry>, StoreError>,
) -> Result<(), StoreError> {
    if lease_token != Some(token) {
        return Err(StoreError::LeaseMismatch);
    }
    if life.state == State::Leased {
        if life.lease_expires_at.is_none_or(|e| e <= now) {
            return Err(StoreError::LeaseExpired); // not reaped yet
        }
        return Ok(());
    }
    let end = match life.lease_end {
        Some(end) => end,
        None => legacy_lease_end(life, token, &history()?),
    };
    Err(end.error())
}

/// How the last lease of a message ended when nothing stored says so (SQLite rows from
/// before schema v7), told from the message and its history: done → acked; the attempt
/// taken back → released; else the history's entry for that attempt (a failure coded
/// `lease_expired` → expired, another failure → nacked, a kill → killed). Nothing says
/// otherwise: expired, what every late call was told before v7.
pub fn legacy_lease_end(life: &Lifecycle, token: &str, history: &[HistoryEntry]) -> LeaseEnd {
    if life.state == State::Done {
        return LeaseEnd::Settled(Settled::Acked);
    }
    if token_attempt(token).is_some_and(|n| n > life.attempts) {
        return LeaseEnd::Settled(Settled::Released);
    }
    history
        .iter()
        .rev()
        .filter(|h| h.attempt == life.attempts)
        .find_map(|h| match &h.event {
            HistoryEvent::Failed { error, .. }
                if error.code.as_deref() == Some("lease_expired") =>
            {
                Some(LeaseEnd::Expired)
            }
            HistoryEvent::Failed { .. } => Some(LeaseEnd::Settled(Settled::Nacked)),
            HistoryEvent::Killed { .. } => Some(LeaseEnd::Settled(Settled::Killed)),
            HistoryEvent::Acked => Some(LeaseEnd::Settled(Settled::Acked)),
            _ => None,
        })
        .unwrap_or(LeaseEnd::Expired)
}

/// The attempt number a lease token was issued for. A token is `ATTEMPT-NONCE`, the
/// nonce random per lease call and mixed with a value random per open of the store, so two
/// leases of one message never share a token, which is all fencing needs.
pub fn token_attempt(token: &str) -> Option<u32> {
    token.split_once('-').and_then(|(n, _)| n.parse().ok())
}

/// Extend a live lease to `now + by_ms`, never shortening it; the new expiry.
pub fn extend(life: &mut Lifecycle, by_ms: u64, now: Timestamp) -> Timestamp {
    let current = life.lease_expires_at.unwrap_or(now);
    let new = now.plus_ms(by_ms).max(current);
    life.lease_expires_at = Some(new);
    life.updated_at = now;
    new
}

/// What a failed attempt also records: how its lease ended (when it was leased), and a
/// time before which its retry may not fall (a charged release's own `until`).
#[derive(Debug, Clone, Copy, Default)]
pub struct AttemptEnd {
    /// How the attempt's lease ended.
    pub lease_end: Option<LeaseEnd>,
    /// No retry before this.
    pub not_before: Option<Timestamp>,
}

impl AttemptEnd {
    /// The attempt's lease ended this way.
    pub fn lease(end: LeaseEnd) -> Self {
        Self {
            lease_end: Some(end),
            not_before: None,
        }
    }
}

/// What [`fail`] decided, for the backend to write.
#[derive(Debug, Clone)]
pub struct FailedAttempt {
    /// The attempt's history entry (`failed`, with the policy's decision).
    pub entry: HistoryEntry,
    /// The message's new last error.
    pub last_error: LastError,
    /// The failure's class.
    pub class: ErrorClass,
    /// The chosen delay, when a retry was scheduled.
    pub retry_delay_ms: Option<u64>,
}

/// A failed attempt (nack, expired lease, charged release, a bridge's return, a publish
/// with `failed`): the queue's policy decides retry (`scheduled`, or `ready` when due now)
/// or dead, never earlier than `end.not_before` (and dead of `max_age` when that falls
/// past the window). `life.attempts` is the failed attempt.
pub fn fail(
    life: &mut Lifecycle,
    policy: &RetryPolicy,
    failure: &Failure,
    end: AttemptEnd,
    now: Timestamp,
    rng: &mut SplitMix64,
) -> FailedAttempt {
    let ctx = failure_context(life, now);
    let mut decision = policy.decide(&ctx, failure, rng);
    if let Some(later) = end.not_before {
        decision = policy.not_before(decision, &ctx, later);
    }
    apply_failure(life, failure, end, decision, now)
}

/// A publish that reports a failure seen elsewhere (`failed`, S1; a bridge's intake; an
/// import of a retry table): the message's first recorded attempt is
/// `attempts_before + 1` (what another mechanism already tried, this failure included),
/// and the queue's policy decides as for any failed attempt — dead when the failure is
/// permanent, the budget is spent or the retry would fall past `max_age`. When the publish
/// also gave `deliver_at`, the caller has timed the next try: a retry is due exactly then
/// (now when that is past), not after the policy's delay
/// ([`RetryPolicy::decide_at`]); without it the policy's delay applies. `life` is the
/// message as [`Lifecycle::published`] made it.
pub fn publish_failed(
    life: &mut Lifecycle,
    policy: &RetryPolicy,
    failure: &Failure,
    attempts_before: u32,
    deliver_at: Option<Timestamp>,
    now: Timestamp,
    rng: &mut SplitMix64,
) -> FailedAttempt {
    life.attempts = attempts_before.saturating_add(1);
    let ctx = failure_context(life, now);
    let decision = match deliver_at {
        Some(at) => policy.decide_at(&ctx, failure, at),
        None => policy.decide(&ctx, failure, rng),
    };
    apply_failure(life, failure, AttemptEnd::default(), decision, now)
}

/// What the policy is told about the message whose attempt `life.attempts` failed.
fn failure_context(life: &Lifecycle, now: Timestamp) -> FailureContext {
    FailureContext {
        counted_attempts: life.counted_attempts().max(1),
        window_start: life.window_start(),
        now,
        prev_delay_ms: life.prev_delay_ms,
        uncharged_rate_limited: life.uncounted,
    }
}

/// Write the policy's `decision` on a failed attempt into `life`, and the attempt's
/// history entry.
fn apply_failure(
    life: &mut Lifecycle,
    failure: &Failure,
    end: AttemptEnd,
    decision: Decision,
    now: Timestamp,
) -> FailedAttempt {
    let last_error = LastError {
        class: failure.class,
        message: failure.message.clone(),
        code: failure.code.clone(),
        at: now,
    };
    life.updated_at = now;
    if let Some(e) = end.lease_end {
        life.lease_end = Some(e);
    }
    let (mut retry_at, mut delay, mut dead) = (None, None, None);
    match decision {
        Decision::Retry {
            delay_ms,
            due_at,
            counted,
        } => {
            life.state = if due_at > now {
                State::Scheduled
            } else {
                State::Ready
            };
            life.due_at = Some(due_at);
            life.prev_delay_ms = Some(delay_ms);
            if !counted {
                life.uncounted += 1;
            }
            retry_at = Some(due_at);
            delay = Some(delay_ms);
        }
        Decision::Dead { reason } => {
            life.state = State::Dead;
            life.finished_at = Some(now);
            life.dead_reason = Some(reason);
            dead = Some(reason);
        }
    }
    let entry = HistoryEntry {
        attempt: life.attempts,
        at: now,
        leased_at: life.leased_at,
        event: HistoryEvent::Failed {
            error: last_error.clone(),
            retry_after_ms: failure.retry_after_ms,
            retry_at,
            delay_ms: delay,
            dead_reason: dead,
        },
        response: None,
    };
    FailedAttempt {
        entry,
        last_error,
        class: failure.class,
        retry_delay_ms: delay,
    }
}

/// Hand a live lease back unattempted ([`Release`]). A consumer's release past the
/// queue's `max_rate_limited` uncharged ones since the publish or the last redrive is a
/// failed attempt instead ([`ReleaseBy::Consumer`]): then the [`fail`] it applied.
/// Uncharged (`None`), it is `ready` (due time kept, so it keeps its place) or `scheduled`
/// until the release's `until`, the lease's attempt taken back.
pub fn release(
    life: &mut Lifecycle,
    policy: &RetryPolicy,
    release: &Release,
    now: Timestamp,
    rng: &mut SplitMix64,
) -> Option<FailedAttempt> {
    let ended = LeaseEnd::Settled(Settled::Released);
    if release.by == ReleaseBy::Consumer {
        let bound = policy.max_rate_limited;
        if life.released >= bound {
            let end = AttemptEnd {
                lease_end: Some(ended),
                not_before: Some(release.until),
            };
            let failure = Failure::released_past_bound(bound);
            return Some(fail(life, policy, &failure, end, now, rng));
        }
        life.released += 1;
    }
    if release.until > now {
        life.state = State::Scheduled;
        life.due_at = Some(release.until);
    } else {
        life.state = State::Ready;
    }
    life.attempts = life.attempts.saturating_sub(1);
    life.updated_at = now;
    life.lease_expires_at = None;
    life.lease_end = Some(ended);
    None
}

/// Redrive a dead or scheduled message: `ready` now, with a fresh attempt budget and a
/// fresh `max_age` window counted from now (SPEC §2). The history entry names an edit and
/// the bulk task doing it.
pub fn redrive(
    life: &mut Lifecycle,
    edited: bool,
    task: Option<&str>,
    now: Timestamp,
) -> Result<HistoryEntry, StoreError> {
    if !matches!(life.state, State::Dead | State::Scheduled) {
        return Err(StoreError::InvalidState {
            state: life.state,
            action: "redrive",
            allowed: "dead or scheduled",
        });
    }
    life.state = State::Ready;
    life.due_at = Some(now);
    life.updated_at = now;
    life.budget_base = life.attempts;
    life.uncounted = 0;
    life.released = 0;
    life.prev_delay_ms = None;
    life.finished_at = None;
    life.dead_reason = None;
    life.window_start = Some(now);
    Ok(HistoryEntry {
        attempt: life.attempts,
        at: now,
        leased_at: None,
        event: HistoryEvent::Redriven {
            edited,
            task: task.map(str::to_owned),
        },
        response: None,
    })
}

/// Kill a scheduled, ready or leased message: dead, `killed` (a live lease ends killed).
pub fn kill(
    life: &mut Lifecycle,
    reason: Option<String>,
    now: Timestamp,
) -> Result<HistoryEntry, StoreError> {
    if life.state.is_final() {
        return Err(StoreError::InvalidState {
            state: life.state,
            action: "kill",
            allowed: "scheduled, ready or leased",
        });
    }
    if life.state == State::Leased {
        life.lease_end = Some(LeaseEnd::Settled(Settled::Killed));
    }
    life.state = State::Dead;
    life.finished_at = Some(now);
    life.updated_at = now;
    life.dead_reason = Some(DeadReason::Killed);
    Ok(HistoryEntry {
        attempt: life.attempts,
        at: now,
        leased_at: None,
        event: HistoryEvent::Killed { reason },
        response: None,
    })
}

/// Does a bridge's return of `attempt` still apply? Only to that attempt of a message
/// still `done` or `leased`; anything else is a repeat and changes nothing.
pub fn returned_applies(life: &Lifecycle, attempt: u32) -> bool {
    matches!(life.state, State::Done | State::Leased) && life.attempts == attempt
}

/// How a queue orders the messages of a key (SPEC §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyMode {
    /// No per-key ordering.
    Unordered,
    /// `ordering = "key"`, `on_dead = "skip"`: dead messages release their key.
    Skip,
    /// `ordering = "key"`, `on_dead = "block"`: dead messages keep their key blocked.
    Block,
}

impl KeyMode {
    /// The mode of a queue.
    pub fn of(settings: &QueueSettings) -> Self {
        match (settings.ordering, settings.on_dead) {
            (Ordering::None, _) => KeyMode::Unordered,
            (Ordering::Key, OnDead::Skip) => KeyMode::Skip,
            (Ordering::Key, OnDead::Block) => KeyMode::Block,
        }
    }

    /// Does a keyed message in `state` take part in its key's order (block later ones)?
    pub fn takes_part(self, state: State) -> bool {
        match self {
            KeyMode::Unordered => false,
            KeyMode::Skip => matches!(state, State::Scheduled | State::Ready | State::Leased),
            KeyMode::Block => state != State::Done,
        }
    }
}

/// The ordering mode of every queue of a catalog, as a shared store records it next to the
/// rows it produced (PostgreSQL and MySQL: `meta.key_order_modes`, JSON), so that a changed
/// configuration is noticed at open and the affected queues' rows rewritten.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyModes {
    /// The mode of every queue not listed.
    pub default: KeyMode,
    /// The queues whose mode is not the default.
    pub queues: std::collections::BTreeMap<String, KeyMode>,
}

impl KeyModes {
    /// The modes of `catalog`'s queues.
    pub fn of(catalog: &redrive_core::QueueCatalog) -> Self {
        // The empty name is never a configured queue: it gets the default settings.
        let default = KeyMode::of(catalog.get(""));
        let queues = catalog
            .configured()
            .map(|q| (q.to_owned(), KeyMode::of(catalog.get(q))))
            .filter(|(_, m)| *m != default)
            .collect();
        Self { default, queues }
    }

    /// What a store that never recorded modes wrote its rows under: every queue unordered.
    pub fn unordered() -> Self {
        Self {
            default: KeyMode::Unordered,
            queues: std::collections::BTreeMap::new(),
        }
    }

    /// The mode of `queue`.
    pub fn get(&self, queue: &str) -> KeyMode {
        self.queues.get(queue).copied().unwrap_or(self.default)
    }
}

/// Which message of one key may be leased now, given the key's messages as (publish
/// order, state), in any order: under per-key ordering, the oldest message taking part in
/// the key's order, when it is ready and no message of the key is leased. `None` when
/// none may (or the queue is unordered: then every ready message may).
pub fn key_head<S: Ord + Copy>(
    mode: KeyMode,
    messages: impl IntoIterator<Item = (S, State)>,
) -> Option<S> {
    if mode == KeyMode::Unordered {
        return None;
    }
    let mut oldest: Option<(S, State)> = None;
    for (seq, state) in messages {
        if state == State::Leased {
            return None;
        }
        if mode.takes_part(state) && oldest.is_none_or(|(s, _)| seq < s) {
            oldest = Some((seq, state));
        }
    }
    oldest.and_then(|(seq, state)| (state == State::Ready).then_some(seq))
}
