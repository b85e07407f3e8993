//! Messages, their states and their history.
//!
//! ```text
//!  publish ──► scheduled ──(due)──► ready ──(lease)──► leased ──(ack)──► done
//!     │            ▲                  ▲                  │
//!     └──(no delay)┼──────────────────┘                  │ nack / lease expired
//!                  └────────────(retry)──────────────────┤
//!                                                        └──(no retry left)──► dead
//!  dead / scheduled ──(redrive)──► ready          any ──(kill)──► dead
//! ```

use crate::{ErrorClass, MessageId, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a message is in its life (SPEC §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Waiting for `due_at`: a delayed publish or a retry backoff.
    Scheduled = 0,
    /// Due and deliverable.
    Ready = 1,
    /// Handed to a consumer until the lease expires.
    Leased = 2,
    /// Acked. Kept for the configured retention, then purged.
    Done = 3,
    /// No more retries. Kept until an operator acts.
    Dead = 4,
}

impl State {
    /// Every state, in lifecycle order.
    pub const ALL: [State; 5] = [
        State::Scheduled,
        State::Ready,
        State::Leased,
        State::Done,
        State::Dead,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Scheduled => "scheduled",
            State::Ready => "ready",
            State::Leased => "leased",
            State::Done => "done",
            State::Dead => "dead",
        }
    }

    /// Parse the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// A small stable integer for storage. These values are on disk (and in the SQLite
    /// schema's partial indexes): they never change, and a new state takes a new number.
    pub fn code(self) -> u8 {
        match self {
            State::Scheduled => 0,
            State::Ready => 1,
            State::Leased => 2,
            State::Done => 3,
            State::Dead => 4,
        }
    }

    /// The inverse of [`State::code`]; `None` for a code no state has (a reader must
    /// treat it as an error, not guess).
    pub fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(State::Scheduled),
            1 => Some(State::Ready),
            2 => Some(State::Leased),
            3 => Some(State::Done),
            4 => Some(State::Dead),
            _ => None,
        }
    }

    /// Done or dead: no delivery will happen without an operator.
    pub fn is_final(self) -> bool {
        matches!(self, State::Done | State::Dead)
    }
}

/// Why a message is dead (SPEC §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadReason {
    /// The last allowed attempt failed.
    MaxAttempts,
    /// The next retry would fall past `created_at + max_age`.
    MaxAge,
    /// The attempt failed with class `permanent`.
    PermanentError,
    /// An operator killed it.
    Killed,
    /// A push endpoint answered 410 Gone: it will never take the message.
    EndpointGone,
}

impl DeadReason {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::MaxAttempts => "max_attempts",
            DeadReason::MaxAge => "max_age",
            DeadReason::PermanentError => "permanent_error",
            DeadReason::Killed => "killed",
            DeadReason::EndpointGone => "endpoint_gone",
        }
    }

    /// Parse the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::MaxAttempts,
            Self::MaxAge,
            Self::PermanentError,
            Self::Killed,
            Self::EndpointGone,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

/// The most recent failure of a message, as shown to consumers and operators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastError {
    /// Its class.
    pub class: ErrorClass,
    /// Free text from the consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A machine code set by redrive itself (e.g. `lease_expired`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// When it happened.
    pub at: Timestamp,
}

