//! Alerts (SPEC §12): a notifier that tells operators about dead-letter inflow and about
//! queues past a threshold, **delivered through redrive's own push delivery**. The notifier
//! makes no HTTP call: it renders each alert as the JSON body a webhook expects and publishes
//! it as a message into a push queue the operator configured (a *sink*), so an alert is
//! signed, retried, protected by the breaker and the SSRF guard, kept in history, and
//! dead-lettered like any message.
//!
//! - **Dead-letter inflow.** The engine hands every message that becomes dead by a failure
//!   (nack, expired lease, a bridge's return, a publish with `failed`) to [`DeadLetters`], a
//!   small bounded record in memory: per queue, the open batch (count, fingerprints of the
//!   last errors, a few ids). A batch opens with a queue's first death and closes
//!   `dead_letter_window` later; the notifier then sends one alert for it when it holds at
//!   least the queue's `dead_letters` threshold. Operator kills are not recorded (an operator
//!   decided them). The record is in memory: a crash loses the open batches (the messages
//!   stay dead and findable); a graceful stop sends them.
//! - **Levels.** Every `interval`, backlog (ready + scheduled) and oldest ready age of each
//!   queue from [`redrive_storage::Store::queue_stats`]: an alert when a threshold is crossed,
//!   again every `repeat` while it stays crossed, and a `resolved` one when it no longer is.
//!   The state is in memory: after a restart a condition still true is alerted again.
//! - Sink queues are never evaluated (nor recorded), so an endpoint that is down cannot
//!   alert about its own alerts.
//! - Each alert is published with the idempotency key `alert:SINK:KIND:QUEUE:FROM:TO` (the
//!   batch's window in ms; for levels both are the time of the alert), so a publish retried
//!   after an error is not a second message.

use super::supervisor::{Placement, Service};
use super::{Engine, Event, Observer, Signal};
use redrive_core::{fingerprint, format_duration_ms, Message, MessageId, NewMessage, Timestamp};
use redrive_storage::{QueueStats, StoreError};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::watch;

/// Fingerprints named in an alert, largest first.
pub const TOP_REASONS: usize = 3;
/// Message ids given as examples in a dead-letter alert.
pub const EXAMPLES: usize = 3;
/// Batches (queues with deaths not yet alerted) kept at most; deaths past it are counted in
/// a log line, not in an alert.
const MAX_BATCHES: usize = 1_000;
/// Distinct fingerprints counted per batch; later ones are counted as `other`.
const MAX_FINGERPRINTS: usize = 100;
/// Alerts waiting to be published (the store refused) kept at most; the oldest go first.
const MAX_OUTBOX: usize = 1_000;

/// How an alert's body is shaped for its webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Template {
    /// Every field (see [`Alert::render`]).
    Json,
    /// A Feishu / Lark custom bot: `{"msg_type": "text", "content": {"text": …}}`.
    Feishu,
    /// A DingTalk custom robot: `{"msgtype": "text", "text": {"content": …}}`.
    Dingtalk,
    /// A Slack incoming webhook: `{"text": …}`.
    Slack,
}

impl Template {
    /// Every template name.
    pub const NAMES: &'static str = "json, feishu, dingtalk or slack";

    /// The template called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "json" => Self::Json,
            "feishu" => Self::Feishu,
            "dingtalk" => Self::Dingtalk,
            "slack" => Self::Slack,
            _ => return None,
        })
    }

    /// `text` made inert for this template's chat markup (SPEC §12): what messages wrote
    /// (error text in the top reasons, through fingerprints) can never mention everyone,
    /// ping a channel or disguise a link. The alert's own text has no markup, so the whole
    /// sentence is escaped.
    ///
    /// - Slack reads `<…>` as mentions (`<!channel>`, `<@U…>`) and labelled links
    ///   (`<https://…|label>`), and wants `&`, `<`, `>` as `&amp;`, `&lt;`, `&gt;`, which it
    ///   shows as the characters (a URL keeps working).
    /// - Feishu's text message has no escape: `<at user_id="all">` mentions everyone and
    ///   `[label](url)` is a labelled link. Angle brackets become their full-width forms
    ///   (`＜`, `＞`: read the same, are no tag), and `](` gets a space, so a link shows
    ///   its real address.
    /// - DingTalk's text message has no markup: mentions come only from the body's `at`
    ///   object, which redrive never sends, so the text is sent as it is.
    /// - JSON is structured: the receiver decides (its `text` is the raw sentence).
    pub fn escape(self, text: &str) -> String {
        match self {
            Self::Json | Self::Dingtalk => text.to_owned(),
            Self::Slack => text
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;"),
            Self::Feishu => text
                .replace('<', "\u{ff1c}")
                .replace('>', "\u{ff1e}")
                .replace("](", "] ("),
        }
    }
}

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Messages became dead.
    DeadLetters,
    /// The oldest ready message waited too long.
    OldestReadyAge,
    /// Too many messages ready or scheduled.
    Backlog,
}

impl Kind {
    /// The name in bodies, keys and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeadLetters => "dead_letters",
            Self::OldestReadyAge => "oldest_ready_age",
            Self::Backlog => "backlog",
        }
    }
}

/// Whether a condition holds or no longer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It holds.
    Firing,
    /// It held and no longer does.
    Resolved,
}

impl Status {
    /// The name in bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Firing => "firing",
            Self::Resolved => "resolved",
        }
    }
}

/// One queue's thresholds (`None`: no alert of that kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Alert when the oldest ready message is older than this, ms.
    pub oldest_ready_age_ms: Option<u64>,
    /// Alert when ready + scheduled is above this.
    pub backlog: Option<u64>,
    /// Alert when at least this many died in one window.
    pub dead_letters: Option<u64>,
}

impl Default for Thresholds {
    /// Dead-letter alerts from the first death; no level alerts.
    fn default() -> Self {
        Self {
            oldest_ready_age_ms: None,
            backlog: None,
            dead_letters: Some(1),
        }
    }
}

