//! `redrive tasks …` and `redrive audit`: bulk actions as durable tasks (SPEC §12), with a
//! progress bar while one runs, and the audit log.

use super::client::{cli_error, filter_of, utc_bare};
use super::output::{emit, print_json, truncate, Align, Table};
use super::usage;
use crate::{AuditArgs, TaskCreateArgs, TasksCommand};
use redrive_client::{Client, Task, TaskCreated, TaskRequest};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often a watched task is read.
const POLL: Duration = Duration::from_millis(500);
/// Without a terminal, a progress line at most this often.
const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// Characters of the progress bar.
const BAR: usize = 30;

/// Run a `tasks` subcommand.
pub async fn run(api: &Client, command: TasksCommand) -> anyhow::Result<()> {
    match command {
        TasksCommand::Create(args) => create(api, &args).await,
        TasksCommand::List { json } => {
            let list = api.tasks().await.map_err(cli_error)?;
            if json {
                print_json(&list);
            } else {
                emit(&tasks_table(&list.tasks).render())?;
            }
            Ok(())
        }
        TasksCommand::Show { id, watch } => {
            let t = if watch {
                follow(api, &id).await?
            } else {
                api.task(&id).await.map_err(cli_error)?
            };
            print_json(&t);
            eprintln!("{}", counts_in_words(&t));
            Ok(())
        }
        TasksCommand::Pause { id } => act(api, &id, "pause").await,
        TasksCommand::Resume { id } => act(api, &id, "resume").await,
        TasksCommand::Cancel { id } => act(api, &id, "cancel").await,
    }
}

async fn act(api: &Client, id: &str, verb: &str) -> anyhow::Result<()> {
    print_json(&api.task_action(id, verb).await.map_err(cli_error)?);
    Ok(())
}

/// The body of `tasks create`.
pub fn request_of(args: &TaskCreateArgs) -> anyhow::Result<TaskRequest> {
    let filter: std::collections::BTreeMap<String, String> = filter_of(&args.filters)?
        .query()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    if filter.is_empty() {
        return Err(usage(
            "give at least one filter (--queue, --state, --key, --error-class, --q, --since, \
             --until, --finished-since, --finished-until, --fingerprint): a task over every \
             message is refused",
        ));
    }
    if args.dry_run && args.wait {
        return Err(usage("--wait: a dry run creates no task to wait for"));
    }
    Ok(TaskRequest {
        action: args.action.clone(),
        filter,
        rate: args.rate.clone(),
        dry_run: args.dry_run,
        reason: args.reason.clone(),
        stop_failure_ratio: args.stop_failure_ratio,
    })
}

async fn create(api: &Client, args: &TaskCreateArgs) -> anyhow::Result<()> {
    let req = request_of(args)?;
    match api.create_task(&req).await.map_err(cli_error)? {
        TaskCreated::DryRun(d) => {
            eprintln!("dry run: the task would {} {} messages", d.action, d.total);
            print_json(&d);
        }
        TaskCreated::Task(t) => {
            eprintln!("task {} created: {} {} messages", t.id, t.action, t.total);
            let t = if args.wait {
                follow(api, &t.id).await?
            } else {
                t
            };
            print_json(&t);
            if args.wait && t.state == "stopped" {
                return Err(super::CliError::Api {
                    code: "task_stopped".into(),
                    message: t.stop_reason.unwrap_or_default(),
                }
                .into());
            }
        }
    }
    Ok(())
}

