use std::time::Duration;

use super::*;

#[test]
fn histogram_buckets_are_upper_bounds_with_an_infinite_tail() {
    let mut h = Histogram::new(&[0.01, 0.1]);
    for ms in [5, 10, 50, 100, 2000] {
        h.observe(Duration::from_millis(ms));
    }
    assert_eq!(h.counts, vec![2, 2, 1]);
    assert_eq!(h.count, 5);
    assert!((h.sum - 2.165).abs() < 1e-9);
    assert_eq!(
        h.cumulative(),
        vec![(Some(0.01), 2), (Some(0.1), 4), (None, 5)]
    );
}

#[test]
fn padding_waste_is_the_unused_share_of_running_shapes() {
    let occupancy = BucketOccupancy {
        context_capacity: 256,
        max_batch: 4,
        running: 2,
        positions_used: 128,
    };
    assert!((occupancy.padding_waste() - 0.75).abs() < 1e-12);
    let idle = BucketOccupancy {
        running: 0,
        positions_used: 0,
        ..occupancy
    };
    assert_eq!(idle.padding_waste(), 0.0);
}

/// One mapping from a finish reason to its counter and spelling, used by the engine and the server.
#[test]
fn finish_counts_record_each_reason_under_its_spelling() {
    let mut counts = FinishCounts::default();
    for (n, reason) in FinishReason::ALL.into_iter().enumerate() {
        for _ in 0..=n {
            counts.record(reason);
        }
    }
    assert_eq!(
        counts.by_reason(),
        [("stop", 1), ("length", 2), ("cancelled", 3), ("error", 4)]
    );
    assert_eq!(counts.get(FinishReason::Cancelled), counts.cancelled);
}
