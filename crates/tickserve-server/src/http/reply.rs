//! A v2 inference answer's HTTP headers: `Content-Type`, `Content-Length`,
//! the binary extension's `Inference-Header-Content-Length` and the timing
//! headers. Each kind of answer has its map made once; an answer clones it
//! (two arrays copied) and sets the values in place, where inserting each
//! header would hash its name and probe the map (and `Content-Length`, set
//! here, is not parsed and inserted again after the handler).

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderValue, header};
use tickserve_core::Timing;

use super::codec::HEADER_LENGTH_NAME;
use crate::timing;

/// The maps: JSON or binary answers, without or with the timing headers.
static MAPS: LazyLock<[HeaderMap; 4]> = LazyLock::new(|| {
    [(false, false), (false, true), (true, false), (true, true)]
        .map(|(binary, timed)| map(binary, timed))
});

/// One kind of answer's map, its values placeholders.
fn map(binary: bool, timed: bool) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(5);
    let content_type = if binary {
        "application/octet-stream"
    } else {
        "application/json"
    };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    if binary {
        headers.insert(HEADER_LENGTH_NAME.clone(), HeaderValue::from_static("0"));
    }
    if timed {
        timing::add(&mut headers, &Timing::default(), true);
    }
    headers
}

/// The headers of an answer of `body` bytes, whose JSON header takes
/// `header_length` of them when the answer is binary; with the timing
/// headers of `timing` when given (`teach`: see [`timing::add`]).
pub fn headers(
    body: usize,
    header_length: Option<usize>,
    timing: Option<(&Timing, bool)>,
) -> HeaderMap {
    let kind = 2 * usize::from(header_length.is_some()) + usize::from(timing.is_some());
    let mut headers = MAPS[kind].clone();
    for (name, value) in headers.iter_mut() {
        if name == header::CONTENT_LENGTH {
            *value = timing::value(body as u64);
        } else if let Some((timing, teach)) = timing
            && let Some(time) = timing::value_for(name, timing, teach)
        {
            *value = time;
        } else if let Some(n) = header_length
            && *name == HEADER_LENGTH_NAME
        {
            *value = timing::value(n as u64);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The headers an answer had when each was inserted in turn: the same
    /// names and values, whatever the kind of answer.
    #[test]
    fn each_kind_of_answer_has_the_headers_inserted_ones_had() {
        let timing = Timing {
            queue: Duration::from_micros(7),
            compute: Duration::from_micros(123_456),
        };
        for header_length in [None, Some(60)] {
            for timed in [None, Some((&timing, false)), Some((&timing, true))] {
                for body in [0, 72, 1023, 1024, 5_000_000] {
                    let mut expected = HeaderMap::new();
                    if let Some((timing, teach)) = timed {
                        timing::add(&mut expected, timing, teach);
                    }
                    let content_type = match header_length {
                        Some(n) => {
                            expected.insert(HEADER_LENGTH_NAME.clone(), HeaderValue::from(n));
                            "application/octet-stream"
                        }
                        None => "application/json",
                    };
                    expected.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
                    expected.insert(header::CONTENT_LENGTH, HeaderValue::from(body));
                    let made = headers(body, header_length, timed);
                    assert_eq!(made.len(), expected.len());
                    for (name, value) in &expected {
                        let got = made.get(name).expect("every header");
                        assert_eq!(got, value, "{name}");
                        assert_eq!(got.is_sensitive(), value.is_sensitive(), "{name}");
                    }
                }
            }
        }
    }
}
