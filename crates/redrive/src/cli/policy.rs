//! `redrive policy explain`: what a retry policy means, before anyone relies on it.
//!
//! The rows come from [`RetryPolicy::explain`]; this file only chooses the
//! policy (config file, flags or the built-in default) and renders it.

use super::output::{print_json, Align, Table};
use super::usage;
use crate::ExplainArgs;
use redrive_core::{
    format_duration_ms, Backoff, ExplainRow, Jitter, PolicyError, RetryPolicy, RetryPolicyConfig,
};
use redrive_server::{Config, Overrides};

/// Run `redrive policy explain`.
pub fn run(args: &ExplainArgs) -> anyhow::Result<()> {
    let (source, policy) = match &args.config {
        Some(path) => {
            // The file alone: REDRIVE_* variables cannot set queue sections, and a shell
            // set up for the client (REDRIVE_SERVER …) must not make the file unreadable.
            let config = Config::load(Some(path), Vec::new(), &Overrides::default())
                .map_err(|e| usage(e.to_string()))?;
            let queue = args.queue.as_deref().unwrap_or("default");
            let own = queue == "default" || config.queues.contains_key(queue);
            let source = if own {
                format!("queue {queue} in {}", path.display())
            } else {
                format!(
                    "queue {queue} in {} (no section of its own: [queues.default] applies)",
                    path.display()
                )
            };
            (source, config.queue_settings(queue).retry)
        }
        None => {
            let cfg = config_from_flags(args);
            let source = if cfg == RetryPolicyConfig::default() {
                "built-in default".to_owned()
            } else {
                "flags".to_owned()
            };
            (source, cfg.resolve().map_err(|e| usage(flag_error(&e)))?)
        }
    };
    let rows = policy.explain();
    if args.json {
        print_json(&serde_json::json!({ "source": source, "policy": policy, "rows": rows }));
    } else {
        super::output::emit(&render(&source, &policy, &rows))?;
    }
    Ok(())
}

/// Parse `--multiplier`: a finite number ≥ 1.
pub fn parse_multiplier(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("not a number: {s:?}"))?;
    if v.is_finite() && v >= 1.0 {
        Ok(v)
    } else {
        Err(format!("must be a finite number ≥ 1.0, got {s}"))
    }
}

/// The flags as a policy section (unset flags stay unset, so presets and defaults apply).
fn config_from_flags(args: &ExplainArgs) -> RetryPolicyConfig {
    RetryPolicyConfig {
        max_attempts: args.max_attempts,
        backoff: args.backoff,
        initial_delay: args.initial_delay,
        multiplier: args.multiplier,
        max_delay: args.max_delay,
        jitter: args.jitter,
        max_age: args.max_age,
        schedule: args.schedule.clone(),
        preset: args.preset.clone(),
        ..RetryPolicyConfig::default()
    }
}

/// A policy error in terms of the flag at fault (`retry.max_delay` → `--max-delay`).
fn flag_error(e: &PolicyError) -> String {
    match e {
        PolicyError::UnknownPreset(name) => format!("invalid value {name:?} for --preset"),
        PolicyError::Invalid { key, reason } => {
            format!("invalid policy: --{}: {reason}", key.replace('_', "-"))
        }
    }
}