/// What happened, in one history entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum HistoryEvent {
    /// The attempt was acked.
    Acked,
    /// A bridge handed the attempt back to its broker and the broker took it (RabbitMQ's
    /// publisher confirm, Redis's `XADD`): the message is `done` unless the broker's
    /// consumer fails the copy, which then comes back as a failed attempt. Not an ack: no
    /// consumer has processed it yet.
    Republished,
    /// The attempt failed; `next` says what the policy decided.
    Failed {
        /// The failure.
        error: LastError,
        /// `retry_after` the consumer asked for, in ms.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
        /// Scheduled retry time, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_at: Option<Timestamp>,
        /// The delay chosen by the policy, in ms.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delay_ms: Option<u64>,
        /// Why it is dead, if it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dead_reason: Option<DeadReason>,
    },
    /// An operator redrove it: ready now, fresh attempt budget.
    Redriven {
        /// The operator replaced the payload before redriving it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        edited: bool,
        /// The bulk task that redrove it, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        task: Option<String>,
    },
    /// An operator killed it.
    Killed {
        /// The operator's reason.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Push delivery: the message was due but waited, uncharged, for its endpoint (SPEC §10:
    /// "says so in its timeline"). One entry per wait episode: between two attempts a
    /// message has at most one per [`WaitedFor`], updated while the wait goes on
    /// ([`note_wait`]); the entry's `at` is the latest moment it was seen waiting.
    Waited {
        /// What it waited for.
        #[serde(rename = "for")]
        waited_for: WaitedFor,
        /// Since when (it was due then, or the wait began then).
        since: Timestamp,
        /// How many times it was leased and handed back meanwhile (0: it waited in the
        /// store, not leased, e.g. while the breaker was open).
        #[serde(default, skip_serializing_if = "is_zero")]
        parks: u32,
    },
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a push message waited for (SPEC §10, "Downstream protection").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitedFor {
    /// The endpoint's circuit breaker was open (or its half-open probe was out).
    Breaker,
    /// The endpoint's release pace after an outage, or its configured rate limit.
    Pace,
    /// The endpoint's retry budget had no room for another retry.
    Budget,
    /// The endpoint had as many calls in flight as its `concurrency`.
    Concurrency,
}

impl WaitedFor {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Breaker => "breaker",
            Self::Pace => "pace",
            Self::Budget => "budget",
            Self::Concurrency => "concurrency",
        }
    }
}

/// A wait to note in a message's history (see [`note_wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waited {
    /// What it waited for.
    pub waited_for: WaitedFor,
    /// Since when.
    pub since: Timestamp,
    /// It was leased and handed back (a park), rather than left waiting in the store.
    pub parked: bool,
}

/// Note in `history` that the message waited (`wait`, seen at `at`) before its attempt
/// `attempt`. Bounded: among the `waited` entries since the last other entry, one of the same
/// [`WaitedFor`] is updated (its `at`, its `parks`, the earlier `since`) rather than a new one
/// added, so a message parked a thousand times in an outage has one entry per reason, not a
/// thousand. Returns whether an entry was added (else one was updated).
pub fn note_wait(
    history: &mut Vec<HistoryEntry>,
    attempt: u32,
    wait: Waited,
    at: Timestamp,
) -> bool {
    let parks = u32::from(wait.parked);
    let run = history
        .iter()
        .rposition(|h| !matches!(h.event, HistoryEvent::Waited { .. }))
        .map_or(0, |i| i + 1);
    for h in &mut history[run..] {
        if let HistoryEvent::Waited {
            waited_for,
            since,
            parks: n,
        } = &mut h.event
        {
            if *waited_for == wait.waited_for {
                *since = (*since).min(wait.since);
                *n = n.saturating_add(parks);
                h.at = h.at.max(at);
                h.attempt = attempt;
                return false;
            }
        }
    }
    history.push(HistoryEntry {
        attempt,
        at,
        leased_at: None,
        event: HistoryEvent::Waited {
            waited_for: wait.waited_for,
            since: wait.since.min(at),
            parks,
        },
        response: None,
    });
    true
}

/// One entry of a message's history: an attempt's outcome or an operator action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// The attempt number this entry belongs to (0 for operator actions before any attempt).
    pub attempt: u32,
    /// When it happened.
    pub at: Timestamp,
    /// When the attempt's lease started, for attempts delivered by a lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leased_at: Option<Timestamp>,
    /// What happened.
    #[serde(flatten)]
    pub event: HistoryEvent,
    /// What the endpoint answered, for attempts redrive made itself (push delivery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AttemptResponse>,
}

