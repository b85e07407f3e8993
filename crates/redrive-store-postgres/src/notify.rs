//! Messages made ready, told to the other processes on the schema: LISTEN/NOTIFY.
//!
//! A transaction that makes messages ready (a publish, a retry due now, a release, a
//! redrive, a tick's promotion) sends one `pg_notify` per queue it touched *inside* the
//! transaction, so the notice goes out if and only if it commits, with no commit of its
//! own (one NOTIFY per group-committed batch, not per message: PostgreSQL serialises
//! notifying commits, see `docs/ARCHITECTURE.md`). Every store listens on its schema's
//! channel on a connection of its own (not the pool's), skips its own notices (the payload
//! names the sending store) and hands the rest to [`redrive_storage::Notifier::ready`].
//! A notice is a hint: one lost while the listener reconnects is made up for by the long
//! polls' own re-check, never relied upon.

use crate::error::E;
use crate::Inner;
use redrive_storage::ReadyNotice;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, NoTls};

/// How long the listener waits before connecting again after losing its connection.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// The channel of `schema` (a valid identifier: lower-case letters, digits, `_`).
pub fn channel(schema: &str) -> String {
    format!("redrive_{schema}")
}

/// Send the notices of one transaction (queue → how many became ready), from store `node`;
/// nothing without a channel (notices off).
pub async fn send(
    tx: &deadpool_postgres::Transaction<'_>,
    channel: Option<&str>,
    node: u64,
    ready: &[(String, u32)],
) -> Result<(), E> {
    let Some(channel) = channel else {
        return Ok(());
    };
    if ready.is_empty() {
        return Ok(());
    }
    let payloads: Vec<String> = ready
        .iter()
        .map(|(q, n)| format!("{node:016x} {n} {q}"))
        .collect();
    crate::sql::execute(
        tx,
        "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
        &[&channel, &payloads],
    )
    .await?;
    Ok(())
}

/// A notice from another process on the schema.
#[derive(Debug, PartialEq, Eq)]
enum Notice {
    /// `<sender> <count> <queue>`: messages became ready.
    Ready(ReadyNotice),
    /// `<sender> due <ms>`: a message was written that falls due then (the SQL function's
    /// delayed publish, which no scheduler would otherwise know of until its next tick).
    Due(i64),
}

/// Parse a notice: `None` for one of `node`'s own or one that is not ours. Sender 0 is the
/// SQL function `publish(…)` (`sql_publish.rs`); a store's own sender is never 0.
fn parse(payload: &str, node: u64) -> Option<Notice> {
    let mut parts = payload.splitn(3, ' ');
    let from = u64::from_str_radix(parts.next()?, 16).ok()?;
    if from == node {
        return None;
    }
    let second = parts.next()?;
    if second == "due" {
        return parts.next()?.parse().ok().map(Notice::Due);
    }
    let count: u32 = second.parse().ok()?;
    let queue = parts.next()?.to_owned();
    Some(Notice::Ready(ReadyNotice { queue, count }))
}

/// Listen on the store's channel until the task is aborted (the store closed), reconnecting
/// after each loss; `listening` says whether it is listening now (the store's open waits for
/// the first time, so a notice sent right after the open is not missed).
pub async fn listen(
    cfg: tokio_postgres::Config,
    inner: Arc<Inner>,
    listening_now: watch::Sender<bool>,
) {
    let Some(channel) = inner.channel.clone() else {
        return;
    };
    let node = inner.epoch;
    loop {
        match cfg.connect(NoTls).await {
            Ok((client, mut conn)) => {
                let sql = format!("LISTEN \"{channel}\"");
                let listen = client.batch_execute(&sql);
                tokio::pin!(listen);
                let mut listening = false;
                loop {
                    tokio::select! {
                        r = &mut listen, if !listening => {
                            if let Err(e) = r {
                                tracing::warn!(error = %e, "PostgreSQL LISTEN failed");
                                break;
                            }
                            listening = true;
                            listening_now.send_replace(true);
                        }
                        m = std::future::poll_fn(|cx| conn.poll_message(cx)) => match m {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                match parse(n.payload(), node) {
                                    Some(Notice::Ready(r)) => {
                                        let _ = inner.ready_tx.send(r);
                                    }
                                    Some(Notice::Due(at)) => inner.due_elsewhere(at),
                                    None => {}
                                }
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::debug!(error = %e, "PostgreSQL listener connection lost");
                                break;
                            }
                            None => break,
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "PostgreSQL listener cannot connect"),
        }
        listening_now.send_replace(false);
        tokio::time::sleep(RECONNECT_DELAY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_names_its_sender_count_and_queue() {
        let n = parse("00000000000000ab 3 orders v2", 1).expect("another store's");
        assert_eq!(
            n,
            Notice::Ready(ReadyNotice {
                queue: "orders v2".into(),
                count: 3
            })
        );
        assert_eq!(
            parse("0000000000000000 due 1700000000123", 1),
            Some(Notice::Due(1_700_000_000_123))
        );
        assert!(
            parse("00000000000000ab 3 orders", 0xab).is_none(),
            "our own"
        );
        assert!(parse("garbage", 1).is_none());
    }
}