/// One `[[alerts.sinks]]`: where alerts go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sink {
    /// Its name (metrics label, idempotency keys).
    pub name: String,
    /// The push queue its alerts are published into.
    pub queue: String,
    /// The body's shape.
    pub template: Template,
    /// Only alerts about these queues; empty: every queue.
    pub queues: Vec<String>,
}

impl Sink {
    /// Whether alerts about `queue` go to this sink.
    pub fn wants(&self, queue: &str) -> bool {
        self.queues.is_empty() || self.queues.iter().any(|q| q == queue)
    }
}

/// The notifier's settings, checked (built by `Config::alert_settings`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertSettings {
    /// How often the notifier evaluates, ms.
    pub interval_ms: u64,
    /// How long a dead-letter batch stays open, ms.
    pub dead_letter_window_ms: u64,
    /// A level alert still firing is sent again after this, ms.
    pub repeat_ms: u64,
    /// Put in front of links (`https://redrive.internal`); empty: links are paths.
    pub console_url: String,
    /// Where alerts go; none: the notifier does not run.
    pub sinks: Vec<Sink>,
    /// Thresholds of queues without their own.
    pub default_thresholds: Thresholds,
    /// Thresholds per queue (already merged over the default ones).
    pub thresholds: BTreeMap<String, Thresholds>,
}

impl Default for AlertSettings {
    fn default() -> Self {
        Self {
            interval_ms: 30_000,
            dead_letter_window_ms: 300_000,
            repeat_ms: 3_600_000,
            console_url: String::new(),
            sinks: Vec::new(),
            default_thresholds: Thresholds::default(),
            thresholds: BTreeMap::new(),
        }
    }
}

impl AlertSettings {
    /// Whether the notifier runs (it has somewhere to send).
    pub fn enabled(&self) -> bool {
        !self.sinks.is_empty()
    }

    /// Whether `queue` is a sink's queue (never evaluated).
    pub fn is_sink_queue(&self, queue: &str) -> bool {
        self.sinks.iter().any(|s| s.queue == queue)
    }

    /// The thresholds of `queue`.
    pub fn thresholds_of(&self, queue: &str) -> Thresholds {
        self.thresholds
            .get(queue)
            .copied()
            .unwrap_or(self.default_thresholds)
    }

    /// Whether alerts about `queue` have somewhere to go.
    fn watched(&self, queue: &str) -> bool {
        !self.is_sink_queue(queue) && self.sinks.iter().any(|s| s.wants(queue))
    }

    /// Whether any queue has a backlog or oldest-ready-age threshold.
    fn has_levels(&self) -> bool {
        std::iter::once(&self.default_thresholds)
            .chain(self.thresholds.values())
            .any(|t| t.backlog.is_some() || t.oldest_ready_age_ms.is_some())
    }
}

/// The deaths of one queue in one window, as the notifier gets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The queue.
    pub queue: String,
    /// The first death.
    pub from: Timestamp,
    /// The window's end (or the stop, for a batch sent before its window ended).
    pub to: Timestamp,
    /// Messages that died.
    pub count: u64,
    /// Deaths per fingerprint of the last error, largest first.
    pub reasons: Vec<(String, u64)>,
    /// The first few ids.
    pub examples: Vec<MessageId>,
}

/// A batch still open.
#[derive(Debug)]
struct Open {
    from: Timestamp,
    count: u64,
    reasons: HashMap<String, u64>,
    examples: Vec<MessageId>,
}

impl Open {
    fn close(self, queue: String, to: Timestamp) -> Batch {
        let mut reasons: Vec<(String, u64)> = self.reasons.into_iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Batch {
            queue,
            from: self.from,
            to,
            count: self.count,
            reasons,
            examples: self.examples,
        }
    }
}

#[derive(Debug, Default)]
struct Record {
    open: BTreeMap<String, Open>,
    closed: Vec<Batch>,
    dropped: u64,
}

/// The record of recent deaths the notifier drains (bounded: at most `MAX_BATCHES`
/// batches of `MAX_FINGERPRINTS` fingerprints and `EXAMPLES` ids each).
#[derive(Debug, Default)]
pub struct DeadLetters {
    settings: AlertSettings,
    record: Mutex<Record>,
}

/// The record watches the engine: every death by failure goes into it.
impl Observer for DeadLetters {
    fn observe(&self, event: &Event<'_>) {
        if let Event::Failed { outcome, at, .. } = event {
            if outcome.dead_reason.is_some() {
                self.record(&outcome.message, *at);
            }
        }
    }
}