/// The one-line summary above the table.
pub fn header(policy: &RetryPolicy) -> String {
    let d = format_duration_ms;
    let shape = match policy.backoff {
        Backoff::Fixed => format!("fixed backoff of {}", d(policy.initial_delay_ms)),
        Backoff::Linear => format!("linear backoff, {} × n", d(policy.initial_delay_ms)),
        Backoff::Exponential => {
            format!(
                "exponential backoff from {} × {}",
                d(policy.initial_delay_ms),
                policy.multiplier
            )
        }
        Backoff::Decorrelated => {
            format!("decorrelated backoff from {}", d(policy.initial_delay_ms))
        }
        Backoff::Schedule => format!(
            "schedule backoff [{}]",
            policy
                .schedule_ms
                .iter()
                .map(|&ms| d(ms))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Backoff::Sidekiq => "sidekiq backoff (n⁴ + 15 + rand(10)·(n+1) s)".to_owned(),
    };
    let jitter = match policy.jitter {
        Jitter::None => "no jitter",
        Jitter::Full => "full jitter",
        Jitter::Equal => "equal jitter",
        Jitter::Decorrelated => "decorrelated jitter",
    };
    format!(
        "{shape}, capped at {}, {jitter}; at most {} attempts (the first included) within max age {}",
        d(policy.max_delay_ms),
        policy.max_attempts,
        d(policy.max_age_ms)
    )
}

/// `5s` for an exact value, `0s – 1s` for a range.
pub fn range(min_ms: u64, max_ms: u64) -> String {
    if min_ms == max_ms {
        format_duration_ms(min_ms)
    } else {
        format!(
            "{} – {}",
            format_duration_ms(min_ms),
            format_duration_ms(max_ms)
        )
    }
}

/// The whole human output: source, summary, table, legend.
pub fn render(source: &str, policy: &RetryPolicy, rows: &[ExplainRow]) -> String {
    let mut out = format!("policy ({source}): {}\n\n", header(policy));
    let mut t = Table::new(&[
        ("attempt", Align::Right),
        ("delay before it", Align::Left),
        ("cumulative", Align::Left),
        ("", Align::Left),
    ]);
    t.push(vec![
        "1".into(),
        "-".into(),
        "0s".into(),
        "first delivery".into(),
    ]);
    for r in rows {
        let note = if r.may_exceed_max_age {
            "* may pass max age"
        } else {
            ""
        };
        t.push(vec![
            r.attempt.to_string(),
            range(r.delay_min_ms, r.delay_max_ms),
            range(r.cumulative_min_ms, r.cumulative_max_ms),
            note.into(),
        ]);
    }
    out.push_str(&t.render());
    if rows.iter().any(|r| r.may_exceed_max_age) {
        out.push_str(&format!(
            "\n* this attempt may fall past max age ({}): the message goes dead instead of retrying\n",
            format_duration_ms(policy.max_age_ms)
        ));
    }
    let charged = if policy.rate_limited_counts {
        "they count against max_attempts".to_owned()
    } else {
        format!(
            "the first {} do not count against max_attempts (later ones do)",
            policy.max_rate_limited
        )
    };
    out.push_str(&format!(
        "\nafter attempt {} fails the message is dead (max_attempts); rate-limited failures wait for their Retry-After (at most {}, never less than the delay above without jitter); {}\n",
        policy.max_attempts,
        format_duration_ms(policy.max_retry_after_ms),
        charged
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Command, PolicyCommand};
    use clap::Parser;

    fn explain_args(argv: &[&str]) -> Result<ExplainArgs, clap::Error> {
        let mut full = vec!["redrive", "policy", "explain"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full)?.command {
            Command::Policy {
                command: PolicyCommand::Explain(a),
            } => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_flags_is_the_default_policy() {
        let a = explain_args(&[]).unwrap();
        assert_eq!(config_from_flags(&a), RetryPolicyConfig::default());
        assert_eq!(
            config_from_flags(&a).resolve().unwrap(),
            RetryPolicy::default()
        );
    }

    #[test]
    fn flags_build_the_policy() {
        let a = explain_args(&[
            "--backoff",
            "fixed",
            "--initial-delay",
            "0s",
            "--jitter",
            "none",
            "--max-attempts",
            "3",
        ])
        .unwrap();
        let p = config_from_flags(&a).resolve().unwrap();
        assert_eq!(
            (p.backoff, p.initial_delay_ms, p.jitter, p.max_attempts),
            (Backoff::Fixed, 0, Jitter::None, 3)
        );
        let a = explain_args(&["--schedule", "1s,5s,30s"]).unwrap();
        let p = config_from_flags(&a).resolve().unwrap();
        assert_eq!(p.backoff, Backoff::Schedule);
        assert_eq!(p.schedule_ms, vec![1_000, 5_000, 30_000]);
    }

    #[test]
    fn bad_flag_values_name_the_flag() {
        for (argv, flag) in [
            (&["--initial-delay", "soon"][..], "--initial-delay"),
            (&["--multiplier", "0.5"][..], "--multiplier"),
            (&["--backoff", "cubic"][..], "--backoff"),
            (&["--max-attempts", "0"][..], "--max-attempts"),
            (&["--schedule", "1s,later"][..], "--schedule"),
            (&["--preset", "kafka"][..], "--preset"),
        ] {
            let e = explain_args(argv).unwrap_err();
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains(flag), "{argv:?}: {e}");
        }
        // Caught by the policy's own validation, then named as a flag.
        let a = explain_args(&["--backoff", "schedule"]).unwrap();
        let e = flag_error(&config_from_flags(&a).resolve().unwrap_err());
        assert!(e.contains("--schedule"), "{e}");
    }

    #[test]
    fn config_and_flags_do_not_mix() {
        assert!(explain_args(&["--config", "x.toml", "--preset", "svix"]).is_err());
        assert!(
            explain_args(&["--queue", "orders"]).is_err(),
            "--queue needs --config"
        );
    }

    #[test]
    fn ranges_and_exact_values() {
        assert_eq!(range(5_000, 5_000), "5s");
        assert_eq!(range(0, 1_000), "0s – 1s");
        assert_eq!(range(60_000, 90_000), "1m – 1m 30s");
    }

    #[test]
    fn renders_a_fixed_policy() {
        let p = RetryPolicyConfig {
            backoff: Some(Backoff::Fixed),
            initial_delay: Some(redrive_core::DurationMs(5_000)),
            max_delay: Some(redrive_core::DurationMs(900_000)),
            jitter: Some(Jitter::None),
            max_attempts: Some(3),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let text = render("flags", &p, &p.explain());
        let expected_table = "\
attempt  delay before it  cumulative
      1  -                0s          first delivery
      2  5s               5s
      3  5s               10s
";
        assert!(
            text.starts_with(
                "policy (flags): fixed backoff of 5s, capped at 15m, no jitter; at most 3 attempts"
            ),
            "{text}"
        );
        assert!(text.contains(expected_table), "{text}");
        assert!(!text.contains("may pass max age"));
    }

    #[test]
    fn marks_rows_past_max_age() {
        let p = RetryPolicyConfig {
            backoff: Some(Backoff::Fixed),
            initial_delay: Some(redrive_core::DurationMs(60_000)),
            jitter: Some(Jitter::None),
            max_attempts: Some(4),
            max_age: Some(redrive_core::DurationMs(150_000)),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let text = render("flags", &p, &p.explain());
        let marked: Vec<&str> = text
            .lines()
            .filter(|l| l.ends_with("* may pass max age"))
            .collect();
        assert_eq!(marked.len(), 1, "{text}");
        assert!(marked[0].trim_start().starts_with('4'), "{text}");
        assert!(text.contains("max age (2m 30s)"), "{text}");
    }

    #[test]
    fn default_policy_shows_ranges() {
        let p = RetryPolicy::default();
        let text = render("built-in default", &p, &p.explain());
        assert!(text.contains("      2  500ms – 1s"), "{text}");
        assert!(
            text.contains(
                "exponential backoff from 1s × 2, capped at 1h, equal jitter; at most 20 attempts"
            ),
            "{text}"
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.trim_start().starts_with(char::is_numeric))
                .count(),
            20
        );
        // SPEC §3: at least 4 h of retries whatever the jitter draws, about 8 h without.
        assert!(
            text.contains("     20  30m – 1h         4h 4m 7s 500ms – 8h 8m 15s"),
            "{text}"
        );
    }
}
