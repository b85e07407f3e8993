//! One node's share of an endpoint's limits (SPEC §13: an endpoint's `concurrency` and
//! `rate_limit` hold for the whole cluster).
//!
//! With `nodes` live nodes sorted by a key every node sorts the same way (the server uses
//! their incarnations), the node at `rank` takes
//!
//! - concurrency `floor(c / nodes) + (1 if rank < c mod nodes else 0)`: the shares of all
//!   ranks sum to exactly `c`, and none is above `ceil(c / nodes)`. When `c < nodes` the
//!   nodes ranked `c` and after get 0: they take no message of that endpoint;
//! - rate limit `rate / nodes` (the shares sum to the rate).
//!
//! Pure: the caller learns `nodes` and `rank` (the server from its heartbeat) and applies
//! the share with [`crate::protect::Protection::set_limits`].

/// Where a node stands in its cluster: how many live nodes, and its place among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rank {
    /// Live nodes (at least 1: the node itself).
    pub nodes: u32,
    /// This node's place among them, `0..nodes`.
    pub rank: u32,
}

impl Rank {
    /// A node alone: the whole limit is its own.
    pub const ALONE: Rank = Rank { nodes: 1, rank: 0 };

    /// The node at `rank` of `nodes` (`nodes` taken as at least 1, `rank` as at most
    /// `nodes - 1`).
    pub fn new(nodes: u32, rank: u32) -> Self {
        let nodes = nodes.max(1);
        Self {
            nodes,
            rank: rank.min(nodes - 1),
        }
    }
}

impl Default for Rank {
    fn default() -> Self {
        Self::ALONE
    }
}

/// One node's share of an endpoint's limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// Calls in flight at most on this node (0: this node calls the endpoint not at all).
    pub concurrency: u32,
    /// Calls per second at most on this node (`None`: no rate limit).
    pub rate_limit_per_s: Option<f64>,
}

/// The share of the node at `at` of a cluster-wide `concurrency` and `rate_limit_per_s`.
pub fn share(concurrency: u32, rate_limit_per_s: Option<f64>, at: Rank) -> Share {
    let at = Rank::new(at.nodes, at.rank);
    let base = concurrency / at.nodes;
    let extra = u32::from(at.rank < concurrency % at.nodes);
    Share {
        concurrency: base + extra,
        rate_limit_per_s: rate_limit_per_s.map(|r| r / f64::from(at.nodes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        let at = |nodes, rank| Rank::new(nodes, rank);
        assert_eq!(share(16, Some(200.0), Rank::ALONE).concurrency, 16);
        assert_eq!(
            share(16, Some(200.0), Rank::ALONE).rate_limit_per_s,
            Some(200.0)
        );
        let c: Vec<u32> = (0..3)
            .map(|r| share(3, None, at(3, r)).concurrency)
            .collect();
        assert_eq!(c, [1, 1, 1]);
        let c: Vec<u32> = (0..3)
            .map(|r| share(4, None, at(3, r)).concurrency)
            .collect();
        assert_eq!(c, [2, 1, 1]);
        let c: Vec<u32> = (0..3)
            .map(|r| share(2, None, at(3, r)).concurrency)
            .collect();
        assert_eq!(c, [1, 1, 0]);
        assert_eq!(share(3, Some(30.0), at(3, 2)).rate_limit_per_s, Some(10.0));
        assert_eq!(share(3, None, at(3, 2)).rate_limit_per_s, None);
        // Out of range: taken as the last rank of at least one node.
        assert_eq!(Rank::new(0, 5), Rank::ALONE);
        assert_eq!(share(5, None, Rank { nodes: 2, rank: 7 }).concurrency, 2);
    }

    proptest! {
        /// Over all ranks: the concurrency shares sum to exactly `c`, each is at most
        /// `ceil(c / n)` (and at least `floor(c / n)`), and the rate shares sum to the rate.
        #[test]
        fn the_shares_of_all_ranks_add_up(c in 0u32..10_000, n in 1u32..200, rate in 0.001f64..1e6) {
            let shares: Vec<Share> = (0..n).map(|r| share(c, Some(rate), Rank::new(n, r))).collect();
            let sum: u64 = shares.iter().map(|s| u64::from(s.concurrency)).sum();
            prop_assert_eq!(sum, u64::from(c));
            for s in &shares {
                prop_assert!(s.concurrency <= c.div_ceil(n));
                prop_assert!(s.concurrency >= c / n);
            }
            let rates: f64 = shares.iter().filter_map(|s| s.rate_limit_per_s).sum();
            prop_assert!((rates - rate).abs() <= rate * 1e-9, "{} vs {}", rates, rate);
            // Higher ranks never get more than lower ones.
            prop_assert!(shares.windows(2).all(|w| w[0].concurrency >= w[1].concurrency));
        }
    }
}
