//! `[alerts]` (SPEC §12): the notifier's timing, its sinks (`[[alerts.sinks]]`, push queues)
//! and thresholds (`[alerts.thresholds.NAME]`), checked and translated into the engine's
//! `AlertSettings`.

use super::{Config, ConfigError, Delivery};
use crate::engine::alerts::{AlertSettings, Sink, Template, Thresholds};
use redrive_core::DurationMs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[alerts]`: the alert notifier (SPEC §12). Alerts are published into push queues
/// (`[[alerts.sinks]]`); without a sink the notifier does not run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// How often the notifier evaluates.
    pub interval: DurationMs,
    /// Dead-letter inflow is batched per queue over this window.
    pub dead_letter_window: DurationMs,
    /// A threshold alert still true is sent again after this.
    pub repeat: DurationMs,
    /// Put in front of links in alerts (`https://redrive.internal`); empty: links are paths.
    pub console_url: String,
    /// Where alerts go.
    pub sinks: Vec<AlertSinkConfig>,
    /// `[alerts.thresholds.NAME]`, or `[alerts.thresholds.default]` for every queue.
    pub thresholds: BTreeMap<String, AlertThresholdsConfig>,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        Self {
            interval: DurationMs(30_000),
            dead_letter_window: DurationMs(300_000),
            repeat: DurationMs(3_600_000),
            console_url: String::new(),
            sinks: Vec::new(),
            thresholds: BTreeMap::new(),
        }
    }
}

/// One `[[alerts.sinks]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertSinkConfig {
    /// Its name: letters, digits, `_`, `-`, `.` (a metrics label).
    pub name: String,
    /// A configured queue with `delivery = "push"`; alerts are published into it.
    pub queue: String,
    /// `json` (default), `feishu`, `dingtalk` or `slack`.
    #[serde(default = "json_template")]
    pub template: String,
    /// Only alerts about these queues (default: every queue).
    #[serde(default)]
    pub queues: Vec<String>,
}

fn json_template() -> String {
    "json".to_owned()
}

/// One `[alerts.thresholds.NAME]` section; unset keys come from `[alerts.thresholds.default]`.
/// `0` turns an alert off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertThresholdsConfig {
    /// Alert when the oldest ready message is older than this.
    pub oldest_ready_age: Option<DurationMs>,
    /// Alert when ready + scheduled is above this.
    pub backlog: Option<u64>,
    /// Alert when at least this many messages died in one window (built-in: 1).
    pub dead_letters: Option<u64>,
}

