//! An answer's timing headers ([`QUEUE_TIME_HEADER`],
//! [`COMPUTE_TIME_HEADER`]), for the HTTP and gRPC front ends.

use std::sync::LazyLock;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tickserve_core::Timing;

/// Response header (HTTP) and metadata key (gRPC): microseconds the request
/// waited in the model's queue.
pub const QUEUE_TIME_HEADER: &str = "tickserve-queue-us";

/// Response header (HTTP) and metadata key (gRPC): microseconds of compute
/// (rows in, engine runs, rows out).
pub const COMPUTE_TIME_HEADER: &str = "tickserve-compute-us";

/// [`QUEUE_TIME_HEADER`] and [`COMPUTE_TIME_HEADER`], parsed once.
static NAMES: [HeaderName; 2] = [
    HeaderName::from_static(QUEUE_TIME_HEADER),
    HeaderName::from_static(COMPUTE_TIME_HEADER),
];

/// Values below this many microseconds come from [`VALUES`].
const RENDERED: u64 = 1024;

/// The values 0 to [`RENDERED`] - 1, written once: a value taken from here
/// is a copied reference, where one made per answer is a formatted number
/// and two allocations.
static VALUES: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
    let mut text = String::new();
    let mut ends = Vec::new();
    for n in 0..RENDERED {
        text.push_str(&n.to_string());
        ends.push(text.len());
    }
    // Made once per process and kept for its life.
    let text: &'static str = Box::leak(text.into_boxed_str());
    let mut start = 0;
    ends.into_iter()
        .map(|end| {
            let value = HeaderValue::from_static(&text[start..end]);
            start = end;
            value
        })
        .collect()
});

/// The header value for the number `n` (a time in microseconds here, a
/// byte count in an answer's length headers; values below 1024 come
/// pre-written).
pub fn value(n: u64) -> HeaderValue {
    usize::try_from(n)
        .ok()
        .and_then(|i| VALUES.get(i))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from(n))
}

/// A timing header's value for `time` (`teach` as in [`add`]).
fn timed(time: Duration, teach: bool) -> HeaderValue {
    let mut value = value(tickserve_core::durations::micros(time));
    value.set_sensitive(!teach);
    value
}

/// Adds an answer's timing headers to `headers`. Their values change with
/// every answer, so they are marked for HTTP/2's header compression never to
/// keep them in its table, where they would only push useful entries out and
/// keep each answer's value alive for the next hundred answers. Except where
/// `teach` (the first answer on an HTTP/2 connection): kept once, the names
/// are in the table for every later answer to refer to, which spares each
/// of them the names' literal, Huffman-coded bytes (about 1k instructions an
/// answer, docs/performance.md).
pub fn add(headers: &mut HeaderMap, timing: &Timing, teach: bool) {
    for (name, time) in NAMES.iter().zip([timing.queue, timing.compute]) {
        headers.insert(name.clone(), timed(time, teach));
    }
}

/// The value of the timing header `name` for `timing` (`teach` as in
/// [`add`]), where `name` is one of them: for a map that holds the names
/// already, its values set in place.
pub fn value_for(name: &HeaderName, timing: &Timing, teach: bool) -> Option<HeaderValue> {
    let time = if *name == NAMES[0] {
        timing.queue
    } else if *name == NAMES[1] {
        timing.compute
    } else {
        return None;
    };
    Some(timed(time, teach))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn values_read_as_the_microseconds_they_stand_for() {
        for micros in [
            0,
            1,
            9,
            10,
            99,
            100,
            999,
            1000,
            RENDERED - 1,
            RENDERED,
            123_456_789,
        ] {
            assert_eq!(
                value(micros).to_str().ok(),
                Some(micros.to_string().as_str())
            );
        }
        let mut headers = HeaderMap::new();
        let timing = Timing {
            queue: Duration::from_micros(7),
            compute: Duration::from_micros(4096),
        };
        add(&mut headers, &timing, false);
        assert_eq!(
            headers.get(QUEUE_TIME_HEADER).map(|v| v.as_bytes()),
            Some(&b"7"[..])
        );
        assert_eq!(
            headers.get(COMPUTE_TIME_HEADER).map(|v| v.as_bytes()),
            Some(&b"4096"[..])
        );
        assert!(
            headers
                .get(QUEUE_TIME_HEADER)
                .is_some_and(HeaderValue::is_sensitive)
        );
    }
}
