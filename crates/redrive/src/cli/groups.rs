//! `redrive groups`: the failure groups of `GET /v1/failure-groups` (dead letters grouped by
//! the fingerprint of their last error, largest first), so an operator gets a fingerprint
//! for `messages list --fingerprint` or `tasks create --fingerprint` without curl.

use super::client::{cli_error, utc_bare};
use super::output::{emit, print_json, truncate, Align, Table};
use crate::GroupsArgs;
use redrive_client::{Client, FailureGroups};

/// Longest example error in the table.
const EXAMPLE_CHARS: usize = 60;

/// Run `redrive groups`.
pub async fn run(api: &Client, args: &GroupsArgs) -> anyhow::Result<()> {
    let groups = api
        .failure_groups(args.queue.as_deref(), args.limit)
        .await
        .map_err(cli_error)?;
    if args.json {
        print_json(&groups);
        return Ok(());
    }
    emit(&groups_table(&groups).render())?;
    eprintln!("{}", footer(&groups));
    Ok(())
}

/// The table: one row per group, its fingerprint whole (it is what a filter takes).
pub fn groups_table(g: &FailureGroups) -> Table {
    let mut t = Table::new(&[
        ("dead", Align::Right),
        ("queues", Align::Left),
        ("last dead (UTC)", Align::Left),
        ("example", Align::Left),
        ("sample ids", Align::Left),
        ("fingerprint", Align::Left),
    ]);
    for group in &g.groups {
        t.push(vec![
            group.count.to_string(),
            group.queues.join(","),
            group.last_at.map_or_else(|| "-".to_owned(), utc_bare),
            group
                .example
                .as_deref()
                .map_or_else(|| "-".to_owned(), |e| truncate(e, EXAMPLE_CHARS)),
            group.sample_ids.join(","),
            group.fingerprint.clone(),
        ]);
    }
    t
}

/// What was read, and how to use a fingerprint.
pub fn footer(g: &FailureGroups) -> String {
    let mut s = format!(
        "{} group{} of {} dead letter{} read",
        g.groups.len(),
        if g.groups.len() == 1 { "" } else { "s" },
        g.scanned,
        if g.scanned == 1 { "" } else { "s" },
    );
    if g.truncated {
        s.push_str(" (the newest 100,000: there are more)");
    }
    if let Some(first) = g.groups.first() {
        s.push_str(&format!(
            "\nall of a group: redrive messages list --state dead --fingerprint '{fp}'\
             \nredrive them:   redrive tasks create --action redrive --state dead --fingerprint '{fp}' --dry-run",
            fp = first.fingerprint.replace('\'', "'\\''")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_shows_each_group_with_its_whole_fingerprint() {
        let g: FailureGroups = serde_json::from_value(json!({
            "groups": [
                {"fingerprint": "transient: HTTP 503 from payments (req <hex>)", "count": 49,
                 "queues": ["orders", "refunds"], "dead_reasons": ["max_attempts"],
                 "example": "HTTP 503 from payments (req 0x9f3a)", "first_at": "2026-01-31T08:00:00.000Z",
                 "last_at": "2026-01-31T12:00:00.000Z", "sample_ids": ["a", "b"]},
                {"fingerprint": "killed", "count": 1, "queues": ["orders"], "dead_reasons": ["killed"],
                 "example": null, "first_at": null, "last_at": null, "sample_ids": ["c"]}
            ],
            "scanned": 50, "truncated": false
        }))
        .unwrap();
        assert_eq!(
            groups_table(&g).render(),
            "dead  queues          last dead (UTC)      example                              sample ids  fingerprint\n\
             \x20 49  orders,refunds  2026-01-31 12:00:00  HTTP 503 from payments (req 0x9f3a)  a,b         transient: HTTP 503 from payments (req <hex>)\n\
             \x20  1  orders          -                    -                                    c           killed\n"
        );
        let f = footer(&g);
        assert!(f.starts_with("2 groups of 50 dead letters read\n"), "{f}");
        assert!(
            f.contains("--fingerprint 'transient: HTTP 503 from payments (req <hex>)'"),
            "{f}"
        );
    }

    #[test]
    fn a_quote_in_a_fingerprint_is_quoted_for_the_shell() {
        let g = FailureGroups {
            groups: vec![redrive_client::FailureGroup {
                fingerprint: "permanent: can't parse".into(),
                count: 1,
                queues: vec![],
                dead_reasons: vec![],
                example: None,
                first_at: None,
                last_at: None,
                sample_ids: vec![],
            }],
            scanned: 1,
            truncated: true,
        };
        let f = footer(&g);
        assert!(f.contains("'permanent: can'\\''t parse'"), "{f}");
        assert!(f.contains("there are more"), "{f}");
    }
}