impl Config {
    /// The alert notifier's settings, checked (the error names the key).
    pub fn alert_settings(&self) -> Result<AlertSettings, ConfigError> {
        let a = &self.alerts;
        let val = |key: String, reason: &str| ConfigError::Value {
            key,
            reason: reason.to_owned(),
        };
        if !(100..=3_600_000).contains(&a.interval.ms()) {
            return Err(val(
                "alerts.interval".into(),
                "must be between 100ms and 1h",
            ));
        }
        if a.dead_letter_window.ms() < a.interval.ms() || a.dead_letter_window.ms() > 86_400_000 {
            return Err(val(
                "alerts.dead_letter_window".into(),
                "must be at least alerts.interval and at most 1d",
            ));
        }
        if a.repeat.ms() == 0 {
            return Err(val("alerts.repeat".into(), "must be above 0s"));
        }
        let console_url = a.console_url.trim().trim_end_matches('/');
        let web = console_url.starts_with("http://") || console_url.starts_with("https://");
        if !console_url.is_empty() && !web {
            return Err(val(
                "alerts.console_url".into(),
                "must be empty or an http:// or https:// URL, e.g. \"https://redrive.internal\"",
            ));
        }
        let is_push = |q: &str| {
            q != "default"
                && self
                    .queues
                    .get(q)
                    .is_some_and(|c| c.delivery == Some(Delivery::Push))
        };
        let mut sinks: Vec<Sink> = Vec::new();
        for (i, k) in a.sinks.iter().enumerate() {
            let key = |f: &str| format!("alerts.sinks[{i}].{f}");
            if k.name.is_empty()
                || !k
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
            {
                return Err(val(
                    key("name"),
                    "must be letters, digits, '_', '-' or '.' (it is a metrics label)",
                ));
            }
            if sinks.iter().any(|s| s.name == k.name) {
                return Err(val(key("name"), "is the name of an earlier sink"));
            }
            if !is_push(&k.queue) {
                return Err(val(
                    key("queue"),
                    &format!(
                        "{:?} must be a queue configured with delivery = \"push\" ([queues.NAME] and \
                         [queues.NAME.push] with the webhook's url): alerts are delivered by push",
                        k.queue
                    ),
                ));
            }
            let template = Template::parse(&k.template)
                .ok_or_else(|| val(key("template"), &format!("must be {}", Template::NAMES)))?;
            for (j, q) in k.queues.iter().enumerate() {
                redrive_core::validate_queue_name(q)
                    .map_err(|e| val(key(&format!("queues[{j}]")), &e.to_string()))?;
            }
            sinks.push(Sink {
                name: k.name.clone(),
                queue: k.queue.clone(),
                template,
                queues: k.queues.clone(),
            });
        }
        for (j, k) in a.sinks.iter().enumerate() {
            for (n, q) in k.queues.iter().enumerate() {
                if sinks.iter().any(|s| &s.queue == q) {
                    return Err(val(
                        format!("alerts.sinks[{j}].queues[{n}]"),
                        "is a sink's queue: sink queues are never evaluated",
                    ));
                }
            }
        }
        let merge = |own: &AlertThresholdsConfig, base: &Thresholds| {
            let on = |v: u64| (v > 0).then_some(v);
            Thresholds {
                oldest_ready_age_ms: own
                    .oldest_ready_age
                    .map_or(base.oldest_ready_age_ms, |d| on(d.ms())),
                backlog: own.backlog.map_or(base.backlog, on),
                dead_letters: own.dead_letters.map_or(base.dead_letters, on),
            }
        };
        let default_thresholds = merge(
            &a.thresholds.get("default").cloned().unwrap_or_default(),
            &Thresholds::default(),
        );
        let mut thresholds = BTreeMap::new();
        for (name, t) in a.thresholds.iter().filter(|(n, _)| *n != "default") {
            let key = format!("alerts.thresholds.{name}");
            redrive_core::validate_queue_name(name)
                .map_err(|e| val(key.clone(), &e.to_string()))?;
            if sinks.iter().any(|s| &s.queue == name) {
                return Err(val(
                    key,
                    "is a sink's queue: sink queues are never evaluated",
                ));
            }
            thresholds.insert(name.clone(), merge(t, &default_thresholds));
        }
        Ok(AlertSettings {
            interval_ms: a.interval.ms(),
            dead_letter_window_ms: a.dead_letter_window.ms(),
            repeat_ms: a.repeat.ms(),
            console_url: console_url.to_owned(),
            sinks,
            default_thresholds,
            thresholds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::load;

    const SINK_QUEUE: &str = "[push]\nallow_cidrs = [\"127.0.0.1/32\"]\n\
        [queues.ops-alerts]\ndelivery = \"push\"\n\
        [queues.ops-alerts.push]\nurl = \"https://open.feishu.cn/open-apis/bot/v2/hook/x\"\n";

    #[test]
    fn alert_sinks_must_be_push_queues_and_bad_alert_values_are_named() {
        let ok = load(
            &format!(
                "{SINK_QUEUE}[alerts]\ninterval = \"200ms\"\ndead_letter_window = \"1s\"\n\
                 console_url = \"https://redrive.internal/\"\n\
                 [[alerts.sinks]]\nname = \"oncall-feishu\"\nqueue = \"ops-alerts\"\n\
                 template = \"feishu\"\nqueues = [\"orders\"]\n\
                 [alerts.thresholds.default]\nbacklog = 100\n\
                 [alerts.thresholds.orders]\noldest_ready_age = \"10m\"\ndead_letters = 0\n"
            ),
            &[],
        )
        .unwrap();
        let a = ok.alert_settings().unwrap();
        assert_eq!(a.console_url, "https://redrive.internal");
        assert_eq!(a.sinks[0].template, Template::Feishu);
        assert_eq!(
            a.thresholds_of("orders"),
            Thresholds {
                oldest_ready_age_ms: Some(600_000),
                backlog: Some(100),
                dead_letters: None
            }
        );
        assert_eq!(
            a.thresholds_of("billing"),
            Thresholds {
                oldest_ready_age_ms: None,
                backlog: Some(100),
                dead_letters: Some(1)
            }
        );
        assert_eq!(ok.engine_config().alerts, a);
        let sink = |extra: &str| {
            format!("[[alerts.sinks]]\nname = \"oncall\"\nqueue = \"ops-alerts\"\n{extra}")
        };
        for (text, key) in [
            // A pull queue, an unconfigured queue, [queues.default]: refused, naming the key.
            (
                "[queues.ops-alerts]\nordering = \"none\"\n".to_owned() + &sink(""),
                "alerts.sinks[0].queue",
            ),
            (
                sink("").replace("queue = \"ops-alerts\"", "queue = \"nowhere\""),
                "alerts.sinks[0].queue",
            ),
            (
                format!(
                    "{SINK_QUEUE}{}",
                    sink("").replace("\"ops-alerts\"", "\"default\"")
                ),
                "alerts.sinks[0].queue",
            ),
            (
                format!("{SINK_QUEUE}{}", sink("template = \"teams\"")),
                "alerts.sinks[0].template",
            ),
            (
                format!("{SINK_QUEUE}{}", sink("queues = [\"a b\"]")),
                "alerts.sinks[0].queues[0]",
            ),
            (
                format!("{SINK_QUEUE}{}", sink("queues = [\"ops-alerts\"]")),
                "alerts.sinks[0].queues[0]",
            ),
            (
                format!("{SINK_QUEUE}{}{}", sink(""), sink("")),
                "alerts.sinks[1].name",
            ),
            (
                format!(
                    "{SINK_QUEUE}{}",
                    sink("").replace("\"oncall\"", "\"on call\"")
                ),
                "alerts.sinks[0].name",
            ),
            (
                format!(
                    "{SINK_QUEUE}{}[alerts.thresholds.ops-alerts]\nbacklog = 1\n",
                    sink("")
                ),
                "alerts.thresholds.ops-alerts",
            ),
            ("[alerts]\ninterval = \"0s\"".to_owned(), "alerts.interval"),
            (
                "[alerts]\ninterval = \"1m\"\ndead_letter_window = \"30s\"".to_owned(),
                "alerts.dead_letter_window",
            ),
            ("[alerts]\nrepeat = \"0s\"".to_owned(), "alerts.repeat"),
            (
                "[alerts]\nconsole_url = \"redrive.internal\"".to_owned(),
                "alerts.console_url",
            ),
            ("[alerts]\nrepeats = \"1h\"".to_owned(), "repeats"),
            (
                "[alerts.thresholds.orders]\nbacklogg = 1".to_owned(),
                "backlogg",
            ),
        ] {
            let e = load(&text, &[]).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }
}