/// What an endpoint answered to one push attempt (SPEC §10), kept in the attempt's history
/// entry so an operator sees why each attempt failed, and what the request left out.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AttemptResponse {
    /// The HTTP status; absent when there was no answer (timeout, connection error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// From sending the request to the end of the answer (or the failure), ms.
    pub latency_ms: u64,
    /// The first bytes of the answer's body (at most 1 KiB, cut at a character boundary),
    /// or what went wrong when there was no answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The message's headers the request did not carry because the server owns them
    /// (`host`, `content-length`, `content-type`, `webhook-*` …; SPEC §10): publish refuses
    /// them on a push queue, so only a message stored before its queue was a push queue has any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_headers: Vec<String>,
}

/// A message as stored and shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Sortable id.
    pub id: MessageId,
    /// Its queue.
    pub queue: String,
    /// Current state.
    pub state: State,
    /// Any JSON value.
    pub payload: serde_json::Value,
    /// String headers.
    pub headers: BTreeMap<String, String>,
    /// Ordering / partition key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Idempotency key given at publish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// 0–9, higher first.
    pub priority: u8,
    /// Deliveries so far (leases handed out, plus a failure reported at publish).
    pub attempts: u32,
    /// When it becomes (or became) deliverable; for scheduled and ready messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    /// Lease expiry, for leased messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<Timestamp>,
    /// Publish time.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
    /// When it became done or dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// Why it is dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_reason: Option<DeadReason>,
    /// The most recent failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<LastError>,
    /// One entry per attempt outcome and operator action. Empty in listings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
    /// Push delivery: where this message goes instead of its queue's `url` (queues with
    /// `allow_message_targets = true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_url: Option<String>,
}

/// A message to publish, validated by the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// Target queue (already validated).
    pub queue: String,
    /// Any JSON value.
    pub payload: serde_json::Value,
    /// String headers.
    pub headers: BTreeMap<String, String>,
    /// Ordering key.
    pub key: Option<String>,
    /// Idempotency key.
    pub idempotency_key: Option<String>,
    /// 0–9.
    pub priority: u8,
    /// Deliver no earlier than this.
    pub deliver_at: Option<Timestamp>,
    /// A failure seen elsewhere, recorded as attempt 1 and scheduled by the policy.
    pub failed: Option<crate::Failure>,
    /// Push delivery: the message's own endpoint URL (see [`Message::target_url`]).
    pub target_url: Option<String>,
    /// With `failed`: attempts already made elsewhere before that one (a bridge takes in a
    /// message another retry mechanism already counted, `x-retry-count`). The failure is
    /// then attempt `attempts_before + 1`, and the policy counts them all.
    pub attempts_before: u32,
}

