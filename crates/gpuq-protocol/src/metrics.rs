//! Counters and histograms that cross a process boundary: the node helper's
//! `GET /v1/metrics` answer, which the broker re-exposes per node on its
//! OpenMetrics endpoint (`[metrics]` in broker.toml, docs/operations.md).
//!
//! Plain data: the node helper records into these (it has no metrics
//! library; its privileged surface stays small), the broker encodes them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Upper bounds (seconds) of every step-duration histogram, node and
/// broker alike: lease steps take from milliseconds (a test-mode wipe) to
/// many minutes (discarding large NVMe, a slow format).
pub const STEP_BUCKETS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// A histogram with [`STEP_BUCKETS`]: `counts[i]` observations fell in
/// bucket `i` (not cumulative), the last entry being `+Inf`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; STEP_BUCKETS.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }
}

impl Histogram {
    pub fn observe(&mut self, secs: f64) {
        let secs = if secs.is_finite() && secs > 0.0 {
            secs
        } else {
            0.0
        };
        let i = STEP_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(STEP_BUCKETS.len());
        if self.counts.len() != STEP_BUCKETS.len() + 1 {
            self.counts = vec![0; STEP_BUCKETS.len() + 1];
        }
        self.counts[i] += 1;
        self.sum += secs;
        self.count += 1;
    }

    /// `(upper bound, count in that bucket)`, `+Inf` last; `None` when the
    /// counts do not match [`STEP_BUCKETS`] (an answer from another version).
    pub fn buckets(&self) -> Option<Vec<(f64, u64)>> {
        if self.counts.len() != STEP_BUCKETS.len() + 1 {
            return None;
        }
        Some(
            STEP_BUCKETS
                .iter()
                .copied()
                .chain(std::iter::once(f64::INFINITY))
                .zip(self.counts.iter().copied())
                .collect(),
        )
    }
}

/// One node helper's metrics since it started (`GET /v1/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeMetrics {
    pub node: String,
    pub version: String,
    /// Lease steps (`preflight`, `start`, `stop`, `wipe`) by outcome
    /// (`ok`, `refused`, `failed`).
    pub steps: BTreeMap<String, BTreeMap<String, u64>>,
    /// How long each step took, whatever its outcome.
    pub step_seconds: BTreeMap<String, Histogram>,
    /// Preflight findings that refused a lease, by reason
    /// (`device_refused`, `foreign_engine`, ...).
    pub refusals: BTreeMap<String, u64>,
}

impl NodeMetrics {
    pub fn step(&mut self, step: &str, outcome: &str, secs: f64) {
        *self
            .steps
            .entry(step.to_string())
            .or_default()
            .entry(outcome.to_string())
            .or_default() += 1;
        self.step_seconds
            .entry(step.to_string())
            .or_default()
            .observe(secs);
    }

    pub fn refused(&mut self, reason: &str) {
        *self.refusals.entry(reason.to_string()).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_bad_values_count_as_zero() {
        let mut h = Histogram::default();
        h.observe(0.01);
        h.observe(0.05);
        h.observe(3.0);
        h.observe(1e9);
        h.observe(f64::NAN);
        let b = h.buckets().unwrap();
        assert_eq!(b[0], (0.05, 3)); // 0.01, 0.05 and NaN-as-0
        assert_eq!(b[6], (5.0, 1));
        assert_eq!(b.last().unwrap(), &(f64::INFINITY, 1));
        assert_eq!(h.count, 5);
        assert!((h.sum - (0.06 + 3.0 + 1e9)).abs() < 1e-3);
    }

    #[test]
    fn an_answer_with_other_buckets_is_not_encoded() {
        let h = Histogram {
            counts: vec![1, 2],
            sum: 1.0,
            count: 3,
        };
        assert_eq!(h.buckets(), None);
    }

    #[test]
    fn steps_count_by_outcome() {
        let mut m = NodeMetrics::default();
        m.step("wipe", "ok", 0.2);
        m.step("wipe", "ok", 0.3);
        m.step("wipe", "failed", 1.0);
        m.refused("device_refused");
        assert_eq!(m.steps["wipe"]["ok"], 2);
        assert_eq!(m.steps["wipe"]["failed"], 1);
        assert_eq!(m.step_seconds["wipe"].count, 3);
        assert_eq!(m.refusals["device_refused"], 1);
    }
}