impl DeadLetters {
    /// A record for `settings` (it records nothing when alerts are off).
    pub fn new(settings: &AlertSettings) -> Self {
        Self {
            settings: settings.clone(),
            record: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Record> {
        // Plain counters: a panic elsewhere leaves them usable.
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `m` became dead at `now`.
    fn record(&self, m: &Message, now: Timestamp) {
        let s = &self.settings;
        if !s.enabled() || !s.watched(&m.queue) || s.thresholds_of(&m.queue).dead_letters.is_none()
        {
            return;
        }
        let reason = fingerprint::of_message(m).0;
        let window = s.dead_letter_window_ms;
        let mut r = self.lock();
        let r = &mut *r;
        if let Some(o) = r.open.get(&m.queue) {
            if now >= o.from.plus_ms(window) {
                let end = o.from.plus_ms(window);
                if let Some(o) = r.open.remove(&m.queue) {
                    r.closed.push(o.close(m.queue.clone(), end));
                }
            }
        }
        if !r.open.contains_key(&m.queue) && r.open.len() + r.closed.len() >= MAX_BATCHES {
            r.dropped += 1;
            return;
        }
        let o = r.open.entry(m.queue.clone()).or_insert_with(|| Open {
            from: now,
            count: 0,
            reasons: HashMap::new(),
            examples: Vec::new(),
        });
        o.count += 1;
        let key = if o.reasons.len() < MAX_FINGERPRINTS || o.reasons.contains_key(&reason) {
            reason
        } else {
            "other".to_owned()
        };
        *o.reasons.entry(key).or_default() += 1;
        if o.examples.len() < EXAMPLES {
            o.examples.push(m.id);
        }
    }

    /// The batches whose window ended by `now` (every batch, with `all`: at a stop), and the
    /// deaths that found no room since the last drain.
    pub fn drain(&self, now: Timestamp, all: bool) -> (Vec<Batch>, u64) {
        let window = self.settings.dead_letter_window_ms;
        let mut r = self.lock();
        let mut out = std::mem::take(&mut r.closed);
        let ended: Vec<String> = r
            .open
            .iter()
            .filter(|(_, o)| all || now >= o.from.plus_ms(window))
            .map(|(q, _)| q.clone())
            .collect();
        for q in ended {
            if let Some(o) = r.open.remove(&q) {
                let to = o.from.plus_ms(window).min(now.max(o.from));
                out.push(o.close(q, to));
            }
        }
        (out, std::mem::take(&mut r.dropped))
    }
}

/// One alert, before a template shapes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Alert {
    /// What it is about.
    pub kind: Kind,
    /// Firing or resolved (dead-letter alerts are always firing).
    pub status: Status,
    /// The queue.
    pub queue: String,
    /// Deaths in the window, ready + scheduled, or the oldest ready age in ms.
    pub value: u64,
    /// The threshold, in the value's unit.
    pub threshold: u64,
    /// Dead letters: the window (first death, end).
    pub window: Option<(Timestamp, Timestamp)>,
    /// Dead letters: deaths per fingerprint, largest first (at most [`TOP_REASONS`]).
    pub top_reasons: Vec<(String, u64)>,
    /// Dead letters: a few of their ids.
    pub examples: Vec<String>,
    /// When: the window's end for dead letters, else the evaluation.
    pub at: Timestamp,
}

impl Alert {
    /// The idempotency key of this alert in `sink`.
    pub fn key(&self, sink: &str) -> String {
        let (from, to) = self.window.unwrap_or((self.at, self.at));
        format!(
            "alert:{sink}:{}:{}:{}:{}",
            self.kind.as_str(),
            self.queue,
            from.as_millis(),
            to.as_millis()
        )
    }

    /// Where an operator looks (SPEC §12's search page), after `console_url`.
    pub fn link(&self, console_url: &str) -> String {
        let state = match self.kind {
            Kind::DeadLetters => "&state=dead",
            Kind::OldestReadyAge => "&state=ready",
            Kind::Backlog => "",
        };
        format!("{console_url}/ui/messages?queue={}{state}", self.queue)
    }

    /// A duration in the text: whole seconds from 1 s on.
    fn age(ms: u64) -> String {
        format_duration_ms(if ms >= 1_000 { ms / 1_000 * 1_000 } else { ms })
    }

    /// The sentence an operator reads (every template carries it). It starts with
    /// `[redrive]`, a keyword a Feishu or DingTalk bot can require.
    pub fn text(&self, console_url: &str) -> String {
        let link = self.link(console_url);
        let q = &self.queue;
        let resolved = if self.status == Status::Resolved {
            "resolved: "
        } else {
            ""
        };
        match self.kind {
            Kind::DeadLetters => {
                let window = self
                    .window
                    .map_or(0, |(from, to)| to.millis_since(from).max(0) as u64);
                let plural = if self.value == 1 { "" } else { "s" };
                let reasons = self
                    .top_reasons
                    .iter()
                    .map(|(f, n)| format!("{f} ({n})"))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!(
                    "[redrive] {} new dead letter{plural} in {q} in the last {}; top reasons: {reasons}; e.g. {}. {link}",
                    self.value,
                    format_duration_ms(window),
                    self.examples.join(", ")
                )
            }
            Kind::Backlog => {
                let cmp = if self.status == Status::Firing {
                    "above"
                } else {
                    "at most"
                };
                format!(
                    "[redrive] {resolved}backlog of {q} is {} (ready + scheduled), {cmp} {}. {link}",
                    self.value, self.threshold
                )
            }
            Kind::OldestReadyAge => {
                let cmp = if self.status == Status::Firing {
                    "above"
                } else {
                    "at most"
                };
                format!(
                    "[redrive] {resolved}oldest ready message of {q} has waited {}, {cmp} {}. {link}",
                    Self::age(self.value),
                    Self::age(self.threshold)
                )
            }
        }
    }

    /// The body a sink with `template` sends (the message's payload).
    pub fn render(&self, template: Template, console_url: &str) -> Value {
        let text = template.escape(&self.text(console_url));
        match template {
            Template::Feishu => json!({"msg_type": "text", "content": {"text": text}}),
            Template::Dingtalk => json!({"msgtype": "text", "text": {"content": text}}),
            Template::Slack => json!({"text": text}),
            Template::Json => {
                let number = |v: u64| match self.kind {
                    Kind::OldestReadyAge => json!(v as f64 / 1000.0),
                    _ => json!(v),
                };
                let mut body = json!({
                    "kind": self.kind.as_str(),
                    "status": self.status.as_str(),
                    "queue": self.queue,
                    "value": number(self.value),
                    "threshold": number(self.threshold),
                    "top_reasons": self.top_reasons.iter()
                        .map(|(f, n)| json!({"fingerprint": f, "count": n}))
                        .collect::<Vec<_>>(),
                    "examples": self.examples,
                    "link": self.link(console_url),
                    "text": text,
                    "at": self.at.to_rfc3339(),
                });
                if let Some((from, to)) = self.window {
                    body["count"] = json!(self.value);
                    body["window"] = json!(format_duration_ms(to.millis_since(from).max(0) as u64));
                }
                body
            }
        }
    }
}

/// What the notifier decides: alerts from drained batches and from queue counts. Pure
/// (time comes in as `now`), so its tests drive a clock instead of waiting.
#[derive(Debug)]
pub struct Notifier {
    settings: AlertSettings,
    /// Level alerts firing now, and when each was last sent.
    firing: BTreeMap<(Kind, String), Timestamp>,
}

impl Notifier {
    /// A notifier with nothing firing.
    pub fn new(settings: AlertSettings) -> Self {
        Self {
            settings,
            firing: BTreeMap::new(),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &AlertSettings {
        &self.settings
    }

    /// One alert per batch that reaches its queue's `dead_letters` threshold.
    pub fn dead_letters(&self, batches: Vec<Batch>) -> Vec<Alert> {
        batches
            .into_iter()
            .filter_map(|b| {
                let threshold = self.settings.thresholds_of(&b.queue).dead_letters?;
                (b.count >= threshold).then(|| Alert {
                    kind: Kind::DeadLetters,
                    status: Status::Firing,
                    value: b.count,
                    threshold,
                    window: Some((b.from, b.to)),
                    top_reasons: b.reasons.into_iter().take(TOP_REASONS).collect(),
                    examples: b.examples.iter().map(MessageId::to_string).collect(),
                    at: b.to,
                    queue: b.queue,
                })
            })
            .collect()
    }

    /// Level alerts for the queue counts `stats` read at `now`: each threshold crossed
    /// fires, fires again after `repeat` while it stays crossed, and resolves once it is not.
    pub fn levels(&mut self, stats: &[QueueStats], now: Timestamp) -> Vec<Alert> {
        let s = &self.settings;
        let mut values: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for st in stats.iter().filter(|st| s.watched(&st.queue)) {
            let age = st
                .oldest_ready_due
                .map_or(0, |d| now.millis_since(d).max(0) as u64);
            let backlog =
                st.count(redrive_core::State::Ready) + st.count(redrive_core::State::Scheduled);
            values.insert(st.queue.clone(), (age, backlog));
        }
        // Queues that fire but have no messages any more (absent from the stats) resolve.
        let queues: BTreeSet<String> = values
            .keys()
            .cloned()
            .chain(self.firing.keys().map(|(_, q)| q.clone()))
            .collect();
        let mut out = Vec::new();
        for q in queues {
            let t = s.thresholds_of(&q);
            let (age, backlog) = values.get(&q).copied().unwrap_or((0, 0));
            for (kind, limit, value) in [
                (Kind::OldestReadyAge, t.oldest_ready_age_ms, age),
                (Kind::Backlog, t.backlog, backlog),
            ] {
                let Some(limit) = limit else { continue };
                let key = (kind, q.clone());
                let status = match (self.firing.get(&key), value > limit) {
                    (None, true) => Status::Firing,
                    (Some(last), true) if now.millis_since(*last) >= s.repeat_ms as i64 => {
                        Status::Firing
                    }
                    (Some(_), false) => Status::Resolved,
                    _ => continue,
                };
                match status {
                    Status::Firing => self.firing.insert(key, now),
                    Status::Resolved => self.firing.remove(&key),
                };
                out.push(Alert {
                    kind,
                    status,
                    queue: q.clone(),
                    value,
                    threshold: limit,
                    window: None,
                    top_reasons: Vec::new(),
                    examples: Vec::new(),
                    at: now,
                });
            }
        }
        out
    }
}

/// An alert rendered for one sink, waiting to be published.
#[derive(Debug)]
struct Outgoing {
    sink: String,
    kind: Kind,
    message: NewMessage,
}

/// Start the notifier when there is a sink to send to.
pub(super) fn services(engine: &Engine) -> Vec<Service> {
    if !engine.config().alerts.enabled() {
        return Vec::new();
    }
    // Every node sends alerts of the deaths it saw; the leader alone evaluates levels.
    vec![Service::new("alerts", Placement::EveryNode, run)]
}

/// Evaluate every `interval` until `stop`; then send the open batches.
async fn run(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let mut notifier = Notifier::new(engine.config().alerts.clone());
    let clock = engine.clock().clone();
    let mut outbox = Vec::new();
    tracing::info!(
        sinks = notifier.settings().sinks.len(),
        "alert notifier started"
    );
    loop {
        if *stop.borrow() {
            break;
        }
        let next = clock.now().plus_ms(notifier.settings().interval_ms);
        tokio::select! {
            _ = clock.sleep_until(next) => {}
            _ = stop.changed() => break,
        }
        round(&engine, &mut notifier, &mut outbox, false).await;
    }
    round(&engine, &mut notifier, &mut outbox, true).await;
}

/// One evaluation: drain the record, read the counts, publish what is due.
async fn round(
    engine: &Engine,
    notifier: &mut Notifier,
    outbox: &mut Vec<Outgoing>,
    stopping: bool,
) {
    let now = engine.clock().now();
    let (batches, dropped) = engine.dead_letters().drain(now, stopping);
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "alerts: deaths in more than {MAX_BATCHES} queues at once; these are not in any alert (they are dead and findable)"
        );
    }
    let mut alerts = notifier.dead_letters(batches);
    // Levels are the cluster's (counts from the store): the leader alone evaluates them.
    // Deaths are this node's own record, sent by the node that saw them.
    if !stopping && notifier.settings().has_levels() && engine.membership().leads() {
        match engine.store().queue_stats().await {
            Ok(stats) => alerts.extend(notifier.levels(&stats, now)),
            Err(e) => {
                tracing::warn!(error = %e, "alerts: cannot read queue counts; thresholds not evaluated this time")
            }
        }
    }
    let s = notifier.settings();
    for a in &alerts {
        for sink in s.sinks.iter().filter(|k| k.wants(&a.queue)) {
            let mut m = NewMessage::new(&sink.queue, a.render(sink.template, &s.console_url));
            m.idempotency_key = Some(a.key(&sink.name));
            outbox.push(Outgoing {
                sink: sink.name.clone(),
                kind: a.kind,
                message: m,
            });
        }
    }
    if outbox.len() > MAX_OUTBOX {
        let n = outbox.len() - MAX_OUTBOX;
        outbox.drain(..n);
        tracing::error!(
            dropped = n,
            "alerts: too many alerts could not be published; the oldest are dropped"
        );
    }
    let published = publish(engine, outbox).await;
    engine
        .signals()
        .send(|| Signal::AlertsChecked { published });
}

/// Publish the outbox into the sink queues (one store write); on an error keep it for the
/// next round (same idempotency keys). An alert whose key was already used with another body
/// is dropped (it would block every other alert). Returns the alerts newly published.
async fn publish(engine: &Engine, outbox: &mut Vec<Outgoing>) -> usize {
    while !outbox.is_empty() {
        let items = outbox.iter().map(|o| o.message.clone()).collect();
        match engine.publish(items).await {
            Ok(out) => {
                let mut n = 0;
                for (o, p) in outbox.iter().zip(&out) {
                    if p.replayed {
                        continue;
                    }
                    n += 1;
                    engine.observe(Event::AlertSent {
                        sink: &o.sink,
                        kind: o.kind.as_str(),
                    });
                    tracing::info!(sink = %o.sink, kind = o.kind.as_str(), message = %p.message.id,
                        queue = %o.message.queue, "alert published");
                }
                outbox.clear();
                return n;
            }
            Err(StoreError::IdempotencyConflict { index, key }) if index < outbox.len() => {
                let o = outbox.remove(index);
                tracing::error!(sink = %o.sink, key = %key,
                    "alerts: this alert's idempotency key was already used with another body; alert dropped");
            }
            Err(e) => {
                tracing::error!(error = %e, pending = outbox.len(),
                    "alerts: cannot publish into the sink queues; trying again next time");
                return 0;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Clock, ManualClock};
    use redrive_core::{DeadReason, ErrorClass, LastError, State};

    const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    fn sink(name: &str, queue: &str, template: Template) -> Sink {
        Sink {
            name: name.into(),
            queue: queue.into(),
            template,
            queues: Vec::new(),
        }
    }

    fn settings() -> AlertSettings {
        AlertSettings {
            interval_ms: 1_000,
            dead_letter_window_ms: 60_000,
            repeat_ms: 600_000,
            sinks: vec![sink("oncall", "ops-alerts", Template::Json)],
            ..AlertSettings::default()
        }
    }

    fn id(n: u128) -> MessageId {
        format!("0190b5c2-7d1e-7c3a-9f00-{n:012x}").parse().unwrap()
    }

    fn dead(queue: &str, n: u128, error: Option<&str>) -> Message {
        let at = Timestamp::from_millis(T0);
        Message {
            id: id(n),
            queue: queue.into(),
            state: State::Dead,
            payload: json!({}),
            headers: BTreeMap::new(),
            key: None,
            idempotency_key: None,
            priority: 0,
            attempts: 1,
            due_at: None,
            lease_expires_at: None,
            created_at: at,
            updated_at: at,
            finished_at: Some(at),
            dead_reason: Some(DeadReason::MaxAttempts),
            last_error: error.map(|e| LastError {
                class: ErrorClass::Transient,
                message: Some(e.into()),
                code: None,
                at,
            }),
            history: Vec::new(),
            target_url: None,
        }
    }

    fn stats(queue: &str, ready: u64, scheduled: u64, oldest_ready_due: Option<i64>) -> QueueStats {
        QueueStats {
            queue: queue.into(),
            counts: [scheduled, ready, 0, 0, 0],
            oldest_ready_due: oldest_ready_due.map(Timestamp::from_millis),
        }
    }

    fn alert() -> Alert {
        Alert {
            kind: Kind::DeadLetters,
            status: Status::Firing,
            queue: "orders".into(),
            value: 37,
            threshold: 1,
            window: Some((
                Timestamp::from_millis(T0),
                Timestamp::from_millis(T0 + 300_000),
            )),
            top_reasons: vec![
                ("transient: HTTP <n> Service Unavailable".into(), 21),
                ("transient: timeout".into(), 9),
            ],
            examples: vec![id(1).to_string(), id(2).to_string()],
            at: Timestamp::from_millis(T0 + 300_000),
        }
    }

    const TEXT: &str = "[redrive] 37 new dead letters in orders in the last 5m; top reasons: \
        transient: HTTP <n> Service Unavailable (21), transient: timeout (9); \
        e.g. 0190b5c2-7d1e-7c3a-9f00-000000000001, 0190b5c2-7d1e-7c3a-9f00-000000000002. \
        https://redrive.internal/ui/messages?queue=orders&state=dead";

    #[test]
    fn each_template_is_the_vendors_body() {
        let a = alert();
        let url = "https://redrive.internal";
        assert_eq!(a.text(url), TEXT);
        assert_eq!(
            a.render(Template::Json, url),
            json!({
                "kind": "dead_letters", "status": "firing", "queue": "orders",
                "count": 37, "window": "5m", "value": 37, "threshold": 1,
                "top_reasons": [
                    {"fingerprint": "transient: HTTP <n> Service Unavailable", "count": 21},
                    {"fingerprint": "transient: timeout", "count": 9}
                ],
                "examples": ["0190b5c2-7d1e-7c3a-9f00-000000000001",
                             "0190b5c2-7d1e-7c3a-9f00-000000000002"],
                "link": "https://redrive.internal/ui/messages?queue=orders&state=dead",
                "text": TEXT,
                "at": "2026-01-01T00:05:00.000Z"
            })
        );
        let feishu = TEXT.replace("<n>", "\u{ff1c}n\u{ff1e}");
        assert_eq!(
            a.render(Template::Feishu, url),
            json!({"msg_type": "text", "content": {"text": feishu}})
        );
        assert_eq!(
            a.render(Template::Dingtalk, url),
            json!({"msgtype": "text", "text": {"content": TEXT}})
        );
        let slack = TEXT
            .replace("<n>", "&lt;n&gt;")
            .replace("&state", "&amp;state");
        assert_eq!(a.render(Template::Slack, url), json!({"text": slack}));
        assert_eq!(
            a.key("oncall"),
            format!("alert:oncall:dead_letters:orders:{T0}:{}", T0 + 300_000)
        );
    }

    /// An error message a consume-scope caller (or a RabbitMQ consumer, through the bridge)
    /// wrote, carrying each chat's markup: mentions of everyone, a channel ping, and a link
    /// whose label hides where it goes.
    const HOSTILE: &str = "<!channel> <!here> <@UABCDEFGH> <https://evil.example/login|open the redrive console> \
        <at user_id=\"all\">all</at> [open the redrive console](https://evil.example/login) &lt;!channel&gt;";

    /// The chat text of an alert whose top reason is [`HOSTILE`], through the whole path:
    /// a dead letter recorded, its batch drained, the alert rendered.
    fn hostile_text(template: Template) -> String {
        let clock = ManualClock::new(Timestamp::from_millis(T0));
        let s = settings();
        let record = DeadLetters::new(&s);
        record.record(&dead("orders", 1, Some(HOSTILE)), clock.now());
        clock.advance(60_000);
        let alerts = Notifier::new(s).dead_letters(record.drain(clock.now(), false).0);
        let body = alerts[0].render(template, "https://redrive.internal");
        let text = match template {
            Template::Feishu => &body["content"]["text"],
            Template::Dingtalk => &body["text"]["content"],
            Template::Slack | Template::Json => &body["text"],
        };
        text.as_str().unwrap().to_owned()
    }

    #[test]
    fn slack_alerts_cannot_ping_a_channel_mention_anyone_or_disguise_a_link() {
        let text = hostile_text(Template::Slack);
        // Slack reads markup only inside < >, and & starts its escapes: none is left raw,
        // so every < > in what Slack shows came from the message as text.
        assert!(!text.contains('<') && !text.contains('>'), "{text}");
        assert!(
            !text
                .replace("&amp;", "")
                .replace("&lt;", "")
                .replace("&gt;", "")
                .contains('&'),
            "{text}"
        );
        assert!(
            text.contains("&lt;!channel&gt; &lt;!here&gt; &lt;@UABCDEFGH&gt;"),
            "{text}"
        );
        assert!(
            text.contains("&lt;https://evil.example/login|open the redrive console&gt;"),
            "{text}"
        );
        // What the message itself had escaped stays visible as it was written.
        assert!(text.contains("&amp;lt;!channel&amp;gt;"), "{text}");
        assert!(
            text.contains("/ui/messages?queue=orders&amp;state=dead"),
            "{text}"
        );
    }

    #[test]
    fn feishu_alerts_cannot_mention_everyone_or_disguise_a_link() {
        let text = hostile_text(Template::Feishu);
        assert!(!text.contains('<') && !text.contains('>'), "{text}");
        assert!(!text.contains("<at"), "{text}");
        assert!(
            text.contains("\u{ff1c}at user_id=\"all\"\u{ff1e}all\u{ff1c}/at\u{ff1e}"),
            "{text}"
        );
        assert!(!text.contains("]("), "a [label](url) link: {text}");
        assert!(
            text.contains("[open the redrive console] (https://evil.example/login)"),
            "{text}"
        );
        assert!(
            text.contains("/ui/messages?queue=orders&state=dead"),
            "{text}"
        );
    }

    #[test]
    fn dingtalk_alerts_never_carry_an_at_object_so_nothing_mentions_anyone() {
        // DingTalk's text message has no markup; a mention needs the body's `at` object
        // (`isAtAll`, `atMobiles`, `atUserIds`), which the text cannot add.
        let clock = ManualClock::new(Timestamp::from_millis(T0));
        let s = settings();
        let record = DeadLetters::new(&s);
        record.record(
            &dead(
                "orders",
                1,
                Some("@all @13800000000 \"at\": {\"isAtAll\": true}"),
            ),
            clock.now(),
        );
        clock.advance(60_000);
        let alerts = Notifier::new(s).dead_letters(record.drain(clock.now(), false).0);
        let body = alerts[0].render(Template::Dingtalk, "https://redrive.internal");
        let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["msgtype", "text"], "{body}");
        assert_eq!(body["msgtype"], "text");
        assert_eq!(body["text"].as_object().unwrap().len(), 1, "{body}");
        assert!(hostile_text(Template::Dingtalk).contains(HOSTILE.split(' ').next().unwrap()));
    }

    #[test]
    fn the_json_body_keeps_the_text_as_written() {
        // Structured: the receiver escapes for wherever it shows it.
        assert!(hostile_text(Template::Json).contains("<!channel>"));
    }

    #[test]
    fn level_alerts_render_their_unit_and_no_window() {
        let at = Timestamp::from_millis(T0);
        let age = Alert {
            kind: Kind::OldestReadyAge,
            status: Status::Firing,
            queue: "orders".into(),
            value: 750_250,
            threshold: 600_000,
            window: None,
            top_reasons: Vec::new(),
            examples: Vec::new(),
            at,
        };
        let text = "[redrive] oldest ready message of orders has waited 12m 30s, above 10m. \
                    /ui/messages?queue=orders&state=ready";
        assert_eq!(
            age.render(Template::Json, ""),
            json!({
                "kind": "oldest_ready_age", "status": "firing", "queue": "orders",
                "value": 750.25, "threshold": 600.0, "top_reasons": [], "examples": [],
                "link": "/ui/messages?queue=orders&state=ready", "text": text,
                "at": "2026-01-01T00:00:00.000Z"
            })
        );
        let backlog = Alert {
            kind: Kind::Backlog,
            status: Status::Resolved,
            value: 40,
            threshold: 10_000,
            ..age
        };
        assert_eq!(
            backlog.render(Template::Slack, ""),
            json!({"text": "[redrive] resolved: backlog of orders is 40 (ready + scheduled), \
                            at most 10000. /ui/messages?queue=orders"})
        );
        assert_eq!(
            backlog.key("s"),
            format!("alert:s:backlog:orders:{T0}:{T0}")
        );
    }

    #[test]
    fn deaths_are_batched_per_queue_per_window_and_grouped_by_fingerprint() {
        let clock = ManualClock::new(Timestamp::from_millis(T0));
        let s = settings();
        let record = DeadLetters::new(&s);
        let notifier = Notifier::new(s);
        for n in 0..21 {
            record.record(
                &dead("orders", n, Some(&format!("HTTP 503 req {n}"))),
                clock.now(),
            );
            clock.advance(1_000);
        }
        for n in 21..30 {
            record.record(&dead("orders", n, Some("timeout")), clock.now());
        }
        record.record(&dead("orders", 30, Some("disk full")), clock.now());
        record.record(&dead("billing", 31, None), clock.now());
        record.record(&dead("ops-alerts", 32, Some("own alert died")), clock.now());
        // The window is open: nothing yet.
        assert_eq!(record.drain(clock.now(), false).0, Vec::new());
        clock.set(Timestamp::from_millis(T0 + 59_999));
        assert_eq!(record.drain(clock.now(), false).0, Vec::new());
        clock.advance(1);
        let (batches, dropped) = record.drain(clock.now(), false);
        assert_eq!(dropped, 0);
        assert_eq!(batches.len(), 1, "{batches:?}");
        let alerts = notifier.dead_letters(batches);
        assert_eq!(alerts.len(), 1);
        let a = &alerts[0];
        assert_eq!((a.queue.as_str(), a.value), ("orders", 31));
        assert_eq!(
            a.window,
            Some((
                Timestamp::from_millis(T0),
                Timestamp::from_millis(T0 + 60_000)
            ))
        );
        assert_eq!(
            a.top_reasons,
            [
                // The status stays in the fingerprint (issue 15), the request number does not.
                ("transient: HTTP 503 req <n>".to_owned(), 21),
                ("transient: timeout".to_owned(), 9),
                ("transient: disk full".to_owned(), 1)
            ]
        );
        assert_eq!(a.examples, [id(0), id(1), id(2)].map(|i| i.to_string()));
        // billing's window opened 21 s later: it closes 21 s later, on its own.
        clock.advance(20_999);
        assert_eq!(record.drain(clock.now(), false).0, Vec::new());
        clock.advance(1);
        let alerts = notifier.dead_letters(record.drain(clock.now(), false).0);
        assert_eq!(alerts.len(), 1);
        assert_eq!((alerts[0].queue.as_str(), alerts[0].value), ("billing", 1));
        assert_eq!(alerts[0].top_reasons, [("max_attempts".to_owned(), 1)]);
        // Drained means gone; the sink queue's own death was never recorded.
        clock.advance(600_000);
        assert_eq!(record.drain(clock.now(), true).0, Vec::new());
    }

    #[test]
    fn a_death_after_the_window_opens_the_next_batch_and_a_stop_sends_open_ones() {
        let clock = ManualClock::new(Timestamp::from_millis(T0));
        let record = DeadLetters::new(&settings());
        record.record(&dead("orders", 1, Some("x")), clock.now());
        clock.advance(60_000); // the window ended, not drained yet
        record.record(&dead("orders", 2, Some("y")), clock.now());
        clock.advance(5_000);
        let (batches, _) = record.drain(clock.now(), false);
        assert_eq!(batches.len(), 1);
        assert_eq!(
            (batches[0].count, batches[0].examples.clone()),
            (1, vec![id(1)])
        );
        assert_eq!(batches[0].to, Timestamp::from_millis(T0 + 60_000));
        // Stopping: the open batch goes now, its window cut at the stop.
        let (batches, _) = record.drain(clock.now(), true);
        assert_eq!(batches.len(), 1);
        assert_eq!(
            (batches[0].count, batches[0].examples.clone()),
            (1, vec![id(2)])
        );
        assert_eq!(
            (batches[0].from, batches[0].to),
            (
                Timestamp::from_millis(T0 + 60_000),
                Timestamp::from_millis(T0 + 65_000)
            )
        );
    }

    #[test]
    fn thresholds_sinks_and_their_queue_filters_decide_what_is_recorded() {
        let mut s = settings();
        s.default_thresholds.dead_letters = Some(3);
        s.thresholds.insert(
            "quiet".into(),
            Thresholds {
                dead_letters: None,
                ..Thresholds::default()
            },
        );
        s.sinks[0].queues = vec!["orders".into(), "quiet".into()];
        let record = DeadLetters::new(&s);
        let notifier = Notifier::new(s);
        let now = Timestamp::from_millis(T0);
        for n in 0..2 {
            record.record(&dead("orders", n, Some("x")), now);
            record.record(&dead("quiet", 10 + n, Some("x")), now);
            record.record(&dead("unwatched", 20 + n, Some("x")), now);
        }
        let (batches, _) = record.drain(now.plus_ms(60_000), false);
        assert_eq!(batches.len(), 1, "only orders is recorded: {batches:?}");
        assert!(notifier.dead_letters(batches).is_empty(), "2 < 3");
        for n in 0..3 {
            record.record(&dead("orders", n, Some("x")), now);
        }
        let (batches, _) = record.drain(now.plus_ms(60_000), false);
        assert_eq!(notifier.dead_letters(batches).len(), 1, "3 ≥ 3");
        // Alerts off (no sink): nothing is recorded at all.
        let off = DeadLetters::new(&AlertSettings::default());
        off.record(&dead("orders", 1, None), now);
        assert!(off.drain(now.plus_ms(600_000), true).0.is_empty());
    }

    #[test]
    fn the_record_is_bounded() {
        let record = DeadLetters::new(&settings());
        let now = Timestamp::from_millis(T0);
        for n in 0..(MAX_BATCHES as u128 + 5) {
            record.record(&dead(&format!("q{n}"), n, Some("x")), now);
        }
        for n in 0..(MAX_FINGERPRINTS as u128 + 7) {
            record.record(
                &dead("q0", n, Some(&format!("error {}", "x".repeat(n as usize)))),
                now,
            );
        }
        let (batches, dropped) = record.drain(now, true);
        assert_eq!((batches.len(), dropped), (MAX_BATCHES, 5));
        let q0 = batches.iter().find(|b| b.queue == "q0").unwrap();
        assert_eq!(q0.count, MAX_FINGERPRINTS as u64 + 8);
        assert_eq!(q0.reasons.len(), MAX_FINGERPRINTS + 1);
        // q0 had 1 fingerprint; of the 107 new ones, 99 fit and 8 are counted as `other`.
        assert_eq!(q0.reasons[0], ("other".to_owned(), 8));
        assert_eq!(q0.examples.len(), EXAMPLES);
    }

    #[test]
    fn a_level_fires_repeats_after_repeat_and_resolves() {
        let clock = ManualClock::new(Timestamp::from_millis(T0));
        let mut s = settings();
        s.default_thresholds.backlog = Some(100);
        s.thresholds.insert(
            "orders".into(),
            Thresholds {
                oldest_ready_age_ms: Some(600_000),
                backlog: Some(10),
                dead_letters: Some(1),
            },
        );
        let mut n = Notifier::new(s);
        let brief = |alerts: Vec<Alert>| -> Vec<(Kind, Status, String, u64)> {
            alerts
                .into_iter()
                .map(|a| (a.kind, a.status, a.queue, a.value))
                .collect()
        };
        use Kind::*;
        use Status::*;
        // Under every threshold: nothing.
        let t = clock.now().as_millis();
        assert!(n
            .levels(
                &[stats("orders", 5, 5, Some(t)), stats("other", 100, 0, None)],
                clock.now()
            )
            .is_empty());
        // orders' backlog passes 10: it fires, once.
        clock.advance(1_000);
        assert_eq!(
            brief(n.levels(&[stats("orders", 6, 5, Some(t))], clock.now())),
            [(Backlog, Firing, "orders".into(), 11)]
        );
        clock.advance(1_000);
        assert!(n
            .levels(&[stats("orders", 6, 5, Some(t))], clock.now())
            .is_empty());
        // Still above after `repeat`: sent again (and the age passed 10 m meanwhile).
        clock.set(Timestamp::from_millis(t + 601_000));
        assert_eq!(
            brief(n.levels(&[stats("orders", 6, 5, Some(t))], clock.now())),
            [
                (OldestReadyAge, Firing, "orders".into(), 601_000),
                (Backlog, Firing, "orders".into(), 11)
            ]
        );
        clock.advance(1_000);
        assert!(n
            .levels(&[stats("orders", 6, 5, Some(t))], clock.now())
            .is_empty());
        // The queue empties (absent from the counts): both resolve, once.
        clock.advance(1_000);
        assert_eq!(
            brief(n.levels(&[], clock.now())),
            [
                (OldestReadyAge, Resolved, "orders".into(), 0),
                (Backlog, Resolved, "orders".into(), 0)
            ]
        );
        clock.advance(1_000);
        assert!(n.levels(&[], clock.now()).is_empty());
        // `other` falls under the default threshold (100): 101 fires.
        assert_eq!(
            brief(n.levels(&[stats("other", 101, 0, None)], clock.now())),
            [(Backlog, Firing, "other".into(), 101)]
        );
    }

    #[tokio::test]
    async fn a_key_reused_with_another_body_drops_that_alert_only_and_a_replay_is_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let store = redrive_store_sqlite::SqliteStore::open(
            redrive_store_sqlite::SqliteOptions::new(dir.path()),
        )
        .unwrap();
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
        let engine = Engine::new(
            Arc::new(store),
            crate::engine::EngineConfig::default(),
            crate::engine::Observers::none(),
            clock,
        )
        .unwrap();
        let out = |key: &str, body: Value| {
            let mut message = NewMessage::new("ops-alerts", body);
            message.idempotency_key = Some(key.to_owned());
            Outgoing {
                sink: "oncall".into(),
                kind: Kind::Backlog,
                message,
            }
        };
        let mut outbox = vec![
            out("k1", json!({"text": "a"})),
            out("k1", json!({"text": "b"})),
            out("k2", json!({"text": "c"})),
        ];
        assert_eq!(publish(&engine, &mut outbox).await, 2);
        assert!(outbox.is_empty());
        // Published again (a retry): replays, nothing new.
        let mut outbox = vec![
            out("k1", json!({"text": "a"})),
            out("k2", json!({"text": "c"})),
        ];
        assert_eq!(publish(&engine, &mut outbox).await, 0);
        let stats = engine.store().queue_stats().await.unwrap();
        assert_eq!(stats[0].count(State::Ready), 2);
        engine.store().close().await;
    }

    #[test]
    fn sink_queues_never_alert_about_themselves() {
        let mut s = settings();
        s.default_thresholds.backlog = Some(0);
        s.default_thresholds.oldest_ready_age_ms = Some(0);
        let mut n = Notifier::new(s);
        let now = Timestamp::from_millis(T0);
        let huge = stats("ops-alerts", 1_000_000, 5, Some(T0 - 86_400_000));
        assert!(n.levels(&[huge], now).is_empty());
    }
}