impl NewMessage {
    /// A plain message: no key, priority 0, due now.
    pub fn new(queue: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            queue: queue.into(),
            payload,
            headers: BTreeMap::new(),
            key: None,
            idempotency_key: None,
            priority: 0,
            deliver_at: None,
            failed: None,
            target_url: None,
            attempts_before: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_codes_round_trip() {
        for s in State::ALL {
            assert_eq!(State::from_code(s.code()), Some(s));
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
        assert_eq!(State::from_code(9), None);
    }

    /// The codes are on disk: changing one would silently re-state every stored message.
    #[test]
    fn state_codes_are_pinned_on_disk_values() {
        let pinned = [
            (State::Scheduled, 0u8),
            (State::Ready, 1),
            (State::Leased, 2),
            (State::Done, 3),
            (State::Dead, 4),
        ];
        for (state, code) in pinned {
            assert_eq!(state.code(), code, "{state:?}");
            assert_eq!(State::from_code(code), Some(state), "{code}");
            assert_eq!(state as u8, code, "{state:?} discriminant");
        }
        assert_eq!(
            State::ALL.len(),
            pinned.len(),
            "a new state needs a pinned code"
        );
    }

    #[test]
    fn unknown_state_code_is_none_not_dead() {
        for code in [5u8, 9, 42, 255] {
            assert_eq!(State::from_code(code), None, "{code}");
        }
    }

    fn waited(waited_for: WaitedFor, since: i64, parked: bool) -> Waited {
        Waited {
            waited_for,
            since: Timestamp::from_millis(since),
            parked,
        }
    }

    #[test]
    fn a_wait_is_one_entry_per_episode_and_reason_however_often_it_is_noted() {
        let t = Timestamp::from_millis;
        let mut h = vec![HistoryEntry {
            attempt: 1,
            at: t(1_000),
            leased_at: Some(t(900)),
            event: HistoryEvent::Acked,
            response: None,
        }];
        // Parked 1,000 times for the budget, with the breaker in between: two entries.
        assert!(note_wait(
            &mut h,
            2,
            waited(WaitedFor::Budget, 2_000, true),
            t(2_000)
        ));
        for i in 1..1_000 {
            let kind = if i % 10 == 0 {
                WaitedFor::Breaker
            } else {
                WaitedFor::Budget
            };
            note_wait(
                &mut h,
                2,
                waited(kind, 2_000 + i, kind == WaitedFor::Budget),
                t(2_000 + i),
            );
        }
        assert_eq!(h.len(), 3, "{h:?}");
        assert_eq!(
            h[1].event,
            HistoryEvent::Waited {
                waited_for: WaitedFor::Budget,
                since: t(2_000),
                parks: 901
            }
        );
        assert_eq!(h[1].at, t(2_999));
        assert_eq!(
            h[2].event,
            HistoryEvent::Waited {
                waited_for: WaitedFor::Breaker,
                since: t(2_010),
                parks: 0
            }
        );
        assert_eq!(h[2].at, t(2_990));
        // Each reason at most once between two attempts, whatever the order.
        for (i, kind) in [
            WaitedFor::Pace,
            WaitedFor::Concurrency,
            WaitedFor::Pace,
            WaitedFor::Budget,
        ]
        .into_iter()
        .enumerate()
        {
            note_wait(&mut h, 2, waited(kind, 3_000, false), t(3_000 + i as i64));
        }
        assert_eq!(h.len(), 5, "{h:?}");
        // After the next attempt, a new episode.
        h.push(HistoryEntry {
            attempt: 2,
            at: t(4_000),
            leased_at: Some(t(3_900)),
            event: HistoryEvent::Acked,
            response: None,
        });
        assert!(note_wait(
            &mut h,
            3,
            waited(WaitedFor::Budget, 5_000, true),
            t(5_100)
        ));
        assert_eq!(h.len(), 7);
        let v = serde_json::to_value(&h[6]).unwrap();
        assert_eq!(v["event"], "waited");
        assert_eq!(v["for"], "budget");
        assert_eq!(v["parks"], 1);
        assert_eq!(v["attempt"], 3);
        let back: HistoryEntry = serde_json::from_value(v).unwrap();
        assert_eq!(back, h[6]);
        // An in-store wait has no `parks`.
        let v = serde_json::to_value(&h[2]).unwrap();
        assert!(v.get("parks").is_none(), "{v}");
    }

    #[test]
    fn history_serializes_flat() {
        let e = HistoryEntry {
            attempt: 2,
            at: Timestamp::from_millis(0),
            leased_at: None,
            event: HistoryEvent::Killed {
                reason: Some("bad".into()),
            },
            response: None,
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["event"], "killed");
        assert_eq!(v["reason"], "bad");
        let back: HistoryEntry = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn a_bridge_confirm_is_republished_not_acked() {
        let e = HistoryEntry {
            attempt: 1,
            at: Timestamp::from_millis(0),
            leased_at: None,
            event: HistoryEvent::Republished,
            response: None,
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["event"], "republished");
        assert_eq!(serde_json::from_value::<HistoryEntry>(v).unwrap(), e);
    }
}
