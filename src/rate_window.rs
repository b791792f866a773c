//! The sliding-window check of a rate limiter's admissions: in every window of one interval, at
//! most `rate + burst` permits, counted at the moments the server admitted them.

use std::time::{Duration, SystemTime};

/// The most permits any half-open window `[t, t + interval)` holds, and where that window
/// starts: `admitted` are `(moment, permits)` pairs in any order.
pub fn busiest_window(
    admitted: &[(SystemTime, u64)],
    interval: Duration,
) -> (u64, Option<SystemTime>) {
    let mut sorted: Vec<(SystemTime, u64)> = admitted.to_vec();
    sorted.sort();
    let (mut best, mut at, mut sum, mut start) = (0, None, 0, 0);
    // A busiest window starts at an admission: slide its end over every admission.
    for end in 0..sorted.len() {
        sum += sorted[end].1;
        while sorted[end].0 >= sorted[start].0 + interval {
            sum -= sorted[start].1;
            start += 1;
        }
        if sum > best {
            best = sum;
            at = Some(sorted[start].0);
        }
    }
    (best, at)
}

/// Panics, naming the window, when some window of `interval` holds more than `most` permits.
///
/// # Panics
/// As said.
pub fn assert_no_window_over(admitted: &[(SystemTime, u64)], interval: Duration, most: u64) {
    let (busiest, at) = busiest_window(admitted, interval);
    assert!(
        busiest <= most,
        "{busiest} permits admitted in the window of {interval:?} from {at:?} (at most {most} \
         allowed), over {} admissions",
        admitted.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(ms: u64, permits: u64) -> (SystemTime, u64) {
        (UNIX_EPOCH + Duration::from_millis(ms), permits)
    }

    #[test]
    fn counts_half_open_windows() {
        let second = Duration::from_secs(1);
        // 0 and 1000 are in different windows of one second; 0, 500, 999 in one.
        let admitted = [at(0, 1), at(500, 2), at(999, 1), at(1000, 1)];
        assert_eq!(busiest_window(&admitted, second).0, 4);
        assert_eq!(busiest_window(&[at(0, 1), at(1000, 1)], second).0, 1);
        assert_eq!(busiest_window(&[], second).0, 0);
    }
}
