//! What a shared-database backend's group commit batches: the calls that become jobs
//! ([`Work`]: publishes, acks and nacks), their answers ([`Done`]), and which jobs of a batch
//! may run as one call ([`groups`]: one kind, one `now`). The backends run the calls; this
//! is the bookkeeping both do alike.

use crate::{Ack, Acked, FailureOutcome, Nack, Published, StoreError};
use redrive_core::{NewMessage, Timestamp};

/// What a job does.
#[derive(Debug)]
pub enum Work {
    /// `Store::publish`.
    Publish(Vec<NewMessage>, Option<Timestamp>),
    /// `Store::ack`.
    Ack(Vec<Ack>, Option<Timestamp>),
    /// `Store::nack`.
    Nack(Vec<Nack>, Option<Timestamp>),
}

/// What a job answers.
#[derive(Debug)]
pub enum Done {
    /// To a [`Work::Publish`].
    Publish(Vec<Published>),
    /// To a [`Work::Ack`].
    Ack(Vec<Result<Acked, StoreError>>),
    /// To a [`Work::Nack`].
    Nack(Vec<Result<FailureOutcome, StoreError>>),
}

impl Work {
    /// Whether `self` and `other` can run as one call: one kind, one `now`.
    pub fn merges_with(&self, other: &Work) -> bool {
        match (self, other) {
            (Work::Publish(_, a), Work::Publish(_, b))
            | (Work::Ack(_, a), Work::Ack(_, b))
            | (Work::Nack(_, a), Work::Nack(_, b)) => a == b,
            _ => false,
        }
    }

    /// Its items.
    pub fn len(&self) -> usize {
        match self {
            Work::Publish(v, _) => v.len(),
            Work::Ack(v, _) => v.len(),
            Work::Nack(v, _) => v.len(),
        }
    }

    /// Whether it has no items.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Move `other`'s items to the end of `self`'s (of the same kind: [`Work::merges_with`]).
    pub fn append(&mut self, other: &mut Work) {
        match (self, other) {
            (Work::Publish(a, _), Work::Publish(b, _)) => a.append(b),
            (Work::Ack(a, _), Work::Ack(b, _)) => a.append(b),
            (Work::Nack(a, _), Work::Nack(b, _)) => a.append(b),
            _ => unreachable!("only work of one kind is merged"),
        }
    }

    /// Split off the last `n` items into a work of the same kind.
    pub fn split_off_last(&mut self, n: usize) -> Work {
        match self {
            Work::Publish(v, now) => Work::Publish(v.split_off(v.len() - n), *now),
            Work::Ack(v, now) => Work::Ack(v.split_off(v.len() - n), *now),
            Work::Nack(v, now) => Work::Nack(v.split_off(v.len() - n), *now),
        }
    }
}

impl Done {
    /// Split off the answers of the last `n` items.
    pub fn split_off_last(&mut self, n: usize) -> Done {
        match self {
            Done::Publish(v) => Done::Publish(v.split_off(v.len() - n)),
            Done::Ack(v) => Done::Ack(v.split_off(v.len() - n)),
            Done::Nack(v) => Done::Nack(v.split_off(v.len() - n)),
        }
    }

    /// Its answers.
    pub fn len(&self) -> usize {
        match self {
            Done::Publish(v) => v.len(),
            Done::Ack(v) => v.len(),
            Done::Nack(v) => v.len(),
        }
    }

    /// Whether it has no answers.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The answers of a merged call, split into one per job of `lens` items each (`None`:
    /// the call answered another number of items).
    pub fn split(mut self, lens: &[usize]) -> Option<Vec<Done>> {
        if self.len() != lens.iter().sum::<usize>() {
            return None;
        }
        let mut out: Vec<Done> = lens.iter().rev().map(|&n| self.split_off_last(n)).collect();
        out.reverse();
        Some(out)
    }
}

/// The jobs of a batch (their works, in order) in groups that may run as one call, by
/// index: each job joins the first group it merges with, so the groups keep the order of
/// their first jobs.
pub fn groups(works: &[&Work]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (i, w) in works.iter().enumerate() {
        match out.iter_mut().find(|g| works[g[0]].merges_with(w)) {
            Some(g) => g.push(i),
            None => out.push(vec![i]),
        }
    }
    out
}
