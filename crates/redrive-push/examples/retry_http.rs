//! Calls an HTTP URL with retries, the in-process way (SPEC S6): `Retrier::run` with the push
//! classification table (`http_failure`) and a breaker shared by every call.
//!
//! ```text
//! cargo run -p redrive-push --example retry_http -- URL [CALLS]
//! ```
//!
//! Makes CALLS (default 1) GET requests one after the other, each retried on the default
//! policy shortened to 5 attempts from 500 ms, printing every attempt, its verdict and the
//! breaker's state. Plain `http://` only (the example's reqwest has no TLS). Redirects are
//! not followed (a 3xx is `permanent`, as in push delivery).

use redrive_core::{Failure, RetryPolicy};
use redrive_push::classify::{Attempt, Rules};
use redrive_push::protect::{Protection, ProtectionConfig};
use redrive_push::retry::{http_failure, Retrier, RetryError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("usage: retry_http URL [CALLS]")?;
    let calls: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1);

    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5))
        .build()?;
    let rules = Rules::default();
    let policy = RetryPolicy {
        max_attempts: 5,
        initial_delay_ms: 500,
        max_delay_ms: 10_000,
        ..RetryPolicy::default()
    };
    let retrier = Retrier::new(policy);
    let breaker = Arc::new(Mutex::new(Protection::new(
        ProtectionConfig::default(),
        retrier.now_ms(),
    )));
    let retrier = retrier.breaker(breaker.clone());
    println!("policy: {}", retrier.policy().summary());

    for call in 1..=calls {
        let result = retrier
            .run(
                |f: &Failure| f.clone(),
                |attempt| {
                    let (client, url, rules, retrier) = (&client, &url, &rules, &retrier);
                    async move {
                        let at = retrier.now_ms();
                        let sent = client
                            .get(url.as_str())
                            .header("redrive-attempt", attempt.to_string())
                            .send()
                            .await;
                        let now_s = time::OffsetDateTime::now_utc().unix_timestamp();
                        let (status, failure) = match &sent {
                            Ok(resp) => {
                                let retry_after = resp
                                    .headers()
                                    .get("retry-after")
                                    .and_then(|v| v.to_str().ok());
                                let status = resp.status().as_u16();
                                let answer = Attempt::Answered {
                                    status,
                                    retry_after,
                                };
                                (Some(status), http_failure(rules, answer, now_s))
                            }
                            Err(e) if e.is_timeout() => {
                                (None, http_failure(rules, Attempt::TimedOut, now_s))
                            }
                            Err(_) => (None, http_failure(rules, Attempt::ConnectFailed, now_s)),
                        };
                        let verdict = match &failure {
                            None => "delivered".to_owned(),
                            Some(f) => format!(
                                "{} ({}{})",
                                f.message.as_deref().unwrap_or("failed"),
                                f.class.as_str(),
                                f.retry_after_ms
                                    .map(|ms| format!(", retry after {ms} ms"))
                                    .unwrap_or_default()
                            ),
                        };
                        println!("call {call} attempt {attempt} at {at} ms: {verdict}");
                        match (status, failure) {
                            (_, Some(f)) => Err(f),
                            (status, None) => Ok(status.unwrap_or(0)),
                        }
                    }
                },
            )
            .await;
        match result {
            Ok(status) => println!("call {call}: done, HTTP {status}"),
            Err(RetryError::Exhausted {
                reason,
                attempts,
                last,
            }) => println!(
                "call {call}: gave up after {attempts} attempt(s), {}: {}",
                reason.as_str(),
                last.message.as_deref().unwrap_or("")
            ),
            Err(RetryError::NeverAdmitted { waited_ms }) => {
                println!("call {call}: never admitted by the breaker (parked {waited_ms} ms)")
            }
        }
        let snap = breaker
            .lock()
            .map_err(|_| "the breaker's lock is poisoned")?
            .snapshot(retrier.now_ms());
        println!(
            "  breaker: {}, {} of {} recent calls failed, pace {}, opened {} time(s)",
            snap.state.as_str(),
            snap.window_failures,
            snap.window_calls,
            snap.pace_per_s
                .map_or("none".to_owned(), |p| format!("{p:.0}/s")),
            snap.opened_total
        );
    }
    Ok(())
}
