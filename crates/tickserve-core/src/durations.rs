//! Durations from clients and configuration files, with a stated maximum each
//! and checked arithmetic: a client's number can never overflow an `Instant`,
//! and an absurd configured value stops the load, naming its key and limit.
//!
//! A client's timeout (`grpc-timeout`, the `Tickserve-Timeout` header, the
//! `timeout` parameter) longer than [`MAX_TIMEOUT`] counts as [`MAX_TIMEOUT`]:
//! asking for "no hurry" is legitimate, and no request waits in tickserve for
//! an hour (queues are bounded in rows). Configured durations are refused
//! above their maximum instead, since a typo there affects every request.

use std::time::{Duration, Instant};

use serde::{Deserialize, Deserializer};

/// The longest deadline a request can have: a client's longer timeout is
/// shortened to it; a model's `timeout` may not exceed it.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The longest `max_queue_delay`: how long a queued request may wait for
/// company. A second is already far beyond any trading use.
pub const MAX_QUEUE_DELAY: Duration = Duration::from_secs(1);

/// The longest `keep_warm` interval: a warm run less often than this keeps
/// nothing warm.
pub const MAX_KEEP_WARM: Duration = Duration::from_secs(60);

/// The shortest `keep_warm` interval other than 0 (off): a warm run takes
/// the executor for one smallest-bucket run, and one every millisecond is
/// already more than any model needs to stay warm.
pub const MIN_KEEP_WARM: Duration = Duration::from_millis(1);

/// The longest `runtime.inline_budget`.
pub const MAX_INLINE_BUDGET: Duration = Duration::from_secs(1);

/// The deadline `timeout` after `now`, `timeout` shortened to [`MAX_TIMEOUT`].
pub fn deadline_after(now: Instant, timeout: Duration) -> Instant {
    let timeout = timeout.min(MAX_TIMEOUT);
    // An hour after a real `Instant` always fits; should it not, the request
    // gets the latest deadline that does rather than a panic.
    now.checked_add(timeout).unwrap_or(now)
}

/// `d` in whole microseconds, as answers and views report durations
/// (`u64::MAX` for what does not fit).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Checks a configured duration `value` (`key`) against its `limit`.
pub fn check(key: &str, value: Duration, limit: Duration) -> Result<(), String> {
    if value > limit {
        return Err(format!(
            "{key} is {}; the most it may be is {}",
            humantime::format_duration(value),
            humantime::format_duration(limit)
        ));
    }
    Ok(())
}

/// Checks a configured `keep_warm` (`key`): 0 (off), or from
/// [`MIN_KEEP_WARM`] to [`MAX_KEEP_WARM`].
pub fn check_keep_warm(key: &str, value: Duration) -> Result<(), String> {
    if !value.is_zero() && value < MIN_KEEP_WARM {
        return Err(format!(
            "{key} is {}; it is \"0s\" (off) or at least {}",
            humantime::format_duration(value),
            humantime::format_duration(MIN_KEEP_WARM)
        ));
    }
    check(key, value, MAX_KEEP_WARM)
}

/// The one reader of a duration as people write it (`"10s"`, `"250us"`,
/// `"1m 30s"`; spaces around it ignored): every configuration file's and
/// the `tickserve-timeout` header's. The error quotes the text (clipped)
/// and says what a duration looks like.
pub fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!(
            "{} is not a duration like \"250us\", \"2ms\" or \"10s\" ({e})",
            crate::text::quote(text)
        )
    })
}

/// A duration as configuration files write it ([`parse`]), for
/// `#[serde(deserialize_with)]`.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse(&s).map_err(serde::de::Error::custom)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // instants of the machine's clock as test data
mod tests {
    use super::*;

    /// Every configuration key of a duration reads it alike: one reader.
    #[test]
    fn every_duration_is_read_by_one_reader() {
        assert_eq!(parse(" 250us "), Ok(Duration::from_micros(250)));
        assert_eq!(parse("1m 30s"), Ok(Duration::from_secs(90)));
        let refused = parse("ten seconds").unwrap_err();
        assert!(
            refused.starts_with("\"ten seconds\" is not a duration like \"250us\""),
            "{refused}"
        );
        let long = "9".repeat(10_000);
        assert!(parse(&long).unwrap_err().len() < 300, "the text is clipped");
    }

    #[test]
    fn a_huge_timeout_is_the_longest_deadline_not_a_panic() {
        let now = Instant::now();
        assert_eq!(deadline_after(now, Duration::MAX), now + MAX_TIMEOUT);
        assert_eq!(
            deadline_after(now, Duration::from_secs(10_000_000_000_000_000_000)),
            now + MAX_TIMEOUT
        );
        assert_eq!(
            deadline_after(now, Duration::from_micros(250)),
            now + Duration::from_micros(250)
        );
    }

    #[test]
    fn a_configured_duration_over_its_limit_names_key_and_limit() {
        let error = check("max_queue_delay", Duration::from_secs(5), MAX_QUEUE_DELAY).unwrap_err();
        assert_eq!(error, "max_queue_delay is 5s; the most it may be is 1s");
        assert_eq!(check("timeout", MAX_TIMEOUT, MAX_TIMEOUT), Ok(()));
    }

    #[test]
    fn keep_warm_is_off_or_within_its_floor_and_ceiling() {
        let ms = Duration::from_millis;
        assert!(check_keep_warm("keep_warm", Duration::ZERO).is_ok());
        assert!(check_keep_warm("keep_warm", ms(1)).is_ok());
        assert!(check_keep_warm("keep_warm", ms(60_000)).is_ok());
        let error = check_keep_warm("keep_warm", Duration::from_nanos(1)).unwrap_err();
        assert!(
            error.contains("keep_warm is 1ns; it is \"0s\" (off) or at least 1ms"),
            "{error}"
        );
        assert!(check_keep_warm("keep_warm", ms(60_001)).is_err());
    }
}
