//! Prometheus metrics (SPEC §8). Labels stay low-cardinality: queue, state,
//! outcome, error class, reason — never a message id. The console's per-minute charts
//! are fed from the same hooks ([`series`]).

pub mod series;

use crate::engine::bridge::BridgeGauges;
use crate::engine::push::EndpointGauges;
use crate::engine::{Event, Observer};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use redrive_core::State;
use redrive_storage::{FailureOutcome, MetricKind, QueueStats, StoreMetric};
use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    queue: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    queue: String,
    error_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    queue: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    queue: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    queue: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointResultLabels {
    endpoint: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointReasonLabels {
    endpoint: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointStateLabels {
    endpoint: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SinkKindLabels {
    sink: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BridgeLabel {
    bridge: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    queue: String,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BridgeEventLabels {
    bridge: String,
    event: &'static str,
}

/// The metrics watch the engine: each of its events is counted here.
impl Observer for Metrics {
    fn observe(&self, event: &Event<'_>) {
        match *event {
            Event::Published { queue, n } => self.published(queue, n),
            Event::Leased { queue, lateness_ms } => self.leased(queue, lateness_ms),
            Event::Acked { message, event } => self.acked(&message.queue, message.attempts, event),
            Event::Released { queue } => self.released(queue),
            Event::Failed {
                outcome, delivery, ..
            } => self.failed(outcome, delivery),
            Event::Killed { queue } => self.dead(queue, "killed"),
            Event::Purged { queue, n } => self.purged(queue, n),
            Event::PushAttempt {
                endpoint,
                result,
                latency_ms,
            } => self.push_attempt(endpoint, result, latency_ms),
            Event::PushParked { endpoint, reason } => self.push_parked(endpoint, reason),
            Event::ConsumeStoreFault { queue, operation } => {
                self.consume_store_fault(queue, operation)
            }
            Event::AlertSent { sink, kind } => self.alert_sent(sink, kind),
        }
    }
}

/// Every metric redrive exports.
pub struct Metrics {
    registry: Registry,
    published: Family<QueueLabel, Counter>,
    deliveries: Family<OutcomeLabels, Counter>,
    retries: Family<ClassLabels, Counter>,
    retry_delay: Family<QueueLabel, Histogram>,
    dead_letters: Family<ReasonLabels, Counter>,
    finished: Family<ResultLabels, Counter>,
    queue_messages: Family<StateLabels, Gauge>,
    oldest_ready_age: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    lateness: Histogram,
    commit_batch: Histogram,
    commit_seconds: Histogram,
    commits: Counter,
    commit_changes: Counter,
    done_purged: Family<QueueLabel, Counter>,
    push_attempts: Family<EndpointResultLabels, Counter>,
    push_latency: Family<EndpointLabel, Histogram>,
    push_parked: Family<EndpointReasonLabels, Counter>,
    endpoint_state: Family<EndpointStateLabels, Gauge>,
    endpoint_in_flight: Family<EndpointLabel, Gauge>,
    endpoint_pace: Family<EndpointLabel, Gauge<f64, AtomicU64>>,
    endpoint_parked: Family<EndpointLabel, Gauge>,
    endpoint_opened: Family<EndpointLabel, Gauge>,
    bridge_connected: Family<BridgeLabel, Gauge>,
    bridge_events: Family<BridgeEventLabels, Gauge>,
    alerts_sent: Family<SinkKindLabels, Counter>,
    consume_store_faults: Family<OperationLabels, Counter>,
    /// Per-minute counts for the console's charts (in memory, since start-up).
    series: series::Series,
    /// When these metrics were made (the process started), ms since the epoch.
    started_at_ms: i64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Bucket bounds of delay-like histograms, seconds: 1 ms … 1 day.
const DELAY_BUCKETS: [f64; 16] = [
    0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0,
    21600.0, 86400.0,
];
/// Bucket bounds of lateness, seconds: 0.5 ms … 10 s (the scheduler aims at milliseconds).
const LATENESS_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Bucket bounds of commit duration, seconds.
const COMMIT_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
];
/// Bucket bounds of push attempt latency, seconds: 1 ms … 60 s.
const PUSH_LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];
/// Bucket bounds of transitions per commit.
const BATCH_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

impl Metrics {
    /// Register every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let published = Family::<QueueLabel, Counter>::default();
        registry.register(
            "redrive_messages_published",
            "Messages published (idempotent replays excluded)",
            published.clone(),
        );
        let deliveries = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "redrive_deliveries",
            "Deliveries by outcome: leased, acked, nacked, released (a consumer handed it back), returned, lease_expired",
            deliveries.clone(),
        );
        let retries = Family::<ClassLabels, Counter>::default();
        registry.register(
            "redrive_retries",
            "Retries scheduled, by the failure's class",
            retries.clone(),
        );
        let retry_delay =
            Family::<QueueLabel, Histogram>::new_with_constructor(|| Histogram::new(DELAY_BUCKETS));
        registry.register(
            "redrive_retry_delay_seconds",
            "Delay chosen before a retry",
            retry_delay.clone(),
        );
        let dead_letters = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "redrive_dead_letters",
            "Messages that became dead, by reason",
            dead_letters.clone(),
        );
        let finished = Family::<ResultLabels, Counter>::default();
        registry.register(
            "redrive_messages_finished",
            "Messages finished: first_try, after_retry (acked) or dead",
            finished.clone(),
        );
        let queue_messages = Family::<StateLabels, Gauge>::default();
        registry.register(
            "redrive_queue_messages",
            "Messages per queue and state",
            queue_messages.clone(),
        );
        let oldest_ready_age = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "redrive_oldest_ready_age_seconds",
            "Age of the oldest ready message (now − its due time)",
            oldest_ready_age.clone(),
        );
        let lateness = Histogram::new(LATENESS_BUCKETS);
        registry.register(
            "redrive_delivery_lateness_seconds",
            "Lease time minus due time of each delivery",
            lateness.clone(),
        );
        let commit_batch = Histogram::new(BATCH_BUCKETS);
        registry.register(
            "redrive_commit_batch_size",
            "Message transitions per storage commit",
            commit_batch.clone(),
        );
        let commit_seconds = Histogram::new(COMMIT_BUCKETS);
        registry.register(
            "redrive_commit_seconds",
            "Duration of one storage commit (fsync included)",
            commit_seconds.clone(),
        );
        let commits = Counter::default();
        registry.register(
            "redrive_commits",
            "Storage commits (one fsync each in durable mode)",
            commits.clone(),
        );
        let commit_changes = Counter::default();
        registry.register(
            "redrive_commit_changes",
            "Message transitions committed (published, promoted, leased, acked, nacked …)",
            commit_changes.clone(),
        );
        let done_purged = Family::<QueueLabel, Counter>::default();
        registry.register(
            "redrive_done_purged",
            "Done messages deleted after done_retention",
            done_purged.clone(),
        );
        let push_attempts = Family::<EndpointResultLabels, Counter>::default();
        registry.register(
            "redrive_push_attempts",
            "Push attempts by endpoint and result: delivered, transient, rate_limited, permanent, gone, refused (SSRF guard)",
            push_attempts.clone(),
        );
        let push_latency = Family::<EndpointLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(PUSH_LATENCY_BUCKETS)
        });
        registry.register(
            "redrive_push_latency_seconds",
            "Push attempt latency, from sending to the end of the answer",
            push_latency.clone(),
        );
        let push_parked = Family::<EndpointReasonLabels, Counter>::default();
        registry.register(
            "redrive_push_parked",
            "Due push messages handed back unattempted and uncharged, by reason: breaker, budget, rate, concurrency",
            push_parked.clone(),
        );
        let endpoint_state = Family::<EndpointStateLabels, Gauge>::default();
        registry.register(
            "redrive_endpoint_state",
            "1 for the breaker state an endpoint is in (closed, open, half_open, recovering), 0 for the others",
            endpoint_state.clone(),
        );
        let endpoint_in_flight = Family::<EndpointLabel, Gauge>::default();
        registry.register(
            "redrive_endpoint_in_flight",
            "Push calls in flight per endpoint",
            endpoint_in_flight.clone(),
        );
        let endpoint_pace = Family::<EndpointLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "redrive_endpoint_pace_per_second",
            "Release pace per endpoint after a breaker opened (additive increase, multiplicative decrease); 0 when unpaced",
            endpoint_pace.clone(),
        );
        let endpoint_parked = Family::<EndpointLabel, Gauge>::default();
        registry.register(
            "redrive_endpoint_parked_messages",
            "Messages parked per endpoint: handed back unattempted, waiting to be due again",
            endpoint_parked.clone(),
        );
        let endpoint_opened = Family::<EndpointLabel, Gauge>::default();
        registry.register(
            "redrive_endpoint_breaker_opened",
            "Times an endpoint's breaker opened since start",
            endpoint_opened.clone(),
        );
        let bridge_connected = Family::<BridgeLabel, Gauge>::default();
        registry.register(
            "redrive_bridge_connected",
            "1 while a bridge is connected to its broker, 0 while it (re)connects",
            bridge_connected.clone(),
        );
        let bridge_events = Family::<BridgeEventLabels, Gauge>::default();
        registry.register(
            "redrive_bridge_events",
            "Bridge events since start, by kind: intake, duplicates, returned, republished, republish_refused, dead, connects",
            bridge_events.clone(),
        );
        let alerts_sent = Family::<SinkKindLabels, Counter>::default();
        registry.register(
            "redrive_alerts_sent",
            "Alerts published into a sink's push queue, by sink and kind: dead_letters, oldest_ready_age, backlog",
            alerts_sent.clone(),
        );
        let consume_store_faults = Family::<OperationLabels, Counter>::default();
        registry.register(
            "redrive_consume_store_faults",
            "Store errors met by the server's own consumers (push, bridges) while leasing or settling, by queue and operation: lease, ack, nack, release. Each is backed off and survived; a message whose settlement was lost is delivered again after its lease",
            consume_store_faults.clone(),
        );
        Self {
            registry,
            published,
            deliveries,
            retries,
            retry_delay,
            dead_letters,
            finished,
            queue_messages,
            oldest_ready_age,
            lateness,
            commit_batch,
            commit_seconds,
            commits,
            commit_changes,
            done_purged,
            push_attempts,
            push_latency,
            push_parked,
            endpoint_state,
            endpoint_in_flight,
            endpoint_pace,
            endpoint_parked,
            endpoint_opened,
            bridge_connected,
            bridge_events,
            alerts_sent,
            consume_store_faults,
            series: series::Series::new(),
            started_at_ms: now_ms(),
        }
    }

    /// An alert of `kind` was published into `sink`'s queue.
    pub fn alert_sent(&self, sink: &str, kind: &'static str) {
        self.alerts_sent
            .get_or_create(&SinkKindLabels {
                sink: sink.to_owned(),
                kind,
            })
            .inc();
    }

    /// Refresh the bridge gauges (at scrape time).
    pub fn set_bridges(&self, bridges: &[BridgeGauges]) {
        for BridgeGauges {
            bridge,
            connected,
            events,
        } in bridges
        {
            self.bridge_connected
                .get_or_create(&BridgeLabel {
                    bridge: bridge.clone(),
                })
                .set(i64::from(*connected));
            for (event, n) in events {
                self.bridge_events
                    .get_or_create(&BridgeEventLabels {
                        bridge: bridge.clone(),
                        event,
                    })
                    .set((*n).min(i64::MAX as u64) as i64);
            }
        }
    }

    /// A push attempt to `endpoint` ended with `result` (`delivered`, `transient`,
    /// `rate_limited`, `permanent`, `gone`, `refused`) after `latency_ms`.
    pub fn push_attempt(&self, endpoint: &str, result: &'static str, latency_ms: u64) {
        self.push_attempts
            .get_or_create(&EndpointResultLabels {
                endpoint: endpoint.to_owned(),
                result,
            })
            .inc();
        if result != "refused" {
            self.push_latency
                .get_or_create(&EndpointLabel {
                    endpoint: endpoint.to_owned(),
                })
                .observe(latency_ms as f64 / 1000.0);
        }
    }

    /// One of the server's own consumers met a store error during `operation` on `queue`.
    pub fn consume_store_fault(&self, queue: &str, operation: &'static str) {
        self.consume_store_faults
            .get_or_create(&OperationLabels {
                queue: queue.to_owned(),
                operation,
            })
            .inc();
    }

    /// A message due for `endpoint` was parked (handed back unattempted) because of `reason`.
    pub fn push_parked(&self, endpoint: &str, reason: &'static str) {
        self.push_parked
            .get_or_create(&EndpointReasonLabels {
                endpoint: endpoint.to_owned(),
                reason,
            })
            .inc();
    }

    /// Refresh the endpoint gauges (at scrape time).
    pub fn set_endpoints(&self, endpoints: &[EndpointGauges]) {
        for e in endpoints {
            let label = EndpointLabel {
                endpoint: e.endpoint.clone(),
            };
            for st in e.states {
                self.endpoint_state
                    .get_or_create(&EndpointStateLabels {
                        endpoint: e.endpoint.clone(),
                        state: st,
                    })
                    .set(i64::from(*st == e.state));
            }
            self.endpoint_in_flight
                .get_or_create(&label)
                .set(i64::from(e.in_flight));
            self.endpoint_pace
                .get_or_create(&label)
                .set(e.pace_per_s.unwrap_or(0.0));
            self.endpoint_parked
                .get_or_create(&label)
                .set(e.parked.min(i64::MAX as u64) as i64);
            self.endpoint_opened
                .get_or_create(&label)
                .set(e.opened_total.min(i64::MAX as u64) as i64);
        }
    }

    fn q(queue: &str) -> QueueLabel {
        QueueLabel {
            queue: queue.to_owned(),
        }
    }

    /// A storage commit of `n` transitions took `secs`.
    pub fn observe_commit(&self, n: usize, secs: f64) {
        self.commit_batch.observe(n as f64);
        self.commit_seconds.observe(secs);
        self.commits.inc();
        self.commit_changes.inc_by(n as u64);
    }

    /// The console's per-minute series.
    pub fn series(&self) -> &series::Series {
        &self.series
    }

    /// When the series began (process start), ms since the epoch.
    pub fn started_at_ms(&self) -> i64 {
        self.started_at_ms
    }

    fn chart(&self, queue: &str, kind: series::Kind, n: u64) {
        self.series.add(queue, kind, n, series::minute_of(now_ms()));
    }

    /// `n` messages were published to `queue`.
    pub fn published(&self, queue: &str, n: u64) {
        self.published.get_or_create(&Self::q(queue)).inc_by(n);
        self.chart(queue, series::Kind::Published, n);
    }

    /// A message was leased `lateness_ms` after it was due.
    pub fn leased(&self, queue: &str, lateness_ms: i64) {
        self.deliveries
            .get_or_create(&OutcomeLabels {
                queue: queue.to_owned(),
                outcome: "leased",
            })
            .inc();
        self.lateness.observe(lateness_ms.max(0) as f64 / 1000.0);
    }

    /// A delivery was acked on its `attempts`-th attempt (outcome `acked`), or a bridge's
    /// broker took its republish (outcome `republished`); either makes the message done.
    pub fn acked(&self, queue: &str, attempts: u32, event: redrive_storage::AckEvent) {
        self.deliveries
            .get_or_create(&OutcomeLabels {
                queue: queue.to_owned(),
                outcome: event.as_str(),
            })
            .inc();
        self.chart(queue, series::Kind::Done, 1);
        let result = if attempts <= 1 {
            "first_try"
        } else {
            "after_retry"
        };
        self.finished
            .get_or_create(&ResultLabels {
                queue: queue.to_owned(),
                result,
            })
            .inc();
    }

    /// A consumer handed a lease of `queue` back uncharged (a release past its bound is a
    /// failed attempt: [`Metrics::failed`] with outcome `released`).
    pub fn released(&self, queue: &str) {
        self.deliveries
            .get_or_create(&OutcomeLabels {
                queue: queue.to_owned(),
                outcome: "released",
            })
            .inc();
    }

    /// A failed attempt (nack, expired lease, or a failure reported at publish) and its outcome.
    pub fn failed(&self, outcome: &FailureOutcome, delivery_outcome: Option<&'static str>) {
        let queue = &outcome.message.queue;
        if let Some(o) = delivery_outcome {
            self.deliveries
                .get_or_create(&OutcomeLabels {
                    queue: queue.clone(),
                    outcome: o,
                })
                .inc();
        }
        if let Some(delay) = outcome.retry_delay_ms {
            self.retries
                .get_or_create(&ClassLabels {
                    queue: queue.clone(),
                    error_class: outcome.class.as_str(),
                })
                .inc();
            self.retry_delay
                .get_or_create(&Self::q(queue))
                .observe(delay as f64 / 1000.0);
            self.chart(queue, series::Kind::Retried, 1);
        }
        if let Some(reason) = outcome.dead_reason {
            self.dead(queue, reason.as_str());
        }
    }

    /// A message became dead.
    pub fn dead(&self, queue: &str, reason: &'static str) {
        self.chart(queue, series::Kind::Dead, 1);
        self.dead_letters
            .get_or_create(&ReasonLabels {
                queue: queue.to_owned(),
                reason,
            })
            .inc();
        self.finished
            .get_or_create(&ResultLabels {
                queue: queue.to_owned(),
                result: "dead",
            })
            .inc();
    }

    /// Done messages were purged.
    pub fn purged(&self, queue: &str, n: u64) {
        self.done_purged.get_or_create(&Self::q(queue)).inc_by(n);
    }

    /// Render the text exposition, refreshing the queue gauges from `stats`, with the
    /// store's own figures (`store`: each backend names its own, e.g. SQLite's WAL).
    pub fn render(
        &self,
        stats: &[QueueStats],
        store: &[StoreMetric],
        node: &NodeLabel<'_>,
        now_ms: i64,
    ) -> String {
        self.queue_messages.clear();
        self.oldest_ready_age.clear();
        for s in stats {
            for st in State::ALL {
                self.queue_messages
                    .get_or_create(&StateLabels {
                        queue: s.queue.clone(),
                        state: st.as_str(),
                    })
                    .set(s.count(st) as i64);
            }
            let age = s
                .oldest_ready_due
                .map_or(0.0, |d| (now_ms - d.as_millis()).max(0) as f64 / 1000.0);
            self.oldest_ready_age
                .get_or_create(&Self::q(&s.queue))
                .set(age);
        }
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.push_str("# encoding failed\n");
        }
        let eof = out.rfind("# EOF").unwrap_or(out.len());
        let mut tail = String::new();
        for m in store {
            let kind = match m.kind {
                MetricKind::Gauge => "gauge",
                MetricKind::Counter => "counter",
            };
            let sample = match m.kind {
                MetricKind::Gauge => m.name.to_owned(),
                MetricKind::Counter => format!("{}_total", m.name),
            };
            let _ = writeln!(tail, "# HELP {} {}", m.name, m.help);
            let _ = writeln!(tail, "# TYPE {} {kind}", m.name);
            let _ = writeln!(tail, "{sample} {}", m.value);
        }
        // Which node answered (every node of a cluster serves /metrics; the queue gauges above
        // are the store's, the same on each), and whether it leads.
        let _ = writeln!(
            tail,
            "# HELP redrive_node The node that answered: its name and process; 1 while it leads its cluster, 0 otherwise."
        );
        let _ = writeln!(tail, "# TYPE redrive_node gauge");
        let _ = writeln!(
            tail,
            "redrive_node{{node=\"{}\",incarnation=\"{}\"}} {}",
            label_value(node.node),
            label_value(node.incarnation),
            u8::from(node.leads)
        );
        out.insert_str(eof, &tail);
        out
    }
}

/// Wall-clock milliseconds since the epoch (the charts are labelled in wall-clock time).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// This node, for [`Metrics::render`]'s `redrive_node`.
#[derive(Debug, Clone, Copy)]
pub struct NodeLabel<'a> {
    /// Its name (`[cluster] node`).
    pub node: &'a str,
    /// Its process.
    pub incarnation: &'a str,
    /// Whether it leads its cluster now.
    pub leads: bool,
}

/// A label value escaped for the text exposition format (backslash, double quote, newline).
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