/// Follow a task until it finishes, drawing its progress on stderr: a bar redrawn in
/// place on a terminal, a line every few seconds otherwise.
async fn follow(api: &Client, id: &str) -> anyhow::Result<Task> {
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last_line = Instant::now() - PLAIN_EVERY;
    loop {
        let t = api.task(id).await.map_err(cli_error)?;
        let line = progress_line(&t, started.elapsed());
        let mut err = std::io::stderr();
        if tty {
            let _ = write!(err, "\r\x1b[2K{line}");
        } else if last_line.elapsed() >= PLAIN_EVERY || t.is_final() {
            let _ = writeln!(err, "{line}");
            last_line = Instant::now();
        }
        if t.is_final() {
            if tty {
                let _ = writeln!(err);
            }
            let _ = writeln!(err, "{}", counts_in_words(&t));
            return Ok(t);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What a task's action did to a message, in the past tense (`redriven`).
fn acted(action: &str) -> &'static str {
    redrive_storage::TaskAction::past_tense_of(action)
}

/// A task's counts said with what they mean (issue 15: a stopped redrive read "22 done, 0
/// failed" beside "20 failed again"): `22 of 30 redriven, 0 refused (no longer in a state a
/// redrive applies to, or gone)`, then a stopped task's reason, which has the stop rule's
/// figures.
pub fn counts_in_words(t: &Task) -> String {
    let mut s = format!(
        "{}: {} of {} {}, {} refused (no longer in a state a {} applies to, or gone)",
        t.state,
        t.done,
        t.total,
        acted(&t.action),
        t.failed,
        t.action
    );
    if let Some(ratio) = t.stop_failure_ratio {
        s.push_str(&format!(
            "; the stop rule watches the redriven ones: it stops the task when more than {:.0} % \
             of the last {} whose outcome is known failed again",
            ratio * 100.0,
            redrive_server::engine::tasks::OUTCOME_WINDOW
        ));
    }
    if let Some(r) = &t.stop_reason {
        s.push_str(&format!("\n{}: {r}", t.state));
    }
    s
}

/// `[#########.....] 4500/10000  45%  4000 redriven  500 refused  running  1210/s`
pub fn progress_line(t: &Task, elapsed: Duration) -> String {
    let handled = t.done + t.failed;
    let share = if t.total == 0 {
        1.0
    } else {
        (handled as f64 / t.total as f64).min(1.0)
    };
    let filled = (share * BAR as f64).round() as usize;
    let rate = handled as f64 / elapsed.as_secs_f64().max(0.001);
    format!(
        "[{}{}] {}/{} {:>3.0}%  {} {}  {} refused  {}  {:.0}/s",
        "#".repeat(filled),
        ".".repeat(BAR - filled),
        handled,
        t.total,
        share * 100.0,
        t.done,
        acted(&t.action),
        t.failed,
        t.state,
        rate
    )
}

/// The `tasks list` table.
pub fn tasks_table(tasks: &[Task]) -> Table {
    let mut table = Table::new(&[
        ("id", Align::Left),
        ("action", Align::Left),
        ("state", Align::Left),
        ("acted on", Align::Right),
        ("refused", Align::Right),
        ("total", Align::Right),
        ("by", Align::Left),
        ("created (UTC)", Align::Left),
        ("filter", Align::Left),
    ]);
    for t in tasks {
        table.push(vec![
            t.id.clone(),
            t.action.clone(),
            t.state.clone(),
            t.done.to_string(),
            t.failed.to_string(),
            t.total.to_string(),
            t.created_by.clone(),
            utc_bare(t.created_at),
            truncate(&t.filter.to_string(), 60),
        ]);
    }
    table
}

/// `redrive audit`.
pub async fn audit(api: &Client, args: &AuditArgs) -> anyhow::Result<()> {
    if args.limit == 0 || args.limit > 1_000 {
        return Err(usage("--limit: between 1 and 1000"));
    }
    let page = api
        .audit(args.limit, args.cursor.as_deref())
        .await
        .map_err(cli_error)?;
    if args.json {
        print_json(&page);
        return Ok(());
    }
    let mut table = Table::new(&[
        ("at (UTC)", Align::Left),
        ("who", Align::Left),
        ("action", Align::Left),
        ("target", Align::Left),
        ("count", Align::Right),
        ("detail", Align::Left),
        ("node", Align::Left),
    ]);
    for e in &page.entries {
        table.push(vec![
            utc_bare(e.at),
            e.actor.clone(),
            e.action.clone(),
            e.target.clone().unwrap_or_default(),
            e.count.to_string(),
            truncate(e.detail.as_deref().unwrap_or(""), 60),
            e.node.clone().unwrap_or_default(),
        ]);
    }
    emit(&table.render())?;
    if let Some(next) = &page.next_cursor {
        eprintln!("more: add --cursor {next}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn task(done: u64, failed: u64, total: u64, state: &str) -> Task {
        Task {
            id: "t".into(),
            action: "redrive".into(),
            state: state.into(),
            filter: serde_json::json!({"queue": "orders"}),
            rate: None,
            total,
            done,
            failed,
            created_by: "ops".into(),
            created_at: redrive_core::Timestamp::from_millis(0),
            updated_at: redrive_core::Timestamp::from_millis(0),
            stop_reason: None,
            stop_failure_ratio: Some(0.5),
        }
    }

    #[test]
    fn progress_line_shows_share_failures_and_rate() {
        let l = progress_line(&task(4_000, 500, 9_000, "running"), Duration::from_secs(3));
        assert!(
            l.starts_with(&format!("[{}{}]", "#".repeat(15), ".".repeat(15))),
            "{l}"
        );
        assert!(l.contains("4500/9000  50%"), "{l}");
        assert!(
            l.contains("4000 redriven  500 refused  running  1500/s"),
            "{l}"
        );
        let empty = progress_line(&task(0, 0, 0, "done"), Duration::from_secs(1));
        assert!(empty.contains("100%"), "{empty}");
    }

    /// Regression, issue 15: a stopped redrive read "22 done, 0 failed" beside "20 failed
    /// again"; each count now says what it counts.
    #[test]
    fn a_stopped_tasks_counts_say_what_they_mean() {
        let mut t = task(22, 0, 30, "stopped");
        t.stop_reason = Some(
            "stopped by its stop rule: 20 of the last 22 redriven messages whose outcome is \
             known failed again (more than 50 %; …)"
                .into(),
        );
        let w = counts_in_words(&t);
        assert!(
            w.starts_with(
                "stopped: 22 of 30 redriven, 0 refused (no longer in a state a redrive applies to, or gone)"
            ),
            "{w}"
        );
        assert!(w.contains("more than 50 % of the last 100"), "{w}");
        assert!(
            w.contains("\nstopped: stopped by its stop rule: 20 of the last 22"),
            "{w}"
        );
        let l = progress_line(&t, Duration::from_secs(1));
        assert!(l.contains("22 redriven  0 refused  stopped"), "{l}");
        assert!(!l.contains("failed"), "{l}");
        let mut k = task(3, 1, 4, "done");
        k.action = "kill".into();
        k.stop_failure_ratio = None;
        assert_eq!(
            counts_in_words(&k),
            "done: 3 of 4 killed, 1 refused (no longer in a state a kill applies to, or gone)"
        );
    }

    fn create_args(argv: &[&str]) -> TaskCreateArgs {
        let mut full = vec!["redrive", "tasks", "create"];
        full.extend_from_slice(argv);
        match crate::Cli::try_parse_from(full).unwrap().command {
            crate::Command::Tasks {
                command: TasksCommand::Create(a),
            } => *a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn create_flags_become_the_request() {
        let r = request_of(&create_args(&[
            "--action",
            "redrive",
            "--queue",
            "orders",
            "--state",
            "dead",
            "--fingerprint",
            "permanent: order <n> not found",
            "--rate",
            "50/s",
        ]))
        .unwrap();
        assert_eq!(r.action, "redrive");
        assert_eq!(r.filter["queue"], "orders");
        assert_eq!(r.filter["state"], "dead");
        assert_eq!(r.filter["fingerprint"], "permanent: order <n> not found");
        assert_eq!(r.rate.as_deref(), Some("50/s"));
        let e = request_of(&create_args(&["--action", "kill"])).unwrap_err();
        assert!(e.to_string().contains("at least one filter"), "{e}");
        let e = request_of(&create_args(&[
            "--action",
            "kill",
            "--queue",
            "q",
            "--dry-run",
            "--wait",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("--wait"), "{e}");
        assert!(crate::Cli::try_parse_from([
            "redrive", "tasks", "create", "--action", "nuke", "--queue", "q"
        ])
        .is_err());
    }
}
